/* Mixed-precision training of the network (lib/net.c, rn_net_create) without a GPU.
 *
 * The CPU backend computes in fp32 only, so this test wraps it in a backend that takes
 * fp16 and bf16 for every op: half-precision inputs are widened to fp32, the CPU op runs,
 * and outputs are rounded back to nearest even. That is storage in half precision and
 * arithmetic in fp32, as cuDNN and rn's CUDA kernels do it, so every AMP path of the
 * network runs here: the dtype of each op, the sizes of the half buffers (an overrun
 * shows under SANITIZE=1), the compute copy of the weights, the fp32 loss, the gradients
 * folded into fp32 across micro-batches, the loss scale and the overflow check. What it
 * cannot show is how the CUDA backend itself behaves in half precision: test_cuda_ops
 * and make gpu-check do that on a GPU.
 *
 * Checks, against the fp32 network from the same weights on the same batch: the loss and
 * every gradient of a step of two micro-batches under a loss scale of 65536 (fp16) once
 * unscaled; the losses of three SGD steps and an inference forward after them. Also: an
 * fp16 overflow is found (and the skipped step leaves the weights), bf16's range holds
 * the same scale, activation memory halves, recomputation (RN_NET_RECOMPUTE) gives the
 * plain AMP net's bits, and the CPU backend refuses AMP. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/backend.h"
#include "rn/backend_impl.h"
#include "rn/ckpt.h"
#include "rn/err.h"
#include "rn/loader.h"
#include "rn/net.h"
#include "rn/resnet.h"
#include "rn/rng.h"
#include "rn/tensor.h"

/* ---- the emulating backend: the CPU table, every compute op wrapped ---- */

static const rn_backend_ops *cpu; /* the wrapped CPU table */
static rn_backend_ops emu;

/* n elements of x (dtype) widened into a new fp32 array; NULL stays NULL */
static float *wide(int dtype, const void *x, int64_t n) {
    if (!x) return NULL;
    float *t = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        t[i] = dtype == RN_F16 ? rn_f16_to_f32(((const uint16_t *)x)[i]) : rn_bf16_to_f32(((const uint16_t *)x)[i]);
    return t;
}

/* an fp32 scratch array for an output; for accumulating ops it starts as y's values */
static float *scratch(int dtype, const void *y, int64_t n, int load) {
    if (!y) return NULL;
    return load ? wide(dtype, y, n) : calloc((size_t)(n ? n : 1), sizeof(float));
}

/* round t back into y (dtype) and free t */
static void narrow(int dtype, float *t, void *y, int64_t n) {
    if (!t) return;
    for (int64_t i = 0; i < n; i++)
        ((uint16_t *)y)[i] = dtype == RN_F16 ? rn_f32_to_f16(t[i]) : rn_f32_to_bf16(t[i]);
    free(t);
}

/* element counts of a convolution's input, weight and output */
static void conv_sizes(const rn_conv_desc *d, int64_t *nx, int64_t *nw, int64_t *ny) {
    *nx = (int64_t)d->n * d->h * d->w * d->c;
    *nw = (int64_t)d->k * d->kh * d->kw * d->c;
    *ny = (int64_t)d->n * d->p * d->q * d->k;
}

static int e_conv_fwd(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w, void *y) {
    if (d->dtype == RN_F32) return cpu->conv_fwd(be, d, x, w, y);
    rn_conv_desc f = *d;
    f.dtype = RN_F32;
    int64_t nx, nw, ny;
    conv_sizes(d, &nx, &nw, &ny);
    float *tx = wide(d->dtype, x, nx), *tw = wide(d->dtype, w, nw), *ty = scratch(d->dtype, y, ny, 0);
    int rc = cpu->conv_fwd(be, &f, tx, tw, ty);
    narrow(d->dtype, ty, y, ny);
    free(tx), free(tw);
    return rc;
}

static int e_conv_bwd_data(rn_backend *be, const rn_conv_desc *d, const void *dy, const void *w, void *dx, int acc) {
    if (d->dtype == RN_F32) return cpu->conv_bwd_data(be, d, dy, w, dx, acc);
    rn_conv_desc f = *d;
    f.dtype = RN_F32;
    int64_t nx, nw, ny;
    conv_sizes(d, &nx, &nw, &ny);
    float *tdy = wide(d->dtype, dy, ny), *tw = wide(d->dtype, w, nw), *tdx = scratch(d->dtype, dx, nx, acc);
    int rc = cpu->conv_bwd_data(be, &f, tdy, tw, tdx, acc);
    narrow(d->dtype, tdx, dx, nx);
    free(tdy), free(tw);
    return rc;
}

static int e_conv_bwd_filter(rn_backend *be, const rn_conv_desc *d, const void *x, const void *dy, void *dw,
                             int acc) {
    if (d->dtype == RN_F32) return cpu->conv_bwd_filter(be, d, x, dy, dw, acc);
    rn_conv_desc f = *d;
    f.dtype = RN_F32;
    int64_t nx, nw, ny;
    conv_sizes(d, &nx, &nw, &ny);
    float *tx = wide(d->dtype, x, nx), *tdy = wide(d->dtype, dy, ny), *tdw = scratch(d->dtype, dw, nw, acc);
    int rc = cpu->conv_bwd_filter(be, &f, tx, tdy, tdw, acc);
    narrow(d->dtype, tdw, dw, nw);
    free(tx), free(tdy);
    return rc;
}

static int e_bn_fwd_train(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma, const float *beta,
                          const void *res, void *y, float *sm, float *si, float *rm, float *rv, void *reserve) {
    if (d->dtype == RN_F32) return cpu->bn_fwd_train(be, d, x, gamma, beta, res, y, sm, si, rm, rv, reserve);
    rn_bn_desc f = *d;
    f.dtype = RN_F32;
    int64_t n = d->m * d->c;
    float *tx = wide(d->dtype, x, n), *tr = wide(d->dtype, res, n), *ty = scratch(d->dtype, y, n, 0);
    int rc = cpu->bn_fwd_train(be, &f, tx, gamma, beta, tr, ty, sm, si, rm, rv, reserve);
    narrow(d->dtype, ty, y, n);
    free(tx), free(tr);
    return rc;
}

static int e_bn_fwd_infer(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma, const float *beta,
                          const float *rm, const float *rv, const void *res, void *y) {
    if (d->dtype == RN_F32) return cpu->bn_fwd_infer(be, d, x, gamma, beta, rm, rv, res, y);
    rn_bn_desc f = *d;
    f.dtype = RN_F32;
    int64_t n = d->m * d->c;
    float *tx = wide(d->dtype, x, n), *tr = wide(d->dtype, res, n), *ty = scratch(d->dtype, y, n, 0);
    int rc = cpu->bn_fwd_infer(be, &f, tx, gamma, beta, rm, rv, tr, ty);
    narrow(d->dtype, ty, y, n);
    free(tx), free(tr);
    return rc;
}

static int e_bn_bwd(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y, const void *dy,
                    const float *gamma, const float *sm, const float *si, void *dx, float *dgamma, float *dbeta,
                    void *dres, void *reserve, int acc) {
    if (d->dtype == RN_F32) return cpu->bn_bwd(be, d, x, y, dy, gamma, sm, si, dx, dgamma, dbeta, dres, reserve, acc);
    rn_bn_desc f = *d;
    f.dtype = RN_F32;
    int64_t n = d->m * d->c;
    float *tx = wide(d->dtype, x, n), *ty = wide(d->dtype, y, n), *tdy = wide(d->dtype, dy, n);
    float *tdx = scratch(d->dtype, dx, n, 0), *tdres = scratch(d->dtype, dres, n, 0);
    int rc = cpu->bn_bwd(be, &f, tx, ty, tdy, gamma, sm, si, tdx, dgamma, dbeta, tdres, reserve, acc);
    narrow(d->dtype, tdx, dx, n); /* dx and dres may alias dy: written after the op */
    narrow(d->dtype, tdres, dres, n);
    free(tx), free(ty), free(tdy);
    return rc;
}

static int e_bn_bwd_frozen(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y, const void *dy,
                           const float *gamma, const float *rm, const float *rv, void *dx, float *dgamma, float *dbeta,
                           void *dres, int acc) {
    if (d->dtype == RN_F32) return cpu->bn_bwd_frozen(be, d, x, y, dy, gamma, rm, rv, dx, dgamma, dbeta, dres, acc);
    rn_bn_desc f = *d;
    f.dtype = RN_F32;
    int64_t n = d->m * d->c;
    float *tx = wide(d->dtype, x, n), *ty = wide(d->dtype, y, n), *tdy = wide(d->dtype, dy, n);
    float *tdx = scratch(d->dtype, dx, n, 0), *tdres = scratch(d->dtype, dres, n, 0);
    int rc = cpu->bn_bwd_frozen(be, &f, tx, ty, tdy, gamma, rm, rv, tdx, dgamma, dbeta, tdres, acc);
    narrow(d->dtype, tdx, dx, n); /* dx and dres may alias dy: written after the op */
    narrow(d->dtype, tdres, dres, n);
    free(tx), free(ty), free(tdy);
    return rc;
}

static int e_add(rn_backend *be, int dt, int64_t n, const void *a, const void *b, void *y, int relu) {
    if (dt == RN_F32) return cpu->add(be, dt, n, a, b, y, relu);
    float *ta = wide(dt, a, n), *tb = wide(dt, b, n), *ty = scratch(dt, y, n, 0);
    int rc = cpu->add(be, RN_F32, n, ta, tb, ty, relu);
    narrow(dt, ty, y, n);
    free(ta), free(tb);
    return rc;
}

static int e_relu_fwd(rn_backend *be, int dt, int64_t n, const void *x, void *y) {
    if (dt == RN_F32) return cpu->relu_fwd(be, dt, n, x, y);
    float *tx = wide(dt, x, n), *ty = scratch(dt, y, n, 0);
    int rc = cpu->relu_fwd(be, RN_F32, n, tx, ty);
    narrow(dt, ty, y, n);
    free(tx);
    return rc;
}

static int e_relu_bwd(rn_backend *be, int dt, int64_t n, const void *y, const void *dy, void *dx) {
    if (dt == RN_F32) return cpu->relu_bwd(be, dt, n, y, dy, dx);
    float *ty = wide(dt, y, n), *tdy = wide(dt, dy, n), *tdx = scratch(dt, dx, n, 0);
    int rc = cpu->relu_bwd(be, RN_F32, n, ty, tdy, tdx);
    narrow(dt, tdx, dx, n);
    free(ty), free(tdy);
    return rc;
}

static int e_input_normalize(rn_backend *be, int dt, int64_t m, int c, const uint8_t *x, const float *mean,
                             const float *std, void *y) {
    if (dt == RN_F32) return cpu->input_normalize(be, dt, m, c, x, mean, std, y);
    float *ty = scratch(dt, y, m * c, 0);
    int rc = cpu->input_normalize(be, RN_F32, m, c, x, mean, std, ty);
    narrow(dt, ty, y, m * c);
    return rc;
}

static int e_maxpool_fwd(rn_backend *be, const rn_pool_desc *d, const void *x, void *y) {
    if (d->dtype == RN_F32) return cpu->maxpool_fwd(be, d, x, y);
    rn_pool_desc f = *d;
    f.dtype = RN_F32;
    int64_t nx = (int64_t)d->n * d->h * d->w * d->c, ny = (int64_t)d->n * d->p * d->q * d->c;
    float *tx = wide(d->dtype, x, nx), *ty = scratch(d->dtype, y, ny, 0);
    int rc = cpu->maxpool_fwd(be, &f, tx, ty);
    narrow(d->dtype, ty, y, ny);
    free(tx);
    return rc;
}

static int e_maxpool_bwd(rn_backend *be, const rn_pool_desc *d, const void *x, const void *y, const void *dy,
                         void *dx) {
    if (d->dtype == RN_F32) return cpu->maxpool_bwd(be, d, x, y, dy, dx);
    rn_pool_desc f = *d;
    f.dtype = RN_F32;
    int64_t nx = (int64_t)d->n * d->h * d->w * d->c, ny = (int64_t)d->n * d->p * d->q * d->c;
    float *tx = wide(d->dtype, x, nx), *ty = wide(d->dtype, y, ny), *tdy = wide(d->dtype, dy, ny),
          *tdx = scratch(d->dtype, dx, nx, 0);
    int rc = cpu->maxpool_bwd(be, &f, tx, ty, tdy, tdx);
    narrow(d->dtype, tdx, dx, nx);
    free(tx), free(ty), free(tdy);
    return rc;
}

static int e_gap_fwd(rn_backend *be, int dt, int n, int hw, int c, const void *x, void *y) {
    if (dt == RN_F32) return cpu->avgpool_global_fwd(be, dt, n, hw, c, x, y);
    float *tx = wide(dt, x, (int64_t)n * hw * c), *ty = scratch(dt, y, (int64_t)n * c, 0);
    int rc = cpu->avgpool_global_fwd(be, RN_F32, n, hw, c, tx, ty);
    narrow(dt, ty, y, (int64_t)n * c);
    free(tx);
    return rc;
}

static int e_gap_bwd(rn_backend *be, int dt, int n, int hw, int c, const void *dy, void *dx) {
    if (dt == RN_F32) return cpu->avgpool_global_bwd(be, dt, n, hw, c, dy, dx);
    float *tdy = wide(dt, dy, (int64_t)n * c), *tdx = scratch(dt, dx, (int64_t)n * hw * c, 0);
    int rc = cpu->avgpool_global_bwd(be, RN_F32, n, hw, c, tdy, tdx);
    narrow(dt, tdx, dx, (int64_t)n * hw * c);
    free(tdy);
    return rc;
}

static int e_fc_fwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w, const void *b, void *y) {
    if (d->dtype == RN_F32) return cpu->fc_fwd(be, d, x, w, b, y);
    rn_fc_desc f = *d;
    f.dtype = RN_F32;
    float *tx = wide(d->dtype, x, (int64_t)d->n * d->in), *tw = wide(d->dtype, w, (int64_t)d->out * d->in),
          *tb = wide(d->dtype, b, d->out), *ty = scratch(d->dtype, y, (int64_t)d->n * d->out, 0);
    int rc = cpu->fc_fwd(be, &f, tx, tw, tb, ty);
    narrow(d->dtype, ty, y, (int64_t)d->n * d->out);
    free(tx), free(tw), free(tb);
    return rc;
}

static int e_fc_bwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w, const void *dy, void *dx,
                    void *dw, void *db, int acc) {
    if (d->dtype == RN_F32) return cpu->fc_bwd(be, d, x, w, dy, dx, dw, db, acc);
    rn_fc_desc f = *d;
    f.dtype = RN_F32;
    int64_t nx = (int64_t)d->n * d->in, nw = (int64_t)d->out * d->in, ny = (int64_t)d->n * d->out;
    float *tx = wide(d->dtype, x, nx), *tw = wide(d->dtype, w, nw), *tdy = wide(d->dtype, dy, ny);
    float *tdx = scratch(d->dtype, dx, nx, 0), *tdw = scratch(d->dtype, dw, nw, acc),
          *tdb = scratch(d->dtype, db, d->out, acc);
    int rc = cpu->fc_bwd(be, &f, tx, tw, tdy, tdx, tdw, tdb, acc);
    narrow(d->dtype, tdx, dx, nx);
    narrow(d->dtype, tdw, dw, nw);
    narrow(d->dtype, tdb, db, d->out);
    free(tx), free(tw), free(tdy);
    return rc;
}

static int e_softmax_xent(rn_backend *be, const rn_xent_desc *d, const void *logits, const int32_t *labels,
                          float *loss, void *dl) {
    if (d->dtype == RN_F32) return cpu->softmax_xent(be, d, logits, labels, loss, dl);
    rn_xent_desc f = *d;
    f.dtype = RN_F32;
    int64_t n = (int64_t)d->n * d->classes;
    float *tz = wide(d->dtype, logits, n), *tdl = scratch(d->dtype, dl, n, 0);
    int rc = cpu->softmax_xent(be, &f, tz, labels, loss, tdl);
    narrow(d->dtype, tdl, dl, n);
    free(tz);
    return rc;
}

/* A CPU context whose table takes fp16 and bf16 for every op. */
static rn_backend *emu_create(void) {
    rn_backend *be = NULL;
    CHECK_OK(rn_backend_create("cpu", 2, NULL, &be));
    if (!be) return NULL;
    cpu = be->ops;
    emu = *cpu;
    emu.dtypes = (1u << RN_F32) | (1u << RN_F16) | (1u << RN_BF16);
    emu.conv_fwd = e_conv_fwd;
    emu.conv_bwd_data = e_conv_bwd_data;
    emu.conv_bwd_filter = e_conv_bwd_filter;
    emu.bn_fwd_train = e_bn_fwd_train;
    emu.bn_fwd_infer = e_bn_fwd_infer;
    emu.bn_bwd = e_bn_bwd;
    emu.bn_bwd_frozen = e_bn_bwd_frozen;
    emu.add = e_add;
    emu.relu_fwd = e_relu_fwd;
    emu.relu_bwd = e_relu_bwd;
    emu.input_normalize = e_input_normalize;
    emu.maxpool_fwd = e_maxpool_fwd;
    emu.maxpool_bwd = e_maxpool_bwd;
    emu.avgpool_global_fwd = e_gap_fwd;
    emu.avgpool_global_bwd = e_gap_bwd;
    emu.fc_fwd = e_fc_fwd;
    emu.fc_bwd = e_fc_bwd;
    emu.softmax_xent = e_softmax_xent;
    /* conversions, the overflow check and the SGD step take every storage type on the
       CPU already: they stay the CPU's own */
    be->ops = &emu;
    return be;
}

/* ---- the network in AMP against fp32 ---- */

#define ARCH "resnet18"
#define CLASSES 10
#define SIZE 64
#define BATCH 8
#define STEPS 3

static rn_resnet spec;
static rn_ckpt *init;
static uint8_t px[BATCH * SIZE * SIZE * 3];
static int32_t labels[BATCH];

/* relative L2 error of a against b */
static double rel_l2(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static rn_net *make_net(rn_backend *be, int dtype, int batch) {
    rn_net *net = NULL;
    CHECK_OK(rn_net_create(be, &spec, batch, SIZE, SIZE, RN_NET_TRAIN, dtype, &net));
    if (net) CHECK_OK(rn_net_load(net, init));
    return net;
}

/* images [first, first+n) of the batch into the net's input, in its dtype */
static int fill(rn_backend *be, rn_net *net, int first, int n) {
    return rn_input_normalize(be, rn_net_dtype(net), (int64_t)n * SIZE * SIZE, 3, px + (size_t)first * SIZE * SIZE * 3,
                              RN_IMAGENET_MEAN, RN_IMAGENET_STD, rn_net_input(net));
}

/* One training step as rn-train takes it: two micro-batches, the loss times `scale`
 * and divided by 2, gradients checked, then unscaled in the SGD step. *loss: the mean of
 * the two micro-batch losses; *found: the overflow check's verdict (no step then). */
static void step(rn_backend *be, rn_net *net, float scale, float *loss, int *found) {
    float l0 = 0, l1 = 0;
    CHECK_OK(fill(be, net, 0, BATCH / 2));
    CHECK_OK(rn_net_forward(net, BATCH / 2, 1));
    CHECK_OK(rn_net_backward(net, labels, BATCH / 2, 0.0f, scale / 2, 0, &l0));
    CHECK_OK(fill(be, net, BATCH / 2, BATCH / 2));
    CHECK_OK(rn_net_forward(net, BATCH / 2, 1));
    CHECK_OK(rn_net_backward(net, labels + BATCH / 2, BATCH / 2, 0.0f, scale / 2, 1, &l1));
    *loss = (l0 + l1) / 2;
    /* rn_net_step with a GradScaler at this scale: skip on overflow and halve */
    rn_scaler sc;
    CHECK_OK(rn_scaler_init(&sc, scale, RN_SCALER_GROWTH, RN_SCALER_BACKOFF, RN_SCALER_INTERVAL));
    CHECK_OK(rn_net_step(net, &sc, 0.02f, 0.9f, 1e-4f, 0, 0, found));
    CHECK(sc.scale == (*found ? scale / 2 : scale), "scale %g after a step at %g (skipped %d)", sc.scale, scale,
          *found);
}

/* every parameter (torchvision names and layouts) into one host array */
static float *all_params(rn_net *net, int grads, int64_t *n) {
    rn_ckpt *c = NULL;
    CHECK_OK(rn_ckpt_new(&spec, &c));
    *n = 0;
    for (size_t i = 0; c && i < c->n_params; i++) *n += rn_numel(c->params[i]->shape, c->params[i]->n_shape);
    float *out = malloc(sizeof(float) * (size_t)*n), *at = out;
    if (c && !grads) CHECK_OK(rn_net_store(net, c));
    for (size_t i = 0; c && i < c->n_params; i++) {
        int64_t k = rn_numel(c->params[i]->shape, c->params[i]->n_shape);
        if (grads) CHECK_OK(rn_net_grad(net, c->params[i]->name, at, k));
        else memcpy(at, c->params[i]->data.data, sizeof(float) * (size_t)k);
        at += k;
    }
    rn_ckpt_free(c);
    return out;
}

/* Half precision changes a ReLU's or a max pool's choice wherever a value lies within
 * rounding of the kink, and each changed choice moves a gradient by O(1): the gradient
 * error grows with the depth below a layer and with the square root of the unit
 * roundoff, not the roundoff itself (bf16's errors here are about sqrt(8) times fp16's).
 * So the tolerances are measured ones with margin, per tensor, and tightest at the fc
 * layer, where no kink lies downstream of the loss. A plumbing mistake (a gradient left
 * scaled, a micro-batch dropped, a stale compute copy) is off by O(1) or more. */
typedef struct {
    int dtype;
    float scale;     /* loss scale of the AMP run (test_gradients) */
    float traj_scale; /* loss scale of test_trajectory's steps */
    double loss_tol; /* relative, first forward */
    double fc_tol;   /* fc.weight gradient, relative L2 */
    double grad_tol; /* every other gradient tensor, relative L2 */
} amp_case;

/* One step with BN frozen (no batch statistics, the better-conditioned network): the
 * loss, and every gradient tensor, unscaled and accumulated over two micro-batches,
 * against fp32's. */
static void test_gradients(rn_backend *cpu_be, rn_backend *emu_be, const amp_case *c) {
    const char *name = rn_dtype_name(c->dtype);
    rn_net *ref = make_net(cpu_be, RN_F32, BATCH / 2), *amp = make_net(emu_be, c->dtype, BATCH / 2);
    rn_ckpt *names = NULL;
    CHECK_OK(rn_ckpt_new(&spec, &names));
    if (!ref || !amp || !names) goto out;
    rn_net_freeze_bn(ref, 1);
    rn_net_freeze_bn(amp, 1);
    float lref, lamp;
    int fref = 0, famp = 0;
    step(cpu_be, ref, 1.0f, &lref, &fref);
    step(emu_be, amp, c->scale, &lamp, &famp);
    CHECK(!fref && !famp, "%s: unexpected overflow (fp32 %d, amp %d)", name, fref, famp);
    CHECK(fabs(lamp - lref) <= c->loss_tol * lref, "%s: loss %.7g, fp32 %.7g", name, lamp, lref);
    int64_t n = 0, off = 0;
    float *gr = all_params(ref, 1, &n), *ga = all_params(amp, 1, &n);
    for (int64_t i = 0; i < n; i++) ga[i] /= c->scale;
    double worst = 0;
    for (size_t i = 0; i < names->n_params; i++) {
        const char *t = names->params[i]->name;
        int64_t k = rn_numel(names->params[i]->shape, names->params[i]->n_shape);
        double e = rel_l2(ga + off, gr + off, k), tol = strcmp(t, "fc.weight") == 0 ? c->fc_tol : c->grad_tol;
        CHECK(e < tol, "%s: gradient of %s off fp32's by %.3g (tol %.3g)", name, t, e, tol);
        if (strcmp(t, "fc.weight") == 0)
            fprintf(stderr, "test_amp: %s: fc.weight gradient rel. L2 error %.3g\n", name, e);
        else if (e > worst)
            worst = e;
        off += k;
    }
    fprintf(stderr, "test_amp: %s: worst other gradient rel. L2 error %.3g, loss %.7g (fp32 %.7g)\n", name, worst,
            lamp, lref);
    free(gr), free(ga);
out:
    rn_ckpt_free(names);
    rn_net_destroy(ref);
    rn_net_destroy(amp);
}

/* Three steps on the same batch with batch statistics (at traj_scale): the AMP losses follow fp32's down
 * (the compute copy follows every SGD step), and so does an inference forward after. */
static void test_trajectory(rn_backend *cpu_be, rn_backend *emu_be, const amp_case *c) {
    const char *name = rn_dtype_name(c->dtype);
    rn_net *ref = make_net(cpu_be, RN_F32, BATCH / 2), *amp = make_net(emu_be, c->dtype, BATCH / 2);
    if (!ref || !amp) goto out;
    float lref[STEPS], lamp[STEPS];
    for (int s = 0; s < STEPS; s++) {
        int fref = 0, famp = 0;
        step(cpu_be, ref, 1.0f, &lref[s], &fref);
        step(emu_be, amp, c->traj_scale, &lamp[s], &famp);
        CHECK(!fref && !famp, "%s step %d: unexpected overflow (fp32 %d, amp %d)", name, s, fref, famp);
    }
    double drop = lref[0] - lref[STEPS - 1];
    fprintf(stderr, "test_amp: %s: losses %.5f %.5f %.5f (fp32 %.5f %.5f %.5f)\n", name, lamp[0], lamp[1], lamp[2],
            lref[0], lref[1], lref[2]);
    CHECK(drop > 1, "fp32 loss should fall on a repeated batch: by %g", drop);
    for (int s = 0; s < STEPS; s++)
        CHECK(fabs(lamp[s] - lref[s]) < 0.05 * drop, "%s step %d: loss %.6f, fp32 %.6f (fp32 fell by %.4f)", name, s,
              lamp[s], lref[s], drop);
    /* inference with the running statistics, fp32 logits out */
    float lr_, la;
    CHECK_OK(fill(cpu_be, ref, 0, BATCH / 2));
    CHECK_OK(rn_net_forward(ref, BATCH / 2, 0));
    CHECK_OK(rn_net_loss(ref, labels, BATCH / 2, 0.0f, &lr_));
    CHECK_OK(fill(emu_be, amp, 0, BATCH / 2));
    CHECK_OK(rn_net_forward(amp, BATCH / 2, 0));
    CHECK_OK(rn_net_loss(amp, labels, BATCH / 2, 0.0f, &la));
    fprintf(stderr, "test_amp: %s: eval loss %.5f (fp32 %.5f)\n", name, la, lr_);
    CHECK(fabs(la - lr_) < 0.05 * drop, "%s: eval loss %g, fp32 %g", name, la, lr_);
out:
    rn_net_destroy(ref);
    rn_net_destroy(amp);
}

/* A loss scale the fp16 range cannot hold makes inf gradients, and the check finds
 * them; bf16 holds the same scale; a net that skipped the step keeps its weights. */
static void test_overflow(rn_backend *emu_be) {
    const float huge = 0x1p40f;
    rn_net *h = make_net(emu_be, RN_F16, BATCH / 2), *b = make_net(emu_be, RN_BF16, BATCH / 2);
    if (!h || !b) goto out;
    float loss;
    int found = 0;
    int64_t n;
    float *before = all_params(h, 0, &n);
    step(emu_be, h, huge, &loss, &found);
    CHECK(found == 1, "fp16 with loss scale 2^40: no overflow found");
    float *after = all_params(h, 0, &n);
    CHECK(memcmp(before, after, sizeof(float) * (size_t)n) == 0, "a skipped step changed the weights");
    step(emu_be, h, 1024.0f, &loss, &found);
    CHECK(found == 0 && isfinite(loss), "fp16 at loss scale 1024 found an overflow");
    step(emu_be, b, huge, &loss, &found);
    CHECK(found == 0, "bf16 at loss scale 2^40 should not overflow");
    free(before), free(after);
out:
    rn_net_destroy(h);
    rn_net_destroy(b);
}

/* A non-finite value in the forward pass reaches the loss and the step is skipped, as in
 * torch: ReLU and max-pool pass NaN on. In fp32, one NaN pixel; in fp16, a conv1 so large
 * that its outputs overflow to inf (BN then makes NaN of them). Before ReLU passed NaN,
 * both became zeros after the first ReLU and the step went ahead on a finite loss. */
static void test_nonfinite_activation(rn_backend *cpu_be, rn_backend *emu_be) {
    float loss;
    int found = 0;
    rn_net *f = make_net(cpu_be, RN_F32, BATCH / 2);
    if (f) {
        CHECK_OK(fill(cpu_be, f, 0, BATCH / 2));
        ((float *)rn_net_input(f))[5] = NAN;
        CHECK_OK(rn_net_forward(f, BATCH / 2, 1));
        CHECK_OK(rn_net_backward(f, labels, BATCH / 2, 0.0f, 1.0f, 0, &loss));
        CHECK(isnan(loss), "fp32: a NaN pixel gave the loss %g", loss);
    }
    rn_net_destroy(f);
    rn_ptensor *w = rn_ckpt_find(init, "conv1.weight");
    float *wf = w ? rn_ptensor_f32(w) : NULL;
    CHECK(wf != NULL, "conv1.weight in the checkpoint");
    if (!wf) return;
    int64_t nw = (int64_t)(w->data.len / sizeof(float));
    for (int64_t i = 0; i < nw; i++) wf[i] *= 1e6f;
    rn_net *h = make_net(emu_be, RN_F16, BATCH / 2);
    for (int64_t i = 0; i < nw; i++) wf[i] /= 1e6f;
    if (!h) return;
    step(emu_be, h, 1024.0f, &loss, &found);
    CHECK(found == 1, "fp16 with conv1 outputs past 65504: the step was not skipped (loss %g)", loss);
    CHECK(!isfinite(loss), "fp16 overflowed activations gave a finite loss %g", loss);
    rn_net_destroy(h);
}

/* Gradient clipping (rn_net_set_clip) takes the norm after the loss scale is taken out:
 * in fp32 a power-of-two scale is exact, so scale 1024 and scale 1 give the same norm and
 * weights bit for bit; clipping acted (an unclipped net ends elsewhere); a skipped fp16
 * step measures no norm and keeps its weights. */
static void test_clip_scaled(rn_backend *cpu_be, rn_backend *emu_be) {
    rn_net *a = make_net(cpu_be, RN_F32, BATCH / 2), *b = make_net(cpu_be, RN_F32, BATCH / 2);
    rn_net *c = make_net(cpu_be, RN_F32, BATCH / 2), *h = make_net(emu_be, RN_F16, BATCH / 2);
    float loss;
    int found = 0;
    int64_t n;
    if (!a || !b || !c || !h) goto out;
    CHECK_OK(rn_net_set_clip(a, 1.0));
    CHECK_OK(rn_net_set_clip(b, 1.0));
    CHECK_OK(rn_net_set_clip(h, 1.0));
    CHECK(rn_net_set_clip(a, -1.0) == RN_EINVAL && rn_net_set_clip(a, INFINITY) == RN_EINVAL, "bad max norms");
    step(cpu_be, a, 1.0f, &loss, &found);
    step(cpu_be, b, 1024.0f, &loss, &found);
    step(cpu_be, c, 1.0f, &loss, &found);
    double na = rn_net_grad_norm(a), nb = rn_net_grad_norm(b);
    CHECK(isfinite(na) && na > 1 && memcmp(&na, &nb, sizeof na) == 0, "clip: norm %.17g at scale 1, %.17g at 1024",
          na, nb);
    CHECK(isnan(rn_net_grad_norm(c)), "an unclipped step measured a norm");
    float *pa = all_params(a, 0, &n), *pb = all_params(b, 0, &n), *pc = all_params(c, 0, &n);
    CHECK(memcmp(pa, pb, sizeof(float) * (size_t)n) == 0, "clip: the scaled step's weights differ");
    CHECK(memcmp(pa, pc, sizeof(float) * (size_t)n) != 0, "clip: the clipped step equals the unclipped one");
    free(pa), free(pb), free(pc);
    float *before = all_params(h, 0, &n);
    step(emu_be, h, 0x1p40f, &loss, &found);
    float *after = all_params(h, 0, &n);
    CHECK(found == 1 && isnan(rn_net_grad_norm(h)), "a skipped fp16 step: found %d, norm %g", found,
          rn_net_grad_norm(h));
    CHECK(memcmp(before, after, sizeof(float) * (size_t)n) == 0, "a skipped clipped step changed the weights");
    free(before), free(after);
out:
    rn_net_destroy(a), rn_net_destroy(b), rn_net_destroy(c), rn_net_destroy(h);
}

/* Recomputation (RN_NET_RECOMPUTE) under mixed precision: its block scratch in half
 * precision, the recomputed forward on the half compute copy; two steps give the bits of
 * the plain AMP net (the same ops on the same inputs), gradients and then weights. */
static void test_recompute(rn_backend *emu_be) {
    const int dt[2] = {RN_F16, RN_BF16};
    for (int t = 0; t < 2; t++) {
        rn_net *plain = make_net(emu_be, dt[t], BATCH / 2), *rec = NULL;
        CHECK_OK(rn_net_create(emu_be, &spec, BATCH / 2, SIZE, SIZE, RN_NET_TRAIN | RN_NET_RECOMPUTE, dt[t], &rec));
        if (rec) CHECK_OK(rn_net_load(rec, init));
        if (plain && rec)
            for (int s = 0; s < 2; s++) {
                float lp, lr;
                int fp, fr;
                step(emu_be, plain, 1024.0f, &lp, &fp);
                step(emu_be, rec, 1024.0f, &lr, &fr);
                CHECK(lp == lr && fp == fr, "%s step %d: loss %.9g recomputing, %.9g plain", rn_dtype_name(dt[t]),
                      s + 1, lr, lp);
                int64_t n, m;
                float *a = all_params(plain, s == 0, &n), *b = all_params(rec, s == 0, &m);
                CHECK(n == m && memcmp(a, b, sizeof(float) * (size_t)n) == 0, "%s step %d: %s differ",
                      rn_dtype_name(dt[t]), s + 1, s == 0 ? "gradients" : "weights");
                free(a), free(b);
            }
        rn_net_destroy(plain);
        rn_net_destroy(rec);
    }
}

/* Activation memory (what grows with the batch) halves in fp16 and bf16. rn_net_plan
 * counts exactly what rn_net_create holds (this backend's workspace query is exact). */
static void test_memory(void) {
    size_t bytes[3][2];
    const int dt[3] = {RN_F32, RN_F16, RN_BF16};
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < 2; k++)
            for (int mode = RN_NET_INFER; mode <= RN_NET_TRAIN; mode++) {
                rn_backend *be = emu_create();
                rn_net *net = NULL;
                size_t planned = 0;
                int batch = 8 * (k + 1);
                if (be) CHECK_OK(rn_net_plan(be, &spec, batch, SIZE, SIZE, mode, dt[t], &planned));
                CHECK(be && rn_backend_reserved(be) == 0, "planning reserved workspace");
                if (be) CHECK_OK(rn_net_create(be, &spec, batch, SIZE, SIZE, mode, dt[t], &net));
                if (net) {
                    CHECK(planned == rn_net_bytes(net), "%s mode %d batch %d: planned %zu bytes, holds %zu",
                          rn_dtype_name(dt[t]), mode, batch, planned, rn_net_bytes(net));
                    if (mode == RN_NET_TRAIN) bytes[t][k] = rn_net_bytes(net) - rn_backend_reserved(be);
                }
                rn_net_destroy(net);
                rn_backend_destroy(be);
            }
    double act32 = (double)(bytes[0][1] - bytes[0][0]);
    for (int t = 1; t < 3; t++) {
        double r = (double)(bytes[t][1] - bytes[t][0]) / act32;
        CHECK(r > 0.5 && r < 0.52, "%s: activation memory per image %.3f of fp32's, want about 0.5",
              rn_dtype_name(dt[t]), r);
    }
}

int main(void) {
    CHECK_OK(rn_resnet_build(&spec, ARCH, CLASSES));
    CHECK_OK(rn_ckpt_new(&spec, &init));
    if (!init) return check_done("test_amp");
    CHECK_OK(rn_ckpt_init(init, &spec, 7, 0));
    float u[BATCH * SIZE * SIZE * 3 + BATCH];
    rn_rng_uniform(rn_rng_key(20261203u, 1), u, (int64_t)(sizeof u / sizeof *u), 0, 1);
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(u[i] * 255.99f);
    for (int i = 0; i < BATCH; i++) labels[i] = (int32_t)(u[sizeof px + i] * CLASSES) % CLASSES;

    rn_backend *cpu_be = NULL, *emu_be = emu_create();
    CHECK_OK(rn_backend_create("cpu", 2, NULL, &cpu_be));
    if (cpu_be && emu_be) {
        /* the CPU backend itself refuses: it computes in fp32 only */
        rn_net *net = NULL;
        CHECK(rn_net_create(cpu_be, &spec, 2, SIZE, SIZE, RN_NET_TRAIN, RN_F16, &net) == RN_ENOTSUP && !net,
              "CPU backend with fp16");
        CHECK(strstr(rn_last_error(), "F32 only") != NULL, "message: %s", rn_last_error());
        CHECK(rn_net_create(cpu_be, &spec, 2, SIZE, SIZE, RN_NET_TRAIN, RN_U8, &net) == RN_EINVAL, "U8 net");
        /* With batch statistics (test_trajectory) the stem's weight gradient of one
           micro-batch peaks near 1: at 65536 its largest entry, scaled, came to 65265 with
           the GEMMs through OpenBLAS, 0.4% under fp16's 65504, and to 67255 with a first
           version of rn's kernel: a rounding difference decided whether step 0 overflowed.
           16384 leaves 4x. */
        const amp_case cases[] = {{RN_F16, 65536.0f, 16384.0f, 2e-4, 4e-3, 0.15},
                                  {RN_BF16, 1.0f, 1.0f, 2e-3, 3e-2, 0.4}};
        for (int i = 0; i < 2; i++) {
            test_gradients(cpu_be, emu_be, &cases[i]);
            test_trajectory(cpu_be, emu_be, &cases[i]);
        }
        test_overflow(emu_be);
        test_nonfinite_activation(cpu_be, emu_be);
        test_clip_scaled(cpu_be, emu_be);
        test_recompute(emu_be);
        test_memory();
    }
    rn_backend_destroy(cpu_be);
    rn_backend_destroy(emu_be);
    rn_ckpt_free(init);
    return check_done("test_amp");
}
