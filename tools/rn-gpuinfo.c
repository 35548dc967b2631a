/* rn-gpuinfo: the GPU stack as rn will load it, live monitoring, preflight check, quick bench. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/cli.h"
#include "rn/err.h"
#include "rn/gpuinfo.h"

#ifndef RN_VERSION
#define RN_VERSION "unknown"
#endif

/* --watch's longest interval and --timeout's longest wait: a day; longer is surely a typo */
#define MAX_SECONDS 86400.0
#define DEFAULT_NCCL_TIMEOUT 60.0

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: rn-gpuinfo [--json] [--check]\n"
               "       rn-gpuinfo --watch SECONDS [--count N] [--device N] [--json]\n"
               "       rn-gpuinfo --bench [--device N] [--json]\n"
               "       rn-gpuinfo --nccl [--timeout SECONDS] [--json]\n"
               "\n"
               "Report the NVIDIA stack exactly as rn loads it at run time: driver (and the highest\n"
               "CUDA it supports), CUDA runtime, cuBLAS, cuDNN and NCCL with the path each was\n"
               "loaded from, every device (memory, clocks, temperature, power, utilisation, ECC,\n"
               "throttle reasons, PCIe, peer access), and a verdict with the fix for what is wrong.\n"
               "\n"
               "  -j, --json             the report as one JSON object (schema rn-gpuinfo/1); with\n"
               "                         --watch one object per device per sample, with --bench one\n"
               "                         object per device\n"
               "  -c, --check            preflight: print only the verdict (one line) and exit with it\n"
               "  -w, --watch SECONDS    one line per device every SECONDS (e.g. 1 or 0.5) from NVML,\n"
               "                         until interrupted\n"
               "  -n, --count N          with --watch: stop after N samples\n"
               "  -b, --bench            measure H2D/D2D bandwidth, cuBLAS GEMM (fp32, TF32, fp16,\n"
               "                         bf16) and a ResNet-50 cuDNN convolution against datasheet peaks\n"
               "  -N, --nccl             preflight of many-GPU training: an NCCL all-reduce across\n"
               "                         every usable GPU, 8 MiB to 256 MiB per GPU, each size's sums\n"
               "                         checked, with algorithm and bus bandwidth (GB/s, as\n"
               "                         nccl-tests); fewer than 2 GPUs: one line saying it was\n"
               "                         skipped, exit 0\n"
               "  -t, --timeout SECONDS  with --nccl: give up a size whose all-reduces have not\n"
               "                         finished after SECONDS (default 60): GPUs that cannot reach\n"
               "                         each other hang there rather than fail\n"
               "  -d, --device N         with --watch or --bench: only device N (or cuda:N)\n"
               "  -h, --help             this help\n"
               "  -V, --version          print the version\n"
               "\n"
               "Exit status (plain, --json and --check alike):\n"
               "  0  a usable GPU, NVIDIA driver, CUDA runtime, cuBLAS and cuDNN\n"
               "  1  runtime failure (a write error, a failed benchmark call, NVML missing for --watch)\n"
               "  2  bad usage\n"
               "  3  no usable NVIDIA driver is loaded\n"
               "  4  the driver is too old for this CUDA runtime\n"
               "  5  the driver is loaded but no usable CUDA device\n"
               "  6  cuDNN missing, not 9.x, built for another CUDA, or incomplete\n"
               "  7  this rn build has no GPU support (built with USE_CUDA=0)\n"
               "  8  the CUDA runtime or cuBLAS is missing or of another CUDA major\n"
               "--watch, --bench and --nccl exit 0 when they ran, or with 3-7 when there is nothing to run\n"
               "on; --nccl exits 1 when NCCL is missing or the all-reduce fails or times out.\n");
}

static int bad_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "rn-gpuinfo: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see rn-gpuinfo --help)\n");
    return 2;
}

/* The flags that only make sense together, checked once every flag is read. */
static int check_flags(double watch, int64_t count, int bench, int nccl, int check, int device, double timeout,
                       int nargs, char **args) {
    if (nargs) return rn_errorf(RN_EINVAL, "unexpected argument '%s': rn-gpuinfo takes no files", args[0]);
    if (count && !watch) return rn_errorf(RN_EINVAL, "--count only goes with --watch SECONDS");
    if (timeout > 0 && !nccl) return rn_errorf(RN_EINVAL, "--timeout only goes with --nccl");
    if ((watch > 0) + bench + nccl + check > 1)
        return rn_errorf(RN_EINVAL, "conflicting modes: pick one of --watch, --bench, --nccl and --check");
    if (device >= 0 && !watch && !bench) return rn_errorf(RN_EINVAL, "--device only goes with --watch or --bench");
    return RN_OK;
}

/* The first problem that stops devices from being listed at all: no driver, too old
 * (only with no device listed), no device, no GPU build. */
static const rn_gpuproblem *device_problem(const rn_gpuinfo *g) {
    for (int i = 0; i < g->nproblems; i++) {
        int c = g->problem[i].code;
        if (c == RN_GPUINFO_NO_DRIVER || c == RN_GPUINFO_NO_DEVICE || c == RN_GPUINFO_DRIVER_TOO_OLD)
            return &g->problem[i];
    }
    return NULL;
}

static void diagnosis(const rn_gpuproblem *p) {
    fprintf(stderr, "rn-gpuinfo: %s", p->message);
    if (p->fix[0]) fprintf(stderr, " (%s)", p->fix);
    fputc('\n', stderr);
}

static int finish(int status) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "rn-gpuinfo: writing stdout: %s\n", strerror(errno ? errno : EIO));
        return 1;
    }
    return status;
}

/* --bench and --nccl need a CUDA build and a device: the exit status when they have none
 * (its diagnosis printed), else 0. dp: the first device's problem, or NULL. */
static int nothing_to_measure(const rn_gpuinfo *g, const rn_gpuproblem *dp, const char *flag) {
    if (!g->built_with_cuda) {
        diagnosis(&g->problem[0]);
        return RN_GPUINFO_NO_BUILD_GPU;
    }
    if (g->ndev == 0 || (dp && dp->code == RN_GPUINFO_DRIVER_TOO_OLD)) {
        if (dp) diagnosis(dp);
        else fprintf(stderr, "rn-gpuinfo: %s: no CUDA device\n", flag);
        return dp ? dp->code : RN_GPUINFO_NO_DEVICE;
    }
    return 0;
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
                                         {"check", no_argument, NULL, 'c'},
                                         {"watch", required_argument, NULL, 'w'},
                                         {"count", required_argument, NULL, 'n'},
                                         {"bench", no_argument, NULL, 'b'},
                                         {"nccl", no_argument, NULL, 'N'},
                                         {"timeout", required_argument, NULL, 't'},
                                         {"device", required_argument, NULL, 'd'},
                                         {"help", no_argument, NULL, 'h'},
                                         {"version", no_argument, NULL, 'V'},
                                         {NULL, 0, NULL, 0}};
    int json = 0, check = 0, bench = 0, nccl = 0, device = -1, c;
    double watch = 0, timeout = 0;
    int64_t count = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":jcw:n:bNt:d:hV", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'c': check = 1; break;
        case 'b': bench = 1; break;
        case 'N': nccl = 1; break;
        case 'w':
            if (rn_cli_float("--watch", optarg, 0, MAX_SECONDS, &watch) != RN_OK)
                return bad_usage("%s", rn_last_error());
            if (watch == 0)
                return bad_usage("--watch: '%s' is no interval: want more than 0 seconds, e.g. 1 or 0.5", optarg);
            break;
        case 't':
            if (rn_cli_float("--timeout", optarg, 0, MAX_SECONDS, &timeout) != RN_OK)
                return bad_usage("%s", rn_last_error());
            if (timeout == 0) return bad_usage("--timeout: '%s': want more than 0 seconds, e.g. 60", optarg);
            break;
        case 'n':
            if (rn_cli_i64("--count", optarg, 1, LONG_MAX, &count) != RN_OK) return bad_usage("%s", rn_last_error());
            break;
        case 'd':
            /* N or cuda:N */
            if (rn_cli_int("--device", strncmp(optarg, "cuda:", 5) == 0 ? optarg + 5 : optarg, 0, 1023, &device))
                return bad_usage("--device: '%s' is not a device index such as 0 or cuda:1", optarg);
            break;
        case 'h': usage(stdout); return finish(0);
        case 'V': printf("rn-gpuinfo %s\n", RN_VERSION); return finish(0);
        case ':': return bad_usage("%s needs a value", argv[optind - 1]);
        default: {
            char opt[3] = {'-', (char)optopt, 0};
            return bad_usage("unknown option %s", optopt ? opt : argv[optind - 1]);
        }
        }
    }
    if (check_flags(watch, count, bench, nccl, check, device, timeout, argc - optind, argv + optind) != RN_OK)
        return bad_usage("%s", rn_last_error());

    rn_gpuinfo *g = NULL;
    if (rn_gpuinfo_probe(&g) != RN_OK) {
        fprintf(stderr, "rn-gpuinfo: %s\n", rn_last_error());
        return 1;
    }
    int status = rn_gpuinfo_status(g), rc = 0;
    const rn_gpuproblem *dp = device_problem(g);

    if (watch > 0) {
        /* NVML monitoring needs no GPU support in rn itself, only a device to look at */
        if (g->ndev == 0) {
            if (dp)
                diagnosis(dp);
            else
                fprintf(stderr, "rn-gpuinfo: --watch: no CUDA device to watch\n");
            rc = dp ? dp->code : RN_GPUINFO_NO_DEVICE;
        } else {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_signal;
            sigemptyset(&sa.sa_mask);
            if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) {
                fprintf(stderr, "rn-gpuinfo: sigaction: %s\n", strerror(errno));
                rc = 1;
            } else if (rn_gpuinfo_watch(g, watch, (long)count, device, json, stdout, &stop_requested) != RN_OK) {
                fprintf(stderr, "rn-gpuinfo: --watch: %s\n", rn_last_error());
                rc = 1;
            }
        }
    } else if (bench) {
        if ((rc = nothing_to_measure(g, dp, "--bench"))) {
        } else if (device >= g->ndev) {
            fprintf(stderr, "rn-gpuinfo: --device %d: only %d device%s visible (0..%d)\n", device, g->ndev,
                    g->ndev == 1 ? "" : "s", g->ndev - 1);
            rc = 2;
        } else {
            if (status != RN_GPUINFO_USABLE) diagnosis(&g->problem[0]);
            for (int i = 0; i < g->ndev && !rc; i++) {
                if (device >= 0 && i != device) continue;
                rn_gpubench b;
                if (!json) fprintf(stderr, "rn-gpuinfo: benchmarking GPU %d (%s), a few seconds\n", i, g->dev[i].name);
                if (rn_gpuinfo_bench(g, i, &b) != RN_OK || rn_gpuinfo_write_bench(&b, json, stdout) != RN_OK) {
                    fprintf(stderr, "rn-gpuinfo: %s\n", rn_last_error());
                    rc = 1;
                }
                fflush(stdout);
            }
        }
    } else if (nccl) {
        rn_gpunccl r;
        if ((rc = nothing_to_measure(g, dp, "--nccl"))) {
        } else {
            if (!json && g->ndev > 1) fprintf(stderr, "rn-gpuinfo: --nccl: all-reduce across the GPUs, a few seconds\n");
            if (rn_gpuinfo_nccl(g, timeout > 0 ? timeout : DEFAULT_NCCL_TIMEOUT, &r) != RN_OK ||
                rn_gpuinfo_write_nccl(&r, json, stdout) != RN_OK) {
                fprintf(stderr, "rn-gpuinfo: %s\n", rn_last_error());
                rc = 1;
            }
        }
    } else {
        if (json) {
            if (rn_gpuinfo_write_json(g, stdout) != RN_OK) rc = 1;
        } else if (!check) {
            if (rn_gpuinfo_write_text(g, stdout) != RN_OK) rc = 1;
        }
        if (rc)
            fprintf(stderr, "rn-gpuinfo: %s\n", rn_last_error());
        else if (status != RN_GPUINFO_USABLE && (check || json))
            diagnosis(&g->problem[0]);
        else if (check) {
            int usable = 0;
            for (int i = 0; i < g->ndev; i++)
                usable += g->dev[i].usable;
            printf("rn-gpuinfo: ok: %d usable device%s (%s), driver %s (CUDA %s), runtime %s, cuBLAS %s, cuDNN %s\n",
                   usable, usable == 1 ? "" : "s", g->dev[0].name, g->driver_version, g->lib[RN_GPULIB_CUDA].version,
                   g->lib[RN_GPULIB_CUDART].version, g->lib[RN_GPULIB_CUBLAS].version, g->lib[RN_GPULIB_CUDNN].version);
        }
        if (!rc) rc = status;
    }
    rn_gpuinfo_free(g);
    return finish(rc);
}
