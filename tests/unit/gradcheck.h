/* Reusable gradient checker for op tests (Caffe's GradientChecker, in C).
 *
 * The caller provides an objective L = f(ctx) that reads some float inputs (for an op,
 * usually L = sum_i r_i * y_i with fixed random r, whose gradient w.r.t. y is r) and the
 * analytic gradient of L w.r.t. one input array. gc_check perturbs that array one element
 * at a time by +-h, evaluates L in double and compares the central difference
 * (L+ - L-)/(2h) with the analytic value: it passes when
 *     |analytic - numeric| <= thr * max(|analytic|, |numeric|, 1).
 * The step actually taken is recomputed from the rounded float, so float rounding of
 * x +- h does not bias the quotient.
 *
 * Kinks (ReLU at 0, a max changing its winner) make the central difference meaningless at
 * points within h of them. Such points are detected without knowing the op: the one-sided
 * slopes (L+ - L0)/h and (L0 - L-)/h then disagree by more than thr * scale, while on a
 * smooth function they differ only by about h * L''. A point that fails the comparison
 * and shows such a disagreement is skipped and counted; a check that skips more than a
 * quarter of its points fails, so a test cannot pass by skipping everything.
 *
 * Include after check.h. GC_VERBOSE=1 in the environment prints every check's counts. */
#ifndef RN_TEST_GRADCHECK_H
#define RN_TEST_GRADCHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

typedef double (*gc_objective)(void *ctx);

typedef struct {
    double h;            /* perturbation step (1e-3 suits fp32 ops with O(1) inputs) */
    double thr;          /* relative tolerance (1e-2) */
    int64_t max_points;  /* check at most this many elements, evenly spread; 0: all */
} gc_opts;

typedef struct {
    int64_t checked, skipped, failed;
    double max_err;      /* largest |a - b| / max(|a|, |b|, 1) among checked points */
} gc_result;

static inline gc_opts gc_defaults(void) {
    gc_opts o = {1e-3, 1e-2, 0};
    return o;
}

/* Compare analytic[i] with dL/dx[i] for the selected i; x is restored afterwards.
 * Records one CHECK for the whole array and prints the first mismatches. */
static inline gc_result gc_check(const char *name, gc_objective f, void *ctx, float *x,
                                 int64_t n, const float *analytic, gc_opts o) {
    gc_result res = {0, 0, 0, 0};
    int64_t step = (o.max_points > 0 && n > o.max_points) ? (n + o.max_points - 1) / o.max_points : 1;
    double l0 = f(ctx);
    for (int64_t i = 0; i < n; i += step) {
        float x0 = x[i];
        float xp = (float)(x0 + o.h), xm = (float)(x0 - o.h);
        x[i] = xp;
        double lp = f(ctx);
        x[i] = xm;
        double lm = f(ctx);
        x[i] = x0;
        double hp = (double)xp - x0, hm = (double)x0 - xm;
        double sp = (lp - l0) / hp, sm = (l0 - lm) / hm;
        double num = (lp - lm) / (hp + hm), a = analytic[i];
        double scale = fmax(fmax(fabs(sp), fabs(sm)), 1.0);
        double err = fabs(a - num) / fmax(fmax(fabs(a), fabs(num)), 1.0);
        /* only a point that would fail is excused as a kink: a smooth point with strong
         * curvature then still counts when its central difference agrees */
        if (err > o.thr && fabs(sp - sm) > o.thr * scale) {
            res.skipped++;
            continue;
        }
        res.checked++;
        if (err > res.max_err) res.max_err = err;
        if (err > o.thr) {
            if (res.failed < 5)
                fprintf(stderr, "  %s[%lld]: analytic %.7g numeric %.7g (rel err %.3g)\n", name,
                        (long long)i, a, num, err);
            res.failed++;
        }
    }
    if (getenv("GC_VERBOSE"))
        fprintf(stderr, "gradcheck %s: %lld checked, %lld skipped, max rel err %.3g\n", name,
                (long long)res.checked, (long long)res.skipped, res.max_err);
    CHECK(res.failed == 0 && res.skipped * 4 <= res.checked + res.skipped && res.checked > 0,
          "gradient %s: %lld checked, %lld failed, %lld skipped near kinks, max rel err %.3g",
          name, (long long)res.checked, (long long)res.failed, (long long)res.skipped,
          res.max_err);
    return res;
}

/* sum_i r[i] * y[i] in double: the usual objective, whose gradient w.r.t. y is r. */
static inline double gc_dot(const float *r, const float *y, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)r[i] * y[i];
    return s;
}

#endif
