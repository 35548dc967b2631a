/* rn/lrfind.h: the learning-rate range test (Smith, "Cyclical Learning Rates for
 * Training Neural Networks", 2017; as fastai's lr_find and torch-lr-finder run it).
 *
 * From a checkpoint, SGD steps on training batches with the lr growing geometrically
 * from lr_min at step 0 to lr_max at step steps-1 (lr_i = lr_min * (lr_max/lr_min)^(i/(steps-1))),
 * recording each step's loss (the batch's, before its step) and the smoothed loss: an
 * exponential moving average with beta 0.98, divided by 1 - beta^(i+1) to remove its
 * bias towards 0 (fastai's SmoothenValue). The sweep stops early when the smoothed loss
 * exceeds RN_LRFIND_DIVERGE times its best so far (fastai's 4x; torch-lr-finder uses 5x)
 * or the loss is not finite. The weights live in memory only: the checkpoint is never
 * written. */
#ifndef RN_LRFIND_H
#define RN_LRFIND_H

#include <stdint.h>
#include <stdio.h>

#include "rn/augment.h"
#include "rn/backend.h"
#include "rn/ckpt.h"

/* Defaults, next to the flags of rn-lrfind that override them (fastai's and torch-lr-finder's). */
#define RN_LRFIND_MIN 1e-7
#define RN_LRFIND_MAX 10.0
#define RN_LRFIND_STEPS 100
#define RN_LRFIND_BETA 0.98
#define RN_LRFIND_DIVERGE 4.0
#define RN_LRFIND_SKIP_START 10 /* steps the suggestion ignores: the average is still settling
                                   (torch-lr-finder's skip_start) */

typedef struct {
    const char *data;       /* training dataset */
    const char *device;     /* "auto", "cpu", "cuda[:N]" */
    rn_backend_opts backend;
    int threads, workers, batch, crop;
    int micro_batch;        /* images per forward, a divisor of batch (gradients accumulated
                               over batch/micro_batch forwards, as rn-train --micro-batch);
                               0: the largest divisor that fits in memory (rn/runner.h) */
    rn_augment augment;     /* the training chain (rn/augment.h; n = 0: the eval transform) */
    double lr_min, lr_max;  /* 0 < lr_min < lr_max */
    int steps;              /* >= 2 */
    double momentum, weight_decay;
    int nesterov;
    uint64_t seed;
    int seed_given;         /* else the checkpoint's seed */
    FILE *progress;         /* a line every 10 steps and the stop, or NULL */
} rn_lrfind_opts;

void rn_lrfind_defaults(rn_lrfind_opts *o);

typedef struct {
    int64_t step;
    double lr, loss, smoothed;
} rn_lrfind_point;

/* The lr of step i of a sweep of `steps` from lr_min to lr_max. */
double rn_lrfind_lr(double lr_min, double lr_max, int steps, int i);

/* Run the sweep on a copy of ck's weights in memory: pts (o->steps entries, the
 * caller's) gets one point per step taken, *n how many (fewer than o->steps when it
 * diverged: *diverged = 1). Errors: those of the loader, the network and the backend
 * (ck's model and the dataset must agree, as rn-train checks). */
int rn_lrfind_run(const rn_lrfind_opts *o, rn_ckpt *ck, rn_lrfind_point *pts, int *n, int *diverged);

/* The suggested lr: the point of steepest descent (most negative gradient, central
 * differences as numpy.gradient) of the smoothed loss against ln(lr), among the points
 * from RN_LRFIND_SKIP_START (fewer when the sweep is short) up to the best smoothed loss
 * (so before divergence). *at: its index in pts. Errors: RN_EDATA when fewer than 3
 * points precede the best (the message says to lower --lr-min or take more --steps). */
int rn_lrfind_suggest(const rn_lrfind_point *pts, int n, int *at);

#endif
