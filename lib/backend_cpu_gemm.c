/* CPU convolutions as OpenBLAS GEMMs over NHWC activations and OHWI weights.
 *
 * With M = n*p*q output positions and KC = kh*kw*c, the weights (k, kh, kw, c) are a
 * row-major (k, KC) matrix and the im2col rows of x, taken in (kh, kw, c) order, are a
 * (M, KC) matrix whose rows copy whole runs of contiguous channels. Then
 *   forward        y  (M, k)  = col (M, KC) * w^T
 *   backward data  dcol (M, KC) = dy (M, k) * w, scattered back into dx (col2im)
 *   backward filter dw (k, KC) = sum over row tiles of dy_tile^T * col_tile
 * A 1x1 stride-1 unpadded conv needs no im2col: x is already (M, c).
 * im2col runs over tiles of TILE_BYTES rows (the workspace), so the copy stays in cache
 * for the GEMM that reads it and memory does not grow with the batch. Tile boundaries
 * depend only on the shape, never on the thread count, so results do not either. */
#include <cblas.h>
#include <limits.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "rn/backend_impl.h"
#include "rn/err.h"

/* Workspace per conv: one im2col tile. Large enough that each tile's GEMM runs near
 * peak, small enough to stay in L2/L3 between the copy and the GEMM. */
#define TILE_BYTES ((size_t)4 << 20)
/* GEMMs with fewer rows than this lose efficiency faster than the cache helps. */
#define TILE_MIN_ROWS 128

static int pointwise(const rn_conv_desc *d) {
    return d->kh == 1 && d->kw == 1 && d->stride_h == 1 && d->stride_w == 1 && d->pad_h == 0 &&
           d->pad_w == 0;
}

static int64_t rows_total(const rn_conv_desc *d) { return (int64_t)d->n * d->p * d->q; }
static int64_t kcols(const rn_conv_desc *d) { return (int64_t)d->kh * d->kw * d->c; }

static int64_t tile_rows(const rn_conv_desc *d) {
    int64_t t = (int64_t)(TILE_BYTES / (kcols(d) * sizeof(float)));
    if (t < TILE_MIN_ROWS) t = TILE_MIN_ROWS;
    int64_t m = rows_total(d);
    return t < m ? t : m;
}

size_t rn_cpu_conv_workspace(rn_backend *be, const rn_conv_desc *d) {
    (void)be;
    if (pointwise(d)) return 0;
    return (size_t)tile_rows(d) * kcols(d) * sizeof(float);
}

/* cblas takes int sizes; refuse what would overflow them rather than wrap. */
static int check_int(const rn_conv_desc *d, const char *op) {
    int64_t m = rows_total(d), in = (int64_t)d->n * d->h * d->w;
    if (m > INT_MAX || in > INT_MAX || kcols(d) * d->k > INT_MAX)
        return rn_errorf(RN_EINVAL, "%s: shape too large for 32-bit BLAS (n=%d %dx%dx%d -> k=%d); "
                         "use a smaller batch", op, d->n, d->h, d->w, d->c, d->k);
    return RN_OK;
}

/* col (mt, KC) = im2col rows [m0, m0+mt) of x. */
static void im2col(int nt, const rn_conv_desc *d, const float *x, int64_t m0, int64_t mt,
                   float *col) {
    const int C = d->c, kw = d->kw, kh = d->kh, pq = d->p * d->q;
    const int64_t kc = kcols(d);
#pragma omp parallel for num_threads(nt) schedule(static) if (mt * kc >= 32768)
    for (int64_t r = 0; r < mt; r++) {
        int64_t m = m0 + r;
        int ni = (int)(m / pq), rem = (int)(m % pq);
        int pi = rem / d->q, qi = rem % d->q;
        float *dst = col + r * kc;
        int w0 = qi * d->stride_w - d->pad_w;
        for (int i = 0; i < kh; i++, dst += (int64_t)kw * C) {
            int hi = pi * d->stride_h - d->pad_h + i;
            if (hi < 0 || hi >= d->h) {
                memset(dst, 0, sizeof(float) * kw * C);
                continue;
            }
            const float *xrow = x + ((int64_t)ni * d->h + hi) * d->w * C;
            /* the kw positions of one kernel row are adjacent pixels: one copy when inside */
            if (w0 >= 0 && w0 + kw <= d->w) {
                memcpy(dst, xrow + (int64_t)w0 * C, sizeof(float) * kw * C);
                continue;
            }
            for (int j = 0; j < kw; j++) {
                int wj = w0 + j;
                if (wj < 0 || wj >= d->w) memset(dst + j * C, 0, sizeof(float) * C);
                else memcpy(dst + j * C, xrow + (int64_t)wj * C, sizeof(float) * C);
            }
        }
    }
}

/* dx += col2im(col) for rows [m0, m0+mt). Receptive fields overlap, so threads split the
 * channels instead of the rows: each thread owns a channel range of dx. */
static void col2im_add(int nt, const rn_conv_desc *d, const float *col, int64_t m0, int64_t mt,
                       float *dx) {
    const int C = d->c, kw = d->kw, kh = d->kh, pq = d->p * d->q;
    const int64_t kc = kcols(d);
    int threads = (mt * kc >= 32768 && C >= 16) ? nt : 1;
#pragma omp parallel num_threads(threads)
    {
        int t = 0, tn = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        tn = omp_get_num_threads();
#endif
        int c0 = C * t / tn, c1 = C * (t + 1) / tn;
        for (int64_t r = 0; r < mt; r++) {
            int64_t m = m0 + r;
            int ni = (int)(m / pq), rem = (int)(m % pq);
            int pi = rem / d->q, qi = rem % d->q;
            const float *src = col + r * kc;
            for (int i = 0; i < kh; i++) {
                int hi = pi * d->stride_h - d->pad_h + i;
                if (hi < 0 || hi >= d->h) continue;
                float *xrow = dx + ((int64_t)ni * d->h + hi) * d->w * C;
                for (int j = 0; j < kw; j++) {
                    int wj = qi * d->stride_w - d->pad_w + j;
                    if (wj < 0 || wj >= d->w) continue;
                    float *o = xrow + (int64_t)wj * C;
                    const float *s = src + ((int64_t)i * kw + j) * C;
#pragma omp simd
                    for (int c = c0; c < c1; c++) o[c] += s[c];
                }
            }
        }
    }
}

int rn_cpu_conv_fwd(rn_backend *be, const rn_conv_desc *d, const void *xv, const void *wv,
                    void *yv) {
    int rc = check_int(d, "conv_fwd");
    if (rc) return rc;
    const float *x = xv, *w = wv;
    float *y = yv;
    const int K = d->k;
    const int64_t M = rows_total(d), kc = kcols(d);
    if (pointwise(d)) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, K, d->c, 1.0f, x, d->c, w,
                    d->c, 0.0f, y, K);
        return RN_OK;
    }
    const int64_t mt = tile_rows(d);
    float *col = be->ws;
    for (int64_t m0 = 0; m0 < M; m0 += mt) {
        int64_t rows = M - m0 < mt ? M - m0 : mt;
        im2col(be->nthreads, d, x, m0, rows, col);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, K, (int)kc, 1.0f, col,
                    (int)kc, w, (int)kc, 0.0f, y + m0 * K, K);
    }
    return RN_OK;
}

int rn_cpu_conv_bwd_data(rn_backend *be, const rn_conv_desc *d, const void *dyv, const void *wv,
                         void *dxv, int accumulate) {
    int rc = check_int(d, "conv_bwd_data");
    if (rc) return rc;
    const float *dy = dyv, *w = wv;
    float *dx = dxv;
    const int K = d->k;
    const int64_t M = rows_total(d), kc = kcols(d);
    if (pointwise(d)) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, d->c, K, 1.0f, dy, K, w,
                    d->c, accumulate ? 1.0f : 0.0f, dx, d->c);
        return RN_OK;
    }
    if (!accumulate)
        be->ops->zero(be, dx, (size_t)d->n * d->h * d->w * d->c * sizeof(float));
    const int64_t mt = tile_rows(d);
    float *col = be->ws;
    for (int64_t m0 = 0; m0 < M; m0 += mt) {
        int64_t rows = M - m0 < mt ? M - m0 : mt;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)kc, K, 1.0f,
                    dy + m0 * K, K, w, (int)kc, 0.0f, col, (int)kc);
        col2im_add(be->nthreads, d, col, m0, rows, dx);
    }
    return RN_OK;
}

int rn_cpu_conv_bwd_filter(rn_backend *be, const rn_conv_desc *d, const void *xv,
                           const void *dyv, void *dwv, int accumulate) {
    int rc = check_int(d, "conv_bwd_filter");
    if (rc) return rc;
    const float *x = xv, *dy = dyv;
    float *dw = dwv;
    const int K = d->k;
    const int64_t M = rows_total(d), kc = kcols(d);
    if (pointwise(d)) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, d->c, (int)M, 1.0f, dy, K, x,
                    d->c, accumulate ? 1.0f : 0.0f, dw, d->c);
        return RN_OK;
    }
    const int64_t mt = tile_rows(d);
    float *col = be->ws;
    for (int64_t m0 = 0; m0 < M; m0 += mt) {
        int64_t rows = M - m0 < mt ? M - m0 : mt;
        im2col(be->nthreads, d, x, m0, rows, col);
        float beta = (m0 == 0 && !accumulate) ? 0.0f : 1.0f;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, (int)kc, (int)rows, 1.0f,
                    dy + m0 * K, K, col, (int)kc, beta, dw, (int)kc);
    }
    return RN_OK;
}
