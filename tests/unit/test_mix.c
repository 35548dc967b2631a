/* Mixup and cutmix (rn/mix.h): Beta(alpha, alpha) from Philox against the exact CDF (KS on
 * 100,000 draws), the batch-level choices of torchvision's reference (probabilities, the
 * cutmix box and its lambda), their keying, and rn_input_mix on the CPU against direct
 * loops, with and without each image's erase box applied before the mixing. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/augment.h"
#include "rn/backend.h"
#include "rn/err.h"
#include "rn/mix.h"
#include "rn/rng.h"
#include "rn/tensor.h"

#define SEED 20261203u
#define DRAWS 100000
/* Kolmogorov's distribution: P(sqrt(n) D > 1.9495) = 0.001 */
#define KS_CRIT_001 1.9495

/* continued fraction of the incomplete beta function (Lentz) */
static double betacf(double a, double b, double x) {
    const double tiny = 1e-300;
    double qab = a + b, qap = a + 1, qam = a - 1, c = 1, d = 1 - qab * x / qap;
    if (fabs(d) < tiny) d = tiny;
    d = 1 / d;
    double h = d;
    for (int m = 1; m <= 10000; m++) {
        int m2 = 2 * m;
        double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1 + aa * d;
        if (fabs(d) < tiny) d = tiny;
        c = 1 + aa / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        h *= d * c;
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1 + aa * d;
        if (fabs(d) < tiny) d = tiny;
        c = 1 + aa / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-15) break;
    }
    return h;
}

/* the exact CDF of Beta(a, b): the regularised incomplete beta function I_x(a, b) */
static double beta_cdf(double x, double a, double b) {
    if (x <= 0) return 0;
    if (x >= 1) return 1;
    double bt = exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * log(x) + b * log1p(-x));
    if (x < (a + 1) / (a + b + 2)) return bt * betacf(a, b, x) / a;
    return 1 - bt * betacf(b, a, 1 - x) / b;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Beta(a, a) CDF at the lower (side -1) or upper (+1) edge of the values that round to the
 * double v: near 1 a double is 1.1e-16 wide, and Beta(0.1, 0.1) puts 1.3% of its mass above
 * 1 - 1e-16, so draws tie at the last doubles below 1 and at 1 itself; the KS comparison of
 * a run of ties is then with the edges of its rounding interval. Above 0.5 by symmetry,
 * F(x) = 1 - I_{1-x}(a, a), with 1 - v exact. */
static double edge_cdf(double v, int side, double a) {
    double half = (nextafter(v, 2.0) - v) / 2;
    if (v < 0.5) return beta_cdf(v + side * half, a, a);
    return 1 - beta_cdf((1 - v) - side * half, a, a);
}

/* sqrt(n) times the KS distance of sorted xs from Beta(a, a), ties taken run by run */
static double ks_stat(const double *xs, int n, double a) {
    double dmax = 0;
    for (int i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && xs[j] == xs[i]; j++) {
        }
        double d1 = fabs(edge_cdf(xs[i], -1, a) - (double)i / n), d2 = fabs((double)j / n - edge_cdf(xs[i], 1, a));
        if (d1 > dmax) dmax = d1;
        if (d2 > dmax) dmax = d2;
    }
    return dmax * sqrt((double)n);
}

static void test_beta(void) {
    /* the exact CDF itself, where it has a closed form: Beta(1,1) = x, Beta(2,2) = 3x^2 - 2x^3, symmetry at 0.5 */
    CHECK(fabs(beta_cdf(0.3, 1, 1) - 0.3) < 1e-12, "I_0.3(1,1) = %.15g", beta_cdf(0.3, 1, 1));
    CHECK(fabs(beta_cdf(0.3, 2, 2) - (3 * 0.09 - 2 * 0.027)) < 1e-12, "I_0.3(2,2) = %.15g", beta_cdf(0.3, 2, 2));
    CHECK(fabs(beta_cdf(0.5, 0.1, 0.1) - 0.5) < 1e-12, "I_0.5(0.1,0.1) = %.15g", beta_cdf(0.5, 0.1, 0.1));
    const double alphas[] = {0.1, 0.2, 0.8, 1.0, 2.0, 5.0};
    double *xs = malloc(sizeof(double) * DRAWS);
    for (size_t t = 0; t < sizeof alphas / sizeof *alphas; t++) {
        double a = alphas[t];
        uint64_t key = rn_rng_key(SEED, 100 + t);
        int bad = 0;
        for (int i = 0; i < DRAWS; i++) {
            xs[i] = rn_mix_beta(key, 7, (uint64_t)i, a);
            if (!(xs[i] >= 0 && xs[i] <= 1)) bad++;
        }
        CHECK(bad == 0, "Beta(%g, %g): %d draws outside [0, 1]", a, a, bad);
        CHECK(rn_mix_beta(key, 7, 12345, a) == xs[12345], "Beta(%g): the same counters gave another value", a);
        qsort(xs, DRAWS, sizeof *xs, cmp_d);
        double ks = ks_stat(xs, DRAWS, a);
        CHECK(ks < KS_CRIT_001, "Beta(%g, %g): KS sqrt(n)*D = %.3f >= %.3f (p < 0.001) over %d draws", a, a, ks,
              KS_CRIT_001, DRAWS);
        /* the test can fail: the same draws against a Beta 15% wider in alpha are rejected */
        double wrong = ks_stat(xs, DRAWS, a * 1.15);
        CHECK(wrong > KS_CRIT_001, "Beta(%g) draws not told apart from Beta(%g): KS %.3f", a, a * 1.15, wrong);
        if (getenv("MIX_VERBOSE")) printf("Beta(%g, %g): KS %.3f (vs Beta(%g): %.3f)\n", a, a, ks, a * 1.15, wrong);
    }
    free(xs);
}

static void test_draw(void) {
    rn_mix_opts o = {.mixup = 0.2, .cutmix = 1.0, .prob = 1, .switch_prob = 0.5};
    rn_mix_desc d, e;
    const int N = 20000, H = 37, W = 53;
    int kinds[3] = {0, 0, 0}, box_bad = 0, lam_bad = 0;
    for (int i = 0; i < N; i++) {
        rn_mix_draw(&o, SEED, i / 4, i % 4, H, W, &d);
        kinds[d.kind]++;
        if (d.kind == RN_MIX_CUTMIX) {
            if (!(0 <= d.y0 && d.y0 <= d.y1 && d.y1 <= H && 0 <= d.x0 && d.x0 <= d.x1 && d.x1 <= W)) box_bad++;
            if (d.lambda != 1.0 - (double)(d.x1 - d.x0) * (d.y1 - d.y0) / ((double)W * H)) lam_bad++;
        }
        if (!(d.lambda >= 0 && d.lambda <= 1)) lam_bad++;
    }
    CHECK(kinds[RN_MIX_NONE] == 0, "mix-prob 1: %d micro-batches not mixed", kinds[RN_MIX_NONE]);
    /* switch-prob 0.5: binomial(20000, 0.5), 5 sigma = 354 */
    CHECK(abs(kinds[RN_MIX_CUTMIX] - N / 2) < 354, "switch-prob 0.5: %d cutmix of %d", kinds[RN_MIX_CUTMIX], N);
    CHECK(box_bad == 0, "%d cutmix boxes outside the image", box_bad);
    CHECK(lam_bad == 0, "%d lambdas not the clipped box's", lam_bad);

    /* mix-prob 0.3: binomial(20000, 0.3), 5 sigma = 324 */
    o.prob = 0.3;
    int mixed = 0;
    for (int i = 0; i < N; i++) {
        rn_mix_draw(&o, SEED, i, 0, H, W, &d);
        mixed += d.kind != RN_MIX_NONE;
    }
    CHECK(abs(mixed - 6000) < 324, "mix-prob 0.3: %d of %d mixed", mixed, N);

    /* one kind alone: switch-prob does not matter */
    rn_mix_opts mu = {.mixup = 0.4, .prob = 1, .switch_prob = 1}, cu = {.cutmix = 0.4, .prob = 1, .switch_prob = 0};
    int wrong = 0;
    for (int i = 0; i < 1000; i++) {
        rn_mix_draw(&mu, SEED, i, 1, H, W, &d);
        wrong += d.kind != RN_MIX_MIXUP;
        rn_mix_draw(&cu, SEED, i, 1, H, W, &d);
        wrong += d.kind != RN_MIX_CUTMIX;
    }
    CHECK(wrong == 0, "%d draws of the wrong kind with one of mixup/cutmix on", wrong);
    rn_mix_opts off = {.prob = 1, .switch_prob = 0.5};
    rn_mix_draw(&off, SEED, 3, 3, H, W, &d);
    CHECK(d.kind == RN_MIX_NONE && d.lambda == 1, "mixing off: kind %d lambda %g", d.kind, d.lambda);

    /* keyed by (seed, step, micro-batch) only: the same arguments, the same draw; another micro-batch, step or
       seed, another */
    o.prob = 1;
    rn_mix_draw(&o, SEED, 11, 5, H, W, &d);
    rn_mix_draw(&o, SEED, 11, 5, H, W, &e);
    CHECK(memcmp(&d, &e, sizeof d) == 0, "the same (seed, step, micro) drew twice differently");
    int same = 0;
    for (int i = 0; i < 3; i++) {
        rn_mix_draw(&o, i == 0 ? SEED + 1 : SEED, i == 1 ? 12 : 11, i == 2 ? 6 : 5, H, W, &e);
        same += e.lambda == d.lambda;
    }
    CHECK(same == 0, "%d of 3 other keys drew the same lambda", same);

    /* the cutmix lambda: E[lambda] of Beta(1,1) is 0.5 before clipping; clipping only shrinks the box, so the
       corrected mean is above it */
    cu.cutmix = 1.0;
    double sum1 = 0;
    for (int i = 0; i < N; i++) {
        rn_mix_draw(&cu, SEED, i, 2, 224, 224, &d);
        sum1 += d.lambda;
    }
    CHECK(sum1 / N > 0.5 && sum1 / N < 0.75, "cutmix 1: mean corrected lambda %.4f", sum1 / N);
}

/* rn_input_mix on the CPU against loops over the formula, and NONE against rn_input_normalize's bits */
static void test_input_mix(void) {
    rn_backend *be = NULL;
    CHECK_OK(rn_backend_create("cpu", 2, NULL, &be));
    if (!be) return;
    const int n = 3, h = 5, w = 7, c = 3;
    const int64_t img = (int64_t)h * w * c, tot = n * img;
    uint8_t *x = malloc((size_t)tot);
    uint32_t r[4];
    for (int64_t i = 0; i < tot; i++) {
        rn_philox(rn_rng_key(SEED, 9), 0, (uint64_t)i, r);
        x[i] = (uint8_t)r[0];
    }
    const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    float *y = malloc(sizeof(float) * tot), *yn = malloc(sizeof(float) * tot);
    rn_mix_desc d = {.kind = RN_MIX_MIXUP, .lambda = 0.3141592653589793};
    CHECK_OK(rn_input_mix(be, RN_F32, &d, n, h, w, c, x, mean, sd, NULL, 0, 0, y));
    CHECK_OK(rn_input_normalize(be, RN_F32, (int64_t)n * h * w, c, x, mean, sd, yn));
    double worst = 0;
    int cut_bad = 0;
    for (int64_t e = 0; e < tot; e++) {
        int i = (int)(e / img), p = (i + n - 1) % n;
        double a = ((double)x[e] / 255 - mean[e % c]) / sd[e % c];
        double b = ((double)x[p * img + e % img] / 255 - mean[e % c]) / sd[e % c];
        double want = a * d.lambda + b * (1 - d.lambda);
        worst = fmax(worst, fabs(y[e] - want));
    }
    CHECK(worst < 1e-5, "mixup: max |rn - formula| %.3g", worst);
    d = (rn_mix_desc){.kind = RN_MIX_CUTMIX, .lambda = 1 - 6.0 / 35, .y0 = 1, .y1 = 3, .x0 = 4, .x1 = 7};
    CHECK_OK(rn_input_mix(be, RN_F32, &d, n, h, w, c, x, mean, sd, NULL, 0, 0, y));
    for (int64_t e = 0; e < tot; e++) {
        int i = (int)(e / img), p = (i + n - 1) % n;
        int64_t off = e % img;
        int yy = (int)(off / (w * c)), xx = (int)(off / c % w);
        int inside = yy >= 1 && yy < 3 && xx >= 4 && xx < 7;
        /* cutmix copies normalised values: the bits of rn_input_normalize, own or partner's */
        float want = inside ? yn[p * img + off] : yn[e];
        if (memcmp(&y[e], &want, sizeof want)) cut_bad++;
    }
    CHECK(cut_bad == 0, "cutmix: %d values not the normalised own/partner pixel", cut_bad);
    d = (rn_mix_desc){.kind = RN_MIX_CUTMIX, .lambda = 0.5, .y0 = 1, .y1 = 6, .x0 = 0, .x1 = 2};
    CHECK(rn_input_mix(be, RN_F32, &d, n, h, w, c, x, mean, sd, NULL, 0, 0, y) == RN_EINVAL,
          "a box past the image accepted");
    d = (rn_mix_desc){.kind = RN_MIX_MIXUP, .lambda = 1.5};
    CHECK(rn_input_mix(be, RN_F32, &d, n, h, w, c, x, mean, sd, NULL, 0, 0, y) == RN_EINVAL, "lambda 1.5 accepted");
    free(x), free(y), free(yn);
    rn_backend_destroy(be);
}

/* With erase boxes: the mixed input is torchvision's order of operations, each image
 * normalised (rn_input_normalize) and erased by its own box (rn_erase_apply) before the
 * batch is mixed, bit for bit: mixup in fp32 as the op documents it, cutmix copying the
 * erased values. Boxes cross the cutmix box's edges; image 1 has none. */
static void test_input_mix_erase(void) {
    rn_backend *be = NULL;
    CHECK_OK(rn_backend_create("cpu", 2, NULL, &be));
    if (!be) return;
    const int n = 4, h = 6, w = 8, c = 3;
    const int64_t img = (int64_t)h * w * c, tot = n * img;
    const uint64_t key = rn_rng_key(SEED, 31);
    const int64_t epoch = 2;
    uint8_t *x = malloc((size_t)tot);
    uint32_t r[4];
    for (int64_t i = 0; i < tot; i++) {
        rn_philox(rn_rng_key(SEED, 10), 0, (uint64_t)i, r);
        x[i] = (uint8_t)r[0];
    }
    const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    float *y = malloc(sizeof(float) * tot), *ref = malloc(sizeof(float) * tot), *plain = malloc(sizeof(float) * tot);
    const rn_mix_desc ds[2] = {{.kind = RN_MIX_MIXUP, .lambda = 0.2718281828459045},
                               {.kind = RN_MIX_CUTMIX, .lambda = 1 - 12.0 / 48, .y0 = 1, .y1 = 4, .x0 = 3, .x1 = 7}};
    for (int random = 0; random < 2; random++) {
        const rn_erase er[4] = {{.x = 0, .y = 0, .w = 4, .h = 3, .rec = 11, .random = random},
                                {.x = 0, .y = 0, .w = 0, .h = 0, .rec = 12, .random = random},
                                {.x = 5, .y = 2, .w = 3, .h = 4, .rec = 13, .random = random},
                                {.x = 2, .y = 3, .w = 5, .h = 2, .rec = 14, .random = random}};
        CHECK_OK(rn_input_normalize(be, RN_F32, (int64_t)n * h * w, c, x, mean, sd, ref));
        rn_erase_apply(er, n, h, w, c, key, epoch, ref);
        for (int k = 0; k < 2; k++) {
            const rn_mix_desc *d = &ds[k];
            const char *what = k ? "cutmix" : "mixup", *how = random ? "random" : "zero";
            CHECK_OK(rn_input_mix(be, RN_F32, d, n, h, w, c, x, mean, sd, er, key, epoch, y));
            CHECK_OK(rn_input_mix(be, RN_F32, d, n, h, w, c, x, mean, sd, NULL, 0, 0, plain));
            int bad = 0, changed = 0;
            const float la = (float)d->lambda, lb = (float)(1.0 - d->lambda);
            for (int64_t e = 0; e < tot; e++) {
                int i = (int)(e / img), p = (i + n - 1) % n;
                int64_t off = e % img;
                int yy = (int)(off / (w * c)), xx = (int)(off / c % w);
                float a = ref[e], b = ref[p * img + off], want;
                if (d->kind == RN_MIX_MIXUP) {
                    float ta = a * la, tb = b * lb;
                    want = ta + tb;
                } else
                    want = yy >= d->y0 && yy < d->y1 && xx >= d->x0 && xx < d->x1 ? b : a;
                if (memcmp(&y[e], &want, sizeof want)) {
                    if (bad++ < 3)
                        fprintf(stderr, "  %s %s: y[%lld] %.9g, want %.9g\n", what, how, (long long)e, y[e], want);
                }
                changed += memcmp(&y[e], &plain[e], sizeof want) != 0;
            }
            CHECK(bad == 0, "%s, %s erase: %d values not the erased inputs mixed", what, how, bad);
            CHECK(changed > 0, "%s, %s erase: the same as without erasing", what, how);
        }
    }
    const rn_erase out[4] = {{.x = 6, .y = 0, .w = 3, .h = 1}};
    CHECK(rn_input_mix(be, RN_F32, &ds[0], n, h, w, c, x, mean, sd, out, key, epoch, y) == RN_EINVAL,
          "an erase box past the image accepted");
    free(x), free(y), free(ref), free(plain);
    rn_backend_destroy(be);
}

/* the same bytes on 1, 2 and 3 threads (with erase boxes), for a batch larger than one chunk of rows */
static void test_input_mix_threads(void) {
    const int n = 4, h = 64, w = 48, c = 3;
    const int64_t tot = (int64_t)n * h * w * c;
    uint8_t *x = malloc((size_t)tot);
    for (int64_t i = 0; i < tot; i++)
        x[i] = (uint8_t)((i * 2654435761u) >> 9);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    const rn_mix_desc ds[2] = {{.kind = RN_MIX_MIXUP, .lambda = 0.61},
                               {.kind = RN_MIX_CUTMIX, .lambda = 0.7, .y0 = 5, .y1 = 40, .x0 = 9, .x1 = 48}};
    const rn_erase er[4] = {{.x = 3, .y = 10, .w = 30, .h = 40, .rec = 1, .random = 1},
                            {.x = 0, .y = 0, .w = 0, .h = 0},
                            {.x = 20, .y = 30, .w = 28, .h = 34, .rec = 3, .random = 1},
                            {.x = 1, .y = 1, .w = 10, .h = 10, .rec = 4, .random = 0}};
    float *y[3];
    for (int k = 0; k < 2; k++) {
        for (int t = 0; t < 3; t++) {
            rn_backend *be = NULL;
            y[t] = malloc(sizeof(float) * tot);
            CHECK_OK(rn_backend_create("cpu", t + 1, NULL, &be));
            if (be) CHECK_OK(rn_input_mix(be, RN_F32, &ds[k], n, h, w, c, x, mean, sd, er, 5, 1, y[t]));
            rn_backend_destroy(be);
        }
        CHECK(memcmp(y[0], y[1], sizeof(float) * tot) == 0 && memcmp(y[0], y[2], sizeof(float) * tot) == 0,
              "%s: 1, 2 and 3 threads differ", k ? "cutmix" : "mixup");
        for (int t = 0; t < 3; t++)
            free(y[t]);
    }
    free(x);
}

int main(void) {
    test_beta();
    test_draw();
    test_input_mix();
    test_input_mix_erase();
    test_input_mix_threads();
    return check_done("test_mix");
}
