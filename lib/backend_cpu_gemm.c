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
 * pool (backend_cpu_pool.c) hands out tasks so that threads never wait on each other:
 * forward takes row tiles, backward-data runs of whole images, backward-filter column
 * blocks of dw; a conv whose whole im2col matrix fits one tile, and the FC layer, cut
 * their GEMMs into fixed blocks. Two pools (ours and OpenBLAS's) on the same cores each spin-wait while the other
 * works, and a barrier per tile stalls whenever the OS preempts one thread: on this
 * 2-core machine either one cost more than half the 3x3 convs' speed.
 *
 * Determinism. How OpenBLAS sums one output element depends on its kernel (chosen at load
 * time: OPENBLAS_CORETYPE or the CPU) and on the shape of the call: with the Haswell and
 * Zen kernels a 64x128 GEMM and two 64x64 halves of it give different bits. So every
 * tile and block here is sized from the op's shape alone, never from the thread count:
 * each output element is computed by a call of the same shape, at the same place in it,
 * and dw sums its row tiles in a fixed order. Threads only decide who runs which task.
 * test_threads checks 1, 2 and 3 threads bit for bit; tests/kernels.bats runs it, and a
 * short rn-train, under every kernel the CPU can execute. */
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
/* Block edges are multiples of this many rows/columns (one AVX-512 vector), so block
 * starts stay 64-byte aligned. */
#define SPLIT_ALIGN 16
/* A GEMM or a row range is cut into about this many tasks: more than threads, so the
 * dynamic hand-out balances them, few enough that each stays efficient. A constant, not
 * the thread count: the cut must not depend on how many threads run it. */
#define PARTS 8
/* The smallest side of a block: narrower GEMMs waste the kernel's register tile. */
#define BLOCK_MIN 64

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The length of one of PARTS pieces of n: a multiple of SPLIT_ALIGN, at least BLOCK_MIN,
 * at most n. */
static int64_t part_len(int64_t n) {
    int64_t b = round_up(ceil_div(n, PARTS), SPLIT_ALIGN);
    if (b < BLOCK_MIN) b = BLOCK_MIN;
    return min64(b, n);
}

/* C (m, n) cut into fixed blocks: the longer side in PARTS pieces. The cut depends on
 * (m, n) alone, so every element of C is computed by a GEMM call of the same shape, at
 * the same place in it, whatever the thread count: OpenBLAS's summation order (and
 * whether it takes a small-matrix path) depends on the shape of the call and differs
 * between kernels (OPENBLAS_CORETYPE), so equal shapes are the only portable guarantee. */
typedef struct {
    int64_t m, n;     /* C's size */
    int64_t bm, bn;   /* block size; edge blocks are smaller */
    int64_t nn;       /* blocks per row of blocks */
    int64_t count;    /* blocks */
} gemm_grid;

/* C (m, n) in blocks of (bm, bn). */
static gemm_grid grid_cut(int64_t m, int64_t n, int64_t bm, int64_t bn) {
    gemm_grid g = {.m = m, .n = n, .bm = bm < 1 ? 1 : bm, .bn = bn < 1 ? 1 : bn};
    g.nn = ceil_div(n, g.bn);
    g.count = ceil_div(m, g.bm) * g.nn;
    return g;
}

static gemm_grid grid_of(int64_t m, int64_t n) {
    return m >= n ? grid_cut(m, n, part_len(m), n) : grid_cut(m, n, m, part_len(n));
}

/* [*i0, *i0 + *mb) x [*j0, *j0 + *nb): block t of g. */
static void grid_block(const gemm_grid *g, int64_t t, int64_t *i0, int64_t *mb, int64_t *j0,
                       int64_t *nb) {
    *i0 = t / g->nn * g->bm;
    *j0 = t % g->nn * g->bn;
    *mb = min64(g->bm, g->m - *i0);
    *nb = min64(g->bn, g->n - *j0);
}

/* Block t of C = alpha op(A) op(B) + beta C (row-major, C of g's size, inner size K). */
static void gemm_block(const gemm_grid *g, int64_t t, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
                       int K, float alpha, const float *A, int lda, const float *B, int ldb,
                       float beta, float *C, int ldc) {
    int64_t i0, mb, j0, nb;
    grid_block(g, t, &i0, &mb, &j0, &nb);
    if (mb <= 0 || nb <= 0) return;
    const float *a = ta == CblasNoTrans ? A + i0 * lda : A + i0;
    const float *b = tb == CblasNoTrans ? B + j0 : B + j0 * ldb;
    cblas_sgemm(CblasRowMajor, ta, tb, (int)mb, (int)nb, K, alpha, a, lda, b, ldb, beta,
                C + i0 * ldc + j0, ldc);
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
    return min64(t, rows_total(d));
}

/* Floats between two workers' tiles in the workspace: a whole number of 64-byte lines,
 * so every worker's tile starts equally aligned. */
static int64_t tile_stride(const rn_conv_desc *d) {
    return round_up(tile_rows(d) * kcols(d), SPLIT_ALIGN);
}

/* Row tiles for the forward pass: at most tile_rows, and about PARTS of them (tiles are
 * handed out dynamically, so a thread the OS preempts does not hold up the rest). */
static int64_t fwd_tile_rows(const rn_conv_desc *d) {
    int64_t even = round_up(ceil_div(rows_total(d), PARTS), SPLIT_ALIGN);
    if (even < TILE_MIN_ROWS) even = TILE_MIN_ROWS;
    return min64(even, tile_rows(d));
}

/* The whole im2col matrix fits one tile (late layers at small images or batches): it is
 * built in one run and the GEMM cut into fixed blocks, which keeps every thread busy when
 * row tiles would be few. */
static int whole(const rn_conv_desc *d) { return rows_total(d) <= tile_rows(d); }

/* Teams smaller than the work: tiny convs (the unit tests, late layers at small batch)
 * are not worth waking a second thread for. */
static int team_for(const rn_backend *be, double flops) {
    return flops < 2e6 ? 1 : be->nthreads;
}

static int conv_team(const rn_backend *be, const rn_conv_desc *d) {
    return team_for(be, 2.0 * rows_total(d) * kcols(d) * d->k);
}

static int wino_use(const rn_backend *be, const rn_conv_desc *d);
static int wino_m(const rn_backend *be, const rn_conv_desc *d);
static size_t wino_workspace(const rn_backend *be, const rn_conv_desc *d);
static int fused_use(const rn_backend *be);
static size_t own_workspace(const rn_backend *be, const rn_conv_desc *d);

/* K rounded up to whole panels of rn's own kernel (backend_cpu_fused.c) */
static int64_t k_pad(const rn_conv_desc *d) { return round_up(d->k, RN_FUSED_NR); }

/* forward and backward-data: one tile per thread; backward-filter: one tile, cut by
 * columns; the inference forward of a Winograd shape: its transformed filters and one
 * block of tiles per thread; on rn's own kernel: the im2col tiles and behind them the
 * packed weights (forward, backward-data) or each thread's packed im2col columns
 * (backward-filter) */
size_t rn_cpu_conv_workspace(rn_backend *be, const rn_conv_desc *d) {
    size_t need = pointwise(d) ? 0 : (size_t)be->nthreads * tile_stride(d) * sizeof(float);
    if ((d->dirs & RN_CONV_FWD) && wino_use(be, d)) {
        size_t wino = wino_workspace(be, d);
        if (wino > need) need = wino;
    }
    if (fused_use(be)) {
        size_t own = own_workspace(be, d);
        if (own > need) need = own;
    }
    return need;
}

const char *rn_cpu_conv_algo(rn_backend *be, const rn_conv_desc *d, int dir) {
    if (dir == RN_CONV_BIAS_FWD && wino_use(be, d))
        return wino_m(be, d) == 4 ? "Winograd F(4x4,3x3)" : "Winograd F(2x2,3x3)";
    if (dir == RN_CONV_BIAS_FWD && fused_use(be))
        return pointwise(d) ? "fused GEMM (pointwise)" : "im2col + fused GEMM";
    if (fused_use(be)) return pointwise(d) ? "own GEMM (pointwise)" : "im2col + own GEMM";
    return pointwise(d) ? "GEMM (pointwise)" : "im2col + GEMM";
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
    gemm_grid g;
    int accumulate;
    const float *bias, *res; /* conv_bias_fwd: (k) and (M, k) or NULL */
    int relu;
    int packed;      /* Winograd: U in rn's kernel's panels (backend_cpu_fused.c), not (E, K, C) */
    int wm;          /* Winograd: the output tile's side, 2 or 4 */
    float *pk;       /* where the weights' packed form is made (the workspace's front, or the
                        caller's buffer in rn_cpu_conv_bias_pack) */
    const float *wp; /* the packed form the GEMMs read */
    int isa;         /* rn's own kernel (RN_GEMM_AVX2/AVX512/PORTABLE), or RN_GEMM_NONE: OpenBLAS */
} conv_job;

/* Rows are independent: tiles of rows are handed out one at a time, each worker using
 * its own slice of the workspace. */
static void conv_fwd_tile(void *ctx, int64_t tile, int worker) {
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int K = d->k, C = d->c;
    const int64_t M = rows_total(d), kc = kcols(d);
    int64_t m0 = tile * j->mt, rows = min64(M - m0, j->mt);
    if (pointwise(d)) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, K, C, 1.0f,
                    j->x + m0 * C, C, j->w, C, 0.0f, j->y + m0 * K, K);
        return;
    }
    float *col = j->ws + (int64_t)worker * tile_stride(d);
    im2col(d, j->x, m0, rows, 0, kc, col);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, K, (int)kc, 1.0f, col,
                (int)kc, j->w, (int)kc, 0.0f, j->y + m0 * K, K);
}

/* A copy, so any split will do: part t of tn of the rows. */
static void conv_im2col_part(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    int64_t m = rows_total(j->d), r0 = m * t / j->tn, r1 = m * (t + 1) / j->tn;
    if (r1 > r0) im2col(j->d, j->x, r0, r1 - r0, 0, kcols(j->d), j->ws + r0 * kcols(j->d));
}

static void conv_fwd_block(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const float *a = pointwise(d) ? j->x : j->ws;
    int kc = (int)kcols(d);
    gemm_block(&j->g, t, CblasNoTrans, CblasTrans, kc, 1.0f, a, kc, j->w, kc, 0.0f, j->y, d->k);
}

static int fused_run(rn_backend *be, conv_job *j, int prepared);

int rn_cpu_conv_fwd(rn_backend *be, const rn_conv_desc *d, const void *xv, const void *wv,
                    void *yv) {
    int rc = check_int(d, "conv_fwd");
    if (rc) return rc;
    const int nt = conv_team(be, d);
    conv_job j = {.d = d, .x = xv, .w = wv, .y = yv, .ws = be->ws, .tn = nt, .isa = rn_cpu_own_isa(be)};
    if (j.isa) return fused_run(be, &j, 0);
    if (whole(d)) {
        if (!pointwise(d)) rn_cpu_pool_run(be->impl, nt, nt, conv_im2col_part, &j);
        j.g = grid_of(rows_total(d), d->k);
        rn_cpu_pool_run(be->impl, j.g.count, nt, conv_fwd_block, &j);
        return RN_OK;
    }
    j.mt = fwd_tile_rows(d);
    rn_cpu_pool_run(be->impl, ceil_div(rows_total(d), j.mt), nt, conv_fwd_tile, &j);
    return RN_OK;
}

/* ---- the inference path's conv through OpenBLAS: y = [relu](conv + bias [+ res]) ----
 * Where rn's own kernel does not run (a CPU without AVX2 and FMA, RN_CPU_GEMM=openblas;
 * fused_run below otherwise). Each tile or block of y is first set to bias (+ res), the GEMM adds into it (beta 1,
 * which also spares OpenBLAS its pass that zeroes C for beta 0), then ReLU runs over it
 * while it is still in cache: no pass of BN over the whole output as the exact path
 * has. Tiles hold at most about OUT_TILE_BYTES of output for that: smaller tiles cost more
 * than they save in OpenBLAS repacking the weights for each call (512 KiB took about 4%
 * more CPU time than 2 MiB on ResNet-50 at batch 32). */
#define OUT_TILE_BYTES ((size_t)2 << 20)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define RN_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RN_HOT
#endif

/* Rows [0, rows) x columns [j0, j0 + nb) of y (row stride ld) = bias [+ res] (same stride). */
RN_HOT static void fill_block(float *y, const float *bias, const float *res, int64_t ld, int64_t rows,
                              int64_t j0, int64_t nb) {
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * ld + j0;
        const float *b = bias + j0;
        if (res) {
            const float *rr = res + r * ld + j0;
#pragma omp simd
            for (int64_t c = 0; c < nb; c++) yr[c] = b[c] + rr[c];
        } else {
            memcpy(yr, b, sizeof(float) * (size_t)nb);
        }
    }
}

/* The same block: v < 0 ? 0 : v, which keeps NaN as PyTorch's ReLU does. */
RN_HOT static void relu_block(float *y, int64_t ld, int64_t rows, int64_t j0, int64_t nb) {
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * ld + j0;
#pragma omp simd
        for (int64_t c = 0; c < nb; c++) yr[c] = yr[c] < 0.0f ? 0.0f : yr[c];
    }
}

/* Row tiles of the fused forward: fwd_tile_rows, cut further so that a tile's output
 * stays in cache between its fill, GEMM and ReLU. From the shape alone. */
static int64_t bias_tile_rows(const rn_conv_desc *d) {
    int64_t r = round_up((int64_t)(OUT_TILE_BYTES / sizeof(float)) / d->k, SPLIT_ALIGN);
    if (r < TILE_MIN_ROWS) r = TILE_MIN_ROWS;
    return min64(r, fwd_tile_rows(d));
}

static void conv_bias_tile(void *ctx, int64_t tile, int worker) {
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int K = d->k, C = d->c;
    const int64_t M = rows_total(d), kc = kcols(d);
    int64_t m0 = tile * j->mt, rows = min64(M - m0, j->mt);
    float *y = j->y + m0 * K;
    fill_block(y, j->bias, j->res ? j->res + m0 * K : NULL, K, rows, 0, K);
    if (pointwise(d)) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, K, C, 1.0f, j->x + m0 * C, C, j->w, C,
                    1.0f, y, K);
    } else {
        float *col = j->ws + (int64_t)worker * tile_stride(d);
        im2col(d, j->x, m0, rows, 0, kc, col);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, K, (int)kc, 1.0f, col, (int)kc, j->w,
                    (int)kc, 1.0f, y, K);
    }
    if (j->relu) relu_block(y, K, rows, 0, K);
}

static void conv_bias_block(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const float *a = pointwise(d) ? j->x : j->ws;
    int kc = (int)kcols(d);
    int64_t i0, mb, j0, nb;
    grid_block(&j->g, t, &i0, &mb, &j0, &nb);
    if (mb <= 0 || nb <= 0) return;
    float *y = j->y + i0 * d->k;
    fill_block(y, j->bias, j->res ? j->res + i0 * d->k : NULL, d->k, mb, j0, nb);
    gemm_block(&j->g, t, CblasNoTrans, CblasTrans, kc, 1.0f, a, kc, j->w, kc, 1.0f, j->y, d->k);
    if (j->relu) relu_block(y, d->k, mb, j0, nb);
}

/* ---- Winograd F(4x4,3x3) and F(2x2,3x3) for the inference path's 3x3 stride-1 pad-1 convs ----
 * (Lavin & Gray 2015.) Output tiles of m x m (m = 4 or 2) from overlapping a x a input
 * tiles (a = m + 2): with V = B^T d B (per tile, per channel) and U = G g G^T (per filter,
 * per channel), each of the E = a^2 elements e of the transform domain is one GEMM
 *   M[e] (tiles, K) = V[e] (tiles, C) * U[e]^T,
 * and the m x m output is A^T M A: E GEMMs of C*K per tile of m^2 outputs instead of
 * 9 m^2 C*K multiplications (F(2x2): 16 for 36, 2.25x fewer; F(4x4): 36 for 144, 4x;
 * less where edge tiles are partial). F(2x2)'s transforms add and halve only, so its
 * error is that of a float dot product with a small constant (~1e-7 of the sum of the
 * terms' magnitudes in test_ops); F(4x4)'s scale by up to 8 and its filters by 1/6 and
 * 1/24 (computed in double, rounded once), about 3e-6 of that sum: ~30x F(2x2)'s, still
 * a few millionths, and ResNet-50's logits stay within torchvision's float64 tolerance
 * (parity.bats). cpu_winograd = 2 keeps F(2x2) only. The transforms run eight channels at a
 * time (GCC's vector extension; written as scalar loops they were not vectorised and
 * cost more than the GEMMs). The GEMMs run on rn's own kernel where it runs
 * (backend_cpu_fused.c; then U is written straight into its panels), else through
 * OpenBLAS (wino_run says how each cuts the tiles into blocks). U is made by
 * rn_cpu_conv_bias_pack once per load (the inference net), or per call into the
 * workspace, split over filters: an elementwise transform, no reduction. The training
 * path and RN_NET_INFER_EXACT call rn_conv_fwd, which keeps im2col + GEMM. */
#define WINO_BYTES ((size_t)4 << 20) /* per worker: one block's V and M */
#define WINO_MIN_TILES 64
/* filters per weight-transform task */
#define WINO_UK 16
/* the largest input tile side: F(4x4,3x3)'s 6 */
#define WINO_AMAX 6

static int wino_shape(const rn_conv_desc *d) {
    return d->kh == 3 && d->kw == 3 && d->stride_h == 1 && d->stride_w == 1 && d->pad_h == 1 && d->pad_w == 1;
}

/* one image's tiles of m x m outputs */
static int64_t wino_img_tiles(const rn_conv_desc *d, int m) { return ceil_div(d->p, m) * ceil_div(d->q, m); }

/* Which shapes take it when cpu_winograd is on (1, the default; 2: F(2x2) only;
 * RN_CPU_WINOGRAD=0 turns it off), and with which output tile: m = 4, F(4x4,3x3), or
 * m = 2, F(2x2,3x3); 0: neither. The choice looks at one image, never at the batch: a
 * rank's slice of a batch, rn-train's --val and rn-eval at another --batch take the same
 * algorithm for each image (dist.bats compares ranks' logits bit for bit). A tile size
 * is taken only where at least 70% of its tiles' outputs lie inside P x Q and the image
 * has enough tiles: F(4x4) 16 (14x14 outputs), F(2x2) 49 (also 14x14). Measured on the
 * 2-core EPYC (2 threads, packed weights, `build/tests/bench_ops B 224 2 3x3/1 fwd`,
 * README "Winograd"): F(2x2) against rn's own im2col path per ResNet-50 3x3/1 shape at
 * batch 32 and 1: 56x56x64 2.0x and 1.5x, 28x28x128 2.1x and 1.7x, 14x14x256 2.45x and
 * 1.75x; 7x7x512 (2x2 tiles of an 8x8 grid, 77% inside) even; F(4x4) against F(2x2),
 * best of 3-4 alternating runs: 56x56 1.1-1.5x and 1.1-1.9x, 28x28 1.45-1.7x and
 * 1.3-1.6x, 14x14 (16 tiles of a 16x16 grid, 77% inside) 0.9-1.2x and even (with the
 * three passes of a small batch, wino_run). */
#define WINO_MIN_CHANNELS 64
#define WINO2_IMG_TILES 49
#define WINO4_IMG_TILES 16
static int wino_fits(const rn_conv_desc *d, int m, int64_t min_tiles) {
    int64_t t = wino_img_tiles(d, m);
    return t >= min_tiles && 10 * (int64_t)d->p * d->q >= 7 * (int64_t)m * m * t;
}
static int wino_m(const rn_backend *be, const rn_conv_desc *d) {
    if (!be->opts.cpu_winograd || !wino_shape(d) || d->c < WINO_MIN_CHANNELS || d->k < WINO_MIN_CHANNELS) return 0;
    if (be->opts.cpu_winograd == 1 && wino_fits(d, 4, WINO4_IMG_TILES)) return 4;
    return wino_fits(d, 2, WINO2_IMG_TILES) ? 2 : 0;
}
static int wino_use(const rn_backend *be, const rn_conv_desc *d) { return wino_m(be, d) != 0; }

/* The sizes below are for the output tile side m that wino_m chose. */

/* the transform domain's elements: (m + 2)^2 GEMMs */
static int wino_e(int m) { return (m + 2) * (m + 2); }

static int64_t wino_tiles_total(const rn_conv_desc *d, int m) { return (int64_t)d->n * wino_img_tiles(d, m); }

/* Tiles per block at most: V and M of one block in WINO_BYTES, at least WINO_MIN_TILES,
 * a multiple of SPLIT_ALIGN, at most all (the workspace holds one such block per thread). */
static int64_t wino_tiles(const rn_conv_desc *d, int m) {
    int64_t t = (int64_t)(WINO_BYTES / (wino_e(m) * sizeof(float) * ((size_t)d->c + d->k))) / SPLIT_ALIGN * SPLIT_ALIGN;
    if (t < WINO_MIN_TILES) t = WINO_MIN_TILES;
    return min64(t, wino_tiles_total(d, m));
}

/* On rn's kernel an element's bits do not depend on how the tiles are cut, so the
 * blocks can follow the thread count: about a multiple of nt blocks (whole MR-row groups
 * each, the last one shorter) of at most wino_tiles tiles (batch 1's 28x28 layer is one
 * block otherwise, run by one thread). */
static int64_t wino_tiles_even(const rn_conv_desc *d, int m, int nt) {
    int64_t total = wino_tiles_total(d, m), blocks = round_up(ceil_div(total, wino_tiles(d, m)), nt);
    return min64(wino_tiles(d, m), round_up(ceil_div(total, blocks), RN_FUSED_MR));
}

/* U: E (K, C) matrices, or E sets of K / RN_FUSED_NR panels (K rounded up) */
static int64_t wino_u_floats(const rn_conv_desc *d, int m) {
    return round_up(wino_e(m) * k_pad(d) * d->c, SPLIT_ALIGN);
}
/* zeros: the row that positions outside the image read (C) and the kernel's bias (K) */
static int64_t wino_zero_floats(const rn_conv_desc *d) { return round_up(d->c > d->k ? d->c : d->k, SPLIT_ALIGN); }
static int64_t wino_worker_floats(const rn_conv_desc *d, int m) {
    return round_up(wino_e(m) * wino_tiles(d, m) * ((int64_t)d->c + d->k), SPLIT_ALIGN);
}

static size_t wino_workspace(const rn_backend *be, const rn_conv_desc *d) {
    const int m = wino_m(be, d);
    return sizeof(float) * (size_t)(wino_u_floats(d, m) + wino_zero_floats(d) + be->nthreads * wino_worker_floats(d, m));
}

/* The one-dimensional transforms, a = m + 2 points (Lavin & Gray's matrices; F(4x4) on
 * the points 0, 1, -1, 2, -2). Filters: u = G g, in double, rounded once at the end. */
static void wino_g(int m, const double g[3], double u[WINO_AMAX]) {
    if (m == 2) {
        u[0] = g[0];
        u[1] = 0.5 * (g[0] + g[1] + g[2]);
        u[2] = 0.5 * (g[0] - g[1] + g[2]);
        u[3] = g[2];
        return;
    }
    u[0] = g[0] / 4;
    u[1] = -(g[0] + g[1] + g[2]) / 6;
    u[2] = -(g[0] - g[1] + g[2]) / 6;
    u[3] = g[0] / 24 + g[1] / 12 + g[2] / 6;
    u[4] = g[0] / 24 - g[1] / 12 + g[2] / 6;
    u[5] = g[2];
}

/* Eight lanes of float: GCC's vector extension, so that the tile transforms are written
 * once and compile to one AVX2 instruction per operation in RN_HOT's avx2 clone (the
 * compiler did not vectorise per-channel scalar loops on its own). A channel count that
 * is not a multiple of 8 runs its last channels in the low lanes of the same code, so an
 * element's bits never depend on which lane it is in. There is no multiply-add to
 * contract (-std=c11 leaves contraction off anyway): each line is the same IEEE
 * operations in every lane and clone. */
typedef float v8 __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));

/* *v = lanes [0, n) of p, the rest 0; and lanes [0, n) of *v back */
static inline __attribute__((always_inline)) void ld8(v8 *v, const float *p, int n) {
    if (n == 8) {
        *v = *(const v8u *)p;
        return;
    }
    *v = (v8){0};
    memcpy(v, p, sizeof(float) * (size_t)n);
}
static inline __attribute__((always_inline)) void st8(float *p, const v8 *v, int n) {
    if (n == 8) *(v8u *)p = *v;
    else memcpy(p, v, sizeof(float) * (size_t)n);
}

/* y = B^T x */
static inline __attribute__((always_inline)) void wino_bt(int m, const v8 *x, v8 *y) {
    if (m == 2) {
        y[0] = x[0] - x[2];
        y[1] = x[1] + x[2];
        y[2] = x[2] - x[1];
        y[3] = x[1] - x[3];
        return;
    }
    const v8 four = {4, 4, 4, 4, 4, 4, 4, 4}, five = {5, 5, 5, 5, 5, 5, 5, 5}, two = {2, 2, 2, 2, 2, 2, 2, 2};
    y[0] = (four * x[0] - five * x[2]) + x[4];
    y[1] = (x[3] + x[4]) - four * (x[1] + x[2]);
    y[2] = (x[4] - x[3]) + four * (x[1] - x[2]);
    y[3] = (x[4] - x[2]) - two * (x[1] - x[3]);
    y[4] = (x[4] - x[2]) + two * (x[1] - x[3]);
    y[5] = (four * x[1] - five * x[3]) + x[5];
}

/* z = A^T x */
static inline __attribute__((always_inline)) void wino_at(int m, const v8 *x, v8 *z) {
    if (m == 2) {
        z[0] = x[0] + x[1] + x[2];
        z[1] = x[1] - x[2] - x[3];
        return;
    }
    const v8 two = {2, 2, 2, 2, 2, 2, 2, 2}, four = {4, 4, 4, 4, 4, 4, 4, 4}, eight = {8, 8, 8, 8, 8, 8, 8, 8};
    v8 s = x[1] + x[2], t = x[1] - x[2], u = x[3] + x[4], w = x[3] - x[4];
    z[0] = (x[0] + s) + u;
    z[1] = t + two * w;
    z[2] = s + four * u;
    z[3] = (t + eight * w) + x[5];
}

/* U[e] (K, C) = G g G^T for filters [k0, k0 + WINO_UK): w is OHWI, so each filter's nine
 * taps are runs of C channels. Packed (j->packed), U[e] is written as rn_cpu_fused_pack
 * would lay it out: element (k, c) at panel k / NR, row c, lane k % NR. */
static void wino_weights(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int m = j->wm, a = m + 2;
    const int64_t C = d->c, K = d->k, NR = RN_FUSED_NR;
    const int64_t es = j->packed ? k_pad(d) * C : K * C, cs = j->packed ? NR : 1;
    float *U = j->pk;
    for (int64_t k = t * WINO_UK; k < min64((t + 1) * WINO_UK, K); k++) {
        const float *g = j->w + k * 9 * C;
        const int64_t ko = j->packed ? k / NR * C * NR + k % NR : k * C;
        for (int64_t c = 0; c < C; c++) {
            double r[WINO_AMAX][3];
            for (int b = 0; b < 3; b++) {
                double col[3] = {g[(0 * 3 + b) * C + c], g[(1 * 3 + b) * C + c], g[(2 * 3 + b) * C + c]}, u[WINO_AMAX];
                wino_g(m, col, u);
                for (int i = 0; i < a; i++) r[i][b] = u[i];
            }
            for (int i = 0; i < a; i++) {
                double u[WINO_AMAX];
                wino_g(m, r[i], u);
                for (int e = 0; e < a; e++) U[(int64_t)(i * a + e) * es + ko + c * cs] = (float)u[e];
            }
        }
    }
}

/* The input transform of one tile's channels [c, c + n): o[(i a + e) es] = (B^T d B)[i][e] */
static inline __attribute__((always_inline)) void wino_in_tile(int m, const float *const *src, int64_t c, int n,
                                                               float *o, int64_t es) {
    const int a = m + 2;
    v8 s[WINO_AMAX][WINO_AMAX];
    for (int b = 0; b < a; b++) {
        v8 x[WINO_AMAX], y[WINO_AMAX];
        for (int i = 0; i < a; i++) ld8(&x[i], src[i * a + b] + c, n);
        wino_bt(m, x, y);
        for (int i = 0; i < a; i++) s[i][b] = y[i];
    }
    for (int i = 0; i < a; i++) {
        v8 y[WINO_AMAX];
        wino_bt(m, s[i], y);
        for (int e = 0; e < a; e++) st8(o + (int64_t)(i * a + e) * es, &y[e], n);
    }
}

/* V[e] rows [0, rows) = B^T d B of tiles [t0, t0 + rows); positions outside the image
 * read the zero row. */
static inline __attribute__((always_inline)) void wino_input_m(int m, const rn_conv_desc *d, const float *x,
                                                               const float *zero, int64_t t0, int64_t rows,
                                                               int64_t tb, float *V) {
    const int a = m + 2;
    const int64_t C = d->c, th = ceil_div(d->p, m), tw = ceil_div(d->q, m), es = tb * C;
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = t0 + r, ni = t / (th * tw), rem = t % (th * tw);
        int hi0 = (int)(rem / tw) * m - 1, wi0 = (int)(rem % tw) * m - 1;
        const float *src[WINO_AMAX * WINO_AMAX];
        for (int i = 0; i < a; i++)
            for (int jj = 0; jj < a; jj++) {
                int hi = hi0 + i, wi = wi0 + jj;
                src[i * a + jj] = hi >= 0 && hi < d->h && wi >= 0 && wi < d->w
                                      ? x + ((ni * d->h + hi) * (int64_t)d->w + wi) * C
                                      : zero;
            }
        for (int64_t c = 0; c < C; c += 8) wino_in_tile(m, src, c, C - c < 8 ? (int)(C - c) : 8, V + r * C + c, es);
    }
}
RN_HOT static void wino_input(int m, const rn_conv_desc *d, const float *x, const float *zero, int64_t t0,
                              int64_t rows, int64_t tb, float *V) {
    if (m == 4) wino_input_m(4, d, x, zero, t0, rows, tb, V);
    else wino_input_m(2, d, x, zero, t0, rows, tb, V);
}

/* y of tiles [t0, t0 + rows) = [relu](A^T M A + (bias [+ res])), the same epilogue as the
 * im2col path; the parts of edge tiles past P or Q are dropped. */
static inline __attribute__((always_inline)) void wino_output_m(int m, const conv_job *j, const float *Mo,
                                                                int64_t t0, int64_t rows, int64_t tb) {
    const rn_conv_desc *d = j->d;
    const int a = m + 2;
    const int64_t K = d->k, th = ceil_div(d->p, m), tw = ceil_div(d->q, m), es = tb * K;
    const v8 zero = {0};
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = t0 + r, ni = t / (th * tw), rem = t % (th * tw);
        int p0 = (int)(rem / tw) * m, q0 = (int)(rem % tw) * m;
        const float *mr = Mo + r * K;
        float *y[4 * 4];
        const float *res[4 * 4];
        for (int i = 0; i < m * m; i++) {
            int64_t at = ((ni * d->p + p0 + i / m) * (int64_t)d->q + q0 + i % m) * K;
            int in = p0 + i / m < d->p && q0 + i % m < d->q;
            y[i] = in ? j->y + at : NULL;
            res[i] = in && j->res ? j->res + at : NULL;
        }
        for (int64_t c = 0; c < K; c += 8) {
            const int n = K - c < 8 ? (int)(K - c) : 8;
            v8 s[4][WINO_AMAX];
            for (int e = 0; e < a; e++) {
                v8 x[WINO_AMAX], z[4];
                for (int i = 0; i < a; i++) ld8(&x[i], mr + (int64_t)(i * a + e) * es + c, n);
                wino_at(m, x, z);
                for (int i = 0; i < m; i++) s[i][e] = z[i];
            }
            v8 bias, rv;
            ld8(&bias, j->bias + c, n);
            for (int i = 0; i < m; i++) {
                v8 z[4];
                wino_at(m, s[i], z);
                for (int e = 0; e < m; e++) {
                    int o = i * m + e;
                    if (!y[o]) continue;
                    v8 v;
                    if (res[o]) {
                        ld8(&rv, res[o] + c, n);
                        v = z[e] + (bias + rv);
                    } else {
                        v = z[e] + bias;
                    }
                    /* v < 0 ? 0 : v: NaN and -0 pass */
                    if (j->relu) v = (v8)((v8i)v & ~(v8i)(v < zero));
                    st8(y[o] + c, &v, n);
                }
            }
        }
    }
}
RN_HOT static void wino_output(int m, const conv_job *j, const float *Mo, int64_t t0, int64_t rows, int64_t tb) {
    if (m == 4) wino_output_m(4, j, Mo, t0, rows, tb);
    else wino_output_m(2, j, Mo, t0, rows, tb);
}

/* One block of tiles: input transform, E GEMMs, output transform, in the worker's
 * slice of the workspace. */
static void wino_block(void *ctx, int64_t blk, int worker) {
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int m = j->wm, E = wino_e(m);
    const int64_t C = d->c, K = d->k, tb = j->mt, uf = wino_u_floats(d, m);
    int64_t t0 = blk * tb, rows = min64(tb, wino_tiles_total(d, m) - t0);
    if (!j->packed) { /* blocks within one image (wino_run) */
        int64_t img = wino_img_tiles(d, m), per = ceil_div(img, tb), bi = blk % per;
        t0 = blk / per * img + bi * tb;
        rows = min64(tb, img - bi * tb);
    }
    const float *U = j->wp, *zero = j->ws + uf;
    float *V = j->ws + uf + wino_zero_floats(d) + (int64_t)worker * wino_worker_floats(d, m);
    float *Mo = V + E * tb * C;
    wino_input(m, d, j->x, zero, t0, rows, tb, V);
    if (j->packed) {
        const int64_t panels = k_pad(d) / RN_FUSED_NR;
        for (int e = 0; e < E; e++)
            rn_cpu_fused_gemm(j->isa, V + e * tb * C, C, rows, C, U + e * k_pad(d) * C, K, 0, panels, zero, NULL, 0,
                              Mo + e * tb * K);
    } else {
        for (int e = 0; e < E; e++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)K, (int)C, 1.0f, V + e * tb * C,
                        (int)C, U + e * K * C, (int)C, 0.0f, Mo + e * tb * K, (int)K);
    }
    wino_output(m, j, Mo, t0, rows, tb);
}

/* All tiles as one block shared by the threads, in three passes (wino_run): tiles in
 * runs of WINO_RUN for the transforms, and (element, group of WINO_PG panels) for the
 * GEMMs, so that a thread streams only its part of U. */
#define WINO_RUN 8
#define WINO_PG 4
static float *wino_shared(const conv_job *j, int64_t *tb) {
    const rn_conv_desc *d = j->d;
    *tb = wino_tiles_total(d, j->wm);
    return j->ws + wino_u_floats(d, j->wm) + wino_zero_floats(d);
}
static void wino_in_run(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    int64_t tb;
    float *V = wino_shared(j, &tb);
    const float *zero = V - wino_zero_floats(j->d);
    wino_input(j->wm, j->d, j->x, zero, t * WINO_RUN, min64(WINO_RUN, tb - t * WINO_RUN), tb, V + t * WINO_RUN * j->d->c);
}
static void wino_gemm_part(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int64_t C = d->c, K = d->k, panels = k_pad(d) / RN_FUSED_NR, groups = ceil_div(panels, WINO_PG);
    const int64_t e = t / groups, p0 = t % groups * WINO_PG, p1 = min64(p0 + WINO_PG, panels);
    int64_t tb;
    float *V = wino_shared(j, &tb), *Mo = V + wino_e(j->wm) * tb * C;
    const float *zero = V - wino_zero_floats(d);
    rn_cpu_fused_gemm(j->isa, V + e * tb * C, C, tb, C, j->wp + e * k_pad(d) * C, K, p0, p1, zero, NULL, 0, Mo + e * tb * K);
}
static void wino_out_run(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    int64_t tb;
    float *V = wino_shared(j, &tb), *Mo = V + wino_e(j->wm) * tb * j->d->c;
    wino_output(j->wm, j, Mo + t * WINO_RUN * j->d->k, t * WINO_RUN, min64(WINO_RUN, tb - t * WINO_RUN), tb);
}

/* j->pk = U, the transformed filters */
static void wino_pack(rn_backend *be, conv_job *j) {
    const rn_conv_desc *d = j->d;
    j->packed = fused_use(be);
    j->wm = wino_m(be, d);
    /* the last panel's lanes past K: zeros, not stale memory */
    if (j->packed && d->k % RN_FUSED_NR) memset(j->pk, 0, sizeof(float) * (size_t)wino_u_floats(d, j->wm));
    rn_cpu_pool_run(be->impl, ceil_div(d->k, WINO_UK), (int)j->tn, wino_weights, j);
}

/* prepared: j->w is U from rn_cpu_conv_bias_pack */
static int wino_run(rn_backend *be, conv_job *j, int prepared) {
    const rn_conv_desc *d = j->d;
    const int nt = (int)j->tn;
    const int m = wino_m(be, d);
    memset(j->ws + wino_u_floats(d, m), 0, sizeof(float) * (size_t)wino_zero_floats(d));
    if (prepared) {
        j->packed = fused_use(be);
        j->wm = m;
        j->wp = j->w;
    } else {
        j->pk = j->ws;
        wino_pack(be, j);
        j->wp = j->ws;
    }
    /* On rn's kernel blocks run across images, as even over the threads as they can be. An
     * OpenBLAS sgemm's bits can depend on its call's shape, so there every block lies
     * within one image and is cut from the image's shape alone: a tile's GEMM call is the
     * same at any batch (a rank's slice, another --batch) and thread count. */
    const int64_t img = wino_img_tiles(d, m), total = wino_tiles_total(d, m);
    int64_t blocks;
    if (j->packed && nt > 1 && total <= wino_tiles(d, m)) {
        /* every tile fits one block (a small batch): the three passes, each split over
           the threads, instead of one block on one thread */
        const int64_t runs = ceil_div(total, WINO_RUN), gemms = wino_e(m) * ceil_div(k_pad(d) / RN_FUSED_NR, WINO_PG);
        rn_cpu_pool_run(be->impl, runs, nt, wino_in_run, j);
        rn_cpu_pool_run(be->impl, gemms, nt, wino_gemm_part, j);
        rn_cpu_pool_run(be->impl, runs, nt, wino_out_run, j);
        return RN_OK;
    }
    if (j->packed) {
        j->mt = wino_tiles_even(d, m, nt);
        blocks = ceil_div(total, j->mt);
    } else {
        j->mt = min64(wino_tiles(d, m), img);
        blocks = d->n * ceil_div(img, j->mt);
    }
    rn_cpu_pool_run(be->impl, blocks, nt, wino_block, j);
    return RN_OK;
}

/* ---- the inference conv on rn's own kernel (backend_cpu_fused.c) ----
 * Tasks are FUSED_ROWS rows by a group of output-channel panels: groups only when there
 * are too few row tiles to keep the threads busy (late layers at a small batch), both cut
 * from the shape alone. The kernel's result for an element does not depend on the cut
 * anyway (its summation order is fixed), so threads change nothing. The workspace is
 * the im2col path's (a conv whose im2col matrix fits one tile builds it whole first,
 * shared by the groups; a larger one builds each row tile in its worker's slice) with
 * the weights packed behind it, once per call, split over panels, unless the caller
 * packed them once (rn_cpu_conv_bias_pack). */
#define FUSED_ROWS 48 /* a multiple of RN_FUSED_MR; 96 and 192 measured within the noise of it */
/* Up to this many rows are one tile when the rows are shared (x itself, or the whole
 * im2col matrix): every task then streams its panels of the weights once (a small
 * batch's late layers, where the weights outweigh the activations), and its 256-column
 * chunk of rows (256 KiB) still fits L2. */
#define FUSED_ONE_TILE 256

static int64_t fused_rows(const rn_conv_desc *d) {
    return rows_total(d) <= FUSED_ONE_TILE && (pointwise(d) || whole(d)) ? rows_total(d) : FUSED_ROWS;
}
#define FUSED_PACK_PANELS 4

int rn_cpu_own_isa(const rn_backend *be) {
    int isa = rn_cpu_gemm_isa(), want = be->opts.cpu_gemm;
    if (want == RN_CPU_GEMM_OPENBLAS || isa == RN_GEMM_NONE) return RN_GEMM_NONE;
    /* a narrower form where asked for and the CPU has it (an x86-64 CPU runs all three) */
    if (want == RN_CPU_GEMM_PORTABLE) return RN_GEMM_PORTABLE;
    if (want == RN_CPU_GEMM_AVX2 && isa == RN_GEMM_AVX512) return RN_GEMM_AVX2;
    return isa;
}
static int fused_use(const rn_backend *be) { return rn_cpu_own_isa(be) != RN_GEMM_NONE; }

static int64_t fused_panels(const rn_conv_desc *d) { return k_pad(d) / RN_FUSED_NR; }
static int64_t fused_w_floats(const rn_conv_desc *d) { return round_up(k_pad(d) * kcols(d), SPLIT_ALIGN); }
/* the im2col path's workspace, in front of the packed weights */
static int64_t fused_col_floats(const rn_backend *be, const rn_conv_desc *d) {
    return pointwise(d) ? 0 : be->nthreads * tile_stride(d);
}

/* backward-data: the weights packed as B = w (k x KC) */
static int64_t kc_pad(const rn_conv_desc *d) { return round_up(kcols(d), RN_FUSED_NR); }
static int64_t dgrad_w_floats(const rn_conv_desc *d) { return round_up(d->k * kc_pad(d), SPLIT_ALIGN); }

/* backward-filter: dw's blocks (columns only where im2col builds them) and the rows of x
 * or im2col per tile, as many as TILE_BYTES of its columns hold */
static gemm_grid wgrad_grid(const rn_conv_desc *d) {
    /* columns in blocks a whole number of the AVX-512 kernel's 32 wide */
    int64_t bn = min64(round_up(ceil_div(kcols(d), PARTS), 2 * RN_FUSED_NR), kcols(d));
    if (pointwise(d)) { /* x's tile is packed once for all blocks: cut the longer side */
        /* rows in whole groups of both kernels' 6 and 8 */
        if (d->k > d->c) return grid_cut(d->k, d->c, min64(round_up(ceil_div(d->k, PARTS), 24), d->k), d->c);
        return grid_cut(d->k, d->c, d->k, bn);
    }
    return grid_cut(d->k, kcols(d), d->k, bn);
}
static int64_t wgrad_rows(const rn_conv_desc *d) {
    return pointwise(d) ? min64(rows_total(d), tile_rows(d)) : tile_rows(d);
}
/* the packed tile: a 1x1 conv's x, all columns, shared; otherwise one thread's
 * columns of im2col, each thread its own */
static int64_t wgrad_pk_floats(const rn_conv_desc *d) {
    return round_up(wgrad_rows(d) * round_up(pointwise(d) ? d->c : wgrad_grid(d).bn, RN_FUSED_NR), SPLIT_ALIGN);
}
static int64_t wgrad_pk_copies(const rn_backend *be, const rn_conv_desc *d) { return pointwise(d) ? 1 : be->nthreads; }

static size_t own_workspace(const rn_backend *be, const rn_conv_desc *d) {
    int64_t need = 0, col = fused_col_floats(be, d);
    if (d->dirs & RN_CONV_FWD) need = col + fused_w_floats(d);
    if ((d->dirs & RN_CONV_BWD_DATA) && col + dgrad_w_floats(d) > need) need = col + dgrad_w_floats(d);
    if ((d->dirs & RN_CONV_BWD_FILTER) && col + wgrad_pk_copies(be, d) * wgrad_pk_floats(d) > need)
        need = col + wgrad_pk_copies(be, d) * wgrad_pk_floats(d);
    return sizeof(float) * (size_t)need;
}

/* An operand of rn's kernel into its panels of RN_FUSED_NR columns, FUSED_PACK_PANELS
 * panels per task: B = src (kc x n, row stride ld; rn_cpu_gemm_pack_n) or, trans, B =
 * src^T with src (n x kc) row-major (rn_cpu_fused_pack). A copy: any split will do. */
typedef struct {
    const float *src;
    int64_t ld, kc, n;
    int trans;
    float *out;
} pack_job;

static void pack_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const pack_job *p = ctx;
    int64_t p0 = t * FUSED_PACK_PANELS, p1 = min64(p0 + FUSED_PACK_PANELS, ceil_div(p->n, RN_FUSED_NR));
    if (p->trans) rn_cpu_fused_pack(p->src, p->n, p->kc, p0, p1, p->out);
    else rn_cpu_gemm_pack_n(p->src, p->ld, p->kc, p->n, p0, p1, p->out);
}

static void pack_run(rn_backend *be, int team, const float *src, int64_t ld, int64_t kc, int64_t n, int trans,
                     float *out) {
    pack_job p = {.src = src, .ld = ld, .kc = kc, .n = n, .trans = trans, .out = out};
    rn_cpu_pool_run(be->impl, ceil_div(ceil_div(n, RN_FUSED_NR), FUSED_PACK_PANELS), team, pack_task, &p);
}

/* j->pk = the weights in the kernel's panels */
static void fused_pack(rn_backend *be, conv_job *j) {
    pack_run(be, (int)j->tn, j->w, kcols(j->d), kcols(j->d), j->d->k, 1, j->pk);
}

/* Task t: row tile t / groups, panel group t % groups (j->ipt panels each). */
static void fused_task(void *ctx, int64_t t, int worker) {
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int64_t M = rows_total(d), kc = kcols(d), groups = ceil_div(fused_panels(d), j->ipt);
    int64_t m0 = t / groups * fused_rows(d), rows = min64(M - m0, fused_rows(d));
    int64_t p0 = t % groups * j->ipt, p1 = min64(p0 + j->ipt, fused_panels(d));
    const float *a;
    if (pointwise(d)) {
        a = j->x + m0 * d->c;
    } else if (whole(d)) {
        a = j->ws + m0 * kc;
    } else {
        float *col = j->ws + (int64_t)worker * tile_stride(d);
        im2col(d, j->x, m0, rows, 0, kc, col);
        a = col;
    }
    rn_cpu_fused_gemm(j->isa, a, kc, rows, kc, j->wp, d->k, p0, p1, j->bias, j->res ? j->res + m0 * d->k : NULL, j->relu,
                      j->y + m0 * d->k);
}

/* prepared: j->w is already packed (rn_cpu_conv_bias_pack) */
static int fused_run(rn_backend *be, conv_job *j, int prepared) {
    const rn_conv_desc *d = j->d;
    const int nt = (int)j->tn;
    const int64_t panels = fused_panels(d), row_tiles = ceil_div(rows_total(d), fused_rows(d));
    if (prepared) {
        j->wp = j->w;
    } else {
        j->pk = j->ws + fused_col_floats(be, d);
        fused_pack(be, j);
        j->wp = j->pk;
    }
    /* panels per task: all, unless the row tiles are fewer than PARTS and the rows are
       shared (a 1x1 conv's x or a whole im2col matrix) */
    j->ipt = panels;
    if (row_tiles < PARTS && (pointwise(d) || whole(d)))
        j->ipt = min64(round_up(ceil_div(panels, min64(ceil_div(PARTS, row_tiles), panels)), 2), panels);
    if (!pointwise(d) && whole(d)) rn_cpu_pool_run(be->impl, nt, nt, conv_im2col_part, j);
    rn_cpu_pool_run(be->impl, row_tiles * ceil_div(panels, j->ipt), nt, fused_task, j);
    return RN_OK;
}

size_t rn_cpu_conv_bias_packed_bytes(rn_backend *be, const rn_conv_desc *d) {
    if (wino_use(be, d)) return sizeof(float) * (size_t)wino_u_floats(d, wino_m(be, d));
    if (fused_use(be)) return sizeof(float) * (size_t)fused_w_floats(d);
    return 0;
}

int rn_cpu_conv_bias_pack(rn_backend *be, const rn_conv_desc *d, const void *wv, void *packed) {
    /* the batch plays no part in packing: only the weights' size is checked */
    if (kcols(d) * d->k > INT_MAX)
        return rn_errorf(RN_EINVAL, "conv_bias_pack: weights too large (k=%d x %lld)", d->k, (long long)kcols(d));
    conv_job j = {.d = d, .w = wv, .pk = packed, .tn = be->nthreads};
    if (wino_use(be, d)) wino_pack(be, &j);
    else fused_pack(be, &j);
    return RN_OK;
}

int rn_cpu_conv_bias_fwd(rn_backend *be, const rn_conv_desc *d, const void *xv, const void *wv,
                         const float *bias, const void *res, int relu, int packed, void *yv) {
    int rc = check_int(d, "conv_bias_fwd");
    if (rc) return rc;
    const int nt = conv_team(be, d);
    conv_job j = {.d = d, .x = xv, .w = wv, .y = yv, .ws = be->ws, .tn = nt, .bias = bias, .res = res,
                  .relu = relu, .isa = rn_cpu_own_isa(be)};
    if (wino_use(be, d)) return wino_run(be, &j, packed);
    if (fused_use(be)) return fused_run(be, &j, packed);
    if (whole(d)) {
        if (!pointwise(d)) rn_cpu_pool_run(be->impl, nt, nt, conv_im2col_part, &j);
        j.g = grid_of(rows_total(d), d->k);
        rn_cpu_pool_run(be->impl, j.g.count, nt, conv_bias_block, &j);
        return RN_OK;
    }
    j.mt = bias_tile_rows(d);
    rn_cpu_pool_run(be->impl, ceil_div(rows_total(d), j.mt), nt, conv_bias_tile, &j);
    return RN_OK;
}


/* ---- training's backward GEMMs on rn's own kernel ----
 * The same tiles, blocks and tasks as through OpenBLAS below, with B packed into the
 * kernel's panels: backward-data's weights once per call behind the im2col tiles,
 * backward-filter's columns of x or im2col per tile into the worker's own slice. Each
 * element's sum runs in one fixed order whatever the cut (backend_cpu_fused.c); the
 * weight gradient's sum over the rows m runs from m = 0 up through every tile in turn,
 * accumulated in dw itself. */

/* rows [m0, m0 + rows) x columns [j0, j0 + nb) of dcol (row stride ldc, at c) = dy w
 * (+ what c holds, accumulating) */
static void dgrad_gemm(const conv_job *j, int64_t m0, int64_t rows, int64_t j0, int64_t nb, float *c, int64_t ldc,
                       int accumulate) {
    const rn_conv_desc *d = j->d;
    const int64_t K = d->k;
    rn_cpu_gemm_args g = {.isa = j->isa, .m = rows, .n = nb, .kc = K, .a = j->dy + m0 * K, .ars = K, .aps = 1,
                          .b = j->wp + j0 / RN_FUSED_NR * K * RN_FUSED_NR, .bps = K * RN_FUSED_NR,
                          .bpp = RN_FUSED_NR, .c = c + j0, .ldc = ldc, .accumulate = accumulate};
    rn_cpu_gemm(&g);
}

/* dw block [i0, i0 + mb) x [j0, j0 + nb) (+)= dy^T over rows [m0, m0 + rows) times pk,
 * those rows' columns [j0, j0 + nb) in panels */
static void wgrad_gemm(const conv_job *j, int64_t m0, int64_t rows, int64_t i0, int64_t mb, int64_t j0, int64_t nb,
                       const float *pk, int accumulate) {
    const rn_conv_desc *d = j->d;
    const int64_t K = d->k, ld = pointwise(d) ? d->c : kcols(d);
    rn_cpu_gemm_args g = {.isa = j->isa, .m = mb, .n = nb, .kc = rows, .a = j->dy + m0 * K + i0, .ars = 1, .aps = K,
                          .a_trans = 1, .b = pk, .bps = rows * RN_FUSED_NR, .bpp = RN_FUSED_NR,
                          .c = j->dw + i0 * ld + j0, .ldc = ld, .accumulate = accumulate};
    rn_cpu_gemm(&g);
}

static void own_bwd_filter_task(void *ctx, int64_t t, int worker) {
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int64_t M = rows_total(d), mt = j->mt;
    int64_t i0, mb, j0, nb;
    grid_block(&j->g, t, &i0, &mb, &j0, &nb);
    if (mb <= 0 || nb <= 0) return;
    float *pk = j->pk + (int64_t)worker * wgrad_pk_floats(d), *col = j->ws + mt * j0;
    const int64_t panels = ceil_div(nb, RN_FUSED_NR);
    for (int64_t m0 = 0; m0 < M; m0 += mt) {
        int64_t rows = min64(M - m0, mt);
        im2col(d, j->x, m0, rows, j0, j0 + nb, col);
        rn_cpu_gemm_pack_n(col, nb, rows, nb, 0, panels, pk);
        wgrad_gemm(j, m0, rows, i0, mb, j0, nb, pk, m0 > 0 || j->accumulate);
    }
}

/* A 1x1 conv: tile by tile, x's rows packed once, then every block of dw takes its sum
 * over the tile's rows (j->ipt: the tile's first row, j->mt its rows). */
static void own_wgrad_block(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    int64_t i0, mb, j0, nb;
    grid_block(&j->g, t, &i0, &mb, &j0, &nb);
    if (mb > 0 && nb > 0) wgrad_gemm(j, j->ipt, j->mt, i0, mb, j0, nb, j->pk + j0 * j->mt, j->ipt > 0 || j->accumulate);
}

/* Receptive fields overlap inside an image but never across images, so a task is a run
 * of whole images: enough of them that the GEMM has a useful number of rows when images
 * are small (late layers), one image in tile-sized row chunks when they are large. A 1x1
 * stride-1 conv has no overlap at all and takes row tiles. Every dx element receives its
 * contributions in the order of the rows m, however the images are grouped. */
static void conv_bwd_data_task(void *ctx, int64_t task, int worker) {
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int K = d->k, C = d->c;
    const int64_t M = rows_total(d), kc = kcols(d);
    float beta = j->accumulate ? 1.0f : 0.0f;
    if (pointwise(d)) {
        int64_t m0 = task * j->mt, rows = min64(M - m0, j->mt);
        if (j->isa) dgrad_gemm(j, m0, rows, 0, C, j->dx + m0 * C, C, j->accumulate);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, C, K, 1.0f,
                         j->dy + m0 * K, K, j->w, C, beta, j->dx + m0 * C, C);
        return;
    }
    const int64_t pq = (int64_t)d->p * d->q, img = (int64_t)d->h * d->w * C;
    float *col = j->ws + (int64_t)worker * tile_stride(d);
    int64_t n0 = task * j->ipt, n1 = min64(n0 + j->ipt, d->n);
    if (!j->accumulate) memset(j->dx + n0 * img, 0, sizeof(float) * (size_t)((n1 - n0) * img));
    for (int64_t m0 = n0 * pq; m0 < n1 * pq; m0 += j->mt) {
        int64_t rows = min64(n1 * pq - m0, j->mt);
        if (j->isa) dgrad_gemm(j, m0, rows, 0, kc, col, kc, 0);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)kc, K, 1.0f,
                         j->dy + m0 * K, K, j->w, (int)kc, 0.0f, col, (int)kc);
        col2im_add(d, col, m0, rows, j->dx);
    }
}

/* Whole-matrix backward data: dcol = dy w in fixed blocks, then col2im split by channels. */
static void conv_dcol_block(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    int kc = (int)kcols(d);
    if (j->isa) { /* rn's kernel: the same block of dcol (or of dx, 1x1) */
        int64_t i0, mb, j0, nb;
        grid_block(&j->g, t, &i0, &mb, &j0, &nb);
        float *c = pointwise(d) ? j->dx : j->ws;
        if (mb > 0 && nb > 0) dgrad_gemm(j, i0, mb, j0, nb, c + i0 * kc, kc, pointwise(d) && j->accumulate);
        return;
    }
    if (pointwise(d)) {
        gemm_block(&j->g, t, CblasNoTrans, CblasNoTrans, d->k, 1.0f, j->dy, d->k, j->w, kc,
                   j->accumulate ? 1.0f : 0.0f, j->dx, kc);
        return;
    }
    gemm_block(&j->g, t, CblasNoTrans, CblasNoTrans, d->k, 1.0f, j->dy, d->k, j->w, kc, 0.0f,
               j->ws, kc);
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

/* Images per backward-data task: as many as one tile holds, fewer when that leaves
 * fewer than PARTS tasks, but not below TILE_MIN_ROWS rows. */
static int64_t bwd_images(const rn_conv_desc *d) {
    const int64_t pq = (int64_t)d->p * d->q, fit = tile_rows(d) / pq;
    int64_t ipt = fit < 1 ? 1 : fit;
    if (ipt > 1 && ceil_div(d->n, ipt) < PARTS) {
        ipt = ceil_div(d->n, PARTS);
        if (ipt * pq < TILE_MIN_ROWS) ipt = min64(TILE_MIN_ROWS / pq, fit);
        if (ipt < 1) ipt = 1;
    }
    return ipt;
}

int rn_cpu_conv_bwd_data(rn_backend *be, const rn_conv_desc *d, const void *dyv, const void *wv,
                         void *dxv, int accumulate) {
    int rc = check_int(d, "conv_bwd_data");
    if (rc) return rc;
    const int nt = conv_team(be, d);
    conv_job j = {.d = d, .dy = dyv, .w = wv, .dx = dxv, .ws = be->ws, .accumulate = accumulate,
                  .tn = nt, .isa = rn_cpu_own_isa(be)};
    if (j.isa) { /* the weights into panels behind the im2col tiles */
        j.pk = j.ws + fused_col_floats(be, d);
        j.wp = j.pk;
        pack_run(be, nt, j.w, kcols(d), d->k, kcols(d), 0, j.pk);
    }
    if (whole(d)) {
        j.g = grid_of(rows_total(d), kcols(d));
        rn_cpu_pool_run(be->impl, j.g.count, nt, conv_dcol_block, &j);
        if (!pointwise(d)) rn_cpu_pool_run(be->impl, nt, nt, conv_col2im_part, &j);
        return RN_OK;
    }
    if (pointwise(d)) {
        j.mt = fwd_tile_rows(d);
        rn_cpu_pool_run(be->impl, ceil_div(rows_total(d), j.mt), nt, conv_bwd_data_task, &j);
        return RN_OK;
    }
    j.ipt = bwd_images(d);
    j.mt = min64(j.ipt * d->p * d->q, tile_rows(d));
    rn_cpu_pool_run(be->impl, ceil_div(d->n, j.ipt), nt, conv_bwd_data_task, &j);
    return RN_OK;
}

/* dw's columns are cut into fixed blocks; each task builds only its columns of every
 * im2col tile and sums the tiles in order, so no two tasks touch one element and each
 * element's sum runs over the same tiles in the same order for any thread count. */
static void conv_bwd_filter_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const conv_job *j = ctx;
    const rn_conv_desc *d = j->d;
    const int K = d->k, C = d->c;
    const int64_t M = rows_total(d), kc = kcols(d), mt = j->mt;
    if (pointwise(d)) {
        gemm_block(&j->g, t, CblasTrans, CblasNoTrans, (int)M, 1.0f, j->dy, K, j->x, C,
                   j->accumulate ? 1.0f : 0.0f, j->dw, C);
        return;
    }
    int64_t i0, mb, k0, width;
    grid_block(&j->g, t, &i0, &mb, &k0, &width);
    float *col = j->ws + mt * k0;
    for (int64_t m0 = 0; m0 < M && width > 0; m0 += mt) {
        int64_t rows = min64(M - m0, mt);
        im2col(d, j->x, m0, rows, k0, k0 + width, col);
        float beta = (m0 == 0 && !j->accumulate) ? 0.0f : 1.0f;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, (int)width, (int)rows, 1.0f,
                    j->dy + m0 * K, K, col, (int)width, beta, j->dw + k0, (int)kc);
    }
}

int rn_cpu_conv_bwd_filter(rn_backend *be, const rn_conv_desc *d, const void *xv,
                           const void *dyv, void *dwv, int accumulate) {
    int rc = check_int(d, "conv_bwd_filter");
    if (rc) return rc;
    const int nt = conv_team(be, d);
    conv_job j = {.d = d, .x = xv, .dy = dyv, .dw = dwv, .ws = be->ws, .mt = tile_rows(d),
                  .tn = nt, .accumulate = accumulate, .isa = rn_cpu_own_isa(be)};
    if (j.isa) {
        j.g = wgrad_grid(d);
        j.pk = j.ws + fused_col_floats(be, d);
        if (!pointwise(d)) {
            j.mt = wgrad_rows(d);
            rn_cpu_pool_run(be->impl, j.g.count, nt, own_bwd_filter_task, &j);
            return RN_OK;
        }
        const int64_t M = rows_total(d), mt = wgrad_rows(d);
        for (int64_t m0 = 0; m0 < M; m0 += mt) {
            j.ipt = m0, j.mt = min64(M - m0, mt);
            pack_run(be, nt, j.x + m0 * d->c, d->c, j.mt, d->c, 0, j.pk);
            rn_cpu_pool_run(be->impl, j.g.count, nt, own_wgrad_block, &j);
        }
        return RN_OK;
    }
    /* im2col: blocks of columns only, each spanning all of dw's rows */
    j.g = pointwise(d) ? grid_of(d->k, d->c) : grid_cut(d->k, kcols(d), d->k, part_len(kcols(d)));
    rn_cpu_pool_run(be->impl, j.g.count, nt, conv_bwd_filter_task, &j);
    return RN_OK;
}

/* ---- fully connected: x (n, in), w (out, in), y (n, out) ----
 * On rn's own kernel the batch is the short side, so every GEMM is written with the
 * weights as A, read in place, and the batch's operand packed into panels (small: n
 * columns): y^T = w x^T, dx^T = w^T dy^T (w read transposed), dw = dy^T x (x packed,
 * dy^T read in place). y and dx are transposed back from the workspace. Each element
 * sums in the order of the inner index (backend_cpu_fused.c), then + b. */

typedef struct {
    const rn_fc_desc *d;
    const float *x, *w, *b, *dy;
    float *y, *dx, *dw, *db;
    gemm_grid gy, gdx, gdw;   /* fixed blocks of y, dx and dw */
    int64_t db_len;           /* bias entries per task */
    int accumulate;
    int isa;                  /* rn's own kernel, or RN_GEMM_NONE: OpenBLAS */
    float *pk, *t;            /* own kernel: the packed batch operand, a transposed result */
    float *pkx;               /* own kernel, backward: x packed for dw */
} fc_job;

/* run t of the bias gradient: its entries summed over the batch in order */
static void fc_db_run(const fc_job *j, int64_t t) {
    const rn_fc_desc *d = j->d;
    int64_t lo = t * j->db_len, hi = min64(lo + j->db_len, d->out);
    for (int64_t k = lo; k < hi; k++) {
        float s = j->accumulate ? j->db[k] : 0.0f;
        for (int i = 0; i < d->n; i++) s += j->dy[(int64_t)i * d->out + k];
        j->db[k] = s;
    }
}

static int64_t npad(const rn_fc_desc *d) { return round_up(d->n, RN_FUSED_NR); }

/* own kernel, floats: forward x^T packed and y^T; backward dy^T packed, dx^T and x packed */
static int64_t fc_fwd_floats(const rn_fc_desc *d) {
    return round_up((int64_t)d->in * npad(d), SPLIT_ALIGN) + round_up((int64_t)d->out * d->n, SPLIT_ALIGN);
}
static int64_t fc_bwd_floats(const rn_fc_desc *d) {
    return round_up((int64_t)d->out * npad(d), SPLIT_ALIGN) + round_up((int64_t)d->in * d->n, SPLIT_ALIGN) +
           round_up((int64_t)d->n * round_up(d->in, RN_FUSED_NR), SPLIT_ALIGN);
}

size_t rn_cpu_fc_workspace(rn_backend *be, const rn_fc_desc *d) {
    if (!fused_use(be)) return 0;
    int64_t f = fc_fwd_floats(d), b = fc_bwd_floats(d);
    return sizeof(float) * (size_t)(f > b ? f : b);
}

/* Rows of a product cut into PARTS tasks, from its shape (the bits do not depend on it). */
static int64_t fc_rows_per_task(int64_t rows) { return part_len(rows); }

/* task t: rows of y^T (= outputs) [r0, r0 + len): w rows times x^T */
static void fc_own_fwd_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const fc_job *j = ctx;
    const rn_fc_desc *d = j->d;
    const int64_t len = fc_rows_per_task(d->out), r0 = t * len, rows = min64(len, d->out - r0);
    rn_cpu_gemm_args g = {.isa = j->isa, .m = rows, .n = d->n, .kc = d->in, .a = j->w + r0 * d->in, .ars = d->in,
                          .aps = 1, .b = j->pk, .bps = (int64_t)d->in * RN_FUSED_NR, .bpp = RN_FUSED_NR,
                          .c = j->t + r0 * d->n, .ldc = d->n};
    rn_cpu_gemm(&g);
}

static int fc_own_fwd(rn_backend *be, fc_job *j, int team) {
    const rn_fc_desc *d = j->d;
    j->pk = be->ws;
    j->t = j->pk + round_up((int64_t)d->in * npad(d), SPLIT_ALIGN);
    pack_run(be, team, j->x, d->in, d->in, d->n, 1, j->pk); /* x^T */
    rn_cpu_pool_run(be->impl, ceil_div(d->out, fc_rows_per_task(d->out)), team, fc_own_fwd_task, j);
    for (int64_t i = 0; i < d->n; i++)
        for (int64_t k = 0; k < d->out; k++) {
            float v = j->t[k * d->n + i];
            j->y[i * d->out + k] = j->b ? v + j->b[k] : v;
        }
    return RN_OK;
}

/* Tasks in order: row blocks of dx^T (inputs; when wanted), the blocks of dw, then runs
 * of bias entries, each summed over the batch in order. */
static void fc_own_bwd_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const fc_job *j = ctx;
    const rn_fc_desc *d = j->d;
    const int64_t len = fc_rows_per_task(d->in), ndx = j->dx ? ceil_div(d->in, len) : 0;
    if (t < ndx) {
        const int64_t r0 = t * len, rows = min64(len, d->in - r0);
        rn_cpu_gemm_args g = {.isa = j->isa, .m = rows, .n = d->n, .kc = d->out, .a = j->w + r0, .ars = 1,
                              .aps = d->in, .a_trans = 1, .b = j->pk, .bps = (int64_t)d->out * RN_FUSED_NR,
                              .bpp = RN_FUSED_NR, .c = j->t + r0 * d->n, .ldc = d->n};
        rn_cpu_gemm(&g);
        return;
    }
    t -= ndx;
    if (t < j->gdw.count) {
        int64_t i0, mb, k0, nb;
        grid_block(&j->gdw, t, &i0, &mb, &k0, &nb);
        if (mb <= 0 || nb <= 0) return;
        rn_cpu_gemm_args g = {.isa = j->isa, .m = mb, .n = nb, .kc = d->n, .a = j->dy + i0, .ars = 1,
                              .aps = d->out, .a_trans = 1, .b = j->pkx + k0 * d->n, .bps = (int64_t)d->n * RN_FUSED_NR,
                              .bpp = RN_FUSED_NR, .c = j->dw + i0 * d->in + k0, .ldc = d->in,
                              .accumulate = j->accumulate};
        rn_cpu_gemm(&g);
        return;
    }
    fc_db_run(j, t - j->gdw.count);
}

static int fc_own_bwd(rn_backend *be, fc_job *j, int team) {
    const rn_fc_desc *d = j->d;
    j->pk = be->ws;
    j->t = j->pk + round_up((int64_t)d->out * npad(d), SPLIT_ALIGN);
    j->pkx = j->t + round_up((int64_t)d->in * d->n, SPLIT_ALIGN);
    if (j->dx) pack_run(be, team, j->dy, d->out, d->out, d->n, 1, j->pk); /* dy^T */
    pack_run(be, team, j->x, d->in, d->n, d->in, 0, j->pkx);
    /* dw's blocks whole multiples of the AVX-512 kernel's 32 columns */
    j->gdw = grid_cut(d->out, d->in, part_len(d->out), min64(round_up(ceil_div(d->in, PARTS), 2 * RN_FUSED_NR), d->in));
    int64_t tasks = (j->dx ? ceil_div(d->in, fc_rows_per_task(d->in)) : 0) + j->gdw.count +
                    (j->db ? ceil_div(d->out, j->db_len) : 0);
    rn_cpu_pool_run(be->impl, tasks, team, fc_own_bwd_task, j);
    if (j->dx)
        for (int64_t i = 0; i < d->n; i++)
            for (int64_t k = 0; k < d->in; k++) j->dx[i * d->in + k] = j->t[k * d->n + i];
    return RN_OK;
}

/* Through OpenBLAS: */

/* Block t of y, then the bias on that block. */
static void fc_fwd_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const fc_job *j = ctx;
    const rn_fc_desc *d = j->d;
    gemm_block(&j->gy, t, CblasNoTrans, CblasTrans, d->in, 1.0f, j->x, d->in, j->w, d->in, 0.0f,
               j->y, d->out);
    if (!j->b) return;
    int64_t i0, mb, k0, nb;
    grid_block(&j->gy, t, &i0, &mb, &k0, &nb);
    for (int64_t i = i0; i < i0 + mb; i++)
        for (int64_t k = k0; k < k0 + nb; k++) j->y[i * d->out + k] += j->b[k];
}

int rn_cpu_fc_fwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
                  const void *b, void *y) {
    fc_job j = {.d = d, .x = x, .w = w, .b = b, .y = y, .gy = grid_of(d->n, d->out), .isa = rn_cpu_own_isa(be)};
    const int team = team_for(be, 2.0 * d->n * d->in * d->out);
    if (j.isa) return fc_own_fwd(be, &j, team);
    rn_cpu_pool_run(be->impl, j.gy.count, team, fc_fwd_task, &j);
    return RN_OK;
}

/* Tasks in order: the blocks of dx (when wanted), of dw, then runs of bias entries, each
 * summed over the batch in order. Independent outputs, no waiting. */
static void fc_bwd_task(void *ctx, int64_t t, int worker) {
    (void)worker;
    const fc_job *j = ctx;
    const rn_fc_desc *d = j->d;
    int64_t ndx = j->dx ? j->gdx.count : 0;
    if (t < ndx) {
        gemm_block(&j->gdx, t, CblasNoTrans, CblasNoTrans, d->out, 1.0f, j->dy, d->out, j->w,
                   d->in, 0.0f, j->dx, d->in);
        return;
    }
    t -= ndx;
    if (t < j->gdw.count) {
        gemm_block(&j->gdw, t, CblasTrans, CblasNoTrans, d->n, 1.0f, j->dy, d->out, j->x, d->in,
                   j->accumulate ? 1.0f : 0.0f, j->dw, d->in);
        return;
    }
    fc_db_run(j, t - j->gdw.count);
}

int rn_cpu_fc_bwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
                  const void *dy, void *dx, void *dw, void *db, int accumulate) {
    fc_job j = {.d = d, .x = x, .w = w, .dy = dy, .dx = dx, .dw = dw, .db = db,
                .gdx = grid_of(d->n, d->in), .gdw = grid_of(d->out, d->in),
                .db_len = part_len(d->out), .accumulate = accumulate, .isa = rn_cpu_own_isa(be)};
    if (j.isa) return fc_own_bwd(be, &j, team_for(be, 2.0 * d->n * d->in * d->out));
    int64_t tasks = (dx ? j.gdx.count : 0) + j.gdw.count + (db ? ceil_div(d->out, j.db_len) : 0);
    rn_cpu_pool_run(be->impl, tasks, team_for(be, 2.0 * d->n * d->in * d->out), fc_bwd_task, &j);
    return RN_OK;
}
