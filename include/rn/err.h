/* rn/err.h: status codes and error messages for librn.
 *
 * Every librn function that can fail returns an int status: RN_OK (0) or one of the
 * negative RN_E* codes below. The failing function records a human-readable message
 * (what failed, where, what to do) with rn_errorf(); the caller reads it with
 * rn_last_error(). The message lives in thread-local storage, like errno, so threads
 * never see each other's messages. librn never prints and never exits. */
#ifndef RN_ERR_H
#define RN_ERR_H

#include <stddef.h>

enum {
    RN_OK = 0,
    RN_EINVAL = -1,   /* bad argument or bad usage */
    RN_EIO = -2,      /* file system error */
    RN_ECORRUPT = -3, /* a file failed validation (truncated, checksum, shape...) */
    RN_ENOMEM = -4,   /* host allocation failed */
    RN_EGPU = -5,     /* CUDA/cuDNN/cuBLAS error, or no usable GPU */
    RN_EDATA = -6,    /* dataset problem (LMDB, decoding, labels) */
    RN_ENOTSUP = -7,  /* not supported by this build */
    RN_EINTR = -8,    /* interrupted by a signal */
    RN_ENUMERIC = -9, /* non-finite loss or values */
};

/* Record a printf-style message for the current thread and return code. */
int rn_errorf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepend "prefix: " to the current thread's message (adds context on the way up)
 * and return code. */
int rn_error_context(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). */
const char *rn_last_error(void);

/* A short fixed description of a status code. */
const char *rn_strerror(int code);

/* Allocation helpers that record RN_ENOMEM with the size asked for. A block of
 * RN_HUGE_MIN bytes or more is given rn_advise_huge. */
void *rn_malloc(size_t n);
void *rn_calloc(size_t n, size_t size);

/* Asks the kernel to back the 2 MiB-aligned part of [p, p + n) with transparent huge
 * pages (madvise MADV_HUGEPAGE), for memory not yet touched: one page fault per 2 MiB
 * when it first is, not one per 4 KiB (reading a 134 MB checkpoint took 65,000 faults).
 * Advice only: where THP is off, or n is under RN_HUGE_MIN, nothing changes. */
#define RN_HUGE_MIN ((size_t)4 << 20)
void rn_advise_huge(void *p, size_t n);

#endif
