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

#endif
