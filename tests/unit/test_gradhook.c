/* rn_net_set_grad_hook (lib/net.c), what the overlapped gradient sum stands on, on the
 * CPU: over two micro-batches (the second accumulating, as rn-train's last one does),
 * - every parameter tensor is reported exactly once;
 * - a reported range already holds its final value (the same bits as after the backward);
 * - the gradients are the bits of the same backward without the hook;
 * - the hook's error stops the backward and is returned. */
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

#define CLASSES 10
#define SIZE 32
#define MICRO 2

typedef struct {
    const float *g; /* (n) rn_net_grads before the backward (inside it, under accumulate, the
                       net's own pointer is the micro-batch's spare buffer) */
    int64_t n, calls, floats, first_off, last_off;
    float *snap;    /* (n) each range as it was when reported */
    uint8_t *seen;  /* (n) elements reported */
    int fail_at;    /* return an error at this call (0: never) */
} hook_log;

static int hook(void *ctx, int64_t off, int64_t numel) {
    hook_log *h = ctx;
    int64_t n = h->n;
    const float *g = h->g;
    h->calls++;
    if (h->calls == h->fail_at) return rn_errorf(RN_EIO, "the hook's own error");
    if (h->calls == 1) h->first_off = off;
    h->last_off = off;
    CHECK(off >= 0 && numel > 0 && off + numel <= n, "hook range [%lld, +%lld) outside %lld", (long long)off,
          (long long)numel, (long long)n);
    int64_t twice = 0;
    for (int64_t i = off; i < off + numel && off >= 0 && off + numel <= n; i++) {
        twice += h->seen[i];
        h->seen[i] = 1;
        h->snap[i] = g[i];
    }
    CHECK(twice == 0, "[%lld, +%lld): %lld elements reported twice", (long long)off, (long long)numel,
          (long long)twice);
    h->floats += numel;
    return RN_OK;
}

/* Two micro-batches of MICRO images through a fresh net, the second accumulating, with
 * the hook on it when h is given; the gradients into a malloc'ed *out. */
static int run(const rn_resnet *spec, const rn_ckpt *init, const uint8_t *px, const int32_t *labels, hook_log *h,
               float **out, int64_t *nout) {
    rn_backend *be = NULL;
    rn_net *net = NULL;
    int rc = RN_OK;
    float loss;
    *out = NULL;
    CHECK_OK(rn_backend_create("cpu", 1, NULL, &be));
    if (be) CHECK_OK(rn_net_create(be, spec, MICRO, SIZE, SIZE, RN_NET_TRAIN, RN_F32, &net));
    if (!net) goto done;
    CHECK_OK(rn_net_load(net, init));
    for (int k = 0; k < 2 && rc == RN_OK; k++) {
        CHECK_OK(rn_input_normalize(be, RN_F32, (int64_t)MICRO * SIZE * SIZE, 3, px + (size_t)k * MICRO * SIZE * SIZE * 3,
                                    RN_IMAGENET_MEAN, RN_IMAGENET_STD, rn_net_input(net)));
        CHECK_OK(rn_net_forward(net, MICRO, 1));
        if (h && k == 1) {
            h->g = rn_net_grads(net, &h->n);
            rn_net_set_grad_hook(net, hook, h);
        }
        rc = rn_net_backward(net, labels + k * MICRO, MICRO, 0.0f, 0.5f, k > 0, &loss);
        rn_net_set_grad_hook(net, NULL, NULL);
    }
    const float *g = rn_net_grads(net, nout);
    if ((*out = malloc(sizeof(float) * (size_t)*nout))) memcpy(*out, g, sizeof(float) * (size_t)*nout);
done:
    rn_net_destroy(net);
    rn_backend_destroy(be);
    return rc;
}

int main(void) {
    rn_resnet spec;
    rn_ckpt *init = NULL;
    CHECK_OK(rn_resnet_build(&spec, "resnet18", CLASSES));
    CHECK_OK(rn_ckpt_new(&spec, &init));
    if (!init) return check_done("test_gradhook");
    CHECK_OK(rn_ckpt_init(init, &spec, 5, 0));
    static uint8_t px[2 * MICRO * SIZE * SIZE * 3];
    static float u[sizeof px + 2 * MICRO];
    int32_t labels[2 * MICRO];
    rn_rng_uniform(rn_rng_key(20261203u, 1), u, (int64_t)(sizeof u / sizeof *u), 0, 1);
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(u[i] * 255.99f);
    for (int i = 0; i < 2 * MICRO; i++) labels[i] = (int32_t)(u[sizeof px + i] * CLASSES) % CLASSES;

    float *plain = NULL, *hooked = NULL;
    int64_t n = 0, n2 = 0;
    CHECK_OK(run(&spec, init, px, labels, NULL, &plain, &n));
    /* what the memory plan counts for buffers of the gradients' size, without a net */
    int64_t np = 0, ns = 0;
    CHECK_OK(rn_net_param_floats(&spec, &np, &ns));
    CHECK(np == n && ns == 9600, "rn_net_param_floats: %lld and %lld floats; the net's gradients %lld, resnet18's "
          "BN statistics 9600", (long long)np, (long long)ns, (long long)n);
    hook_log h = {.snap = calloc((size_t)n, sizeof(float)), .seen = calloc((size_t)n, 1)};
    CHECK_OK(run(&spec, init, px, labels, &h, &hooked, &n2));
    CHECK(n == n2 && plain && hooked && h.snap && h.seen, "two nets of %lld and %lld floats", (long long)n,
          (long long)n2);
    if (n == n2 && plain && hooked && h.snap && h.seen) {
        int64_t params = 0, bad = 0, early = 0;
        for (size_t i = 0; i < init->n_params; i++) params += rn_numel(init->params[i]->shape, init->params[i]->n_shape);
        CHECK(h.calls == (int64_t)init->n_params, "%lld hook calls for %zu tensors", (long long)h.calls,
              init->n_params);
        CHECK(h.floats == params, "%lld floats reported of %lld", (long long)h.floats, (long long)params);
        for (int64_t i = 0; i < n; i++) {
            bad += memcmp(&plain[i], &hooked[i], sizeof(float)) != 0;
            early += h.seen[i] && memcmp(&h.snap[i], &hooked[i], sizeof(float)) != 0;
        }
        CHECK(bad == 0, "with the hook %lld of %lld gradients differ from the plain backward", (long long)bad,
              (long long)n);
        CHECK(early == 0, "%lld gradients changed after they were reported final", (long long)early);
        /* the fc first (its weight is the last conv-or-fc weight, its bias the last
           tensor of all: neither at 0, where conv1.weight is, reported with the stem last) */
        CHECK(h.first_off > 0, "the first tensor reported is at %lld", (long long)h.first_off);
        CHECK(h.seen[0] && h.last_off != h.first_off, "the stem: seen %d, last at %lld", h.seen[0],
              (long long)h.last_off);
    }
    /* the hook's error is the backward's */
    hook_log f = {.snap = calloc((size_t)n, sizeof(float)), .seen = calloc((size_t)n, 1), .fail_at = 3};
    float *junk = NULL;
    int64_t nj = 0;
    int rc = run(&spec, init, px, labels, &f, &junk, &nj);
    CHECK(rc == RN_EIO && strstr(rn_last_error(), "the hook's own error"), "a failing hook: rc %d (%s)", rc,
          rn_last_error());
    CHECK(f.calls == 3, "the backward went on after the hook failed: %lld calls", (long long)f.calls);
    free(junk);
    free(f.snap);
    free(f.seen);
    free(h.snap);
    free(h.seen);
    free(plain);
    free(hooked);
    rn_ckpt_free(init);
    return check_done("test_gradhook");
}
