/* The learning-rate schedule as a function of the step, and the names of schedules and
 * mixed-precision modes. */
#include "rn/schedule.h"

#include <math.h>
#include <string.h>

#include "rn/tensor.h"

/* name tables indexed by the enums of rn/schedule.h */
static const char *sched_names[] = {"step", "multistep", "cosine", "constant", "poly", "exp"};
static const char *warmup_names[] = {"ramp", "linear", "constant"};
#define N_SCHED (int)(sizeof sched_names / sizeof *sched_names)
#define N_WARMUP (int)(sizeof warmup_names / sizeof *warmup_names)

static int name_index(const char *const *names, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

int rn_lr_schedule_parse(const char *name) { return name_index(sched_names, N_SCHED, name); }
const char *rn_lr_schedule_name(int s) { return s >= 0 && s < N_SCHED ? sched_names[s] : "?"; }
int rn_warmup_method_parse(const char *name) { return name_index(warmup_names, N_WARMUP, name); }
const char *rn_warmup_method_name(int m) { return m >= 0 && m < N_WARMUP ? warmup_names[m] : "?"; }

int rn_amp_parse(const char *name) {
    if (strcmp(name, "off") == 0) return RN_F32;
    if (strcmp(name, "fp16") == 0) return RN_F16;
    if (strcmp(name, "bf16") == 0) return RN_BF16;
    return -1;
}

const char *rn_amp_name(int dtype) { return dtype == RN_F16 ? "fp16" : dtype == RN_BF16 ? "bf16" : "off"; }

/* The schedule at clock k of spe steps per epoch, with the RAMP warm-up. */
static double schedule_at(const rn_lr_schedule *s, int64_t step, int64_t spe) {
    int64_t epoch = step / spe;
    double lr = s->lr;
    switch (s->schedule) {
    case RN_LR_STEP:
        if (s->step_epochs > 0) lr *= pow(s->gamma, (double)(epoch / s->step_epochs));
        break;
    case RN_LR_MULTISTEP:
        for (int i = 0; i < s->n_milestones; i++)
            if (epoch >= s->milestones[i]) lr *= s->gamma;
        break;
    case RN_LR_EXP: lr *= pow(s->gamma, (double)epoch); break;
    case RN_LR_COSINE: {
        double total = (double)(s->total_epochs > 0 ? s->total_epochs : 1) * (double)spe;
        double t = (double)step / total;
        lr = s->lr_min + (lr - s->lr_min) * (0.5 * (1.0 + cos(M_PI * (t < 1.0 ? t : 1.0))));
        break;
    }
    case RN_LR_POLY: {
        /* MLPerf's polynomial ("pow2") decay from lr after the warm-up to lr_end at the
           run's last step; the warm-up below multiplies the lr it holds there */
        int64_t warm = (int64_t)s->warmup_epochs * spe;
        double total = (double)((int64_t)(s->total_epochs > 0 ? s->total_epochs : 1) * spe - warm);
        double t = (double)(step > warm ? step - warm : 0);
        if (total < 1) total = 1;
        if (t > total) t = total;
        lr = s->lr_end + (s->lr - s->lr_end) * pow(1.0 - t / total, s->power);
        break;
    }
    default: break;
    }
    int64_t warm = (int64_t)s->warmup_epochs * spe;
    if (step < warm) lr *= (double)(step + 1) / (double)warm;
    return lr;
}

double rn_lr_at(const rn_lr_schedule *s, int64_t step, int64_t spe) {
    if (spe < 1) spe = 1;
    if (s->per_epoch) { /* torchvision's scheduler.step() once per epoch */
        step /= spe;
        spe = 1;
    }
    if (s->warmup_method == RN_WARMUP_RAMP || s->warmup_epochs <= 0) return schedule_at(s, step, spe);
    /* torch's SequentialLR([LinearLR or ConstantLR, main], milestones=[W]) */
    int64_t warm = (int64_t)s->warmup_epochs * spe;
    double d = s->warmup_decay;
    if (step < warm)
        return s->warmup_method == RN_WARMUP_LINEAR ? s->lr * (d + (1.0 - d) * (double)step / (double)warm)
                                                    : s->lr * d;
    rn_lr_schedule main = *s; /* from its start, over the epochs after the warm-up */
    main.warmup_epochs = 0;
    main.total_epochs = s->total_epochs > s->warmup_epochs ? s->total_epochs - s->warmup_epochs : 1;
    return schedule_at(&main, step - warm, spe);
}
