/* rn/augment.h: the training augmentation chain (--augment), parsed in one place.
 *
 * A chain is ops separated by commas, applied in order to each training image:
 *
 *   OP[=V][:KEY=VALUE|:WORD]...      e.g.  rrc:scale=0.35-1,flip,erase=0.25:value=random
 *
 * V is the op's main number (flip's and erase's probability, crop-pad's padding); KEY=VALUE
 * sets any parameter, a range is LO-HI; a bare WORD is a value of the op's one word-valued
 * parameter (crop-pad=4:reflect). Parameters left out take torchvision's defaults.
 *
 *   rrc      RandomResizedCrop(S, scale=(0.08, 1), ratio=(3/4, 4/3))    scale=LO-HI ratio=LO-HI
 *   crop-pad RandomCrop(S, padding=N, fill=0, padding_mode=constant)    =N mode=constant|edge|reflect
 *            (the image at its stored size, padded by N on every side;  fill=0..255
 *            the offset is drawn over the padded image, as torchvision)
 *   flip     RandomHorizontalFlip(p=0.5)                                =P
 *   ta_wide  TrivialAugmentWide(num_magnitude_bins=31)                   bins=N
 *   randaug  RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=31)  =N m=M bins=B
 *   autoaug  AutoAugment(AutoAugmentPolicy.IMAGENET)                     policy=imagenet
 *   jitter   ColorJitter(brightness=0, contrast=0, saturation=0, hue=0)  brightness= contrast=
 *                                                                        saturation= hue=
 *   erase    RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), =P scale=LO-HI ratio=LO-HI
 *            value=0), on the normalised tensor: 0 or N(0, 1) each     value=0|random
 *
 * The pixel ops (ta_wide, randaug, autoaug, jitter) are rn/augops.h's policies: drawn and
 * applied to the S x S crop, with torchvision's tensor-path arithmetic, in chain order.
 *
 * At most one crop op (rrc or crop-pad), and it comes first; then flip; then the pixel
 * ops; erase last (it works on the normalised tensor, after the pixels). Each op at most once. Without a crop
 * op the image takes the eval geometry (resize, centre crop: rn/transform.h) before the
 * ops that follow. Whole-chain spellings kept from before chains existed: `standard` and
 * `rrc` (alone) mean `rrc,flip`; `none` is the empty chain (the eval transform). To get a
 * RandomResizedCrop without a flip, write `rrc,flip=0` or give rrc a parameter.
 *
 * Every random draw of a record comes from one Philox stream keyed by (seed, epoch,
 * record), in chain order (rn/loader.h). Adding an op is one row of the table in
 * lib/augment.c (and its case where the loader applies its stage). */
#ifndef RN_AUGMENT_H
#define RN_AUGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "rn/image.h"

#define RN_AUG_MAX 8  /* ops in one chain */
#define RN_AUG_NVAL 6 /* numbers one op keeps */

/* ops (rows of the table in lib/augment.c) */
enum {
    RN_AUG_OP_RRC,
    RN_AUG_OP_CROP_PAD,
    RN_AUG_OP_FLIP,
    RN_AUG_OP_ERASE,
    RN_AUG_OP_TA_WIDE,
    RN_AUG_OP_RANDAUG,
    RN_AUG_OP_AUTOAUG,
    RN_AUG_OP_JITTER,
    RN_AUG_OP_COUNT
};
/* stages: a chain's ops come in this order */
enum { RN_AUG_STAGE_CROP, RN_AUG_STAGE_FLIP, RN_AUG_STAGE_PIXEL, RN_AUG_STAGE_ERASE };
/* crop-pad padding modes (torchvision's padding_mode) */
enum { RN_AUG_PAD_CONSTANT, RN_AUG_PAD_EDGE, RN_AUG_PAD_REFLECT };
/* erase values */
enum { RN_AUG_ERASE_ZERO, RN_AUG_ERASE_RANDOM };

/* the values of each op, by slot:
 *   rrc       scale lo, hi, ratio lo, hi
 *   crop-pad  padding, mode, fill
 *   flip      p
 *   erase     p, scale lo, hi, ratio lo, hi, value
 *   ta_wide   bins
 *   randaug   num_ops, magnitude, bins
 *   autoaug   policy (0: imagenet)
 *   jitter    brightness, contrast, saturation, hue */
typedef struct {
    int op; /* RN_AUG_OP_* */
    double v[RN_AUG_NVAL];
} rn_aug_step;

typedef struct {
    int n; /* 0: the eval transform */
    rn_aug_step step[RN_AUG_MAX];
} rn_augment;

/* The default chain, `rrc,flip` with torchvision's defaults. */
void rn_augment_default(rn_augment *a);

/* Parse a chain. Errors: RN_EINVAL with a message that names the op or parameter at
 * fault and lists the known ones (tools prefix it with the flag and exit 2). */
int rn_augment_parse(const char *text, rn_augment *a);

/* The chain written out in full, every parameter given (parses back to the same chain):
 * for logs and rn-load's report. Returns the length it needed (as snprintf). */
int rn_augment_format(const rn_augment *a, char *buf, size_t cap);

/* The rn/augops.h policy of a pixel op's step (ta_wide, randaug, autoaug, jitter).
 * Errors: RN_EINVAL (not a pixel op, or values rn_aug_policy_parse refuses). */
struct rn_aug_policy_s;
int rn_augment_policy(const rn_aug_step *s, struct rn_aug_policy_s *p);

/* The step of op `op` in the chain, or NULL. */
const rn_aug_step *rn_augment_find(const rn_augment *a, int op);

/* An op's name and stage. */
const char *rn_augment_op_name(int op);
int rn_augment_op_stage(int op);

/* ---- the ops' parameters and pixels (the loader calls these; tests too) */

/* crop-pad's offset: torchvision's RandomCrop.get_params over the w x h image padded by
 * pad on each side, for an S x S crop: i (row) then j (column), each
 * randint(0, padded - S + 1). Returns 0, or -1 when the padded image is smaller than S. */
int rn_aug_crop_offsets(int w, int h, int pad, int S, const rn_draws *d, int *i, int *j);

/* The S x S window at row i, column j of src (w x h x c) padded by pad on each side with
 * mode (RN_AUG_PAD_*; fill for constant), mirrored left-right if flip, into dst
 * (S x S x c): torchvision's F.pad then F.crop (then F.hflip). reflect needs pad < w and
 * pad < h (torch's rule); the caller checks. */
void rn_aug_crop_pad(const uint8_t *src, int w, int h, int c, int pad, int mode, int fill, int i, int j, int S,
                     int flip, uint8_t *dst);

/* RandomErasing.get_params for a c x h x w image: up to 10 attempts of area scale in
 * [scale_lo, scale_hi] and log-uniform ratio h/w in [ratio_lo, ratio_hi], kept when the
 * box is strictly smaller than the image on both sides, then (i, j) from randint. Writes
 * box = {x, y, w, h} (j, i, w, h); w = h = 0 when all attempts fail (nothing erased). */
void rn_aug_erase_box(int w, int h, double scale_lo, double scale_hi, double ratio_lo, double ratio_hi,
                      const rn_draws *d, int box[4]);

/* One image's erase box, carried from the loader to the normalisation. */
typedef struct {
    int32_t x, y, w, h; /* the box in output pixels; w == 0: nothing erased */
    uint32_t rec;       /* the sample: the record, or with repeated augmentation copy r of
                           record i, i + r * records (rn_loader_opts.repeats); keys the
                           random values */
    int32_t random;     /* RN_AUG_ERASE_ZERO or RN_AUG_ERASE_RANDOM */
} rn_erase;

/* The random erase value of element e = (y * w + x) * c + ch of record rec's image in
 * epoch `epoch`: N(0, 1) by Box-Muller (in double, rounded to float) from Philox word pair
 * (e % 4) / 2 of rn_philox(key, epoch, (rec << 32) | e / 4), cos for even e, sin for odd. */
float rn_erase_value(uint64_t key, int64_t epoch, uint32_t rec, uint32_t e);

/* Write the erase values into n normalised images y (n, h, w, c) float, image k's box
 * from boxes[k]. */
void rn_erase_apply(const rn_erase *boxes, int n, int h, int w, int c, uint64_t key, int64_t epoch, float *y);

#endif
