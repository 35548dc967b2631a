/* rn/train.h: the training loop (rn-train) over a dataset.
 *
 * Memory: before allocating, the network's bytes at the micro-batch are checked against
 * the memory plan (rn/runner.h); a plan that does not fit fails with RN_ENOMEM naming
 * the largest micro-batch (a divisor of batch) that does, and micro_batch = -1 (auto)
 * takes it. On a GPU the loader fills pinned buffers and each batch is copied to the device on
 * its own stream (rn_backend_upload_async) while the previous step computes.
 *
 * Training: the loader delivers batches of `batch` images; each is split into `accum`
 * micro-batches of batch/accum, run forward and backward one after another with the
 * loss divided by accum (BN statistics per micro-batch, as PyTorch computes them under
 * accumulation), then one SGD step. Schedules are functions of the optimiser step, so
 * accumulation never changes them. Everything a run depends on (weights, BN buffers,
 * momentum, step, epoch, loader position, seed) is in the checkpoint, and all
 * randomness is counter-based: training 2N steps, or N, saving, resuming and N more,
 * gives the same tensors bit for bit.
 *
 * Mixed precision (amp RN_F16 or RN_BF16; the CUDA backend only): the network computes
 * in that type on fp32 master weights (rn/net.h). fp16 multiplies the loss by a dynamic
 * loss scale (rn/scaler.h, torch.cuda.amp.GradScaler's rule; across all micro-batches of
 * a step), checks the accumulated gradients for inf/NaN before the step, unscales them
 * in the fused SGD pass, or skips the step and backs the scale off. A skipped step still
 * counts as a step (the schedule, the log and --max-steps count batches), as PyTorch's
 * loop steps its scheduler whether or not GradScaler skipped optimizer.step(). The scale
 * and its growth tracker are saved in and restored from the checkpoint (TrainState),
 * so resuming stays exact. bf16 runs without a loss scale, as in PyTorch.
 *
 * Many processes (o->dist with world W > 1, rn/dist.h): batch stays the global batch of
 * one optimiser step. Every rank walks the same batches (one permutation per (seed,
 * epoch), the same augmentation per record) and computes batch/W images in
 * batch/(W x accum) micro-batches, dealt out in turn: rank r's micro-batch a is
 * micro-batch a*W + r of one process with --accum W x accum (the loader's interleave).
 * Each micro-batch's gradients are summed over the ranks in a round of their own
 * (rn_dist_sum_round: each rank adds the world's copies of its chunk onto its running
 * sum, rank 0 first; the last round gathers the sums), so they add up in one process's
 * order, ((g0 + g1) + g2) + ...; the loss likewise; every BN layer's batch statistics of
 * every micro-batch are gathered and replayed into the running statistics in global
 * order (rn_net_bn_replay), so every rank holds the same weights, momentum and buffers:
 * bit for bit on the CPU, one process with --accum W x accum. fp16's inf/NaN check runs
 * on the summed gradients, so every rank skips the same steps. Rank 0 alone reports and
 * writes checkpoints; the stored loader position is global, so a run resumes on any
 * number of processes. A stop signal on any rank stops all at the same step boundary
 * (the flag is reduced every step).
 *
 * Synchronised BN (o->sync_bn, PyTorch's SyncBatchNorm): each BN layer normalises rank
 * r's micro-batch a with the statistics of micro-batch a of every rank together
 * (batch/accum images), gathered per layer in the forward and their gradient sums in the
 * backward (rn_net_set_sync over rn_dist_allgather); every rank updates the running
 * statistics once per micro-batch index with the same global statistics, so nothing is
 * captured or replayed. With accum 1 this is one process with the same --batch and no
 * --accum, up to float rounding (the statistics are combined from per-rank sums in
 * double, in another order than one process sums the whole batch): not bit for bit.
 * The checkpoint records accum as the per-rank accum, the micro-batches BN saw. In a
 * world of one sync_bn changes nothing; with freeze_bn there are no batch statistics.
 *
 * Profiling (o->profile): the run takes profile_warmup + profile_steps steps (its
 * max_steps) and the last profile_steps of them are timed layer by layer (rn_net_set_prof)
 * with the step's stages around them: "data-wait" (the loader), "input" (staging and the
 * normalise into the net's input, per micro-batch), "h2d-wait" (the asynchronous upload
 * of the next batch), "grad-sum" (many processes: the gradient and loss sums and the BN
 * statistics' gather), "sgd" or "lars" (the optimiser step). The table and trace are written
 * (rn_prof_write) instead of the checkpoint. The numbers are those of an unprofiled run.
 *
 * Moving average of the weights (o->ema_decay, torchvision's --model-ema): after every
 * optimiser step whose index within its epoch is a multiple of ema_every, the average
 * of the parameters and BN running statistics is updated (rn_net_ema_update) with
 * alpha = min(1, (1 - decay) * batch * ema_every / epochs), batch the global --batch (the
 * reference's world_size x batch_size) and epochs lr.total_epochs (the run's length), as
 * avg = (1 - alpha) * avg + alpha * w, in torch's float order; the first update (and the
 * first after each update in an epoch below lr.warmup_epochs, where the reference resets
 * n_averaged) copies the model. The set, its settings and its update count are saved in
 * the checkpoint (EmaState), so resuming stays exact; --val evaluates the average too.
 *
 * Output: progress lines on o->progress, the JSONL log at o->log_path and the event file
 * in o->tensorboard (rank 0 only, opened before the first step) are the sinks of an
 * rn_report (rn/report.h, rn/tbevent.h); evaluation with --val is rn_eval_run
 * (rn/eval.h); the learning rate is rn_lr_at (rn/schedule.h). */
#ifndef RN_TRAIN_H
#define RN_TRAIN_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "rn/augment.h"
#include "rn/backend.h"
#include "rn/ckpt.h"
#include "rn/dist.h"
#include "rn/eval.h"
#include "rn/mix.h"
#include "rn/scaler.h"
#include "rn/schedule.h"

/* Defaults of the seed recipe, next to the flags that override them. */
#define RN_TRAIN_LR 0.01
#define RN_TRAIN_MOMENTUM 0.9
#define RN_TRAIN_WD 1e-4
#define RN_TRAIN_LR_STEP 10
#define RN_TRAIN_LR_GAMMA 0.1
#define RN_TRAIN_LR_END 1e-4      /* --lr-end: poly's final lr (MLPerf's end_learning_rate) */
#define RN_TRAIN_LR_POWER 2.0     /* --lr-power: poly's exponent (MLPerf's "pow2") */
#define RN_TRAIN_WARMUP_DECAY 0.01 /* --warmup-decay: linear and constant warm-ups' start
                                      factor (torchvision's --lr-warmup-decay) */
#define RN_TRAIN_LARS_ETA 0.001   /* --lars-eta: MLPerf's trust coefficient */
#define RN_TRAIN_LARS_EPS 0.0     /* --lars-eps: epsilon of MLPerf's TensorFlow LARSOptimizer */

enum { RN_OPT_SGD = 0, RN_OPT_LARS }; /* rn_train_opts.optimizer */
#define RN_TRAIN_BATCH 256
#define RN_TRAIN_CROP 224
#define RN_TRAIN_WORKERS 4
#define RN_TRAIN_LOG_EVERY 20
/* The train loss and top-1 stay on the device for up to this many steps (fewer with a
 * smaller log_every) and are read back at once: a diverged loss stops the run at the next
 * read, naming its step, with nothing saved after it. */
#define RN_TRAIN_METRICS_RING 64
#define RN_TRAIN_OVERFIT_STEPS 200 /* --overfit-batches without --epochs or --max-steps */
#define RN_TRAIN_OVERFIT_FIT 0.05  /* a final pass below this loss: the model fits the batches */
#define RN_TRAIN_PROFILE_WARMUP 3  /* --profile: unprofiled steps first (allocation, caches, autotuning) */
#define RN_TRAIN_PROFILE_STEPS 5   /* --profile: steps profiled after them */
#define RN_TRAIN_GPU_SAMPLE 0.1    /* --gpu-sample: seconds between readings of the GPU (rn/gpumon.h) */

/* rn_train_opts.recompute: RN_TRAIN_RECOMPUTE_NONE keeps every activation backward reads;
 * _BLOCKS recomputes each residual block's inside in backward (rn/net.h, RN_NET_RECOMPUTE:
 * the same bits in less memory, for about one more forward); _AUTO (rn_train_defaults)
 * is none, unless micro_batch is -1 (auto) and the largest micro-batch that fits needs
 * accumulation: then rn_runner_net's rule (RN_RUNNER_RECOMPUTE_AUTO) may choose blocks. */
enum { RN_TRAIN_RECOMPUTE_AUTO = -1, RN_TRAIN_RECOMPUTE_NONE = 0, RN_TRAIN_RECOMPUTE_BLOCKS = 1 };

#define RN_TRAIN_EMA_EVERY 32      /* --ema-every: torchvision's --model-ema-steps */

typedef struct {
    const char *data;       /* training dataset */
    const char *val;        /* validation dataset evaluated after each epoch, or NULL */
    const char *out;        /* checkpoint written at save points and at the end */
    const char *log_path;   /* JSONL log, or NULL */
    const char *tensorboard;/* folder of TensorBoard event files (rn/tbevent.h), or NULL */
    const char *dump_grads; /* safetensors of this run's first step's gradients (and its batch), or NULL */
    const char *profile;    /* per-layer timing (rn/prof.h): run profile_warmup steps, then profile_steps
                               profiled ones, write the table to this path and the trace to
                               PATH.json, and stop without writing o->out; NULL: off */
    int profile_warmup, profile_steps;
    double gpu_sample;      /* a CUDA device with NVML: read its utilisation, memory and power every
                               gpu_sample seconds in a thread (rn/gpumon.h); each step event carries
                               the means (rn_step_info.gpu). 0: off. Rank 0's device only */
    const char *device;     /* "auto", "cpu", "cuda[:N]" */
    rn_backend_opts backend;/* the backend's settings (rn_train_defaults: the defaults) */
    int threads, workers;
    int batch, accum, crop;
    int micro_batch;        /* 0: batch/accum; > 0: images per micro-batch (a divisor of batch,
                               accum left 1); -1: auto, the largest divisor that fits in memory */
    size_t mem_limit;       /* bytes the network may plan for; 0: the device's free memory
                               less 5% of its total (rn_backend_mem_info) */
    int recompute;          /* RN_TRAIN_RECOMPUTE_*: activation checkpointing (RN_NET_RECOMPUTE) */
    int resize;             /* eval transform (--val, augment none): shorter side before the
                               centre crop; -1: round(crop*256/224); 0: no resize */
    int val_crop;           /* --val's centre crop; 0: crop. Another size evaluates on a second,
                               inference-only net of that size, loaded with the weights */
    int val_resize;         /* --val's resize; -1: resize, and when that is -1 too
                               round(val_crop*256/224); 0: no resize */
    int crop_sched[4];      /* --crop-schedule START, END, E1, E2 (rn_train_crop_at); START 0: off */
    rn_augment augment;     /* the training chain (rn/augment.h; n = 0: the eval transform) */
    int shuffle;            /* 1 or 0 */
    int ra_reps;            /* repeated augmentation: each record K times per batch, each
                               copy its own draws (rn_loader_opts.repeats; 1: off) */
    int64_t overfit_batches;/* > 0: every epoch is the first N batches of epoch 0, the same
                               images and crops each time (rn_loader_opts.epoch_batches; N
                               over the dataset's batches: all of them, said on progress);
                               at the end the first and last epochs' losses are compared
                               (rn_train_overfit_verdict) on progress */
    int epochs;             /* epochs to run, counted from the checkpoint's epoch */
    int64_t max_steps;      /* stop after this many optimiser steps in this run (0: no limit) */
    int64_t save_every;     /* also save every N steps (0: only at the end) */
    int log_every;          /* steps between log lines */
    uint64_t seed;
    int seed_given;         /* else the checkpoint's seed is kept */
    double momentum, weight_decay, label_smoothing;
    rn_mix_opts mix;        /* mixup/cutmix of each micro-batch (rn/mix.h); alphas 0: off */
    int nesterov, wd_mode;    /* wd_mode: RN_WD_* (rn/net.h): --no-wd-bn, --no-wd-norm */
    int optimizer;          /* RN_OPT_SGD or RN_OPT_LARS (rn_net_set_lars) */
    double clip_grad_norm;  /* > 0: clip the gradients' global 2-norm to it (rn_net_set_clip) */
    int cuda_graphs;        /* each micro-batch's forward and backward, and the optimiser
                               step, captured once and replayed as one launch each
                               (rn/replay.h; a backend with graphs, one process, no --profile) */
    double lars_eta, lars_eps;
    int freeze_bn;          /* BN uses and keeps its running statistics (rn_net_freeze_bn) */
    int sync_bn;            /* many processes: BN statistics over every rank's micro-batch of
                               the same index (rn_net_set_sync); nothing in a world of one */
    int sum_per_step;       /* many processes: 0 (--sum-every micro-batch): every micro-batch's
                               gradients summed over the ranks in a round of their own, the
                               order of one process; 1 (step): each rank's micro-batches added
                               first, one sum per step (rounding differs under accum > 1) */
    int amp;                /* RN_F32 (off), RN_F16 or RN_BF16 (rn/tensor.h) */
    double loss_scale;      /* fp16: initial loss scale, when the checkpoint holds none */
    int scale_growth_interval; /* fp16: clean steps before the loss scale doubles */
    double ema_decay;       /* the weights' moving average (rn_net_ema_*): torchvision's decay;
                               0: off (a checkpoint's EMA set is dropped); < 0: the
                               checkpoint's, off when it holds none */
    int ema_every;          /* optimiser steps between EMA updates, counted within each epoch
                               (an update after its step 0, every, 2 every, ...); 0: the
                               checkpoint's, else RN_TRAIN_EMA_EVERY */
    rn_lr_schedule lr;
    volatile sig_atomic_t *stop; /* set (to the signal number) by a handler: save and return RN_EINTR
                               (with many processes, *stop then holds the largest signal
                               number any rank got) */
    rn_dist *dist;          /* the processes this run is split over (NULL: this one alone) */
    FILE *progress;         /* stderr */
    int progress_tty;       /* redraw one status line instead of printing lines */
    int argc;
    char **argv;            /* for provenance */
} rn_train_opts;

/* --crop-schedule (FFCV's progressive resizing): the training crop of epoch index e
 * (counted from 0, the log's epoch e + 1) for sched = {START, END, E1, E2}: START up to E1,
 * END from E2, in between START + (END - START)(e - E1)/(E2 - E1) rounded to a multiple of
 * 32 (half to even, as numpy's round). sched[0] == 0: crop. */
int rn_train_crop_at(const int sched[4], int crop, int e);

void rn_train_defaults(rn_train_opts *o);

/* Train ck in place and write o->out at save points and at the end. Returns RN_OK,
 * RN_EINTR (stopped by *o->stop after saving), RN_ENUMERIC (non-finite loss: nothing
 * saved after the last good save point), or another error. */
int rn_train(const rn_train_opts *o, rn_ckpt *ck);

/* The overfit check's verdict: the mean loss of the first and of the last of `passes`
 * whole passes over the `batches` batches, after `steps` steps, as one line (no newline)
 * into buf: whether the loss fell towards zero (below RN_TRAIN_OVERFIT_FIT) and, if not,
 * what to try (fewer than two, nothing to compare: more steps). Returns 1 when the model
 * fits the batches, else 0. */
int rn_train_overfit_verdict(double first, double last, int64_t passes, int64_t steps, int64_t batches, char *buf,
                             size_t cap);

#endif
