/* gpuinfo_report: what rn/gpuinfo.h's probe and bench found, as the human report, the
 * JSON object, --watch samples and the --bench table. */
#include "rn/gpuinfo_impl.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "rn/err.h"
#include "rn/json.h"

#ifndef RN_VERSION
#define RN_VERSION "unknown"
#endif

static const char *const throttle_names[] = {
    "gpu_idle",     "applications_clocks", "sw_power_cap",        "hw_slowdown",
    "sync_boost",   "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
    "display_clock"};

static int stream_status(FILE *f, const char *what) {
    if (ferror(f)) return rn_errorf(RN_EIO, "writing %s: %s", what, strerror(errno ? errno : EIO));
    return RN_OK;
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
    rn_json_count(f, d->mem_total);
    fputs(",\"free\":", f);
    rn_json_count(f, d->mem_free);
    fputs(",\"used\":", f);
    rn_json_count(f, d->mem_used);
    fputs("},\"clocks_mhz\":{\"sm\":", f);
    rn_json_count(f, d->sm_mhz);
    fputs(",\"memory\":", f);
    rn_json_count(f, d->mem_mhz);
    fputs(",\"sm_max\":", f);
    rn_json_count(f, d->sm_max_mhz);
    fputs(",\"memory_max\":", f);
    rn_json_count(f, d->mem_max_mhz);
    fputs("},\"temperature_c\":", f);
    rn_json_count(f, d->temperature_c);
    fputs(",\"power_w\":{\"draw\":", f);
    rn_json_reading(f, d->power_w);
    fputs(",\"limit\":", f);
    rn_json_reading(f, d->power_limit_w);
    fputs("},\"utilization_pct\":{\"gpu\":", f);
    rn_json_count(f, d->util_gpu);
    fputs(",\"memory\":", f);
    rn_json_count(f, d->util_mem);
    fputs("},\"throttle_reasons\":", f);
    throttle_json(f, d->throttle);
}

static void problem_json(FILE *f, int code, const char *msg, const char *fix) {
    fprintf(f, "{\"code\":%d,\"name\":\"%s\",\"message\":", code, rn_gpuinfo_status_name(code));
    rn_json_string_or_null(f, msg);
    fputs(",\"fix\":", f);
    rn_json_string_or_null(f, fix);
    fputc('}', f);
}

int rn_gpuinfo_write_json(const rn_gpuinfo *g, FILE *f) {
    char b[4][16];
    rn_gpuinfo_cuda_ver(b[0], 16, g->built_cudart);
    rn_gpuinfo_lib_ver(b[1], 16, g->built_cublas, 0);
    rn_gpuinfo_lib_ver(b[2], 16, g->built_cudnn, RN_GPUINFO_CUDNN_WIDE);
    rn_gpuinfo_lib_ver(b[3], 16, g->built_nccl, RN_GPUINFO_NCCL_WIDE);
    fprintf(f, "{\"schema\":\"rn-gpuinfo/1\",\"rn_version\":");
    rn_json_string_or_null(f, RN_VERSION);
    fprintf(f, ",\"build\":{\"cuda\":%s,\"cudart\":", g->built_with_cuda ? "true" : "false");
    rn_json_string_or_null(f, b[0]);
    fputs(",\"cublas\":", f);
    rn_json_string_or_null(f, b[1]);
    fputs(",\"cudnn\":", f);
    rn_json_string_or_null(f, b[2]);
    fputs(",\"nccl\":", f);
    rn_json_string_or_null(f, b[3]);
    fputs("},\"driver\":{\"version\":", f);
    rn_json_string_or_null(f, g->driver_version);
    fputs(",\"cuda\":", f);
    rn_json_string_or_null(f, g->lib[RN_GPULIB_CUDA].version);
    fprintf(f, ",\"kernel_module\":%s,\"init\":", g->kernel_module ? "true" : "false");
    rn_json_string_or_null(f, g->cu_init >= 0 ? g->cu_init_name : NULL);
    fputs("},\"libraries\":{", f);
    for (int i = 0; i < RN_GPULIB_COUNT; i++) {
        const rn_gpulib *l = &g->lib[i];
        fprintf(f, "%s\"%s\":{\"soname\":", i ? "," : "", l->key);
        rn_json_string_or_null(f, l->soname);
        fprintf(f, ",\"loaded\":%s,\"path\":", l->loaded ? "true" : "false");
        rn_json_string_or_null(f, l->path);
        fputs(",\"realpath\":", f);
        rn_json_string_or_null(f, l->realpath);
        fputs(",\"version\":", f);
        rn_json_string_or_null(f, l->version);
        fputs(",\"error\":", f);
        rn_json_string_or_null(f, l->error);
        if (i == RN_GPULIB_CUDNN || i == RN_GPULIB_CUBLAS) {
            fputs(",\"cuda\":", f);
            rn_json_string_or_null(f, l->built_for);
        }
        fputc('}', f);
    }
    fputs("},\"devices\":[", f);
    for (int i = 0; i < g->ndev; i++) {
        const rn_gpudev *d = &g->dev[i];
        fprintf(f, "%s{\"index\":%d,\"name\":", i ? "," : "", d->index);
        rn_json_string_or_null(f, d->name);
        fputs(",\"uuid\":", f);
        rn_json_string_or_null(f, d->uuid);
        fputs(",\"pci_bus_id\":", f);
        rn_json_string_or_null(f, d->pci_bus_id);
        fputs(",\"compute_capability\":", f);
        if (d->cc_major >= 0)
            fprintf(f, "\"%d.%d\"", d->cc_major, d->cc_minor);
        else
            fputs("null", f);
        fputs(",\"multiprocessors\":", f);
        rn_json_count(f, d->sms);
        fputs(",\"compute_mode\":", f);
        rn_json_string_or_null(f, mode_name(d->compute_mode));
        fprintf(f, ",\"usable\":%s,\"unusable_reason\":", d->usable ? "true" : "false");
        rn_json_string_or_null(f, d->unusable_reason);
        fputc(',', f);
        live_json(f, d);
        fputs(",\"ecc\":{\"enabled\":", f);
        fputs(d->ecc_enabled < 0 ? "null" : d->ecc_enabled ? "true" : "false", f);
        fputs(",\"volatile_corrected\":", f);
        rn_json_count(f, d->ecc_vol_corr);
        fputs(",\"volatile_uncorrected\":", f);
        rn_json_count(f, d->ecc_vol_uncorr);
        fputs(",\"aggregate_corrected\":", f);
        rn_json_count(f, d->ecc_agg_corr);
        fputs(",\"aggregate_uncorrected\":", f);
        rn_json_count(f, d->ecc_agg_uncorr);
        fputs("},\"pcie\":{\"gen\":", f);
        rn_json_count(f, d->pcie_gen);
        fputs(",\"width\":", f);
        rn_json_count(f, d->pcie_width);
        fputs(",\"gen_max\":", f);
        rn_json_count(f, d->pcie_gen_max);
        fputs(",\"width_max\":", f);
        rn_json_count(f, d->pcie_width_max);
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
        rn_gpuinfo_cuda_ver(v[0], 16, g->built_cudart);
        rn_gpuinfo_lib_ver(v[1], 16, g->built_cublas, 0);
        rn_gpuinfo_lib_ver(v[2], 16, g->built_cudnn, RN_GPUINFO_CUDNN_WIDE);
        rn_gpuinfo_lib_ver(v[3], 16, g->built_nccl, RN_GPUINFO_NCCL_WIDE);
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
        rn_json_string_or_null(f, d->name);
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

int rn_gpuinfo_write_bench(const rn_gpubench *b, int json, FILE *f) {
    if (json) {
        fprintf(f, "{\"schema\":\"rn-gpuinfo-bench/1\",\"index\":%d,\"name\":", b->index);
        rn_json_string_or_null(f, b->name);
        fputs(",\"peak_source\":", f);
        rn_json_string_or_null(f, b->peak_source);
        fputs(",\"results\":[", f);
        for (int i = 0; i < b->n; i++) {
            const rn_gpubench_result *r = &b->r[i];
            fprintf(f, "%s{\"test\":\"%s\",\"what\":", i ? "," : "", r->test);
            rn_json_string_or_null(f, r->what);
            fputs(",\"value\":", f);
            rn_json_reading(f, r->value);
            fprintf(f, ",\"unit\":\"%s\",\"peak\":", r->unit);
            rn_json_reading(f, r->peak);
            fputs(",\"fraction\":", f);
            rn_json_reading(f, r->value >= 0 && r->peak > 0 ? r->value / r->peak : -1);
            fputs(",\"skipped\":", f);
            rn_json_string_or_null(f, r->skipped);
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

int rn_gpuinfo_write_nccl(const rn_gpunccl *b, int json, FILE *f) {
    if (json) {
        fputs("{\"schema\":\"rn-gpuinfo-nccl/1\",\"nccl\":", f);
        rn_json_string_or_null(f, b->version);
        fputs(",\"devices\":[", f);
        for (int i = 0; i < b->ndev; i++)
            fprintf(f, "%s%d", i ? "," : "", b->dev[i]);
        fprintf(f, "],\"verified\":%s,\"skipped\":", b->verified ? "true" : "false");
        rn_json_string_or_null(f, b->skipped);
        fputs(",\"results\":[", f);
        for (int i = 0; i < b->n; i++) {
            const rn_gpunccl_result *r = &b->r[i];
            fprintf(f, "%s{\"bytes\":%lld,\"time_us\":", i ? "," : "", r->bytes);
            rn_json_reading(f, r->us);
            fputs(",\"algbw\":", f);
            rn_json_reading(f, r->algbw);
            fputs(",\"busbw\":", f);
            rn_json_reading(f, r->busbw);
            fputc('}', f);
        }
        fputs("]}\n", f);
    } else if (b->skipped[0]) {
        fprintf(f, "rn-gpuinfo: --nccl: %s; skipped\n", b->skipped);
    } else {
        fprintf(f, "NCCL %s all-reduce (fp32 sum, out of place) across %d GPUs (", b->version[0] ? b->version : "?",
                b->ndev);
        for (int i = 0; i < b->ndev; i++)
            fprintf(f, "%s%d", i ? "," : "", b->dev[i]);
        fprintf(f, "), sums %s\n", b->verified ? "checked exact" : "not checked");
        fprintf(f, "  %10s %12s %12s %12s\n", "size", "time (us)", "algbw GB/s", "busbw GB/s");
        for (int i = 0; i < b->n; i++) {
            const rn_gpunccl_result *r = &b->r[i];
            fprintf(f, "  %6lld MiB %12.1f %12.2f %12.2f\n", r->bytes >> 20, r->us, r->algbw, r->busbw);
        }
    }
    return stream_status(f, "the all-reduce results");
}
