/* Every CUDA backend op against the CPU backend's op on the same seeded random inputs:
 * fp32 (TF32 off) within a relative error of 1e-4, fp16 and bf16 (inputs rounded to that
 * type for both sides) within their own tolerances. Mismatches print the first few
 * indices. Without a usable GPU (or in a build without CUDA) it prints one SKIP line and
 * passes. RN_TEST_SEED picks the inputs (make gpu-check passes a fresh one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/backend.h"
#include "rn/cli.h"
#include "rn/err.h"
#include "rn/rng.h"
#include "rn/tensor.h"
#ifdef RN_HAVE_CUDA
#include "rn/backend_impl.h" /* rn_backend_cuda_blas_open */
#include "rn/cudnn_status.h"
#endif

static uint64_t seed = 20261202u;
static uint64_t stream_no;
static const char *variant = ""; /* names the BN or conv mode variant in messages */
static int tf32_on;                /* the GPU context allows TF32 for fp32 */

typedef struct {
    rn_backend *cpu, *gpu;
    int dtype; /* of the GPU side */
} env;

/* error of each element relative to max(|want|, rms(want)): near-zero entries of a
 * tensor are judged against its scale, not against themselves */
static double tol_for(int dtype) { return dtype == RN_F16 ? 1e-2 : dtype == RN_BF16 ? 6e-2 : 1e-4; }

static float *randn(int64_t n, float mean, float std) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    rn_rng_normal(rn_rng_key(seed, ++stream_no), p, n, mean, std);
    return p;
}

static float rnd(int dtype, float v) {
    if (dtype == RN_F16) return rn_f16_to_f32(rn_f32_to_f16(v));
    if (dtype == RN_BF16) return rn_bf16_to_f32(rn_f32_to_bf16(v));
    return v;
}

static void round_all(int dtype, float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = rnd(dtype, p[i]);
}

static float *copyf(const float *p, int64_t n) {
    float *q = malloc(sizeof(float) * (size_t)(n ? n : 1));
    memcpy(q, p, sizeof(float) * (size_t)n);
    return q;
}

/* host fp32 -> backend memory in dtype */
static void *up(rn_backend *be, int dtype, const float *h, int64_t n) {
    size_t es = rn_dtype_size(dtype);
    void *tmp = malloc(es * (size_t)(n ? n : 1)), *d = NULL;
    for (int64_t i = 0; i < n; i++) {
        if (dtype == RN_F16) ((uint16_t *)tmp)[i] = rn_f32_to_f16(h[i]);
        else if (dtype == RN_BF16) ((uint16_t *)tmp)[i] = rn_f32_to_bf16(h[i]);
        else ((float *)tmp)[i] = h[i];
    }
    CHECK_OK(rn_backend_alloc(be, es * (size_t)(n ? n : 1), &d));
    if (d) CHECK_OK(rn_backend_upload(be, d, tmp, es * (size_t)n));
    free(tmp);
    return d;
}

/* backend memory in dtype -> new host fp32 array */
static float *down(rn_backend *be, int dtype, const void *d, int64_t n) {
    size_t es = rn_dtype_size(dtype);
    void *tmp = malloc(es * (size_t)(n ? n : 1));
    float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
    CHECK_OK(rn_backend_download(be, tmp, d, es * (size_t)n));
    for (int64_t i = 0; i < n; i++)
        h[i] = dtype == RN_F16 ? rn_f16_to_f32(((uint16_t *)tmp)[i])
             : dtype == RN_BF16 ? rn_bf16_to_f32(((uint16_t *)tmp)[i]) : ((float *)tmp)[i];
    free(tmp);
    return h;
}

/* got (GPU) against want (CPU): prints the first mismatches with their indices */
static void compare_tol(const char *what, int dtype, const float *got, const float *want, int64_t n, double tol) {
    double ss = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(want[i])) ss += (double)want[i] * want[i];
    double rms = n ? sqrt(ss / n) : 0;
    if (rms < 1e-30) rms = 1e-30;
    int64_t bad = 0, at = 0;
    for (int64_t i = 0; i < n; i++) {
        if (got[i] == want[i] || (got[i] != got[i] && want[i] != want[i])) continue; /* inf, NaN */
        double den = fabs(want[i]) > rms ? fabs(want[i]) : rms;
        double e = fabs((double)got[i] - want[i]) / den;
        if (!(e <= tol)) {
            if (bad < 5)
                fprintf(stderr, "  %s [%s] mismatch at %lld: gpu %.8g cpu %.8g (rel %.3g, tol %.1g)\n", what,
                        rn_dtype_name(dtype), (long long)i, got[i], want[i], e, tol);
            bad++;
        }
        if (e > worst || e != e) worst = e, at = i;
    }
    CHECK(bad == 0, "%s [%s]: %lld of %lld elements differ; worst rel %.3g at %lld", what, rn_dtype_name(dtype),
          (long long)bad, (long long)n, worst, (long long)at);
}

static void compare(const char *what, int dtype, const float *got, const float *want, int64_t n) {
    compare_tol(what, dtype, got, want, n, tol_for(dtype));
}

/* download a GPU tensor and compare it with a CPU one */
static void cmp_dev(env *e, const char *what, const void *gdev, int gdtype, const float *want, int64_t n) {
    float *got = down(e->gpu, gdtype, gdev, n);
    compare(what, gdtype, got, want, n);
    free(got);
}

static void reserve_both(env *e, size_t cpu_bytes, size_t gpu_bytes) {
    CHECK_OK(rn_backend_reserve(e->cpu, cpu_bytes));
    CHECK_OK(rn_backend_reserve(e->gpu, gpu_bytes));
}

/* ---- convolution ---- */

/* fp32 (TF32 off) tolerance by algorithm family. GEMM-like and direct algorithms only
 * reorder fp32 sums: 1e-4 of the rms, as every fp32 op. Winograd's tile transforms
 * multiply by constants up to ~10 before the sum and divide after, and FFT rounds in
 * frequency space across the whole tile: both amplify rounding ~10x (the expected error
 * of F(4x4,3x3) in fp32 is ~1e-5 of the data's scale, against ~1e-6 for GEMM): 1e-3.
 * Find may pick them in fp32, as PyTorch's cudnn.benchmark does. */
static double conv_tol(int dtype, const char *algo) {
    /* TF32 rounds each input to 10 mantissa bits (2^-11 relative): ~30x fp32's bound */
    if (dtype == RN_F32 && tf32_on) return 3e-3;
    if (dtype == RN_F32 && (strstr(algo, "WINOGRAD") || strstr(algo, "FFT"))) return 1e-3;
    return tol_for(dtype);
}

static void cmp_conv(env *e, const char *what, const rn_conv_desc *dg, int dir, const void *gdev,
                     const float *want, int64_t n) {
    const char *algo = rn_conv_algo(e->gpu, dg, dir);
    char t[300];
    snprintf(t, sizeof t, "%s (%s)", what, algo);
    float *got = down(e->gpu, dg->dtype, gdev, n);
    compare_tol(t, dg->dtype, got, want, n, conv_tol(dg->dtype, algo));
    free(got);
}

static void test_conv(env *e, int n, int h, int w, int c, int k, int ks, int stride, int pad) {
    rn_conv_desc d, dg;
    CHECK_OK(rn_conv_desc_init(&d, n, h, w, c, k, ks, ks, stride, pad));
    dg = d;
    dg.dtype = e->dtype;
    int64_t nx = (int64_t)n * h * w * c, nw = (int64_t)k * ks * ks * c, ny = (int64_t)n * d.p * d.q * k;
    float *x = randn(nx, 0, 1), *wt = randn(nw, 0, 0.5f), *dy = randn(ny, 0, 1), *dx0 = randn(nx, 0, 1),
          *dw0 = randn(nw, 0, 1);
    round_all(e->dtype, x, nx), round_all(e->dtype, wt, nw), round_all(e->dtype, dy, ny);
    round_all(e->dtype, dx0, nx), round_all(e->dtype, dw0, nw);
    /* a shape first asked about after a reservation is held to it (rn/backend.h): ask
       with none, as a network plans */
    rn_backend_unreserve(e->gpu);
    reserve_both(e, rn_conv_workspace(e->cpu, &d), rn_conv_workspace(e->gpu, &dg));
    float *y = malloc(sizeof(float) * ny), *dx = copyf(dx0, nx), *dw = copyf(dw0, nw);
    CHECK_OK(rn_conv_fwd(e->cpu, &d, x, wt, y));
    void *gx = up(e->gpu, e->dtype, x, nx), *gw = up(e->gpu, e->dtype, wt, nw), *gy = up(e->gpu, e->dtype, y, ny);
    void *gdy = up(e->gpu, e->dtype, dy, ny), *gdx = up(e->gpu, e->dtype, dx0, nx), *gdw = up(e->gpu, e->dtype, dw0, nw);
    char what[160];
    snprintf(what, sizeof what, "%sconv %dx%dx%dx%d k%d %dx%d s%d p%d", variant, n, h, w, c, k, ks, ks, stride, pad);
    CHECK_OK(rn_conv_fwd(e->gpu, &dg, gx, gw, gy));
    char t[200];
    snprintf(t, sizeof t, "%s fwd", what);
    cmp_conv(e, t, &dg, RN_CONV_FWD, gy, y, ny);
    for (int acc = 0; acc < 2; acc++) {
        /* acc 1 adds to what acc 0 left, on both sides */
        CHECK_OK(rn_conv_bwd_data(e->cpu, &d, dy, wt, dx, acc));
        CHECK_OK(rn_conv_bwd_filter(e->cpu, &d, x, dy, dw, acc));
        CHECK_OK(rn_conv_bwd_data(e->gpu, &dg, gdy, gw, gdx, acc));
        CHECK_OK(rn_conv_bwd_filter(e->gpu, &dg, gx, gdy, gdw, acc));
        snprintf(t, sizeof t, "%s bwd_data%s", what, acc ? " accumulate" : "");
        cmp_conv(e, t, &dg, RN_CONV_BWD_DATA, gdx, dx, nx);
        snprintf(t, sizeof t, "%s bwd_filter%s", what, acc ? " accumulate" : "");
        cmp_conv(e, t, &dg, RN_CONV_BWD_FILTER, gdw, dw, nw);
    }
    fprintf(stderr, "test_cuda_ops: %s [%s]: fwd %s, bwd_data %s, bwd_filter %s\n", what, rn_dtype_name(e->dtype),
            rn_conv_algo(e->gpu, &dg, RN_CONV_FWD), rn_conv_algo(e->gpu, &dg, RN_CONV_BWD_DATA),
            rn_conv_algo(e->gpu, &dg, RN_CONV_BWD_FILTER));
    void *bufs[] = {gx, gw, gy, gdy, gdx, gdw};
    for (int i = 0; i < 6; i++) rn_backend_free(e->gpu, bufs[i]);
    free(x), free(wt), free(dy), free(dx0), free(dw0), free(y), free(dx), free(dw);
}

/* ---- batch norm ---- */

/* A BN backward's four outputs on the GPU against the CPU's: dx, dgamma, dbeta and,
 * with a residual, dres; `op` names the op in messages */
static void cmp_bn_grads(env *e, const char *what, const char *op, const void *gdx, const float *dx,
                         const float *gdg, const float *dg, const float *gdb, const float *db, const void *gdres,
                         const float *dres, int64_t n, int c) {
    char t[240];
    snprintf(t, sizeof t, "%s %s dx", what, op);
    cmp_dev(e, t, gdx, e->dtype, dx, n);
    snprintf(t, sizeof t, "%s %s dgamma (accumulate)", what, op);
    cmp_dev(e, t, gdg, RN_F32, dg, c);
    snprintf(t, sizeof t, "%s %s dbeta (accumulate)", what, op);
    cmp_dev(e, t, gdb, RN_F32, db, c);
    if (dres) {
        snprintf(t, sizeof t, "%s %s dres", what, op);
        cmp_dev(e, t, gdres, e->dtype, dres, n);
    }
}

/* a training forward's output, batch statistics and running statistics against the CPU's */
static void cmp_bn_fwd(env *e, const char *what, const void *gy, const float *y, const float *gsm, const float *sm,
                       const float *gsi, const float *si, const float *grm, const float *rm, const float *grv,
                       const float *rv, int64_t n, int c) {
    char t[240];
    snprintf(t, sizeof t, "%s fwd_train y", what);
    cmp_dev(e, t, gy, e->dtype, y, n);
    snprintf(t, sizeof t, "%s save_mean", what);
    cmp_dev(e, t, gsm, RN_F32, sm, c);
    snprintf(t, sizeof t, "%s save_invstd", what);
    cmp_dev(e, t, gsi, RN_F32, si, c);
    snprintf(t, sizeof t, "%s running_mean", what);
    cmp_dev(e, t, grm, RN_F32, rm, c);
    snprintf(t, sizeof t, "%s running_var", what);
    cmp_dev(e, t, grv, RN_F32, rv, c);
}

/* RN_CUDA_BN=cudnn: the backward calls where cuDNN could run it (fp16, channels a multiple
 * of 4, its own forward before: y apart from x) and those where it did (one launch where
 * ours make three), over a dtype's cases */
static int dnn_bwd_could, dnn_bwd_did;

static void test_bn(env *e, int64_t m, int c, int relu, int residual, int in_place) {
    rn_bn_desc d, dg;
    CHECK_OK(rn_bn_desc_init(&d, m, c, relu));
    dg = d;
    dg.dtype = e->dtype;
    int64_t n = m * c;
    float *x = randn(n, 0.5f, 2), *res = residual ? randn(n, 0, 1) : NULL, *gamma = randn(c, 1, 0.3f),
          *beta = randn(c, 0, 0.3f), *rm = randn(c, 0, 0.1f), *rv = randn(c, 1, 0.1f), *dy = randn(n, 0, 1);
    for (int j = 0; j < c; j++) rv[j] = fabsf(rv[j]) + 0.1f;
    round_all(e->dtype, x, n), round_all(e->dtype, dy, n);
    if (res) round_all(e->dtype, res, n);
    reserve_both(e, rn_bn_workspace(e->cpu, &d), rn_bn_workspace(e->gpu, &dg));
    size_t rs = rn_bn_reserve_size(e->gpu, &dg);
    void *reserve = NULL;
    if (rs) CHECK_OK(rn_backend_alloc(e->gpu, rs, &reserve));
    char what[160], t[220];
    snprintf(what, sizeof what, "%sbn m=%lld c=%d%s%s%s", variant, (long long)m, c, relu ? " relu" : "",
             residual ? " residual" : "", in_place ? " in place" : "");

    /* CPU reference */
    float *y = malloc(sizeof(float) * n), *sm = malloc(sizeof(float) * c), *si = malloc(sizeof(float) * c);
    float *crm = copyf(rm, c), *crv = copyf(rv, c), *yi = malloc(sizeof(float) * n);
    CHECK_OK(rn_bn_fwd_train(e->cpu, &d, x, gamma, beta, res, y, sm, si, crm, crv, NULL));
    CHECK_OK(rn_bn_fwd_infer(e->cpu, &d, x, gamma, beta, crm, crv, res, yi));
    float *dx = malloc(sizeof(float) * n), *dres = res ? malloc(sizeof(float) * n) : NULL;
    float *dg0 = randn(c, 0, 1), *db0 = randn(c, 0, 1);
    float *dgam = copyf(dg0, c), *dbet = copyf(db0, c);

    /* GPU: fp32 parameters and statistics, activations in dtype */
    void *gx = up(e->gpu, e->dtype, x, n), *gres = res ? up(e->gpu, e->dtype, res, n) : NULL;
    void *gy = in_place ? gx : up(e->gpu, e->dtype, x, n);
    float *ggam = up(e->gpu, RN_F32, gamma, c), *gbet = up(e->gpu, RN_F32, beta, c);
    float *grm = up(e->gpu, RN_F32, rm, c), *grv = up(e->gpu, RN_F32, rv, c);
    float *gsm = up(e->gpu, RN_F32, sm, c), *gsi = up(e->gpu, RN_F32, si, c);
    void *gxkeep = in_place ? up(e->gpu, e->dtype, x, n) : gx; /* x for the backward */
    CHECK_OK(rn_bn_fwd_train(e->gpu, &dg, gx, ggam, gbet, gres, gy, gsm, gsi, grm, grv, reserve));
    cmp_bn_fwd(e, what, gy, y, gsm, sm, gsi, si, grm, crm, grv, crv, n, c);

    /* The CPU backward takes the GPU's y, so both sides apply the same ReLU mask (a value
     * within rounding of 0 may land on either side of it). */
    float *yg = down(e->gpu, e->dtype, gy, n);
    CHECK_OK(rn_bn_bwd(e->cpu, &d, x, yg, dy, gamma, sm, si, dx, dgam, dbet, dres, NULL, 1));
    free(yg);

    /* backward: dx in place over dy when asked, dres over dy otherwise */
    void *gdy = up(e->gpu, e->dtype, dy, n), *gdx = in_place ? gdy : up(e->gpu, e->dtype, dy, n);
    void *gdres = res ? (in_place ? up(e->gpu, e->dtype, dy, n) : gdy) : NULL;
    float *gdg = up(e->gpu, RN_F32, dg0, c), *gdb = up(e->gpu, RN_F32, db0, c);
    int64_t l0 = rn_backend_launches(e->gpu);
    CHECK_OK(rn_bn_bwd(e->gpu, &dg, gxkeep, gy, gdy, ggam, gsm, gsi, gdx, gdg, gdb, gdres, reserve, 1));
    int dnn_could = strstr(variant, "RN_CUDA_BN=cudnn") && e->dtype == RN_F16 && c % 4 == 0 && !in_place &&
                    (relu || !residual);
    dnn_bwd_could += dnn_could;
    dnn_bwd_did += dnn_could && rn_backend_launches(e->gpu) - l0 == 1;
    cmp_bn_grads(e, what, "bwd", gdx, dx, gdg, dgam, gdb, dbet, gdres, dres, n, c);
    /* where the backend keeps the ReLU mask in the reserve (the CUDA backend's own BN), the
       backward takes the ReLU from it, not from y: the same gradients with y all zeros
       (which would stop every one) */
    if (reserve && relu && !strstr(variant, "RN_CUDA_BN=cudnn")) {
        float *zeros = calloc((size_t)n, sizeof(float));
        void *gz = up(e->gpu, e->dtype, zeros, n), *mdy = up(e->gpu, e->dtype, dy, n);
        void *mres = res ? up(e->gpu, e->dtype, dy, n) : NULL;
        float *mg = up(e->gpu, RN_F32, dg0, c), *mb = up(e->gpu, RN_F32, db0, c);
        CHECK_OK(rn_bn_bwd(e->gpu, &dg, gxkeep, gz, mdy, ggam, gsm, gsi, mdy, mg, mb, mres, reserve, 1));
        cmp_bn_grads(e, what, "bwd from the mask (y zeroed, dx in place)", mdy, dx, mg, dgam, mb, dbet, mres, dres,
                     n, c);
        void *mb_[] = {gz, mdy, mres, mg, mb};
        for (size_t i = 0; i < sizeof mb_ / sizeof *mb_; i++) rn_backend_free(e->gpu, mb_[i]);
        free(zeros);
    }
    /* cuDNN's backward (after its forward, y apart from x) in place over dy, as the network
       calls a BN without a residual, dres apart, and without accumulation, as the network
       calls it: the above had dres over dy, dx apart, and accumulation */
    if (!in_place && strstr(variant, "RN_CUDA_BN=cudnn")) {
        float *zg = calloc((size_t)c, sizeof(float)), *zb = calloc((size_t)c, sizeof(float));
        float *cdx = malloc(sizeof(float) * n), *cres = res ? malloc(sizeof(float) * n) : NULL;
        float *yc = down(e->gpu, e->dtype, gy, n);
        CHECK_OK(rn_bn_bwd(e->cpu, &d, x, yc, dy, gamma, sm, si, cdx, zg, zb, cres, NULL, 0));
        void *pdy = up(e->gpu, e->dtype, dy, n), *pres = res ? up(e->gpu, e->dtype, dy, n) : NULL;
        float *pg = up(e->gpu, RN_F32, dg0, c), *pb = up(e->gpu, RN_F32, db0, c); /* (overwritten) */
        l0 = rn_backend_launches(e->gpu);
        CHECK_OK(rn_bn_bwd(e->gpu, &dg, gxkeep, gy, pdy, ggam, gsm, gsi, pdy, pg, pb, pres, reserve, 0));
        dnn_bwd_could += dnn_could;
        dnn_bwd_did += dnn_could && rn_backend_launches(e->gpu) - l0 == 1;
        cmp_bn_grads(e, what, "bwd (dx in place, dres apart, no accumulation)", pdy, cdx, pg, zg, pb, zb, pres, cres,
                     n, c);
        void *pb_[] = {pdy, pres, pg, pb};
        for (size_t i = 0; i < sizeof pb_ / sizeof *pb_; i++) rn_backend_free(e->gpu, pb_[i]);
        free(zg), free(zb), free(cdx), free(cres), free(yc);
    }

    /* inference with the updated running statistics, in place over a fresh x */
    void *gxi = up(e->gpu, e->dtype, x, n);
    CHECK_OK(rn_bn_fwd_infer(e->gpu, &dg, gxi, ggam, gbet, grm, grv, gres, gxi));
    snprintf(t, sizeof t, "%s fwd_infer", what);
    cmp_dev(e, t, gxi, e->dtype, yi, n);

    /* the frozen backward (--freeze-bn) through that output, with the same running
       statistics on both sides and the GPU's y for the ReLU mask */
    float *yf = down(e->gpu, e->dtype, gxi, n), *fdx = malloc(sizeof(float) * n);
    float *fdres = res ? malloc(sizeof(float) * n) : NULL, *fdg = copyf(dg0, c), *fdb = copyf(db0, c);
    CHECK_OK(rn_bn_bwd_frozen(e->cpu, &d, x, yf, dy, gamma, crm, crv, fdx, fdg, fdb, fdres, 1));
    float *frm = up(e->gpu, RN_F32, crm, c), *frv = up(e->gpu, RN_F32, crv, c);
    float *gfg = up(e->gpu, RN_F32, dg0, c), *gfb = up(e->gpu, RN_F32, db0, c);
    void *gfdy = up(e->gpu, e->dtype, dy, n), *gfdres = res ? up(e->gpu, e->dtype, dy, n) : NULL;
    CHECK_OK(rn_bn_bwd_frozen(e->gpu, &dg, gxkeep, gxi, gfdy, ggam, frm, frv, gfdy, gfg, gfb, gfdres, 1));
    cmp_bn_grads(e, what, "bwd_frozen (dx in place)", gfdy, fdx, gfg, fdg, gfb, fdb, gfdres, fdres, n, c);
    void *fb[] = {frm, frv, gfg, gfb, gfdy, gfdres};
    for (size_t i = 0; i < sizeof fb / sizeof *fb; i++) rn_backend_free(e->gpu, fb[i]);
    free(yf), free(fdx), free(fdres), free(fdg), free(fdb);

    void *bufs[] = {gx, gres, in_place ? NULL : gy, ggam, gbet, grm, grv, gsm, gsi, in_place ? gxkeep : NULL,
                    gdy, in_place ? NULL : gdx, (res && in_place) ? gdres : NULL, gdg, gdb, gxi, reserve};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) rn_backend_free(e->gpu, bufs[i]);
    free(x), free(res), free(gamma), free(beta), free(rm), free(rv), free(dy), free(y), free(sm), free(si);
    free(crm), free(crv), free(yi), free(dx), free(dres), free(dg0), free(db0), free(dgam), free(dbet);
}

/* NaN and inf through BN, as PyTorch carries them (the CPU ops: test_ops): BN of m rows,
 * c channels (ReLU, our kernels) with a NaN in channel 0 and +inf in channel 2 of x: those
 * channels' statistics, outputs and gradients non-finite on both sides, the same elements,
 * the others equal within tolerance; the backward here without accumulation (dgamma,
 * dbeta overwritten). (The loss's: test_xent with nonfinite.) */
static void test_nonfinite_bn(env *e, int64_t m, int c) {
    rn_bn_desc d, dg;
    CHECK_OK(rn_bn_desc_init(&d, m, c, 1));
    dg = d;
    dg.dtype = e->dtype;
    int64_t n = m * c;
    float *x = randn(n, 0.5f, 2), *gamma = randn(c, 1, 0.3f), *beta = randn(c, 0, 0.3f), *rm = randn(c, 0, 0.1f),
          *rv = randn(c, 1, 0.1f), *dy = randn(n, 0, 1);
    for (int j = 0; j < c; j++) rv[j] = fabsf(rv[j]) + 0.1f;
    round_all(e->dtype, x, n), round_all(e->dtype, dy, n);
    x[3 * c + 0] = NAN;
    x[5 * c + 2] = INFINITY;
    reserve_both(e, rn_bn_workspace(e->cpu, &d), rn_bn_workspace(e->gpu, &dg));
    size_t rs = rn_bn_reserve_size(e->gpu, &dg);
    void *reserve = NULL;
    if (rs) CHECK_OK(rn_backend_alloc(e->gpu, rs, &reserve));
    float *y = malloc(sizeof(float) * n), *sm = malloc(sizeof(float) * c), *si = malloc(sizeof(float) * c);
    float *crm = copyf(rm, c), *crv = copyf(rv, c), *dx = malloc(sizeof(float) * n);
    float *dgam = malloc(sizeof(float) * c), *dbet = malloc(sizeof(float) * c);
    CHECK_OK(rn_bn_fwd_train(e->cpu, &d, x, gamma, beta, NULL, y, sm, si, crm, crv, NULL));
    void *gx = up(e->gpu, e->dtype, x, n), *gy = up(e->gpu, e->dtype, x, n);
    float *ggam = up(e->gpu, RN_F32, gamma, c), *gbet = up(e->gpu, RN_F32, beta, c);
    float *grm = up(e->gpu, RN_F32, rm, c), *grv = up(e->gpu, RN_F32, rv, c);
    float *gsm = up(e->gpu, RN_F32, sm, c), *gsi = up(e->gpu, RN_F32, si, c);
    CHECK_OK(rn_bn_fwd_train(e->gpu, &dg, gx, ggam, gbet, NULL, gy, gsm, gsi, grm, grv, reserve));
    char t[160];
    snprintf(t, sizeof t, "%sbn m=%lld c=%d with NaN and inf", variant, (long long)m, c);
    cmp_bn_fwd(e, t, gy, y, gsm, sm, gsi, si, grm, crm, grv, crv, n, c);
    CHECK(y[3 * c] != y[3 * c] && !isfinite(si[2]), "the CPU's own BN: y %g in the NaN channel, invstd %g in the "
          "inf one", y[3 * c], si[2]);
    float *yg = down(e->gpu, e->dtype, gy, n);
    CHECK_OK(rn_bn_bwd(e->cpu, &d, x, yg, dy, gamma, sm, si, dx, dgam, dbet, NULL, NULL, 0));
    void *gdy = up(e->gpu, e->dtype, dy, n), *gdx = up(e->gpu, e->dtype, dy, n);
    float *junk = malloc(sizeof(float) * c);
    for (int j = 0; j < c; j++) junk[j] = 1e6f; /* overwritten without accumulation */
    float *gdg = up(e->gpu, RN_F32, junk, c), *gdb = up(e->gpu, RN_F32, junk, c);
    CHECK_OK(rn_bn_bwd(e->gpu, &dg, gx, gy, gdy, ggam, gsm, gsi, gdx, gdg, gdb, NULL, reserve, 0));
    cmp_bn_grads(e, t, "bwd (no accumulation)", gdx, dx, gdg, dgam, gdb, dbet, NULL, NULL, n, c);
    void *bufs[] = {gx, gy, ggam, gbet, grm, grv, gsm, gsi, gdy, gdx, gdg, gdb, reserve};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) rn_backend_free(e->gpu, bufs[i]);
    free(x), free(gamma), free(beta), free(rm), free(rv), free(dy), free(y), free(sm), free(si), free(crm);
    free(crv), free(dx), free(dgam), free(dbet), free(yg), free(junk);
}

/* ---- elementwise, input normalise ---- */

static void test_elementwise(env *e, int64_t n) {
    float *a = randn(n, 0, 1), *b = randn(n, 0, 1), *dy = randn(n, 0, 1);
    round_all(e->dtype, a, n), round_all(e->dtype, b, n), round_all(e->dtype, dy, n);
    /* NaN and inf pass through ReLU and its backward as in torch */
    a[7] = NAN, a[11] = INFINITY, a[13] = -INFINITY, a[17] = -0.0f;
    float *y = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    void *ga = up(e->gpu, e->dtype, a, n), *gb = up(e->gpu, e->dtype, b, n), *gdy = up(e->gpu, e->dtype, dy, n);
    void *gy = up(e->gpu, e->dtype, a, n);
    for (int relu = 0; relu < 2; relu++) {
        CHECK_OK(rn_add(e->cpu, RN_F32, n, a, b, y, relu));
        CHECK_OK(rn_add(e->gpu, e->dtype, n, ga, gb, gy, relu));
        cmp_dev(e, relu ? "add relu" : "add", gy, e->dtype, y, n);
    }
    CHECK_OK(rn_relu_fwd(e->cpu, RN_F32, n, a, r));
    CHECK_OK(rn_relu_fwd(e->gpu, e->dtype, n, ga, gy));
    cmp_dev(e, "relu_fwd", gy, e->dtype, r, n);
    CHECK_OK(rn_relu_bwd(e->cpu, RN_F32, n, r, dy, dx));
    CHECK_OK(rn_relu_bwd(e->gpu, e->dtype, n, gy, gdy, gdy)); /* in place */
    cmp_dev(e, "relu_bwd", gdy, e->dtype, dx, n);

    /* input normalise: u8 pixels, 3 channels */
    int64_t m = n / 3;
    uint8_t *px = malloc((size_t)m * 3);
    for (int64_t i = 0; i < m * 3; i++) px[i] = (uint8_t)((i * 2654435761u + seed) >> 7);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    CHECK_OK(rn_input_normalize(e->cpu, RN_F32, m, 3, px, mean, std, y));
    for (int64_t i = 0; i < m * 3; i++) y[i] = rnd(e->dtype, y[i]);
    void *gpx = NULL;
    CHECK_OK(rn_backend_alloc(e->gpu, (size_t)m * 3, &gpx));
    CHECK_OK(rn_backend_upload(e->gpu, gpx, px, (size_t)m * 3));
    CHECK_OK(rn_input_normalize(e->gpu, e->dtype, m, 3, gpx, mean, std, gy));
    cmp_dev(e, "input_normalize", gy, e->dtype, y, m * 3);
    /* RandomErasing after it, on the first 16 x eh pixels as one image: a zero box, then a
     * random one (Philox and Box-Muller on the device) */
    int eh = (int)(m / 16);
    for (int random = 0; random < 2 && eh >= 4; random++) {
        CHECK_OK(rn_input_erase(e->cpu, RN_F32, eh, 16, 3, 3, 1, 9, eh - 2, random, 77, 2, 5, y));
        for (int64_t i = 0; i < (int64_t)eh * 16 * 3; i++) y[i] = rnd(e->dtype, y[i]);
        CHECK_OK(rn_input_erase(e->gpu, e->dtype, eh, 16, 3, 3, 1, 9, eh - 2, random, 77, 2, 5, gy));
        cmp_dev(e, random ? "input_erase random" : "input_erase 0", gy, e->dtype, y, (int64_t)eh * 16 * 3);
    }
    rn_backend_free(e->gpu, gpx), rn_backend_free(e->gpu, ga), rn_backend_free(e->gpu, gb);
    rn_backend_free(e->gpu, gdy), rn_backend_free(e->gpu, gy);
    free(a), free(b), free(dy), free(y), free(r), free(dx), free(px);
}

/* ---- pooling ---- */

static void test_maxpool(env *e, int n, int h, int w, int c) {
    rn_pool_desc d, dg;
    CHECK_OK(rn_pool_desc_init(&d, n, h, w, c, 3, 2, 1));
    dg = d;
    dg.dtype = e->dtype;
    int64_t nx = (int64_t)n * h * w * c, ny = (int64_t)n * d.p * d.q * c;
    /* after a ReLU: many zeros, so many windows tie */
    float *x = randn(nx, 0, 1), *dy = randn(ny, 0, 1);
    for (int64_t i = 0; i < nx; i++) x[i] = x[i] > 0 ? rnd(e->dtype, x[i]) : 0;
    /* windows holding NaN (two in one window: the gradient goes to the last) and inf */
    x[0] = NAN, x[(int64_t)w * c] = NAN, x[nx - 1] = INFINITY, x[nx / 2] = NAN;
    round_all(e->dtype, dy, ny);
    float *y = malloc(sizeof(float) * ny), *dx = malloc(sizeof(float) * nx);
    CHECK_OK(rn_maxpool_fwd(e->cpu, &d, x, y));
    CHECK_OK(rn_maxpool_bwd(e->cpu, &d, x, y, dy, dx));
    void *gx = up(e->gpu, e->dtype, x, nx), *gy = up(e->gpu, e->dtype, y, ny), *gdy = up(e->gpu, e->dtype, dy, ny);
    void *gdx = up(e->gpu, e->dtype, x, nx);
    CHECK_OK(rn_maxpool_fwd(e->gpu, &dg, gx, gy));
    cmp_dev(e, "maxpool_fwd", gy, e->dtype, y, ny);
    CHECK_OK(rn_maxpool_bwd(e->gpu, &dg, gx, gy, gdy, gdx));
    cmp_dev(e, "maxpool_bwd (ties)", gdx, e->dtype, dx, nx);
    rn_backend_free(e->gpu, gx), rn_backend_free(e->gpu, gy), rn_backend_free(e->gpu, gdy);
    rn_backend_free(e->gpu, gdx);
    free(x), free(dy), free(y), free(dx);
}

static void test_gap(env *e, int n, int hw, int c) {
    int64_t nx = (int64_t)n * hw * c, ny = (int64_t)n * c;
    float *x = randn(nx, 0, 1), *dy = randn(ny, 0, 1);
    round_all(e->dtype, x, nx), round_all(e->dtype, dy, ny);
    float *y = malloc(sizeof(float) * ny), *dx = malloc(sizeof(float) * nx);
    CHECK_OK(rn_avgpool_global_fwd(e->cpu, RN_F32, n, hw, c, x, y));
    CHECK_OK(rn_avgpool_global_bwd(e->cpu, RN_F32, n, hw, c, dy, dx));
    void *gx = up(e->gpu, e->dtype, x, nx), *gy = up(e->gpu, e->dtype, y, ny), *gdy = up(e->gpu, e->dtype, dy, ny);
    CHECK_OK(rn_avgpool_global_fwd(e->gpu, e->dtype, n, hw, c, gx, gy));
    cmp_dev(e, "avgpool_global_fwd", gy, e->dtype, y, ny);
    CHECK_OK(rn_avgpool_global_bwd(e->gpu, e->dtype, n, hw, c, gdy, gx));
    cmp_dev(e, "avgpool_global_bwd", gx, e->dtype, dx, nx);
    rn_backend_free(e->gpu, gx), rn_backend_free(e->gpu, gy), rn_backend_free(e->gpu, gdy);
    free(x), free(dy), free(y), free(dx);
}

/* ---- fully connected, loss ---- */

static void test_fc(env *e, int n, int in, int out) {
    rn_fc_desc d = {RN_F32, n, in, out}, dg = {e->dtype, n, in, out};
    int64_t nx = (int64_t)n * in, nw = (int64_t)out * in, ny = (int64_t)n * out;
    float *x = randn(nx, 0, 1), *w = randn(nw, 0, 0.1f), *b = randn(out, 0, 1), *dy = randn(ny, 0, 1);
    float *dw0 = randn(nw, 0, 1), *db0 = randn(out, 0, 1);
    round_all(e->dtype, x, nx), round_all(e->dtype, w, nw), round_all(e->dtype, b, out);
    round_all(e->dtype, dy, ny), round_all(e->dtype, dw0, nw), round_all(e->dtype, db0, out);
    float *y = malloc(sizeof(float) * ny), *dx = malloc(sizeof(float) * nx), *dw = copyf(dw0, nw),
          *db = copyf(db0, out);
    reserve_both(e, rn_fc_workspace(e->cpu, &d), rn_fc_workspace(e->gpu, &dg));
    CHECK_OK(rn_fc_fwd(e->cpu, &d, x, w, b, y));
    CHECK_OK(rn_fc_bwd(e->cpu, &d, x, w, dy, dx, dw, db, 1));
    void *gx = up(e->gpu, e->dtype, x, nx), *gw = up(e->gpu, e->dtype, w, nw), *gb = up(e->gpu, e->dtype, b, out);
    void *gy = up(e->gpu, e->dtype, y, ny), *gdy = up(e->gpu, e->dtype, dy, ny), *gdx = up(e->gpu, e->dtype, x, nx);
    void *gdw = up(e->gpu, e->dtype, dw0, nw), *gdb = up(e->gpu, e->dtype, db0, out);
    /* cuBLAS under TF32 (fp32 with RN_CUDA_TF32=1): the convolutions' TF32 tolerance */
    double tol = e->dtype == RN_F32 && tf32_on ? 3e-3 : tol_for(e->dtype);
    char t[160];
#define CMP_FC(what, gdev, want, len)                                                   \
    do {                                                                                \
        float *got_ = down(e->gpu, e->dtype, gdev, len);                                \
        snprintf(t, sizeof t, "%s%s n=%d in=%d out=%d", variant, what, n, in, out);     \
        compare_tol(t, e->dtype, got_, want, len, tol);                                 \
        free(got_);                                                                     \
    } while (0)
    CHECK_OK(rn_fc_fwd(e->gpu, &dg, gx, gw, gb, gy));
    CMP_FC("fc_fwd", gy, y, ny);
    CHECK_OK(rn_fc_bwd(e->gpu, &dg, gx, gw, gdy, gdx, gdw, gdb, 1));
    CMP_FC("fc_bwd dx", gdx, dx, nx);
    CMP_FC("fc_bwd dw (accumulate)", gdw, dw, nw);
    CMP_FC("fc_bwd db (accumulate)", gdb, db, out);
    /* no bias */
    CHECK_OK(rn_fc_fwd(e->cpu, &d, x, w, NULL, y));
    CHECK_OK(rn_fc_fwd(e->gpu, &dg, gx, gw, NULL, gy));
    CMP_FC("fc_fwd without bias", gy, y, ny);
#undef CMP_FC
    void *bufs[] = {gx, gw, gb, gy, gdy, gdx, gdw, gdb};
    for (int i = 0; i < 8; i++) rn_backend_free(e->gpu, bufs[i]);
    free(x), free(w), free(b), free(dy), free(dw0), free(db0), free(y), free(dx), free(dw), free(db);
}

/* nonfinite: rows 1, 3 and 5 get a NaN, a +inf and a -inf logit (n >= 6, k >= 10): the
 * first two rows' gradients and the loss NaN on both sides, the -inf row finite */
static void test_xent(env *e, int n, int k, float smoothing, float grad_scale, double mix_weight, int nonfinite) {
    rn_xent_desc d, dg;
    CHECK_OK(rn_xent_desc_init(&d, n, k));
    d.label_smoothing = smoothing;
    d.grad_scale = grad_scale;
    d.mix_weight = mix_weight;
    dg = d;
    dg.dtype = e->dtype;
    int64_t nz = (int64_t)n * k;
    float *z = randn(nz, 0, 3);
    round_all(e->dtype, z, nz);
    if (nonfinite) z[1 * k + 4] = NAN, z[3 * k + 0] = INFINITY, z[5 * k + 9] = -INFINITY;
    int32_t *lab = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) lab[i] = (int32_t)((i * 7919 + (int)seed) % k);
    float loss, *dl = malloc(sizeof(float) * nz);
    CHECK_OK(rn_softmax_xent(e->cpu, &d, z, lab, &loss, dl));
    if (nonfinite)
        CHECK(loss != loss && dl[1 * k] != dl[1 * k] && isfinite(dl[5 * k + 9]), "the CPU's own loss %g, row 1 %g, "
              "row 5's -inf logit's gradient %g", loss, dl[1 * k], dl[5 * k + 9]);
    void *gz = up(e->gpu, e->dtype, z, nz);
    int32_t *glab = NULL;
    float *gloss = NULL;
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof(int32_t) * n, (void **)&glab));
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof(float), (void **)&gloss));
    CHECK_OK(rn_backend_upload(e->gpu, glab, lab, sizeof(int32_t) * n));
    CHECK_OK(rn_softmax_xent(e->gpu, &dg, gz, glab, gloss, gz)); /* dlogits over logits */
    char t[120];
    const char *nf = nonfinite ? " with NaN, +inf and -inf logits" : "";
    snprintf(t, sizeof t, "softmax_xent n=%d k=%d smoothing %g mix %g%s loss", n, k, smoothing, mix_weight, nf);
    cmp_dev(e, t, gloss, RN_F32, &loss, 1);
    snprintf(t, sizeof t, "softmax_xent n=%d k=%d smoothing %g mix %g%s dlogits", n, k, smoothing, mix_weight, nf);
    cmp_dev(e, t, gz, e->dtype, dl, nz);
    if (mix_weight > 0) { /* the weight read from device memory (mix_weight_at; the scalar 0) */
        double *gm = NULL;
        CHECK_OK(rn_backend_alloc(e->gpu, sizeof(double), (void **)&gm));
        CHECK_OK(rn_backend_upload(e->gpu, gm, &mix_weight, sizeof mix_weight));
        void *gz2 = up(e->gpu, e->dtype, z, nz);
        rn_xent_desc da = dg;
        da.mix_weight = 0;
        da.mix_weight_at = gm;
        CHECK_OK(rn_softmax_xent(e->gpu, &da, gz2, glab, gloss, gz2));
        snprintf(t, sizeof t, "softmax_xent n=%d k=%d smoothing %g mix_weight_at %g loss", n, k, smoothing,
                 mix_weight);
        cmp_dev(e, t, gloss, RN_F32, &loss, 1);
        snprintf(t, sizeof t, "softmax_xent n=%d k=%d smoothing %g mix_weight_at %g dlogits", n, k, smoothing,
                 mix_weight);
        cmp_dev(e, t, gz2, e->dtype, dl, nz);
        rn_backend_free(e->gpu, gz2), rn_backend_free(e->gpu, gm);
    }
    rn_backend_free(e->gpu, gz), rn_backend_free(e->gpu, glab), rn_backend_free(e->gpu, gloss);
    free(z), free(lab), free(dl);
}

/* the train top-1 count against the CPU op: n rows of k classes with ties (values
 * rounded to a few levels), NaN sprinkled in (column 0 too) and rows over the block's 32
 * warps, each target */
static void test_top1(env *e, int n, int k) {
    int64_t nz = (int64_t)n * k;
    float *z = randn(nz, 0, 1);
    for (int64_t i = 0; i < nz; i++) {
        z[i] = roundf(z[i] * 2) / 2; /* ties */
        if ((i * 7 + seed) % 97 == 0) z[i] = NAN;
    }
    int32_t *lab = malloc(sizeof(int32_t) * n);
    int32_t *gl = NULL, *gh = NULL, hc = -1, hg = -2;
    for (int i = 0; i < n; i++) lab[i] = (int32_t)((i * 31 + (int)seed) % k);
    float *gz = up(e->gpu, RN_F32, z, nz);
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof(int32_t) * n, (void **)&gl));
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof(int32_t), (void **)&gh));
    CHECK_OK(rn_backend_upload(e->gpu, gl, lab, sizeof(int32_t) * n));
    for (int target = RN_TOP1_LABEL; target <= RN_TOP1_SMALLER; target++) {
        CHECK_OK(rn_top1_count(e->cpu, n, k, z, lab, target, &hc));
        CHECK_OK(rn_top1_count(e->gpu, n, k, gz, gl, target, gh));
        CHECK_OK(rn_backend_download(e->gpu, &hg, gh, sizeof hg));
        CHECK(hg == hc, "top1_count n=%d k=%d target %d: %d, the CPU's %d", n, k, target, hg, hc);
        /* the target read from device memory (rn_top1_count_at) */
        int32_t *gt = NULL, t32 = target;
        hg = -2;
        CHECK_OK(rn_backend_alloc(e->gpu, sizeof(int32_t), (void **)&gt));
        CHECK_OK(rn_backend_upload(e->gpu, gt, &t32, sizeof t32));
        CHECK_OK(rn_top1_count_at(e->gpu, n, k, gz, gl, gt, gh));
        CHECK_OK(rn_backend_download(e->gpu, &hg, gh, sizeof hg));
        CHECK(hg == hc, "top1_count_at n=%d k=%d target %d: %d, the CPU's %d", n, k, target, hg, hc);
        rn_backend_free(e->gpu, gt);
    }
    rn_backend_free(e->gpu, gz), rn_backend_free(e->gpu, gl), rn_backend_free(e->gpu, gh);
    free(z), free(lab);
}

/* add on tensors whose start is one element past a 16-byte boundary, n a multiple of 8:
 * the kernels' 16-byte loads must not apply (a misaligned vector load faults) */
static void test_add_unaligned(env *e, int64_t n) {
    float *a = randn(n + 1, 0, 1), *b = randn(n + 1, 0, 1), *y = malloc(sizeof(float) * (size_t)n);
    round_all(e->dtype, a, n + 1), round_all(e->dtype, b, n + 1);
    size_t es = rn_dtype_size(e->dtype);
    char *ga = up(e->gpu, e->dtype, a, n + 1), *gb = up(e->gpu, e->dtype, b, n + 1);
    char *gy = up(e->gpu, e->dtype, a, n + 1);
    CHECK_OK(rn_add(e->cpu, RN_F32, n, a + 1, b + 1, y, 1));
    CHECK_OK(rn_add(e->gpu, e->dtype, n, ga + es, gb + es, gy + es, 1));
    cmp_dev(e, "add relu, one element past 16-byte alignment", gy + es, e->dtype, y, n);
    rn_backend_free(e->gpu, ga), rn_backend_free(e->gpu, gb), rn_backend_free(e->gpu, gy);
    free(a), free(b), free(y);
}

/* a label out of range, on the row in the middle and, without the gradient, the last: the
 * GPU's loss is NaN (the CPU backend refuses the batch instead, naming the row) */
static void test_xent_bad_label(env *e, int bad_row) {
    const int n = 5, k = 10;
    rn_xent_desc d;
    CHECK_OK(rn_xent_desc_init(&d, n, k));
    d.dtype = e->dtype;
    float *z = randn(n * k, 0, 1);
    round_all(e->dtype, z, n * k);
    int32_t lab[5] = {1, 2, 3, 4, 5};
    lab[bad_row] = k;
    void *gz = up(e->gpu, e->dtype, z, n * k);
    int32_t *glab = NULL;
    float *gloss = NULL, loss = 0;
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof lab, (void **)&glab));
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof(float), (void **)&gloss));
    CHECK_OK(rn_backend_upload(e->gpu, glab, lab, sizeof lab));
    int rc = rn_softmax_xent(e->gpu, &d, gz, glab, gloss, bad_row == n - 1 ? NULL : gz);
    if (rn_backend_is_host(e->gpu)) { /* RN_TEST_DEVICE=cpu: the harness on the CPU */
        CHECK(rc == RN_EINVAL && strstr(rn_last_error(), "out of range"), "CPU softmax_xent with label %d of %d: %s",
              k, k, rc ? rn_last_error() : "accepted");
    } else {
        CHECK_OK(rc);
        CHECK_OK(rn_backend_download(e->gpu, &loss, gloss, sizeof loss));
        CHECK(isnan(loss), "softmax_xent with label %d of %d classes on row %d: loss %g, not NaN", k, k, bad_row,
              loss);
    }
    rn_backend_free(e->gpu, gz), rn_backend_free(e->gpu, glab), rn_backend_free(e->gpu, gloss);
    free(z);
}

/* mixup and cutmix of a u8 batch: the CPU op's float operations, so equal in fp32; without
 * erasing, then with each image's erase box (zero or random values; box 1 none, the others
 * across the cutmix box's edge) applied to it and to it as a partner before the mixing */
static void test_input_mix(env *e, int n, int h, int w) {
    const int c = 3;
    int64_t tot = (int64_t)n * h * w * c;
    uint8_t *px = malloc((size_t)tot);
    for (int64_t i = 0; i < tot; i++) px[i] = (uint8_t)((i * 2654435761u + seed) >> 9);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    float *y = malloc(sizeof(float) * tot);
    void *gpx = NULL, *gy = NULL;
    CHECK_OK(rn_backend_alloc(e->gpu, (size_t)tot, &gpx));
    CHECK_OK(rn_backend_alloc(e->gpu, rn_dtype_size(e->dtype) * (size_t)tot, &gy));
    CHECK_OK(rn_backend_upload(e->gpu, gpx, px, (size_t)tot));
    const rn_mix_desc ds[2] = {{.kind = RN_MIX_MIXUP, .lambda = 0.3183098861837907},
                               {.kind = RN_MIX_CUTMIX, .lambda = 0.75, .y0 = 1, .y1 = h - 2, .x0 = 2, .x1 = w}};
    rn_erase *er = calloc((size_t)n, sizeof *er);
    void *ger = NULL;
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof *er * (size_t)n, &ger));
    for (int mode = 0; mode < 3; mode++) { /* no erase, zero, random */
        for (int k = 0; k < n; k++)
            er[k] = (rn_erase){.x = k % 3, .y = k % 2, .w = k == 1 ? 0 : w / 2, .h = h - 2, .rec = 40u + (uint32_t)k,
                               .random = mode == 2};
        CHECK_OK(rn_backend_upload(e->gpu, ger, er, sizeof *er * (size_t)n));
        for (int i = 0; i < 2; i++) {
            char what[64];
            snprintf(what, sizeof what, "input_mix %s%s", i ? "cutmix" : "mixup",
                     mode == 0 ? "" : mode == 1 ? " erase 0" : " erase random");
            CHECK_OK(rn_input_mix(e->cpu, RN_F32, &ds[i], n, h, w, c, px, mean, std, mode ? er : NULL, 77, 3, y));
            for (int64_t j = 0; j < tot; j++) y[j] = rnd(e->dtype, y[j]);
            CHECK_OK(rn_input_mix(e->gpu, e->dtype, &ds[i], n, h, w, c, gpx, mean, std, mode ? ger : NULL, 77, 3, gy));
            cmp_dev(e, what, gy, e->dtype, y, tot);
        }
    }
    rn_backend_free(e->gpu, gpx), rn_backend_free(e->gpu, gy), rn_backend_free(e->gpu, ger);
    free(px), free(y), free(er);
}

/* SGD is fp32 everywhere and written with the same float operations: equal to the bit.
 * Variants 4 and 5 read the rate from lr_at and the skip from skip_if on the device (5:
 * set, so nothing may change; the CPU's side skips by not stepping). */
static void test_sgd(env *e, int64_t n) {
    for (int variant = 0; variant < 6; variant++) {
        rn_sgd_desc d;
        CHECK_OK(rn_sgd_desc_init(&d, 0.1f, variant == 3 ? 0 : 0.9f, variant == 2 ? 0 : 1e-4f, variant == 1));
        d.first_step = variant == 0;
        d.grad_scale = variant == 2 ? 0.25f : 1.0f;
        float *p = randn(n, 0, 1), *g = randn(n, 0, 1), *buf = randn(n, 0, 1);
        float *gp = up(e->gpu, RN_F32, p, n), *gg = up(e->gpu, RN_F32, g, n), *gbuf = up(e->gpu, RN_F32, buf, n);
        if (variant != 5) CHECK_OK(rn_sgd_update(e->cpu, &d, n, p, g, buf));
        float at[2] = {0.1f, 0};
        int32_t skip = variant == 5;
        if (variant >= 4) {
            CHECK_OK(rn_backend_alloc(e->gpu, sizeof at, (void **)&d.lr_at));
            CHECK_OK(rn_backend_upload(e->gpu, (void *)d.lr_at, at, sizeof at));
            CHECK_OK(rn_backend_alloc(e->gpu, sizeof skip, (void **)&d.skip_if));
            CHECK_OK(rn_backend_upload(e->gpu, (void *)d.skip_if, &skip, sizeof skip));
            d.lr = 123.0f; /* (not read) */
        }
        CHECK_OK(rn_sgd_update(e->gpu, &d, n, gp, gg, gbuf));
        rn_backend_free(e->gpu, (void *)d.lr_at), rn_backend_free(e->gpu, (void *)d.skip_if);
        float *hp = down(e->gpu, RN_F32, gp, n), *hb = down(e->gpu, RN_F32, gbuf, n);
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += hp[i] != p[i] || (d.momentum != 0 && hb[i] != buf[i]);
        CHECK(diff == 0, "sgd variant %d: %lld of %lld values differ from the CPU's", variant, (long long)diff,
              (long long)n);
        rn_backend_free(e->gpu, gp), rn_backend_free(e->gpu, gg), rn_backend_free(e->gpu, gbuf);
        free(p), free(g), free(buf), free(hp), free(hb);
    }
}

/* rn_backend_put: the bytes on the device, in order with the ops around it (a copy
 * issued after it reads them) */
static void test_put(env *e) {
    unsigned char src[RN_BACKEND_PUT_MAX], got[RN_BACKEND_PUT_MAX];
    for (int i = 0; i < RN_BACKEND_PUT_MAX; i++) src[i] = (unsigned char)(7 * i + 5);
    void *a = NULL, *b = NULL;
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof src, &a));
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof src, &b));
    if (!a || !b) return;
    unsigned char ff[RN_BACKEND_PUT_MAX];
    memset(ff, 0xff, sizeof ff);
    CHECK_OK(rn_backend_upload(e->gpu, a, ff, sizeof ff));
    CHECK_OK(rn_backend_put(e->gpu, a, src, 13));
    CHECK_OK(rn_backend_download(e->gpu, got, a, sizeof got));
    CHECK(memcmp(got, src, 13) == 0 && memcmp(got + 13, ff, sizeof got - 13) == 0,
          "put of 13 bytes: the 13 differ or a byte past them changed");
    CHECK_OK(rn_backend_put(e->gpu, (unsigned char *)a + 13, src + 13, sizeof src - 13));
    CHECK_OK(rn_backend_copy(e->gpu, b, a, sizeof src));
    CHECK_OK(rn_backend_download(e->gpu, got, b, sizeof got));
    CHECK(memcmp(got, src, sizeof src) == 0, "put: the bytes read back differ");
    rn_backend_free(e->gpu, a), rn_backend_free(e->gpu, b);
}

/* An optimiser update (a descriptor template, then the rate, lr_at and skip_if) */
typedef int (*update_fn)(rn_backend *be, const void *tmpl, float lr, const float *lr_at, const int32_t *skip_if,
                         int64_t n, float *p, const float *g, float *buf);

static int sgd_update(rn_backend *be, const void *tmpl, float lr, const float *lr_at, const int32_t *skip_if,
                      int64_t n, float *p, const float *g, float *buf) {
    rn_sgd_desc d = *(const rn_sgd_desc *)tmpl;
    d.lr = lr, d.lr_at = lr_at, d.skip_if = skip_if;
    return rn_sgd_update(be, &d, n, p, g, buf);
}

static int lars_update(rn_backend *be, const void *tmpl, float lr, const float *lr_at, const int32_t *skip_if,
                       int64_t n, float *p, const float *g, float *buf) {
    rn_lars_desc d = *(const rn_lars_desc *)tmpl;
    d.lr = lr, d.lr_at = lr_at, d.skip_if = skip_if;
    return rn_lars_update(be, &d, n, p, g, buf);
}

/* The update in a graph reads lr_at and skip_if when the graph runs (rn-train
 * --cuda-graphs' optimiser step): captured once, launched with the flag set (nothing may
 * change), then with the flag cleared and a new rate put: the CPU's step at that rate,
 * bit for bit */
static void graph_update(env *e, int64_t n, const char *what, update_fn update, const void *tmpl) {
    float *p = randn(n, 0, 1), *g = randn(n, 0, 1e-2f), *buf = randn(n, 0, 1e-2f);
    float *gp = up(e->gpu, RN_F32, p, n), *gg = up(e->gpu, RN_F32, g, n), *gbuf = up(e->gpu, RN_F32, buf, n);
    float *lr_d = NULL, lr = 0.25f;
    int32_t *skip_d = NULL, skip = 1;
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof lr, (void **)&lr_d));
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof skip, (void **)&skip_d));
    CHECK_OK(rn_backend_put(e->gpu, lr_d, &lr, sizeof lr));
    CHECK_OK(rn_backend_put(e->gpu, skip_d, &skip, sizeof skip));
    rn_graph *graph = NULL;
    int64_t nodes = 0;
    CHECK_OK(rn_backend_capture_begin(e->gpu));
    int rc = update(e->gpu, tmpl, 0.0f, lr_d, skip_d, n, gp, gg, gbuf);
    CHECK_OK(rn_backend_capture_end(e->gpu, rc == RN_OK, &graph, &nodes));
    CHECK(rc == RN_OK && graph, "%s captured: %s", what, rn_last_error());
    if (graph) {
        CHECK_OK(rn_backend_graph_launch(e->gpu, graph));
        float *h0 = down(e->gpu, RN_F32, gp, n), *b0 = down(e->gpu, RN_F32, gbuf, n);
        CHECK(memcmp(h0, p, sizeof(float) * (size_t)n) == 0 && memcmp(b0, buf, sizeof(float) * (size_t)n) == 0,
              "%s graph launched with skip_if set: the weights or the momentum changed", what);
        lr = 0.0625f, skip = 0;
        CHECK_OK(rn_backend_put(e->gpu, lr_d, &lr, sizeof lr));
        CHECK_OK(rn_backend_put(e->gpu, skip_d, &skip, sizeof skip));
        CHECK_OK(rn_backend_graph_launch(e->gpu, graph));
        CHECK_OK(update(e->cpu, tmpl, lr, NULL, NULL, n, p, g, buf));
        float *h1 = down(e->gpu, RN_F32, gp, n), *b1 = down(e->gpu, RN_F32, gbuf, n);
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += h1[i] != p[i] || b1[i] != buf[i];
        CHECK(diff == 0, "%s graph launched with a new rate: %lld of %lld values differ from the CPU's step", what,
              (long long)diff, (long long)n);
        rn_backend_graph_free(e->gpu, graph);
        free(h0), free(b0), free(h1), free(b1);
    }
    rn_backend_free(e->gpu, lr_d), rn_backend_free(e->gpu, skip_d);
    rn_backend_free(e->gpu, gp), rn_backend_free(e->gpu, gg), rn_backend_free(e->gpu, gbuf);
    free(p), free(g), free(buf);
}

/* SGD, and LARS adapted (its trust kernel reads lr_at) and not (its update does) */
static void test_update_graphs(env *e, int64_t n) {
    if (!rn_backend_has_graphs(e->gpu)) return;
    rn_sgd_desc sd;
    CHECK_OK(rn_sgd_desc_init(&sd, 0.0f, 0.9f, 1e-4f, 0));
    sd.first_step = 0;
    graph_update(e, n, "sgd", sgd_update, &sd);
    for (int adapt = 0; adapt < 2; adapt++) {
        rn_lars_desc ld;
        CHECK_OK(rn_lars_desc_init(&ld, 0.0f, 0.9f, 5e-5f, 0.001f, 0));
        ld.adapt = adapt;
        CHECK_OK(rn_backend_reserve(e->cpu, rn_lars_workspace(e->cpu, n)));
        CHECK_OK(rn_backend_reserve(e->gpu, rn_lars_workspace(e->gpu, n)));
        graph_update(e, n, adapt ? "lars (adapted)" : "lars (not adapted)", lars_update, &ld);
    }
}

/* The weights' moving average: the same bits as the CPU's */
static void test_ema(env *e, int64_t n) {
    float *x = randn(n, 0, 1), *avg = randn(n, 0, 1);
    float *gx = up(e->gpu, RN_F32, x, n), *gavg = up(e->gpu, RN_F32, avg, n);
    const float keep = (float)(1.0 - 0.0123), take = (float)(1.0 - (1.0 - 0.0123));
    CHECK_OK(rn_ema_update(e->cpu, n, x, avg, keep, take));
    CHECK_OK(rn_ema_update(e->gpu, n, gx, gavg, keep, take));
    float *h = down(e->gpu, RN_F32, gavg, n);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += h[i] != avg[i];
    CHECK(diff == 0, "ema_update: %lld of %lld values differ from the CPU's", (long long)diff, (long long)n);
    rn_backend_free(e->gpu, gx), rn_backend_free(e->gpu, gavg);
    free(x), free(avg), free(h);
}

/* The fused AMP step: p, buf and the compute copy in each type, bit for bit */
static void test_sgd_copy(env *e, int64_t n) {
    const int dtypes[] = {RN_F32, RN_F16, RN_BF16};
    for (int t = 0; t < 3; t++) {
        rn_sgd_desc d;
        CHECK_OK(rn_sgd_desc_init(&d, 0.1f, 0.9f, 1e-4f, 0));
        d.first_step = 0;
        d.grad_scale = 1.0f / 65536.0f;
        d.dtype = dtypes[t];
        size_t es = rn_dtype_size(dtypes[t]);
        float *p = randn(n, 0, 1), *g = randn(n, 0, 3e3f), *buf = randn(n, 0, 1e-2f);
        void *copy = malloc(es * n), *got = malloc(es * n), *gcopy = NULL;
        float *gp = up(e->gpu, RN_F32, p, n), *gg = up(e->gpu, RN_F32, g, n), *gbuf = up(e->gpu, RN_F32, buf, n);
        CHECK_OK(rn_backend_alloc(e->gpu, es * n, &gcopy));
        CHECK_OK(rn_sgd_update_copy(e->cpu, &d, n, p, g, buf, copy));
        CHECK_OK(rn_sgd_update_copy(e->gpu, &d, n, gp, gg, gbuf, gcopy));
        float *hp = down(e->gpu, RN_F32, gp, n), *hb = down(e->gpu, RN_F32, gbuf, n);
        CHECK_OK(rn_backend_download(e->gpu, got, gcopy, es * n));
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += hp[i] != p[i] || hb[i] != buf[i];
        CHECK(diff == 0 && memcmp(got, copy, es * n) == 0,
              "sgd_update_copy %s: %lld of %lld p/buf values differ from the CPU's, copy %s",
              rn_dtype_name(dtypes[t]), (long long)diff, (long long)n,
              memcmp(got, copy, es * n) ? "differs" : "equal");
        rn_backend_free(e->gpu, gp), rn_backend_free(e->gpu, gg), rn_backend_free(e->gpu, gbuf);
        rn_backend_free(e->gpu, gcopy);
        free(p), free(g), free(buf), free(copy), free(got), free(hp), free(hb);
    }
}

/* LARS mirrors the CPU's order (chunk sums in double, no fused multiply-add): p, buf and
 * the compute copy bit for bit, adapted and excluded, with AMP's unscale; variant 4 reads
 * the rate from lr_at and a cleared skip_if on the device (rn-train's captured step) */
static void test_lars(env *e, int64_t n) {
    const int dtypes[] = {RN_F32, RN_F16, RN_BF16, RN_F32, RN_F16};
    for (int v = 0; v < 5; v++) {
        rn_lars_desc d, gd;
        CHECK_OK(rn_lars_desc_init(&d, 2.5f, 0.9f, 5e-5f, 0.001f, v == 1 ? 1e-3f : 0));
        d.adapt = v != 3;
        d.grad_scale = v == 2 ? 1.0f / 65536.0f : 1.0f;
        d.dtype = dtypes[v];
        gd = d;
        float *lr_d = NULL;
        int32_t *skip_d = NULL, zero = 0;
        if (v == 4) {
            CHECK_OK(rn_backend_alloc(e->gpu, sizeof(float), (void **)&lr_d));
            CHECK_OK(rn_backend_alloc(e->gpu, sizeof(int32_t), (void **)&skip_d));
            CHECK_OK(rn_backend_put(e->gpu, lr_d, &d.lr, sizeof(float)));
            CHECK_OK(rn_backend_put(e->gpu, skip_d, &zero, sizeof zero));
            gd.lr = 77.0f, gd.lr_at = lr_d, gd.skip_if = skip_d; /* (gd.lr not read) */
        }
        size_t es = rn_dtype_size(dtypes[v]);
        CHECK_OK(rn_backend_reserve(e->cpu, rn_lars_workspace(e->cpu, n)));
        CHECK_OK(rn_backend_reserve(e->gpu, rn_lars_workspace(e->gpu, n)));
        float *p = randn(n, 0, 1), *g = randn(n, 0, v == 2 ? 3e3f : 1e-2f), *buf = randn(n, 0, 1e-2f);
        void *copy = malloc(es * n), *got = malloc(es * n), *gcopy = NULL;
        float *gp = up(e->gpu, RN_F32, p, n), *gg = up(e->gpu, RN_F32, g, n), *gbuf = up(e->gpu, RN_F32, buf, n);
        CHECK_OK(rn_backend_alloc(e->gpu, es * n, &gcopy));
        CHECK_OK(rn_lars_update_copy(e->cpu, &d, n, p, g, buf, copy));
        CHECK_OK(rn_lars_update_copy(e->gpu, &gd, n, gp, gg, gbuf, gcopy));
        rn_backend_free(e->gpu, lr_d), rn_backend_free(e->gpu, skip_d);
        float *hp = down(e->gpu, RN_F32, gp, n), *hb = down(e->gpu, RN_F32, gbuf, n);
        CHECK_OK(rn_backend_download(e->gpu, got, gcopy, es * n));
        int64_t diff = 0, first = -1;
        for (int64_t i = 0; i < n; i++)
            if (hp[i] != p[i] || hb[i] != buf[i]) {
                if (first < 0) first = i;
                diff++;
            }
        CHECK(diff == 0 && memcmp(got, copy, es * n) == 0,
              "lars variant %d (%s copy): %lld of %lld p/buf values differ from the CPU's (first at %lld: p %.9g vs "
              "%.9g), copy %s", v, rn_dtype_name(dtypes[v]), (long long)diff, (long long)n, (long long)first,
              first >= 0 ? hp[first] : 0.0, first >= 0 ? p[first] : 0.0,
              memcmp(got, copy, es * n) ? "differs" : "equal");
        rn_backend_free(e->gpu, gp), rn_backend_free(e->gpu, gg), rn_backend_free(e->gpu, gbuf);
        rn_backend_free(e->gpu, gcopy);
        free(p), free(g), free(buf), free(copy), free(got), free(hp), free(hb);
    }
}

/* rn_sumsq (--clip-grad-norm) in the CPU's order: the same double bit for bit */
static void test_sumsq(env *e, int64_t n) {
    float *x = randn(n, 0, 3.0f), *gx = up(e->gpu, RN_F32, x, n);
    double want = -1, got = -2, *gs = NULL;
    CHECK_OK(rn_backend_reserve(e->cpu, rn_sumsq_workspace(e->cpu, n)));
    CHECK_OK(rn_backend_reserve(e->gpu, rn_sumsq_workspace(e->gpu, n)));
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof(double), (void **)&gs));
    CHECK_OK(rn_sumsq(e->cpu, n, x, &want));
    CHECK_OK(rn_sumsq(e->gpu, n, gx, gs));
    CHECK_OK(rn_backend_download(e->gpu, &got, gs, sizeof got));
    CHECK(memcmp(&got, &want, sizeof got) == 0, "sumsq of %lld: GPU %.17g, CPU %.17g", (long long)n, got, want);
    rn_backend_free(e->gpu, gx), rn_backend_free(e->gpu, gs);
    free(x);
}

/* Every conversion, plain and accumulating, bit for bit (values past the fp16 range
 * included: both sides must make them inf) */
static void test_cast(env *e, int64_t n) {
    const int dtypes[] = {RN_F32, RN_F16, RN_BF16};
    float *x = randn(n, 0, 3e4f), *y0 = randn(n, 0, 3e4f);
    for (int si = 0; si < 3; si++)
        for (int di = 0; di < 3; di++)
            for (int acc = 0; acc < 2; acc++) {
                int src = dtypes[si], dst = dtypes[di];
                size_t ss = rn_dtype_size(src), ds = rn_dtype_size(dst);
                /* the inputs in their own types, made by the CPU's conversion */
                void *hx = malloc(ss * n), *hy = malloc(ds * n), *got = malloc(ds * n);
                CHECK_OK(rn_cast(e->cpu, RN_F32, src, n, x, hx, 0));
                CHECK_OK(rn_cast(e->cpu, RN_F32, dst, n, y0, hy, 0));
                void *gx = NULL, *gy = NULL;
                CHECK_OK(rn_backend_alloc(e->gpu, ss * n, &gx));
                CHECK_OK(rn_backend_alloc(e->gpu, ds * n, &gy));
                CHECK_OK(rn_backend_upload(e->gpu, gx, hx, ss * n));
                CHECK_OK(rn_backend_upload(e->gpu, gy, hy, ds * n));
                CHECK_OK(rn_cast(e->cpu, src, dst, n, hx, hy, acc));
                CHECK_OK(rn_cast(e->gpu, src, dst, n, gx, gy, acc));
                CHECK_OK(rn_backend_download(e->gpu, got, gy, ds * n));
                int64_t bad = 0, first = -1;
                for (int64_t i = 0; i < n; i++)
                    if (memcmp((char *)got + i * ds, (char *)hy + i * ds, ds)) {
                        if (first < 0) first = i;
                        bad++;
                    }
                CHECK(bad == 0, "cast %s -> %s%s: %lld of %lld differ from the CPU's, first at %lld",
                      rn_dtype_name(src), rn_dtype_name(dst), acc ? " accumulate" : "", (long long)bad,
                      (long long)n, (long long)first);
                rn_backend_free(e->gpu, gx), rn_backend_free(e->gpu, gy);
                free(hx), free(hy), free(got);
            }
    free(x), free(y0);
}

/* The overflow check: nothing found in finite values, one inf or NaN anywhere found */
static void test_nonfinite(env *e, int64_t n) {
    float *x = randn(n, 0, 1e30f);
    const int64_t at[] = {-1, 0, n / 2 + 1, n - 1};
    const float bad[] = {0, NAN, INFINITY, -INFINITY};
    int32_t *gflag = NULL;
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof(int32_t), (void **)&gflag));
    for (int k = 0; k < 4; k++) {
        float keep = at[k] >= 0 ? x[at[k]] : 0;
        if (at[k] >= 0) x[at[k]] = bad[k];
        float *gx = up(e->gpu, RN_F32, x, n);
        int32_t cflag = 0, flag = 7;
        CHECK_OK(rn_backend_zero(e->gpu, gflag, sizeof(int32_t)));
        CHECK_OK(rn_nonfinite(e->cpu, n, x, &cflag));
        CHECK_OK(rn_nonfinite(e->gpu, n, gx, gflag));
        CHECK_OK(rn_backend_download(e->gpu, &flag, gflag, sizeof(int32_t)));
        CHECK(flag == cflag && flag == (at[k] >= 0), "nonfinite with %g at %lld: gpu flag %d, cpu %d", bad[k],
              (long long)at[k], flag, cflag);
        if (at[k] >= 0) x[at[k]] = keep;
        rn_backend_free(e->gpu, gx);
    }
    rn_backend_free(e->gpu, gflag);
    free(x);
}

/* BN forward (training) and backward with ReLU on activations one element past a 16-byte
 * boundary, c a multiple of 8: the 16-byte loads must not apply (a misaligned vector load
 * faults), the scalar sums and the separate ReLU-mask pass run instead, and the results
 * must equal the CPU's */
static void test_bn_unaligned(env *e, int64_t m, int c) {
    rn_bn_desc d, dg;
    CHECK_OK(rn_bn_desc_init(&d, m, c, 1));
    dg = d;
    dg.dtype = e->dtype;
    const int64_t n = m * c;
    const size_t es = rn_dtype_size(e->dtype);
    float *x = randn(n + 1, 0.5f, 2), *dy = randn(n + 1, 0, 1), *gamma = randn(c, 1, 0.3f), *beta = randn(c, 0, 0.3f);
    float *rm = randn(c, 0, 0.1f), *rv = randn(c, 1, 0.1f), *dg0 = randn(c, 0, 1), *db0 = randn(c, 0, 1);
    for (int j = 0; j < c; j++) rv[j] = fabsf(rv[j]) + 0.1f;
    round_all(e->dtype, x, n + 1), round_all(e->dtype, dy, n + 1);
    reserve_both(e, rn_bn_workspace(e->cpu, &d), rn_bn_workspace(e->gpu, &dg));
    size_t rs = rn_bn_reserve_size(e->gpu, &dg);
    void *reserve = NULL;
    if (rs) CHECK_OK(rn_backend_alloc(e->gpu, rs, &reserve));
    char what[160], t[220];
    snprintf(what, sizeof what, "%sbn m=%lld c=%d relu, one element past 16-byte alignment", variant, (long long)m, c);
    /* the CPU on the same elements (x + 1, dy + 1) */
    float *y = malloc(sizeof(float) * n), *sm = malloc(sizeof(float) * c), *si = malloc(sizeof(float) * c);
    float *crm = copyf(rm, c), *crv = copyf(rv, c), *dx = malloc(sizeof(float) * n);
    float *dgam = copyf(dg0, c), *dbet = copyf(db0, c);
    CHECK_OK(rn_bn_fwd_train(e->cpu, &d, x + 1, gamma, beta, NULL, y, sm, si, crm, crv, NULL));
    char *gx = up(e->gpu, e->dtype, x, n + 1), *gy = up(e->gpu, e->dtype, x, n + 1);
    char *gdy = up(e->gpu, e->dtype, dy, n + 1), *gdx = up(e->gpu, e->dtype, dy, n + 1);
    float *ggam = up(e->gpu, RN_F32, gamma, c), *gbet = up(e->gpu, RN_F32, beta, c);
    float *grm = up(e->gpu, RN_F32, rm, c), *grv = up(e->gpu, RN_F32, rv, c);
    float *gsm = up(e->gpu, RN_F32, sm, c), *gsi = up(e->gpu, RN_F32, si, c);
    float *gdg = up(e->gpu, RN_F32, dg0, c), *gdb = up(e->gpu, RN_F32, db0, c);
    CHECK_OK(rn_bn_fwd_train(e->gpu, &dg, gx + es, ggam, gbet, NULL, gy + es, gsm, gsi, grm, grv, reserve));
    snprintf(t, sizeof t, "%s fwd_train y", what);
    cmp_dev(e, t, gy + es, e->dtype, y, n);
    snprintf(t, sizeof t, "%s save_mean", what);
    cmp_dev(e, t, gsm, RN_F32, sm, c);
    snprintf(t, sizeof t, "%s save_invstd", what);
    cmp_dev(e, t, gsi, RN_F32, si, c);
    /* the CPU's backward through the GPU's y: the same ReLU decisions on both sides */
    float *yg = down(e->gpu, e->dtype, gy + es, n);
    CHECK_OK(rn_bn_bwd(e->cpu, &d, x + 1, yg, dy + 1, gamma, sm, si, dx, dgam, dbet, NULL, NULL, 1));
    CHECK_OK(rn_bn_bwd(e->gpu, &dg, gx + es, gy + es, gdy + es, ggam, gsm, gsi, gdx + es, gdg, gdb, NULL, reserve, 1));
    cmp_bn_grads(e, what, "bwd", gdx + es, dx, gdg, dgam, gdb, dbet, NULL, NULL, n, c);
    void *bufs[] = {gx, gy, gdy, gdx, ggam, gbet, grm, grv, gsm, gsi, gdg, gdb, reserve};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) rn_backend_free(e->gpu, bufs[i]);
    free(x), free(dy), free(gamma), free(beta), free(rm), free(rv), free(dg0), free(db0), free(y), free(sm);
    free(si), free(crm), free(crv), free(dx), free(dgam), free(dbet), free(yg);
}

static void run_bn(env *e) {
    for (int relu = 0; relu < 2; relu++)
        for (int res = 0; res < 2; res++) test_bn(e, 70, 13, relu, res, 0);
    test_bn(e, 70, 13, 1, 0, 1);
    test_bn(e, 256, 64, 1, 1, 1);
    test_bn(e, 32 * 16 * 16, 40, 1, 1, 0);
    test_bn(e, 32 * 8 * 8, 64, 1, 1, 0);
    test_bn(e, 8 * 7 * 7, 256, 0, 0, 1);
    test_bn(e, 8 * 7 * 7, 256, 0, 0, 0); /* (a BN without ReLU, as the downsample's, y apart) */
    test_bn(e, 300, 264, 1, 1, 0); /* 16-byte loads: a last tile of one lane (half) */
    test_bn(e, 130, 8, 1, 0, 0);   /* one lane across the row (half), two (float) */
    test_bn_unaligned(e, 300, 64);
    if (!strstr(variant, "RN_CUDA_BN=cudnn")) test_nonfinite_bn(e, 64, 8); /* (ours: PyTorch's NaN rules) */
}

/* Host staging as rn-train uses it: batches in pinned host memory, copied on the copy
 * stream into two device buffers in turn while ops read the other, each normalised on
 * the compute stream right after its rn_backend_upload_async. Every output must equal
 * the CPU's normalise of its own batch (a copy overtaking or racing an op shows up as
 * another batch's pixels). Each batch's labels go with its pixels as a second part
 * (rn_backend_upload_parts_async, as rn_runner_stage sends them) and are read by a top-1
 * count whose result is the round's own (r + 1 hits). Also rn_backend_mem_info's
 * figures. */
/* round r's pixels */
static void staged_pattern(uint8_t *h, size_t bytes, int r) {
    for (size_t i = 0; i < bytes; i++) h[i] = (uint8_t)((i * 2654435761u + (uint64_t)r * 977 + seed) >> 5);
}

static void test_staging(env *e) {
    size_t fr = 0, tot = 0;
    CHECK_OK(rn_backend_mem_info(e->gpu, &fr, &tot));
    CHECK(fr > 0 && tot >= fr, "mem_info: %zu free of %zu", fr, tot);
    enum { ROUNDS = 6 };
    const int64_t m = 64 * 64 * 32; /* 32 images of 64x64 */
    const size_t bytes = (size_t)m * 3;
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    uint8_t *host[2] = {NULL, NULL}, *dev[2] = {NULL, NULL};
    int32_t *hlab[2] = {NULL, NULL}, *ghits = NULL;
    const size_t lab_off = (bytes + 15) & ~(size_t)15;
    enum { NL = 32 }; /* labels per batch; logits row i's largest is class i */
    float *logits = calloc(NL * NL, sizeof(float)), *glogits = NULL;
    for (int i = 0; i < NL; i++) logits[i * NL + i] = 1;
    void *out[ROUNDS] = {NULL};
    float *want = malloc(sizeof(float) * (size_t)m * 3);
    void *gbig = NULL, *gbig_y = NULL;
    for (int i = 0; i < 2; i++) {
        CHECK_OK(rn_backend_host_alloc(e->gpu, bytes, (void **)&host[i]));
        CHECK_OK(rn_backend_host_alloc(e->gpu, sizeof(int32_t) * NL, (void **)&hlab[i]));
        CHECK_OK(rn_backend_alloc(e->gpu, lab_off + sizeof(int32_t) * NL, (void **)&dev[i]));
    }
    glogits = up(e->gpu, RN_F32, logits, NL * NL);
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof(int32_t) * ROUNDS, (void **)&ghits));
    /* a long op before each copy, so that copies run while the compute stream is busy */
    const int64_t mbig = (int64_t)1 << 22;
    CHECK_OK(rn_backend_alloc(e->gpu, (size_t)mbig * 3, &gbig));
    CHECK_OK(rn_backend_alloc(e->gpu, sizeof(float) * (size_t)mbig * 3, &gbig_y));
    CHECK_OK(rn_backend_zero(e->gpu, gbig, (size_t)mbig * 3));
    /* every buffer before the loop: an allocation inside it (cudaMalloc synchronises the
       device) would serialise the streams and hide a race */
    int have_out = 1;
    for (int r = 0; r < ROUNDS; r++) {
        CHECK_OK(rn_backend_alloc(e->gpu, sizeof(float) * (size_t)m * 3, &out[r]));
        have_out &= out[r] != NULL;
    }
    CHECK_OK(rn_backend_sync(e->gpu));
    have_out &= hlab[0] && hlab[1] && ghits && glogits;
    for (int r = 0; r < ROUNDS && have_out && host[0] && host[1] && dev[0] && dev[1] && gbig && gbig_y; r++) {
        uint8_t *h = host[r % 2];
        int32_t *l = hlab[r % 2];
        staged_pattern(h, bytes, r);
        for (int i = 0; i < NL; i++) l[i] = i <= r ? i : (i + 1) % NL; /* r + 1 rows hit */
        CHECK_OK(rn_input_normalize(e->gpu, RN_F32, mbig, 3, gbig, mean, std, gbig_y));
        rn_upload_part parts[2] = {{dev[r % 2], h, bytes}, {dev[r % 2] + lab_off, l, sizeof(int32_t) * NL}};
        CHECK_OK(rn_backend_upload_parts_async(e->gpu, parts, 2));
        CHECK_OK(rn_input_normalize(e->gpu, RN_F32, m, 3, dev[r % 2], mean, std, out[r]));
        CHECK_OK(rn_top1_count(e->gpu, NL, NL, glogits, (const int32_t *)(dev[r % 2] + lab_off), RN_TOP1_LABEL,
                               ghits + r));
        CHECK_OK(rn_backend_upload_wait(e->gpu)); /* h and l may be refilled two rounds on */
    }
    int32_t hits[ROUNDS] = {0};
    if (have_out) CHECK_OK(rn_backend_download(e->gpu, hits, ghits, sizeof hits));
    for (int r = 0; r < ROUNDS && have_out; r++)
        CHECK(hits[r] == r + 1, "staged labels of batch %d: %d hits, want %d (another batch's labels?)", r, hits[r],
              r + 1);
    for (int r = 0; r < ROUNDS && have_out; r++) {
        uint8_t *h = malloc(bytes);
        staged_pattern(h, bytes, r);
        CHECK_OK(rn_input_normalize(e->cpu, RN_F32, m, 3, h, mean, std, want));
        char what[48];
        snprintf(what, sizeof what, "staged batch %d", r);
        cmp_dev(e, what, out[r], RN_F32, want, m * 3);
        free(h);
    }
    for (int r = 0; r < ROUNDS; r++) rn_backend_free(e->gpu, out[r]);
    for (int i = 0; i < 2; i++) {
        rn_backend_host_free(e->gpu, host[i]);
        rn_backend_host_free(e->gpu, hlab[i]);
        rn_backend_free(e->gpu, dev[i]);
    }
    rn_backend_free(e->gpu, gbig), rn_backend_free(e->gpu, gbig_y);
    rn_backend_free(e->gpu, glogits), rn_backend_free(e->gpu, ghits);
    free(want), free(logits);
}

/* A shape first met while a reservation is held (a short last batch): its algorithms are
 * chosen within the reservation, and it computes what the CPU does. */
static void test_conv_reserved(env *e, int c, int k, int ks, int stride, int pad) {
    rn_conv_desc a, b, bg;
    CHECK_OK(rn_conv_desc_init(&a, 8, 14, 14, c, k, ks, ks, stride, pad));
    CHECK_OK(rn_conv_desc_init(&b, 5, 14, 14, c, k, ks, ks, stride, pad));
    a.dtype = e->dtype;
    bg = b;
    bg.dtype = e->dtype;
    rn_backend_unreserve(e->gpu);
    CHECK_OK(rn_backend_reserve(e->gpu, rn_conv_workspace(e->gpu, &a)));
    size_t held = rn_backend_reserved(e->gpu), need = rn_conv_workspace(e->gpu, &bg);
    CHECK(need <= held, "a new shape under a reservation of %zu bytes chose algorithms needing %zu", held, need);
    int64_t nx = (int64_t)5 * 14 * 14 * c, nw = (int64_t)k * ks * ks * c, ny = (int64_t)5 * b.p * b.q * k;
    float *x = randn(nx, 0, 1), *wt = randn(nw, 0, 0.5f), *y = malloc(sizeof(float) * ny);
    round_all(e->dtype, x, nx), round_all(e->dtype, wt, nw);
    CHECK_OK(rn_backend_reserve(e->cpu, rn_conv_workspace(e->cpu, &b)));
    CHECK_OK(rn_conv_fwd(e->cpu, &b, x, wt, y));
    void *gx = up(e->gpu, e->dtype, x, nx), *gw = up(e->gpu, e->dtype, wt, nw), *gy = up(e->gpu, e->dtype, y, ny);
    CHECK_OK(rn_conv_fwd(e->gpu, &bg, gx, gw, gy));
    cmp_conv(e, "conv first met under a reservation, fwd", &bg, RN_CONV_FWD, gy, y, ny);
    rn_backend_free(e->gpu, gx), rn_backend_free(e->gpu, gw), rn_backend_free(e->gpu, gy);
    free(x), free(wt), free(y);
}

/* the convolutions again in another algorithm mode of the context */
static void run_conv_mode(env *e) {
    test_conv(e, 2, 9, 7, 8, 16, 3, 1, 1);
    test_conv(e, 4, 14, 14, 32, 64, 3, 2, 1);
    test_conv(e, 8, 7, 7, 64, 256, 1, 1, 0);
    test_conv(e, 2, 16, 16, 3, 64, 7, 2, 3);
}

static void run_all(env *e) {
    int half = e->dtype != RN_F32;
    if (!half) {
        test_conv(e, 2, 9, 7, 5, 6, 3, 1, 1);
        test_conv(e, 3, 11, 11, 3, 8, 7, 2, 3);
        test_conv(e, 2, 8, 8, 4, 6, 1, 2, 0);
    }
    /* half precision: channel counts that tensor-core algorithms take */
    test_conv(e, 2, 9, 7, 8, 16, 3, 1, 1);
    test_conv(e, 2, 8, 8, 16, 32, 1, 2, 0);
    test_conv(e, 4, 14, 14, 32, 64, 3, 2, 1);
    test_conv(e, 8, 7, 7, 64, 256, 1, 1, 0);
    /* the ResNet stem as rn-train --amp runs it: 3 input channels in half precision too
       (there padded to 4 unless RN_CUDA_STEM=plain) */
    test_conv(e, 2, 16, 16, 3, 64, 7, 2, 3);
    test_conv_reserved(e, 32, 64, 3, 1, 1);
    test_conv_reserved(e, 3, 64, 7, 2, 3); /* the stem: its padded copies within the reservation too */
    run_bn(e);
    test_elementwise(e, 3 * 1000 + 3); /* one element per step (n not a multiple of 8) */
    test_elementwise(e, 4096);         /* 16 bytes per step */
    test_add_unaligned(e, 4096);
    test_maxpool(e, 2, 9, 9, 8);
    test_maxpool(e, 2, 16, 16, 64);
    test_maxpool(e, 1, 8, 7, 3);
    test_gap(e, 3, 49, 40);
    test_fc(e, 5, 64, 10);
    test_fc(e, 32, 2048, 1000);
    test_xent(e, 7, 10, 0, 1, 0, 0);
    test_xent(e, 32, 1000, 0.1f, 0.5f, 0, 0);
    test_xent(e, 7, 10, 0, 1, 0.37, 0);
    test_xent(e, 32, 1000, 0.1f, 0.5f, 0.81, 0);
    test_xent(e, 7, 10, 0, 1, 0, 1); /* NaN and inf (ours: PyTorch's rules) */
    test_xent_bad_label(e, 2);
    test_xent_bad_label(e, 4);
    test_top1(e, 7, 10);
    test_top1(e, 1, 1);
    test_top1(e, 256, 1000);
    test_input_mix(e, 3, 9, 7);
    if (!half) {
        test_sgd(e, 100003);
        test_put(e);
        test_update_graphs(e, 100003);
        test_sgd_copy(e, 100003);
        test_lars(e, 100003);
        test_sumsq(e, 100003);
        test_sumsq(e, 7);
        test_cast(e, 100003);
        test_nonfinite(e, 100003);
        test_ema(e, 100003);
    }
}

/* cuDNN 9 statuses by category, as the backend reads them (no GPU needed): every
 * not-supported detail gives way to another path, allocation failures let Find give way
 * to the heuristic, a bad parameter never hides */
static void test_status_classes(void) {
#ifdef RN_HAVE_CUDA
    static const struct { cudnnStatus_t s; int want, falls_back; } t[] = {
        {CUDNN_STATUS_SUCCESS, RN_DNN_OK, 0},
        {CUDNN_STATUS_NOT_SUPPORTED, RN_DNN_UNSUPPORTED, 1},
        {CUDNN_STATUS_NOT_SUPPORTED_SHAPE, RN_DNN_UNSUPPORTED, 1},
        {CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, RN_DNN_UNSUPPORTED, 1},
        {CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, RN_DNN_UNSUPPORTED, 1},
        {CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, RN_DNN_RESOURCES, 1},
        {CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, RN_DNN_RESOURCES, 1},
        {CUDNN_STATUS_ALLOC_FAILED, RN_DNN_RESOURCES, 1},
        {CUDNN_STATUS_EXECUTION_FAILED_CUDART, RN_DNN_RESOURCES, 1},
        {CUDNN_STATUS_EXECUTION_FAILED, RN_DNN_FATAL, 0},
        {CUDNN_STATUS_INTERNAL_ERROR, RN_DNN_FATAL, 0},
        {CUDNN_STATUS_BAD_PARAM, RN_DNN_FATAL, 0},
        {CUDNN_STATUS_BAD_PARAM_NULL_POINTER, RN_DNN_FATAL, 0},
        {CUDNN_STATUS_NOT_INITIALIZED, RN_DNN_FATAL, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        CHECK(rn_dnn_status_class(t[i].s) == t[i].want, "cuDNN status %d: class %d, want %d", (int)t[i].s,
              rn_dnn_status_class(t[i].s), t[i].want);
        CHECK(rn_dnn_find_falls_back(t[i].s) == t[i].falls_back, "cuDNN status %d: Find falls back %d", (int)t[i].s,
              rn_dnn_find_falls_back(t[i].s));
    }
#endif
}

/* ResNet-50's training sizes at batch 256, so that grid-stride loops iterate, BN's
 * chunking reaches its cap and backward-filter meets split-K algorithms (beta 1 on the
 * accumulate pass). Only on a GPU: the CPU reference of these takes minutes on two
 * cores. RN_TEST_REAL_SIZES=0 leaves them out. */
static void run_real_sizes(env *e) {
    const int64_t n = 256;
    test_bn(e, n * 112 * 112, 64, 1, 0, 0);
    test_bn(e, n * 56 * 56, 256, 1, 1, 0);
    test_bn(e, n * 7 * 7, 2048, 1, 1, 1);
    test_elementwise(e, n * 56 * 56 * 256);
    test_maxpool(e, (int)n, 112, 112, 64);
    test_xent(e, (int)n, 1000, 0.1f, 1024.0f, 0, 0);
    test_conv(e, (int)n, 56, 56, 64, 64, 3, 1, 1);
    test_conv(e, (int)n, 7, 7, 2048, 512, 1, 1, 0);
    test_conv(e, 8, 224, 224, 3, 64, 7, 2, 3); /* the stem at full size (8 images: the CPU's share) */
    test_gap(e, (int)n, 49, 2048);
    test_fc(e, (int)n, 2048, 1000);
}

/* cuBLAS is opened at run time, not linked: the library and every call the backend makes
 * are found (no GPU needed), so a misspelt name cannot wait for a GPU machine to show */
static void test_blas_open(void) {
#ifdef RN_HAVE_CUDA
    CHECK_OK(rn_backend_cuda_blas_open());
#endif
}

int main(void) {
    test_status_classes();
    test_blas_open();
    const char *s = getenv("RN_TEST_SEED");
    if (s && *s) seed = strtoull(s, NULL, 10);
    /* RN_TEST_DEVICE=cpu runs the harness itself CPU against CPU (fp32 only): a check of
     * the test on machines without a GPU */
    const char *dev = getenv("RN_TEST_DEVICE");
    if (!dev || !*dev) dev = "cuda";
    env e = {0};
    /* RN_SYNC, RN_CUDA_CONV_ALGO, ... as the tools take them (gpu-check sets some) */
    rn_backend_opts bo;
    rn_backend_opts_init(&bo);
    int rc = rn_cli_backend_env(&bo);
    bo.cuda_algo_cache[0] = 0; /* every choice searched here, none taken from earlier runs */
    if (rc == RN_OK) rc = rn_backend_create(dev, 0, &bo, &e.gpu);
    if (rc != RN_OK) {
        /* any failure to open a GPU (no CUDA in this build, no driver, no device, a driver
         * too old) means: skip, saying why */
        printf("test_cuda_ops: SKIP (the CUDA ops were not tested; %d checks of cuDNN status classes and cuBLAS "
               "calls passed): %s\n",
               check_passed, rn_last_error());
        return check_failed ? check_done("test_cuda_ops") : 0;
    }
    CHECK_OK(rn_backend_create("cpu", 0, NULL, &e.cpu));
    fprintf(stderr, "test_cuda_ops: %s against %s, seed %llu\n", rn_backend_name(e.gpu), rn_backend_name(e.cpu),
            (unsigned long long)seed);
    {
        int before = check_failed;
        test_staging(&e);
        fprintf(stderr, "test_cuda_ops: pinned staging, async copies: %s\n",
                check_failed == before ? "every batch arrived intact" : "MISMATCHES above");
    }
    const int dtypes[] = {RN_F32, RN_F16, RN_BF16};
    int ndt = rn_backend_is_host(e.gpu) ? 1 : 3;
    for (int i = 0; i < ndt; i++) {
        int before = check_failed;
        e.dtype = dtypes[i];
        run_all(&e);
        fprintf(stderr, "test_cuda_ops: %s: %s\n", rn_dtype_name(e.dtype),
                check_failed == before ? "all ops match the CPU" : "MISMATCHES above");
    }
    const char *rs = getenv("RN_TEST_REAL_SIZES");
    for (int i = 0; ndt == 3 && !(rs && strcmp(rs, "0") == 0) && i < 2; i++) {
        int before = check_failed;
        e.dtype = i == 0 ? RN_F16 : RN_F32;
        run_real_sizes(&e);
        fprintf(stderr, "test_cuda_ops: %s at ResNet-50 batch-256 sizes: %s\n", rn_dtype_name(e.dtype),
                check_failed == before ? "all ops match the CPU" : "MISMATCHES above");
    }
    rn_backend_destroy(e.gpu);
    e.gpu = NULL;
    /* the convolutions in the context's other modes: TF32 on (fp32), cuDNN's heuristic
       instead of Find, deterministic algorithms only, and the half-precision stem on its
       3 channels instead of padded to 4 */
    static const char *modes[] = {"RN_CUDA_TF32=1 ", "RN_CUDA_CONV_ALGO=heuristic ", "RN_CUDA_DETERMINISTIC=1 ",
                                  "RN_CUDA_STEM=plain "};
    for (int m = 0; ndt == 3 && m < 4; m++) {
        rn_backend_opts mo = bo;
        mo.cuda_tf32 = m == 0;
        mo.cuda_conv_heuristic = m == 1 || m == 2;
        mo.cuda_deterministic = m == 2;
        mo.cuda_stem_plain = m == 3;
        mo.cuda_algo_cache[0] = 0;
        if (rn_backend_create(dev, 0, &mo, &e.gpu) != RN_OK) {
            CHECK(0, "%scontext: %s", modes[m], rn_last_error());
            continue;
        }
        variant = modes[m];
        tf32_on = m == 0;
        for (int i = m == 3 ? 1 : 0; i < (m == 0 ? 1 : 3); i++) {
            int before = check_failed;
            e.dtype = dtypes[i];
            run_conv_mode(&e);
            if (m == 0 && e.dtype == RN_F32) test_fc(&e, 32, 2048, 1000); /* cuBLAS in TF32 */
            fprintf(stderr, "test_cuda_ops: %s convolutions with %s: %s\n", rn_dtype_name(e.dtype), modes[m],
                    check_failed == before ? "match the CPU" : "MISMATCHES above");
        }
        tf32_on = 0;
        rn_backend_destroy(e.gpu);
        e.gpu = NULL;
    }
    variant = "";
    /* BN training forward and backward again through cuDNN's fused variant (RN_CUDA_BN=cudnn) */
    bo.cuda_bn_cudnn = 1;
    if (ndt == 3) CHECK_OK(rn_backend_create(dev, 0, &bo, &e.gpu));
    variant = "RN_CUDA_BN=cudnn ";
    for (int i = 0; e.gpu && i < 3; i++) {
        int before = check_failed;
        e.dtype = dtypes[i];
        dnn_bwd_could = dnn_bwd_did = 0;
        run_bn(&e);
        fprintf(stderr, "test_cuda_ops: %s BN with RN_CUDA_BN=cudnn: %s", rn_dtype_name(e.dtype),
                check_failed == before ? "matches the CPU" : "MISMATCHES above");
        if (dnn_bwd_could) fprintf(stderr, "; cuDNN ran %d of %d backwards it could", dnn_bwd_did, dnn_bwd_could);
        fputc('\n', stderr);
        /* (a case cuDNN refuses runs ours, rightly; none taken would test nothing of its own) */
        CHECK(!dnn_bwd_could || dnn_bwd_did > 0, "RN_CUDA_BN=cudnn %s: cuDNN's BN backward ran in none of %d cases",
              rn_dtype_name(e.dtype), dnn_bwd_could);
    }
    rn_backend_destroy(e.gpu);
    rn_backend_destroy(e.cpu);
    return check_done("test_cuda_ops");
}
