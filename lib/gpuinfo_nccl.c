/* gpuinfo_nccl: --nccl, an all-reduce across every usable device of this machine from one
 * process, through its own dlsym binding of the CUDA runtime and NCCL (rn/gpuinfo.h), so
 * that rn-gpuinfo needs neither to start and says which one is missing. */
#include "rn/gpuinfo_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rn/err.h"
#include "rn/rng.h"

/* Values from nccl.h and cuda_runtime_api.h that this file uses. */
enum { NC_FLOAT32 = 7, NC_SUM = 0, RT_H2D = 1, RT_D2H = 2 };

#if defined(RN_HAVE_NCCL) && RN_HAVE_NCCL
#include <nccl.h>
_Static_assert((int)NC_FLOAT32 == (int)ncclFloat32 && (int)NC_SUM == (int)ncclSum, "NCCL values");
#endif
#if defined(RN_HAVE_CUDA) && RN_HAVE_CUDA
#include <cuda_runtime_api.h>
_Static_assert((int)RT_H2D == (int)cudaMemcpyHostToDevice && (int)RT_D2H == (int)cudaMemcpyDeviceToHost,
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
    int (*stream_sync)(void *);
    int (*stream_destroy)(void *);
    const char *(*error_string)(int);
    int (*init_all)(void **, int, const int *);
    int (*destroy)(void *);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*all_reduce)(const void *, void *, size_t, int, int, void *, void *);
    const char *(*nccl_error)(int);
} nccl_api;

#define NC(call)                                                                                                       \
    do {                                                                                                               \
        int e_ = (call);                                                                                               \
        if (e_ != 0) {                                                                                                 \
            rc = rn_errorf(RN_EGPU, "%s:%d: %s: %s (NCCL_DEBUG=INFO says more)", __FILE__, __LINE__, #call,           \
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
             rn_gpuinfo_sym(rt, "cudaStreamCreate", &a->stream_create) &
             rn_gpuinfo_sym(rt, "cudaStreamSynchronize", &a->stream_sync) &
             rn_gpuinfo_sym(rt, "cudaStreamDestroy", &a->stream_destroy) &
             rn_gpuinfo_sym(rt, "cudaGetErrorString", &a->error_string);
    if (!ok) return rn_errorf(RN_EGPU, "%s lacks a function --nccl needs (cudaMalloc, cudaStream*)", rt->path);
    ok = rn_gpuinfo_sym(nc, "ncclCommInitAll", &a->init_all) & rn_gpuinfo_sym(nc, "ncclCommDestroy", &a->destroy) &
         rn_gpuinfo_sym(nc, "ncclGroupStart", &a->group_start) & rn_gpuinfo_sym(nc, "ncclGroupEnd", &a->group_end) &
         rn_gpuinfo_sym(nc, "ncclAllReduce", &a->all_reduce) &
         rn_gpuinfo_sym(nc, "ncclGetErrorString", &a->nccl_error);
    if (!ok) return rn_errorf(RN_EGPU, "%s lacks a function --nccl needs (ncclCommInitAll, ncclAllReduce, ...)", nc->path);
    return RN_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* iters all-reduces of count floats on every device, one group per all-reduce (as a
 * multi-GPU process must issue them), then a wait for every device's stream. */
static int run(const nccl_api *a, int nd, void **comm, void **stream, void **send, void **recv, size_t count,
               int iters, const int *dev) {
    nccl_api api = *a;
    int rc = RN_OK;
    for (int it = 0; it < iters; it++) {
        NC(api.group_start());
        int e = 0;
        for (int d = 0; d < nd && !e; d++)
            e = api.all_reduce(send[d], recv[d], count, NC_FLOAT32, NC_SUM, comm[d], stream[d]);
        int e2 = api.group_end();
        NC(e ? e : e2);
    }
    for (int d = 0; d < nd; d++) {
        RN_GPUINFO_RT(api.set_device(dev[d]));
        RN_GPUINFO_RT(api.stream_sync(stream[d]));
    }
fail:
    return rc;
}

int rn_gpuinfo_nccl(const rn_gpuinfo *g, rn_gpunccl *out) {
    memset(out, 0, sizeof *out);
    if (!g->built_with_cuda)
        return rn_errorf(RN_ENOTSUP,
                         "this rn build has no GPU support: rebuild with CUDA, make USE_CUDA=1, to run --nccl");
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
    float *host = malloc(most), *back = malloc(first);
    if (!host || !back) {
        rc = rn_errorf(RN_ENOMEM, "--nccl: %zu MiB of host memory for the test data", (most + first) >> 20);
        goto fail;
    }
    /* seeded random multiples of 1/256 in [-1, 1]: any sum of up to 64 of them is exact in
     * fp32 whatever the order NCCL adds in, so the check below can ask for equality */
    int64_t nf = (int64_t)(most / sizeof(float));
    rn_rng_uniform(rn_rng_key(20260131, 9), host, nf, -1.0f, 1.0f);
    for (int64_t i = 0; i < nf; i++)
        host[i] = (float)(int)(host[i] * 256.0f) / 256.0f;
    for (int d = 0; d < nd; d++) {
        RN_GPUINFO_RT(api.set_device(out->dev[d]));
        RN_GPUINFO_RT(api.malloc_(&send[d], most));
        RN_GPUINFO_RT(api.malloc_(&recv[d], most));
        RN_GPUINFO_RT(api.stream_create(&stream[d]));
        RN_GPUINFO_RT(api.memcpy_(send[d], host, most, RT_H2D));
    }
    NC(api.init_all(comm, nd, out->dev));
    have_comms = 1;

    for (long long bytes = NCCL_MIN_BYTES; bytes <= NCCL_MAX_BYTES && out->n < RN_GPUNCCL_MAX; bytes *= 2) {
        size_t count = (size_t)bytes / sizeof(float);
        /* the first call per size sets up NCCL's buffers and channels; time the second */
        if ((rc = run(&api, nd, comm, stream, send, recv, count, 1, out->dev))) goto fail;
        double t0 = now_s();
        if ((rc = run(&api, nd, comm, stream, send, recv, count, 1, out->dev))) goto fail;
        double one = now_s() - t0;
        int iters = one > 0 ? (int)(NCCL_SECONDS / one) : 100;
        iters = iters < 5 ? 5 : iters > 100 ? 100 : iters;
        if (bytes == NCCL_MIN_BYTES) {
            for (int d = 0; d < nd; d++) {
                RN_GPUINFO_RT(api.set_device(out->dev[d]));
                RN_GPUINFO_RT(api.memcpy_(back, recv[d], first, RT_D2H));
                for (size_t i = 0; i < count; i++) {
                    if (back[i] != (float)nd * host[i]) {
                        rc = rn_errorf(RN_EGPU,
                                       "--nccl: the all-reduce is wrong on cuda:%d at element %zu: %g, want %g "
                                       "(%d x %g): a faulty link or driver between the GPUs (NCCL_P2P_DISABLE=1 "
                                       "tells whether peer-to-peer transfers are the cause)",
                                       out->dev[d], i, back[i], nd * host[i], nd, host[i]);
                        goto fail;
                    }
                }
            }
            out->verified = 1;
        }
        t0 = now_s();
        if ((rc = run(&api, nd, comm, stream, send, recv, count, iters, out->dev))) goto fail;
        double s = (now_s() - t0) / iters;
        rn_gpunccl_result *r = &out->r[out->n++];
        r->bytes = bytes;
        r->us = s * 1e6;
        r->algbw = s > 0 ? bytes / s / 1e9 : -1;
        r->busbw = s > 0 ? r->algbw * 2.0 * (nd - 1) / nd : -1;
    }

fail:
    for (int d = 0; d < nd; d++) {
        if (have_comms && comm[d]) api.destroy(comm[d]);
        if (api.set_device) api.set_device(out->dev[d]);
        if (stream[d]) api.stream_destroy(stream[d]);
        if (send[d]) api.free_(send[d]);
        if (recv[d]) api.free_(recv[d]);
    }
    free(host);
    free(back);
    if (rc) return rn_error_context(rc, "--nccl across %d GPUs", nd);
    return RN_OK;
}
