/* The training loop: set a run up, take optimiser steps (micro-batches, the loss
 * scaler), account epochs and validation, report, and save. */
#include "rn/train.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/backend.h"
#include "rn/err.h"
#include "rn/gpumon.h"
#include "rn/loader.h"
#include "rn/net.h"
#include "rn/prof.h"
#include "rn/replay.h"
#include "rn/report.h"
#include "rn/runner.h"
#include "rn/safetensors.h"
#include "rn/state.h"
#include "rn/tbevent.h"
#include "rn/tensor.h"

void rn_train_defaults(rn_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "auto";
    rn_backend_opts_init(&o->backend);
    o->workers = RN_TRAIN_WORKERS;
    o->batch = RN_TRAIN_BATCH;
    o->accum = 1;
    o->recompute = RN_TRAIN_RECOMPUTE_AUTO;
    o->crop = RN_TRAIN_CROP;
    o->resize = -1;
    o->val_resize = -1;
    rn_augment_default(&o->augment);
    o->shuffle = 1;
    o->ra_reps = 1;
    o->epochs = 1;
    o->log_every = RN_TRAIN_LOG_EVERY;
    o->momentum = RN_TRAIN_MOMENTUM;
    o->weight_decay = RN_TRAIN_WD;
    o->mix.prob = RN_MIX_PROB;
    o->mix.switch_prob = RN_MIX_SWITCH;
    o->lr.schedule = RN_LR_STEP;
    o->lr.lr = RN_TRAIN_LR;
    o->lr.step_epochs = RN_TRAIN_LR_STEP;
    o->lr.gamma = RN_TRAIN_LR_GAMMA;
    o->lr.lr_end = RN_TRAIN_LR_END;
    o->lr.power = RN_TRAIN_LR_POWER;
    o->lr.warmup_decay = RN_TRAIN_WARMUP_DECAY;
    o->optimizer = RN_OPT_SGD;
    o->lars_eta = RN_TRAIN_LARS_ETA;
    o->lars_eps = RN_TRAIN_LARS_EPS;
    o->amp = RN_F32;
    o->loss_scale = RN_SCALER_INIT;
    o->scale_growth_interval = RN_SCALER_INTERVAL;
    o->progress = stderr;
    o->profile_warmup = RN_TRAIN_PROFILE_WARMUP;
    o->profile_steps = RN_TRAIN_PROFILE_STEPS;
    o->gpu_sample = RN_TRAIN_GPU_SAMPLE;
    o->ema_decay = -1;
}

/* The first step's gradients (unscaled: times `unscale`, 1/loss_scale under fp16 AMP),
 * and the batch they came from (u8 pixels and labels, so a reference can recompute them
 * from the same input). */
static int dump_grads(rn_net *net, const rn_ckpt *ck, const char *path, const rn_batch *b, const uint8_t *pixels,
                      const int32_t *labels, float unscale, const rn_mix_desc *mix, int nmix) {
    rn_st_tensor *t = rn_calloc(ck->n_params + 2, sizeof *t);
    if (!t) return RN_ENOMEM;
    int rc = RN_OK;
    t[ck->n_params] = (rn_st_tensor){.name = "input.pixels", .dtype = RN_U8, .ndim = 4, .shape = {b->n, b->h, b->w, b->c},
                                     .data = pixels, .nbytes = (size_t)b->n * b->h * b->w * b->c};
    t[ck->n_params + 1] = (rn_st_tensor){.name = "input.labels", .dtype = RN_I32, .ndim = 1, .shape = {b->n},
                                         .data = (const uint8_t *)labels, .nbytes = sizeof(int32_t) * (size_t)b->n};
    for (size_t i = 0; i < ck->n_params && rc == RN_OK; i++) {
        const rn_ptensor *p = ck->params[i];
        int64_t numel = rn_numel(p->shape, p->n_shape);
        float *g = rn_malloc(sizeof(float) * (size_t)numel);
        if (!g) {
            rc = RN_ENOMEM;
            break;
        }
        t[i] = (rn_st_tensor){.name = p->name, .dtype = RN_F32, .ndim = (int)p->n_shape, .data = (uint8_t *)g,
                              .nbytes = sizeof(float) * (size_t)numel};
        memcpy(t[i].shape, p->shape, sizeof(int64_t) * p->n_shape);
        rc = rn_net_grad(net, p->name, g, numel);
        if (unscale != 1.0f)
            for (int64_t k = 0; k < numel; k++) g[k] *= unscale;
    }
    /* mixing on: "mix" says how each micro-batch of the dumped pixels was mixed, one "kind lambda y0 y1 x0 x1"
       per micro-batch, ";"-separated, lambda to the last bit */
    char mixs[1024] = "";
    for (int i = 0; mix && i < nmix; i++) {
        size_t at = strlen(mixs);
        snprintf(mixs + at, sizeof mixs - at, "%s%s %.17g %d %d %d %d", i ? ";" : "",
                 mix[i].kind == RN_MIX_MIXUP ? "mixup" : mix[i].kind == RN_MIX_CUTMIX ? "cutmix" : "none",
                 mix[i].lambda, mix[i].y0, mix[i].y1, mix[i].x0, mix[i].x1);
    }
    /* --augment's erase: the pixels are u8 before it, so "erase" gives what a replay applies after
       normalising: "key epoch" then each image's "x y w h rec random", ";"-separated */
    char *erases = NULL;
    if (rc == RN_OK && b->erase) {
        size_t cap = 64 + (size_t)b->n * 72, at;
        if (!(erases = rn_malloc(cap))) rc = RN_ENOMEM;
        for (int i = 0; erases && i < b->n; i++) {
            if (i == 0) snprintf(erases, cap, "%llu %lld", (unsigned long long)b->erase_key, (long long)b->erase_epoch);
            at = strlen(erases);
            const rn_erase *e = &b->erase[i];
            snprintf(erases + at, cap - at, ";%d %d %d %d %u %d", e->x, e->y, e->w, e->h, e->rec, e->random);
        }
    }
    const char *k[4] = {"arch", "content"}, *v[4] = {ck->model->arch, "gradients of the first optimiser step"};
    int nk = 2;
    if (mix) k[nk] = "mix", v[nk++] = mixs;
    if (erases) k[nk] = "erase", v[nk++] = erases;
    if (rc == RN_OK) rc = rn_st_write(path, t, (int)ck->n_params + 2, k, v, nk);
    free(erases);
    for (size_t i = 0; i < ck->n_params; i++) free((void *)t[i].data);
    free(t);
    return rc ? rn_error_context(rc, "--dump-grads %s", path) : RN_OK;
}

/* Steps taken since a point in time (the last report, the epoch's start). */
typedef struct {
    int64_t steps, skipped, hits, seen;
    double t0, wait, loss;
} window;

/* A run in progress: what setup makes, the loop reads and finish frees. */
typedef struct {
    const rn_train_opts *o;
    rn_ckpt *ck;
    rn_run_state st;      /* where the run stands; into ck at each save */
    rn_runner r;
    rn_runner vr;         /* --val's net when its input differs from t->r's (on t->r's backend) */
    int crop, crop_max;   /* the training crop of this epoch, the largest of the run (--crop-schedule) */
    rn_loader *l, *vl;    /* training data; validation data or NULL */
    rn_report rep;
    rn_scaler sc;         /* fp16's loss scale, when scaled */
    int scaled;
    int64_t spe;          /* steps per epoch */
    int micro, accum;     /* images per forward, forwards per step on this rank */
    /* many processes (rn/dist.h) */
    rn_dist *dist;
    int world, rank;
    int many;             /* the collectives run (rn_dist_many): world > 1, or RN_DIST_SOLO=1 */
    int rounds;           /* many processes: the gradient sum's rounds a step (rn/dist.h), one
                             for each of the step's last `rounds` micro-batches, summed as
                             their backwards go: accum, or 1 (--sum-every step); 0: alone */
    float *dpack, *dscratch; /* a device backend's: the overlapped sum's buffers (nparams) */
    float *drun;          /* and with rounds > 1, its running sums (rn_dist_run_floats) */
    int64_t nrun;         /* ... their floats */
    int steps;            /* micro-batches per optimiser step over all ranks: world x accum */
    float *stats;         /* (accum, nstats) this rank's micro-batches' BN batch statistics */
    float *all_stats;     /* (world x accum, nstats) every rank's, in global order; then as
                             many again for the gather, in rank order */
    /* each micro-batch's train loss and top-1 hits, left on the device by its backward
       and rn_top1_count and read back once for many steps (flush): a step waits for
       neither. Slot (j, k): pending step j's micro-batch k. */
    void *metrics;        /* backend memory: (ring, accum) floats of loss, then as many int32 hits */
    void *metrics_h;      /* its host copy */
    int ring;             /* steps it holds */
    int npend;            /* steps in it not yet read */
    int64_t pend_step;    /* the first one's step number */
    window w, ep;         /* the steps since the last report, since the epoch started */
    int64_t nstats;
    rn_prof *prof;        /* o->profile: the profile; NULL: off */
    int profiling;        /* this step is profiled */
    rn_gpumon *mon;       /* the device's sampler (o->gpu_sample, rank 0, NVML); NULL: none */
    /* the weights' moving average (o->ema_decay); ema 0: off */
    int ema, ema_every;
    double ema_decay, ema_alpha;
    float ema_keep, ema_take; /* torch's decay and 1 - decay of ExponentialMovingAverage, as floats */
    int64_t ema_updates;  /* AveragedModel.n_averaged */
    /* the next step's batch, taken and its copy to the device started before this step's
       optimiser step (take_ahead); have_ahead 0: none */
    rn_batch ahead;
    int have_ahead;
    int ahead_rc;         /* taking it failed: the next step fails with this, and ahead_err */
    char ahead_err[1024];
    int64_t ahead_epoch, ahead_index; /* the loader's position before it: a checkpoint's */
    /* --cuda-graphs: micro-batch k's forward and backward as graphs[k] (rn/replay.h),
       reading its labels from glabels (the step's, copied there: the staging buffers
       alternate) and leaving its loss and hits in gmet (accum floats, then accum int32),
       copied into the metrics ring after the step's last; NULL: off */
    rn_replay *graphs;
    int32_t *glabels;
    void *gmet;
    double *gmix;         /* with mixing: the micro-batch's mixing weight, then (int32 at
                             gmix + 1) its top-1 target, uploaded before its graph runs */
    int graphs_said;      /* a failed capture's note is printed */
    rn_replay gstep;      /* --cuda-graphs: the optimiser step's ops (rn_net_step_ops) */
    int gstep_said;       /* ... its failed capture's note is printed */
} run;

/* A stage of the step as a span of the profile (rn/prof.h) when this step is profiled. */
static double tbeg(run *t, const char *name) { return t->profiling ? rn_prof_begin(t->prof, name) : 0; }

static int tend(run *t, double t0, const char *name, int track, double flops, double bytes, int rc) {
    return t->profiling ? rn_prof_end(t->prof, t0, name, RN_PROF_STEP, track, flops, bytes, rc) : rc;
}

/* What one optimiser step did. */
typedef struct {
    double waited;        /* seconds this rank spent waiting for the loader */
    int64_t seen;         /* images of every rank (their loss and top-1 hits: flush) */
    double lr;
    int skipped;          /* the loss scaler skipped it */
    double grad_norm;     /* before clipping (--clip-grad-norm); NaN: not measured */
    int last;             /* it ended an epoch */
    rn_dist_sum_stats sum; /* many processes, overlapped: how the gradient sum went */
} step_result;

static void window_reset(window *w) { *w = (window){.t0 = rn_report_clock()}; }

static int imax(int a, int b) { return a > b ? a : b; }

/* Where the training data stands for a checkpoint: before the batch taken ahead, which
 * no step has used yet. */
static void data_position(const run *t, int64_t *epoch, int64_t *index) {
    if (t->have_ahead || t->ahead_rc) *epoch = t->ahead_epoch, *index = t->ahead_index;
    else rn_loader_position(t->l, epoch, index);
}

/* The batch taken ahead given back unused (the run stops or changes its loader); its
 * copy may still be reading the loader's pinned buffer. */
static void drop_ahead(run *t) {
    if (!t->have_ahead) return;
    (void)rn_backend_upload_wait(t->r.be); /* (a failure shows at the next op, or not at all) */
    rn_loader_release(t->l, &t->ahead);
    t->have_ahead = 0;
}

static int set_crop(run *t, int c, int loader);

int rn_train_crop_at(const int sched[4], int crop, int e) {
    if (!sched[0]) return crop;
    if (e <= sched[2]) return sched[0];
    if (e >= sched[3]) return sched[1];
    double x = sched[0] + (double)(sched[1] - sched[0]) * (e - sched[2]) / (sched[3] - sched[2]);
    return (int)nearbyint(x / 32) * 32; /* np.round: half to even in the default rounding mode */
}

/* The training loader, positioned where ck left off; ck takes the dataset's class
 * names when it has none. */
static int setup_data(run *t) {
    const rn_train_opts *o = t->o;
    rn_loader_opts lo;
    rn_loader_defaults(&lo);
    rn_runner_loader_memory(&lo, t->r.be);
    lo.crop = t->crop;
    lo.batch = o->batch;
    lo.workers = o->workers;
    lo.train = 1;
    lo.aug = o->augment;
    lo.resize = o->resize;
    lo.shuffle = o->shuffle;
    lo.drop_last = 1; /* every step sees a full batch (BN needs more than one value) */
    lo.seed = t->st.seed;
    lo.epoch_batches = o->overfit_batches;
    lo.repeats = o->ra_reps;
    /* this rank's slice of every global batch: micro-batches rank, rank + world, ... */
    lo.part = t->rank;
    lo.parts = t->world;
    lo.unit = t->micro;
    lo.interleave = 1;
    int rc = rn_loader_create(o->data, &lo, &t->l);
    if (rc) return rc;
    const rn_dataset_info *info = rn_loader_info(t->l);
    if ((rc = rn_runner_check_data(o->data, info, t->ck))) return rc;
    if (t->st.data_epoch || t->st.data_index) {
        if ((rc = rn_loader_seek(t->l, t->st.data_epoch, t->st.data_index))) return rc;
    } else if (t->st.epoch) {
        if ((rc = rn_loader_seek(t->l, t->st.epoch, 0))) return rc;
    }
    if ((rc = rn_state_set_class_names(t->ck, info->class_names, info->n_classes))) return rc;
    t->spe = rn_loader_batches_per_epoch(t->l);
    if (t->spe < 1)
        return rn_errorf(RN_EDATA, "%s: %llu images do not fill one batch of %d (lower --batch)", o->data,
                         (unsigned long long)info->count, o->batch);
    t->st.steps_per_epoch = t->spe;
    if (o->overfit_batches > t->spe && t->rank == 0 && o->progress)
        fprintf(o->progress, "rn-train: --overfit-batches %lld: %s holds %lld batches of %d: overfitting all %lld\n",
                (long long)o->overfit_batches, o->data, (long long)t->spe, o->batch, (long long)t->spe);
    return RN_OK;
}

/* rn_net_set_sync's gather: every rank's BN statistics or gradient sums of one layer */
static int gather_bn(void *dist, const void *mine, size_t bytes, void *all) {
    return rn_dist_allgather(dist, mine, bytes, all, "the gather of a synchronised BN layer");
}

/* The optimiser's settings that a training network carries (a new one at each crop, too):
 * LARS or SGD, and gradient clipping. */
static int set_optimiser(run *t) {
    const rn_train_opts *o = t->o;
    int rc = rn_net_set_lars(t->r.net, o->optimizer == RN_OPT_LARS, o->lars_eta, o->lars_eps);
    /* a replayed forward counts its batch in train.c (run_micro); its loss reads the
       mixing weight of its step from the device */
    rn_net_count_by_caller(t->r.net, o->cuda_graphs);
    rn_net_set_mix_at(t->r.net, t->gmix);
    return rc ? rc : rn_net_set_clip(t->r.net, o->clip_grad_norm);
}

/* Many processes run one plan: the backend's kind (host or device), the micro-batch,
 * recomputation, --sum-every and --bucket-mb decide which collectives a step makes and
 * how large they are, so a rank
 * whose plan differs would pair its collectives with other ones (a hang, or wrong sums).
 * --device auto (a CPU where a process finds no GPU) chooses per process, and so would
 * --micro-batch auto without common_plan: a difference is an error on every rank, naming
 * it. */
static int agree_plan(run *t) {
    enum { K = 5 };
    const int64_t mine[K] = {rn_backend_is_host(t->r.be), t->r.micro, t->r.recompute, t->o->sum_per_step,
                             (int64_t)rn_dist_bucket(t->dist)};
    int64_t *all = rn_malloc(sizeof mine * (size_t)t->world);
    /* (a rank that cannot take part must not leave the others in the gather) */
    int rc = rn_dist_agree(t->dist, all ? RN_OK : RN_ENOMEM, "comparing the processes' plans");
    if (rc == RN_OK) rc = rn_dist_allgather(t->dist, mine, sizeof mine, all, "the processes' plans");
    /* every rank's smallest micro-batch: the same advice on each */
    int64_t least = rc == RN_OK ? all[1] : 0;
    for (int r = 1; rc == RN_OK && r < t->world; r++)
        if (all[K * r + 1] < least) least = all[K * r + 1];
    for (int r = 1; rc == RN_OK && r < t->world; r++) {
        const int64_t *p = all + K * r;
        if (p[0] != all[0])
            rc = rn_errorf(RN_EINVAL, "the processes run on different devices: rank 0 on %s, rank %d on %s "
                           "(--device auto takes the CPU where a process finds no usable GPU: run rn-gpuinfo on "
                           "that node, or give --device cuda or --device cpu)",
                           all[0] ? "the CPU" : "a GPU", r, p[0] ? "the CPU" : "a GPU");
        else if (p[1] != all[1])
            rc = rn_errorf(RN_EINVAL, "the processes planned different micro-batches: rank 0 %lld images, rank %d "
                           "%lld%s: give every process --micro-batch %lld",
                           (long long)all[1], r, (long long)p[1],
                           t->o->micro_batch < 0 ? " (--micro-batch auto follows each process's free memory)" : "",
                           (long long)least);
        else if (p[2] != all[2])
            rc = rn_errorf(RN_EINVAL, "the processes planned differently: rank 0 %s blocks, rank %d %s: give every "
                           "process --recompute blocks or --recompute none",
                           all[2] ? "recomputes" : "keeps", r, p[2] ? "recomputes" : "keeps");
        else if (p[3] != all[3])
            rc = rn_errorf(RN_EINVAL, "the processes sum differently: rank 0 --sum-every %s, rank %d --sum-every %s: "
                           "give every process the same", all[3] ? "step" : "micro-batch", r,
                           p[3] ? "step" : "micro-batch");
        else if (p[4] != all[4])
            rc = rn_errorf(RN_EINVAL, "the processes sum in different buckets: rank 0 --bucket-mb %g, rank %d "
                           "--bucket-mb %g: give every process the same", (double)all[4] / 1e6, r,
                           (double)p[4] / 1e6);
    }
    free(all);
    return rc;
}

/* Many processes: each plans for its own memory, then those under --micro-batch auto take
 * the smallest micro-batch any process planned (or one gave), and those under the default
 * --recompute recompute when any process does at that micro-batch; *want and *mode are
 * set to that plan. The same collectives on every rank, whatever its flags; a process's
 * given --micro-batch or --recompute is kept, and agree_plan names a difference. *note
 * (cap bytes) is what rank 0 says when the plan is taken. */
static int common_plan(run *t, int share, int *want, int *mode, char *note, size_t cap) {
    const rn_train_opts *o = t->o;
    int micro = 0, rec = 0, world = t->world;
    int free_micro = *want == 0, free_rec = o->recompute == RN_TRAIN_RECOMPUTE_AUTO;
    /* per rank: its micro-batch (negative: given), its --batch; then whether it recomputes */
    int64_t *all = rn_malloc(sizeof(int64_t) * 2 * (size_t)world);
    int rc = all ? rn_runner_plan(&t->r, t->ck, share, *want, o->mem_limit, t->crop_max, *mode, o->amp, &micro, &rec)
                 : RN_ENOMEM;
    if ((rc = rn_dist_agree(t->dist, rc, "planning the network"))) {
        free(all);
        return rc;
    }
    int64_t mine[2] = {free_micro ? micro : -micro, o->batch};
    rc = rn_dist_allgather(t->dist, mine, sizeof mine, all, "the processes' micro-batches");
    int least = micro, who = t->rank, differ = 0, any_free = 0;
    for (int r = 0; rc == RN_OK && r < world; r++) {
        int m = (int)(all[2 * r] < 0 ? -all[2 * r] : all[2 * r]);
        if (all[2 * r + 1] != o->batch) {
            rc = rn_errorf(RN_EINVAL, "the processes were given different --batch: rank %d %lld, rank %d %d: give "
                           "every process the same global batch", r, (long long)all[2 * r + 1], t->rank, o->batch);
            break;
        }
        if (m < least || (m == least && r < who)) least = m, who = r;
        differ |= all[2 * r] != all[0];
        any_free |= all[2 * r] > 0;
    }
    int given = rc == RN_OK && all[2 * who] < 0;
    if (rc == RN_OK) { /* (every rank agrees, whether it planned again or not) */
        if (free_micro && least != micro)
            rc = rn_runner_plan(&t->r, t->ck, share, least, o->mem_limit, t->crop_max, *mode, o->amp, &micro, &rec);
        rc = rn_dist_agree(t->dist, rc, "planning the network at the processes' micro-batch");
    }
    if (rc == RN_OK) {
        int64_t r1 = rec;
        rc = rn_dist_allgather(t->dist, &r1, sizeof r1, all, "the processes' recomputation");
    }
    int needs = -1; /* the first rank that recomputes */
    for (int r = 0; rc == RN_OK && r < world && needs < 0; r++)
        if (all[r]) needs = r;
    free(all);
    if (rc) return rc;
    if (free_micro) *want = least;
    if (free_rec) *mode = (*mode & ~RN_RUNNER_RECOMPUTE_AUTO & ~RN_NET_RECOMPUTE) | (needs >= 0 ? RN_NET_RECOMPUTE : 0);
    char rnote[64] = "";
    if (needs >= 0) snprintf(rnote, sizeof rnote, ", recomputing blocks as rank %d must", needs);
    note[0] = 0;
    if (any_free && differ)
        snprintf(note, cap, "rn-train: --micro-batch auto: every process trains micro-batches of %d, %s rank %d's "
                 "%s%s\n", least, given ? "as" : "the most that", who, given ? "--micro-batch gives" : "memory fits",
                 rnote);
    return RN_OK;
}

/* --ema-decay, else the checkpoint's decay (0: no average) */
static double ema_decay_of(const rn_train_opts *o, const rn_ckpt *ck) {
    return o->ema_decay >= 0 ? o->ema_decay : ck->ema ? ck->ema->decay : 0;
}

/* The network at the micro-batch asked for (or the largest that fits), the validation
 * loader, and fp16's loss scaler (the checkpoint's scale when resuming). */
static int setup_net(run *t) {
    const rn_train_opts *o = t->o;
    int share = o->batch / t->world; /* this rank's images per step */
    int want = o->micro_batch > 0 ? o->micro_batch : o->micro_batch < 0 ? 0 : share / o->accum;
    /* the two optimisers' momentum buffers mean different things (torch's buffer, LARS's
       last step): resuming one as the other would silently corrupt the run */
    const char *kind = rn_state_optim_kind(t->ck), *want_kind = o->optimizer == RN_OPT_LARS ? "lars" : "sgd";
    if (kind && strcmp(kind, want_kind) != 0)
        return rn_errorf(RN_EINVAL, "the checkpoint holds %s momentum and this run asks for --optimizer %s: resume "
                         "with --optimizer %s", kind, want_kind, kind);
    int mode = RN_NET_TRAIN;
    if (o->recompute == RN_TRAIN_RECOMPUTE_BLOCKS)
        mode |= RN_NET_RECOMPUTE;
    else if (o->recompute == RN_TRAIN_RECOMPUTE_AUTO && want == 0)
        mode |= RN_RUNNER_RECOMPUTE_AUTO;
    /* what the run holds beside the net, counted by the plan: the EMA weights and
       statistics, and with many processes the gradient sum's buffers (two of the
       gradients' size, rn_dist's on the host or t->dpack and t->dscratch on a device, and
       the running sums of a sum in rounds when the rank's share is split: this rank's
       chunk of the gradients, about 1/world of them) */
    rn_resnet spec;
    int64_t np, ns;
    int rc = rn_ckpt_net(t->ck, &spec);
    if (rc || (rc = rn_net_param_floats(&spec, &np, &ns))) return rc;
    int ema = ema_decay_of(o, t->ck) > 0, sum = t->many;
    t->r.also = sizeof(float) * ((ema ? (size_t)(np + ns) : 0) + (sum ? 2 * (size_t)np : 0));
    t->r.also_split = sum && !o->sum_per_step ? sizeof(float) * (size_t)rn_dist_run_floats(t->dist, np) : 0;
    snprintf(t->r.also_what, sizeof t->r.also_what, "%s%s%s", sum ? "the gradient sum's buffers" : "",
             sum && ema ? " and " : "", ema ? "the EMA weights" : "");
    char note[256] = "";
    if (t->many && (rc = common_plan(t, share, &want, &mode, note, sizeof note))) return rc;
    rc = rn_runner_net(&t->r, t->ck, share, want, o->mem_limit, t->crop_max, mode, o->amp);
    /* (a rank that failed here must not leave the others waiting in the next collective) */
    if (t->many && (rc = rn_dist_agree(t->dist, rc, "building the network")) == RN_OK) rc = agree_plan(t);
    if (rc) return rc;
    if (note[0] && t->rank == 0 && o->progress) fputs(note, o->progress);
    if ((rc = set_optimiser(t))) return rc;
    t->micro = t->r.micro;
    t->accum = share / t->micro;
    t->steps = t->world * t->accum;
    t->rounds = !t->many ? 0 : o->sum_per_step ? 1 : t->accum;
    if (t->many) {
        if ((rc = rn_dist_attach(t->dist, t->r.be))) return rc;
        if (o->sync_bn && !o->freeze_bn) {
            if ((rc = rn_net_set_sync(t->r.net, t->world, gather_bn, t->dist))) return rc;
        } else if (!o->freeze_bn) {
            /* BN's running statistics: captured per micro-batch, replayed in global order */
            t->nstats = rn_net_bn_stats_len(t->r.net);
            t->stats = rn_malloc(sizeof(float) * (size_t)(t->accum * t->nstats));
            t->all_stats = rn_malloc(2 * sizeof(float) * (size_t)(t->steps * t->nstats)); /* (and the gather's) */
            if (!t->stats || !t->all_stats) return RN_ENOMEM;
            if ((rc = rn_net_bn_capture(t->r.net, 1))) return rc;
        }
    }
    if (o->val) {
        int vcrop = o->val_crop ? o->val_crop : o->crop, vresize = o->val_resize >= 0 ? o->val_resize : o->resize;
        if ((rc = rn_eval_loader_open(o->val, t->micro, vcrop, vresize, o->workers, t->r.dist, t->r.be, &t->vl)))
            return rc;
        if ((rc = rn_runner_check_data(o->val, rn_loader_info(t->vl), t->ck))) return rc;
        if (vcrop != o->crop || o->crop_sched[0]) { /* a net has one input size: another, for inference */
            t->vr.be = t->r.be;
            t->vr.dist = t->r.dist;
            /* (planned against the memory left by the training net, before the EMA and the
               gradient sum's buffers are allocated: those count beside it) */
            t->vr.also = t->r.also + (t->rounds > 1 ? t->r.also_split : 0);
            snprintf(t->vr.also_what, sizeof t->vr.also_what, "%s", t->r.also_what);
            if ((rc = rn_runner_net(&t->vr, t->ck, t->micro, t->micro, 0, vcrop, RN_NET_INFER, RN_F32)))
                return rn_error_context(rc, "the --val-crop network");
        }
    }
    rn_net_freeze_bn(t->r.net, o->freeze_bn);
    /* fp16 scales the loss; bf16 has fp32's range and runs without, as in PyTorch */
    t->scaled = o->amp == RN_F16;
    if (t->scaled) {
        if ((rc = rn_scaler_init(&t->sc, o->loss_scale, RN_SCALER_GROWTH, RN_SCALER_BACKOFF,
                                 o->scale_growth_interval)))
            return rc;
        if (t->st.loss_scale > 0) { /* resuming: the checkpoint's scale and tracker */
            t->sc.scale = (float)t->st.loss_scale;
            t->sc.growth_tracker = t->st.scale_growth_tracker;
        }
    }
    return RN_OK;
}

/* The GPU's sampler on rank 0 (its step events carry the means). A backend without a
 * device (the CPU) has nothing to sample and nothing is said; a GPU whose NVML cannot be
 * read is said once, and the run goes on without the figures. */
static void setup_gpumon(run *t) {
    const rn_train_opts *o = t->o;
    if (t->rank != 0 || o->gpu_sample <= 0) return;
    char bus[64];
    int rc = rn_backend_pci_bus_id(t->r.be, bus, sizeof bus);
    if (rc == RN_ENOTSUP) return;
    rn_gpumon_source src;
    if (rc == RN_OK && (rc = rn_gpumon_nvml(bus, &src)) == RN_OK) rc = rn_gpumon_start(&src, o->gpu_sample, &t->mon);
    if (rc && o->progress)
        fprintf(o->progress, "rn-train: GPU utilisation is not logged (gpu_util, gpu_mem_used, gpu_power_w): %s\n",
                rn_last_error());
}

/* The sinks of o: the JSONL log, the TensorBoard event file, then progress lines. */
static int setup_report(run *t) {
    const rn_train_opts *o = t->o;
    rn_reporter s;
    int rc;
    if (t->rank == 0 && o->log_path) {
        FILE *f = fopen(o->log_path, "a");
        if (!f) return rn_errorf(RN_EIO, "--log %s: cannot open for appending", o->log_path);
        if ((rc = rn_report_jsonl(f, &s))) return rc;
        if ((rc = rn_report_add(&t->rep, &s))) return rc;
    }
    if (t->rank == 0 && o->tensorboard) {
        rn_tb_writer *w;
        if ((rc = rn_tb_open(o->tensorboard, &w))) return rn_error_context(rc, "--tensorboard");
        if ((rc = rn_report_tensorboard(w, "rn-train", o->argc, o->argv, o->progress ? o->progress : stderr, &s)))
            return rc;
        if ((rc = rn_report_add(&t->rep, &s))) return rc;
    }
    if (t->rank == 0 && o->progress) {
        if ((rc = rn_report_progress(o->progress, o->progress_tty, &s))) return rc;
        if ((rc = rn_report_add(&t->rep, &s))) return rc;
    }
    rn_run_info info = {.arch = t->ck->model->arch, .device = rn_backend_name(t->r.be), .steps_per_epoch = t->spe,
                        .step = t->st.step, .batch = o->batch, .accum = t->steps, .micro = t->micro, .world = t->world,
                        .ra_reps = o->ra_reps,
                        .net_bytes = (double)rn_net_bytes(t->r.net), .amp = o->amp,
                        .recompute = t->r.recompute, .recompute_saved = (double)t->r.recompute_saved,
                        .loss_scale = t->scaled ? t->sc.scale : 1.0, .workers = o->workers};
    rn_report_begin(&t->rep, &info);
    return RN_OK;
}

/* The divisors of n, as "1, 2, 4 or 8", for the messages of a batch that does not split. */
static void divisors(int n, char *buf, size_t cap) {
    size_t len = 0;
    int count = 0, last = 0;
    buf[0] = 0;
    for (int d = 1; d <= n && len + 16 < cap; d++)
        if (n % d == 0) {
            if (last) len += snprintf(buf + len, cap - len, "%s%d", count++ ? ", " : "", last);
            last = d;
        }
    snprintf(buf + len, cap - len, "%s%d", count ? " or " : "", last);
}

/* The moving average's settings from o and the checkpoint, its set in the net (the
 * checkpoint's when it has one). */
static int setup_ema(run *t) {
    const rn_train_opts *o = t->o;
    const Rn__EmaState *e = t->ck->ema;
    t->ema_decay = ema_decay_of(o, t->ck);
    t->ema_every = o->ema_every > 0 ? o->ema_every : e ? e->every : RN_TRAIN_EMA_EVERY;
    if (t->ema_decay <= 0) {
        if (e && t->rank == 0 && o->progress)
            fprintf(o->progress, "rn-train: --ema-decay 0: the EMA weights of the input are dropped; %s will hold "
                    "none\n", o->out);
        rn_state_ema_drop(t->ck);
        return RN_OK;
    }
    if (t->ema_decay > 1) return rn_errorf(RN_EINVAL, "--ema-decay %g: give a decay in (0, 1]", t->ema_decay);
    t->ema = 1;
    int epochs = o->lr.total_epochs > 0 ? o->lr.total_epochs : t->st.epoch + o->epochs;
    /* torchvision's train.py: adjust = world_size * batch_size * model_ema_steps / epochs */
    double adjust = (double)o->batch * t->ema_every / (epochs > 0 ? epochs : 1);
    t->ema_alpha = fmin(1.0, (1.0 - t->ema_decay) * adjust);
    double decay = 1.0 - t->ema_alpha; /* ExponentialMovingAverage(decay=1 - alpha) */
    t->ema_keep = (float)decay;
    t->ema_take = (float)(1.0 - decay);
    int rc = rn_net_ema_enable(t->r.net);
    if (rc) return rc;
    t->ema_updates = 0;
    if (e) {
        if ((rc = rn_net_ema_load(t->r.net, t->ck))) return rn_error_context(rc, "the EMA weights of the input");
        t->ema_updates = e->updates;
        return RN_OK;
    }
    /* AveragedModel starts as a deep copy of the model (a run stopped before its first
       update saves that, not zeros); the first update copies again */
    return rn_net_ema_update(t->r.net, 0, 0, 1);
}

/* After the step of index i within its epoch: the reference's
 * `if i % model_ema_steps == 0: update_parameters; if epoch < warmup: n_averaged = 0`. */
static int ema_step(run *t, int64_t i) {
    if (!t->ema || i % t->ema_every) return RN_OK;
    int rc = rn_net_ema_update(t->r.net, t->ema_keep, t->ema_take, t->ema_updates == 0);
    if (rc) return rc;
    t->ema_updates++;
    if (t->st.epoch < t->o->lr.warmup_epochs) t->ema_updates = 0;
    return RN_OK;
}

static int setup(run *t) {
    const rn_train_opts *o = t->o;
    char valid[256];
    t->dist = o->dist;
    t->world = rn_dist_world(o->dist);
    t->many = rn_dist_many(o->dist);
    t->rank = rn_dist_rank(o->dist);
    /* (rn-train refuses --profile first, saying why) */
    if (o->cuda_graphs && o->profile)
        return rn_errorf(RN_EINVAL, "--cuda-graphs with --profile: a graph runs no host code between its ops");
    if (o->cuda_graphs && t->many)
        return rn_errorf(RN_EINVAL, "--cuda-graphs runs in one process%s: with %d%s, the gradient sum and BN's "
                         "statistics are exchanged between the ops a graph would hold (drop --cuda-graphs)",
                         t->world > 1 ? "" : " without collectives", t->world,
                         t->world > 1 ? "" : " under RN_DIST_SOLO=1");
    if (o->batch % t->world) {
        int below = o->batch / t->world * t->world;
        return rn_errorf(RN_EINVAL,
                         "--batch %d does not split over %d processes: the global batch must be a multiple of the "
                         "process count (e.g. %d or %d)",
                         o->batch, t->world, below > 0 ? below : t->world, below + t->world);
    }
    int share = o->batch / t->world;
    if (o->accum < 1 || share % o->accum) {
        divisors(share, valid, sizeof valid);
        if (t->world > 1)
            return rn_errorf(RN_EINVAL, "--accum %d: each of %d processes computes %d images of --batch %d per step, "
                             "which does not split into %d micro-batches (valid --accum: %s)",
                             o->accum, t->world, share, o->batch, o->accum, valid);
        return rn_errorf(RN_EINVAL, "--batch %d is not a multiple of --accum %d", o->batch, o->accum);
    }
    if (o->micro_batch > 0 && share % o->micro_batch) {
        divisors(share, valid, sizeof valid);
        if (t->world > 1)
            return rn_errorf(RN_EINVAL, "--micro-batch %d: each of %d processes computes %d images of --batch %d "
                             "per step (valid --micro-batch: %s)", o->micro_batch, t->world, share, o->batch, valid);
        return rn_errorf(RN_EINVAL, "--batch %d is not a multiple of --micro-batch %d", o->batch, o->micro_batch);
    }
    if (o->micro_batch && o->accum != 1)
        return rn_errorf(RN_EINVAL, "--micro-batch and --accum both set the micro-batch: give one");
    rn_state_get(t->ck, &t->st);
    if (o->seed_given || t->st.step == 0) t->st.seed = o->seed;
    int rc = rn_runner_open(&t->r, o->device, o->threads, &o->backend);
    if (rc) return rc;
    if (o->cuda_graphs && !rn_backend_has_graphs(t->r.be))
        return rn_errorf(RN_EINVAL, "--cuda-graphs needs a backend with graphs (--device cuda); this run is on %s",
                         rn_backend_name(t->r.be));
    t->r.dist = o->dist;
    /* --crop-schedule: this epoch's crop; the memory planned for the largest of the run */
    t->crop = rn_train_crop_at(o->crop_sched, o->crop, t->st.epoch);
    t->crop_max = t->crop;
    for (int e = 0; o->crop_sched[0] && e <= o->crop_sched[3]; e++)
        t->crop_max = imax(t->crop_max, rn_train_crop_at(o->crop_sched, o->crop, e));
    /* many processes: the loader deals out micro-batches, known once the plan is agreed
       (one process opens it first, as it always has: the plan then sees its memory taken) */
    if (!t->many && (rc = setup_data(t))) return rc;
    if ((rc = setup_net(t))) return rc;
    if (t->many && (rc = setup_data(t))) return rc;
    if ((rc = setup_ema(t))) return rc;
    if ((rc = set_crop(t, t->crop, 0))) return rc;
    if (t->rounds && !rn_backend_is_host(t->r.be)) {
        /* a device backend's sum packs its buckets in memory of its own (2 x the gradients,
           and the running sums of a sum in rounds: this rank's chunk of them) */
        int64_t n, nrun;
        int rounds = t->rounds > 1;
        rn_net_grads(t->r.net, &n);
        nrun = t->nrun = rounds ? rn_dist_run_floats(t->dist, n) : 0;
        if ((rc = rn_backend_alloc(t->r.be, sizeof(float) * (size_t)n, (void **)&t->dpack)) ||
            (rc = rn_backend_alloc(t->r.be, sizeof(float) * (size_t)n, (void **)&t->dscratch)) ||
            (rounds && (rc = rn_backend_alloc(t->r.be, sizeof(float) * (size_t)nrun, (void **)&t->drun))))
            return rn_error_context(rc, "the gradient sum's buffers (2 x %lld floats and %lld)", (long long)n,
                                    (long long)nrun);
    }
    t->ring = o->log_every < 1 ? 1 : o->log_every < RN_TRAIN_METRICS_RING ? o->log_every : RN_TRAIN_METRICS_RING;
    size_t mb = 2 * sizeof(float) * (size_t)t->ring * (size_t)t->accum;
    if ((rc = rn_backend_alloc(t->r.be, mb, &t->metrics)))
        return rn_error_context(rc, "the train loss and top-1 of %d steps", t->ring);
    if (!(t->metrics_h = rn_malloc(mb))) return RN_ENOMEM;
    if (o->cuda_graphs) {
        if (!(t->graphs = rn_calloc((size_t)t->accum, sizeof *t->graphs))) return RN_ENOMEM;
        if ((rc = rn_backend_alloc(t->r.be, sizeof(int32_t) * (size_t)t->accum * (size_t)t->micro,
                                   (void **)&t->glabels)) ||
            (rc = rn_backend_alloc(t->r.be, 2 * sizeof(float) * (size_t)t->accum, &t->gmet)) ||
            ((o->mix.mixup > 0 || o->mix.cutmix > 0) && (rc = rn_backend_alloc(t->r.be, 2 * sizeof(double),
                                                                                (void **)&t->gmix))))
            return rn_error_context(rc, "--cuda-graphs' labels and losses");
        rn_net_set_mix_at(t->r.net, t->gmix);
    }
    if (o->profile && (rc = rn_prof_create(t->r.be, &t->prof))) return rc;
    setup_gpumon(t);
    return setup_report(t);
}

static int flush(run *t);

/* Copy the network and the run's state into ck and write it atomically. */
static int save(run *t) {
    const rn_train_opts *o = t->o;
    rn_ckpt *ck = t->ck;
    /* the losses of the steps since the last read: a diverged run saves nothing */
    int rc = flush(t);
    if (rc || t->rank != 0) return rc; /* every rank holds the same state; rank 0 writes it */
    rc = rn_net_store(t->r.net, ck);
    if (rc) return rc;
    if (t->ema) {
        if ((rc = rn_net_ema_store(t->r.net, ck))) return rc;
        ck->ema->decay = t->ema_decay;
        ck->ema->every = t->ema_every;
        ck->ema->alpha = t->ema_alpha;
        ck->ema->updates = t->ema_updates;
    }
    if ((rc = rn_state_put_sgd(ck, o->lr.lr, o->momentum, o->weight_decay, o->nesterov))) return rc;
    if (o->optimizer == RN_OPT_LARS && (rc = rn_state_put_lars(ck, o->lars_eta, o->lars_eps))) return rc;
    data_position(t, &t->st.data_epoch, &t->st.data_index);
    t->st.batch = o->batch;
    /* micro-batches of all ranks: the same run as one process with this --accum; under
       synchronised BN, the micro-batches BN saw */
    t->st.accum = o->sync_bn && !o->freeze_bn && t->many ? t->accum : t->steps;
    if ((rc = rn_state_put(ck, &t->st, &o->lr))) return rc;
    char ds[1024];
    snprintf(ds, sizeof ds, "%s (%llu records)", o->data, (unsigned long long)rn_loader_info(t->l)->count);
    if ((rc = rn_state_put_provenance(ck, o->argc, o->argv, ds))) return rc;
    return rn_ckpt_write(o->out, ck);
}

/* the graphs name the network's buffers: before it goes */
static void graphs_reset(run *t) {
    for (int k = 0; t->graphs && k < t->accum; k++) rn_replay_reset(&t->graphs[k], t->r.be);
    rn_replay_reset(&t->gstep, t->r.be);
}

static void finish(run *t) {
    drop_ahead(t);
    rn_gpumon_stop(t->mon);
    if (t->l) rn_loader_set_trace(t->l, NULL, NULL); /* before the profile goes */
    if (t->r.net) rn_net_set_prof(t->r.net, NULL);
    rn_prof_destroy(t->prof);
    free(t->stats);
    free(t->all_stats);
    free(t->metrics_h);
    if (t->r.be) {
        graphs_reset(t);
        free(t->graphs);
        rn_backend_free(t->r.be, t->glabels);
        rn_backend_free(t->r.be, t->gmet);
        rn_backend_free(t->r.be, t->gmix);
        rn_backend_free(t->r.be, t->metrics);
        rn_dist_sum_cancel(t->dist); /* (a failed step's buckets may still use them) */
        rn_backend_free(t->r.be, t->dpack);
        rn_backend_free(t->r.be, t->dscratch);
        rn_backend_free(t->r.be, t->drun);
    }
    rn_report_close(&t->rep);
    rn_loader_destroy(t->vl); /* their buffers may be the backend's pinned memory */
    rn_loader_destroy(t->l);
    if (t->vr.be) { /* the eval net, not the backend it shares */
        rn_net_destroy(t->vr.net);
        rn_backend_free(t->vr.be, t->vr.staging[0]);
        rn_backend_free(t->vr.be, t->vr.staging[1]);
    }
    rn_runner_close(&t->r);
}

/* Many processes: the sum's round for the last micro-batch ended (the last round writes
 * the summed gradients), its bucket counts added to the step's. */
static int end_round(run *t, step_result *s) {
    rn_dist_sum_stats st;
    int rc = rn_dist_sum_end(t->dist, &st);
    s->sum.buckets += st.buckets;
    s->sum.started_early += st.started_early;
    s->sum.done_early += st.done_early;
    s->sum.floats = st.floats;
    return rc;
}

/* Many processes, after this rank's micro-batches: the BN statistics of every rank's
 * micro-batches replayed in global order and the gradients summed in rank order
 * (rn/dist.h), so every rank goes on with the same numbers. (The loss and the top-1
 * hits are summed when they are read: flush.) */
static int combine(run *t, step_result *s) {
    int rc;
    /* the last backward started the buckets (rn_dist_sum_part); wait for the rest */
    if ((rc = end_round(t, s))) return rc;
    if (t->stats) {
        /* gathered rank by rank, replayed in global order: micro-batch k of rank r is
           the step's micro-batch k x world + r */
        const int W = t->world, A = t->accum;
        const size_t ns = (size_t)t->nstats;
        float *got = t->all_stats + (size_t)t->steps * ns;
        if ((rc = rn_dist_allgather(t->dist, t->stats, sizeof(float) * A * ns, got, "the gather of the BN statistics")))
            return rc;
        for (int r = 0; r < W; r++)
            for (int k = 0; k < A; k++)
                memcpy(t->all_stats + ((size_t)k * W + r) * ns, got + ((size_t)r * A + k) * ns, sizeof(float) * ns);
        if ((rc = rn_net_bn_replay(t->r.net, t->all_stats, t->steps))) return rc;
    }
    return RN_OK;
}

/* Which label of micro-batch md's rows their top-1 class is counted against, as
 * torchvision's reference counts its train acc1 (utils.accuracy on target.max(dim=1)): the
 * label with the larger weight of the soft target, float(lambda) against float(1 -
 * lambda), on a tie the smaller class index (the first maximum); unmixed, the label. */
static int top1_target(const rn_mix_desc *md) {
    float own = (float)md->lambda, other = (float)(1.0 - md->lambda);
    return md->kind == RN_MIX_NONE || own > other ? RN_TOP1_LABEL : own < other ? RN_TOP1_ROLLED : RN_TOP1_SMALLER;
}

/* The error for the first of the n pending steps whose loss is not finite, or RN_OK. */
static int diverged(const run *t, const float *loss, int n) {
    const rn_train_opts *o = t->o;
    for (int j = 0; j < n; j++)
        if (!isfinite(loss[j]))
            /* (the forward does not depend on the loss scale: skipping would not help) */
            return rn_errorf(RN_ENUMERIC,
                             "step %lld: the loss is %g: training diverged (lower --lr, check the data%s); "
                             "%s keeps the last good checkpoint",
                             (long long)(t->pend_step + j), loss[j],
                             o->amp == RN_F16 ? ", or use --amp bf16: fp16 activations overflow past 65504" : "",
                             o->out);
    return RN_OK;
}

/* This rank's micro-batch losses of the pending steps, each / steps (loss[j * accum + k]
 * for step j's micro-batch k), and each step's top-1 hits, read back in one copy. */
static int read_pending(run *t, float *loss, int64_t *hits) {
    const int a = t->accum, cap = t->ring * a;
    int rc = rn_backend_download(t->r.be, t->metrics_h, t->metrics, 2 * sizeof(float) * (size_t)cap);
    if (rc) return rn_error_context(rc, "reading back the train loss");
    const float *lo = t->metrics_h;
    const int32_t *hi = (const int32_t *)(lo + cap);
    for (int j = 0; j < t->npend; j++) {
        int64_t h = 0;
        for (int k = 0; k < a; k++) {
            loss[j * a + k] = lo[j * a + k] / t->steps;
            h += hi[j * a + k];
        }
        hits[j] = h;
    }
    return RN_OK;
}

/* Pending step j's loss from the micro-batch losses of `world` ranks (read_pending's of
 * n steps, rank after rank), added as one process adds its micro-batches' (the float
 * operations, in their order, of a read after each): in the step's order, in which
 * micro-batch k of rank r is k x world + r. */
static float step_loss(const run *t, const float *micro, int n, int world, int j) {
    const int a = t->accum;
    float l = 0;
    for (int k = 0; k < a; k++)
        for (int r = 0; r < world; r++) l += micro[((size_t)r * n + j) * a + k];
    return l;
}

/* The pending steps' train loss and top-1 hits (read_pending), summed over the ranks in
 * rank order, each step's loss checked, and added in step order to the report's window
 * and the epoch's. Every rank calls it at the same steps: at a report, a save, the end,
 * and when the ring is full. */
static int flush(run *t) {
    const int n = t->npend, world = t->world;
    if (n == 0) return RN_OK;
    const size_t nm = (size_t)n * (size_t)t->accum; /* this rank's micro-batches */
    float *micro = rn_malloc(sizeof(float) * nm * (size_t)(world + 1)), *loss = rn_malloc(sizeof(float) * (size_t)n);
    int64_t *hits = rn_malloc(sizeof(int64_t) * (size_t)n * (size_t)(world + 1));
    int rc = micro && loss && hits ? read_pending(t, micro, hits) : RN_ENOMEM;
    t->npend = 0;
    const float *all = micro;
    if (rc == RN_OK && t->many) {
        /* every rank's after this rank's own; the hits summed per step in rank order */
        all = micro + nm;
        int64_t *ah = hits + n;
        rc = rn_dist_allgather(t->dist, micro, sizeof(float) * nm, micro + nm, "the sum of the loss");
        if (rc == RN_OK)
            rc = rn_dist_allgather(t->dist, hits, sizeof(int64_t) * (size_t)n, ah, "the sum of the train top-1 hits");
        for (int j = 0; j < n && rc == RN_OK; j++) {
            hits[j] = 0;
            for (int r = 0; r < world; r++) hits[j] += ah[(size_t)r * n + j];
        }
    }
    for (int j = 0; j < n && rc == RN_OK; j++) loss[j] = step_loss(t, all, n, world, j);
    if (rc == RN_OK) rc = diverged(t, loss, n);
    for (int j = 0; j < n && rc == RN_OK; j++) {
        t->w.loss += loss[j], t->ep.loss += loss[j];
        t->w.hits += hits[j];
    }
    free(micro);
    free(loss);
    free(hits);
    return rc;
}

/* A run failing with rc while steps are pending: when one of them diverged (this rank's
 * part of its loss not finite: then the sum is not either), that is the cause the old
 * order named first, and the error returned. No collective: the ranks may be failing
 * at different places. */
static int first_cause(run *t, int rc) {
    const int n = t->npend;
    if (n == 0 || rc == RN_OK) return rc;
    float *loss = rn_malloc(sizeof(float) * (size_t)n * (size_t)(t->accum + 1));
    int64_t *hits = rn_malloc(sizeof(int64_t) * (size_t)n);
    char kept[1024];
    snprintf(kept, sizeof kept, "%s", rn_last_error());
    int out = RN_OK;
    if (loss && hits && read_pending(t, loss + n, hits) == RN_OK) {
        for (int j = 0; j < n; j++) loss[j] = step_loss(t, loss + n, n, 1, j);
        out = diverged(t, loss, n);
    }
    if (out == RN_OK) out = rn_errorf(rc, "%s", kept); /* (a failed read-back's message is not the run's) */
    t->npend = 0;
    free(loss);
    free(hits);
    return out;
}

/* rn_net_grad_fn: a gradient is final, its bucket may go (rn_dist_sum_part); profiled
 * as "grad-sum-overlap" (the packing, the buckets started and moved on meanwhile) */
static int grad_final(void *ctx, int64_t off, int64_t numel) {
    run *t = ctx;
    double t0 = tbeg(t, "grad-sum-overlap");
    return tend(t, t0, "grad-sum-overlap", RN_PROF_HOST, 0, 8.0 * (double)numel,
                rn_dist_sum_part(t->dist, off, numel));
}

/* The next batch from the loader, its copy to the device started (rn_runner_stage); on
 * failure none is held. */
static int next_batch(run *t, rn_batch *b, double *waited) {
    double t0 = tbeg(t, "data-wait"), tw = rn_report_clock();
    int rc = tend(t, t0, "data-wait", RN_PROF_HOST, 0, 0, rn_loader_next(t->l, b));
    if (rc) return rc;
    *waited = rn_report_clock() - tw;
    t0 = tbeg(t, "input");
    rc = tend(t, t0, "input", RN_PROF_COMPUTE, 0, (double)b->n * b->h * b->w * b->c, rn_runner_stage(&t->r, b));
    if (rc) {
        (void)rn_backend_upload_wait(t->r.be); /* (a copy may have started) */
        rn_loader_release(t->l, b);
    }
    return rc;
}

/* The next step's batch taken now, after this step's last backward is queued and before
 * its optimiser step: on a GPU its copy then overlaps the backward, instead of starting
 * after the fp16 overflow check's read-back and idling the GPU until it lands. (The
 * batches and their order are the loader's either way.) The wait counts in this step's
 * data-wait. A failure (a broken record) is kept for the next step, which fails with it
 * where it failed before: this step still takes its optimiser step, logs and saves. */
static void take_ahead(run *t, step_result *s) {
    data_position(t, &t->ahead_epoch, &t->ahead_index);
    double waited = 0;
    int rc = next_batch(t, &t->ahead, &waited);
    s->waited += waited;
    t->have_ahead = rc == RN_OK;
    if (rc) {
        t->ahead_rc = rc;
        snprintf(t->ahead_err, sizeof t->ahead_err, "%s", rn_last_error());
    }
}

/* --cuda-graphs: micro-batch k's forward, top-1 count and backward, the ops of its graph */
typedef struct {
    run *t;
    int k, target;
    float grad_scale;
    double mix_weight;
} micro_job;

static int micro_ops(void *ctx) {
    const micro_job *j = ctx;
    run *t = j->t;
    const int32_t *labels = t->glabels + (size_t)j->k * t->micro;
    float *loss = (float *)t->gmet + j->k;
    int32_t *hits = (int32_t *)((float *)t->gmet + t->accum) + j->k;
    int rc = rn_net_forward(t->r.net, t->micro, 1);
    int classes = t->ck->model->num_classes;
    if (rc == RN_OK && t->gmix)
        rc = rn_top1_count_at(t->r.be, t->micro, classes, rn_net_logits(t->r.net), labels,
                              (const int32_t *)(t->gmix + 1), hits);
    else if (rc == RN_OK)
        rc = rn_top1_count(t->r.be, t->micro, classes, rn_net_logits(t->r.net), labels, j->target, hits);
    if (rc == RN_OK)
        rc = rn_net_backward_dev(t->r.net, labels, t->micro, (float)t->o->label_smoothing, j->mix_weight,
                                 j->grad_scale, j->k > 0, loss);
    return rc;
}

/* --cuda-graphs: a replay whose capture failed says so, once (*said): micro-batch k's,
 * or (k < 0) the optimiser step's */
static void note_uncaptured(const run *t, int *said, const rn_replay *r, int k) {
    if (!r->off || *said) return;
    *said = 1;
    char what[64] = "the optimiser step";
    if (k >= 0) snprintf(what, sizeof what, "micro-batch %d of the step", k);
    if (t->o->progress)
        fprintf(t->o->progress, "rn-train: note: --cuda-graphs: %s could not be captured (%s); it runs without a "
                "graph from now on (the same results, more launches)\n", what, r->why);
}

/* Micro-batch k through graphs[k], keyed by everything its ops' pointers and scalars
 * follow that can change in a run: the weights' buffer (the EMA swap) and the loss scale
 * (and the mixing values, constant without mixing; with it they go to the device, gmix,
 * where the graph's loss and top-1 count read them). BN's batch count is kept here,
 * however the ops ran. */
static int run_micro(run *t, int k, const rn_mix_desc *md, float grad_scale) {
    micro_job j = {.t = t, .k = k, .target = top1_target(md), .grad_scale = grad_scale, .mix_weight = 1.0 - md->lambda};
    if (t->gmix) {
        unsigned char v[sizeof(double) + sizeof(int32_t)];
        int32_t target = j.target;
        memcpy(v, &j.mix_weight, sizeof(double));
        memcpy(v + sizeof(double), &target, sizeof target);
        int rc = rn_backend_put(t->r.be, t->gmix, v, sizeof v);
        if (rc) return rc;
        j.mix_weight = 0, j.target = RN_TOP1_LABEL; /* (read from gmix: not the key's) */
    }
    struct {
        const void *weights;
        double mix_weight;
        float grad_scale;
        int target;
    } key;
    memset(&key, 0, sizeof key); /* (its padding too: the key is compared as bytes) */
    key.weights = rn_net_weights(t->r.net);
    key.mix_weight = j.mix_weight;
    key.grad_scale = grad_scale;
    key.target = j.target;
    rn_replay *r = &t->graphs[k];
    int rc = rn_replay_run(r, t->r.be, &key, sizeof key, micro_ops, &j, NULL);
    if (rc == RN_OK) rn_net_count_batch(t->r.net, t->micro);
    note_uncaptured(t, &t->graphs_said, r, k);
    return rc;
}

/* --cuda-graphs: the optimiser step's device ops (the overflow check and SGD or LARS,
 * which read the rate and the check's verdict on the device) */
static int step_ops(void *ctx) {
    run *t = ctx;
    const rn_train_opts *o = t->o;
    return rn_net_step_ops(t->r.net, t->scaled ? &t->sc : NULL, (float)o->momentum, (float)o->weight_decay,
                           o->nesterov, o->wd_mode);
}

/* The optimiser step through gstep, keyed by what its ops follow (rn_net_step_keyof: the
 * weights' buffer, the loss scale and the momentum buffers' start); the rate goes to the
 * device first, and the overflow check's verdict comes back after (fp16). */
static int run_step(run *t, float lr, int *skipped) {
    int rc = rn_net_step_lr(t->r.net, lr);
    if (rc) return rc;
    rn_net_step_key key;
    rn_net_step_keyof(t->r.net, t->scaled ? &t->sc : NULL, &key);
    rc = rn_replay_run(&t->gstep, t->r.be, &key, sizeof key, step_ops, t, NULL);
    note_uncaptured(t, &t->gstep_said, &t->gstep, -1);
    if (rc) return rc;
    return rn_net_step_end(t->r.net, t->scaled ? &t->sc : NULL, (float)t->o->momentum, skipped);
}

/* --cuda-graphs' line at the end of a run: how the micro-batches and the steps ran */
static void graphs_summary(const run *t) {
    int64_t e = 0, c = 0, r = 0, nodes = 0;
    for (int k = 0; k < t->accum; k++) {
        const rn_replay *g = &t->graphs[k];
        e += g->eager, c += g->captures, r += g->replays;
        if (g->nodes > nodes) nodes = g->nodes;
    }
    fprintf(t->o->progress, "rn-train: --cuda-graphs: %lld micro-batches replayed, %lld captured, %lld run without "
            "a graph", (long long)r, (long long)c, (long long)e);
    if (nodes) fprintf(t->o->progress, "; a graph holds %lld launches", (long long)nodes);
    const rn_replay *g = &t->gstep;
    if (rn_net_step_on_device(t->r.net))
        fprintf(t->o->progress, "; optimiser steps: %lld replayed, %lld captured, %lld run without a graph",
                (long long)g->replays, (long long)g->captures, (long long)g->eager);
    else
        fprintf(t->o->progress, "; optimiser steps run without a graph (--clip-grad-norm reads the norm back "
                "before the update)");
    fputc('\n', t->o->progress);
}

/* Forward and backward over the micro-batches of the next batch (the first step of the
 * run also dumps its gradients when asked); then, unless this step ends an epoch or the
 * run (last_of_run), the next step's batch is taken ahead. */
static int accumulate(run *t, int first, int last_of_run, step_result *s) {
    const rn_train_opts *o = t->o;
    rn_batch b;
    int rc = RN_OK;
    if (t->ahead_rc) {
        rc = t->ahead_rc;
        t->ahead_rc = 0;
        return rn_errorf(rc, "%s", t->ahead_err);
    }
    if (t->have_ahead) {
        b = t->ahead;
        t->have_ahead = 0;
    } else if ((rc = next_batch(t, &b, &s->waited))) {
        return rc;
    }
    /* every micro-batch's gradient is scaled by the same loss scale: they add up in
       fp32 and are checked and unscaled once, at the step */
    float grad_scale = t->scaled ? (float)((double)t->sc.scale / t->steps) : 1.0f / t->steps;
    /* the input: u8 pixels read, the net's input written; 2 FLOPs (subtract, scale) each */
    double px = (double)b.h * b.w * b.c, es = rn_net_dtype(t->r.net) == RN_F32 ? 4 : 2;
    double t0;
    int mixing = o->mix.mixup > 0 || o->mix.cutmix > 0;
    rn_mix_desc mix[8]; /* the first micro-batches' mixing, for --dump-grads */
    /* this step's slots of the ring: its micro-batches' losses, then their hits */
    float *loss_d = (float *)t->metrics + (size_t)t->npend * t->accum;
    int32_t *hits_d = (int32_t *)((float *)t->metrics + (size_t)t->ring * t->accum) + (size_t)t->npend * t->accum;
    /* --cuda-graphs: the labels where the graphs read them */
    if (t->graphs)
        rc = rn_backend_copy(t->r.be, t->glabels, t->r.labels, sizeof(int32_t) * (size_t)t->accum * (size_t)t->micro);
    for (int k = 0; k < t->accum && rc == RN_OK; k++) {
        /* the mixing unit is the micro-batch; its draws are keyed by its index in the whole
           batch (this rank's k-th is micro-batch k x world + rank: setup_data), so ranks
           and --accum slice the same units the same way */
        rn_mix_desc md;
        rn_mix_draw(&o->mix, t->st.seed, t->st.step, (int64_t)k * t->world + t->rank, b.h, b.w, &md);
        if (k < 8) mix[k] = md;
        t0 = tbeg(t, "input");
        if ((rc = tend(t, t0, "input", RN_PROF_COMPUTE, 2 * px * t->micro, (1 + es) * px * t->micro,
                       rn_runner_input_mix(&t->r, &b, k * t->micro, t->micro, &md))))
            break;
        if (t->graphs) {
            rc = run_micro(t, k, &md, grad_scale);
            continue;
        }
        if ((rc = rn_net_forward(t->r.net, t->micro, 1)) ||
            (t->stats && (rc = rn_net_bn_captured(t->r.net, t->stats + (size_t)k * t->nstats))) ||
            (rc = rn_top1_count(t->r.be, t->micro, t->ck->model->num_classes, rn_net_logits(t->r.net),
                                t->r.labels + (size_t)k * t->micro, top1_target(&md), hits_d + k)))
            break;
        /* many processes: every micro-batch's backward hands each gradient to the sum as
           it becomes final, the sum's buckets going while the backward goes on; round k
           of the sum adds the ranks' k-th micro-batches onto the running sum (rn/dist.h),
           so the gradients add up in the global order of one process's micro-batches.
           The previous round ends first: its buffers are this round's. (--sum-every
           step: the last micro-batch's backward alone, its gradients added onto this
           rank's others first, one round.) */
        int round = k - (t->accum - t->rounds), hook = t->rounds && round >= 0;
        if (hook) {
            int64_t n;
            float *g = rn_net_grads(t->r.net, &n);
            if (round > 0) {
                t0 = tbeg(t, "grad-sum");
                if ((rc = tend(t, t0, "grad-sum", RN_PROF_HOST, (double)n * (t->world - 1), 4.0 * (double)n * t->world,
                               end_round(t, s))))
                    break;
            }
            if ((rc = rn_dist_sum_begin(t->dist, t->r.be, g, t->dpack, t->dscratch, n, "gradients")) ||
                (rc = rn_dist_sum_round(t->dist, round, t->rounds, t->drun, t->nrun)))
                break;
            rn_net_set_grad_hook(t->r.net, grad_final, t);
        }
        rc = rn_net_backward_dev(t->r.net, t->r.labels + (size_t)k * t->micro, t->micro, (float)o->label_smoothing,
                                 1.0 - md.lambda, grad_scale, k > 0 && t->rounds < t->accum, loss_d + k);
        if (hook) rn_net_set_grad_hook(t->r.net, NULL, NULL);
    }
    /* --cuda-graphs: the losses and hits into the ring, where flush reads them */
    if (rc == RN_OK && t->graphs && (rc = rn_backend_copy(t->r.be, loss_d, t->gmet, sizeof(float) * t->accum)) == RN_OK)
        rc = rn_backend_copy(t->r.be, hits_d, (float *)t->gmet + t->accum, sizeof(int32_t) * t->accum);
    if (rc == RN_OK && t->npend++ == 0) t->pend_step = t->st.step;
    s->seen = (int64_t)t->steps * t->micro;
    s->last = b.last;
    if (rc == RN_OK && t->many) {
        int64_t np = 0;
        rn_net_grads(t->r.net, &np);
        t0 = tbeg(t, "grad-sum");
        rc = tend(t, t0, "grad-sum", RN_PROF_HOST, (double)np * (t->world - 1), 8.0 * (double)np * t->world,
                  combine(t, s));
    }
    float unscale = t->scaled ? rn_scaler_inv(&t->sc) : 1.0f;
    /* (many processes: the gradients are the whole batch's, the pixels this rank's) */
    /* (its loss read first: a diverged step is not dumped) */
    if (rc == RN_OK && first && o->dump_grads && (rc = flush(t)) == RN_OK && t->rank == 0)
        rc = dump_grads(t->r.net, t->ck, o->dump_grads, &b, b.pixels, b.labels, unscale, mixing ? mix : NULL,
                        t->accum < 8 ? t->accum : 8);
    t0 = tbeg(t, "h2d-wait");
    int wrc = tend(t, t0, "h2d-wait", RN_PROF_HOST, 0, 0, rn_backend_upload_wait(t->r.be));
    if (rc == RN_OK) rc = wrc;
    rn_loader_release(t->l, &b);
    if (rc == RN_OK && !s->last && !last_of_run) take_ahead(t, s);
    return rc;
}

/* One optimiser step: the gradients of a batch, then SGD (or the loss scaler's skip);
 * last_of_run: no step follows (accumulate takes no batch ahead). */
static int train_step(run *t, int first, int last_of_run, step_result *s) {
    const rn_train_opts *o = t->o;
    rn_run_state *ts = &t->st;
    *s = (step_result){0};
    int rc = t->profiling ? rn_prof_step_begin(t->prof) : RN_OK;
    if (rc == RN_OK) rc = accumulate(t, first, last_of_run, s);
    if (rc) return rc;
    s->lr = rn_lr_at(&o->lr, ts->step, t->spe);
    /* SGD with momentum: 5 FLOPs per parameter; weights, gradients and momentum read,
       weights and momentum written, in fp32. LARS first reads weights and gradients for
       their norms (4 FLOPs more per parameter) */
    int64_t np = 0;
    rn_net_grads(t->r.net, &np);
    const int lars = o->optimizer == RN_OPT_LARS;
    const char *stage = lars ? "lars" : "sgd";
    double t0 = tbeg(t, stage);
    const double cf = o->clip_grad_norm > 0 ? 2.0 : 0.0, cb = o->clip_grad_norm > 0 ? 4.0 : 0.0; /* the norm's pass */
    if ((rc = tend(t, t0, stage, RN_PROF_COMPUTE, ((lars ? 9.0 : 5.0) + cf) * (double)np,
                   ((lars ? 28.0 : 20.0) + cb) * (double)np,
                   t->graphs && rn_net_step_on_device(t->r.net)
                       ? run_step(t, (float)s->lr, &s->skipped)
                       : rn_net_step(t->r.net, t->scaled ? &t->sc : NULL, (float)s->lr, (float)o->momentum,
                                     (float)o->weight_decay, o->nesterov, o->wd_mode, &s->skipped))))
        return rc;
    s->grad_norm = rn_net_grad_norm(t->r.net);
    if (t->profiling && (rc = rn_prof_step_end(t->prof))) return rc;
    if ((rc = ema_step(t, ts->step - (int64_t)ts->epoch * t->spe))) return rc;
    if (t->scaled) {
        ts->skipped_steps += s->skipped;
        ts->loss_scale = t->sc.scale;
        ts->scale_growth_tracker = t->sc.growth_tracker;
        if (!(t->sc.scale >= FLT_MIN)) {
            /* a diverged loss, read first, is the cause to name when there is one */
            if ((rc = flush(t))) return rc;
            return rn_errorf(RN_ENUMERIC,
                             "step %lld: the fp16 loss scale fell to %g: the gradients overflow at any scale "
                             "(lower --lr, or use --amp bf16); %s keeps the last good checkpoint",
                             (long long)ts->step, t->sc.scale, o->out);
        }
    }
    ts->step++;
    return RN_OK;
}

/* The step event for the steps in w, the last of which was s; run_steps taken so far in
 * this run, which ends at target_epoch. */
static int report_steps(run *t, const window *w, const step_result *s, int target_epoch, int64_t run_steps) {
    const rn_train_opts *o = t->o;
    const rn_run_state *ts = &t->st;
    double dt = rn_report_clock() - w->t0;
    /* many processes: every rank's seconds per step and data-wait, for the stragglers */
    double mine[2] = {dt / w->steps, dt > 0 ? w->wait / dt : 0}, *all = NULL;
    if (t->many) {
        if (!(all = rn_malloc(sizeof mine * (size_t)t->world))) return RN_ENOMEM;
        int rc = rn_dist_allgather(t->dist, mine, sizeof mine, all, "the gather of the step times");
        if (rc) {
            free(all);
            return rc;
        }
    }
    double ips = w->steps * o->batch / (dt > 0 ? dt : 1e-9);
    int64_t left = (int64_t)(target_epoch - ts->epoch) * t->spe - (ts->step - (int64_t)ts->epoch * t->spe);
    if (o->max_steps && o->max_steps - run_steps < left) left = o->max_steps - run_steps;
    rn_step_info si = {.epoch = ts->epoch + 1, .step = ts->step, .epoch_step = ts->step - (int64_t)ts->epoch * t->spe,
                       .steps_per_epoch = t->spe, .steps_left = left, .loss = w->loss / w->steps, .lr = s->lr,
                       .train_top1 = w->seen ? (double)w->hits / w->seen : -1,
                       .img_s = ips, .data_wait = dt > 0 ? w->wait / dt : 0, .scaled = t->scaled,
                       .loss_scale = t->scaled ? t->sc.scale : 1.0, .skipped = w->skipped, .grad_norm = s->grad_norm,
                       .has_grad_norm = o->clip_grad_norm > 0 && !s->skipped, .last = s->last,
                       .world = t->world, .step_s_min = mine[0], .step_s_max = mine[0], .wait_min = mine[1],
                       .wait_max = mine[1], .buckets = s->sum.buckets, .buckets_early = s->sum.started_early,
                       .buckets_done_early = s->sum.done_early};
    if (t->mon) {
        rn_gpumon_sample g;
        rn_gpumon_take(t->mon, &g);
        si.gpu = 1, si.gpu_util = g.util, si.gpu_mem_used = g.mem_used, si.gpu_power_w = g.power_w;
    }
    for (int r = 0; all && r < t->world; r++) {
        const double *a = all + 2 * r;
        if (a[0] < si.step_s_min || r == 0) si.step_s_min = a[0], si.fast_rank = r;
        if (a[0] > si.step_s_max || r == 0) si.step_s_max = a[0], si.slow_rank = r;
        if (a[1] < si.wait_min || r == 0) si.wait_min = a[1];
        if (a[1] > si.wait_max || r == 0) si.wait_max = a[1];
    }
    free(all);
    rn_report_step(&t->rep, &si);
    return RN_OK;
}

/* The runner --val evaluates with: t->r, or with --val-crop other than --crop the eval net
 * loaded with the weights (ema: the moving average's) through t->ck, whose own weights are
 * stored back after the moving average's. */
static int val_runner(run *t, int ema, rn_runner **out) {
    *out = &t->r;
    if (!t->vr.net) return ema ? rn_net_ema_swap(t->r.net) : RN_OK;
    int rc = ema ? rn_net_ema_swap(t->r.net) : RN_OK;
    if (rc) return rc;
    rc = rn_net_store(t->r.net, t->ck);
    int src = ema ? rn_net_ema_swap(t->r.net) : RN_OK;
    if (rc || (rc = src) || (rc = rn_net_load(t->vr.net, t->ck))) return rc;
    if (ema && (rc = rn_net_store(t->r.net, t->ck))) return rc;
    *out = &t->vr;
    return RN_OK;
}

/* --crop-schedule: the network and the loader at crop c, at an epoch boundary. The network
 * goes through t->ck (weights, momentum, BN buffers, the moving average) into one of the
 * same micro-batch at the new size, as a resume from a checkpoint would make it; the
 * loader is recreated at the position the old one had reached. */
static int set_crop(run *t, int c, int loader) {
    const rn_train_opts *o = t->o;
    if (c == t->r.crop && (!loader || c == t->crop)) return RN_OK;
    int rc;
    if (c != t->r.crop) {
        if ((rc = rn_net_store(t->r.net, t->ck))) return rc;
        if (t->ema && (rc = rn_net_ema_store(t->r.net, t->ck))) return rc;
        rn_resnet spec;
        if ((rc = rn_ckpt_net(t->ck, &spec))) return rc;
        graphs_reset(t);
        rn_net_destroy(t->r.net);
        t->r.net = NULL;
        int mode = RN_NET_TRAIN | (t->r.recompute ? RN_NET_RECOMPUTE : 0);
        if ((rc = rn_net_create(t->r.be, &spec, t->micro, c, c, mode, o->amp, &t->r.net)) ||
            (rc = rn_net_load(t->r.net, t->ck)))
            return rn_error_context(rc, "--crop-schedule");
        t->r.crop = c;
        if ((rc = set_optimiser(t))) return rc;
        if (t->many && o->sync_bn && !o->freeze_bn) {
            if ((rc = rn_net_set_sync(t->r.net, t->world, gather_bn, t->dist))) return rc;
        } else if (t->stats && (rc = rn_net_bn_capture(t->r.net, 1)))
            return rc;
        rn_net_freeze_bn(t->r.net, o->freeze_bn);
        if (t->ema && ((rc = rn_net_ema_enable(t->r.net)) || (rc = rn_net_ema_load(t->r.net, t->ck)))) return rc;
    }
    if (loader && c != t->crop) {
        int64_t de = 0, di = 0;
        data_position(t, &de, &di);
        drop_ahead(t);
        rn_loader_destroy(t->l);
        t->l = NULL;
        t->crop = c;
        rn_run_state keep = t->st;
        t->st.data_epoch = de;
        t->st.data_index = di;
        rc = setup_data(t);
        t->st = keep;
        if (rc) return rc;
    }
    t->crop = c;
    if (t->rank == 0 && o->progress)
        fprintf(o->progress, "rn-train: epoch %d: crop %d (--crop-schedule)\n", t->st.epoch + 1, c);
    return RN_OK;
}

/* The end of an epoch: validation, the epoch event, and the checkpoint's history. */
static int end_epoch(run *t, const window *ep, double lr) {
    rn_run_state *ts = &t->st;
    ts->epoch++;
    rn_epoch_info e = {.epoch = ts->epoch, .step = ts->step, .train_loss = ep->loss / (ep->steps ? ep->steps : 1),
                       .lr = lr, .seconds = rn_report_clock() - ep->t0, .crop = t->crop};
    e.img_s = ep->steps * t->o->batch / (e.seconds > 0 ? e.seconds : 1e-9);
    if (t->vl) {
        rn_eval_result vr = {0};
        rn_runner *er_run;
        int rc = rn_loader_seek(t->vl, 0, 0);
        if (rc || (rc = val_runner(t, 0, &er_run))) return rc;
        if ((rc = rn_eval_run(er_run, t->vl, RN_EVAL_TOPK, &vr, NULL, t->o->progress, t->o->progress_tty)))
            return rc;
        e.has_val = 1;
        e.val_top1 = vr.top1;
        e.val_top5 = vr.topk;
        e.val_loss = vr.loss;
        e.val_n = vr.n;
        if (t->ema) { /* the reference evaluates the EMA model too */
            rn_eval_result er = {0};
            if ((rc = rn_loader_seek(t->vl, 0, 0)) || (rc = val_runner(t, 1, &er_run))) return rc;
            rc = rn_eval_run(er_run, t->vl, RN_EVAL_TOPK, &er, NULL, t->o->progress, t->o->progress_tty);
            int src = er_run == &t->r ? rn_net_ema_swap(t->r.net) : RN_OK; /* t->r's weights back */
            if (rc || (rc = src)) return rc;
            e.has_ema_val = 1;
            e.ema_top1 = er.top1;
            e.ema_top5 = er.topk;
            e.ema_loss = er.loss;
        }
    }
    rn_report_epoch(&t->rep, &e);
    return rn_state_add_epoch(t->ck, &e);
}

/* Whether to stop before the next step: a signal here, or (many processes) on any rank,
 * so that all stop at the same step boundary. *sig: the signal number. */
static int stop_now(run *t, int *sig, int *rc) {
    int64_t v = t->o->stop ? *t->o->stop : 0;
    if (t->many && (*rc = rn_dist_max_i64(t->dist, &v, "the stop flag"))) return 1;
    *sig = (int)v;
    return v != 0;
}

/* The profile's table and trace, and a line on progress saying where they are. */
static int write_profile(run *t) {
    const rn_train_opts *o = t->o;
    if (t->rank != 0) return RN_OK;
    int64_t steps;
    double wall, spans;
    rn_prof_totals(t->prof, &steps, &wall, &spans);
    if (steps < 1)
        return rn_errorf(RN_EINVAL, "--profile %s: the run ended before the first profiled step (after %d warm-up "
                         "steps)", o->profile, o->profile_warmup);
    char title[256], trace[4096];
    snprintf(title, sizeof title, "rn-train --profile: %s on %s, batch %d in micro-batches of %d, crop %d, %s",
             t->ck->model->arch, rn_backend_name(t->r.be), o->batch, t->micro, o->crop,
             o->amp == RN_F16 ? "fp16" : o->amp == RN_BF16 ? "bf16" : "fp32");
    snprintf(trace, sizeof trace, "%s.json", o->profile);
    int rc = rn_prof_write(t->prof, title, o->profile, trace);
    if (rc) return rn_error_context(rc, "--profile");
    if (o->progress)
        fprintf(o->progress,
                "rn-train: profiled %lld steps after %d warm-up steps: %.1f ms per step, %.1f%% of it in the rows; "
                "table in %s, trace in %s; no checkpoint written\n",
                (long long)steps, o->profile_warmup, 1e3 * wall / (double)steps, wall > 0 ? 100 * spans / wall : 0,
                o->profile, trace);
    return RN_OK;
}

int rn_train(const rn_train_opts *o, rn_ckpt *ck) {
    run t = {.o = o, .ck = ck};
    int rc = setup(&t);
    if (rc) goto out;
    int target_epoch = t.st.epoch + o->epochs;
    int64_t run_steps = 0;
    window *w = &t.w, *ep = &t.ep;
    double first_pass = NAN, last_pass = NAN; /* mean loss of an epoch: the overfit check */
    int64_t passes = 0;
    window_reset(w);
    window_reset(ep);
    if (t.mon) { /* the first interval starts with the first step, as the window does */
        rn_gpumon_sample idle;
        rn_gpumon_take(t.mon, &idle);
    }
    int sig = 0;
    while (t.st.epoch < target_epoch && (o->max_steps == 0 || run_steps < o->max_steps)) {
        if (stop_now(&t, &sig, &rc)) {
            if (rc) goto out;
            break;
        }
        step_result s;
        /* (the layers are timed only inside a profiled step: not in --val's evaluation) */
        t.profiling = t.prof && run_steps >= o->profile_warmup;
        if (t.profiling) rn_net_set_prof(t.r.net, t.prof);
        /* the workers' chunks on tracks of their own, from the first profiled step on */
        if (t.profiling && run_steps == o->profile_warmup) rn_loader_set_trace(t.l, rn_prof_loader_span, t.prof);
        /* the run's last step takes no batch ahead; a profile's does, as every step it
           stands for does (the batch is given back unused) */
        int last = o->max_steps && run_steps + 1 >= o->max_steps && !t.prof;
        rc = train_step(&t, run_steps == 0, last, &s);
        if (t.profiling) rn_net_set_prof(t.r.net, NULL);
        t.profiling = 0;
        if (rc) goto out;
        run_steps++;
        w->steps++, ep->steps++;
        w->wait += s.waited;
        w->seen += s.seen;
        w->skipped += s.skipped;
        /* (the loss and the hits join the windows when they are read back) */
        if (t.npend == t.ring && (rc = flush(&t))) goto out;
        if (w->steps >= o->log_every || s.last) {
            if ((rc = flush(&t)) || (rc = report_steps(&t, w, &s, target_epoch, run_steps))) goto out;
            window_reset(w);
        }
        if (s.last) {
            last_pass = ep->loss / ep->steps;
            if (passes++ == 0) first_pass = last_pass;
            if ((rc = end_epoch(&t, ep, s.lr))) goto out;
            window_reset(ep);
            if (o->crop_sched[0] && t.st.epoch < target_epoch &&
                (rc = set_crop(&t, rn_train_crop_at(o->crop_sched, o->crop, t.st.epoch), 1)))
                goto out;
        }
        if (o->save_every && t.st.step % o->save_every == 0 && (rc = save(&t))) goto out;
    }
    if ((rc = flush(&t))) goto out;
    rn_report_end(&t.rep, w->steps);
    if (!passes && ep->steps) first_pass = last_pass = ep->loss / ep->steps; /* not one whole pass */
    rc = t.prof ? write_profile(&t) : save(&t);
    if (rc == RN_OK && t.graphs && t.rank == 0 && o->progress) graphs_summary(&t);
    if (rc == RN_OK && o->overfit_batches && t.rank == 0 && o->progress && !isnan(last_pass)) {
        char verdict[512];
        rn_train_overfit_verdict(first_pass, last_pass, passes, run_steps, t.spe, verdict, sizeof verdict);
        fprintf(o->progress, "rn-train: overfit check: %s\n", verdict);
    }
    if (sig) *o->stop = sig; /* the signal every rank agreed on */
    if (rc == RN_OK && sig && t.prof)
        rc = rn_errorf(RN_EINTR, "stopped by signal %d at step %lld; %s holds the profile of the steps before it "
                       "(no checkpoint written)", sig, (long long)t.st.step, o->profile);
    else if (rc == RN_OK && sig)
        rc = rn_errorf(RN_EINTR, "stopped by signal %d at step %lld; %s holds the state to resume from", sig,
                       (long long)t.st.step, o->out);
out:
    rc = first_cause(&t, rc);
    finish(&t);
    return rc;
}
