/* rn/scaler.h: the dynamic loss scale of fp16 mixed precision, with the semantics of
 * torch.cuda.amp.GradScaler.
 *
 * fp16 gradients below 2^-24 flush to zero. Multiplying the loss by a large scale S lifts
 * them into range; the optimiser step divides by S again (rn_scaler_inv). Too large an S
 * overflows some gradient to inf or NaN: that step is skipped and S shrinks. After
 * growth_interval clean steps in a row S grows. rn_scaler_update is GradScaler.update()
 * (torch._amp_update_scale_) exactly:
 *
 *   found_inf:  scale = scale * backoff_factor;  growth_tracker = 0;  skip the step
 *   otherwise:  if growth_tracker + 1 == growth_interval:
 *                   scale = scale * growth_factor, unless that is inf in fp32;
 *                   growth_tracker = 0
 *               else growth_tracker += 1
 *
 * The scale is an fp32 value, as torch keeps it; each product is formed in double and
 * rounded once to fp32, as torch's kernel does. No state other than scale and
 * growth_tracker changes, so saving those two resumes a run exactly (torch's state_dict
 * holds the same). bf16 needs no loss scale (its range is fp32's): rn-train, like torch
 * users, runs it without a scaler. */
#ifndef RN_SCALER_H
#define RN_SCALER_H

#include <stdint.h>

/* GradScaler's defaults, next to rn-train's flags that override them. */
#define RN_SCALER_INIT 65536.0
#define RN_SCALER_GROWTH 2.0
#define RN_SCALER_BACKOFF 0.5
#define RN_SCALER_INTERVAL 2000

typedef struct {
    float scale;             /* multiplies the loss (and so every gradient) */
    int32_t growth_tracker;  /* clean steps since the scale last changed */
    double growth_factor;    /* > 1 */
    double backoff_factor;   /* in (0, 1) */
    int32_t growth_interval; /* >= 1 */
} rn_scaler;

/* Fill s with scale init_scale (rounded to fp32) and growth_tracker 0. Errors: RN_EINVAL,
 * naming the value, for init_scale not finite and > 0 in fp32, growth_factor <= 1,
 * backoff_factor outside (0, 1) or growth_interval < 1 (torch asserts the same). */
int rn_scaler_init(rn_scaler *s, double init_scale, double growth_factor, double backoff_factor,
                   int growth_interval);

/* Take a finished backward's verdict (found_inf != 0: some gradient was inf or NaN) and
 * move scale and growth_tracker on. Returns 1 when the step must be skipped (found_inf),
 * else 0. Call it after the optimiser step (or its skip), as GradScaler.update(). */
int rn_scaler_update(rn_scaler *s, int found_inf);

/* The factor that unscales the gradients: 1/scale, computed in double and rounded to
 * fp32 (torch: scale.double().reciprocal().float()). */
float rn_scaler_inv(const rn_scaler *s);

#endif
