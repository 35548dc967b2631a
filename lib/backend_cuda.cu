/* CUDA backend: cuDNN convolutions (NHWC activations, OHWI filters), cuBLAS for the fully
 * connected layer, and our own kernels for everything a library does not fit exactly:
 * BatchNorm (see the note there), pooling with torch's tie rules, elementwise ops, input
 * normalise, softmax cross-entropy, the SGD update (fused with AMP's compute copy), casts
 * and AMP's overflow check. Arguments arrive checked (lib/backend.c); every
 * CUDA/cuDNN/cuBLAS call is checked here with its text, file, line and the library's own
 * message.
 *
 * Settings, from rn_backend_opts when the context is created and shown in
 * rn_backend_name() (tools take them from the RN_CUDA_* variables, rn_cli_backend_env):
 *   cuda_workspace        conv workspace limit per algorithm
 *   cuda_tf32             allow TF32 tensor cores for fp32 convolutions and GEMMs (off by
 *                         default, so fp32 results compare with the CPU backend at 1e-4)
 *   cuda_deterministic    only deterministic convolution algorithms
 *   cuda_bn_cudnn         BatchNorm training forward and backward by cuDNN's fused
 *                         BN+add+ReLU where it applies (fp16, channels a multiple of 4;
 *                         see there), else ours
 *   cuda_stem_plain       run 3-channel fp16/bf16 convs (the stem) unpadded, not on
 *                         copies padded to 4 channels (see there)
 *   cuda_conv_heuristic   take cuDNN's heuristic choice without running anything, instead
 *                         of benchmarking every algorithm once per shape
 *   cuda_algo_cache       a file of Find's choices per (device, cuDNN version, shape,
 *                         dtype, direction, TF32/deterministic, workspace limit), read at
 *                         start and appended to, so later processes skip the search
 *
 * One context uses one device and one stream for its ops, plus a copy stream for
 * rn_backend_upload_async (so the next batch's pixels cross the bus while this batch
 * computes); call it from the thread that created it
 * (the current device is set when the context is created). In a build with NCCL
 * (RN_HAVE_NCCL) the context also holds one communicator for rn_backend_coll_*. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef RN_HAVE_NCCL
#include <nccl.h>
#endif

#include "rn/backend_impl.h"
#include "rn/cudnn_status.h"
extern "C" {
#include "rn/algocache.h"
#include "rn/err.h"
#include "rn/philox.h"
#include "rn/tensor.h"
}

/* Largest channel count of rn_input_normalize (mean/std travel as kernel arguments). */
#define NORM_MAXC 64
/* Threads per block of the elementwise kernels. */
#define TPB 256

/* a failed call's error is read here (cudaGetLastError clears it), so that the next
 * kernel's launch check does not report it again under the kernel's name */
#define CU(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { (void)cudaGetLastError(); \
    return rn_errorf(RN_EGPU, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); } } while (0)
/* frees have no caller to report to: clear what they leave */
#define FREED(call) do { if ((call) != cudaSuccess) (void)cudaGetLastError(); } while (0)
#define DNN(call) do { cudnnStatus_t s_ = (call); if (s_ != CUDNN_STATUS_SUCCESS) \
    return rn_errorf(RN_EGPU, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudnnGetErrorString(s_)); } while (0)
#define BLAS(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) \
    return rn_errorf(RN_EGPU, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cublas.status(s_)); } while (0)
#define RN_STR_(x) #x
#define RN_STR(x) RN_STR_(x)
/* cuBLAS is opened (dlopen) when the first context is, not linked: its start-up
 * (cuBLASLt's static initialisers, about 0.35 s) would otherwise be paid by every
 * rn-train, rn-eval and rn-export process, on a GPU or not. These are the calls rn makes;
 * cublas_v2.h's macros give the exported names (cublasCreate is cublasCreate_v2). */
#define CUBLAS_SONAME "libcublas.so." RN_STR(CUBLAS_VER_MAJOR)
static struct {
    decltype(&cublasCreate) create;
    decltype(&cublasDestroy) destroy;
    decltype(&cublasSetStream) set_stream;
    decltype(&cublasSetWorkspace) set_workspace;
    decltype(&cublasSetMathMode) set_math;
    /* the exported C function; C++ also sees an inline overload taking cudaDataType */
    cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                           const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    decltype(&cublasGetStatusString) status;
    decltype(&cublasGetVersion) version;
    char error[600]; /* why it could not be loaded; empty once it is */
} cublas;
static pthread_once_t cublas_once = PTHREAD_ONCE_INIT;

static void cublas_load(void) {
    void *h = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(cublas.error, sizeof cublas.error, "cannot load %s: %s", CUBLAS_SONAME, e ? e : "dlopen failed");
        return;
    }
#define CUBLAS_SYM(field, fn) \
    if (!(*(void **)&cublas.field = dlsym(h, RN_STR(fn)))) { \
        snprintf(cublas.error, sizeof cublas.error, "%s lacks %s", CUBLAS_SONAME, RN_STR(fn)); return; }
    CUBLAS_SYM(create, cublasCreate)
    CUBLAS_SYM(destroy, cublasDestroy)
    CUBLAS_SYM(set_stream, cublasSetStream)
    CUBLAS_SYM(set_workspace, cublasSetWorkspace)
    CUBLAS_SYM(set_math, cublasSetMathMode)
    CUBLAS_SYM(gemm, cublasGemmEx)
    CUBLAS_SYM(status, cublasGetStatusString)
    CUBLAS_SYM(version, cublasGetVersion)
#undef CUBLAS_SYM
}

/* after a kernel launch: a bad configuration shows here, a fault at the next sync
 * (RN_SYNC=1 makes that the same op) */
#define LAUNCHED(kernel) do { be->launches++; cudaError_t e_ = cudaGetLastError(); if (e_ != cudaSuccess) \
    return rn_errorf(RN_EGPU, "%s:%d: kernel %s: %s", __FILE__, __LINE__, kernel, cudaGetErrorString(e_)); } while (0)

/* One convolution shape: descriptors and the algorithm chosen for each direction, each
 * direction chosen on its first use (an inference network never searches backward
 * algorithms; the stem, with no input gradient, never searches backward-data). */
typedef struct {
    int key[12]; /* dtype n h w c k kh kw stride_h stride_w pad_h pad_w */
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    int have;    /* RN_CONV_* directions chosen so far */
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    cudnnMathType_t fwd_math, data_math, filter_math;
    size_t ws_fwd, ws_data, ws_filter; /* each chosen algorithm's workspace */
} conv_plan;

/* async uploads a profiled step times on the copy stream (more are left untimed) */
#define RN_CUDA_COPY_SPANS 16
/* cuBLAS's workspace: NVIDIA's recommendation for Hopper (32 MiB), enough for the others */
#define RN_CUDA_BLAS_WS ((size_t)32 << 20)

typedef struct {
    int dev, sms;
    cudaStream_t stream;
    cudaStream_t copy;       /* rn_backend_upload_async's stream */
    cudaEvent_t copied;      /* recorded on copy after the last async upload */
    cudaEvent_t consumed;    /* recorded on stream at the last async upload: the ops the
                                next one must wait for (rn/backend.h) */
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    int tf32, deterministic, heuristic;
    size_t ws_limit; /* bytes */
    rn_algocache *algos; /* Find's earlier choices (opts.cuda_algo_cache), or NULL */
    char devid[96];      /* the device in the cache's keys: name and compute capability */
    conv_plan *plans;
    int nplans, cap;
    int bn_cudnn; /* RN_CUDA_BN=cudnn: training BN through cuDNN where it applies */
    struct {
        int64_t m;
        int c, relu, res, bwd;
    } bn_refused[32]; /* shapes cuDNN's BN refused (bwd: its backward): ours run them from then
                         on, captured or not */
    int nbn_refused;
    struct {
        const void *reserve; /* a layer's reserve, which the forward last filled through cuDNN */
        const float *beta;   /* that forward's beta (cuDNN's backward with a ReLU wants it) */
        int res;             /* with a residual */
    } bn_dnn_ran[512];
    int nbn_dnn_ran, bn_dnn_next; /* entries; the one a full table overwrites next */
    int stem_plain; /* RN_CUDA_STEM=plain: 3-channel half-precision convs not padded to 4 */
    /* RN_CUDA_INJECT: the status Find, the fused BN forward and its backward return
       instead of running (0: they run) */
    cudnnStatus_t inj_find, inj_bn, inj_bn_bwd;
    cudnnTensorDescriptor_t bn_x, bn_stat;
    cudnnActivationDescriptor_t bn_relu;
    float *coef; /* BN inference scale and shift, coef_cap floats */
    size_t coef_cap;
    double *xent_part; /* softmax_xent's per-row loss terms, xent_cap doubles */
    size_t xent_cap;
    int64_t capture_launches; /* be->launches at rn_backend_capture_begin */
    void *blas_ws;       /* cuBLAS's workspace, RN_CUDA_BLAS_WS bytes */
    cudaEvent_t *marks;  /* rn_backend_mark's timestamps on stream, nmarks created */
    int64_t nmarks;
    /* since mark 0: each async upload's start and end on copy (rn_backend_copy_spans) */
    cudaEvent_t copy_ev[2 * RN_CUDA_COPY_SPANS];
    int ncopy_ev, ncopy; /* events created; uploads timed since mark 0 */
#ifdef RN_HAVE_NCCL
    ncclComm_t comm;     /* rn_backend_coll_init's communicator (non-blocking); NULL before,
                            and after an abort */
    int rank, world;
    double coll_timeout; /* seconds one wait for a collective may take before it is given up */
    float *coll_small;   /* (world, world) floats: coll_sum's receive buffer when the
                            caller's scratch is too small for it (see there) */
    int coll_small_world; /* the world coll_small was made for */
    cudaStream_t comm_st; /* coll_sum_async's stream (made by coll_init) */
    cudaEvent_t grads_ev, comm_ev; /* recorded on stream before a bucket goes / on comm_st
                            when the compute stream joins it */
    void (*coll_poll)(void *); /* called while a collective waits (rn_backend_coll_set_poll) */
    void *coll_poll_arg;
#endif
    rn_backend_ops ops;
} cuda_ctx;

static cuda_ctx *CTX(rn_backend *be) { return (cuda_ctx *)be->impl; }

static int64_t blocks_for(const cuda_ctx *g, int64_t n) {
    int64_t b = (n + TPB - 1) / TPB, cap = (int64_t)g->sms * 32;
    return b < 1 ? 1 : b > cap ? cap : b;
}

/* ---- element access: every kernel computes in fp32 ---- */

__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ float ld(__half v) { return __half2float(v); }
__device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T st(float v);
template <> __device__ __forceinline__ float st<float>(float v) { return v; }
template <> __device__ __forceinline__ __half st<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* where a ReLU's backward passes the gradient, judged on its output y: y > 0 or NaN (as
 * PyTorch); the ReLU mask (bn_masked) records exactly this */
__device__ __forceinline__ bool relu_passes(float y) { return !(y <= 0); }

/* channel of flat NHWC index i: 32-bit division when the tensor allows (several times
 * cheaper than 64-bit on the GPU) */
__device__ __forceinline__ int chan(int64_t i, int c, int64_t n) {
    return n <= 0xffffffffLL ? (int)((uint32_t)i % (uint32_t)c) : (int)(i % c);
}

/* V consecutive elements moved as one load or store (16 bytes: V = VEC<T>). The
 * elementwise and BN kernels take V = VEC<T> where the tensor allows (vec_ok): each
 * thread then keeps 16 bytes per tensor in flight instead of 2 or 4, which a grid-stride
 * loop of scalar loads needs to come near the memory's bandwidth. Every element gets the
 * same float operations at any V, so an elementwise result does not depend on it; BN's
 * per-channel sums are cut into other partial sums at V > 1 (bn_moments_v_k), so its
 * statistics may differ from the V = 1 path's in the last bits. */
template <typename T, int V> struct alignas(sizeof(T) * V) pack {
    T v[V];
};
template <typename T> constexpr int VEC = 16 / (int)sizeof(T);
template <typename T, int V> __device__ __forceinline__ pack<T, V> ldv(const T *p, int64_t i) {
    return *(const pack<T, V> *)(p + i);
}
template <typename T, int V> __device__ __forceinline__ void stv(T *p, int64_t i, const pack<T, V> &x) {
    *(pack<T, V> *)(p + i) = x;
}
/* 16-byte loads apply: n (the elements, or a BN's channels) a multiple of VEC<T>, and
 * every pointer (NULL: an absent operand) on a 16-byte boundary */
template <typename T>
static int vec_ok(int64_t n, const void *a, const void *b = NULL, const void *c = NULL, const void *d = NULL) {
    const void *p[] = {a, b, c, d};
    if (n % VEC<T>) return 0;
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)p[i] % 16) return 0;
    return 1;
}

/* Run F<T> for the element type of dtype (lib/backend.c admits only these three). */
#define BY_DTYPE(dtype, call) \
    ((dtype) == RN_F16 ? call<__half> : (dtype) == RN_BF16 ? call<__nv_bfloat16> : call<float>)

/* ---- memory ---- */

static int cuda_alloc(rn_backend *be, size_t bytes, void **out) {
    void *p = NULL;
    /* (a buffer grown on first use, inside a capture: the caller runs eagerly first) */
    if (be->capturing)
        return rn_errorf(RN_EINVAL, "cuda:%d: cudaMalloc(%zu bytes) inside a graph capture", CTX(be)->dev, bytes);
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        cudaGetLastError();
        return rn_errorf(e == cudaErrorMemoryAllocation ? RN_ENOMEM : RN_EGPU,
                         "cuda:%d: cudaMalloc(%zu bytes = %.1f MiB): %s; %.1f MiB of %.1f MiB free "
                         "(try a smaller --batch or --accum with micro-batches)",
                         CTX(be)->dev, bytes, bytes / 1048576.0, cudaGetErrorString(e),
                         fr / 1048576.0, tot / 1048576.0);
    }
    *out = p;
    return RN_OK;
}

static void cuda_free(rn_backend *be, void *p) {
    (void)be;
    FREED(cudaFree(p));
}

/* From pageable memory cudaMemcpyAsync returns once the bytes are staged; from pinned
 * memory it returns at once and reads src when the stream gets there, so a caller that
 * refilled src (a loader slot's labels) would race it: wait for that copy. */
static int cuda_upload(rn_backend *be, void *dst, const void *src, size_t bytes) {
    cudaStream_t st = CTX(be)->stream;
    be->launches++;
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
    cudaPointerAttributes at;
    CU(cudaPointerGetAttributes(&at, src));
    if (at.type == cudaMemoryTypeHost) CU(cudaStreamSynchronize(st));
    return RN_OK;
}

/* rn_backend_put: the bytes as the kernel's argument, so the host waits for nothing */
typedef struct {
    unsigned char b[RN_BACKEND_PUT_MAX];
} put_bytes;

__global__ void put_k(unsigned char *dst, put_bytes v, int n) {
    int i = (int)threadIdx.x;
    if (i < n) dst[i] = v.b[i];
}

static int cuda_put(rn_backend *be, void *dst, const void *src, size_t bytes) {
    put_bytes v;
    memset(&v, 0, sizeof v);
    memcpy(v.b, src, bytes);
    put_k<<<1, RN_BACKEND_PUT_MAX, 0, CTX(be)->stream>>>((unsigned char *)dst, v, (int)bytes);
    LAUNCHED("put");
    return RN_OK;
}

static int cuda_download(rn_backend *be, void *dst, const void *src, size_t bytes) {
    be->launches++;
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, CTX(be)->stream));
    CU(cudaStreamSynchronize(CTX(be)->stream));
    return RN_OK;
}

static int cuda_copy(rn_backend *be, void *dst, const void *src, size_t bytes) {
    be->launches++;
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CTX(be)->stream));
    return RN_OK;
}

static int cuda_zero(rn_backend *be, void *dst, size_t bytes) {
    be->launches++;
    CU(cudaMemsetAsync(dst, 0, bytes, CTX(be)->stream));
    return RN_OK;
}

static int cuda_mem_info(rn_backend *be, size_t *free_bytes, size_t *total_bytes) {
    CU(cudaMemGetInfo(free_bytes, total_bytes));
    (void)be;
    return RN_OK;
}

static int cuda_host_alloc(rn_backend *be, size_t bytes, void **out) {
    /* portable: the loader may touch it from any thread, with any device current */
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return rn_errorf(e == cudaErrorMemoryAllocation ? RN_ENOMEM : RN_EGPU, "cuda:%d: cudaHostAlloc(%zu bytes = %.1f MiB of pinned host memory): %s "
                         "(lower --batch or --workers, or raise the locked-memory limit: ulimit -l)",
                         CTX(be)->dev, bytes, bytes / 1048576.0, cudaGetErrorString(e));
    }
    return RN_OK;
}

static void cuda_host_free(rn_backend *be, void *p) {
    (void)be;
    FREED(cudaFreeHost(p));
}

static int cuda_upload_async(rn_backend *be, const rn_upload_part *parts, int n) {
    cuda_ctx *g = CTX(be);
    CU(cudaStreamWaitEvent(g->copy, g->consumed, 0));
    /* a profile's marks are on (mark 0 recorded): time the copy itself, after its wait */
    int k = g->nmarks > 0 && g->ncopy < RN_CUDA_COPY_SPANS ? g->ncopy : -1;
    for (; k >= 0 && g->ncopy_ev < 2 * k + 2; g->ncopy_ev++)
        CU(cudaEventCreate(&g->copy_ev[g->ncopy_ev]));
    if (k >= 0) CU(cudaEventRecord(g->copy_ev[2 * k], g->copy));
    for (int i = 0; i < n; i++) {
        be->launches++;
        CU(cudaMemcpyAsync(parts[i].dst, parts[i].src, parts[i].bytes, cudaMemcpyHostToDevice, g->copy));
    }
    if (k >= 0) {
        CU(cudaEventRecord(g->copy_ev[2 * k + 1], g->copy));
        g->ncopy++;
    }
    CU(cudaEventRecord(g->copied, g->copy));
    CU(cudaEventRecord(g->consumed, g->stream));
    CU(cudaStreamWaitEvent(g->stream, g->copied, 0));
    return RN_OK;
}

static int cuda_upload_wait(rn_backend *be) {
    CU(cudaEventSynchronize(CTX(be)->copied));
    return RN_OK;
}

static int cuda_sync(rn_backend *be) {
    CU(cudaStreamSynchronize(CTX(be)->stream));
    CU(cudaGetLastError());
    return RN_OK;
}

static int cuda_pci_bus_id(rn_backend *be, char *buf, size_t cap) {
    CU(cudaDeviceGetPCIBusId(buf, (int)cap, CTX(be)->dev));
    return RN_OK;
}

/* --profile's timestamps: one event per mark, created on first use and kept (a profiled
 * step records the same number each time), recorded on the compute stream in order */
static int cuda_mark(rn_backend *be, int64_t i) {
    cuda_ctx *g = CTX(be);
    if (i > g->nmarks)
        return rn_errorf(RN_EINVAL, "cuda: mark %lld before mark %lld", (long long)i, (long long)g->nmarks);
    if (i == g->nmarks) {
        cudaEvent_t *m = (cudaEvent_t *)realloc(g->marks, sizeof *m * (size_t)(i + 1));
        if (!m) return rn_errorf(RN_ENOMEM, "cuda: %lld timing events", (long long)(i + 1));
        g->marks = m;
        CU(cudaEventCreate(&g->marks[i]));
        g->nmarks = i + 1;
    }
    CU(cudaEventRecord(g->marks[i], g->stream));
    if (i == 0) g->ncopy = 0; /* a new series: its copies from here */
    return RN_OK;
}

static int cuda_copy_spans(rn_backend *be, int64_t cap, double *t0, double *t1, int64_t *n) {
    cuda_ctx *g = CTX(be);
    *n = 0;
    if (g->nmarks < 1) return RN_OK;
    for (int k = 0; k < g->ncopy && k < cap; k++) {
        float a = 0, b = 0;
        CU(cudaEventSynchronize(g->copy_ev[2 * k + 1]));
        /* events of two streams of one device: elapsed times between them are defined */
        CU(cudaEventElapsedTime(&a, g->marks[0], g->copy_ev[2 * k]));
        CU(cudaEventElapsedTime(&b, g->marks[0], g->copy_ev[2 * k + 1]));
        t0[k] = 1e-3 * (double)a, t1[k] = 1e-3 * (double)b;
        *n = k + 1;
    }
    return RN_OK;
}

static int cuda_marks_read(rn_backend *be, int64_t n, double *sec) {
    cuda_ctx *g = CTX(be);
    if (n > g->nmarks)
        return rn_errorf(RN_EINVAL, "cuda: %lld marks read, %lld recorded", (long long)n, (long long)g->nmarks);
    /* marks complete in stream order: the last one done means all are */
    CU(cudaEventSynchronize(g->marks[n - 1]));
    for (int64_t i = 0; i < n; i++) {
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, g->marks[0], g->marks[i]));
        sec[i] = 1e-3 * (double)ms;
    }
    return RN_OK;
}

/* ---- graphs (rn_backend_capture_begin): the compute stream's ops recorded and replayed ---- */

struct rn_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

static int cuda_capture_begin(rn_backend *be) {
    cuda_ctx *g = CTX(be);
    /* thread-local: a call of this thread that is unsafe in a capture (a cudaMalloc, a
       synchronising copy) fails, and invalidates the capture, instead of running out of
       order; the loader's threads are not affected */
    CU(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
    g->capture_launches = be->launches;
    return RN_OK;
}

static int cuda_capture_end(rn_backend *be, int keep, rn_graph **out, int64_t *nodes) {
    cuda_ctx *g = CTX(be);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(g->stream, &graph);
    be->launches = g->capture_launches; /* a capture launches nothing */
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (graph) (void)cudaGraphDestroy(graph);
        return rn_errorf(RN_EGPU, "cuda:%d: cudaStreamEndCapture: %s (a call inside the capture broke it)", g->dev,
                         cudaGetErrorString(e));
    }
    if (!keep) {
        FREED(cudaGraphDestroy(graph));
        return RN_OK;
    }
    size_t n = 0;
    e = cudaGraphGetNodes(graph, NULL, &n);
    rn_graph *r = (rn_graph *)calloc(1, sizeof *r);
    if (e == cudaSuccess && r) e = cudaGraphInstantiate(&r->exec, graph, 0);
    if (e != cudaSuccess || !r) {
        (void)cudaGetLastError();
        free(r);
        FREED(cudaGraphDestroy(graph));
        if (e == cudaSuccess) return rn_errorf(RN_ENOMEM, "cuda: out of host memory for a graph");
        return rn_errorf(RN_EGPU, "cuda:%d: instantiating a captured graph of %zu nodes: %s", g->dev, n,
                         cudaGetErrorString(e));
    }
    r->graph = graph;
    *out = r;
    *nodes = (int64_t)n;
    return RN_OK;
}

static int cuda_graph_launch(rn_backend *be, rn_graph *r) {
    be->launches++;
    CU(cudaGraphLaunch(r->exec, CTX(be)->stream));
    return RN_OK;
}

static void cuda_graph_free(rn_backend *be, rn_graph *r) {
    (void)be;
    /* a launched graph may still run: destroying it is safe (CUDA keeps it until done) */
    FREED(cudaGraphExecDestroy(r->exec));
    FREED(cudaGraphDestroy(r->graph));
    free(r);
}

/* ---- convolution (cuDNN) ---- */

static cudnnDataType_t dnn_type(int dtype) {
    return dtype == RN_F16 ? CUDNN_DATA_HALF : dtype == RN_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

/* The math type a direction searches and runs with. fp32 without TF32 must be FMA_MATH:
 * cuDNN's DEFAULT_MATH lets Ampere and later use TF32 tensor cores for fp32. */
static cudnnMathType_t search_math(const cuda_ctx *g, int dtype) {
    if (dtype != RN_F32) return CUDNN_TENSOR_OP_MATH;
    return g->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

/* strict: fp32 without TF32 takes only results measured in FMA math (Find also times
 * DEFAULT_MATH, which may be TF32 on Ampere and later); the second pass admits those,
 * run as FMA, when no FMA result fits */
static int math_ok(const cuda_ctx *g, int dtype, cudnnMathType_t m, int strict) {
    if (dtype == RN_F32 && !g->tf32) return m == CUDNN_FMA_MATH || (!strict && m == CUDNN_DEFAULT_MATH);
    return 1;
}

/* The run-time math type for an algorithm found with math m. */
static cudnnMathType_t run_math(const cuda_ctx *g, int dtype, cudnnMathType_t m) {
    return dtype == RN_F32 && !g->tf32 ? CUDNN_FMA_MATH : m;
}

static void plan_destroy(conv_plan *p) {
    if (p->x) cudnnDestroyTensorDescriptor(p->x);
    if (p->y) cudnnDestroyTensorDescriptor(p->y);
    if (p->w) cudnnDestroyFilterDescriptor(p->w);
    if (p->conv) cudnnDestroyConvolutionDescriptor(p->conv);
    memset(p, 0, sizeof *p);
}

/* Pick the first (fastest for Find, best for the heuristic) result that succeeded, fits
 * the workspace limit, has an allowed math type and, when asked, is deterministic. */
#define PICK(perf, got, out, math, mem, what)                                                 \
    do {                                                                                      \
        int i_ = (got);                                                                       \
        for (int strict_ = 1; strict_ >= 0 && i_ == (got); strict_--)                         \
            for (i_ = 0; i_ < (got); i_++)                                                    \
                if ((perf)[i_].status == CUDNN_STATUS_SUCCESS && (perf)[i_].memory <= limit && \
                    math_ok(g, d->dtype, (perf)[i_].mathType, strict_) &&                     \
                    (!g->deterministic || (perf)[i_].determinism == CUDNN_DETERMINISTIC))     \
                    break;                                                                    \
        if (i_ == (got))                                                                      \
            return rn_errorf(RN_EGPU, "conv %s %s n=%d h=%d w=%d c=%d k=%d %dx%d stride %d "   \
                             "pad %d: cuDNN offers no algorithm within %zu MiB of workspace%s "  \
                             "(raise RN_CUDA_WORKSPACE_MB)", what, rn_dtype_name(d->dtype),   \
                             d->n, d->h, d->w, d->c, d->k, d->kh, d->kw, d->stride_h,         \
                             d->pad_h, limit >> 20,                                           \
                             g->deterministic ? " that is deterministic" : "");               \
        (out) = (perf)[i_].algo;                                                              \
        (math) = run_math(g, d->dtype, (perf)[i_].mathType);                                  \
        (mem) = (perf)[i_].memory;                                                            \
    } while (0)

/* The descriptors of a new plan; no algorithm chosen yet. */
static int plan_describe(const rn_conv_desc *d, conv_plan *p) {
    cudnnDataType_t t = dnn_type(d->dtype);
    DNN(cudnnCreateTensorDescriptor(&p->x));
    DNN(cudnnCreateTensorDescriptor(&p->y));
    DNN(cudnnCreateFilterDescriptor(&p->w));
    DNN(cudnnCreateConvolutionDescriptor(&p->conv));
    DNN(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NHWC, t, d->n, d->c, d->h, d->w));
    DNN(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NHWC, t, d->n, d->k, d->p, d->q));
    DNN(cudnnSetFilter4dDescriptor(p->w, t, CUDNN_TENSOR_NHWC, d->k, d->c, d->kh, d->kw));
    DNN(cudnnSetConvolution2dDescriptor(p->conv, d->pad_h, d->pad_w, d->stride_h, d->stride_w, 1, 1,
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    int on, oh, ow, oc;
    DNN(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &on, &oc, &oh, &ow));
    if (on != d->n || oc != d->k || oh != d->p || ow != d->q)
        return rn_errorf(RN_EGPU, "conv: cuDNN computes output %dx%dx%dx%d, rn expects %dx%dx%dx%d", on, oh, ow,
                         oc, d->n, d->p, d->q, d->k);
    return RN_OK;
}

/* Take a choice from the algorithm cache when cuDNN still accepts it for this shape
 * within limit (an entry from another cuDNN build, or edited by hand, is searched again);
 * 1 when taken. */
static int plan_cached(cuda_ctx *g, conv_plan *p, int dir, const rn_algo_val *v, size_t limit) {
    size_t ws = 0;
    cudnnMathType_t m = (cudnnMathType_t)v->math;
    if (cudnnSetConvolutionMathType(p->conv, m) != CUDNN_STATUS_SUCCESS) return 0;
    cudnnStatus_t st;
    if (dir == RN_CONV_FWD)
        st = cudnnGetConvolutionForwardWorkspaceSize(g->dnn, p->x, p->w, p->conv, p->y,
                                                     (cudnnConvolutionFwdAlgo_t)v->algo, &ws);
    else if (dir == RN_CONV_BWD_DATA)
        st = cudnnGetConvolutionBackwardDataWorkspaceSize(g->dnn, p->w, p->y, p->conv, p->x,
                                                          (cudnnConvolutionBwdDataAlgo_t)v->algo, &ws);
    else
        st = cudnnGetConvolutionBackwardFilterWorkspaceSize(g->dnn, p->x, p->y, p->conv, p->w,
                                                            (cudnnConvolutionBwdFilterAlgo_t)v->algo, &ws);
    if (st != CUDNN_STATUS_SUCCESS || ws > limit) return 0;
    if (dir == RN_CONV_FWD) p->fwd = (cudnnConvolutionFwdAlgo_t)v->algo, p->fwd_math = m, p->ws_fwd = ws;
    else if (dir == RN_CONV_BWD_DATA) p->bwd_data = (cudnnConvolutionBwdDataAlgo_t)v->algo, p->data_math = m, p->ws_data = ws;
    else p->bwd_filter = (cudnnConvolutionBwdFilterAlgo_t)v->algo, p->filter_math = m, p->ws_filter = ws;
    p->have |= dir;
    return 1;
}

/* Choose the algorithm of one direction (RN_CONV_FWD, _BWD_DATA or _BWD_FILTER); the op
 * holds `held` bytes of the workspace for itself (the stem's padded copies). */
static int plan_choose(rn_backend *be, const rn_conv_desc *d, conv_plan *p, int dir, size_t held) {
    cuda_ctx *g = CTX(be);
    /* After a reservation exists, a new shape (a smaller last batch) must fit in it. */
    size_t limit = g->ws_limit - held; /* (held <= ws_limit: stem_pad) */
    if (be->ws_bytes) {
        size_t room = be->ws_bytes > held ? be->ws_bytes - held : 0;
        if (room < limit) limit = room;
    }
    rn_algo_key ck;
    rn_algo_val cv;
    if (g->algos && !g->heuristic) {
        memset(&ck, 0, sizeof ck);
        memcpy(ck.device, g->devid, sizeof ck.device);
        ck.cudnn = (int)cudnnGetVersion();
        memcpy(ck.shape, p->key, sizeof ck.shape);
        ck.dir = dir;
        ck.flags = (g->tf32 ? 1 : 0) | (g->deterministic ? 2 : 0);
        ck.ws_limit = limit;
        if (rn_algocache_get(g->algos, &ck, &cv) && plan_cached(g, p, dir, &cv, limit)) return RN_OK;
    }
    int timed = 0; /* Find ran (not the heuristic): worth keeping */
    DNN(cudnnSetConvolutionMathType(p->conv, search_math(g, d->dtype)));
    /* Find runs every algorithm on scratch memory it allocates itself; the heuristic
       (RN_CUDA_CONV_ALGO=heuristic, or where Find cannot run: a shape it does not support,
       or scratch that does not fit in what is free, as for a new shape late in a run that
       filled the device) runs nothing */
#define CHOOSE(find, get)                                                                       \
    do {                                                                                        \
        cudnnStatus_t s_ = g->heuristic ? CUDNN_STATUS_SUCCESS : g->inj_find ? g->inj_find : (find); \
        if (g->heuristic || rn_dnn_find_falls_back(s_)) {                                       \
            (void)cudaGetLastError(); /* a failed scratch allocation leaves its error */         \
            DNN(get);                                                                           \
        } else if (s_ != CUDNN_STATUS_SUCCESS)                                                  \
            return rn_errorf(RN_EGPU, "%s:%d: %s: %s", __FILE__, __LINE__, #find, cudnnGetErrorString(s_)); \
        else timed = 1;                                                                         \
    } while (0)
    int got = 0;
    if (dir == RN_CONV_FWD) {
        cudnnConvolutionFwdAlgoPerf_t pf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CHOOSE(cudnnFindConvolutionForwardAlgorithm(g->dnn, p->x, p->w, p->conv, p->y,
                                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, pf),
               cudnnGetConvolutionForwardAlgorithm_v7(g->dnn, p->x, p->w, p->conv, p->y,
                                                      CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, pf));
        PICK(pf, got, p->fwd, p->fwd_math, p->ws_fwd, "forward");
        /* the heuristic's memory figures are estimates: ask for the exact size */
        DNN(cudnnSetConvolutionMathType(p->conv, p->fwd_math));
        DNN(cudnnGetConvolutionForwardWorkspaceSize(g->dnn, p->x, p->w, p->conv, p->y, p->fwd, &p->ws_fwd));
    } else if (dir == RN_CONV_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t pd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CHOOSE(cudnnFindConvolutionBackwardDataAlgorithm(g->dnn, p->w, p->y, p->conv, p->x,
                                                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, pd),
               cudnnGetConvolutionBackwardDataAlgorithm_v7(g->dnn, p->w, p->y, p->conv, p->x,
                                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, pd));
        PICK(pd, got, p->bwd_data, p->data_math, p->ws_data, "backward-data");
        DNN(cudnnSetConvolutionMathType(p->conv, p->data_math));
        DNN(cudnnGetConvolutionBackwardDataWorkspaceSize(g->dnn, p->w, p->y, p->conv, p->x, p->bwd_data,
                                                         &p->ws_data));
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t pw[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CHOOSE(cudnnFindConvolutionBackwardFilterAlgorithm(g->dnn, p->x, p->y, p->conv, p->w,
                                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, pw),
               cudnnGetConvolutionBackwardFilterAlgorithm_v7(g->dnn, p->x, p->y, p->conv, p->w,
                                                             CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, pw));
        PICK(pw, got, p->bwd_filter, p->filter_math, p->ws_filter, "backward-filter");
        DNN(cudnnSetConvolutionMathType(p->conv, p->filter_math));
        DNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(g->dnn, p->x, p->y, p->conv, p->w, p->bwd_filter,
                                                           &p->ws_filter));
    }
#undef CHOOSE
    p->have |= dir;
    if (g->algos && timed) {
        cv.algo = dir == RN_CONV_FWD ? (int)p->fwd : dir == RN_CONV_BWD_DATA ? (int)p->bwd_data : (int)p->bwd_filter;
        cv.math = (int)(dir == RN_CONV_FWD ? p->fwd_math : dir == RN_CONV_BWD_DATA ? p->data_math : p->filter_math);
        cv.ws = dir == RN_CONV_FWD ? p->ws_fwd : dir == RN_CONV_BWD_DATA ? p->ws_data : p->ws_filter;
        /* a file that cannot be written only loses the speed-up (the note says why) */
        (void)rn_algocache_put(g->algos, &ck, &cv);
    }
    return RN_OK;
}

static void plan_key(const rn_conv_desc *d, int key[12]) {
    int k[12] = {d->dtype, d->n, d->h, d->w, d->c, d->k, d->kh, d->kw, d->stride_h, d->stride_w, d->pad_h, d->pad_w};
    memcpy(key, k, sizeof k);
}

/* The cached plan for d's shape, with an algorithm chosen for every direction in dirs
 * (within the workspace less `held` bytes, as plan_choose). */
static int conv_plan_get(rn_backend *be, const rn_conv_desc *d, int dirs, size_t held, conv_plan **out) {
    cuda_ctx *g = CTX(be);
    int key[12];
    plan_key(d, key);
    conv_plan *p = NULL;
    for (int i = 0; i < g->nplans && !p; i++)
        if (memcmp(g->plans[i].key, key, sizeof key) == 0) p = &g->plans[i];
    if (!p) {
        if (g->nplans == g->cap) {
            int cap = g->cap ? 2 * g->cap : 32;
            conv_plan *np = (conv_plan *)realloc(g->plans, sizeof(conv_plan) * (size_t)cap);
            if (!np) return rn_errorf(RN_ENOMEM, "conv: out of host memory for %d algorithm plans", cap);
            g->plans = np;
            g->cap = cap;
        }
        conv_plan np;
        memset(&np, 0, sizeof np);
        memcpy(np.key, key, sizeof key);
        int rc = plan_describe(d, &np);
        if (rc != RN_OK) {
            plan_destroy(&np);
            return rn_error_context(rc, "cuda:%d: describing a convolution", g->dev);
        }
        g->plans[g->nplans] = np;
        p = &g->plans[g->nplans++];
    }
    for (int dir = RN_CONV_FWD; dir <= RN_CONV_BWD_FILTER; dir <<= 1)
        if ((dirs & dir) && !(p->have & dir)) {
            /* Find times the algorithms on memory it allocates: not inside a graph capture
               (rn/replay.h runs a step eagerly before it captures it, so none is chosen there) */
            if (be->capturing)
                return rn_errorf(RN_EINVAL, "cuda:%d: a convolution's algorithm first chosen inside a graph capture",
                                 g->dev);
            int rc = plan_choose(be, d, p, dir, held);
            if (rc != RN_OK) return rn_error_context(rc, "cuda:%d: choosing convolution algorithms", g->dev);
        }
    *out = p;
    return RN_OK;
}

static const char *algo_name(int dir, int a) {
    static const char *fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
    static const char *data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
    static const char *filt[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
    const char **t = dir == RN_CONV_FWD ? fwd : dir == RN_CONV_BWD_DATA ? data : filt;
    int n = dir == RN_CONV_FWD ? 8 : dir == RN_CONV_BWD_DATA ? 6 : 7;
    return a >= 0 && a < n ? t[a] : "unknown";
}

/* ---- the stem's 3 input channels padded to 4 ----
 * cuDNN's tensor-core kernels for NHWC fp16/bf16 want the input channels a multiple of 4
 * (8 bytes per pixel); with 3 (the stem) it falls back to slower ones. So in half
 * precision a 3-channel conv runs forward and backward-filter on copies of x and w with a
 * fourth channel of zeros, as NVIDIA's ResNet-50 implementations feed the stem: the zeros
 * contribute exact zeros, so it is the same convolution. The copies lie at the start of
 * the workspace (rn_conv_workspace counts them); cuDNN's own workspace follows. The
 * backward-data (which the stem, with no input gradient, never runs) keeps the 3-channel
 * plan. RN_CUDA_STEM=plain leaves the stem unpadded (to compare). */
#define STEM_C 4

static size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

/* bytes of the padded x copy (half precision), where the w copy starts */
static size_t stem_x_bytes(const rn_conv_desc *d) { return up256((size_t)d->n * d->h * d->w * STEM_C * 2); }

/* 0 when d runs as it is; else the padded shape in *pd and the bytes its copies hold:
 * x (n, h, w, 4), then w or dw (k, kh, kw, 4). The copies and cuDNN's workspace together
 * stay within the per-conv limit (RN_CUDA_WORKSPACE_MB, what a memory plan counts): where
 * the copies alone pass it, the conv runs unpadded. */
static size_t stem_pad(const cuda_ctx *g, const rn_conv_desc *d, rn_conv_desc *pd) {
    if (d->c != 3 || (d->dtype != RN_F16 && d->dtype != RN_BF16) || g->stem_plain) return 0;
    *pd = *d;
    pd->c = STEM_C;
    size_t held = stem_x_bytes(d) + up256((size_t)d->k * d->kh * d->kw * STEM_C * 2);
    return held <= g->ws_limit ? held : 0;
}

/* rows of `from` channels copied to rows of `to`: the first min(from, to) channels, zeros after */
template <typename T> __global__ void repad_k(int64_t rows, int from, int to, const T *x, T *y) {
    int64_t n = rows * to;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = n <= 0xffffffffLL ? (int64_t)((uint32_t)i / (uint32_t)to) : i / to;
        int e = (int)(i - r * to);
        y[i] = e < from ? x[r * from + e] : st<T>(0.0f);
    }
}

template <typename T> static int repad_t(rn_backend *be, int64_t rows, int from, int to, const void *x, void *y) {
    cuda_ctx *g = CTX(be);
    repad_k<T><<<blocks_for(g, rows * to), TPB, 0, g->stream>>>(rows, from, to, (const T *)x, (T *)y);
    LAUNCHED("repad");
    return RN_OK;
}

static int repad(rn_backend *be, int dtype, int64_t rows, int from, int to, const void *x, void *y) {
    return BY_DTYPE(dtype, repad_t)(be, rows, from, to, x, y);
}

/* the padded copies' places in the workspace: x first, w (or dw) after */
static int stem_bufs(rn_backend *be, const rn_conv_desc *d, size_t held, void **xp, void **wp) {
    if (held > be->ws_bytes)
        return rn_errorf(RN_EGPU, "conv n=%d h=%d w=%d c=3: the stem's 4-channel copies need %zu MiB of workspace, "
                         "%zu MiB reserved (plan the shape with rn_conv_workspace before rn_backend_reserve)",
                         d->n, d->h, d->w, held >> 20, be->ws_bytes >> 20);
    *xp = be->ws;
    *wp = (char *)be->ws + stem_x_bytes(d);
    return RN_OK;
}

static const char *cuda_conv_algo(rn_backend *be, const rn_conv_desc *d, int dir) {
    static __thread char buf[80];
    cuda_ctx *g = CTX(be);
    rn_conv_desc pd;
    int padded = dir != RN_CONV_BWD_DATA && stem_pad(g, d, &pd);
    int key[12];
    plan_key(padded ? &pd : d, key);
    for (int i = 0; i < g->nplans; i++) {
        const conv_plan *p = &g->plans[i];
        if (memcmp(p->key, key, sizeof key) != 0 || !(p->have & dir)) continue;
        int a = dir == RN_CONV_FWD ? (int)p->fwd : dir == RN_CONV_BWD_DATA ? (int)p->bwd_data : (int)p->bwd_filter;
        snprintf(buf, sizeof buf, "cuDNN %s%s", algo_name(dir, a), padded ? " (C padded 3 to 4)" : "");
        return buf;
    }
    return NULL;
}

/* No status to return here: a failure leaves 0 and the op itself reports it. */
static size_t cuda_conv_workspace(rn_backend *be, const rn_conv_desc *d) {
    rn_conv_desc pd;
    size_t held = stem_pad(CTX(be), d, &pd), ws = 0;
    conv_plan *p;
    int dirs = d->dirs & (RN_CONV_FWD | RN_CONV_BWD_FILTER);
    if (dirs) {
        if (conv_plan_get(be, held ? &pd : d, dirs, held, &p) != RN_OK) return 0;
        if ((dirs & RN_CONV_FWD) && held + p->ws_fwd > ws) ws = held + p->ws_fwd;
        if ((dirs & RN_CONV_BWD_FILTER) && held + p->ws_filter > ws) ws = held + p->ws_filter;
    }
    if (d->dirs & RN_CONV_BWD_DATA) {
        if (conv_plan_get(be, d, RN_CONV_BWD_DATA, 0, &p) != RN_OK) return 0;
        if (p->ws_data > ws) ws = p->ws_data;
    }
    return ws;
}

static int cuda_conv_fwd(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w, void *y) {
    cuda_ctx *g = CTX(be);
    rn_conv_desc pd;
    size_t held = stem_pad(g, d, &pd);
    conv_plan *p;
    int rc = conv_plan_get(be, held ? &pd : d, RN_CONV_FWD, held, &p);
    if (rc) return rc;
    if (held) {
        void *xp, *wp;
        if ((rc = stem_bufs(be, d, held, &xp, &wp)) ||
            (rc = repad(be, d->dtype, (int64_t)d->n * d->h * d->w, 3, STEM_C, x, xp)) ||
            (rc = repad(be, d->dtype, (int64_t)d->k * d->kh * d->kw, 3, STEM_C, w, wp)))
            return rc;
        x = xp, w = wp;
    }
    const float one = 1, zero = 0;
    DNN(cudnnSetConvolutionMathType(p->conv, p->fwd_math));
    be->launches++;
    DNN(cudnnConvolutionForward(g->dnn, &one, p->x, x, p->w, w, p->conv, p->fwd, (char *)be->ws + held,
                                be->ws_bytes - held, &zero, p->y, y));
    return RN_OK;
}

static int cuda_conv_bwd_data(rn_backend *be, const rn_conv_desc *d, const void *dy, const void *w, void *dx,
                              int accumulate) {
    cuda_ctx *g = CTX(be);
    conv_plan *p;
    int rc = conv_plan_get(be, d, RN_CONV_BWD_DATA, 0, &p);
    if (rc) return rc;
    const float one = 1, beta = accumulate ? 1.0f : 0.0f;
    DNN(cudnnSetConvolutionMathType(p->conv, p->data_math));
    be->launches++;
    DNN(cudnnConvolutionBackwardData(g->dnn, &one, p->w, w, p->y, dy, p->conv, p->bwd_data, be->ws,
                                     be->ws_bytes, &beta, p->x, dx));
    return RN_OK;
}

/* padded: dw's copy takes cuDNN's output (beta 1 adds to dw's values copied in, so that
 * accumulation is cuDNN's own), then its first 3 channels go back to dw */
static int cuda_conv_bwd_filter(rn_backend *be, const rn_conv_desc *d, const void *x, const void *dy, void *dw,
                                int accumulate) {
    cuda_ctx *g = CTX(be);
    rn_conv_desc pd;
    size_t held = stem_pad(g, d, &pd);
    conv_plan *p;
    int rc = conv_plan_get(be, held ? &pd : d, RN_CONV_BWD_FILTER, held, &p);
    if (rc) return rc;
    void *out = dw;
    int64_t wrows = (int64_t)d->k * d->kh * d->kw;
    if (held) {
        void *xp;
        if ((rc = stem_bufs(be, d, held, &xp, &out)) ||
            (rc = repad(be, d->dtype, (int64_t)d->n * d->h * d->w, 3, STEM_C, x, xp)) ||
            (accumulate && (rc = repad(be, d->dtype, wrows, 3, STEM_C, dw, out))))
            return rc;
        x = xp;
    }
    const float one = 1, beta = accumulate ? 1.0f : 0.0f;
    DNN(cudnnSetConvolutionMathType(p->conv, p->filter_math));
    be->launches++;
    DNN(cudnnConvolutionBackwardFilter(g->dnn, &one, p->x, x, p->y, dy, p->conv, p->bwd_filter,
                                       (char *)be->ws + held, be->ws_bytes - held, &beta, p->w, out));
    return held ? repad(be, d->dtype, wrows, STEM_C, 3, out, dw) : RN_OK;
}

/* ---- batch norm ----
 * Our own kernels by default rather than cuDNN's: the op contract lets y alias x or the
 * residual and dx alias dy (the network runs BN backward in place), which cuDNN's
 * BatchNorm does not promise to support. (cuDNN's fused forward is an opt-in below.)
 * Statistics are fp32 outputs of double sums over a fixed grid of row chunks, summed in
 * chunk order: results do not depend on timing and match the CPU backend's formulas.
 * Pass 1 reduces (m, c) in tiles of 32 channels (or, with 16-byte loads, up to 32 lanes
 * of 16 bytes: 256 half or 128 float channels) x a chunk of rows; pass 2 finishes each
 * channel; pass 3 is elementwise. */

#define BN_TX 32
#define BN_TY 8

/* Threads per block of the column sums with 16-byte loads (bn_moments_v_k): L = min(32,
 * c/V) lanes of V channels across a row, BN_VT/L row phases. */
#define BN_VT 256

static void bn_vec_block(int c, int v, int *lanes, int *phases) {
    *lanes = c / v < 32 ? c / v : 32;
    *phases = BN_VT / *lanes;
}

/* blocks across the channels: of 32 channels (v = 1) or of L*v */
static int64_t bn_tiles(int c, int v) {
    if (v == 1) return (c + BN_TX - 1) / BN_TX;
    int l, ph;
    bn_vec_block(c, v, &l, &ph);
    return (c + l * v - 1) / (l * v);
}

/* the column sums' launch: tiles across the channels x nch row chunks, blocks of BN_TX x
 * BN_TY threads (v = 1) or bn_vec_block's */
static void bn_sums_shape(int c, int v, int nch, dim3 *grid, dim3 *block) {
    int l = BN_TX, ph = BN_TY;
    if (v > 1) bn_vec_block(c, v, &l, &ph);
    *grid = dim3((unsigned)bn_tiles(c, v), (unsigned)nch);
    *block = dim3(l, ph);
}

/* the elements per 16 bytes where d's channels are a multiple of them, else 1 (whether
 * the pointers allow it is known at the call: vec_ok) */
static int bn_vec_width(const rn_bn_desc *d) {
    int v = d->dtype == RN_F16 || d->dtype == RN_BF16 ? 8 : 4; /* (dtype 0 is RN_F32) */
    return d->c >= v && d->c % v == 0 ? v : 1;
}

/* row chunks (blockIdx.y) of the column sums for `tiles` blocks across the channels */
static int bn_chunks(const cuda_ctx *g, const rn_bn_desc *d, int64_t tiles) {
    int64_t want = (4 * (int64_t)g->sms + tiles - 1) / tiles; /* ~4 blocks per SM */
    int64_t most = (d->m + 63) / 64;                          /* >= 64 rows per chunk */
    if (want > most) want = most;
    if (want > 1024) want = 1024;
    return want < 1 ? 1 : (int)want;
}

/* ---- the cuDNN variant of training BN (RN_CUDA_BN=cudnn, off by default until make
 * gpu-check has compared it on a GPU): cudnnBatchNormalizationForwardTrainingEx in NHWC
 * spatial-persistent mode, fused with the residual add and the ReLU where the layer has
 * them (CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION), its ReLU state in the layer's reserve
 * (rn_bn_reserve_size), and BackwardEx with the same ops for a layer whose forward it
 * ran. It writes the same save_mean/save_invstd as ours, so either backward follows
 * either forward but for the reserve: ours reads y (not the mask) under RN_CUDA_BN=cudnn.
 * Calls it cannot take (a forward's y aliasing x or the residual, a residual without
 * ReLU, or a shape cuDNN refuses) run our kernels. x (m, c) is described as m images of
 * 1x1. ---- */

#define BN_MODE CUDNN_BATCHNORM_SPATIAL_PERSISTENT

static cudnnBatchNormOps_t bn_ops_for(int relu, int residual) {
    return relu ? (residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION)
                : CUDNN_BATCHNORM_OPS_BN;
}

static int bn_dnn_describe(cuda_ctx *g, const rn_bn_desc *d) {
    if (d->m > 0x7fffffff) return rn_errorf(RN_EINVAL, "bn: m=%lld too large for cuDNN", (long long)d->m);
    DNN(cudnnSetTensor4dDescriptor(g->bn_x, CUDNN_TENSOR_NHWC, dnn_type(d->dtype), (int)d->m, d->c, 1, 1));
    DNN(cudnnDeriveBNTensorDescriptor(g->bn_stat, g->bn_x, BN_MODE));
    return RN_OK;
}

/* cuDNN's workspace (the forward's and the backward's, the larger) and reserve for one
 * op variant; 0 when cuDNN does not take it. bws (unless NULL): the backward's alone,
 * SIZE_MAX where cuDNN does not size it (its call is then left to ours: bn_dnn_bwd). */
static int bn_dnn_sizes(cuda_ctx *g, const rn_bn_desc *d, int residual, size_t *ws, size_t *rs, size_t *bws) {
    *ws = *rs = 0;
    if (bws) *bws = SIZE_MAX;
    /* cuDNN's fused NHWC kernel (the only one that applies ReLU and adds a residual)
       takes fp16 with channels a multiple of 4; elsewhere ours run */
    if (!g->bn_cudnn || d->dtype != RN_F16 || d->c % 4 || (residual && !d->relu) || bn_dnn_describe(g, d) != RN_OK)
        return 0;
    cudnnBatchNormOps_t ops = bn_ops_for(d->relu, residual);
    cudnnActivationDescriptor_t act = d->relu ? g->bn_relu : NULL;
    if (cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(g->dnn, BN_MODE, ops, g->bn_x,
                                                                 residual ? g->bn_x : NULL, g->bn_x, g->bn_stat,
                                                                 act, ws) != CUDNN_STATUS_SUCCESS ||
        cudnnGetBatchNormalizationTrainingExReserveSpaceSize(g->dnn, BN_MODE, ops, act, g->bn_x, rs) !=
            CUDNN_STATUS_SUCCESS) {
        *ws = *rs = 0;
        return 0;
    }
    size_t b = 0;
    if (cudnnGetBatchNormalizationBackwardExWorkspaceSize(g->dnn, BN_MODE, ops, g->bn_x, g->bn_x, g->bn_x,
                                                          residual ? g->bn_x : NULL, g->bn_x, g->bn_stat, act,
                                                          &b) == CUDNN_STATUS_SUCCESS) {
        if (b > *ws) *ws = b;
        if (bws) *bws = b;
    }
    return 1;
}

/* Whether the layer whose reserve this is went through cuDNN in its last forward (the
 * backward must then read cuDNN's reserve, or leave it to ours, which reads y), its
 * entry in bn_dnn_ran; -1 when not. */
static int bn_dnn_find(const cuda_ctx *g, const void *reserve) {
    for (int i = 0; reserve && i < g->nbn_dnn_ran; i++)
        if (g->bn_dnn_ran[i].reserve == reserve) return i;
    return -1;
}

/* A layer without a reserve (cuDNN keeps no state for a BN without ReLU) needs no entry:
 * cuDNN's backward then follows either forward. A full table overwrites its entries in
 * turn (those of a network since destroyed, say): a layer left out runs our backward,
 * right after either forward. */
static void bn_dnn_mark(cuda_ctx *g, const void *reserve, const float *beta, int res, int ran) {
    if (!reserve) return;
    int i = bn_dnn_find(g, reserve);
    const int cap = (int)(sizeof g->bn_dnn_ran / sizeof g->bn_dnn_ran[0]);
    if (!ran) {
        if (i >= 0) g->bn_dnn_ran[i] = g->bn_dnn_ran[--g->nbn_dnn_ran];
        return;
    }
    if (i < 0) i = g->nbn_dnn_ran < cap ? g->nbn_dnn_ran++ : g->bn_dnn_next++ % cap;
    g->bn_dnn_ran[i].reserve = reserve;
    g->bn_dnn_ran[i].beta = beta;
    g->bn_dnn_ran[i].res = res;
}

static int bn_dnn_refused(const cuda_ctx *g, const rn_bn_desc *d, int res, int bwd) {
    for (int i = 0; i < g->nbn_refused; i++)
        if (g->bn_refused[i].m == d->m && g->bn_refused[i].c == d->c && g->bn_refused[i].relu == d->relu &&
            g->bn_refused[i].res == res && g->bn_refused[i].bwd == bwd)
            return 1;
    return 0;
}

/* cuDNN refused (any NOT_SUPPORTED_*) this shape: ours run it from now on. A shape the
 * uncaptured step ran through cuDNN but a capture refuses would put other ops in the
 * graph than that step ran: the capture fails instead. */
static int bn_dnn_refuse(rn_backend *be, const rn_bn_desc *d, int res, int bwd) {
    cuda_ctx *g = CTX(be);
    if (be->capturing)
        return rn_errorf(RN_EGPU, "cuda:%d: cuDNN's BN %s refused a shape inside a graph capture", g->dev,
                         bwd ? "backward" : "forward");
    if (g->nbn_refused < (int)(sizeof g->bn_refused / sizeof g->bn_refused[0])) {
        int i = g->nbn_refused++;
        g->bn_refused[i].m = d->m, g->bn_refused[i].c = d->c, g->bn_refused[i].relu = d->relu;
        g->bn_refused[i].res = res, g->bn_refused[i].bwd = bwd;
    }
    return RN_OK;
}

/* A fused BN call's status st: a refused shape is left to ours from now on (*done stays
 * 0), success is done, anything else an error naming the call. */
static int bn_dnn_status(rn_backend *be, const rn_bn_desc *d, int res, int bwd, cudnnStatus_t st, int *done) {
    if (rn_dnn_status_class(st) == RN_DNN_UNSUPPORTED) return bn_dnn_refuse(be, d, res, bwd);
    be->launches++;
    if (st != CUDNN_STATUS_SUCCESS)
        return rn_errorf(RN_EGPU, "%s:%d: %s (%lld x %d channels): %s (RN_CUDA_BN=own runs rn's BatchNorm instead)",
                         __FILE__, __LINE__,
                         bwd ? "cudnnBatchNormalizationBackwardEx" : "cudnnBatchNormalizationForwardTrainingEx",
                         (long long)d->m, d->c, cudnnGetErrorString(st));
    *done = 1;
    return RN_OK;
}

/* workspace: part (chunks, 2, c) doubles, then four float rows of c; or cuDNN's. The
 * vector tiling has no more tiles than the scalar one, so at least as many chunks: its
 * count covers both. */
static size_t cuda_bn_workspace(rn_backend *be, const rn_bn_desc *d) {
    cuda_ctx *g = CTX(be);
    int64_t nch = bn_chunks(g, d, bn_tiles(d->c, bn_vec_width(d)));
    size_t own = (size_t)nch * 2 * d->c * sizeof(double) + 4 * (size_t)d->c * sizeof(float);
    for (int res = 0; res < 2; res++) {
        size_t ws, rs;
        if (bn_dnn_sizes(g, d, res, &ws, &rs, NULL) && ws > own) own = ws;
    }
    return own;
}

/* Our kernels keep a 1-bit ReLU mask in the reserve (bit i of the flat (m, c) index: 1
 * where y[i] passes the gradient, y > 0 or NaN, as the backward tests y), so that the
 * backward reads m*c/8 bytes instead of y twice. Not with RN_CUDA_BN=cudnn, whose reserve
 * holds cuDNN's own format (our backward then reads y). */
static int bn_masked(const cuda_ctx *g, const rn_bn_desc *d) { return d->relu && !g->bn_cudnn; }

static size_t cuda_bn_reserve_size(rn_backend *be, const rn_bn_desc *d) {
    if (bn_masked(CTX(be), d)) return (size_t)((d->m * d->c + 7) / 8);
    size_t most = 0;
    for (int res = 0; res < 2; res++) {
        size_t ws, rs;
        if (bn_dnn_sizes(CTX(be), d, res, &ws, &rs, NULL) && rs > most) most = rs;
    }
    return most;
}

/* *done = 1 when cuDNN ran the op, 0 when the caller must run ours */
static int bn_dnn_fwd_train(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma,
                            const float *beta, const void *res, void *y, float *save_mean, float *save_invstd,
                            float *rmean, float *rvar, void *reserve, int *done) {
    cuda_ctx *g = CTX(be);
    size_t ws, rs;
    *done = 0;
    if (y == x || (res && y == res) || !bn_dnn_sizes(g, d, res != NULL, &ws, &rs, NULL) || ws > be->ws_bytes ||
        (rs && !reserve))
        return RN_OK;
    int res_in = res != NULL;
    if (bn_dnn_refused(g, d, res_in, 0)) return RN_OK;
    const float one = 1, zero = 0;
    cudnnStatus_t st = g->inj_bn ? g->inj_bn : cudnnBatchNormalizationForwardTrainingEx(
        g->dnn, BN_MODE, bn_ops_for(d->relu, res_in), &one, &zero, g->bn_x, x, res ? g->bn_x : NULL, res,
        g->bn_x, y, g->bn_stat, gamma, beta, d->momentum, rmean, rvar, d->eps, save_mean, save_invstd,
        d->relu ? g->bn_relu : NULL, be->ws, be->ws_bytes, reserve, rs);
    return bn_dnn_status(be, d, res_in, 0, st, done);
}

/* The backward through cuDNN (cudnnBatchNormalizationBackwardEx, the forward's fused ops)
 * when the layer's last forward went through it (its reserve holds cuDNN's ReLU state),
 * or for a BN without ReLU or reserve after either; *done = 0 leaves it to ours, which reads y and the statistics both forwards save alike.
 * dx and dres alias dy as the network passes them (in place over dy, and dres over dy):
 * cuDNN documents no rule for that, so test_cuda_ops's BN cases (in place and not) decide
 * it on a GPU before RN_CUDA_BN=cudnn may become the default. */
static int bn_dnn_bwd(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y, const void *dy,
                      const float *gamma, const float *save_mean, const float *save_invstd, void *dx, float *dgamma,
                      float *dbeta, void *dres, void *reserve, int accumulate, int *done) {
    cuda_ctx *g = CTX(be);
    *done = 0;
    int k = bn_dnn_find(g, reserve), res_in = dres != NULL;
    size_t ws, rs, bws;
    if (!g->bn_cudnn || bn_dnn_refused(g, d, res_in, 1) || !bn_dnn_sizes(g, d, res_in, &ws, &rs, &bws) ||
        (rs && !reserve) || bws > be->ws_bytes)
        return RN_OK;
    /* cuDNN's backward reads the state its forward left in the reserve, and with a ReLU
       the forward's beta: only after its own forward, with the same ops (a BN with
       neither, no ReLU and no reserve, follows either forward) */
    if ((d->relu || rs) && (k < 0 || g->bn_dnn_ran[k].res != res_in)) return RN_OK;
    cudnnBatchNormOps_t ops = bn_ops_for(d->relu, res_in);
    cudnnActivationDescriptor_t act = d->relu ? g->bn_relu : NULL;
    const float one = 1, zero = 0;
    cudnnStatus_t st = g->inj_bn_bwd ? g->inj_bn_bwd : cudnnBatchNormalizationBackwardEx(
        g->dnn, BN_MODE, ops, &one, &zero, &one, accumulate ? &one : &zero, g->bn_x, x, y ? g->bn_x : NULL, y, g->bn_x,
        dy, res_in ? g->bn_x : NULL, dres, g->bn_x, dx, g->bn_stat, gamma, k >= 0 ? g->bn_dnn_ran[k].beta : NULL,
        dgamma, dbeta, d->eps, save_mean, save_invstd, act, be->ws, be->ws_bytes, reserve, rs);
    return bn_dnn_status(be, d, res_in, 1, st, done);
}

template <typename T>
__global__ void bn_moments_k(int64_t m, int c, int nch, const T *__restrict__ x, double *part) {
    __shared__ double sa[BN_TY][BN_TX], sb[BN_TY][BN_TX];
    int j = blockIdx.x * BN_TX + threadIdx.x, ch = blockIdx.y;
    int64_t r0 = m * ch / nch, r1 = m * (ch + 1) / nch;
    double a = 0, b = 0;
    /* unrolled so that several rows' loads are in flight at once (x is __restrict__: they
       may move ahead of the adds, which stay in row order) */
    if (j < c) {
#pragma unroll 4
        for (int64_t r = r0 + threadIdx.y; r < r1; r += BN_TY) {
            double v = ld(x[r * c + j]);
            a += v;
            b += v * v;
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        for (int t = 1; t < BN_TY; t++) a += sa[t][threadIdx.x], b += sb[t][threadIdx.x];
        part[(int64_t)ch * 2 * c + j] = a;
        part[(int64_t)ch * 2 * c + c + j] = b;
    }
}

/* The end of a vector column-sum block: thread (l, p) holds the sums a, b of its V
 * channels over its rows; each of the block's L*V channels adds its BN_VT/L phases' sums
 * in phase order into part (chunk blockIdx.y). */
template <int V>
__device__ __forceinline__ void bn_cols_finish(const double *a, const double *b, int c, double *part) {
    __shared__ double sa[BN_VT * 8], sb[BN_VT * 8];
    const int L = blockDim.x, P = blockDim.y, t = threadIdx.y * L + threadIdx.x;
#pragma unroll
    for (int e = 0; e < V; e++) sa[t * V + e] = a[e], sb[t * V + e] = b[e];
    __syncthreads();
    int j = blockIdx.x * L * V + t;
    if (t < L * V && j < c) {
        int lane = t / V, e = t % V;
        double s = 0, ss = 0;
        for (int q = 0; q < P; q++) s += sa[(q * L + lane) * V + e], ss += sb[(q * L + lane) * V + e];
        part[(int64_t)blockIdx.y * 2 * c + j] = s;
        part[(int64_t)blockIdx.y * 2 * c + c + j] = ss;
    }
}

/* bn_moments_k with 16-byte loads (c a multiple of V, x aligned): a warp reads whole
 * rows (64 halves: four 128-byte rows at once) where the scalar kernel's warp reads 64
 * bytes of one row. Each channel's sum runs over its rows in the same fixed order. */
template <typename T, int V>
__global__ void __launch_bounds__(BN_VT) bn_moments_v_k(int64_t m, int c, int nch, const T *__restrict__ x,
                                                        double *part) {
    int j = (blockIdx.x * blockDim.x + threadIdx.x) * V, ch = blockIdx.y;
    int64_t r0 = m * ch / nch, r1 = m * (ch + 1) / nch;
    double a[V], b[V];
#pragma unroll
    for (int e = 0; e < V; e++) a[e] = b[e] = 0;
    if (j < c) {
#pragma unroll 4
        for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
            pack<T, V> v = ldv<T, V>(x, r * c + j);
#pragma unroll
            for (int e = 0; e < V; e++) {
                double f = ld(v.v[e]);
                a[e] += f;
                b[e] += f * f;
            }
        }
    }
    bn_cols_finish<V>(a, b, c, part);
}

__global__ void bn_stats_k(int64_t m, int c, int nch, const double *part, const float *gamma, const float *beta,
                           float eps, float mom, float *save_mean, float *save_invstd, float *rmean, float *rvar,
                           float *scale, float *shift) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    double s = 0, ss = 0;
    for (int ch = 0; ch < nch; ch++) s += part[(int64_t)ch * 2 * c + j], ss += part[(int64_t)ch * 2 * c + c + j];
    double mean = s / m, var = ss / m - mean * mean;
    if (var < 0) var = 0;
    double invstd = 1.0 / sqrt(var + eps);
    save_mean[j] = (float)mean;
    save_invstd[j] = (float)invstd;
    scale[j] = (float)(gamma[j] * invstd);
    shift[j] = (float)(beta[j] - mean * gamma[j] * invstd);
    if (rmean) {
        rmean[j] = (1 - mom) * rmean[j] + mom * (float)mean;
        rvar[j] = (1 - mom) * rvar[j] + mom * (float)(var * m / (m - 1));
    }
}

/* y = [relu](x*scale + shift [+ res]), elementwise, so y may alias x or res; V elements
   per step (c a multiple of V: they lie in one row, channels j..j+V-1). With V = 8 and a
   mask, each step also writes the mask byte of its 8 elements (bn_masked). */
template <typename T, int V>
__global__ void bn_apply_k(int64_t m, int c, const T *x, const float *scale, const float *shift, const T *res,
                           int relu, T *y, uint8_t *mask) {
    int64_t n = m * c;
    for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V; i < n;
         i += (int64_t)gridDim.x * blockDim.x * V) {
        int j = chan(i, c, n);
        pack<T, V> a = ldv<T, V>(x, i), r = a, o;
        if (res) r = ldv<T, V>(res, i);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float v = ld(a.v[e]) * scale[j + e] + shift[j + e];
            if (res) v += ld(r.v[e]);
            o.v[e] = st<T>(relu && v < 0 ? 0.0f : v);
        }
        stv<T, V>(y, i, o);
        if (V == 8 && mask) {
            unsigned bits = 0;
#pragma unroll
            for (int e = 0; e < V; e++) bits |= (unsigned)relu_passes(ld(o.v[e])) << e;
            mask[i >> 3] = (uint8_t)bits;
        }
    }
}

/* the ReLU mask from y (where bn_apply_k could not write it): one byte per thread and step */
template <typename T> __global__ void relu_mask_k(int64_t n, const T *y, uint8_t *mask) {
    int64_t nb = (n + 7) / 8;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nb; b += (int64_t)gridDim.x * blockDim.x) {
        unsigned bits = 0;
        for (int e = 0; e < 8 && b * 8 + e < n; e++) bits |= (unsigned)relu_passes(ld(y[b * 8 + e])) << e;
        mask[b] = (uint8_t)bits;
    }
}

/* 1 where the mask passes element i's gradient; V bits from element i (a multiple of V) */
__device__ __forceinline__ bool mask_on(const uint8_t *mask, int64_t i) { return (mask[i >> 3] >> (i & 7)) & 1; }
template <int V> __device__ __forceinline__ unsigned mask_bits(const uint8_t *mask, int64_t i) {
    if (V == 8) return mask[i >> 3];
    unsigned b = 0;
#pragma unroll
    for (int e = 0; e < V; e++) b |= (unsigned)mask_on(mask, i + e) << e;
    return b;
}

template <typename T>
static int bn_apply(rn_backend *be, int64_t m, int c, const T *x, const float *scale, const float *shift,
                    const T *res, int relu, T *y, uint8_t *mask) {
    cuda_ctx *g = CTX(be);
    int vec = vec_ok<T>(c, x, res, y);
    if (vec)
        bn_apply_k<T, VEC<T>><<<blocks_for(g, m * c / VEC<T>), TPB, 0, g->stream>>>(
            m, c, x, scale, shift, res, relu, y, VEC<T> == 8 ? mask : NULL);
    else
        bn_apply_k<T, 1><<<blocks_for(g, m * c), TPB, 0, g->stream>>>(m, c, x, scale, shift, res, relu, y, NULL);
    LAUNCHED("bn_apply");
    if (mask && !(vec && VEC<T> == 8)) {
        relu_mask_k<T><<<blocks_for(g, (m * c + 7) / 8), TPB, 0, g->stream>>>(m * c, y, mask);
        LAUNCHED("relu_mask");
    }
    return RN_OK;
}

/* inference: per-channel scale and shift from the running statistics, then apply */
__global__ void bn_infer_coef_k(int c, const float *gamma, const float *beta, const float *rmean, const float *rvar,
                                float eps, float *scale, float *shift) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    double invstd = 1.0 / sqrt((double)rvar[j] + eps);
    scale[j] = (float)(gamma[j] * invstd);
    shift[j] = (float)(beta[j] - rmean[j] * gamma[j] * invstd);
}

/* (the backward kernels take the ReLU's pass/stop from mask where given, else from y) */
template <typename T>
__global__ void bn_bwd_sums_k(int64_t m, int c, int nch, const T *x, const T *y, const uint8_t *mask, const T *dy,
                              const float *mean, T *dres, int relu, double *part) {
    __shared__ double sa[BN_TY][BN_TX], sb[BN_TY][BN_TX];
    int j = blockIdx.x * BN_TX + threadIdx.x, ch = blockIdx.y;
    int64_t r0 = m * ch / nch, r1 = m * (ch + 1) / nch;
    double a = 0, b = 0;
    if (j < c) {
        float mu = mean[j];
        int64_t r = r0 + threadIdx.y;
        /* four rows' loads before their stores, so that they are in flight together (the
           compiler may not move a load past a store to dres, which may alias dy: each
           element is this thread's own, read before it is written); the sums still add
           row by row in order */
        for (; r + 3 * BN_TY < r1; r += 4 * BN_TY) {
            float g[4], xv[4];
            bool off[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int64_t i = (r + u * BN_TY) * c + j;
                g[u] = ld(dy[i]);
                off[u] = mask ? !mask_on(mask, i) : relu && !relu_passes(ld(y[i]));
                xv[u] = ld(x[i]);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float dz = off[u] ? 0.0f : g[u];
                if (dres) dres[(r + u * BN_TY) * c + j] = st<T>(dz);
                a += dz;
                b += (double)dz * (double)(xv[u] - mu);
            }
        }
        for (; r < r1; r += BN_TY) {
            int64_t i = r * c + j;
            float dz = ld(dy[i]);
            if (mask ? !mask_on(mask, i) : relu && !relu_passes(ld(y[i]))) dz = 0;
            if (dres) dres[i] = st<T>(dz);
            a += dz;
            b += (double)dz * (double)(ld(x[i]) - mu);
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        for (int t = 1; t < BN_TY; t++) a += sa[t][threadIdx.x], b += sb[t][threadIdx.x];
        part[(int64_t)ch * 2 * c + j] = a;
        part[(int64_t)ch * 2 * c + c + j] = b;
    }
}

/* bn_bwd_sums_k with 16-byte loads and stores (c a multiple of V, every tensor aligned):
 * two rows' loads in flight before their stores (dres may alias dy: each element is this
 * thread's own, read before it is written); the same arithmetic per element, and each
 * channel's sums in row order. */
template <typename T, int V>
__global__ void __launch_bounds__(BN_VT) bn_bwd_sums_v_k(int64_t m, int c, int nch, const T *x, const T *y,
                                                         const uint8_t *mask, const T *dy, const float *mean,
                                                         T *dres, int relu, double *part) {
    int j = (blockIdx.x * blockDim.x + threadIdx.x) * V, ch = blockIdx.y;
    const int P = blockDim.y;
    int64_t r0 = m * ch / nch, r1 = m * (ch + 1) / nch;
    double a[V], b[V];
#pragma unroll
    for (int e = 0; e < V; e++) a[e] = b[e] = 0;
    if (j < c) {
        float mu[V];
#pragma unroll
        for (int e = 0; e < V; e++) mu[e] = mean[j + e];
        int64_t r = r0 + threadIdx.y;
        while (r < r1) {
            int rows = r + P < r1 ? 2 : 1;
            pack<T, V> g[2], xv[2];
            unsigned on[2] = {~0u, ~0u}; /* bit e: element e's gradient passes the ReLU */
#pragma unroll
            for (int u = 0; u < 2; u++)
                if (u < rows) {
                    int64_t i = (r + u * P) * c + j;
                    g[u] = ldv<T, V>(dy, i);
                    if (mask) {
                        on[u] = mask_bits<V>(mask, i);
                    } else if (relu) {
                        pack<T, V> yv = ldv<T, V>(y, i);
                        on[u] = 0;
#pragma unroll
                        for (int e = 0; e < V; e++) on[u] |= (unsigned)relu_passes(ld(yv.v[e])) << e;
                    }
                    xv[u] = ldv<T, V>(x, i);
                }
#pragma unroll
            for (int u = 0; u < 2; u++)
                if (u < rows) {
                    pack<T, V> z;
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        float dz = (on[u] >> e) & 1 ? ld(g[u].v[e]) : 0.0f;
                        z.v[e] = st<T>(dz);
                        a[e] += dz;
                        b[e] += (double)dz * (double)(ld(xv[u].v[e]) - mu[e]);
                    }
                    if (dres) stv<T, V>(dres, (r + u * P) * c + j, z);
                }
            r += rows * P;
        }
    }
    bn_cols_finish<V>(a, b, c, part);
}

__global__ void bn_bwd_coef_k(int64_t m, int c, int nch, const double *part, const float *gamma,
                              const float *invstd, float eps, int frozen, float *dgamma, float *dbeta, int accumulate,
                              float *ka, float *kb, float *k0) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    double sdz = 0, sdzx = 0;
    for (int ch = 0; ch < nch; ch++) sdz += part[(int64_t)ch * 2 * c + j], sdzx += part[(int64_t)ch * 2 * c + c + j];
    /* frozen: invstd holds the running variance, and the statistics are constants */
    double is = frozen ? 1.0 / sqrt((double)invstd[j] + eps) : (double)invstd[j], dg = sdzx * is, db = sdz;
    dgamma[j] = accumulate ? dgamma[j] + (float)dg : (float)dg;
    dbeta[j] = accumulate ? dbeta[j] + (float)db : (float)db;
    double a = gamma[j] * is;
    ka[j] = (float)a;
    kb[j] = frozen ? 0.0f : (float)(a * is * is * sdzx / m);
    k0[j] = frozen ? 0.0f : (float)(a * sdz / m);
}

/* dx = ka*dz - k0 - kb*(x - mean); dz recomputed from dy and y (dres, if it aliased dy,
 * already holds dz: masking twice changes nothing) */
template <typename T, int V>
__global__ void bn_bwd_dx_k(int64_t m, int c, const T *x, const T *y, const uint8_t *mask, const T *dy,
                            const float *mean, const float *ka, const float *kb, const float *k0, int relu, T *dx) {
    int64_t n = m * c;
    for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V; i < n;
         i += (int64_t)gridDim.x * blockDim.x * V) {
        int j = chan(i, c, n);
        pack<T, V> xs = ldv<T, V>(x, i), g = ldv<T, V>(dy, i), ys = g, o;
        unsigned on = mask ? mask_bits<V>(mask, i) : ~0u;
        if (relu && !mask) ys = ldv<T, V>(y, i);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float dz = ld(g.v[e]);
            if (mask ? !((on >> e) & 1) : relu && !relu_passes(ld(ys.v[e]))) dz = 0;
            o.v[e] = st<T>(ka[j + e] * dz - k0[j + e] - kb[j + e] * (ld(xs.v[e]) - mean[j + e]));
        }
        stv<T, V>(dx, i, o);
    }
}

template <typename T>
static int bn_fwd_train_t(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma, const float *beta,
                          const void *res, void *y, float *save_mean, float *save_invstd, float *rmean, float *rvar,
                          void *reserve) {
    cuda_ctx *g = CTX(be);
    int c = d->c, v = vec_ok<T>(c, x) ? VEC<T> : 1, nch = bn_chunks(g, d, bn_tiles(c, v));
    double *part = (double *)be->ws;
    float *scale = (float *)(part + (size_t)nch * 2 * c), *shift = scale + c;
    dim3 grid, block;
    bn_sums_shape(c, v, nch, &grid, &block);
    if (v > 1)
        bn_moments_v_k<T, VEC<T>><<<grid, block, 0, g->stream>>>(d->m, c, nch, (const T *)x, part);
    else
        bn_moments_k<T><<<grid, block, 0, g->stream>>>(d->m, c, nch, (const T *)x, part);
    LAUNCHED("bn_moments");
    bn_stats_k<<<(c + 127) / 128, 128, 0, g->stream>>>(d->m, c, nch, part, gamma, beta, d->eps, d->momentum,
                                                        save_mean, save_invstd, rmean, rvar, scale, shift);
    LAUNCHED("bn_stats");
    return bn_apply<T>(be, d->m, c, (const T *)x, scale, shift, (const T *)res, d->relu, (T *)y,
                       reserve && bn_masked(g, d) ? (uint8_t *)reserve : NULL);
}

static int cuda_bn_fwd_train(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma,
                             const float *beta, const void *res, void *y, float *save_mean, float *save_invstd,
                             float *rmean, float *rvar, void *reserve) {
    int done = 0;
    int rc = bn_dnn_fwd_train(be, d, x, gamma, beta, res, y, save_mean, save_invstd, rmean, rvar, reserve, &done);
    if (rc == RN_OK && CTX(be)->bn_cudnn) bn_dnn_mark(CTX(be), reserve, beta, res != NULL, done);
    if (rc != RN_OK || done) return rc;
    return BY_DTYPE(d->dtype, bn_fwd_train_t)(be, d, x, gamma, beta, res, y, save_mean, save_invstd, rmean, rvar,
                                              reserve);
}

/* The inference coefficients live in a small buffer of the context, not the workspace:
 * an evaluation network may never reserve one. */
template <typename T>
static int bn_fwd_infer_t(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma, const float *beta,
                          const float *rmean, const float *rvar, const void *res, void *y) {
    cuda_ctx *g = CTX(be);
    size_t need = 2 * (size_t)d->c;
    if (need > g->coef_cap) {
        float *p = NULL;
        int rc = cuda_alloc(be, need * sizeof(float), (void **)&p);
        if (rc) return rn_error_context(rc, "bn_fwd_infer: coefficients for %d channels", d->c);
        FREED(cudaFree(g->coef)); /* waits for the ops that used it */
        g->coef = p;
        g->coef_cap = need;
        be->moved++;
    }
    float *scale = g->coef, *shift = g->coef + d->c;
    bn_infer_coef_k<<<(d->c + 127) / 128, 128, 0, g->stream>>>(d->c, gamma, beta, rmean, rvar, d->eps, scale, shift);
    LAUNCHED("bn_infer_coef");
    return bn_apply<T>(be, d->m, d->c, (const T *)x, scale, shift, (const T *)res, d->relu, (T *)y, NULL);
}

static int cuda_bn_fwd_infer(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma,
                             const float *beta, const float *rmean, const float *rvar, const void *res, void *y) {
    return BY_DTYPE(d->dtype, bn_fwd_infer_t)(be, d, x, gamma, beta, rmean, rvar, res, y);
}

template <typename T>
static int bn_bwd_t(rn_backend *be, const rn_bn_desc *d, int frozen, const void *x, const void *y,
                    const uint8_t *mask, const void *dy, const float *gamma, const float *save_mean,
                    const float *save_invstd, void *dx, float *dgamma, float *dbeta, void *dres, int accumulate) {
    cuda_ctx *g = CTX(be);
    const void *ry = d->relu && !mask ? y : NULL; /* y is read only for the ReLU without a mask */
    int c = d->c, v = vec_ok<T>(c, x, ry, dy, dres) ? VEC<T> : 1;
    int nch = bn_chunks(g, d, bn_tiles(c, v));
    double *part = (double *)be->ws;
    float *ka = (float *)(part + (size_t)nch * 2 * c), *kb = ka + c, *k0 = kb + c;
    dim3 grid, block;
    bn_sums_shape(c, v, nch, &grid, &block);
    if (v > 1)
        bn_bwd_sums_v_k<T, VEC<T>><<<grid, block, 0, g->stream>>>(d->m, c, nch, (const T *)x, (const T *)ry, mask,
                                                                  (const T *)dy, save_mean, (T *)dres, d->relu,
                                                                  part);
    else
        bn_bwd_sums_k<T><<<grid, block, 0, g->stream>>>(d->m, c, nch, (const T *)x, (const T *)ry, mask,
                                                        (const T *)dy, save_mean, (T *)dres, d->relu, part);
    LAUNCHED("bn_bwd_sums");
    bn_bwd_coef_k<<<(c + 127) / 128, 128, 0, g->stream>>>(d->m, c, nch, part, gamma, save_invstd, d->eps, frozen,
                                                           dgamma, dbeta, accumulate, ka, kb, k0);
    LAUNCHED("bn_bwd_coef");
    if (vec_ok<T>(c, x, ry, dy, dx))
        bn_bwd_dx_k<T, VEC<T>><<<blocks_for(g, d->m * c / VEC<T>), TPB, 0, g->stream>>>(
            d->m, c, (const T *)x, (const T *)ry, mask, (const T *)dy, save_mean, ka, kb, k0, d->relu, (T *)dx);
    else
        bn_bwd_dx_k<T, 1><<<blocks_for(g, d->m * c), TPB, 0, g->stream>>>(
            d->m, c, (const T *)x, (const T *)ry, mask, (const T *)dy, save_mean, ka, kb, k0, d->relu, (T *)dx);
    LAUNCHED("bn_bwd_dx");
    return RN_OK;
}

static int cuda_bn_bwd(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y, const void *dy,
                       const float *gamma, const float *save_mean, const float *save_invstd, void *dx,
                       float *dgamma, float *dbeta, void *dres, void *reserve, int accumulate) {
    int done = 0;
    int rc = bn_dnn_bwd(be, d, x, y, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, dres, reserve, accumulate,
                        &done);
    if (rc != RN_OK || done) return rc;
    const uint8_t *mask = reserve && bn_masked(CTX(be), d) ? (const uint8_t *)reserve : NULL;
    return BY_DTYPE(d->dtype, bn_bwd_t)(be, d, 0, x, y, mask, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
                                        dres, accumulate);
}

/* the same kernels with the running statistics in the saved ones' slots, frozen set */
static int cuda_bn_bwd_frozen(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y, const void *dy,
                              const float *gamma, const float *running_mean, const float *running_var, void *dx,
                              float *dgamma, float *dbeta, void *dres, int accumulate) {
    return BY_DTYPE(d->dtype, bn_bwd_t)(be, d, 1, x, y, NULL, dy, gamma, running_mean, running_var, dx, dgamma,
                                        dbeta, dres, accumulate);
}

/* ---- elementwise ---- */

#define GRID_LOOP(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* V elements per step (n a multiple of V); y may alias an input */
#define VEC_LOOP(i, n, V)                                                                            \
    for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * (V); i < (n);                  \
         i += (int64_t)gridDim.x * blockDim.x * (V))

template <typename T, int V> __global__ void add_k(int64_t n, const T *a, const T *b, T *y, int relu) {
    VEC_LOOP(i, n, V) {
        pack<T, V> p = ldv<T, V>(a, i), q = ldv<T, V>(b, i), o;
#pragma unroll
        for (int e = 0; e < V; e++) {
            float v = ld(p.v[e]) + ld(q.v[e]);
            o.v[e] = st<T>(relu && v < 0 ? 0.0f : v);
        }
        stv<T, V>(y, i, o);
    }
}

template <typename T, int V> __global__ void relu_fwd_k(int64_t n, const T *x, T *y) {
    VEC_LOOP(i, n, V) {
        pack<T, V> p = ldv<T, V>(x, i), o;
#pragma unroll
        for (int e = 0; e < V; e++) {
            float v = ld(p.v[e]);
            o.v[e] = st<T>(v < 0 ? 0.0f : v);
        }
        stv<T, V>(y, i, o);
    }
}

template <typename T, int V> __global__ void relu_bwd_k(int64_t n, const T *y, const T *dy, T *dx) {
    VEC_LOOP(i, n, V) {
        pack<T, V> p = ldv<T, V>(y, i), g = ldv<T, V>(dy, i), o;
#pragma unroll
        for (int e = 0; e < V; e++) o.v[e] = st<T>(relu_passes(ld(p.v[e])) ? ld(g.v[e]) : 0.0f);
        stv<T, V>(dx, i, o);
    }
}

/* launch K<T, V> over n elements, V = VEC<T> where vec_ok, else 1 */
#define LAUNCH_VEC(K, n, ok, ...)                                                                          \
    do {                                                                                                   \
        if (ok) K<T, VEC<T>><<<blocks_for(g, (n) / VEC<T>), TPB, 0, g->stream>>>((n), __VA_ARGS__);        \
        else K<T, 1><<<blocks_for(g, (n)), TPB, 0, g->stream>>>((n), __VA_ARGS__);                         \
    } while (0)

template <typename T>
static int add_t(rn_backend *be, int64_t n, const void *a, const void *b, void *y, int relu) {
    cuda_ctx *g = CTX(be);
    LAUNCH_VEC(add_k, n, vec_ok<T>(n, a, b, y), (const T *)a, (const T *)b, (T *)y, relu);
    LAUNCHED("add");
    return RN_OK;
}
static int cuda_add(rn_backend *be, int dtype, int64_t n, const void *a, const void *b, void *y, int relu) {
    return BY_DTYPE(dtype, add_t)(be, n, a, b, y, relu);
}

template <typename T> static int relu_fwd_t(rn_backend *be, int64_t n, const void *x, void *y) {
    cuda_ctx *g = CTX(be);
    LAUNCH_VEC(relu_fwd_k, n, vec_ok<T>(n, x, y), (const T *)x, (T *)y);
    LAUNCHED("relu_fwd");
    return RN_OK;
}
static int cuda_relu_fwd(rn_backend *be, int dtype, int64_t n, const void *x, void *y) {
    return BY_DTYPE(dtype, relu_fwd_t)(be, n, x, y);
}

template <typename T> static int relu_bwd_t(rn_backend *be, int64_t n, const void *y, const void *dy, void *dx) {
    cuda_ctx *g = CTX(be);
    LAUNCH_VEC(relu_bwd_k, n, vec_ok<T>(n, y, dy, dx), (const T *)y, (const T *)dy, (T *)dx);
    LAUNCHED("relu_bwd");
    return RN_OK;
}
static int cuda_relu_bwd(rn_backend *be, int dtype, int64_t n, const void *y, const void *dy, void *dx) {
    return BY_DTYPE(dtype, relu_bwd_t)(be, n, y, dy, dx);
}

typedef struct {
    float mean[NORM_MAXC], std[NORM_MAXC];
} norm_coef;

/* the same float operations as ToTensor then Normalize: (x/255 - mean)/std */
template <typename T> __global__ void normalize_k(int64_t n, int c, const uint8_t *x, norm_coef k, T *y) {
    GRID_LOOP(i, n) {
        int j = chan(i, c, n);
        y[i] = st<T>(__fdiv_rn(__fsub_rn(__fdiv_rn((float)x[i], 255.0f), k.mean[j]), k.std[j]));
    }
}

template <typename T>
static int normalize_t(rn_backend *be, int64_t m, int c, const uint8_t *x, const norm_coef *k, void *y) {
    cuda_ctx *g = CTX(be);
    normalize_k<T><<<blocks_for(g, m * c), TPB, 0, g->stream>>>(m * c, c, x, *k, (T *)y);
    LAUNCHED("input_normalize");
    return RN_OK;
}

static int cuda_input_normalize(rn_backend *be, int dtype, int64_t m, int c, const uint8_t *x, const float *mean,
                                const float *std, void *y) {
    if (c > NORM_MAXC)
        return rn_errorf(RN_ENOTSUP, "input_normalize: %d channels; the CUDA backend takes at most %d", c,
                         NORM_MAXC);
    norm_coef k;
    memset(&k, 0, sizeof k);
    memcpy(k.mean, mean, sizeof(float) * (size_t)c);
    memcpy(k.std, std, sizeof(float) * (size_t)c);
    return BY_DTYPE(dtype, normalize_t)(be, m, c, x, &k, y);
}

/* rn_erase_value: rn/philox.h's Box-Muller pair, the same source as the CPU's */
__device__ float erase_value_dev(uint64_t key, uint64_t epoch, uint32_t rec, uint32_t e) {
    double rad, th;
    rn_erase_pair(key, epoch, rec, e, &rad, &th);
    return (float)(e & 1 ? rad * sin(th) : rad * cos(th));
}

template <typename T>
__global__ void erase_k(int64_t n, int w, int c, int x, int y0, int bw, int random, uint64_t key, uint64_t epoch,
                        uint32_t rec, T *y) {
    GRID_LOOP(i, n) { /* i over the box's bw * bh * c elements */
        int ch = (int)(i % c), col = (int)(i / c % bw), row = (int)(i / c / bw);
        uint32_t e = (uint32_t)(((int64_t)(y0 + row) * w + x + col) * c + ch);
        float v = random ? erase_value_dev(key, epoch, rec, e) : 0.0f;
        y[e] = st<T>(v);
    }
}

template <typename T>
static int erase_t(rn_backend *be, int w, int c, int x, int y0, int bw, int bh, int random, uint64_t key,
                   int64_t epoch, uint32_t rec, void *y) {
    cuda_ctx *g = CTX(be);
    int64_t n = (int64_t)bw * bh * c;
    erase_k<T><<<blocks_for(g, n), TPB, 0, g->stream>>>(n, w, c, x, y0, bw, random, key, (uint64_t)epoch, rec,
                                                         (T *)y);
    LAUNCHED("input_erase");
    return RN_OK;
}

static int cuda_input_erase(rn_backend *be, int dtype, int h, int w, int c, int x, int y0, int bw, int bh,
                            int random, uint64_t key, int64_t epoch, uint32_t rec, void *y) {
    (void)h;
    return BY_DTYPE(dtype, erase_t)(be, w, c, x, y0, bw, bh, random, key, epoch, rec, y);
}

/* element off of image i: normalised as normalize_k does, then erased by image i's box as
   erase_k erases it */
__device__ float mix_input_dev(const uint8_t *x, int64_t img, int i, int64_t off, int ch, int xx, int yy,
                               const norm_coef &k, const rn_erase *er, uint64_t key, uint64_t epoch) {
    if (er) {
        rn_erase b = er[i];
        if (b.w > 0 && b.h > 0 && yy >= b.y && yy < b.y + b.h && xx >= b.x && xx < b.x + b.w)
            return b.random ? erase_value_dev(key, epoch, b.rec, (uint32_t)off) : 0.0f;
    }
    return __fdiv_rn(__fsub_rn(__fdiv_rn((float)x[(int64_t)i * img + off], 255.0f), k.mean[ch]), k.std[ch]);
}

/* mixup / cutmix from the u8 batch: image i and its partner i-1 normalised and erased as
   mix_input_dev does, then mixed with the CPU backend's float operations (no fused
   multiply-add) */
template <typename T>
__global__ void mix_k(int64_t total, int n, int h, int w, int c, rn_mix_desc d, float la, float lb, const uint8_t *x,
                      norm_coef k, const rn_erase *er, uint64_t key, uint64_t epoch, T *y) {
    const int64_t img = (int64_t)h * w * c;
    GRID_LOOP(e, total) {
        int i = (int)(e / img), p = (i + n - 1) % n;
        int64_t off = e % img;
        int ch = (int)(off % c), xx = (int)(off / c % w), yy = (int)(off / ((int64_t)w * c));
        float a = mix_input_dev(x, img, i, off, ch, xx, yy, k, er, key, epoch);
        float b = mix_input_dev(x, img, p, off, ch, xx, yy, k, er, key, epoch);
        float v;
        if (d.kind == RN_MIX_MIXUP)
            v = __fadd_rn(__fmul_rn(a, la), __fmul_rn(b, lb));
        else
            v = d.kind == RN_MIX_CUTMIX && yy >= d.y0 && yy < d.y1 && xx >= d.x0 && xx < d.x1 ? b : a;
        y[e] = st<T>(v);
    }
}

template <typename T>
static int mix_t(rn_backend *be, const rn_mix_desc *d, int n, int h, int w, int c, const uint8_t *x, const norm_coef *k,
                 const rn_erase *er, uint64_t key, int64_t epoch, void *y) {
    cuda_ctx *g = CTX(be);
    int64_t total = (int64_t)n * h * w * c;
    mix_k<T><<<blocks_for(g, total), TPB, 0, g->stream>>>(
        total, n, h, w, c, *d, (float)d->lambda, (float)(1.0 - d->lambda), x, *k, er, key, (uint64_t)epoch, (T *)y);
    LAUNCHED("input_mix");
    return RN_OK;
}

static int cuda_input_mix(rn_backend *be, int dtype, const rn_mix_desc *d, int n, int h, int w, int c, const uint8_t *x,
                          const float *mean, const float *std, const rn_erase *erase, uint64_t erase_key,
                          int64_t erase_epoch, void *y) {
    if (c > NORM_MAXC)
        return rn_errorf(RN_ENOTSUP, "input_mix: %d channels; the CUDA backend takes at most %d", c, NORM_MAXC);
    norm_coef k;
    memset(&k, 0, sizeof k);
    memcpy(k.mean, mean, sizeof(float) * (size_t)c);
    memcpy(k.std, std, sizeof(float) * (size_t)c);
    return BY_DTYPE(dtype, mix_t)(be, d, n, h, w, c, x, &k, erase, erase_key, erase_epoch, y);
}

/* ---- pooling: torch's rules (NaN propagates, the first maximum in row-major order
 * takes the gradient), which cuDNN does not promise for ties; ties are common after a
 * ReLU (windows of zeros). ---- */

template <typename T> __global__ void maxpool_fwd_k(rn_pool_desc d, const T *x, T *y) {
    int64_t n = (int64_t)d.n * d.p * d.q * d.c;
    GRID_LOOP(o, n) {
        int j = (int)(o % d.c);
        int64_t r = o / d.c;
        int qi = (int)(r % d.q), pi = (int)(r / d.q % d.p), ni = (int)(r / ((int64_t)d.q * d.p));
        float best = -INFINITY;
        for (int i = 0; i < d.kh; i++) {
            int hi = pi * d.stride_h - d.pad_h + i;
            if (hi < 0 || hi >= d.h) continue;
            for (int s = 0; s < d.kw; s++) {
                int wi = qi * d.stride_w - d.pad_w + s;
                if (wi < 0 || wi >= d.w) continue;
                float v = ld(x[(((int64_t)ni * d.h + hi) * d.w + wi) * d.c + j]);
                if (v > best || v != v) best = v;
            }
        }
        y[o] = st<T>(best);
    }
}

/* one thread per input element gathers from the windows that chose it, in output order */
template <typename T> __global__ void maxpool_bwd_k(rn_pool_desc d, const T *x, const T *y, const T *dy, T *dx) {
    int64_t n = (int64_t)d.n * d.h * d.w * d.c;
    GRID_LOOP(e, n) {
        int j = (int)(e % d.c);
        int64_t r = e / d.c;
        int wi0 = (int)(r % d.w), hi0 = (int)(r / d.w % d.h), ni = (int)(r / ((int64_t)d.w * d.h));
        int p0 = hi0 + d.pad_h - d.kh + 1, q0 = wi0 + d.pad_w - d.kw + 1;
        p0 = p0 > 0 ? (p0 + d.stride_h - 1) / d.stride_h : 0;
        q0 = q0 > 0 ? (q0 + d.stride_w - 1) / d.stride_w : 0;
        int p1 = (hi0 + d.pad_h) / d.stride_h, q1 = (wi0 + d.pad_w) / d.stride_w;
        if (p1 >= d.p) p1 = d.p - 1;
        if (q1 >= d.q) q1 = d.q - 1;
        float gsum = 0;
        for (int pi = p0; pi <= p1; pi++)
            for (int qi = q0; qi <= q1; qi++) {
                int64_t o = (((int64_t)ni * d.p + pi) * d.q + qi) * d.c + j;
                float yv = ld(y[o]);
                int nan = yv != yv, shi = -1, swi = -1;
                /* torch's index: the first maximum, or the last NaN of the window */
                for (int i = 0; i < d.kh; i++) {
                    int hi = pi * d.stride_h - d.pad_h + i;
                    if (hi < 0 || hi >= d.h) continue;
                    for (int s = 0; s < d.kw; s++) {
                        int wi = qi * d.stride_w - d.pad_w + s;
                        if (wi < 0 || wi >= d.w) continue;
                        float xv = ld(x[(((int64_t)ni * d.h + hi) * d.w + wi) * d.c + j]);
                        if (nan ? xv != xv : shi < 0 && xv == yv) shi = hi, swi = wi;
                    }
                }
                if (shi == hi0 && swi == wi0) gsum += ld(dy[o]);
            }
        dx[e] = st<T>(gsum);
    }
}

template <typename T> static int maxpool_fwd_t(rn_backend *be, const rn_pool_desc *d, const void *x, void *y) {
    cuda_ctx *g = CTX(be);
    maxpool_fwd_k<T><<<blocks_for(g, (int64_t)d->n * d->p * d->q * d->c), TPB, 0, g->stream>>>(*d, (const T *)x,
                                                                                                (T *)y);
    LAUNCHED("maxpool_fwd");
    return RN_OK;
}
static int cuda_maxpool_fwd(rn_backend *be, const rn_pool_desc *d, const void *x, void *y) {
    return BY_DTYPE(d->dtype, maxpool_fwd_t)(be, d, x, y);
}

template <typename T>
static int maxpool_bwd_t(rn_backend *be, const rn_pool_desc *d, const void *x, const void *y, const void *dy,
                         void *dx) {
    cuda_ctx *g = CTX(be);
    maxpool_bwd_k<T><<<blocks_for(g, (int64_t)d->n * d->h * d->w * d->c), TPB, 0, g->stream>>>(
        *d, (const T *)x, (const T *)y, (const T *)dy, (T *)dx);
    LAUNCHED("maxpool_bwd");
    return RN_OK;
}
static int cuda_maxpool_bwd(rn_backend *be, const rn_pool_desc *d, const void *x, const void *y, const void *dy,
                            void *dx) {
    return BY_DTYPE(d->dtype, maxpool_bwd_t)(be, d, x, y, dy, dx);
}

/* sums in float in the CPU backend's order, then divides */
template <typename T> __global__ void gap_fwd_k(int n, int hw, int c, const T *x, T *y) {
    GRID_LOOP(o, (int64_t)n * c) {
        int64_t ni = o / c, j = o % c;
        float s = 0;
        for (int k = 0; k < hw; k++) s += ld(x[(ni * hw + k) * c + j]);
        y[o] = st<T>(s / (float)hw);
    }
}

template <typename T> __global__ void gap_bwd_k(int n, int hw, int c, const T *dy, T *dx) {
    const float inv = 1.0f / (float)hw;
    GRID_LOOP(e, (int64_t)n * hw * c) {
        int64_t j = e % c, ni = e / ((int64_t)hw * c);
        dx[e] = st<T>(ld(dy[ni * c + j]) * inv);
    }
}

template <typename T> static int gap_fwd_t(rn_backend *be, int n, int hw, int c, const void *x, void *y) {
    cuda_ctx *g = CTX(be);
    gap_fwd_k<T><<<blocks_for(g, (int64_t)n * c), TPB, 0, g->stream>>>(n, hw, c, (const T *)x, (T *)y);
    LAUNCHED("avgpool_global_fwd");
    return RN_OK;
}
static int cuda_gap_fwd(rn_backend *be, int dtype, int n, int hw, int c, const void *x, void *y) {
    return BY_DTYPE(dtype, gap_fwd_t)(be, n, hw, c, x, y);
}

template <typename T> static int gap_bwd_t(rn_backend *be, int n, int hw, int c, const void *dy, void *dx) {
    cuda_ctx *g = CTX(be);
    gap_bwd_k<T><<<blocks_for(g, (int64_t)n * hw * c), TPB, 0, g->stream>>>(n, hw, c, (const T *)dy, (T *)dx);
    LAUNCHED("avgpool_global_bwd");
    return RN_OK;
}
static int cuda_gap_bwd(rn_backend *be, int dtype, int n, int hw, int c, const void *dy, void *dx) {
    return BY_DTYPE(dtype, gap_bwd_t)(be, n, hw, c, dy, dx);
}

/* ---- fully connected (cuBLAS) ----
 * Row-major x (n, in), w (out, in), y (n, out) are column-major x^T (in, n), w^T (in, out)
 * and y^T (out, n): y^T = w x^T, dx^T = w^T... in cuBLAS's column-major words below. */

static cudaDataType_t blas_type(int dtype) {
    return dtype == RN_F16 ? CUDA_R_16F : dtype == RN_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static cublasComputeType_t blas_compute(const cuda_ctx *g, int dtype) {
    return dtype == RN_F32 && g->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

template <typename T> __global__ void bias_rows_k(int n, int out, const T *b, T *y) {
    GRID_LOOP(i, (int64_t)n * out) y[i] = b[i % out];
}

/* db[j] [+]= sum over rows of dy[:, j], in row order like the CPU backend */
template <typename T> __global__ void bias_grad_k(int n, int out, const T *dy, T *db, int accumulate) {
    GRID_LOOP(j, (int64_t)out) {
        float s = accumulate ? ld(db[j]) : 0.0f;
        for (int i = 0; i < n; i++) s += ld(dy[(int64_t)i * out + j]);
        db[j] = st<T>(s);
    }
}

template <typename T>
static int fc_fwd_t(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w, const void *b, void *y) {
    cuda_ctx *g = CTX(be);
    float one = 1, beta = 0;
    if (b) {
        bias_rows_k<T><<<blocks_for(g, (int64_t)d->n * d->out), TPB, 0, g->stream>>>(d->n, d->out, (const T *)b,
                                                                                     (T *)y);
        LAUNCHED("fc bias");
        beta = 1;
    }
    cudaDataType_t t = blas_type(d->dtype);
    be->launches++;
    BLAS(cublas.gemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, d->out, d->n, d->in, &one, w, t, d->in, x, t, d->in, &beta,
                      y, t, d->out, blas_compute(g, d->dtype), CUBLAS_GEMM_DEFAULT));
    return RN_OK;
}
static int cuda_fc_fwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w, const void *b, void *y) {
    return BY_DTYPE(d->dtype, fc_fwd_t)(be, d, x, w, b, y);
}

template <typename T>
static int fc_bwd_t(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w, const void *dy, void *dx,
                    void *dw, void *db, int accumulate) {
    cuda_ctx *g = CTX(be);
    cudaDataType_t t = blas_type(d->dtype);
    cublasComputeType_t ct = blas_compute(g, d->dtype);
    float one = 1, zero = 0, beta = accumulate ? 1.0f : 0.0f;
    if (dx) { /* dx^T (in, n) = w^T (in, out) dy^T (out, n) */
        be->launches++;
        BLAS(cublas.gemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, d->in, d->n, d->out, &one, w, t, d->in, dy, t, d->out,
                          &zero, dx, t, d->in, ct, CUBLAS_GEMM_DEFAULT));
    }
    /* dw^T (in, out) [+]= x^T (in, n) dy (n, out) */
    be->launches++;
    BLAS(cublas.gemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_T, d->in, d->out, d->n, &one, x, t, d->in, dy, t, d->out,
                      &beta, dw, t, d->in, ct, CUBLAS_GEMM_DEFAULT));
    if (db) {
        bias_grad_k<T><<<blocks_for(g, d->out), TPB, 0, g->stream>>>(d->n, d->out, (const T *)dy, (T *)db,
                                                                    accumulate);
        LAUNCHED("fc bias gradient");
    }
    return RN_OK;
}
static int cuda_fc_bwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w, const void *dy, void *dx,
                       void *dw, void *db, int accumulate) {
    return BY_DTYPE(d->dtype, fc_bwd_t)(be, d, x, w, dy, dx, dw, db, accumulate);
}

/* ---- softmax cross-entropy: one block per row writes the row's term of the loss and its
 * gradient row, then one thread adds the terms in row order, so the mean is the same sum
 * in the same order every run (and as when one block walked the rows: the same bits).
 * A label out of range makes the loss NaN (the CPU backend names the row instead). ---- */

#define XENT_TPB 512

__device__ double block_sum(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += sh[w];
    return s;
}

__device__ double block_max(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s = fmax(s, sh[w]);
    return s;
}

/* Row blockIdx.x: its term of the loss sum into part (NaN for a label out of range) and,
   when dl is given, its gradient row. mix_weight m > 0: the soft target of mixup/cutmix,
   row i's label weighted 1-m and row i-1's m, with the CPU backend's double operations in
   the same order. */
template <typename T>
__global__ void xent_rows_k(int n, int k, float eps, float grad_scale, double m0, const double *m_at,
                            const T *logits, const int32_t *labels, double *part, T *dl) {
    __shared__ double sh[XENT_TPB / 32];
    const double m = m_at ? *m_at : m0;
    const int i = blockIdx.x;
    const T *z = logits + (int64_t)i * k;
    int lab = labels[i], lb = labels[(i + n - 1) % n], bad = 0;
    if (lab < 0 || lab >= k) {
        bad = 1;
        lab = 0;
    }
    if (lb < 0 || lb >= k) {
        bad = 1;
        lb = 0;
    }
    double mx = -INFINITY, se = 0, sz = 0;
    for (int j = threadIdx.x; j < k; j += blockDim.x) mx = fmax(mx, (double)ld(z[j]));
    mx = block_max(mx, sh);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        double v = ld(z[j]);
        se += exp(v - mx);
        sz += v;
    }
    se = block_sum(se, sh);
    sz = block_sum(sz, sh);
    double lse = mx + log(se);
    double zl = ld(z[lab]);
    double term = m == 0 ? lse - (1 - (double)eps) * zl - (double)eps * sz / k
                         : lse - (1 - (double)eps) * ((1 - m) * zl + m * (double)ld(z[lb])) - (double)eps * sz / k;
    if (threadIdx.x == 0) part[i] = bad ? NAN : term;
    if (dl) {
        /* every thread has read row i before any thread writes it (dl may alias logits) */
        __syncthreads();
        double s = (double)grad_scale / n;
        for (int j = threadIdx.x; j < k; j += blockDim.x) {
            double t = m == 0 ? (j == lab ? 1 - (double)eps : 0) + (double)eps / k
                              : (1 - (double)eps) * ((j == lab ? 1 - m : 0) + (j == lb ? m : 0)) + (double)eps / k;
            dl[(int64_t)i * k + j] = st<T>((float)((exp((double)ld(z[j]) - lse) - t) * s));
        }
    }
}

/* the mean of the rows' terms, added in row order by one thread */
__global__ void xent_mean_k(int n, const double *part, float *loss) {
    double total = 0;
    for (int i = 0; i < n; i++) total += part[i];
    *loss = (float)(total / n);
}

/* The rows' terms live in a small buffer of the context (as BN's inference coefficients):
 * a loss may run where no workspace is reserved. */
template <typename T>
static int xent_t(rn_backend *be, const rn_xent_desc *d, const void *logits, const int32_t *labels, float *loss,
                  void *dl) {
    cuda_ctx *g = CTX(be);
    if ((size_t)d->n > g->xent_cap) {
        double *p = NULL;
        int rc = cuda_alloc(be, (size_t)d->n * sizeof(double), (void **)&p);
        if (rc) return rn_error_context(rc, "softmax_xent: the loss terms of %d rows", d->n);
        FREED(cudaFree(g->xent_part)); /* waits for the ops that used it */
        g->xent_part = p;
        g->xent_cap = (size_t)d->n;
        be->moved++;
    }
    xent_rows_k<T><<<d->n, XENT_TPB, 0, g->stream>>>(d->n, d->classes, d->label_smoothing, d->grad_scale,
                                                     d->mix_weight, d->mix_weight_at, (const T *)logits, labels,
                                                     g->xent_part, (T *)dl);
    LAUNCHED("softmax_xent rows");
    xent_mean_k<<<1, 1, 0, g->stream>>>(d->n, g->xent_part, loss);
    LAUNCHED("softmax_xent mean");
    return RN_OK;
}
static int cuda_softmax_xent(rn_backend *be, const rn_xent_desc *d, const void *logits, const int32_t *labels,
                             float *loss, void *dl) {
    return BY_DTYPE(d->dtype, xent_t)(be, d, logits, labels, loss, dl);
}

/* ---- the train top-1 (rn_top1_count) ----
 * One block: warp w takes rows w, w + 32, ...; each lane the first maximum of its columns
 * (a NaN never taken), then the lanes' (value, column) pairs merged to the larger value or,
 * equal, the smaller column: the row's first maximum with NaN never the largest, as the
 * CPU loop finds it; a NaN in column 0 makes class 0, as that loop's start does. The rows'
 * hits are counted per warp and the warps' counts added by one thread: an integer, the
 * same for any order. */
#define TOP1_TPB 1024
__global__ void top1_count_k(int n, int k, int target0, const int32_t *target_at, const float *logits,
                             const int32_t *labels, int32_t *hits) {
    __shared__ int counts[TOP1_TPB / 32];
    const int target = target_at ? *target_at : target0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int count = 0;
    for (int i = warp; i < n; i += TOP1_TPB / 32) {
        const float *z = logits + (int64_t)i * k;
        float v = 0;
        int at = -1; /* none yet */
        for (int j = lane; j < k; j += 32) {
            float x = z[j];
            if (x == x && (at < 0 || x > v)) v = x, at = j;
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_down_sync(0xffffffffu, v, o);
            int oat = __shfl_down_sync(0xffffffffu, at, o);
            if (oat >= 0 && (at < 0 || ov > v || (ov == v && oat < at))) v = ov, at = oat;
        }
        if (lane == 0) {
            float z0 = z[0];
            int best = z0 != z0 || at < 0 ? 0 : at;
            int a = labels[i], p = labels[(i + n - 1) % n];
            int want = rn_top1_want(target, a, p);
            count += best == want;
        }
    }
    if (lane == 0) counts[warp] = count;
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
        for (int w = 0; w < TOP1_TPB / 32; w++) total += counts[w];
        *hits = total;
    }
}

static int cuda_top1_count(rn_backend *be, int n, int classes, const float *logits, const int32_t *labels,
                           int target, const int32_t *target_at, int32_t *hits) {
    top1_count_k<<<1, TOP1_TPB, 0, CTX(be)->stream>>>(n, classes, target, target_at, logits, labels, hits);
    LAUNCHED("top1_count");
    return RN_OK;
}

/* ---- SGD: torch's float operations in torch's order, rounded like the CPU backend
 * (no fused multiply-add) ---- */

/* The fused step of mixed precision: unscale (gs), weight decay, momentum, the fp32
 * master update and, when copy is given, the compute copy in T, in one pass. (The
 * overflow check that decides whether to run it is nonfinite_k, before: skipping must be
 * decided before the first weight is written.) */
template <typename T>
__global__ void sgd_k(int64_t n, float lr_arg, const float *lr_at, const int32_t *skip_if, float mom, float damp1,
                      float wd, float gs, int nesterov, int first, float *p, const float *grad, float *buf, T *copy) {
    if (skip_if && *skip_if) return; /* an fp16 overflow: the step is skipped */
    const float lr = lr_at ? *lr_at : lr_arg;
    GRID_LOOP(i, n) {
        float g = gs == 1.0f ? grad[i] : __fmul_rn(grad[i], gs);
        if (wd != 0) g = __fadd_rn(g, __fmul_rn(wd, p[i]));
        if (mom != 0) {
            float b = first ? g : __fadd_rn(__fmul_rn(buf[i], mom), __fmul_rn(damp1, g));
            buf[i] = b;
            g = nesterov ? __fadd_rn(g, __fmul_rn(mom, b)) : b;
        }
        float np = __fadd_rn(p[i], __fmul_rn(-lr, g));
        p[i] = np;
        if (copy) copy[i] = st<T>(np);
    }
}

template <typename T>
static int sgd_t(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p, const float *grad, float *buf,
                 void *copy) {
    cuda_ctx *g = CTX(be);
    sgd_k<T><<<blocks_for(g, n), TPB, 0, g->stream>>>(n, d->lr, d->lr_at, d->skip_if, d->momentum,
                                                       1.0f - d->dampening, d->weight_decay, d->grad_scale,
                                                       d->nesterov, d->first_step, p, grad, buf, (T *)copy);
    LAUNCHED("sgd_update");
    return RN_OK;
}
static int cuda_sgd_update(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p, const float *grad,
                           float *buf, void *copy) {
    return BY_DTYPE(copy ? d->dtype : RN_F32, sgd_t)(be, d, n, p, grad, buf, copy);
}

/* ---- LARS: the CPU backend's operations in its order (rn/backend.h), so the two agree
 * bit for bit: a block of RN_LARS_LANES threads per RN_LARS_CHUNK chunk, thread l summing
 * lane l in double (coalesced reads), thread 0 adding the lanes in order; one thread adds
 * the chunks in order and forms lr * trust; then the elementwise step. No fused
 * multiply-add anywhere (the CPU build has none). ---- */

/* chunk blockIdx.x's lane threadIdx.x: the squares of x[i] (times gs unless 1) added in
 * element order, in double */
__device__ double lane_sumsq(int64_t n, const float *x, float gs) {
    const int64_t i0 = blockIdx.x * (int64_t)RN_LARS_CHUNK, i1 = i0 + RN_LARS_CHUNK < n ? i0 + RN_LARS_CHUNK : n;
    double s = 0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += RN_LARS_LANES) {
        float v = gs == 1.0f ? x[i] : __fmul_rn(x[i], gs);
        s = __dadd_rn(s, __dmul_rn((double)v, (double)v));
    }
    return s;
}

/* the block's lane sums (one per thread, through lane[RN_LARS_LANES]) added in lane order:
 * the chunk's sum, on thread 0 (0 on the others); every thread must call it, each call
 * with an array of its own (no barrier after thread 0's reads) */
__device__ double lanes_in_order(double s, double *lane) {
    lane[threadIdx.x] = s;
    __syncthreads();
    double t = 0;
    if (threadIdx.x == 0)
        for (int l = 0; l < RN_LARS_LANES; l++) t = __dadd_rn(t, lane[l]);
    return t;
}

__global__ void lars_norm_k(int64_t n, float gs, const float *p, const float *grad, double *part) {
    __shared__ double lw[RN_LARS_LANES], lg[RN_LARS_LANES];
    double sw = lanes_in_order(lane_sumsq(n, p, 1.0f), lw);
    double sg = lanes_in_order(lane_sumsq(n, grad, gs), lg);
    if (threadIdx.x == 0) {
        part[2 * blockIdx.x] = sw;
        part[2 * blockIdx.x + 1] = sg;
    }
}

__global__ void lars_trust_k(int64_t chunks, float lr_arg, const float *lr_at, float eta, float wd, float eps,
                             const double *part, float *slr) {
    const float lr = lr_at ? *lr_at : lr_arg;
    double sw = 0, sg = 0;
    for (int64_t c = 0; c < chunks; c++) {
        sw = __dadd_rn(sw, part[2 * c]);
        sg = __dadd_rn(sg, part[2 * c + 1]);
    }
    double wn = sqrt(sw), gn = sqrt(sg), trust = 1.0;
    if (wn > 0 && gn > 0)
        trust = __ddiv_rn(__dmul_rn((double)eta, wn), __dadd_rn(__dadd_rn(gn, __dmul_rn((double)wd, wn)), (double)eps));
    *slr = (float)__dmul_rn((double)lr, trust);
}

/* slr: lr * trust in device memory (adapted tensors), or NULL to use lr (or *lr_at) */
template <typename T>
__global__ void lars_k(int64_t n, float lr, const float *lr_at, const int32_t *skip_if, const float *slr, float mom,
                       float wd, float gs, float *p, const float *grad, float *buf, T *copy) {
    if (skip_if && *skip_if) return; /* an fp16 overflow: the step is skipped */
    const float s = slr ? *slr : lr_at ? *lr_at : lr;
    GRID_LOOP(i, n) {
        float g = gs == 1.0f ? grad[i] : __fmul_rn(grad[i], gs);
        if (wd != 0) g = __fadd_rn(g, __fmul_rn(wd, p[i]));
        float b = __fadd_rn(__fmul_rn(buf[i], mom), __fmul_rn(s, g));
        buf[i] = b;
        float np = __fsub_rn(p[i], b);
        p[i] = np;
        if (copy) copy[i] = st<T>(np);
    }
}

template <typename T>
static int lars_t(rn_backend *be, const rn_lars_desc *d, int64_t n, float *p, const float *grad, float *buf,
                  void *copy) {
    cuda_ctx *g = CTX(be);
    float *slr = NULL;
    if (d->adapt) {
        int64_t chunks = (n + RN_LARS_CHUNK - 1) / RN_LARS_CHUNK;
        double *part = (double *)be->ws;
        slr = (float *)(part + 2 * chunks);
        lars_norm_k<<<(unsigned)chunks, RN_LARS_LANES, 0, g->stream>>>(n, d->grad_scale, p, grad, part);
        LAUNCHED("lars_update norms");
        lars_trust_k<<<1, 1, 0, g->stream>>>(chunks, d->lr, d->lr_at, d->eta, d->weight_decay, d->eps, part, slr);
        LAUNCHED("lars_update trust ratio");
    }
    lars_k<T><<<blocks_for(g, n), TPB, 0, g->stream>>>(n, d->lr, d->lr_at, d->skip_if, slr, d->momentum,
                                                        d->weight_decay, d->grad_scale, p, grad, buf, (T *)copy);
    LAUNCHED("lars_update");
    return RN_OK;
}
static int cuda_lars_update(rn_backend *be, const rn_lars_desc *d, int64_t n, float *p, const float *grad,
                            float *buf, void *copy) {
    return BY_DTYPE(copy ? d->dtype : RN_F32, lars_t)(be, d, n, p, grad, buf, copy);
}

/* ---- the sum of squares (--clip-grad-norm): lars_norm_k's order for one array, the
 * CPU backend's cpu_sumsq bit for bit ---- */

__global__ void sumsq_k(int64_t n, const float *x, double *part) {
    __shared__ double lane[RN_LARS_LANES];
    double s = lanes_in_order(lane_sumsq(n, x, 1.0f), lane);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void sumsq_total_k(int64_t chunks, const double *part, double *out) {
    double s = 0;
    for (int64_t c = 0; c < chunks; c++) s = __dadd_rn(s, part[c]);
    *out = s;
}

static int cuda_sumsq(rn_backend *be, int64_t n, const float *x, double *out) {
    cuda_ctx *g = CTX(be);
    int64_t chunks = (n + RN_LARS_CHUNK - 1) / RN_LARS_CHUNK;
    double *part = (double *)be->ws;
    if (chunks > 0) {
        sumsq_k<<<(unsigned)chunks, RN_LARS_LANES, 0, g->stream>>>(n, x, part);
        LAUNCHED("sumsq chunks");
    }
    sumsq_total_k<<<1, 1, 0, g->stream>>>(chunks, part, out);
    LAUNCHED("sumsq");
    return RN_OK;
}

/* ---- the weights' moving average: the CPU backend's ema_range, rounded the same way
 * (each product and the sum rounded once, no fused multiply-add) ---- */

__global__ void ema_k(int64_t n, const float *x, float *avg, float keep, float take) {
    GRID_LOOP(i, n) avg[i] = __fadd_rn(__fmul_rn(keep, avg[i]), __fmul_rn(take, x[i]));
}

static int cuda_ema_update(rn_backend *be, int64_t n, const float *x, float *avg, float keep, float take) {
    cuda_ctx *g = CTX(be);
    ema_k<<<blocks_for(g, n), TPB, 0, g->stream>>>(n, x, avg, keep, take);
    LAUNCHED("ema_update");
    return RN_OK;
}

/* ---- conversions and the overflow check of mixed precision ---- */

/* y [+]= x in D, the sum formed in fp32 as the CPU backend forms it */
template <typename S, typename D> __global__ void cast_k(int64_t n, const S *x, D *y, int accumulate) {
    GRID_LOOP(i, n) y[i] = st<D>(accumulate ? ld(y[i]) + ld(x[i]) : ld(x[i]));
}

template <typename S>
static int cast_from(rn_backend *be, int dst, int64_t n, const void *x, void *y, int accumulate) {
    cuda_ctx *g = CTX(be);
    int64_t nb = blocks_for(g, n);
    if (dst == RN_F16)
        cast_k<S, __half><<<nb, TPB, 0, g->stream>>>(n, (const S *)x, (__half *)y, accumulate);
    else if (dst == RN_BF16)
        cast_k<S, __nv_bfloat16><<<nb, TPB, 0, g->stream>>>(n, (const S *)x, (__nv_bfloat16 *)y, accumulate);
    else
        cast_k<S, float><<<nb, TPB, 0, g->stream>>>(n, (const S *)x, (float *)y, accumulate);
    LAUNCHED("cast");
    return RN_OK;
}
static int cuda_cast(rn_backend *be, int src, int dst, int64_t n, const void *x, void *y, int accumulate) {
    return BY_DTYPE(src, cast_from)(be, dst, n, x, y, accumulate);
}

/* every thread that saw an inf or NaN stores 1; none ever stores anything else */
__global__ void nonfinite_k(int64_t n, const float *x, int32_t *flag) {
    int any = 0;
    GRID_LOOP(i, n) any |= !isfinite(x[i]);
    if (any) *flag = 1;
}

static int cuda_nonfinite(rn_backend *be, int64_t n, const float *x, int32_t *flag) {
    cuda_ctx *g = CTX(be);
    nonfinite_k<<<blocks_for(g, n), TPB, 0, g->stream>>>(n, x, flag);
    LAUNCHED("nonfinite");
    return RN_OK;
}

/* ---- collectives across processes: NCCL ----
 * The communicator is non-blocking (config.blocking = 0) so that no NCCL call can hang
 * the process: each returns at once (maybe ncclInProgress) and coll_wait polls
 * ncclCommGetAsyncError, and the stream, under the timeout, aborting the communicator
 * when it runs out. rn_backend_coll_sum runs on the compute stream (the gradients it sums
 * were written there, the step that reads the sums comes after: the stream orders both).
 * rn_backend_coll_sum_async, the overlapped sum's, runs on comm_st, ordered by events: it
 * waits for an event recorded on the compute stream when the bucket is handed over, and
 * rn_backend_coll_join makes the compute stream wait for comm_st. */
#ifdef RN_HAVE_NCCL

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Abort: the only NCCL call that returns whatever the peers do, and it stops kernels of
 * this communicator still waiting on the stream. */
static void comm_abort(cuda_ctx *g) {
    if (g->comm) ncclCommAbort(g->comm);
    g->comm = NULL;
}

/* A failed NCCL call: the message is formed while the communicator (and NCCL's last
 * error, which says more than the result code) still exists, then it is aborted so that
 * no later call waits on it. */
static int nccl_fail(cuda_ctx *g, ncclResult_t r, const char *call, const char *file, int line) {
    const char *last = g->comm ? ncclGetLastError(g->comm) : NULL;
    int rc = rn_errorf(RN_EGPU, "%s:%d: %s: %s%s%s", file, line, call, ncclGetErrorString(r),
                       last && *last ? ": " : "", last && *last ? last : "");
    comm_abort(g);
    return rc;
}
/* an NCCL call on context g: ncclInProgress is how a non-blocking communicator says
 * "accepted", and coll_wait follows it */
#define RN_NCCL(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess && r_ != ncclInProgress) \
    return nccl_fail(g, r_, #call, __FILE__, __LINE__); } while (0)

/* Wait until the communicator's last call is done (the operations of a group are then
 * enqueued on the stream) and, with drain, until the stream has run them. Gives up
 * after g->coll_timeout seconds: a peer that died or hangs leaves its partners waiting
 * for ever, which only an abort ends. */
static int coll_wait_on(cuda_ctx *g, int drain, cudaStream_t st_drain, const char *what) {
    double t0 = now_s();
    for (;;) {
        ncclResult_t st = ncclSuccess, r = ncclCommGetAsyncError(g->comm, &st);
        if (r != ncclSuccess) st = r;
        if (st != ncclSuccess && st != ncclInProgress)
            return rn_error_context(nccl_fail(g, st, "ncclCommGetAsyncError", __FILE__, __LINE__),
                                    "%s (rank %d of %d, cuda:%d)", what, g->rank, g->world, g->dev);
        if (st == ncclSuccess) {
            if (!drain) return RN_OK;
            cudaError_t e = cudaStreamQuery(st_drain);
            if (e == cudaSuccess) return RN_OK;
            if (e != cudaErrorNotReady) {
                (void)cudaGetLastError();
                comm_abort(g);
                return rn_errorf(RN_EGPU, "%s:%d: %s (rank %d of %d, cuda:%d): cudaStreamQuery: %s", __FILE__,
                                 __LINE__, what, g->rank, g->world, g->dev, cudaGetErrorString(e));
            }
        }
        if (now_s() - t0 > g->coll_timeout) {
            comm_abort(g);
            return rn_errorf(RN_EGPU,
                             "%s (rank %d of %d, cuda:%d): no progress in %g s: another rank died or hangs "
                             "(see the other ranks' messages; NCCL_DEBUG=INFO shows where NCCL waits, "
                             "NCCL_SOCKET_IFNAME chooses the network the ranks share)",
                             what, g->rank, g->world, g->dev, g->coll_timeout);
        }
        if (g->coll_poll) g->coll_poll(g->coll_poll_arg);
        /* short enough to add little to a bucket's milliseconds */
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
}

static int coll_wait(cuda_ctx *g, int drain, const char *what) { return coll_wait_on(g, drain, g->stream, what); }

static void cuda_coll_set_poll(rn_backend *be, void (*poll)(void *), void *arg) {
    cuda_ctx *g = CTX(be);
    g->coll_poll = poll;
    g->coll_poll_arg = arg;
}

static int cuda_coll_id(rn_backend *be, void *id, size_t cap, size_t *len) {
    (void)be;
    if (cap < sizeof(ncclUniqueId))
        return rn_errorf(RN_EINVAL, "NCCL id: %zu bytes of room, ncclUniqueId needs %zu", cap, sizeof(ncclUniqueId));
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return rn_errorf(RN_EGPU, "%s:%d: ncclGetUniqueId: %s: %s (NCCL_DEBUG=INFO says more)", __FILE__, __LINE__,
                         ncclGetErrorString(r), ncclGetLastError(NULL));
    memcpy(id, &u, sizeof u);
    *len = sizeof u;
    return RN_OK;
}

static int cuda_coll_init(rn_backend *be, int rank, int world, const void *id, size_t len, double timeout_s) {
    cuda_ctx *g = CTX(be);
    if (g->comm) return rn_errorf(RN_EINVAL, "NCCL communicator init: cuda:%d already has a communicator", g->dev);
    if (len != sizeof(ncclUniqueId))
        return rn_errorf(RN_EINVAL, "NCCL communicator init: an id of %zu bytes, ncclUniqueId has %zu", len,
                         sizeof(ncclUniqueId));
    if (world < 1 || rank < 0 || rank >= world || !(timeout_s > 0))
        return rn_errorf(RN_EINVAL, "NCCL communicator init: rank %d of %d, timeout %g s", rank, world, timeout_s);
    g->rank = rank;
    g->world = world;
    g->coll_timeout = timeout_s;
    /* NCCL takes the device from the calling thread */
    CU(cudaSetDevice(g->dev));
    if (world > g->coll_small_world) { /* (an init after an abort may bring a larger world) */
        cudaFree(g->coll_small);
        g->coll_small = NULL, g->coll_small_world = 0;
        CU(cudaMalloc(&g->coll_small, sizeof(float) * (size_t)world * (size_t)world));
        g->coll_small_world = world;
    }
    if (!g->comm_st) {
        CU(cudaStreamCreateWithFlags(&g->comm_st, cudaStreamNonBlocking));
        CU(cudaEventCreateWithFlags(&g->grads_ev, cudaEventDisableTiming));
        CU(cudaEventCreateWithFlags(&g->comm_ev, cudaEventDisableTiming));
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    RN_NCCL(ncclCommInitRankConfig(&g->comm, world, u, rank, &cfg));
    return coll_wait(g, 0, "NCCL communicator init");
}

/* Chunk r of n floats split over W ranks: [n*r/W, n*(r+1)/W), as lib/dist.c splits. */
static int64_t chunk_lo(int64_t n, int r, int W) { return n * r / W; }

/* acc = ((c0[i] + c1[i]) + c2[i]) ... over the world's copies of this rank's chunk, in
 * rank order; copy `self` is x itself, copy p of another rank is recv[slot p], slots
 * numbering the others in rank order. One thread adds one element's copies in order, so
 * the bits are those of lib/dist.c's host sum. A round of a sum over rounds (run) starts
 * from run[i] instead, unless first, and leaves acc there. With last, x[i] = acc (for
 * the gather). */
__global__ void coll_add_k(int64_t m, int W, int self, float *x, const float *recv, float *run, int first,
                           int last) {
    GRID_LOOP(i, m) {
        float acc = first ? 0.0f : run[i];
        for (int p = 0, slot = 0; p < W; p++) {
            float v = p == self ? x[i] : recv[(int64_t)slot++ * m + i];
            acc = first && p == 0 ? v : __fadd_rn(acc, v);
        }
        if (run) run[i] = acc;
        if (last) x[i] = acc;
    }
}

/* The rank-ordered sum: (1) every rank sends chunk p of its x to rank p (an all-to-all of
 * send/recv pairs), (2) rank p adds the W copies of chunk p in rank order (coll_add_k),
 * (3) every rank sends its summed chunk to every other (an all-gather of send/recv pairs
 * into x in place). ncclAllReduce would be faster but its order of additions depends on
 * the algorithm NCCL picks; ncclAllGather in place needs equal chunks, which n not a
 * multiple of W does not give, and send/recv takes any counts. */
static int coll_sum_on(cuda_ctx *g, float *x, float *scratch, int64_t n, cudaStream_t st, float *run, int first,
                       int last) {
    if (!g->comm)
        return rn_errorf(RN_EGPU, "NCCL sum on cuda:%d: no communicator (rn_backend_coll_init not called, or an "
                         "earlier error aborted it)", g->dev);
    int W = g->world, R = g->rank;
    if (n == 0 || (W == 1 && !run)) return RN_OK;
    int64_t lo = chunk_lo(n, R, W), mine = chunk_lo(n, R + 1, W) - lo;
    /* the other ranks' copies of this chunk need (W-1)*mine floats; that exceeds scratch's
     * n only when the chunks are shorter than W floats (a bucket of a few floats), and
     * then it is under (W-1)*W: the context's own coll_small holds it */
    float *recv = (W - 1) * mine <= n ? scratch : g->coll_small;
    ncclResult_t r = ncclSuccess;
    const char *call = "ncclGroupStart";
    if ((r = ncclGroupStart()) != ncclSuccess) goto fail;
    for (int p = 0, slot = 0; p < W; p++) {
        if (p == R) continue;
        int64_t plo = chunk_lo(n, p, W), pn = chunk_lo(n, p + 1, W) - plo;
        /* both sides know both counts: a pair is skipped on both or on neither */
        call = "ncclSend";
        if (pn && (r = ncclSend(x + plo, (size_t)pn, ncclFloat32, p, g->comm, st)) != ncclSuccess) break;
        call = "ncclRecv";
        if (mine && (r = ncclRecv(recv + (int64_t)slot * mine, (size_t)mine, ncclFloat32, p, g->comm, st)) !=
                        ncclSuccess)
            break;
        slot++;
    }
    {
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess && e != ncclSuccess && e != ncclInProgress) r = e, call = "ncclGroupEnd";
    }
    if (r != ncclSuccess) goto fail;
    {
        int rc = coll_wait(g, 0, "NCCL sum (exchange)");
        if (rc) return rc;
    }
    if (mine) {
        coll_add_k<<<blocks_for(g, mine), TPB, 0, st>>>(mine, W, R, x + lo, recv, run, first, last);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) {
            comm_abort(g);
            return rn_errorf(RN_EGPU, "%s:%d: kernel coll_add: %s", __FILE__, __LINE__, cudaGetErrorString(e));
        }
    }
    /* a round before the last: the running sums stay in run, nothing is gathered */
    if (!last) return RN_OK;
    call = "ncclGroupStart";
    if ((r = ncclGroupStart()) != ncclSuccess) goto fail;
    for (int p = 0; p < W; p++) {
        if (p == R) continue;
        int64_t plo = chunk_lo(n, p, W), pn = chunk_lo(n, p + 1, W) - plo;
        call = "ncclSend";
        if (mine && (r = ncclSend(x + lo, (size_t)mine, ncclFloat32, p, g->comm, st)) != ncclSuccess) break;
        call = "ncclRecv";
        if (pn && (r = ncclRecv(x + plo, (size_t)pn, ncclFloat32, p, g->comm, st)) != ncclSuccess) break;
    }
    {
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess && e != ncclSuccess && e != ncclInProgress) r = e, call = "ncclGroupEnd";
    }
    if (r != ncclSuccess) goto fail;
    return coll_wait_on(g, 0, st, "NCCL sum (gather)");
fail:
    return rn_error_context(nccl_fail(g, r, call, __FILE__, __LINE__), "NCCL sum of %lld floats (rank %d of %d)",
                            (long long)n, R, W);
}

static int cuda_coll_sum(rn_backend *be, float *x, float *scratch, int64_t n) {
    cuda_ctx *g = CTX(be);
    int rc = coll_sum_on(g, x, scratch, n, g->stream, NULL, 1, 1);
    return rc ? rc : coll_wait(g, 1, "NCCL sum");
}

/* The overlapped sum: a bucket goes on comm_st once the compute stream has written it
 * (an event recorded there now: everything enqueued so far, its last gradient included),
 * while the compute stream goes on with the backward; the host only waits until NCCL
 * has enqueued it. Both streams touch disjoint memory meanwhile (the bucket's pack and
 * scratch ranges are the caller's, no longer written by the backward). */
static int cuda_coll_sum_async(rn_backend *be, float *x, float *scratch, int64_t n) {
    cuda_ctx *g = CTX(be);
    if (!g->comm_st) return cuda_coll_sum(be, x, scratch, n);
    CU(cudaEventRecord(g->grads_ev, g->stream));
    CU(cudaStreamWaitEvent(g->comm_st, g->grads_ev, 0));
    return coll_sum_on(g, x, scratch, n, g->comm_st, NULL, 1, 1);
}

/* A round of a sum over rounds (rn_backend_coll_sum_round_async), as cuda_coll_sum_async
 * enqueues a bucket; without a communication stream, on the compute stream, waited for. */
static int cuda_coll_sum_round_async(rn_backend *be, float *x, float *scratch, float *run, int64_t n, int first,
                                     int last) {
    cuda_ctx *g = CTX(be);
    if (!run) return rn_errorf(RN_EINVAL, "NCCL sum in rounds on cuda:%d: no buffer for the running sums", g->dev);
    if (!g->comm_st) {
        int rc = coll_sum_on(g, x, scratch, n, g->stream, run, first, last);
        return rc ? rc : coll_wait(g, 1, "NCCL sum");
    }
    CU(cudaEventRecord(g->grads_ev, g->stream));
    CU(cudaStreamWaitEvent(g->comm_st, g->grads_ev, 0));
    return coll_sum_on(g, x, scratch, n, g->comm_st, run, first, last);
}

/* Every bucket sent so far is summed (comm_st drained under the timeout, so a dead peer
 * is reported here and not by a later hang), and the compute stream orders after them. */
static int cuda_coll_join(rn_backend *be) {
    cuda_ctx *g = CTX(be);
    if (!g->comm_st) return RN_OK;
    if (!g->comm) {
        /* what is still queued (the abort ends NCCL's kernels) must be done before the
           caller frees the buckets' memory */
        if (cudaStreamSynchronize(g->comm_st) != cudaSuccess) (void)cudaGetLastError();
        return rn_errorf(RN_EGPU, "NCCL sum on cuda:%d: no communicator (an earlier error aborted it)", g->dev);
    }
    int rc = coll_wait_on(g, 1, g->comm_st, "NCCL sum (the overlapped buckets)");
    if (rc) return rc;
    CU(cudaEventRecord(g->comm_ev, g->comm_st));
    CU(cudaStreamWaitEvent(g->stream, g->comm_ev, 0));
    return RN_OK;
}

/* Finalize flushes what is still queued and lets the peers finish theirs; when that
 * cannot complete (a peer is gone) within the timeout, abort. */
static void comm_close(cuda_ctx *g) {
    if (!g->comm) return;
    if (cudaSetDevice(g->dev) != cudaSuccess) (void)cudaGetLastError();
    ncclResult_t st = ncclCommFinalize(g->comm);
    double t0 = now_s();
    while (st == ncclInProgress && now_s() - t0 < g->coll_timeout) {
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
        if (ncclCommGetAsyncError(g->comm, &st) != ncclSuccess) st = ncclInternalError;
    }
    if (st != ncclSuccess) {
        comm_abort(g);
        return;
    }
    ncclCommDestroy(g->comm);
    g->comm = NULL;
}
#endif

/* ---- context ---- */

static void ctx_free(cuda_ctx *g) {
    if (!g) return;
    rn_algocache_free(g->algos);
#ifdef RN_HAVE_NCCL
    /* before the stream its operations run on goes */
    comm_close(g);
    cudaFree(g->coll_small);
    if (g->comm_st) cudaStreamDestroy(g->comm_st);
    if (g->grads_ev) cudaEventDestroy(g->grads_ev);
    if (g->comm_ev) cudaEventDestroy(g->comm_ev);
#endif
    for (int i = 0; i < g->nplans; i++) plan_destroy(&g->plans[i]);
    free(g->plans);
    if (g->bn_x) cudnnDestroyTensorDescriptor(g->bn_x);
    if (g->bn_stat) cudnnDestroyTensorDescriptor(g->bn_stat);
    if (g->bn_relu) cudnnDestroyActivationDescriptor(g->bn_relu);
    if (g->blas) cublas.destroy(g->blas);
    cudaFree(g->blas_ws);
    if (g->dnn) cudnnDestroy(g->dnn);
    if (g->stream) cudaStreamDestroy(g->stream);
    if (g->copy) cudaStreamDestroy(g->copy);
    if (g->copied) cudaEventDestroy(g->copied);
    if (g->consumed) cudaEventDestroy(g->consumed);
    for (int64_t i = 0; i < g->nmarks; i++) cudaEventDestroy(g->marks[i]);
    for (int i = 0; i < g->ncopy_ev; i++) cudaEventDestroy(g->copy_ev[i]);
    free(g->marks);
    cudaFree(g->coef);
    cudaFree(g->xent_part);
    free(g);
}

static void cuda_destroy(rn_backend *be) {
    ctx_free(CTX(be));
    be->impl = NULL;
}

/* The table lives in the context (filled by name, so it cannot drift from the header's
 * order) rather than in a global. */
static void fill_ops(rn_backend_ops *o) {
    memset(o, 0, sizeof *o);
    o->kind = "cuda";
    o->is_host = 0;
    o->dtypes = (1u << RN_F32) | (1u << RN_F16) | (1u << RN_BF16);
    o->destroy = cuda_destroy;
    o->alloc = cuda_alloc;
    o->free = cuda_free;
    o->mem_info = cuda_mem_info;
    o->host_alloc = cuda_host_alloc;
    o->host_free = cuda_host_free;
    o->upload_async = cuda_upload_async;
    o->upload_wait = cuda_upload_wait;
    o->upload = cuda_upload;
    o->put = cuda_put;
    o->download = cuda_download;
    o->copy = cuda_copy;
    o->zero = cuda_zero;
    o->sync = cuda_sync;
    o->pci_bus_id = cuda_pci_bus_id;
    o->mark = cuda_mark;
    o->marks_read = cuda_marks_read;
    o->copy_spans = cuda_copy_spans;
    o->conv_workspace = cuda_conv_workspace;
    o->conv_algo = cuda_conv_algo;
    o->conv_fwd = cuda_conv_fwd;
    o->conv_bwd_data = cuda_conv_bwd_data;
    o->conv_bwd_filter = cuda_conv_bwd_filter;
    o->bn_workspace = cuda_bn_workspace;
    o->bn_reserve_size = cuda_bn_reserve_size;
    o->bn_fwd_train = cuda_bn_fwd_train;
    o->bn_fwd_infer = cuda_bn_fwd_infer;
    o->bn_bwd = cuda_bn_bwd;
    o->bn_bwd_frozen = cuda_bn_bwd_frozen;
    o->add = cuda_add;
    o->relu_fwd = cuda_relu_fwd;
    o->relu_bwd = cuda_relu_bwd;
    o->input_normalize = cuda_input_normalize;
    o->input_erase = cuda_input_erase;
    o->input_mix = cuda_input_mix;
    o->maxpool_fwd = cuda_maxpool_fwd;
    o->maxpool_bwd = cuda_maxpool_bwd;
    o->avgpool_global_fwd = cuda_gap_fwd;
    o->avgpool_global_bwd = cuda_gap_bwd;
    o->fc_fwd = cuda_fc_fwd;
    o->fc_bwd = cuda_fc_bwd;
    o->softmax_xent = cuda_softmax_xent;
    o->top1_count = cuda_top1_count;
    o->sgd_update = cuda_sgd_update;
    o->lars_update = cuda_lars_update;
    o->sumsq = cuda_sumsq;
    o->cast = cuda_cast;
    o->nonfinite = cuda_nonfinite;
    o->ema_update = cuda_ema_update;
    o->capture_begin = cuda_capture_begin;
    o->capture_end = cuda_capture_end;
    o->graph_launch = cuda_graph_launch;
    o->graph_free = cuda_graph_free;
#ifdef RN_HAVE_NCCL
    o->coll_id = cuda_coll_id;
    o->coll_init = cuda_coll_init;
    o->coll_sum = cuda_coll_sum;
    o->coll_sum_async = cuda_coll_sum_async;
    o->coll_sum_round_async = cuda_coll_sum_round_async;
    o->coll_set_poll = cuda_coll_set_poll;
    o->coll_join = cuda_coll_join;
#endif
}

/* Why there is no GPU, in words that do not send a user after a driver upgrade when
 * there is no driver at all (cudart says "insufficient driver" in both cases). */
static int no_gpu(int index, cudaError_t e) {
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    cudaGetLastError();
    if (drv == 0)
        return rn_errorf(RN_EGPU, "cuda:%d: no usable NVIDIA GPU: no NVIDIA driver is loaded (libcuda.so.1 not "
                         "found) (run rn-gpuinfo to see why; use --device cpu)", index);
    if (e == cudaErrorInsufficientDriver)
        return rn_errorf(RN_EGPU, "cuda:%d: no usable NVIDIA GPU: the driver supports CUDA %d.%d, this rn was built "
                         "with CUDA %d.%d (%s) (run rn-gpuinfo to see why; use --device cpu)", index, drv / 1000,
                         drv % 1000 / 10, rt / 1000, rt % 1000 / 10, cudaGetErrorString(e));
    return rn_errorf(RN_EGPU, "cuda:%d: no usable NVIDIA GPU: %s (run rn-gpuinfo to see why; use --device cpu)",
                     index, cudaGetErrorString(e));
}

extern "C" int rn_backend_cuda_blas_open(void) {
    pthread_once(&cublas_once, cublas_load);
    if (cublas.error[0])
        return rn_errorf(RN_EGPU, "%s (cuBLAS comes with the CUDA Toolkit; rn-gpuinfo shows which libraries load)",
                         cublas.error);
    return RN_OK;
}

static int ctx_open(cuda_ctx *g) {
    CU(cudaSetDevice(g->dev));
    CU(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&g->copied, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&g->consumed, cudaEventDisableTiming));
    DNN(cudnnCreate(&g->dnn));
    DNN(cudnnSetStream(g->dnn, g->stream));
    DNN(cudnnCreateTensorDescriptor(&g->bn_x));
    DNN(cudnnCreateTensorDescriptor(&g->bn_stat));
    DNN(cudnnCreateActivationDescriptor(&g->bn_relu));
    DNN(cudnnSetActivationDescriptor(g->bn_relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
    int rc = rn_backend_cuda_blas_open();
    if (rc != RN_OK) return rc;
    BLAS(cublas.create(&g->blas));
    BLAS(cublas.set_stream(g->blas, g->stream));
    /* a workspace of its own (after set_stream, which resets it to cuBLAS's pool): the same
       GEMM algorithms in and out of a graph capture, and no allocation inside one */
    CU(cudaMalloc(&g->blas_ws, RN_CUDA_BLAS_WS));
    BLAS(cublas.set_workspace(g->blas, g->blas_ws, RN_CUDA_BLAS_WS));
    BLAS(cublas.set_math(g->blas, g->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return RN_OK;
}

extern "C" int rn_backend_cuda_init(rn_backend *be, int index) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return no_gpu(index, e);
    if (count == 0) return no_gpu(index, cudaErrorNoDevice);
    /* many processes on this node, index its local rank: one GPU each. A process that
       sees one GPU has its own (bound by the launcher); fewer GPUs than processes is an
       error, not --device auto's fall-back to the CPU (the ranks would run different
       backends) */
    int lw = be->opts.cuda_local_world;
    if (lw > 1 && count == 1) index = 0;
    else if (lw > count)
        return rn_errorf(RN_EINVAL, "cuda: %d processes on this node and %d GPUs: one process per GPU (mpirun -np "
                         "%d per node), or give each process a GPU of its own (Slurm's --gpus-per-task, "
                         "CUDA_VISIBLE_DEVICES per process)", lw, count, count);
    if (index < 0 || index >= count)
        return rn_errorf(RN_EGPU, "cuda:%d: this machine has %d usable GPU%s (cuda:0 to cuda:%d; rn-gpuinfo lists "
                         "them)", index, count, count == 1 ? "" : "s", count - 1);
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, index);
    if (e != cudaSuccess) return no_gpu(index, e);

    cuda_ctx *g = (cuda_ctx *)calloc(1, sizeof *g);
    if (!g) return rn_errorf(RN_ENOMEM, "cuda:%d: out of host memory for the backend context", index);
    g->dev = index;
    g->sms = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    g->tf32 = be->opts.cuda_tf32;
    g->deterministic = be->opts.cuda_deterministic;
    g->bn_cudnn = be->opts.cuda_bn_cudnn;
    g->stem_plain = be->opts.cuda_stem_plain;
    g->inj_find = (cudnnStatus_t)be->opts.cuda_inject_find;
    g->inj_bn = (cudnnStatus_t)be->opts.cuda_inject_bn;
    g->inj_bn_bwd = (cudnnStatus_t)be->opts.cuda_inject_bn_bwd;
    g->heuristic = be->opts.cuda_conv_heuristic;
    g->ws_limit = be->opts.cuda_workspace;
    snprintf(g->devid, sizeof g->devid, "%s_sm%d%d", prop.name, prop.major, prop.minor);
    for (char *c = g->devid; *c; c++)
        if (*c == ' ' || *c == '\t') *c = '_';
    if (be->opts.cuda_algo_cache[0] && !g->heuristic && rn_algocache_open(be->opts.cuda_algo_cache, &g->algos) != RN_OK) {
        ctx_free(g);
        return rn_error_context(RN_ENOMEM, "cuda:%d: the algorithm cache", index);
    }
    rn_algocache_set_here(g->algos, g->devid, (int)cudnnGetVersion());
    int rc = ctx_open(g);
    if (rc != RN_OK) {
        ctx_free(g);
        return rn_error_context(rc, "cuda:%d (%s)", index, prop.name);
    }
    fill_ops(&g->ops);
    g->ops.ws_limit = g->ws_limit ? g->ws_limit : 1; /* 0 would mean "ask cuDNN" (rn_net_plan) */
    be->ops = &g->ops;
    be->impl = g;
    size_t cv = cudnnGetVersion();
    int bv = 0;
    cublas.version(g->blas, &bv);
    char name[1024];
    snprintf(name, sizeof name,
             "cuda:%d: %s (sm_%d%d, %.0f GiB), cuDNN %zu.%zu.%zu, cuBLAS %d.%d, conv workspace limit %ld MiB, "
             "TF32 %s%s%s%s%s%s", index, prop.name, prop.major, prop.minor, prop.totalGlobalMem / 1073741824.0,
             cv / 10000, cv % 10000 / 100, cv % 100, bv / 10000, bv % 10000 / 100, (long)(g->ws_limit >> 20), g->tf32 ? "on" : "off",
             g->deterministic ? ", deterministic" : "", g->heuristic ? ", heuristic algorithms" : "",
             g->bn_cudnn ? ", cuDNN BN" : "", g->stem_plain ? ", stem not padded" : "",
             g->inj_find || g->inj_bn || g->inj_bn_bwd ? ", cuDNN statuses injected (RN_CUDA_INJECT)" : "");
    if (g->algos) {
        size_t nl = strlen(name);
        snprintf(name + nl, sizeof name - nl, "; %s", rn_algocache_note(g->algos));
    }
    size_t len = strlen(name);
    if (len >= sizeof be->name) len = sizeof be->name - 1;
    memcpy(be->name, name, len);
    be->name[len] = 0;
    return RN_OK;
}
