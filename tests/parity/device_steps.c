/* Training steps on one device from a checkpoint, for comparing devices (make gpu-check):
 *   parity_device_steps DEVICE CKPT.pb SIZE BATCH STEPS SEED
 * Every step trains on the same batch: SEED's u8 pixels (uploaded, then rn_input_normalize
 * on the device, as rn-train does) and labels, SGD lr 0.01 momentum 0.9 weight decay 1e-4.
 * stdout: "step <i> loss <l>" per step, "eval loss <l>" (an inference forward of the same
 * batch with the trained weights), then "ms_per_step=<t> backend=<name>". The same
 * checkpoint and seed on two devices give two loss curves to compare. Exit 1 on error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rn/backend.h"
#include "rn/cli.h"
#include "rn/ckpt.h"
#include "rn/err.h"
#include "rn/loader.h"
#include "rn/net.h"
#include "rn/rng.h"
#include "rn/tensor.h"

#define TRY(call) do { if ((rc = (call)) != RN_OK) { \
    fprintf(stderr, "parity_device_steps: %s: %s\n", #call, rn_last_error()); goto out; } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: parity_device_steps DEVICE CKPT.pb SIZE BATCH STEPS SEED\n");
        return 2;
    }
    const char *device = argv[1], *ckpt = argv[2];
    int size = atoi(argv[3]), batch = atoi(argv[4]), steps = atoi(argv[5]);
    uint64_t seed = strtoull(argv[6], NULL, 10);
    if (size < 1 || batch < 1 || steps < 1) {
        fprintf(stderr, "parity_device_steps: SIZE, BATCH and STEPS must be positive\n");
        return 2;
    }
    int rc = RN_OK;
    rn_resnet spec;
    rn_ckpt *ck = NULL;
    rn_backend *be = NULL;
    rn_net *net = NULL;
    uint8_t *px = NULL, *dpx = NULL;
    int32_t *labels = NULL;
    size_t npx = (size_t)batch * size * size * 3;
    TRY(rn_ckpt_read(ckpt, &ck));
    TRY(rn_ckpt_net(ck, &spec));
    rn_backend_opts bo;
    rn_backend_opts_init(&bo);
    TRY(rn_cli_backend_env(&bo));
    TRY(rn_backend_create(device, 0, &bo, &be));
    fprintf(stderr, "parity_device_steps: %s\n", rn_backend_name(be));
    TRY(rn_net_create(be, &spec, batch, size, size, RN_NET_TRAIN, RN_F32, &net));
    TRY(rn_net_load(net, ck));
    px = malloc(npx);
    labels = malloc(sizeof(int32_t) * (size_t)batch);
    if (!px || !labels) {
        rc = RN_ENOMEM;
        fprintf(stderr, "parity_device_steps: out of memory\n");
        goto out;
    }
    {
        float *u = malloc(sizeof(float) * (npx + (size_t)batch));
        if (!u) {
            rc = RN_ENOMEM;
            goto out;
        }
        rn_rng_uniform(rn_rng_key(seed, 1), u, (int64_t)(npx + (size_t)batch), 0, 1);
        for (size_t i = 0; i < npx; i++) px[i] = (uint8_t)(u[i] * 255.99f);
        for (int i = 0; i < batch; i++) labels[i] = (int32_t)(u[npx + (size_t)i] * spec.num_classes) % spec.num_classes;
        free(u);
    }
    const uint8_t *src = px;
    if (!rn_backend_is_host(be)) {
        TRY(rn_backend_alloc(be, npx, (void **)&dpx));
        TRY(rn_backend_upload(be, dpx, px, npx));
        src = dpx;
    }
    double t0 = 0;
    for (int s = 0; s < steps; s++) {
        if (s == 1) {
            TRY(rn_backend_sync(be));
            t0 = now(); /* step 0 finds algorithms and warms up */
        }
        float loss;
        TRY(rn_input_normalize(be, RN_F32, (int64_t)batch * size * size, 3, src, RN_IMAGENET_MEAN, RN_IMAGENET_STD,
                               rn_net_input(net)));
        TRY(rn_net_forward(net, batch, 1));
        TRY(rn_net_backward(net, labels, batch, 0.0f, 1.0f, 0, &loss));
        TRY(rn_net_step(net, NULL, 0.01f, 0.9f, 1e-4f, 0, 0, NULL));
        printf("step %d loss %.9g\n", s, loss);
        fflush(stdout);
    }
    TRY(rn_backend_sync(be));
    double t1 = now();
    {
        /* the trained weights in inference mode (running statistics, BN in place) */
        float eval_loss;
        TRY(rn_input_normalize(be, RN_F32, (int64_t)batch * size * size, 3, src, RN_IMAGENET_MEAN, RN_IMAGENET_STD,
                               rn_net_input(net)));
        TRY(rn_net_forward(net, batch, 0));
        TRY(rn_net_loss(net, labels, batch, 0.0f, &eval_loss));
        printf("eval loss %.9g\n", eval_loss);
    }
    printf("ms_per_step=%.2f backend=%s\n", steps > 1 ? 1e3 * (t1 - t0) / (steps - 1) : 0.0,
           rn_backend_name(be));
out:
    if (be) rn_backend_free(be, dpx);
    free(px);
    free(labels);
    rn_net_destroy(net);
    rn_backend_destroy(be);
    rn_ckpt_free(ck);
    return rc == RN_OK ? 0 : 1;
}
