#include "rn/err.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Thread-local, like errno: the one piece of per-thread state librn keeps, so that
 * a status code can travel up the stack while the message stays readable. */
static _Thread_local char msg[2048];

int rn_errorf(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return code;
}

int rn_error_context(int code, const char *fmt, ...) {
    char prefix[512], old[sizeof msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, msg, sizeof msg);
    snprintf(msg, sizeof msg, "%.500s: %.1500s", prefix, old[0] ? old : rn_strerror(code));
    return code;
}

const char *rn_last_error(void) { return msg; }

const char *rn_strerror(int code) {
    switch (code) {
    case RN_OK: return "success";
    case RN_EINVAL: return "invalid argument";
    case RN_EIO: return "input/output error";
    case RN_ECORRUPT: return "corrupt or invalid file";
    case RN_ENOMEM: return "out of memory";
    case RN_EGPU: return "GPU error";
    case RN_EDATA: return "dataset error";
    case RN_ENOTSUP: return "not supported by this build";
    case RN_EINTR: return "interrupted";
    case RN_ENUMERIC: return "non-finite values";
    default: return "unknown error";
    }
}

void rn_advise_huge(void *p, size_t n) {
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (!p || n < RN_HUGE_MIN) return;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), b = ((uintptr_t)p + n) & ~(huge - 1);
    /* the result is not checked: advice (EINVAL where the kernel has no THP) */
    if (b > a) (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
}

void *rn_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) rn_errorf(RN_ENOMEM, "out of memory allocating %zu bytes", n);
    rn_advise_huge(p, n);
    return p;
}

void *rn_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) rn_errorf(RN_ENOMEM, "out of memory allocating %zu x %zu bytes", n, size);
    else if (size && n <= SIZE_MAX / size) rn_advise_huge(p, n * size);
    return p;
}
