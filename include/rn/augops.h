/* rn/augops.h: torchvision's pixel augmentations and random augmentation policies on u8 images.
 *
 * Images are u8, interleaved HWC (see rn/image.h), w x h pixels of c = 1 or 3 channels, changed
 * in place. Each operation has the semantics of torchvision.transforms.functional (0.14) on a
 * uint8 *tensor* (the tensor path, not PIL): the same float32 arithmetic, the same truncation on
 * the way back to u8, NEAREST interpolation with fill 0 for the geometric ops.
 *
 * Grey images (c = 1) follow torchvision's rules for 1-channel tensors: saturation (COLOR) and
 * hue leave them unchanged; contrast blends with the image's own mean; every other operation
 * works on the one channel as it would on each channel of a colour image.
 *
 * A policy (TrivialAugmentWide, RandAugment, AutoAugment's ImageNet policy, ColorJitter) is used
 * in two steps: rn_aug_policy_draw takes a fixed number of words from a caller-keyed
 * rn_image_stream (rn_aug_policy_words: the same count for every image, whatever is drawn) and
 * writes the ops and magnitudes to apply; rn_aug_policy_apply applies them. The draw is what the
 * tests compare with torchvision's sampler; the apply is what they compare with its pixels.
 *
 * Magnitude tables are torchvision's torch.linspace(...) tables with torch's own float32
 * arithmetic (its x86-64 AVX2 kernel), not the correctly rounded values: at some bins the two
 * differ by an ulp, and that ulp moves enhancement results by a grey level. */
#ifndef RN_AUGOPS_H
#define RN_AUGOPS_H

#include <stddef.h>
#include <stdint.h>

#include "rn/image.h"

/* The operations, numbered in the order of torchvision's _augmentation_space (which is the
 * order TrivialAugmentWide and RandAugment draw from), then INVERT (AutoAugment) and HUE
 * (ColorJitter). */
enum {
    RN_AUG_IDENTITY,
    RN_AUG_SHEAR_X,
    RN_AUG_SHEAR_Y,
    RN_AUG_TRANSLATE_X,
    RN_AUG_TRANSLATE_Y,
    RN_AUG_ROTATE,
    RN_AUG_BRIGHTNESS,
    RN_AUG_COLOR,
    RN_AUG_CONTRAST,
    RN_AUG_SHARPNESS,
    RN_AUG_POSTERIZE,
    RN_AUG_SOLARIZE,
    RN_AUG_AUTOCONTRAST,
    RN_AUG_EQUALIZE,
    RN_AUG_INVERT,
    RN_AUG_HUE,
    RN_AUG_NOPS
};

/* torchvision's name of an op ("ShearX", "Color", ...; "Hue" for RN_AUG_HUE), NULL if out of
 * range. */
const char *rn_aug_op_name(int op);

/* Scratch memory the ops reuse between calls (a copy of the image for the geometric ops and
 * sharpness); zero-initialise, free with rn_aug_ws_free. It grows to the largest image seen
 * and is then never reallocated. One per thread. */
typedef struct {
    uint8_t *buf;
    size_t cap;
} rn_aug_ws;
void rn_aug_ws_free(rn_aug_ws *ws);

/* Apply op with magnitude as torchvision's autoaugment._apply_op(img, name, magnitude,
 * NEAREST, fill=None) does:
 *   SHEAR_X/Y      F.affine(shear = degrees(atan(magnitude)) on x or y, centre = top-left corner)
 *   TRANSLATE_X/Y  F.affine(translate = int(magnitude) pixels, centre = image centre)
 *   ROTATE         F.rotate(angle = magnitude degrees, counter-clockwise, about the centre)
 *   BRIGHTNESS, COLOR, CONTRAST, SHARPNESS   F.adjust_*(factor = 1 + magnitude)
 *   POSTERIZE      F.posterize(bits = int(magnitude)), bits in [0, 8]
 *   SOLARIZE       F.solarize(threshold = magnitude), threshold in [0, 255]
 *   AUTOCONTRAST, EQUALIZE, INVERT, IDENTITY   magnitude ignored
 *   HUE            F.adjust_hue(hue_factor = magnitude), in [-0.5, 0.5]
 * Errors: RN_EINVAL (bad op, size, channel count or magnitude; the message names it),
 * RN_ENOMEM. */
int rn_aug_op(int op, double magnitude, uint8_t *img, int w, int h, int c, rn_aug_ws *ws);

/* F.adjust_brightness / adjust_saturation / adjust_contrast / adjust_sharpness / adjust_hue with
 * torchvision's own factor (op RN_AUG_BRIGHTNESS, COLOR, CONTRAST, SHARPNESS or HUE): what
 * ColorJitter calls. Factors >= 0; hue in [-0.5, 0.5]. Errors: RN_EINVAL, RN_ENOMEM. */
int rn_aug_adjust(int op, double factor, uint8_t *img, int w, int h, int c, rn_aug_ws *ws);

/* The policies. */
enum { RN_AUG_TA_WIDE = 1, RN_AUG_RANDAUG, RN_AUG_AUTOAUG, RN_AUG_JITTER };

#define RN_AUG_MAX_OPS 16 /* most ops one draw applies (RandAugment's num_ops at most this) */

/* Defaults, equal to torchvision's. */
#define RN_AUG_TA_BINS 31     /* TrivialAugmentWide(num_magnitude_bins) */
#define RN_AUG_RA_NUM_OPS 2   /* RandAugment(num_ops) */
#define RN_AUG_RA_MAGNITUDE 9 /* RandAugment(magnitude) */
#define RN_AUG_RA_BINS 31     /* RandAugment(num_magnitude_bins) */
#define RN_AUG_AA_BINS 10     /* AutoAugment's fixed magnitude tables */

typedef struct rn_aug_policy_s {
    int kind;        /* RN_AUG_TA_WIDE, RN_AUG_RANDAUG, RN_AUG_AUTOAUG, RN_AUG_JITTER */
    int num_ops;     /* RandAugment: ops per image, 0..RN_AUG_MAX_OPS */
    int magnitude;   /* RandAugment: bin index, 0..bins-1 */
    int bins;        /* TrivialAugmentWide, RandAugment: magnitude bins, >= 2 */
    float jitter[4]; /* ColorJitter: brightness, contrast, saturation, hue (0 = off) */
} rn_aug_policy;

/* Parse a policy: name is one of
 *   ta_wide (trivialaugment)  args "" or "BINS"                           default 31
 *   randaug (randaugment)     args "" or "NUM_OPS,MAGNITUDE[,BINS]"      default 2,9,31
 *   autoaug (autoaugment)     args "" or "imagenet"
 *   jitter (colorjitter)      args "B[,C[,S[,H]]]", missing values 0     e.g. "0.4,0.4,0.4,0.1"
 * (args may be NULL for ""). ColorJitter's ranges are torchvision's: brightness, contrast and
 * saturation factors uniform in [max(0, 1 - v), 1 + v], hue in [-v, v] with v <= 0.5; a value
 * of 0 turns that adjustment off. Errors: RN_EINVAL with a message naming the bad part. */
int rn_aug_policy_parse(const char *name, const char *args, rn_aug_policy *p);

/* One image's draw: the ops to apply, in order. For ta_wide/randaug/autoaug mag[i] is the
 * signed magnitude torchvision passes to _apply_op (apply with rn_aug_op); for jitter it is the
 * factor (apply with rn_aug_adjust). bin[i] is the magnitude bin (-1 where the op has none),
 * sign[i] 1 where the magnitude was negated; both are for tests and logs. */
typedef struct {
    int n;
    int op[RN_AUG_MAX_OPS];
    double mag[RN_AUG_MAX_OPS];
    int bin[RN_AUG_MAX_OPS];
    int sign[RN_AUG_MAX_OPS];
} rn_aug_draw;

/* Words of the stream one draw takes, the same for every image: ta_wide 3 (op, bin, sign),
 * randaug 2 per op (op, sign), autoaug 5 (sub-policy, two probabilities, two signs), jitter 7
 * (a random order of the 4 adjustments from 3 words, then 4 factors, drawn even when off). */
int rn_aug_policy_words(const rn_aug_policy *p);

/* Draw one image's ops for a w x h image (RandAugment's and AutoAugment's translations scale
 * with the image: 150/331 of the width or height) from st, taking exactly
 * rn_aug_policy_words(p) words. Sampling is torchvision's: ops uniform, magnitude bins uniform
 * (TrivialAugmentWide), signs fair coins for signed ops, AutoAugment's sub-policy uniform and
 * each of its two ops applied with its probability, ColorJitter's order a uniform permutation.
 * Errors: RN_EINVAL for a policy rn_aug_policy_parse would not produce. */
int rn_aug_policy_draw(const rn_aug_policy *p, rn_image_stream *st, int w, int h, rn_aug_draw *d);

/* The unsigned magnitude of op at bin (0..bins-1; AutoAugment: 0..9) in p's table for a w x h
 * image, into *mag (0 for ops without one). Errors: RN_EINVAL (a jitter policy, a bad op or
 * bin). */
int rn_aug_magnitude(const rn_aug_policy *p, int op, int bin, int w, int h, double *mag);

/* Apply a draw of p to img (w x h x c) in place. Errors: as rn_aug_op. */
int rn_aug_policy_apply(const rn_aug_policy *p, const rn_aug_draw *d, uint8_t *img, int w, int h, int c, rn_aug_ws *ws);

#endif
