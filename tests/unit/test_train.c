#include <math.h>
#include <string.h>

#include "check.h"
#include "rn/err.h"
#include "rn/tensor.h"
#include "rn/train.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1.0, fabs(b)); }

int main(void) {
    rn_lr_schedule s = {.schedule = RN_LR_STEP, .lr = 0.1, .step_epochs = 10, .gamma = 0.1};
    /* StepLR(10, 0.1) with 100 steps per epoch: epoch 9 (steps 900..999) still at 0.1 */
    CHECK(near(rn_lr_at(&s, 0, 100), 0.1) && near(rn_lr_at(&s, 999, 100), 0.1), "step: first ten epochs");
    CHECK(near(rn_lr_at(&s, 1000, 100), 0.01) && near(rn_lr_at(&s, 2500, 100), 0.001), "step: decays");
    s.schedule = RN_LR_MULTISTEP;
    s.n_milestones = 3;
    s.milestones[0] = 30, s.milestones[1] = 60, s.milestones[2] = 80;
    CHECK(near(rn_lr_at(&s, 2999, 100), 0.1) && near(rn_lr_at(&s, 3000, 100), 0.01) &&
              near(rn_lr_at(&s, 8000, 100), 0.0001),
          "multistep");
    s.schedule = RN_LR_COSINE;
    s.total_epochs = 10;
    CHECK(near(rn_lr_at(&s, 0, 100), 0.1) && near(rn_lr_at(&s, 500, 100), 0.05) && rn_lr_at(&s, 1000, 100) < 1e-12,
          "cosine: %g %g", rn_lr_at(&s, 500, 100), rn_lr_at(&s, 1000, 100));
    s.schedule = RN_LR_CONSTANT;
    s.warmup_epochs = 2;
    CHECK(near(rn_lr_at(&s, 0, 100), 0.1 / 200) && near(rn_lr_at(&s, 99, 100), 0.1 * 100 / 200) &&
              near(rn_lr_at(&s, 200, 100), 0.1),
          "linear warm-up");
    /* the schedule is a function of the optimiser step alone: accumulation (fewer,
     * larger steps) is expressed by steps_per_epoch, never by micro-batches. 1200 images
     * are 12 steps of 100, or 3 steps of 400 (micro-batches of 100 with --accum 4): every
     * schedule is at epoch e's rate on the first optimiser step of epoch e in both, step
     * and multistep keep it to the epoch's last step, and a warm-up ends on the last step
     * of its last epoch in both */
    rn_lr_schedule all[] = {
        {.schedule = RN_LR_STEP, .lr = 0.1, .step_epochs = 3, .gamma = 0.1},
        {.schedule = RN_LR_MULTISTEP, .lr = 0.1, .gamma = 0.5, .milestones = {2, 5}, .n_milestones = 2},
        {.schedule = RN_LR_COSINE, .lr = 0.1, .total_epochs = 8},
        {.schedule = RN_LR_CONSTANT, .lr = 0.1, .warmup_epochs = 2},
    };
    for (int i = 0; i < 4; i++) {
        const rn_lr_schedule *a = &all[i];
        /* within a warm-up the rate rises step by step: compared where it ends, below */
        for (int e = a->warmup_epochs; e < 8; e++) {
            double lr = rn_lr_at(a, e * 12, 12);
            CHECK(near(rn_lr_at(a, e * 3, 3), lr), "%s epoch %d: %g with 3 steps an epoch, %g with 12",
                  rn_lr_schedule_name(a->schedule), e, rn_lr_at(a, e * 3, 3), lr);
            if (a->schedule == RN_LR_STEP || a->schedule == RN_LR_MULTISTEP)
                CHECK(near(rn_lr_at(a, e * 3 + 2, 3), lr) && near(rn_lr_at(a, e * 12 + 11, 12), lr),
                      "%s: epoch %d's last step", rn_lr_schedule_name(a->schedule), e);
        }
    }
    CHECK(near(rn_lr_at(&all[0], 8, 3), 0.1) && near(rn_lr_at(&all[0], 9, 3), 0.01),
          "step: decays after 3 epochs of 3");
    CHECK(near(rn_lr_at(&all[1], 5, 3), 0.1) && near(rn_lr_at(&all[1], 6, 3), 0.05) &&
              near(rn_lr_at(&all[1], 15, 3), 0.025),
          "multistep: milestones 2, 5 at 3 steps an epoch");
    CHECK(near(rn_lr_at(&all[3], 5, 3), 0.1) && near(rn_lr_at(&all[3], 23, 12), 0.1) && rn_lr_at(&all[3], 4, 3) < 0.1 &&
              rn_lr_at(&all[3], 22, 12) < 0.1,
          "warm-up ends on its last step");
    CHECK(rn_lr_schedule_parse("cosine") == RN_LR_COSINE && rn_lr_schedule_parse("exponential") == -1, "parse");
    /* torchvision's form: per epoch, LinearLR(0.01, 5) then cosine over the 595 epochs
     * after it (the v2 recipe at 16 steps an epoch); every step of an epoch has the
     * epoch's rate, and accumulation (4 steps an epoch, not 16) keeps it */
    rn_lr_schedule tv = {.schedule = RN_LR_COSINE, .lr = 0.5, .total_epochs = 600, .warmup_epochs = 5,
                         .warmup_method = RN_WARMUP_LINEAR, .warmup_decay = 0.01, .per_epoch = 1};
    for (int e = 0; e < 600; e += 7) {
        double want = e < 5 ? 0.5 * (0.01 + 0.99 * e / 5.0) : 0.5 * (1 + cos(M_PI * (e - 5) / 595.0)) / 2;
        CHECK(near(rn_lr_at(&tv, e * 16, 16), want) && rn_lr_at(&tv, e * 16 + 15, 16) == rn_lr_at(&tv, e * 16, 16) &&
                  rn_lr_at(&tv, e * 4 + 3, 4) == rn_lr_at(&tv, e * 16, 16),
              "torchvision form, epoch %d: %.17g, want %.17g", e, rn_lr_at(&tv, e * 16, 16), want);
    }
    CHECK(rn_lr_at(&tv, 5 * 16, 16) == 0.5 && near(rn_lr_at(&tv, 0, 16), 0.005), "linear warm-up: 0.01 x lr, then lr");
    /* the same per step: the warm-up rises within an epoch, the cosine starts at its end */
    tv.per_epoch = 0;
    CHECK(near(rn_lr_at(&tv, 1, 16), 0.5 * (0.01 + 0.99 / 80)) && rn_lr_at(&tv, 80, 16) == 0.5 &&
              near(rn_lr_at(&tv, 81, 16), 0.5 * (1 + cos(M_PI / (595.0 * 16))) / 2),
          "torchvision form per step");
    /* constant warm-up, then a StepLR counted from the warm-up's end */
    rn_lr_schedule cw = {.schedule = RN_LR_STEP, .lr = 0.1, .step_epochs = 3, .gamma = 0.5, .warmup_epochs = 2,
                         .warmup_method = RN_WARMUP_CONSTANT, .warmup_decay = 0.1, .per_epoch = 1};
    CHECK(near(rn_lr_at(&cw, 0, 10), 0.01) && near(rn_lr_at(&cw, 19, 10), 0.01) && near(rn_lr_at(&cw, 20, 10), 0.1) &&
              near(rn_lr_at(&cw, 49, 10), 0.1) && near(rn_lr_at(&cw, 50, 10), 0.05),
          "constant warm-up, then StepLR(3) from epoch 2: decays at epoch 5");
    /* ExponentialLR: lr * gamma^epoch; cosine down to lr_min (eta_min), halfway at the mean */
    rn_lr_schedule ex = {.schedule = RN_LR_EXP, .lr = 0.1, .gamma = 0.9};
    CHECK(near(rn_lr_at(&ex, 0, 10), 0.1) && near(rn_lr_at(&ex, 9, 10), 0.1) && near(rn_lr_at(&ex, 30, 10), 0.1 * 0.729),
          "exp: %.17g", rn_lr_at(&ex, 30, 10));
    rn_lr_schedule cm = {.schedule = RN_LR_COSINE, .lr = 0.1, .lr_min = 0.01, .total_epochs = 10};
    CHECK(near(rn_lr_at(&cm, 0, 10), 0.1) && near(rn_lr_at(&cm, 50, 10), 0.055) && near(rn_lr_at(&cm, 100, 10), 0.01) &&
              near(rn_lr_at(&cm, 500, 10), 0.01),
          "cosine to lr_min: %.17g %.17g", rn_lr_at(&cm, 50, 10), rn_lr_at(&cm, 100, 10));
    rn_lr_schedule po = {.schedule = RN_LR_POLY, .lr = 0.1, .lr_end = 0.001, .power = 2, .total_epochs = 10};
    CHECK(near(rn_lr_at(&po, 50, 10), 0.001 + 0.099 * 0.25) && near(rn_lr_at(&po, 100, 10), 0.001) &&
              near(rn_lr_at(&po, 500, 10), 0.001),
          "poly to lr_end, held past it: %.17g %.17g", rn_lr_at(&po, 50, 10), rn_lr_at(&po, 500, 10));
    CHECK(rn_lr_schedule_parse("exp") == RN_LR_EXP && strcmp(rn_lr_schedule_name(RN_LR_EXP), "exp") == 0, "exp name");
    /* the default ramp is unchanged by warmup_decay */
    rn_lr_schedule rp = {.schedule = RN_LR_CONSTANT, .lr = 0.1, .warmup_epochs = 2, .warmup_decay = 0.5};
    CHECK(near(rn_lr_at(&rp, 0, 100), 0.1 / 200), "ramp ignores warmup_decay");
    CHECK(rn_warmup_method_parse("linear") == RN_WARMUP_LINEAR && rn_warmup_method_parse("ramp") == RN_WARMUP_RAMP &&
              rn_warmup_method_parse("exp") == -1 && strcmp(rn_warmup_method_name(RN_WARMUP_CONSTANT), "constant") == 0,
          "warm-up names");
    /* --amp names */
    CHECK(rn_amp_parse("off") == RN_F32 && rn_amp_parse("fp16") == RN_F16 && rn_amp_parse("bf16") == RN_BF16 &&
              rn_amp_parse("fp32") == -1 && rn_amp_parse("") == -1,
          "amp parse");
    for (int d = RN_F32; d <= RN_BF16; d++) CHECK(rn_amp_parse(rn_amp_name(d)) == d, "amp name %d", d);
    return check_done("test_train");
}
