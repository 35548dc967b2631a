/* rn/gpuinfo.h: what GPU stack this machine really has, as loaded at run time.
 *
 * rn_gpuinfo_probe() loads the NVIDIA libraries with dlopen, whatever rn was built with:
 *   libcuda.so.1 (driver API), libnvidia-ml.so.1 (NVML: live figures),
 *   libcudart.so.<major> (CUDA runtime), libcublas.so.<major>, libcudnn.so.9, libnccl.so.2.
 * It records which file each came from (dlinfo), asks each for its version, lists the
 * devices the driver API sees (NVML adds live figures), and turns all of it into a
 * verdict: one of the RN_GPUINFO_* codes below, with a one-line diagnosis and the fix.
 * Nothing here needs a GPU, a driver or the CUDA headers; a library that is absent is
 * reported as absent. Only rn_gpuinfo_bench() does work on a device.
 *
 * The verdict codes are the exit statuses of rn-gpuinfo (plain, --json and --check), so
 * a Makefile can branch on them. They are checked in this order and the first that
 * applies wins; every one that applies is listed in rn_gpuinfo.problems:
 *   0  RN_GPUINFO_USABLE          a usable GPU, driver, CUDA runtime, cuBLAS and cuDNN
 *   7  RN_GPUINFO_NO_BUILD_GPU    this rn build has no GPU support (USE_CUDA=0)
 *   3  RN_GPUINFO_NO_DRIVER       no usable NVIDIA driver is loaded (libcuda.so.1 absent,
 *                                 the kernel module not loaded, the toolkit's stub libcuda,
 *                                 or a driver library/kernel module version mismatch)
 *   4  RN_GPUINFO_DRIVER_TOO_OLD  the driver supports an older CUDA major than the runtime
 *   5  RN_GPUINFO_NO_DEVICE       driver loaded but no usable device (CUDA_VISIBLE_DEVICES,
 *                                 /dev/nvidia* permissions, compute mode prohibited,
 *                                 a GPU too old for this CUDA)
 *   8  RN_GPUINFO_CUDA_LIBS       the CUDA runtime or cuBLAS is missing or of another major
 *   6  RN_GPUINFO_CUDNN           cuDNN missing, not 9.x, built for another CUDA major,
 *                                 older than rn was built against, or missing a sub-library
 * (1 and 2 are the tools' runtime-failure and bad-usage statuses, so they are not used.)
 *
 * JSON (rn_gpuinfo_write_json), schema "rn-gpuinfo/1". Unknown values are null; a field
 * is never left out. Sizes in bytes, clocks in MHz, power in W, temperature in C.
 *   {
 *     "schema": "rn-gpuinfo/1",
 *     "rn_version": "0.1.0+abc1234",
 *     "build": {"cuda": bool,            // built with RN_HAVE_CUDA
 *               "cudart": str|null, "cublas": str|null, "cudnn": str|null,
 *               "nccl": str|null},       // versions of the headers rn was built with
 *     "driver": {"version": str|null,    // "580.65.06" (NVML, else /proc/driver/nvidia)
 *                "cuda": str|null,       // highest CUDA it supports, "13.0"
 *                "kernel_module": bool,  // /proc/driver/nvidia/version exists
 *                "init": str|null},      // cuInit's result, "CUDA_SUCCESS", null if not called
 *     "libraries": {                     // keys: cuda nvml cudart cublas cudnn nccl
 *       "cudnn": {"soname": str,         // the name dlopen was given (or tried first)
 *                 "loaded": bool,
 *                 "path": str|null,      // where the loader found it
 *                 "realpath": str|null,  // that path with symlinks resolved
 *                 "version": str|null,   // "9.13.0"; driver: the driver's CUDA version
 *                 "error": str|null,     // dlerror() when not loaded
 *                 "cuda": str|null},     // cudnn and cublas only: CUDA they were built for
 *       ...},
 *     "devices": [{"index": int,         // CUDA device ordinal (after CUDA_VISIBLE_DEVICES)
 *       "name": str, "uuid": str|null, "pci_bus_id": str|null,
 *       "compute_capability": "9.0", "multiprocessors": int|null,
 *       "compute_mode": "default"|"exclusive_process"|"prohibited"|null,
 *       "usable": bool, "unusable_reason": str|null,
 *       "memory": {"total": int|null, "free": int|null, "used": int|null},
 *       "clocks_mhz": {"sm": int|null, "memory": int|null,
 *                      "sm_max": int|null, "memory_max": int|null},
 *       "temperature_c": int|null,
 *       "power_w": {"draw": num|null, "limit": num|null},
 *       "utilization_pct": {"gpu": int|null, "memory": int|null},
 *       "ecc": {"enabled": bool|null, "volatile_corrected": int|null,
 *               "volatile_uncorrected": int|null, "aggregate_corrected": int|null,
 *               "aggregate_uncorrected": int|null},
 *       "throttle_reasons": [str]|null,  // "gpu_idle", "sw_power_cap", "hw_slowdown", ...
 *       "pcie": {"gen": int|null, "width": int|null, "gen_max": int|null,
 *                "width_max": int|null}}],
 *     "peer_access": [[bool]],           // [i][j]: device i can access device j's memory
 *     "status": {"code": int, "name": str, "message": str, "fix": str|null},
 *     "problems": [{"code": int, "name": str, "message": str, "fix": str|null}],
 *     "notes": [str]                     // worth knowing, does not change the status
 *   }
 * status.name is one of "usable", "no_build_gpu", "no_driver", "driver_too_old",
 * "no_device", "cuda_libs", "cudnn". Schema changes that remove or retype a field bump
 * the number after the slash; new fields may appear without a bump. */
#ifndef RN_GPUINFO_H
#define RN_GPUINFO_H

#include <signal.h>
#include <stdio.h>

enum {
    RN_GPUINFO_USABLE = 0,
    RN_GPUINFO_NO_DRIVER = 3,
    RN_GPUINFO_DRIVER_TOO_OLD = 4,
    RN_GPUINFO_NO_DEVICE = 5,
    RN_GPUINFO_CUDNN = 6,
    RN_GPUINFO_NO_BUILD_GPU = 7,
    RN_GPUINFO_CUDA_LIBS = 8,
};

/* The libraries probed, in report order. */
enum {
    RN_GPULIB_CUDA,
    RN_GPULIB_NVML,
    RN_GPULIB_CUDART,
    RN_GPULIB_CUBLAS,
    RN_GPULIB_CUDNN,
    RN_GPULIB_NCCL,
    RN_GPULIB_COUNT
};

typedef struct {
    const char *key;   /* "cuda", "nvml", "cudart", "cublas", "cudnn", "nccl" */
    const char *title; /* "NVIDIA driver", "NVML", "CUDA runtime", ... */
    char soname[64];   /* the name that loaded, else the first one tried */
    int loaded;
    char path[512];     /* as the dynamic loader found it; "" when not loaded */
    char realpath[512]; /* path with symlinks resolved; "" when unknown */
    char version[32];   /* "9.13.0"; "" when unknown */
    char built_for[16]; /* cuDNN/cuBLAS: the CUDA version they were built for; "" */
    char error[256];    /* why it did not load (dlerror), or why a version is unknown */
    void *handle;       /* dlopen handle, owned; NULL when not loaded */
} rn_gpulib;

/* One CUDA device. Integers are -1 and doubles < 0 when unknown (NVML absent or the
 * device does not support the query). */
typedef struct {
    int index; /* CUDA ordinal */
    char name[128];
    char uuid[48];                     /* "GPU-xxxxxxxx-...", "" when unknown */
    char pci_bus_id[32];               /* "0000:3B:00.0", "" when unknown */
    int cc_major, cc_minor;            /* compute capability */
    int sms;                           /* multiprocessors */
    int compute_mode;                  /* 0 default, 2 prohibited, 3 exclusive process, -1 unknown */
    int mem_clock_khz, bus_width_bits; /* for the theoretical memory bandwidth */
    int usable;                        /* 1 unless unusable_reason says why not */
    char unusable_reason[160];
    long long mem_total, mem_free, mem_used; /* bytes */
    int sm_mhz, mem_mhz, sm_max_mhz, mem_max_mhz;
    int temperature_c;
    double power_w, power_limit_w;
    int util_gpu, util_mem; /* percent over the last sample period */
    int ecc_enabled;        /* 1, 0, -1 unknown */
    long long ecc_vol_corr, ecc_vol_uncorr, ecc_agg_corr, ecc_agg_uncorr;
    long long throttle; /* NVML clocks-event reason bits, -1 unknown */
    int pcie_gen, pcie_width, pcie_gen_max, pcie_width_max;
    void *nvml; /* NVML handle, NULL when NVML has no match */
} rn_gpudev;

typedef struct {
    int code;          /* an RN_GPUINFO_* code */
    char message[512]; /* what is wrong and where (which library, which path) */
    char fix[320];     /* what to do next */
} rn_gpuproblem;

#define RN_GPUINFO_MAX_PROBLEMS 16
#define RN_GPUINFO_MAX_NOTES 16

typedef struct {
    int built_with_cuda;
    int built_cudart, built_cublas, built_cudnn, built_nccl; /* header versions, 0 unknown */
    rn_gpulib lib[RN_GPULIB_COUNT];
    char driver_version[32]; /* "580.65.06", "" unknown */
    int driver_cuda;         /* cuDriverGetVersion: 13000 means CUDA 13.0; 0 unknown */
    int kernel_module;       /* /proc/driver/nvidia/version exists */
    int cu_init;             /* cuInit's CUresult; -1 when not called */
    char cu_init_name[48];   /* "CUDA_SUCCESS", "CUDA_ERROR_NO_DEVICE", ... */
    int nvml_init;           /* nvmlInit's result; -1 when not called */
    int runtime;             /* cudaRuntimeGetVersion: 13000; 0 unknown */
    int cudnn, cudnn_cudart; /* cudnnGetVersion (90300), cudnnGetCudartVersion; 0 */
    int ndev;
    rn_gpudev *dev;     /* ndev entries */
    unsigned char *p2p; /* ndev*ndev: p2p[i*ndev+j] = device i can access device j */
    int nproblems;      /* in verdict order: problem[0] decides the status */
    rn_gpuproblem problem[RN_GPUINFO_MAX_PROBLEMS];
    int nnotes;
    char note[RN_GPUINFO_MAX_NOTES][320];
} rn_gpuinfo;

/* Load the libraries, query versions and devices, and diagnose. Never fails for want of
 * a GPU or a library: that is what *out describes. Call rn_gpuinfo_free(*out) after.
 * Errors: RN_ENOMEM. */
int rn_gpuinfo_probe(rn_gpuinfo **out);

/* Release what probe loaded (NVML is shut down, libraries closed). NULL is fine. */
void rn_gpuinfo_free(rn_gpuinfo *g);

/* The verdict: RN_GPUINFO_USABLE or the code of problem[0]. */
int rn_gpuinfo_status(const rn_gpuinfo *g);

/* "usable", "no_driver", ... for a verdict code; "unknown" otherwise. */
const char *rn_gpuinfo_status_name(int code);

/* Re-read the live NVML figures (memory, clocks, temperature, power, utilisation, ECC,
 * throttle reasons, PCIe link) of every device. Errors: RN_EGPU when NVML is not loaded
 * (the message says why and what to install). */
int rn_gpuinfo_refresh(rn_gpuinfo *g);

/* The human report / the JSON object described above (one line, newline-terminated).
 * Errors: RN_EIO when the stream reports a write error. */
int rn_gpuinfo_write_text(const rn_gpuinfo *g, FILE *f);
int rn_gpuinfo_write_json(const rn_gpuinfo *g, FILE *f);

/* One --watch sample of device d: a compact text line, or a JSON object on one line
 *   {"time": "2026-01-31T12:00:00Z", "index": 0, "name": str, "utilization_pct": {...},
 *    "memory": {...}, "power_w": {...}, "temperature_c": int|null, "clocks_mhz": {...},
 *    "throttle_reasons": [...]|null}
 * with the same member meanings as in the report. now is the sample's time.
 * Errors: RN_EIO. */
int rn_gpuinfo_write_sample(const rn_gpuinfo *g, int d, long long now, int json, FILE *f);

/* Sample every device (or only device `only` when >= 0) every interval_s seconds, count
 * times (0: until *stop becomes non-zero, which a signal handler may set). The first
 * sample is taken at once. Needs NVML and at least one device.
 * Errors: RN_EINVAL (only out of range), RN_EGPU (no devices, NVML absent), RN_EIO. */
int rn_gpuinfo_watch(rn_gpuinfo *g, double interval_s, long count, int only, int json, FILE *f,
                     volatile sig_atomic_t *stop);

/* --bench. One measurement of a device against its datasheet peak (peak < 0: unknown). */
typedef struct {
    const char *test;   /* "h2d", "d2d", "gemm_fp32", "gemm_tf32", "gemm_fp16", "gemm_bf16",
                         * "conv_fp16" */
    char what[96];      /* the shape measured, e.g. "8192x8192x8192", "256 MiB" */
    double value, peak; /* in unit; value < 0 when the test was skipped */
    const char *unit;   /* "GB/s" or "TFLOP/s" */
    char skipped[128];  /* why it was skipped, "" when it ran */
} rn_gpubench_result;

#define RN_GPUBENCH_MAX 8

typedef struct {
    int index;
    char name[128];
    const char *peak_source; /* the datasheet entry used ("H100 SXM5"), NULL when unknown */
    int n;
    rn_gpubench_result r[RN_GPUBENCH_MAX];
} rn_gpubench;

/* Measure device d (host-to-device and device-to-device copy bandwidth, cuBLAS GEMM in
 * fp32, TF32, fp16 and bf16 with fp32 accumulation, and one ResNet-50 layer2 3x3
 * convolution in fp16 NHWC through cuDNN) into *out; a few seconds per device. D2D counts
 * the bytes read plus the bytes written, as CUDA's bandwidthTest does. Bandwidth peaks
 * come from the datasheet table (or memory clock x bus width), the H2D peak from the
 * PCIe link NVML reports.
 * Errors: RN_ENOTSUP (this build has no GPU support), RN_EGPU (no such device, a
 * library missing, or a CUDA/cuBLAS/cuDNN call failed: the message names the call). */
int rn_gpuinfo_bench(const rn_gpuinfo *g, int d, rn_gpubench *out);

/* The datasheet entry --bench compares device `name` with ("NVIDIA H100 80GB HBM3" ->
 * "H100 SXM5"), NULL for a GPU the table does not know. */
const char *rn_gpuinfo_datasheet(const char *name);

/* Print bench results: a table, or one JSON object per device on one line:
 *   {"schema": "rn-gpuinfo-bench/1", "index": int, "name": str, "peak_source": str|null,
 *    "results": [{"test": str, "what": str, "value": num|null, "unit": str,
 *                 "peak": num|null, "fraction": num|null, "skipped": str|null}]}
 * Errors: RN_EIO. */
int rn_gpuinfo_write_bench(const rn_gpubench *b, int json, FILE *f);

/* --nccl. A preflight of the collectives a many-GPU run uses: an fp32 sum all-reduce
 * (out of place) across every usable device of this machine from one process
 * (ncclCommInitAll), at sizes from 8 MiB to 256 MiB per device. Bandwidths are in GB/s
 * as nccl-tests counts them: algbw = bytes / time, busbw = algbw * 2 (n-1) / n, the
 * figure to compare with the link (NVLink, PCIe) speed. */
typedef struct {
    long long bytes;     /* per device */
    double us;           /* mean time of one all-reduce, microseconds */
    double algbw, busbw; /* GB/s */
} rn_gpunccl_result;

#define RN_GPUNCCL_MAX 8

typedef struct {
    int ndev;               /* devices taking part */
    int dev[64];            /* their CUDA ordinals, the first ndev entries */
    char version[32];       /* the NCCL library's version, "" unknown */
    int verified;           /* 1: every size's sums were exact on every device */
    char skipped[160];      /* why nothing ran (fewer than 2 usable devices), "" when it ran */
    int n;
    rn_gpunccl_result r[RN_GPUNCCL_MAX];
} rn_gpunccl;

/* Run --nccl into *out, through its own dlsym binding of the CUDA runtime and NCCL (no
 * NCCL needed to start rn-gpuinfo). Fewer than 2 usable devices is no error: out->skipped
 * says so and nothing runs. Each size's sums are checked (device d sends data x (d + 1)
 * whose sums are exact in any order; the sums are cleared to NaN before the checked run
 * and read back whole), so a link that corrupts data, a part
 * summed twice or one left out fails here rather than in training. A size whose
 * all-reduces have not finished timeout seconds after they started is given up (the
 * communicators aborted), as is every run after a failure.
 * Errors: RN_ENOTSUP (no GPU build), RN_EINVAL (timeout not > 0), RN_EGPU (NCCL or the
 * runtime missing, a call failed, the sums wrong, the timeout: the message names the call
 * or the device). ncclCommInitAll blocks and takes no timeout: a machine whose GPUs
 * cannot reach each other may hang there (NCCL_DEBUG=INFO shows where). */
int rn_gpuinfo_nccl(const rn_gpuinfo *g, double timeout, rn_gpunccl *out);

/* Print --nccl's results: a table, or one JSON object on one line:
 *   {"schema": "rn-gpuinfo-nccl/1", "nccl": str|null, "devices": [int],
 *    "verified": bool, "skipped": str|null,
 *    "results": [{"bytes": int, "time_us": num, "algbw": num, "busbw": num}]}
 * Errors: RN_EIO. */
int rn_gpuinfo_write_nccl(const rn_gpunccl *b, int json, FILE *f);

#endif
