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

/* The CPU backend's own GEMM (lib/backend_cpu_fused.c): C = [relu](A B + (bias + res)) or
 * C += A B, each element summed in a fixed order (256-term chunks by FMA, then the chunks'
 * sums in turn), so that its bits depend on the inputs alone (not the ISA, the blocking or
 * OPENBLAS_CORETYPE). x86-64
 * with AVX2 and FMA (RN_GEMM_AVX2) or AVX-512 (RN_GEMM_AVX512), and a portable C form
 * (RN_GEMM_PORTABLE; on x86-64 it needs AVX2 and FMA too); rn_cpu_gemm_isa() says the
 * widest this CPU runs, RN_GEMM_NONE where none must be called. B is packed into
 * panels of RN_FUSED_NR columns (ceil(n / RN_FUSED_NR) * RN_FUSED_NR * kc floats) or
 * read in place; RN_FUSED_MR rows is a good multiple for row tiles. */
#define RN_FUSED_NR 16
#define RN_FUSED_MR 6
enum { RN_GEMM_NONE = 0, RN_GEMM_AVX2 = 1, RN_GEMM_AVX512 = 2, RN_GEMM_PORTABLE = 3 };
int rn_cpu_gemm_isa(void);
typedef struct {
    int isa;             /* RN_GEMM_AVX2, _AVX512 or _PORTABLE (the same bits whichever) */
    int64_t m, n, kc;    /* C (m x n) = A (m x kc) B (kc x n) */
    const float *a;      /* A(r, p) = a[r * ars + p * aps] */
    int64_t ars, aps;
    int a_trans;         /* ars == 1: A is a transposed row-major matrix (aps its row stride) */
    const float *b;      /* B(p, j) = b[(j / RN_FUSED_NR) * bps + p * bpp + j % RN_FUSED_NR] */
    int64_t bps, bpp;
    float *c;            /* C(r, j) = c[r * ldc + j] */
    int64_t ldc;
    int accumulate;      /* C += A B: each sum starts from C's value */
    const float *bias;   /* (n) or NULL, added after the sum */
    const float *res;    /* C's layout or NULL, added after the sum (with bias: sum + (bias + res)) */
    int relu;
} rn_cpu_gemm_args;
void rn_cpu_gemm(const rn_cpu_gemm_args *g);
/* B (kc x n, row stride ldb) into panels [t0, t1) */
void rn_cpu_gemm_pack_n(const float *b, int64_t ldb, int64_t kc, int64_t n, int64_t t0, int64_t t1, float *out);
/* w (k x kc, row-major) as B = w^T (kc x k): panels [p0, p1) of output channels */
void rn_cpu_fused_pack(const float *w, int64_t k, int64_t kc, int64_t p0, int64_t p1, float *wp);
/* y (rows x k) columns [p0*NR, p1*NR) = [relu](a w^T + (bias + res)), wp from rn_cpu_fused_pack */
void rn_cpu_fused_gemm(int isa, const float *a, int64_t lda, int64_t rows, int64_t kc, const float *wp, int64_t k,
                       int64_t p0, int64_t p1, const float *bias, const float *res, int relu, float *y);

#endif
