/* Synchronised BatchNorm (rn_net_set_sync, lib/net.c) on the CPU, without MPI: two
 * threads play two ranks, each with its own backend and net over half of a batch, their
 * gather a barrier over shared memory. Checks, against one net over the whole batch with
 * plain BN (batch statistics over all of it):
 * - the mean of the two ranks' losses is the batch's loss;
 * - the sum of the two ranks' gradients (as rn_dist_sum adds them) is every gradient of
 *   the batch: through dx's correction with the global sums every layer below a BN
 *   depends on it, so a wrong term shows at conv1;
 * - both ranks' running statistics are the batch's, and num_batches_tracked counts one;
 * - a world of one with a copying gather computes what plain BN does.
 * Float sums in another order: tolerances relative, a few float32 roundoffs deep.
 * usage: test_syncbn [DEVICE] (default cpu; cuda runs both ranks on one GPU, measured
 * only on the CPU so far). */
#include <pthread.h>
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
#include "rn/tensor.h"

#define ARCH "resnet18"
#define CLASSES 10
#define SIZE 48
#define BATCH 8
#define WORLD 2
#define TOL 2e-4 /* relative L2 per tensor (measured: 4e-6 at worst) */

static const char *device = "cpu";
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

/* The state of one net after a step's forward and backward: its loss, every gradient
 * (torchvision names and order) and the stored checkpoint (weights, BN buffers). */
typedef struct {
    float loss;
    float *grads;
    int64_t ngrads;
    rn_ckpt *ck;
} result;

static void result_free(result *r) {
    free(r->grads);
    rn_ckpt_free(r->ck);
}

/* A net over images [first, first+n), optionally synchronised, one forward and backward
 * with the loss times grad_scale; the result into *r. */
static void run_net(int first, int n, float grad_scale, int world, rn_net_gather_fn gather, void *ctx, result *r) {
    memset(r, 0, sizeof *r);
    rn_backend *be = NULL;
    rn_net *net = NULL;
    CHECK_OK(rn_backend_create(device, 1, NULL, &be));
    if (be) CHECK_OK(rn_net_create(be, &spec, n, SIZE, SIZE, RN_NET_TRAIN, RN_F32, &net));
    if (net) {
        CHECK_OK(rn_net_load(net, init));
        if (gather) CHECK_OK(rn_net_set_sync(net, world, gather, ctx));
        CHECK_OK(rn_input_normalize(be, RN_F32, (int64_t)n * SIZE * SIZE, 3, px + (size_t)first * SIZE * SIZE * 3,
                                    RN_IMAGENET_MEAN, RN_IMAGENET_STD, rn_net_input(net)));
        CHECK_OK(rn_net_forward(net, n, 1));
        CHECK_OK(rn_net_backward(net, labels + first, n, 0.0f, grad_scale, 0, &r->loss));
        CHECK_OK(rn_ckpt_new(&spec, &r->ck));
        if (r->ck) {
            CHECK_OK(rn_net_store(net, r->ck));
            for (size_t i = 0; i < r->ck->n_params; i++)
                r->ngrads += rn_numel(r->ck->params[i]->shape, r->ck->params[i]->n_shape);
            r->grads = calloc((size_t)r->ngrads, sizeof(float));
            float *at = r->grads;
            for (size_t i = 0; r->grads && i < r->ck->n_params; i++) {
                int64_t k = rn_numel(r->ck->params[i]->shape, r->ck->params[i]->n_shape);
                CHECK_OK(rn_net_grad(net, r->ck->params[i]->name, at, k));
                at += k;
            }
        }
    }
    rn_net_destroy(net);
    rn_backend_destroy(be);
}

/* ---- two ranks as threads: the gather is a barrier over one shared table ---- */
typedef struct {
    pthread_barrier_t bar;
    const void *part[WORLD];
    size_t bytes[WORLD];
    int bad;
} table;

typedef struct {
    table *t;
    int rank;
    result r;
} rank_ctx;

static int gather(void *ctx, const void *mine, size_t bytes, void *all) {
    rank_ctx *c = ctx;
    table *t = c->t;
    t->part[c->rank] = mine;
    t->bytes[c->rank] = bytes;
    pthread_barrier_wait(&t->bar);
    for (int r = 0; r < WORLD; r++) {
        if (t->bytes[r] != bytes)
            t->bad = 1;
        else
            memcpy((char *)all + (size_t)r * bytes, t->part[r], bytes);
    }
    /* nobody overwrites its part before everyone has copied it */
    pthread_barrier_wait(&t->bar);
    return RN_OK;
}

static int copy1(void *ctx, const void *mine, size_t bytes, void *all) {
    (void)ctx;
    memcpy(all, mine, bytes);
    return RN_OK;
}

static void *rank_main(void *arg) {
    rank_ctx *c = arg;
    /* rank r's slice; each rank's loss is its slice's mean, so 1/WORLD makes the sum the batch's */
    run_net(c->rank * (BATCH / WORLD), BATCH / WORLD, 1.0f / WORLD, WORLD, gather, c, &c->r);
    return NULL;
}

/* every tensor of a against b within TOL (buffers: num_batches_tracked exactly) */
static void compare_ckpt(const char *what, const rn_ckpt *a, const rn_ckpt *b) {
    for (size_t i = 0; i < a->n_buffers; i++) {
        const rn_ptensor *x = a->buffers[i], *y = b->buffers[i];
        const float *xf = rn_ptensor_f32(x), *yf = rn_ptensor_f32(y);
        if (!xf) {
            CHECK(x->data.len == y->data.len && memcmp(x->data.data, y->data.data, x->data.len) == 0, "%s: %s", what,
                  x->name);
            continue;
        }
        double e = rel_l2(xf, yf, rn_numel(x->shape, x->n_shape));
        CHECK(e <= TOL, "%s: %s: relative error %.3g", what, x->name, e);
    }
}

static void compare_grads(const char *what, const float *g, const result *ref) {
    float *at = ref->grads;
    const float *gat = g;
    double worst = 0;
    for (size_t i = 0; i < ref->ck->n_params; i++) {
        int64_t k = rn_numel(ref->ck->params[i]->shape, ref->ck->params[i]->n_shape);
        double e = rel_l2(gat, at, k);
        if (e > worst) worst = e;
        CHECK(e <= TOL, "%s: gradient of %s: relative error %.3g", what, ref->ck->params[i]->name, e);
        at += k, gat += k;
    }
    printf("%s: worst gradient relative error %.3g\n", what, worst);
}

int main(int argc, char **argv) {
    if (argc > 1) device = argv[1];
    CHECK_OK(rn_resnet_build(&spec, ARCH, CLASSES));
    CHECK_OK(rn_ckpt_new(&spec, &init));
    if (!init) return check_done("test_syncbn");
    CHECK_OK(rn_ckpt_init(init, &spec, 7, 0));
    /* The data decides whether some activation lies within rounding of a ReLU's kink, and
       one that does lands on either side depending on the order of every sum before it:
       the gradients below it then move by O(1) at a few positions (about 2e-2 of relative
       L2), more than any rounding tolerance. With the data of seed 20260611 the plain net
       on rn's GEMM kernel and the same net through OpenBLAS differed so at layer1 and
       below (0.0237), the synchronised net siding with OpenBLAS (3.4e-6); over seeds 1-8
       about half hold such an activation, on either kernel. rn's kernel gives the same
       bits on every x86-64 CPU with AVX2 and FMA, so seed 1, which holds none for it, does
       so everywhere. A change to the kernel's summation order can bring one into reach
       again: if this test then fails from some layer down by about 1e-2, run the plain
       net through OpenBLAS (rn_backend_opts.cpu_gemm) as a second reference
       before suspecting synchronised BN. */
    static float u[BATCH * SIZE * SIZE * 3 + BATCH];
    rn_rng_uniform(rn_rng_key(1u, 1), u, (int64_t)(sizeof u / sizeof *u), 0, 1);
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (uint8_t)(u[i] * 255.99f);
    for (int i = 0; i < BATCH; i++)
        labels[i] = (int32_t)(u[sizeof px + i] * CLASSES) % CLASSES;

    result whole, one;
    run_net(0, BATCH, 1.0f, 1, NULL, NULL, &whole);
    run_net(0, BATCH, 1.0f, 1, copy1, NULL, &one);
    if (whole.grads && one.grads) {
        CHECK(fabsf(one.loss - whole.loss) <= 1e-5f * whole.loss, "world 1: loss %.8g, plain %.8g", one.loss,
              whole.loss);
        compare_grads("world 1", one.grads, &whole);
        compare_ckpt("world 1", one.ck, whole.ck);
    }

    table t = {0};
    pthread_barrier_init(&t.bar, NULL, WORLD);
    rank_ctx rk[WORLD];
    pthread_t th[WORLD];
    for (int r = 0; r < WORLD; r++) {
        rk[r] = (rank_ctx){.t = &t, .rank = r};
        pthread_create(&th[r], NULL, rank_main, &rk[r]);
    }
    for (int r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&t.bar);
    CHECK(!t.bad, "the ranks gathered different sizes");
    if (whole.grads && rk[0].r.grads && rk[1].r.grads) {
        float loss = (rk[0].r.loss + rk[1].r.loss) / 2;
        CHECK(fabsf(loss - whole.loss) <= 1e-5f * whole.loss, "2 ranks: loss %.8g, one process %.8g", loss, whole.loss);
        float *sum = malloc(sizeof(float) * (size_t)whole.ngrads);
        for (int64_t i = 0; sum && i < whole.ngrads; i++)
            sum[i] = rk[0].r.grads[i] + rk[1].r.grads[i];
        if (sum) compare_grads("2 ranks", sum, &whole);
        free(sum);
        compare_ckpt("2 ranks: rank 0", rk[0].r.ck, whole.ck);
        compare_ckpt("2 ranks: rank 1", rk[1].r.ck, whole.ck);
        /* without synchronisation each rank's statistics are its half's: far off */
        result alone;
        run_net(0, BATCH / WORLD, 1.0f / WORLD, 1, NULL, NULL, &alone);
        if (alone.grads) {
            double e = rel_l2(alone.grads, rk[0].r.grads, whole.ngrads);
            CHECK(e > 100 * TOL, "per-rank BN should differ: %.3g", e);
            printf("per-rank BN against synchronised, rank 0's gradients: relative error %.3g\n", e);
        }
        result_free(&alone);
    }
    for (int r = 0; r < WORLD; r++)
        result_free(&rk[r].r);
    result_free(&whole);
    result_free(&one);

    /* an inference net refuses */
    rn_backend *be = NULL;
    rn_net *net = NULL;
    CHECK_OK(rn_backend_create(device, 1, NULL, &be));
    if (be) CHECK_OK(rn_net_create(be, &spec, 2, SIZE, SIZE, RN_NET_INFER, RN_F32, &net));
    if (net) CHECK(rn_net_set_sync(net, 1, copy1, NULL) == RN_EINVAL, "inference net with sync BN");
    rn_net_destroy(net);
    rn_backend_destroy(be);
    rn_ckpt_free(init);
    return check_done("test_syncbn");
}
