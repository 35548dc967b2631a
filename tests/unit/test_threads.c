/* The CPU backend gives the same bytes for any thread count: every conv direction in
 * each of its ways of cutting the work (whole-matrix blocks, row tiles, runs of images,
 * column blocks of dw, pointwise and strided 1x1), the inference conv (conv_bias_fwd) on
 * rn's own kernel and through OpenBLAS, the fully connected layer and BatchNorm, on 1, 2
 * and 3 threads, compared bit for bit with 1 thread.
 *
 * OpenBLAS picks its kernel at load time (OPENBLAS_CORETYPE, else the CPU it finds), and
 * kernels sum in different orders, so tests/kernels.bats runs this binary under every
 * kernel the CPU can execute. The first line of output names the kernel that ran.
 *   test_threads           the checks
 *   test_threads --probe   one small GEMM and exit 0: can this kernel run here? */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/backend.h"
#include "rn/err.h"
#include "rn/rng.h"
#include "rn/tensor.h"

#define SEED 20261203u

char *openblas_get_corename(void);

static float *randn(uint64_t stream, int64_t n, float std) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    rn_rng_normal(rn_rng_key(SEED, stream), p, n, 0, std);
    return p;
}

static float *zeros(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }

/* a and b bit-identical; else a failure naming the first differing element */
static void same(const char *what, int threads, const float *a, const float *b, int64_t n) {
    int64_t at = -1;
    for (int64_t i = 0; i < n && at < 0; i++)
        if (memcmp(a + i, b + i, sizeof(float)) != 0) at = i;
    CHECK(at < 0, "%s: 1 and %d threads differ, first at [%lld]: %.9g vs %.9g", what, threads,
          (long long)at, at < 0 ? 0.0 : a[at], at < 0 ? 0.0 : b[at]);
}

#define NT 3
static rn_backend *be[NT + 1];   /* be[t]: t threads */
static rn_backend *blas[NT + 1]; /* the same, rn_conv_bias_fwd through OpenBLAS (RN_CPU_GEMM=openblas) */

typedef struct {
    const char *why; /* the way of cutting the work it exercises */
    int n, h, c, k, ks, stride, pad;
} conv_case;

static void conv_case_run(const conv_case *cc) {
    rn_conv_desc d;
    CHECK_OK(rn_conv_desc_init(&d, cc->n, cc->h, cc->h, cc->c, cc->k, cc->ks, cc->ks, cc->stride,
                               cc->pad));
    int64_t nx = (int64_t)d.n * d.h * d.w * d.c, nw = (int64_t)d.k * d.kh * d.kw * d.c,
            ny = (int64_t)d.n * d.p * d.q * d.k;
    float *x = randn(1, nx, 1), *w = randn(2, nw, 0.05f), *dy = randn(3, ny, 1), *bias = randn(5, d.k, 1);
    float *y[NT + 1], *dx[NT + 1], *dw[NT + 1], *dwa[NT + 1], *yb[NT + 1], *ybb[NT + 1];
    char what[160];
    for (int t = 1; t <= NT; t++) {
        y[t] = zeros(ny), dx[t] = zeros(nx), dw[t] = zeros(nw), dwa[t] = randn(4, nw, 1), yb[t] = zeros(ny);
        ybb[t] = zeros(ny);
        CHECK_OK(rn_backend_reserve(be[t], rn_conv_workspace(be[t], &d)));
        CHECK_OK(rn_backend_reserve(blas[t], rn_conv_workspace(blas[t], &d)));
        CHECK_OK(rn_conv_fwd(be[t], &d, x, w, y[t]));
        CHECK_OK(rn_conv_bias_fwd(be[t], &d, x, w, bias, dy, 1, yb[t]));
        CHECK_OK(rn_conv_bias_fwd(blas[t], &d, x, w, bias, dy, 1, ybb[t]));
        /* a Winograd case names its tile size, "Winograd F(4x4,3x3), ..." */
        const char *algo = rn_conv_algo(be[t], &d, RN_CONV_BIAS_FWD);
        if (strncmp(cc->why, "Winograd ", 9) == 0)
            CHECK(strncmp(algo, "Winograd ", 9) == 0 && strncmp(cc->why + 9, algo + 9, strlen(algo + 9)) == 0,
                  "%s: conv_bias_fwd ran %s", cc->why, algo);
        CHECK_OK(rn_conv_bwd_data(be[t], &d, dy, w, dx[t], 0));
        CHECK_OK(rn_conv_bwd_filter(be[t], &d, x, dy, dw[t], 0));
        CHECK_OK(rn_conv_bwd_filter(be[t], &d, x, dy, dwa[t], 1));
    }
    for (int t = 2; t <= NT; t++) {
        const char *dir[] = {"fwd", "bwd_data", "bwd_filter", "bwd_filter accumulate", "bias_fwd",
                             "bias_fwd OpenBLAS"};
        float **out[] = {y, dx, dw, dwa, yb, ybb};
        int64_t len[] = {ny, nx, nw, nw, ny, ny};
        for (int i = 0; i < 6; i++) {
            snprintf(what, sizeof what, "conv n%d %dx%dx%d k%d %dx%d/%d (%s) %s", d.n, d.h, d.w,
                     d.c, d.k, d.kh, d.kw, cc->stride, cc->why, dir[i]);
            same(what, t, out[i][1], out[i][t], len[i]);
        }
    }
    for (int t = 1; t <= NT; t++) free(y[t]), free(dx[t]), free(dw[t]), free(dwa[t]), free(yb[t]), free(ybb[t]);
    free(x), free(w), free(dy), free(bias);
}

static void fc_case_run(int n, int in, int out) {
    rn_fc_desc d = {.dtype = RN_F32, .n = n, .in = in, .out = out};
    float *x = randn(11, (int64_t)n * in, 1), *w = randn(12, (int64_t)out * in, 0.05f),
          *b = randn(13, out, 1), *dy = randn(14, (int64_t)n * out, 1);
    float *y[NT + 1], *dx[NT + 1], *dw[NT + 1], *db[NT + 1];
    for (int t = 1; t <= NT; t++) {
        y[t] = zeros((int64_t)n * out), dx[t] = zeros((int64_t)n * in);
        dw[t] = randn(15, (int64_t)out * in, 1), db[t] = randn(16, out, 1);
        CHECK_OK(rn_fc_fwd(be[t], &d, x, w, b, y[t]));
        CHECK_OK(rn_fc_bwd(be[t], &d, x, w, dy, dx[t], dw[t], db[t], 1));
    }
    char what[96];
    for (int t = 2; t <= NT; t++) {
        snprintf(what, sizeof what, "fc %dx%d -> %d fwd", n, in, out);
        same(what, t, y[1], y[t], (int64_t)n * out);
        snprintf(what, sizeof what, "fc %dx%d -> %d dx", n, in, out);
        same(what, t, dx[1], dx[t], (int64_t)n * in);
        snprintf(what, sizeof what, "fc %dx%d -> %d dw accumulate", n, in, out);
        same(what, t, dw[1], dw[t], (int64_t)out * in);
        snprintf(what, sizeof what, "fc %dx%d -> %d db accumulate", n, in, out);
        same(what, t, db[1], db[t], out);
    }
    for (int t = 1; t <= NT; t++) free(y[t]), free(dx[t]), free(dw[t]), free(db[t]);
    free(x), free(w), free(b), free(dy);
}

static void bn_case_run(int64_t m, int c) {
    rn_bn_desc d;
    CHECK_OK(rn_bn_desc_init(&d, m, c, 1));
    float *x = randn(21, m * c, 1), *dy = randn(22, m * c, 1);
    float *g = randn(23, c, 1), *bt = randn(24, c, 1);
    float *y[NT + 1], *dx[NT + 1], *mean[NT + 1], *inv[NT + 1], *dg[NT + 1], *db[NT + 1];
    for (int t = 1; t <= NT; t++) {
        y[t] = zeros(m * c), dx[t] = zeros(m * c), mean[t] = zeros(c), inv[t] = zeros(c);
        dg[t] = zeros(c), db[t] = zeros(c);
        CHECK_OK(rn_backend_reserve(be[t], rn_bn_workspace(be[t], &d)));
        CHECK_OK(rn_bn_fwd_train(be[t], &d, x, g, bt, NULL, y[t], mean[t], inv[t], NULL, NULL,
                                 NULL));
        CHECK_OK(rn_bn_bwd(be[t], &d, x, y[t], dy, g, mean[t], inv[t], dx[t], dg[t], db[t], NULL,
                           NULL, 0));
    }
    for (int t = 2; t <= NT; t++) {
        same("bn fwd y", t, y[1], y[t], m * c);
        same("bn fwd invstd", t, inv[1], inv[t], c);
        same("bn bwd dx", t, dx[1], dx[t], m * c);
        same("bn bwd dgamma", t, dg[1], dg[t], c);
        same("bn bwd dbeta", t, db[1], db[t], c);
    }
    for (int t = 1; t <= NT; t++)
        free(y[t]), free(dx[t]), free(mean[t]), free(inv[t]), free(dg[t]), free(db[t]);
    free(x), free(dy), free(g), free(bt);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--probe") == 0) {
        float a[64], b[64], c[64];
        for (int i = 0; i < 64; i++) a[i] = (float)i, b[i] = 1.0f / (float)(i + 1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 8, 8, 8, 1.0f, a, 8, b, 8, 0.0f, c,
                    8);
        printf("test_threads: OpenBLAS kernel %s runs here\n", openblas_get_corename());
        return 0;
    }
    printf("test_threads: OpenBLAS kernel %s\n", openblas_get_corename());
    rn_backend_opts o; /* Winograd on (the default): its shapes below take it */
    rn_backend_opts_init(&o);
    o.cpu_winograd = 1;
    for (int t = 1; t <= NT; t++) CHECK_OK(rn_backend_create("cpu", t, &o, &be[t]));
    o.cpu_gemm = RN_CPU_GEMM_OPENBLAS;
    for (int t = 1; t <= NT; t++) CHECK_OK(rn_backend_create("cpu", t, &o, &blas[t]));
    for (int t = 1; t <= NT; t++)
        if (!be[t] || !blas[t]) return check_done("test_threads");
    static const conv_case convs[] = {
        {"whole-matrix blocks", 2, 14, 64, 32, 3, 1, 1},
        {"row tiles, runs of one image", 8, 32, 16, 16, 3, 1, 1},
        {"row tiles, runs of two images", 8, 7, 512, 64, 3, 1, 1},
        {"pointwise row tiles", 4, 32, 512, 64, 1, 1, 0},
        {"pointwise blocks", 4, 16, 64, 96, 1, 1, 0},
        {"strided 1x1", 4, 8, 256, 128, 1, 2, 0},
        {"few rows, wide output", 2, 4, 256, 64, 3, 1, 1},
        {"odd sizes", 3, 9, 24, 40, 3, 2, 1},
        {"stem 7x7/2", 2, 32, 3, 64, 7, 2, 3},
        /* 200 tiles: blocks at any thread count (one block holds 112) */
        {"Winograd F(4x4,3x3), several tile blocks", 2, 40, 128, 128, 3, 1, 1},
        /* 16 tiles: one block at 1 thread, the three passes at 2 and 3 (and through
           OpenBLAS a block per image); partial tiles, odd channels */
        {"Winograd F(4x4,3x3), three passes, partial tiles, odd channels", 1, 15, 129, 131, 3, 1, 1},
        /* 121 tiles per image: through OpenBLAS two blocks per image */
        {"Winograd F(4x4,3x3), two blocks per image", 2, 44, 128, 128, 3, 1, 1},
        /* 147 tiles of 2x2 (one block holds 240): the three passes at 2 and 3 threads */
        {"Winograd F(2x2,3x3), odd sizes and channels", 3, 13, 129, 131, 3, 1, 1},
    };
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++) conv_case_run(&convs[i]);
    fc_case_run(32, 2048, 1000);
    fc_case_run(64, 512, 10);
    fc_case_run(5, 300, 7);
    bn_case_run(2 * 14 * 14, 32);
    bn_case_run(8 * 7 * 7, 512);
    for (int t = 1; t <= NT; t++) rn_backend_destroy(be[t]), rn_backend_destroy(blas[t]);
    return check_done("test_threads");
}
