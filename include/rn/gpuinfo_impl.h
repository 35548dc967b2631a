/* rn/gpuinfo_impl.h: internals shared by the files of the gpuinfo module and nothing else:
 * lib/gpuinfo.c (probing and diagnosis), lib/gpuinfo_report.c (text, JSON and --watch
 * output) and lib/gpuinfo_bench.c (--bench). Tools include rn/gpuinfo.h. */
#ifndef RN_GPUINFO_IMPL_H
#define RN_GPUINFO_IMPL_H

#include <stddef.h>

#include "rn/gpuinfo.h"

/* dlsym `name` from library l into the typed function pointer at fnp (POSIX guarantees
 * the two are interchangeable). Returns 1 when found; 0, with *fnp NULL, when l is not
 * loaded or lacks it. */
int rn_gpuinfo_sym(const rn_gpulib *l, const char *name, void *fnp);

/* A version number as text in buf (cap bytes), "" when v <= 0 (unknown):
 * cuda  CUDA's 1000 * major + 10 * minor, 13000 -> "13.0";
 * cudnn cuDNN 9's 10000 * major + 100 * minor + patch (90300 -> "9.3.0"), cuDNN 8's
 *       1000 * major + 100 * minor + patch;
 * nccl  NCCL >= 2.9's 10000 * major + 100 * minor + patch (22809 -> "2.28.9"), older
 *       NCCL's 1000 * major + 100 * minor + patch;
 * xyz   10000 * major + 100 * minor + patch (cuBLAS, 130100 -> "13.1.0"). */
void rn_gpuinfo_cuda_ver(char *buf, size_t cap, int v);
void rn_gpuinfo_cudnn_ver(char *buf, size_t cap, int v);
void rn_gpuinfo_nccl_ver(char *buf, size_t cap, int v);
void rn_gpuinfo_xyz_ver(char *buf, size_t cap, int v);

#endif
