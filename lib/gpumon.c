/* GPU utilisation while training: an NVML source, a sampling thread, interval means and
 * the advice they lead to. */
#include "rn/gpumon.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rn/err.h"

void rn_gpumon_acc_add(rn_gpumon_acc *a, const rn_gpumon_sample *s) {
    if (!isnan(s->util)) a->util += s->util, a->n_util++;
    if (!isnan(s->mem_used)) a->mem_used += s->mem_used, a->n_mem++;
    if (!isnan(s->power_w)) a->power_w += s->power_w, a->n_power++;
}

void rn_gpumon_acc_mean(const rn_gpumon_acc *a, rn_gpumon_sample *mean) {
    mean->util = a->n_util ? a->util / (double)a->n_util : NAN;
    mean->mem_used = a->n_mem ? a->mem_used / (double)a->n_mem : NAN;
    mean->power_w = a->n_power ? a->power_w / (double)a->n_power : NAN;
}

/* ---- NVML ---- */

/* nvml.h's nvmlUtilization_t and nvmlMemory_t (version 1) */
typedef struct {
    unsigned gpu, memory;
} nvml_util;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

typedef struct {
    void *lib;
    void *dev;
    int (*shutdown)(void);
    int (*util)(void *, nvml_util *);
    int (*mem)(void *, nvml_memory *);
    int (*power)(void *, unsigned *);
} nvml_source;

static int nvml_read(void *ctx, rn_gpumon_sample *s) {
    nvml_source *n = ctx;
    *s = (rn_gpumon_sample){NAN, NAN, NAN};
    nvml_util u;
    nvml_memory m;
    unsigned mw;
    int ok = 0;
    /* a query the device does not support leaves its field unknown */
    if (n->util && n->util(n->dev, &u) == 0) s->util = u.gpu, ok = 1;
    if (n->mem && n->mem(n->dev, &m) == 0) s->mem_used = (double)m.used, ok = 1;
    if (n->power && n->power(n->dev, &mw) == 0) s->power_w = mw / 1000.0, ok = 1;
    return ok ? RN_OK : rn_errorf(RN_EGPU, "NVML answered none of utilisation, memory and power");
}

static void nvml_close(void *ctx) {
    nvml_source *n = ctx;
    if (n->shutdown) n->shutdown();
    dlclose(n->lib);
    free(n);
}

/* dlsym into a typed function pointer (POSIX lets the two convert) */
static int sym(void *lib, const char *name, void *fnp) {
    void *p = dlsym(lib, name);
    memcpy(fnp, &p, sizeof p);
    return p != NULL;
}

int rn_gpumon_nvml(const char *pci_bus_id, rn_gpumon_source *out) {
    const char *soname = "libnvidia-ml.so.1";
    void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return rn_errorf(RN_ENOTSUP, "%s: %s (it comes with the NVIDIA driver; rn-gpuinfo says what is missing)",
                         soname, dlerror());
    nvml_source *n = rn_calloc(1, sizeof *n);
    if (!n) {
        dlclose(lib);
        return RN_ENOMEM;
    }
    n->lib = lib;
    int rc = RN_OK;
    int (*init)(void) = NULL;
    int (*by_bus)(const char *, void **) = NULL;
    const char *(*error_string)(int) = NULL;
    sym(lib, "nvmlErrorString", &error_string);
    if (!sym(lib, "nvmlInit_v2", &init) || !sym(lib, "nvmlDeviceGetHandleByPciBusId_v2", &by_bus)) {
        rc = rn_errorf(RN_ENOTSUP,
                       "%s lacks nvmlInit_v2 or nvmlDeviceGetHandleByPciBusId_v2 (a driver older "
                       "than NVML's version 2 API: update the NVIDIA driver)",
                       soname);
        goto fail;
    }
    int e = init();
    if (e != 0) {
        rc = rn_errorf(RN_EGPU, "nvmlInit_v2: %s (error %d)", error_string ? error_string(e) : "failed", e);
        goto fail;
    }
    sym(lib, "nvmlShutdown", &n->shutdown);
    if ((e = by_bus(pci_bus_id, &n->dev)) != 0) {
        rc = rn_errorf(RN_EGPU, "nvmlDeviceGetHandleByPciBusId_v2(%s): %s (error %d)", pci_bus_id,
                       error_string ? error_string(e) : "failed", e);
        goto fail;
    }
    sym(lib, "nvmlDeviceGetUtilizationRates", &n->util);
    sym(lib, "nvmlDeviceGetMemoryInfo", &n->mem);
    sym(lib, "nvmlDeviceGetPowerUsage", &n->power);
    *out = (rn_gpumon_source){.read = nvml_read, .close = nvml_close, .ctx = n};
    return RN_OK;
fail:
    nvml_close(n);
    return rc;
}

/* ---- the sampler ---- */

struct rn_gpumon {
    rn_gpumon_source src;
    double interval;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC: stop wakes the thread early */
    int stop;
    rn_gpumon_acc acc; /* the current interval */
    int64_t reads, failed;
};

/* read the source once and add what it said; mu is not held */
static void sample(rn_gpumon *m) {
    rn_gpumon_sample s;
    int rc = m->src.read(m->src.ctx, &s);
    pthread_mutex_lock(&m->mu);
    if (rc == RN_OK) rn_gpumon_acc_add(&m->acc, &s);
    m->reads++;
    m->failed += rc != RN_OK;
    pthread_mutex_unlock(&m->mu);
}

static void *run(void *arg) {
    rn_gpumon *m = arg;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        /* a fixed cadence: the next deadline counts from the last, not from the read */
        long long ns = next.tv_nsec + (long long)(m->interval * 1e9);
        next.tv_sec += ns / 1000000000, next.tv_nsec = ns % 1000000000;
        while (!m->stop && pthread_cond_timedwait(&m->cv, &m->mu, &next) != ETIMEDOUT) {
        }
        if (m->stop) break;
        pthread_mutex_unlock(&m->mu);
        sample(m);
        pthread_mutex_lock(&m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int rn_gpumon_start(const rn_gpumon_source *src, double interval_s, rn_gpumon **out) {
    *out = NULL;
    int rc = RN_OK;
    rn_gpumon *m = NULL;
    if (!(interval_s >= RN_GPUMON_INTERVAL_MIN && interval_s <= RN_GPUMON_INTERVAL_MAX)) {
        rc = rn_errorf(RN_EINVAL, "GPU sampling interval %g s is outside %g..%g s", interval_s, RN_GPUMON_INTERVAL_MIN,
                       RN_GPUMON_INTERVAL_MAX);
        goto fail;
    }
    rn_gpumon_sample first;
    if ((rc = src->read(src->ctx, &first))) goto fail;
    if (!(m = rn_calloc(1, sizeof *m))) {
        rc = RN_ENOMEM;
        goto fail;
    }
    m->src = *src;
    m->interval = interval_s;
    rn_gpumon_acc_add(&m->acc, &first);
    m->reads = 1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&m->mu, NULL);
    int e = pthread_create(&m->thread, NULL, run, m);
    if (e) {
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
        free(m);
        m = NULL;
        rc = rn_errorf(RN_EIO, "the GPU sampling thread did not start: %s", strerror(e));
        goto fail;
    }
    *out = m;
    return RN_OK;
fail:
    if (src->close) src->close(src->ctx);
    return rc;
}

void rn_gpumon_take(rn_gpumon *m, rn_gpumon_sample *mean) {
    pthread_mutex_lock(&m->mu);
    int empty = m->acc.n_util + m->acc.n_mem + m->acc.n_power == 0;
    pthread_mutex_unlock(&m->mu);
    /* (the source is read from one thread at a time: NVML's calls are thread-safe, and a
       scripted test source takes its own lock) */
    if (empty) sample(m);
    pthread_mutex_lock(&m->mu);
    rn_gpumon_acc_mean(&m->acc, mean);
    m->acc = (rn_gpumon_acc){0};
    pthread_mutex_unlock(&m->mu);
}

void rn_gpumon_counts(const rn_gpumon *m, int64_t *reads, int64_t *failed) {
    pthread_mutex_lock((pthread_mutex_t *)&m->mu);
    *reads = m->reads, *failed = m->failed;
    pthread_mutex_unlock((pthread_mutex_t *)&m->mu);
}

void rn_gpumon_stop(rn_gpumon *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    if (m->src.close) m->src.close(m->src.ctx);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

int rn_gpumon_advice(double util, double data_wait, int workers, int micro, char *buf, size_t cap) {
    buf[0] = 0;
    if (isnan(util) || util >= RN_GPUMON_BUSY) return RN_GPUMON_ADVICE_NONE;
    if (data_wait > RN_GPUMON_WAIT_HIGH) {
        snprintf(buf, cap,
                 "rn-train: the GPU was %.0f%% busy while the loader held back %.0f%% of the step time: add "
                 "--workers (now %d), store smaller images (rn-prep --resize), or store raw pixels "
                 "(rn-prep --encode raw: no JPEG decoding)",
                 util, 100 * data_wait, workers);
        return RN_GPUMON_ADVICE_LOADER;
    }
    if (data_wait < RN_GPUMON_WAIT_LOW) {
        snprintf(buf, cap,
                 "rn-train: the GPU was %.0f%% busy with the loader holding back only %.0f%% of the step time: "
                 "the host keeps it waiting (synchronisations, as RN_SYNC=1 makes; kernel launches: "
                 "--cuda-graphs makes a micro-batch's one) or a micro-batch of %d is too small to fill it "
                 "(raise --batch or --micro-batch)",
                 util, 100 * data_wait, micro);
        return RN_GPUMON_ADVICE_HOST;
    }
    return RN_GPUMON_ADVICE_NONE;
}
