/* The AMP loss scaler against torch.cuda.amp.GradScaler's update rule (torch's
 * _amp_update_scale_ kernel; GradScaler's docstring): start 65536, x2 after 2000 clean
 * steps in a row, x0.5 and skip on a step that found inf/NaN, growth tracker reset on
 * both, no growth to inf. Expected values are written out by hand from that rule. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "check.h"
#include "rn/err.h"
#include "rn/scaler.h"

/* run found[0..n) through s; the scale and tracker after each update into sc[], tr[] */
static int run(rn_scaler *s, const int *found, int n, float *sc, int32_t *tr) {
    int skipped = 0;
    for (int i = 0; i < n; i++) {
        int skip = rn_scaler_update(s, found[i]);
        skipped += skip;
        CHECK(skip == (found[i] != 0), "update %d: skip %d for found_inf %d", i, skip, found[i]);
        sc[i] = s->scale;
        tr[i] = s->growth_tracker;
    }
    return skipped;
}

static void test_defaults(void) {
    rn_scaler s;
    CHECK_OK(rn_scaler_init(&s, RN_SCALER_INIT, RN_SCALER_GROWTH, RN_SCALER_BACKOFF, RN_SCALER_INTERVAL));
    CHECK(s.scale == 65536.0f && s.growth_tracker == 0 && s.growth_interval == 2000, "init: %g %d %d", s.scale,
          s.growth_tracker, s.growth_interval);
    CHECK(rn_scaler_inv(&s) == 1.0f / 65536.0f, "inv %g", rn_scaler_inv(&s));
    /* 1999 clean steps: no change of scale, the tracker counts them */
    for (int i = 0; i < 1999; i++) rn_scaler_update(&s, 0);
    CHECK(s.scale == 65536.0f && s.growth_tracker == 1999, "after 1999 clean: %g %d", s.scale, s.growth_tracker);
    /* the 2000th doubles it and resets the tracker */
    CHECK(rn_scaler_update(&s, 0) == 0, "clean step not skipped");
    CHECK(s.scale == 131072.0f && s.growth_tracker == 0, "after 2000 clean: %g %d", s.scale, s.growth_tracker);
    /* an overflow halves it, resets the tracker and skips */
    for (int i = 0; i < 1500; i++) rn_scaler_update(&s, 0);
    CHECK(rn_scaler_update(&s, 1) == 1, "overflow skipped");
    CHECK(s.scale == 65536.0f && s.growth_tracker == 0, "after inf: %g %d", s.scale, s.growth_tracker);
    /* 2000 clean steps are counted again from the overflow, not from the last growth */
    for (int i = 0; i < 1999; i++) rn_scaler_update(&s, 0);
    CHECK(s.scale == 65536.0f, "no growth 1999 steps after an inf: %g", s.scale);
    rn_scaler_update(&s, 0);
    CHECK(s.scale == 131072.0f, "growth 2000 steps after an inf: %g", s.scale);
}

/* A step that finds inf never grows the scale, even when it would have been the
 * growth_interval-th: it halves it. */
static void test_inf_on_growth_step(void) {
    rn_scaler s;
    CHECK_OK(rn_scaler_init(&s, 1024, 2, 0.5, 4));
    const int found[] = {0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    const float want_s[] = {1024, 1024, 1024, 512, 512, 512, 512, 1024, 512, 256, 256, 256, 256, 512,
                            512, 512, 512, 1024};
    const int32_t want_t[] = {1, 2, 3, 0, 1, 2, 3, 0, 0, 0, 1, 2, 3, 0, 1, 2, 3, 0};
    enum { N = sizeof found / sizeof *found };
    float sc[N];
    int32_t tr[N];
    CHECK(run(&s, found, N, sc, tr) == 3, "three skipped");
    for (int i = 0; i < N; i++)
        CHECK(sc[i] == want_s[i] && tr[i] == want_t[i], "update %d: scale %g tracker %d, want %g %d", i, sc[i],
              tr[i], want_s[i], want_t[i]);
}

/* growth_interval 1 grows on every clean step; consecutive overflows halve each time */
static void test_interval_one(void) {
    rn_scaler s;
    CHECK_OK(rn_scaler_init(&s, 8, 2, 0.5, 1));
    const int found[] = {0, 0, 1, 1, 1, 0};
    const float want[] = {16, 32, 16, 8, 4, 8};
    float sc[6];
    int32_t tr[6];
    run(&s, found, 6, sc, tr);
    for (int i = 0; i < 6; i++)
        CHECK(sc[i] == want[i] && tr[i] == 0, "interval 1, update %d: %g %d, want %g 0", i, sc[i], tr[i], want[i]);
}

/* Products in double rounded once to fp32, as torch's kernel; no growth to inf. */
static void test_rounding_and_range(void) {
    rn_scaler s;
    CHECK_OK(rn_scaler_init(&s, 3.0, 3.0, 0.3, 1));
    rn_scaler_update(&s, 0);
    CHECK(s.scale == 9.0f, "x3: %g", s.scale);
    rn_scaler_update(&s, 1);
    CHECK(s.scale == (float)(9.0 * 0.3), "x0.3 rounded once: %.9g want %.9g", s.scale, (float)(9.0 * 0.3));
    CHECK(rn_scaler_inv(&s) == (float)(1.0 / (double)(float)(9.0 * 0.3)), "inv in double then fp32");
    /* at 2^127 a growth would overflow fp32: the scale stays, the tracker resets */
    CHECK_OK(rn_scaler_init(&s, ldexp(1.0, 127), 2, 0.5, 2));
    rn_scaler_update(&s, 0);
    CHECK(s.growth_tracker == 1, "tracker 1");
    rn_scaler_update(&s, 0);
    CHECK(s.scale == ldexpf(1.0f, 127) && s.growth_tracker == 0, "no growth to inf: %g %d", s.scale,
          s.growth_tracker);
    /* init rounds to fp32 like torch.full(..., dtype=float32) */
    CHECK_OK(rn_scaler_init(&s, 0.1, 2, 0.5, 10));
    CHECK(s.scale == 0.1f, "init rounded to fp32");
}

/* A long mixed run equals a second scaler restored from (scale, tracker) half-way:
 * those two values are the whole state a checkpoint needs. */
static void test_restore(void) {
    rn_scaler a, b;
    CHECK_OK(rn_scaler_init(&a, 65536, 2, 0.5, 7));
    uint32_t x = 12345;
    int found[400];
    for (int i = 0; i < 400; i++) {
        x = x * 1664525u + 1013904223u;
        found[i] = (x >> 24) < 20; /* about 8% overflows */
    }
    for (int i = 0; i < 200; i++) rn_scaler_update(&a, found[i]);
    CHECK_OK(rn_scaler_init(&b, 1, 2, 0.5, 7));
    b.scale = (float)(double)a.scale; /* through TrainState's double */
    b.growth_tracker = a.growth_tracker;
    int same = 1;
    for (int i = 200; i < 400; i++) {
        rn_scaler_update(&a, found[i]);
        rn_scaler_update(&b, found[i]);
        same &= a.scale == b.scale && a.growth_tracker == b.growth_tracker;
    }
    CHECK(same, "restored scaler diverged");
}

static void test_errors(void) {
    rn_scaler s;
    CHECK(rn_scaler_init(&s, 0, 2, 0.5, 1) == RN_EINVAL, "scale 0");
    CHECK(strstr(rn_last_error(), "loss scale 0") != NULL, "message: %s", rn_last_error());
    CHECK(rn_scaler_init(&s, -1, 2, 0.5, 1) == RN_EINVAL, "negative scale");
    CHECK(rn_scaler_init(&s, 1e39, 2, 0.5, 1) == RN_EINVAL, "scale beyond fp32");
    CHECK(rn_scaler_init(&s, NAN, 2, 0.5, 1) == RN_EINVAL, "NaN scale");
    CHECK(rn_scaler_init(&s, 1, 1, 0.5, 1) == RN_EINVAL, "growth factor 1");
    CHECK(rn_scaler_init(&s, 1, 2, 1, 1) == RN_EINVAL, "backoff 1");
    CHECK(rn_scaler_init(&s, 1, 2, 0, 1) == RN_EINVAL, "backoff 0");
    CHECK(rn_scaler_init(&s, 1, 2, 0.5, 0) == RN_EINVAL, "interval 0");
}

int main(void) {
    test_defaults();
    test_inf_on_growth_step();
    test_interval_one();
    test_rounding_and_range();
    test_restore();
    test_errors();
    return check_done("test_scaler");
}
