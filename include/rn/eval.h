/* rn/eval.h: evaluation of a checkpoint over a dataset (rn-eval, and rn-train's --val):
 * the eval transform, running BN statistics, no gradients; top-1, top-k, mean loss and
 * the confusion matrix.
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

typedef struct {
    const char *data;
    const char *device;
    rn_backend_opts backend;/* the backend's settings (rn_eval_defaults: the defaults) */
    int threads, workers, batch, crop, resize;
    size_t mem_limit;       /* as rn_train_opts */
    int topk;               /* the "top-k" accuracy besides top-1 (5) */
    const char *dump_logits;/* safetensors of per-sample logits in dataset order, or NULL */
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
/* Evaluate ck (running BN statistics, no gradients) on o->data. Free r->confusion. */
int rn_eval(const rn_eval_opts *o, const rn_ckpt *ck, rn_eval_result *r);

/* A loader of path with the eval transform (shorter side to resize, -1: round(crop *
 * 256/224), 0: none; centre crop crop x crop), in order, the last batch short, in be's
 * pinned memory on a device (destroy it before be). Errors as rn_loader_create. */
int rn_eval_loader_open(const char *path, int batch, int crop, int resize, int workers, rn_backend *be,
                        rn_loader **l);

/* Evaluate r's network (rn_runner_net, either mode; running BN statistics) on loader l
 * from its position to the end of that epoch. Fills res's n, top1, topk, loss, and
 * adds to res->confusion when it is not NULL (res->n_classes square). logits, unless
 * NULL, receives every sample's logits in loader order ((count, classes) floats).
 * progress, when tty, gets a redrawn "eval i/n images" line. Errors: those of the
 * loader and the network. */
int rn_eval_run(rn_runner *r, rn_loader *l, int topk, rn_eval_result *res, float *logits, FILE *progress,
                int tty);

#endif
