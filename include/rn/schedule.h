/* rn/schedule.h: the learning-rate schedule of a training run, and the names by which
 * flags and checkpoints spell it and the mixed-precision mode.
 *
 * A schedule is a pure function of the optimiser step (0-based) and the steps in an
 * epoch, so gradient accumulation, resuming and the number of processes never change
 * it. rn_train (rn/train.h) saves it in the checkpoint's TrainState. */
#ifndef RN_SCHEDULE_H
#define RN_SCHEDULE_H

#include <stdint.h>

enum { RN_LR_STEP = 0, RN_LR_MULTISTEP, RN_LR_COSINE, RN_LR_CONSTANT, RN_LR_POLY };

typedef struct {
    int schedule;          /* RN_LR_* */
    double lr;             /* base learning rate */
    int step_epochs;       /* step: decay every step_epochs epochs */
    double gamma;          /* step, multistep: decay factor */
    int milestones[32];    /* multistep: epochs at which to decay */
    int n_milestones;
    int warmup_epochs;     /* linear warm-up from lr/warmup_steps to lr */
    int total_epochs;      /* cosine, poly: epochs of the whole run */
    double lr_end;         /* poly: the learning rate at the end of the run */
    double power;          /* poly: the exponent (MLPerf's "pow2": 2) */
} rn_lr_schedule;

/* Learning rate for optimiser step `step` (0-based) with steps_per_epoch steps (values
 * below 1 count as 1). With W = warmup_epochs * spe warm-up steps and T = total_epochs *
 * spe steps in all, poly is
 *   lr_end + (lr - lr_end) * (1 - min(max(step - W, 0), T - W) / (T - W))^power
 * (T - W at least 1), and every schedule is multiplied by (step + 1) / W while step < W. */
double rn_lr_at(const rn_lr_schedule *s, int64_t step, int64_t steps_per_epoch);
/* Parse "step", "multistep", "cosine", "constant", "poly"; -1 if unknown. */
int rn_lr_schedule_parse(const char *name);
/* The name rn_lr_schedule_parse reads back; "?" for an unknown schedule. */
const char *rn_lr_schedule_name(int schedule);

/* "off", "fp16", "bf16" <-> RN_F32, RN_F16, RN_BF16; parse gives -1 if unknown. */
int rn_amp_parse(const char *name);
const char *rn_amp_name(int dtype);

#endif
