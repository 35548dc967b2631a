/* Backend op tests on the CPU backend: forwards against direct loops in double, every
 * backward against central finite differences (gradcheck.h), BN running statistics,
 * SGD against values torch.optim.SGD printed, and the argument checks. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h"
#include "rn/backend.h"
#include "rn/backend_cpu_impl.h"
#include "rn/err.h"
#include "rn/rng.h"
#include "rn/tensor.h"

#define SEED 20261202u

/* n floats ~ N(mean, std), seeded by stream: never all zeros. */
static float *randn(uint64_t stream, int64_t n, float mean, float std) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    rn_rng_normal(rn_rng_key(SEED, stream), p, n, mean, std);
    return p;
}

static float *zeros(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }

/* max |a - b| / max(|b|, 1) over n, with the first index where it is worst */
static double max_rel(const float *a, const double *b, int64_t n, int64_t *at) {
    double worst = 0;
    *at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]) / fmax(fabs(b[i]), 1.0);
        if (e > worst || e != e) worst = e, *at = i;
    }
    return worst;
}

#define CHECK_CLOSE(what, a, b, n, tol) do { int64_t at_; double e_ = max_rel(a, b, n, &at_); \
    CHECK(e_ <= (tol), "%s: max rel err %.3g at %lld (got %.7g want %.7g)", what, e_, \
          (long long)at_, (double)(a)[at_], (b)[at_]); } while (0)

static void reserve(rn_backend *be, size_t bytes) {
    CHECK_OK(rn_backend_reserve(be, bytes));
}

/* ---- convolution ---- */

static void conv_naive_fwd(const rn_conv_desc *d, const float *x, const float *w, double *y) {
    for (int n = 0; n < d->n; n++)
        for (int p = 0; p < d->p; p++)
            for (int q = 0; q < d->q; q++)
                for (int k = 0; k < d->k; k++) {
                    double s = 0;
                    for (int i = 0; i < d->kh; i++)
                        for (int j = 0; j < d->kw; j++) {
                            int h = p * d->stride_h - d->pad_h + i, ww = q * d->stride_w - d->pad_w + j;
                            if (h < 0 || h >= d->h || ww < 0 || ww >= d->w) continue;
                            for (int c = 0; c < d->c; c++)
                                s += (double)x[((n * d->h + h) * d->w + ww) * d->c + c] *
                                     w[((k * d->kh + i) * d->kw + j) * d->c + c];
                        }
                    y[((n * d->p + p) * d->q + q) * d->k + k] = s;
                }
}

static void conv_naive_bwd(const rn_conv_desc *d, const float *x, const float *w,
                           const float *dy, double *dx, double *dw) {
    memset(dx, 0, sizeof(double) * d->n * d->h * d->w * d->c);
    memset(dw, 0, sizeof(double) * d->k * d->kh * d->kw * d->c);
    for (int n = 0; n < d->n; n++)
        for (int p = 0; p < d->p; p++)
            for (int q = 0; q < d->q; q++)
                for (int k = 0; k < d->k; k++) {
                    double g = dy[((n * d->p + p) * d->q + q) * d->k + k];
                    for (int i = 0; i < d->kh; i++)
                        for (int j = 0; j < d->kw; j++) {
                            int h = p * d->stride_h - d->pad_h + i, ww = q * d->stride_w - d->pad_w + j;
                            if (h < 0 || h >= d->h || ww < 0 || ww >= d->w) continue;
                            for (int c = 0; c < d->c; c++) {
                                int64_t xi = ((n * d->h + h) * d->w + ww) * d->c + c;
                                int64_t wi = ((k * d->kh + i) * d->kw + j) * d->c + c;
                                dx[xi] += g * w[wi];
                                dw[wi] += g * x[xi];
                            }
                        }
                }
}

typedef struct {
    rn_backend *be;
    const rn_conv_desc *d;
    float *x, *w, *y, *r;
} conv_ctx;

static double conv_obj(void *p) {
    conv_ctx *c = p;
    if (rn_conv_fwd(c->be, c->d, c->x, c->w, c->y) != RN_OK) return NAN;
    return gc_dot(c->r, c->y, (int64_t)c->d->n * c->d->p * c->d->q * c->d->k);
}

/* Forward, both backwards and their accumulate forms against the direct loops; the
 * backwards against finite differences too when `grad` (small shapes only). */
static void test_conv_case(rn_backend *be, int n, int h, int w, int c, int k, int ks, int stride,
                           int pad, int grad) {
    rn_conv_desc d;
    CHECK_OK(rn_conv_desc_init(&d, n, h, w, c, k, ks, ks, stride, pad));
    char name[96];
    snprintf(name, sizeof name, "conv n%d %dx%dx%d k%d %dx%d/s%d/p%d", n, h, w, c, k, ks, ks,
             stride, pad);
    int64_t nx = (int64_t)n * h * w * c, nw = (int64_t)k * ks * ks * c,
            ny = (int64_t)n * d.p * d.q * k;
    uint64_t s = (uint64_t)(h * 131 + w * 17 + c * 7 + ks * 3 + stride);
    float *x = randn(s, nx, 0.1f, 1.0f);
    float *w_oihw = randn(s + 1, nw, 0.0f, (float)(1.0 / sqrt((double)ks * ks * c)));
    float *wt = zeros(nw), *back = zeros(nw);
    rn_conv_oihw_to_ohwi(w_oihw, wt, k, c, ks, ks);
    rn_conv_ohwi_to_oihw(wt, back, k, c, ks, ks);
    CHECK(memcmp(back, w_oihw, sizeof(float) * nw) == 0, "%s: OIHW->OHWI->OIHW round trip", name);
    /* the layout helpers against the index formula */
    int bad = 0;
    for (int o = 0; o < k; o++)
        for (int i = 0; i < c; i++)
            for (int r = 0; r < ks; r++)
                for (int t = 0; t < ks; t++)
                    bad += wt[((o * ks + r) * ks + t) * c + i] != w_oihw[((o * c + i) * ks + r) * ks + t];
    CHECK(bad == 0, "%s: OHWI layout has %d misplaced elements", name, bad);

    float *y = zeros(ny), *dy = randn(s + 2, ny, 0.0f, 1.0f);
    float *dx = zeros(nx), *dw = zeros(nw);
    double *ry = malloc(sizeof(double) * ny), *rdx = malloc(sizeof(double) * nx),
           *rdw = malloc(sizeof(double) * nw);
    reserve(be, rn_conv_workspace(be, &d));
    CHECK_OK(rn_conv_fwd(be, &d, x, wt, y));
    conv_naive_fwd(&d, x, wt, ry);
    CHECK_CLOSE(name, y, ry, ny, 1e-5);
    conv_naive_bwd(&d, x, wt, dy, rdx, rdw);
    CHECK_OK(rn_conv_bwd_data(be, &d, dy, wt, dx, 0));
    CHECK_CLOSE("conv bwd_data vs loops", dx, rdx, nx, 1e-5);
    CHECK_OK(rn_conv_bwd_filter(be, &d, x, dy, dw, 0));
    CHECK_CLOSE("conv bwd_filter vs loops", dw, rdw, nw, 1e-4);
    /* accumulate: a second call adds the same gradient again */
    CHECK_OK(rn_conv_bwd_data(be, &d, dy, wt, dx, 1));
    CHECK_OK(rn_conv_bwd_filter(be, &d, x, dy, dw, 1));
    for (int64_t i = 0; i < nx; i++) rdx[i] *= 2;
    for (int64_t i = 0; i < nw; i++) rdw[i] *= 2;
    CHECK_CLOSE("conv bwd_data accumulate", dx, rdx, nx, 1e-5);
    CHECK_CLOSE("conv bwd_filter accumulate", dw, rdw, nw, 1e-4);

    if (grad) {
        conv_ctx cc = {be, &d, x, wt, y, dy};
        CHECK_OK(rn_conv_bwd_data(be, &d, dy, wt, dx, 0));
        CHECK_OK(rn_conv_bwd_filter(be, &d, x, dy, dw, 0));
        char gname[128];
        snprintf(gname, sizeof gname, "%s dx", name);
        gc_check(gname, conv_obj, &cc, x, nx, dx, gc_defaults());
        snprintf(gname, sizeof gname, "%s dw", name);
        gc_check(gname, conv_obj, &cc, wt, nw, dw, gc_defaults());
    }
    free(x), free(w_oihw), free(wt), free(back), free(y), free(dy), free(dx), free(dw);
    free(ry), free(rdx), free(rdw);
}

static void test_conv(rn_backend *be) {
    /* the shapes ResNet uses, shrunk to odd sizes: 1x1, 1x1/2, 3x3, 3x3/2, 7x7/2 stem */
    test_conv_case(be, 2, 5, 7, 3, 5, 1, 1, 0, 1);
    test_conv_case(be, 2, 7, 5, 5, 3, 1, 2, 0, 1);
    test_conv_case(be, 2, 5, 7, 3, 5, 3, 1, 1, 1);
    test_conv_case(be, 2, 7, 7, 5, 3, 3, 2, 1, 1);
    test_conv_case(be, 2, 7, 5, 3, 5, 7, 2, 3, 1);
    test_conv_case(be, 2, 5, 5, 3, 4, 3, 1, 0, 1);   /* no padding */
    test_conv_case(be, 1, 2, 3, 5, 2, 3, 1, 1, 1);   /* output smaller than the kernel rows */
    /* many channels: several im2col tiles per call (KC = 4608 makes a tile ~227 rows) */
    test_conv_case(be, 2, 13, 13, 512, 8, 3, 1, 1, 0);
    test_conv_case(be, 2, 16, 15, 64, 16, 1, 2, 0, 0);
    test_conv_case(be, 3, 40, 40, 16, 8, 1, 1, 0, 0);
    /* many small images: backward-data groups several whole images per GEMM */
    test_conv_case(be, 7, 4, 4, 64, 16, 3, 2, 1, 0);
    test_conv_case(be, 9, 3, 3, 32, 24, 3, 1, 1, 0);
    test_conv_case(be, 5, 8, 8, 96, 32, 1, 2, 0, 0);
    /* few output rows: the whole im2col matrix, its GEMM cut into column blocks */
    test_conv_case(be, 2, 4, 4, 256, 64, 3, 1, 1, 0);
    test_conv_case(be, 2, 4, 4, 512, 256, 1, 1, 0, 0);
    test_conv_case(be, 2, 4, 4, 256, 128, 1, 2, 0, 0);
}

/* The algorithm rn_conv_bias_fwd takes on a context for a shape outside Winograd's: rn's
 * own kernel ("fused GEMM") by default where the CPU has AVX2 and FMA. */
static const char *plain_algo(int openblas, int pointwise) {
    if (!openblas && rn_cpu_gemm_isa()) return pointwise ? "fused GEMM (pointwise)" : "im2col + fused GEMM";
    return pointwise ? "GEMM (pointwise)" : "im2col + GEMM";
}

/* The algorithm the training convs (rn_conv_fwd and both backwards) take: rn's own kernel
 * unless the context keeps OpenBLAS or the CPU lacks AVX2 and FMA. */
static const char *train_algo(int openblas, int pointwise) {
    if (!openblas && rn_cpu_gemm_isa()) return pointwise ? "own GEMM (pointwise)" : "im2col + own GEMM";
    return pointwise ? "GEMM (pointwise)" : "im2col + GEMM";
}

/* rn_conv_bias_fwd_packed with the weights from rn_conv_bias_pack gives y's bits (what
 * rn_conv_bias_fwd gave), or, where the context takes w as it is, is refused. */
static void packed_same(rn_backend *be, const rn_conv_desc *d, const float *x, const float *w, const float *bias,
                        const float *res, int relu, const float *y, const char *what) {
    size_t bytes = rn_conv_bias_packed_bytes(be, d);
    int64_t ny = (int64_t)d->n * d->p * d->q * d->k;
    if (!bytes) {
        CHECK(rn_conv_bias_fwd_packed(be, d, x, w, bias, res, relu, (float *)y) == RN_EINVAL,
              "%s: packed call without a packed form accepted", what);
        CHECK(rn_conv_bias_pack(be, d, w, (float *)y) == RN_EINVAL, "%s: pack without a packed form accepted", what);
        return;
    }
    float *pk = malloc(bytes), *yp = malloc(sizeof(float) * (size_t)ny);
    memset(pk, 0xff, bytes); /* NaN: a lane the pack forgot would show */
    for (int64_t i = 0; i < ny; i++) yp[i] = NAN;
    CHECK_OK(rn_conv_bias_pack(be, d, w, pk));
    CHECK_OK(rn_conv_bias_fwd_packed(be, d, x, pk, bias, res, relu, yp));
    CHECK(memcmp(y, yp, sizeof(float) * (size_t)ny) == 0, "%s: packed weights give other bits", what);
    /* the same packed copy serves a smaller batch: the first image alone, and the last
       (whose rows end a partial tile in the batch): the bits must not depend on the batch */
    if (d->n > 1) {
        rn_conv_desc d1 = *d;
        d1.n = 1;
        int64_t xi = (int64_t)d->h * d->w * d->c, yi = ny / d->n;
        for (int last = 0; last <= 1; last++) {
            int64_t ix = last ? (d->n - 1) * xi : 0, iy = last ? (d->n - 1) * yi : 0;
            for (int64_t i = 0; i < ny; i++) yp[i] = NAN;
            CHECK_OK(rn_conv_bias_fwd_packed(be, &d1, x + ix, pk, bias, res ? res + iy : NULL, relu, yp));
            CHECK(memcmp(y + iy, yp, sizeof(float) * (size_t)yi) == 0, "%s: packed, image %d alone: other bits",
                  what, last ? d->n - 1 : 0);
        }
    }
    free(pk), free(yp);
}

/* rn_conv_bias_fwd against the naive conv in double plus bias [+ residual], [ReLU]; the
 * large cases take the tiled path, the small ones the whole-matrix one. */
static void test_conv_bias_case(rn_backend *be, int n, int h, int w, int c, int k, int ks, int stride, int pad,
                                int residual, int relu) {
    rn_conv_desc d;
    CHECK_OK(rn_conv_desc_init(&d, n, h, w, c, k, ks, ks, stride, pad));
    int64_t nx = (int64_t)n * h * w * c, nw = (int64_t)k * ks * ks * c, ny = (int64_t)n * d.p * d.q * k;
    float *x = randn(40, nx, 0, 1), *wt = randn(41, nw, 0, 0.2f), *bias = randn(42, k, 0, 1);
    float *res = residual ? randn(43, ny, 0, 1) : NULL, *y = zeros(ny);
    double *ref = malloc(sizeof(double) * (size_t)ny);
    conv_naive_fwd(&d, x, wt, ref);
    for (int64_t i = 0; i < ny; i++) {
        ref[i] += (double)bias[i % k] + (res ? (double)res[i] : 0.0);
        if (relu && ref[i] < 0) ref[i] = 0;
    }
    reserve(be, rn_conv_workspace(be, &d));
    for (int64_t i = 0; i < ny; i++) y[i] = NAN; /* a stale output must not pass */
    CHECK_OK(rn_conv_bias_fwd(be, &d, x, wt, bias, res, relu, y));
    char what[160];
    snprintf(what, sizeof what, "conv_bias %dx%dx%dx%d k%d %dx%d/%d res %d relu %d (%s)", n, h, w, c, k, ks, ks,
             stride, residual, relu, rn_conv_algo(be, &d, RN_CONV_BIAS_FWD));
    CHECK_CLOSE(what, y, ref, ny, 1e-5);
    packed_same(be, &d, x, wt, bias, res, relu, y, what);
    /* a NaN bias stays NaN through the ReLU, as in PyTorch */
    bias[0] = NAN;
    CHECK_OK(rn_conv_bias_fwd(be, &d, x, wt, bias, res, relu, y));
    int nan_kept = 1;
    for (int64_t i = 0; i < ny; i += k) nan_kept &= isnan(y[i]);
    CHECK(nan_kept, "%s: NaN bias not propagated through ReLU", what);
    free(x), free(wt), free(bias), free(res), free(y), free(ref);
}

static void test_conv_bias_on(rn_backend *be, int openblas) {
    rn_conv_desc d;
    CHECK_OK(rn_conv_desc_init(&d, 2, 8, 8, 64, 64, 3, 3, 1, 1));
    CHECK(strcmp(rn_conv_algo(be, &d, RN_CONV_BIAS_FWD), plain_algo(openblas, 0)) == 0, "3x3 conv_bias runs %s",
          rn_conv_algo(be, &d, RN_CONV_BIAS_FWD));
    CHECK_OK(rn_conv_desc_init(&d, 2, 8, 8, 64, 64, 1, 1, 1, 0));
    CHECK(strcmp(rn_conv_algo(be, &d, RN_CONV_BIAS_FWD), plain_algo(openblas, 1)) == 0, "1x1 conv_bias runs %s",
          rn_conv_algo(be, &d, RN_CONV_BIAS_FWD));
    CHECK(strcmp(rn_conv_algo(be, &d, RN_CONV_FWD), train_algo(openblas, 1)) == 0, "1x1 conv_fwd runs %s",
          rn_conv_algo(be, &d, RN_CONV_FWD));
    test_conv_bias_case(be, 2, 5, 7, 3, 5, 3, 1, 1, 1, 1);
    test_conv_bias_case(be, 2, 7, 5, 3, 5, 7, 2, 3, 0, 1);
    test_conv_bias_case(be, 2, 16, 15, 64, 16, 1, 2, 0, 0, 0);
    test_conv_bias_case(be, 2, 4, 4, 512, 256, 1, 1, 0, 1, 1);
    /* tiled: KC = 576 makes a tile ~1820 rows of 2048; 512 channels ~2048 of 3200 */
    test_conv_bias_case(be, 2, 32, 32, 64, 16, 3, 1, 1, 1, 1);
    test_conv_bias_case(be, 2, 40, 40, 512, 16, 1, 1, 0, 1, 1);
    test_conv_bias_case(be, 2, 40, 40, 512, 16, 1, 1, 0, 0, 0);
    /* the own kernel's edges: rows not a multiple of 6 (35, 1), filters not of 16 (37, 1),
     * dot products in several chunks of 256 with a partial last one (300, 9 * 40) */
    test_conv_bias_case(be, 1, 5, 7, 300, 37, 1, 1, 0, 1, 1);
    test_conv_bias_case(be, 1, 1, 1, 300, 1, 1, 1, 0, 1, 0);
    test_conv_bias_case(be, 3, 9, 11, 40, 37, 3, 2, 1, 0, 1);
    test_conv_bias_case(be, 1, 20, 20, 40, 40, 3, 1, 1, 1, 1);
    /* the inference net's fc as a 1x1 conv: 13 images of 1x1 (two tiles of 6 and one
       row), 1000 classes (62 panels and a half) */
    test_conv_bias_case(be, 13, 1, 1, 520, 1000, 1, 1, 0, 0, 0);
}

/* rn_conv_bias_fwd on the default context (rn's own kernel where the CPU has AVX2 and
 * FMA) and on one that keeps OpenBLAS (RN_CPU_GEMM=openblas). */
static void test_conv_bias(rn_backend *be) {
    test_conv_bias_on(be, 0);
    rn_backend_opts o;
    rn_backend_opts_init(&o);
    o.cpu_gemm = RN_CPU_GEMM_OPENBLAS;
    rn_backend *blas = NULL;
    CHECK_OK(rn_backend_create("cpu", 2, &o, &blas));
    if (!blas) return;
    test_conv_bias_on(blas, 1);
    rn_backend_destroy(blas);
}

/* Winograd F(mxm,3x3) in rn_conv_bias_fwd: the algorithm must be the one that ran, and
 * every output within its tolerance of the sum of its terms' magnitudes (sum |x w| +
 * |bias| + |res|) from the naive conv in double, and from a context with Winograd off
 * (im2col + GEMM). F(2,3)'s transforms add, subtract and halve before and after a dot
 * product of C terms, so its error is that of a float dot product (~C ulps of the
 * magnitude sum at worst, far less on average) with a small constant; relative to the
 * output value itself it is unbounded where the terms cancel, so the magnitude sum is the
 * scale. Measured: ~1e-7 (about one ulp); 1e-6 leaves 10x for other BLAS kernels and is
 * still far below what a wrong coefficient or misplaced tap makes (whole terms: 1e-3 of
 * the sum and more). F(4,3)'s transforms scale by up to 8 (and its filters by 1/24):
 * measured 2-3e-6, so 2e-5, still 50x below a wrong term. */
#define WINO_TOL 1e-6
#define WINO4_TOL 2e-5
static void test_wino_case(rn_backend *be, rn_backend *exact, int m, int n, int h, int w, int c, int k, int residual,
                           int relu) {
    const char *algo = m == 4 ? "Winograd F(4x4,3x3)" : "Winograd F(2x2,3x3)";
    const double tol = m == 4 ? WINO4_TOL : WINO_TOL;
    rn_conv_desc d;
    CHECK_OK(rn_conv_desc_init(&d, n, h, w, c, k, 3, 3, 1, 1));
    int64_t nx = (int64_t)n * h * w * c, nw = (int64_t)k * 9 * c, ny = (int64_t)n * d.p * d.q * k;
    uint64_t s = (uint64_t)(h * 131 + w * 17 + c * 7 + k * 3 + n);
    float *x = randn(s, nx, 0.1f, 1), *wt = randn(s + 1, nw, 0, 0.2f), *bias = randn(s + 2, k, 0, 1);
    float *res = residual ? randn(s + 3, ny, 0, 1) : NULL, *y = zeros(ny), *yi = zeros(ny);
    double *ref = malloc(sizeof(double) * (size_t)ny), *mag = malloc(sizeof(double) * (size_t)ny);
    conv_naive_fwd(&d, x, wt, ref);
    /* the magnitude sum: the naive conv of |x| and |w| */
    float *ax = zeros(nx), *aw = zeros(nw);
    for (int64_t i = 0; i < nx; i++) ax[i] = fabsf(x[i]);
    for (int64_t i = 0; i < nw; i++) aw[i] = fabsf(wt[i]);
    conv_naive_fwd(&d, ax, aw, mag);
    for (int64_t i = 0; i < ny; i++) {
        ref[i] += (double)bias[i % k] + (res ? (double)res[i] : 0.0);
        mag[i] += fabs((double)bias[i % k]) + (res ? fabs((double)res[i]) : 0.0);
        if (relu && ref[i] < 0) ref[i] = 0;
    }
    char what[128];
    snprintf(what, sizeof what, "winograd F(%dx%d) n%d %dx%dx%d k%d res %d relu %d", m, m, n, h, w, c, k, residual,
             relu);
    reserve(be, rn_conv_workspace(be, &d));
    reserve(exact, rn_conv_workspace(exact, &d));
    CHECK(strcmp(rn_conv_algo(be, &d, RN_CONV_BIAS_FWD), algo) == 0, "%s: algo %s", what,
          rn_conv_algo(be, &d, RN_CONV_BIAS_FWD));
    CHECK(strcmp(rn_conv_algo(exact, &d, RN_CONV_BIAS_FWD), plain_algo(0, 0)) == 0, "%s: Winograd off: algo %s",
          what, rn_conv_algo(exact, &d, RN_CONV_BIAS_FWD));
    /* NaN first: a stale output from an earlier case must not pass */
    for (int64_t i = 0; i < ny; i++) y[i] = NAN;
    CHECK_OK(rn_conv_bias_fwd(be, &d, x, wt, bias, res, relu, y));
    CHECK_OK(rn_conv_bias_fwd(exact, &d, x, wt, bias, res, relu, yi));
    double worst = 0, worst_i = 0, scale = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < ny; i++) {
        double e = fabs((double)y[i] - ref[i]) / mag[i], ei = fabs((double)y[i] - (double)yi[i]) / mag[i];
        if (!(e <= worst)) worst = e, at = i; /* NaN counts as worst */
        if (ei > worst_i) worst_i = ei;
        if (mag[i] > scale) scale = mag[i];
    }
    CHECK(worst <= tol, "%s: error %.3g of the magnitude sum at %lld (got %.7g want %.7g)", what, worst,
          (long long)at, (double)y[at], ref[at]);
    CHECK(worst_i <= tol, "%s: %.3g of the magnitude sum from the path with Winograd off", what, worst_i);
    packed_same(be, &d, x, wt, bias, res, relu, y, what);
    printf("  %s: max error %.2g of the magnitude sum (%.2g vs Winograd off)\n", what, worst, worst_i);
    /* a NaN bias stays NaN through the ReLU in the vector lanes (channel 0) and in the
       scalar tail (channel k - 1 when k is not a multiple of 8), as in PyTorch */
    bias[0] = bias[k - 1] = NAN;
    CHECK_OK(rn_conv_bias_fwd(be, &d, x, wt, bias, res, relu, y));
    int nan_kept = 1;
    for (int64_t i = 0; i < ny; i += k) nan_kept &= isnan(y[i]) && isnan(y[i + k - 1]);
    CHECK(nan_kept, "%s: NaN bias not propagated through ReLU", what);
    free(x), free(wt), free(bias), free(res), free(y), free(yi), free(ref), free(mag), free(ax), free(aw);
}

/* the algorithm a square 3x3 stride-1 conv of n images, h x h, c channels in and out takes */
static void wino_expect(rn_backend *be, int n, int h, int c, int dir, const char *want, const char *what) {
    rn_conv_desc d;
    CHECK_OK(rn_conv_desc_init(&d, n, h, h, c, c, 3, 3, 1, 1));
    CHECK(strcmp(rn_conv_algo(be, &d, dir), want) == 0, "%s: %s", what, rn_conv_algo(be, &d, dir));
}

/* be: a default context, Winograd on (RN_CPU_WINOGRAD unset or 1): F(4x4) where its
 * tiles fit, else F(2x2) */
static void test_wino(rn_backend *be) {
    rn_backend_opts o;
    rn_backend_opts_init(&o);
    o.cpu_winograd = 0;
    rn_backend *off = NULL, *two = NULL, *blas = NULL, *blas2 = NULL;
    CHECK_OK(rn_backend_create("cpu", 2, &o, &off));
    o.cpu_winograd = 2; /* RN_CPU_WINOGRAD=2: F(2x2) only */
    CHECK_OK(rn_backend_create("cpu", 2, &o, &two));
    o.cpu_gemm = RN_CPU_GEMM_OPENBLAS; /* RN_CPU_GEMM=openblas: the GEMMs through OpenBLAS */
    CHECK_OK(rn_backend_create("cpu", 2, &o, &blas2));
    o.cpu_winograd = 1;
    CHECK_OK(rn_backend_create("cpu", 2, &o, &blas));
    if (!off || !two || !blas || !blas2) goto done;
    /* On a 2-thread context a case whose tiles fit one block (V and M of 4 MiB:
     * 4 MiB / (36 * 4 bytes * (C + K)), rounded down to 16, at least 64 tiles) runs the
     * three passes; the 40x38 one (200 tiles > 112) runs blocks, and packed_same runs its
     * first image alone (100 tiles) through the three passes: the same bits. */
    test_wino_case(be, off, 4, 1, 15, 13, 129, 131, 1, 1);  /* odd P and Q: partial edge tiles; odd C, K */
    test_wino_case(be, off, 4, 3, 14, 14, 128, 136, 0, 0);  /* several images, 77% of the tiles inside */
    test_wino_case(be, off, 4, 2, 17, 18, 133, 128, 1, 0);
    test_wino_case(be, off, 4, 2, 13, 14, 300, 150, 0, 1);  /* long dot products */
    test_wino_case(be, off, 4, 2, 40, 38, 128, 128, 1, 1);  /* several tile blocks, the last partial */
    test_wino_case(be, off, 4, 1, 14, 14, 256, 256, 1, 1);  /* ResNet-50's 14x14 3x3 at batch 1 */
    test_wino_case(be, off, 4, 1, 20, 19, 64, 70, 1, 1);    /* the fewest channels it takes */
    test_wino_case(be, off, 2, 2, 13, 13, 64, 72, 1, 1);    /* 4x4 tiles 66% inside: F(2x2) */
    test_wino_case(two, off, 2, 1, 15, 13, 129, 131, 1, 1);
    test_wino_case(two, off, 2, 2, 40, 38, 128, 128, 1, 1);
    test_wino_case(two, off, 2, 1, 14, 14, 256, 256, 1, 1);
    test_wino_case(two, off, 2, 1, 20, 19, 64, 70, 1, 1);
    /* through OpenBLAS: one block per image, and two (11x12 = 132 tiles, blocks of 112),
     * partial tiles in both directions */
    test_wino_case(blas, off, 4, 2, 17, 18, 133, 128, 1, 1);
    test_wino_case(blas, off, 4, 2, 43, 45, 128, 128, 1, 1);
    /* two blocks per image (380 tiles, blocks of 240), scalar tails in both transforms */
    test_wino_case(blas2, off, 2, 2, 40, 38, 129, 131, 1, 1);
    /* too few tiles per image (4x4 tiles: 4 < 16; 2x2 tiles: 16 < 49) at any batch,
     * im2col; and so is a 1x1 output, and fewer than 64 channels; rn_conv_fwd (training,
     * exact inference) never takes it, nor does a context with it off */
    wino_expect(be, 64, 7, 512, RN_CONV_BIAS_FWD, plain_algo(0, 0), "7x7 batch 64");
    wino_expect(be, 64, 1, 512, RN_CONV_BIAS_FWD, plain_algo(0, 0), "1x1 batch 64");
    wino_expect(be, 32, 56, 32, RN_CONV_BIAS_FWD, plain_algo(0, 0), "56x56x32 batch 32");
    wino_expect(be, 32, 56, 64, RN_CONV_BIAS_FWD, "Winograd F(4x4,3x3)", "56x56x64 batch 32");
    wino_expect(be, 1, 13, 64, RN_CONV_BIAS_FWD, "Winograd F(2x2,3x3)", "13x13x64 batch 1");
    wino_expect(two, 32, 56, 64, RN_CONV_BIAS_FWD, "Winograd F(2x2,3x3)", "F(2x2) only: 56x56x64 batch 32");
    wino_expect(be, 2, 40, 128, RN_CONV_FWD, train_algo(0, 0), "conv_fwd 40x40x128");
    wino_expect(off, 2, 40, 128, RN_CONV_BIAS_FWD, plain_algo(0, 0), "Winograd off 40x40x128");
done:
    rn_backend_destroy(off);
    rn_backend_destroy(two);
    rn_backend_destroy(blas);
    rn_backend_destroy(blas2);
}

/* ---- batch norm ---- */

typedef struct {
    rn_backend *be;
    rn_bn_desc d;
    float *x, *gamma, *beta, *res, *y, *r, *mean, *invstd;
} bn_ctx;

static double bn_obj(void *p) {
    bn_ctx *b = p;
    if (rn_bn_fwd_train(b->be, &b->d, b->x, b->gamma, b->beta, b->res, b->y, b->mean,
                        b->invstd, NULL, NULL, NULL) != RN_OK)
        return NAN;
    return gc_dot(b->r, b->y, b->d.m * b->d.c);
}

/* Random BN inputs: x (n), gamma and beta (c), a residual (n) or NULL, y zeroed (n), and
 * r (n), the fixed direction the objectives dot y with. */
static void bn_inputs(uint64_t s, int64_t n, int c, int residual, float **x, float **gamma, float **beta,
                      float **res, float **y, float **r) {
    *x = randn(s, n, 0.7f, 2.0f);
    *gamma = randn(s + 1, c, 1.0f, 0.5f);
    *beta = randn(s + 2, c, 0.0f, 0.5f);
    *res = residual ? randn(s + 3, n, 0.0f, 1.0f) : NULL;
    *y = zeros(n);
    *r = randn(s + 4, n, 0.0f, 1.0f);
}

/* Central differences of obj (a forward, dotted with a fixed r) against a BN backward's
 * dx, dgamma, dbeta and, with a residual, dres. */
static void bn_gradcheck(const char *name, double (*obj)(void *), void *ctx, float *x, float *gamma, float *beta,
                         float *res, int64_t n, int c, const float *dx, const float *dg, const float *db,
                         const float *dres) {
    char g[96];
    gc_opts o = gc_defaults();
    o.max_points = 400;   /* every point costs a whole forward: keep big cases quick */
    snprintf(g, sizeof g, "%s dx", name);
    gc_check(g, obj, ctx, x, n, dx, o);
    snprintf(g, sizeof g, "%s dgamma", name);
    gc_check(g, obj, ctx, gamma, c, dg, o);
    snprintf(g, sizeof g, "%s dbeta", name);
    gc_check(g, obj, ctx, beta, c, db, o);
    if (res) {
        snprintf(g, sizeof g, "%s dres", name);
        gc_check(g, obj, ctx, res, n, dres, o);
    }
}

static void test_bn_case(rn_backend *be, int64_t m, int c, int relu, int residual) {
    char name[64];
    snprintf(name, sizeof name, "bn m%lld c%d%s%s", (long long)m, c, relu ? " relu" : "",
             residual ? " +res" : "");
    bn_ctx b = {be, {0}, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK_OK(rn_bn_desc_init(&b.d, m, c, relu));
    int64_t n = m * c;
    uint64_t s = 1000 + (uint64_t)(m * 8 + c * 2 + relu + residual * 4);
    bn_inputs(s, n, c, residual, &b.x, &b.gamma, &b.beta, &b.res, &b.y, &b.r);
    b.mean = zeros(c), b.invstd = zeros(c);
    float *rm = randn(s + 5, c, 0.0f, 1.0f), *rv = randn(s + 6, c, 2.0f, 0.3f);
    float *rm0 = malloc(sizeof(float) * c), *rv0 = malloc(sizeof(float) * c);
    memcpy(rm0, rm, sizeof(float) * c), memcpy(rv0, rv, sizeof(float) * c);
    reserve(be, rn_bn_workspace(be, &b.d));
    CHECK_OK(rn_bn_fwd_train(be, &b.d, b.x, b.gamma, b.beta, b.res, b.y, b.mean, b.invstd, rm,
                             rv, NULL));

    /* forward and statistics against the definition, in double */
    double *ry = malloc(sizeof(double) * n), *rmean = malloc(sizeof(double) * c),
           *rinv = malloc(sizeof(double) * c), *rrm = malloc(sizeof(double) * c),
           *rrv = malloc(sizeof(double) * c);
    for (int j = 0; j < c; j++) {
        double s1 = 0, s2 = 0;
        for (int64_t i = 0; i < m; i++) s1 += b.x[i * c + j];
        double mu = s1 / m;
        for (int64_t i = 0; i < m; i++) s2 += (b.x[i * c + j] - mu) * (b.x[i * c + j] - mu);
        double var = s2 / m;
        rmean[j] = mu, rinv[j] = 1 / sqrt(var + 1e-5);
        rrm[j] = 0.9 * rm0[j] + 0.1 * mu;
        rrv[j] = 0.9 * rv0[j] + 0.1 * s2 / (m - 1);
        for (int64_t i = 0; i < m; i++) {
            double v = b.gamma[j] * (b.x[i * c + j] - mu) * rinv[j] + b.beta[j];
            if (residual) v += b.res[i * c + j];
            ry[i * c + j] = relu && v < 0 ? 0 : v;
        }
    }
    CHECK_CLOSE(name, b.y, ry, n, 2e-6);
    CHECK_CLOSE("bn save_mean", b.mean, rmean, c, 1e-6);
    CHECK_CLOSE("bn save_invstd", b.invstd, rinv, c, 1e-6);
    CHECK_CLOSE("bn running_mean (momentum 0.1)", rm, rrm, c, 1e-6);
    CHECK_CLOSE("bn running_var (momentum 0.1, unbiased)", rv, rrv, c, 1e-6);

    /* inference forward with the updated running statistics */
    for (int j = 0; j < c; j++)
        for (int64_t i = 0; i < m; i++) {
            double v = b.gamma[j] * (b.x[i * c + j] - rm[j]) / sqrt((double)rv[j] + 1e-5) + b.beta[j];
            if (residual) v += b.res[i * c + j];
            ry[i * c + j] = relu && v < 0 ? 0 : v;
        }
    float *yi = zeros(n);
    CHECK_OK(rn_bn_fwd_infer(be, &b.d, b.x, b.gamma, b.beta, rm, rv, b.res, yi));
    CHECK_CLOSE("bn inference", yi, ry, n, 2e-6);

    /* backward against finite differences */
    float *dx = zeros(n), *dres = residual ? zeros(n) : NULL, *dg = zeros(c), *db = zeros(c);
    CHECK_OK(rn_bn_fwd_train(be, &b.d, b.x, b.gamma, b.beta, b.res, b.y, b.mean, b.invstd, NULL,
                             NULL, NULL));
    CHECK_OK(rn_bn_bwd(be, &b.d, b.x, b.y, b.r, b.gamma, b.mean, b.invstd, dx, dg, db, dres, NULL, 0));
    bn_gradcheck(name, bn_obj, &b, b.x, b.gamma, b.beta, b.res, n, c, dx, dg, db, dres);

    /* accumulate doubles dgamma/dbeta; in place (dx and dres on dy) gives the same dx */
    double *r2 = malloc(sizeof(double) * (c + n));
    for (int j = 0; j < c; j++) r2[j] = 2.0 * dg[j];
    float *dy2 = malloc(sizeof(float) * n);
    memcpy(dy2, b.r, sizeof(float) * n);
    CHECK_OK(rn_bn_bwd(be, &b.d, b.x, b.y, dy2, b.gamma, b.mean, b.invstd, dy2, dg, db,
                       NULL, NULL, 1));
    CHECK_CLOSE("bn dgamma accumulate", dg, r2, c, 1e-6);
    for (int64_t i = 0; i < n; i++) r2[i] = dx[i];
    CHECK_CLOSE("bn dx in place (dx == dy)", dy2, r2, n, 1e-6);
    if (residual) {
        memcpy(dy2, b.r, sizeof(float) * n);
        float *dx3 = zeros(n);
        CHECK_OK(rn_bn_bwd(be, &b.d, b.x, b.y, dy2, b.gamma, b.mean, b.invstd, dx3, dg, db,
                           dy2, NULL, 0));
        CHECK_CLOSE("bn dx with dres == dy", dx3, r2, n, 1e-6);
        for (int64_t i = 0; i < n; i++) r2[i] = dres[i];
        CHECK_CLOSE("bn dres in place (dres == dy)", dy2, r2, n, 0);
        free(dx3);
    }
    free(b.x), free(b.gamma), free(b.beta), free(b.res), free(b.y), free(b.r), free(b.mean);
    free(b.invstd), free(rm), free(rv), free(rm0), free(rv0), free(ry), free(rmean), free(rinv);
    free(rrm), free(rrv), free(yi), free(dx), free(dres), free(dg), free(db), free(r2), free(dy2);
}

/* Frozen BN (training with the running statistics, as in fine-tuning): the backward of
 * the inference forward, against finite differences of it. */
typedef struct {
    rn_backend *be;
    rn_bn_desc d;
    float *x, *gamma, *beta, *res, *y, *r, *rm, *rv;
} bnf_ctx;

static double bnf_obj(void *p) {
    bnf_ctx *b = p;
    if (rn_bn_fwd_infer(b->be, &b->d, b->x, b->gamma, b->beta, b->rm, b->rv, b->res, b->y) != RN_OK)
        return NAN;
    return gc_dot(b->r, b->y, b->d.m * b->d.c);
}

static void test_bn_frozen_case(rn_backend *be, int64_t m, int c, int relu, int residual) {
    char name[64], g[96];
    snprintf(name, sizeof name, "bn frozen m%lld c%d%s%s", (long long)m, c, relu ? " relu" : "",
             residual ? " +res" : "");
    bnf_ctx b = {be, {0}, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK_OK(rn_bn_desc_init(&b.d, m, c, relu));
    int64_t n = m * c;
    uint64_t s = 5000 + (uint64_t)(m * 8 + c * 2 + relu + residual * 4);
    bn_inputs(s, n, c, residual, &b.x, &b.gamma, &b.beta, &b.res, &b.y, &b.r);
    b.rm = randn(s + 5, c, 0.5f, 1.0f), b.rv = randn(s + 6, c, 3.0f, 0.5f);
    float *rm0 = malloc(sizeof(float) * c), *rv0 = malloc(sizeof(float) * c);
    memcpy(rm0, b.rm, sizeof(float) * c), memcpy(rv0, b.rv, sizeof(float) * c);
    reserve(be, rn_bn_workspace(be, &b.d));
    CHECK_OK(rn_bn_fwd_infer(be, &b.d, b.x, b.gamma, b.beta, b.rm, b.rv, b.res, b.y));
    float *dx = zeros(n), *dres = residual ? zeros(n) : NULL, *dg = zeros(c), *db = zeros(c);
    CHECK_OK(rn_bn_bwd_frozen(be, &b.d, b.x, b.y, b.r, b.gamma, b.rm, b.rv, dx, dg, db, dres, 0));
    CHECK(memcmp(rm0, b.rm, sizeof(float) * c) == 0 && memcmp(rv0, b.rv, sizeof(float) * c) == 0,
          "%s: running statistics unchanged", name);
    bn_gradcheck(name, bnf_obj, &b, b.x, b.gamma, b.beta, b.res, n, c, dx, dg, db, dres);
    /* accumulate doubles dgamma; dx in place on dy gives the same dx */
    double *r2 = malloc(sizeof(double) * (c + n));
    for (int j = 0; j < c; j++) r2[j] = 2.0 * dg[j];
    float *dy2 = malloc(sizeof(float) * n);
    memcpy(dy2, b.r, sizeof(float) * n);
    CHECK_OK(rn_bn_bwd_frozen(be, &b.d, b.x, b.y, dy2, b.gamma, b.rm, b.rv, dy2, dg, db, NULL, 1));
    snprintf(g, sizeof g, "%s dgamma accumulate", name);
    CHECK_CLOSE(g, dg, r2, c, 1e-6);
    for (int64_t i = 0; i < n; i++) r2[i] = dx[i];
    snprintf(g, sizeof g, "%s dx in place", name);
    CHECK_CLOSE(g, dy2, r2, n, 1e-6);
    free(b.x), free(b.gamma), free(b.beta), free(b.res), free(b.y), free(b.r), free(b.rm), free(b.rv);
    free(rm0), free(rv0), free(dx), free(dres), free(dg), free(db), free(r2), free(dy2);
}

static void test_bn(rn_backend *be) {
    for (int relu = 0; relu < 2; relu++)
        for (int res = 0; res < 2; res++) test_bn_frozen_case(be, 2 * 5 * 7, 8, relu, res);
    test_bn_frozen_case(be, 1, 5, 1, 1);          /* one position: fine when frozen */
    test_bn_frozen_case(be, 2 * 3 * 5, 300, 1, 0);

    for (int relu = 0; relu < 2; relu++)
        for (int res = 0; res < 2; res++) test_bn_case(be, 2 * 5 * 7, 3, relu, res);
    test_bn_case(be, 2 * 7 * 7, 5, 1, 1);
    test_bn_case(be, 2, 5, 0, 0);              /* fewest positions training allows */
    test_bn_case(be, 2 * 3 * 5, 300, 1, 0);    /* more channels than one block of 256 */

    /* torch refuses training statistics from one value per channel */
    rn_bn_desc d;
    CHECK_OK(rn_bn_desc_init(&d, 1, 3, 0));
    float v[3] = {1, 2, 3}, o[3], mean[3], inv[3];
    float gm[3] = {1, 1, 1}, bt[3] = {0, 0, 0};
    CHECK(rn_bn_fwd_train(be, &d, v, gm, bt, NULL, o, mean, inv, NULL, NULL, NULL) == RN_EINVAL,
          "m = 1 in training must fail");
    CHECK(strstr(rn_last_error(), "more than 1 value") != NULL, "message: %s", rn_last_error());
}

/* ---- elementwise ---- */

static void test_elementwise(rn_backend *be) {
    const int64_t n = 2 * 5 * 7 * 3;
    float *a = randn(2001, n, 0, 1), *b = randn(2002, n, 0, 1), *y = zeros(n), *dx = zeros(n);
    float *dy = randn(2003, n, 0, 1);
    double *r = malloc(sizeof(double) * n);
    CHECK_OK(rn_add(be, RN_F32, n, a, b, y, 0));
    for (int64_t i = 0; i < n; i++) r[i] = (double)a[i] + b[i];
    CHECK_CLOSE("add", y, r, n, 1e-7);
    CHECK_OK(rn_add(be, RN_F32, n, a, b, y, 1));
    for (int64_t i = 0; i < n; i++) r[i] = r[i] > 0 ? r[i] : 0;
    CHECK_CLOSE("add relu", y, r, n, 1e-7);
    CHECK_OK(rn_relu_bwd(be, RN_F32, n, y, dy, dx));
    for (int64_t i = 0; i < n; i++) r[i] = y[i] > 0 ? dy[i] : 0;
    CHECK_CLOSE("relu_bwd", dx, r, n, 0);
    CHECK_OK(rn_relu_fwd(be, RN_F32, n, a, y));
    for (int64_t i = 0; i < n; i++) r[i] = a[i] > 0 ? a[i] : 0;
    CHECK_CLOSE("relu_fwd", y, r, n, 0);
    CHECK_OK(rn_relu_fwd(be, RN_F32, n, a, a));
    CHECK_CLOSE("relu_fwd in place", a, r, n, 0);

    uint8_t px[2 * 3 * 3];
    for (int i = 0; i < 18; i++) px[i] = (uint8_t)(i * 14 + 3);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    float o[18];
    double ro[18];
    CHECK_OK(rn_input_normalize(be, RN_F32, 6, 3, px, mean, sd, o));
    for (int i = 0; i < 18; i++) ro[i] = (px[i] / 255.0 - mean[i % 3]) / sd[i % 3];
    CHECK_CLOSE("input_normalize", o, ro, 18, 1e-6);
    free(a), free(b), free(y), free(dx), free(dy), free(r);
}

/* ---- pooling ---- */

typedef struct {
    rn_backend *be;
    const rn_pool_desc *d;
    float *x, *y, *r;
} pool_ctx;

static double pool_obj(void *p) {
    pool_ctx *c = p;
    if (rn_maxpool_fwd(c->be, c->d, c->x, c->y) != RN_OK) return NAN;
    return gc_dot(c->r, c->y, (int64_t)c->d->n * c->d->p * c->d->q * c->d->c);
}

static void test_maxpool_case(rn_backend *be, int n, int h, int w, int c, int k, int stride, int pad) {
    rn_pool_desc d;
    CHECK_OK(rn_pool_desc_init(&d, n, h, w, c, k, stride, pad));
    int64_t nx = (int64_t)n * h * w * c, ny = (int64_t)n * d.p * d.q * c;
    float *x = randn(3000 + h * 10 + w + k, nx, 0, 1), *y = zeros(ny), *dx = zeros(nx);
    float *dy = randn(3100 + h, ny, 0, 1);
    double *ry = malloc(sizeof(double) * ny);
    for (int ni = 0; ni < n; ni++)
        for (int p = 0; p < d.p; p++)
            for (int q = 0; q < d.q; q++)
                for (int j = 0; j < c; j++) {
                    double m = -INFINITY;
                    for (int i = 0; i < k; i++)
                        for (int s = 0; s < k; s++) {
                            int hh = p * stride - pad + i, ww = q * stride - pad + s;
                            if (hh >= 0 && hh < h && ww >= 0 && ww < w)
                                m = fmax(m, x[((ni * h + hh) * w + ww) * c + j]);
                        }
                    ry[((ni * d.p + p) * d.q + q) * c + j] = m;
                }
    CHECK_OK(rn_maxpool_fwd(be, &d, x, y));
    char name[64];
    snprintf(name, sizeof name, "maxpool %dx%dx%d %dx%d/s%d/p%d", h, w, c, k, k, stride, pad);
    CHECK_CLOSE(name, y, ry, ny, 0);
    CHECK_OK(rn_maxpool_bwd(be, &d, x, y, dy, dx));
    pool_ctx pc = {be, &d, x, y, dy};
    gc_check(name, pool_obj, &pc, x, nx, dx, gc_defaults());
    /* ties route to the first maximum in row-major order (torch) */
    float tx[4] = {1, 1, 1, 1}, ty[1], tdy[1] = {5}, tdx[4];
    rn_pool_desc t;
    CHECK_OK(rn_pool_desc_init(&t, 1, 2, 2, 1, 2, 2, 0));
    CHECK_OK(rn_maxpool_fwd(be, &t, tx, ty));
    CHECK_OK(rn_maxpool_bwd(be, &t, tx, ty, tdy, tdx));
    CHECK(tdx[0] == 5 && tdx[1] == 0 && tdx[2] == 0 && tdx[3] == 0, "tie: %g %g %g %g", tdx[0],
          tdx[1], tdx[2], tdx[3]);
    free(x), free(y), free(dx), free(dy), free(ry);
}

typedef struct {
    rn_backend *be;
    int n, hw, c;
    float *x, *y, *r;
} gap_ctx;

static double gap_obj(void *p) {
    gap_ctx *g = p;
    if (rn_avgpool_global_fwd(g->be, RN_F32, g->n, g->hw, g->c, g->x, g->y) != RN_OK) return NAN;
    return gc_dot(g->r, g->y, (int64_t)g->n * g->c);
}

static void test_pool(rn_backend *be) {
    test_maxpool_case(be, 2, 7, 5, 3, 3, 2, 1);    /* ResNet's stem pool, odd sizes */
    test_maxpool_case(be, 2, 5, 7, 5, 3, 2, 1);
    test_maxpool_case(be, 2, 6, 6, 3, 2, 2, 0);
    test_maxpool_case(be, 1, 9, 9, 70, 3, 2, 1);   /* more than one 64-channel block */

    gap_ctx g = {be, 2, 35, 5, NULL, NULL, NULL};
    /* dy of size 35 makes dx = dy/35 of order 1, where the tolerance is relative */
    g.x = randn(3201, 2 * 35 * 5, 0, 1), g.y = zeros(10), g.r = randn(3202, 10, 0, 35);
    float *dx = zeros(2 * 35 * 5);
    double ry[10];
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < 5; j++) {
            double s = 0;
            for (int i = 0; i < 35; i++) s += g.x[(n * 35 + i) * 5 + j];
            ry[n * 5 + j] = s / 35;
        }
    CHECK_OK(rn_avgpool_global_fwd(be, RN_F32, 2, 35, 5, g.x, g.y));
    CHECK_CLOSE("global avgpool", g.y, ry, 10, 1e-6);
    CHECK_OK(rn_avgpool_global_bwd(be, RN_F32, 2, 35, 5, g.r, dx));
    gc_check("global avgpool dx", gap_obj, &g, g.x, 2 * 35 * 5, dx, gc_defaults());
    free(g.x), free(g.y), free(g.r), free(dx);
}

/* ---- fully connected ---- */

typedef struct {
    rn_backend *be;
    const rn_fc_desc *d;
    float *x, *w, *b, *y, *r;
} fc_ctx;

static double fc_obj(void *p) {
    fc_ctx *f = p;
    if (rn_fc_fwd(f->be, f->d, f->x, f->w, f->b, f->y) != RN_OK) return NAN;
    return gc_dot(f->r, f->y, (int64_t)f->d->n * f->d->out);
}

static void test_fc(rn_backend *be) {
    rn_fc_desc d = {RN_F32, 3, 7, 5};
    int nx = 21, nw = 35, ny = 15;
    float *x = randn(4001, nx, 0, 1), *w = randn(4002, nw, 0, 0.4f), *b = randn(4003, 5, 0, 1);
    float *y = zeros(ny), *r = randn(4004, ny, 0, 1), *dx = zeros(nx), *dw = zeros(nw), *db = zeros(5);
    double ry[15];
    for (int i = 0; i < 3; i++)
        for (int o = 0; o < 5; o++) {
            double s = b[o];
            for (int k = 0; k < 7; k++) s += (double)x[i * 7 + k] * w[o * 7 + k];
            ry[i * 5 + o] = s;
        }
    CHECK_OK(rn_fc_fwd(be, &d, x, w, b, y));
    CHECK_CLOSE("fc fwd", y, ry, ny, 1e-6);
    CHECK_OK(rn_fc_bwd(be, &d, x, w, r, dx, dw, db, 0));
    fc_ctx f = {be, &d, x, w, b, y, r};
    gc_check("fc dx", fc_obj, &f, x, nx, dx, gc_defaults());
    gc_check("fc dw", fc_obj, &f, w, nw, dw, gc_defaults());
    gc_check("fc db", fc_obj, &f, b, 5, db, gc_defaults());
    double r2[35];
    for (int i = 0; i < nw; i++) r2[i] = 2.0 * dw[i];
    CHECK_OK(rn_fc_bwd(be, &d, x, w, r, NULL, dw, db, 1));
    CHECK_CLOSE("fc dw accumulate", dw, r2, nw, 1e-6);
    CHECK_OK(rn_fc_fwd(be, &d, x, w, NULL, y));
    for (int i = 0; i < 3; i++)
        for (int o = 0; o < 5; o++) ry[i * 5 + o] -= b[o];
    CHECK_CLOSE("fc fwd without bias", y, ry, ny, 1e-5);
    free(x), free(w), free(b), free(y), free(r), free(dx), free(dw), free(db);
}

/* A larger fc, so that rn's own kernel's panels, column edges and the batch's packing are
 * all reached (33 images: two panels and one column; 70 outputs; 100 inputs), against
 * double loops; then the same on a context whose GEMMs go through OpenBLAS. */
static void test_fc_big_on(rn_backend *be, const char *what) {
    const int N = 33, IN = 100, OUT = 70;
    rn_fc_desc d = {RN_F32, N, IN, OUT};
    reserve(be, rn_fc_workspace(be, &d));
    float *x = randn(4101, N * IN, 0, 1), *w = randn(4102, OUT * IN, 0, 0.1f), *b = randn(4103, OUT, 0, 1);
    float *dy = randn(4104, N * OUT, 0, 1), *y = zeros(N * OUT), *dx = zeros(N * IN), *dw = zeros(OUT * IN),
          *db = zeros(OUT);
    double *ry = malloc(sizeof(double) * N * OUT), *rdx = malloc(sizeof(double) * N * IN),
           *rdw = malloc(sizeof(double) * OUT * IN), *rdb = malloc(sizeof(double) * OUT);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OUT; o++) {
            double s = b[o];
            for (int k = 0; k < IN; k++) s += (double)x[i * IN + k] * w[o * IN + k];
            ry[i * OUT + o] = s;
        }
    for (int i = 0; i < N; i++)
        for (int k = 0; k < IN; k++) {
            double s = 0;
            for (int o = 0; o < OUT; o++) s += (double)dy[i * OUT + o] * w[o * IN + k];
            rdx[i * IN + k] = s;
        }
    for (int o = 0; o < OUT; o++) {
        double sb = 0;
        for (int i = 0; i < N; i++) sb += dy[i * OUT + o];
        rdb[o] = sb;
        for (int k = 0; k < IN; k++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += (double)dy[i * OUT + o] * x[i * IN + k];
            rdw[o * IN + k] = s;
        }
    }
    char name[96];
    snprintf(name, sizeof name, "fc 33x100->70 (%s) fwd", what);
    CHECK_OK(rn_fc_fwd(be, &d, x, w, b, y));
    CHECK_CLOSE(name, y, ry, N * OUT, 1e-5);
    CHECK_OK(rn_fc_bwd(be, &d, x, w, dy, dx, dw, db, 0));
    snprintf(name, sizeof name, "fc 33x100->70 (%s) dx", what);
    CHECK_CLOSE(name, dx, rdx, N * IN, 1e-5);
    snprintf(name, sizeof name, "fc 33x100->70 (%s) dw", what);
    CHECK_CLOSE(name, dw, rdw, OUT * IN, 1e-5);
    snprintf(name, sizeof name, "fc 33x100->70 (%s) db", what);
    CHECK_CLOSE(name, db, rdb, OUT, 1e-5);
    CHECK_OK(rn_fc_bwd(be, &d, x, w, dy, NULL, dw, db, 1));
    for (int i = 0; i < OUT * IN; i++) rdw[i] *= 2;
    snprintf(name, sizeof name, "fc 33x100->70 (%s) dw accumulate", what);
    CHECK_CLOSE(name, dw, rdw, OUT * IN, 1e-5);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
    free(ry), free(rdx), free(rdw), free(rdb);
}

/* rn's own GEMM kernel sums every element in one order, so its forms (AVX-512, AVX2, the
 * portable C one) give the same bits (backend_cpu_fused.c): the training convs (both
 * backwards, with and without accumulation), the inference conv with bias, residual and
 * ReLU, and the fc, on shapes with row and column edges, each form against the widest.
 * Where the CPU runs one form only there is nothing to compare; it says so. */
static void test_own_isa(void) {
    int widest = rn_cpu_gemm_isa();
    rn_backend_opts o;
    rn_backend_opts_init(&o);
    enum { F = 3 };
    rn_backend *ctx[F] = {NULL};
    const char *form[F] = {widest == RN_GEMM_AVX512 ? "AVX-512" : widest == RN_GEMM_AVX2 ? "AVX2" : "portable C"};
    int nf = 1;
    if (widest == RN_GEMM_NONE || widest == RN_GEMM_PORTABLE) {
        fprintf(stderr, "test_ops: rn's kernel runs in %s form only on this CPU: no second form to compare\n",
                widest == RN_GEMM_NONE ? "no" : "its portable");
        return;
    }
    CHECK_OK(rn_backend_create("cpu", 2, &o, &ctx[0]));
    if (widest == RN_GEMM_AVX512) {
        o.cpu_gemm = RN_CPU_GEMM_AVX2; /* RN_CPU_GEMM=avx2 */
        CHECK_OK(rn_backend_create("cpu", 3, &o, &ctx[nf]));
        form[nf++] = "AVX2";
    }
    o.cpu_gemm = RN_CPU_GEMM_PORTABLE; /* RN_CPU_GEMM=portable */
    CHECK_OK(rn_backend_create("cpu", 1, &o, &ctx[nf]));
    form[nf++] = "portable C";
    for (int c = 0; c < nf; c++) {
        if (!ctx[c]) goto done;
        CHECK(strstr(rn_backend_name(ctx[c]), form[c]) != NULL, "form %d: %s, want %s", c, rn_backend_name(ctx[c]),
              form[c]);
    }
    static const int shapes[][8] = {
        /* n, h, w, c, k, kernel, stride, pad */
        {2, 9, 11, 5, 37, 3, 1, 1}, {3, 8, 8, 64, 64, 1, 1, 0}, {2, 12, 12, 48, 70, 3, 2, 1},
        {1, 30, 30, 3, 20, 7, 2, 3}, {4, 5, 5, 130, 33, 1, 2, 0}, {2, 14, 14, 64, 64, 3, 1, 1},
    };
    static const char *const what[4] = {"fwd", "bwd_data", "bwd_filter", "fwd with bias, residual, ReLU"};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const int *v = shapes[i];
        rn_conv_desc d;
        CHECK_OK(rn_conv_desc_init(&d, v[0], v[1], v[2], v[3], v[4], v[5], v[5], v[6], v[7]));
        int64_t nx = (int64_t)v[0] * v[1] * v[2] * v[3], nw = (int64_t)v[4] * v[5] * v[5] * v[3],
                ny = (int64_t)v[0] * d.p * d.q * v[4];
        float *x = randn(4200 + i, nx, 0, 1), *w = randn(4300 + i, nw, 0, 0.2f), *dy = randn(4400 + i, ny, 0, 1),
              *bias = randn(4900 + i, v[4], 0, 1);
        float *out[F][4];
        const int64_t len[4] = {ny, nx, nw, ny};
        for (int c = 0; c < nf; c++) {
            reserve(ctx[c], rn_conv_workspace(ctx[c], &d));
            out[c][0] = zeros(ny), out[c][1] = zeros(nx), out[c][2] = zeros(nw), out[c][3] = zeros(ny);
            CHECK_OK(rn_conv_fwd(ctx[c], &d, x, w, out[c][0]));
            CHECK_OK(rn_conv_bwd_data(ctx[c], &d, dy, w, out[c][1], 0));
            CHECK_OK(rn_conv_bwd_data(ctx[c], &d, dy, w, out[c][1], 1));
            CHECK_OK(rn_conv_bwd_filter(ctx[c], &d, x, dy, out[c][2], 0));
            CHECK_OK(rn_conv_bwd_filter(ctx[c], &d, x, dy, out[c][2], 1));
            CHECK_OK(rn_conv_bias_fwd(ctx[c], &d, x, w, bias, dy, 1, out[c][3]));
        }
        for (int c = 1; c < nf; c++)
            for (int t = 0; t < 4; t++)
                CHECK(memcmp(out[0][t], out[c][t], sizeof(float) * len[t]) == 0, "conv shape %zu: %s bits differ, %s vs %s",
                      i, what[t], form[0], form[c]);
        for (int c = 0; c < nf; c++)
            for (int t = 0; t < 4; t++) free(out[c][t]);
        free(x), free(w), free(dy), free(bias);
    }
    static const int fcs[][3] = {{33, 100, 70}, {5, 2048, 10}, {64, 512, 1000}};
    for (size_t i = 0; i < sizeof fcs / sizeof *fcs; i++) {
        rn_fc_desc d = {RN_F32, fcs[i][0], fcs[i][1], fcs[i][2]};
        int64_t nx = (int64_t)d.n * d.in, nw = (int64_t)d.out * d.in, ny = (int64_t)d.n * d.out;
        float *x = randn(4500 + i, nx, 0, 1), *w = randn(4600 + i, nw, 0, 0.1f), *b = randn(4700 + i, d.out, 0, 1),
              *dy = randn(4800 + i, ny, 0, 1);
        float *out[F][4];
        for (int c = 0; c < nf; c++) {
            reserve(ctx[c], rn_fc_workspace(ctx[c], &d));
            out[c][0] = zeros(ny), out[c][1] = zeros(nx), out[c][2] = zeros(nw), out[c][3] = zeros(d.out);
            CHECK_OK(rn_fc_fwd(ctx[c], &d, x, w, b, out[c][0]));
            CHECK_OK(rn_fc_bwd(ctx[c], &d, x, w, dy, out[c][1], out[c][2], out[c][3], 0));
            CHECK_OK(rn_fc_bwd(ctx[c], &d, x, w, dy, NULL, out[c][2], out[c][3], 1));
        }
        for (int c = 1; c < nf; c++) {
            CHECK(memcmp(out[0][0], out[c][0], sizeof(float) * ny) == 0, "fc %zu: fwd bits differ, %s vs %s", i, form[0],
                  form[c]);
            CHECK(memcmp(out[0][1], out[c][1], sizeof(float) * nx) == 0, "fc %zu: dx bits differ, %s vs %s", i, form[0],
                  form[c]);
            CHECK(memcmp(out[0][2], out[c][2], sizeof(float) * nw) == 0, "fc %zu: dw bits differ, %s vs %s", i, form[0],
                  form[c]);
            CHECK(memcmp(out[0][3], out[c][3], sizeof(float) * d.out) == 0, "fc %zu: db bits differ, %s vs %s", i,
                  form[0], form[c]);
        }
        for (int c = 0; c < nf; c++) free(out[c][0]), free(out[c][1]), free(out[c][2]), free(out[c][3]);
        free(x), free(w), free(b), free(dy);
    }
done:
    for (int c = 0; c < F; c++) rn_backend_destroy(ctx[c]);
}

/* ---- softmax cross-entropy ---- */

typedef struct {
    rn_backend *be;
    const rn_xent_desc *d;
    float *z;
    const int32_t *labels;
} xent_ctx;

/* The loss times the descriptor's grad_scale, so that the test can scale gradients of
 * size 1/n up to O(1), where the checker's relative tolerance bites. */
static double xent_obj(void *p) {
    xent_ctx *c = p;
    float loss;
    if (rn_softmax_xent(c->be, c->d, c->z, c->labels, &loss, NULL) != RN_OK) return NAN;
    return (double)loss * c->d->grad_scale;
}

static void test_xent(rn_backend *be) {
    const int n = 3, k = 7;
    int32_t labels[3] = {4, 0, 6};
    float *z = randn(5001, n * k, 0, 3), *dz = zeros(n * k), *dz2 = zeros(n * k);
    for (int ls = 0; ls < 2; ls++) {
        rn_xent_desc d;
        CHECK_OK(rn_xent_desc_init(&d, n, k));
        d.label_smoothing = ls ? 0.1f : 0.0f;
        float loss = 0;
        CHECK_OK(rn_softmax_xent(be, &d, z, labels, &loss, dz));
        /* torch's formula: (1-e)*nll + e*mean_k(-log p_k), mean over the batch */
        double want = 0;
        for (int i = 0; i < n; i++) {
            double mx = -INFINITY, se = 0;
            for (int j = 0; j < k; j++) mx = fmax(mx, z[i * k + j]);
            for (int j = 0; j < k; j++) se += exp(z[i * k + j] - mx);
            double smooth = 0;
            for (int j = 0; j < k; j++) smooth += -(z[i * k + j] - mx - log(se));
            double nll = -(z[i * k + labels[i]] - mx - log(se));
            want += (1 - d.label_smoothing) * nll + d.label_smoothing * smooth / k;
        }
        want /= n;
        CHECK(fabs(loss - want) <= 1e-6 * fmax(1, fabs(want)), "xent loss ls=%g: %.8g want %.8g",
              d.label_smoothing, loss, want);
        /* dlogits against (softmax - (1-e)*onehot - e/k) / n, directly */
        double rd[21];
        for (int i = 0; i < n; i++) {
            double mx = -INFINITY, se = 0;
            for (int j = 0; j < k; j++) mx = fmax(mx, z[i * k + j]);
            for (int j = 0; j < k; j++) se += exp(z[i * k + j] - mx);
            for (int j = 0; j < k; j++)
                rd[i * k + j] = (exp(z[i * k + j] - mx) / se -
                                 (j == labels[i]) * (1 - d.label_smoothing) - d.label_smoothing / k) / n;
        }
        CHECK_CLOSE(ls ? "xent dlogits formula (smoothing)" : "xent dlogits formula", dz, rd, n * k, 1e-6);
        xent_ctx c = {be, &d, z, labels};
        d.grad_scale = 30.0f;
        float *dzs = zeros(n * k);
        CHECK_OK(rn_softmax_xent(be, &d, z, labels, &loss, dzs));
        /* the loss is a float: a wider step keeps its rounding out of the quotient */
        gc_opts o = gc_defaults();
        o.h = 1e-2;
        gc_check(ls ? "xent dlogits (label smoothing 0.1)" : "xent dlogits", xent_obj, &c, z, n * k,
                 dzs, o);
        free(dzs);
        /* grad_scale multiplies dlogits only; dlogits may overwrite the logits */
        d.grad_scale = 0.25f;
        float loss2 = 0;
        memcpy(dz2, z, sizeof(float) * n * k);
        CHECK_OK(rn_softmax_xent(be, &d, dz2, labels, &loss2, dz2));
        double rs[21];
        for (int i = 0; i < n * k; i++) rs[i] = 0.25 * dz[i];
        CHECK_CLOSE("xent grad_scale, in place", dz2, rs, n * k, 1e-6);
        CHECK(loss2 == loss, "grad_scale must not change the loss (%g vs %g)", loss2, loss);
    }
    rn_xent_desc d;
    CHECK_OK(rn_xent_desc_init(&d, n, k));
    int32_t bad[3] = {1, 7, 2};
    float loss;
    CHECK(rn_softmax_xent(be, &d, z, bad, &loss, dz) == RN_EINVAL, "label 7 of 7 classes");
    CHECK(strstr(rn_last_error(), "row 1") != NULL, "message names the row: %s", rn_last_error());
    free(z), free(dz), free(dz2);
}

/* ---- SGD against torch.optim.SGD (1.13), values printed by:
 *   p = Parameter([1, -2, .5, 0]); opt = SGD([p], **cfg)
 *   for g in grads: p.grad = tensor(g); opt.step(); print(p) */
/* The soft targets of mixup/cutmix: row i's label weighted 1-m, row i-1's m (row 0 takes
 * the last row's: torch's roll), smoothed as torch smooths probability targets. Loss and
 * dlogits against the formula with explicit targets, dlogits against finite differences,
 * and m = 0 bit for bit the hard-label op. */
static void test_xent_mix(rn_backend *be) {
    const int n = 4, k = 9;
    int32_t labels[4] = {2, 7, 7, 0};
    float *z = randn(5002, n * k, 0, 2), *dz = zeros(n * k), *dh = zeros(n * k), *dm0 = zeros(n * k);
    const double ms[2] = {0.3, 0.8};
    const float es[2] = {0.0f, 0.1f};
    for (int c = 0; c < 4; c++) {
        double m = ms[c & 1];
        float e = es[c >> 1];
        rn_xent_desc d;
        CHECK_OK(rn_xent_desc_init(&d, n, k));
        d.label_smoothing = e;
        d.mix_weight = m;
        float loss = 0;
        CHECK_OK(rn_softmax_xent(be, &d, z, labels, &loss, dz));
        double want = 0, rd[36];
        for (int i = 0; i < n; i++) {
            double mx = -INFINITY, se = 0, t[9] = {0};
            t[labels[i]] += 1 - m;
            t[labels[(i + n - 1) % n]] += m;
            for (int j = 0; j < k; j++) mx = fmax(mx, z[i * k + j]);
            for (int j = 0; j < k; j++) se += exp(z[i * k + j] - mx);
            for (int j = 0; j < k; j++) {
                double tj = (1 - e) * t[j] + e / k, lp = z[i * k + j] - mx - log(se);
                want -= tj * lp;
                rd[i * k + j] = (exp(lp) - tj) / n;
            }
        }
        want /= n;
        CHECK(fabs(loss - want) <= 1e-6 * fmax(1, fabs(want)), "mixed xent loss m=%g e=%g: %.8g want %.8g", m, e,
              loss, want);
        char what[96];
        snprintf(what, sizeof what, "mixed xent dlogits formula m=%g e=%g", m, e);
        CHECK_CLOSE(what, dz, rd, n * k, 1e-6);
        d.grad_scale = 30.0f;
        CHECK_OK(rn_softmax_xent(be, &d, z, labels, &loss, dz));
        xent_ctx cx = {be, &d, z, labels};
        gc_opts o = gc_defaults();
        o.h = 1e-2;
        snprintf(what, sizeof what, "mixed xent dlogits m=%g e=%g", m, e);
        gc_check(what, xent_obj, &cx, z, n * k, dz, o);
        /* m = 0: the hard-label op's bits */
        float lh = 0, l0 = 0;
        d.grad_scale = 1;
        d.mix_weight = 0;
        CHECK_OK(rn_softmax_xent(be, &d, z, labels, &l0, dm0));
        rn_xent_desc h;
        CHECK_OK(rn_xent_desc_init(&h, n, k));
        h.label_smoothing = e;
        CHECK_OK(rn_softmax_xent(be, &h, z, labels, &lh, dh));
        CHECK(memcmp(&l0, &lh, sizeof l0) == 0 && memcmp(dm0, dh, sizeof(float) * n * k) == 0,
              "mix_weight 0 differs from the hard-label op (e=%g)", e);
        /* the weight read from memory (mix_weight_at; the scalar then ignored): the same bits,
           m and 0 */
        const double at[2] = {m, 0};
        for (int a = 0; a < 2; a++) {
            float ls = 0, la = 0;
            d.mix_weight = at[a];
            d.mix_weight_at = NULL;
            CHECK_OK(rn_softmax_xent(be, &d, z, labels, &ls, dh));
            d.mix_weight = a ? m : 0;
            d.mix_weight_at = &at[a];
            CHECK_OK(rn_softmax_xent(be, &d, z, labels, &la, dm0));
            CHECK(memcmp(&ls, &la, sizeof ls) == 0 && memcmp(dm0, dh, sizeof(float) * n * k) == 0,
                  "mix_weight_at %g differs from mix_weight %g (e=%g)", at[a], at[a], e);
        }
    }
    rn_xent_desc d;
    CHECK_OK(rn_xent_desc_init(&d, n, k));
    float loss;
    d.mix_weight = 1.5;
    CHECK(rn_softmax_xent(be, &d, z, labels, &loss, NULL) == RN_EINVAL, "mix_weight 1.5 accepted");
    const double big = 1.5;
    d.mix_weight = 0;
    d.mix_weight_at = &big;
    CHECK(rn_softmax_xent(be, &d, z, labels, &loss, NULL) == RN_EINVAL, "mix_weight_at 1.5 accepted on the host");
    free(z), free(dz), free(dh), free(dm0);
}

/* the train top-1: the first maximum (ties, -0 against 0), a NaN that never wins, NaN in
 * column 0 (class 0), all NaN, one class, the three targets, a label out of range */
static void test_top1(rn_backend *be) {
    const int n = 6, k = 5;
    const float nan = NAN;
    float z[6 * 5] = {
        1, 3, 3, 0, 2,          /* first of two maxima: 1 */
        -0.0f, 0.0f, -1, -2, -3, /* -0 == 0: the first, 0 */
        0, nan, 4, 4, nan,      /* NaN never largest: 2 */
        nan, 9, 9, 9, 9,        /* NaN in column 0: 0 */
        nan, nan, nan, nan, nan, /* all NaN: 0 */
        -INFINITY, -INFINITY, -5, INFINITY, 1, /* 3 */
    };
    int32_t lab[6] = {1, 0, 2, 0, 0, 3}, hits = -1;
    CHECK_OK(rn_top1_count(be, n, k, z, lab, RN_TOP1_LABEL, &hits));
    CHECK(hits == 6, "top1_count on labels: %d of 6", hits);
    /* rolled: row i against row i-1's label (row 0 against the last): 3,1,0,2,0,0 */
    int32_t roll[6] = {0, 1, 3, 2, 0, 0};
    CHECK_OK(rn_top1_count(be, n, k, z, roll, RN_TOP1_ROLLED, &hits));
    int want = 0;
    const int pred[6] = {1, 0, 2, 0, 0, 3};
    for (int i = 0; i < n; i++) want += pred[i] == roll[(i + n - 1) % n];
    CHECK(hits == want, "top1_count on the rolled labels: %d, want %d", hits, want);
    /* smaller of the two: row 1 (0 vs 1 -> 0 hits), row 2 (1 vs 0: 0, predicted 2: miss) */
    int32_t sm[6] = {1, 2, 1, 4, 0, 3};
    want = 0;
    for (int i = 0; i < n; i++) {
        int a = sm[i], p = sm[(i + n - 1) % n];
        want += pred[i] == (a < p ? a : p);
    }
    CHECK_OK(rn_top1_count(be, n, k, z, sm, RN_TOP1_SMALLER, &hits));
    CHECK(hits == want, "top1_count on the smaller label: %d, want %d", hits, want);
    int32_t bad[6] = {1, 0, 2, 0, 0, 99};
    CHECK_OK(rn_top1_count(be, n, k, z, bad, RN_TOP1_LABEL, &hits));
    CHECK(hits == 5, "top1_count with a label out of range: %d of 6, want 5", hits);
    int32_t zero = 0;
    CHECK_OK(rn_top1_count(be, 1, 1, z, &zero, RN_TOP1_LABEL, &hits));
    CHECK(hits == 1, "top1_count with one class: %d", hits);
    CHECK(rn_top1_count(be, n, k, z, lab, 3, &hits) == RN_EINVAL, "top1_count target 3 accepted");
    /* the target read from memory: the same counts */
    const int32_t *labs[3] = {lab, roll, sm};
    for (int32_t t = RN_TOP1_LABEL; t <= RN_TOP1_SMALLER; t++) {
        int32_t h1 = -1, h2 = -2;
        CHECK_OK(rn_top1_count(be, n, k, z, labs[t], t, &h1));
        CHECK_OK(rn_top1_count_at(be, n, k, z, labs[t], &t, &h2));
        CHECK(h1 == h2, "top1_count_at target %d: %d, top1_count %d", t, h2, h1);
    }
    CHECK(rn_top1_count_at(be, n, k, z, lab, NULL, &hits) == RN_EINVAL, "top1_count_at without a target accepted");
    int32_t t3 = 3;
    CHECK(rn_top1_count_at(be, n, k, z, lab, &t3, &hits) == RN_EINVAL, "top1_count_at target 3 accepted");
    CHECK(rn_top1_count(be, 0, k, z, lab, RN_TOP1_LABEL, &hits) == RN_EINVAL, "top1_count of 0 rows accepted");
}

static void test_sgd(rn_backend *be) {
    static const float grads[3][4] = {{0.3f, -0.1f, 0.25f, 1.0f},
                                      {-0.2f, 0.4f, 0.05f, -0.5f},
                                      {0.1f, 0.1f, -0.3f, 0.25f}};
    static const struct {
        const char *name;
        float lr, momentum, dampening, wd;
        int nesterov;
        float want[3][4];
    } cases[] = {
        {"momentum 0.9 wd 1e-4", 0.1f, 0.9f, 0, 1e-4f, 0,
         {{0.969990015f, -1.98997998f, 0.474994987f, -0.100000001f},
          {0.96297133f, -2.02094197f, 0.447485745f, -0.139999002f},
          {0.946644843f, -2.05878758f, 0.452722937f, -0.200996697f}}},
        {"nesterov", 0.1f, 0.9f, 0, 1e-4f, 1,
         {{0.942981005f, -1.98096204f, 0.452490509f, -0.189999998f},
          {0.956654966f, -2.0488081f, 0.422727853f, -0.175996378f},
          {0.93195188f, -2.09284854f, 0.457437515f, -0.255891502f}}},
        {"dampening 0.1 wd 0.01", 0.05f, 0.9f, 0.1f, 0.01f, 0,
         {{0.984499991f, -1.99399996f, 0.48725f, -0.0500000007f},
          {0.979106963f, -2.00570273f, 0.473305732f, -0.0724774972f},
          {0.969312668f, -2.01983261f, 0.474042922f, -0.103924632f}}},
        {"no momentum", 0.1f, 0, 0, 0.01f, 0,
         {{0.968999982f, -1.98800004f, 0.4745f, -0.100000001f},
          {0.98803097f, -2.02601194f, 0.469025493f, -0.0499000028f},
          {0.977042913f, -2.03398585f, 0.498556465f, -0.0748501047f}}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float p[4] = {1.0f, -2.0f, 0.5f, 0.0f}, buf[4] = {9, 9, 9, 9};
        rn_sgd_desc d;
        CHECK_OK(rn_sgd_desc_init(&d, cases[c].lr, cases[c].momentum, cases[c].wd,
                                  cases[c].nesterov));
        d.dampening = cases[c].dampening;
        for (int step = 0; step < 3; step++) {
            CHECK_OK(rn_sgd_update(be, &d, 4, p, grads[step], cases[c].momentum ? buf : NULL));
            d.first_step = 0;
            double want[4];
            for (int i = 0; i < 4; i++) want[i] = cases[c].want[step][i];
            char name[64];
            snprintf(name, sizeof name, "sgd %s step %d", cases[c].name, step + 1);
            CHECK_CLOSE(name, p, want, 4, 2e-7);
        }
    }
    /* grad_scale unscales before anything else: grad*4 with scale 1/4 is the same step */
    float p1[2] = {1, 2}, p2[2] = {1, 2}, b1[2], b2[2], g1[2] = {0.5f, -1}, g2[2] = {2, -4};
    rn_sgd_desc d;
    CHECK_OK(rn_sgd_desc_init(&d, 0.1f, 0.9f, 1e-4f, 0));
    CHECK_OK(rn_sgd_update(be, &d, 2, p1, g1, b1));
    d.grad_scale = 0.25f;
    CHECK_OK(rn_sgd_update(be, &d, 2, p2, g2, b2));
    CHECK(p1[0] == p2[0] && p1[1] == p2[1] && b1[0] == b2[0], "grad_scale: %g %g vs %g %g",
          p1[0], p1[1], p2[0], p2[1]);
    d.grad_scale = 0;
    CHECK(rn_sgd_update(be, &d, 2, p2, g2, b2) == RN_EINVAL, "grad_scale 0 must be refused");
}

/* The weights' moving average against torchvision's ExponentialMovingAverage in torch 1.13
 * (decay * avg + (1 - decay) * x in float32, decay 0.9998; the values printed by torch for
 * three updates, x halved plus 0.1 after each), and the same bits for 1 and 3 threads over
 * many chunks. */
static void test_ema(rn_backend *be) {
    static const double want[3][5] = {{0.999940038, -1.99998009, 0.499950022, 0.300140023, -1.99885108e-07},
                                      {0.999830067, -1.99975014, 0.499895036, 0.300200015, -0.000480199873},
                                      {0.999695182, -1.99941516, 0.499837577, 0.300219983, -0.000700103876}};
    const double decay = 0.9998;
    const float keep = (float)decay, take = (float)(1.0 - decay);
    float avg[5] = {1.0f, -2.0f, 0.5f, 0.3f, 1e-3f}, x[5] = {0.7f, -1.9f, 0.25f, 1.0f, -5.0f};
    for (int step = 0; step < 3; step++) {
        CHECK_OK(rn_ema_update(be, 5, x, avg, keep, take));
        for (int i = 0; i < 5; i++) x[i] = x[i] * 0.5f + 0.1f;
        char name[32];
        snprintf(name, sizeof name, "ema update %d", step + 1);
        CHECK_CLOSE(name, avg, want[step], 5, 1e-7);
    }
    const int64_t n = 3 * 16384 + 77;
    float *a1 = malloc(sizeof(float) * n), *a3 = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
        a1[i] = a3[i] = (float)sin((double)i);
        w[i] = (float)cos(0.7 * (double)i);
    }
    rn_backend *b1 = NULL, *b3 = NULL;
    CHECK_OK(rn_backend_create("cpu", 1, NULL, &b1));
    CHECK_OK(rn_backend_create("cpu", 3, NULL, &b3));
    CHECK_OK(rn_ema_update(b1, n, w, a1, 0.75f, 0.25f));
    CHECK_OK(rn_ema_update(b3, n, w, a3, 0.75f, 0.25f));
    int64_t diff = 0, off = 0;
    for (int64_t i = 0; i < n; i++) {
        diff += memcmp(&a1[i], &a3[i], sizeof(float)) != 0;
        off += a1[i] != (float)(0.75f * (float)sin((double)i) + 0.25f * w[i]);
    }
    CHECK(diff == 0, "ema update: %lld of %lld values differ between 1 and 3 threads", (long long)diff, (long long)n);
    CHECK(off == 0, "ema update: %lld of %lld values are not 0.75 avg + 0.25 x", (long long)off, (long long)n);
    CHECK(rn_ema_update(be, 2, w, a1, NAN, 0.5f) == RN_EINVAL, "a NaN keep must be refused");
    CHECK(rn_ema_update(be, -1, w, a1, 0.5f, 0.5f) == RN_EINVAL, "a negative count must be refused");
    rn_backend_destroy(b1);
    rn_backend_destroy(b3);
    free(a1), free(a3), free(w);
}

/* The fused step of mixed precision: the same p and buf as rn_sgd_update, bit for bit,
 * and the compute copy is p rounded to the copy's type. Gradients scaled by 2^16 and
 * unscaled by grad_scale 2^-16 give the step of the unscaled gradients exactly. */
static void test_sgd_copy(rn_backend *be) {
    const int64_t n = 100003; /* several parallel pieces */
    float *p0 = randn(60, n, 0, 1), *g = randn(61, n, 0, 1e-3f), *b0 = randn(62, n, 0, 1e-3f);
    float *gs = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) gs[i] = g[i] * 65536.0f;
    const int dtypes[] = {RN_F32, RN_F16, RN_BF16};
    for (int t = 0; t < 3; t++) {
        float *p1 = malloc(sizeof(float) * n), *b1 = malloc(sizeof(float) * n);
        float *p2 = malloc(sizeof(float) * n), *b2 = malloc(sizeof(float) * n);
        void *copy = malloc(rn_dtype_size(dtypes[t]) * n);
        memcpy(p1, p0, sizeof(float) * n), memcpy(p2, p0, sizeof(float) * n);
        memcpy(b1, b0, sizeof(float) * n), memcpy(b2, b0, sizeof(float) * n);
        rn_sgd_desc d;
        CHECK_OK(rn_sgd_desc_init(&d, 0.1f, 0.9f, 1e-4f, 0));
        d.first_step = 0;
        CHECK_OK(rn_sgd_update(be, &d, n, p1, g, b1));
        d.grad_scale = 1.0f / 65536.0f;
        d.dtype = dtypes[t];
        CHECK_OK(rn_sgd_update_copy(be, &d, n, p2, gs, b2, copy));
        int64_t diff = 0, bad_copy = 0;
        for (int64_t i = 0; i < n; i++) {
            diff += p1[i] != p2[i] || b1[i] != b2[i];
            if (dtypes[t] == RN_F32) bad_copy += ((float *)copy)[i] != p2[i];
            else if (dtypes[t] == RN_F16) bad_copy += ((uint16_t *)copy)[i] != rn_f32_to_f16(p2[i]);
            else bad_copy += ((uint16_t *)copy)[i] != rn_f32_to_bf16(p2[i]);
        }
        CHECK(diff == 0, "sgd_update_copy %s: %lld of %lld p/buf values differ from rn_sgd_update",
              rn_dtype_name(dtypes[t]), (long long)diff, (long long)n);
        CHECK(bad_copy == 0, "sgd_update_copy %s: %lld copies are not p rounded", rn_dtype_name(dtypes[t]),
              (long long)bad_copy);
        free(p1), free(b1), free(p2), free(b2), free(copy);
    }
    rn_sgd_desc d;
    /* the rate read from lr_at when the op runs (the host's lr ignored): the same bits
       as the rate passed; skip_if set: nothing written; skip_if 0: the step */
    {
        float *p1 = malloc(sizeof(float) * n), *b1 = malloc(sizeof(float) * n);
        float *p2 = malloc(sizeof(float) * n), *b2 = malloc(sizeof(float) * n);
        uint16_t *c2 = malloc(sizeof(uint16_t) * n);
        memcpy(p1, p0, sizeof(float) * n), memcpy(p2, p0, sizeof(float) * n);
        memcpy(b1, b0, sizeof(float) * n), memcpy(b2, b0, sizeof(float) * n);
        for (int64_t i = 0; i < n; i++) c2[i] = 0x7e00;
        float lr = 0.037f;
        int32_t skip = 1;
        CHECK_OK(rn_sgd_desc_init(&d, lr, 0.9f, 1e-4f, 1));
        d.first_step = 0;
        CHECK_OK(rn_sgd_update(be, &d, n, p1, g, b1));
        d.lr = NAN; /* (not read) */
        d.lr_at = &lr;
        d.skip_if = &skip;
        d.dtype = RN_F16;
        CHECK_OK(rn_sgd_update_copy(be, &d, n, p2, g, b2, c2));
        int64_t moved = 0, diff = 0;
        for (int64_t i = 0; i < n; i++) moved += p2[i] != p0[i] || b2[i] != b0[i] || c2[i] != 0x7e00;
        CHECK(moved == 0, "sgd skip_if 1: %lld of %lld values written", (long long)moved, (long long)n);
        skip = 0;
        CHECK_OK(rn_sgd_update_copy(be, &d, n, p2, g, b2, c2));
        for (int64_t i = 0; i < n; i++) diff += p1[i] != p2[i] || b1[i] != b2[i] || c2[i] != rn_f32_to_f16(p2[i]);
        CHECK(diff == 0, "sgd lr_at: %lld of %lld values differ from the rate passed", (long long)diff, (long long)n);
        lr = INFINITY;
        CHECK(rn_sgd_update(be, &d, n, p2, g, b2) == RN_EINVAL, "an inf at lr_at refused");
        CHECK(strstr(rn_last_error(), "lr_at") != NULL, "message names lr_at: %s", rn_last_error());
        free(p1), free(b1), free(p2), free(b2), free(c2);
    }
    CHECK_OK(rn_sgd_desc_init(&d, 0.1f, 0.9f, 1e-4f, 0));
    CHECK(rn_sgd_update_copy(be, &d, n, p0, g, b0, NULL) == RN_EINVAL, "NULL copy refused");
    d.dtype = RN_U8;
    CHECK(rn_sgd_update_copy(be, &d, n, p0, g, b0, gs) == RN_EINVAL, "U8 copy refused");
    CHECK(strstr(rn_last_error(), "U8") != NULL, "message names the dtype: %s", rn_last_error());
    free(p0), free(g), free(b0), free(gs);
}

/* Conversions: round to nearest even at the edges of each type, written out as bits. */
static void test_cast(rn_backend *be) {
    const float in[] = {1.0f, -2.5f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 3e-8f, 1e-8f,
                        1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, INFINITY, -INFINITY, NAN,
                        1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, FLT_MAX};
    const uint16_t want16[] = {0x3c00, 0xc100, 0x8000, 0x7bff, 0x7bff, 0x7c00, 0x0001, 0x0000,
                               0x3c00, 0x3c02, 0x7c00, 0xfc00, 0x7e00, 0x3c04, 0x3c0c, 0x7c00};
    /* (bf16 NaN: any NaN; torch and CUDA pick different payloads) */
    const uint16_t wantbf[] = {0x3f80, 0xc020, 0x8000, 0x4780, 0x4780, 0x4780, 0x3301, 0x322c,
                               0x3f80, 0x3f80, 0x7f80, 0xff80, 0x7fc0, 0x3f80, 0x3f82, 0x7f80};
    enum { N = sizeof in / sizeof *in };
    uint16_t h[N], b[N];
    CHECK_OK(rn_cast(be, RN_F32, RN_F16, N, in, h, 0));
    CHECK_OK(rn_cast(be, RN_F32, RN_BF16, N, in, b, 0));
    for (int i = 0; i < N; i++) {
        CHECK(h[i] == want16[i], "f32 %.9g -> f16 0x%04x, want 0x%04x", in[i], h[i], want16[i]);
        CHECK(b[i] == wantbf[i] || (isnan(in[i]) && (b[i] & 0x7f80) == 0x7f80 && (b[i] & 0x7f)),
              "f32 %.9g -> bf16 0x%04x, want 0x%04x", in[i], b[i], wantbf[i]);
    }
    /* back to fp32: exact */
    float back[N];
    CHECK_OK(rn_cast(be, RN_F16, RN_F32, N, h, back, 0));
    CHECK(back[0] == 1.0f && back[1] == -2.5f && back[3] == 65504.0f && back[6] == 0x1p-24f &&
              isinf(back[5]) && isnan(back[12]) && signbit(back[2]),
          "f16 -> f32: %g %g %g %g", back[0], back[1], back[3], back[6]);
    CHECK_OK(rn_cast(be, RN_BF16, RN_F32, N, b, back, 0));
    CHECK(back[0] == 1.0f && back[1] == -2.5f && back[14] == 1.0f + 0x1p-6f && isnan(back[12]),
          "bf16 -> f32: %g %g %.9g", back[0], back[1], back[14]);
    /* accumulate: the sum in fp32, rounded once into the destination type */
    float acc[3] = {1.0f, 0.5f, -3.0f};
    uint16_t x16[3] = {0x3c00, 0x3800, 0x4000}; /* 1, 0.5, 2 */
    CHECK_OK(rn_cast(be, RN_F16, RN_F32, 3, x16, acc, 1));
    CHECK(acc[0] == 2.0f && acc[1] == 1.0f && acc[2] == -1.0f, "f16 into f32 accumulate: %g %g %g", acc[0],
          acc[1], acc[2]);
    uint16_t y16[2] = {0x3c00, 0x3c00};            /* 1, 1 */
    const float dx[2] = {0x1p-11f, 0x1p-11f + 0x1p-20f}; /* a tie, and just above one */
    CHECK_OK(rn_cast(be, RN_F32, RN_F16, 2, dx, y16, 1));
    CHECK(y16[0] == 0x3c00 && y16[1] == 0x3c01, "f32 into f16 accumulate rounds once: 0x%04x 0x%04x", y16[0],
          y16[1]);
    /* many elements, on the pool: f32 -> bf16 -> f32 is rn_f32_to_bf16's rounding */
    const int64_t n = 100003;
    float *x = randn(63, n, 0, 1), *z = malloc(sizeof(float) * n);
    uint16_t *mid = malloc(sizeof(uint16_t) * n);
    CHECK_OK(rn_cast(be, RN_F32, RN_BF16, n, x, mid, 0));
    CHECK_OK(rn_cast(be, RN_BF16, RN_F32, n, mid, z, 0));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += z[i] != rn_bf16_to_f32(rn_f32_to_bf16(x[i]));
    CHECK(bad == 0, "bulk bf16 round trip: %lld differ", (long long)bad);
    CHECK_OK(rn_cast(be, 0, RN_F32, n, x, z, 0)); /* 0 means fp32 */
    CHECK(memcmp(x, z, sizeof(float) * n) == 0, "f32 -> f32 copies");
    CHECK(rn_cast(be, RN_U8, RN_F32, n, x, z, 0) == RN_EINVAL, "U8 refused");
    CHECK(rn_cast(be, RN_F32, RN_F16, -1, x, z, 0) == RN_EINVAL, "negative count refused");
    CHECK(rn_cast(be, RN_F32, RN_F16, n, x, NULL, 0) == RN_EINVAL, "NULL y refused");
    free(x), free(z), free(mid);
}

/* The overflow check: any inf or NaN anywhere sets the flag; finite values, however
 * large, leave it; it never clears a flag already set. */
static void test_nonfinite(rn_backend *be) {
    const int64_t n = 100003;
    float *x = randn(64, n, 0, 1e30f);
    x[5] = FLT_MAX, x[6] = -FLT_MAX, x[7] = FLT_MIN / 4; /* finite, subnormal */
    int32_t flag = 0;
    CHECK_OK(rn_nonfinite(be, n, x, &flag));
    CHECK(flag == 0, "finite values set the flag");
    const int64_t at[] = {77777, 0, n - 1};
    const float bad[] = {INFINITY, NAN, -INFINITY};
    for (int k = 0; k < 3; k++) {
        float keep = x[at[k]];
        x[at[k]] = bad[k];
        flag = 0;
        CHECK_OK(rn_nonfinite(be, n, x, &flag));
        CHECK(flag == 1, "%g at %lld not found", bad[k], (long long)at[k]);
        x[at[k]] = keep;
    }
    flag = 1;
    CHECK_OK(rn_nonfinite(be, n, x, &flag));
    CHECK(flag == 1, "a set flag stays set");
    flag = 0;
    CHECK_OK(rn_nonfinite(be, 0, NULL, &flag));
    CHECK(flag == 0 && rn_nonfinite(be, n, x, NULL) == RN_EINVAL, "n 0; NULL flag refused");
    free(x);
}

/* NaN and inf travel as in torch: ReLU is clamp_min(0) (NaN and -0 pass), its backward
 * masks only where y <= 0, max-pool's window takes a NaN and its backward routes the
 * gradient to the index torch returns (the last NaN of the window). */
static void test_nan(rn_backend *be) {
    float x[4] = {-0.0f, NAN, -1.0f, 2.0f}, y[4], dy[4] = {1, 2, 3, 4}, dx[4];
    int64_t l0 = rn_backend_launches(be);
    CHECK_OK(rn_relu_fwd(be, RN_F32, 4, x, y));
    CHECK(y[0] == 0 && signbit(y[0]) && isnan(y[1]) && y[2] == 0 && !signbit(y[2]) && y[3] == 2,
          "relu: %g %g %g %g", y[0], y[1], y[2], y[3]);
    CHECK_OK(rn_relu_bwd(be, RN_F32, 4, y, dy, dx));
    CHECK(dx[0] == 0 && dx[1] == 2 && dx[2] == 0 && dx[3] == 4, "relu_bwd: %g %g %g %g", dx[0], dx[1],
          dx[2], dx[3]);
    CHECK(rn_backend_launches(be) - l0 == 2, "two ops counted as %lld launches", (long long)(rn_backend_launches(be) - l0));
    float one[4] = {1, 1, 1, 1};
    CHECK_OK(rn_add(be, RN_F32, 4, x, one, y, 1));
    CHECK(isnan(y[1]) && y[2] == 0 && y[3] == 3, "add relu: %g %g %g", y[1], y[2], y[3]);
    /* BN in inference with the ReLU fused, one channel */
    rn_bn_desc d;
    CHECK_OK(rn_bn_desc_init(&d, 4, 1, 1));
    const float g = 1, b = 0, rm = 0, rv = 1;
    CHECK_OK(rn_bn_fwd_infer(be, &d, x, &g, &b, &rm, &rv, NULL, y));
    CHECK(isnan(y[1]) && y[2] == 0 && y[3] > 1.9f, "bn relu: %g %g %g", y[1], y[2], y[3]);
    /* a NaN in training statistics makes every output NaN, and the ReLU keeps them */
    float mean, inv;
    CHECK_OK(rn_bn_fwd_train(be, &d, x, &g, &b, NULL, y, &mean, &inv, NULL, NULL, NULL));
    CHECK(isnan(y[0]) && isnan(y[2]) && isnan(y[3]), "bn train relu: %g %g %g", y[0], y[2], y[3]);
    /* torch: max_pool2d([[1, nan], [nan, 0]], 2) = nan, index 2 */
    rn_pool_desc pd;
    CHECK_OK(rn_pool_desc_init(&pd, 1, 2, 2, 1, 2, 2, 0));
    float px[4] = {1, NAN, NAN, 0}, py[1], pdy[1] = {5}, pdx[4];
    CHECK_OK(rn_maxpool_fwd(be, &pd, px, py));
    CHECK(isnan(py[0]), "maxpool of a NaN window: %g", py[0]);
    CHECK_OK(rn_maxpool_bwd(be, &pd, px, py, pdy, pdx));
    CHECK(pdx[0] == 0 && pdx[1] == 0 && pdx[2] == 5 && pdx[3] == 0, "maxpool_bwd NaN: %g %g %g %g",
          pdx[0], pdx[1], pdx[2], pdx[3]);
    float ix[4] = {1, INFINITY, 3, INFINITY}, iy[1];
    CHECK_OK(rn_maxpool_fwd(be, &pd, ix, iy));
    CHECK_OK(rn_maxpool_bwd(be, &pd, ix, iy, pdy, pdx));
    CHECK(isinf(iy[0]) && pdx[1] == 5 && pdx[3] == 0, "maxpool inf: %g, dx %g %g", iy[0], pdx[1], pdx[3]);
}

/* ---- argument checks ---- */

/* rn_backend_put: the bytes where they are put, up to RN_BACKEND_PUT_MAX; more, or NULL,
 * refused */
static void test_put(rn_backend *be) {
    unsigned char src[RN_BACKEND_PUT_MAX + 1], dst[RN_BACKEND_PUT_MAX + 1];
    for (int i = 0; i < RN_BACKEND_PUT_MAX + 1; i++) src[i] = (unsigned char)(3 * i + 1), dst[i] = 0;
    CHECK_OK(rn_backend_put(be, dst, src, RN_BACKEND_PUT_MAX));
    CHECK(memcmp(dst, src, RN_BACKEND_PUT_MAX) == 0 && dst[RN_BACKEND_PUT_MAX] == 0, "put %d bytes",
          RN_BACKEND_PUT_MAX);
    CHECK(rn_backend_put(be, dst, src, RN_BACKEND_PUT_MAX + 1) == RN_EINVAL, "put of %d bytes refused",
          RN_BACKEND_PUT_MAX + 1);
    CHECK(strstr(rn_last_error(), "at most") != NULL, "message says the limit: %s", rn_last_error());
    CHECK(rn_backend_put(be, NULL, src, 4) == RN_EINVAL, "put to NULL refused");
    CHECK_OK(rn_backend_put(be, NULL, NULL, 0));
}

static void test_errors(rn_backend *be) {
    rn_conv_desc d;
    CHECK(rn_conv_desc_init(&d, 1, 2, 2, 3, 4, 7, 7, 1, 0) == RN_EINVAL, "kernel > input");
    CHECK_OK(rn_conv_desc_init(&d, 2, 9, 9, 64, 8, 3, 3, 1, 1));
    float *x = zeros(2 * 81 * 64), *w = zeros(8 * 9 * 64), *y = zeros(2 * 81 * 8);
    rn_conv_desc bad = d;
    bad.p = 5;
    CHECK(rn_conv_fwd(be, &bad, x, w, y) == RN_EINVAL, "inconsistent output size");
    bad = d;
    bad.dtype = RN_F16;
    CHECK(rn_conv_fwd(be, &bad, x, w, y) == RN_ENOTSUP, "fp16 on cpu");
    CHECK(strstr(rn_last_error(), "F16") != NULL, "message names the dtype: %s", rn_last_error());
    CHECK(rn_conv_fwd(be, &d, NULL, w, y) == RN_EINVAL, "NULL x");
    /* a fresh context has no workspace: the op must refuse, not allocate */
    rn_backend *b2 = NULL;
    CHECK_OK(rn_backend_create("cpu", 1, NULL, &b2));
    if (b2) {
        CHECK(rn_conv_fwd(b2, &d, x, w, y) == RN_EINVAL, "no workspace reserved");
        CHECK(strstr(rn_last_error(), "workspace") != NULL, "message: %s", rn_last_error());
        CHECK(rn_conv_workspace(b2, &d) > 0, "3x3 conv needs workspace");
        CHECK_OK(rn_backend_reserve(b2, rn_conv_workspace(b2, &d)));
        CHECK_OK(rn_conv_fwd(b2, &d, x, w, y));
        rn_backend_destroy(b2);
    }
    CHECK(rn_backend_create("tpu", 1, NULL, &b2) == RN_EINVAL && b2 == NULL, "unknown device");
    /* without a GPU: not in this build, or built with CUDA but no usable device */
    int rc = rn_backend_create("cuda:0", 1, NULL, &b2);
    if (rc == RN_OK) rn_backend_destroy(b2);
    else CHECK((rc == RN_ENOTSUP || rc == RN_EGPU) && b2 == NULL, "cuda:0 without a GPU: %d %s",
               rc, rn_last_error());
    rn_pool_desc pd;
    CHECK(rn_pool_desc_init(&pd, 1, 5, 5, 3, 3, 2, 2) == RN_EINVAL, "pool pad > k/2");
    free(x), free(w), free(y);
}

/* ---- the CPU backend's thread pool ---- */

typedef struct {
    int64_t hits[64];       /* per task: each index is claimed by exactly one thread */
    int64_t by_worker[8];   /* per worker id: each slot written by one thread only */
} threadpool_ctx;

static void pool_task(void *c, int64_t t, int worker) {
    threadpool_ctx *p = c;
    p->hits[t]++;
    if (worker >= 0 && worker < 8) p->by_worker[worker]++;
}

/* Many short runs back to back, the pattern of a training step: every task runs exactly
 * once per run, and the pool neither loses a wake-up (a hang) nor runs a task twice. */
static void test_pool_threads(void) {
    rn_cpu_pool *p = NULL;
    CHECK_OK(rn_cpu_pool_create(3, &p));
    if (!p) return;
    CHECK(rn_cpu_pool_size(p) == 3, "pool of 3: size %d", rn_cpu_pool_size(p));
    threadpool_ctx c;
    memset(&c, 0, sizeof c);
    const int runs = 2000;
    for (int r = 0; r < runs; r++) rn_cpu_pool_run(p, 1 + r % 64, 3, pool_task, &c);
    int64_t bad = 0;
    for (int t = 0; t < 64; t++) {
        int64_t want = 0;
        for (int r = 0; r < runs; r++) want += t < 1 + r % 64;
        bad += c.hits[t] != want;
    }
    CHECK(bad == 0, "pool: %lld task slots ran a wrong number of times", (long long)bad);
    int64_t total = 0, want_total = 0;
    for (int w = 0; w < 8; w++) total += c.by_worker[w];
    for (int r = 0; r < runs; r++) want_total += 1 + r % 64;
    CHECK(total == want_total && c.by_worker[3] == 0, "worker ids 0..2 ran every task: %lld of %lld",
          (long long)total, (long long)want_total);
    rn_cpu_pool_destroy(p);
}

int main(void) {
    rn_backend *be = NULL;
    CHECK_OK(rn_backend_create("cpu", 2, NULL, &be));
    if (!be) return check_done("test_ops");
    test_conv(be);
    test_conv_bias(be);
    test_wino(be);
    test_bn(be);
    test_elementwise(be);
    test_pool(be);
    test_fc(be);
    test_fc_big_on(be, "default");
    test_own_isa();
    /* the training convs and the fc again with their GEMMs through OpenBLAS
       (RN_CPU_GEMM=openblas, and every CPU without AVX2 and FMA) */
    rn_backend_opts o;
    rn_backend_opts_init(&o);
    o.cpu_gemm = RN_CPU_GEMM_OPENBLAS;
    rn_backend *blas = NULL;
    CHECK_OK(rn_backend_create("cpu", 2, &o, &blas));
    if (blas) {
        reserve(blas, 1 << 20);
        test_conv(blas);
        test_fc(blas);
        test_fc_big_on(blas, "openblas");
        rn_backend_destroy(blas);
    }
    test_xent(be);
    test_xent_mix(be);
    test_top1(be);
    test_sgd(be);
    test_sgd_copy(be);
    test_put(be);
    test_ema(be);
    test_cast(be);
    test_nonfinite(be);
    test_nan(be);
    test_errors(be);
    test_pool_threads();
    rn_backend_destroy(be);
    return check_done("test_ops");
}
