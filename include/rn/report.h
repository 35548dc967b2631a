/* rn/report.h: what a training run tells the world as it goes, behind one interface.
 *
 * rn_train (rn/train.h) emits four events: begin (once, the run's shape), step (every
 * log_every optimiser steps and at each epoch's last), epoch (after each epoch and its
 * validation) and end (once, before the final save). Each goes to every sink of an
 * rn_report, in the order they were added. Three sinks come with the library: the
 * progress lines on stderr (rn_report_progress), the JSONL log (rn_report_jsonl) and
 * TensorBoard event files (rn_report_tensorboard, in rn/tbevent.h). Another sink (a
 * profiler, a logger that only rank 0 keeps) is an rn_reporter with its own callbacks;
 * a callback left NULL is not called. Sinks do not fail the run: an output that cannot
 * be written is the sink's own business.
 *
 *   rn_report rep = {0};
 *   rn_reporter s;
 *   if (rn_report_jsonl(fopen("train.jsonl", "a"), &s) == RN_OK) rn_report_add(&rep, &s);
 *   rn_report_begin(&rep, &run); ... rn_report_step(&rep, &st); ... rn_report_end(&rep, n);
 *   rn_report_close(&rep);
 */
#ifndef RN_REPORT_H
#define RN_REPORT_H

#include <stdint.h>
#include <stdio.h>

/* The run, once its network is built. */
typedef struct {
    const char *arch;        /* "resnet50" */
    const char *device;      /* rn_backend_name */
    int64_t steps_per_epoch;
    int64_t step;            /* optimiser steps the checkpoint had taken: the run's first is step + 1 */
    int batch, accum, micro; /* batch = accum x micro images per optimiser step */
    int ra_reps;             /* repeated augmentation: each batch's records K times (1: off) */
    double net_bytes;        /* rn_net_bytes */
    int recompute;           /* the net recomputes its blocks in backward (RN_NET_RECOMPUTE) */
    double recompute_saved;  /* the bytes that saves, by the memory plan */
    int amp;                 /* RN_F32, RN_F16 or RN_BF16 */
    double loss_scale;       /* fp16: the loss scale the run starts with */
    int workers;             /* loader threads (the progress advice names them) */
    int world;               /* processes the run is split over (rn/dist.h); 1 alone.
                                accum counts the micro-batches of all of them */
} rn_run_info;

/* A window of optimiser steps since the last step event. */
typedef struct {
    int epoch;               /* 1-based epoch the steps belong to */
    int64_t step;            /* optimiser steps taken, counting the run's checkpoint */
    int64_t epoch_step;      /* steps taken in this epoch */
    int64_t steps_per_epoch;
    int64_t steps_left;      /* steps this run still has to take */
    double loss;             /* mean loss over the window */
    double train_top1;       /* fraction of the window's images whose top-1 is their dominant target (the
                                label; with mixup/cutmix the one of larger weight), as torchvision's
                                reference counts acc1; < 0: not measured */
    double lr;               /* learning rate of the window's last step */
    double img_s;            /* images per second over the window */
    double data_wait;        /* fraction of the window spent waiting for the loader */
    int scaled;              /* fp16 loss scaling on: loss_scale and skipped apply */
    double loss_scale;       /* after the window's last step; 1 when not scaled */
    int64_t skipped;         /* steps the loss scaler skipped in the window */
    int has_grad_norm;       /* 1: --clip-grad-norm measured the window's last step */
    double grad_norm;        /* its gradient norm before clipping (NaN for NaN gradients) */
    int last;                /* the window ends its epoch */
    int world;               /* processes (1 alone); with more, the stragglers: */
    double step_s_min, step_s_max; /* the fastest and slowest rank's seconds per step */
    double wait_min, wait_max;     /* the least and most data-wait fraction of a rank */
    int fast_rank, slow_rank;      /* who they are (by step time) */
    int gpu;                       /* 1: the device was sampled (rn/gpumon.h): the means below */
    double gpu_util;               /* mean utilisation over the window, percent; NaN: not known */
    double gpu_mem_used;           /* mean device memory in use, bytes; NaN: not known */
    double gpu_power_w;            /* mean board power, watts; NaN: not known */
    /* the gradient sum of the window's last step on this rank (0 when not overlapped):
       buckets, those started during the backward, those finished during it */
    int buckets, buckets_early, buckets_done_early;
} rn_step_info;

/* An epoch, its training and (when has_val) its validation. */
typedef struct {
    int epoch;               /* 1-based, the one just finished */
    int64_t step;            /* optimiser steps taken after it */
    double train_loss;       /* mean of the steps' losses */
    double lr;               /* of its last step */
    double seconds, img_s;
    int crop;                /* its training crop (--crop, or --crop-schedule's) */
    int has_val;
    double val_top1, val_top5, val_loss;
    int64_t val_n;
    int has_ema_val;       /* the same validation of the EMA weights (rn-train --ema-decay) */
    double ema_top1, ema_top5, ema_loss;
} rn_epoch_info;

typedef struct {
    void (*begin)(void *ctx, const rn_run_info *run);
    void (*step)(void *ctx, const rn_step_info *s);
    void (*epoch)(void *ctx, const rn_epoch_info *e);
    /* unreported: steps taken since the last step event */
    void (*end)(void *ctx, int64_t unreported);
    /* free ctx (and close what the sink opened) */
    void (*close)(void *ctx);
    void *ctx;
} rn_reporter;

#define RN_REPORT_SINKS 8

typedef struct {
    rn_reporter sink[RN_REPORT_SINKS];
    int n;
} rn_report;

/* Add a sink; rep owns it from here (rn_report_close closes it). Errors: RN_EINVAL
 * when RN_REPORT_SINKS are already there (s is closed). */
int rn_report_add(rn_report *rep, const rn_reporter *s);
void rn_report_begin(rn_report *rep, const rn_run_info *run);
void rn_report_step(rn_report *rep, const rn_step_info *s);
void rn_report_epoch(rn_report *rep, const rn_epoch_info *e);
void rn_report_end(rn_report *rep, int64_t unreported);
/* Close every sink; rep is empty afterwards. */
void rn_report_close(rn_report *rep);

/* Progress on f (stderr; borrowed): a header line, a line per step event (with "GPU N%"
 * when the device was sampled), the validation result, and advice: without GPU figures,
 * once, to add --workers when the loader held back more than 20% of a window; with them,
 * at most once per epoch, rn_gpumon_advice's line when the GPU was under 90% busy.
 * tty != 0: each step line redraws the last. Errors:
 * RN_ENOMEM. */
int rn_report_progress(FILE *f, int tty, rn_reporter *out);

/* One JSON object a line on f (opened for appending; the sink owns and closes it):
 * {"kind":"step",...} per step event and {"kind":"epoch",...} per epoch, each flushed
 * at once. Returns RN_OK. */
int rn_report_jsonl(FILE *f, rn_reporter *out);

/* Seconds on the monotonic clock: the time base of reports. */
double rn_report_clock(void);

#endif
