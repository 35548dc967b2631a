/* Graph replays (rn/replay.h, lib/replay.c) and the graph calls of rn/backend.h, on the
 * CPU: the CPU backend has no graphs, so a test backend does what a CUDA capture does
 * with its copies (recorded while capturing, run again at each launch) and can be told to
 * fail a capture. Checks: eager the first time a key is met, captured the second, then
 * replayed without calling the work (the replay copies what the buffers hold now); a new
 * key, or the backend's memory moved (a workspace reserved anew), runs eagerly again and
 * frees the old graph; a capture that fails (the work's error
 * inside it, the backend's at its end, a download inside it) turns graphs off, says why,
 * runs the work eagerly and ends the capture; a backend without graphs always runs
 * eagerly; the calls' own refusals. And rn_net_count_by_caller: a net whose caller counts
 * its batches with rn_net_count_batch ends with the checkpoint of one that counts them
 * itself, for plain and frozen BN. rn_net_set_mix_at: the training loss reads its mixing
 * weight from memory, the same bits as the argument, and the evaluation loss never. The
 * optimiser step captured as rn-train --cuda-graphs captures it (the test backend records
 * its zeroing, overflow check and SGD too): rn_net_step's bits at every step, with a new
 * rate each step and an overflow met by a replay. The first step after a load without
 * momentum, SGD and LARS: buffers an earlier step filled give the bits of zero ones. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/backend_impl.h"
#include "rn/ckpt.h"
#include "rn/err.h"
#include "rn/loader.h"
#include "rn/net.h"
#include "rn/replay.h"
#include "rn/resnet.h"
#include "rn/state.h"
#include "rn/scaler.h"
#include "rn/tensor.h"

/* ---- a backend with graphs: the CPU's ops, its copies recordable ---- */

enum { MAXREC = 64 };
/* a recorded op: a copy, or (the optimiser step's) a zeroing, an overflow check, an SGD
   or LARS update */
enum { REC_COPY = 0, REC_ZERO, REC_NONFINITE, REC_SGD, REC_LARS };
typedef struct {
    int kind;
    void *dst;
    const void *src;
    size_t bytes;
    rn_sgd_desc sgd; /* REC_SGD: dst p, src grad, buf, copy, n; REC_NONFINITE: src x, dst flag, n */
    rn_lars_desc lars; /* REC_LARS: as REC_SGD */
    float *buf;
    void *copy;
    int64_t n;
} rec_copy;

struct rn_graph {
    rec_copy ops[MAXREC];
    int n;
};

static const rn_backend_ops *cpu;
static rn_backend_ops fake;
static rec_copy recorded[MAXREC];
static int nrecorded, capturing_now, fail_end, begins, ends, launches, frees;

static int record(rec_copy op) {
    if (nrecorded == MAXREC) return rn_errorf(RN_EINVAL, "fake: more than %d ops in a capture", MAXREC);
    recorded[nrecorded++] = op;
    return RN_OK;
}

static int fake_copy(rn_backend *be, void *dst, const void *src, size_t bytes) {
    if (!capturing_now) return cpu->copy(be, dst, src, bytes);
    return record((rec_copy){.kind = REC_COPY, .dst = dst, .src = src, .bytes = bytes});
}

static int fake_zero(rn_backend *be, void *dst, size_t bytes) {
    if (!capturing_now) return cpu->zero(be, dst, bytes);
    return record((rec_copy){.kind = REC_ZERO, .dst = dst, .bytes = bytes});
}

static int fake_nonfinite(rn_backend *be, int64_t n, const float *x, int32_t *flag) {
    if (!capturing_now) return cpu->nonfinite(be, n, x, flag);
    return record((rec_copy){.kind = REC_NONFINITE, .dst = flag, .src = x, .n = n});
}

/* (a capture holds the descriptor by value, its lr_at and skip_if pointers read when the
   graph runs: CUDA's kernel arguments) */
static int fake_sgd(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p, const float *grad, float *buf,
                    void *copy) {
    if (!capturing_now) return cpu->sgd_update(be, d, n, p, grad, buf, copy);
    return record((rec_copy){.kind = REC_SGD, .sgd = *d, .dst = p, .src = grad, .buf = buf, .copy = copy, .n = n});
}

static int fake_begin(rn_backend *be) {
    (void)be;
    begins++;
    capturing_now = 1;
    nrecorded = 0;
    return RN_OK;
}

static int fake_end(rn_backend *be, int keep, rn_graph **out, int64_t *nodes) {
    (void)be;
    ends++;
    capturing_now = 0;
    if (fail_end) return rn_errorf(RN_EGPU, "fake: the capture was invalidated");
    if (!keep) return RN_OK;
    rn_graph *g = calloc(1, sizeof *g);
    if (!g) return RN_ENOMEM;
    memcpy(g->ops, recorded, sizeof recorded);
    g->n = nrecorded;
    *out = g;
    *nodes = nrecorded;
    return RN_OK;
}

static int fake_launch(rn_backend *be, rn_graph *g) {
    launches++;
    for (int i = 0; i < g->n; i++) {
        const rec_copy *o = &g->ops[i];
        int rc = o->kind == REC_COPY        ? cpu->copy(be, o->dst, o->src, o->bytes)
                 : o->kind == REC_ZERO      ? cpu->zero(be, o->dst, o->bytes)
                 : o->kind == REC_NONFINITE ? cpu->nonfinite(be, o->n, o->src, o->dst)
                 : o->kind == REC_SGD       ? cpu->sgd_update(be, &o->sgd, o->n, o->dst, o->src, o->buf, o->copy)
                                            : cpu->lars_update(be, &o->lars, o->n, o->dst, o->src, o->buf, o->copy);
        if (rc) return rc;
    }
    return RN_OK;
}

static void fake_free(rn_backend *be, rn_graph *g) {
    (void)be;
    frees++;
    free(g);
}

static int fake_lars(rn_backend *be, const rn_lars_desc *d, int64_t n, float *p, const float *grad, float *buf,
                     void *copy) {
    if (!capturing_now) return cpu->lars_update(be, d, n, p, grad, buf, copy);
    return record((rec_copy){.kind = REC_LARS, .lars = *d, .dst = p, .src = grad, .buf = buf, .copy = copy, .n = n});
}

/* the test backend's ops: c's (the CPU's), with graphs */
static void fake_init(const rn_backend_ops *c) {
    cpu = c;
    fake = *cpu;
    fake.copy = fake_copy;
    fake.zero = fake_zero;
    fake.nonfinite = fake_nonfinite;
    fake.sgd_update = fake_sgd;
    fake.lars_update = fake_lars;
    fake.capture_begin = fake_begin;
    fake.capture_end = fake_end;
    fake.graph_launch = fake_launch;
    fake.graph_free = fake_free;
}

/* ---- the work: copy src to dst; host calls counted ---- */

typedef struct {
    rn_backend *be;
    float src[4], dst[4];
    int calls;
    int fail_in_capture; /* 1: an error of its own inside a capture; 2: a download there
                            (refused there); 3: an error every time */
} work;

static int do_work(void *ctx) {
    work *w = ctx;
    w->calls++;
    if (w->fail_in_capture == 1 && w->be->capturing) return rn_errorf(RN_EINVAL, "the work fails in a capture");
    if (w->fail_in_capture == 3) return rn_errorf(RN_EIO, "the work fails");
    if (w->fail_in_capture == 2) {
        float host = 0;
        int rc = rn_backend_download(w->be, &host, w->src, sizeof host);
        if (rc) return rc;
    }
    return rn_backend_copy(w->be, w->dst, w->src, sizeof w->src);
}

static void set_src(work *w, float v) {
    for (int i = 0; i < 4; i++)
        w->src[i] = v + (float)i;
}

static int copied(const work *w) { return memcmp(w->src, w->dst, sizeof w->src) == 0; }

static void test_replay(void) {
    rn_backend *be = NULL;
    CHECK_OK(rn_backend_create("cpu", 1, NULL, &be));
    if (!be) return;
    CHECK(!rn_backend_has_graphs(be), "the CPU backend has no graphs");
    CHECK(rn_backend_capture_begin(be) == RN_ENOTSUP, "capture_begin on the CPU: RN_ENOTSUP");
    /* the same work on the plain CPU backend: eager every time */
    work w = {.be = be};
    rn_replay r = {0};
    for (int i = 0; i < 3; i++) {
        int how = -1;
        set_src(&w, 10.0f * (float)i);
        CHECK_OK(rn_replay_run(&r, be, "k", 1, do_work, &w, &how));
        CHECK(how == RN_REPLAY_EAGER && copied(&w), "no graphs: run %d eager (how %d)", i + 1, how);
    }
    CHECK(w.calls == 3 && r.eager == 3 && !r.graph && !r.off, "no graphs: 3 eager runs, %d calls", w.calls);
    rn_replay_reset(&r, be);

    fake_init(be->ops);
    be->ops = &fake;
    CHECK(rn_backend_has_graphs(be), "the test backend has graphs");
    CHECK(rn_backend_capture_end(be, 0, NULL, NULL) == RN_EINVAL, "capture_end without a capture: RN_EINVAL");
    CHECK(rn_backend_graph_launch(be, NULL) == RN_EINVAL, "launch of no graph: RN_EINVAL");
    CHECK_OK(rn_backend_capture_begin(be));
    CHECK(rn_backend_capture_begin(be) == RN_EINVAL, "a second capture_begin: RN_EINVAL");
    float host = 0;
    CHECK(rn_backend_download(be, &host, w.src, sizeof host) == RN_EINVAL &&
              strstr(rn_last_error(), "while a graph is being captured"),
          "a download inside a capture is refused by name: %s", rn_last_error());
    CHECK(rn_backend_sync(be) == RN_EINVAL, "a sync inside a capture is refused");
    CHECK(rn_backend_put(be, w.dst, &host, sizeof host) == RN_EINVAL, "a put inside a capture is refused");
    CHECK_OK(rn_backend_capture_end(be, 0, NULL, NULL));
    CHECK(!be->capturing && begins == 1 && ends == 1, "the capture ended");
    CHECK_OK(rn_backend_capture_begin(be));
    CHECK(rn_backend_capture_end(be, 1, NULL, NULL) == RN_EINVAL && !be->capturing && ends == 2,
          "keep without a place for the graph: RN_EINVAL, the capture ended all the same");
    begins = ends = 1; /* (the checks below count from one capture, as before this one) */

    /* key A: eager, captured, replayed */
    w = (work){.be = be};
    r = (rn_replay){0};
    int how = -1;
    set_src(&w, 1);
    CHECK_OK(rn_replay_run(&r, be, "A", 1, do_work, &w, &how));
    CHECK(how == RN_REPLAY_EAGER && w.calls == 1 && copied(&w) && begins == 1, "key A, run 1: eager (how %d)", how);
    set_src(&w, 2);
    CHECK_OK(rn_replay_run(&r, be, "A", 1, do_work, &w, &how));
    CHECK(how == RN_REPLAY_CAPTURED && w.calls == 2 && begins == 2 && launches == 1 && r.nodes == 1,
          "key A, run 2: captured and launched (how %d, %lld nodes)", how, (long long)r.nodes);
    CHECK(copied(&w), "the captured run's copy was done by its launch");
    for (int i = 3; i <= 5; i++) {
        set_src(&w, (float)i);
        CHECK_OK(rn_replay_run(&r, be, "A", 1, do_work, &w, &how));
        CHECK(how == RN_REPLAY_REPLAYED && w.calls == 2 && copied(&w), "key A, run %d: replayed (how %d, %d calls)", i,
              how, w.calls);
    }
    CHECK(r.eager == 1 && r.captures == 1 && r.replays == 3 && launches == 4 && begins == 2, "counts: %lld %lld %lld",
          (long long)r.eager, (long long)r.captures, (long long)r.replays);
    /* the backend's memory moved (a workspace reserved anew): the graph is stale */
    CHECK_OK(rn_backend_reserve(be, be->ws_bytes + 4096));
    set_src(&w, 5.5f);
    CHECK_OK(rn_replay_run(&r, be, "A", 1, do_work, &w, &how));
    CHECK(how == RN_REPLAY_EAGER && frees == 1 && !r.graph && copied(&w), "moved memory: eager, the graph freed");
    set_src(&w, 5.75f);
    CHECK_OK(rn_replay_run(&r, be, "A", 1, do_work, &w, &how));
    CHECK(how == RN_REPLAY_CAPTURED && copied(&w), "moved memory, run 2: captured again");
    set_src(&w, 5.875f);
    CHECK_OK(rn_replay_run(&r, be, "A", 1, do_work, &w, &how));
    CHECK(how == RN_REPLAY_REPLAYED && copied(&w), "moved memory, run 3: replayed");
    /* key B: eager again (the old graph freed), then captured */
    set_src(&w, 6);
    CHECK_OK(rn_replay_run(&r, be, "B", 1, do_work, &w, &how));
    CHECK(how == RN_REPLAY_EAGER && frees == 2 && !r.graph && copied(&w), "key B: eager, A's graph freed");
    set_src(&w, 7);
    CHECK_OK(rn_replay_run(&r, be, "B", 1, do_work, &w, &how));
    CHECK(how == RN_REPLAY_CAPTURED && copied(&w), "key B, run 2: captured");
    /* a key of another length is another key */
    CHECK_OK(rn_replay_run(&r, be, "BB", 2, do_work, &w, &how));
    CHECK(how == RN_REPLAY_EAGER && frees == 3, "key BB after B: eager");
    unsigned char big[RN_REPLAY_KEY + 1] = {0};
    CHECK(rn_replay_run(&r, be, big, sizeof big, do_work, &w, &how) == RN_EINVAL, "an oversized key: RN_EINVAL");
    rn_replay_reset(&r, be);
    CHECK(frees == 3 && !r.graph, "reset without a graph frees nothing");

    /* captures that fail: the work's error, the backend's, a download inside */
    for (int mode = 0; mode < 3; mode++) {
        w = (work){.be = be, .fail_in_capture = mode == 0 ? 1 : mode == 2 ? 2 : 0};
        r = (rn_replay){0};
        fail_end = mode == 1;
        int e0 = ends;
        set_src(&w, 20);
        CHECK_OK(rn_replay_run(&r, be, "C", 1, do_work, &w, &how));
        set_src(&w, 21);
        CHECK_OK(rn_replay_run(&r, be, "C", 1, do_work, &w, &how));
        CHECK(how == RN_REPLAY_EAGER && r.off && copied(&w) && w.calls == 3,
              "failure %d: the run after the failed capture is eager (how %d, %d calls)", mode, how, w.calls);
        CHECK(ends == e0 + 1 && !be->capturing && !r.graph, "failure %d: the capture was ended", mode);
        const char *want = mode == 0   ? "the work fails in a capture"
                           : mode == 1 ? "invalidated"
                                       : "while a graph is being captured";
        CHECK(strstr(r.why, want) != NULL, "failure %d: why says '%s': %s", mode, want, r.why);
        int b0 = begins;
        set_src(&w, 22);
        CHECK_OK(rn_replay_run(&r, be, "C", 1, do_work, &w, &how));
        CHECK(how == RN_REPLAY_EAGER && begins == b0 && copied(&w), "failure %d: off for good", mode);
    }
    fail_end = 0;
    /* an eager error is the caller's */
    w = (work){.be = be, .fail_in_capture = 3};
    r = (rn_replay){0};
    CHECK(rn_replay_run(&r, be, "D", 1, do_work, &w, &how) == RN_EIO && !r.seen && !r.off,
          "an eager failure is returned");
    be->ops = cpu;
    rn_backend_destroy(be);
}

/* ---- rn_net_count_by_caller ---- */

enum { BATCH = 4, SIZE = 32, CLASSES = 3 };

static int64_t tracked(const rn_ckpt *c, const char *name) {
    const rn_ptensor *t = rn_ckpt_find(c, name);
    int64_t v = -1;
    if (t && t->data.len == sizeof v) memcpy(&v, t->data.data, sizeof v);
    return v;
}

/* resnet18 of CLASSES classes from one seeded init on one CPU context: three training
 * nets (0 where any step fails; free_nets frees what was made) */
static int make_nets(uint64_t seed, rn_resnet *spec, rn_ckpt **init, rn_backend **be, rn_net *net[3]) {
    CHECK_OK(rn_resnet_build(spec, "resnet18", CLASSES));
    CHECK_OK(rn_ckpt_new(spec, init));
    if (!*init) return 0;
    CHECK_OK(rn_ckpt_init(*init, spec, seed, 0));
    CHECK_OK(rn_backend_create("cpu", 1, NULL, be));
    if (!*be) return 0;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(rn_net_create(*be, spec, BATCH, SIZE, SIZE, RN_NET_TRAIN, RN_F32, &net[i]));
        if (!net[i]) return 0;
        CHECK_OK(rn_net_load(net[i], *init));
    }
    return 1;
}

static void free_nets(rn_ckpt *init, rn_backend *be, rn_net *net[3]) {
    for (int i = 0; i < 3; i++)
        rn_net_destroy(net[i]);
    rn_ckpt_free(init);
    rn_backend_destroy(be);
}

/* a batch of BATCH images into the net's input */
static void input(rn_backend *be, rn_net *net, uint8_t mul, uint8_t add) {
    static uint8_t px[BATCH * SIZE * SIZE * 3];
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (uint8_t)(i * mul + add);
    CHECK_OK(rn_input_normalize(be, RN_F32, (int64_t)BATCH * SIZE * SIZE, 3, px, RN_IMAGENET_MEAN, RN_IMAGENET_STD,
                                rn_net_input(net)));
}

static void test_count(int frozen) {
    rn_resnet spec;
    rn_ckpt *init = NULL, *c[3] = {NULL, NULL, NULL};
    rn_backend *be = NULL;
    rn_net *net[3] = {NULL, NULL, NULL};
    int32_t labels[BATCH] = {0, 1, 2, 0};
    if (!make_nets(3, &spec, &init, &be, net)) goto out;
    /* 0 counts itself; 1 is counted by its caller; 2 says the caller counts and is not counted */
    for (int i = 0; i < 3; i++) {
        rn_net_freeze_bn(net[i], frozen);
        rn_net_count_by_caller(net[i], i > 0);
        for (int s = 0; s < 3; s++) {
            float loss = 0;
            input(be, net[i], 37, 11);
            CHECK_OK(rn_net_forward(net[i], BATCH, 1));
            if (i == 1) rn_net_count_batch(net[i], BATCH);
            CHECK_OK(rn_net_backward(net[i], labels, BATCH, 0, 1.0f, 0, &loss));
            CHECK_OK(rn_net_step(net[i], NULL, 0.01f, 0.9f, 0, 0, 0, NULL));
        }
        CHECK_OK(rn_ckpt_new(&spec, &c[i]));
        if (!c[i]) goto out;
        CHECK_OK(rn_net_store(net[i], c[i]));
    }
    const char *bn = "layer2.0.bn1.num_batches_tracked";
    int64_t want = frozen ? 0 : 3;
    CHECK(tracked(c[0], bn) == want, "%s: %s %lld, want %lld", frozen ? "frozen" : "plain", bn,
          (long long)tracked(c[0], bn), (long long)want);
    for (size_t i = 0; i < c[0]->n_buffers; i++) {
        const rn_ptensor *a = c[0]->buffers[i], *b = c[1]->buffers[i];
        CHECK(a->data.len == b->data.len && memcmp(a->data.data, b->data.data, a->data.len) == 0,
              "%s: buffer %s differs between counting itself and counted by its caller", frozen ? "frozen" : "plain",
              a->name);
    }
    CHECK(tracked(c[2], bn) == 0, "%s: the uncounted net's %s: %lld", frozen ? "frozen" : "plain", bn,
          (long long)tracked(c[2], bn));
    /* a replayed forward (no rn_net_forward) of BATCH after an eager one of 2: the unit
       outputs are BATCH rows, as the replay's device work wrote them */
    static float out0[BATCH * SIZE * SIZE * 64];
    int64_t shape[4] = {0};
    CHECK_OK(rn_net_forward(net[1], 2, 1));
    rn_net_count_batch(net[1], BATCH);
    CHECK_OK(rn_net_unit_output(net[1], 0, out0, shape));
    CHECK(shape[0] == BATCH, "after a counted replay of %d the unit outputs have %lld rows", BATCH, (long long)shape[0]);
out:
    for (int i = 0; i < 3; i++)
        rn_ckpt_free(c[i]);
    free_nets(init, be, net);
}

/* rn_net_set_mix_at: the training loss takes its mixing weight from memory, the same bits
 * as the argument; the evaluation loss (rn_net_loss) never mixes */
static void test_mix_at(void) {
    rn_resnet spec;
    rn_ckpt *init = NULL;
    rn_backend *be = NULL;
    rn_net *net[3] = {NULL, NULL, NULL}; /* mixed by the argument, from memory; not mixed */
    int32_t labels[BATCH] = {2, 1, 0, 1};
    float loss[3] = {0, 0, 0}, eval[3] = {0, 0, 0}, *g[3] = {NULL, NULL, NULL};
    const double m = 0.375;
    int64_t ng = 0;
    if (!make_nets(5, &spec, &init, &be, net)) goto out;
    for (int i = 0; i < 3; i++) {
        if (i == 1) rn_net_set_mix_at(net[i], &m);
        input(be, net[i], 53, 7);
        CHECK_OK(rn_net_forward(net[i], BATCH, 1));
        CHECK_OK(rn_net_loss(net[i], labels, BATCH, 0.1f, &eval[i]));
        CHECK_OK(rn_net_backward_mix(net[i], labels, BATCH, 0.1f, i == 0 ? m : 0, 1.0f, 0, &loss[i]));
        g[i] = rn_net_grads(net[i], &ng);
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0, "mixed loss from memory %.9g, from the argument %.9g",
          loss[1], loss[0]);
    CHECK(memcmp(g[0], g[1], sizeof(float) * (size_t)ng) == 0, "mixed gradients from memory differ");
    CHECK(memcmp(g[0], g[2], sizeof(float) * (size_t)ng) != 0, "mixing changes no gradient: the test tests nothing");
    CHECK(memcmp(&eval[0], &eval[1], sizeof eval[0]) == 0, "the evaluation loss mixes: %.9g, unmixed %.9g", eval[1],
          eval[0]);
out:
    free_nets(init, be, net);
}

/* ---- the optimiser step captured ---- */

typedef struct {
    rn_net *net;
    const rn_scaler *sc;
    float momentum;
} step_work;

static int do_step(void *ctx) {
    const step_work *w = ctx;
    return rn_net_step_ops(w->net, w->sc, w->momentum, 1e-4f, 0, RN_WD_NO_BN_BIAS);
}

/* rn_net_step_lr, rn_net_step_ops in a replay (keyed by rn_net_step_keyof, as rn-train
 * keys it) and rn_net_step_end (net 1) against rn_net_step (net 0, the same calls
 * eagerly) and against the host's decisions (net 2: clipping at a norm never reached
 * takes rn_net_step's other path, the overflow verdict read back before an SGD with the
 * rate passed), with GradScaler on: a new rate every step and a NaN gradient planted at
 * the first step (the momentum buffers, filled by an earlier run and not loaded, must stay
 * unstarted) and at a replayed one. The replay's SGD reads the rate and the check's
 * verdict when it runs, so the weights, the skips and the scale are the same bits on all
 * three at every step. */
static void test_step(int lars, float momentum) {
    enum { STEPS = 9, NETS = 3 };
    rn_resnet spec;
    rn_ckpt *init = NULL;
    rn_backend *be[NETS] = {NULL, NULL, NULL};
    rn_net *net[NETS] = {NULL, NULL, NULL};
    rn_scaler sc[NETS];
    int32_t labels[BATCH] = {0, 1, 2, 1};
    rn_replay r = {0};
    CHECK_OK(rn_resnet_build(&spec, "resnet18", CLASSES));
    CHECK_OK(rn_ckpt_new(&spec, &init));
    if (!init) goto out;
    CHECK_OK(rn_ckpt_init(init, &spec, 9, 0));
    for (int i = 0; i < NETS; i++) {
        float loss = 0;
        CHECK_OK(rn_backend_create("cpu", 1, NULL, &be[i]));
        if (!be[i]) goto out;
        CHECK_OK(rn_net_create(be[i], &spec, BATCH, SIZE, SIZE, RN_NET_TRAIN, RN_F32, &net[i]));
        if (!net[i]) goto out;
        /* a step fills the momentum buffers; the weights loaded again leave them unstarted */
        CHECK_OK(rn_net_load(net[i], init));
        input(be[i], net[i], 91, 3);
        CHECK_OK(rn_net_forward(net[i], BATCH, 1));
        CHECK_OK(rn_net_backward(net[i], labels, BATCH, 0, 1.0f, 0, &loss));
        CHECK_OK(rn_net_step(net[i], NULL, 0.5f, 0.9f, 0, 0, 0, NULL));
        CHECK_OK(rn_net_load(net[i], init));
        CHECK_OK(rn_scaler_init(&sc[i], 1024.0, 2.0, 0.5, 1000));
        if (lars) CHECK_OK(rn_net_set_lars(net[i], 1, 0.001, 0));
    }
    CHECK_OK(rn_net_set_clip(net[2], 1e30));
    CHECK(rn_net_step_on_device(net[1]) && !rn_net_step_on_device(net[2]), "%s steps on the device, clipped not",
          lars ? "LARS" : "SGD");
    fake_init(be[1]->ops);
    be[1]->ops = &fake;
    int64_t n = 0;
    for (int s = 0; s < STEPS; s++) {
        const float lr = 0.1f / (float)(1 + s);
        const int planted = s == 0 || s == 5;
        int sk[NETS] = {-1, -1, -1}, how = -1;
        for (int i = 0; i < NETS; i++) {
            float loss = 0;
            input(be[i], net[i], (uint8_t)(37 + s), 11);
            CHECK_OK(rn_net_forward(net[i], BATCH, 1));
            CHECK_OK(rn_net_backward(net[i], labels, BATCH, 0, sc[i].scale, 0, &loss));
            if (planted) rn_net_grads(net[i], &n)[5] = NAN; /* (CPU memory) */
        }
        CHECK_OK(rn_net_step(net[0], &sc[0], lr, momentum, 1e-4f, 0, RN_WD_NO_BN_BIAS, &sk[0]));
        CHECK_OK(rn_net_step(net[2], &sc[2], lr, momentum, 1e-4f, 0, RN_WD_NO_BN_BIAS, &sk[2]));
        rn_net_step_key key;
        rn_net_step_keyof(net[1], &sc[1], &key);
        if (s == 0) CHECK(key.first == 1, "the momentum buffers count as started after a load without them");
        step_work w = {net[1], &sc[1], momentum};
        CHECK_OK(rn_net_step_lr(net[1], lr));
        CHECK_OK(rn_replay_run(&r, be[1], &key, sizeof key, do_step, &w, &how));
        CHECK_OK(rn_net_step_end(net[1], &sc[1], momentum, &sk[1]));
        for (int i = 0; i < NETS; i++) {
            CHECK(sk[i] == planted, "%s step %d, net %d: skipped %d, want %d", lars ? "LARS" : "SGD", s, i, sk[i],
                  planted);
            CHECK(sc[i].scale == sc[0].scale && sc[i].growth_tracker == sc[0].growth_tracker,
                  "step %d, net %d: scale %g (tracker %d), net 0's %g (%d)", s, i, sc[i].scale, sc[i].growth_tracker,
                  sc[0].scale, sc[0].growth_tracker);
            rn_net_grads(net[0], &n);
            CHECK(memcmp(rn_net_weights(net[0]), rn_net_weights(net[i]), sizeof(float) * (size_t)n) == 0,
                  "%s step %d (%s): net %d's weights differ from net 0's", lars ? "LARS" : "SGD", s,
                  how == RN_REPLAY_REPLAYED ? "replayed" : how == RN_REPLAY_CAPTURED ? "captured" : "eager", i);
        }
    }
    /* eager: the first step (skipped), the second (a new scale), the third (the momentum
       started: LARS's buffer at momentum 0 too, which holds its steps), the one after the
       second overflow (a new scale); captured: the fourth and the eighth; replayed: the
       rest, the second overflow among them */
    CHECK(r.eager == 4 && r.captures == 2 && r.replays == 3 && !r.off,
          "the step ran %lld eager, %lld captured, %lld replayed (off %d): want 4, 2, 3", (long long)r.eager,
          (long long)r.captures, (long long)r.replays, r.off);
    CHECK(sc[1].scale == 256.0f, "the scale after two overflows: %g, want 256", sc[1].scale);
    rn_replay_reset(&r, be[1]);
out:
    if (be[1]) be[1]->ops = cpu;
    for (int i = 0; i < NETS; i++) {
        rn_net_destroy(net[i]);
        rn_backend_destroy(be[i]);
    }
    rn_ckpt_free(init);
}

/* The first step after a load without momentum starts the buffers from zero, whatever they
 * held: net 0's hold an earlier step's (a load leaves them unstarted), net 1 loads a
 * checkpoint whose momentum is all zero (started: nothing is zeroed for it). Both take
 * the same two steps to the same bits (SGD's first step copies the gradient, where a zero
 * buffer gives momentum * 0 + gradient, the same value; LARS zeroes its buffer). This is
 * independent of the paths test_step compares, which all share that start. */
static void test_first_step(int lars) {
    rn_resnet spec;
    rn_ckpt *init = NULL, *zero = NULL, *warm = NULL;
    rn_backend *be = NULL;
    rn_net *net[3] = {NULL, NULL, NULL};
    int32_t labels[BATCH] = {1, 0, 2, 2};
    const char *what = lars ? "LARS" : "SGD";
    float loss = 0;
    if (!make_nets(13, &spec, &init, &be, net)) goto out;
    CHECK_OK(rn_ckpt_new(&spec, &zero));
    CHECK_OK(rn_ckpt_new(&spec, &warm));
    if (!zero || !warm) goto out;
    CHECK_OK(rn_ckpt_init(zero, &spec, 13, 0));
    CHECK_OK(rn_state_momentum_alloc(zero));
    CHECK_OK(rn_ckpt_init(warm, &spec, 13, 0));
    /* net 0's buffers filled by a step, then the weights loaded again */
    input(be, net[0], 71, 5);
    CHECK_OK(rn_net_forward(net[0], BATCH, 1));
    CHECK_OK(rn_net_backward(net[0], labels, BATCH, 0, 1.0f, 0, &loss));
    CHECK_OK(rn_net_step(net[0], NULL, 0.5f, 0.9f, 0, 0, 0, NULL));
    CHECK_OK(rn_net_store(net[0], warm));
    CHECK_OK(rn_net_load(net[0], init));
    CHECK_OK(rn_net_load(net[1], zero));
    /* not vacuous: what the buffers hold would change a step that took it as momentum */
    const rn_ptensor *m = rn_state_momentum(warm, "fc.weight");
    const float *mv = m ? rn_ptensor_f32(m) : NULL;
    double sum = 0;
    for (size_t i = 0; mv && i < m->data.len / sizeof(float); i++)
        sum += fabs(mv[i]);
    CHECK(sum > 0, "the buffers after a step hold no momentum for fc.weight: the test tests nothing");
    int64_t n = 0;
    for (int i = 0; lars && i < 2; i++)
        CHECK_OK(rn_net_set_lars(net[i], 1, 0.001, 0));
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 2; i++) {
            input(be, net[i], (uint8_t)(29 + s), 3);
            CHECK_OK(rn_net_forward(net[i], BATCH, 1));
            CHECK_OK(rn_net_backward(net[i], labels, BATCH, 0, 1.0f, 0, &loss));
            CHECK_OK(rn_net_step(net[i], NULL, 0.05f, 0.9f, 1e-4f, 0, RN_WD_NO_BN_BIAS, NULL));
            if (i == 0) continue;
            rn_net_grads(net[0], &n);
            CHECK(memcmp(rn_net_weights(net[0]), rn_net_weights(net[1]), sizeof(float) * (size_t)n) == 0,
                  "%s step %d: buffers left by an earlier step (unstarted) give other weights than zero ones", what,
                  s);
        }
out:
    rn_ckpt_free(zero);
    rn_ckpt_free(warm);
    free_nets(init, be, net);
}

int main(void) {
    test_replay();
    test_step(0, 0.9f);
    test_step(1, 0.9f);
    test_step(1, 0.0f);
    test_first_step(0);
    test_first_step(1);
    test_count(0);
    test_count(1);
    test_mix_at();
    return check_done("test_replay");
}
