#include "rn/train.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rn/backend.h"
#include "rn/err.h"
#include "rn/json.h"
#include "rn/loader.h"
#include "rn/net.h"
#include "rn/safetensors.h"
#include "rn/tensor.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *sched_names[] = {"step", "multistep", "cosine", "constant"};

int rn_lr_schedule_parse(const char *name) {
    for (int i = 0; i < 4; i++)
        if (strcmp(name, sched_names[i]) == 0) return i;
    return -1;
}

const char *rn_lr_schedule_name(int s) { return s >= 0 && s < 4 ? sched_names[s] : "?"; }

int rn_amp_parse(const char *name) {
    if (strcmp(name, "off") == 0) return RN_F32;
    if (strcmp(name, "fp16") == 0) return RN_F16;
    if (strcmp(name, "bf16") == 0) return RN_BF16;
    return -1;
}

const char *rn_amp_name(int dtype) { return dtype == RN_F16 ? "fp16" : dtype == RN_BF16 ? "bf16" : "off"; }

double rn_lr_at(const rn_lr_schedule *s, int64_t step, int64_t spe) {
    if (spe < 1) spe = 1;
    int64_t epoch = step / spe;
    double lr = s->lr;
    switch (s->schedule) {
    case RN_LR_STEP:
        if (s->step_epochs > 0) lr *= pow(s->gamma, (double)(epoch / s->step_epochs));
        break;
    case RN_LR_MULTISTEP:
        for (int i = 0; i < s->n_milestones; i++)
            if (epoch >= s->milestones[i]) lr *= s->gamma;
        break;
    case RN_LR_COSINE: {
        double total = (double)(s->total_epochs > 0 ? s->total_epochs : 1) * (double)spe;
        double t = (double)step / total;
        lr *= 0.5 * (1.0 + cos(M_PI * (t < 1.0 ? t : 1.0)));
        break;
    }
    default: break;
    }
    int64_t warm = (int64_t)s->warmup_epochs * spe;
    if (step < warm) lr *= (double)(step + 1) / (double)warm;
    return lr;
}

void rn_train_defaults(rn_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "auto";
    rn_backend_opts_init(&o->backend);
    o->workers = RN_TRAIN_WORKERS;
    o->batch = RN_TRAIN_BATCH;
    o->accum = 1;
    o->crop = RN_TRAIN_CROP;
    o->resize = -1;
    o->augment = RN_AUG_RRC;
    o->shuffle = 1;
    o->epochs = 1;
    o->log_every = RN_TRAIN_LOG_EVERY;
    o->momentum = RN_TRAIN_MOMENTUM;
    o->weight_decay = RN_TRAIN_WD;
    o->lr.schedule = RN_LR_STEP;
    o->lr.lr = RN_TRAIN_LR;
    o->lr.step_epochs = RN_TRAIN_LR_STEP;
    o->lr.gamma = RN_TRAIN_LR_GAMMA;
    o->amp = RN_F32;
    o->loss_scale = RN_SCALER_INIT;
    o->scale_growth_interval = RN_SCALER_INTERVAL;
    o->progress = stderr;
}

void rn_eval_defaults(rn_eval_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "auto";
    rn_backend_opts_init(&o->backend);
    o->workers = RN_TRAIN_WORKERS;
    o->batch = 64;
    o->crop = RN_TRAIN_CROP;
    o->resize = -1;
    o->topk = 5;
    o->progress = stderr;
}

/* The backend, network and input staging shared by training and evaluation. */
typedef struct {
    rn_backend *be;
    rn_net *net;
    uint8_t *staging[2]; /* non-host backends: device copies of a loader batch of u8 pixels,
                            used in turn so that one fills while the other is read */
    const uint8_t *px;   /* the pixels of the batch last staged: staging[i] or the batch's own */
    int next;            /* staging buffer the next batch goes to */
    int micro, crop;
    size_t staged_cap;   /* bytes per staging buffer */
} runner;

static void runner_close(runner *r) {
    rn_net_destroy(r->net);
    if (r->be) {
        rn_backend_free(r->be, r->staging[0]);
        rn_backend_free(r->be, r->staging[1]);
    }
    rn_backend_destroy(r->be);
    memset(r, 0, sizeof *r);
}

/* The loader's allocator hook: pinned host memory, so batches copy asynchronously */
static void *pinned_alloc(size_t bytes, void *be) {
    void *p = NULL;
    return rn_backend_host_alloc(be, bytes, &p) == RN_OK ? p : NULL;
}
static void pinned_free(void *p, void *be) { rn_backend_host_free(be, p); }

/* Loader batches in memory be copies from fastest (pinned on a GPU). The loader must be
 * destroyed before be. */
static void loader_memory(rn_loader_opts *lo, rn_backend *be) {
    if (rn_backend_is_host(be)) return;
    lo->alloc = pinned_alloc;
    lo->free = pinned_free;
    lo->alloc_ctx = be;
}

static void fmt_bytes(size_t b, char *buf, size_t cap) {
    if (b >= (size_t)1 << 30) snprintf(buf, cap, "%.1f GiB", b / 1073741824.0);
    else snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
}

/* What the run may plan for: --mem-limit, else the free memory less 5% of the total
 * (cuDNN's algorithm search, cuBLAS, the loader and fragmentation take the rest). */
static int mem_budget(rn_backend *be, size_t limit, size_t *budget, char *how, size_t cap) {
    if (limit) {
        *budget = limit;
        snprintf(how, cap, "--mem-limit");
        return RN_OK;
    }
    size_t fr, tot;
    int rc = rn_backend_mem_info(be, &fr, &tot);
    if (rc) return rc;
    *budget = fr > tot / 20 ? fr - tot / 20 : 0;
    char f[32], t[32];
    fmt_bytes(fr, f, sizeof f);
    fmt_bytes(tot, t, sizeof t);
    snprintf(how, cap, "%s free of %s, less 5%% of the total; --mem-limit sets it", f, t);
    return RN_OK;
}

/* The largest divisor m <= below of batch whose network plus `extra` bytes fits in
 * budget, its need in *need; 0 when none does (or the ones that would are too small
 * for BatchNorm to train on). */
static int largest_fit(rn_backend *be, const rn_resnet *spec, int batch, int below, int crop, int mode, int dtype,
                       size_t extra, size_t budget, size_t *need, int *rc) {
    for (int m = below; m >= 1; m--) {
        if (batch % m) continue;
        size_t b;
        if ((*rc = rn_net_plan(be, spec, m, crop, crop, mode, dtype, &b)) == RN_EINVAL) {
            *rc = RN_OK; /* smaller ones cannot train either */
            return 0;
        }
        if (*rc) return 0;
        if (b + extra <= budget) {
            *need = b + extra;
            return m;
        }
    }
    return 0;
}

/* What to run instead: micro-batch (training) or batch (evaluation) `fit` and its need,
 * or, when fit is 0, that nothing smaller fits. */
static void advise(char *buf, size_t cap, int mode, int batch, int fit, size_t need, rn_backend *be) {
    char f[32];
    fmt_bytes(need, f, sizeof f);
    if (!fit)
        snprintf(buf, cap, "no smaller %s fits: lower --crop%s, or free memory",
                 mode == RN_NET_TRAIN ? "micro-batch" : "batch", rn_backend_is_host(be) ? "" : ", use --amp");
    else if (mode == RN_NET_TRAIN)
        snprintf(buf, cap, "--micro-batch %d (= --accum %d) needs %s", fit, batch / fit, f);
    else
        snprintf(buf, cap, "--batch %d needs %s", fit, f);
}

/* Open the backend (before the loaders, whose buffers it allocates). */
static int runner_backend(runner *r, const char *device, int threads, const rn_backend_opts *opts) {
    memset(r, 0, sizeof *r);
    return rn_backend_create(device, threads, opts, &r->be);
}

/* The network for batches of `batch` images in micro-batches of `micro` (0: the largest
 * divisor of batch that fits in memory), checked against the memory budget before
 * anything is allocated; then ck's weights, and staging for batches of `batch`. */
static int runner_net(runner *r, const rn_ckpt *ck, int batch, int micro, size_t mem_limit, int crop, int mode,
                      int dtype) {
    rn_resnet spec;
    int rc = rn_ckpt_net(ck, &spec);
    if (rc) return rc;
    if (!rn_backend_has_dtype(r->be, dtype))
        return rn_errorf(RN_ENOTSUP, "--amp %s needs a GPU (--device cuda): the CPU backend computes in fp32 (%s)",
                         rn_amp_name(dtype), rn_backend_name(r->be));
    size_t staged = rn_backend_is_host(r->be) ? 0 : (size_t)batch * crop * crop * 3;
    size_t budget, need = 0, fit_need = 0;
    char how[160], a[32], u[32], advice[160];
    if ((rc = mem_budget(r->be, mem_limit, &budget, how, sizeof how))) return rc;
    const char *what = mode == RN_NET_TRAIN ? "training" : "evaluation";
    const char *unit = mode == RN_NET_TRAIN ? "micro-batch" : "batch";
    const char *dt = dtype == RN_F32 ? "fp32" : rn_amp_name(dtype);
    const char *where = rn_backend_is_host(r->be) ? "host" : "GPU";
    int is_auto = micro == 0;
    if (!is_auto) {
        if ((rc = rn_net_plan(r->be, &spec, micro, crop, crop, mode, dtype, &need))) return rc;
        need += 2 * staged;
        if (need > budget) {
            int fit = largest_fit(r->be, &spec, batch, micro - 1, crop, mode, dtype, 2 * staged, budget, &fit_need, &rc);
            if (rc) return rc;
            advise(advice, sizeof advice, mode, batch, fit, fit_need, r->be);
            fmt_bytes(need, a, sizeof a);
            fmt_bytes(budget, u, sizeof u);
            return rn_errorf(RN_ENOMEM, "%s %s at %s %d of %dx%d in %s needs %s of %s memory, but %s is usable "
                             "(%s): %s%s",
                             spec.arch, what, unit, micro, crop, crop, dt,
                             a, where, u, how, advice, fit && mode == RN_NET_TRAIN ? "; --micro-batch auto picks it" : "");
        }
    } else {
        micro = largest_fit(r->be, &spec, batch, batch, crop, mode, dtype, 2 * staged, budget, &need, &rc);
        if (rc) return rc;
        if (!micro) {
            fmt_bytes(budget, u, sizeof u);
            return rn_errorf(RN_ENOMEM, "--micro-batch auto: %s %s of %dx%d in %s does not fit in %s memory at any "
                             "micro-batch that can train (%s usable: %s): lower --crop, or free memory",
                             spec.arch, what, crop, crop, dt, where, u, how);
        }
    }
    for (int i = 0; i < 2 && staged; i++)
        if ((rc = rn_backend_alloc(r->be, staged, (void **)&r->staging[i])))
            return rn_error_context(rc, "staging for batches of %d", batch);
    /* The plan fits, but an allocation can still fail (another process took memory since,
       fragmentation): auto goes on to the next smaller micro-batch that fits what is
       usable now; a given micro-batch fails, naming one. */
    while ((rc = rn_net_create_amp(r->be, &spec, micro, crop, crop, mode, dtype, &r->net)) == RN_ENOMEM) {
        char failed[600];
        snprintf(failed, sizeof failed, "%s", rn_last_error());
        rn_backend_unreserve(r->be); /* the failed net's workspace: a smaller net needs less */
        int rc2 = mem_budget(r->be, mem_limit, &budget, how, sizeof how), fit = 0;
        if (rc2 == RN_OK)
            fit = largest_fit(r->be, &spec, batch, micro - 1, crop, mode, dtype, 2 * staged, budget, &fit_need, &rc2);
        if (is_auto && fit) {
            micro = fit;
            continue;
        }
        advise(advice, sizeof advice, mode, batch, fit, fit_need, r->be);
        fmt_bytes(budget, u, sizeof u);
        rc = rn_errorf(RN_ENOMEM, "%s %s at %s %d: %s; by the plan, with %s usable now (%s): %s", spec.arch, what,
                       unit, micro, failed, u, how, advice);
        break;
    }
    if (rc) return rc;
    if ((rc = rn_net_load(r->net, ck))) return rc;
    r->staged_cap = staged;
    r->micro = micro;
    r->crop = crop;
    return RN_OK;
}

/* Start b's pixels on their way to the device (the whole batch, overlapping whatever
 * the device is still computing). rn_backend_upload_wait before releasing b. */
static int stage(runner *r, const rn_batch *b) {
    size_t bytes = (size_t)b->n * b->h * b->w * b->c;
    if (!r->staging[0]) {
        r->px = b->pixels;
        return RN_OK;
    }
    if (bytes > r->staged_cap)
        return rn_errorf(RN_EINVAL, "a batch of %zu bytes does not fit the %zu-byte staging buffer", bytes,
                         r->staged_cap);
    uint8_t *dst = r->staging[r->next];
    r->next ^= 1;
    r->px = dst;
    return rn_backend_upload_async(r->be, dst, b->pixels, bytes);
}

/* Normalise n images starting at image `first` of the batch last staged into the
 * network input. */
static int fill_input(runner *r, const rn_batch *b, int first, int n) {
    const uint8_t *px = r->px + (size_t)first * b->h * b->w * b->c;
    return rn_input_normalize(r->be, rn_net_dtype(r->net), (int64_t)n * b->h * b->w, b->c, px, RN_IMAGENET_MEAN,
                              RN_IMAGENET_STD, rn_net_input(r->net));
}

static int check_dataset(const char *path, const rn_dataset_info *info, const rn_ckpt *ck) {
    if (info->channels != 3)
        return rn_errorf(RN_EDATA, "%s: %d-channel images; the network takes RGB (rebuild with rn-prep without --gray)",
                         path, info->channels);
    if (info->n_classes > ck->model->num_classes)
        return rn_errorf(RN_EDATA,
                         "%s: %d classes, but the model has %d outputs (make the model with rn-init --classes %d, "
                         "or rn-init --from ... --reset-fc %d)",
                         path, info->n_classes, ck->model->num_classes, info->n_classes, info->n_classes);
    return RN_OK;
}

/* Top-1 / top-k counts and the confusion matrix for one batch of logits. */
static void score(const float *logits, const int32_t *labels, int n, int classes, int topk, int64_t *c1, int64_t *ck,
                  int64_t *confusion, int nconf) {
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * classes;
        int y = labels[i], best = 0, above = 0;
        for (int k = 0; k < classes; k++) {
            if (z[k] > z[best]) best = k;
            /* rank of the true class: classes strictly above it, ties to the lower index */
            if (z[k] > z[y] || (z[k] == z[y] && k < y)) above++;
        }
        *c1 += best == y;
        *ck += above < topk;
        if (confusion && y < nconf && best < nconf) confusion[(size_t)y * nconf + best]++;
    }
}

typedef struct {
    float *logits; /* all logits in dataset order, for --dump-logits */
    int64_t cap;
} logit_dump;

/* Evaluate with r's network (running BN statistics) over the whole of loader l's epoch 0. */
static int eval_loop(runner *r, rn_loader *l, int classes, int topk, rn_eval_result *res, logit_dump *dump,
                     FILE *progress, int tty) {
    float *logits = rn_malloc(sizeof(float) * (size_t)r->micro * classes);
    if (!logits) return RN_ENOMEM;
    int64_t c1 = 0, ck = 0, n = 0, total = rn_loader_info(l)->count;
    double loss_sum = 0, t0 = now();
    int rc = RN_OK;
    for (;;) {
        rn_batch b;
        if ((rc = rn_loader_next(l, &b))) break;
        rc = stage(r, &b);
        for (int off = 0; off < b.n && rc == RN_OK; off += r->micro) {
            int m = b.n - off < r->micro ? b.n - off : r->micro;
            float loss;
            if ((rc = fill_input(r, &b, off, m)) || (rc = rn_net_forward(r->net, m, 0)) ||
                (rc = rn_net_loss(r->net, b.labels + off, m, 0.0f, &loss)) ||
                (rc = rn_backend_download(r->be, logits, rn_net_logits(r->net), sizeof(float) * (size_t)m * classes)))
                break;
            loss_sum += (double)loss * m;
            score(logits, b.labels + off, m, classes, topk, &c1, &ck, res->confusion, res->n_classes);
            if (dump && dump->logits)
                memcpy(dump->logits + (size_t)(n + off) * classes, logits, sizeof(float) * (size_t)m * classes);
        }
        n += b.n;
        int last = b.last;
        int wrc = rn_backend_upload_wait(r->be);
        if (rc == RN_OK) rc = wrc;
        rn_loader_release(l, &b);
        if (progress && tty)
            fprintf(progress, "\reval %lld/%lld images, %.1f img/s   ", (long long)n, (long long)total,
                    n / (now() - t0 + 1e-9));
        if (rc || last) break;
    }
    if (progress && tty) fputc('\n', progress);
    free(logits);
    res->n = n;
    res->top1 = n ? (double)c1 / n : 0;
    res->topk = n ? (double)ck / n : 0;
    res->loss = n ? loss_sum / n : 0;
    return rc;
}

static int open_eval_loader(const char *path, int batch, int crop, int resize, int workers, rn_backend *be,
                            rn_loader **l) {
    rn_loader_opts lo;
    rn_loader_defaults(&lo);
    loader_memory(&lo, be);
    lo.crop = crop;
    lo.batch = batch;
    lo.workers = workers;
    lo.train = 0;
    lo.shuffle = 0;
    lo.resize = resize;
    lo.drop_last = 0;
    return rn_loader_create(path, &lo, l);
}

int rn_eval(const rn_eval_opts *o, const rn_ckpt *ck, rn_eval_result *res) {
    memset(res, 0, sizeof *res);
    rn_loader *l = NULL;
    runner r = {0};
    logit_dump dump = {0};
    int classes = ck->model->num_classes;
    int rc = runner_backend(&r, o->device, o->threads, &o->backend);
    if (rc == RN_OK) rc = open_eval_loader(o->data, o->batch, o->crop, o->resize, o->workers, r.be, &l);
    if (rc == RN_OK) rc = check_dataset(o->data, rn_loader_info(l), ck);
    if (rc == RN_OK) rc = runner_net(&r, ck, o->batch, o->batch, o->mem_limit, o->crop, RN_NET_INFER, RN_F32);
    if (rc == RN_OK) {
        res->n_classes = classes;
        res->confusion = rn_calloc((size_t)classes * classes, sizeof(int64_t));
        if (!res->confusion) rc = RN_ENOMEM;
    }
    if (rc == RN_OK && o->dump_logits) {
        dump.cap = (int64_t)rn_loader_info(l)->count;
        dump.logits = rn_calloc((size_t)dump.cap * classes, sizeof(float));
        if (!dump.logits) rc = RN_ENOMEM;
    }
    if (rc == RN_OK) rc = eval_loop(&r, l, classes, o->topk, res, &dump, o->progress, o->progress_tty);
    if (rc == RN_OK && o->dump_logits) {
        int32_t *labels = NULL;
        rn_st_tensor t = {.name = "logits", .dtype = RN_F32, .ndim = 2, .shape = {res->n, classes},
                          .data = (const uint8_t *)dump.logits, .nbytes = sizeof(float) * (size_t)res->n * classes};
        const char *k[] = {"arch", "rows"}, *v[] = {ck->model->arch, "dataset order"};
        rc = rn_st_write(o->dump_logits, &t, 1, k, v, 2);
        free(labels);
    }
    free(dump.logits);
    rn_loader_destroy(l); /* its buffers may be the backend's pinned memory */
    runner_close(&r);
    if (rc != RN_OK) {
        free(res->confusion);
        res->confusion = NULL;
    }
    return rc;
}

static int ensure_train_state(rn_ckpt *ck) {
    if (ck->train) return RN_OK;
    ck->train = rn_malloc(sizeof *ck->train);
    if (!ck->train) return RN_ENOMEM;
    rn__train_state__init(ck->train);
    return RN_OK;
}

/* The first step's gradients (unscaled: times `unscale`, 1/loss_scale under fp16 AMP),
 * and the batch they came from (u8 pixels and labels, so a reference can recompute them
 * from the same input). */
static int dump_grads(rn_net *net, const rn_ckpt *ck, const char *path, const rn_batch *b, const uint8_t *pixels,
                      const int32_t *labels, float unscale) {
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
    const char *k[] = {"arch", "content"}, *v[] = {ck->model->arch, "gradients of the first optimiser step"};
    if (rc == RN_OK) rc = rn_st_write(path, t, (int)ck->n_params + 2, k, v, 2);
    for (size_t i = 0; i < ck->n_params; i++) free((void *)t[i].data);
    free(t);
    return rc ? rn_error_context(rc, "--dump-grads %s", path) : RN_OK;
}

static int add_history(rn_ckpt *ck, const Rn__EpochMetrics *m) {
    Rn__EpochMetrics **h = realloc(ck->history, sizeof *h * (ck->n_history + 1));
    if (!h) return rn_errorf(RN_ENOMEM, "out of memory");
    ck->history = h;
    Rn__EpochMetrics *e = rn_malloc(sizeof *e);
    if (!e) return RN_ENOMEM;
    *e = *m;
    h[ck->n_history++] = e;
    return RN_OK;
}

/* Copy the network and the loop's state into ck and write it atomically. */
static int save(const rn_train_opts *o, runner *r, rn_ckpt *ck, rn_loader *l) {
    int rc = rn_net_store(r->net, ck);
    if (rc) return rc;
    if (ck->optim) {
        ck->optim->lr = o->lr.lr;
        ck->optim->momentum_coef = o->momentum;
        ck->optim->weight_decay = o->weight_decay;
        ck->optim->nesterov = o->nesterov;
        if ((rc = rn_pb_set_string(&ck->optim->kind, "sgd"))) return rc;
    }
    Rn__TrainState *t = ck->train;
    rn_loader_position(l, &t->data_epoch, &t->data_index);
    if ((rc = rn_pb_set_string(&t->lr_schedule, rn_lr_schedule_name(o->lr.schedule)))) return rc;
    t->lr_step = o->lr.step_epochs;
    t->lr_gamma = o->lr.gamma;
    t->warmup_epochs = o->lr.warmup_epochs;
    t->total_epochs = o->lr.total_epochs;
    free(t->lr_milestones);
    t->lr_milestones = NULL;
    t->n_lr_milestones = 0;
    if (o->lr.n_milestones) {
        t->lr_milestones = rn_malloc(sizeof(int32_t) * (size_t)o->lr.n_milestones);
        if (!t->lr_milestones) return RN_ENOMEM;
        memcpy(t->lr_milestones, o->lr.milestones, sizeof(int32_t) * (size_t)o->lr.n_milestones);
        t->n_lr_milestones = (size_t)o->lr.n_milestones;
    }
    t->batch = o->batch;
    t->accum = o->batch / r->micro;
    if ((rc = rn_ckpt_set_provenance(ck, o->argc, o->argv, NULL, 1))) return rc;
    char ds[1024];
    snprintf(ds, sizeof ds, "%s (%llu records)", o->data, (unsigned long long)rn_loader_info(l)->count);
    if ((rc = rn_pb_set_string(&ck->provenance->dataset, ds))) return rc;
    return rn_ckpt_write(o->out, ck);
}

static void fmt_eta(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) snprintf(buf, cap, "?");
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

int rn_train(const rn_train_opts *o, rn_ckpt *ck) {
    if (o->accum < 1 || o->batch % o->accum)
        return rn_errorf(RN_EINVAL, "--batch %d is not a multiple of --accum %d", o->batch, o->accum);
    if (o->micro_batch > 0 && o->batch % o->micro_batch)
        return rn_errorf(RN_EINVAL, "--batch %d is not a multiple of --micro-batch %d", o->batch, o->micro_batch);
    if (o->micro_batch && o->accum != 1)
        return rn_errorf(RN_EINVAL, "--micro-batch and --accum both set the micro-batch: give one");
    int rc = ensure_train_state(ck);
    if (rc) return rc;
    Rn__TrainState *ts = ck->train;
    if (o->seed_given || ts->step == 0) ts->seed = o->seed;
    rn_loader *l = NULL, *vl = NULL;
    runner r = {0};
    FILE *log = NULL;
    int classes = ck->model->num_classes;

    if ((rc = runner_backend(&r, o->device, o->threads, &o->backend))) goto out;
    rn_loader_opts lo;
    rn_loader_defaults(&lo);
    loader_memory(&lo, r.be);
    lo.crop = o->crop;
    lo.batch = o->batch;
    lo.workers = o->workers;
    lo.train = 1;
    lo.augment = o->augment;
    lo.resize = o->resize;
    lo.shuffle = o->shuffle;
    lo.drop_last = 1; /* every step sees a full batch (BN needs more than one value) */
    lo.seed = ts->seed;
    if ((rc = rn_loader_create(o->data, &lo, &l))) goto out;
    const rn_dataset_info *info = rn_loader_info(l);
    if ((rc = check_dataset(o->data, info, ck))) goto out;
    if (ts->data_epoch || ts->data_index) {
        if ((rc = rn_loader_seek(l, ts->data_epoch, ts->data_index))) goto out;
    } else if (ts->epoch) {
        if ((rc = rn_loader_seek(l, ts->epoch, 0))) goto out;
    }
    if (ck->n_class_names == 0 && info->n_classes > 0) {
        ck->class_names = rn_calloc((size_t)info->n_classes, sizeof(char *));
        if (!ck->class_names) {
            rc = RN_ENOMEM;
            goto out;
        }
        for (int i = 0; i < info->n_classes; i++) {
            ck->class_names[i] = strdup(info->class_names[i]);
            if (!ck->class_names[i]) {
                rc = rn_errorf(RN_ENOMEM, "out of memory");
                goto out;
            }
            ck->n_class_names++;
        }
    }
    int64_t spe = rn_loader_batches_per_epoch(l);
    if (spe < 1) {
        rc = rn_errorf(RN_EDATA, "%s: %llu images do not fill one batch of %d (lower --batch)", o->data,
                       (unsigned long long)info->count, o->batch);
        goto out;
    }
    ts->steps_per_epoch = spe;
    int want = o->micro_batch > 0 ? o->micro_batch : o->micro_batch < 0 ? 0 : o->batch / o->accum;
    if ((rc = runner_net(&r, ck, o->batch, want, o->mem_limit, o->crop, RN_NET_TRAIN, o->amp))) goto out;
    int micro = r.micro, accum = o->batch / micro;
    if (o->val) {
        if ((rc = open_eval_loader(o->val, micro, o->crop, o->resize, o->workers, r.be, &vl))) goto out;
        if ((rc = check_dataset(o->val, rn_loader_info(vl), ck))) goto out;
    }
    rn_net_freeze_bn(r.net, o->freeze_bn);
    /* fp16 scales the loss; bf16 has fp32's range and runs without, as in PyTorch */
    int scaled = o->amp == RN_F16;
    rn_scaler sc = {0};
    if (scaled) {
        if ((rc = rn_scaler_init(&sc, o->loss_scale, RN_SCALER_GROWTH, RN_SCALER_BACKOFF, o->scale_growth_interval)))
            goto out;
        if (ts->loss_scale > 0) { /* resuming: the checkpoint's scale and tracker */
            sc.scale = (float)ts->loss_scale;
            sc.growth_tracker = ts->scale_growth_tracker;
        }
    }
    char amp_note[64] = "";
    if (scaled) snprintf(amp_note, sizeof amp_note, ", AMP fp16 (loss scale %g)", sc.scale);
    else if (o->amp != RN_F32) snprintf(amp_note, sizeof amp_note, ", AMP %s", rn_amp_name(o->amp));
    if (o->log_path) {
        log = fopen(o->log_path, "a");
        if (!log) {
            rc = rn_errorf(RN_EIO, "--log %s: cannot open for appending", o->log_path);
            goto out;
        }
    }
    if (o->progress)
        fprintf(o->progress, "rn-train: %s on %s: %lld steps per epoch of %d (%d x %d), network %.0f MiB%s\n",
                ck->model->arch, rn_backend_name(r.be), (long long)spe, o->batch, accum, micro,
                rn_net_bytes(r.net) / 1048576.0, amp_note);

    int target_epoch = ts->epoch + o->epochs;
    int64_t run_steps = 0, since_log = 0;
    double t_start = now(), t_log = t_start, wait_log = 0, loss_log = 0, loss_epoch = 0, t_epoch = t_start;
    int64_t epoch_steps = 0, warned_wait = 0, skipped_log = 0;
    while (ts->epoch < target_epoch && (o->max_steps == 0 || run_steps < o->max_steps)) {
        if (o->stop && *o->stop) break;
        rn_batch b;
        double tw = now();
        if ((rc = rn_loader_next(l, &b))) goto out;
        double waited = now() - tw;
        float step_loss = 0;
        /* every micro-batch's gradient is scaled by the same loss scale: they add up in
           fp32 and are checked and unscaled once, at the step */
        float grad_scale = scaled ? (float)((double)sc.scale / accum) : 1.0f / accum;
        rc = stage(&r, &b);
        for (int k = 0; k < accum && rc == RN_OK; k++) {
            float loss;
            if ((rc = fill_input(&r, &b, k * micro, micro)) || (rc = rn_net_forward(r.net, micro, 1)) ||
                (rc = rn_net_loss_backward(r.net, b.labels + k * micro, micro, (float)o->label_smoothing,
                                           grad_scale, 1, k > 0, &loss)))
                break;
            step_loss += loss / accum;
        }
        int last = b.last;
        float unscale = scaled ? rn_scaler_inv(&sc) : 1.0f;
        if (rc == RN_OK && run_steps == 0 && o->dump_grads && isfinite(step_loss))
            rc = dump_grads(r.net, ck, o->dump_grads, &b, b.pixels, b.labels, unscale);
        int wrc = rn_backend_upload_wait(r.be);
        if (rc == RN_OK) rc = wrc;
        rn_loader_release(l, &b);
        if (rc) goto out;
        if (!isfinite(step_loss)) {
            /* (the forward does not depend on the loss scale: skipping would not help) */
            rc = rn_errorf(RN_ENUMERIC,
                           "step %lld: the loss is %g: training diverged (lower --lr, check the data%s); "
                           "%s keeps the last good checkpoint",
                           (long long)ts->step, step_loss,
                           o->amp == RN_F16 ? ", or use --amp bf16: fp16 activations overflow past 65504" : "",
                           o->out);
            goto out;
        }
        double lr = rn_lr_at(&o->lr, ts->step, spe);
        int skipped = 0;
        if ((rc = rn_net_step(r.net, scaled ? &sc : NULL, (float)lr, (float)o->momentum, (float)o->weight_decay,
                              o->nesterov, o->no_wd_bn, &skipped)))
            goto out;
        if (scaled) {
            ts->skipped_steps += skipped;
            skipped_log += skipped;
            ts->loss_scale = sc.scale;
            ts->scale_growth_tracker = sc.growth_tracker;
            if (!(sc.scale >= FLT_MIN)) {
                rc = rn_errorf(RN_ENUMERIC,
                               "step %lld: the fp16 loss scale fell to %g: the gradients overflow at any scale "
                               "(lower --lr, or use --amp bf16); %s keeps the last good checkpoint",
                               (long long)ts->step, sc.scale, o->out);
                goto out;
            }
        }
        ts->step++;
        run_steps++;
        since_log++;
        epoch_steps++;
        wait_log += waited;
        loss_log += step_loss;
        loss_epoch += step_loss;
        if (since_log >= o->log_every || last) {
            double t = now(), dt = t - t_log;
            double ips = since_log * o->batch / (dt > 0 ? dt : 1e-9), wait = dt > 0 ? wait_log / dt : 0;
            int64_t left = (int64_t)(target_epoch - ts->epoch) * spe - (ts->step - (int64_t)ts->epoch * spe);
            if (o->max_steps && o->max_steps - run_steps < left) left = o->max_steps - run_steps;
            char eta[32];
            fmt_eta(left * o->batch / (ips > 0 ? ips : 1e-9), eta, sizeof eta);
            char scale_note[64] = "";
            if (scaled)
                snprintf(scale_note, sizeof scale_note, " loss-scale %g (%lld skipped)", sc.scale,
                         (long long)skipped_log);
            if (o->progress)
                fprintf(o->progress, "%sepoch %d step %lld (%lld/%lld) loss %.4f lr %.4g%s %.1f img/s data-wait %.0f%% ETA %s%s",
                        o->progress_tty ? "\r" : "", ts->epoch + 1, (long long)ts->step,
                        (long long)(ts->step - (int64_t)ts->epoch * spe), (long long)spe, loss_log / since_log, lr,
                        scale_note, ips, 100 * wait, eta, o->progress_tty ? "   " : "\n");
            if (log) {
                fprintf(log, "{\"kind\":\"step\",\"epoch\":%d,\"step\":%lld,\"loss\":", ts->epoch + 1,
                        (long long)ts->step);
                rn_json_number(log, loss_log / since_log);
                fprintf(log, ",\"lr\":");
                rn_json_number(log, lr);
                fprintf(log, ",\"img_s\":%.2f,\"data_wait\":%.4f,\"loss_scale\":", ips, wait);
                rn_json_number(log, scaled ? sc.scale : 1.0);
                fprintf(log, ",\"skipped\":%lld}\n", (long long)skipped_log);
                fflush(log);
            }
            if (wait > 0.2 && !warned_wait++ && o->progress)
                fprintf(o->progress, "%srn-train: the loader held back %.0f%% of the step time: add --workers (now %d)\n",
                        o->progress_tty ? "\n" : "", 100 * wait, o->workers);
            t_log = t;
            since_log = 0;
            wait_log = loss_log = 0;
            skipped_log = 0;
        }
        if (last) {
            ts->epoch++;
            Rn__EpochMetrics m;
            rn__epoch_metrics__init(&m);
            m.epoch = ts->epoch;
            m.step = ts->step;
            m.train_loss = loss_epoch / (epoch_steps ? epoch_steps : 1);
            m.lr = lr;
            m.seconds = now() - t_epoch;
            m.images_per_second = epoch_steps * o->batch / (m.seconds > 0 ? m.seconds : 1e-9);
            if (o->progress_tty && o->progress) fputc('\n', o->progress);
            if (vl) {
                rn_eval_result vr = {0};
                if ((rc = rn_loader_seek(vl, 0, 0)) ||
                    (rc = eval_loop(&r, vl, classes, 5, &vr, NULL, o->progress, o->progress_tty)))
                    goto out;
                m.val_top1 = vr.top1;
                m.val_top5 = vr.topk;
                m.val_loss = vr.loss;
                m.val_n = vr.n;
                if (o->progress)
                    fprintf(o->progress, "epoch %d: val top1=%.4f top5=%.4f loss=%.4f n=%lld\n", ts->epoch, vr.top1,
                            vr.topk, vr.loss, (long long)vr.n);
            }
            if ((rc = add_history(ck, &m))) goto out;
            if (log) {
                fprintf(log, "{\"kind\":\"epoch\",\"epoch\":%d,\"step\":%lld,\"train_loss\":", m.epoch,
                        (long long)m.step);
                rn_json_number(log, m.train_loss);
                fprintf(log, ",\"lr\":");
                rn_json_number(log, m.lr);
                fprintf(log, ",\"seconds\":%.2f,\"img_s\":%.2f", m.seconds, m.images_per_second);
                if (vl) fprintf(log, ",\"val_top1\":%.6f,\"val_top5\":%.6f,\"val_loss\":%.6f", m.val_top1, m.val_top5,
                                m.val_loss);
                fprintf(log, "}\n");
                fflush(log);
            }
            loss_epoch = 0;
            epoch_steps = 0;
            t_epoch = now();
        }
        if (o->save_every && ts->step % o->save_every == 0 && (rc = save(o, &r, ck, l))) goto out;
    }
    if (o->progress_tty && o->progress && since_log) fputc('\n', o->progress);
    rc = save(o, &r, ck, l);
    if (rc == RN_OK && o->stop && *o->stop)
        rc = rn_errorf(RN_EINTR, "stopped by signal %d at step %lld; %s holds the state to resume from",
                       (int)*o->stop, (long long)ts->step, o->out);
out:
    if (log) fclose(log);
    rn_loader_destroy(vl); /* their buffers may be the backend's pinned memory */
    rn_loader_destroy(l);
    runner_close(&r);
    return rc;
}
