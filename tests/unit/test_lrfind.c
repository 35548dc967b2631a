/* The LR range test's pure parts (the sweep's lr, the suggestion) and the overfit
 * check's verdict. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "rn/err.h"
#include "rn/lrfind.h"
#include "rn/train.h"

static void test_lr(void) {
    double a = rn_lrfind_lr(1e-7, 10, 100, 0), b = rn_lrfind_lr(1e-7, 10, 100, 99);
    CHECK(a == 1e-7, "first lr %g", a);
    CHECK(fabs(b / 10 - 1) < 1e-12, "last lr %g", b);
    double r = pow(1e8, 1.0 / 99);
    for (int i = 1; i < 100; i++) {
        double q = rn_lrfind_lr(1e-7, 10, 100, i) / rn_lrfind_lr(1e-7, 10, 100, i - 1);
        CHECK(fabs(q / r - 1) < 1e-9, "step %d ratio %g", i, q);
    }
}

/* a curve over ln lr: flat, a descent steepest at step 40 (a tanh), the minimum at 60,
 * then a steeper rise, which must not be taken for the descent */
static void test_suggest(void) {
    enum { N = 80 };
    rn_lrfind_point p[N];
    for (int i = 0; i < N; i++) {
        double s = 1 - 0.5 * tanh((i - 40) / 5.0);
        if (i > 60) s = p[60].smoothed + 0.5 * (i - 60);
        p[i] = (rn_lrfind_point){.step = i, .lr = rn_lrfind_lr(1e-7, 10, N, i), .loss = s, .smoothed = s};
    }
    int at = -1;
    CHECK_OK(rn_lrfind_suggest(p, N, &at));
    CHECK(at == 40, "steepest descent at %d, not 40", at);
    /* a noisy start (skipped): a dip at step 2 is not the suggestion */
    p[2].smoothed = 0.6;
    CHECK_OK(rn_lrfind_suggest(p, N, &at));
    CHECK(at == 40, "with an early dip: %d", at);
    /* lowest at the start: nothing before it to descend */
    rn_lrfind_point q[5];
    for (int i = 0; i < 5; i++) q[i] = (rn_lrfind_point){.step = i, .lr = 1e-3 * (i + 1), .smoothed = 1.0 + i};
    CHECK(rn_lrfind_suggest(q, 5, &at) == RN_EDATA, "rising from the start");
    CHECK(strstr(rn_last_error(), "lower --lr-min") != NULL, "message: %s", rn_last_error());
}

static void test_verdict(void) {
    char b[512];
    CHECK(rn_train_overfit_verdict(0.78, 0.01, 30, 30, 1, b, sizeof b) == 1, "fits: %s", b);
    CHECK(strcmp(b, "loss 0.78 -> 0.01 after 30 steps over 1 batch: the model can fit the data") == 0, "%s", b);
    CHECK(rn_train_overfit_verdict(2.3, 0.9, 5, 50, 10, b, sizeof b) == 0, "falls");
    CHECK(strstr(b, "over 10 batches: the loss falls but is not near 0 yet") != NULL, "%s", b);
    CHECK(rn_train_overfit_verdict(2.3, 2.4, 5, 50, 10, b, sizeof b) == 0, "rose");
    CHECK(strstr(b, "did not fall: lower --lr") != NULL, "%s", b);
    CHECK(rn_train_overfit_verdict(2.3, 2.0, 5, 50, 10, b, sizeof b) == 0, "flat");
    CHECK(strstr(b, "barely falls: raise --lr") != NULL, "%s", b);
    CHECK(rn_train_overfit_verdict(2.3, 2.3, 1, 5, 10, b, sizeof b) == 0, "one pass");
    CHECK(strstr(b, "fewer than two passes") != NULL, "%s", b);
    CHECK(rn_train_overfit_verdict(2.3, 0.01, 2, 20, 10, b, 16) == 1, "short buffer");
}

int main(void) {
    test_lr();
    test_suggest();
    test_verdict();
    return check_done("test_lrfind");
}
