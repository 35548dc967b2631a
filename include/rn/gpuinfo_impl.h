/* rn/gpuinfo_impl.h: internals shared by the files of the gpuinfo module and nothing else:
 * lib/gpuinfo.c (probing and diagnosis), lib/gpuinfo_report.c (the text report, JSON,
 * --watch samples and the --bench table) and lib/gpuinfo_bench.c (--bench's measurements).
 * Tools include rn/gpuinfo.h. */
#ifndef RN_GPUINFO_IMPL_H
#define RN_GPUINFO_IMPL_H

#include <stddef.h>

#include "rn/gpuinfo.h"

/* dlsym `name` from library l into the typed function pointer at fnp (POSIX guarantees
 * the two are interchangeable). Returns 1 when found; 0, with *fnp NULL, when l is not
 * loaded or lacks it. */
int rn_gpuinfo_sym(const rn_gpulib *l, const char *name, void *fnp);

/* CUDA's version number as text in buf (cap bytes): 1000 * major + 10 * minor,
 * 13000 -> "13.0"; "" when v <= 0 (unknown). */
void rn_gpuinfo_cuda_ver(char *buf, size_t cap, int v);

/* A library's version number as "major.minor.patch" in buf (cap bytes): v is
 * 10000 * major + 100 * minor + patch from wide_from on, 1000 * major + 100 * minor + patch
 * below it (0: always the former, as cuBLAS); "" when v <= 0 (unknown). */
void rn_gpuinfo_lib_ver(char *buf, size_t cap, int v, int wide_from);
/* The first cuDNN (9.0.0) and NCCL (2.9.0) version numbers in the wide encoding. */
enum { RN_GPUINFO_CUDNN_WIDE = 90000, RN_GPUINFO_NCCL_WIDE = 20900 };

/* A CUDA runtime call through the dlsym'ed table `api` (its error_string may be NULL),
 * in a function with `int rc` and a `fail:` label: on an error, rc = RN_EGPU naming the
 * call, file and line, and goto fail. */
#define RN_GPUINFO_RT(call)                                                                                     \
    do {                                                                                                        \
        int e_ = (call);                                                                                        \
        if (e_ != 0) {                                                                                          \
            rc = rn_errorf(RN_EGPU, "%s:%d: %s: %s (error %d)", __FILE__, __LINE__, #call,                      \
                           api.error_string ? api.error_string(e_) : "CUDA runtime error", e_);                 \
            goto fail;                                                                                          \
        }                                                                                                       \
    } while (0)

#endif
