/* The CPU backend's GEMM-shaped ops: convolutions over NHWC activations and OHWI weights,
 * and the fully connected layer.
 *
 * With M = n*p*q output positions and KC = kh*kw*c, the weights (k, kh, kw, c) are a
 * row-major (k, KC) matrix and the im2col rows of x, taken in (kh, kw, c) order, are a
 * (M, KC) matrix whose rows copy whole runs of contiguous channels. Then
 *   forward         y (M, k)    = col (M, KC) * w^T
 *   backward data   dcol (M, KC) = dy (M, k) * w, scattered back into dx (col2im)
 *   backward filter dw (k, KC)  = sum over row tiles of dy_tile^T * col_tile
 * A 1x1 stride-1 unpadded conv needs no im2col: x is already (M, c).
 * im2col runs over tiles of at most TILE_BYTES per thread (the workspace), so the copy is
 * still in cache when the GEMM reads it and memory does not grow with the batch.
 *
 * Threads. OpenBLAS runs single-threaded (set in rn_backend_cpu_init) and the context's
 * pool (backend_cpu_pool.c) splits the work so that threads never wait on each other:
 * forward takes row tiles, backward-data runs of whole images, backward-filter column ranges of
 * dw. Two pools (ours and OpenBLAS's) on the same cores each spin-wait while the other
 * works, and a barrier per tile stalls whenever the OS preempts one thread: on this
 * 2-core machine either one cost more than half the 3x3 convs' speed.
 *
 * Determinism. Row and column splits do not change the order in which OpenBLAS sums an
 * output element, and dw sums its tiles in a fixed order, so results do not depend on the
 * thread count (test_ops checks this bit for bit). */
#include <cblas.h>
#include <limits.h>
#include <string.h>

#include "rn/backend_cpu_impl.h"
#include "rn/backend_impl.h"
#include "rn/err.h"

/* Workspace per conv: one im2col tile. Large enough that each tile's GEMM runs near
 * peak, small enough to stay in L2/L3 between the copy and the GEMM. */
#define TILE_BYTES ((size_t)4 << 20)
/* GEMMs with fewer rows than this lose efficiency faster than the cache helps. */
#define TILE_MIN_ROWS 128
/* Split points of a GEMM are multiples of this many rows/columns (one AVX-512 vector). */
#define SPLIT_ALIGN 16

/* [*lo, *hi) = share t of tn of [0, n), boundaries on multiples of SPLIT_ALIGN. */
static void share(int64_t n, int t, int tn, int64_t *lo, int64_t *hi) {
    int64_t blocks = (n + SPLIT_ALIGN - 1) / SPLIT_ALIGN;
    *lo = blocks * t / tn * SPLIT_ALIGN;
    *hi = blocks * (t + 1) / tn * SPLIT_ALIGN;
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
}

/* Thread t's part of C = alpha op(A) op(B) + beta C (row-major): a block of C's rows, or
 * of its columns when C is wider than tall, so no two threads write one element. */
static void gemm_part(int t, int tn, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N,
                      int K, float alpha, const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc) {
    int64_t lo, hi;
    if (M >= N) {
        share(M, t, tn, &lo, &hi);
        if (hi <= lo) return;
        const float *a = ta == CblasNoTrans ? A + lo * lda : A + lo;
        cblas_sgemm(CblasRowMajor, ta, tb, (int)(hi - lo), N, K, alpha, a, lda, B, ldb, beta,
                    C + lo * ldc, ldc);
    } else {
        share(N, t, tn, &lo, &hi);
        if (hi <= lo) return;
        const float *b = tb == CblasNoTrans ? B + lo : B + lo * ldb;
        cblas_sgemm(CblasRowMajor, ta, tb, M, (int)(hi - lo), K, alpha, A, lda, b, ldb, beta,
                    C + lo, ldc);
    }
}

/* ---- convolution ---- */

static int pointwise(const rn_conv_desc *d) {
    return d->kh == 1 && d->kw == 1 && d->stride_h == 1 && d->stride_w == 1 && d->pad_h == 0 &&
           d->pad_w == 0;
}

static int64_t rows_total(const rn_conv_desc *d) { return (int64_t)d->n * d->p * d->q; }
static int64_t kcols(const rn_conv_desc *d) { return (int64_t)d->kh * d->kw * d->c; }

/* Rows per im2col tile: TILE_BYTES of columns, at least TILE_MIN_ROWS, at most M. */
static int64_t tile_rows(const rn_conv_desc *d) {
    int64_t t = (int64_t)(TILE_BYTES / (kcols(d) * sizeof(float)));
    if (t < TILE_MIN_ROWS) t = TILE_MIN_ROWS;
    int64_t m = rows_total(d);
    return t < m ? t : m;
}

/* Row tiles for the forward pass: at most tile_rows, and small enough that every thread
 * gets a few (tiles are handed out dynamically, so a thread the OS preempts does not hold
 * up the rest). */
static int64_t fwd_tile_rows(const rn_conv_desc *d, int nt) {
    int64_t m = rows_total(d), t = tile_rows(d);
    int64_t even = (m + 4 * nt - 1) / (4 * nt);
    even = (even + SPLIT_ALIGN - 1) / SPLIT_ALIGN * SPLIT_ALIGN;
    if (even < TILE_MIN_ROWS) even = TILE_MIN_ROWS;
    return even < t ? even : t;
}

/* Teams smaller than the work: tiny convs (the unit tests, late layers at small batch)
 * are not worth waking a second thread for. */
static int team_for(const rn_backend *be, double flops) {
    return flops < 2e6 ? 1 : be->nthreads;
}

static int conv_team(const rn_backend *be, const rn_conv_desc *d) {
    return team_for(be, 2.0 * rows_total(d) * kcols(d) * d->k);
}

/* forward and backward-data: one tile per thread; backward-filter: one tile, split by
 * columns among the threads */
size_t rn_cpu_conv_workspace(rn_backend *be, const rn_conv_desc *d) {
    if (pointwise(d)) return 0;
    return (size_t)be->nthreads * tile_rows(d) * kcols(d) * sizeof(float);
}

/* cblas takes int sizes; refuse what would overflow them rather than wrap. */
static int check_int(const rn_conv_desc *d, const char *op) {
    int64_t m = rows_total(d), in = (int64_t)d->n * d->h * d->w;
    if (m * d->k > INT_MAX || in * d->c > INT_MAX || kcols(d) * d->k > INT_MAX)
        return rn_errorf(RN_EINVAL, "%s: shape too large for 32-bit BLAS (n=%d %dx%dx%d -> k=%d); "
                         "use a smaller batch", op, d->n, d->h, d->w, d->c, d->k);
    return RN_OK;
}

/* Columns [k0, k1) of im2col rows [m0, m0+mt) of x into col (mt, k1-k0). Column
 * (i*kw + j)*c + ch holds x at kernel offset (i, j), channel ch. */
static void im2col(const rn_conv_desc *d, const float *x, int64_t m0, int64_t mt, int64_t k0,
                   int64_t k1, float *col) {
    const int C = d->c, kw = d->kw, pq = d->p * d->q;
    const int64_t width = k1 - k0;
    const int whole = k0 == 0 && k1 == kcols(d);
    for (int64_t r = 0; r < mt; r++) {
        int64_t m = m0 + r;
        int ni = (int)(m / pq), rem = (int)(m % pq);
        int pi = rem / d->q, qi = rem % d->q;
        float *dst = col + r * width;
        int w0 = qi * d->stride_w - d->pad_w;
        for (int i = 0; i < d->kh; i++) {
            int64_t base = (int64_t)i * kw * C;
            if (base + (int64_t)kw * C <= k0 || base >= k1) continue;
            int hi = pi * d->stride_h - d->pad_h + i;
            const float *xrow = hi >= 0 && hi < d->h ? x + ((int64_t)ni * d->h + hi) * d->w * C : NULL;
            /* the kw positions of one kernel row are adjacent pixels: one copy when inside */
            if (whole && xrow && w0 >= 0 && w0 + kw <= d->w) {
                memcpy(dst + base, xrow + (int64_t)w0 * C, sizeof(float) * kw * C);
                continue;
            }
            for (int j = 0; j < kw; j++) {
                int64_t lo = base + (int64_t)j * C, hi2 = lo + C;
                if (lo < k0) lo = k0;
                if (hi2 > k1) hi2 = k1;
                if (lo >= hi2) continue;
                int wj = w0 + j;
                float *o = dst + lo - k0;
                if (!xrow || wj < 0 || wj >= d->w) memset(o, 0, sizeof(float) * (size_t)(hi2 - lo));
                else memcpy(o, xrow + (int64_t)wj * C + (lo - base - (int64_t)j * C),
                            sizeof(float) * (size_t)(hi2 - lo));
            }
        }
    }
}

/* dx += col2im(col) for rows [m0, m0+mt), all channels. */
static void col2im_add_ch(const rn_conv_desc *d, const float *col, int64_t m0, int64_t mt,
                          int c0, int c1, float *dx) {
    const int C = d->c, kw = d->kw, kh = d->kh, pq = d->p * d->q;
    const int64_t kc = kcols(d);
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

static void col2im_add(const rn_conv_desc *d, const float *col, int64_t m0, int64_t mt,
                       float *dx) {
    col2im_add_ch(d, col, m0, mt, 0, d->c, dx);
}

typedef struct {
    const rn_conv_desc *d;
    const float *x, *w, *dy;
    float *y, *dx, *dw, *ws;
    int64_t mt, ipt, tn;
    int accumulate;
} conv_job;

/* Rows are independent: tiles of rows are handed out one at a time, each worker using
 * its own slice of the workspace. */
static void conv_fwd_tile(void *ctx, int64_t tile, int worker) {
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int K = d->k, C = d->c;
    const int64_t M = rows_total(d), kc = kcols(d);
    int64_t m0 = tile * j->mt, rows = M - m0 < j->mt ? M - m0 : j->mt;
    if (pointwise(d)) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, K, C, 1.0f,
                    j->x + m0 * C, C, j->w, C, 0.0f, j->y + m0 * K, K);
        return;
    }
    float *col = j->ws + (int64_t)worker * tile_rows(d) * kc;
    im2col(d, j->x, m0, rows, 0, kc, col);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, K, (int)kc, 1.0f, col,
                (int)kc, j->w, (int)kc, 0.0f, j->y + m0 * K, K);
}

/* Few output rows (late layers at small images or batches): row tiles would leave
 * threads idle, so the whole im2col matrix is built in one run (rows split) and the GEMM
 * split by columns in a second. */
static int small_m(const rn_conv_desc *d, int nt) {
    int64_t m = rows_total(d);
    return nt > 1 && m <= tile_rows(d) && (m + fwd_tile_rows(d, nt) - 1) / fwd_tile_rows(d, nt) < 2 * nt;
}

static void conv_im2col_part(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    int64_t m = rows_total(j->d), r0, r1;
    share(m, (int)t, (int)j->tn, &r0, &r1);
    if (r1 > r0) im2col(j->d, j->x, r0, r1 - r0, 0, kcols(j->d), j->ws + r0 * kcols(j->d));
}

static void conv_fwd_part(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const float *a = pointwise(d) ? j->x : j->ws;
    int kc = (int)kcols(d);
    gemm_part((int)t, (int)j->tn, CblasNoTrans, CblasTrans, (int)rows_total(d), d->k, kc, 1.0f,
              a, kc, j->w, kc, 0.0f, j->y, d->k);
}

int rn_cpu_conv_fwd(rn_backend *be, const rn_conv_desc *d, const void *xv, const void *wv,
                    void *yv) {
    int rc = check_int(d, "conv_fwd");
    if (rc) return rc;
    const int nt = conv_team(be, d);
    conv_job j = {.d = d, .x = xv, .w = wv, .y = yv, .ws = be->ws, .mt = fwd_tile_rows(d, nt),
                  .tn = nt};
    if (small_m(d, nt)) {
        if (!pointwise(d)) rn_cpu_pool_run(be->impl, nt, nt, conv_im2col_part, &j);
        rn_cpu_pool_run(be->impl, nt, nt, conv_fwd_part, &j);
        return RN_OK;
    }
    rn_cpu_pool_run(be->impl, (rows_total(d) + j.mt - 1) / j.mt, nt, conv_fwd_tile, &j);
    return RN_OK;
}

/* Receptive fields overlap inside an image but never across images, so a task is a run
 * of whole images: enough of them that the GEMM has a useful number of rows when images
 * are small (late layers), one image in tile-sized row chunks when they are large. A 1x1
 * stride-1 conv has no overlap at all and takes row tiles. */
static void conv_bwd_data_task(void *ctx, int64_t task, int worker) {
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int K = d->k, C = d->c;
    const int64_t M = rows_total(d), kc = kcols(d);
    float beta = j->accumulate ? 1.0f : 0.0f;
    if (pointwise(d)) {
        int64_t m0 = task * j->mt, rows = M - m0 < j->mt ? M - m0 : j->mt;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, C, K, 1.0f,
                    j->dy + m0 * K, K, j->w, C, beta, j->dx + m0 * C, C);
        return;
    }
    const int64_t pq = (int64_t)d->p * d->q, img = (int64_t)d->h * d->w * C;
    float *col = j->ws + (int64_t)worker * tile_rows(d) * kc;
    int64_t n0 = task * j->ipt, n1 = n0 + j->ipt < d->n ? n0 + j->ipt : d->n;
    if (!j->accumulate) memset(j->dx + n0 * img, 0, sizeof(float) * (size_t)((n1 - n0) * img));
    for (int64_t m0 = n0 * pq; m0 < n1 * pq; m0 += j->mt) {
        int64_t rows = n1 * pq - m0 < j->mt ? n1 * pq - m0 : j->mt;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)kc, K, 1.0f,
                    j->dy + m0 * K, K, j->w, (int)kc, 0.0f, col, (int)kc);
        col2im_add(d, col, m0, rows, j->dx);
    }
}

/* Small-M backward data: dcol = dy w split by columns, then col2im split by channels. */
static void conv_dcol_part(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    int kc = (int)kcols(d);
    if (pointwise(d)) {
        gemm_part((int)t, (int)j->tn, CblasNoTrans, CblasNoTrans, (int)rows_total(d), kc, d->k,
                  1.0f, j->dy, d->k, j->w, kc, j->accumulate ? 1.0f : 0.0f, j->dx, kc);
        return;
    }
    gemm_part((int)t, (int)j->tn, CblasNoTrans, CblasNoTrans, (int)rows_total(d), kc, d->k, 1.0f,
              j->dy, d->k, j->w, kc, 0.0f, j->ws, kc);
}

static void conv_col2im_part(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    int c0 = (int)(d->c * t / j->tn), c1 = (int)(d->c * (t + 1) / j->tn);
    if (c1 <= c0) return;
    if (!j->accumulate) {
        int64_t px = (int64_t)d->n * d->h * d->w;
        for (int64_t i = 0; i < px; i++) memset(j->dx + i * d->c + c0, 0, sizeof(float) * (c1 - c0));
    }
    col2im_add_ch(d, j->ws, 0, rows_total(d), c0, c1, j->dx);
}

int rn_cpu_conv_bwd_data(rn_backend *be, const rn_conv_desc *d, const void *dyv, const void *wv,
                         void *dxv, int accumulate) {
    int rc = check_int(d, "conv_bwd_data");
    if (rc) return rc;
    const int nt = conv_team(be, d);
    conv_job j = {.d = d, .dy = dyv, .w = wv, .dx = dxv, .ws = be->ws, .accumulate = accumulate,
                  .tn = nt};
    if (small_m(d, nt)) {
        rn_cpu_pool_run(be->impl, nt, nt, conv_dcol_part, &j);
        if (!pointwise(d)) rn_cpu_pool_run(be->impl, nt, nt, conv_col2im_part, &j);
        return RN_OK;
    }
    if (pointwise(d)) {
        j.mt = fwd_tile_rows(d, nt);
        rn_cpu_pool_run(be->impl, (rows_total(d) + j.mt - 1) / j.mt, nt, conv_bwd_data_task, &j);
        return RN_OK;
    }
    const int64_t pq = (int64_t)d->p * d->q, tr = tile_rows(d);
    int64_t ipt = tr / pq;
    if (ipt < 1) ipt = 1;
    if (ipt > 1 && (d->n + ipt - 1) / ipt < 2 * nt) {
        ipt = (d->n + 2 * nt - 1) / (2 * nt);
        if (ipt * pq < TILE_MIN_ROWS) ipt = TILE_MIN_ROWS / pq < tr / pq ? TILE_MIN_ROWS / pq : tr / pq;
        if (ipt < 1) ipt = 1;
    }
    j.ipt = ipt;
    j.mt = ipt * pq < tr ? ipt * pq : tr;
    rn_cpu_pool_run(be->impl, (d->n + ipt - 1) / ipt, nt, conv_bwd_data_task, &j);
    return RN_OK;
}

/* dw's columns are split into tn ranges; each task builds only its columns of every
 * im2col tile and sums the tiles in order, so no two tasks touch one element. */
static void conv_bwd_filter_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int K = d->k, C = d->c;
    const int64_t M = rows_total(d), kc = kcols(d), mt = j->mt;
    if (pointwise(d)) {
        gemm_part((int)t, (int)j->tn, CblasTrans, CblasNoTrans, K, C, (int)M, 1.0f, j->dy, K,
                  j->x, C, j->accumulate ? 1.0f : 0.0f, j->dw, C);
        return;
    }
    int64_t k0, k1;
    share(kc, (int)t, (int)j->tn, &k0, &k1);
    float *col = j->ws + mt * k0;
    for (int64_t m0 = 0; m0 < M && k1 > k0; m0 += mt) {
        int64_t rows = M - m0 < mt ? M - m0 : mt;
        im2col(d, j->x, m0, rows, k0, k1, col);
        float beta = (m0 == 0 && !j->accumulate) ? 0.0f : 1.0f;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, (int)(k1 - k0), (int)rows, 1.0f,
                    j->dy + m0 * K, K, col, (int)(k1 - k0), beta, j->dw + k0, (int)kc);
    }
}

int rn_cpu_conv_bwd_filter(rn_backend *be, const rn_conv_desc *d, const void *xv,
                           const void *dyv, void *dwv, int accumulate) {
    int rc = check_int(d, "conv_bwd_filter");
    if (rc) return rc;
    const int nt = conv_team(be, d);
    conv_job j = {.d = d, .x = xv, .dy = dyv, .dw = dwv, .ws = be->ws, .mt = tile_rows(d),
                  .tn = nt, .accumulate = accumulate};
    rn_cpu_pool_run(be->impl, nt, nt, conv_bwd_filter_task, &j);
    return RN_OK;
}

/* ---- fully connected: x (n, in), w (out, in), y (n, out) ---- */

typedef struct {
    const rn_fc_desc *d;
    const float *x, *w, *b, *dy;
    float *y, *dx, *dw, *db;
    int tn, accumulate;
} fc_job;

/* Part t of tn: a block of y's rows or columns, then the bias on this part's rows. */
static void fc_fwd_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const fc_job *j = ctx;
    const rn_fc_desc *d = j->d;
    gemm_part((int)t, j->tn, CblasNoTrans, CblasTrans, d->n, d->out, d->in, 1.0f, j->x, d->in,
              j->w, d->in, 0.0f, j->y, d->out);
    if (!j->b) return;
    /* the same split as gemm_part, so the bias lands on elements this task wrote */
    int64_t lo, hi;
    if (d->n >= d->out) {
        share(d->n, (int)t, j->tn, &lo, &hi);
        for (int64_t i = lo; i < hi; i++)
            for (int k = 0; k < d->out; k++) j->y[i * d->out + k] += j->b[k];
    } else {
        share(d->out, (int)t, j->tn, &lo, &hi);
        for (int64_t i = 0; i < d->n; i++)
            for (int64_t k = lo; k < hi; k++) j->y[i * d->out + k] += j->b[k];
    }
}

int rn_cpu_fc_fwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
                  const void *b, void *y) {
    fc_job j = {.d = d, .x = x, .w = w, .b = b, .y = y};
    j.tn = team_for(be, 2.0 * d->n * d->in * d->out);
    rn_cpu_pool_run(be->impl, j.tn, j.tn, fc_fwd_task, &j);
    return RN_OK;
}

/* Part t of tn of each of dx, dw and db: independent outputs, no waiting. */
static void fc_bwd_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const fc_job *j = ctx;
    const rn_fc_desc *d = j->d;
    if (j->dx)
        gemm_part((int)t, j->tn, CblasNoTrans, CblasNoTrans, d->n, d->in, d->out, 1.0f, j->dy,
                  d->out, j->w, d->in, 0.0f, j->dx, d->in);
    gemm_part((int)t, j->tn, CblasTrans, CblasNoTrans, d->out, d->in, d->n, 1.0f, j->dy, d->out,
              j->x, d->in, j->accumulate ? 1.0f : 0.0f, j->dw, d->in);
    if (j->db) {
        /* each part owns a range of bias entries and sums over the batch in order */
        int64_t lo = (int64_t)d->out * t / j->tn, hi = (int64_t)d->out * (t + 1) / j->tn;
        for (int64_t k = lo; k < hi; k++) {
            float s = j->accumulate ? j->db[k] : 0.0f;
            for (int i = 0; i < d->n; i++) s += j->dy[(int64_t)i * d->out + k];
            j->db[k] = s;
        }
    }
}

int rn_cpu_fc_bwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
                  const void *dy, void *dx, void *dw, void *db, int accumulate) {
    fc_job j = {.d = d, .x = x, .w = w, .dy = dy, .dx = dx, .dw = dw, .db = db,
                .accumulate = accumulate};
    j.tn = team_for(be, 2.0 * d->n * d->in * d->out);
    rn_cpu_pool_run(be->impl, j.tn, j.tn, fc_bwd_task, &j);
    return RN_OK;
}
