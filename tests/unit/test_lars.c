/* LARS (rn_lars_update) against a double-precision reference of MLPerf's formula over
 * several steps, its corner cases (a zero norm, excluded tensors, AMP's unscale), the
 * same bits for any thread count and with the compute copy, refused descriptors; and the
 * poly schedule's values against its formula. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "rn/backend.h"
#include "rn/err.h"
#include "rn/rng.h"
#include "rn/schedule.h"
#include "rn/tensor.h"

/* MLPerf's TensorFlow LARSOptimizer in double: trust from the norms, momentum slot
 * v = m*v + lr*trust*(g + wd*w), w -= v */
static void ref_step(int64_t n, double *w, const double *g, double *v, double lr, double m, double wd, double eta,
                     double eps, int adapt) {
    double wn = 0, gn = 0, trust = 1;
    for (int64_t i = 0; i < n; i++) {
        wn += w[i] * w[i];
        gn += g[i] * g[i];
    }
    wn = sqrt(wn);
    gn = sqrt(gn);
    if (adapt && wn > 0 && gn > 0) trust = eta * wn / (gn + wd * wn + eps);
    for (int64_t i = 0; i < n; i++) {
        v[i] = m * v[i] + lr * trust * (g[i] + wd * w[i]);
        w[i] -= v[i];
    }
}

static float uniform(uint64_t seed, uint64_t i) {
    uint32_t r[4];
    rn_philox(seed, 0, i, r);
    return (float)r[0] / 4294967296.0f * 2.0f - 1.0f;
}

/* max |a - b| over max |b|: float rounding of a few steps stays far below 1e-5 */
static double rel_err(int64_t n, const float *a, const double *b) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs(b[i]));
    }
    return e / fmax(s, 1e-30);
}

typedef struct {
    const char *name;
    int64_t n;
    float lr, momentum, wd, eta, eps, gscale;
    int adapt, zero_w, zero_g;
} lars_case;

static void test_reference(rn_backend *be) {
    static const lars_case cases[] = {
        {"adapted, one chunk", 300, 0.5f, 0.9f, 0.01f, 0.02f, 0, 1, 1, 0, 0},
        {"adapted, three chunks, eps", 2 * RN_LARS_CHUNK + 77, 2.0f, 0.9f, 1e-4f, 0.001f, 1e-3f, 1, 1, 0, 0},
        {"adapted, AMP unscale 1/1024", 1000, 0.5f, 0.9f, 0.01f, 0.02f, 0, 1.0f / 1024, 1, 0, 0},
        {"excluded (BN, bias): plain momentum", 64, 0.1f, 0.9f, 0, 0.02f, 0, 1, 0, 0, 0},
        {"zero weights: trust 1", 50, 0.1f, 0.9f, 0.01f, 0.02f, 0, 1, 1, 1, 0},
        {"zero gradients: trust 1", 50, 0.1f, 0.9f, 0.01f, 0.02f, 0, 1, 1, 0, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const lars_case *k = &cases[c];
        int64_t n = k->n;
        float *p = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n), *b = calloc(n, sizeof(float));
        double *pw = malloc(sizeof(double) * n), *gd = malloc(sizeof(double) * n), *v = calloc(n, sizeof(double));
        if (!p || !g || !b || !pw || !gd || !v) abort();
        for (int64_t i = 0; i < n; i++)
            pw[i] = p[i] = k->zero_w ? 0 : uniform(1, i);
        CHECK_OK(rn_backend_reserve(be, rn_lars_workspace(be, n)));
        rn_lars_desc d;
        CHECK_OK(rn_lars_desc_init(&d, k->lr, k->momentum, k->wd, k->eta, k->eps));
        d.adapt = k->adapt;
        d.grad_scale = k->gscale;
        for (int step = 0; step < 4; step++) {
            for (int64_t i = 0; i < n; i++) {
                /* gradients of a different size each step, so the trust ratio moves */
                float x = k->zero_g ? 0 : uniform(2 + step, i) * (0.1f + step);
                gd[i] = x;
                g[i] = x / k->gscale; /* what AMP hands over: scaled up, exact in powers of two */
            }
            double lr = k->lr * (1.0 - 0.2 * step); /* a schedule moves lr under the momentum */
            d.lr = (float)lr;
            CHECK_OK(rn_lars_update(be, &d, n, p, g, b));
            ref_step(n, pw, gd, v, (float)lr, k->momentum, k->wd, k->eta, k->eps, k->adapt);
            double e = rel_err(n, p, pw), eb = rel_err(n, b, v);
            CHECK(e < 1e-5 && eb < 1e-5, "lars %s step %d: weights off by %.3g, momentum by %.3g (relative)", k->name,
                  step + 1, e, eb);
        }
        if (k->adapt && !k->zero_w && !k->zero_g) {
            /* the property the test names: the trust ratio changed the step (plain momentum
               SGD on the same gradients lands far from LARS) */
            double *w2 = malloc(sizeof(double) * n), *v2 = calloc(n, sizeof(double));
            if (!w2 || !v2) abort();
            for (int64_t i = 0; i < n; i++)
                w2[i] = uniform(1, i);
            ref_step(n, w2, gd, v2, k->lr, k->momentum, k->wd, k->eta, k->eps, 0);
            double e = 0;
            for (int64_t i = 0; i < n; i++)
                e = fmax(e, fabs(w2[i] - pw[i]));
            CHECK(e > 1e-3, "lars %s: trust ratio 1 gives the same weights (%g apart)", k->name, e);
            free(w2);
            free(v2);
        }
        free(p), free(g), free(b), free(pw), free(gd), free(v);
    }
}

/* one step of n values with `threads` threads into p and b */
static void run_threads(int threads, int64_t n, float *p, float *b, void *copy) {
    rn_backend *be = NULL;
    CHECK_OK(rn_backend_create("cpu", threads, NULL, &be));
    if (!be) return;
    CHECK_OK(rn_backend_reserve(be, rn_lars_workspace(be, n)));
    float *g = malloc(sizeof(float) * n);
    if (!g) abort();
    for (int64_t i = 0; i < n; i++) {
        p[i] = uniform(5, i);
        g[i] = uniform(6, i) * 1e-3f;
        b[i] = uniform(7, i) * 1e-2f;
    }
    rn_lars_desc d;
    CHECK_OK(rn_lars_desc_init(&d, 3.0f, 0.9f, 5e-5f, 0.001f, 0));
    if (copy) {
        d.dtype = RN_F16;
        CHECK_OK(rn_lars_update_copy(be, &d, n, p, g, b, copy));
    } else
        CHECK_OK(rn_lars_update(be, &d, n, p, g, b));
    free(g);
    rn_backend_destroy(be);
}

static void test_threads_and_copy(void) {
    const int64_t n = 40 * RN_LARS_CHUNK + 5; /* many chunks: the pool splits them */
    float *p1 = malloc(sizeof(float) * n), *b1 = malloc(sizeof(float) * n);
    float *p = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    uint16_t *copy = malloc(sizeof(uint16_t) * n), *want = malloc(sizeof(uint16_t) * n);
    if (!p1 || !b1 || !p || !b || !copy || !want) abort();
    run_threads(1, n, p1, b1, NULL);
    for (int t = 2; t <= 3; t++) {
        run_threads(t, n, p, b, NULL);
        CHECK(memcmp(p, p1, sizeof(float) * n) == 0 && memcmp(b, b1, sizeof(float) * n) == 0,
              "lars: %d threads give other bits than 1", t);
    }
    run_threads(2, n, p, b, copy);
    CHECK(memcmp(p, p1, sizeof(float) * n) == 0 && memcmp(b, b1, sizeof(float) * n) == 0,
          "lars_update_copy: weights or momentum differ from lars_update");
    rn_backend *be = NULL;
    CHECK_OK(rn_backend_create("cpu", 1, NULL, &be));
    if (be) {
        CHECK_OK(rn_cast(be, RN_F32, RN_F16, n, p1, want, 0));
        CHECK(memcmp(copy, want, sizeof(uint16_t) * n) == 0, "lars_update_copy: the fp16 copy is not the new weights");
        rn_backend_destroy(be);
    }
    free(p1), free(b1), free(p), free(b), free(copy), free(want);
}

/* on a fresh backend: its workspace holds the chunk sums of 4 values, no more */
static void test_errors(rn_backend *be) {
    float p[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, b[4] = {0};
    rn_lars_desc d;
    CHECK_OK(rn_backend_reserve(be, rn_lars_workspace(be, 4)));
    CHECK(rn_backend_reserved(be) < rn_lars_workspace(be, 3 * RN_LARS_CHUNK), "the workspace is already larger");
    CHECK_OK(rn_lars_desc_init(&d, 0.1f, 0.9f, 1e-4f, 0.001f, 0));
    d.eta = -1;
    CHECK(rn_lars_update(be, &d, 4, p, g, b) == RN_EINVAL, "eta -1 must be refused");
    d.eta = 0.001f;
    d.eps = NAN;
    CHECK(rn_lars_update(be, &d, 4, p, g, b) == RN_EINVAL, "eps NaN must be refused");
    d.eps = 0;
    d.grad_scale = 0;
    CHECK(rn_lars_update(be, &d, 4, p, g, b) == RN_EINVAL, "grad_scale 0 must be refused");
    d.grad_scale = 1;
    CHECK(rn_lars_update(be, &d, 4, p, g, NULL) == RN_EINVAL, "a NULL momentum buffer must be refused");
    CHECK(rn_lars_update(be, &d, 3 * RN_LARS_CHUNK, p, g, b) == RN_EINVAL,
          "a workspace short of the chunk sums must be refused");
    CHECK(p[0] == 1 && b[0] == 0, "a refused call wrote the weights");
    /* the rate from lr_at (the host's lr not read), and skip_if: set, nothing written */
    float q[4] = {1, 2, 3, 4}, c[4] = {0}, lr = 0.1f;
    int32_t skip = 1;
    d.lr = NAN;
    d.lr_at = &lr;
    d.skip_if = &skip;
    CHECK_OK(rn_lars_update(be, &d, 4, q, g, c));
    CHECK(q[0] == 1 && c[0] == 0, "skip_if set: LARS wrote the weights");
    skip = 0;
    CHECK_OK(rn_lars_update(be, &d, 4, q, g, c));
    rn_lars_desc e;
    CHECK_OK(rn_lars_desc_init(&e, 0.1f, 0.9f, 1e-4f, 0.001f, 0));
    CHECK_OK(rn_lars_update(be, &e, 4, p, g, b));
    CHECK(memcmp(p, q, sizeof p) == 0 && memcmp(b, c, sizeof b) == 0, "lr_at: not the bits of the rate passed");
    lr = INFINITY;
    CHECK(rn_lars_update(be, &d, 4, q, g, c) == RN_EINVAL, "an inf at lr_at must be refused");
}

/* rn_sumsq (--clip-grad-norm's norm, in LARS's order): a long double reference, the same
 * bits on 1, 2 and 3 threads, 0 for no values, and the refusals */
static void test_sumsq(void) {
    const int64_t n = 40 * RN_LARS_CHUNK + 5;
    float *x = malloc(sizeof(float) * n);
    if (!x) abort();
    long double want = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = uniform(8, i) * (i % 7 == 0 ? 100.0f : 0.01f);
        want += (long double)x[i] * x[i];
    }
    double first = 0;
    for (int t = 1; t <= 3; t++) {
        rn_backend *be = NULL;
        CHECK_OK(rn_backend_create("cpu", t, NULL, &be));
        if (!be) break;
        double s = -1;
        CHECK_OK(rn_backend_reserve(be, rn_sumsq_workspace(be, n)));
        CHECK_OK(rn_sumsq(be, n, x, &s));
        if (t == 1) first = s;
        CHECK(fabsl((long double)s - want) <= 1e-12L * want, "sumsq: %.17g, want %.17Lg", s, want);
        CHECK(memcmp(&s, &first, sizeof s) == 0, "sumsq: %d threads give other bits than 1", t);
        if (t == 1) {
            CHECK(rn_sumsq(be, 0, NULL, &s) == RN_OK && s == 0, "sumsq of nothing: %g", s);
            CHECK(rn_sumsq(be, -1, x, &s) == RN_EINVAL, "a negative count must be refused");
            CHECK(rn_sumsq(be, n, x, NULL) == RN_EINVAL, "a NULL result must be refused");
            rn_backend_unreserve(be);
            CHECK(rn_sumsq(be, n, x, &s) == RN_EINVAL, "a workspace short of the chunk sums must be refused");
        }
        rn_backend_destroy(be);
    }
    free(x);
}

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1.0, fabs(b)); }

static void test_poly(void) {
    /* 5 warm-up epochs of 100 steps, 40 epochs in all: T = 3500 steps of decay */
    rn_lr_schedule s = {
        .schedule = RN_LR_POLY, .lr = 10.0, .warmup_epochs = 5, .total_epochs = 40, .lr_end = 1e-4, .power = 2.0};
    static const int64_t steps[] = {0, 1, 249, 499, 500, 501, 1000, 2250, 3999, 4000, 5000};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        int64_t k = steps[i];
        double t = k < 500 ? 0 : k - 500 > 3500 ? 3500 : (double)(k - 500);
        double want = 1e-4 + (10.0 - 1e-4) * pow(1 - t / 3500, 2);
        if (k < 500) want *= (double)(k + 1) / 500;
        CHECK(near(rn_lr_at(&s, k, 100), want), "poly step %lld: %.17g, want %.17g", (long long)k, rn_lr_at(&s, k, 100),
              want);
    }
    CHECK(near(rn_lr_at(&s, 499, 100), 10.0) && near(rn_lr_at(&s, 500, 100), 10.0), "poly: warm-up ends at lr");
    CHECK(near(rn_lr_at(&s, 4000, 100), 1e-4) && near(rn_lr_at(&s, 9000, 100), 1e-4), "poly: ends at lr_end");
    /* halfway through the decay, pow2 leaves a quarter */
    CHECK(near(rn_lr_at(&s, 2250, 100), 1e-4 + (10.0 - 1e-4) * 0.25), "poly: pow2 halfway");
    s.power = 1.0;
    s.warmup_epochs = 0;
    CHECK(near(rn_lr_at(&s, 2000, 100), 1e-4 + (10.0 - 1e-4) * 0.5), "poly power 1: linear");
    CHECK(rn_lr_schedule_parse("poly") == RN_LR_POLY && strcmp(rn_lr_schedule_name(RN_LR_POLY), "poly") == 0,
          "poly's name");
}

int main(void) {
    rn_backend *be = NULL;
    CHECK_OK(rn_backend_create("cpu", 2, NULL, &be));
    if (!be) return check_done("test_lars");
    test_errors(be);
    test_reference(be);
    rn_backend_destroy(be);
    test_threads_and_copy();
    test_sumsq();
    test_poly();
    return check_done("test_lars");
}
