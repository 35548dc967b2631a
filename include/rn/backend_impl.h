/* rn/backend_impl.h: for backend implementers only (lib/backend_*.c, lib/backend_*.cu).
 * Model code includes rn/backend.h and never this.
 *
 * A backend fills one rn_backend_ops table. lib/backend.c validates every argument
 * (shapes, NULLs, dtype, workspace size) before calling through it, so an
 * implementation may assume well-formed descriptors, non-NULL required pointers, a
 * supported dtype and be->ws holding at least the bytes its own workspace query said.
 * Each entry returns RN_OK or an rn_errorf code, like the public functions. */
#ifndef RN_BACKEND_IMPL_H
#define RN_BACKEND_IMPL_H

#include "rn/backend.h"
#include "rn/philox.h" /* RN_HOST_DEVICE */

/* rn_top1_count's target for a row whose label is a and whose rolled partner's is p,
 * written once for the CPU loop and the CUDA kernel */
static inline RN_HOST_DEVICE int rn_top1_want(int target, int a, int p) {
    return target == RN_TOP1_LABEL ? a : target == RN_TOP1_ROLLED ? p : target == RN_TOP1_SMALLER ? (a < p ? a : p) : -1;
}

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rn_backend_ops {
    const char *kind;    /* "cpu", "cuda" */
    int is_host;         /* pointers are host memory */
    unsigned dtypes;     /* bit (1u << dtype) for each supported compute dtype */

    void (*destroy)(rn_backend *be);    /* frees be->impl, not be or be->ws */
    int (*alloc)(rn_backend *be, size_t bytes, void **out);
    void (*free)(rn_backend *be, void *p);
    int (*upload)(rn_backend *be, void *dst, const void *src, size_t bytes);
    int (*put)(rn_backend *be, void *dst, const void *src, size_t bytes); /* NULL: upload */
    int (*download)(rn_backend *be, void *dst, const void *src, size_t bytes);
    int (*copy)(rn_backend *be, void *dst, const void *src, size_t bytes);
    int (*zero)(rn_backend *be, void *dst, size_t bytes);
    int (*sync)(rn_backend *be);
    int (*mem_info)(rn_backend *be, size_t *free_bytes, size_t *total_bytes);
    size_t ws_limit;     /* rn_backend_workspace_limit (CUDA: set per context) */
    int (*host_alloc)(rn_backend *be, size_t bytes, void **out);
    void (*host_free)(rn_backend *be, void *p);
    int (*upload_async)(rn_backend *be, const rn_upload_part *parts, int n); /* n >= 1, none empty */
    int (*upload_wait)(rn_backend *be);

    size_t (*conv_workspace)(rn_backend *be, const rn_conv_desc *d);
    /* optional: the algorithm d's direction dir (RN_CONV_*) runs with, NULL if none chosen */
    const char *(*conv_algo)(rn_backend *be, const rn_conv_desc *d, int dir);
    int (*conv_fwd)(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w, void *y);
    /* rn_conv_bias_fwd; NULL where the backend has none (rn_backend_has_conv_bias) */
    int (*conv_bias_fwd)(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w,
                         const float *bias, const void *residual, int relu, int packed, void *y);
    /* rn_conv_bias_packed_bytes and rn_conv_bias_pack; present with conv_bias_fwd */
    size_t (*conv_bias_packed_bytes)(rn_backend *be, const rn_conv_desc *d);
    int (*conv_bias_pack)(rn_backend *be, const rn_conv_desc *d, const void *w, void *packed);
    int (*conv_bwd_data)(rn_backend *be, const rn_conv_desc *d, const void *dy, const void *w,
                         void *dx, int accumulate);
    int (*conv_bwd_filter)(rn_backend *be, const rn_conv_desc *d, const void *x,
                           const void *dy, void *dw, int accumulate);

    size_t (*bn_workspace)(rn_backend *be, const rn_bn_desc *d);
    size_t (*bn_reserve_size)(rn_backend *be, const rn_bn_desc *d);
    int (*bn_fwd_train)(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma,
                        const float *beta, const void *residual, void *y, float *save_mean,
                        float *save_invstd, float *running_mean, float *running_var,
                        void *reserve);
    int (*bn_fwd_infer)(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma,
                        const float *beta, const float *running_mean,
                        const float *running_var, const void *residual, void *y);
    int (*bn_bwd)(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y,
                  const void *dy, const float *gamma, const float *save_mean,
                  const float *save_invstd, void *dx, float *dgamma, float *dbeta,
                  void *dres, void *reserve, int accumulate);
    /* rn_bn_bwd_frozen: the statistics are the running mean and variance, constants, so
     * dx has no batch-statistics terms: dx = a*dz */
    int (*bn_bwd_frozen)(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y,
                         const void *dy, const float *gamma, const float *running_mean,
                         const float *running_var, void *dx, float *dgamma, float *dbeta,
                         void *dres, int accumulate);

    int (*add)(rn_backend *be, int dtype, int64_t n, const void *a, const void *b, void *y,
               int relu);
    int (*relu_fwd)(rn_backend *be, int dtype, int64_t n, const void *x, void *y);
    int (*relu_bwd)(rn_backend *be, int dtype, int64_t n, const void *y, const void *dy,
                    void *dx);
    int (*input_normalize)(rn_backend *be, int dtype, int64_t m, int c, const uint8_t *x,
                           const float *mean, const float *std, void *y);
    int (*input_erase)(rn_backend *be, int dtype, int h, int w, int c, int x, int y0, int bw, int bh,
                       int random, uint64_t key, int64_t epoch, uint32_t rec, void *y);

    int (*input_mix)(rn_backend *be, int dtype, const rn_mix_desc *d, int n, int h, int w, int c, const uint8_t *x,
                     const float *mean, const float *std, const rn_erase *erase, uint64_t erase_key,
                     int64_t erase_epoch, void *y);

    int (*maxpool_fwd)(rn_backend *be, const rn_pool_desc *d, const void *x, void *y);
    int (*maxpool_bwd)(rn_backend *be, const rn_pool_desc *d, const void *x, const void *y,
                       const void *dy, void *dx);
    int (*avgpool_global_fwd)(rn_backend *be, int dtype, int n, int hw, int c, const void *x,
                              void *y);
    int (*avgpool_global_bwd)(rn_backend *be, int dtype, int n, int hw, int c,
                              const void *dy, void *dx);

    size_t (*fc_workspace)(rn_backend *be, const rn_fc_desc *d); /* NULL: none */
    int (*fc_fwd)(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
                  const void *b, void *y);
    int (*fc_bwd)(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
                  const void *dy, void *dx, void *dw, void *db, int accumulate);
    int (*softmax_xent)(rn_backend *be, const rn_xent_desc *d, const void *logits,
                        const int32_t *labels, float *loss, void *dlogits);
    /* target_at non-NULL: the target is read from there (rn_top1_count_at), not target */
    int (*top1_count)(rn_backend *be, int n, int classes, const float *logits, const int32_t *labels, int target,
                      const int32_t *target_at, int32_t *hits);
    /* copy NULL: rn_sgd_update; else also the compute copy in d->dtype */
    int (*sgd_update)(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p,
                      const float *grad, float *buf, void *copy);
    /* copy NULL: rn_lars_update; else also the compute copy in d->dtype; workspace:
     * rn_lars_workspace(n) bytes at be->ws */
    int (*lars_update)(rn_backend *be, const rn_lars_desc *d, int64_t n, float *p,
                       const float *grad, float *buf, void *copy);
    int (*cast)(rn_backend *be, int src_dtype, int dst_dtype, int64_t n, const void *x,
                void *y, int accumulate);
    int (*nonfinite)(rn_backend *be, int64_t n, const float *x, int32_t *flag);
    int (*ema_update)(rn_backend *be, int64_t n, const float *x, float *avg, float keep, float take);
    /* workspace: rn_sumsq_workspace(n) bytes at be->ws */
    int (*sumsq)(rn_backend *be, int64_t n, const float *x, double *out);

    /* collectives across processes (rn/dist.h); NULL: the backend has none (host
     * memory: rn/dist.h uses MPI) */
    int (*coll_id)(rn_backend *be, void *id, size_t cap, size_t *len);
    int (*coll_init)(rn_backend *be, int rank, int world, const void *id, size_t len, double timeout_s);
    int (*coll_sum)(rn_backend *be, float *x, float *scratch, int64_t n);

    /* optional (NULL: none): the device's PCI bus id, "0000:3B:00.0" (rn_backend_pci_bus_id) */
    int (*pci_bus_id)(rn_backend *be, char *buf, size_t cap);
    /* optional (NULL: the profile times with the host clock around syncs): timestamps on
     * the compute stream (rn_backend_mark, rn_backend_marks_read) */
    int (*mark)(rn_backend *be, int64_t i);
    int (*marks_read)(rn_backend *be, int64_t n, double *sec);
    /* optional, with marks: the async uploads since mark 0 on the copy stream
     * (rn_backend_copy_spans) */
    int (*copy_spans)(rn_backend *be, int64_t cap, double *t0, double *t1, int64_t *n);
    /* optional (NULL: none): graphs (rn_backend_capture_begin); capture_end's graph is
     * NULL when keep is 0 */
    int (*capture_begin)(rn_backend *be);
    int (*capture_end)(rn_backend *be, int keep, rn_graph **graph, int64_t *nodes);
    int (*graph_launch)(rn_backend *be, rn_graph *graph);
    void (*graph_free)(rn_backend *be, rn_graph *graph);
    /* NULL: coll_sum (blocking) and nothing to join */
    int (*coll_sum_async)(rn_backend *be, float *x, float *scratch, int64_t n);
    int (*coll_join)(rn_backend *be);
    /* NULL: the backend sums no rounds (rn_backend_coll_sum_round_async refuses) */
    int (*coll_sum_round_async)(rn_backend *be, float *x, float *scratch, float *run, int64_t n, int first,
                                int last);
    /* NULL: the backend's waits call nothing (rn_backend_coll_set_poll) */
    void (*coll_set_poll)(rn_backend *be, void (*poll)(void *arg), void *arg);
} rn_backend_ops;

struct rn_backend {
    const rn_backend_ops *ops;
    int nthreads;          /* CPU threads for this context (>= 1) */
    rn_backend_opts opts;  /* as given to rn_backend_create */
    void *ws;              /* workspace arena, ws_bytes, in backend memory */
    size_t ws_bytes;
    void *impl;            /* backend-private state */
    size_t mem_cap;        /* CPU: opts.cpu_memory, an emulated device size (0: none) */
    size_t mem_held;       /* CPU: bytes rn_backend_alloc holds, counted under mem_cap */
    char name[640];        /* rn_backend_name() */
    int64_t launches;      /* rn_backend_launches() */
    int capturing;         /* between rn_backend_capture_begin and _end */
    int64_t moved;         /* bumped whenever memory ops may use is allocated anew (the
                              workspace, a backend's own buffers): a graph naming the old
                              is stale (rn/replay.h) */
};

/* Backend constructors: fill be->ops, be->impl and be->name; be->nthreads and be->opts
 * are set. */
int rn_backend_cpu_init(rn_backend *be);
/* CUDA backend (lib/backend_cuda.cu; only in builds with RN_HAVE_CUDA) on GPU `index`.
 * Errors: RN_EGPU saying why no GPU is usable (pointing at rn-gpuinfo), RN_ENOMEM. On failure be is left untouched. */
int rn_backend_cuda_init(rn_backend *be, int index);
/* Opens cuBLAS (dlopen of libcublas.so.<the major version built against>) and finds the
 * calls the CUDA backend makes, once per process; rn_backend_cuda_init does it for its
 * first context. Needs no GPU. Errors: RN_EGPU naming the library or the missing call. */
int rn_backend_cuda_blas_open(void);

/* CPU convolutions and fully connected layer (lib/backend_cpu_gemm.c), entries of the
 * CPU table. */
/* What runs the CPU context's GEMMs: rn's own kernel in the widest form the CPU has (a
 * narrower one where RN_CPU_GEMM=avx2|portable), RN_GEMM_AVX2/AVX512/PORTABLE of
 * rn/backend_cpu_impl.h, or 0: OpenBLAS (RN_CPU_GEMM=openblas, or a CPU with neither
 * AVX2 + FMA nor, off x86, a fused multiply-add instruction). */
int rn_cpu_own_isa(const rn_backend *be);
size_t rn_cpu_conv_workspace(rn_backend *be, const rn_conv_desc *d);
const char *rn_cpu_conv_algo(rn_backend *be, const rn_conv_desc *d, int dir);
int rn_cpu_conv_fwd(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w,
                    void *y);
int rn_cpu_conv_bias_fwd(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w,
                         const float *bias, const void *residual, int relu, int packed, void *y);
size_t rn_cpu_conv_bias_packed_bytes(rn_backend *be, const rn_conv_desc *d);
int rn_cpu_conv_bias_pack(rn_backend *be, const rn_conv_desc *d, const void *w, void *packed);
int rn_cpu_conv_bwd_data(rn_backend *be, const rn_conv_desc *d, const void *dy, const void *w,
                         void *dx, int accumulate);
int rn_cpu_conv_bwd_filter(rn_backend *be, const rn_conv_desc *d, const void *x,
                           const void *dy, void *dw, int accumulate);
size_t rn_cpu_fc_workspace(rn_backend *be, const rn_fc_desc *d);
int rn_cpu_fc_fwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
                  const void *b, void *y);
int rn_cpu_fc_bwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
                  const void *dy, void *dx, void *dw, void *db, int accumulate);

#ifdef __cplusplus
}
#endif

#endif
