/* rn/state.h: the one adapter between a run's state and the checkpoint's protobuf
 * messages. The training loop (rn/train.h) and the network (rn/net.h) read and write a
 * checkpoint's OptimState, TrainState, history and class names through these
 * functions and never touch those messages' fields; a new piece of state (a rank's
 * loader position, a profiler's record) gets its field in proto/rn.proto and its
 * copy here.
 *
 * Everything written is malloc'ed into the checkpoint (rn/ckpt.h), so rn_ckpt_free
 * releases it. */
#ifndef RN_STATE_H
#define RN_STATE_H

#include <stdint.h>

#include "rn/ckpt.h"
#include "rn/report.h"
#include "rn/schedule.h"

/* Where a run stands: TrainState less the schedule, in plain C. */
typedef struct {
    int epoch;                /* finished epochs */
    int64_t step;             /* optimiser steps taken in total */
    uint64_t seed;            /* data order and augmentation */
    int64_t steps_per_epoch;
    int64_t data_epoch, data_index; /* loader position of the next sample */
    double loss_scale;        /* fp16's dynamic loss scale; 0: none saved */
    int scale_growth_tracker; /* clean steps since the scale last changed */
    int64_t skipped_steps;    /* steps the loss scaler skipped */
    int batch, accum;         /* images per step, micro-batches per step */
} rn_run_state;

/* c's run state, all zero where c holds none (a checkpoint from rn-init). */
void rn_state_get(const rn_ckpt *c, rn_run_state *s);
/* Write s and the schedule lr into c's TrainState, creating it as needed.
 * Errors: RN_ENOMEM. */
int rn_state_put(rn_ckpt *c, const rn_run_state *s, const rn_lr_schedule *lr);

/* The SGD settings of the run into c's OptimState (kind "sgd"); nothing when c holds no
 * optimiser state (no step has made momentum). Errors: RN_ENOMEM. */
int rn_state_put_sgd(rn_ckpt *c, double lr, double momentum, double weight_decay, int nesterov);

/* After rn_state_put_sgd (lr, momentum, weight decay): mark c's OptimState as LARS (kind
 * "lars") with trust coefficient eta and epsilon eps; nothing when c holds no optimiser
 * state. Errors: RN_ENOMEM. */
int rn_state_put_lars(rn_ckpt *c, double eta, double eps);
/* The kind of optimiser whose momentum c holds ("sgd", "lars"; "sgd" when unnamed), or
 * NULL when c holds no momentum (rn_state_has_momentum 0). */
const char *rn_state_optim_kind(const rn_ckpt *c);

/* 1 when c holds a momentum tensor for every parameter, else 0. */
int rn_state_has_momentum(const rn_ckpt *c);
/* The momentum of parameter `name` (F32, the parameter's shape and layout), or NULL. */
rn_ptensor *rn_state_momentum(const rn_ckpt *c, const char *name);
/* Give c a zeroed momentum tensor per parameter (kind "sgd") unless it has one for
 * each already. Errors: RN_ENOMEM. */
int rn_state_momentum_alloc(rn_ckpt *c);

/* The exponential moving average of the weights (rn-train --ema-decay; proto EmaState):
 * c->ema's params and buffers mirror c->params and c->buffers (names, dtypes, shapes).
 * rn_state_ema_alloc gives c a zeroed set with updates 0 unless it has one; its decay,
 * every and alpha are the caller's to fill. Errors: RN_ENOMEM. */
int rn_state_ema_alloc(rn_ckpt *c);
/* Remove c's EMA set, if any. */
void rn_state_ema_drop(rn_ckpt *c);
/* Make the EMA weights and buffers c's own params and buffers (the model's move into
 * c->ema, which stays), so that whatever reads a checkpoint's model (rn-eval --ema,
 * rn-export --ema) reads the averaged one. what names c in the message.
 * Errors: RN_EINVAL (c holds no EMA set: the message says how to make one). */
int rn_state_use_ema(rn_ckpt *c, const char *what);

/* Append an epoch's metrics (val_* left 0 without validation) to c's history.
 * Errors: RN_ENOMEM. */
int rn_state_add_epoch(rn_ckpt *c, const rn_epoch_info *e);

/* Record who wrote c (rn_ckpt_set_provenance with the time, no parent) and from which
 * data (`dataset`, e.g. "train.lmdb (1281167 records)"). Errors: RN_ENOMEM. */
int rn_state_put_provenance(rn_ckpt *c, int argc, char **argv, const char *dataset);

/* Copy n class names into c when it has none (else nothing). Errors: RN_ENOMEM. */
int rn_state_set_class_names(rn_ckpt *c, char *const *names, int n);

#endif
