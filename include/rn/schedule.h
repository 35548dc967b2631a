/* rn/schedule.h: the learning-rate schedule of a training run, and the names by which
 * flags and checkpoints spell it and the mixed-precision mode.
 *
 * A schedule is a pure function of the optimiser step (0-based) and the steps in an
 * epoch, so gradient accumulation, resuming and the number of processes never change
 * it. rn_train (rn/train.h) saves it in the checkpoint's TrainState.
 *
 * Two ways to read it. rn's own (the default): the schedule moves every step, and the
 * warm-up ramp multiplies it. torchvision's reference (train.py): the scheduler steps once
 * per epoch (per_epoch), and the warm-up is a scheduler of its own, LinearLR or
 * ConstantLR from warmup_decay, that SequentialLR hands over to the main schedule at the
 * warm-up's end, whose epochs are then counted from there (cosine over total - warm-up
 * epochs, a StepLR's decays and a MultiStepLR's milestones after the warm-up). */
#ifndef RN_SCHEDULE_H
#define RN_SCHEDULE_H

#include <stdint.h>

enum { RN_LR_STEP = 0, RN_LR_MULTISTEP, RN_LR_COSINE, RN_LR_CONSTANT, RN_LR_POLY, RN_LR_EXP };
/* rn_lr_schedule.warmup_method */
enum { RN_WARMUP_RAMP = 0, RN_WARMUP_LINEAR, RN_WARMUP_CONSTANT };

typedef struct {
    int schedule;          /* RN_LR_* */
    double lr;             /* base learning rate */
    int step_epochs;       /* step: decay every step_epochs epochs */
    double gamma;          /* step, multistep, exp: decay factor */
    int milestones[32];    /* multistep: epochs at which to decay */
    int n_milestones;
    int warmup_epochs;     /* W: the warm-up's length (0: none) */
    int warmup_method;     /* RN_WARMUP_RAMP: the schedule times (k + 1) / W at warm-up
                              step k, reaching it at the warm-up's last step;
                              RN_WARMUP_LINEAR: torch's LinearLR(start_factor = warmup_decay,
                              total_iters = W), lr * (d + (1 - d) * k / W), then the schedule
                              from its start; RN_WARMUP_CONSTANT: ConstantLR(factor = d),
                              lr * d, then the schedule from its start */
    double warmup_decay;   /* d of LINEAR and CONSTANT, in (0, 1] (torchvision's
                              --lr-warmup-decay, 0.01 in its recipes) */
    int per_epoch;         /* 1: the rate moves once per epoch, at its first step, as
                              torchvision's scheduler.step() after each epoch; warm-up and
                              schedule count epochs, not steps. 0: every step */
    int total_epochs;      /* cosine, poly: epochs of the whole run */
    double lr_end;         /* poly: the learning rate at the end of the run */
    double lr_min;         /* cosine: the rate it decays to (torch's eta_min) */
    double power;          /* poly: the exponent (MLPerf's "pow2": 2) */
} rn_lr_schedule;

/* Learning rate for optimiser step `step` (0-based) with steps_per_epoch steps (values
 * below 1 count as 1). The clock k is the step, or with per_epoch the epoch step / spe
 * (and spe 1 below). With W = warmup_epochs * spe warm-up steps and T = total_epochs *
 * spe steps in all, on the RAMP warm-up
 *   step:      lr * gamma^floor(k / (step_epochs * spe))
 *   multistep: lr * gamma^(milestones at or below k / spe)
 *   exp:       lr * gamma^floor(k / spe)   (torch's ExponentialLR, once per epoch)
 *   cosine:    lr_min + (lr - lr_min) * (1 + cos(pi * min(k / T, 1))) / 2
 *   poly:      lr_end + (lr - lr_end) * (1 - min(max(k - W, 0), T - W) / (T - W))^power
 *              (T - W at least 1)
 * each multiplied by (k + 1) / W while k < W. On the LINEAR and CONSTANT warm-ups, k < W
 * has lr * (d + (1 - d) * k / W), or lr * d, and k >= W the schedule above at k - W with
 * T - W steps in all (at least one epoch's) and no warm-up. */
double rn_lr_at(const rn_lr_schedule *s, int64_t step, int64_t steps_per_epoch);
/* Parse "step", "multistep", "cosine", "constant", "poly", "exp"; -1 if unknown. */
int rn_lr_schedule_parse(const char *name);
/* The name rn_lr_schedule_parse reads back; "?" for an unknown schedule. */
const char *rn_lr_schedule_name(int schedule);

/* "ramp", "linear", "constant" <-> RN_WARMUP_*; parse gives -1 if unknown. */
int rn_warmup_method_parse(const char *name);
const char *rn_warmup_method_name(int method);

/* "off", "fp16", "bf16" <-> RN_F32, RN_F16, RN_BF16; parse gives -1 if unknown. */
int rn_amp_parse(const char *name);
const char *rn_amp_name(int dtype);

#endif
