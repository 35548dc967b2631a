/* The CPU backend's thread pool: nthreads-1 workers plus the calling thread run the
 * tasks of one op, claiming them from an atomic counter.
 *
 * Why not OpenMP: libgomp lets an idle thread spin for about a millisecond before it
 * sleeps, and only an environment variable read before main() changes that. On a machine
 * whose cores are shared (CI, a workstation, this project's build host) the spinning
 * thread takes the core the preempted one needs, at every op: ResNet-50 training at 2
 * threads ran 2.5x slower than at 1 thread with libgomp's default and as fast as 1 thread
 * with OMP_WAIT_POLICY=passive. Here an idle thread spins for POOL_SPIN pause
 * instructions (tens of microseconds: enough to catch the next op of a training step)
 * and then sleeps on a condition variable. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "rn/backend_cpu_impl.h"
#include "rn/backend_impl.h"
#include "rn/err.h"

#define POOL_SPIN 4000

struct rn_cpu_pool {
    int nworkers;                 /* threads besides the caller */
    pthread_t *threads;           /* (nworkers) */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    atomic_uint_fast64_t gen;     /* bumped once per run: workers wait for a change */
    atomic_int pending;           /* workers that have not finished the current run */
    atomic_int_fast64_t next;     /* next unclaimed task */
    int quit;                     /* under mu */
    /* the current run, written before gen is bumped */
    int64_t ntasks;
    rn_cpu_task_fn fn;
    void *ctx;
    struct worker_arg *args;      /* (nworkers) what each thread was started with */
};

typedef struct worker_arg {
    struct rn_cpu_pool *p;
    int id;                       /* 1..nworkers; the caller is 0 */
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void claim_all(struct rn_cpu_pool *p, int id) {
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->ntasks) break;
        p->fn(p->ctx, t, id);
    }
}

static void *worker_main(void *argp) {
    worker_arg *a = argp;
    struct rn_cpu_pool *p = a->p;
    int id = a->id;
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; i < POOL_SPIN && g == seen; i++) {
            cpu_relax();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while (!p->quit && (g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
                pthread_cond_wait(&p->work_cv, &p->mu);
            int quit = p->quit;
            pthread_mutex_unlock(&p->mu);
            if (quit) break;
        }
        seen = g;
        claim_all(p, id);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

int rn_cpu_pool_create(int nthreads, rn_cpu_pool **out) {
    *out = NULL;
    struct rn_cpu_pool *p = rn_calloc(1, sizeof *p);
    if (!p) return RN_ENOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->next, 0);
    int want = nthreads > 1 ? nthreads - 1 : 0;
    if (want) {
        p->threads = rn_calloc((size_t)want, sizeof *p->threads);
        p->args = rn_calloc((size_t)want, sizeof *p->args);
        if (!p->threads || !p->args) {
            rn_cpu_pool_destroy(p);
            return RN_ENOMEM;
        }
    }
    for (int i = 0; i < want; i++) {
        p->args[i] = (worker_arg){p, i + 1};
        int e = pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]);
        if (e) {
            rn_cpu_pool_destroy(p);
            return rn_errorf(RN_ENOMEM, "cpu backend: starting worker thread %d of %d failed "
                             "(error %d); try fewer --threads", i + 1, want, e);
        }
        p->nworkers++;
    }
    *out = p;
    return RN_OK;
}

void rn_cpu_pool_destroy(rn_cpu_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p->args);
    free(p);
}

int rn_cpu_pool_size(const rn_cpu_pool *p) { return p->nworkers + 1; }

void rn_cpu_pool_run(rn_cpu_pool *p, int64_t ntasks, int team, rn_cpu_task_fn fn, void *ctx) {
    if (ntasks <= 0) return;
    if (ntasks == 1 || team <= 1 || p->nworkers == 0) {
        for (int64_t t = 0; t < ntasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->ntasks = ntasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->nworkers, memory_order_relaxed);
    /* the bump publishes fn, ctx and ntasks; the mutex closes the gap between a
     * sleeping worker's check of gen and its wait */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    claim_all(p, 0);
    for (int i = 0; i < POOL_SPIN && atomic_load_explicit(&p->pending, memory_order_acquire); i++)
        cpu_relax();
    if (atomic_load_explicit(&p->pending, memory_order_acquire)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->pending, memory_order_acquire))
            pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
