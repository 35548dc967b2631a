/* rn/eval.h: evaluation of a checkpoint over a dataset (rn-eval, and rn-train's --val):
 * the eval transform, running BN statistics, no gradients; top-1, top-k, mean loss and
 * the confusion matrix.
 *
 * Many processes (rn/dist.h): every rank forwards its own slice of the records, whole
 * forwards of `batch` images at the places one process would make them, and rank 0
 * scores every image in dataset order with the code one process runs: the same forward
 * shapes give the same logits (the CPU backend's bits depend on a forward's shape, never
 * on the thread count), and the counts and the loss are added image by image in dataset
 * order, so top-1, top-k, loss, the confusion matrix and the logits dump are the same
 * bytes for any number of ranks. No record is padded or seen twice.
 *
 * Memory: the network at `batch` is checked against the memory plan before anything is
 * allocated (rn/runner.h); a batch that does not fit fails with RN_ENOMEM naming one
 * that does. On a GPU the loader fills pinned buffers and each batch is copied to the
 * device while the previous one computes. */
#ifndef RN_EVAL_H
#define RN_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rn/ckpt.h"
#include "rn/loader.h"
#include "rn/runner.h"

/* Defaults, next to the flags of rn-eval that override them. */
#define RN_EVAL_BATCH 64
#define RN_EVAL_CROP 224
#define RN_EVAL_WORKERS 4
#define RN_EVAL_TOPK 5
#define RN_EVAL_PROFILE_WARMUP 3 /* --profile: batches forwarded before the profiled ones */
#define RN_EVAL_PROFILE_STEPS 5  /* --profile: batches profiled */

typedef struct {
    const char *data;
    const char *device;
    rn_backend_opts backend;/* the backend's settings (rn_eval_defaults: the defaults) */
    int threads, workers, batch, crop, resize;
    size_t mem_limit;       /* as rn_train_opts */
    int topk;               /* the "top-k" accuracy besides top-1 (5) */
    const char *dump_logits;/* safetensors of per-sample logits in dataset order, or NULL
                               (rank 0 writes it; other ranks' is ignored) */
    rn_dist *dist;          /* the ranks to shard over (NULL: this process alone) */
    const char *profile;    /* per-layer timing (rn/prof.h) instead of the evaluation: forward
                               profile_warmup batches, then profile_steps profiled ones (the
                               dataset from its start again when it ends), write the table here
                               and the trace to PATH.json; nothing is scored. One process only.
                               NULL: off */
    int profile_warmup, profile_steps;
    FILE *progress;
    int progress_tty;
} rn_eval_opts;

typedef struct {
    int64_t n;
    double top1, topk, loss;
    int n_classes;
    int64_t *confusion;     /* (n_classes, n_classes) true x predicted counts, malloc'ed */
    char **class_names;     /* borrowed from the checkpoint or dataset; may be NULL */
} rn_eval_result;

void rn_eval_defaults(rn_eval_opts *o);
/* Evaluate ck (running BN statistics, no gradients) on o->data, over o->dist's ranks
 * when it has more than one (every rank calls it; results as rn_eval_run's: r->confusion
 * is filled on rank 0 only). Free r->confusion. Errors: those of the steps; under a
 * dist every rank returns an error when any rank fails (rn_dist_agree). */
int rn_eval(const rn_eval_opts *o, const rn_ckpt *ck, rn_eval_result *r);

/* A loader of path with the eval transform (shorter side to resize, -1: round(crop *
 * 256/224), 0: none; centre crop crop x crop), in order, the last batch short, in be's
 * pinned memory on a device (destroy it before be). dist (NULL: alone) with W > 1 ranks:
 * batches of W * batch records, of which this rank gets whole runs of `batch`
 * (rn_loader_opts.unit) as rank-th of W parts: slices start at multiples of batch in the
 * epoch, as one process's batches do, and the last batch leaves some ranks a short or
 * an empty slice. Give rn_eval_run a runner with the same dist and a network whose
 * micro-batch divides batch. Errors as rn_loader_create. */
int rn_eval_loader_open(const char *path, int batch, int crop, int resize, int workers, const rn_dist *dist,
                        rn_backend *be, rn_loader **l);

/* Evaluate r's network (rn_runner_net, either mode; running BN statistics) on loader l
 * (from rn_eval_loader_open with r->dist) from its position to the end of that epoch.
 * Images are forwarded in runs of r->micro that start at multiples of r->micro in the
 * epoch. Every rank of r->dist must call it; each forwards its slices and rank 0 scores
 * every image in loader order (above). Fills res's n, top1, topk, loss on every rank
 * (rank 0's, broadcast), and adds to res->confusion on rank 0 when it is not NULL
 * (res->n_classes square; other ranks' is left as it is). logits, unless NULL, receives
 * every sample's logits in loader order ((count, classes) floats): rank 0's only, other
 * ranks pass NULL. The loss is each image's softmax cross-entropy, computed in double
 * from its logits and added in loader order. progress, when tty, gets a redrawn
 * "eval i/n images" line (rank 0 only). Errors: those of the loader and the network;
 * under a dist, those of rn_dist_*, and every rank fails when one does. */
int rn_eval_run(rn_runner *r, rn_loader *l, int topk, rn_eval_result *res, float *logits, FILE *progress,
                int tty);

#endif
