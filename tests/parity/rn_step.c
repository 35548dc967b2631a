/* Parity harness: runs rn's network on given weights and input and writes what the
 * PyTorch reference computes too (tests/parity/train_parity.py drives both).
 *   parity_rn_step WEIGHTS.safetensors INPUT.safetensors OUT.safetensors
 * INPUT holds x (n, h, w, 3) F32 NHWC and y (n) I32. OUT holds eval_logits, logits,
 * loss, loss2, grad.<param> (first step, torchvision layout) and final.<name> for every
 * parameter and buffer after two SGD steps (lr 0.1, momentum 0.9, weight decay 1e-4),
 * and act.<module>.<call> (n, h, w, c): the output of each call of a torchvision ReLU
 * module in the first training forward ("relu.0" the stem's, "layer1.0.relu.2" a
 * bottleneck's third, after the residual add), so the driver can see rn's ReLU masks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/backend.h"
#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/convert.h"
#include "rn/err.h"
#include "rn/net.h"
#include "rn/safetensors.h"
#include "rn/tensor.h"

#define MAX_OUT 1536

static rn_st_tensor outs[MAX_OUT];
static int nout;

static void add_out(const char *name, int ndim, const int64_t *shape, const void *data, size_t nbytes) {
    rn_st_tensor *t = &outs[nout++];
    t->name = strdup(name);
    t->dtype = RN_F32;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    void *copy = malloc(nbytes);
    memcpy(copy, data, nbytes);
    t->data = copy;
    t->nbytes = nbytes;
}

#define TRY(call) do { if ((call) != RN_OK) { fprintf(stderr, "parity_rn_step: %s: %s\n", #call, rn_last_error()); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: parity_rn_step WEIGHTS.safetensors INPUT.safetensors OUT.safetensors\n");
        return 2;
    }
    rn_safetensors *wst = NULL, *ist = NULL;
    rn_ckpt *ck = NULL;
    TRY(rn_st_read(argv[1], &wst));
    TRY(rn_ckpt_from_safetensors(wst, NULL, 0, 0, &ck));
    TRY(rn_st_read(argv[2], &ist));
    const rn_st_tensor *x = rn_st_find(ist, "x"), *y = rn_st_find(ist, "y");
    if (!x || !y || x->ndim != 4 || x->dtype != RN_F32 || y->dtype != RN_I32) {
        fprintf(stderr, "parity_rn_step: INPUT needs x (n,h,w,3) F32 and y (n) I32\n");
        return 1;
    }
    int n = (int)x->shape[0], h = (int)x->shape[1], w = (int)x->shape[2];
    rn_resnet spec;
    TRY(rn_ckpt_net(ck, &spec));
    rn_backend *be = NULL;
    rn_net *net = NULL;
    rn_backend_opts o; /* RN_CPU_GEMM and the rest, as rn-train */
    rn_backend_opts_init(&o);
    TRY(rn_cli_backend_env(&o));
    TRY(rn_backend_create("cpu", 0, &o, &be));
    TRY(rn_net_create(be, &spec, n, h, w, RN_NET_TRAIN, RN_F32, &net));
    TRY(rn_net_load(net, ck));
    TRY(rn_backend_upload(be, rn_net_input(net), x->data, x->nbytes));
    int64_t K = spec.num_classes;
    float *logits = malloc(sizeof(float) * (size_t)(n * K));
    int64_t lshape[2] = {n, K}, one[1] = {1};

    TRY(rn_net_forward(net, n, 0));
    TRY(rn_backend_download(be, logits, rn_net_logits(net), sizeof(float) * (size_t)(n * K)));
    add_out("eval_logits", 2, lshape, logits, sizeof(float) * (size_t)(n * K));

    const int32_t *labels = (const int32_t *)(const void *)y->data;
    float loss = 0;
    TRY(rn_net_forward(net, n, 1));
    TRY(rn_backend_download(be, logits, rn_net_logits(net), sizeof(float) * (size_t)(n * K)));
    add_out("logits", 2, lshape, logits, sizeof(float) * (size_t)(n * K));
    char name[128];
    /* torchvision's ReLU calls: the stem's, then call j of a block's module after its
       unit j (the downsample unit has none) */
    for (int b = -1; b < spec.nblocks; b++) {
        int nc = b < 0 ? 1 : spec.blocks[b].nconv;
        for (int j = 0; j < nc; j++) {
            int ui = b < 0 ? 0 : spec.blocks[b].conv[j];
            const rn_convbn *cb = &spec.units[ui];
            const char *dot = strrchr(cb->bn, '.');
            int plen = b < 0 || !dot ? 0 : (int)(dot - cb->bn);
            snprintf(name, sizeof name, "act.%.*s%srelu.%d", plen, cb->bn, plen ? "." : "", j);
            int64_t ashape[4];
            TRY(rn_net_unit_output(net, ui, NULL, ashape));
            int64_t numel = rn_numel(ashape, 4);
            float *a = malloc(sizeof(float) * (size_t)numel);
            TRY(rn_net_unit_output(net, ui, a, ashape));
            add_out(name, 4, ashape, a, sizeof(float) * (size_t)numel);
            free(a);
        }
    }
    TRY(rn_net_backward(net, labels, n, 0.0f, 1.0f, 0, &loss));
    add_out("loss", 1, one, &loss, sizeof loss);
    for (size_t i = 0; i < ck->n_params; i++) {
        const rn_ptensor *p = ck->params[i];
        int64_t numel = rn_numel(p->shape, p->n_shape);
        float *g = malloc(sizeof(float) * (size_t)numel);
        TRY(rn_net_grad(net, p->name, g, numel));
        snprintf(name, sizeof name, "grad.%s", p->name);
        add_out(name, (int)p->n_shape, p->shape, g, sizeof(float) * (size_t)numel);
        free(g);
    }
    TRY(rn_net_step(net, NULL, 0.1f, 0.9f, 1e-4f, 0, 0, NULL));
    TRY(rn_net_forward(net, n, 1));
    TRY(rn_net_backward(net, labels, n, 0.0f, 1.0f, 0, &loss));
    add_out("loss2", 1, one, &loss, sizeof loss);
    TRY(rn_net_step(net, NULL, 0.1f, 0.9f, 1e-4f, 0, 0, NULL));
    TRY(rn_net_store(net, ck));
    for (int pass = 0; pass < 2; pass++) {
        rn_ptensor **t = pass ? ck->buffers : ck->params;
        size_t cnt = pass ? ck->n_buffers : ck->n_params;
        for (size_t i = 0; i < cnt; i++) {
            if (t[i]->dtype != RN__DTYPE__F32) continue;
            snprintf(name, sizeof name, "final.%s", t[i]->name);
            add_out(name, (int)t[i]->n_shape, t[i]->shape, t[i]->data.data, t[i]->data.len);
        }
    }
    fprintf(stderr, "parity_rn_step: %s, network memory %.1f MiB\n", rn_backend_name(be), rn_net_bytes(net) / 1048576.0);
    TRY(rn_st_write(argv[3], outs, nout, NULL, NULL, 0));
    for (int i = 0; i < nout; i++) free(outs[i].name), free((void *)outs[i].data);
    free(logits);
    rn_net_destroy(net);
    rn_backend_destroy(be);
    rn_ckpt_free(ck);
    rn_st_free(wst);
    rn_st_free(ist);
    return 0;
}
