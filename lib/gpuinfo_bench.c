/* gpuinfo_bench: --bench, copy bandwidth, cuBLAS GEMMs and a cuDNN convolution on one
 * device against its datasheet peaks, through its own dlsym binding of the CUDA runtime,
 * cuBLAS and cuDNN (rn/gpuinfo.h), so that rn-gpuinfo needs no GPU library to start. */
#include "rn/gpuinfo_impl.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rn/err.h"
#include "rn/rng.h"
#include "rn/tensor.h"

/* Values from cuda_runtime_api.h, cublas_api.h, library_types.h and cudnn_*.h that this
 * file uses. */
enum {
    RT_MEMCPY_H2D = 1,
    RT_MEMCPY_D2D = 3,
    DT_R_32F = 0,
    DT_R_16F = 2,
    DT_R_16BF = 14,
    BLAS_OP_N = 0,
    BLAS_COMPUTE_32F = 68,
    BLAS_COMPUTE_32F_FAST_TF32 = 77,
    BLAS_GEMM_DEFAULT = -1,
    DNN_DATA_FLOAT = 0,
    DNN_DATA_HALF = 2,
    DNN_TENSOR_NHWC = 1,
    DNN_CROSS_CORRELATION = 1,
    DNN_TENSOR_OP_MATH = 1,
};

typedef struct {
    int algo, status;
    float time;
    size_t memory;
    int determinism, math_type, reserved[3];
} dnn_fwd_perf;

#if defined(RN_HAVE_CUDA) && RN_HAVE_CUDA
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
_Static_assert((int)RT_MEMCPY_H2D == (int)cudaMemcpyHostToDevice &&
                   (int)RT_MEMCPY_D2D == (int)cudaMemcpyDeviceToDevice && (int)DT_R_32F == (int)CUDA_R_32F &&
                   (int)DT_R_16F == (int)CUDA_R_16F && (int)DT_R_16BF == (int)CUDA_R_16BF &&
                   (int)BLAS_OP_N == (int)CUBLAS_OP_N && (int)BLAS_COMPUTE_32F == (int)CUBLAS_COMPUTE_32F &&
                   (int)BLAS_COMPUTE_32F_FAST_TF32 == (int)CUBLAS_COMPUTE_32F_FAST_TF32 &&
                   (int)BLAS_GEMM_DEFAULT == (int)CUBLAS_GEMM_DEFAULT,
               "runtime and cuBLAS values");
_Static_assert((int)DNN_DATA_FLOAT == (int)CUDNN_DATA_FLOAT && (int)DNN_DATA_HALF == (int)CUDNN_DATA_HALF &&
                   (int)DNN_TENSOR_NHWC == (int)CUDNN_TENSOR_NHWC &&
                   (int)DNN_CROSS_CORRELATION == (int)CUDNN_CROSS_CORRELATION &&
                   (int)DNN_TENSOR_OP_MATH == (int)CUDNN_TENSOR_OP_MATH &&
                   sizeof(dnn_fwd_perf) == sizeof(cudnnConvolutionFwdAlgoPerf_t) &&
                   offsetof(dnn_fwd_perf, memory) == offsetof(cudnnConvolutionFwdAlgoPerf_t, memory),
               "cuDNN values");
#endif

/* Datasheet peaks, dense (no sparsity), TFLOP/s with fp32 accumulation, memory GB/s.
 * Matched against cuDeviceGetName in order, first hit wins. 0: the GPU lacks the mode. */
static const struct {
    const char *match, *match2, *label;
    double fp32, tf32, fp16, bf16, mem_gbs;
} datasheet[] = {
    {"GH200", "144G", "GH200 144GB HBM3e", 67, 494.5, 989.5, 989.5, 4900},
    {"GH200", NULL, "GH200 96GB HBM3", 67, 494.5, 989.5, 989.5, 4000},
    {"H200 NVL", NULL, "H200 NVL", 60, 417.5, 835.5, 835.5, 4800},
    {"H200", NULL, "H200 SXM", 67, 494.5, 989.5, 989.5, 4800},
    {"H100 NVL", NULL, "H100 NVL", 60, 417.5, 835.5, 835.5, 3900},
    {"H100", "PCIe", "H100 PCIe", 51, 378, 756, 756, 2000},
    {"H100", NULL, "H100 SXM5", 67, 494.5, 989.5, 989.5, 3350},
    {"A100", "SXM4-80GB", "A100 SXM4 80GB", 19.5, 156, 312, 312, 2039},
    {"A100", "80GB PCIe", "A100 PCIe 80GB", 19.5, 156, 312, 312, 1935},
    {"A100", NULL, "A100 40GB", 19.5, 156, 312, 312, 1555},
    {"L40S", NULL, "L40S", 91.6, 183, 362, 362, 864},
    {"A10", NULL, "A10", 31.2, 62.5, 125, 125, 600},
    {"L4", NULL, "L4", 30.3, 60, 121, 121, 300},
    {"T4", NULL, "T4", 8.1, 0, 65, 0, 320},
};

typedef struct {
    int (*set_device)(int);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*malloc_host)(void **, size_t);
    int (*free_host)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*sync)(void);
    int (*event_create)(void **);
    int (*event_record)(void *, void *);
    int (*event_sync)(void *);
    int (*event_elapsed)(float *, void *, void *);
    int (*event_destroy)(void *);
    const char *(*error_string)(int);
    int (*blas_create)(void **);
    int (*blas_destroy)(void *);
    int (*gemm)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int,
                const void *, void *, int, int, int, int);
    const char *(*blas_error)(int);
    int (*dnn_create)(void **);
    int (*dnn_destroy)(void *);
    const char *(*dnn_error)(int);
    int (*tensor_create)(void **), (*tensor_destroy)(void *);
    int (*tensor_set)(void *, int, int, int, int, int, int);
    int (*filter_create)(void **), (*filter_destroy)(void *);
    int (*filter_set)(void *, int, int, int, int, int, int);
    int (*conv_create)(void **), (*conv_destroy)(void *);
    int (*conv_set)(void *, int, int, int, int, int, int, int, int);
    int (*conv_math)(void *, int);
    int (*conv_find)(void *, void *, void *, void *, void *, int, int *, dnn_fwd_perf *);
    int (*conv_ws)(void *, void *, void *, void *, void *, int, size_t *);
    int (*conv_fwd)(void *, const void *, void *, const void *, void *, const void *, void *, int, void *, size_t,
                    const void *, void *, void *);
} gpu_api;

#define BLAS(call)                                                                                                     \
    do {                                                                                                               \
        int e_ = (call);                                                                                               \
        if (e_ != 0) {                                                                                                 \
            rc = rn_errorf(RN_EGPU, "%s:%d: %s: %s (status %d)", __FILE__, __LINE__, #call,                            \
                           api.blas_error ? api.blas_error(e_) : "cuBLAS error", e_);                                  \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)
#define DNN(call)                                                                                                      \
    do {                                                                                                               \
        int e_ = (call);                                                                                               \
        if (e_ != 0) {                                                                                                 \
            rc = rn_errorf(RN_EGPU, "%s:%d: %s: %s (status %d)", __FILE__, __LINE__, #call,                            \
                           api.dnn_error ? api.dnn_error(e_) : "cuDNN error", e_);                                     \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

static int load_gpu_api(const rn_gpuinfo *g, gpu_api *a) {
    memset(a, 0, sizeof *a);
    const rn_gpulib *rt = &g->lib[RN_GPULIB_CUDART], *bl = &g->lib[RN_GPULIB_CUBLAS], *dn = &g->lib[RN_GPULIB_CUDNN];
    if (!rt->loaded || !bl->loaded)
        return rn_errorf(RN_EGPU, "--bench needs the CUDA runtime and cuBLAS: %s", !rt->loaded ? rt->error : bl->error);
    int ok = rn_gpuinfo_sym(rt, "cudaSetDevice", &a->set_device) & rn_gpuinfo_sym(rt, "cudaMalloc", &a->malloc_) &
             rn_gpuinfo_sym(rt, "cudaFree", &a->free_) & rn_gpuinfo_sym(rt, "cudaMallocHost", &a->malloc_host) &
             rn_gpuinfo_sym(rt, "cudaFreeHost", &a->free_host) & rn_gpuinfo_sym(rt, "cudaMemcpy", &a->memcpy_) &
             rn_gpuinfo_sym(rt, "cudaDeviceSynchronize", &a->sync) &
             rn_gpuinfo_sym(rt, "cudaEventCreate", &a->event_create) &
             rn_gpuinfo_sym(rt, "cudaEventRecord", &a->event_record) &
             rn_gpuinfo_sym(rt, "cudaEventSynchronize", &a->event_sync) &
             rn_gpuinfo_sym(rt, "cudaEventElapsedTime", &a->event_elapsed) &
             rn_gpuinfo_sym(rt, "cudaEventDestroy", &a->event_destroy) &
             rn_gpuinfo_sym(rt, "cudaGetErrorString", &a->error_string);
    if (!ok)
        return rn_errorf(RN_EGPU, "%s lacks a function --bench needs (cudaMalloc, cudaMemcpy, cudaEvent*)", rt->path);
    ok = rn_gpuinfo_sym(bl, "cublasCreate_v2", &a->blas_create) &
         rn_gpuinfo_sym(bl, "cublasDestroy_v2", &a->blas_destroy) & rn_gpuinfo_sym(bl, "cublasGemmEx", &a->gemm);
    if (!ok) return rn_errorf(RN_EGPU, "%s lacks cublasCreate_v2, cublasDestroy_v2 or cublasGemmEx", bl->path);
    rn_gpuinfo_sym(bl, "cublasGetStatusString", &a->blas_error);
    if (dn->loaded) {
        ok = rn_gpuinfo_sym(dn, "cudnnCreate", &a->dnn_create) & rn_gpuinfo_sym(dn, "cudnnDestroy", &a->dnn_destroy) &
             rn_gpuinfo_sym(dn, "cudnnGetErrorString", &a->dnn_error) &
             rn_gpuinfo_sym(dn, "cudnnCreateTensorDescriptor", &a->tensor_create) &
             rn_gpuinfo_sym(dn, "cudnnDestroyTensorDescriptor", &a->tensor_destroy) &
             rn_gpuinfo_sym(dn, "cudnnSetTensor4dDescriptor", &a->tensor_set) &
             rn_gpuinfo_sym(dn, "cudnnCreateFilterDescriptor", &a->filter_create) &
             rn_gpuinfo_sym(dn, "cudnnDestroyFilterDescriptor", &a->filter_destroy) &
             rn_gpuinfo_sym(dn, "cudnnSetFilter4dDescriptor", &a->filter_set) &
             rn_gpuinfo_sym(dn, "cudnnCreateConvolutionDescriptor", &a->conv_create) &
             rn_gpuinfo_sym(dn, "cudnnDestroyConvolutionDescriptor", &a->conv_destroy) &
             rn_gpuinfo_sym(dn, "cudnnSetConvolution2dDescriptor", &a->conv_set) &
             rn_gpuinfo_sym(dn, "cudnnSetConvolutionMathType", &a->conv_math) &
             rn_gpuinfo_sym(dn, "cudnnFindConvolutionForwardAlgorithm", &a->conv_find) &
             rn_gpuinfo_sym(dn, "cudnnGetConvolutionForwardWorkspaceSize", &a->conv_ws) &
             rn_gpuinfo_sym(dn, "cudnnConvolutionForward", &a->conv_fwd);
        if (!ok) a->dnn_create = NULL;
    }
    return RN_OK;
}

static void add_result(rn_gpubench *b, const char *test, const char *unit, double value, double peak,
                       const char *what) {
    if (b->n >= RN_GPUBENCH_MAX) return;
    rn_gpubench_result *r = &b->r[b->n++];
    memset(r, 0, sizeof *r);
    r->test = test;
    r->unit = unit;
    r->value = value;
    r->peak = peak > 0 ? peak : -1;
    snprintf(r->what, sizeof r->what, "%s", what);
}

static void add_skipped(rn_gpubench *b, const char *test, const char *unit, const char *why) {
    add_result(b, test, unit, -1, -1, "");
    snprintf(b->r[b->n - 1].skipped, sizeof b->r[0].skipped, "%s", why);
}

/* PCIe payload bandwidth per lane in GB/s, by generation (after line encoding). */
static double pcie_lane_gbs(int gen) {
    static const double lane[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563};
    return gen > 0 && gen < (int)(sizeof lane / sizeof *lane) ? lane[gen] : -1;
}

/* The datasheet row for a device name, -1 when none. "A10" must not catch "A100" nor "L4"
 * "L40S": those rows come first, and a bare match must end the name or be followed by a
 * space or a dash. */
static int find_peak(const char *name) {
    for (size_t i = 0; i < sizeof datasheet / sizeof *datasheet; i++) {
        const char *p = strstr(name, datasheet[i].match);
        if (!p || (datasheet[i].match2 && !strstr(name, datasheet[i].match2))) continue;
        p += strlen(datasheet[i].match);
        if (!datasheet[i].match2 && *p && *p != ' ' && *p != '-') return -1;
        return (int)i;
    }
    return -1;
}

const char *rn_gpuinfo_datasheet(const char *name) {
    int i = find_peak(name);
    return i < 0 ? NULL : datasheet[i].label;
}

int rn_gpuinfo_bench(const rn_gpuinfo *g, int di, rn_gpubench *out) {
    memset(out, 0, sizeof *out);
    if (!g->built_with_cuda)
        return rn_errorf(RN_ENOTSUP,
                         "this rn build has no GPU support: rebuild with CUDA, make USE_CUDA=1, to run --bench");
    if (di < 0 || di >= g->ndev)
        return rn_errorf(RN_EGPU, "--bench: no CUDA device %d (%d device%s visible)", di, g->ndev,
                         g->ndev == 1 ? "" : "s");
    const rn_gpudev *d = &g->dev[di];
    out->index = d->index;
    snprintf(out->name, sizeof out->name, "%s", d->name);
    int peak = find_peak(d->name);
    out->peak_source = peak >= 0 ? datasheet[peak].label : NULL;
    double mem_peak = peak >= 0 ? datasheet[peak].mem_gbs
                      : d->mem_clock_khz > 0 && d->bus_width_bits > 0
                          ? 2.0 * d->mem_clock_khz * 1e3 * d->bus_width_bits / 8 / 1e9
                          : -1;
    double h2d_peak =
        d->pcie_gen_max > 0 && d->pcie_width_max > 0 ? pcie_lane_gbs(d->pcie_gen_max) * d->pcie_width_max : -1;

    gpu_api api;
    int rc = load_gpu_api(g, &api);
    if (rc) return rc;
    /* 8192^3 GEMMs take 10-20 ms on an H100 in fp32: long enough to time, short enough to repeat */
    int n = d->mem_total < 0 || d->mem_total >= (16LL << 30) ? 8192 : 4096;
    size_t bytes = (size_t)n * n * 4;
    void *host = NULL, *a = NULL, *b = NULL, *c = NULL, *ev0 = NULL, *ev1 = NULL, *blas = NULL;
    void *dnn = NULL, *xd = NULL, *yd = NULL, *wd = NULL, *cd = NULL, *ws = NULL;
    float ms;
    char what[96];

    RN_GPUINFO_RT(api.set_device(d->index));
    RN_GPUINFO_RT(api.malloc_host(&host, bytes));
    RN_GPUINFO_RT(api.malloc_(&a, bytes));
    RN_GPUINFO_RT(api.malloc_(&b, bytes));
    RN_GPUINFO_RT(api.malloc_(&c, bytes));
    RN_GPUINFO_RT(api.event_create(&ev0));
    RN_GPUINFO_RT(api.event_create(&ev1));
    /* seeded random data, never zeros: power, hence clocks, depend on the bits */
    rn_rng_uniform(rn_rng_key(20260131, 7), host, (int64_t)n * n, -1.0f, 1.0f);

    RN_GPUINFO_RT(api.memcpy_(a, host, bytes, RT_MEMCPY_H2D));
    RN_GPUINFO_RT(api.event_record(ev0, NULL));
    for (int i = 0; i < 5; i++)
        RN_GPUINFO_RT(api.memcpy_(a, host, bytes, RT_MEMCPY_H2D));
    RN_GPUINFO_RT(api.event_record(ev1, NULL));
    RN_GPUINFO_RT(api.event_sync(ev1));
    RN_GPUINFO_RT(api.event_elapsed(&ms, ev0, ev1));
    snprintf(what, sizeof what, "%zu MiB pinned", bytes >> 20);
    add_result(out, "h2d", "GB/s", 5.0 * bytes / (ms * 1e-3) / 1e9, h2d_peak, what);

    RN_GPUINFO_RT(api.memcpy_(b, a, bytes, RT_MEMCPY_D2D));
    RN_GPUINFO_RT(api.event_record(ev0, NULL));
    for (int i = 0; i < 20; i++)
        RN_GPUINFO_RT(api.memcpy_(b, a, bytes, RT_MEMCPY_D2D));
    RN_GPUINFO_RT(api.event_record(ev1, NULL));
    RN_GPUINFO_RT(api.event_sync(ev1));
    RN_GPUINFO_RT(api.event_elapsed(&ms, ev0, ev1));
    snprintf(what, sizeof what, "%zu MiB, read+write", bytes >> 20);
    add_result(out, "d2d", "GB/s", 20.0 * 2 * bytes / (ms * 1e-3) / 1e9, mem_peak, what);

    BLAS(api.blas_create(&blas));
    static const struct {
        const char *test;
        int dtype, compute, size;
    } gemms[] = {
        {"gemm_fp32", DT_R_32F, BLAS_COMPUTE_32F, 4},
        {"gemm_tf32", DT_R_32F, BLAS_COMPUTE_32F_FAST_TF32, 4},
        {"gemm_fp16", DT_R_16F, BLAS_COMPUTE_32F, 2},
        {"gemm_bf16", DT_R_16BF, BLAS_COMPUTE_32F, 2},
    };
    const float one = 1.0f, zero = 0.0f;
    for (size_t k = 0; k < sizeof gemms / sizeof *gemms; k++) {
        double pk = peak < 0 ? -1
                    : k == 0 ? datasheet[peak].fp32
                    : k == 1 ? datasheet[peak].tf32
                    : k == 2 ? datasheet[peak].fp16
                             : datasheet[peak].bf16;
        if (peak >= 0 && pk == 0) {
            add_skipped(out, gemms[k].test, "TFLOP/s", "this GPU has no tensor cores for this type");
            continue;
        }
        if (gemms[k].size == 2) {
            /* narrow the host data in place into the first half of the buffer, then upload */
            uint16_t *h16 = host;
            float *h32 = host;
            rn_rng_uniform(rn_rng_key(20260131, 7), h32, (int64_t)n * n, -1.0f, 1.0f);
            for (int64_t i = 0; i < (int64_t)n * n; i++)
                h16[i] = gemms[k].dtype == DT_R_16F ? rn_f32_to_f16(h32[i]) : rn_f32_to_bf16(h32[i]);
            RN_GPUINFO_RT(api.memcpy_(a, host, (size_t)n * n * 2, RT_MEMCPY_H2D));
            RN_GPUINFO_RT(api.memcpy_(b, host, (size_t)n * n * 2, RT_MEMCPY_H2D));
        } else {
            rn_rng_uniform(rn_rng_key(20260131, 7), host, (int64_t)n * n, -1.0f, 1.0f);
            RN_GPUINFO_RT(api.memcpy_(a, host, bytes, RT_MEMCPY_H2D));
            RN_GPUINFO_RT(api.memcpy_(b, host, bytes, RT_MEMCPY_H2D));
        }
#define GEMM()                                                                                                         \
    BLAS(api.gemm(blas, BLAS_OP_N, BLAS_OP_N, n, n, n, &one, a, gemms[k].dtype, n, b, gemms[k].dtype, n, &zero, c,     \
                  gemms[k].dtype, n, gemms[k].compute, BLAS_GEMM_DEFAULT))
        GEMM();
        RN_GPUINFO_RT(api.event_record(ev0, NULL));
        GEMM();
        RN_GPUINFO_RT(api.event_record(ev1, NULL));
        RN_GPUINFO_RT(api.event_sync(ev1));
        RN_GPUINFO_RT(api.event_elapsed(&ms, ev0, ev1));
        int iters = ms > 0 ? (int)(300.0 / ms) : 50; /* about 0.3 s of work */
        iters = iters < 3 ? 3 : iters > 200 ? 200 : iters;
        RN_GPUINFO_RT(api.event_record(ev0, NULL));
        for (int i = 0; i < iters; i++)
            GEMM();
        RN_GPUINFO_RT(api.event_record(ev1, NULL));
        RN_GPUINFO_RT(api.event_sync(ev1));
        RN_GPUINFO_RT(api.event_elapsed(&ms, ev0, ev1));
#undef GEMM
        snprintf(what, sizeof what, "%dx%dx%d", n, n, n);
        add_result(out, gemms[k].test, "TFLOP/s", 2.0 * n * n * (double)n * iters / (ms * 1e-3) / 1e12, pk, what);
    }

    /* ResNet-50 layer2 3x3 conv at batch 256, fp16 NHWC with fp32 accumulation: what training runs */
    if (!api.dnn_create) {
        add_skipped(out, "conv_fp16", "TFLOP/s", "cuDNN is not loaded or lacks the legacy convolution API");
    } else {
        const int N = 256, C = 128, K = 128, H = 28, W = 28, R = 3, S = 3;
        size_t xbytes = (size_t)N * C * H * W * 2;
        if (xbytes > bytes || (size_t)K * C * R * S * 2 > bytes) {
            add_skipped(out, "conv_fp16", "TFLOP/s", "buffers too small on this device");
        } else {
            dnn_fwd_perf perf[8];
            int nperf = 0;
            size_t wsize = 0;
            DNN(api.dnn_create(&dnn));
            DNN(api.tensor_create(&xd));
            DNN(api.tensor_create(&yd));
            DNN(api.filter_create(&wd));
            DNN(api.conv_create(&cd));
            DNN(api.tensor_set(xd, DNN_TENSOR_NHWC, DNN_DATA_HALF, N, C, H, W));
            DNN(api.tensor_set(yd, DNN_TENSOR_NHWC, DNN_DATA_HALF, N, K, H, W));
            DNN(api.filter_set(wd, DNN_DATA_HALF, DNN_TENSOR_NHWC, K, C, R, S));
            DNN(api.conv_set(cd, 1, 1, 1, 1, 1, 1, DNN_CROSS_CORRELATION, DNN_DATA_FLOAT));
            DNN(api.conv_math(cd, DNN_TENSOR_OP_MATH));
            /* x in a (already random fp16/bf16 bits from the GEMMs: re-upload fp16), w in b, y in c */
            uint16_t *h16 = host;
            float *h32 = host;
            rn_rng_uniform(rn_rng_key(20260131, 8), h32, (int64_t)(xbytes / 2), -1.0f, 1.0f);
            for (size_t i = 0; i < xbytes / 2; i++)
                h16[i] = rn_f32_to_f16(h32[i]);
            RN_GPUINFO_RT(api.memcpy_(a, host, xbytes, RT_MEMCPY_H2D));
            RN_GPUINFO_RT(api.memcpy_(b, host, (size_t)K * C * R * S * 2, RT_MEMCPY_H2D));
            DNN(api.conv_find(dnn, xd, wd, cd, yd, 8, &nperf, perf));
            int best = -1;
            for (int i = 0; i < nperf && best < 0; i++)
                if (perf[i].status == 0) best = i;
            if (best < 0) {
                rc = rn_errorf(RN_EGPU, "cudnnFindConvolutionForwardAlgorithm: no algorithm works for %dx%dx%dx%d", N,
                               C, H, W);
                goto fail;
            }
            DNN(api.conv_ws(dnn, xd, wd, cd, yd, perf[best].algo, &wsize));
            if (wsize) RN_GPUINFO_RT(api.malloc_(&ws, wsize));
#define CONV() DNN(api.conv_fwd(dnn, &one, xd, a, wd, b, cd, perf[best].algo, ws, wsize, &zero, yd, c))
            CONV();
            RN_GPUINFO_RT(api.event_record(ev0, NULL));
            for (int i = 0; i < 20; i++)
                CONV();
            RN_GPUINFO_RT(api.event_record(ev1, NULL));
            RN_GPUINFO_RT(api.event_sync(ev1));
            RN_GPUINFO_RT(api.event_elapsed(&ms, ev0, ev1));
#undef CONV
            snprintf(what, sizeof what, "N%d C%d K%d %dx%d 3x3 NHWC algo %d", N, C, K, H, W, perf[best].algo);
            add_result(out, "conv_fp16", "TFLOP/s", 2.0 * N * K * C * R * S * H * W * 20.0 / (ms * 1e-3) / 1e12,
                       peak >= 0 ? datasheet[peak].fp16 : -1, what);
        }
    }
    RN_GPUINFO_RT(api.sync());

fail:
    if (ws) api.free_(ws);
    if (cd) api.conv_destroy(cd);
    if (wd) api.filter_destroy(wd);
    if (yd) api.tensor_destroy(yd);
    if (xd) api.tensor_destroy(xd);
    if (dnn) api.dnn_destroy(dnn);
    if (blas) api.blas_destroy(blas);
    if (ev1) api.event_destroy(ev1);
    if (ev0) api.event_destroy(ev0);
    if (c) api.free_(c);
    if (b) api.free_(b);
    if (a) api.free_(a);
    if (host) api.free_host(host);
    if (rc) return rn_error_context(rc, "--bench on device %d (%s)", d->index, d->name);
    return RN_OK;
}
