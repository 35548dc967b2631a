/* The runner: backend, network sized by the memory plan (with the advice when it does
 * not fit), and the staging of loader batches onto the device. */
#include "rn/runner.h"

#include <stdio.h>
#include <string.h>

#include "rn/err.h"
#include "rn/schedule.h"
#include "rn/tensor.h"

void rn_runner_close(rn_runner *r) {
    rn_net_destroy(r->net);
    if (r->be) {
        rn_backend_free(r->be, r->staging[0]);
        rn_backend_free(r->be, r->staging[1]);
        rn_backend_free(r->be, r->erase);
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

void rn_runner_loader_memory(rn_loader_opts *lo, rn_backend *be) {
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
 * (cuDNN's algorithm search, cuBLAS, the loader and fragmentation take the rest). The
 * machine's memory, which the node's processes of the run (r->dist) share, gives each
 * its share, read once: the processes plan at different moments, some after others
 * have built their nets, so later plans of r keep the first figure unless `fresh`. */
static int mem_budget(rn_runner *r, size_t limit, int fresh, size_t *budget, char *how, size_t cap) {
    rn_backend *be = r->be;
    if (limit) {
        *budget = limit;
        snprintf(how, cap, "--mem-limit");
        return RN_OK;
    }
    if (r->shared_budget && !fresh) {
        *budget = r->shared_budget;
        snprintf(how, cap, "%s", r->shared_how);
        return RN_OK;
    }
    size_t fr, tot;
    int rc = rn_backend_mem_info(be, &fr, &tot);
    if (rc) return rc;
    *budget = fr > tot / 20 ? fr - tot / 20 : 0;
    char f[32], t[32];
    fmt_bytes(fr, f, sizeof f);
    fmt_bytes(tot, t, sizeof t);
    int share = rn_backend_mem_shared(be) ? rn_dist_local_world(r->dist) : 1;
    if (share > 1) {
        *budget /= (size_t)share;
        snprintf(how, cap, "%s free of %s, less 5%% of the total, shared by this node's %d processes; --mem-limit "
                 "sets it per process", f, t, share);
        r->shared_budget = *budget ? *budget : 1;
        snprintf(r->shared_how, sizeof r->shared_how, "%s", how);
    } else {
        snprintf(how, cap, "%s free of %s, less 5%% of the total; --mem-limit sets it", f, t);
    }
    return RN_OK;
}

/* What a micro-batch of m (of batch) needs beside its network: the staging buffers and
 * what the caller holds (r->also, r->also_split). */
static size_t beside(const rn_runner *r, int m, int batch, size_t staged) {
    return 2 * staged + r->also + (m < batch ? r->also_split : 0);
}

/* The largest divisor m <= below of batch whose network plus what it needs beside it
 * fits in budget, its need in *need; 0 when none does (or the ones that would are too
 * small for BatchNorm to train on). */
static int largest_fit(const rn_runner *r, const rn_resnet *spec, int batch, int below, int crop, int mode,
                       int dtype, size_t staged, size_t budget, size_t *need, int *rc) {
    for (int m = below; m >= 1; m--) {
        if (batch % m) continue;
        size_t b, extra = beside(r, m, batch, staged);
        if ((*rc = rn_net_plan(r->be, spec, m, crop, crop, mode, dtype, &b)) == RN_EINVAL) {
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

int rn_runner_open(rn_runner *r, const char *device, int threads, const rn_backend_opts *opts) {
    memset(r, 0, sizeof *r);
    return rn_backend_create(device, threads, opts, &r->be);
}

/* --micro-batch auto's choice between accumulation and recomputation (README, "Tuning
 * and troubleshooting"): a step of K micro-batches of m images costs K x T(m), and
 * recomputation adds one forward of the blocks, about a third of a training step's
 * FLOPs (measured on the CPU: README). On the CPU an image costs about the same at any
 * micro-batch, so accumulation always wins there. On a GPU small micro-batches leave the
 * SMs idle: below RN_RECOMPUTE_BELOW images per forward, a micro-batch at least twice as
 * large is taken to run more than 4/3 times faster per image, so recomputation wins. */
#define RN_RECOMPUTE_BELOW 32

static int recompute_pays(rn_backend *be, int plain, int larger) {
    return !rn_backend_is_host(be) && plain < RN_RECOMPUTE_BELOW && larger >= 2 * plain;
}

/* What rn_runner_net builds, planned against the memory budget without allocating */
typedef struct {
    int micro;          /* images per forward */
    int mode;           /* RN_NET_TRAIN or RN_NET_INFER, | RN_NET_RECOMPUTE */
    size_t staged;      /* bytes per staging buffer (0 on the host) */
    size_t staged_px;   /* its pixels' bytes */
    size_t budget;      /* the memory the plan was checked against */
    char how[224];      /* where that figure came from */
} plan;

/* The plan for micro (0: auto) and mode (RN_RUNNER_RECOMPUTE_AUTO: may recompute).
 * Errors: rn_runner_net's planning ones. */
static int choose(rn_runner *r, const rn_resnet *spec, int batch, int micro, size_t mem_limit, int crop, int mode,
                  int dtype, plan *p) {
    int may = (mode & RN_RUNNER_RECOMPUTE_AUTO) != 0;
    mode &= ~RN_RUNNER_RECOMPUTE_AUTO;
    int recompute = mode & RN_NET_RECOMPUTE, base = mode & ~RN_NET_RECOMPUTE;
    int rc;
    if (!rn_backend_has_dtype(r->be, dtype))
        return rn_errorf(RN_ENOTSUP, "--amp %s needs a GPU (--device cuda): the CPU backend computes in fp32 (%s)",
                         rn_amp_name(dtype), rn_backend_name(r->be));
    /* a staging buffer: a batch's u8 pixels, then (16-byte aligned) its int32 labels */
    size_t staged_px = ((size_t)batch * crop * crop * 3 + 15) & ~(size_t)15;
    size_t staged = rn_backend_is_host(r->be) ? 0 : staged_px + sizeof(int32_t) * (size_t)batch;
    size_t budget, need = 0, fit_need = 0;
    char how[224], a[32], u[32], advice[160];
    if ((rc = mem_budget(r, mem_limit, 0, &budget, how, sizeof how))) return rc;
    const char *what = base == RN_NET_TRAIN ? "training" : "evaluation";
    const char *unit = base == RN_NET_TRAIN ? "micro-batch" : "batch";
    const char *dt = dtype == RN_F32 ? "fp32" : rn_amp_name(dtype);
    const char *where = rn_backend_is_host(r->be) ? "host" : "GPU";
    if (micro) {
        if ((rc = rn_net_plan(r->be, spec, micro, crop, crop, mode, dtype, &need))) return rc;
        need += beside(r, micro, batch, staged);
        /* the other way: this micro-batch with recomputation, which auto may take */
        size_t rneed = 0;
        if (need > budget && base == RN_NET_TRAIN && !recompute) {
            if ((rc = rn_net_plan(r->be, spec, micro, crop, crop, mode | RN_NET_RECOMPUTE, dtype, &rneed))) return rc;
            rneed += beside(r, micro, batch, staged);
            if (may && rneed <= budget) {
                mode |= RN_NET_RECOMPUTE;
                need = rneed;
            }
        }
        if (need > budget) {
            int fit = largest_fit(r, spec, batch, micro - 1, crop, mode, dtype, staged, budget, &fit_need, &rc);
            if (rc) return rc;
            advise(advice, sizeof advice, base, batch, fit, fit_need, r->be);
            char rec[96] = "";
            if (rneed) {
                fmt_bytes(rneed, a, sizeof a);
                if (rneed <= budget) snprintf(rec, sizeof rec, "; or --recompute blocks, which needs %s", a);
            }
            fmt_bytes(need, a, sizeof a);
            fmt_bytes(budget, u, sizeof u);
            char held[160] = "", h[32];
            size_t also = beside(r, micro, batch, 0);
            if (also) {
                fmt_bytes(also, h, sizeof h);
                snprintf(held, sizeof held, " (%s of it %s)", h, r->also_what);
            }
            return rn_errorf(RN_ENOMEM, "%s %s at %s %d of %dx%d in %s needs %s of %s memory%s, but %s is usable "
                             "(%s): %s%s%s",
                             spec->arch, what, unit, micro, crop, crop, dt,
                             a, where, held, u, how, advice,
                             fit && base == RN_NET_TRAIN ? "; --micro-batch auto picks it" : "", rec);
        }
    } else {
        micro = largest_fit(r, spec, batch, batch, crop, mode, dtype, staged, budget, &need, &rc);
        if (rc) return rc;
        if (may && !recompute && base == RN_NET_TRAIN && micro < batch) {
            size_t rneed = 0;
            int m = largest_fit(r, spec, batch, batch, crop, mode | RN_NET_RECOMPUTE, dtype, staged, budget, &rneed,
                                &rc);
            if (rc) return rc;
            if ((micro == 0 && m) || (m && recompute_pays(r->be, micro, m))) {
                micro = m;
                need = rneed;
                mode |= RN_NET_RECOMPUTE;
            }
        }
        if (!micro) {
            fmt_bytes(budget, u, sizeof u);
            return rn_errorf(RN_ENOMEM, "--micro-batch auto: %s %s of %dx%d in %s does not fit in %s memory at any "
                             "micro-batch that can train (%s usable: %s): lower --crop, or free memory",
                             spec->arch, what, crop, crop, dt, where, u, how);
        }
    }
    *p = (plan){.micro = micro, .mode = mode, .staged = staged, .staged_px = staged_px, .budget = budget};
    snprintf(p->how, sizeof p->how, "%s", how);
    return RN_OK;
}

int rn_runner_plan(rn_runner *r, const rn_ckpt *ck, int batch, int micro, size_t mem_limit, int crop, int mode,
                   int dtype, int *micro_out, int *recompute_out) {
    rn_resnet spec;
    plan p;
    int rc = rn_ckpt_net(ck, &spec);
    if (rc || (rc = choose(r, &spec, batch, micro, mem_limit, crop, mode, dtype, &p))) return rc;
    *micro_out = p.micro;
    *recompute_out = (p.mode & RN_NET_RECOMPUTE) != 0;
    return RN_OK;
}

int rn_runner_net(rn_runner *r, const rn_ckpt *ck, int batch, int micro, size_t mem_limit, int crop, int mode,
                  int dtype) {
    rn_resnet spec;
    plan p;
    int is_auto = micro == 0;
    int rc = rn_ckpt_net(ck, &spec);
    if (rc || (rc = choose(r, &spec, batch, micro, mem_limit, crop, mode, dtype, &p))) return rc;
    micro = p.micro;
    mode = p.mode;
    size_t staged = p.staged, budget = p.budget, fit_need = 0;
    char u[32], advice[160];
    int recompute = mode & RN_NET_RECOMPUTE, base = mode & ~RN_NET_RECOMPUTE;
    const char *what = base == RN_NET_TRAIN ? "training" : "evaluation";
    const char *unit = base == RN_NET_TRAIN ? "micro-batch" : "batch";
    for (int i = 0; i < 2 && staged; i++)
        if ((rc = rn_backend_alloc(r->be, staged, (void **)&r->staging[i])))
            return rn_error_context(rc, "staging for batches of %d", batch);
    if (staged && (rc = rn_backend_alloc(r->be, sizeof(rn_erase) * (size_t)batch, (void **)&r->erase)))
        return rn_error_context(rc, "erase boxes for batches of %d", batch);
    /* The plan fits, but an allocation can still fail (another process took memory since,
       fragmentation): auto goes on to the next smaller micro-batch that fits what is
       usable now; a given micro-batch fails, naming one. */
    while ((rc = rn_net_create(r->be, &spec, micro, crop, crop, mode, dtype, &r->net)) == RN_ENOMEM) {
        char failed[600];
        snprintf(failed, sizeof failed, "%s", rn_last_error());
        rn_backend_unreserve(r->be); /* the failed net's workspace: a smaller net needs less */
        int rc2 = mem_budget(r, mem_limit, 1, &budget, p.how, sizeof p.how), fit = 0;
        if (rc2 == RN_OK)
            fit = largest_fit(r, &spec, batch, micro - 1, crop, mode, dtype, staged, budget, &fit_need, &rc2);
        if (is_auto && fit) {
            micro = fit;
            continue;
        }
        advise(advice, sizeof advice, base, batch, fit, fit_need, r->be);
        fmt_bytes(budget, u, sizeof u);
        rc = rn_errorf(RN_ENOMEM, "%s %s at %s %d: %s; by the plan, with %s usable now (%s): %s", spec.arch, what,
                       unit, micro, failed, u, p.how, advice);
        break;
    }
    if (rc) return rc;
    if ((rc = rn_net_load(r->net, ck))) return rc;
    r->recompute = recompute != 0;
    r->recompute_saved = 0;
    if (recompute) {
        size_t with, without;
        if ((rc = rn_net_plan(r->be, &spec, micro, crop, crop, mode, dtype, &with)) ||
            (rc = rn_net_plan(r->be, &spec, micro, crop, crop, base, dtype, &without)))
            return rc;
        r->recompute_saved = without > with ? without - with : 0;
    }
    r->staged_cap = staged ? p.staged_px : 0;
    r->staged_n = batch;
    r->classes = spec.num_classes;
    r->micro = micro;
    r->crop = crop;
    return RN_OK;
}

int rn_runner_stage(rn_runner *r, const rn_batch *b) {
    size_t bytes = (size_t)b->n * b->h * b->w * b->c;
    if (!r->staging[0]) {
        r->px = b->pixels;
        r->labels = b->labels;
        return RN_OK;
    }
    if (bytes > r->staged_cap || b->n > r->staged_n)
        return rn_errorf(RN_EINVAL, "a batch of %d images, %zu bytes does not fit the staging buffer of %d images, "
                         "%zu bytes", b->n, bytes, r->staged_n, r->staged_cap);
    uint8_t *dst = r->staging[r->next];
    r->next ^= 1;
    r->px = dst;
    r->labels = b->labels ? (const int32_t *)(dst + r->staged_cap) : NULL;
    /* the labels travel with the pixels: one copy's place in the streams' order */
    rn_upload_part parts[2] = {{dst, b->pixels, bytes},
                               {dst + r->staged_cap, b->labels, b->labels ? sizeof(int32_t) * (size_t)b->n : 0}};
    return rn_backend_upload_parts_async(r->be, parts, 2);
}

int rn_runner_input(rn_runner *r, const rn_batch *b, int first, int n) {
    const uint8_t *px = r->px + (size_t)first * b->h * b->w * b->c;
    int dt = rn_net_dtype(r->net);
    void *y = rn_net_input(r->net);
    int rc = rn_input_normalize(r->be, dt, (int64_t)n * b->h * b->w, b->c, px, RN_IMAGENET_MEAN, RN_IMAGENET_STD, y);
    /* RandomErasing after the normalisation, as torchvision erases the normalised tensor */
    size_t img = (size_t)b->h * b->w * b->c * rn_dtype_size(dt);
    for (int k = 0; k < n && rc == RN_OK && b->erase; k++) {
        const rn_erase *e = &b->erase[first + k];
        if (e->w > 0 && e->h > 0)
            rc = rn_input_erase(r->be, dt, b->h, b->w, b->c, e->x, e->y, e->w, e->h, e->random, b->erase_key,
                                b->erase_epoch, e->rec, (char *)y + (size_t)k * img);
    }
    return rc;
}

int rn_runner_input_mix(rn_runner *r, const rn_batch *b, int first, int n, const rn_mix_desc *d) {
    if (d->kind == RN_MIX_NONE) return rn_runner_input(r, b, first, n);
    const uint8_t *px = r->px + (size_t)first * b->h * b->w * b->c;
    const rn_erase *er = b->erase ? b->erase + first : NULL;
    int rc;
    /* the boxes go to the device for the one op that reads them; the buffer is reused in stream order */
    if (er && r->erase) {
        if (n > r->micro) return rn_errorf(RN_EINVAL, "mixing %d images; the erase buffer holds %d", n, r->micro);
        if ((rc = rn_backend_upload(r->be, r->erase, er, sizeof(rn_erase) * (size_t)n))) return rc;
        er = r->erase;
    }
    return rn_input_mix(r->be, rn_net_dtype(r->net), d, n, b->h, b->w, b->c, px, RN_IMAGENET_MEAN, RN_IMAGENET_STD, er,
                        b->erase_key, b->erase_epoch, rn_net_input(r->net));
}

int rn_runner_logits(rn_runner *r, const rn_batch *b, int first, int n, float *logits) {
    int rc = rn_runner_input(r, b, first, n);
    if (rc) return rc;
    if ((rc = rn_net_forward(r->net, n, 0))) return rc;
    return rn_backend_download(r->be, logits, rn_net_logits(r->net),
                               sizeof(float) * (size_t)n * (size_t)r->classes);
}

int rn_runner_check_data(const char *path, const rn_dataset_info *info, const rn_ckpt *ck) {
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
