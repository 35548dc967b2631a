/* Micro-benchmark of the backend's convolutions over ResNet-50's conv shapes, weighted by
 * how often each shape occurs, with a plain one-thread sgemm of each conv's GEMM size for
 * reference. Not part of `make test` or `make bench`; `make` builds it:
 *   build/tests/bench_ops [batch] [size] [threads] [filter] [fwd]    (default 8 224 2, all rows)
 * e.g. `build/tests/bench_ops 32 64 2 3x3`; a fifth argument "fwd" skips the backwards. The
 * "infer" column is rn_conv_bias_fwd_packed (the inference net's conv, its weights packed
 * once beforehand as the net packs them at load) on a context set from the
 * environment as the tools set theirs (default: rn's own fused GEMM kernel where the CPU
 * has AVX2 and FMA; RN_CPU_WINOGRAD=1, RN_CPU_GEMM=openblas), its algorithm named in the
 * last column; "blas" the same op through OpenBLAS without Winograd (the path before
 * either); "x" infer's speed over blas's, their calls alternating. Each number is the
 * fastest of a few calls: on a shared machine the minimum is what the code can do. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rn/backend.h"
#include "rn/cli.h"
#include "rn/err.h"
#include "rn/rng.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
    int h, c, k, ks, stride, count; /* input size and channels at 224, output channels */
} shape;

/* ResNet-50 v1.5 convs at 224x224 input: (input h, cin, cout, kernel, stride, times). */
static const shape R50[] = {
    {224, 3, 64, 7, 2, 1},
    {56, 64, 64, 1, 1, 1},   {56, 64, 64, 3, 1, 3},   {56, 64, 256, 1, 1, 4},
    {56, 256, 64, 1, 1, 2},
    {56, 256, 128, 1, 1, 1}, {56, 128, 128, 3, 2, 1}, {28, 128, 512, 1, 1, 4},
    {56, 256, 512, 1, 2, 1}, {28, 512, 128, 1, 1, 3}, {28, 128, 128, 3, 1, 3},
    {28, 512, 256, 1, 1, 1}, {28, 256, 256, 3, 2, 1}, {14, 256, 1024, 1, 1, 6},
    {28, 512, 1024, 1, 2, 1}, {14, 1024, 256, 1, 1, 5}, {14, 256, 256, 3, 1, 5},
    {14, 1024, 512, 1, 1, 1}, {14, 512, 512, 3, 2, 1}, {7, 512, 2048, 1, 1, 3},
    {14, 1024, 2048, 1, 2, 1}, {7, 2048, 512, 1, 1, 2}, {7, 512, 512, 3, 1, 2},
};

int main(int argc, char **argv) {
    int batch = argc > 1 ? atoi(argv[1]) : 8, size = argc > 2 ? atoi(argv[2]) : 224;
    int threads = argc > 3 ? atoi(argv[3]) : 2;
    const char *only = argc > 4 ? argv[4] : NULL;   /* e.g. "3x3": only matching rows */
    int fwd_only = argc > 5 && strcmp(argv[5], "fwd") == 0;
    rn_backend *be, *be_ex;
    rn_backend_opts env, blas;
    rn_backend_opts_init(&env);
    rn_backend_opts_init(&blas);
    blas.cpu_gemm = RN_CPU_GEMM_OPENBLAS;
    if (rn_cli_backend_env(&env) || rn_backend_create("cpu", threads, &env, &be) ||
        rn_backend_create("cpu", threads, &blas, &be_ex)) {
        fprintf(stderr, "%s\n", rn_last_error());
        return 1;
    }
    printf("%s; batch %d, %dx%d\n", rn_backend_name(be), batch, size, size);
    printf("%-26s %6s %8s %8s %8s %8s %8s %8s %6s   GFLOP/s (sgemm: the same GEMM, one call, one "
           "thread; infer: conv_bias_fwd, blas: the same through OpenBLAS, x: infer/blas)\n", "conv (h c->k kxk/s)",
           "times", "fwd", "bwd_d", "bwd_f", "sgemm", "infer", "blas", "x");
    double tot_flop = 0, tot_t[3] = {0, 0, 0}, tot_g = 0, tot_inf = 0, tot_ex = 0;
    for (size_t i = 0; i < sizeof R50 / sizeof *R50; i++) {
        const shape *s = &R50[i];
        int h = s->h * size / 224;
        if (h < 1) h = 1;
        char name[64];
        snprintf(name, sizeof name, "%d %d->%d %dx%d/%d", h, s->c, s->k, s->ks, s->ks, s->stride);
        if (only && !strstr(name, only)) continue;
        rn_conv_desc d;
        int pad = s->ks / 2;
        if (rn_conv_desc_init(&d, batch, h, h, s->c, s->k, s->ks, s->ks, s->stride, pad)) return 1;
        size_t nx = (size_t)batch * h * h * s->c, nw = (size_t)s->k * s->ks * s->ks * s->c,
               ny = (size_t)batch * d.p * d.q * s->k;
        float *x = malloc(nx * 4), *w = malloc(nw * 4), *y = malloc(ny * 4), *dx = malloc(nx * 4),
              *dw = malloc(nw * 4), *bias = calloc((size_t)s->k, 4), *yb = malloc(ny * 4);
        size_t ncol = (size_t)batch * d.p * d.q * s->ks * s->ks * s->c;
        float *col = calloc(ncol, 4);   /* the A operand of the equivalent plain sgemm */
        rn_rng_normal(1, x, (int64_t)nx, 0, 1);
        rn_rng_normal(2, w, (int64_t)nw, 0, 0.05f);
        rn_rng_normal(3, y, (int64_t)ny, 0, 1);
        rn_backend_reserve(be, rn_conv_workspace(be, &d));
        rn_backend_reserve(be_ex, rn_conv_workspace(be_ex, &d));
        /* infer's weights packed once, as the inference net packs its folded weights */
        size_t npk = rn_conv_bias_packed_bytes(be, &d);
        float *pk = npk ? malloc(npk) : NULL;
        if (pk && rn_conv_bias_pack(be, &d, w, pk)) {
            fprintf(stderr, "%s\n", rn_last_error());
            return 1;
        }
        double flop = 2.0 * ny * s->ks * s->ks * s->c;
        int reps = (int)(2e9 / flop) + 1;
        if (reps > 20) reps = 20;
        if (reps < 3) reps = 3;
        double t[6];
        for (int op = 0; op < 6; op++) t[op] = 1e30;
        for (int op = 0; op < 5; op++) {
            /* one warm-up call, then the fastest of the timed ones; ops 4 and 5 (infer and
               blas) alternate, so that a slow spell of the machine hits both */
            if (fwd_only && (op == 1 || op == 2)) continue;
            for (int r = -1; r < (op == 4 ? 2 * reps : reps); r++) {
                int o = op == 4 && r >= 0 && r % 2 ? 5 : op;
                double t0 = now();
                if (o == 0) rn_conv_fwd(be, &d, x, w, y);
                else if (o == 1) rn_conv_bwd_data(be, &d, y, w, dx, 0);
                else if (o == 2) rn_conv_bwd_filter(be, &d, x, y, dw, 0);
                else if (o == 4 && pk) rn_conv_bias_fwd_packed(be, &d, x, pk, bias, NULL, 1, yb);
                else if (o == 4) rn_conv_bias_fwd(be, &d, x, w, bias, NULL, 1, yb);
                else if (o == 5) rn_conv_bias_fwd(be_ex, &d, x, w, bias, NULL, 1, yb);
                else
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch * d.p * d.q, s->k,
                                s->ks * s->ks * s->c, 1.0f, col, s->ks * s->ks * s->c, w,
                                s->ks * s->ks * s->c, 0.0f, y, s->k);
                if (r >= 0 && now() - t0 < t[o]) t[o] = now() - t0;
            }
        }
        printf("%-26s %6d %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %6.2f  %s\n", name, s->count, flop / t[0] * 1e-9,
               s->ks == 7 ? 0 : flop / t[1] * 1e-9, flop / t[2] * 1e-9,
               flop / t[3] * 1e-9, flop / t[4] * 1e-9, flop / t[5] * 1e-9, t[5] / t[4],
               rn_conv_algo(be, &d, RN_CONV_BIAS_FWD));
        tot_inf += t[4] * s->count;
        tot_ex += t[5] * s->count;
        tot_flop += flop * s->count;
        for (int op = 0; op < 3; op++) tot_t[op] += t[op] * s->count;
        tot_g += (s->ks == 7 ? 0 : t[1]) * s->count;
        free(x), free(w), free(y), free(dx), free(dw), free(col), free(bias), free(yb), free(pk);
    }
    double step = tot_t[0] + tot_t[1] + tot_t[2];
    if (!fwd_only)
        printf("all convs: fwd %.1f GFLOP/s (%.0f ms), bwd_data %.0f ms, bwd_filter %.1f GFLOP/s "
           "(%.0f ms); fwd+bwd %.0f ms = %.1f GFLOP/s overall\n",
           tot_flop / tot_t[0] * 1e-9, tot_t[0] * 1e3, tot_t[1] * 1e3,
           tot_flop / tot_t[2] * 1e-9, tot_t[2] * 1e3, step * 1e3,
           (3 * tot_flop - 0) / step * 1e-9);
    printf("all convs: infer (conv_bias_fwd) %.0f ms, blas (OpenBLAS, no Winograd) %.0f ms: %.2fx\n", tot_inf * 1e3,
           tot_ex * 1e3, tot_ex / tot_inf);
    (void)tot_g;
    rn_backend_destroy(be);
    rn_backend_destroy(be_ex);
    return 0;
}
