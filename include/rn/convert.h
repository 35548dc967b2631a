/* rn/convert.h: checkpoints to and from safetensors in torchvision naming. */
#ifndef RN_CONVERT_H
#define RN_CONVERT_H

#include <stdint.h>

#include "rn/ckpt.h"
#include "rn/safetensors.h"

/* Guess the arch from the tensor names of a torchvision state_dict (bottleneck blocks
 * and the number of blocks in layer3). Writes "" if the names are not a ResNet's. */
void rn_guess_arch(const rn_safetensors *st, char arch[16]);

/* A checkpoint from torchvision-named weights. arch NULL or "" means: the file's
 * "arch" metadata, else guessed from the names. F32, F16 and BF16 parameters are
 * converted to F32; num_batches_tracked may be I64 or I32. reset_fc > 0 ignores the
 * file's fc.* and makes a freshly initialised reset_fc-class classifier (seeded).
 * Every missing, extra or mis-shaped tensor is listed by name in the error.
 * Errors: RN_EINVAL (arch), RN_ECORRUPT (tensor mismatch), RN_ENOMEM. */
int rn_ckpt_from_safetensors(const rn_safetensors *st, const char *arch, int reset_fc, uint64_t seed,
                             rn_ckpt **out);

/* Write c's parameters and buffers in state_dict order, with the model spec in the
 * metadata (arch, num_classes, zero_init_residual, format "pt"), so that
 * torchvision.models.<arch>(num_classes=N).load_state_dict(..., strict=True) works. */
int rn_ckpt_export_safetensors(const rn_ckpt *c, const char *path);

#endif
