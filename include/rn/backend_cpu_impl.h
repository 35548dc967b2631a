/* rn/backend_cpu_impl.h: internals shared by the CPU backend's files (lib/backend_cpu*.c)
 * and nothing else. */
#ifndef RN_BACKEND_CPU_IMPL_H
#define RN_BACKEND_CPU_IMPL_H

#include <stdint.h>

/* The CPU backend's thread pool (lib/backend_cpu_pool.c), kept in rn_backend.impl:
 * rn_cpu_pool_run calls fn(ctx, task, worker) for every task in [0, ntasks), claimed
 * dynamically by the caller (worker 0) and the pool's threads (workers 1..size-1), and
 * returns when all are done. team <= 1 runs them all on the caller. Not reentrant: one
 * run at a time per pool, like the context it belongs to. */
typedef struct rn_cpu_pool rn_cpu_pool;
typedef void (*rn_cpu_task_fn)(void *ctx, int64_t task, int worker);
int rn_cpu_pool_create(int nthreads, rn_cpu_pool **out);
void rn_cpu_pool_destroy(rn_cpu_pool *p);
int rn_cpu_pool_size(const rn_cpu_pool *p);
void rn_cpu_pool_run(rn_cpu_pool *p, int64_t ntasks, int team, rn_cpu_task_fn fn, void *ctx);

/* The inference conv's own GEMM (lib/backend_cpu_fused.c): AVX2 + FMA on x86-64; where
 * rn_cpu_fused_available() is 0 the others must not be called. Weights are packed into
 * panels of RN_FUSED_NR output channels (ceil(k / RN_FUSED_NR) * RN_FUSED_NR * kc floats);
 * rows go through the kernel RN_FUSED_MR at a time. */
#define RN_FUSED_NR 16
#define RN_FUSED_MR 6
int rn_cpu_fused_available(void);
void rn_cpu_fused_pack(const float *w, int64_t k, int64_t kc, int64_t p0, int64_t p1, float *wp);
void rn_cpu_fused_gemm(const float *a, int64_t lda, int64_t rows, int64_t kc, const float *wp, int64_t k,
                       int64_t p0, int64_t p1, const float *bias, const float *res, int relu, float *y);

#endif
