/* Recomputation of activations (RN_NET_RECOMPUTE, lib/net.c): a training net that keeps
 * only each block's output and recomputes the block's inside in backward must give the
 * bits of a plain net, in less memory.
 *
 * Checks, for resnet18 (basic blocks) and resnet50 (bottlenecks with downsamples) on the
 * CPU with 1, 2 and 3 threads, against a plain net from the same weights on the same
 * batches: every gradient of a step of two accumulated micro-batches, and every weight,
 * momentum and BN buffer (running statistics, num_batches_tracked) after three such
 * steps, byte for byte; the same under frozen BN, with BN capture (the captured
 * statistics too) and with synchronised BN over a world of one. Also: rn_net_plan counts
 * exactly what rn_net_create holds and less than the plain net (by more at a larger
 * batch); inference nets refuse the flag; rn_net_unit_output has the block outputs only. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/backend.h"
#include "rn/ckpt.h"
#include "rn/err.h"
#include "rn/loader.h"
#include "rn/net.h"
#include "rn/resnet.h"
#include "rn/rng.h"
#include "rn/state.h"
#include "rn/tensor.h"

enum { BATCH = 8, SIZE = 32, CLASSES = 5, STEPS = 3 };

static uint8_t px[BATCH * SIZE * SIZE * 3];
static int32_t labels[BATCH];

enum { PLAIN, FROZEN, CAPTURE, SYNC };
static const char *const variant_name[] = {"plain BN", "frozen BN", "BN capture", "synchronised BN"};

/* rn_net_set_sync's gather in a world of one: everyone's part is this process's */
static int gather_one(void *ctx, const void *mine, size_t bytes, void *all) {
    (void)ctx;
    memcpy(all, mine, bytes);
    return RN_OK;
}

static rn_net *make_net(rn_backend *be, const rn_resnet *spec, const rn_ckpt *init, int recompute, int variant) {
    rn_net *net = NULL;
    CHECK_OK(rn_net_create(be, spec, BATCH / 2, SIZE, SIZE, RN_NET_TRAIN | (recompute ? RN_NET_RECOMPUTE : 0), RN_F32,
                           &net));
    if (!net) return NULL;
    CHECK_OK(rn_net_load(net, init));
    rn_net_freeze_bn(net, variant == FROZEN);
    if (variant == CAPTURE) CHECK_OK(rn_net_bn_capture(net, 1));
    if (variant == SYNC) CHECK_OK(rn_net_set_sync(net, 1, gather_one, NULL));
    return net;
}

/* One step of two micro-batches of BATCH/2; the gradients (before the SGD step) into
 * grads (nparams floats) and, under capture, each micro-batch's statistics into stats
 * (2 x nstats) */
static void step(rn_backend *be, rn_net *net, int variant, float *grads, float *stats) {
    int64_t nstat = rn_net_bn_stats_len(net), ng = 0;
    for (int k = 0; k < 2; k++) {
        float loss = 0;
        CHECK_OK(rn_input_normalize(be, RN_F32, (int64_t)(BATCH / 2) * SIZE * SIZE, 3,
                                    px + (size_t)k * (BATCH / 2) * SIZE * SIZE * 3, RN_IMAGENET_MEAN, RN_IMAGENET_STD,
                                    rn_net_input(net)));
        CHECK_OK(rn_net_forward(net, BATCH / 2, 1));
        CHECK_OK(rn_net_backward(net, labels + k * (BATCH / 2), BATCH / 2, 0.1f, 0.5f, k > 0, &loss));
        if (variant == CAPTURE) CHECK_OK(rn_net_bn_captured(net, stats + k * nstat));
    }
    if (variant == CAPTURE) CHECK_OK(rn_net_bn_replay(net, stats, 2));
    float *g = rn_net_grads(net, &ng);
    CHECK_OK(rn_backend_download(be, grads, g, sizeof(float) * (size_t)ng));
    CHECK_OK(rn_net_step(net, NULL, 0.05f, 0.9f, 1e-4f, 0, 0, NULL));
}

/* 1 when two tensors hold the same bytes */
static int same_bytes(const rn_ptensor *a, const rn_ptensor *b) {
    return a && b && a->data.len == b->data.len && memcmp(a->data.data, b->data.data, a->data.len) == 0;
}

/* Every tensor of the two nets' checkpoints (weights, their momentum, BN buffers) byte
 * for byte; a failure names the first few tensors that differ. */
static void same_ckpt(rn_net *a, rn_net *b, const rn_resnet *spec, const char *what) {
    rn_ckpt *ca = NULL, *cb = NULL;
    int bad = 0;
    CHECK_OK(rn_ckpt_new(spec, &ca));
    CHECK_OK(rn_ckpt_new(spec, &cb));
    if (!ca || !cb) goto out;
    CHECK_OK(rn_net_store(a, ca));
    CHECK_OK(rn_net_store(b, cb));
    CHECK(rn_state_has_momentum(ca) && rn_state_has_momentum(cb), "%s: momentum stored", what);
    for (size_t i = 0; i < ca->n_params; i++) {
        const char *name = ca->params[i]->name;
        if (!same_bytes(ca->params[i], cb->params[i]) && bad++ < 3) fprintf(stderr, "%s: %s differs\n", what, name);
        if (!same_bytes(rn_state_momentum(ca, name), rn_state_momentum(cb, name)) && bad++ < 3)
            fprintf(stderr, "%s: the momentum of %s differs\n", what, name);
    }
    for (size_t i = 0; i < ca->n_buffers; i++)
        if (!same_bytes(ca->buffers[i], cb->buffers[i]) && bad++ < 3)
            fprintf(stderr, "%s: buffer %s differs\n", what, ca->buffers[i]->name);
    CHECK(bad == 0, "%s: %d tensors differ", what, bad);
out:
    rn_ckpt_free(ca);
    rn_ckpt_free(cb);
}

/* STEPS steps of a plain and a recomputing net side by side: each step's gradients (and
 * captured statistics) the same bytes, then the checkpoints. */
static void test_same_bits(const char *arch, int threads, int variant) {
    rn_resnet spec;
    rn_ckpt *init = NULL;
    rn_backend *be = NULL;
    rn_net *plain = NULL, *rec = NULL;
    float *g[2] = {NULL, NULL}, *st[2] = {NULL, NULL};
    char what[128];
    snprintf(what, sizeof what, "%s, %s, %d threads", arch, variant_name[variant], threads);
    CHECK_OK(rn_resnet_build(&spec, arch, CLASSES));
    CHECK_OK(rn_ckpt_new(&spec, &init));
    if (!init) return;
    CHECK_OK(rn_ckpt_init(init, &spec, 11, 0));
    CHECK_OK(rn_backend_create("cpu", threads, NULL, &be));
    if (!be) goto out;
    plain = make_net(be, &spec, init, 0, variant);
    rec = make_net(be, &spec, init, 1, variant);
    if (!plain || !rec) goto out;
    int64_t ng = 0, ns = rn_net_bn_stats_len(plain);
    rn_net_grads(plain, &ng);
    for (int k = 0; k < 2; k++) {
        g[k] = malloc(sizeof(float) * (size_t)ng);
        st[k] = malloc(sizeof(float) * 2 * (size_t)ns);
    }
    if (!g[0] || !g[1] || !st[0] || !st[1]) goto out;
    for (int s = 0; s < STEPS; s++) {
        step(be, plain, variant, g[0], st[0]);
        step(be, rec, variant, g[1], st[1]);
        int64_t first = -1;
        for (int64_t i = 0; i < ng && first < 0; i++)
            if (memcmp(&g[0][i], &g[1][i], sizeof(float))) first = i;
        CHECK(first < 0, "%s: step %d: gradient %lld: %.9g recomputed, %.9g plain", what, s + 1, (long long)first,
              first < 0 ? 0.0 : g[1][first], first < 0 ? 0.0 : g[0][first]);
        if (variant == CAPTURE)
            CHECK(memcmp(st[0], st[1], sizeof(float) * 2 * (size_t)ns) == 0, "%s: step %d: captured statistics", what,
                  s + 1);
    }
    same_ckpt(plain, rec, &spec, what);
out:
    for (int k = 0; k < 2; k++) {
        free(g[k]);
        free(st[k]);
    }
    rn_net_destroy(plain);
    rn_net_destroy(rec);
    rn_backend_destroy(be);
    rn_ckpt_free(init);
}

/* The plan is what the net holds, and recomputation plans less, by more at a larger
 * batch (what it saves is activations). */
static void test_memory(void) {
    const char *arch[] = {"resnet18", "resnet50"};
    for (int a = 0; a < 2; a++) {
        rn_resnet spec;
        CHECK_OK(rn_resnet_build(&spec, arch[a], CLASSES));
        size_t saved[2] = {0, 0};
        const int batch[2] = {2, 8};
        for (int b = 0; b < 2; b++) {
            size_t plain = 0, rec = 0;
            /* a fresh backend: rn_net_bytes counts the workspace reserved so far */
            rn_backend *be = NULL;
            CHECK_OK(rn_backend_create("cpu", 2, NULL, &be));
            if (!be) return;
            CHECK_OK(rn_net_plan(be, &spec, batch[b], 64, 64, RN_NET_TRAIN, RN_F32, &plain));
            CHECK_OK(rn_net_plan(be, &spec, batch[b], 64, 64, RN_NET_TRAIN | RN_NET_RECOMPUTE, RN_F32, &rec));
            CHECK(rec < plain, "%s batch %d: recomputing plans %zu bytes, plain %zu", arch[a], batch[b], rec, plain);
            saved[b] = plain > rec ? plain - rec : 0;
            rn_net *net = NULL;
            CHECK_OK(rn_net_create(be, &spec, batch[b], 64, 64, RN_NET_TRAIN | RN_NET_RECOMPUTE, RN_F32, &net));
            if (net)
                CHECK(rn_net_bytes(net) == rec, "%s batch %d: holds %zu, planned %zu", arch[a], batch[b],
                      rn_net_bytes(net), rec);
            rn_net_destroy(net);
            rn_backend_destroy(be);
        }
        CHECK(saved[1] > saved[0], "%s: saves %zu bytes at batch 8, %zu at 2", arch[a], saved[1], saved[0]);
        /* ResNet-50 at 224x224: the numbers README quotes (bytes per image, from the plan) */
        rn_backend *be = NULL;
        if (a == 1) CHECK_OK(rn_backend_create("cpu", 2, NULL, &be));
        if (be) {
            size_t p1, p2, r1, r2;
            CHECK_OK(rn_net_plan(be, &spec, 1, 224, 224, RN_NET_TRAIN, RN_F32, &p1));
            CHECK_OK(rn_net_plan(be, &spec, 2, 224, 224, RN_NET_TRAIN, RN_F32, &p2));
            CHECK_OK(rn_net_plan(be, &spec, 1, 224, 224, RN_NET_TRAIN | RN_NET_RECOMPUTE, RN_F32, &r1));
            CHECK_OK(rn_net_plan(be, &spec, 2, 224, 224, RN_NET_TRAIN | RN_NET_RECOMPUTE, RN_F32, &r2));
            printf("resnet50 224x224 fp32 training, per image: %.1f MiB plain, %.1f MiB recomputing blocks "
                   "(fixed: %.1f MiB, %.1f MiB)\n",
                   (p2 - p1) / 1048576.0, (r2 - r1) / 1048576.0, (2 * p1 - p2) / 1048576.0, (2 * r1 - r2) / 1048576.0);
            CHECK(r2 - r1 < p2 - p1, "per image: %zu recomputing, %zu plain", r2 - r1, p2 - p1);
        }
        rn_backend_destroy(be);
    }
}

/* Inference nets refuse the flag; a recomputing net shows block outputs only. */
static void test_refusals(void) {
    rn_resnet spec;
    rn_backend *be = NULL;
    rn_net *net = NULL;
    size_t bytes;
    CHECK_OK(rn_resnet_build(&spec, "resnet18", CLASSES));
    CHECK_OK(rn_backend_create("cpu", 2, NULL, &be));
    if (!be) return;
    CHECK(rn_net_create(be, &spec, 2, SIZE, SIZE, RN_NET_INFER | RN_NET_RECOMPUTE, RN_F32, &net) == RN_EINVAL && !net,
          "an inference net with RN_NET_RECOMPUTE");
    CHECK(strstr(rn_last_error(), "training networks only") != NULL, "message: %s", rn_last_error());
    CHECK(rn_net_plan(be, &spec, 2, SIZE, SIZE, RN_NET_INFER_EXACT | RN_NET_RECOMPUTE, RN_F32, &bytes) == RN_EINVAL,
          "planning an inference net with RN_NET_RECOMPUTE");
    rn_ckpt *init = NULL;
    CHECK_OK(rn_ckpt_new(&spec, &init));
    if (init) CHECK_OK(rn_ckpt_init(init, &spec, 3, 0));
    rn_net *plain = init ? make_net(be, &spec, init, 0, PLAIN) : NULL;
    net = init ? make_net(be, &spec, init, 1, PLAIN) : NULL;
    if (net && plain) {
        for (int k = 0; k < 2; k++) {
            rn_net *n = k ? net : plain;
            CHECK_OK(rn_input_normalize(be, RN_F32, (int64_t)(BATCH / 2) * SIZE * SIZE, 3, px, RN_IMAGENET_MEAN,
                                        RN_IMAGENET_STD, rn_net_input(n)));
            CHECK_OK(rn_net_forward(n, BATCH / 2, 1));
        }
        int64_t shape[4];
        const rn_block *blk = &spec.blocks[1];
        CHECK(rn_net_unit_output(net, blk->conv[0], NULL, shape) == RN_ENOTSUP, "an inner unit's output");
        CHECK(strstr(rn_last_error(), "block outputs") != NULL, "message: %s", rn_last_error());
        int last = blk->conv[blk->nconv - 1];
        CHECK_OK(rn_net_unit_output(net, last, NULL, shape));
        int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
        if (a && b) {
            CHECK_OK(rn_net_unit_output(net, last, a, shape));
            CHECK_OK(rn_net_unit_output(plain, last, b, shape));
            CHECK(memcmp(a, b, sizeof(float) * (size_t)n) == 0, "block output of %s", spec.units[last].bn);
        }
        free(a);
        free(b);
    }
    rn_net_destroy(plain);
    rn_net_destroy(net);
    rn_ckpt_free(init);
    rn_backend_destroy(be);
}

int main(void) {
    float u[BATCH * SIZE * SIZE * 3 + BATCH];
    rn_rng_uniform(rn_rng_key(20261203u, 15), u, (int64_t)(sizeof u / sizeof *u), 0, 1);
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (uint8_t)(u[i] * 255.99f);
    for (int i = 0; i < BATCH; i++)
        labels[i] = (int32_t)(u[sizeof px + i] * CLASSES) % CLASSES;
    for (int t = 1; t <= 3; t++)
        test_same_bits("resnet50", t, PLAIN);
    test_same_bits("resnet18", 2, PLAIN);
    for (int v = FROZEN; v <= SYNC; v++) {
        test_same_bits("resnet18", 3, v);
        test_same_bits("resnet50", 2, v);
    }
    test_memory();
    test_refusals();
    return check_done("test_recompute");
}
