/* rn/mix.h: batch-level mixup and cutmix (torchvision's reference recipe,
 * references/classification/transforms.py RandomMixup / RandomCutmix).
 *
 * The mixing unit is the micro-batch one forward sees: image i is mixed with image i-1 of
 * the same micro-batch (image 0 with the last one: torch's batch.roll(1, 0)), with one
 * lambda and one cutmix box for the whole micro-batch. Every draw is keyed by (seed, optimiser
 * step, global micro-batch index) through Philox, so --accum K, resume, and N ranks against
 * one process with --accum N mix the same images the same way. */
#ifndef RN_MIX_H
#define RN_MIX_H

#include <stdint.h>

#include "rn/backend.h"

/* Defaults, next to the flags that override them (rn-train --mix-prob, --switch-prob). */
#define RN_MIX_PROB 1.0   /* torchvision's reference: RandomMixup/RandomCutmix with p=1.0 */
#define RN_MIX_SWITCH 0.5 /* torchvision's RandomChoice of the two: each with probability 1/2 */

typedef struct {
    double mixup;       /* Beta alpha of mixup; 0: off */
    double cutmix;      /* Beta alpha of cutmix; 0: off */
    double prob;        /* probability that a micro-batch is mixed */
    double switch_prob; /* both on: probability of cutmix rather than mixup */
} rn_mix_opts;

/* One draw of Beta(alpha, alpha), alpha > 0, from the Philox stream (key, ctr_hi, ctr_lo):
 * X / (X + Y) with X, Y ~ Gamma(alpha) (Marsaglia-Tsang; alpha < 1 through Gamma(alpha+1)
 * U^(1/alpha), in logs so that small alphas neither underflow nor give 0/0). Each attempt of
 * the rejection loop reads its own counter, so the value depends only on the arguments. */
double rn_mix_beta(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, double alpha);

/* The mixing of global micro-batch `micro` of optimiser step `step` for images h x w:
 * d->kind RN_MIX_NONE (not mixed), RN_MIX_MIXUP or RN_MIX_CUTMIX with its lambda (the weight
 * of each image's own label; cutmix: 1 - box area / image area, the clipped box's) and box.
 * The uniforms are drawn as torch draws them in the reference (torch.rand for p, randint for
 * the box centre, int() truncation of the half sizes, clamped corners). */
void rn_mix_draw(const rn_mix_opts *o, uint64_t seed, int64_t step, int64_t micro, int h, int w, rn_mix_desc *d);

#endif
