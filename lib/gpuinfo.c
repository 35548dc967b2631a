/* gpuinfo: probing and diagnosis: load the NVIDIA libraries, ask them for versions and
 * devices, and turn what is found into a verdict with its fix (see rn/gpuinfo.h).
 * Text and JSON output are lib/gpuinfo_report.c, --bench is lib/gpuinfo_bench.c.
 *
 * Every NVIDIA library is opened with dlopen and called through pointers typed here, so
 * this file compiles and runs identically with and without the CUDA toolkit; in a CUDA
 * build the enum values copied below are checked against the real headers at compile
 * time. */
#include "rn/gpuinfo_impl.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn/err.h"

/* Values from cuda.h, nvml.h and cublas_api.h that this file uses. */
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
    BLAS_PROP_MAJOR = 0,
    BLAS_PROP_MINOR = 1,
    BLAS_PROP_PATCH = 2,
};

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
_Static_assert((int)BLAS_PROP_MAJOR == (int)MAJOR_VERSION && (int)BLAS_PROP_MINOR == (int)MINOR_VERSION &&
                   (int)BLAS_PROP_PATCH == (int)PATCH_LEVEL,
               "cuBLAS property values");
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

/* Minimum Linux driver for each CUDA major (CUDA release notes, table 3). */
static const struct {
    int major;
    const char *driver;
} min_driver[] = {{11, "450.80.02"}, {12, "525.60.13"}, {13, "580.65.06"}};

static const char *const status_names[] = {
    "usable", "?", "?", "no_driver", "driver_too_old", "no_device", "cudnn", "no_build_gpu", "cuda_libs"};

const char *rn_gpuinfo_status_name(int code) {
    if (code < 0 || code >= (int)(sizeof status_names / sizeof *status_names) || status_names[code][0] == '?')
        return "unknown";
    return status_names[code];
}

int rn_gpuinfo_status(const rn_gpuinfo *g) { return g->nproblems ? g->problem[0].code : RN_GPUINFO_USABLE; }

/* dlsym into a typed function pointer (POSIX guarantees the two are interchangeable). */
int rn_gpuinfo_sym(const rn_gpulib *l, const char *name, void *fnp) {
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
void rn_gpuinfo_cuda_ver(char *buf, size_t cap, int v) {
    if (v > 0)
        snprintf(buf, cap, "%d.%d", v / 1000, v % 1000 / 10);
    else if (cap)
        buf[0] = 0;
}

static int cudnn_major(int v) { return v >= RN_GPUINFO_CUDNN_WIDE ? v / 10000 : v / 1000; }

void rn_gpuinfo_lib_ver(char *buf, size_t cap, int v, int wide_from) {
    if (v <= 0) {
        if (cap) buf[0] = 0;
    } else if (v >= wide_from)
        snprintf(buf, cap, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
    else
        snprintf(buf, cap, "%d.%d.%d", v / 1000, v % 1000 / 100, v % 100);
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
    if (!rn_gpuinfo_sym(l, "nvmlInit_v2", &n->init)) rn_gpuinfo_sym(l, "nvmlInit", &n->init);
    rn_gpuinfo_sym(l, "nvmlShutdown", &n->shutdown);
    rn_gpuinfo_sym(l, "nvmlErrorString", &n->error_string);
    rn_gpuinfo_sym(l, "nvmlDeviceGetHandleByPciBusId_v2", &n->by_bus);
    rn_gpuinfo_sym(l, "nvmlDeviceGetHandleByUUID", &n->by_uuid);
    rn_gpuinfo_sym(l, "nvmlDeviceGetMemoryInfo", &n->mem);
    rn_gpuinfo_sym(l, "nvmlDeviceGetClockInfo", &n->clock);
    rn_gpuinfo_sym(l, "nvmlDeviceGetMaxClockInfo", &n->max_clock);
    rn_gpuinfo_sym(l, "nvmlDeviceGetTemperature", &n->temp);
    rn_gpuinfo_sym(l, "nvmlDeviceGetPowerUsage", &n->power);
    rn_gpuinfo_sym(l, "nvmlDeviceGetEnforcedPowerLimit", &n->power_limit);
    rn_gpuinfo_sym(l, "nvmlDeviceGetUtilizationRates", &n->util);
    rn_gpuinfo_sym(l, "nvmlDeviceGetEccMode", &n->ecc_mode);
    rn_gpuinfo_sym(l, "nvmlDeviceGetTotalEccErrors", &n->ecc_errors);
    /* renamed in NVML 12.2; the old name stays exported for older drivers */
    if (!rn_gpuinfo_sym(l, "nvmlDeviceGetCurrentClocksEventReasons", &n->reasons))
        rn_gpuinfo_sym(l, "nvmlDeviceGetCurrentClocksThrottleReasons", &n->reasons);
    rn_gpuinfo_sym(l, "nvmlDeviceGetCurrPcieLinkGeneration", &n->pcie_gen);
    rn_gpuinfo_sym(l, "nvmlDeviceGetCurrPcieLinkWidth", &n->pcie_width);
    rn_gpuinfo_sym(l, "nvmlDeviceGetMaxPcieLinkGeneration", &n->pcie_gen_max);
    rn_gpuinfo_sym(l, "nvmlDeviceGetMaxPcieLinkWidth", &n->pcie_width_max);
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
    if (!rn_gpuinfo_sym(l, "cuDeviceGetCount", &get_count) || !rn_gpuinfo_sym(l, "cuDeviceGet", &get) ||
        !rn_gpuinfo_sym(l, "cuDeviceGetName", &get_name) || !rn_gpuinfo_sym(l, "cuDeviceGetAttribute", &attr)) {
        add_note(g,
                 "%s lacks the device functions (cuDeviceGetCount, cuDeviceGet, cuDeviceGetName, "
                 "cuDeviceGetAttribute): devices not listed",
                 l->path);
        return;
    }
    if (!rn_gpuinfo_sym(l, "cuDeviceTotalMem_v2", &total_mem)) rn_gpuinfo_sym(l, "cuDeviceTotalMem", &total_mem);
    rn_gpuinfo_sym(l, "cuDeviceGetPCIBusId", &bus);
    if (!rn_gpuinfo_sym(l, "cuDeviceGetUuid_v2", &uuid)) rn_gpuinfo_sym(l, "cuDeviceGetUuid", &uuid);
    rn_gpuinfo_sym(l, "cuDeviceCanAccessPeer", &peer);
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
    if (rn_gpuinfo_sym(l, "nvmlSystemGetDriverVersion", &drv) && drv(buf, sizeof buf) == NVML_OK)
        snprintf(g->driver_version, sizeof g->driver_version, "%.31s", buf);
    if (rn_gpuinfo_sym(l, "nvmlSystemGetNVMLVersion", &nver) && nver(buf, sizeof buf) == NVML_OK)
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
    if (rn_gpuinfo_sym(l, "cudaRuntimeGetVersion", &rtver) && rtver(&v) == 0 && v > 0) {
        g->runtime = v;
        rn_gpuinfo_cuda_ver(l->version, sizeof l->version, v);
    } else if (l->loaded)
        snprintf(l->error, sizeof l->error, "cudaRuntimeGetVersion failed");

    l = &g->lib[RN_GPULIB_CUBLAS];
    int (*prop)(int, int *) = NULL;
    size_t (*blas_rt)(void) = NULL;
    int ma, mi, pa;
    if (rn_gpuinfo_sym(l, "cublasGetProperty", &prop) && prop(BLAS_PROP_MAJOR, &ma) == 0 &&
        prop(BLAS_PROP_MINOR, &mi) == 0 && prop(BLAS_PROP_PATCH, &pa) == 0)
        snprintf(l->version, sizeof l->version, "%d.%d.%d", ma, mi, pa);
    else if (l->loaded)
        snprintf(l->error, sizeof l->error, "cublasGetProperty failed");
    if (rn_gpuinfo_sym(l, "cublasGetCudartVersion", &blas_rt))
        rn_gpuinfo_cuda_ver(l->built_for, sizeof l->built_for, (int)blas_rt());

    l = &g->lib[RN_GPULIB_CUDNN];
    size_t (*dnn)(void) = NULL, (*dnn_rt)(void) = NULL;
    if (rn_gpuinfo_sym(l, "cudnnGetVersion", &dnn)) {
        g->cudnn = (int)dnn();
        rn_gpuinfo_lib_ver(l->version, sizeof l->version, g->cudnn, RN_GPUINFO_CUDNN_WIDE);
    }
    if (rn_gpuinfo_sym(l, "cudnnGetCudartVersion", &dnn_rt)) {
        g->cudnn_cudart = (int)dnn_rt();
        rn_gpuinfo_cuda_ver(l->built_for, sizeof l->built_for, g->cudnn_cudart);
    }

    l = &g->lib[RN_GPULIB_NCCL];
    int (*nccl)(int *) = NULL;
    if (rn_gpuinfo_sym(l, "ncclGetVersion", &nccl) && nccl(&v) == 0)
        rn_gpuinfo_lib_ver(l->version, sizeof l->version, v, RN_GPUINFO_NCCL_WIDE);
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
    rn_gpuinfo_cuda_ver(needs, sizeof needs, need);
    rn_gpuinfo_cuda_ver(has, sizeof has, g->driver_cuda);

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
        rn_gpuinfo_lib_ver(built, sizeof built, g->built_cudnn, RN_GPUINFO_CUDNN_WIDE);
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
        if (rn_gpuinfo_sym(cu, "cuDriverGetVersion", &drv) && drv(&v) == CU_OK) {
            g->driver_cuda = v;
            rn_gpuinfo_cuda_ver(cu->version, sizeof cu->version, v);
        }
        if (rn_gpuinfo_sym(cu, "cuInit", &init)) {
            g->cu_init = init(0);
            const char *nm = NULL;
            if (!rn_gpuinfo_sym(cu, "cuGetErrorName", &ename) || ename(g->cu_init, &nm) != CU_OK || !nm)
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
    if (nv->loaded && g->nvml_init == NVML_OK && rn_gpuinfo_sym(nv, "nvmlShutdown", &shutdown)) shutdown();
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
