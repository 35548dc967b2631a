#include "rn/net.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/prof.h"
#include "rn/state.h"
#include "rn/tensor.h"

/* Where a parameter lives in the flat arrays. */
typedef struct {
    rn_tensor_desc d;
    int64_t off, numel; /* offset into params/grads/mom, in floats */
} pref;

/* A conv+BN unit at run time. */
typedef struct {
    int h, w;           /* input spatial size */
    int p, q;           /* output spatial size */
    int64_t out_elems;  /* per image: p*q*cout */
    int relu;           /* its BN ends in a ReLU: every unit's but a downsample shortcut's */
    int64_t w_off, g_off, b_off; /* conv weight, BN gamma, BN beta offsets into params */
    int64_t stat_off;   /* running_mean at bufs+stat_off, running_var at bufs+stat_off+cout */
    int64_t pk_off;     /* the folded weights in rn_conv_bias_fwd's own form at packed+pk_off
                           (rn_conv_bias_pack), or -1: it reads them from fold */
    void *z, *a;        /* train: conv output / BN output (max_batch, p, q, cout), in dtype */
    float *save_mean, *save_invstd; /* (cout) */
    void *reserve;
    int64_t tracked;    /* num_batches_tracked */
    int shared_z, shared_a; /* recomputation: z / a point into the net's block scratch (rz, ra),
                               rewritten by every block's forward, not owned */
} unit_rt;

/* Recomputation: the most units of a block (conv1..conv3 and the downsample) */
enum { RN_NET_SLOTS = 4 };

struct rn_net {
    rn_backend *be;
    rn_resnet spec;
    int mode, max_batch, h, w;
    int dtype;          /* activations and the weights convs and fc read: RN_F32, or
                           RN_F16/RN_BF16 for mixed precision (AMP) */
    size_t es;          /* bytes per element of dtype */
    int npref;
    pref *prefs;        /* every parameter, state_dict order */
    int64_t nparams, ndecay; /* params[0..ndecay): conv and fc weights (always decayed) */
    float *params, *grads, *mom, *bufs; /* fp32 always: the master weights under AMP */
    float *fold;        /* RN_NET_INFER with rn_conv_bias_fwd: (nparams) in params' layout,
                           conv weights with their BN folded in and each BN's beta slot
                           holding the folded bias (made by rn_net_load); else NULL */
    float *packed;      /* with fold: the units' folded weights as rn_conv_bias_pack makes
                           them, once per load instead of once per forward (unit_rt.pk_off),
                           and the fc's (fc_pk_off); NULL when none has such a form */
    int64_t fc_pk_off;  /* with fold: the fc weight, run as a 1x1 conv (fc_conv_desc), at
                           packed+fc_pk_off, or -1: it reads it from fold */
    float *spare;       /* training: (nparams) a micro-batch's own gradients before they are
                           added to grads; rn_net_spare's scratch between steps */
    float *capt;        /* training: (nstats) the batch statistics of the last forward, in
                           bufs' layout, when capturing (rn_net_bn_capture) */
    int64_t nstats;     /* floats in bufs */
    int capture;        /* training forwards capture BN's batch statistics instead of
                           updating the running ones */
    /* synchronised BN (rn_net_set_sync): gather NULL when off */
    rn_net_gather_fn gather;
    void *gather_ctx;
    int world;
    int maxc;           /* the most channels of any BN layer */
    float *gstat;       /* training: (nstats) in bufs' layout, the global batch mean and biased
                           variance of the last forward (this process's own while computed) */
    float *gcoef;       /* training: (2, maxc) the dx correction's scale and shift */
    float *hstat;       /* host (nstats): gstat's values */
    float *hrun;        /* host (nstats): the global mean and unbiased variance, for the
                           running statistics */
    float *hf;          /* host (3, maxc): a layer's downloads; malloc'ed (pageable), so an
                           upload from it has read it when it returns, on CUDA too */
    double *hbuf;       /* host (world + 1, 2 maxc + 1): a gather's own part, then everyone's */
    void *wc;           /* AMP: compute copy of params in dtype (nparams), made by rn_net_load
                           and by every SGD step; NULL in fp32, where convs read params */
    void *gh;           /* AMP: one conv or fc layer's weight (and bias) gradient in dtype,
                           on its way into grads (gh_numel) */
    int64_t gh_numel;
    float *ema, *ema_bufs; /* rn_net_ema_enable: the moving average of params (nparams, params'
                           layout) and of bufs (nstats); NULL: off */
    int64_t *ema_tracked; /* host (nunits): the average's num_batches_tracked, copied */
    int have_mom;
    int lars;           /* the step is LARS (rn_net_set_lars) instead of SGD */
    float lars_eta, lars_eps;
    double clip;        /* rn_net_set_clip's max norm; 0: off */
    double gnorm;       /* the last step's gradient norm before clipping (NaN: not measured) */
    double *gsq;        /* one double, backend memory: rn_sumsq of the gradients */
    int freeze_bn;      /* training uses and keeps BN's running statistics */
    int caller_counts;  /* rn_net_count_by_caller: training forwards leave tracked alone */
    const double *mix_at; /* rn_net_set_mix_at: the loss's mixing weight, in backend memory */
    unit_rt *u;
    rn_pool_desc pool;  /* stem max pool for max_batch */
    int pool_h, pool_w; /* its output size */
    int fin_hw;         /* last block's output h*w */
    /* activations and their gradients, in dtype */
    void *input;        /* (max_batch, h, w, 3) */
    void *pooled_max;   /* stem max-pool output (train) */
    void *feat, *dfeat; /* (max_batch, fc_in) */
    /* the loss is fp32: under AMP the fc output is cast up to logits, and dlogits
       cast down for the fc backward, as autocast does for cross_entropy */
    float *logits, *dlogits; /* (max_batch, classes) fp32 */
    void *logits_h, *dlogits_h; /* AMP: the same in dtype */
    int64_t fc_w, fc_b; /* offsets */
    void *g[5];         /* training: g[0..3] gradient scratch; all five are the
                           inference rotation when a training net evaluates */
    void *pool5[5];     /* inference nets: the rotation */
    int32_t *labels;    /* (max_batch) backend memory */
    float *loss;        /* one float, backend memory */
    int32_t *flag;      /* one int32, backend memory: rn_nonfinite's verdict */
    float *lr;          /* one float, backend memory: the rate SGD reads (rn_net_step_lr) */
    int64_t max_act;    /* largest activation per batch, floats */
    size_t bytes;
    int plan;           /* rn_net_plan: count bytes, allocate nothing */
    int last_n;
    int recompute;      /* RN_NET_RECOMPUTE: a block's inside is kept only while its forward or
                           backward runs: the units' z and a (bar the block output) live in
                           rz/ra, one per position in the block, and backward recomputes them */
    int again;          /* set while backward recomputes a block's forward (bn_fwd) */
    void *rz[RN_NET_SLOTS], *ra[RN_NET_SLOTS]; /* (max_batch, the largest out_elems of that
                           position in any block), in dtype */
    rn_prof *prof;      /* rn_net_set_prof: every layer and direction timed; NULL: off */
    rn_net_grad_fn on_grad; /* rn_net_set_grad_hook: told of each final gradient; NULL: off */
    void *on_grad_ctx;
    float *acc_into;    /* an accumulating backward with on_grad: the sum the micro-batch's
                           gradients (in grads, then the spare buffer) are added to, tensor
                           by tensor as each is final; NULL otherwise */
    int reported;       /* tensors on_grad was told of in this backward */
};

static int nalloc(rn_net *net, size_t bytes, void *out) {
    if (net->plan) {
        *(void **)out = NULL;
        net->bytes += bytes;
        return RN_OK;
    }
    int rc = rn_backend_alloc(net->be, bytes ? bytes : 64, (void **)out);
    if (rc != RN_OK)
        return rn_error_context(rc, "network memory: %zu bytes asked, %zu already held", bytes, net->bytes);
    net->bytes += bytes;
    return RN_OK;
}

/* zero backend memory from nalloc (nothing to do when planning) */
static int nzero(rn_net *net, void *p, size_t bytes) {
    return net->plan ? RN_OK : rn_backend_zero(net->be, p, bytes);
}

static int bn_update(rn_net *net, const float *stats, int nslices);
static int fold_bn(rn_net *net);

static int conv_desc(const rn_net *net, int ui, int n, rn_conv_desc *d) {
    const rn_convbn *cb = &net->spec.units[ui];
    const unit_rt *u = &net->u[ui];
    int rc = rn_conv_desc_init(d, n, u->h, u->w, cb->cin, cb->cout, cb->k, cb->k, cb->stride, cb->pad);
    d->dtype = net->dtype;
    /* the stem (unit 0) has no input gradient: its backward-data never runs */
    d->dirs = net->mode != RN_NET_TRAIN ? RN_CONV_FWD
            : ui == 0                   ? RN_CONV_FWD | RN_CONV_BWD_FILTER
                                        : RN_CONV_ALL;
    return rc;
}

/* The inference net's fc as rn_conv_bias_fwd runs it: a 1x1 conv over n images of 1x1
 * pixels (feat (n, fc_in) is NHWC, the fc weight (out, in) is (k, 1, 1, c)). Its bits then
 * depend on one image's features only, not on the batch (OpenBLAS's sgemm gives other bits
 * for the same row at another M). */
static int fc_conv_desc(const rn_net *net, int n, rn_conv_desc *d) {
    int rc = rn_conv_desc_init(d, n, 1, 1, net->spec.fc_in, net->spec.num_classes, 1, 1, 1, 0);
    d->dtype = net->dtype;
    d->dirs = RN_CONV_FWD;
    return rc;
}

static int bn_desc(const rn_net *net, int ui, int n, rn_bn_desc *d) {
    const unit_rt *u = &net->u[ui];
    int rc = rn_bn_desc_init(d, (int64_t)n * u->p * u->q, net->spec.units[ui].cout, u->relu);
    d->dtype = net->dtype;
    return rc;
}

/* the stem's max pool for a batch of n */
static int pool_desc(const rn_net *net, int n, rn_pool_desc *d) {
    int rc = rn_pool_desc_init(d, n, net->pool.h, net->pool.w, 64, 3, 2, 1);
    d->dtype = net->dtype;
    return rc;
}

/* n rounded up to 16 floats: parameter starts (and the fc bias in gh) are 64-byte aligned */
static int64_t align16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* The offset in packed (floats) of the next shape's rn_conv_bias_pack form, *npacked
 * advanced past it; -1 where the shape has none (it reads its weights from fold). */
static int64_t pack_slot(rn_backend *be, const rn_conv_desc *d, int64_t *npacked) {
    size_t bytes = rn_conv_bias_packed_bytes(be, d);
    int64_t at = bytes ? *npacked : -1;
    *npacked += align16((int64_t)((bytes + sizeof(float) - 1) / sizeof(float)));
    return at;
}

/* element off of an array in dtype */
static void *elem(const rn_net *net, const void *base, int64_t off) {
    return (char *)base + (size_t)off * net->es;
}

/* the conv or fc weight at off as the layers read it: the fp32 master, or its AMP copy */
static const void *weight(const rn_net *net, int64_t off) {
    return net->wc ? elem(net, net->wc, off) : (const void *)(net->params + off);
}

void rn_net_set_prof(rn_net *net, rn_prof *prof) { net->prof = prof; }

/* Profiling (rn/prof.h): pbeg before a layer's op, a pend_* with the op's status after;
 * with profiling off each is one branch. The FLOP and byte estimates are rn-train(1)'s. */
static double pbeg(rn_net *net, const char *name) { return net->prof ? rn_prof_begin(net->prof, name) : 0; }

static int pend(rn_net *net, double t0, const char *name, int dir, double flops, double bytes, int rc) {
    return net->prof ? rn_prof_end(net->prof, t0, name, dir, RN_PROF_COMPUTE, flops, bytes, rc) : rc;
}

/* a conv: 2 x MACs forward, twice that backward (data and filter; the stem has no data
 * gradient); bytes: input, weight and output once, the weight gradient in fp32 */
static int pend_conv(rn_net *net, double t0, int ui, int n, int dir, int rc) {
    if (!net->prof) return rc;
    const rn_convbn *cb = &net->spec.units[ui];
    const unit_rt *u = &net->u[ui];
    double x = (double)n * u->h * u->w * cb->cin, y = (double)n * u->p * u->q * cb->cout;
    double w = (double)cb->cout * cb->cin * cb->k * cb->k, es = (double)net->es;
    double f = 2 * y * cb->cin * cb->k * cb->k, b = es * (x + y + w);
    if (dir == RN_PROF_BWD) {
        int dx = ui != 0;
        f *= 1 + dx;
        b = es * (x + y + w + (dx ? x : 0)) + 4 * w;
    }
    return rn_prof_end(net->prof, t0, cb->conv, dir, RN_PROF_COMPUTE, f, b, rc);
}

/* a BN (with its ReLU and residual add): 8 FLOPs per element forward (statistics 3,
 * normalise and affine 4, ReLU 1; +1 for a residual), 12 backward; bytes: each tensor
 * read or written once (forward z, y [, residual]; backward z, y, dy, dz [, dres]) */
static int pend_bn(rn_net *net, double t0, int ui, int n, int dir, int res, int rc) {
    if (!net->prof) return rc;
    const rn_convbn *cb = &net->spec.units[ui];
    double e = (double)n * net->u[ui].p * net->u[ui].q * cb->cout, es = (double)net->es;
    double f = dir == RN_PROF_FWD ? (8 + res) * e : 12 * e;
    double b = dir == RN_PROF_FWD ? es * e * (2 + res) : es * e * (4 + res);
    return rn_prof_end(net->prof, t0, cb->bn, dir, RN_PROF_COMPUTE, f, b, rc);
}

void rn_net_destroy(rn_net *net) {
    if (!net) return;
    rn_backend *be = net->be;
    if (net->u)
        for (int i = 0; i < net->spec.nunits; i++) {
            if (!net->u[i].shared_z) rn_backend_free(be, net->u[i].z);
            if (!net->u[i].shared_a) rn_backend_free(be, net->u[i].a);
            rn_backend_free(be, net->u[i].save_mean);
            rn_backend_free(be, net->u[i].save_invstd);
            rn_backend_free(be, net->u[i].reserve);
        }
    void *bufs[] = {net->params, net->fold, net->packed, net->grads, net->spare, net->capt, net->gstat, net->gcoef, net->mom, net->bufs,
                    net->wc, net->gh, net->input, net->pooled_max, net->feat, net->dfeat, net->logits, net->dlogits,
                    net->logits_h, net->dlogits_h, net->labels, net->loss, net->flag, net->lr, net->gsq, net->ema, net->ema_bufs};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) rn_backend_free(be, bufs[i]);
    for (int i = 0; i < 5; i++) rn_backend_free(be, net->g[i]);
    for (int i = 0; i < 5; i++) rn_backend_free(be, net->pool5[i]);
    for (int i = 0; i < RN_NET_SLOTS; i++) {
        rn_backend_free(be, net->rz[i]);
        rn_backend_free(be, net->ra[i]);
    }
    free(net->hstat);
    free(net->hrun);
    free(net->hf);
    free(net->hbuf);
    free(net->ema_tracked);
    free(net->u);
    free(net->prefs);
    free(net);
}

size_t rn_net_bytes(const rn_net *net) { return net->bytes + rn_backend_reserved(net->be); }
void rn_net_freeze_bn(rn_net *net, int on) {
    net->freeze_bn = on != 0;
}

void *rn_net_input(rn_net *net) { return net->input; }
int rn_net_dtype(const rn_net *net) { return net->dtype; }
const float *rn_net_logits(const rn_net *net) { return net->logits; }

/* Lay out parameters: decayed ones (conv weights, fc weight) first, then BN and fc
 * bias (last, as in torchvision's order), so each weight-decay mode is contiguous SGD
 * calls: --no-wd-bn two, --no-wd-norm three. Also each unit's offset in the BN statistics
 * and their length, nstats. */
static int layout(rn_net *net) {
    rn_tensor_desc *d = NULL;
    int n = 0, rc = rn_resnet_tensors(&net->spec, &d, &n);
    if (rc) return rc;
    net->prefs = rn_calloc((size_t)n, sizeof *net->prefs);
    if (!net->prefs) {
        free(d);
        return RN_ENOMEM;
    }
    int64_t off = 0, stat = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            if (d[i].is_buffer) continue;
            int decayed = d[i].kind == RN_T_CONV_W || d[i].kind == RN_T_FC_W;
            if (decayed != (pass == 0)) continue;
            pref *p = &net->prefs[net->npref++];
            p->d = d[i];
            p->off = off;
            p->numel = rn_numel(d[i].shape, (size_t)d[i].ndim);
            off += align16(p->numel);
            if (pass == 0) net->ndecay = off;
            unit_rt *u = d[i].unit >= 0 ? &net->u[d[i].unit] : NULL;
            switch (d[i].kind) {
            case RN_T_CONV_W: u->w_off = p->off; break;
            case RN_T_BN_W: u->g_off = p->off; break;
            case RN_T_BN_B: u->b_off = p->off; break;
            case RN_T_FC_W: net->fc_w = p->off; break;
            case RN_T_FC_B: net->fc_b = p->off; break;
            default: break;
            }
        }
    net->nparams = off;
    /* sgd() relies on it: the fc bias closes the parameters (torchvision's order) */
    if (net->prefs[net->npref - 1].d.kind != RN_T_FC_B) {
        free(d);
        return rn_errorf(RN_EINVAL, "parameter layout: the fc bias is not the last parameter");
    }
    for (int i = 0; i < net->spec.nunits; i++) {
        net->u[i].stat_off = stat;
        stat += 2 * net->spec.units[i].cout;
    }
    net->nstats = stat;
    free(d);
    return RN_OK;
}

int rn_net_param_floats(const rn_resnet *spec, int64_t *nparams, int64_t *nstats) {
    rn_net tmp = {.spec = *spec};
    if (!(tmp.u = rn_calloc((size_t)spec->nunits, sizeof *tmp.u))) return RN_ENOMEM;
    int rc = layout(&tmp);
    *nparams = tmp.nparams;
    *nstats = tmp.nstats;
    free(tmp.prefs);
    free(tmp.u);
    return rc;
}

/* Recomputation's memory: unit j of every block (the downsample after the convs) has its
 * conv output z and BN output a in scratch slot j, sized for the largest such unit, except
 * the block output (the last conv's a), which the next block reads and backward keeps.
 * The stem keeps its own: it is in no block. */
static int share_blocks(rn_net *net) {
    const rn_resnet *s = &net->spec;
    int64_t most_z[RN_NET_SLOTS] = {0}, most_a[RN_NET_SLOTS] = {0};
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < s->nblocks; b++) {
            const rn_block *blk = &s->blocks[b];
            int nu = blk->nconv + (blk->down >= 0);
            if (nu > RN_NET_SLOTS)
                return rn_errorf(RN_EINVAL, "block %d has %d units: recomputation handles %d", b, nu, RN_NET_SLOTS);
            for (int j = 0; j < nu; j++) {
                unit_rt *u = &net->u[j < blk->nconv ? blk->conv[j] : blk->down];
                int own_a = j == blk->nconv - 1; /* the block output: its own */
                if (pass == 0) {
                    if (u->out_elems > most_z[j]) most_z[j] = u->out_elems;
                    if (!own_a && u->out_elems > most_a[j]) most_a[j] = u->out_elems;
                    continue;
                }
                u->z = net->rz[j];
                u->shared_z = 1;
                if (own_a) continue;
                u->a = net->ra[j];
                u->shared_a = 1;
            }
            if (pass == 0 && b == s->nblocks - 1)
                for (int j = 0; j < RN_NET_SLOTS; j++) {
                    size_t bz = (size_t)(net->max_batch * most_z[j]) * net->es;
                    size_t ba = (size_t)(net->max_batch * most_a[j]) * net->es;
                    int rc;
                    if ((most_z[j] && (rc = nalloc(net, bz, &net->rz[j]))) ||
                        (most_a[j] && (rc = nalloc(net, ba, &net->ra[j]))))
                        return rc;
                }
        }
    return RN_OK;
}

/* rn_net_create, or with plan set the same walk counting bytes into *planned */
static int build(rn_backend *be, const rn_resnet *spec, int max_batch, int h, int w, int mode, int dtype, int plan,
                 rn_net **out, size_t *planned) {
    *out = NULL;
    int recompute = (mode & RN_NET_RECOMPUTE) != 0;
    mode &= ~RN_NET_RECOMPUTE;
    if (mode != RN_NET_TRAIN && mode != RN_NET_INFER && mode != RN_NET_INFER_EXACT)
        return rn_errorf(RN_EINVAL, "network mode %d: expected RN_NET_TRAIN, RN_NET_INFER or RN_NET_INFER_EXACT", mode);
    if (recompute && mode != RN_NET_TRAIN)
        return rn_errorf(RN_EINVAL, "recomputation (RN_NET_RECOMPUTE) is for training networks only");
    if (max_batch < 1 || h < 1 || w < 1)
        return rn_errorf(RN_EINVAL, "network input must be at least 1x1x1, not batch %d of %dx%d", max_batch, h, w);
    if (dtype != RN_F32 && dtype != RN_F16 && dtype != RN_BF16)
        return rn_errorf(RN_EINVAL, "network compute type %s: expected F32, F16 or BF16", rn_dtype_name(dtype));
    if (!rn_backend_has_dtype(be, dtype))
        return rn_errorf(RN_ENOTSUP, "network compute type %s: %s computes in F32 only", rn_dtype_name(dtype),
                         rn_backend_name(be));
    rn_net *net = rn_calloc(1, sizeof *net);
    if (!net) return RN_ENOMEM;
    net->gnorm = NAN;
    net->be = be;
    net->plan = plan;
    net->dtype = dtype;
    net->es = rn_dtype_size(dtype);
    net->spec = *spec;
    net->mode = mode;
    net->recompute = recompute;
    net->max_batch = max_batch;
    net->fc_pk_off = -1;
    net->h = h;
    net->w = w;
    int rc = RN_OK;
    net->u = rn_calloc((size_t)spec->nunits, sizeof *net->u);
    if (!net->u) {
        rc = RN_ENOMEM;
        goto fail;
    }
    if ((rc = layout(net))) goto fail;

    /* shapes: stem conv, max pool, then each block's units from the block input */
    size_t ws = 0;
    int64_t max_act = (int64_t)h * w * 3;
    rn_conv_desc cd;
    rn_bn_desc bd;
    int ch = h, cw = w;
    for (int b = -1; b < spec->nblocks; b++) {
        int nu = b < 0 ? 1 : spec->blocks[b].nconv + (spec->blocks[b].down >= 0);
        int bh = ch, bw = cw;
        for (int j = 0; j < nu; j++) {
            int ui = b < 0 ? 0 : j < spec->blocks[b].nconv ? spec->blocks[b].conv[j] : spec->blocks[b].down;
            unit_rt *u = &net->u[ui];
            /* main-path units chain; the downsample reads the block input */
            u->h = (b >= 0 && ui == spec->blocks[b].down) ? bh : ch;
            u->w = (b >= 0 && ui == spec->blocks[b].down) ? bw : cw;
            if ((rc = conv_desc(net, ui, max_batch, &cd)) != RN_OK) {
                rn_error_context(rc, "input %dx%d is too small for %s (unit %s)", h, w, spec->arch,
                                 spec->units[ui].conv);
                rc = RN_EINVAL;
                goto fail;
            }
            u->p = cd.p;
            u->q = cd.q;
            u->relu = b < 0 || ui != spec->blocks[b].down;
            u->out_elems = (int64_t)cd.p * cd.q * spec->units[ui].cout;
            if ((int64_t)u->h * u->w * spec->units[ui].cin > max_act) max_act = (int64_t)u->h * u->w * spec->units[ui].cin;
            if (u->out_elems > max_act) max_act = u->out_elems;
            /* planning on a device takes the bound: asking would benchmark algorithms */
            size_t cw_ = plan && rn_backend_workspace_limit(be) ? rn_backend_workspace_limit(be)
                                                                : rn_conv_workspace(be, &cd);
            if (cw_ > ws) ws = cw_;
            if ((rc = bn_desc(net, ui, max_batch, &bd)) != RN_OK) goto fail;
            if (mode == RN_NET_TRAIN && bd.m < 2) {
                rc = rn_errorf(RN_EINVAL, "input %dx%d at batch %d leaves one value per channel at %s: BatchNorm "
                                          "cannot train on that (use a larger --crop or --batch)",
                               h, w, max_batch, spec->units[ui].bn);
                goto fail;
            }
            size_t bw_ = rn_bn_workspace(be, &bd);
            if (bw_ > ws) ws = bw_;
            if (ui != (b >= 0 ? spec->blocks[b].down : -1)) ch = cd.p, cw = cd.q;
        }
        if (b < 0) {
            if ((rc = rn_pool_desc_init(&net->pool, max_batch, ch, cw, 64, 3, 2, 1)) != RN_OK) {
                rc = rn_error_context(RN_EINVAL, "input %dx%d is too small for the stem max pool", h, w);
                goto fail;
            }
            net->pool_h = ch = net->pool.p;
            net->pool_w = cw = net->pool.q;
        }
    }
    net->fin_hw = ch * cw;
    net->max_act = max_act;
    if (mode == RN_NET_TRAIN) { /* rn_net_set_lars's norms: bounded by the largest tensor */
        for (int i = 0; i < net->npref; i++)
            if (rn_lars_workspace(be, net->prefs[i].numel) > ws) ws = rn_lars_workspace(be, net->prefs[i].numel);
        /* rn_net_set_clip's: every gradient at once, padding included */
        if (rn_sumsq_workspace(be, net->nparams) > ws) ws = rn_sumsq_workspace(be, net->nparams);
    }
    /* the inference path: BN folded into the convs (fold_bn), rn_conv_bias_fwd, the fc a 1x1 conv */
    const int folds = mode == RN_NET_INFER && dtype == RN_F32 && rn_backend_has_conv_bias(be);
    if (folds) { /* fc_fwd's 1x1 conv */
        rn_conv_desc fd;
        if ((rc = fc_conv_desc(net, max_batch, &fd))) goto fail;
        if (rn_conv_workspace(be, &fd) > ws) ws = rn_conv_workspace(be, &fd);
    } else { /* rn_fc_fwd and rn_fc_bwd */
        rn_fc_desc fd = {dtype, max_batch, spec->fc_in, spec->num_classes};
        if (rn_fc_workspace(be, &fd) > ws) ws = rn_fc_workspace(be, &fd);
    }
    if (plan) net->bytes += ws;
    else if ((rc = rn_backend_reserve(be, ws)) != RN_OK) goto fail;

    int64_t B = max_batch, K = spec->num_classes, F = spec->fc_in;
    int64_t nstats = net->nstats; /* (layout's) */
    for (int i = 0; i < spec->nunits; i++)
        if (spec->units[i].cout > net->maxc) net->maxc = spec->units[i].cout;
    /* fl: fp32 (weights, statistics, the loss); es: activations (half under AMP) */
    size_t fl = sizeof(float), es = net->es;
    int amp = dtype != RN_F32;
    if ((rc = nalloc(net, (size_t)net->nparams * fl, &net->params)) ||
        (rc = nalloc(net, (size_t)nstats * fl, &net->bufs)) ||
        (rc = nalloc(net, (size_t)B * h * w * 3 * es, &net->input)) ||
        (rc = nalloc(net, (size_t)(B * F) * es, &net->feat)) ||
        (rc = nalloc(net, (size_t)(B * K) * fl, &net->logits)) ||
        (rc = nalloc(net, (size_t)B * sizeof(int32_t), &net->labels)) || (rc = nalloc(net, fl, &net->loss)) ||
        (amp && (rc = nalloc(net, (size_t)net->nparams * es, &net->wc))) ||
        (amp && (rc = nalloc(net, (size_t)(B * K) * es, &net->logits_h))))
        goto fail;
    if ((rc = nzero(net, net->params, (size_t)net->nparams * fl))) goto fail;
    if (folds) {
        if ((rc = nalloc(net, (size_t)net->nparams * fl, &net->fold))) goto fail;
        if ((rc = nzero(net, net->fold, (size_t)net->nparams * fl))) goto fail;
        int64_t npacked = 0;
        rn_conv_desc cd;
        for (int ui = 0; ui < spec->nunits; ui++) {
            if ((rc = conv_desc(net, ui, max_batch, &cd))) goto fail;
            net->u[ui].pk_off = pack_slot(be, &cd, &npacked);
        }
        if ((rc = fc_conv_desc(net, max_batch, &cd))) goto fail;
        net->fc_pk_off = pack_slot(be, &cd, &npacked);
        if (npacked && ((rc = nalloc(net, (size_t)npacked * fl, &net->packed)) ||
                        (rc = nzero(net, net->packed, (size_t)npacked * fl))))
            goto fail;
    }
    if (amp && (rc = nzero(net, net->wc, (size_t)net->nparams * es))) goto fail;
    if (mode == RN_NET_TRAIN) {
        /* gh holds the largest weight, or the fc weight and then its bias */
        for (int i = 0; i < net->npref; i++)
            if (net->prefs[i].numel > net->gh_numel) net->gh_numel = net->prefs[i].numel;
        if (net->gh_numel < align16(F * K) + K) net->gh_numel = align16(F * K) + K;
        if ((rc = nalloc(net, (size_t)net->nparams * fl, &net->grads)) ||
            (rc = nalloc(net, (size_t)net->nparams * fl, &net->spare)) ||
            (rc = nalloc(net, (size_t)nstats * fl, &net->capt)) ||
            (rc = nalloc(net, (size_t)nstats * fl, &net->gstat)) ||
            (rc = nalloc(net, (size_t)(2 * net->maxc) * fl, &net->gcoef)) ||
            (rc = nalloc(net, (size_t)net->nparams * fl, &net->mom)) ||
            (rc = nalloc(net, (size_t)(B * F) * es, &net->dfeat)) ||
            (rc = nalloc(net, (size_t)(B * K) * fl, &net->dlogits)) ||
            (rc = nalloc(net, (size_t)B * net->pool_h * net->pool_w * 64 * es, &net->pooled_max)) ||
            (rc = nalloc(net, sizeof(int32_t), &net->flag)) ||
            (rc = nalloc(net, sizeof(float), &net->lr)) ||
            (rc = nalloc(net, sizeof(double), &net->gsq)) ||
            (amp && (rc = nalloc(net, (size_t)(B * K) * es, &net->dlogits_h))) ||
            (amp && (rc = nalloc(net, (size_t)net->gh_numel * es, &net->gh))))
            goto fail;
        /* spare too: its padding between parameters is added into grads' by every
           accumulating backward, and would carry whatever the allocation held */
        if ((rc = nzero(net, net->grads, (size_t)net->nparams * fl)) ||
            (rc = nzero(net, net->spare, (size_t)net->nparams * fl)))
            goto fail;
        for (int i = 0; i < 5; i++)
            if ((rc = nalloc(net, (size_t)(B * max_act) * es, &net->g[i]))) goto fail;
        if (recompute && (rc = share_blocks(net))) goto fail;
        for (int i = 0; i < spec->nunits; i++) {
            unit_rt *u = &net->u[i];
            int c = spec->units[i].cout;
            /* (the reserve as the unit's calls have it: CUDA keeps a ReLU mask there) */
            if ((rc = bn_desc(net, i, max_batch, &bd))) goto fail;
            size_t rs = rn_bn_reserve_size(be, &bd);
            if ((!u->shared_z && (rc = nalloc(net, (size_t)(B * u->out_elems) * es, &u->z))) ||
                (!u->shared_a && (rc = nalloc(net, (size_t)(B * u->out_elems) * es, &u->a))) ||
                (rc = nalloc(net, (size_t)c * fl, &u->save_mean)) ||
                (rc = nalloc(net, (size_t)c * fl, &u->save_invstd)) || (rs && (rc = nalloc(net, rs, &u->reserve))))
                goto fail;
        }
    } else {
        for (int i = 0; i < 5; i++)
            if ((rc = nalloc(net, (size_t)(B * max_act) * es, &net->pool5[i]))) goto fail;
    }
    if (plan) {
        *planned = net->bytes;
        rn_net_destroy(net);
        return RN_OK;
    }
    *out = net;
    return RN_OK;
fail:
    rn_net_destroy(net);
    return rc;
}

int rn_net_create(rn_backend *be, const rn_resnet *spec, int max_batch, int h, int w, int mode, int dtype,
                  rn_net **out) {
    return build(be, spec, max_batch, h, w, mode, dtype, 0, out, NULL);
}

int rn_net_plan(rn_backend *be, const rn_resnet *spec, int max_batch, int h, int w, int mode, int dtype,
                size_t *bytes) {
    rn_net *none;
    *bytes = 0;
    return build(be, spec, max_batch, h, w, mode, dtype, 1, &none, bytes);
}

static const pref *find_pref(const rn_net *net, const char *name) {
    for (int i = 0; i < net->npref; i++)
        if (strcmp(net->prefs[i].d.name, name) == 0) return &net->prefs[i];
    return NULL;
}

/* Host tensor (torchvision layout) <-> flat backend array (backend layout). */
static int put(rn_net *net, float *dst_base, const pref *p, const float *src) {
    const rn_tensor_desc *d = &p->d;
    if (d->kind == RN_T_CONV_W && d->shape[2] > 1) {
        float *tmp = rn_malloc((size_t)p->numel * sizeof(float));
        if (!tmp) return RN_ENOMEM;
        rn_conv_oihw_to_ohwi(src, tmp, (int)d->shape[0], (int)d->shape[1], (int)d->shape[2], (int)d->shape[3]);
        int rc = rn_backend_upload(net->be, dst_base + p->off, tmp, (size_t)p->numel * sizeof(float));
        free(tmp);
        return rc;
    }
    return rn_backend_upload(net->be, dst_base + p->off, src, (size_t)p->numel * sizeof(float));
}

static int get(rn_net *net, const float *src_base, const pref *p, float *dst) {
    const rn_tensor_desc *d = &p->d;
    if (d->kind == RN_T_CONV_W && d->shape[2] > 1) {
        float *tmp = rn_malloc((size_t)p->numel * sizeof(float));
        if (!tmp) return RN_ENOMEM;
        int rc = rn_backend_download(net->be, tmp, src_base + p->off, (size_t)p->numel * sizeof(float));
        if (rc == RN_OK)
            rn_conv_ohwi_to_oihw(tmp, dst, (int)d->shape[0], (int)d->shape[1], (int)d->shape[2], (int)d->shape[3]);
        free(tmp);
        return rc;
    }
    return rn_backend_download(net->be, dst, src_base + p->off, (size_t)p->numel * sizeof(float));
}

/* The running statistics of every BN unit between the net and c: into the net when
 * to_net, else into c. */
static int exchange_bn(rn_net *net, const rn_ckpt *c, int to_net) {
    char name[80];
    for (int i = 0; i < net->spec.nunits; i++) {
        const char *bn = net->spec.units[i].bn;
        size_t bytes = (size_t)net->spec.units[i].cout * sizeof(float);
        float *mean = net->bufs + net->u[i].stat_off, *var = mean + net->spec.units[i].cout;
        snprintf(name, sizeof name, "%s.running_mean", bn);
        rn_ptensor *m = rn_ckpt_find(c, name);
        snprintf(name, sizeof name, "%s.running_var", bn);
        rn_ptensor *v = rn_ckpt_find(c, name);
        snprintf(name, sizeof name, "%s.num_batches_tracked", bn);
        rn_ptensor *k = rn_ckpt_find(c, name);
        if (!m || !v || !k) return rn_errorf(RN_EINVAL, "checkpoint lacks the running statistics of %s", bn);
        int rc;
        if (to_net) {
            if ((rc = rn_backend_upload(net->be, mean, m->data.data, bytes))) return rc;
            if ((rc = rn_backend_upload(net->be, var, v->data.data, bytes))) return rc;
            memcpy(&net->u[i].tracked, k->data.data, sizeof(int64_t));
        } else {
            if ((rc = rn_backend_download(net->be, m->data.data, mean, bytes))) return rc;
            if ((rc = rn_backend_download(net->be, v->data.data, var, bytes))) return rc;
            memcpy(k->data.data, &net->u[i].tracked, sizeof(int64_t));
        }
    }
    return RN_OK;
}

int rn_net_load(rn_net *net, const rn_ckpt *c) {
    if (!c->model || strcmp(c->model->arch, net->spec.arch) != 0 || c->model->num_classes != net->spec.num_classes)
        return rn_errorf(RN_EINVAL, "checkpoint is %s/%d classes, the network %s/%d",
                         c->model ? c->model->arch : "?", c->model ? c->model->num_classes : 0, net->spec.arch,
                         net->spec.num_classes);
    /* inference nets keep no momentum */
    int with_mom = net->mom && rn_state_has_momentum(c);
    for (int i = 0; i < net->npref; i++) {
        const pref *p = &net->prefs[i];
        const rn_ptensor *t = rn_ckpt_find(c, p->d.name), *m = with_mom ? rn_state_momentum(c, p->d.name) : NULL;
        if (!t) return rn_errorf(RN_EINVAL, "checkpoint lacks %s", p->d.name);
        if (with_mom && !m) return rn_errorf(RN_EINVAL, "checkpoint lacks the momentum of %s", p->d.name);
        int rc = put(net, net->params, p, rn_ptensor_f32(t));
        if (rc == RN_OK && m) rc = put(net, net->mom, p, rn_ptensor_f32(m));
        if (rc) return rc;
    }
    int rc = exchange_bn(net, c, 1);
    if (rc) return rc;
    net->have_mom = with_mom;
    if (net->fold && (rc = fold_bn(net))) return rc;
    return net->wc ? rn_cast(net->be, RN_F32, net->dtype, net->nparams, net->params, net->wc, 0) : RN_OK;
}

/* net->fold from params and the running statistics: per output channel
 * s = gamma / sqrt(var + eps), w' = w * s and bias = beta - mean * s, in double, each
 * rounded once to float. */
static int fold_bn(rn_net *net) {
    int rc = RN_OK;
    float *p = rn_malloc((size_t)net->nparams * sizeof(float)), *st = rn_malloc((size_t)net->nstats * sizeof(float));
    if (!p || !st) {
        rc = RN_ENOMEM;
        goto fail;
    }
    if ((rc = rn_backend_download(net->be, p, net->params, (size_t)net->nparams * sizeof(float))) ||
        (rc = rn_backend_download(net->be, st, net->bufs, (size_t)net->nstats * sizeof(float))))
        goto fail;
    for (int i = 0; i < net->spec.nunits; i++) {
        const rn_convbn *cb = &net->spec.units[i];
        const unit_rt *u = &net->u[i];
        const int64_t per = (int64_t)cb->cin * cb->k * cb->k;
        const float *mean = st + u->stat_off, *var = mean + cb->cout;
        float *w = p + u->w_off, *gamma = p + u->g_off, *beta = p + u->b_off;
        for (int k = 0; k < cb->cout; k++) {
            double s = (double)gamma[k] / sqrt((double)var[k] + (double)RN_BN_EPS);
            for (int64_t e = 0; e < per; e++) w[k * per + e] = (float)((double)w[k * per + e] * s);
            beta[k] = (float)((double)beta[k] - (double)mean[k] * s);
        }
    }
    if ((rc = rn_backend_upload(net->be, net->fold, p, (size_t)net->nparams * sizeof(float)))) goto fail;
    for (int i = 0; i < net->spec.nunits && rc == RN_OK; i++) {
        rn_conv_desc cd;
        if (net->u[i].pk_off < 0) continue;
        if ((rc = conv_desc(net, i, net->max_batch, &cd)) == RN_OK)
            rc = rn_conv_bias_pack(net->be, &cd, net->fold + net->u[i].w_off, net->packed + net->u[i].pk_off);
    }
    rn_conv_desc fd;
    if (rc == RN_OK && net->fc_pk_off >= 0 && (rc = fc_conv_desc(net, net->max_batch, &fd)) == RN_OK)
        rc = rn_conv_bias_pack(net->be, &fd, net->fold + net->fc_w, net->packed + net->fc_pk_off);
    /* a pack that failed part-way: every unit reads fold (these weights) from now on,
       never a mix of this load's packed copies and an earlier one's */
    if (rc != RN_OK) {
        for (int i = 0; i < net->spec.nunits; i++) net->u[i].pk_off = -1;
        net->fc_pk_off = -1;
    }
fail:
    free(p);
    free(st);
    return rc;
}

int rn_net_store(rn_net *net, rn_ckpt *c) {
    int rc = net->have_mom ? rn_state_momentum_alloc(c) : RN_OK;
    for (int i = 0; i < net->npref && rc == RN_OK; i++) {
        const pref *p = &net->prefs[i];
        rn_ptensor *t = rn_ckpt_find(c, p->d.name);
        if (!t) return rn_errorf(RN_EINVAL, "checkpoint lacks %s", p->d.name);
        rc = get(net, net->params, p, rn_ptensor_f32(t));
        if (rc == RN_OK && net->have_mom) rc = get(net, net->mom, p, rn_ptensor_f32(rn_state_momentum(c, p->d.name)));
    }
    return rc ? rc : exchange_bn(net, c, 0);
}

/* Synchronised BN forward of unit ui (rn_net_set_sync): this process's batch statistics,
 * every process's combined, then the normalisation with the global ones. */
static int sync_fwd(rn_net *net, int ui, const rn_bn_desc *bd, const void *z, const float *gamma, const float *beta,
                    const void *res, void *y) {
    unit_rt *u = &net->u[ui];
    const int c = net->spec.units[ui].cout, k = 2 * c + 1;
    float *gm = net->gstat + u->stat_off, *gv = gm + c;
    /* momentum 1 makes the "running" outputs this batch's mean and unbiased variance,
       (1 - 1) * 0 + 1 * x; zeroed first so that no inf/NaN of an earlier step survives
       the 0 * x. Its y is overwritten below. */
    rn_bn_desc sd = *bd;
    sd.momentum = 1.0f;
    int rc = rn_backend_zero(net->be, gm, sizeof(float) * 2 * (size_t)c);
    if (rc || (rc = rn_bn_fwd_train(net->be, &sd, z, gamma, beta, res, y, u->save_mean, u->save_invstd, gm, gv,
                                    u->reserve)) ||
        (rc = rn_backend_download(net->be, net->hf, gm, sizeof(float) * 2 * (size_t)c)))
        return rc;
    double m = (double)bd->m, *mine = net->hbuf, *all = mine + 2 * net->maxc + 1;
    mine[0] = m;
    for (int j = 0; j < c; j++) {
        mine[1 + j] = net->hf[j];
        mine[1 + c + j] = net->hf[c + j] * (m - 1) / m; /* biased */
    }
    if ((rc = net->gather(net->gather_ctx, mine, sizeof(double) * (size_t)k, all))) return rc;
    /* in rank order, in double: the count, the mean, then the biased variance about it
       (each process's variance plus its mean's squared distance from the global mean) */
    double n = 0;
    for (int r = 0; r < net->world; r++) n += all[r * k];
    float *hm = net->hstat + u->stat_off, *hr = net->hrun + u->stat_off;
    for (int j = 0; j < c; j++) {
        double s = 0, v = 0;
        for (int r = 0; r < net->world; r++) s += all[r * k] * all[r * k + 1 + j];
        double mean = s / n;
        for (int r = 0; r < net->world; r++) {
            double d = all[r * k + 1 + j] - mean;
            v += all[r * k] * (all[r * k + 1 + c + j] + d * d);
        }
        double var = v / n;
        hm[j] = (float)mean;
        hm[c + j] = (float)var;
        hr[j] = (float)mean;
        hr[c + j] = (float)(var * n / (n - 1));
    }
    if ((rc = rn_backend_upload(net->be, gm, hm, sizeof(float) * 2 * (size_t)c))) return rc;
    /* rn_bn_fwd_infer's invstd is 1/sqrt(var + eps): the biased variance normalises */
    return rn_bn_fwd_infer(net->be, bd, z, gamma, beta, gm, gv, res, y);
}

/* The BN part of a unit forward: z -> y (BN [+ residual] [ReLU]). */
static int bn_fwd(rn_net *net, int ui, int train, const rn_bn_desc *bdp, const void *z, void *y, const void *res) {
    rn_bn_desc bd = *bdp;
    unit_rt *u = &net->u[ui];
    float *gamma = net->params + u->g_off, *beta = net->params + u->b_off;
    float *rm = net->bufs + u->stat_off, *rv = rm + net->spec.units[ui].cout;
    if (train && !net->freeze_bn) {
        if (net->again) {
            /* backward's recomputation: the forward's very y (the same op on the same z
               gives the same bits), the statistics it saved rewritten with themselves, and
               the running ones (or the capture) left alone: NULL updates none. Synchronised
               BN normalised with the global statistics, which gstat still holds. */
            if (net->gather)
                return rn_bn_fwd_infer(net->be, &bd, z, gamma, beta, net->gstat + u->stat_off,
                                       net->gstat + u->stat_off + net->spec.units[ui].cout, res, y);
            return rn_bn_fwd_train(net->be, &bd, z, gamma, beta, res, y, u->save_mean, u->save_invstd, NULL, NULL,
                                   u->reserve);
        }
        if (net->gather) return sync_fwd(net, ui, &bd, z, gamma, beta, res, y);
        if (net->capture) {
            /* momentum 1 makes the "running" update the batch statistics themselves:
               (1 - 1) * 0 + 1 * mean; rn_net_bn_replay applies them later (num_batches_tracked
               with them: count_batch counts no capturing forward) */
            bd.momentum = 1.0f;
            rm = net->capt + u->stat_off, rv = rm + net->spec.units[ui].cout;
        }
        return rn_bn_fwd_train(net->be, &bd, z, gamma, beta, res, y, u->save_mean, u->save_invstd, rm, rv,
                               u->reserve);
    }
    return rn_bn_fwd_infer(net->be, &bd, z, gamma, beta, rm, rv, res, y);
}

/* One conv+BN unit forward: x -> z (conv) -> y (BN [+ residual] [ReLU]). */
static int unit_fwd(rn_net *net, int ui, int n, int train, const void *x, void *z, void *y, const void *res) {
    rn_conv_desc cd;
    rn_bn_desc bd;
    unit_rt *u = &net->u[ui];
    const rn_convbn *cb = &net->spec.units[ui];
    int rc;
    if ((rc = conv_desc(net, ui, n, &cd)) || (rc = bn_desc(net, ui, n, &bd))) return rc;
    double t0 = pbeg(net, cb->conv);
    /* (the folded path's row is the conv's: its BN, residual and ReLU are in it) */
    if (!train && net->fold && u->pk_off >= 0)
        return pend_conv(net, t0, ui, n, RN_PROF_FWD,
                         rn_conv_bias_fwd_packed(net->be, &cd, x, net->packed + u->pk_off, net->fold + u->b_off, res,
                                                 u->relu, y));
    if (!train && net->fold)
        return pend_conv(net, t0, ui, n, RN_PROF_FWD,
                         rn_conv_bias_fwd(net->be, &cd, x, net->fold + u->w_off, net->fold + u->b_off, res, u->relu, y));
    if ((rc = pend_conv(net, t0, ui, n, RN_PROF_FWD, rn_conv_fwd(net->be, &cd, x, weight(net, u->w_off), z))))
        return rc;
    t0 = pbeg(net, cb->bn);
    return pend_bn(net, t0, ui, n, RN_PROF_FWD, res != NULL, bn_fwd(net, ui, train, &bd, z, y, res));
}

static int fc_fwd(rn_net *net, int n) {
    rn_fc_desc fd = {net->dtype, n, net->spec.fc_in, net->spec.num_classes};
    if (net->fold) { /* the inference path */
        rn_conv_desc cd;
        int rc = fc_conv_desc(net, n, &cd);
        if (rc) return rc;
        const float *b = net->fold + net->fc_b;
        return net->fc_pk_off >= 0
                   ? rn_conv_bias_fwd_packed(net->be, &cd, net->feat, net->packed + net->fc_pk_off, b, NULL, 0,
                                             net->logits)
                   : rn_conv_bias_fwd(net->be, &cd, net->feat, net->fold + net->fc_w, b, NULL, 0, net->logits);
    }
    if (!net->wc)
        return rn_fc_fwd(net->be, &fd, net->feat, net->params + net->fc_w, net->params + net->fc_b, net->logits);
    int rc = rn_fc_fwd(net->be, &fd, net->feat, weight(net, net->fc_w), weight(net, net->fc_b), net->logits_h);
    if (rc) return rc;
    return rn_cast(net->be, net->dtype, RN_F32, (int64_t)n * net->spec.num_classes, net->logits_h, net->logits, 0);
}

static int head_fwd(rn_net *net, int n, const void *x) {
    double c = net->spec.fc_in, k = net->spec.num_classes, es = (double)net->es, hw = net->fin_hw;
    double t0 = pbeg(net, "avgpool");
    int rc = pend(net, t0, "avgpool", RN_PROF_FWD, n * hw * c, es * n * c * (hw + 1),
                  rn_avgpool_global_fwd(net->be, net->dtype, n, net->fin_hw, net->spec.fc_in, x, net->feat));
    if (rc) return rc;
    t0 = pbeg(net, "fc");
    return pend(net, t0, "fc", RN_PROF_FWD, 2 * n * c * k + n * k, es * (n * c + c * k + n * k) + 4 * k,
                fc_fwd(net, n));
}

/* the stem's max pool: 9 compares per output forward, one per output backward */
static int pend_pool(rn_net *net, double t0, int n, int dir, int rc) {
    if (!net->prof) return rc;
    double in = (double)n * net->u[0].p * net->u[0].q * 64, out = (double)n * net->pool_h * net->pool_w * 64;
    double es = (double)net->es;
    return rn_prof_end(net->prof, t0, "maxpool", dir, RN_PROF_COMPUTE, dir == RN_PROF_FWD ? 9 * out : out,
                       es * (dir == RN_PROF_FWD ? in + out : 2 * in + 2 * out), rc);
}

/* What block b reads in a training net: the stem's max-pool output or the previous
 * block's output (b == nblocks: the last block's output, the head's input). */
static const void *block_input(const rn_net *net, int b) {
    if (b == 0) return net->pooled_max;
    const rn_block *prev = &net->spec.blocks[b - 1];
    return net->u[prev->conv[prev->nconv - 1]].a;
}

/* Block b's training forward from x: the downsample, then the convs, the last adding
 * the shortcut. Backward runs it again under recomputation (net->again). */
static int block_fwd(rn_net *net, int b, int n, const void *x) {
    const rn_block *blk = &net->spec.blocks[b];
    const void *res = x;
    int rc;
    if (blk->down >= 0) {
        unit_rt *d = &net->u[blk->down];
        if ((rc = unit_fwd(net, blk->down, n, 1, x, d->z, d->a, NULL))) return rc;
        res = d->a;
    }
    const void *in = x;
    for (int j = 0; j < blk->nconv; j++) {
        unit_rt *u = &net->u[blk->conv[j]];
        int last = j == blk->nconv - 1;
        if ((rc = unit_fwd(net, blk->conv[j], n, 1, in, u->z, u->a, last ? res : NULL))) return rc;
        in = u->a;
    }
    return RN_OK;
}

static int forward_train(rn_net *net, int n) {
    const rn_resnet *s = &net->spec;
    int rc = unit_fwd(net, 0, n, 1, net->input, net->u[0].z, net->u[0].a, NULL);
    rn_pool_desc pd;
    if (rc || (rc = pool_desc(net, n, &pd))) return rc;
    double t0 = pbeg(net, "maxpool");
    if ((rc = pend_pool(net, t0, n, RN_PROF_FWD, rn_maxpool_fwd(net->be, &pd, net->u[0].a, net->pooled_max))))
        return rc;
    for (int b = 0; b < s->nblocks; b++)
        if ((rc = block_fwd(net, b, n, block_input(net, b)))) return rc;
    return head_fwd(net, n, block_input(net, s->nblocks));
}

/* Inference: five rotating buffers, BN in place over the conv output. */
static int forward_infer(rn_net *net, int n) {
    const rn_resnet *s = &net->spec;
    /* a training net evaluating uses its gradient scratch, free between steps */
    void **B = net->mode == RN_NET_TRAIN ? net->g : net->pool5;
    int rc = unit_fwd(net, 0, n, 0, net->input, B[0], B[0], NULL);
    rn_pool_desc pd;
    if (rc || (rc = pool_desc(net, n, &pd))) return rc;
    double t0 = pbeg(net, "maxpool");
    if ((rc = pend_pool(net, t0, n, RN_PROF_FWD, rn_maxpool_fwd(net->be, &pd, B[0], B[1])))) return rc;
    int xi = 1;
    for (int b = 0; b < s->nblocks && rc == RN_OK; b++) {
        const rn_block *blk = &s->blocks[b];
        int f[4], k = 0;
        for (int i = 0; i < 5 && k < 4; i++)
            if (i != xi) f[k++] = i;
        int ri = xi;
        if (blk->down >= 0) {
            if ((rc = unit_fwd(net, blk->down, n, 0, B[xi], B[f[3]], B[f[3]], NULL))) return rc;
            ri = f[3];
        }
        int in = xi;
        for (int j = 0; j < blk->nconv && rc == RN_OK; j++) {
            int last = j == blk->nconv - 1;
            rc = unit_fwd(net, blk->conv[j], n, 0, B[in], B[f[j]], B[f[j]], last ? B[ri] : NULL);
            in = f[j];
        }
        xi = in;
    }
    return rc ? rc : head_fwd(net, n, B[xi]);
}

/* num_batches_tracked: one more batch for every BN layer whose running statistics a
 * training forward updated (each layer's bn_fwd once per forward; synchronised BN counts
 * in bn_update, a capture in rn_net_bn_replay) */
void rn_net_count_batch(rn_net *net, int n) {
    net->last_n = n;
    if (net->mode != RN_NET_TRAIN || net->freeze_bn || net->gather || net->capture) return;
    for (int i = 0; i < net->spec.nunits; i++) net->u[i].tracked++;
}

void rn_net_count_by_caller(rn_net *net, int on) { net->caller_counts = on != 0; }

void rn_net_set_mix_at(rn_net *net, const double *mix_weight) { net->mix_at = mix_weight; }

const void *rn_net_weights(const rn_net *net) { return net->params; }

int rn_net_forward(rn_net *net, int n, int train) {
    if (n < 1 || n > net->max_batch)
        return rn_errorf(RN_EINVAL, "batch of %d images, the network was built for 1..%d", n, net->max_batch);
    if (train && net->mode != RN_NET_TRAIN) return rn_errorf(RN_EINVAL, "training forward on an inference network");
    net->last_n = n;
    if (!train) return forward_infer(net, n);
    /* a capture starts from zeros: the momentum-1 update keeps no trace of the last */
    int rc = net->capture ? rn_backend_zero(net->be, net->capt, sizeof(float) * (size_t)net->nstats) : RN_OK;
    if (rc || (rc = forward_train(net, n))) return rc;
    if (!net->caller_counts) rn_net_count_batch(net, n);
    /* synchronised BN: every process makes the same update with the global statistics */
    return net->gather && !net->freeze_bn ? bn_update(net, net->hrun, 1) : RN_OK;
}

/* The loss of the last forward against labels into loss_dev, both in backend memory,
 * and its gradient into dlogits (NULL: none). */
static int loss_of(rn_net *net, const int32_t *labels_dev, int n, float smoothing, double mix_weight,
                   const double *mix_at, float grad_scale, float *dlogits, float *loss_dev) {
    if (n != net->last_n) return rn_errorf(RN_EINVAL, "loss of %d labels after a forward of %d images", n, net->last_n);
    rn_xent_desc xd;
    int rc = rn_xent_desc_init(&xd, n, net->spec.num_classes);
    if (rc) return rc;
    xd.label_smoothing = smoothing;
    xd.grad_scale = grad_scale;
    xd.mix_weight = mix_weight;
    xd.mix_weight_at = mix_at;
    return rn_softmax_xent(net->be, &xd, net->logits, labels_dev, loss_dev, dlogits);
}

/* host labels into the net's label buffer */
static int upload_labels(rn_net *net, const int32_t *labels, int n) {
    if (n < 1 || n > net->max_batch)
        return rn_errorf(RN_EINVAL, "%d labels, the network was built for 1..%d images", n, net->max_batch);
    return rn_backend_upload(net->be, net->labels, labels, (size_t)n * sizeof(int32_t));
}

int rn_net_loss(rn_net *net, const int32_t *labels, int n, float label_smoothing, float *loss) {
    int rc = upload_labels(net, labels, n);
    if (rc || (rc = loss_of(net, net->labels, n, label_smoothing, 0, NULL, 1.0f, NULL, net->loss))) return rc;
    return rn_backend_download(net->be, loss, net->loss, sizeof(float));
}

/* Backward of one conv+BN unit, its parameter gradients replacing the stored ones. dy
 * (its BN output gradient) is consumed. dres receives the gradient of the residual input
 * (may alias dy). dx receives the gradient of the unit's input (accumulate_dx adds to
 * it); NULL skips it (the stem). */
/* Under AMP a conv or fc weight's gradient comes out of its backward op in dtype (into
 * gh): copy it into the fp32 master gradient at off, as autocast's cast back to the fp32
 * parameter does in PyTorch. (In fp32 the ops write grads directly.) */
static int fold_grad(rn_net *net, const void *gh, int64_t off, int64_t numel) {
    return rn_cast(net->be, net->dtype, RN_F32, numel, gh, net->grads + off, 0);
}

/* Synchronised BN backward of unit ui, after rn_bn_bwd_frozen on the global statistics
 * left dz = gamma*invstd*dz, dgamma = sum dz*xhat and dbeta = sum dz (this process's
 * sums, replacing the stored ones): every process's sums added in rank order give G and
 * Bt over the M images, and dz -= gamma*invstd*(Bt/M + xhat*G/M), an affine function of
 * the BN input z per channel, which rn_bn_fwd_infer adds with dz as its residual. */
static int sync_bwd(rn_net *net, int ui, const rn_bn_desc *bd, void *dz) {
    unit_rt *u = &net->u[ui];
    const int c = net->spec.units[ui].cout, k = 2 * c + 1;
    float *hf = net->hf, *gm = net->gstat + u->stat_off, *gv = gm + c;
    size_t cb = sizeof(float) * (size_t)c;
    int rc;
    if ((rc = rn_backend_download(net->be, hf, net->grads + u->b_off, cb)) ||
        (rc = rn_backend_download(net->be, hf + c, net->grads + u->g_off, cb)) ||
        (rc = rn_backend_download(net->be, hf + 2 * c, net->params + u->g_off, cb)))
        return rc;
    double *mine = net->hbuf, *all = mine + 2 * net->maxc + 1;
    mine[0] = (double)bd->m;
    for (int j = 0; j < 2 * c; j++) mine[1 + j] = hf[j];
    if ((rc = net->gather(net->gather_ctx, mine, sizeof(double) * (size_t)k, all))) return rc;
    double n = 0;
    for (int r = 0; r < net->world; r++) n += all[r * k];
    const float *hv = net->hstat + u->stat_off + c;
    float *scale = hf, *shift = hf + c; /* (overwriting the sums, read by then) */
    for (int j = 0; j < c; j++) {
        double bt = 0, g = 0;
        for (int r = 0; r < net->world; r++) bt += all[r * k + 1 + j], g += all[r * k + 1 + c + j];
        /* the invstd rn_bn_fwd_infer computes, so that gamma' * (z - mean) * invstd is xhat * gamma' */
        double a = hf[2 * c + j] / sqrt((double)hv[j] + bd->eps);
        scale[j] = (float)(-a * g / n);
        shift[j] = (float)(-a * bt / n);
    }
    rn_bn_desc d = *bd;
    d.relu = 0;
    if ((rc = rn_backend_upload(net->be, net->gcoef, hf, 2 * cb))) return rc;
    return rn_bn_fwd_infer(net->be, &d, u->z, net->gcoef, net->gcoef + c, gm, gv, dz, dz);
}

/* The BN part of a unit backward: dy -> dz (and dres), BN's parameter gradients. */
static int bn_bwd(rn_net *net, int ui, const rn_bn_desc *bd, void *dy, void *dz, void *dres) {
    unit_rt *u = &net->u[ui];
    float *gamma = net->params + u->g_off;
    int rc;
    if (net->freeze_bn) {
        const float *rm = net->bufs + u->stat_off, *rv = rm + net->spec.units[ui].cout;
        return rn_bn_bwd_frozen(net->be, bd, u->z, u->a, dy, gamma, rm, rv, dz, net->grads + u->g_off,
                                net->grads + u->b_off, dres, 0);
    }
    if (net->gather) {
        /* (sync_bwd reads this micro-batch's own sums from grads: replaced, not added) */
        const float *gm = net->gstat + u->stat_off, *gv = gm + net->spec.units[ui].cout;
        rc = rn_bn_bwd_frozen(net->be, bd, u->z, u->a, dy, gamma, gm, gv, dz, net->grads + u->g_off,
                              net->grads + u->b_off, dres, 0);
        return rc ? rc : sync_bwd(net, ui, bd, dz);
    }
    return rn_bn_bwd(net->be, bd, u->z, u->a, dy, gamma, u->save_mean, u->save_invstd, dz, net->grads + u->g_off,
                     net->grads + u->b_off, dres, u->reserve, 0);
}

/* The conv part of a unit backward: its weight gradient, then dx unless NULL. */
static int conv_bwd(rn_net *net, int ui, const rn_conv_desc *cd, const void *x, const void *dz, void *dx,
                    int accumulate_dx) {
    unit_rt *u = &net->u[ui];
    int rc;
    if (!net->gh) rc = rn_conv_bwd_filter(net->be, cd, x, dz, net->grads + u->w_off, 0);
    else if ((rc = rn_conv_bwd_filter(net->be, cd, x, dz, net->gh, 0)) == RN_OK)
        rc = fold_grad(net, net->gh, u->w_off, (int64_t)cd->k * cd->kh * cd->kw * cd->c);
    if (rc) return rc;
    return dx ? rn_conv_bwd_data(net->be, cd, dz, weight(net, u->w_off), dx, accumulate_dx) : RN_OK;
}

static int grads_final(rn_net *net, int ui);

static int unit_bwd(rn_net *net, int ui, int n, const void *x, void *dy, void *dz, void *dres, void *dx,
                    int accumulate_dx) {
    rn_conv_desc cd;
    rn_bn_desc bd;
    const rn_convbn *cb = &net->spec.units[ui];
    int rc;
    if ((rc = conv_desc(net, ui, n, &cd)) || (rc = bn_desc(net, ui, n, &bd))) return rc;
    double t0 = pbeg(net, cb->bn);
    if ((rc = pend_bn(net, t0, ui, n, RN_PROF_BWD, dres != NULL, bn_bwd(net, ui, &bd, dy, dz, dres)))) return rc;
    t0 = pbeg(net, cb->conv);
    if ((rc = pend_conv(net, t0, ui, n, RN_PROF_BWD, conv_bwd(net, ui, &cd, x, dz, dx, accumulate_dx)))) return rc;
    return grads_final(net, ui);
}

static int backward(rn_net *net, const int32_t *labels_dev, int n, float label_smoothing, double mix_weight,
                    float grad_scale, float *loss_dev);

/* a hook must have heard of every parameter once: a layer left out of grads_final
   would leave its gradients out of the caller's sum */
static int check_reported(rn_net *net) {
    if (net->on_grad && net->reported != net->npref)
        return rn_errorf(RN_EINVAL, "backward reported %d of %d gradients final (a bug in rn: lib/net.c)",
                         net->reported, net->npref);
    return RN_OK;
}

int rn_net_backward(rn_net *net, const int32_t *labels, int n, float label_smoothing, float grad_scale,
                    int accumulate, float *loss) {
    return rn_net_backward_mix(net, labels, n, label_smoothing, 0, grad_scale, accumulate, loss);
}

int rn_net_backward_mix(rn_net *net, const int32_t *labels, int n, float label_smoothing, double mix_weight,
                        float grad_scale, int accumulate, float *loss) {
    int rc = upload_labels(net, labels, n);
    if (rc || (rc = rn_net_backward_dev(net, net->labels, n, label_smoothing, mix_weight, grad_scale, accumulate,
                                        net->loss)))
        return rc;
    return rn_backend_download(net->be, loss, net->loss, sizeof(float));
}

int rn_net_backward_dev(rn_net *net, const int32_t *labels, int n, float label_smoothing, double mix_weight,
                        float grad_scale, int accumulate, float *loss) {
    if (net->mode != RN_NET_TRAIN) return rn_errorf(RN_EINVAL, "backward on an inference network");
    net->reported = 0;
    int rc;
    if (!accumulate) {
        rc = backward(net, labels, n, label_smoothing, mix_weight, grad_scale, loss);
        return rc ? rc : check_reported(net);
    }
    /* this micro-batch's gradients on their own, then added: grads + g, element by
       element, as PyTorch adds each backward's gradient into .grad (and as rn_dist_sum
       adds the ranks' gradients, so W ranks give the bits of --accum W); with a hook,
       each tensor as soon as it is final, so that the hook can send it on */
    float *sum = net->grads;
    net->grads = net->spare;
    net->acc_into = net->on_grad ? sum : NULL;
    rc = backward(net, labels, n, label_smoothing, mix_weight, grad_scale, loss);
    net->grads = sum;
    net->acc_into = NULL;
    if (rc) return rc;
    if (net->on_grad) return check_reported(net);
    double t0 = pbeg(net, "grad-accumulate"), np = (double)net->nparams;
    return pend(net, t0, "grad-accumulate", RN_PROF_BWD, np, 12 * np,
                rn_add(net->be, RN_F32, net->nparams, sum, net->spare, sum, 0));
}

void rn_net_set_grad_hook(rn_net *net, rn_net_grad_fn fn, void *ctx) {
    net->on_grad = fn;
    net->on_grad_ctx = ctx;
}

/* The gradients of unit ui (or of the fc, ui -1) are final in this backward: tell
 * on_grad, tensor by tensor, after adding each into the accumulated sum. */
static int grads_final(rn_net *net, int ui) {
    if (!net->on_grad) return RN_OK;
    int rc;
    for (int i = 0; i < net->npref; i++) {
        const pref *p = &net->prefs[i];
        if (p->d.unit != ui || (ui < 0 && p->d.kind != RN_T_FC_W && p->d.kind != RN_T_FC_B)) continue;
        if (net->acc_into) {
            double t0 = pbeg(net, "grad-accumulate"), np = (double)p->numel;
            float *sum = net->acc_into + p->off;
            if ((rc = pend(net, t0, "grad-accumulate", RN_PROF_BWD, np, 12 * np,
                           rn_add(net->be, RN_F32, p->numel, sum, net->grads + p->off, sum, 0))))
                return rc;
        }
        if ((rc = net->on_grad(net->on_grad_ctx, p->off, p->numel))) return rc;
        net->reported++;
    }
    return RN_OK;
}

/* the fc layer's backward: dfeat and the fc's gradients (under AMP through gh) */
static int fc_bwd(rn_net *net, int n) {
    const rn_resnet *s = &net->spec;
    rn_fc_desc fd = {net->dtype, n, s->fc_in, s->num_classes};
    int rc;
    if (!net->gh)
        return rn_fc_bwd(net->be, &fd, net->feat, net->params + net->fc_w, net->dlogits, net->dfeat,
                         net->grads + net->fc_w, net->grads + net->fc_b, 0);
    int64_t nw = (int64_t)s->fc_in * s->num_classes, bias_at = align16(nw);
    void *gb = elem(net, net->gh, bias_at);
    if ((rc = rn_cast(net->be, RN_F32, net->dtype, (int64_t)n * s->num_classes, net->dlogits, net->dlogits_h, 0)) ||
        (rc = rn_fc_bwd(net->be, &fd, net->feat, weight(net, net->fc_w), net->dlogits_h, net->dfeat, net->gh, gb,
                        0)) ||
        (rc = fold_grad(net, net->gh, net->fc_w, nw)))
        return rc;
    return fold_grad(net, gb, net->fc_b, s->num_classes);
}

/* torchvision's name of block b ("layer2.0"): its first conv's name less the last part */
static void block_name(const rn_resnet *s, int b, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", s->units[s->blocks[b].conv[0]].conv);
    char *dot = strrchr(buf, '.');
    if (dot) *dot = 0;
}

/* The gradients of the last forward into net->grads (replacing them). */
static int backward(rn_net *net, const int32_t *labels_dev, int n, float label_smoothing, double mix_weight,
                    float grad_scale, float *loss_dev) {
    const rn_resnet *s = &net->spec;
    double k = s->num_classes, c = s->fc_in, es = (double)net->es, hw = net->fin_hw;
    /* the softmax cross-entropy and its gradient: 6 FLOPs per logit, the logits read and
       their gradient written in fp32 */
    double t0 = pbeg(net, "loss");
    int rc = pend(net, t0, "loss", RN_PROF_BWD, 6 * n * k, 8 * n * k,
                  loss_of(net, labels_dev, n, label_smoothing, mix_weight, net->mix_at, grad_scale, net->dlogits, loss_dev));
    if (rc) return rc;
    t0 = pbeg(net, "fc");
    double fc_bytes = es * (n * k + 2 * n * c + c * k) + 4 * (c * k + k);
    if ((rc = pend(net, t0, "fc", RN_PROF_BWD, 4 * n * c * k + n * k, fc_bytes, fc_bwd(net, n))) ||
        (rc = grads_final(net, -1)))
        return rc;
    void **G = net->g;
    int dyi = 0, s1 = 1, s2 = 2, outi = 3;
    t0 = pbeg(net, "avgpool");
    if ((rc = pend(net, t0, "avgpool", RN_PROF_BWD, n * hw * c, es * n * c * (hw + 1),
                   rn_avgpool_global_bwd(net->be, net->dtype, n, net->fin_hw, s->fc_in, net->dfeat, G[dyi]))))
        return rc;
    for (int b = s->nblocks - 1; b >= 0; b--) {
        const rn_block *blk = &s->blocks[b];
        const void *bin = block_input(net, b);
        if (net->recompute) {
            net->again = 1;
            rc = block_fwd(net, b, n, bin);
            net->again = 0;
            if (rc) return rc;
        }
        /* the last unit: its BN adds the residual before the ReLU; dres lands in G[dyi] */
        int j = blk->nconv - 1;
        const void *xin = j == 0 ? bin : net->u[blk->conv[j - 1]].a;
        void *dx_dst = j == 0 ? G[outi] : G[s2];
        if ((rc = unit_bwd(net, blk->conv[j], n, xin, G[dyi], G[s1], G[dyi], dx_dst, 0))) return rc;
        for (j = blk->nconv - 2; j >= 0; j--) {
            xin = j == 0 ? bin : net->u[blk->conv[j - 1]].a;
            /* dy in G[s2]; BN backward in place into G[s2]; conv data gradient to G[s1] or out */
            void *dcur = G[s2];
            void *dnext = j == 0 ? G[outi] : G[s1];
            if ((rc = unit_bwd(net, blk->conv[j], n, xin, dcur, dcur, NULL, dnext, 0))) return rc;
            int t = s1;
            s1 = s2;
            s2 = t;
        }
        if (blk->down >= 0) {
            if ((rc = unit_bwd(net, blk->down, n, bin, G[dyi], G[dyi], NULL, G[outi], 1))) return rc;
        } else {
            int64_t elems = (int64_t)n * net->u[blk->conv[0]].h * net->u[blk->conv[0]].w * s->units[blk->conv[0]].cin;
            /* the identity shortcut's gradient: a row named after the block ("layer1.1") */
            char name[48] = "";
            if (net->prof) block_name(s, b, name, sizeof name);
            t0 = pbeg(net, name);
            if ((rc = pend(net, t0, name, RN_PROF_BWD, (double)elems, 3 * es * (double)elems,
                           rn_add(net->be, net->dtype, elems, G[outi], G[dyi], G[outi], 0))))
                return rc;
        }
        int t = dyi;
        dyi = outi;
        outi = t;
    }
    rn_pool_desc pd;
    if ((rc = pool_desc(net, n, &pd))) return rc;
    t0 = pbeg(net, "maxpool");
    if ((rc = pend_pool(net, t0, n, RN_PROF_BWD,
                        rn_maxpool_bwd(net->be, &pd, net->u[0].a, net->pooled_max, G[dyi], G[s1]))))
        return rc;
    return unit_bwd(net, 0, n, net->input, G[s1], G[s1], NULL, NULL, 0);
}

/* the SGD call over params[off, off+n): with the compute copy under AMP */
static int sgd_part(rn_net *net, const rn_sgd_desc *sd, int64_t off, int64_t n, float *buf) {
    if (!net->wc)
        return rn_sgd_update(net->be, sd, n, net->params + off, net->grads + off, buf ? buf + off : NULL);
    return rn_sgd_update_copy(net->be, sd, n, net->params + off, net->grads + off, buf ? buf + off : NULL,
                              elem(net, net->wc, off));
}

/* the LARS call over params[off, off+n): with the compute copy under AMP */
static int lars_part(rn_net *net, const rn_lars_desc *ld, int64_t off, int64_t n) {
    if (!net->wc) return rn_lars_update(net->be, ld, n, net->params + off, net->grads + off, net->mom + off);
    return rn_lars_update_copy(net->be, ld, n, net->params + off, net->grads + off, net->mom + off,
                               elem(net, net->wc, off));
}

/* LARS: conv and fc weights (params[0, ndecay)) one tensor at a time with their trust
 * ratio and weight decay; BN parameters and the fc bias (the rest) in one call with
 * neither, as MLPerf's reference excludes them. */
static int lars(rn_net *net, const rn_lars_desc *ld) {
    rn_lars_desc d = *ld;
    d.dtype = net->dtype;
    /* TensorFlow's momentum slot starts at zero (a checkpoint without momentum too) */
    int rc = net->have_mom ? RN_OK : rn_backend_zero(net->be, net->mom, (size_t)net->nparams * sizeof(float));
    for (int i = 0; i < net->npref && rc == RN_OK; i++)
        if (net->prefs[i].off < net->ndecay) rc = lars_part(net, &d, net->prefs[i].off, net->prefs[i].numel);
    d.adapt = 0;
    d.weight_decay = 0.0f;
    if (rc == RN_OK) rc = lars_part(net, &d, net->ndecay, net->nparams - net->ndecay);
    return rc;
}

int rn_net_set_lars(rn_net *net, int on, double eta, double eps) {
    if (on && (!(eta >= 0) || !isfinite(eta) || !(eps >= 0) || !isfinite(eps)))
        return rn_errorf(RN_EINVAL, "LARS eta %g, eps %g: want finite values >= 0", eta, eps);
    net->lars = on != 0;
    net->lars_eta = (float)eta;
    net->lars_eps = (float)eps;
    return RN_OK;
}

int rn_net_set_clip(rn_net *net, double max_norm) {
    if (!(max_norm >= 0) || !isfinite(max_norm))
        return rn_errorf(RN_EINVAL, "gradient clipping: max norm %g, want a finite value >= 0 (0: off)", max_norm);
    net->clip = max_norm;
    return RN_OK;
}

double rn_net_grad_norm(const rn_net *net) { return net->gnorm; }

/* torch.nn.utils.clip_grad_norm_: the norm of every gradient (unscaled by grad_scale)
 * together, and when it is above the max, the gradients scaled by max / (norm + 1e-6),
 * folded here into the step's grad_scale (one multiply per element, as the unscaling). */
static int clip(rn_net *net, float *grad_scale) {
    /* over nparams, the padding between tensors too: it stays 0 (zeroed at build, and no
       op writes outside its tensor) */
    double sq = 0;
    int rc = rn_sumsq(net->be, net->nparams, net->grads, net->gsq);
    if (rc == RN_OK) rc = rn_backend_download(net->be, &sq, net->gsq, sizeof sq);
    if (rc) return rc;
    net->gnorm = (double)*grad_scale * sqrt(sq);
    double coef = net->clip / (net->gnorm + 1e-6);
    if (coef < 1.0) *grad_scale = (float)((double)*grad_scale * coef);
    return RN_OK;
}

/* SGD's calls over every parameter with sd (its weight decay where wd_mode puts it) */
static int sgd_parts(rn_net *net, const rn_sgd_desc *sd, int wd_mode) {
    rn_sgd_desc d = *sd;
    float *buf = d.momentum != 0.0f ? net->mom : NULL;
    d.first_step = !net->have_mom;
    d.dtype = net->dtype;
    if (wd_mode == RN_WD_ALL) return sgd_part(net, &d, 0, net->nparams, buf);
    /* decayed weights, the BN parameters without decay, and the fc bias (last) with it
       under RN_WD_NO_NORM */
    int64_t bn_end = wd_mode == RN_WD_NO_NORM ? net->fc_b : net->nparams;
    int rc = sgd_part(net, &d, 0, net->ndecay, buf);
    d.weight_decay = 0.0f;
    if (rc == RN_OK) rc = sgd_part(net, &d, net->ndecay, bn_end - net->ndecay, buf);
    d.weight_decay = sd->weight_decay;
    if (rc == RN_OK && bn_end < net->nparams) rc = sgd_part(net, &d, bn_end, net->nparams - bn_end, buf);
    return rc;
}

/* SGD (or LARS, rn_net_set_lars) over every parameter on the gradients times grad_scale
 * (1/loss_scale unscales the gradients of a loss multiplied by an AMP loss scale), at the
 * rate lr or the one lr_at holds, writing nothing where skip_if holds a verdict (both
 * backend memory or NULL: rn_sgd_desc): device ops only, the momentum buffers' start is
 * the caller's (mom_started) */
static int update(rn_net *net, float lr, const float *lr_at, const int32_t *skip_if, float momentum,
                  float weight_decay, int nesterov, int wd_mode, float grad_scale) {
    int rc;
    if (net->lars) {
        if (nesterov) return rn_errorf(RN_EINVAL, "LARS has no Nesterov momentum");
        rn_lars_desc ld;
        if ((rc = rn_lars_desc_init(&ld, lr, momentum, weight_decay, net->lars_eta, net->lars_eps))) return rc;
        ld.lr_at = lr_at, ld.skip_if = skip_if, ld.grad_scale = grad_scale;
        return lars(net, &ld);
    }
    rn_sgd_desc sd;
    if ((rc = rn_sgd_desc_init(&sd, lr, momentum, weight_decay, nesterov))) return rc;
    sd.lr_at = lr_at, sd.skip_if = skip_if, sd.grad_scale = grad_scale;
    return sgd_parts(net, &sd, wd_mode);
}

/* a step taken: SGD's momentum buffers start holding momentum, LARS's its steps */
static void mom_started(rn_net *net, float momentum) {
    if (momentum != 0.0f || net->lars) net->have_mom = 1;
}

/* The update with the host's decisions: clipping's norm read back first */
static int sgd(rn_net *net, float lr, float momentum, float weight_decay, int nesterov, int wd_mode,
               float grad_scale) {
    int rc = net->clip > 0 ? clip(net, &grad_scale) : RN_OK;
    if (rc == RN_OK) rc = update(net, lr, NULL, NULL, momentum, weight_decay, nesterov, wd_mode, grad_scale);
    if (rc == RN_OK) mom_started(net, momentum);
    return rc;
}

/* *found = 1 when any stored gradient is inf or NaN (an fp16 overflow), else 0. */
static int grads_nonfinite(rn_net *net, int *found) {
    *found = 0;
    if (!net->grads) return rn_errorf(RN_EINVAL, "inference networks keep no gradients");
    int32_t flag = 0;
    int rc = rn_backend_zero(net->be, net->flag, sizeof flag);
    if (rc == RN_OK) rc = rn_nonfinite(net->be, net->nparams, net->grads, net->flag);
    if (rc == RN_OK) rc = rn_backend_download(net->be, &flag, net->flag, sizeof flag);
    *found = flag != 0;
    return rc;
}

int rn_net_step_on_device(const rn_net *net) { return net->mode == RN_NET_TRAIN && !(net->clip > 0); }

void rn_net_step_keyof(const rn_net *net, const rn_scaler *sc, rn_net_step_key *key) {
    memset(key, 0, sizeof *key); /* (the key is compared as bytes) */
    key->weights = net->params;
    key->unscale = sc ? rn_scaler_inv(sc) : 1.0f;
    key->first = !net->have_mom;
}

int rn_net_step_lr(rn_net *net, float lr) {
    if (net->mode != RN_NET_TRAIN) return rn_errorf(RN_EINVAL, "SGD on an inference network");
    if (!isfinite(lr)) return rn_errorf(RN_EINVAL, "learning rate %g: want a finite value", lr);
    return rn_backend_put(net->be, net->lr, &lr, sizeof lr);
}

int rn_net_step_ops(rn_net *net, const rn_scaler *sc, float momentum, float weight_decay, int nesterov, int wd_mode) {
    if (!rn_net_step_on_device(net))
        return rn_errorf(RN_EINVAL, "rn_net_step_ops: %s", net->mode != RN_NET_TRAIN ? "an inference network"
                                                           : "clipping reads the norm back: use rn_net_step");
    if (wd_mode < RN_WD_ALL || wd_mode > RN_WD_NO_NORM) return rn_errorf(RN_EINVAL, "weight-decay mode %d", wd_mode);
    /* GradScaler: the check's flag decides on the device whether the update writes */
    int rc = sc ? rn_backend_zero(net->be, net->flag, sizeof(int32_t)) : RN_OK;
    if (rc == RN_OK && sc) rc = rn_nonfinite(net->be, net->nparams, net->grads, net->flag);
    if (rc) return rc;
    return update(net, 0.0f, net->lr, sc ? net->flag : NULL, momentum, weight_decay, nesterov, wd_mode,
                  sc ? rn_scaler_inv(sc) : 1.0f);
}

int rn_net_step_end(rn_net *net, rn_scaler *sc, float momentum, int *skipped) {
    if (skipped) *skipped = 0;
    net->gnorm = NAN;
    int32_t flag = 0;
    int rc = sc ? rn_backend_download(net->be, &flag, net->flag, sizeof flag) : RN_OK;
    if (rc) return rc;
    if (!flag) mom_started(net, momentum);
    int skip = sc ? rn_scaler_update(sc, flag != 0) : 0;
    if (skipped) *skipped = skip;
    return RN_OK;
}

int rn_net_step(rn_net *net, rn_scaler *sc, float lr, float momentum, float weight_decay, int nesterov, int wd_mode,
                int *skipped) {
    int skip = 0;
    if (skipped) *skipped = 0;
    if (net->mode != RN_NET_TRAIN) return rn_errorf(RN_EINVAL, "SGD on an inference network");
    if (wd_mode < RN_WD_ALL || wd_mode > RN_WD_NO_NORM) return rn_errorf(RN_EINVAL, "weight-decay mode %d", wd_mode);
    /* SGD decides on the device: the same calls a captured step makes (rn-train
       --cuda-graphs), with no read-back between them */
    if (rn_net_step_on_device(net)) {
        int rc = rn_net_step_lr(net, lr);
        if (rc == RN_OK) rc = rn_net_step_ops(net, sc, momentum, weight_decay, nesterov, wd_mode);
        if (rc) return rc;
        return rn_net_step_end(net, sc, momentum, skipped);
    }
    net->gnorm = NAN; /* until a clipping step measures it */
    if (!sc) return sgd(net, lr, momentum, weight_decay, nesterov, wd_mode, 1.0f);
    /* GradScaler: unscale and check with this step's scale, step unless an inf/NaN
       turned up, then update the scale */
    int found = 0;
    int rc = grads_nonfinite(net, &found);
    if (rc == RN_OK && !found) rc = sgd(net, lr, momentum, weight_decay, nesterov, wd_mode, rn_scaler_inv(sc));
    if (rc == RN_OK) skip = rn_scaler_update(sc, found);
    if (skipped) *skipped = skip;
    return rc;
}

int rn_net_grad(rn_net *net, const char *name, float *host, int64_t numel) {
    const pref *p = find_pref(net, name);
    if (!p) return rn_errorf(RN_EINVAL, "no parameter named %s", name);
    if (p->numel != numel) return rn_errorf(RN_EINVAL, "%s has %lld values, not %lld", name, (long long)p->numel,
                                            (long long)numel);
    if (!net->grads) return rn_errorf(RN_EINVAL, "inference networks keep no gradients");
    return get(net, net->grads, p, host);
}

float *rn_net_grads(rn_net *net, int64_t *n) {
    *n = net->grads ? net->nparams : 0;
    return net->grads;
}

float *rn_net_spare(rn_net *net) { return net->spare; }

int64_t rn_net_bn_stats_len(const rn_net *net) { return net->nstats; }

int rn_net_set_sync(rn_net *net, int world, rn_net_gather_fn gather, void *ctx) {
    if (net->mode != RN_NET_TRAIN) return rn_errorf(RN_EINVAL, "synchronised BN on an inference network");
    if (gather && world < 1) return rn_errorf(RN_EINVAL, "synchronised BN over %d processes", world);
    free(net->hstat);
    free(net->hrun);
    free(net->hf);
    free(net->hbuf);
    net->hstat = net->hrun = net->hf = NULL;
    net->hbuf = NULL;
    net->gather = NULL;
    if (!gather) return RN_OK;
    net->hstat = rn_malloc(sizeof(float) * (size_t)net->nstats);
    net->hrun = rn_malloc(sizeof(float) * (size_t)net->nstats);
    net->hf = rn_malloc(sizeof(float) * 3 * (size_t)net->maxc);
    net->hbuf = rn_malloc(sizeof(double) * (size_t)(world + 1) * (2 * (size_t)net->maxc + 1));
    if (!net->hstat || !net->hrun || !net->hf || !net->hbuf) return RN_ENOMEM;
    net->gather = gather;
    net->gather_ctx = ctx;
    net->world = world;
    return RN_OK;
}

int rn_net_bn_capture(rn_net *net, int on) {
    if (net->mode != RN_NET_TRAIN) return rn_errorf(RN_EINVAL, "BN capture on an inference network");
    net->capture = on != 0;
    return RN_OK;
}

int rn_net_bn_captured(rn_net *net, float *host) {
    if (!net->capture) return rn_errorf(RN_EINVAL, "BN statistics are captured only after rn_net_bn_capture");
    return rn_backend_download(net->be, host, net->capt, sizeof(float) * (size_t)net->nstats);
}

int rn_net_bn_replay(rn_net *net, const float *stats, int nslices) {
    if (net->mode != RN_NET_TRAIN) return rn_errorf(RN_EINVAL, "BN replay on an inference network");
    if (net->freeze_bn || nslices < 1) return RN_OK;
    return bn_update(net, stats, nslices);
}

/* The running statistics updated with nslices sets of batch statistics (host, bufs'
 * layout), and num_batches_tracked. */
static int bn_update(rn_net *net, const float *stats, int nslices) {
    float *r = rn_malloc(sizeof(float) * (size_t)net->nstats);
    if (!r) return RN_ENOMEM;
    int rc = rn_backend_download(net->be, r, net->bufs, sizeof(float) * (size_t)net->nstats);
    /* the CPU backend's update, term for term (lib/backend_cpu.c), so that replayed
       statistics equal the ones one process updates in place */
    const float mom = RN_BN_MOMENTUM;
    for (int k = 0; k < nslices && rc == RN_OK; k++) {
        const float *x = stats + (size_t)k * net->nstats;
        for (int64_t j = 0; j < net->nstats; j++) r[j] = (1 - mom) * r[j] + mom * x[j];
    }
    if (rc == RN_OK) rc = rn_backend_upload(net->be, net->bufs, r, sizeof(float) * (size_t)net->nstats);
    free(r);
    if (rc == RN_OK)
        for (int i = 0; i < net->spec.nunits; i++) net->u[i].tracked += nslices;
    return rc;
}

int rn_net_unit_output(rn_net *net, int unit, float *host, int64_t shape[4]) {
    if (unit < 0 || unit >= net->spec.nunits) return rn_errorf(RN_EINVAL, "no unit %d", unit);
    const unit_rt *u = &net->u[unit];
    if (net->mode != RN_NET_TRAIN || !u->a || net->last_n < 1)
        return rn_errorf(RN_EINVAL, "unit outputs are kept by a training forward only");
    if (u->shared_a)
        return rn_errorf(RN_ENOTSUP, "unit %s: a recomputing network keeps only the block outputs",
                         net->spec.units[unit].bn);
    if (net->dtype != RN_F32) return rn_errorf(RN_ENOTSUP, "unit outputs of an AMP network");
    shape[0] = net->last_n, shape[1] = u->p, shape[2] = u->q, shape[3] = net->spec.units[unit].cout;
    if (!host) return RN_OK;
    return rn_backend_download(net->be, host, u->a, sizeof(float) * (size_t)(net->last_n * u->out_elems));
}

int rn_net_ema_enable(rn_net *net) {
    if (net->mode != RN_NET_TRAIN) return rn_errorf(RN_EINVAL, "a moving average of an inference network's weights");
    if (net->ema) return RN_OK;
    net->ema_tracked = rn_calloc((size_t)net->spec.nunits, sizeof(int64_t));
    if (!net->ema_tracked) return RN_ENOMEM;
    int rc = nalloc(net, sizeof(float) * (size_t)net->nparams, &net->ema);
    if (rc == RN_OK) rc = nalloc(net, sizeof(float) * (size_t)net->nstats, &net->ema_bufs);
    /* the gaps between parameters stay 0 in the average as they are in params */
    if (rc == RN_OK) rc = nzero(net, net->ema, sizeof(float) * (size_t)net->nparams);
    if (rc == RN_OK) rc = nzero(net, net->ema_bufs, sizeof(float) * (size_t)net->nstats);
    return rc;
}

int rn_net_ema_update(rn_net *net, float keep, float take, int copy) {
    if (!net->ema) return rn_errorf(RN_EINVAL, "no moving average: rn_net_ema_enable first");
    int rc;
    for (int i = 0; i < net->spec.nunits; i++) net->ema_tracked[i] = net->u[i].tracked;
    if (copy) {
        if ((rc = rn_backend_copy(net->be, net->ema, net->params, sizeof(float) * (size_t)net->nparams))) return rc;
        return rn_backend_copy(net->be, net->ema_bufs, net->bufs, sizeof(float) * (size_t)net->nstats);
    }
    if ((rc = rn_ema_update(net->be, net->nparams, net->params, net->ema, keep, take))) return rc;
    return rn_ema_update(net->be, net->nstats, net->bufs, net->ema_bufs, keep, take);
}

int rn_net_ema_swap(rn_net *net) {
    if (!net->ema) return rn_errorf(RN_EINVAL, "no moving average: rn_net_ema_enable first");
    float *p = net->params, *b = net->bufs;
    net->params = net->ema, net->ema = p;
    net->bufs = net->ema_bufs, net->ema_bufs = b;
    for (int i = 0; i < net->spec.nunits; i++) {
        int64_t k = net->u[i].tracked;
        net->u[i].tracked = net->ema_tracked[i];
        net->ema_tracked[i] = k;
    }
    /* AMP: the layers read the compute copy of whichever set is now params */
    return net->wc ? rn_cast(net->be, RN_F32, net->dtype, net->nparams, net->params, net->wc, 0) : RN_OK;
}

/* The EMA set between the net and c->ema (allocated by the caller): into the net when
 * to_net, else into c. The swap makes the average the net's own weights for the walk. */
static int ema_exchange(rn_net *net, rn_ckpt *c, int to_net) {
    if (!net->ema) return rn_errorf(RN_EINVAL, "no moving average: rn_net_ema_enable first");
    if (!c->ema) return rn_errorf(RN_EINVAL, "checkpoint holds no EMA set");
    /* a view of c whose params and buffers are the EMA's */
    rn_ckpt v = *c;
    v.params = c->ema->params, v.n_params = c->ema->n_params;
    v.buffers = c->ema->buffers, v.n_buffers = c->ema->n_buffers;
    float *p = net->params, *b = net->bufs;
    net->params = net->ema, net->bufs = net->ema_bufs;
    int64_t *tr = rn_malloc(sizeof(int64_t) * (size_t)net->spec.nunits);
    if (!tr) {
        net->params = p, net->bufs = b;
        return RN_ENOMEM;
    }
    for (int i = 0; i < net->spec.nunits; i++) {
        tr[i] = net->u[i].tracked;
        net->u[i].tracked = net->ema_tracked[i];
    }
    int rc = RN_OK;
    for (int i = 0; i < net->npref && rc == RN_OK; i++) {
        const pref *pr = &net->prefs[i];
        rn_ptensor *t = rn_ckpt_find(&v, pr->d.name);
        if (!t) rc = rn_errorf(RN_EINVAL, "checkpoint's EMA set lacks %s", pr->d.name);
        else rc = to_net ? put(net, net->params, pr, rn_ptensor_f32(t)) : get(net, net->params, pr, rn_ptensor_f32(t));
    }
    if (rc == RN_OK) rc = exchange_bn(net, &v, to_net);
    for (int i = 0; i < net->spec.nunits; i++) {
        net->ema_tracked[i] = net->u[i].tracked;
        net->u[i].tracked = tr[i];
    }
    free(tr);
    net->params = p, net->bufs = b;
    return rc;
}

int rn_net_ema_load(rn_net *net, const rn_ckpt *c) { return ema_exchange(net, (rn_ckpt *)c, 1); }

int rn_net_ema_store(rn_net *net, rn_ckpt *c) {
    int rc = rn_state_ema_alloc(c);
    return rc ? rc : ema_exchange(net, c, 0);
}
