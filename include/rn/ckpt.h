/* rn/ckpt.h: checkpoints (proto/rn.proto Checkpoint) in memory and on disk.
 *
 * In memory a checkpoint is the protobuf-c struct itself (rn_ckpt). Everything in it is
 * allocated with malloc, whether it came from rn_ckpt_read or was built with the
 * functions here, so one rn_ckpt_free releases either. Parameters are F32 in
 * torchvision's layout (conv OIHW); buffers are BN running_mean/running_var (F32) and
 * num_batches_tracked (I64 scalar), all in state_dict order (see rn/resnet.h). */
#ifndef RN_CKPT_H
#define RN_CKPT_H

#include <stdint.h>

#include "rn.pb-c.h"
#include "rn/resnet.h"

typedef Rn__Checkpoint rn_ckpt;
typedef Rn__Tensor rn_ptensor;

#define RN_FORMAT_VERSION 1
/* Loading refuses training-state counters beyond these (corrupt or hostile files): epochs
 * and epoch counts up to 2^30 (far past any run, and epoch + --epochs stays in an int),
 * steps and positions up to 2^40. */
#define RN_CKPT_MAX_EPOCHS (1 << 30)
#define RN_CKPT_MAX_STEPS ((int64_t)1 << 40)

/* A tensor with malloc'ed, zeroed data of numel(shape) * dtype size bytes.
 * Returns NULL (and records RN_ENOMEM/RN_EINVAL) on failure. */
rn_ptensor *rn_ptensor_new(const char *name, int dtype, int ndim, const int64_t *shape);
void rn_ptensor_free(rn_ptensor *t);
/* Float view of an F32 tensor's data (NULL for other dtypes). */
static inline float *rn_ptensor_f32(const rn_ptensor *t) {
    return t->dtype == RN__DTYPE__F32 ? (float *)(void *)t->data.data : 0;
}

/* A checkpoint with every parameter and buffer of net allocated and zeroed, model spec
 * filled, format version set, no optimiser state. Errors: RN_ENOMEM. */
int rn_ckpt_new(const rn_resnet *net, rn_ckpt **out);

/* torchvision's initialisation, seeded: conv kaiming-normal (fan_out, ReLU gain), BN
 * weight 1 bias 0, running mean 0 var 1, fc weight and bias U(-1/sqrt(fan_in), +).
 * zero_init_residual zeroes the last BN gamma of each block. Tensor t's values depend
 * only on (seed, t's name), so the same seed gives byte-identical checkpoints. */
int rn_ckpt_init(rn_ckpt *c, const rn_resnet *net, uint64_t seed, int zero_init_residual);
/* Re-initialise just the tensors whose names start with prefix (e.g. "fc."). */
int rn_ckpt_init_prefix(rn_ckpt *c, const rn_resnet *net, uint64_t seed, const char *prefix);

/* The param or buffer named name, or NULL. */
rn_ptensor *rn_ckpt_find(const rn_ckpt *c, const char *name);

/* Build the rn_resnet that c's model spec describes. Errors: RN_ECORRUPT. */
int rn_ckpt_net(const rn_ckpt *c, rn_resnet *net);

/* Check c against its model spec: version, arch, class count (1..RN_MAX_CLASSES), the
 * training state's counters (RN_CKPT_MAX_*), the optimiser kind, the number of class
 * names, every param/buffer/momentum name, order, dtype, shape, byte count and CRC32C.
 * The message names the first bad field or tensor. Errors: RN_ECORRUPT. */
int rn_ckpt_validate(const rn_ckpt *c);

/* Read and validate path ("-" = stdin). Errors: RN_EIO, RN_ECORRUPT (message starts
 * with the path and names what is wrong), RN_ENOMEM. */
int rn_ckpt_read(const char *path, rn_ckpt **out);
/* rn_ckpt_read's work on len bytes already in memory (buf stays the caller's); name is
 * the file or stream the bytes came from, for messages. Errors: RN_ECORRUPT, RN_ENOMEM. */
int rn_ckpt_parse(const uint8_t *buf, size_t len, const char *name, rn_ckpt **out);

/* Recompute every CRC32C, then write atomically (tmp, fsync, rename, fsync dir);
 * "-" = stdout. Errors: RN_EIO, RN_ENOMEM. */
int rn_ckpt_write(const char *path, rn_ckpt *c);

/* Record who wrote this file: rn version, command line, host, parent file, and the UTC
 * time when with_time (tools whose output must be reproducible byte for byte, like
 * rn-init, leave the time out). */
int rn_ckpt_set_provenance(rn_ckpt *c, int argc, char **argv, const char *parent, int with_time);

void rn_ckpt_free(rn_ckpt *c);

/* Replace *field (a malloc'ed protobuf string or protobuf_c_empty_string) with a copy of s. */
int rn_pb_set_string(char **field, const char *s);

#endif
