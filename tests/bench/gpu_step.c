/* GPU benchmark body for make bench-gpu (tests/bench/gpu.sh): ResNet training steps
 * (forward, loss and backward, SGD momentum 0.9) on a fixed random batch already in device
 * memory, timed after warm-up steps, each end of the timed window after a device sync.
 * The batch goes in as rn-train's does: random u8 pixels normalised on the device into
 * the net's input, so that the input's element type is the net's business.
 *   bench_gpu_step probe [DEVICE]
 *       exit 0 and print the backend's name when DEVICE (default cuda) starts; exit 77 and
 *       say why when it does not (no GPU, no driver, a build without CUDA)
 *   bench_gpu_step ARCH SIZE BATCH WARMUP STEPS fp32|fp16|bf16 [DEVICE]
 *       prints "img/s=<x> ms_per_step=<m> net_mib=<n> t0=<s> t1=<s> loss=<l>
 *       loss_scale=<s> skipped=<k>": net_mib is what the net holds in device memory
 *       (weights, gradients, momentum, activations, the workspace arena: rn allocates
 *       nothing after rn_net_create); t0 and t1 bound the timed steps in wall-clock
 *       seconds since the epoch, for matching GPU utilisation samples to them; loss is
 *       the last step's (each step's loss and train top-1 hits stay on the device, read
 *       after the timed steps, as rn-train reads them once per log line); loss_scale and skipped (timed steps the fp16 loss scale skipped)
 *       are 1 and 0 unless fp16.
 * fp16 and bf16 are mixed precision as rn-train --amp runs it (lib/train.c, one micro-
 * batch): fp16 backward of the loss times a GradScaler scale, the inf/NaN check, then the
 * unscaling SGD step or its skip, and the scale's update; bf16 plain SGD, no scale.
 * Exit 3 with "<precision>: AMP needs a GPU: ..." where the backend does not compute in
 * that type. DEVICE "cpu" runs the same code on the CPU (a check of this program only).
 * RN_BENCH_CUDA_GRAPHS=1: the forward, top-1 count and backward of each step through a
 * graph replay (rn/replay.h), and the optimiser step through another, as rn-train
 * --cuda-graphs runs them (exit 3 where the backend has no graphs). */
#include <float.h>
#include <math.h>
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
#include "rn/replay.h"
#include "rn/rng.h"
#include "rn/scaler.h"
#include "rn/tensor.h"

#define SKIP 77
#define NOT_SUPPORTED 3

#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        if ((call) != RN_OK) {                                                                                         \
            fprintf(stderr, "bench_gpu_step: %s: %s\n", #call, rn_last_error());                                       \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* a context with the settings the environment gives (RN_CUDA_TF32, ... as rn-train) */
static int open_backend(const char *device, rn_backend **be) {
    rn_backend_opts bo;
    rn_backend_opts_init(&bo);
    int rc = rn_cli_backend_env(&bo);
    return rc ? rc : rn_backend_create(device, 0, &bo, be);
}

static int probe(const char *device) {
    rn_backend *be = NULL;
    if (open_backend(device, &be) != RN_OK) {
        printf("%s\n", rn_last_error());
        return SKIP;
    }
    printf("%s\n", rn_backend_name(be));
    rn_backend_destroy(be);
    return 0;
}

/* the optimiser's state across steps: fp16's loss scale, what the steps saw */
typedef struct {
    rn_net *net;
    rn_backend *be;
    int scaled; /* fp16: GradScaler; fp32 and bf16 step without a scale */
    rn_scaler sc;
    int64_t skipped; /* steps an inf/NaN gradient skipped */
    const int32_t *labels; /* (batch) in device memory */
    float *loss;     /* device memory: step s's loss at s (read after the steps, as rn-train reads them) */
    int32_t *hits;   /* device memory: step s's train top-1 hits at s */
    rn_replay *graph; /* RN_BENCH_CUDA_GRAPHS=1: the replay; NULL: eager */
    rn_replay *sgraph; /* ... and the optimiser step's */
    float *gloss;    /* with graph: the replayed step's loss, then its hits */
    int batch;
    float grad_scale;
} stepper;

/* the step's ops up to its optimiser step; with a graph, into gloss (a fixed place) */
static int step_ops(void *ctx) {
    stepper *st = ctx;
    float *loss = st->gloss;
    int32_t *hits = (int32_t *)(st->gloss + 1);
    int rc = rn_net_forward(st->net, st->batch, 1);
    if (rc == RN_OK)
        rc = rn_top1_count(st->be, st->batch, 1000, rn_net_logits(st->net), st->labels, RN_TOP1_LABEL, hits);
    if (rc == RN_OK) rc = rn_net_backward_dev(st->net, st->labels, st->batch, 0.0f, 0, st->grad_scale, 0, loss);
    return rc;
}

/* the optimiser step's device ops, as rn-train's step graph holds them */
static int sgd_ops(void *ctx) {
    stepper *st = ctx;
    return rn_net_step_ops(st->net, st->scaled ? &st->sc : NULL, 0.9f, 1e-4f, 0, 0);
}

/* optimiser step s as rn-train takes it (lib/train.c): the loss and the top-1 hits stay
 * on the device; the host waits only for fp16's overflow flag */
static int step(stepper *st, int s, int batch) {
    int rc;
    float grad_scale = st->scaled ? st->sc.scale : 1.0f;
    if (st->graph) {
        st->batch = batch, st->grad_scale = grad_scale;
        if ((rc = rn_replay_run(st->graph, st->be, &grad_scale, sizeof grad_scale, step_ops, st, NULL)) ||
            (rc = rn_backend_copy(st->be, st->loss + s, st->gloss, sizeof(float))) ||
            (rc = rn_backend_copy(st->be, st->hits + s, st->gloss + 1, sizeof(int32_t))))
            return rc;
        rn_net_count_batch(st->net, batch);
        if (st->graph->off) return rn_errorf(RN_EGPU, "a capture failed: %s", st->graph->why);
    } else if ((rc = rn_net_forward(st->net, batch, 1)) ||
        (rc = rn_top1_count(st->be, batch, 1000, rn_net_logits(st->net), st->labels, RN_TOP1_LABEL, st->hits + s)) ||
        (rc = rn_net_backward_dev(st->net, st->labels, batch, 0.0f, 0, grad_scale, 0, st->loss + s)))
        return rc;
    int skipped = 0;
    if (st->graph) {
        rn_net_step_key key;
        rn_net_step_keyof(st->net, st->scaled ? &st->sc : NULL, &key);
        if ((rc = rn_net_step_lr(st->net, 0.01f)) ||
            (rc = rn_replay_run(st->sgraph, st->be, &key, sizeof key, sgd_ops, st, NULL)) ||
            (rc = rn_net_step_end(st->net, st->scaled ? &st->sc : NULL, 0.9f, &skipped)))
            return rc;
        if (st->sgraph->off) return rn_errorf(RN_EGPU, "the step's capture failed: %s", st->sgraph->why);
    } else if ((rc = rn_net_step(st->net, st->scaled ? &st->sc : NULL, 0.01f, 0.9f, 1e-4f, 0, 0, &skipped))) {
        return rc;
    }
    st->skipped += skipped;
    if (st->scaled && !(st->sc.scale >= FLT_MIN))
        return rn_errorf(RN_ENUMERIC, "the fp16 loss scale fell to %g: the gradients overflow at any scale",
                         st->sc.scale);
    return RN_OK;
}

/* the first n steps' losses into losses, each checked ("which" steps, for the message) */
static int read_losses(const stepper *st, float *losses, int n, const char *which) {
    int rc = rn_backend_download(st->be, losses, st->loss, sizeof(float) * (size_t)n);
    for (int s = 0; s < n && rc == RN_OK; s++)
        if (!isfinite(losses[s]))
            rc = rn_errorf(RN_ENUMERIC, "%s step %d: the loss is %g: training diverged%s", which, s, losses[s],
                           st->scaled ? " (fp16 activations overflow past 65504)" : "");
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 2 && argc <= 3 && strcmp(argv[1], "probe") == 0) return probe(argc == 3 ? argv[2] : "cuda");
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: bench_gpu_step ARCH SIZE BATCH WARMUP STEPS fp32|fp16|bf16 [DEVICE]\n"
                        "       bench_gpu_step probe [DEVICE]\n");
        return 2;
    }
    int size = atoi(argv[2]), batch = atoi(argv[3]), warmup = atoi(argv[4]), steps = atoi(argv[5]);
    const char *prec = argv[6], *device = argc == 8 ? argv[7] : "cuda";
    if (size < 1 || batch < 1 || warmup < 1 || steps < 1) {
        fprintf(stderr, "bench_gpu_step: SIZE, BATCH, WARMUP and STEPS must be positive\n");
        return 2;
    }
    int dtype = strcmp(prec, "fp32") == 0   ? RN_F32
                : strcmp(prec, "fp16") == 0 ? RN_F16
                : strcmp(prec, "bf16") == 0 ? RN_BF16
                                            : -1;
    if (dtype < 0) {
        fprintf(stderr, "bench_gpu_step: %s: want fp32, fp16 or bf16\n", prec);
        return 2;
    }
    int ret = 1;
    rn_resnet spec;
    rn_ckpt *ck = NULL;
    rn_backend *be = NULL;
    rn_net *net = NULL;
    uint8_t *px = NULL, *dpx = NULL;
    int32_t *labels = NULL, *dlabels = NULL, *dhits = NULL;
    float *dloss = NULL, *losses = NULL;
    rn_replay replay = {0}, sreplay = {0};
    if (open_backend(device, &be) != RN_OK) {
        fprintf(stderr, "bench_gpu_step: %s: %s\n", device, rn_last_error());
        return SKIP;
    }
    if (!rn_backend_has_dtype(be, dtype)) {
        /* gpu.sh turns exit 3 into a "not run: <why>" row, as rn-train --amp refuses */
        fprintf(stderr, "bench_gpu_step: %s: AMP needs a GPU: this backend computes in fp32 only (%s)\n", prec,
                rn_backend_name(be));
        rn_backend_destroy(be);
        return NOT_SUPPORTED;
    }
    stepper st = {.be = be, .scaled = dtype == RN_F16};
    if (st.scaled &&
        rn_scaler_init(&st.sc, RN_SCALER_INIT, RN_SCALER_GROWTH, RN_SCALER_BACKOFF, RN_SCALER_INTERVAL) != RN_OK) {
        fprintf(stderr, "bench_gpu_step: %s\n", rn_last_error());
        rn_backend_destroy(be);
        return 1;
    }
    TRY(rn_resnet_build(&spec, argv[1], 1000));
    TRY(rn_ckpt_new(&spec, &ck));
    TRY(rn_ckpt_init(ck, &spec, 0, 0));
    TRY(rn_net_create(be, &spec, batch, size, size, RN_NET_TRAIN, dtype, &net));
    st.net = net;
    const char *g = getenv("RN_BENCH_CUDA_GRAPHS");
    if (g && strcmp(g, "1") == 0) {
        if (!rn_backend_has_graphs(be)) {
            fprintf(stderr, "bench_gpu_step: RN_BENCH_CUDA_GRAPHS=1: the %s backend has no graphs\n", rn_backend_name(be));
            ret = NOT_SUPPORTED;
            goto fail;
        }
        st.graph = &replay;
        st.sgraph = &sreplay;
        rn_net_count_by_caller(net, 1);
        TRY(rn_backend_alloc(be, 2 * sizeof(float), (void **)&st.gloss));
    }
    TRY(rn_net_load(net, ck));
    int64_t m = (int64_t)batch * size * size, nx = m * 3;
    if (!(px = malloc((size_t)nx)) || !(labels = malloc(sizeof(int32_t) * (size_t)batch))) {
        fprintf(stderr, "bench_gpu_step: out of host memory for a batch of %d\n", batch);
        goto fail;
    }
    for (int64_t i = 0; i < nx; i += 16) {
        uint32_t r[4];
        rn_philox(rn_rng_key(1, 2), 0, (uint64_t)i / 16, r);
        memcpy(px + i, r, (size_t)(nx - i < 16 ? nx - i : 16));
    }
    for (int i = 0; i < batch; i++)
        labels[i] = (i * 37) % 1000;
    int nsteps = warmup > steps ? warmup : steps;
    if (!(losses = malloc(sizeof(float) * (size_t)nsteps))) {
        fprintf(stderr, "bench_gpu_step: out of host memory for %d losses\n", nsteps);
        goto fail;
    }
    TRY(rn_backend_alloc(be, (size_t)nx, (void **)&dpx));
    TRY(rn_backend_upload(be, dpx, px, (size_t)nx));
    TRY(rn_backend_alloc(be, sizeof(int32_t) * (size_t)batch, (void **)&dlabels));
    TRY(rn_backend_upload(be, dlabels, labels, sizeof(int32_t) * (size_t)batch));
    TRY(rn_backend_alloc(be, sizeof(float) * (size_t)nsteps, (void **)&dloss));
    TRY(rn_backend_alloc(be, sizeof(int32_t) * (size_t)nsteps, (void **)&dhits));
    st.labels = dlabels, st.loss = dloss, st.hits = dhits;
    TRY(rn_input_normalize(be, rn_net_dtype(net), m, 3, dpx, RN_IMAGENET_MEAN, RN_IMAGENET_STD, rn_net_input(net)));
    /* the first step chooses every convolution algorithm (cuDNN Find): never timed */
    for (int s = 0; s < warmup; s++)
        TRY(step(&st, s, batch));
    int64_t skipped0 = st.skipped;
    TRY(rn_backend_sync(be));
    TRY(read_losses(&st, losses, warmup, "warm-up"));
    int64_t l0 = rn_backend_launches(be);
    double w0 = wall(), t0 = mono();
    for (int s = 0; s < steps; s++)
        TRY(step(&st, s, batch));
    TRY(rn_backend_sync(be));
    double dt = mono() - t0, w1 = wall();
    TRY(read_losses(&st, losses, steps, "timed"));
    double lps = (double)(rn_backend_launches(be) - l0) / steps;
    printf("img/s=%.2f ms_per_step=%.3f net_mib=%.1f t0=%.3f t1=%.3f loss=%.6g loss_scale=%g skipped=%lld "
           "launches_per_step=%.1f\n",
           steps * batch / dt, 1e3 * dt / steps, rn_net_bytes(net) / 1048576.0, w0, w1, losses[steps - 1],
           st.scaled ? st.sc.scale : 1.0f, (long long)(st.skipped - skipped0), lps);
    fprintf(stderr, "bench_gpu_step: %s %dx%d batch %d %s, %d warm-up + %d timed steps on %s\n", argv[1], size, size,
            batch, prec, warmup, steps, rn_backend_name(be));
    ret = 0;
fail:
    free(px);
    free(labels);
    free(losses);
    rn_replay_reset(&replay, be);
    rn_replay_reset(&sreplay, be);
    rn_backend_free(be, st.gloss);
    rn_backend_free(be, dpx);
    rn_backend_free(be, dlabels);
    rn_backend_free(be, dloss);
    rn_backend_free(be, dhits);
    rn_ckpt_free(ck);
    rn_net_destroy(net);
    rn_backend_destroy(be);
    return ret;
}
