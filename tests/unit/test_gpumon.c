/* gpumon and the reporting of its figures, without a GPU: interval means, the sampling
 * thread over a scripted source, the advice decisions, the JSONL fields and progress
 * lines they produce; and --profile's stream-mark timing over a scripted backend. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "rn/backend_impl.h"
#include "rn/err.h"
#include "rn/gpumon.h"
#include "rn/prof.h"
#include "rn/report.h"

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* ---- a scripted device: phase 0 reads util 40, phase 1 util 80; memory and power as set ---- */
typedef struct {
    pthread_mutex_t mu;
    int phase;
    int fail_from; /* reads from this call on fail (0: never) */
    int calls, phase1_reads, closed;
    double power; /* NaN: the device does not report power */
} script;

static int script_read(void *ctx, rn_gpumon_sample *s) {
    script *c = ctx;
    pthread_mutex_lock(&c->mu);
    int call = ++c->calls, ph = c->phase;
    if (ph == 1) c->phase1_reads++;
    pthread_mutex_unlock(&c->mu);
    if (c->fail_from && call >= c->fail_from) return rn_errorf(RN_EGPU, "scripted failure at read %d", call);
    *s = (rn_gpumon_sample){.util = ph ? 80 : 40, .mem_used = ph ? 3e9 : 1e9, .power_w = c->power};
    return RN_OK;
}

static void script_close(void *ctx) { ((script *)ctx)->closed++; }

static rn_gpumon_source source(script *c) {
    return (rn_gpumon_source){.read = script_read, .close = script_close, .ctx = c};
}

static void wait_reads(script *c, int phase1_reads) {
    for (int i = 0; i < 5000; i++) {
        pthread_mutex_lock(&c->mu);
        int n = c->phase1_reads;
        pthread_mutex_unlock(&c->mu);
        if (n >= phase1_reads) return;
        usleep(1000);
    }
}

static void test_acc(void) {
    rn_gpumon_acc a = {0};
    rn_gpumon_sample m;
    rn_gpumon_acc_mean(&a, &m);
    CHECK(isnan(m.util) && isnan(m.mem_used) && isnan(m.power_w), "an empty interval has no means");
    rn_gpumon_acc_add(&a, &(rn_gpumon_sample){10, 1e9, 300});
    rn_gpumon_acc_add(&a, &(rn_gpumon_sample){20, 2e9, NAN});
    rn_gpumon_acc_add(&a, &(rn_gpumon_sample){60, NAN, 100});
    rn_gpumon_acc_mean(&a, &m);
    CHECK(m.util == 30, "util mean over 3 samples: %g", m.util);
    CHECK(m.mem_used == 1.5e9, "memory mean over the 2 samples that knew it: %g", m.mem_used);
    CHECK(m.power_w == 200, "power mean over the 2 samples that knew it: %g", m.power_w);
    CHECK(a.n_util == 3 && a.n_mem == 2 && a.n_power == 2, "counts %lld %lld %lld", (long long)a.n_util,
          (long long)a.n_mem, (long long)a.n_power);
}

static void test_sampler(void) {
    script c = {.mu = PTHREAD_MUTEX_INITIALIZER, .power = 250};
    rn_gpumon_source src = source(&c);
    rn_gpumon *m = NULL;
    CHECK_OK(rn_gpumon_start(&src, 0.01, &m));
    if (!m) return;
    pthread_mutex_lock(&c.mu);
    int calls = c.calls;
    pthread_mutex_unlock(&c.mu);
    CHECK(calls >= 1, "start reads once before returning (%d calls)", calls);
    /* the thread samples every 10 ms: wait for 3 reads (up to 5 s on a loaded machine) */
    int64_t reads = 0, failed = 0;
    for (int i = 0; i < 5000 && reads < 3; i++) {
        usleep(1000);
        rn_gpumon_counts(m, &reads, &failed);
    }
    CHECK(reads >= 3 && failed == 0, "the thread samples: %lld reads, %lld failed", (long long)reads,
          (long long)failed);
    rn_gpumon_sample g;
    rn_gpumon_take(m, &g);
    CHECK(g.util == 40 && g.mem_used == 1e9 && g.power_w == 250, "phase 0 means %g %g %g", g.util, g.mem_used,
          g.power_w);
    /* a new phase: the interval that saw it begin is mixed; the next holds only it */
    pthread_mutex_lock(&c.mu);
    c.phase = 1;
    pthread_mutex_unlock(&c.mu);
    wait_reads(&c, 1);
    rn_gpumon_take(m, &g);
    CHECK(g.util >= 40 && g.util <= 80, "a mixed interval's mean lies between: %g", g.util);
    pthread_mutex_lock(&c.mu);
    int base = c.phase1_reads;
    pthread_mutex_unlock(&c.mu);
    wait_reads(&c, base + 3);
    rn_gpumon_take(m, &g);
    CHECK(g.util == 80 && g.mem_used == 3e9, "phase 1 means %g %g", g.util, g.mem_used);
    rn_gpumon_stop(m);
    CHECK(c.closed == 1, "stop closes the source once (%d)", c.closed);

    /* an interval shorter than the period: read on the spot, never an empty mean */
    script d = {.mu = PTHREAD_MUTEX_INITIALIZER, .power = NAN};
    src = source(&d);
    CHECK_OK(rn_gpumon_start(&src, 60, &m));
    if (!m) return;
    rn_gpumon_take(m, &g); /* the start's read */
    rn_gpumon_take(m, &g); /* empty: one read here */
    rn_gpumon_counts(m, &reads, &failed);
    CHECK(reads == 2 && d.calls == 2, "an empty interval reads once: %lld reads, %d calls", (long long)reads, d.calls);
    CHECK(g.util == 40 && isnan(g.power_w), "a device without power readings: util %g, power %g", g.util, g.power_w);
    /* a read that fails later is counted and leaves the interval without figures */
    d.fail_from = 3;
    rn_gpumon_take(m, &g);
    rn_gpumon_counts(m, &reads, &failed);
    CHECK(failed == 1 && isnan(g.util) && isnan(g.mem_used), "a failed read: %lld failed, util %g", (long long)failed,
          g.util);
    rn_gpumon_stop(m);
    CHECK(d.closed == 1, "closed once (%d)", d.closed);

    /* a source that cannot read fails at the start, once, and is closed */
    script e = {.mu = PTHREAD_MUTEX_INITIALIZER, .fail_from = 1};
    src = source(&e);
    m = NULL;
    int rc = rn_gpumon_start(&src, 0.1, &m);
    CHECK(rc == RN_EGPU && !m && e.closed == 1, "a failing source: rc %d, closed %d", rc, e.closed);
    CHECK(strstr(rn_last_error(), "scripted failure") != NULL, "its own message: %s", rn_last_error());
    script f = {.mu = PTHREAD_MUTEX_INITIALIZER};
    src = source(&f);
    rc = rn_gpumon_start(&src, 0.001, &m);
    CHECK(rc == RN_EINVAL && f.closed == 1 && f.calls == 0, "1 ms is under the minimum: rc %d", rc);
    rn_gpumon_stop(NULL);
}

/* NVML through tests/data/fake_nvidia.c (tests/gpuinfo.bats runs this binary with it first
 * on LD_LIBRARY_PATH and FAKE_NVML_UTIL=10,30,80): the binding reads what the library says */
static void test_nvml_fake(void) {
    rn_gpumon_source src;
    CHECK(rn_gpumon_nvml("0000:0C:00.0", &src) == RN_EGPU, "a bus id NVML does not know is refused");
    CHECK(strstr(rn_last_error(), "nvmlDeviceGetHandleByPciBusId_v2(0000:0C:00.0)") != NULL, "naming the call: %s",
          rn_last_error());
    CHECK_OK(rn_gpumon_nvml("0000:0B:00.0", &src));
    rn_gpumon *m = NULL;
    CHECK_OK(rn_gpumon_start(&src, 60, &m)); /* reads util 10 */
    if (!m) return;
    rn_gpumon_sample g;
    rn_gpumon_take(m, &g);
    CHECK(g.util == 10 && g.mem_used == 2.0 * (1 << 30) && fabs(g.power_w - 312.4) < 1e-9,
          "device 1 of the fake: util %g, memory %g, power %g", g.util, g.mem_used, g.power_w);
    rn_gpumon_take(m, &g); /* an empty interval: reads util 30 */
    CHECK(g.util == 30, "the next scripted reading: %g", g.util);
    rn_gpumon_stop(m);
    printf("test_gpumon: NVML through the fake library checked\n");
}

static void test_nvml_absent(void) {
    if (getenv("FAKE_NVML_UTIL")) {
        test_nvml_fake();
        return;
    }
    /* this machine has no NVIDIA driver: the error says what is missing (skip where one is) */
    if (access("/proc/driver/nvidia/version", F_OK) == 0) {
        printf("test_gpumon: an NVIDIA driver is here: NVML-absent check skipped\n");
        return;
    }
    rn_gpumon_source src;
    int rc = rn_gpumon_nvml("0000:0A:00.0", &src);
    CHECK(rc == RN_ENOTSUP || rc == RN_EGPU, "no NVML: rc %d", rc);
    CHECK(strstr(rn_last_error(), "libnvidia-ml.so.1") || strstr(rn_last_error(), "nvml"), "the message names NVML: %s",
          rn_last_error());
}

static void test_advice(void) {
    char buf[512];
    CHECK(rn_gpumon_advice(95, 0.5, 4, 8, buf, sizeof buf) == RN_GPUMON_ADVICE_NONE && !buf[0],
          "a busy GPU needs no advice: %s", buf);
    CHECK(rn_gpumon_advice(90, 0.5, 4, 8, buf, sizeof buf) == RN_GPUMON_ADVICE_NONE, "90%% is busy");
    CHECK(rn_gpumon_advice(NAN, 0.5, 4, 8, buf, sizeof buf) == RN_GPUMON_ADVICE_NONE, "no figure, no advice");
    CHECK(rn_gpumon_advice(89.9, 0.21, 4, 8, buf, sizeof buf) == RN_GPUMON_ADVICE_LOADER, "loader-bound");
    CHECK(strstr(buf, "--workers (now 4)") && strstr(buf, "rn-prep --resize") && strstr(buf, "--encode raw"),
          "the loader advice names workers, size and encoding: %s", buf);
    CHECK(strstr(buf, "90% busy") && strstr(buf, "21%"), "and the figures: %s", buf);
    CHECK(rn_gpumon_advice(60, 0.01, 4, 8, buf, sizeof buf) == RN_GPUMON_ADVICE_HOST, "host-bound");
    CHECK(strstr(buf, "synchronisations") && strstr(buf, "micro-batch of 8") && strstr(buf, "--batch") &&
              strstr(buf, "--cuda-graphs"),
          "the host advice names syncs, launches and the batch: %s", buf);
    CHECK(rn_gpumon_advice(60, 0.1, 4, 8, buf, sizeof buf) == RN_GPUMON_ADVICE_NONE && !buf[0],
          "between the thresholds nothing is said: %s", buf);
    CHECK(rn_gpumon_advice(60, 0.2, 4, 8, buf, sizeof buf) == RN_GPUMON_ADVICE_NONE, "0.2 is not over 0.2");
    CHECK(rn_gpumon_advice(60, 0.05, 4, 8, buf, sizeof buf) == RN_GPUMON_ADVICE_NONE, "0.05 is not under 0.05");
}

/* ---- the sinks ---- */

static rn_step_info step(int epoch, int64_t k, double util, double wait) {
    return (rn_step_info){.epoch = epoch,
                          .step = k,
                          .epoch_step = k,
                          .steps_per_epoch = 100,
                          .steps_left = 10,
                          .loss = 1,
                          .lr = 0.1,
                          .img_s = 100,
                          .data_wait = wait,
                          .loss_scale = 1,
                          .world = 1,
                          .gpu = !isnan(util),
                          .gpu_util = util,
                          .gpu_mem_used = 1.5e9,
                          .gpu_power_w = NAN};
}

static void test_jsonl(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    rn_report rep = {0};
    rn_reporter s;
    CHECK_OK(rn_report_jsonl(f, &s));
    CHECK_OK(rn_report_add(&rep, &s));
    rn_step_info a = step(1, 1, NAN, 0.1), b = step(1, 2, 55.5, 0.1);
    rn_report_step(&rep, &a);
    rn_report_step(&rep, &b);
    rn_report_close(&rep); /* closes f: buf holds the lines */
    char *nl = buf ? strchr(buf, '\n') : NULL;
    CHECK(nl != NULL, "two lines: %s", buf ? buf : "(none)");
    if (!nl) return;
    *nl = 0;
    CHECK(!strstr(buf, "gpu_"), "unsampled: no gpu fields at all: %s", buf);
    CHECK(strstr(nl + 1, ",\"gpu_util\":55.5,\"gpu_mem_used\":1500000000}") != NULL,
          "sampled: util and memory, and power left out (the device did not give it): %s", nl + 1);
    CHECK(!strstr(nl + 1, "gpu_power_w"), "no power written: %s", nl + 1);
    free(buf);
}

static char *progress_run(const rn_step_info *st, int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    rn_report rep = {0};
    rn_reporter s;
    CHECK_OK(rn_report_progress(f, 0, &s));
    CHECK_OK(rn_report_add(&rep, &s));
    rn_run_info run = {.arch = "resnet50",
                       .device = "test",
                       .steps_per_epoch = 100,
                       .batch = 32,
                       .accum = 4,
                       .micro = 8,
                       .world = 1,
                       .workers = 4};
    rn_report_begin(&rep, &run);
    for (int i = 0; i < n; i++)
        rn_report_step(&rep, &st[i]);
    rn_report_close(&rep);
    fclose(f);
    return buf;
}

static void test_progress(void) {
    rn_step_info gpu[] = {step(1, 1, 50, 0.4), step(1, 2, 50, 0.4),  step(1, 3, 60, 0.01),
                          step(2, 4, 95, 0.4), step(2, 5, 60, 0.01), step(2, 6, 60, 0.5)};
    char *out = progress_run(gpu, 6);
    if (!out) out = strdup("");
    CHECK(count(out, " GPU 50% ETA") == 2, "the step line shows GPU busy: %s", out);
    CHECK(count(out, "rn-train: the GPU was") == 2, "advice at most once an epoch: %s", out);
    CHECK(count(out, "held back 40%") == 1 && count(out, "micro-batch of 8 is too small") == 1,
          "epoch 1: the loader (first); epoch 2: the host (its first idle window): %s", out);
    CHECK(!strstr(out, "add --workers (now 4)\n"), "with GPU figures the GPU advice speaks instead: %s", out);
    free(out);
    rn_step_info cpu[] = {step(1, 1, NAN, 0.4), step(2, 2, NAN, 0.4), step(2, 3, NAN, 0.01)};
    out = progress_run(cpu, 3);
    if (!out) out = strdup("");
    CHECK(!strstr(out, "GPU"), "unsampled: GPU is not mentioned: %s", out);
    CHECK(count(out, "add --workers (now 4)\n") == 1, "the data-wait advice as before, once: %s", out);
    free(out);
}

/* ---- --profile over a backend with scripted stream marks ---- */

typedef struct {
    int syncs;
    int64_t marks;
} fake_dev;

static int fake_sync(rn_backend *be) {
    ((fake_dev *)be->impl)->syncs++;
    return RN_OK;
}
static int fake_mark(rn_backend *be, int64_t i) {
    fake_dev *d = be->impl;
    if (i != d->marks && i != 0) return rn_errorf(RN_EINVAL, "mark %lld out of order", (long long)i);
    d->marks = i + 1;
    return RN_OK;
}
/* mark i at i*i milliseconds: a span's duration is the scripted gap, not the host's */
static int fake_marks_read(rn_backend *be, int64_t n, double *sec) {
    if (n > ((fake_dev *)be->impl)->marks) return rn_errorf(RN_EINVAL, "read past the marks");
    for (int64_t i = 0; i < n; i++)
        sec[i] = 1e-3 * (double)(i * i);
    return RN_OK;
}

/* one upload a step on the copy stream, 2 ms to 3 ms after mark 0 */
static int fake_copy_spans(rn_backend *be, int64_t cap, double *t0, double *t1, int64_t *n) {
    (void)be;
    *n = cap > 0;
    if (cap > 0) t0[0] = 0.002, t1[0] = 0.003;
    return RN_OK;
}

static void test_prof_marks(void) {
    rn_backend_ops ops = {.kind = "fake",
                          .sync = fake_sync,
                          .mark = fake_mark,
                          .marks_read = fake_marks_read,
                          .copy_spans = fake_copy_spans};
    fake_dev dev = {0};
    rn_backend be = {.ops = &ops, .impl = &dev};
    rn_prof *p = NULL;
    CHECK_OK(rn_prof_create(&be, &p));
    if (!p) return;
    CHECK_OK(rn_prof_step_begin(p));                                                          /* mark 0 */
    double t = rn_prof_begin(p, "layer1.0.conv1");                                            /* mark 1 */
    double u = rn_prof_begin(p, "layer1.0.bn1");                                              /* mark 2 */
    CHECK_OK(rn_prof_end(p, u, "layer1.0.bn1", RN_PROF_FWD, RN_PROF_COMPUTE, 0, 0, RN_OK));   /* mark 3 */
    CHECK_OK(rn_prof_end(p, t, "layer1.0.conv1", RN_PROF_FWD, RN_PROF_COMPUTE, 0, 0, RN_OK)); /* mark 4 */
    CHECK_OK(rn_prof_step_end(p));
    int64_t steps;
    double wall, spans;
    rn_prof_totals(p, &steps, &wall, &spans);
    /* inner 9-4 = 5 ms, outer 16-1 = 15 ms */
    CHECK(steps == 1 && fabs(spans - 0.020) < 1e-9, "spans timed by the marks: %.9f s", spans);
    CHECK(dev.syncs == 2, "no sync inside a step with marks: %d syncs", dev.syncs);
    /* an op's error passes through; a host-track span keeps the clock */
    CHECK_OK(rn_prof_step_begin(p));
    t = rn_prof_begin(p, "data-wait");
    usleep(2000);
    CHECK_OK(rn_prof_end(p, t, "data-wait", RN_PROF_STEP, RN_PROF_HOST, 0, 0, RN_OK));
    t = rn_prof_begin(p, "sgd");
    int rc = rn_prof_end(p, t, "sgd", RN_PROF_STEP, RN_PROF_COMPUTE, 0, 0, RN_EGPU);
    CHECK(rc == RN_EGPU, "the op's status is returned: %d", rc);
    CHECK_OK(rn_prof_step_end(p));
    rn_prof_totals(p, &steps, &wall, &spans);
    CHECK(spans - 0.020 >= 0.0019 && spans - 0.020 < 1, "the host span is the clock's ~2 ms: %.6f", spans - 0.020);
    /* a loader worker's chunk: in the trace, not in the sums */
    double before = spans, now = rn_report_clock();
    rn_prof_loader_span(p, 1, 0, 8, now + 0.5, now + 1.5);
    rn_prof_totals(p, &steps, &wall, &spans);
    CHECK(spans == before, "a worker's span is not in the spans' sum: %g -> %g", before, spans);
    char dir[] = "/tmp/test_gpumon.XXXXXX";
    if (mkdtemp(dir)) {
        char table[256], trace[256];
        snprintf(table, sizeof table, "%s/prof.txt", dir);
        snprintf(trace, sizeof trace, "%s/prof.txt.json", dir);
        CHECK_OK(rn_prof_write(p, "test", table, trace));
        FILE *f = fopen(trace, "r");
        char js[8192] = {0};
        if (f) {
            size_t n = fread(js, 1, sizeof js - 1, f);
            js[n] = 0;
            fclose(f);
        }
        CHECK(strstr(js, "\"compute stream (events)\""), "the compute track is named for its events: %.300s", js);
        CHECK(strstr(js, "\"tid\":17,\"args\":{\"name\":\"loader worker 2\"}"), "worker 1's track: %.600s", js);
        CHECK(strstr(js, "\"tid\":3,\"args\":{\"name\":\"copy stream (events)\"}"), "the copy track: %.600s", js);
        const char *h2d =
            strstr(js, "{\"name\":\"h2d\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":3,\"ts\":2000.000,");
        CHECK(h2d && strstr(h2d, "\"dur\":1000.000,"), "the first step's upload on it, 1 ms from 2 ms: %s", js);
        const char *ld = strstr(js, "{\"name\":\"load\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":17,");
        CHECK(ld && strstr(ld, "\"dur\":1000000.000,"), "its chunk on it, 1 s long: %s", js);
        f = fopen(table, "r");
        char tb[8192] = {0};
        if (f) {
            size_t n = fread(tb, 1, sizeof tb - 1, f);
            tb[n] = 0;
            fclose(f);
        }
        CHECK(strstr(tb, "\nload ") == NULL && strstr(tb, "\nh2d ") == NULL && strstr(tb, "layer1.0.bn1"),
              "and no row of the table: %s", tb);
        CHECK(strstr(js, "\"ts\":4000.000,\"dur\":5000.000") && strstr(js, "\"ts\":1000.000,\"dur\":15000.000"),
              "events placed from the step's start, as the marks say: %.800s", js);
        remove(table);
        remove(trace);
        rmdir(dir);
    }
    rn_prof_destroy(p);

    /* without marks: the clock, synchronised around each span (the CPU's way) */
    rn_backend_ops plain = {.kind = "fake", .sync = fake_sync};
    fake_dev d2 = {0};
    rn_backend b2 = {.ops = &plain, .impl = &d2};
    CHECK_OK(rn_prof_create(&b2, &p));
    if (!p) return;
    CHECK_OK(rn_prof_step_begin(p));
    t = rn_prof_begin(p, "fc");
    CHECK_OK(rn_prof_end(p, t, "fc", RN_PROF_FWD, RN_PROF_COMPUTE, 0, 0, RN_OK));
    CHECK_OK(rn_prof_step_end(p));
    CHECK(d2.syncs == 4, "host clock: a sync at each span's ends and the step's: %d", d2.syncs);
    rn_prof_destroy(p);
}

int main(void) {
    test_acc();
    test_sampler();
    test_nvml_absent();
    test_advice();
    test_jsonl();
    test_progress();
    test_prof_marks();
    return check_done("test_gpumon");
}
