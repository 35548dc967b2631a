/* CPU backend, fp32: OpenBLAS for the GEMMs, OpenMP for everything else.
 * Convolutions and the fully connected layer live in backend_cpu_gemm.c. Arguments arrive checked (lib/backend.c).
 *
 * Reductions (BN statistics and gradients, the loss) are split into a fixed number of
 * chunks and summed in chunk order, in double, so results do not depend on the thread
 * count. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/backend_impl.h"
#include "rn/err.h"
#include "rn/tensor.h"

/* Loops shorter than this run on one thread: a parallel region costs a few microseconds. */
#define PAR_MIN 32768
/* BN reductions: fixed chunk count, independent of the thread count. */
#define BN_CHUNKS 32
/* Parallel loops hand out work in pieces of about this many elements, dynamically: on a
 * busy machine a thread the OS preempts then delays only its current piece instead of
 * holding the whole team at the closing barrier for its static half. */
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

static int cpu_alloc(rn_backend *be, size_t bytes, void **out) {
    (void)be;
    void *p = NULL;
    size_t n = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, n ? n : 64) != 0)
        return rn_errorf(RN_ENOMEM, "out of memory allocating %zu bytes", bytes);
    *out = p;
    return RN_OK;
}

static void cpu_free(rn_backend *be, void *p) {
    (void)be;
    free(p);
}

static int cpu_copy(rn_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
    return RN_OK;
}

static int cpu_zero(rn_backend *be, void *dst, size_t bytes) {
    int nt = be->nthreads;
    /* Large activation buffers are zeroed in parallel: one core cannot fill the bandwidth. */
    if (bytes < (size_t)PAR_MIN * 16 || nt == 1) {
        memset(dst, 0, bytes);
        return RN_OK;
    }
    char *p = dst;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < nt; t++) {
        size_t a = bytes * t / nt, b = bytes * (t + 1) / nt;
        memset(p + a, 0, b - a);
    }
    return RN_OK;
}

static int cpu_sync(rn_backend *be) {
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

/* Per-channel sum and sum of squares of x (m, c), in double, left in part[0..c) and
 * part[c..2c) (chunk 0's slots). */
static void bn_moments(int nt, int64_t m, int c, const float *x, double *part) {
    int64_t nch = bn_chunks(m);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (m * c >= PAR_MIN)
    for (int64_t ch = 0; ch < nch; ch++) {
        double *a = part + ch * 2 * c, *b = a + c;
        for (int j = 0; j < c; j++) a[j] = b[j] = 0;
        for (int64_t r = m * ch / nch; r < m * (ch + 1) / nch; r++) {
            const float *xr = x + r * c;
#pragma omp simd
            for (int j = 0; j < c; j++) {
                double v = xr[j];
                a[j] += v;
                b[j] += v * v;
            }
        }
    }
    for (int64_t ch = 1; ch < nch; ch++)
        for (int j = 0; j < 2 * c; j++) part[j] += part[ch * 2 * c + j];
}

/* y = [relu](x*scale + shift [+ res]) per channel. */
static void bn_apply(int nt, int64_t m, int c, const float *x, const float *scale,
                     const float *shift, const float *res, int relu, float *y) {
#pragma omp parallel for num_threads(nt) schedule(dynamic, rows_per_chunk(c)) if (m * c >= PAR_MIN)
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        const float *rr = res ? res + r * c : NULL;
        if (rr && relu) {
#pragma omp simd
            for (int j = 0; j < c; j++) {
                float v = xr[j] * scale[j] + shift[j] + rr[j];
                yr[j] = v > 0 ? v : 0;
            }
        } else if (rr) {
#pragma omp simd
            for (int j = 0; j < c; j++) yr[j] = xr[j] * scale[j] + shift[j] + rr[j];
        } else if (relu) {
#pragma omp simd
            for (int j = 0; j < c; j++) {
                float v = xr[j] * scale[j] + shift[j];
                yr[j] = v > 0 ? v : 0;
            }
        } else {
#pragma omp simd
            for (int j = 0; j < c; j++) yr[j] = xr[j] * scale[j] + shift[j];
        }
    }
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
    bn_moments(be->nthreads, m, c, xv, part);
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
    bn_apply(be->nthreads, m, c, xv, scale, shift, res, d->relu, y);
    return RN_OK;
}

static int cpu_bn_fwd_infer(rn_backend *be, const rn_bn_desc *d, const void *x,
                            const float *gamma, const float *beta, const float *running_mean,
                            const float *running_var, const void *res, void *y) {
    const int c = d->c;
    /* Inference needs no workspace (the model may run eval without reserving), so the
     * two coefficient rows go in stack-bounded blocks of channels. */
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
            bn_apply(be->nthreads, d->m, c, x, scale, shift, res, d->relu, y);
            break;
        }
        /* channel block of a wider tensor: strided rows */
        const float *xf = x, *rf = res;
        float *yf = y;
        int relu = d->relu;
#pragma omp parallel for num_threads(be->nthreads) schedule(dynamic, rows_per_chunk(c)) if (d->m * cb >= PAR_MIN)
        for (int64_t r = 0; r < d->m; r++) {
            const float *xr = xf + r * c + j0;
            float *yr = yf + r * c + j0;
            for (int j = 0; j < cb; j++) {
                float v = xr[j] * scale[j] + shift[j];
                if (rf) v += rf[r * c + j0 + j];
                yr[j] = relu && !(v > 0) ? 0 : v;
            }
        }
    }
    return RN_OK;
}

/* Rows [r0, r1) of BN backward pass 1: dz = dy masked by the ReLU (stored in dres when
 * given), a += dz and b += dz*(x - mean) per channel. Sums run in float over blocks of
 * BN_BLOCK rows (fa, fb: 2c floats of scratch), then in double, so the inner loop is all
 * float and vectorises; one loop per case keeps branches out of it. */
#define BN_BLOCK 16
RN_HOT static void bn_bwd_sums(int64_t r0, int64_t r1, int c, const float *x, const float *y,
                               const float *dy, const float *mean, float *dres, double *a,
                               double *b, float *fa, int relu) {
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
                        float dz = yr[j] > 0 ? dyr[j] : 0.0f;
                        dr[j] = dz;
                        fa[j] += dz;
                        fb[j] += dz * (xr[j] - mean[j]);
                    }
                } else {
#pragma omp simd
                    for (int j = 0; j < c; j++) {
                        float dz = yr[j] > 0 ? dyr[j] : 0.0f;
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
RN_HOT static void bn_bwd_dx(int64_t r0, int64_t r1, int c, const float *x, const float *y,
                             const float *dy, const float *mean, const float *ka,
                             const float *kb, const float *k0, float *dx, int relu) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * c, *dyr = dy + r * c;
        float *dxr = dx + r * c;
        if (relu) {
            const float *yr = y + r * c;
#pragma omp simd
            for (int j = 0; j < c; j++) {
                float dz = yr[j] > 0 ? dyr[j] : 0.0f;
                dxr[j] = ka[j] * dz - k0[j] - kb[j] * (xr[j] - mean[j]);
            }
        } else {
#pragma omp simd
            for (int j = 0; j < c; j++)
                dxr[j] = ka[j] * dyr[j] - k0[j] - kb[j] * (xr[j] - mean[j]);
        }
    }
}

static int cpu_bn_bwd(rn_backend *be, const rn_bn_desc *d, const void *xv, const void *yv,
                      const void *dyv, const float *gamma, const float *save_mean,
                      const float *save_invstd, void *dxv, float *dgamma, float *dbeta,
                      void *dresv, void *reserve, int accumulate) {
    (void)reserve;
    const int c = d->c, relu = d->relu, nt = be->nthreads;
    const int64_t m = d->m, nch = bn_chunks(m);
    const float *x = xv, *y = yv, *dy = dyv;
    float *dx = dxv, *dres = dresv;
    double *part = be->ws;
    float *ka = (float *)(part + nch * 2 * c), *kb = ka + c, *k0 = kb + c, *fs = k0 + c;

#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (m * c >= PAR_MIN)
    for (int64_t ch = 0; ch < nch; ch++) {
        double *a = part + ch * 2 * c, *b = a + c;
        for (int j = 0; j < c; j++) a[j] = b[j] = 0;
        bn_bwd_sums(m * ch / nch, m * (ch + 1) / nch, c, x, y, dy, save_mean, dres, a, b,
                    fs + ch * 2 * c, relu);
    }
    for (int64_t ch = 1; ch < nch; ch++)
        for (int j = 0; j < 2 * c; j++) part[j] += part[ch * 2 * c + j];
    for (int j = 0; j < c; j++) {
        double sdz = part[j], sdzx = part[c + j], is = save_invstd[j];
        double dg = sdzx * is, db = sdz;
        dgamma[j] = accumulate ? dgamma[j] + (float)dg : (float)dg;
        dbeta[j] = accumulate ? dbeta[j] + (float)db : (float)db;
        /* dx = a*(dz - sdz/m) - b*(x - mean), a = gamma*invstd, b = a*invstd^2*sdzx/m */
        double a = gamma[j] * is;
        ka[j] = (float)a;
        kb[j] = (float)(a * is * is * sdzx / m);
        k0[j] = (float)(a * sdz / m);
    }

    const int64_t rc = rows_per_chunk(c), nrc = (m + rc - 1) / rc;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (m * c >= PAR_MIN)
    for (int64_t i = 0; i < nrc; i++) {
        int64_t r1 = (i + 1) * rc < m ? (i + 1) * rc : m;
        bn_bwd_dx(i * rc, r1, c, x, y, dy, save_mean, ka, kb, k0, dx, relu);
    }
    return RN_OK;
}

/* ---- elementwise ---- */

static int cpu_add(rn_backend *be, int dtype, int64_t n, const void *av, const void *bv,
                   void *yv, int relu) {
    (void)dtype;
    const float *a = av, *b = bv;
    float *y = yv;
    if (relu) {
#pragma omp parallel for simd num_threads(be->nthreads) schedule(dynamic, ELEMS_PER_CHUNK) if (n >= PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            float v = a[i] + b[i];
            y[i] = v > 0 ? v : 0;
        }
    } else {
#pragma omp parallel for simd num_threads(be->nthreads) schedule(dynamic, ELEMS_PER_CHUNK) if (n >= PAR_MIN)
        for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
    }
    return RN_OK;
}

static int cpu_relu_fwd(rn_backend *be, int dtype, int64_t n, const void *xv, void *yv) {
    (void)dtype;
    const float *x = xv;
    float *y = yv;
#pragma omp parallel for simd num_threads(be->nthreads) schedule(dynamic, ELEMS_PER_CHUNK) if (n >= PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0;
    return RN_OK;
}

static int cpu_relu_bwd(rn_backend *be, int dtype, int64_t n, const void *yv, const void *dyv,
                        void *dxv) {
    (void)dtype;
    const float *y = yv, *dy = dyv;
    float *dx = dxv;
#pragma omp parallel for simd num_threads(be->nthreads) schedule(dynamic, ELEMS_PER_CHUNK) if (n >= PAR_MIN)
    for (int64_t i = 0; i < n; i++) dx[i] = y[i] > 0 ? dy[i] : 0;
    return RN_OK;
}

static int cpu_input_normalize(rn_backend *be, int dtype, int64_t m, int c, const uint8_t *x,
                               const float *mean, const float *std, void *yv) {
    (void)dtype;
    float *y = yv;
    /* the same float operations as ToTensor (x/255) then Normalize ((t - mean)/std) */
#pragma omp parallel for num_threads(be->nthreads) schedule(dynamic, rows_per_chunk(c)) if (m * c >= PAR_MIN)
    for (int64_t r = 0; r < m; r++)
        for (int j = 0; j < c; j++) y[r * c + j] = ((float)x[r * c + j] / 255.0f - mean[j]) / std[j];
    return RN_OK;
}

/* ---- pooling ---- */

static int cpu_maxpool_fwd(rn_backend *be, const rn_pool_desc *d, const void *xv, void *yv) {
    const float *x = xv;
    float *y = yv;
    const int C = d->c;
    const int64_t rows = (int64_t)d->n * d->p;
#pragma omp parallel for num_threads(be->nthreads) schedule(dynamic, 1) if (rows * d->q * C >= PAR_MIN)
    for (int64_t row = 0; row < rows; row++) {
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
    return RN_OK;
}

static int cpu_maxpool_bwd(rn_backend *be, const rn_pool_desc *d, const void *xv,
                           const void *yv, const void *dyv, void *dxv) {
    const float *x = xv, *y = yv, *dy = dyv;
    float *dx = dxv;
    const int C = d->c;
    enum { CB = 64 };
    const int ncb = (C + CB - 1) / CB;
    const int64_t jobs = (int64_t)d->n * ncb;
    cpu_zero(be, dx, (size_t)d->n * d->h * d->w * C * sizeof(float));
    /* windows overlap, so each job owns one image and one block of channels */
#pragma omp parallel for num_threads(be->nthreads) schedule(dynamic, 1) if ((int64_t)d->n * d->p * d->q * C >= PAR_MIN)
    for (int64_t job = 0; job < jobs; job++) {
        int ni = (int)(job / ncb), c0 = (int)(job % ncb) * CB;
        int cb = C - c0 < CB ? C - c0 : CB;
        float done[CB];   /* 1 once a channel's maximum is found: float keeps the loop vectorisable */
        for (int pi = 0; pi < d->p; pi++)
            for (int qi = 0; qi < d->q; qi++) {
                int64_t o = ((((int64_t)ni * d->p) + pi) * d->q + qi) * C + c0;
                for (int j = 0; j < cb; j++) done[j] = 0;
                for (int i = 0; i < d->kh; i++) {
                    int hi = pi * d->stride_h - d->pad_h + i;
                    if (hi < 0 || hi >= d->h) continue;
                    for (int s = 0; s < d->kw; s++) {
                        int wi = qi * d->stride_w - d->pad_w + s;
                        if (wi < 0 || wi >= d->w) continue;
                        int64_t xi = (((int64_t)ni * d->h + hi) * d->w + wi) * C + c0;
                        const float *xr = x + xi, *yr = y + o, *dyr = dy + o;
                        float *dxr = dx + xi;
#pragma omp simd
                        for (int j = 0; j < cb; j++) {
                            int hit = done[j] == 0 && xr[j] == yr[j];
                            dxr[j] += hit ? dyr[j] : 0.0f;
                            done[j] = hit ? 1.0f : done[j];
                        }
                    }
                }
            }
    }
    return RN_OK;
}

static int cpu_gap_fwd(rn_backend *be, int dtype, int n, int hw, int c, const void *xv,
                       void *yv) {
    (void)dtype;
    const float *x = xv;
    float *y = yv;
#pragma omp parallel for num_threads(be->nthreads) schedule(dynamic, 1) if ((int64_t)n * hw * c >= PAR_MIN)
    for (int ni = 0; ni < n; ni++) {
        float *yo = y + (int64_t)ni * c;
        for (int j = 0; j < c; j++) yo[j] = 0;
        for (int s = 0; s < hw; s++) {
            const float *xi = x + ((int64_t)ni * hw + s) * c;
#pragma omp simd
            for (int j = 0; j < c; j++) yo[j] += xi[j];
        }
        for (int j = 0; j < c; j++) yo[j] /= (float)hw;
    }
    return RN_OK;
}

static int cpu_gap_bwd(rn_backend *be, int dtype, int n, int hw, int c, const void *dyv,
                       void *dxv) {
    (void)dtype;
    const float *dy = dyv;
    float *dx = dxv;
    const float inv = 1.0f / (float)hw;
#pragma omp parallel for num_threads(be->nthreads) schedule(dynamic, rows_per_chunk(c)) if ((int64_t)n * hw * c >= PAR_MIN)
    for (int64_t r = 0; r < (int64_t)n * hw; r++) {
        const float *g = dy + (r / hw) * c;
        float *o = dx + r * c;
#pragma omp simd
        for (int j = 0; j < c; j++) o[j] = g[j] * inv;
    }
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
    const double e = d->label_smoothing;
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
        total += lse - (1 - e) * z[labels[i]] - e * sz / k;
        if (dl) {
            float *g = dl + (int64_t)i * k;
            double s = d->grad_scale / n;
            for (int j = 0; j < k; j++) {
                double t = (j == labels[i] ? 1 - e : 0) + e / k;
                g[j] = (float)((exp(z[j] - lse) - t) * s);
            }
        }
    }
    *loss = (float)(total / n);
    return RN_OK;
}

/* ---- SGD: float operations in torch's order ---- */

RN_HOT static void sgd_range(int64_t i0, int64_t i1, const rn_sgd_desc *d, float *p,
                             const float *grad, float *buf) {
    const float lr = d->lr, mom = d->momentum, damp1 = 1.0f - d->dampening,
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
}

static int cpu_sgd_update(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p,
                          const float *grad, float *buf) {
    const int64_t chunks = (n + ELEMS_PER_CHUNK - 1) / ELEMS_PER_CHUNK;
#pragma omp parallel for num_threads(be->nthreads) schedule(dynamic, 1) if (n >= PAR_MIN)
    for (int64_t k = 0; k < chunks; k++) {
        int64_t i1 = (k + 1) * ELEMS_PER_CHUNK < n ? (k + 1) * ELEMS_PER_CHUNK : n;
        sgd_range(k * ELEMS_PER_CHUNK, i1, d, p, grad, buf);
    }
    return RN_OK;
}

/* ---- the table ---- */

static void cpu_destroy(rn_backend *be) { (void)be; }

static const rn_backend_ops cpu_ops = {
    .kind = "cpu",
    .is_host = 1,
    .dtypes = 1u << RN_F32,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .conv_workspace = rn_cpu_conv_workspace,
    .conv_fwd = rn_cpu_conv_fwd,
    .conv_bwd_data = rn_cpu_conv_bwd_data,
    .conv_bwd_filter = rn_cpu_conv_bwd_filter,
    .bn_workspace = cpu_bn_workspace,
    .bn_reserve_size = cpu_bn_reserve_size,
    .bn_fwd_train = cpu_bn_fwd_train,
    .bn_fwd_infer = cpu_bn_fwd_infer,
    .bn_bwd = cpu_bn_bwd,
    .add = cpu_add,
    .relu_fwd = cpu_relu_fwd,
    .relu_bwd = cpu_relu_bwd,
    .input_normalize = cpu_input_normalize,
    .maxpool_fwd = cpu_maxpool_fwd,
    .maxpool_bwd = cpu_maxpool_bwd,
    .avgpool_global_fwd = cpu_gap_fwd,
    .avgpool_global_bwd = cpu_gap_bwd,
    .fc_fwd = rn_cpu_fc_fwd,
    .fc_bwd = rn_cpu_fc_bwd,
    .softmax_xent = cpu_softmax_xent,
    .sgd_update = cpu_sgd_update,
};

int rn_backend_cpu_init(rn_backend *be) {
    be->ops = &cpu_ops;
    be->impl = NULL;
    /* OpenBLAS's own pool stays idle: backend_cpu_gemm.c splits every GEMM across this
     * context's OpenMP threads (why: see there). The setting is process-wide. */
    openblas_set_num_threads(1);
    const char *core = openblas_get_corename();
    snprintf(be->name, sizeof be->name, "cpu: OpenBLAS %s, %d thread%s", core ? core : "?",
             be->nthreads, be->nthreads == 1 ? "" : "s");
    return RN_OK;
}
