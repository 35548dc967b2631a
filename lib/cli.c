#include "rn/cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn/err.h"
#include "rn/fileio.h"

#define SIZE_EXAMPLE "a size like 8G, 512M or 1048576 (bytes)"

/* text as an optional sign and decimal digits: 1 and the sign and magnitude (*over when
 * the magnitude does not fit in 64 bits), or 0 when text is not written that way */
static int digits(const char *text, int *neg, uint64_t *mag, int *over) {
    const char *p = text;
    *neg = *p == '-';
    if (*p == '-' || *p == '+') p++;
    if (!*p) return 0;
    uint64_t m = 0;
    *over = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        unsigned d = (unsigned)(*p - '0');
        if (m > (UINT64_MAX - d) / 10)
            *over = 1;
        else
            m = m * 10 + d;
    }
    *mag = m;
    return 1;
}

static int not_whole(const char *flag, const char *text) {
    char *end;
    double v = strtod(text, &end);
    /* "1e3" or "16.0": a whole value, written otherwise */
    if (*text && !*end && !strpbrk(text, "xX") && isfinite(v) && v == floor(v) && fabs(v) < 1e15)
        return rn_errorf(RN_EINVAL, "%s: '%s' is not a whole number written in digits (%.0f)", flag, text, v);
    return rn_errorf(RN_EINVAL, "%s: '%s' is not a whole number", flag, text);
}

/* "1 to 8", "at least 1": what a flag wants, for the messages */
static const char *range_i(char *buf, size_t n, int64_t min, int64_t max) {
    if (max == INT64_MAX)
        snprintf(buf, n, "at least %lld", (long long)min);
    else
        snprintf(buf, n, "%lld to %lld", (long long)min, (long long)max);
    return buf;
}

int rn_cli_i64(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out) {
    int neg, over;
    uint64_t m;
    char want[64];
    if (!digits(text, &neg, &m, &over)) return not_whole(flag, text);
    range_i(want, sizeof want, min, max);
    if (neg && !(m == 0 && !over) && min >= 0)
        return rn_errorf(RN_EINVAL, "%s: '%s' is negative: want %s", flag, text, want);
    if (over || m > (uint64_t)INT64_MAX + neg)
        return rn_errorf(RN_EINVAL, "%s: '%s' is too %s: want %s", flag, text, neg ? "small" : "large", want);
    int64_t v = !neg ? (int64_t)m : m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
    if (v < min) return rn_errorf(RN_EINVAL, "%s: '%s' is too small: want %s", flag, text, want);
    if (v > max) return rn_errorf(RN_EINVAL, "%s: '%s' is too large: want %s", flag, text, want);
    *out = v;
    return RN_OK;
}

int rn_cli_int(const char *flag, const char *text, int min, int max, int *out) {
    int64_t v = 0;
    int rc = rn_cli_i64(flag, text, min, max, &v);
    if (rc == RN_OK) *out = (int)v;
    return rc;
}

int rn_cli_u64(const char *flag, const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    int neg, over;
    uint64_t m;
    char want[64];
    if (!digits(text, &neg, &m, &over)) return not_whole(flag, text);
    if (max == UINT64_MAX)
        snprintf(want, sizeof want, "at least %llu", (unsigned long long)min);
    else
        snprintf(want, sizeof want, "%llu to %llu", (unsigned long long)min, (unsigned long long)max);
    if (neg && !(m == 0 && !over)) return rn_errorf(RN_EINVAL, "%s: '%s' is negative: want %s", flag, text, want);
    if (over || m > max) return rn_errorf(RN_EINVAL, "%s: '%s' is too large: want %s", flag, text, want);
    if (m < min) return rn_errorf(RN_EINVAL, "%s: '%s' is too small: want %s", flag, text, want);
    *out = m;
    return RN_OK;
}

int rn_cli_float(const char *flag, const char *text, double min, double max, double *out) {
    char *end;
    /* strtod also reads hexadecimal ("0x1p3") and skips leading spaces: neither is a
     * decimal number as a user writes one */
    if (!*text || strchr("+-.0123456789", *text) == NULL || strpbrk(text, "xX"))
        return rn_errorf(RN_EINVAL, "%s: '%s' is not a number", flag, text);
    double v = strtod(text, &end);
    if (end == text || *end) return rn_errorf(RN_EINVAL, "%s: '%s' is not a number", flag, text);
    if (!isfinite(v)) return rn_errorf(RN_EINVAL, "%s: '%s' is not a finite number", flag, text);
    if (v < min || v > max) {
        const char *why = v > max ? "too large" : v < 0 && min >= 0 ? "negative" : "too small";
        return rn_errorf(RN_EINVAL, "%s: '%s' is %s: want %g to %g", flag, text, why, min, max);
    }
    *out = v;
    return RN_OK;
}

int rn_cli_size(const char *flag, const char *text, size_t min, size_t *out) {
    static const char units[] = "KMGT";
    char *end;
    if (!*text || strchr(".0123456789", *text) == NULL || strpbrk(text, "xX"))
        return rn_errorf(RN_EINVAL, "%s: '%s' is not " SIZE_EXAMPLE, flag, text);
    double v = strtod(text, &end);
    size_t nlen = (size_t)(end - text);
    int shift = 0;
    const char *u = *end ? strchr(units, *end >= 'a' && *end <= 'z' ? *end - 32 : *end) : NULL;
    if (u) {
        shift = 10 * (int)(u - units + 1);
        end++;
        if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0) end += strlen(end);
    } else if (strcmp(end, "B") == 0) {
        end++;
    }
    if (end == text || nlen == 0 || *end || !isfinite(v))
        return rn_errorf(RN_EINVAL, "%s: '%s' is not " SIZE_EXAMPLE, flag, text);
    uint64_t bytes;
    const uint64_t limit = SIZE_MAX / 2;
    char num[32];
    int neg, over;
    uint64_t m;
    if (strspn(text, "0123456789") == nlen && nlen < sizeof num) {
        /* whole numbers exactly, whatever their size: 2^53 + 1 bytes stays odd */
        memcpy(num, text, nlen);
        num[nlen] = 0;
        digits(num, &neg, &m, &over);
        bytes = over || m > limit >> shift ? UINT64_MAX : m << shift;
    } else {
        double b = ldexp(v, shift);
        bytes = b >= (double)limit ? UINT64_MAX : (uint64_t)b;
    }
    if (bytes < 1) return rn_errorf(RN_EINVAL, "%s: '%s' is not " SIZE_EXAMPLE, flag, text);
    if (bytes > limit)
        return rn_errorf(RN_EINVAL, "%s: '%s' is too large: want at most %llu bytes", flag, text,
                         (unsigned long long)limit);
    if (bytes < min) return rn_errorf(RN_EINVAL, "%s: '%s' is too small: want at least %zu bytes", flag, text, min);
    *out = (size_t)bytes;
    return RN_OK;
}

int rn_cli_list(const char *flag, const char *text, int min, int max, int *out, int cap, int *n) {
    /* the first pass checks every entry, the second stores them: *out is untouched on an error */
    for (int store = 0; store < 2; store++) {
        int k = 0;
        for (const char *s = text;; k++) {
            const char *comma = strchr(s, ',');
            size_t len = comma ? (size_t)(comma - s) : strlen(s);
            char item[32];
            int v;
            if (len == 0 || len >= sizeof item)
                return rn_errorf(RN_EINVAL, "%s: '%s' is not a list of whole numbers like 30,60,80", flag, text);
            if (k == cap) return rn_errorf(RN_EINVAL, "%s: '%s' has more than %d entries", flag, text, cap);
            memcpy(item, s, len);
            item[len] = 0;
            int rc = rn_cli_int(flag, item, min, max, &v);
            if (rc != RN_OK) {
                char why[512];
                snprintf(why, sizeof why, "%s", rn_last_error());
                return strchr(text, ',') ? rn_errorf(rc, "%s (in '%s')", why, text) : rc;
            }
            if (store) out[k] = v;
            if (!comma) break;
            s = comma + 1;
        }
        if (store) *n = k + 1;
    }
    return RN_OK;
}

int rn_cli_output(const char *tool, const char *path, FILE *notes) {
    int stale = 0;
    if (!path) return RN_OK;
    int rc = rn_output_check(path, &stale);
    if (stale && notes) fprintf(notes, "%s: removed %s.tmp, left by an interrupted run\n", tool, path);
    return rc;
}

/* "1" sets a flag; unset or empty leaves it; anything else is refused */
static int env_flag(const char *name, int *out) {
    const char *s = getenv(name);
    if (!s || !*s) return RN_OK;
    if (strcmp(s, "1") != 0 && strcmp(s, "0") != 0)
        return rn_errorf(RN_EINVAL, "%s='%s': expected 1 or 0", name, s);
    *out = s[0] == '1';
    return RN_OK;
}

/* one of two words: the second sets *out to 1, the first to 0 */
static int env_choice(const char *name, const char *off, const char *on, int *out) {
    const char *s = getenv(name);
    if (!s || !*s) return RN_OK;
    if (strcmp(s, on) == 0) *out = 1;
    else if (strcmp(s, off) == 0) *out = 0;
    else return rn_errorf(RN_EINVAL, "%s='%s': expected %s or %s", name, s, off, on);
    return RN_OK;
}

/* RN_CPU_GEMM: own (rn's kernel, widest form), avx2 or portable (narrower forms of it) or
 * openblas */
static int env_gemm(rn_backend_opts *o) {
    static const char *const names[] = {[RN_CPU_GEMM_OWN] = "own", [RN_CPU_GEMM_AVX2] = "avx2",
                                        [RN_CPU_GEMM_PORTABLE] = "portable", [RN_CPU_GEMM_OPENBLAS] = "openblas"};
    const char *s = getenv("RN_CPU_GEMM");
    if (!s || !*s) return RN_OK;
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (strcmp(s, names[i]) == 0) {
            o->cpu_gemm = i;
            return RN_OK;
        }
    return rn_errorf(RN_EINVAL, "RN_CPU_GEMM='%s': expected own (rn's kernel, the default), avx2 (rn's kernel "
                     "without AVX-512), portable (rn's kernel in C) or openblas", s);
}

/* RN_CPU_WINOGRAD: 0, 1 or 2 (rn_backend_opts.cpu_winograd) */
static int env_winograd(int *out) {
    const char *s = getenv("RN_CPU_WINOGRAD");
    if (!s || !*s) return RN_OK;
    if (strcmp(s, "0") != 0 && strcmp(s, "1") != 0 && strcmp(s, "2") != 0)
        return rn_errorf(RN_EINVAL, "RN_CPU_WINOGRAD='%s': expected 0 (off), 1 (F(4x4) and F(2x2), the default) "
                         "or 2 (F(2x2) only)", s);
    *out = s[0] - '0';
    return RN_OK;
}

static int env_count(const char *name) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    return *end == 0 && v > 0 && v < (1L << 30) ? (int)v : 0;
}

int rn_cli_launcher_world(void) {
    int w = env_count("OMPI_COMM_WORLD_SIZE");
    if (!w && getenv("PMIX_RANK")) w = env_count("SLURM_STEP_NUM_TASKS");
    if (!w) w = env_count("PMI_SIZE");
    return w ? w : 1;
}

int rn_cli_dist_threads(int threads, int lw) {
    if (threads > 0 || lw <= 1) return threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n / lw > 1 ? (int)(n / lw) : 1;
}

/* RN_CUDA_INJECT=KIND=STATUS[,KIND=STATUS...]: KIND find, bn or bn-bwd, STATUS a cuDNN
 * status code (3002 CUDNN_STATUS_NOT_SUPPORTED_SHAPE, 4004 ..._DEVICE_ALLOCATION_FAILED) */
static int env_inject(rn_backend_opts *o) {
    const char *s = getenv("RN_CUDA_INJECT");
    if (!s || !*s) return RN_OK;
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf)
        return rn_errorf(RN_EINVAL, "RN_CUDA_INJECT: longer than %zu characters", sizeof buf - 1);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '='), *end = NULL;
        long code = eq ? strtol(eq + 1, &end, 10) : 0;
        int *slot = NULL;
        if (eq) {
            *eq = 0;
            slot = strcmp(item, "find") == 0     ? &o->cuda_inject_find
                   : strcmp(item, "bn") == 0     ? &o->cuda_inject_bn
                   : strcmp(item, "bn-bwd") == 0 ? &o->cuda_inject_bn_bwd
                                                 : NULL;
        }
        if (!slot || end == eq + 1 || *end || code < 1 || code > 99999)
            return rn_errorf(RN_EINVAL, "RN_CUDA_INJECT='%s': expected KIND=STATUS[,...], KIND find, bn or bn-bwd, "
                             "STATUS a cuDNN status code (e.g. find=4004,bn=3002)", s);
        *slot = (int)code;
    }
    return RN_OK;
}

int rn_cli_backend_env(rn_backend_opts *o) {
    int rc = RN_OK;
    const char *s;
    if ((rc = env_flag("RN_SYNC", &o->sync_each_op)) != RN_OK) goto fail;
    if ((s = getenv("RN_CPU_MEMORY")) && *s && (rc = rn_cli_size("RN_CPU_MEMORY", s, 1, &o->cpu_memory)) != RN_OK)
        goto fail;
    if ((rc = env_winograd(&o->cpu_winograd)) != RN_OK) goto fail;
    if ((rc = env_gemm(o)) != RN_OK) goto fail;
    if ((rc = env_flag("RN_CUDA_TF32", &o->cuda_tf32)) != RN_OK) goto fail;
    if ((rc = env_flag("RN_CUDA_DETERMINISTIC", &o->cuda_deterministic)) != RN_OK) goto fail;
    if ((rc = env_choice("RN_CUDA_CONV_ALGO", "find", "heuristic", &o->cuda_conv_heuristic)) != RN_OK) goto fail;
    if ((rc = env_choice("RN_CUDA_BN", "own", "cudnn", &o->cuda_bn_cudnn)) != RN_OK) goto fail;
    if ((rc = env_choice("RN_CUDA_STEM", "pad", "plain", &o->cuda_stem_plain)) != RN_OK) goto fail;
    if ((rc = env_inject(o)) != RN_OK) goto fail;
    if ((s = getenv("RN_CUDA_WORKSPACE_MB")) && *s) {
        int64_t mb = 0;
        if ((rc = rn_cli_i64("RN_CUDA_WORKSPACE_MB", s, 0, (int64_t)1 << 30, &mb)) != RN_OK) goto fail;
        o->cuda_workspace = (size_t)mb << 20;
    }
    /* Find's choices are kept per user, as other tools keep theirs (XDG cache folder) */
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = 0;
    if ((s = getenv("RN_CUDA_ALGO_CACHE")) && *s)
        n = strcmp(s, "off") == 0 ? 0 : snprintf(o->cuda_algo_cache, sizeof o->cuda_algo_cache, "%s", s);
    else if (xdg && *xdg == '/')
        n = snprintf(o->cuda_algo_cache, sizeof o->cuda_algo_cache, "%s/rn/cudnn-algos.txt", xdg);
    else if (home && *home == '/')
        n = snprintf(o->cuda_algo_cache, sizeof o->cuda_algo_cache, "%s/.cache/rn/cudnn-algos.txt", home);
    if (n <= 0) o->cuda_algo_cache[0] = 0;
    if (n >= (int)sizeof o->cuda_algo_cache) {
        rc = rn_errorf(RN_EINVAL, "RN_CUDA_ALGO_CACHE: the path is longer than %zu bytes (set a shorter one, or off)",
                       sizeof o->cuda_algo_cache - 1);
        goto fail;
    }
fail:
    return rc;
}
