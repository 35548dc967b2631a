/* Parity harness for the inference path: the logits of WEIGHTS on INPUT's x through the
 * fast inference net (RN_NET_INFER: BN folded, fused conv) at 1, 2 and 3 threads and
 * through the exact one (RN_NET_INFER_EXACT) at 2 (tests/parity/infer_parity.py drives it).
 *   parity_rn_infer WEIGHTS.safetensors INPUT.safetensors OUT.safetensors
 * INPUT holds x (n, h, w, 3) F32 NHWC. OUT holds fast.1, fast.2, fast.3 and exact, each
 * (n, classes) F32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/backend.h"
#include "rn/cli.h"
#include "rn/ckpt.h"
#include "rn/convert.h"
#include "rn/err.h"
#include "rn/net.h"
#include "rn/safetensors.h"
#include "rn/tensor.h"

#define TRY(call) do { if ((call) != RN_OK) { fprintf(stderr, "parity_rn_infer: %s: %s\n", #call, rn_last_error()); return 1; } } while (0)

/* logits (n, classes) of ck on x through a net of mode at threads into out */
static int logits_of(const rn_ckpt *ck, const rn_st_tensor *x, int mode, int threads, float *out) {
    int n = (int)x->shape[0], h = (int)x->shape[1], w = (int)x->shape[2];
    rn_resnet spec;
    rn_backend *be = NULL;
    rn_net *net = NULL;
    TRY(rn_ckpt_net(ck, &spec));
    rn_backend_opts o; /* RN_CPU_WINOGRAD and the rest, as rn-eval */
    rn_backend_opts_init(&o);
    TRY(rn_cli_backend_env(&o));
    TRY(rn_backend_create("cpu", threads, &o, &be));
    TRY(rn_net_create(be, &spec, n, h, w, mode, RN_F32, &net));
    TRY(rn_net_load(net, ck));
    TRY(rn_backend_upload(be, rn_net_input(net), x->data, x->nbytes));
    TRY(rn_net_forward(net, n, 0));
    TRY(rn_backend_download(be, out, rn_net_logits(net), sizeof(float) * (size_t)n * spec.num_classes));
    rn_net_destroy(net);
    rn_backend_destroy(be);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: parity_rn_infer WEIGHTS.safetensors INPUT.safetensors OUT.safetensors\n");
        return 2;
    }
    rn_safetensors *wst = NULL, *ist = NULL;
    rn_ckpt *ck = NULL;
    TRY(rn_st_read(argv[1], &wst));
    TRY(rn_ckpt_from_safetensors(wst, NULL, 0, 0, &ck));
    TRY(rn_st_read(argv[2], &ist));
    const rn_st_tensor *x = rn_st_find(ist, "x");
    if (!x || x->ndim != 4 || x->dtype != RN_F32 || x->shape[3] != 3) {
        fprintf(stderr, "parity_rn_infer: INPUT needs x (n,h,w,3) F32\n");
        return 1;
    }
    rn_resnet spec;
    TRY(rn_ckpt_net(ck, &spec));
    int64_t n = x->shape[0], shape[2] = {n, spec.num_classes};
    size_t bytes = sizeof(float) * (size_t)(n * spec.num_classes);
    const char *names[] = {"fast.1", "fast.2", "fast.3", "exact"};
    const int modes[] = {RN_NET_INFER, RN_NET_INFER, RN_NET_INFER, RN_NET_INFER_EXACT}, threads[] = {1, 2, 3, 2};
    rn_st_tensor outs[4];
    for (int i = 0; i < 4; i++) {
        float *l = malloc(bytes);
        if (!l || logits_of(ck, x, modes[i], threads[i], l)) return 1;
        outs[i] = (rn_st_tensor){.name = (char *)names[i], .dtype = RN_F32, .ndim = 2, .data = (const uint8_t *)l, .nbytes = bytes};
        memcpy(outs[i].shape, shape, sizeof shape);
    }
    TRY(rn_st_write(argv[3], outs, 4, NULL, NULL, 0));
    for (int i = 0; i < 4; i++) free((void *)outs[i].data);
    rn_ckpt_free(ck);
    rn_st_free(wst);
    rn_st_free(ist);
    return 0;
}
