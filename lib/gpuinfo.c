/* gpuinfo: the NVIDIA stack as loaded at run time (see rn/gpuinfo.h).
 *
 * Every NVIDIA library is opened with dlopen and called through pointers typed here, so
 * this file compiles and runs identically with and without the CUDA toolkit; in a CUDA
 * build the enum values and struct layouts copied below are checked against the real
 * headers at compile time. */
#include "rn/gpuinfo.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rn/err.h"
#include "rn/json.h"
#include "rn/rng.h"

/* Values from cuda.h, nvml.h, cuda_runtime_api.h, cublas_api.h, library_types.h and
 * cudnn_*.h that this file uses. */
enum {
    CU_OK = 0,
    CU_NOT_INITIALIZED = 3,
    CU_DEINITIALIZED = 4,
    CU_STUB_LIBRARY = 34,
    CU_DEVICE_UNAVAILABLE = 46,
    CU_NO_DEVICE = 100,
    CU_SYSTEM_DRIVER_MISMATCH = 803,
    CU_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
    CU_ATTR_CLOCK_RATE = 13,
    CU_ATTR_MULTIPROCESSOR_COUNT = 16,
    CU_ATTR_COMPUTE_MODE = 20,
    CU_ATTR_MEMORY_CLOCK_RATE = 36,
    CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37,
    CU_ATTR_CC_MAJOR = 75,
    CU_ATTR_CC_MINOR = 76,
    NVML_OK = 0,
    NVML_CLOCK_SM = 1,
    NVML_CLOCK_MEM = 2,
    NVML_TEMPERATURE_GPU = 0,
    NVML_ECC_CORRECTED = 0,
    NVML_ECC_UNCORRECTED = 1,
    NVML_ECC_VOLATILE = 0,
    NVML_ECC_AGGREGATE = 1,
    RT_MEMCPY_H2D = 1,
    RT_MEMCPY_D2D = 3,
    DT_R_32F = 0,
    DT_R_16F = 2,
    DT_R_16BF = 14,
    BLAS_OP_N = 0,
    BLAS_COMPUTE_32F = 68,
    BLAS_COMPUTE_32F_FAST_TF32 = 77,
    BLAS_GEMM_DEFAULT = -1,
    BLAS_PROP_MAJOR = 0,
    BLAS_PROP_MINOR = 1,
    BLAS_PROP_PATCH = 2,
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

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct {
    unsigned int gpu, memory;
} nvml_util;

#if defined(RN_HAVE_CUDA) && RN_HAVE_CUDA
#include <cublas_api.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
#endif
#endif
_Static_assert((int)CU_NO_DEVICE == (int)CUDA_ERROR_NO_DEVICE && (int)CU_STUB_LIBRARY == (int)CUDA_ERROR_STUB_LIBRARY &&
                   (int)CU_SYSTEM_DRIVER_MISMATCH == (int)CUDA_ERROR_SYSTEM_DRIVER_MISMATCH &&
                   (int)CU_COMPAT_NOT_SUPPORTED_ON_DEVICE == (int)CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE &&
                   (int)CU_NOT_INITIALIZED == (int)CUDA_ERROR_NOT_INITIALIZED &&
                   (int)CU_DEINITIALIZED == (int)CUDA_ERROR_DEINITIALIZED &&
                   (int)CU_DEVICE_UNAVAILABLE == (int)CUDA_ERROR_DEVICE_UNAVAILABLE,
               "CUresult values");
_Static_assert((int)CU_ATTR_CLOCK_RATE == (int)CU_DEVICE_ATTRIBUTE_CLOCK_RATE &&
                   (int)CU_ATTR_MULTIPROCESSOR_COUNT == (int)CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT &&
                   (int)CU_ATTR_COMPUTE_MODE == (int)CU_DEVICE_ATTRIBUTE_COMPUTE_MODE &&
                   (int)CU_ATTR_MEMORY_CLOCK_RATE == (int)CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE &&
                   (int)CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH == (int)CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH &&
                   (int)CU_ATTR_CC_MAJOR == (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR &&
                   (int)CU_ATTR_CC_MINOR == (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
               "CUdevice_attribute values");
_Static_assert((int)RT_MEMCPY_H2D == (int)cudaMemcpyHostToDevice &&
                   (int)RT_MEMCPY_D2D == (int)cudaMemcpyDeviceToDevice && (int)DT_R_32F == (int)CUDA_R_32F &&
                   (int)DT_R_16F == (int)CUDA_R_16F && (int)DT_R_16BF == (int)CUDA_R_16BF &&
                   (int)BLAS_OP_N == (int)CUBLAS_OP_N && (int)BLAS_COMPUTE_32F == (int)CUBLAS_COMPUTE_32F &&
                   (int)BLAS_COMPUTE_32F_FAST_TF32 == (int)CUBLAS_COMPUTE_32F_FAST_TF32 &&
                   (int)BLAS_GEMM_DEFAULT == (int)CUBLAS_GEMM_DEFAULT && (int)BLAS_PROP_MAJOR == (int)MAJOR_VERSION &&
                   (int)BLAS_PROP_MINOR == (int)MINOR_VERSION && (int)BLAS_PROP_PATCH == (int)PATCH_LEVEL,
               "runtime and cuBLAS values");
_Static_assert((int)DNN_DATA_FLOAT == (int)CUDNN_DATA_FLOAT && (int)DNN_DATA_HALF == (int)CUDNN_DATA_HALF &&
                   (int)DNN_TENSOR_NHWC == (int)CUDNN_TENSOR_NHWC &&
                   (int)DNN_CROSS_CORRELATION == (int)CUDNN_CROSS_CORRELATION &&
                   (int)DNN_TENSOR_OP_MATH == (int)CUDNN_TENSOR_OP_MATH &&
                   sizeof(dnn_fwd_perf) == sizeof(cudnnConvolutionFwdAlgoPerf_t) &&
                   offsetof(dnn_fwd_perf, memory) == offsetof(cudnnConvolutionFwdAlgoPerf_t, memory),
               "cuDNN values");
#define BUILT_WITH_CUDA 1
#define BUILT_CUDART CUDART_VERSION
#define BUILT_CUBLAS (CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH)
#define BUILT_CUDNN (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)
#ifdef NCCL_VERSION_CODE
#define BUILT_NCCL NCCL_VERSION_CODE
#else
#define BUILT_NCCL 0
#endif
#else
#define BUILT_WITH_CUDA 0
#define BUILT_CUDART 0
#define BUILT_CUBLAS 0
#define BUILT_CUDNN 0
#define BUILT_NCCL 0
#endif

#ifndef RN_VERSION
#define RN_VERSION "unknown"
#endif

/* Minimum Linux driver for each CUDA major (CUDA release notes, table 3). */
static const struct {
    int major;
    const char *driver;
} min_driver[] = {{11, "450.80.02"}, {12, "525.60.13"}, {13, "580.65.06"}};

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

static const char *const throttle_names[] = {
    "gpu_idle",     "applications_clocks", "sw_power_cap",        "hw_slowdown",
    "sync_boost",   "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
    "display_clock"};

static const char *const status_names[] = {
    "usable", "?", "?", "no_driver", "driver_too_old", "no_device", "cudnn", "no_build_gpu", "cuda_libs"};

const char *rn_gpuinfo_status_name(int code) {
    if (code < 0 || code >= (int)(sizeof status_names / sizeof *status_names) || status_names[code][0] == '?')
        return "unknown";
    return status_names[code];
}

int rn_gpuinfo_status(const rn_gpuinfo *g) { return g->nproblems ? g->problem[0].code : RN_GPUINFO_USABLE; }

/* dlsym into a typed function pointer (POSIX guarantees the two are interchangeable). */
static int sym(const rn_gpulib *l, const char *name, void *fnp) {
    void *p = l->handle ? dlsym(l->handle, name) : NULL;
    memcpy(fnp, &p, sizeof p);
    return p != NULL;
}

static void add_problem(rn_gpuinfo *g, int code, const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add_problem(rn_gpuinfo *g, int code, const char *fix, const char *fmt, ...) {
    if (g->nproblems >= RN_GPUINFO_MAX_PROBLEMS) return;
    rn_gpuproblem *p = &g->problem[g->nproblems++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    va_end(ap);
    p->code = code;
    snprintf(p->fix, sizeof p->fix, "%s", fix ? fix : "");
}

static void add_note(rn_gpuinfo *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(rn_gpuinfo *g, const char *fmt, ...) {
    if (g->nnotes >= RN_GPUINFO_MAX_NOTES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->note[g->nnotes++], sizeof g->note[0], fmt, ap);
    va_end(ap);
}

/* 13000 -> "13.0" (CUDA's encoding: 1000 * major + 10 * minor). */
static void cuda_ver(char *buf, size_t cap, int v) {
    if (v > 0)
        snprintf(buf, cap, "%d.%d", v / 1000, v % 1000 / 10);
    else if (cap)
        buf[0] = 0;
}

/* cuDNN 9 encodes 10000 * major + 100 * minor + patch, cuDNN 8 1000 * major + 100 * minor + patch. */
static int cudnn_major(int v) { return v >= 90000 ? v / 10000 : v / 1000; }
static void cudnn_ver(char *buf, size_t cap, int v) {
    if (v >= 90000)
        snprintf(buf, cap, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
    else if (v > 0)
        snprintf(buf, cap, "%d.%d.%d", v / 1000, v % 1000 / 100, v % 100);
    else if (cap)
        buf[0] = 0;
}

/* NCCL >= 2.9 encodes 10000 * major + 100 * minor + patch, older 1000 * major + 100 * minor + patch. */
static void nccl_ver(char *buf, size_t cap, int v) {
    if (v >= 20900)
        snprintf(buf, cap, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
    else if (v > 0)
        snprintf(buf, cap, "%d.%d.%d", v / 1000, v % 1000 / 100, v % 100);
    else if (cap)
        buf[0] = 0;
}

static void xyz_ver(char *buf, size_t cap, int v) {
    if (v > 0)
        snprintf(buf, cap, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
    else if (cap)
        buf[0] = 0;
}

/* for a libcuda whose cuGetErrorName does not answer (the toolkit's stub) */
static const char *cu_error_name(int e) {
    switch (e) {
    case CU_OK: return "CUDA_SUCCESS";
    case CU_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CU_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CU_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
    case CU_DEVICE_UNAVAILABLE: return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case CU_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CU_SYSTEM_DRIVER_MISMATCH: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CU_COMPAT_NOT_SUPPORTED_ON_DEVICE: return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    default: return "CUDA_ERROR_UNKNOWN_CODE";
    }
}

static const char *min_driver_for(int cuda) {
    for (size_t i = 0; i < sizeof min_driver / sizeof *min_driver; i++)
        if (min_driver[i].major == cuda / 1000) return min_driver[i].driver;
    return "the one its release notes name";
}

/* dlopen the first candidate that loads; remember where the loader found it. */
static void open_lib(rn_gpulib *l, const char *key, const char *title, const char *const *cands, int n) {
    l->key = key;
    l->title = title;
    snprintf(l->soname, sizeof l->soname, "%s", cands[0]);
    for (int i = 0; i < n; i++) {
        if (!cands[i]) continue;
        void *h = dlopen(cands[i], RTLD_LAZY | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            if (!l->error[0]) snprintf(l->error, sizeof l->error, "%s", e ? e : "dlopen failed");
            continue;
        }
        l->handle = h;
        l->loaded = 1;
        snprintf(l->soname, sizeof l->soname, "%s", cands[i]);
        l->error[0] = 0;
        struct link_map *lm = NULL;
        if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
            snprintf(l->path, sizeof l->path, "%s", lm->l_name);
        else
            snprintf(l->path, sizeof l->path, "%s", cands[i]);
        char rp[PATH_MAX];
        if (realpath(l->path, rp)) snprintf(l->realpath, sizeof l->realpath, "%.511s", rp);
        return;
    }
}

/* "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..." -> 580.65.06 */
static int read_kernel_module(char *ver, size_t cap) {
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (!f) return 0;
    char line[512];
    if (fgets(line, sizeof line, f)) {
        char *m = strstr(line, "Module");
        if (m) {
            m += strlen("Module");
            while (*m == ' ')
                m++;
            size_t n = strspn(m, "0123456789.");
            if (n && !ver[0]) snprintf(ver, cap, "%.*s", (int)n, m);
        }
    }
    fclose(f);
    return 1;
}

typedef struct {
    int (*init)(void);
    int (*shutdown)(void);
    const char *(*error_string)(int);
    int (*by_bus)(const char *, void **);
    int (*by_uuid)(const char *, void **);
    int (*mem)(void *, nvml_memory *);
    int (*clock)(void *, int, unsigned *);
    int (*max_clock)(void *, int, unsigned *);
    int (*temp)(void *, int, unsigned *);
    int (*power)(void *, unsigned *);
    int (*power_limit)(void *, unsigned *);
    int (*util)(void *, nvml_util *);
    int (*ecc_mode)(void *, int *, int *);
    int (*ecc_errors)(void *, int, int, unsigned long long *);
    int (*reasons)(void *, unsigned long long *);
    int (*pcie_gen)(void *, unsigned *), (*pcie_width)(void *, unsigned *);
    int (*pcie_gen_max)(void *, unsigned *), (*pcie_width_max)(void *, unsigned *);
} nvml_api;

static void nvml_load(const rn_gpulib *l, nvml_api *n) {
    memset(n, 0, sizeof *n);
    if (!sym(l, "nvmlInit_v2", &n->init)) sym(l, "nvmlInit", &n->init);
    sym(l, "nvmlShutdown", &n->shutdown);
    sym(l, "nvmlErrorString", &n->error_string);
    sym(l, "nvmlDeviceGetHandleByPciBusId_v2", &n->by_bus);
    sym(l, "nvmlDeviceGetHandleByUUID", &n->by_uuid);
    sym(l, "nvmlDeviceGetMemoryInfo", &n->mem);
    sym(l, "nvmlDeviceGetClockInfo", &n->clock);
    sym(l, "nvmlDeviceGetMaxClockInfo", &n->max_clock);
    sym(l, "nvmlDeviceGetTemperature", &n->temp);
    sym(l, "nvmlDeviceGetPowerUsage", &n->power);
    sym(l, "nvmlDeviceGetEnforcedPowerLimit", &n->power_limit);
    sym(l, "nvmlDeviceGetUtilizationRates", &n->util);
    sym(l, "nvmlDeviceGetEccMode", &n->ecc_mode);
    sym(l, "nvmlDeviceGetTotalEccErrors", &n->ecc_errors);
    /* renamed in NVML 12.2; the old name stays exported for older drivers */
    if (!sym(l, "nvmlDeviceGetCurrentClocksEventReasons", &n->reasons))
        sym(l, "nvmlDeviceGetCurrentClocksThrottleReasons", &n->reasons);
    sym(l, "nvmlDeviceGetCurrPcieLinkGeneration", &n->pcie_gen);
    sym(l, "nvmlDeviceGetCurrPcieLinkWidth", &n->pcie_width);
    sym(l, "nvmlDeviceGetMaxPcieLinkGeneration", &n->pcie_gen_max);
    sym(l, "nvmlDeviceGetMaxPcieLinkWidth", &n->pcie_width_max);
}

static int u_or(int (*fn)(void *, unsigned *), void *h) {
    unsigned v;
    return fn && fn(h, &v) == NVML_OK ? (int)v : -1;
}

static void clear_live(rn_gpudev *d) {
    d->mem_free = d->mem_used = -1;
    d->sm_mhz = d->mem_mhz = d->sm_max_mhz = d->mem_max_mhz = d->temperature_c = -1;
    d->power_w = d->power_limit_w = -1;
    d->util_gpu = d->util_mem = d->ecc_enabled = -1;
    d->ecc_vol_corr = d->ecc_vol_uncorr = d->ecc_agg_corr = d->ecc_agg_uncorr = d->throttle = -1;
    d->pcie_gen = d->pcie_width = d->pcie_gen_max = d->pcie_width_max = -1;
}

static void read_live(const nvml_api *n, rn_gpudev *d) {
    void *h = d->nvml;
    clear_live(d);
    if (!h) return;
    nvml_memory m;
    if (n->mem && n->mem(h, &m) == NVML_OK) {
        d->mem_total = (long long)m.total;
        d->mem_free = (long long)m.free;
        d->mem_used = (long long)m.used;
    }
    unsigned v;
    if (n->clock && n->clock(h, NVML_CLOCK_SM, &v) == NVML_OK) d->sm_mhz = (int)v;
    if (n->clock && n->clock(h, NVML_CLOCK_MEM, &v) == NVML_OK) d->mem_mhz = (int)v;
    if (n->max_clock && n->max_clock(h, NVML_CLOCK_SM, &v) == NVML_OK) d->sm_max_mhz = (int)v;
    if (n->max_clock && n->max_clock(h, NVML_CLOCK_MEM, &v) == NVML_OK) d->mem_max_mhz = (int)v;
    if (n->temp && n->temp(h, NVML_TEMPERATURE_GPU, &v) == NVML_OK) d->temperature_c = (int)v;
    if (n->power && n->power(h, &v) == NVML_OK) d->power_w = v / 1000.0;
    if (n->power_limit && n->power_limit(h, &v) == NVML_OK) d->power_limit_w = v / 1000.0;
    nvml_util u;
    if (n->util && n->util(h, &u) == NVML_OK) {
        d->util_gpu = (int)u.gpu;
        d->util_mem = (int)u.memory;
    }
    int cur, pend;
    if (n->ecc_mode && n->ecc_mode(h, &cur, &pend) == NVML_OK) d->ecc_enabled = cur != 0;
    if (d->ecc_enabled == 1 && n->ecc_errors) {
        unsigned long long c;
        if (n->ecc_errors(h, NVML_ECC_CORRECTED, NVML_ECC_VOLATILE, &c) == NVML_OK) d->ecc_vol_corr = (long long)c;
        if (n->ecc_errors(h, NVML_ECC_UNCORRECTED, NVML_ECC_VOLATILE, &c) == NVML_OK) d->ecc_vol_uncorr = (long long)c;
        if (n->ecc_errors(h, NVML_ECC_CORRECTED, NVML_ECC_AGGREGATE, &c) == NVML_OK) d->ecc_agg_corr = (long long)c;
        if (n->ecc_errors(h, NVML_ECC_UNCORRECTED, NVML_ECC_AGGREGATE, &c) == NVML_OK) d->ecc_agg_uncorr = (long long)c;
    }
    unsigned long long r;
    if (n->reasons && n->reasons(h, &r) == NVML_OK) d->throttle = (long long)r;
    d->pcie_gen = u_or(n->pcie_gen, h);
    d->pcie_width = u_or(n->pcie_width, h);
    d->pcie_gen_max = u_or(n->pcie_gen_max, h);
    d->pcie_width_max = u_or(n->pcie_width_max, h);
}

/* Can a binary built for RN_CUDA_ARCH ("80 90": cubins for each, PTX for the last) run
 * on compute capability cc (major*10+minor)? Unknown arch list: assume yes. */
static int arch_runs(int cc) {
#ifdef RN_CUDA_ARCH
    const char *s = RN_CUDA_ARCH;
    int last = 0;
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10);
        if (end == s) {
            s++;
            continue;
        }
        if (a / 10 == cc / 10 && a % 10 <= cc % 10) return 1;
        last = (int)a;
        s = end;
    }
    return last && last <= cc;
#else
    (void)cc;
    return 1;
#endif
}

static void probe_devices(rn_gpuinfo *g) {
    const rn_gpulib *l = &g->lib[RN_GPULIB_CUDA];
    int (*get_count)(int *) = NULL, (*get)(int *, int) = NULL, (*get_name)(char *, int, int) = NULL;
    int (*attr)(int *, int, int) = NULL, (*total_mem)(size_t *, int) = NULL, (*bus)(char *, int, int) = NULL;
    int (*uuid)(unsigned char *, int) = NULL, (*peer)(int *, int, int) = NULL;
    if (!sym(l, "cuDeviceGetCount", &get_count) || !sym(l, "cuDeviceGet", &get) ||
        !sym(l, "cuDeviceGetName", &get_name) || !sym(l, "cuDeviceGetAttribute", &attr)) {
        add_note(g,
                 "%s lacks the device functions (cuDeviceGetCount, cuDeviceGet, cuDeviceGetName, "
                 "cuDeviceGetAttribute): devices not listed",
                 l->path);
        return;
    }
    if (!sym(l, "cuDeviceTotalMem_v2", &total_mem)) sym(l, "cuDeviceTotalMem", &total_mem);
    sym(l, "cuDeviceGetPCIBusId", &bus);
    if (!sym(l, "cuDeviceGetUuid_v2", &uuid)) sym(l, "cuDeviceGetUuid", &uuid);
    sym(l, "cuDeviceCanAccessPeer", &peer);
    int n = 0;
    if (get_count(&n) != CU_OK || n <= 0) return;
    g->dev = rn_calloc((size_t)n, sizeof *g->dev);
    g->p2p = rn_calloc((size_t)n * (size_t)n, 1);
    if (!g->dev || !g->p2p) return;
    g->ndev = n;
    int cu[64];
    for (int i = 0; i < n; i++) {
        rn_gpudev *d = &g->dev[i];
        if (i < 64) cu[i] = i;
        clear_live(d);
        d->index = i;
        d->usable = 1;
        d->mem_total = -1;
        d->cc_major = d->cc_minor = d->sms = d->compute_mode = d->mem_clock_khz = d->bus_width_bits = -1;
        int dev = i;
        if (get(&dev, i) != CU_OK) {
            snprintf(d->name, sizeof d->name, "(cuDeviceGet failed)");
            d->usable = 0;
            snprintf(d->unusable_reason, sizeof d->unusable_reason, "cuDeviceGet(%d) failed", i);
            continue;
        }
        if (i < 64) cu[i] = dev;
        if (get_name(d->name, (int)sizeof d->name, dev) != CU_OK) snprintf(d->name, sizeof d->name, "(unknown)");
        int v;
        if (attr(&v, CU_ATTR_CC_MAJOR, dev) == CU_OK) d->cc_major = v;
        if (attr(&v, CU_ATTR_CC_MINOR, dev) == CU_OK) d->cc_minor = v;
        if (attr(&v, CU_ATTR_MULTIPROCESSOR_COUNT, dev) == CU_OK) d->sms = v;
        if (attr(&v, CU_ATTR_COMPUTE_MODE, dev) == CU_OK) d->compute_mode = v;
        if (attr(&v, CU_ATTR_MEMORY_CLOCK_RATE, dev) == CU_OK) d->mem_clock_khz = v;
        if (attr(&v, CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH, dev) == CU_OK) d->bus_width_bits = v;
        size_t tm;
        if (total_mem && total_mem(&tm, dev) == CU_OK) d->mem_total = (long long)tm;
        if (bus && bus(d->pci_bus_id, (int)sizeof d->pci_bus_id, dev) != CU_OK) d->pci_bus_id[0] = 0;
        unsigned char u[16];
        if (uuid && uuid(u, dev) == CU_OK)
            snprintf(d->uuid, sizeof d->uuid,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
                     u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
        int cc = d->cc_major * 10 + d->cc_minor;
        int rt = g->runtime ? g->runtime : g->built_cudart;
        if (d->compute_mode == 2) {
            d->usable = 0;
            snprintf(d->unusable_reason, sizeof d->unusable_reason,
                     "compute mode is 'prohibited' (nvidia-smi -i %d -c DEFAULT, as root)", i);
        } else if (d->cc_major >= 0 && rt >= 13000 && cc < 75) {
            d->usable = 0;
            snprintf(d->unusable_reason, sizeof d->unusable_reason,
                     "sm_%d is not supported by CUDA %d (it needs sm_75 or newer)", cc, rt / 1000);
        } else if (d->cc_major >= 0 && !arch_runs(cc)) {
            d->usable = 0;
            snprintf(d->unusable_reason, sizeof d->unusable_reason,
                     "rn was compiled for sm %s, which cannot run on sm_%d (rebuild with CUDA_ARCH=\"%d\")",
#ifdef RN_CUDA_ARCH
                     RN_CUDA_ARCH,
#else
                     "?",
#endif
                     cc, cc);
        }
    }
    for (int i = 0; i < n && i < 64; i++)
        for (int j = 0; j < n && j < 64; j++) {
            int can = 0;
            if (i != j && peer && peer(&can, cu[i], cu[j]) == CU_OK) g->p2p[i * n + j] = can != 0;
        }
}

static void probe_nvml(rn_gpuinfo *g) {
    rn_gpulib *l = &g->lib[RN_GPULIB_NVML];
    nvml_api n;
    nvml_load(l, &n);
    if (!n.init) {
        snprintf(l->error, sizeof l->error, "%.200s lacks nvmlInit_v2", l->path);
        return;
    }
    g->nvml_init = n.init();
    if (g->nvml_init != NVML_OK) {
        snprintf(l->error, sizeof l->error, "nvmlInit: %s (error %d)",
                 n.error_string ? n.error_string(g->nvml_init) : "failed", g->nvml_init);
        return;
    }
    int (*drv)(char *, unsigned) = NULL, (*nver)(char *, unsigned) = NULL;
    char buf[80];
    if (sym(l, "nvmlSystemGetDriverVersion", &drv) && drv(buf, sizeof buf) == NVML_OK)
        snprintf(g->driver_version, sizeof g->driver_version, "%.31s", buf);
    if (sym(l, "nvmlSystemGetNVMLVersion", &nver) && nver(buf, sizeof buf) == NVML_OK)
        snprintf(l->version, sizeof l->version, "%.31s", buf);
    for (int i = 0; i < g->ndev; i++) {
        rn_gpudev *d = &g->dev[i];
        void *h = NULL;
        if (d->pci_bus_id[0] && n.by_bus && n.by_bus(d->pci_bus_id, &h) == NVML_OK)
            d->nvml = h;
        else if (d->uuid[0] && n.by_uuid && n.by_uuid(d->uuid, &h) == NVML_OK)
            d->nvml = h;
        read_live(&n, d);
    }
}

static void probe_versions(rn_gpuinfo *g) {
    rn_gpulib *l;
    l = &g->lib[RN_GPULIB_CUDART];
    int (*rtver)(int *) = NULL;
    int v = 0;
    if (sym(l, "cudaRuntimeGetVersion", &rtver) && rtver(&v) == 0 && v > 0) {
        g->runtime = v;
        cuda_ver(l->version, sizeof l->version, v);
    } else if (l->loaded)
        snprintf(l->error, sizeof l->error, "cudaRuntimeGetVersion failed");

    l = &g->lib[RN_GPULIB_CUBLAS];
    int (*prop)(int, int *) = NULL;
    size_t (*blas_rt)(void) = NULL;
    int ma, mi, pa;
    if (sym(l, "cublasGetProperty", &prop) && prop(BLAS_PROP_MAJOR, &ma) == 0 && prop(BLAS_PROP_MINOR, &mi) == 0 &&
        prop(BLAS_PROP_PATCH, &pa) == 0)
        snprintf(l->version, sizeof l->version, "%d.%d.%d", ma, mi, pa);
    else if (l->loaded)
        snprintf(l->error, sizeof l->error, "cublasGetProperty failed");
    if (sym(l, "cublasGetCudartVersion", &blas_rt)) cuda_ver(l->built_for, sizeof l->built_for, (int)blas_rt());

    l = &g->lib[RN_GPULIB_CUDNN];
    size_t (*dnn)(void) = NULL, (*dnn_rt)(void) = NULL;
    if (sym(l, "cudnnGetVersion", &dnn)) {
        g->cudnn = (int)dnn();
        cudnn_ver(l->version, sizeof l->version, g->cudnn);
    }
    if (sym(l, "cudnnGetCudartVersion", &dnn_rt)) {
        g->cudnn_cudart = (int)dnn_rt();
        cuda_ver(l->built_for, sizeof l->built_for, g->cudnn_cudart);
    }

    l = &g->lib[RN_GPULIB_NCCL];
    int (*nccl)(int *) = NULL;
    if (sym(l, "ncclGetVersion", &nccl) && nccl(&v) == 0) nccl_ver(l->version, sizeof l->version, v);
}

/* cuDNN 9 loads its sub-libraries on first use; a missing one fails the first conv, long
 * after startup. Look for them next to libcudnn.so.9, then wherever dlopen finds them. */
static void check_cudnn_parts(rn_gpuinfo *g) {
    static const char *const parts[] = {"libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9",
                                        "libcudnn_engines_precompiled.so.9"};
    const rn_gpulib *l = &g->lib[RN_GPULIB_CUDNN];
    char dir[512], missing[256] = "";
    snprintf(dir, sizeof dir, "%s", l->realpath[0] ? l->realpath : l->path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        char p[800];
        snprintf(p, sizeof p, "%s/%s", dir, parts[i]);
        if (slash && access(p, R_OK) == 0) continue;
        void *h = dlopen(parts[i], RTLD_LAZY | RTLD_LOCAL);
        if (h) {
            dlclose(h);
            continue;
        }
        snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "", parts[i]);
    }
    if (missing[0])
        add_problem(g, RN_GPUINFO_CUDNN,
                    "install the complete cuDNN 9 package (e.g. Debian/Ubuntu libcudnn9-cuda-13, or pip "
                    "nvidia-cudnn-cu13) so its sub-libraries sit next to libcudnn.so.9",
                    "cuDNN %s (%s) is incomplete: %s not found next to it or on the library path", l->version, l->path,
                    missing);
}

static void diagnose(rn_gpuinfo *g) {
    const rn_gpulib *cu = &g->lib[RN_GPULIB_CUDA], *rt = &g->lib[RN_GPULIB_CUDART];
    const rn_gpulib *blas = &g->lib[RN_GPULIB_CUBLAS], *dnn = &g->lib[RN_GPULIB_CUDNN];
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    int need = g->runtime ? g->runtime : g->built_cudart;
    char needs[16], has[16];
    cuda_ver(needs, sizeof needs, need);
    cuda_ver(has, sizeof has, g->driver_cuda);

    if (!g->built_with_cuda)
        add_problem(g, RN_GPUINFO_NO_BUILD_GPU,
                    "install the CUDA toolkit with cuDNN and cuBLAS and rebuild with make USE_CUDA=1, or run the "
                    "tools with --device cpu",
                    "this rn build has no GPU support: it was built with USE_CUDA=0 or without a usable CUDA toolkit");

    /* driver: absent, stub, not loaded, broken */
    if (!cu->loaded) {
        if (g->kernel_module)
            add_problem(g, RN_GPUINFO_NO_DRIVER,
                        "install the driver's user-space libraries matching the kernel module (nvidia-smi must "
                        "work); in a container, start it with the NVIDIA container toolkit (docker run --gpus all)",
                        "no NVIDIA driver is loaded for CUDA: the NVIDIA kernel module%s%s is loaded but its "
                        "library libcuda.so.1 was not found (%s)",
                        g->driver_version[0] ? " " : "", g->driver_version, cu->error);
        else
            add_problem(g, RN_GPUINFO_NO_DRIVER,
                        "install the NVIDIA driver and check it with nvidia-smi, run on a machine with an NVIDIA "
                        "GPU, or use --device cpu",
                        "no NVIDIA driver is loaded: libcuda.so.1 was not found and no NVIDIA kernel module is "
                        "loaded (/proc/driver/nvidia/version is absent)");
    } else if (g->cu_init == CU_STUB_LIBRARY) {
        add_problem(g, RN_GPUINFO_NO_DRIVER,
                    "take the toolkit's stubs directory out of LD_LIBRARY_PATH and install the NVIDIA driver "
                    "(nvidia-smi must work), or use --device cpu",
                    "no NVIDIA driver is loaded: %s is the CUDA toolkit's stub libcuda, which only serves linking",
                    cu->realpath[0] ? cu->realpath : cu->path);
    } else if (g->cu_init == CU_NO_DEVICE && !g->kernel_module) {
        add_problem(g, RN_GPUINFO_NO_DRIVER,
                    "load the driver (modprobe nvidia, or reinstall it) and check nvidia-smi; in a container, "
                    "start it with --gpus all; or use --device cpu",
                    "no NVIDIA driver is loaded: %s is installed but cuInit reports CUDA_ERROR_NO_DEVICE and no "
                    "NVIDIA kernel module is loaded (/proc/driver/nvidia/version is absent)",
                    cu->path);
    } else if (g->cu_init == CU_SYSTEM_DRIVER_MISMATCH) {
        add_problem(g, RN_GPUINFO_NO_DRIVER, "reboot (or reload the nvidia kernel modules) after the driver upgrade",
                    "the NVIDIA driver library %s does not match the loaded kernel module %s "
                    "(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)",
                    cu->realpath[0] ? cu->realpath : cu->path, g->driver_version);
    } else if (g->cu_init == CU_COMPAT_NOT_SUPPORTED_ON_DEVICE) {
        add_problem(g, RN_GPUINFO_DRIVER_TOO_OLD,
                    "upgrade the system NVIDIA driver and take the cuda-compat directory out of LD_LIBRARY_PATH",
                    "the CUDA forward-compatibility driver %s does not support this GPU "
                    "(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)",
                    cu->path);
    } else if (g->cu_init == CU_NO_DEVICE || g->cu_init == CU_DEVICE_UNAVAILABLE) {
        /* handled with the devices below */
    } else if (g->cu_init != CU_OK) {
        add_problem(g, RN_GPUINFO_NO_DRIVER,
                    "check nvidia-smi and the kernel log (dmesg | grep -i nvrm); reinstall the driver if needed",
                    "the NVIDIA driver %s is not usable: cuInit failed with %s (%d)", cu->path, g->cu_init_name,
                    g->cu_init);
    }

    /* driver too old for the runtime: say so only when a driver is actually there */
    if (cu->loaded && g->driver_cuda && need && g->driver_cuda / 1000 < need / 1000) {
        char fix[320];
        snprintf(fix, sizeof fix,
                 "upgrade the NVIDIA driver to %s or newer (CUDA %d needs it; nvidia-smi shows the current one), "
                 "or use an rn build made with CUDA %d",
                 min_driver_for(need), need / 1000, g->driver_cuda / 1000);
        add_problem(g, RN_GPUINFO_DRIVER_TOO_OLD, fix, "the NVIDIA driver %s supports CUDA up to %s but %s is CUDA %s",
                    g->driver_version, has, rt->loaded ? rt->path : "this rn build", needs);
    } else if (cu->loaded && g->driver_cuda && need && g->driver_cuda < need) {
        add_note(g,
                 "the driver supports CUDA %s and the runtime is %s: this works through minor-version "
                 "compatibility, but PTX for the newer version cannot be JIT-compiled (upgrade the driver to be "
                 "safe)",
                 has, needs);
    }

    /* devices */
    if (cu->loaded && (g->cu_init == CU_NO_DEVICE || g->cu_init == CU_DEVICE_UNAVAILABLE) && g->kernel_module) {
        if (vis)
            add_problem(g, RN_GPUINFO_NO_DEVICE,
                        "unset CUDA_VISIBLE_DEVICES or set it to indices or UUIDs that nvidia-smi -L lists",
                        "the NVIDIA driver %s is loaded but CUDA sees no device: CUDA_VISIBLE_DEVICES=\"%s\" "
                        "hides them (%s)",
                        g->driver_version, vis, g->cu_init_name);
        else
            add_problem(g, RN_GPUINFO_NO_DEVICE,
                        "check nvidia-smi, the permissions on /dev/nvidia* (your user may need the video or "
                        "render group) and, in a container, --gpus all",
                        "the NVIDIA driver %s is loaded but CUDA sees no device (%s)", g->driver_version,
                        g->cu_init_name);
    } else if (g->cu_init == CU_OK) {
        int usable = 0;
        for (int i = 0; i < g->ndev; i++)
            usable += g->dev[i].usable;
        if (g->ndev == 0)
            add_problem(g, RN_GPUINFO_NO_DEVICE,
                        vis ? "unset or correct CUDA_VISIBLE_DEVICES (nvidia-smi -L lists the devices)"
                            : "check nvidia-smi and the permissions on /dev/nvidia*",
                        "the NVIDIA driver is loaded but reports no CUDA device%s%s%s",
                        vis ? " (CUDA_VISIBLE_DEVICES=\"" : "", vis ? vis : "", vis ? "\")" : "");
        else if (!usable)
            add_problem(g, RN_GPUINFO_NO_DEVICE, "see each device's reason in the report",
                        "none of the %d device(s) is usable: device 0: %s", g->ndev, g->dev[0].unusable_reason);
        for (int i = 0; i < g->ndev && usable; i++)
            if (!g->dev[i].usable) add_note(g, "device %d is not usable: %s", i, g->dev[i].unusable_reason);
        for (int i = 0; i < g->ndev; i++)
            if (g->dev[i].ecc_vol_uncorr > 0)
                add_note(g,
                         "device %d reports %lld uncorrectable ECC errors since the driver loaded: results on it "
                         "are suspect (reset the GPU, and replace it if they recur)",
                         i, g->dev[i].ecc_vol_uncorr);
    }

    /* CUDA runtime and cuBLAS */
    if (!rt->loaded)
        add_problem(g, RN_GPUINFO_CUDA_LIBS,
                    "install the CUDA runtime (the toolkit, or the cuda-cudart package) or add its lib64 directory "
                    "to LD_LIBRARY_PATH",
                    "the CUDA runtime library was not found (%s)", rt->error);
    else if (g->built_cudart && g->runtime && g->runtime / 1000 != g->built_cudart / 1000)
        add_problem(g, RN_GPUINFO_CUDA_LIBS,
                    "put the runtime rn was built with first on the library path, or rebuild rn",
                    "%s is CUDA %s but rn was built with CUDA %d", rt->path, rt->version, g->built_cudart / 1000);
    if (!blas->loaded)
        add_problem(g, RN_GPUINFO_CUDA_LIBS,
                    "install cuBLAS (part of the CUDA toolkit) or add its directory to LD_LIBRARY_PATH",
                    "cuBLAS was not found (%s)", blas->error);
    else if (g->built_cublas && blas->version[0] && atoi(blas->version) != g->built_cublas / 10000)
        add_problem(
            g, RN_GPUINFO_CUDA_LIBS, "put the cuBLAS rn was built with first on the library path, or rebuild rn",
            "%s is cuBLAS %s but rn was built with cuBLAS %d", blas->path, blas->version, g->built_cublas / 10000);

    /* cuDNN */
    if (!dnn->loaded)
        add_problem(g, RN_GPUINFO_CUDNN,
                    "install cuDNN 9 for your CUDA major (e.g. libcudnn9-cuda-13, or pip nvidia-cudnn-cu13) or "
                    "add its directory to LD_LIBRARY_PATH",
                    "cuDNN 9 was not found (%s)", dnn->error);
    else if (!g->cudnn)
        add_problem(g, RN_GPUINFO_CUDNN, "reinstall cuDNN 9", "%s does not answer cudnnGetVersion", dnn->path);
    else if (cudnn_major(g->cudnn) != 9)
        add_problem(g, RN_GPUINFO_CUDNN, "install cuDNN 9 and put it first on the library path",
                    "%s is cuDNN %s but rn needs cuDNN 9", dnn->path, dnn->version);
    else if (g->cudnn_cudart && need && g->cudnn_cudart / 1000 != need / 1000) {
        char fix[320];
        snprintf(fix, sizeof fix,
                 "install the cuDNN 9 build for CUDA %d (e.g. libcudnn9-cuda-%d, or pip nvidia-cudnn-cu%d)",
                 need / 1000, need / 1000, need / 1000);
        add_problem(g, RN_GPUINFO_CUDNN, fix, "%s (cuDNN %s) was built for CUDA %s but the CUDA runtime is %s",
                    dnn->path, dnn->version, dnn->built_for, needs);
    } else if (g->built_cudnn && g->cudnn < g->built_cudnn) {
        char built[16];
        cudnn_ver(built, sizeof built, g->built_cudnn);
        add_problem(g, RN_GPUINFO_CUDNN, "upgrade cuDNN, or put the one rn was built with first on the library path",
                    "%s is cuDNN %s, older than the %s rn was built with", dnn->path, dnn->version, built);
    } else
        check_cudnn_parts(g);

    /* worth knowing */
    if (cu->loaded && g->cu_init == CU_OK && !g->lib[RN_GPULIB_NVML].loaded)
        add_note(g, "NVML (libnvidia-ml.so.1) was not found, so live figures and --watch are unavailable; it "
                    "ships with the driver's utilities (the package that provides nvidia-smi)");
    else if (g->lib[RN_GPULIB_NVML].loaded && g->nvml_init != NVML_OK && g->cu_init == CU_OK)
        add_note(g, "NVML did not initialise (%s): live figures are unavailable", g->lib[RN_GPULIB_NVML].error);
    if (!g->lib[RN_GPULIB_NCCL].loaded)
        add_note(g, "NCCL (libnccl.so.2) was not found: single-GPU training only (%s)", g->lib[RN_GPULIB_NCCL].error);
    if (vis) add_note(g, "CUDA_VISIBLE_DEVICES=\"%s\": devices are numbered after it", vis);
}

int rn_gpuinfo_probe(rn_gpuinfo **out) {
    *out = NULL;
    rn_gpuinfo *g = rn_calloc(1, sizeof *g);
    if (!g) return RN_ENOMEM;
    g->built_with_cuda = BUILT_WITH_CUDA;
    g->built_cudart = BUILT_CUDART;
    g->built_cublas = BUILT_CUBLAS;
    g->built_cudnn = BUILT_CUDNN;
    g->built_nccl = BUILT_NCCL;
    g->cu_init = g->nvml_init = -1;

    /* the runtime and cuBLAS rn was built with first, then other majors */
    char rt_built[32] = "", blas_built[32] = "";
    if (g->built_cudart) {
        snprintf(rt_built, sizeof rt_built, "libcudart.so.%d", g->built_cudart / 1000);
        snprintf(blas_built, sizeof blas_built, "libcublas.so.%d", g->built_cublas / 10000);
    }
    const char *c_cuda[] = {"libcuda.so.1"};
    const char *c_nvml[] = {"libnvidia-ml.so.1"};
    const char *c_rt[] = {rt_built[0] ? rt_built : NULL, "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                          "libcudart.so"};
    const char *c_blas[] = {blas_built[0] ? blas_built : NULL, "libcublas.so.13", "libcublas.so.12", "libcublas.so.11",
                            "libcublas.so"};
    const char *c_dnn[] = {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"};
    const char *c_nccl[] = {"libnccl.so.2", "libnccl.so"};
#define OPEN(i, key, title, c)                                                                                         \
    open_lib(&g->lib[i], key, title, (c)[0] ? (c) : (c) + 1, (int)(sizeof(c) / sizeof *(c)) - !(c)[0])
    OPEN(RN_GPULIB_CUDA, "cuda", "NVIDIA driver", c_cuda);
    OPEN(RN_GPULIB_NVML, "nvml", "NVML", c_nvml);
    OPEN(RN_GPULIB_CUDART, "cudart", "CUDA runtime", c_rt);
    OPEN(RN_GPULIB_CUBLAS, "cublas", "cuBLAS", c_blas);
    OPEN(RN_GPULIB_CUDNN, "cudnn", "cuDNN", c_dnn);
    OPEN(RN_GPULIB_NCCL, "nccl", "NCCL", c_nccl);
#undef OPEN

    g->kernel_module = read_kernel_module(g->driver_version, sizeof g->driver_version);
    probe_versions(g);

    rn_gpulib *cu = &g->lib[RN_GPULIB_CUDA];
    if (cu->loaded) {
        int (*drv)(int *) = NULL, (*init)(unsigned) = NULL, (*ename)(int, const char **) = NULL;
        int v = 0;
        if (sym(cu, "cuDriverGetVersion", &drv) && drv(&v) == CU_OK) {
            g->driver_cuda = v;
            cuda_ver(cu->version, sizeof cu->version, v);
        }
        if (sym(cu, "cuInit", &init)) {
            g->cu_init = init(0);
            const char *nm = NULL;
            if (!sym(cu, "cuGetErrorName", &ename) || ename(g->cu_init, &nm) != CU_OK || !nm)
                nm = cu_error_name(g->cu_init);
            snprintf(g->cu_init_name, sizeof g->cu_init_name, "%s", nm);
            if (g->cu_init == CU_OK) probe_devices(g);
        } else {
            g->cu_init = 999;
            snprintf(g->cu_init_name, sizeof g->cu_init_name, "cuInit missing");
            snprintf(cu->error, sizeof cu->error, "%.200s lacks cuInit", cu->path);
        }
    }
    if (g->lib[RN_GPULIB_NVML].loaded) probe_nvml(g);
    /* the user-space driver's version is in its file name (libcuda.so.580.65.06) */
    if (!g->driver_version[0] && cu->realpath[0]) {
        const char *p = strstr(cu->realpath, "libcuda.so.");
        if (p && strspn(p + 11, "0123456789.") > 2) snprintf(g->driver_version, sizeof g->driver_version, "%s", p + 11);
    }
    if (g->ndev && !g->dev) g->ndev = 0;
    diagnose(g);
    *out = g;
    return RN_OK;
}

void rn_gpuinfo_free(rn_gpuinfo *g) {
    if (!g) return;
    rn_gpulib *nv = &g->lib[RN_GPULIB_NVML];
    int (*shutdown)(void) = NULL;
    if (nv->loaded && g->nvml_init == NVML_OK && sym(nv, "nvmlShutdown", &shutdown)) shutdown();
    /* the CUDA libraries register atexit handlers and may have threads: leave them mapped */
    for (int i = 0; i < RN_GPULIB_COUNT; i++)
        if (g->lib[i].handle && (i == RN_GPULIB_NVML || i == RN_GPULIB_NCCL)) dlclose(g->lib[i].handle);
    free(g->dev);
    free(g->p2p);
    free(g);
}

int rn_gpuinfo_refresh(rn_gpuinfo *g) {
    const rn_gpulib *l = &g->lib[RN_GPULIB_NVML];
    if (!l->loaded)
        return rn_errorf(RN_EGPU,
                         "NVML (libnvidia-ml.so.1) was not found (%s): live figures need it; it ships with "
                         "the NVIDIA driver's utilities, the package that provides nvidia-smi",
                         l->error);
    if (g->nvml_init != NVML_OK) return rn_errorf(RN_EGPU, "NVML is not usable: %s", l->error);
    nvml_api n;
    nvml_load(l, &n);
    for (int i = 0; i < g->ndev; i++)
        read_live(&n, &g->dev[i]);
    return RN_OK;
}

/* ---------- writers ---------- */

static int stream_status(FILE *f, const char *what) {
    if (ferror(f)) return rn_errorf(RN_EIO, "writing %s: %s", what, strerror(errno ? errno : EIO));
    return RN_OK;
}

static void jint(FILE *f, long long v) {
    if (v < 0)
        fputs("null", f);
    else
        fprintf(f, "%lld", v);
}

static void jnum(FILE *f, double v) {
    if (v < 0 || !isfinite(v))
        fputs("null", f);
    else
        fprintf(f, "%.6g", v);
}

static void jstr(FILE *f, const char *s) {
    if (!s || !s[0])
        fputs("null", f);
    else
        rn_json_string(f, s);
}

static const char *mode_name(int m) {
    switch (m) {
    case 0: return "default";
    case 1: return "exclusive_thread";
    case 2: return "prohibited";
    case 3: return "exclusive_process";
    default: return NULL;
    }
}

static void throttle_json(FILE *f, long long t) {
    if (t < 0) {
        fputs("null", f);
        return;
    }
    fputc('[', f);
    int first = 1;
    for (int b = 0; b < (int)(sizeof throttle_names / sizeof *throttle_names); b++)
        if (t & (1LL << b)) {
            fprintf(f, "%s\"%s\"", first ? "" : ",", throttle_names[b]);
            first = 0;
        }
    fputc(']', f);
}

static void live_json(FILE *f, const rn_gpudev *d) {
    fputs("\"memory\":{\"total\":", f);
    jint(f, d->mem_total);
    fputs(",\"free\":", f);
    jint(f, d->mem_free);
    fputs(",\"used\":", f);
    jint(f, d->mem_used);
    fputs("},\"clocks_mhz\":{\"sm\":", f);
    jint(f, d->sm_mhz);
    fputs(",\"memory\":", f);
    jint(f, d->mem_mhz);
    fputs(",\"sm_max\":", f);
    jint(f, d->sm_max_mhz);
    fputs(",\"memory_max\":", f);
    jint(f, d->mem_max_mhz);
    fputs("},\"temperature_c\":", f);
    jint(f, d->temperature_c);
    fputs(",\"power_w\":{\"draw\":", f);
    jnum(f, d->power_w);
    fputs(",\"limit\":", f);
    jnum(f, d->power_limit_w);
    fputs("},\"utilization_pct\":{\"gpu\":", f);
    jint(f, d->util_gpu);
    fputs(",\"memory\":", f);
    jint(f, d->util_mem);
    fputs("},\"throttle_reasons\":", f);
    throttle_json(f, d->throttle);
}

static void problem_json(FILE *f, int code, const char *msg, const char *fix) {
    fprintf(f, "{\"code\":%d,\"name\":\"%s\",\"message\":", code, rn_gpuinfo_status_name(code));
    jstr(f, msg);
    fputs(",\"fix\":", f);
    jstr(f, fix);
    fputc('}', f);
}

int rn_gpuinfo_write_json(const rn_gpuinfo *g, FILE *f) {
    char b[4][16];
    cuda_ver(b[0], 16, g->built_cudart);
    xyz_ver(b[1], 16, g->built_cublas);
    cudnn_ver(b[2], 16, g->built_cudnn);
    nccl_ver(b[3], 16, g->built_nccl);
    fprintf(f, "{\"schema\":\"rn-gpuinfo/1\",\"rn_version\":");
    jstr(f, RN_VERSION);
    fprintf(f, ",\"build\":{\"cuda\":%s,\"cudart\":", g->built_with_cuda ? "true" : "false");
    jstr(f, b[0]);
    fputs(",\"cublas\":", f);
    jstr(f, b[1]);
    fputs(",\"cudnn\":", f);
    jstr(f, b[2]);
    fputs(",\"nccl\":", f);
    jstr(f, b[3]);
    fputs("},\"driver\":{\"version\":", f);
    jstr(f, g->driver_version);
    fputs(",\"cuda\":", f);
    jstr(f, g->lib[RN_GPULIB_CUDA].version);
    fprintf(f, ",\"kernel_module\":%s,\"init\":", g->kernel_module ? "true" : "false");
    jstr(f, g->cu_init >= 0 ? g->cu_init_name : NULL);
    fputs("},\"libraries\":{", f);
    for (int i = 0; i < RN_GPULIB_COUNT; i++) {
        const rn_gpulib *l = &g->lib[i];
        fprintf(f, "%s\"%s\":{\"soname\":", i ? "," : "", l->key);
        jstr(f, l->soname);
        fprintf(f, ",\"loaded\":%s,\"path\":", l->loaded ? "true" : "false");
        jstr(f, l->path);
        fputs(",\"realpath\":", f);
        jstr(f, l->realpath);
        fputs(",\"version\":", f);
        jstr(f, l->version);
        fputs(",\"error\":", f);
        jstr(f, l->error);
        if (i == RN_GPULIB_CUDNN || i == RN_GPULIB_CUBLAS) {
            fputs(",\"cuda\":", f);
            jstr(f, l->built_for);
        }
        fputc('}', f);
    }
    fputs("},\"devices\":[", f);
    for (int i = 0; i < g->ndev; i++) {
        const rn_gpudev *d = &g->dev[i];
        fprintf(f, "%s{\"index\":%d,\"name\":", i ? "," : "", d->index);
        jstr(f, d->name);
        fputs(",\"uuid\":", f);
        jstr(f, d->uuid);
        fputs(",\"pci_bus_id\":", f);
        jstr(f, d->pci_bus_id);
        fputs(",\"compute_capability\":", f);
        if (d->cc_major >= 0)
            fprintf(f, "\"%d.%d\"", d->cc_major, d->cc_minor);
        else
            fputs("null", f);
        fputs(",\"multiprocessors\":", f);
        jint(f, d->sms);
        fputs(",\"compute_mode\":", f);
        jstr(f, mode_name(d->compute_mode));
        fprintf(f, ",\"usable\":%s,\"unusable_reason\":", d->usable ? "true" : "false");
        jstr(f, d->unusable_reason);
        fputc(',', f);
        live_json(f, d);
        fputs(",\"ecc\":{\"enabled\":", f);
        fputs(d->ecc_enabled < 0 ? "null" : d->ecc_enabled ? "true" : "false", f);
        fputs(",\"volatile_corrected\":", f);
        jint(f, d->ecc_vol_corr);
        fputs(",\"volatile_uncorrected\":", f);
        jint(f, d->ecc_vol_uncorr);
        fputs(",\"aggregate_corrected\":", f);
        jint(f, d->ecc_agg_corr);
        fputs(",\"aggregate_uncorrected\":", f);
        jint(f, d->ecc_agg_uncorr);
        fputs("},\"pcie\":{\"gen\":", f);
        jint(f, d->pcie_gen);
        fputs(",\"width\":", f);
        jint(f, d->pcie_width);
        fputs(",\"gen_max\":", f);
        jint(f, d->pcie_gen_max);
        fputs(",\"width_max\":", f);
        jint(f, d->pcie_width_max);
        fputs("}}", f);
    }
    fputs("],\"peer_access\":[", f);
    for (int i = 0; i < g->ndev; i++) {
        fprintf(f, "%s[", i ? "," : "");
        for (int j = 0; j < g->ndev; j++)
            fprintf(f, "%s%s", j ? "," : "", g->p2p[i * g->ndev + j] ? "true" : "false");
        fputc(']', f);
    }
    fputs("],\"status\":", f);
    if (g->nproblems)
        problem_json(f, g->problem[0].code, g->problem[0].message, g->problem[0].fix);
    else
        problem_json(f, 0, "a usable GPU, NVIDIA driver, CUDA runtime, cuBLAS and cuDNN are present", NULL);
    fputs(",\"problems\":[", f);
    for (int i = 0; i < g->nproblems; i++) {
        if (i) fputc(',', f);
        problem_json(f, g->problem[i].code, g->problem[i].message, g->problem[i].fix);
    }
    fputs("],\"notes\":[", f);
    for (int i = 0; i < g->nnotes; i++) {
        if (i) fputc(',', f);
        rn_json_string(f, g->note[i]);
    }
    fputs("]}\n", f);
    return stream_status(f, "the JSON report");
}

static void mib(char *buf, size_t cap, long long bytes) {
    if (bytes < 0)
        snprintf(buf, cap, "?");
    else
        snprintf(buf, cap, "%lld", bytes >> 20);
}

static void num_or_q(char *buf, size_t cap, long long v) {
    if (v < 0)
        snprintf(buf, cap, "?");
    else
        snprintf(buf, cap, "%lld", v);
}

/* a value for the text report, "?" when unknown; watts to the nearest one */
static const char *qs(char buf[24], long long v) {
    num_or_q(buf, 24, v);
    return buf;
}

static const char *qw(char buf[24], double w) {
    if (w < 0)
        snprintf(buf, 24, "?");
    else
        snprintf(buf, 24, "%.0f", w);
    return buf;
}

int rn_gpuinfo_write_text(const rn_gpuinfo *g, FILE *f) {
    char v[4][16];
    if (g->built_with_cuda) {
        cuda_ver(v[0], 16, g->built_cudart);
        xyz_ver(v[1], 16, g->built_cublas);
        cudnn_ver(v[2], 16, g->built_cudnn);
        nccl_ver(v[3], 16, g->built_nccl);
        fprintf(f, "rn %s, built with CUDA %s, cuBLAS %s, cuDNN %s%s%s\n", RN_VERSION, v[0], v[1], v[2],
                v[3][0] ? ", NCCL headers " : "", v[3]);
    } else
        fprintf(f, "rn %s, built without GPU support (USE_CUDA=0)\n", RN_VERSION);

    fprintf(f, "\n%-14s %-12s %s\n", "library", "version", "loaded from");
    for (int i = 0; i < RN_GPULIB_COUNT; i++) {
        const rn_gpulib *l = &g->lib[i];
        char ver[48];
        if (i == RN_GPULIB_CUDA && g->driver_version[0])
            snprintf(ver, sizeof ver, "%s", g->driver_version);
        else
            snprintf(ver, sizeof ver, "%s", l->version[0] ? l->version : "-");
        if (!l->loaded) {
            fprintf(f, "%-14s %-12s not found: %s\n", l->title, ver, l->error);
            continue;
        }
        fprintf(f, "%-14s %-12s %s", l->title, ver, l->path);
        if (l->realpath[0] && strcmp(l->realpath, l->path)) fprintf(f, " -> %s", l->realpath);
        if (i == RN_GPULIB_CUDA && l->version[0]) fprintf(f, " (supports CUDA %s)", l->version);
        if (l->built_for[0]) fprintf(f, " (for CUDA %s)", l->built_for);
        fputc('\n', f);
    }
    fprintf(f, "\ndriver: %s%s, kernel module %s, cuInit: %s\n", g->driver_version[0] ? "release " : "",
            g->driver_version[0] ? g->driver_version : "release unknown", g->kernel_module ? "loaded" : "not loaded",
            g->cu_init >= 0 ? g->cu_init_name : "not called");

    if (!g->ndev) fprintf(f, "devices: none\n");
    for (int i = 0; i < g->ndev; i++) {
        const rn_gpudev *d = &g->dev[i];
        char a[24], b[24], c[24];
        char cc[16];
        if (d->cc_major >= 0)
            snprintf(cc, sizeof cc, "sm_%d%d", d->cc_major, d->cc_minor);
        else
            snprintf(cc, sizeof cc, "sm_?");
        fprintf(f, "\nGPU %d: %s, %s, %d SMs, %s, PCI %s%s%s\n", d->index, d->name, cc, d->sms,
                d->uuid[0] ? d->uuid : "UUID ?", d->pci_bus_id[0] ? d->pci_bus_id : "?",
                d->usable ? "" : ", NOT USABLE: ", d->usable ? "" : d->unusable_reason);
        mib(a, sizeof a, d->mem_used);
        mib(b, sizeof b, d->mem_total);
        mib(c, sizeof c, d->mem_free);
        fprintf(f, "  memory       %s / %s MiB used, %s MiB free; compute mode %s\n", a, b, c,
                mode_name(d->compute_mode) ? mode_name(d->compute_mode) : "?");
        if (!d->nvml) {
            fprintf(f, "  live figures unavailable (no NVML)\n");
            continue;
        }
        char q[8][24];
        fprintf(f, "  clocks       SM %s / %s MHz, memory %s / %s MHz\n", qs(q[0], d->sm_mhz), qs(q[1], d->sm_max_mhz),
                qs(q[2], d->mem_mhz), qs(q[3], d->mem_max_mhz));
        fprintf(f, "  load         GPU %s%%, memory %s%%, %s C, power %s / %s W\n", qs(q[0], d->util_gpu),
                qs(q[1], d->util_mem), qs(q[2], d->temperature_c), qw(q[3], d->power_w), qw(q[4], d->power_limit_w));
        num_or_q(a, sizeof a, d->ecc_vol_corr);
        num_or_q(b, sizeof b, d->ecc_vol_uncorr);
        num_or_q(c, sizeof c, d->ecc_agg_uncorr);
        fprintf(f, "  ECC          %s", d->ecc_enabled < 0 ? "unknown" : d->ecc_enabled ? "on" : "off");
        if (d->ecc_enabled == 1)
            fprintf(f, ", since load %s corrected %s uncorrected, lifetime %s uncorrected", a, b, c);
        fprintf(f, "\n  throttle     ");
        if (d->throttle < 0)
            fputs("unknown", f);
        else if (d->throttle == 0)
            fputs("none", f);
        else
            for (int t = 0, first = 1; t < (int)(sizeof throttle_names / sizeof *throttle_names); t++)
                if (d->throttle & (1LL << t)) {
                    fprintf(f, "%s%s", first ? "" : ", ", throttle_names[t]);
                    first = 0;
                }
        fprintf(f, "\n  PCIe         gen %s x%s (max gen %s x%s)\n", qs(q[0], d->pcie_gen), qs(q[1], d->pcie_width),
                qs(q[2], d->pcie_gen_max), qs(q[3], d->pcie_width_max));
    }
    if (g->ndev > 1) {
        fprintf(f, "\npeer access (row can read column's memory):\n     ");
        for (int j = 0; j < g->ndev; j++)
            fprintf(f, " %3d", j);
        fputc('\n', f);
        for (int i = 0; i < g->ndev; i++) {
            fprintf(f, "  %3d", i);
            for (int j = 0; j < g->ndev; j++)
                fprintf(f, " %3s", i == j ? "-" : g->p2p[i * g->ndev + j] ? "Y" : "n");
            fputc('\n', f);
        }
    }
    int st = rn_gpuinfo_status(g);
    fprintf(f, "\nstatus: %d %s: %s\n", st, rn_gpuinfo_status_name(st),
            g->nproblems ? g->problem[0].message
                         : "a usable GPU, NVIDIA driver, CUDA runtime, cuBLAS and cuDNN are present");
    if (g->nproblems && g->problem[0].fix[0]) fprintf(f, "  fix: %s\n", g->problem[0].fix);
    for (int i = 1; i < g->nproblems; i++)
        fprintf(f, "also %d %s: %s\n  fix: %s\n", g->problem[i].code, rn_gpuinfo_status_name(g->problem[i].code),
                g->problem[i].message, g->problem[i].fix);
    for (int i = 0; i < g->nnotes; i++)
        fprintf(f, "note: %s\n", g->note[i]);
    return stream_status(f, "the report");
}

static void utc(char *buf, size_t cap, long long now) {
    time_t t = (time_t)now;
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
    else
        snprintf(buf, cap, "%lld", now);
}

int rn_gpuinfo_write_sample(const rn_gpuinfo *g, int i, long long now, int json, FILE *f) {
    const rn_gpudev *d = &g->dev[i];
    char ts[32];
    utc(ts, sizeof ts, now);
    if (json) {
        fprintf(f, "{\"time\":\"%s\",\"index\":%d,\"name\":", ts, d->index);
        jstr(f, d->name);
        fputc(',', f);
        live_json(f, d);
        fputs("}\n", f);
    } else {
        char used[24], total[24], pw[24], pl[24], tc[24], util[24], mu[24], sm[24], mc[24];
        mib(used, sizeof used, d->mem_used);
        mib(total, sizeof total, d->mem_total);
        qw(pw, d->power_w);
        qw(pl, d->power_limit_w);
        num_or_q(tc, sizeof tc, d->temperature_c);
        num_or_q(util, sizeof util, d->util_gpu);
        num_or_q(mu, sizeof mu, d->util_mem);
        num_or_q(sm, sizeof sm, d->sm_mhz);
        num_or_q(mc, sizeof mc, d->mem_mhz);
        fprintf(f, "%s gpu%d util %3s%% memutil %3s%% mem %6s/%s MiB power %4s/%s W temp %3s C sm %5s MHz mem %5s MHz",
                ts, d->index, util, mu, used, total, pw, pl, tc, sm, mc);
        if (d->throttle > 0) {
            fputs(" throttle ", f);
            for (int t = 0, first = 1; t < (int)(sizeof throttle_names / sizeof *throttle_names); t++)
                if (d->throttle & (1LL << t)) {
                    fprintf(f, "%s%s", first ? "" : ",", throttle_names[t]);
                    first = 0;
                }
        }
        fputc('\n', f);
    }
    return stream_status(f, "a --watch sample");
}

int rn_gpuinfo_watch(rn_gpuinfo *g, double interval_s, long count, int only, int json, FILE *f,
                     volatile sig_atomic_t *stop) {
    if (only >= g->ndev)
        return rn_errorf(RN_EINVAL, "--device %d: there %s only %d device%s (0..%d)", only, g->ndev == 1 ? "is" : "are",
                         g->ndev, g->ndev == 1 ? "" : "s", g->ndev - 1);
    if (g->ndev == 0) return rn_errorf(RN_EGPU, "no CUDA device to watch");
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (long k = 0; count == 0 || k < count; k++) {
        if (stop && *stop) break;
        int rc = rn_gpuinfo_refresh(g);
        if (rc) return rc;
        long long now = (long long)time(NULL);
        for (int i = 0; i < g->ndev; i++) {
            if (only >= 0 && i != only) continue;
            if ((rc = rn_gpuinfo_write_sample(g, i, now, json, f))) return rc;
        }
        if (fflush(f) != 0) return rn_errorf(RN_EIO, "writing --watch samples: %s", strerror(errno));
        if (count && k + 1 >= count) break;
        /* absolute deadlines keep the period exact however long a sample takes */
        double whole = floor(interval_s);
        next.tv_sec += (time_t)whole;
        next.tv_nsec += (long)((interval_s - whole) * 1e9);
        if (next.tv_nsec >= 1000000000L) {
            next.tv_sec++;
            next.tv_nsec -= 1000000000L;
        }
        while (!(stop && *stop)) {
            int e = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
            if (e == 0) break;
            if (e != EINTR) return rn_errorf(RN_EIO, "clock_nanosleep: %s", strerror(e));
        }
    }
    return RN_OK;
}

/* ---------- bench ---------- */

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

#define RT(call)                                                                                                       \
    do {                                                                                                               \
        int e_ = (call);                                                                                               \
        if (e_ != 0) {                                                                                                 \
            rc = rn_errorf(RN_EGPU, "%s:%d: %s: %s (error %d)", __FILE__, __LINE__, #call,                             \
                           api.error_string ? api.error_string(e_) : "CUDA runtime error", e_);                        \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)
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
    int ok = sym(rt, "cudaSetDevice", &a->set_device) & sym(rt, "cudaMalloc", &a->malloc_) &
             sym(rt, "cudaFree", &a->free_) & sym(rt, "cudaMallocHost", &a->malloc_host) &
             sym(rt, "cudaFreeHost", &a->free_host) & sym(rt, "cudaMemcpy", &a->memcpy_) &
             sym(rt, "cudaDeviceSynchronize", &a->sync) & sym(rt, "cudaEventCreate", &a->event_create) &
             sym(rt, "cudaEventRecord", &a->event_record) & sym(rt, "cudaEventSynchronize", &a->event_sync) &
             sym(rt, "cudaEventElapsedTime", &a->event_elapsed) & sym(rt, "cudaEventDestroy", &a->event_destroy) &
             sym(rt, "cudaGetErrorString", &a->error_string);
    if (!ok)
        return rn_errorf(RN_EGPU, "%s lacks a function --bench needs (cudaMalloc, cudaMemcpy, cudaEvent*)", rt->path);
    ok = sym(bl, "cublasCreate_v2", &a->blas_create) & sym(bl, "cublasDestroy_v2", &a->blas_destroy) &
         sym(bl, "cublasGemmEx", &a->gemm);
    if (!ok) return rn_errorf(RN_EGPU, "%s lacks cublasCreate_v2, cublasDestroy_v2 or cublasGemmEx", bl->path);
    sym(bl, "cublasGetStatusString", &a->blas_error);
    if (dn->loaded) {
        ok = sym(dn, "cudnnCreate", &a->dnn_create) & sym(dn, "cudnnDestroy", &a->dnn_destroy) &
             sym(dn, "cudnnGetErrorString", &a->dnn_error) & sym(dn, "cudnnCreateTensorDescriptor", &a->tensor_create) &
             sym(dn, "cudnnDestroyTensorDescriptor", &a->tensor_destroy) &
             sym(dn, "cudnnSetTensor4dDescriptor", &a->tensor_set) &
             sym(dn, "cudnnCreateFilterDescriptor", &a->filter_create) &
             sym(dn, "cudnnDestroyFilterDescriptor", &a->filter_destroy) &
             sym(dn, "cudnnSetFilter4dDescriptor", &a->filter_set) &
             sym(dn, "cudnnCreateConvolutionDescriptor", &a->conv_create) &
             sym(dn, "cudnnDestroyConvolutionDescriptor", &a->conv_destroy) &
             sym(dn, "cudnnSetConvolution2dDescriptor", &a->conv_set) &
             sym(dn, "cudnnSetConvolutionMathType", &a->conv_math) &
             sym(dn, "cudnnFindConvolutionForwardAlgorithm", &a->conv_find) &
             sym(dn, "cudnnGetConvolutionForwardWorkspaceSize", &a->conv_ws) &
             sym(dn, "cudnnConvolutionForward", &a->conv_fwd);
        if (!ok) a->dnn_create = NULL;
    }
    return RN_OK;
}

static uint16_t f32_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t m = u & 0x7fffffu;
    if (e <= 0) return (uint16_t)sign; /* the bench data is in [-1, 1): no subnormals needed */
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
    if ((m & 0x1fffu) > 0x1000u || ((m & 0x1fffu) == 0x1000u && (h & 1))) h++; /* round to nearest even */
    return (uint16_t)h;
}

static uint16_t f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even; the data is finite */
    return (uint16_t)(u >> 16);
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

    RT(api.set_device(d->index));
    RT(api.malloc_host(&host, bytes));
    RT(api.malloc_(&a, bytes));
    RT(api.malloc_(&b, bytes));
    RT(api.malloc_(&c, bytes));
    RT(api.event_create(&ev0));
    RT(api.event_create(&ev1));
    /* seeded random data, never zeros: power, hence clocks, depend on the bits */
    rn_rng_uniform(rn_rng_key(20260131, 7), host, (int64_t)n * n, -1.0f, 1.0f);

    RT(api.memcpy_(a, host, bytes, RT_MEMCPY_H2D));
    RT(api.event_record(ev0, NULL));
    for (int i = 0; i < 5; i++)
        RT(api.memcpy_(a, host, bytes, RT_MEMCPY_H2D));
    RT(api.event_record(ev1, NULL));
    RT(api.event_sync(ev1));
    RT(api.event_elapsed(&ms, ev0, ev1));
    snprintf(what, sizeof what, "%zu MiB pinned", bytes >> 20);
    add_result(out, "h2d", "GB/s", 5.0 * bytes / (ms * 1e-3) / 1e9, h2d_peak, what);

    RT(api.memcpy_(b, a, bytes, RT_MEMCPY_D2D));
    RT(api.event_record(ev0, NULL));
    for (int i = 0; i < 20; i++)
        RT(api.memcpy_(b, a, bytes, RT_MEMCPY_D2D));
    RT(api.event_record(ev1, NULL));
    RT(api.event_sync(ev1));
    RT(api.event_elapsed(&ms, ev0, ev1));
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
                h16[i] = gemms[k].dtype == DT_R_16F ? f32_to_f16(h32[i]) : f32_to_bf16(h32[i]);
            RT(api.memcpy_(a, host, (size_t)n * n * 2, RT_MEMCPY_H2D));
            RT(api.memcpy_(b, host, (size_t)n * n * 2, RT_MEMCPY_H2D));
        } else {
            rn_rng_uniform(rn_rng_key(20260131, 7), host, (int64_t)n * n, -1.0f, 1.0f);
            RT(api.memcpy_(a, host, bytes, RT_MEMCPY_H2D));
            RT(api.memcpy_(b, host, bytes, RT_MEMCPY_H2D));
        }
#define GEMM()                                                                                                         \
    BLAS(api.gemm(blas, BLAS_OP_N, BLAS_OP_N, n, n, n, &one, a, gemms[k].dtype, n, b, gemms[k].dtype, n, &zero, c,     \
                  gemms[k].dtype, n, gemms[k].compute, BLAS_GEMM_DEFAULT))
        GEMM();
        RT(api.event_record(ev0, NULL));
        GEMM();
        RT(api.event_record(ev1, NULL));
        RT(api.event_sync(ev1));
        RT(api.event_elapsed(&ms, ev0, ev1));
        int iters = ms > 0 ? (int)(300.0 / ms) : 50; /* about 0.3 s of work */
        iters = iters < 3 ? 3 : iters > 200 ? 200 : iters;
        RT(api.event_record(ev0, NULL));
        for (int i = 0; i < iters; i++)
            GEMM();
        RT(api.event_record(ev1, NULL));
        RT(api.event_sync(ev1));
        RT(api.event_elapsed(&ms, ev0, ev1));
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
                h16[i] = f32_to_f16(h32[i]);
            RT(api.memcpy_(a, host, xbytes, RT_MEMCPY_H2D));
            RT(api.memcpy_(b, host, (size_t)K * C * R * S * 2, RT_MEMCPY_H2D));
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
            if (wsize) RT(api.malloc_(&ws, wsize));
#define CONV() DNN(api.conv_fwd(dnn, &one, xd, a, wd, b, cd, perf[best].algo, ws, wsize, &zero, yd, c))
            CONV();
            RT(api.event_record(ev0, NULL));
            for (int i = 0; i < 20; i++)
                CONV();
            RT(api.event_record(ev1, NULL));
            RT(api.event_sync(ev1));
            RT(api.event_elapsed(&ms, ev0, ev1));
#undef CONV
            snprintf(what, sizeof what, "N%d C%d K%d %dx%d 3x3 NHWC algo %d", N, C, K, H, W, perf[best].algo);
            add_result(out, "conv_fp16", "TFLOP/s", 2.0 * N * K * C * R * S * H * W * 20.0 / (ms * 1e-3) / 1e12,
                       peak >= 0 ? datasheet[peak].fp16 : -1, what);
        }
    }
    RT(api.sync());

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

int rn_gpuinfo_write_bench(const rn_gpubench *b, int json, FILE *f) {
    if (json) {
        fprintf(f, "{\"schema\":\"rn-gpuinfo-bench/1\",\"index\":%d,\"name\":", b->index);
        jstr(f, b->name);
        fputs(",\"peak_source\":", f);
        jstr(f, b->peak_source);
        fputs(",\"results\":[", f);
        for (int i = 0; i < b->n; i++) {
            const rn_gpubench_result *r = &b->r[i];
            fprintf(f, "%s{\"test\":\"%s\",\"what\":", i ? "," : "", r->test);
            jstr(f, r->what);
            fputs(",\"value\":", f);
            jnum(f, r->value);
            fprintf(f, ",\"unit\":\"%s\",\"peak\":", r->unit);
            jnum(f, r->peak);
            fputs(",\"fraction\":", f);
            jnum(f, r->value >= 0 && r->peak > 0 ? r->value / r->peak : -1);
            fputs(",\"skipped\":", f);
            jstr(f, r->skipped);
            fputc('}', f);
        }
        fputs("]}\n", f);
    } else {
        fprintf(f, "GPU %d: %s (peaks: %s)\n", b->index, b->name,
                b->peak_source ? b->peak_source : "no datasheet entry; bandwidth peak from clock x bus width");
        fprintf(f, "  %-10s %10s %10s %7s  %s\n", "test", "measured", "peak", "of peak", "what");
        for (int i = 0; i < b->n; i++) {
            const rn_gpubench_result *r = &b->r[i];
            if (r->skipped[0]) {
                fprintf(f, "  %-10s skipped: %s\n", r->test, r->skipped);
                continue;
            }
            char pk[24] = "?", fr[24] = "?";
            if (r->peak > 0) {
                snprintf(pk, sizeof pk, "%.1f", r->peak);
                snprintf(fr, sizeof fr, "%.0f%%", 100 * r->value / r->peak);
            }
            fprintf(f, "  %-10s %10.1f %10s %7s  %s %s\n", r->test, r->value, pk, fr, r->unit, r->what);
        }
    }
    return stream_status(f, "the benchmark results");
}
