/* CPU backend, fp32: OpenBLAS for the GEMMs, our thread pool (backend_cpu_pool.c) for
 * every loop. Convolutions and the fully connected layer live in backend_cpu_gemm.c.
 * Arguments arrive checked (lib/backend.c).
 *
 * BN's reductions are split into a fixed number of chunks, each summed on one thread and
 * then added in chunk order in double, and the loss is summed on one thread, so results
 * do not depend on the thread count. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "rn/augment.h"
#include "rn/backend_cpu_impl.h"
#include "rn/backend_impl.h"
#include "rn/err.h"
#include "rn/tensor.h"

/* Loops over fewer elements run on the calling thread: waking the pool costs microseconds. */
#define PAR_MIN 32768
/* BN reductions: fixed chunk count, independent of the thread count. */
#define BN_CHUNKS 32
/* Parallel loops hand out work in pieces of about this many elements, dynamically: on a
 * busy machine a thread the OS preempts then delays only its current piece instead of
 * holding the others for a static half. */
#define ELEMS_PER_CHUNK 16384

/* Hot loops are compiled for AVX-512, AVX2 and baseline x86-64, picked when the program
 * loads: the build targets generic x86-64, and these memory-bound loops run 2-4x faster
 * with wide vectors. No FMA is enabled, so every clone rounds the same way. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define RN_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RN_HOT
#endif

static int64_t rows_per_chunk(int64_t row_elems) {
    int64_t r = ELEMS_PER_CHUNK / (row_elems > 0 ? row_elems : 1);
    return r > 0 ? r : 1;
}

/* fn(ctx, i0, i1) over [0, n) in pieces of `grain`, on the pool when `work` (elements
 * touched) is worth it. */
typedef void (*range_fn)(void *ctx, int64_t i0, int64_t i1);
typedef struct {
    range_fn fn;
    void *ctx;
    int64_t n, grain;
} range_job;

static void range_task(void *c, int64_t t, int worker) {
    (void)worker;
    range_job *j = c;
    int64_t i0 = t * j->grain, i1 = i0 + j->grain < j->n ? i0 + j->grain : j->n;
    j->fn(j->ctx, i0, i1);
}

static void par_range(rn_backend *be, int64_t n, int64_t grain, int64_t work, range_fn fn,
                      void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    range_job j = {fn, ctx, n, grain};
    rn_cpu_pool_run(be->impl, (n + grain - 1) / grain, work >= PAR_MIN ? be->nthreads : 1,
                    range_task, &j);
}

/* the loader's buffers (rn_backend_host_alloc): host memory, not counted under
 * RN_CPU_MEMORY */
static int cpu_host_alloc(rn_backend *be, size_t bytes, void **out) {
    (void)be;
    size_t n = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(out, 64, n ? n : 64) != 0) return rn_errorf(RN_ENOMEM, "out of memory allocating %zu bytes", bytes);
    rn_advise_huge(*out, n);
    return RN_OK;
}

/* the same memory, counted under RN_CPU_MEMORY when it is set */
static int cpu_alloc(rn_backend *be, size_t bytes, void **out) {
    size_t n = (bytes + 63) & ~(size_t)63;
    if (be->mem_cap && n + be->mem_held > be->mem_cap)
        return rn_errorf(RN_ENOMEM, "out of memory allocating %zu bytes: %zu of RN_CPU_MEMORY=%zu held", bytes,
                         be->mem_held, be->mem_cap);
    int rc = cpu_host_alloc(be, bytes, out);
    if (rc == RN_OK && be->mem_cap) be->mem_held += malloc_usable_size(*out);
    return rc;
}

static void cpu_free(rn_backend *be, void *p) {
    if (be->mem_cap && p) be->mem_held -= malloc_usable_size(p);
    free(p);
}

static void cpu_host_free(rn_backend *be, void *p) {
    (void)be;
    free(p);
}

static int cpu_copy(rn_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
    return RN_OK;
}

static int cpu_upload_parts(rn_backend *be, const rn_upload_part *parts, int n) {
    for (int i = 0; i < n; i++) cpu_copy(be, parts[i].dst, parts[i].src, parts[i].bytes);
    return RN_OK;
}

static void zero_range(void *ctx, int64_t i0, int64_t i1) {
    memset((char *)ctx + i0, 0, (size_t)(i1 - i0));
}

/* Large activation buffers are zeroed in parallel: one core cannot fill the bandwidth. */
static int cpu_zero(rn_backend *be, void *dst, size_t bytes) {
    par_range(be, (int64_t)bytes, (int64_t)ELEMS_PER_CHUNK * 16, (int64_t)bytes / 16, zero_range,
              dst);
    return RN_OK;
}

static int cpu_sync(rn_backend *be) {
    (void)be;
    return RN_OK;
}

/* a number from the first line of path; 0 when absent, unreadable or "max" */
static size_t read_size(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v = 0;
    if (fscanf(f, "%llu", &v) != 1) v = 0;
    fclose(f);
    return (size_t)v;
}

static int cpu_mem_info(rn_backend *be, size_t *free_bytes, size_t *total_bytes) {
    if (be->mem_cap) {
        *total_bytes = be->mem_cap;
        *free_bytes = be->mem_cap - be->mem_held;
        return RN_OK;
    }
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return rn_errorf(RN_EIO, "cpu memory: cannot read /proc/meminfo");
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *free_bytes = (size_t)kb * 1024;
        else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) *total_bytes = (size_t)kb * 1024;
    }
    fclose(f);
    if (!*total_bytes) return rn_errorf(RN_EIO, "cpu memory: no MemTotal in /proc/meminfo");
    if (!*free_bytes) *free_bytes = *total_bytes; /* kernels before 3.14 */
    /* a container's limit (cgroup v2, else v1) */
    size_t max = read_size("/sys/fs/cgroup/memory.max"), used = read_size("/sys/fs/cgroup/memory.current");
    if (!max) {
        max = read_size("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        used = read_size("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    }
    if (max && max < *total_bytes) {
        size_t left = max > used ? max - used : 0;
        if (left < *free_bytes) *free_bytes = left;
    }
    return RN_OK;
}

static int cpu_upload_wait(rn_backend *be) {
    (void)be;
    return RN_OK;
}

/* ---- batch norm ---- */

static int64_t bn_chunks(int64_t m) { return m < BN_CHUNKS ? m : BN_CHUNKS; }

static size_t cpu_bn_workspace(rn_backend *be, const rn_bn_desc *d) {
    (void)be;
    /* per chunk: two double sums and two float block sums per channel; then three float
     * coefficient rows */
    return (size_t)bn_chunks(d->m) * 2 * d->c * (sizeof(double) + sizeof(float)) +
           3 * (size_t)d->c * sizeof(float);
}

static size_t cpu_bn_reserve_size(rn_backend *be, const rn_bn_desc *d) {
    (void)be, (void)d;
    return 0;
}

/* The arguments of one BN call, shared by its parallel pieces. */
typedef struct {
    int64_t m, nch;
    int c, relu;
    const float *x, *y, *dy, *res, *mean, *scale, *shift, *ka, *kb, *k0;
    float *out, *dres, *fs;
    double *part;
} bn_job;

/* Chunk ch's per-channel sum and sum of squares of x, in double. */
RN_HOT static void bn_moments_chunk(void *ctx, int64_t ch0, int64_t ch1) {
    const bn_job *j = ctx;
    const int c = j->c;
    for (int64_t ch = ch0; ch < ch1; ch++) {
        double *a = j->part + ch * 2 * c, *b = a + c;
        for (int k = 0; k < c; k++) a[k] = b[k] = 0;
        for (int64_t r = j->m * ch / j->nch; r < j->m * (ch + 1) / j->nch; r++) {
            const float *xr = j->x + r * c;
#pragma omp simd
            for (int k = 0; k < c; k++) {
                double v = xr[k];
                a[k] += v;
                b[k] += v * v;
            }
        }
    }
}

/* Per-channel sum and sum of squares of x (m, c), in double, left in part[0..c) and
 * part[c..2c) (chunk 0's slots). */
static void bn_moments(rn_backend *be, int64_t m, int c, const float *x, double *part) {
    bn_job j = {.m = m, .nch = bn_chunks(m), .c = c, .x = x, .part = part};
    par_range(be, j.nch, 1, m * c, bn_moments_chunk, &j);
    for (int64_t ch = 1; ch < j.nch; ch++)
        for (int k = 0; k < 2 * c; k++) part[k] += part[ch * 2 * c + k];
}

/* Rows [r0, r1) of y = [relu](x*scale + shift [+ res]). ReLU is torch's clamp_min(0):
 * v < 0 ? 0 : v, so NaN (and -0) pass through; its backward masks where y <= 0. */
RN_HOT static void bn_apply_rows(void *ctx, int64_t r0, int64_t r1) {
    const bn_job *jb = ctx;
    const int c = jb->c, relu = jb->relu;
    const float *x = jb->x, *res = jb->res, *scale = jb->scale, *shift = jb->shift;
    float *y = jb->out;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        const float *rr = res ? res + r * c : NULL;
        if (rr && relu) {
#pragma omp simd
            for (int j = 0; j < c; j++) {
                float v = xr[j] * scale[j] + shift[j] + rr[j];
                yr[j] = v < 0 ? 0 : v;
            }
        } else if (rr) {
#pragma omp simd
            for (int j = 0; j < c; j++) yr[j] = xr[j] * scale[j] + shift[j] + rr[j];
        } else if (relu) {
#pragma omp simd
            for (int j = 0; j < c; j++) {
                float v = xr[j] * scale[j] + shift[j];
                yr[j] = v < 0 ? 0 : v;
            }
        } else {
#pragma omp simd
            for (int j = 0; j < c; j++) yr[j] = xr[j] * scale[j] + shift[j];
        }
    }
}

static void bn_apply(rn_backend *be, int64_t m, int c, const float *x, const float *scale,
                     const float *shift, const float *res, int relu, float *y) {
    bn_job j = {.m = m, .c = c, .relu = relu, .x = x, .res = res, .scale = scale,
                .shift = shift, .out = y};
    par_range(be, m, rows_per_chunk(c), m * c, bn_apply_rows, &j);
}

static int cpu_bn_fwd_train(rn_backend *be, const rn_bn_desc *d, const void *xv,
                            const float *gamma, const float *beta, const void *res, void *y,
                            float *save_mean, float *save_invstd, float *running_mean,
                            float *running_var, void *reserve) {
    (void)reserve;
    const int c = d->c;
    const int64_t m = d->m;
    double *part = be->ws;
    float *scale = (float *)(part + bn_chunks(m) * 2 * c), *shift = scale + c;
    bn_moments(be, m, c, xv, part);
    const double *sum = part, *sumsq = part + c;
    for (int j = 0; j < c; j++) {
        double mean = sum[j] / m;
        double var = sumsq[j] / m - mean * mean;
        if (var < 0) var = 0;
        double invstd = 1.0 / sqrt(var + d->eps);
        save_mean[j] = (float)mean;
        save_invstd[j] = (float)invstd;
        scale[j] = (float)(gamma[j] * invstd);
        shift[j] = (float)(beta[j] - mean * gamma[j] * invstd);
        if (running_mean) {
            float mom = d->momentum;
            running_mean[j] = (1 - mom) * running_mean[j] + mom * (float)mean;
            running_var[j] = (1 - mom) * running_var[j] + mom * (float)(var * m / (m - 1));
        }
    }
    bn_apply(be, m, c, xv, scale, shift, res, d->relu, y);
    return RN_OK;
}

/* Inference needs no workspace (the model may run eval without reserving), so the
 * coefficients go in stack blocks of channels; a tensor wider than one block is done
 * block by block over strided rows. */
typedef struct {
    int64_t m;
    int c, j0, cb, relu;
    const float *x, *res, *scale, *shift;
    float *y;
} infer_job;

RN_HOT static void bn_infer_rows(void *ctx, int64_t r0, int64_t r1) {
    const infer_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = j->x + r * j->c + j->j0;
        const float *rr = j->res ? j->res + r * j->c + j->j0 : NULL;
        float *yr = j->y + r * j->c + j->j0;
        for (int k = 0; k < j->cb; k++) {
            float v = xr[k] * j->scale[k] + j->shift[k];
            if (rr) v += rr[k];
            yr[k] = j->relu && v < 0 ? 0 : v;
        }
    }
}

static int cpu_bn_fwd_infer(rn_backend *be, const rn_bn_desc *d, const void *x,
                            const float *gamma, const float *beta, const float *running_mean,
                            const float *running_var, const void *res, void *y) {
    const int c = d->c;
    enum { CB = 256 };
    for (int j0 = 0; j0 < c; j0 += CB) {
        int cb = c - j0 < CB ? c - j0 : CB;
        float scale[CB], shift[CB];
        for (int j = 0; j < cb; j++) {
            double invstd = 1.0 / sqrt((double)running_var[j0 + j] + d->eps);
            scale[j] = (float)(gamma[j0 + j] * invstd);
            shift[j] = (float)(beta[j0 + j] - running_mean[j0 + j] * gamma[j0 + j] * invstd);
        }
        if (cb == c) {
            bn_apply(be, d->m, c, x, scale, shift, res, d->relu, y);
            break;
        }
        infer_job j = {d->m, c, j0, cb, d->relu, x, res, scale, shift, y};
        par_range(be, d->m, rows_per_chunk(cb), d->m * cb, bn_infer_rows, &j);
    }
    return RN_OK;
}

/* Rows [r0, r1) of BN backward pass 1: dz = dy masked by the ReLU (stored in dres when
 * given), a += dz and b += dz*(x - mean) per channel. Sums run in float over blocks of
 * BN_BLOCK rows (fa, fb: 2c floats of scratch), then in double, so the inner loop is all
 * float and vectorises; one loop per case keeps branches out of it. */
#define BN_BLOCK 16
/* always inlined, so that it is compiled into each vector-width clone of its caller */
static inline __attribute__((always_inline)) void bn_bwd_sums(int64_t r0, int64_t r1, int c, const float *x, const float *y,
                        const float *dy, const float *mean, float *dres, double *a, double *b,
                        float *fa, int relu) {
    float *fb = fa + c;
    for (int64_t q0 = r0; q0 < r1; q0 += BN_BLOCK) {
        int64_t q1 = q0 + BN_BLOCK < r1 ? q0 + BN_BLOCK : r1;
        for (int j = 0; j < c; j++) fa[j] = fb[j] = 0;
        for (int64_t r = q0; r < q1; r++) {
            const float *xr = x + r * c, *dyr = dy + r * c;
            if (relu) {
                const float *yr = y + r * c;
                if (dres) {
                    float *dr = dres + r * c;
#pragma omp simd
                    for (int j = 0; j < c; j++) {
                        float dz = yr[j] <= 0 ? 0.0f : dyr[j];
                        dr[j] = dz;
                        fa[j] += dz;
                        fb[j] += dz * (xr[j] - mean[j]);
                    }
                } else {
#pragma omp simd
                    for (int j = 0; j < c; j++) {
                        float dz = yr[j] <= 0 ? 0.0f : dyr[j];
                        fa[j] += dz;
                        fb[j] += dz * (xr[j] - mean[j]);
                    }
                }
            } else {
                if (dres) memcpy(dres + r * c, dyr, sizeof(float) * c);
#pragma omp simd
                for (int j = 0; j < c; j++) {
                    fa[j] += dyr[j];
                    fb[j] += dyr[j] * (xr[j] - mean[j]);
                }
            }
        }
        for (int j = 0; j < c; j++) {
            a[j] += fa[j];
            b[j] += fb[j];
        }
    }
}

/* Rows [r0, r1) of BN backward pass 2: dx = ka*dz - k0 - kb*(x - mean). */
RN_HOT static void bn_bwd_dx(void *ctx, int64_t r0, int64_t r1) {
    const bn_job *jb = ctx;
    const int c = jb->c, relu = jb->relu;
    const float *x = jb->x, *y = jb->y, *dy = jb->dy, *mean = jb->mean, *ka = jb->ka,
                *kb = jb->kb, *k0 = jb->k0;
    float *dx = jb->out;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * c, *dyr = dy + r * c;
        float *dxr = dx + r * c;
        if (relu) {
            const float *yr = y + r * c;
#pragma omp simd
            for (int j = 0; j < c; j++) {
                float dz = yr[j] <= 0 ? 0.0f : dyr[j];
                dxr[j] = ka[j] * dz - k0[j] - kb[j] * (xr[j] - mean[j]);
            }
        } else {
#pragma omp simd
            for (int j = 0; j < c; j++)
                dxr[j] = ka[j] * dyr[j] - k0[j] - kb[j] * (xr[j] - mean[j]);
        }
    }
}

/* Chunks [ch0, ch1) of pass 1, each into its own slots of part. */
RN_HOT static void bn_bwd_chunk(void *ctx, int64_t ch0, int64_t ch1) {
    const bn_job *j = ctx;
    const int c = j->c;
    for (int64_t ch = ch0; ch < ch1; ch++) {
        double *a = j->part + ch * 2 * c, *b = a + c;
        for (int k = 0; k < c; k++) a[k] = b[k] = 0;
        bn_bwd_sums(j->m * ch / j->nch, j->m * (ch + 1) / j->nch, c, j->x, j->y, j->dy, j->mean,
                    j->dres, a, b, j->fs + ch * 2 * c, j->relu);
    }
}

/* Both BN backwards: frozen, mean and stat are the running mean and variance (constants);
 * else the batch mean and inverse standard deviation the training forward saved. */
static void bn_bwd(rn_backend *be, const rn_bn_desc *d, int frozen, const void *xv, const void *yv,
                   const void *dyv, const float *gamma, const float *save_mean, const float *stat,
                   void *dxv, float *dgamma, float *dbeta, void *dresv, int accumulate) {
    const int c = d->c, relu = d->relu;
    const int64_t m = d->m, nch = bn_chunks(m);
    const float *x = xv, *y = yv, *dy = dyv;
    float *dx = dxv, *dres = dresv;
    double *part = be->ws;
    float *ka = (float *)(part + nch * 2 * c), *kb = ka + c, *k0 = kb + c, *fs = k0 + c;

    bn_job jb = {.m = m, .nch = nch, .c = c, .relu = relu, .x = x, .y = y, .dy = dy,
                 .mean = save_mean, .ka = ka, .kb = kb, .k0 = k0, .out = dx, .dres = dres,
                 .fs = fs, .part = part};
    par_range(be, nch, 1, m * c, bn_bwd_chunk, &jb);
    for (int64_t ch = 1; ch < nch; ch++)
        for (int j = 0; j < 2 * c; j++) part[j] += part[ch * 2 * c + j];
    for (int j = 0; j < c; j++) {
        double sdz = part[j], sdzx = part[c + j];
        double is = frozen ? 1.0 / sqrt((double)stat[j] + d->eps) : stat[j];
        double dg = sdzx * is, db = sdz;
        dgamma[j] = accumulate ? dgamma[j] + (float)dg : (float)dg;
        dbeta[j] = accumulate ? dbeta[j] + (float)db : (float)db;
        /* dx = a*(dz - sdz/m) - b*(x - mean), a = gamma*invstd, b = a*invstd^2*sdzx/m */
        double a = gamma[j] * is;
        ka[j] = (float)a;
        kb[j] = frozen ? 0.0f : (float)(a * is * is * sdzx / m);
        k0[j] = frozen ? 0.0f : (float)(a * sdz / m);
    }

    par_range(be, m, rows_per_chunk(c), m * c, bn_bwd_dx, &jb);
}

static int cpu_bn_bwd(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y,
                      const void *dy, const float *gamma, const float *save_mean,
                      const float *save_invstd, void *dx, float *dgamma, float *dbeta,
                      void *dres, void *reserve, int accumulate) {
    (void)reserve;
    bn_bwd(be, d, 0, x, y, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, dres, accumulate);
    return RN_OK;
}

static int cpu_bn_bwd_frozen(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y,
                             const void *dy, const float *gamma, const float *running_mean,
                             const float *running_var, void *dx, float *dgamma, float *dbeta,
                             void *dres, int accumulate) {
    bn_bwd(be, d, 1, x, y, dy, gamma, running_mean, running_var, dx, dgamma, dbeta, dres, accumulate);
    return RN_OK;
}

/* ---- elementwise ---- */

/* The arguments of one elementwise or pooling call, shared by its parallel pieces. */
typedef struct {
    const float *a, *b, *c;
    float *y;
    const uint8_t *u8;
    const float *mean, *std;
    const rn_pool_desc *pd;
    int64_t width;      /* row length where the op works on rows */
    int relu, hw;
    float scale;
} ew_job;

RN_HOT static void add_range(void *ctx, int64_t i0, int64_t i1) {
    const ew_job *j = ctx;
    const float *a = j->a, *b = j->b;
    float *y = j->y;
    if (j->relu) {
#pragma omp simd
        for (int64_t i = i0; i < i1; i++) {
            float v = a[i] + b[i];
            y[i] = v < 0 ? 0 : v;
        }
    } else {
#pragma omp simd
        for (int64_t i = i0; i < i1; i++) y[i] = a[i] + b[i];
    }
}

static int cpu_add(rn_backend *be, int dtype, int64_t n, const void *av, const void *bv,
                   void *yv, int relu) {
    (void)dtype;
    ew_job j = {.a = av, .b = bv, .y = yv, .relu = relu};
    par_range(be, n, ELEMS_PER_CHUNK, n, add_range, &j);
    return RN_OK;
}

RN_HOT static void relu_fwd_range(void *ctx, int64_t i0, int64_t i1) {
    const ew_job *j = ctx;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) j->y[i] = j->a[i] < 0 ? 0 : j->a[i];
}

static int cpu_relu_fwd(rn_backend *be, int dtype, int64_t n, const void *xv, void *yv) {
    (void)dtype;
    ew_job j = {.a = xv, .y = yv};
    par_range(be, n, ELEMS_PER_CHUNK, n, relu_fwd_range, &j);
    return RN_OK;
}

RN_HOT static void relu_bwd_range(void *ctx, int64_t i0, int64_t i1) {
    const ew_job *j = ctx;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) j->y[i] = j->a[i] <= 0 ? 0 : j->b[i];
}

static int cpu_relu_bwd(rn_backend *be, int dtype, int64_t n, const void *yv, const void *dyv,
                        void *dxv) {
    (void)dtype;
    ew_job j = {.a = yv, .b = dyv, .y = dxv};
    par_range(be, n, ELEMS_PER_CHUNK, n, relu_bwd_range, &j);
    return RN_OK;
}

/* the same float operations as ToTensor (x/255) then Normalize ((t - mean)/std) */
static void normalize_rows(void *ctx, int64_t r0, int64_t r1) {
    const ew_job *j = ctx;
    const int64_t c = j->width;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k = 0; k < c; k++)
            j->y[r * c + k] = ((float)j->u8[r * c + k] / 255.0f - j->mean[k]) / j->std[k];
}

static int cpu_input_normalize(rn_backend *be, int dtype, int64_t m, int c, const uint8_t *x,
                               const float *mean, const float *std, void *yv) {
    (void)dtype;
    ew_job j = {.u8 = x, .mean = mean, .std = std, .y = yv, .width = c};
    par_range(be, m, rows_per_chunk(c), m * c, normalize_rows, &j);
    return RN_OK;
}

static int cpu_input_erase(rn_backend *be, int dtype, int h, int w, int c, int x, int y0, int bw, int bh,
                           int random, uint64_t key, int64_t epoch, uint32_t rec, void *yv) {
    (void)be, (void)dtype, (void)h;
    rn_erase b = {.x = x, .y = y0, .w = bw, .h = bh, .rec = rec, .random = random};
    rn_erase_apply(&b, 1, h, w, c, key, epoch, yv);
    return RN_OK;
}

typedef struct {
    const rn_mix_desc *d;
    const uint8_t *x;
    const float *mean, *std;
    const rn_erase *erase; /* (n) or NULL */
    uint64_t erase_key;
    int64_t erase_epoch;
    float *y;
    int n, h, w, c;
} mix_job;

/* element k (of w * c) of row yy of image i: normalised, then erased by image i's box, as
   rn_input_normalize then rn_input_erase write it */
static float mix_input(const mix_job *j, int i, int yy, int64_t k, const uint8_t *xr) {
    int ch = (int)(k % j->c), xx = (int)(k / j->c);
    if (j->erase) {
        const rn_erase *e = &j->erase[i];
        if (e->w > 0 && e->h > 0 && yy >= e->y && yy < e->y + e->h && xx >= e->x && xx < e->x + e->w)
            return e->random
                       ? rn_erase_value(j->erase_key, j->erase_epoch, e->rec, (uint32_t)((int64_t)yy * j->w * j->c + k))
                       : 0.0f;
    }
    return ((float)xr[k] / 255.0f - j->mean[ch]) / j->std[ch];
}

/* image rows [r0, r1) of the n*h rows: the float operations of torchvision's reference,
   on the values rn_input_normalize computes */
static void mix_rows(void *ctx, int64_t r0, int64_t r1) {
    const mix_job *j = ctx;
    const rn_mix_desc *d = j->d;
    const int64_t wc = (int64_t)j->w * j->c, img = j->h * wc;
    const float la = (float)d->lambda, lb = (float)(1.0 - d->lambda);
    for (int64_t r = r0; r < r1; r++) {
        int i = (int)(r / j->h), yy = (int)(r % j->h), p = (i + j->n - 1) % j->n;
        const uint8_t *xa = j->x + r * wc, *xb = j->x + (int64_t)p * img + (int64_t)yy * wc;
        float *y = j->y + r * wc;
        int in_rows = d->kind == RN_MIX_CUTMIX && yy >= d->y0 && yy < d->y1;
        for (int64_t k = 0; k < wc; k++) {
            int xx = (int)(k / j->c);
            float a = mix_input(j, i, yy, k, xa), b = mix_input(j, p, yy, k, xb);
            if (d->kind == RN_MIX_MIXUP) {
                float ta = a * la, tb = b * lb;
                y[k] = ta + tb;
            } else
                y[k] = in_rows && xx >= d->x0 && xx < d->x1 ? b : a;
        }
    }
}

static int cpu_input_mix(rn_backend *be, int dtype, const rn_mix_desc *d, int n, int h, int w, int c, const uint8_t *x,
                         const float *mean, const float *std, const rn_erase *erase, uint64_t erase_key,
                         int64_t erase_epoch, void *yv) {
    (void)dtype;
    mix_job j = {.d = d, .x = x, .mean = mean, .std = std, .y = yv, .n = n, .h = h, .w = w, .c = c};
    j.erase = erase;
    j.erase_key = erase_key;
    j.erase_epoch = erase_epoch;
    int64_t wc = (int64_t)w * c;
    par_range(be, (int64_t)n * h, rows_per_chunk(wc), (int64_t)n * h * wc, mix_rows, &j);
    return RN_OK;
}

/* ---- pooling ---- */

/* Output rows [row0, row1) of (n*p) rows. */
RN_HOT static void maxpool_fwd_rows(void *ctx, int64_t row0, int64_t row1) {
    const ew_job *jb = ctx;
    const rn_pool_desc *d = jb->pd;
    const float *x = jb->a;
    float *y = jb->y;
    const int C = d->c;
    for (int64_t row = row0; row < row1; row++) {
        int ni = (int)(row / d->p), pi = (int)(row % d->p);
        for (int qi = 0; qi < d->q; qi++) {
            float *yo = y + ((row * d->q) + qi) * C;
            for (int j = 0; j < C; j++) yo[j] = -INFINITY;
            for (int i = 0; i < d->kh; i++) {
                int hi = pi * d->stride_h - d->pad_h + i;
                if (hi < 0 || hi >= d->h) continue;
                for (int s = 0; s < d->kw; s++) {
                    int wi = qi * d->stride_w - d->pad_w + s;
                    if (wi < 0 || wi >= d->w) continue;
                    const float *xi = x + (((int64_t)ni * d->h + hi) * d->w + wi) * C;
                    /* torch propagates NaN: (v > max) || isnan(v) */
#pragma omp simd
                    for (int j = 0; j < C; j++) yo[j] = (xi[j] > yo[j] || xi[j] != xi[j]) ? xi[j] : yo[j];
                }
            }
        }
    }
}

static int cpu_maxpool_fwd(rn_backend *be, const rn_pool_desc *d, const void *xv, void *yv) {
    ew_job j = {.a = xv, .y = yv, .pd = d};
    int64_t rows = (int64_t)d->n * d->p;
    par_range(be, rows, 1, rows * d->q * d->c, maxpool_fwd_rows, &j);
    return RN_OK;
}

enum { POOL_CB = 64 };

/* Jobs [job0, job1): one image and one block of POOL_CB channels each, because windows
 * overlap and a job must own what it adds to. Each window's gradient goes where torch's
 * max_pool2d puts its index: the first maximum, or the last NaN when the window holds one
 * (its forward takes v when v > max || isnan(v)). */
RN_HOT static void maxpool_bwd_jobs(void *ctx, int64_t job0, int64_t job1) {
    const ew_job *jb = ctx;
    const rn_pool_desc *d = jb->pd;
    const float *x = jb->a, *y = jb->b, *dy = jb->c;
    float *dx = jb->y;
    const int C = d->c, ncb = (C + POOL_CB - 1) / POOL_CB;
    for (int64_t job = job0; job < job1; job++) {
        int ni = (int)(job / ncb), c0 = (int)(job % ncb) * POOL_CB;
        int cb = C - c0 < POOL_CB ? C - c0 : POOL_CB;
        int sel[POOL_CB];   /* window position (i*kw + s) that receives the gradient, -1: none yet */
        for (int pi = 0; pi < d->p; pi++)
            for (int qi = 0; qi < d->q; qi++) {
                int64_t o = ((((int64_t)ni * d->p) + pi) * d->q + qi) * C + c0;
                const float *yr = y + o, *dyr = dy + o;
                for (int j = 0; j < cb; j++) sel[j] = -1;
                for (int i = 0; i < d->kh; i++) {
                    int hi = pi * d->stride_h - d->pad_h + i;
                    if (hi < 0 || hi >= d->h) continue;
                    for (int s = 0; s < d->kw; s++) {
                        int wi = qi * d->stride_w - d->pad_w + s;
                        if (wi < 0 || wi >= d->w) continue;
                        const float *xr = x + (((int64_t)ni * d->h + hi) * d->w + wi) * C + c0;
                        int k = i * d->kw + s;
#pragma omp simd
                        for (int j = 0; j < cb; j++) {
                            int nan = yr[j] != yr[j];
                            int hit = nan ? xr[j] != xr[j] : sel[j] < 0 && xr[j] == yr[j];
                            sel[j] = hit ? k : sel[j];
                        }
                    }
                }
                for (int j = 0; j < cb; j++) {
                    if (sel[j] < 0) continue;
                    int hi = pi * d->stride_h - d->pad_h + sel[j] / d->kw;
                    int wi = qi * d->stride_w - d->pad_w + sel[j] % d->kw;
                    dx[(((int64_t)ni * d->h + hi) * d->w + wi) * C + c0 + j] += dyr[j];
                }
            }
    }
}

static int cpu_maxpool_bwd(rn_backend *be, const rn_pool_desc *d, const void *xv,
                           const void *yv, const void *dyv, void *dxv) {
    cpu_zero(be, dxv, (size_t)d->n * d->h * d->w * d->c * sizeof(float));
    ew_job j = {.a = xv, .b = yv, .c = dyv, .y = dxv, .pd = d};
    int64_t jobs = (int64_t)d->n * ((d->c + POOL_CB - 1) / POOL_CB);
    par_range(be, jobs, 1, (int64_t)d->n * d->p * d->q * d->c, maxpool_bwd_jobs, &j);
    return RN_OK;
}

/* Images [n0, n1): y = mean over hw of x. */
static void gap_fwd_imgs(void *ctx, int64_t n0, int64_t n1) {
    const ew_job *j = ctx;
    const int64_t c = j->width;
    for (int64_t ni = n0; ni < n1; ni++) {
        float *yo = j->y + ni * c;
        for (int64_t k = 0; k < c; k++) yo[k] = 0;
        for (int s = 0; s < j->hw; s++) {
            const float *xi = j->a + (ni * j->hw + s) * c;
#pragma omp simd
            for (int64_t k = 0; k < c; k++) yo[k] += xi[k];
        }
        for (int64_t k = 0; k < c; k++) yo[k] /= (float)j->hw;
    }
}

static int cpu_gap_fwd(rn_backend *be, int dtype, int n, int hw, int c, const void *xv,
                       void *yv) {
    (void)dtype;
    ew_job j = {.a = xv, .y = yv, .width = c, .hw = hw};
    par_range(be, n, 1, (int64_t)n * hw * c, gap_fwd_imgs, &j);
    return RN_OK;
}

/* Rows [r0, r1) of (n*hw): dx = dy / hw. */
static void gap_bwd_rows(void *ctx, int64_t r0, int64_t r1) {
    const ew_job *j = ctx;
    const int64_t c = j->width;
    for (int64_t r = r0; r < r1; r++) {
        const float *g = j->a + (r / j->hw) * c;
        float *o = j->y + r * c;
#pragma omp simd
        for (int64_t k = 0; k < c; k++) o[k] = g[k] * j->scale;
    }
}

static int cpu_gap_bwd(rn_backend *be, int dtype, int n, int hw, int c, const void *dyv,
                       void *dxv) {
    (void)dtype;
    ew_job j = {.a = dyv, .y = dxv, .width = c, .hw = hw, .scale = 1.0f / (float)hw};
    par_range(be, (int64_t)n * hw, rows_per_chunk(c), (int64_t)n * hw * c, gap_bwd_rows, &j);
    return RN_OK;
}

/* ---- the train top-1 (rn_top1_count): the first maximum, as the definition reads ---- */
static int cpu_top1_count(rn_backend *be, int n, int classes, const float *logits, const int32_t *labels,
                          int target, const int32_t *target_at, int32_t *hits) {
    (void)be;
    if (target_at) target = *target_at;
    int32_t count = 0;
    for (int i = 0; i < n; i++) {
        const float *z = logits + (int64_t)i * classes;
        int best = 0;
        for (int j = 1; j < classes; j++)
            if (z[j] > z[best]) best = j;
        int a = labels[i], p = labels[(i + n - 1) % n];
        int want = rn_top1_want(target, a, p);
        count += best == want;
    }
    *hits = count;
    return RN_OK;
}

/* ---- loss ---- */

/* One thread on purpose: n*classes is small next to any conv, and a sequential sum keeps
 * the loss independent of the thread count. */
static int cpu_softmax_xent(rn_backend *be, const rn_xent_desc *d, const void *lv,
                            const int32_t *labels, float *loss, void *dlv) {
    (void)be;
    const float *logits = lv;
    float *dl = dlv;
    const int n = d->n, k = d->classes;
    const double e = d->label_smoothing, m = d->mix_weight_at ? *d->mix_weight_at : d->mix_weight;
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= k)
            return rn_errorf(RN_EINVAL, "softmax_xent: row %d: label %d out of range [0, %d)",
                             i, labels[i], k);
    double total = 0;
    for (int i = 0; i < n; i++) {
        const float *z = logits + (int64_t)i * k;
        double mx = -INFINITY, se = 0, sz = 0;
        for (int j = 0; j < k; j++) mx = z[j] > mx ? z[j] : mx;
        for (int j = 0; j < k; j++) {
            se += exp(z[j] - mx);
            sz += z[j];
        }
        double lse = mx + log(se);
        if (m == 0) {
            total += lse - (1 - e) * z[labels[i]] - e * sz / k;
        } else {
            int b = labels[(i + n - 1) % n];
            total += lse - (1 - e) * ((1 - m) * z[labels[i]] + m * z[b]) - e * sz / k;
        }
        if (dl) {
            float *g = dl + (int64_t)i * k;
            double s = d->grad_scale / n;
            if (m == 0) {
                for (int j = 0; j < k; j++) {
                    double t = (j == labels[i] ? 1 - e : 0) + e / k;
                    g[j] = (float)((exp(z[j] - lse) - t) * s);
                }
            } else {
                int b = labels[(i + n - 1) % n];
                for (int j = 0; j < k; j++) {
                    double t = (1 - e) * ((j == labels[i] ? 1 - m : 0) + (j == b ? m : 0)) + e / k;
                    g[j] = (float)((exp(z[j] - lse) - t) * s);
                }
            }
        }
    }
    *loss = (float)(total / n);
    return RN_OK;
}

/* ---- SGD: float operations in torch's order ---- */

typedef struct {
    const rn_sgd_desc *d;
    float lr; /* d->lr, or what d->lr_at holds */
    float *p, *buf;
    const float *grad;
    void *copy; /* rn_sgd_update_copy's compute copy, in d->dtype, or NULL */
} sgd_job;

static void store_range(int dtype, void *y, const float *v, int64_t i0, int64_t i1);

RN_HOT static void sgd_range(void *ctx, int64_t i0, int64_t i1) {
    const sgd_job *j = ctx;
    const rn_sgd_desc *d = j->d;
    float *p = j->p, *buf = j->buf;
    const float *grad = j->grad;
    const float lr = j->lr, mom = d->momentum, damp1 = 1.0f - d->dampening,
                wd = d->weight_decay, gs = d->grad_scale;
    const int nesterov = d->nesterov, first = d->first_step;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float g = gs == 1.0f ? grad[i] : grad[i] * gs;
        if (wd != 0) g = g + wd * p[i];
        if (mom != 0) {
            float b = first ? g : buf[i] * mom + damp1 * g;
            buf[i] = b;
            g = nesterov ? g + mom * b : b;
        }
        p[i] = p[i] + -lr * g;
    }
    /* the compute copy of this piece while it is in cache; the loop above stays the
     * plain fp32 update */
    if (j->copy) store_range(d->dtype, j->copy, p, i0, i1);
}

static int cpu_sgd_update(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p,
                          const float *grad, float *buf, void *copy) {
    if (d->skip_if && *d->skip_if) return RN_OK;
    sgd_job j = {d, d->lr_at ? *d->lr_at : d->lr, p, buf, grad, copy};
    par_range(be, n, ELEMS_PER_CHUNK, n, sgd_range, &j);
    return RN_OK;
}

/* ---- LARS: per-tensor norms in a fixed order, then the elementwise step ----
 * Not RN_HOT: the AVX-512 clone may contract a*b+c into a fused multiply-add, and these
 * loops must round as the CUDA kernels (which forbid it) and the baseline build do. */

typedef struct {
    const rn_lars_desc *d;
    float *p, *buf;
    const float *grad;
    void *copy;
    int64_t n;
    double *part; /* (chunks, 2): sum of p^2, sum of (grad_scale * grad)^2 */
    float slr;    /* lr * trust */
} lars_job;

/* Chunk c's sum of (gs * x)^2 (gs 1: x as it is), in double, in RN_LARS_LANES lanes
 * (lane l: elements l, l + LANES, ... of the chunk, in order), then the lanes added in
 * lane order: the order a CUDA block of LANES threads reads coalesced, and one the
 * compiler vectorises here. LARS's norms and rn_sumsq's both. */
static double chunk_sumsq(const float *x, int64_t n, int64_t c, float gs) {
    int64_t i0 = c * RN_LARS_CHUNK, i1 = i0 + RN_LARS_CHUNK < n ? i0 + RN_LARS_CHUNK : n;
    double lane[RN_LARS_LANES] = {0};
    for (int64_t b = i0; b < i1; b += RN_LARS_LANES) {
        int m = i1 - b < RN_LARS_LANES ? (int)(i1 - b) : RN_LARS_LANES;
        const float *v = x + b;
        for (int l = 0; l < m; l++) {
            float g = gs == 1.0f ? v[l] : v[l] * gs;
            lane[l] += (double)g * (double)g;
        }
    }
    double s = 0;
    for (int l = 0; l < RN_LARS_LANES; l++) s += lane[l];
    return s;
}

static void lars_norm_chunks(void *ctx, int64_t c0, int64_t c1) {
    const lars_job *j = ctx;
    for (int64_t c = c0; c < c1; c++) {
        j->part[2 * c] = chunk_sumsq(j->p, j->n, c, 1.0f);
        j->part[2 * c + 1] = chunk_sumsq(j->grad, j->n, c, j->d->grad_scale);
    }
}

static void lars_range(void *ctx, int64_t i0, int64_t i1) {
    const lars_job *j = ctx;
    const rn_lars_desc *d = j->d;
    float *p = j->p, *buf = j->buf;
    const float *grad = j->grad;
    const float slr = j->slr, mom = d->momentum, wd = d->weight_decay, gs = d->grad_scale;
    for (int64_t i = i0; i < i1; i++) {
        float g = gs == 1.0f ? grad[i] : grad[i] * gs;
        if (wd != 0) g = g + wd * p[i];
        float b = buf[i] * mom + slr * g;
        buf[i] = b;
        p[i] = p[i] - b;
    }
    if (j->copy) store_range(d->dtype, j->copy, p, i0, i1);
}

/* trust and lr * trust from the two norms' squares, in double, as the CUDA kernel does */
static float lars_scaled_lr(const rn_lars_desc *d, float lr, double sw, double sg) {
    double wn = sqrt(sw), gn = sqrt(sg), trust = 1.0;
    if (d->adapt && wn > 0 && gn > 0)
        trust = (double)d->eta * wn / (gn + (double)d->weight_decay * wn + (double)d->eps);
    return (float)((double)lr * trust);
}

static int cpu_lars_update(rn_backend *be, const rn_lars_desc *d, int64_t n, float *p, const float *grad, float *buf,
                           void *copy) {
    if (d->skip_if && *d->skip_if) return RN_OK;
    const float lr = d->lr_at ? *d->lr_at : d->lr;
    lars_job j = {d, p, buf, grad, copy, n, be->ws, lr};
    if (d->adapt) {
        int64_t chunks = (n + RN_LARS_CHUNK - 1) / RN_LARS_CHUNK;
        par_range(be, chunks, 1, n, lars_norm_chunks, &j);
        double sw = 0, sg = 0;
        for (int64_t c = 0; c < chunks; c++) {
            sw += j.part[2 * c];
            sg += j.part[2 * c + 1];
        }
        j.slr = lars_scaled_lr(d, lr, sw, sg);
    }
    par_range(be, n, ELEMS_PER_CHUNK, n, lars_range, &j);
    return RN_OK;
}

/* ---- the sum of squares (--clip-grad-norm's gradient norm), in LARS's order ---- */

typedef struct {
    const float *x;
    int64_t n;
    double *part; /* (chunks) */
} sumsq_job;

static void sumsq_chunks(void *ctx, int64_t c0, int64_t c1) {
    const sumsq_job *j = ctx;
    for (int64_t c = c0; c < c1; c++) j->part[c] = chunk_sumsq(j->x, j->n, c, 1.0f);
}

static int cpu_sumsq(rn_backend *be, int64_t n, const float *x, double *out) {
    int64_t chunks = (n + RN_LARS_CHUNK - 1) / RN_LARS_CHUNK;
    sumsq_job j = {x, n, be->ws};
    if (chunks > 0) par_range(be, chunks, 1, n, sumsq_chunks, &j);
    double s = 0;
    for (int64_t c = 0; c < chunks; c++) s += j.part[c];
    *out = s;
    return RN_OK;
}

/* ---- conversions (storage: fp32, fp16, bf16) and the non-finite check ---- */

static float load1(int dtype, const void *x, int64_t i) {
    if (dtype == RN_F16) return rn_f16_to_f32(((const uint16_t *)x)[i]);
    if (dtype == RN_BF16) return rn_bf16_to_f32(((const uint16_t *)x)[i]);
    return ((const float *)x)[i];
}

static void store1(int dtype, void *y, int64_t i, float v) {
    if (dtype == RN_F16) ((uint16_t *)y)[i] = rn_f32_to_f16(v);
    else if (dtype == RN_BF16) ((uint16_t *)y)[i] = rn_f32_to_bf16(v);
    else ((float *)y)[i] = v;
}

/* y[i0..i1) = v[i0..i1) in dtype */
static void store_range(int dtype, void *y, const float *v, int64_t i0, int64_t i1) {
    if (dtype == RN_F32) memcpy((float *)y + i0, v + i0, sizeof(float) * (size_t)(i1 - i0));
    else
        for (int64_t i = i0; i < i1; i++) store1(dtype, y, i, v[i]);
}

typedef struct {
    int src, dst, accumulate;
    const void *x;
    void *y;
    const float *xf;
    int32_t *flag;
} cast_job;

static void cast_range(void *ctx, int64_t i0, int64_t i1) {
    const cast_job *j = ctx;
    for (int64_t i = i0; i < i1; i++)
        store1(j->dst, j->y, i,
               j->accumulate ? load1(j->dst, j->y, i) + load1(j->src, j->x, i) : load1(j->src, j->x, i));
}

static int cpu_cast(rn_backend *be, int src, int dst, int64_t n, const void *x, void *y,
                    int accumulate) {
    cast_job j = {.src = src, .dst = dst, .accumulate = accumulate, .x = x, .y = y};
    par_range(be, n, ELEMS_PER_CHUNK, n, cast_range, &j);
    return RN_OK;
}

static void nonfinite_range(void *ctx, int64_t i0, int64_t i1) {
    const cast_job *j = ctx;
    int any = 0;
    for (int64_t i = i0; i < i1; i++) any |= !isfinite(j->xf[i]);
    /* pieces only ever store 1: the order in which they do cannot matter */
    if (any) __atomic_store_n(j->flag, 1, __ATOMIC_RELAXED);
}

static int cpu_nonfinite(rn_backend *be, int64_t n, const float *x, int32_t *flag) {
    cast_job j = {.xf = x, .flag = flag};
    par_range(be, n, ELEMS_PER_CHUNK, n, nonfinite_range, &j);
    return RN_OK;
}

/* ---- the weights' moving average: torch's decay * avg + (1 - decay) * x, no FMA ---- */

typedef struct {
    const float *x;
    float *avg;
    float keep, take;
} ema_job;

static void ema_range(void *ctx, int64_t i0, int64_t i1) {
    const ema_job *j = ctx;
    const float keep = j->keep, take = j->take;
    const float *x = j->x;
    float *avg = j->avg;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) avg[i] = keep * avg[i] + take * x[i];
}

static int cpu_ema_update(rn_backend *be, int64_t n, const float *x, float *avg, float keep, float take) {
    ema_job j = {x, avg, keep, take};
    par_range(be, n, ELEMS_PER_CHUNK, n, ema_range, &j);
    return RN_OK;
}

/* ---- the table ---- */

static void cpu_destroy(rn_backend *be) {
    rn_cpu_pool_destroy(be->impl);
    be->impl = NULL;
}

static const rn_backend_ops cpu_ops = {
    .kind = "cpu",
    .is_host = 1,
    .dtypes = 1u << RN_F32,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .put = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .mem_info = cpu_mem_info,
    .ws_limit = 0,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .upload_async = cpu_upload_parts,
    .upload_wait = cpu_upload_wait,
    .conv_workspace = rn_cpu_conv_workspace,
    .conv_algo = rn_cpu_conv_algo,
    .conv_fwd = rn_cpu_conv_fwd,
    .conv_bias_fwd = rn_cpu_conv_bias_fwd,
    .conv_bias_packed_bytes = rn_cpu_conv_bias_packed_bytes,
    .conv_bias_pack = rn_cpu_conv_bias_pack,
    .conv_bwd_data = rn_cpu_conv_bwd_data,
    .conv_bwd_filter = rn_cpu_conv_bwd_filter,
    .bn_workspace = cpu_bn_workspace,
    .bn_reserve_size = cpu_bn_reserve_size,
    .bn_fwd_train = cpu_bn_fwd_train,
    .bn_fwd_infer = cpu_bn_fwd_infer,
    .bn_bwd = cpu_bn_bwd,
    .bn_bwd_frozen = cpu_bn_bwd_frozen,
    .add = cpu_add,
    .relu_fwd = cpu_relu_fwd,
    .relu_bwd = cpu_relu_bwd,
    .input_normalize = cpu_input_normalize,
    .input_erase = cpu_input_erase,
    .input_mix = cpu_input_mix,
    .maxpool_fwd = cpu_maxpool_fwd,
    .maxpool_bwd = cpu_maxpool_bwd,
    .avgpool_global_fwd = cpu_gap_fwd,
    .avgpool_global_bwd = cpu_gap_bwd,
    .fc_workspace = rn_cpu_fc_workspace,
    .fc_fwd = rn_cpu_fc_fwd,
    .fc_bwd = rn_cpu_fc_bwd,
    .softmax_xent = cpu_softmax_xent,
    .top1_count = cpu_top1_count,
    .sgd_update = cpu_sgd_update,
    .lars_update = cpu_lars_update,
    .sumsq = cpu_sumsq,
    .cast = cpu_cast,
    .nonfinite = cpu_nonfinite,
    .ema_update = cpu_ema_update,
};

int rn_backend_cpu_init(rn_backend *be) {
    rn_cpu_pool *pool = NULL;
    int rc = rn_cpu_pool_create(be->nthreads, &pool);
    if (rc != RN_OK) return rc;
    be->ops = &cpu_ops;
    be->impl = pool;
    /* opts.cpu_memory: the context behaves as a device of that size (allocations past
       it fail, rn_backend_mem_info reports it): out-of-memory paths, tested on the CPU */
    be->mem_cap = be->opts.cpu_memory;
    /* OpenBLAS's own pool stays idle: every GEMM is split across this context's pool
     * (backend_cpu_gemm.c says why). The setting is process-wide. */
    openblas_set_num_threads(1);
    /* the GEMMs' kernel: rn's own (backend_cpu_fused.c), or OpenBLAS's */
    int isa = rn_cpu_own_isa(be);
    const char *core = openblas_get_corename();
    if (isa)
        snprintf(be->name, sizeof be->name, "cpu: rn GEMM %s, %d thread%s",
                 isa == RN_GEMM_AVX512 ? "AVX-512" : isa == RN_GEMM_AVX2 ? "AVX2" : "portable C", be->nthreads,
                 be->nthreads == 1 ? "" : "s");
    else
        snprintf(be->name, sizeof be->name, "cpu: OpenBLAS %s, %d thread%s", core ? core : "?", be->nthreads,
                 be->nthreads == 1 ? "" : "s");
    return RN_OK;
}
