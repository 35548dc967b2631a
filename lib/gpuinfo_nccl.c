/* gpuinfo_nccl: --nccl, an all-reduce across every usable device of this machine from one
 * process, through its own dlsym binding of the CUDA runtime and NCCL (rn/gpuinfo.h), so
 * that rn-gpuinfo needs neither to start and says which one is missing. */
#include "rn/gpuinfo_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rn/err.h"
#include "rn/rng.h"

/* Values from nccl.h and cuda_runtime_api.h that this file uses. */
enum { NC_FLOAT32 = 7, NC_SUM = 0, RT_H2D = 1, RT_D2H = 2, RT_NOT_READY = 600 };

#if defined(RN_HAVE_NCCL) && RN_HAVE_NCCL
#include <nccl.h>
_Static_assert((int)NC_FLOAT32 == (int)ncclFloat32 && (int)NC_SUM == (int)ncclSum, "NCCL values");
#endif
#if defined(RN_HAVE_CUDA) && RN_HAVE_CUDA
#include <cuda_runtime_api.h>
_Static_assert((int)RT_H2D == (int)cudaMemcpyHostToDevice && (int)RT_D2H == (int)cudaMemcpyDeviceToHost &&
                   (int)RT_NOT_READY == (int)cudaErrorNotReady,
               "runtime values");
#endif

/* Sizes per device: 8 MiB to 256 MiB, doubling. */
#define NCCL_MIN_BYTES (8LL << 20)
#define NCCL_MAX_BYTES (256LL << 20)
/* Time each size for about this long (at least 5, at most 100 all-reduces). */
#define NCCL_SECONDS 0.2
#define NCCL_MAXDEV 64

typedef struct {
    int (*set_device)(int);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*stream_create)(void **);
    int (*memset_)(void *, int, size_t);
    int (*stream_query)(void *);
    int (*stream_destroy)(void *);
    const char *(*error_string)(int);
    int (*init_all)(void **, int, const int *);
    int (*destroy)(void *);
    int (*abort_)(void *);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*all_reduce)(const void *, void *, size_t, int, int, void *, void *);
    const char *(*nccl_error)(int);
} nccl_api;

#define NC(call)                                                                                                       \
    do {                                                                                                               \
        int e_ = (call);                                                                                               \
        if (e_ != 0) {                                                                                                 \
            rc = rn_errorf(RN_EGPU, "%s:%d: %s: %s (NCCL_DEBUG=INFO says more)", __FILE__, __LINE__, #call,            \
                           api.nccl_error(e_));                                                                        \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

static int load_api(const rn_gpuinfo *g, nccl_api *a) {
    memset(a, 0, sizeof *a);
    const rn_gpulib *rt = &g->lib[RN_GPULIB_CUDART], *nc = &g->lib[RN_GPULIB_NCCL];
    if (!nc->loaded)
        return rn_errorf(RN_EGPU,
                         "NCCL (libnccl.so.2) is not loaded: %s (install NCCL: it comes with the CUDA toolkit, or "
                         "as Debian's libnccl2; only runs on more than one GPU need it)",
                         nc->error[0] ? nc->error : "not found");
    if (!rt->loaded) return rn_errorf(RN_EGPU, "--nccl needs the CUDA runtime: %s", rt->error);
    int ok = rn_gpuinfo_sym(rt, "cudaSetDevice", &a->set_device) & rn_gpuinfo_sym(rt, "cudaMalloc", &a->malloc_) &
             rn_gpuinfo_sym(rt, "cudaFree", &a->free_) & rn_gpuinfo_sym(rt, "cudaMemcpy", &a->memcpy_) &
             rn_gpuinfo_sym(rt, "cudaStreamCreate", &a->stream_create) & rn_gpuinfo_sym(rt, "cudaMemset", &a->memset_) &
             rn_gpuinfo_sym(rt, "cudaStreamQuery", &a->stream_query) &
             rn_gpuinfo_sym(rt, "cudaStreamDestroy", &a->stream_destroy) &
             rn_gpuinfo_sym(rt, "cudaGetErrorString", &a->error_string);
    if (!ok) return rn_errorf(RN_EGPU, "%s lacks a function --nccl needs (cudaMalloc, cudaStream*)", rt->path);
    ok = rn_gpuinfo_sym(nc, "ncclCommInitAll", &a->init_all) & rn_gpuinfo_sym(nc, "ncclCommDestroy", &a->destroy) &
         rn_gpuinfo_sym(nc, "ncclCommAbort", &a->abort_) & rn_gpuinfo_sym(nc, "ncclGroupStart", &a->group_start) &
         rn_gpuinfo_sym(nc, "ncclGroupEnd", &a->group_end) & rn_gpuinfo_sym(nc, "ncclAllReduce", &a->all_reduce) &
         rn_gpuinfo_sym(nc, "ncclGetErrorString", &a->nccl_error);
    if (!ok)
        return rn_errorf(RN_EGPU, "%s lacks a function --nccl needs (ncclCommInitAll, ncclAllReduce, ...)", nc->path);
    return RN_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wait for every device's stream until timeout seconds after `start` (now_s()): an
 * all-reduce that never ends (GPUs that cannot reach each other: peer-to-peer through a
 * PCIe switch with ACS on, a broken NVLink) is reported, not waited for. */
static int wait_streams(const nccl_api *a, int nd, void **stream, const int *dev, double start, double timeout,
                        size_t bytes) {
    nccl_api api = *a;
    int rc = RN_OK;
    for (int d = 0; d < nd; d++) {
        RN_GPUINFO_RT(api.set_device(dev[d]));
        for (;;) {
            int e = api.stream_query(stream[d]);
            if (e == 0) break;
            if (e != RT_NOT_READY) RN_GPUINFO_RT(e);
            if (now_s() - start > timeout)
                return rn_errorf(RN_EGPU,
                                 "the all-reduce of %zu MiB per GPU has not finished on cuda:%d within --timeout %g "
                                 "s: the GPUs cannot reach each other (NCCL_P2P_DISABLE=1 tells whether peer-to-peer "
                                 "transfers are the cause: PCIe ACS or the IOMMU, a broken NVLink; NCCL_DEBUG=INFO "
                                 "shows where NCCL waits)",
                                 bytes >> 20, dev[d], timeout);
            usleep(100);
        }
    }
fail:
    return rc;
}

/* iters all-reduces of count floats on every device, one group per all-reduce (as a
 * multi-GPU process must issue them), then a wait for every device's stream, given up
 * timeout seconds after the start. */
static int run(const nccl_api *a, int nd, void **comm, void **stream, void **send, void **recv, size_t count, int iters,
               const int *dev, double timeout) {
    nccl_api api = *a;
    int rc = RN_OK;
    double start = now_s();
    for (int it = 0; it < iters; it++) {
        NC(api.group_start());
        int e = 0;
        for (int d = 0; d < nd && !e; d++)
            e = api.all_reduce(send[d], recv[d], count, NC_FLOAT32, NC_SUM, comm[d], stream[d]);
        int e2 = api.group_end();
        NC(e ? e : e2);
    }
    rc = wait_streams(a, nd, stream, dev, start, timeout, count * sizeof(float));
fail:
    return rc;
}

/* Check each device's sum of count floats, read back `piece` floats at a time: element i
 * is host[i] x (1 + 2 + .. + nd), device d having sent host x (d + 1), exact in any order
 * of addition (below). */
static int check_sums(const nccl_api *a, int nd, void **recv, const int *dev, size_t count, size_t piece,
                      const float *host, float *back) {
    nccl_api api = *a;
    int rc = RN_OK;
    const float t = (float)(nd * (nd + 1) / 2);
    for (int d = 0; d < nd; d++) {
        RN_GPUINFO_RT(api.set_device(dev[d]));
        for (size_t lo = 0; lo < count; lo += piece) {
            size_t n = count - lo < piece ? count - lo : piece;
            RN_GPUINFO_RT(api.memcpy_(back, (const float *)recv[d] + lo, n * sizeof(float), RT_D2H));
            for (size_t i = 0; i < n; i++) {
                float want = t * host[lo + i];
                if (back[i] != want) /* (NaN, where nothing was written, too) */
                    return rn_errorf(RN_EGPU,
                                     "the all-reduce of %zu MiB per GPU is wrong on cuda:%d at element %zu: %g, "
                                     "want %g (%g x (1 + .. + %d), cuda:k sending %g x (k + 1)): a faulty link or "
                                     "driver between the GPUs (NCCL_P2P_DISABLE=1 tells whether peer-to-peer transfers "
                                     "are the cause)",
                                     count * sizeof(float) >> 20, dev[d], lo + i, back[i], want, host[lo + i], nd,
                                     host[lo + i]);
            }
        }
    }
fail:
    return rc;
}

int rn_gpuinfo_nccl(const rn_gpuinfo *g, double timeout, rn_gpunccl *out) {
    memset(out, 0, sizeof *out);
    if (!g->built_with_cuda)
        return rn_errorf(RN_ENOTSUP,
                         "this rn build has no GPU support: rebuild with CUDA, make USE_CUDA=1, to run --nccl");
    if (!(timeout > 0)) return rn_errorf(RN_EINVAL, "--nccl: timeout %g s: want more than 0", timeout);
    int nd = 0;
    for (int i = 0; i < g->ndev && nd < NCCL_MAXDEV; i++)
        if (g->dev[i].usable) out->dev[nd++] = g->dev[i].index;
    out->ndev = nd;
    snprintf(out->version, sizeof out->version, "%s", g->lib[RN_GPULIB_NCCL].version);
    if (nd < 2) {
        if (nd == g->ndev)
            snprintf(out->skipped, sizeof out->skipped, "%d GPU visible: an all-reduce needs 2 or more", nd);
        else
            snprintf(out->skipped, sizeof out->skipped, "%d usable GPU of %d visible: an all-reduce needs 2 or more",
                     nd, g->ndev);
        return RN_OK;
    }
    nccl_api api;
    int rc = load_api(g, &api);
    if (rc) return rc;

    void *comm[NCCL_MAXDEV] = {0}, *stream[NCCL_MAXDEV] = {0}, *send[NCCL_MAXDEV] = {0}, *recv[NCCL_MAXDEV] = {0};
    int have_comms = 0;
    size_t most = (size_t)NCCL_MAX_BYTES, first = (size_t)NCCL_MIN_BYTES;
    float *host = malloc(most), *mine = malloc(most), *back = malloc(first);
    if (!host || !mine || !back) {
        rc = rn_errorf(RN_ENOMEM, "--nccl: %zu MiB of host memory for the test data", (2 * most + first) >> 20);
        goto fail;
    }
    /* seeded random multiples of 1/256 in [-1, 1], device d sending them times d + 1: any
     * sum of them over up to 64 devices (at most 256 x 2080 / 256 in size) is exact in fp32
     * whatever the order NCCL adds in, so the check can ask for equality; and a device's
     * part taken twice, or another's left out, shows */
    int64_t nf = (int64_t)(most / sizeof(float));
    rn_rng_uniform(rn_rng_key(20260131, 9), host, nf, -1.0f, 1.0f);
    for (int64_t i = 0; i < nf; i++)
        host[i] = (float)(int)(host[i] * 256.0f) / 256.0f;
    for (int d = 0; d < nd; d++) {
        for (int64_t i = 0; i < nf; i++)
            mine[i] = host[i] * (float)(d + 1);
        RN_GPUINFO_RT(api.set_device(out->dev[d]));
        RN_GPUINFO_RT(api.malloc_(&send[d], most));
        RN_GPUINFO_RT(api.malloc_(&recv[d], most));
        RN_GPUINFO_RT(api.stream_create(&stream[d]));
        RN_GPUINFO_RT(api.memcpy_(send[d], mine, most, RT_H2D));
    }
    /* (blocking: NCCL's init takes no timeout here; NCCL_DEBUG=INFO shows where it waits) */
    NC(api.init_all(comm, nd, out->dev));
    have_comms = 1;

    for (long long bytes = NCCL_MIN_BYTES; bytes <= NCCL_MAX_BYTES && out->n < RN_GPUNCCL_MAX; bytes *= 2) {
        size_t count = (size_t)bytes / sizeof(float);
        /* the first call per size sets up NCCL's buffers and channels; time the second, on
           sums cleared to NaN first (a run that wrote nothing cannot pass), and check all
           of it */
        if ((rc = run(&api, nd, comm, stream, send, recv, count, 1, out->dev, timeout))) goto fail;
        for (int d = 0; d < nd; d++) {
            RN_GPUINFO_RT(api.set_device(out->dev[d]));
            RN_GPUINFO_RT(api.memset_(recv[d], 0xff, (size_t)bytes));
        }
        double t0 = now_s();
        if ((rc = run(&api, nd, comm, stream, send, recv, count, 1, out->dev, timeout))) goto fail;
        double one = now_s() - t0;
        if ((rc = check_sums(&api, nd, recv, out->dev, count, first / sizeof(float), host, back))) goto fail;
        int iters = one > 0 ? (int)(NCCL_SECONDS / one) : 100;
        iters = iters < 5 ? 5 : iters > 100 ? 100 : iters;
        t0 = now_s();
        if ((rc = run(&api, nd, comm, stream, send, recv, count, iters, out->dev, timeout))) goto fail;
        double s = (now_s() - t0) / iters;
        rn_gpunccl_result *r = &out->r[out->n++];
        r->bytes = bytes;
        r->us = s * 1e6;
        r->algbw = s > 0 ? bytes / s / 1e9 : -1;
        r->busbw = s > 0 ? r->algbw * 2.0 * (nd - 1) / nd : -1;
    }
    out->verified = out->n > 0; /* (every size with a result was checked first) */

fail:
    /* every communicator first (after a failure work may still be queued on any device,
       writing into its peers' buffers: abort, as destroy would wait for it), then the
       buffers */
    for (int d = 0; d < nd; d++)
        if (have_comms && comm[d]) (rc ? api.abort_ : api.destroy)(comm[d]);
    for (int d = 0; d < nd; d++) {
        if (api.set_device) api.set_device(out->dev[d]);
        if (stream[d]) api.stream_destroy(stream[d]);
        if (send[d]) api.free_(send[d]);
        if (recv[d]) api.free_(recv[d]);
    }
    free(host);
    free(mine);
    free(back);
    if (rc) return rn_error_context(rc, "--nccl across %d GPUs", nd);
    return RN_OK;
}
