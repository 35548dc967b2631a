/* rn/backend.h: the compute operations the network calls, on one device.
 *
 * The network (lib/net.c; lib/resnet.c describes the architectures as data) calls these
 * functions and never branches on the device:
 * a backend context (rn_backend) is created once for "cpu" or "cuda[:N]", and every op
 * takes it as its first argument. Internally each context carries a table of function
 * pointers (include/rn/backend_impl.h) that a backend fills in; these public functions
 * check their arguments once, for every backend alike, then call through the table. We
 * chose a table over a device tag on each call so that the CUDA backend lives in its own
 * translation unit (compiled by nvcc) and librn links without it when CUDA is absent.
 *
 * Memory. Every tensor pointer given to an op is in the backend's memory space (host
 * memory for "cpu", device memory for "cuda") and is owned by the caller: ops never
 * allocate, free or keep pointers past the call. Use rn_backend_alloc/upload/download
 * to move data; rn_backend_is_host() says whether pointers can be read directly.
 * Scalars in descriptors (eps, lr, ...) and the mean/std arrays of rn_input_normalize
 * are host values.
 *
 * Workspace. A context holds one workspace arena in device memory. Ops that need scratch
 * space take it from there, so nothing is allocated inside a training step: before the
 * first step, take the maximum of rn_conv_workspace() and rn_bn_workspace() over every
 * layer of the plan and call rn_backend_reserve() once. An op whose need exceeds the
 * reservation fails with RN_EINVAL and says how much it needed. Only one op runs at a
 * time per context, so all ops share the one arena. Ops not listed with a workspace
 * query need none.
 *
 * Layouts. Activations are NHWC (channels last) with no padding between elements.
 * Convolution weights are (K, kh, kw, C), "OHWI": both cuDNN's NHWC filter format and the
 * CPU GEMM want it, so the model keeps parameters, gradients and momentum in it and
 * converts from/to torchvision's OIHW only at load/save (rn_conv_oihw_to_ohwi and back,
 * host code in rn/tensor.h).
 * The SGD update is elementwise, so it does not care. Fully connected weights are torch's
 * (out, in). BatchNorm parameters and statistics are (C,).
 *
 * Element types. Each descriptor has a dtype (RN_F32, RN_F16 or RN_BF16 from rn/tensor.h;
 * 0 means RN_F32) that applies to the pointers declared void * in that op: activations,
 * their gradients, conv/FC weights and their gradients. Pointers declared float * are
 * always fp32 (BN parameters and statistics, the loss, SGD master weights). The CPU
 * backend computes in RN_F32 only and returns RN_ENOTSUP for the others
 * (rn_backend_has_dtype says which a context computes in). Conversions between the three
 * (rn_cast, the compute copy of rn_sgd_update_copy) are storage, not compute: every
 * backend does them.
 *
 * Errors. Every function returns RN_OK or a negative RN_E* code with a message
 * (rn_last_error) that names the op and the bad value. Ops are not thread-safe on one
 * context: use one context per thread.
 *
 * Aliasing. An output may share memory with an input only where the op says so.
 *
 * Determinism. On the CPU, results are bit-identical for any thread count, whatever
 * OpenBLAS kernel runs (reduction chunks, tiles and GEMM blocks sized from the shape
 * alone, never from the thread count; lib/backend_cpu_gemm.c); test_threads checks it.
 *
 * Accumulate flags. Where an op has `accumulate`, 0 overwrites its gradient outputs and 1
 * adds to them (gradient accumulation over micro-batches; the two gradient paths into a
 * residual block's input). */
#ifndef RN_BACKEND_H
#define RN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "rn/augment.h" /* rn_erase, the boxes rn_input_mix erases */

typedef struct rn_backend rn_backend;

/* ---- context ---- */

/* Settings of a context, fixed when it is created (as LMDB's mdb_env_set_* come between
 * create and open). rn_backend_opts_init fills the defaults; a tool sets fields from its
 * flags and from the documented environment overrides (rn_cli_backend_env reads them:
 * the library itself never reads the environment). */
#define RN_CUDA_WORKSPACE_DEFAULT ((size_t)1024 << 20)
/* rn_backend_opts.cpu_gemm: RN_CPU_GEMM=own|avx2|portable|openblas */
enum { RN_CPU_GEMM_OWN = 0, RN_CPU_GEMM_AVX2, RN_CPU_GEMM_PORTABLE, RN_CPU_GEMM_OPENBLAS };
typedef struct {
    int sync_each_op;         /* synchronise after every op, so an asynchronous GPU fault is
                                 reported by the op that caused it (RN_SYNC=1) */
    size_t cpu_memory;        /* CPU: behave as a device of this many bytes, allocations past
                                 it failing (0: the machine's memory; RN_CPU_MEMORY=SIZE) */
    int cpu_winograd;         /* CPU: rn_conv_bias_fwd runs 3x3 stride-1 convs of 64+ channels
                                 as Winograd: 1 (the default from rn_backend_opts_init)
                                 F(4x4,3x3) where 4x4 output tiles fit the image (14x14 and
                                 up), else F(2x2,3x3) where 2x2 ones do; 2: F(2x2,3x3) only
                                 (about 30x less rounding error per conv); 0: im2col + GEMM
                                 (RN_CPU_WINOGRAD=0|1|2) */
    int cpu_gemm;             /* CPU: what runs the convolutions' and the fc's GEMMs
                                 (RN_CPU_GEMM): RN_CPU_GEMM_OWN, the default, rn's own kernel
                                 in the widest form the CPU runs (AVX-512, AVX2 + FMA, or the
                                 portable C form on a non-x86 CPU with FMA), whose bits
                                 depend on neither the form nor OpenBLAS's kernel; _AVX2
                                 and _PORTABLE name a narrower form (the same bits, to
                                 compare); _OPENBLAS, OpenBLAS's sgemm (its kernel's rounding) */
    int cuda_index;           /* the GPU "cuda" and "auto" take (a data-parallel rank's
                                 local rank, rn/dist.h); "cuda:N" names its own */
    int cuda_local_world;     /* processes of the run on this node (0, 1: one). With more,
                                 "cuda" and "auto" take GPU 0 where each process sees one
                                 GPU (Slurm's --gpus-per-task, CUDA_VISIBLE_DEVICES per
                                 process), and refuse more processes than GPUs */
    int cuda_tf32;            /* TF32 tensor cores for fp32 convs and GEMMs (RN_CUDA_TF32=1) */
    int cuda_deterministic;   /* deterministic conv algorithms only (--deterministic) */
    int cuda_conv_heuristic;  /* conv algorithms from cuDNN's heuristic, not timed (the
                                 same in every process; --deterministic, or
                                 RN_CUDA_CONV_ALGO=heuristic; default: find) */
    int cuda_bn_cudnn;        /* BN training forward and backward through cuDNN's fused
                                 kernels where they apply (RN_CUDA_BN=cudnn; default:
                                 rn's kernels) */
    int cuda_stem_plain;      /* 3-channel fp16/bf16 convs (the stem) as they are
                                 (RN_CUDA_STEM=plain); default: forward and backward-filter
                                 on copies padded to 4 channels, for cuDNN's tensor-core
                                 kernels */
    size_t cuda_workspace;    /* conv workspace one algorithm may use, bytes
                                 (RN_CUDA_WORKSPACE_MB; default RN_CUDA_WORKSPACE_DEFAULT) */
    char cuda_algo_cache[1024]; /* file that keeps Find's conv algorithm choices for later
                                 processes (rn/algocache.h); "" none (RN_CUDA_ALGO_CACHE) */
    /* a test hook (RN_CUDA_INJECT): the cuDNN status each call of a kind returns instead of
       running, 0 for none, so that a GPU run can check the fall-backs: Find's (convolution
       algorithms), the fused BN forward's and its backward's */
    int cuda_inject_find, cuda_inject_bn, cuda_inject_bn_bwd;
} rn_backend_opts;

void rn_backend_opts_init(rn_backend_opts *o);

/* Create a context for device "cpu", "cuda", "cuda:N" or "auto" (cuda:0 when this build
 * has CUDA and a usable GPU, else cpu; "cuda" and "auto" take GPU opts->cuda_index), with
 * opts (NULL: the defaults). nthreads <= 0
 * means every online core; the CPU backend runs every op, GEMMs included, on its own pool
 * of that many threads (the caller's plus nthreads-1, started here, which sleep when
 * idle), and sets OpenBLAS to one thread of its own (process-wide), so that two pools
 * never compete for the same cores. Code outside the backend that calls cblas directly
 * gets one thread. Errors: RN_EINVAL (unknown device), RN_ENOTSUP (cuda in a CPU-only
 * build), RN_EGPU, RN_ENOMEM. */
int rn_backend_create(const char *device, int nthreads, const rn_backend_opts *opts, rn_backend **out);
/* Free the context and its workspace arena. NULL is a no-op. */
void rn_backend_destroy(rn_backend *be);
/* One line for logs, e.g. "cpu: OpenBLAS 0.3.21 (Zen), 2 threads". */
const char *rn_backend_name(const rn_backend *be);
/* 1 when tensor pointers are host memory the caller may read and write directly. */
int rn_backend_is_host(const rn_backend *be);
int rn_backend_threads(const rn_backend *be);
/* 1 when every op of this context computes in dtype (RN_F32 on every backend; RN_F16 and
 * RN_BF16 on CUDA), else 0. */
int rn_backend_has_dtype(const rn_backend *be, int dtype);

/* ---- memory (pointers in the backend's space; sizes in bytes) ---- */

/* Allocate `bytes` (64-byte aligned, contents undefined). Errors: RN_ENOMEM, RN_EGPU. */
int rn_backend_alloc(rn_backend *be, size_t bytes, void **out);
/* Free memory from rn_backend_alloc. NULL is a no-op. */
void rn_backend_free(rn_backend *be, void *p);
/* Copy host memory to the context's memory, in order with the ops issued before and
 * after it. host_src may be reused or freed as soon as this returns, even when it is
 * pinned memory (rn_backend_host_alloc: e.g. labels read from a loader slot); the
 * asynchronous path for pinned batches is rn_backend_upload_async. */
int rn_backend_upload(rn_backend *be, void *dst, const void *host_src, size_t bytes);
/* Write a few bytes (at most RN_BACKEND_PUT_MAX) of host memory into the context's
 * memory, in order with the ops issued before and after it, without waiting for them: on
 * CUDA the bytes travel as a kernel's arguments, where rn_backend_upload from pageable
 * memory may wait for the stream first. For the scalars a graph reads when it runs (the
 * rate of rn_net_step_lr, rn-train --cuda-graphs' mixing weight), put before its launch;
 * refused inside a capture, which would hold the bytes of its own time. Errors: RN_EINVAL
 * (more than RN_BACKEND_PUT_MAX bytes, NULL, inside a capture). */
#define RN_BACKEND_PUT_MAX 64
int rn_backend_put(rn_backend *be, void *dst, const void *host_src, size_t bytes);
int rn_backend_download(rn_backend *be, void *host_dst, const void *src, size_t bytes);
int rn_backend_copy(rn_backend *be, void *dst, const void *src, size_t bytes);
int rn_backend_zero(rn_backend *be, void *dst, size_t bytes);
/* Work issued on this context since it was created: on CUDA every kernel, cuDNN/cuBLAS
 * compute call, copy and memset put on its streams; on the CPU every op. Differences over
 * a training step give the launches per step the benchmark reports (what a CUDA graph
 * would save). */
int64_t rn_backend_launches(const rn_backend *be);
/* Wait until every op issued on this context has finished; reports deferred errors. */
int rn_backend_sync(rn_backend *be);

/* The PCI bus id of the backend's device, as cudaDeviceGetPCIBusId writes it
 * ("0000:3B:00.0"), into buf (cap bytes): what NVML finds the device by (rn/gpumon.h).
 * Errors: RN_ENOTSUP (a backend without a device: the CPU), RN_EGPU. */
int rn_backend_pci_bus_id(rn_backend *be, char *buf, size_t cap);

/* Timestamps taken on the backend's compute stream, in stream order, for timing ops
 * without synchronising around each (rn/prof.h; CUDA events). rn_backend_has_marks says
 * whether the backend has them (CUDA: yes; CPU: no, its ops are timed by the clock).
 * rn_backend_mark records mark i when the work issued before it is done; marks are
 * numbered 0, 1, 2, ... and mark 0 starts a new series (the marks of the previous one
 * may be reused). rn_backend_marks_read waits for marks 0..n-1 and writes the seconds
 * from mark 0 to mark i into sec[i]. Errors: RN_ENOTSUP (no marks), RN_EINVAL (i or n
 * out of the series), RN_EGPU, RN_ENOMEM. */
int rn_backend_has_marks(const rn_backend *be);
int rn_backend_mark(rn_backend *be, int64_t i);
int rn_backend_marks_read(rn_backend *be, int64_t n, double *sec);
/* The rn_backend_upload_async copies issued since the last mark 0 (at most cap of them,
 * the first), timed on the copy stream: waits for them and writes each one's start and
 * end, seconds after mark 0, to t0[i] and t1[i]; *n is how many. Errors: RN_ENOTSUP (a
 * backend without a copy stream: the CPU), RN_EGPU. */
int rn_backend_copy_spans(rn_backend *be, int64_t cap, double *t0, double *t1, int64_t *n);

/* Graphs (CUDA graphs; rn/replay.h decides when to use them). rn_backend_capture_begin
 * makes the ops issued on this context record into a graph instead of running;
 * rn_backend_capture_end stops recording and, when keep is set and the recording holds,
 * makes it a graph (*nodes: the kernels, copies and memsets in it) that
 * rn_backend_graph_launch runs again, as one launch, with the same pointers and scalars;
 * rn_backend_graph_free frees it (NULL: a no-op). Between begin and end only device-side
 * ops: an upload, download, sync or alloc fails, and so does an op that would allocate (a
 * shape not met before); a free breaks the capture (its end fails). Every begin must be ended, after a failure too
 * (keep 0). rn_backend_has_graphs says whether the backend has them (CUDA: yes; CPU: no,
 * and begin fails with RN_ENOTSUP). Errors: RN_ENOTSUP, RN_EINVAL (begin while
 * capturing, end or launch without), RN_EGPU (the capture failed: its message says which
 * call broke it), RN_ENOMEM. */
typedef struct rn_graph rn_graph;
int rn_backend_has_graphs(const rn_backend *be);
/* A count that changes whenever memory the ops use may have been allocated anew (the
 * workspace: rn_backend_reserve; a backend's own buffers grown on first use): a graph
 * captured before a change names memory that may be gone (rn/replay.h captures again). */
int64_t rn_backend_moved(const rn_backend *be);
int rn_backend_capture_begin(rn_backend *be);
int rn_backend_capture_end(rn_backend *be, int keep, rn_graph **graph, int64_t *nodes);
int rn_backend_graph_launch(rn_backend *be, rn_graph *graph);
void rn_backend_graph_free(rn_backend *be, rn_graph *graph);

/* Memory for planning (rn_net_plan, --micro-batch auto): *free_bytes the device has free
 * now and *total_bytes its size. CUDA: cudaMemGetInfo. CPU: the memory this process can
 * still use: MemAvailable, or the cgroup's memory.max less its usage when that is lower,
 * and MemTotal. Errors: RN_EGPU, RN_EIO (nothing readable). */
int rn_backend_mem_info(rn_backend *be, size_t *free_bytes, size_t *total_bytes);
/* Whether that memory is the machine's, shared with the other processes on it (the CPU
 * backend, unless cpu_memory makes it a device of its own): 1 or 0. */
int rn_backend_mem_shared(const rn_backend *be);
/* The most workspace one convolution may take on this context (CUDA:
 * RN_CUDA_WORKSPACE_MB), or 0 when rn_conv_workspace is exact and cheap for any shape
 * (CPU). */
size_t rn_backend_workspace_limit(const rn_backend *be);

/* ---- host staging: input batches on their way to the device ----
 * Host memory that the device copies from asynchronously: page-locked ("pinned") on
 * CUDA, so a copy runs on the copy engine while kernels run; 64-byte-aligned host
 * memory on the CPU. The loader's allocator hook takes these (rn/loader.h). */
int rn_backend_host_alloc(rn_backend *be, size_t bytes, void **out);
void rn_backend_host_free(rn_backend *be, void *p);
/* Start copying `bytes` from host_src to dst on the context's copy stream, overlapped
 * with the ops already issued; every op issued after this call sees dst filled. The copy
 * first waits for the ops issued before the *previous* rn_backend_upload_async call, so
 * a caller that alternates two dst buffers never overwrites one still being read.
 * host_src must stay unchanged until rn_backend_upload_wait returns (from pageable
 * memory the copy is not overlapped, but still correct). On the CPU: a plain copy. */
int rn_backend_upload_async(rn_backend *be, void *dst, const void *host_src, size_t bytes);
/* rn_backend_upload_async of n parts as one: one wait for the ops before the previous
 * call, the parts copied in order, and every op issued after this call sees them all
 * (a batch's pixels and its labels: two copies, one place in the streams' order). Parts
 * of 0 bytes are skipped. */
typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} rn_upload_part;
int rn_backend_upload_parts_async(rn_backend *be, const rn_upload_part *parts, int n);
/* Wait until the last rn_backend_upload_async has read its source. */
int rn_backend_upload_wait(rn_backend *be);

/* Grow the workspace arena to at least `bytes` (never shrinks). Call before a step. */
int rn_backend_reserve(rn_backend *be, size_t bytes);
/* Free the workspace arena (after a network that reserved it failed to build, so that a
 * smaller one starts from nothing). The next op that needs workspace fails until
 * rn_backend_reserve. */
void rn_backend_unreserve(rn_backend *be);
/* Bytes currently reserved. */
size_t rn_backend_reserved(const rn_backend *be);

/* ---- convolution (no bias, no groups, no dilation) ----
 * x (n, h, w, c)  w (k, kh, kw, c)  y (n, p, q, k)
 * p = (h + 2*pad_h - kh) / stride_h + 1, q likewise: torch's floor rule. */
typedef struct {
    int dtype;                /* element type of x, w, y and their gradients */
    int n, h, w, c;           /* input shape, NHWC */
    int k, kh, kw;            /* output channels, kernel size */
    int stride_h, stride_w;
    int pad_h, pad_w;         /* zero padding on each side */
    int p, q;                 /* output height and width (set by rn_conv_desc_init) */
    int dirs;                 /* the directions this shape will run, RN_CONV_FWD | ...:
                                 rn_conv_workspace counts only these, and CUDA chooses
                                 algorithms only for them (rn_conv_desc_init: all three) */
} rn_conv_desc;

enum { RN_CONV_FWD = 1, RN_CONV_BWD_DATA = 2, RN_CONV_BWD_FILTER = 4, RN_CONV_ALL = 7 };
/* rn_conv_algo's dir for rn_conv_bias_fwd, the inference forward (not a dirs bit) */
enum { RN_CONV_BIAS_FWD = 8 };

/* Fill d for a square stride and padding (dtype RN_F32). Errors: RN_EINVAL for a
 * non-positive size, a kernel larger than the padded input, or sizes that overflow. */
int rn_conv_desc_init(rn_conv_desc *d, int n, int h, int w, int c, int k, int kh, int kw,
                      int stride, int pad);
/* Workspace bytes that each of the conv ops in d->dirs may take for d on this context
 * (on the CPU it grows with the thread count: one im2col tile per thread). On CUDA the
 * first query for a shape and direction chooses its algorithm (then cached; an op whose
 * direction was never queried chooses on its first call), within
 * RN_CUDA_WORKSPACE_MB, and, when a reservation is already held, within it (so that a
 * shape first met during a run, a short last batch, fits the arena): query every shape
 * of a plan before rn_backend_reserve, or after rn_backend_unreserve. */
size_t rn_conv_workspace(rn_backend *be, const rn_conv_desc *d);
/* The name of the algorithm direction dir (RN_CONV_FWD, _BWD_DATA or _BWD_FILTER) of d's
 * shape runs with on this context, or with dir RN_CONV_BIAS_FWD the one rn_conv_bias_fwd
 * runs (the CPU: "Winograd F(4x4,3x3)" or "Winograd F(2x2,3x3)" for the shapes of
 * cpu_winograd when it is on,
 * else rn_conv_fwd's), e.g. "cuDNN WINOGRAD_NONFUSED" or "im2col + GEMM";
 * "not chosen yet" before its first use on CUDA. Static storage. */
const char *rn_conv_algo(rn_backend *be, const rn_conv_desc *d, int dir);
/* y = conv(x, w). */
int rn_conv_fwd(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w, void *y);
/* y = [relu](conv(x, w) + bias [+ residual]), the inference path's conv with BatchNorm
 * folded into w and bias: bias (k) fp32 in backend memory, residual (n, p, q, k) or
 * NULL; y must not overlap x or residual. The sum is formed as conv + (bias + residual),
 * ReLU as v < 0 ? 0 : v (NaN passes, as in PyTorch). F32 only. The workspace is
 * rn_conv_workspace's. Errors: RN_ENOTSUP where the backend has no such op
 * (rn_backend_has_conv_bias), those of rn_conv_fwd. */
int rn_conv_bias_fwd(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w,
                     const float *bias, const void *residual, int relu, void *y);
/* The weights in the form rn_conv_bias_fwd reads them, made once instead of on every
 * call (the inference net does it when it loads weights): on the CPU the panels of rn's
 * own GEMM kernel, or for a Winograd shape the transformed filters. Bytes: 0 where the
 * form is w itself (then use rn_conv_bias_fwd). The form depends on d's shape and the
 * context's settings, not on d->n: a packed copy serves every batch size. */
size_t rn_conv_bias_packed_bytes(rn_backend *be, const rn_conv_desc *d);
/* packed (rn_conv_bias_packed_bytes, backend memory) = w (k, kh, kw, c) in that form.
 * Errors: RN_EINVAL when the size is 0, those of rn_conv_bias_fwd. */
int rn_conv_bias_pack(rn_backend *be, const rn_conv_desc *d, const void *w, void *packed);
/* rn_conv_bias_fwd with weights from rn_conv_bias_pack: the same bits. */
int rn_conv_bias_fwd_packed(rn_backend *be, const rn_conv_desc *d, const void *x, const void *packed,
                            const float *bias, const void *residual, int relu, void *y);
/* 1 when be has rn_conv_bias_fwd (the CPU backend), else 0. */
int rn_backend_has_conv_bias(const rn_backend *be);
/* dx (n, h, w, c) [+]= dL/dx given dy (n, p, q, k). */
int rn_conv_bwd_data(rn_backend *be, const rn_conv_desc *d, const void *dy, const void *w,
                     void *dx, int accumulate);
/* dw (k, kh, kw, c) [+]= dL/dw given x and dy. */
int rn_conv_bwd_filter(rn_backend *be, const rn_conv_desc *d, const void *x, const void *dy,
                       void *dw, int accumulate);

/* ---- batch normalisation over NHWC: x is (m, c) with m = n*h*w ----
 * Training: y = [relu](gamma * (x - mean) * invstd + beta [+ residual]) with the batch's
 * mean and biased variance var, invstd = 1/sqrt(var + eps). Running statistics, when
 * given, follow torch: running_mean = (1-momentum)*running_mean + momentum*mean and
 * running_var = (1-momentum)*running_var + momentum*var*m/(m-1) (unbiased). */
typedef struct {
    int dtype;       /* element type of x, y, residual, dy, dx, dres */
    int64_t m;       /* positions per channel: n*h*w (>= 2 for training) */
    int c;           /* channels */
    float eps;       /* added to the variance inside the sqrt (1e-5) */
    float momentum;  /* running-statistics factor (0.1) */
    int relu;        /* 1: apply ReLU after the (optional) residual add */
} rn_bn_desc;

#define RN_BN_EPS 1e-5f
#define RN_BN_MOMENTUM 0.1f

/* Fill d with eps RN_BN_EPS, momentum RN_BN_MOMENTUM, dtype RN_F32. */
int rn_bn_desc_init(rn_bn_desc *d, int64_t m, int c, int relu);
/* Workspace bytes for rn_bn_fwd_train and rn_bn_bwd. */
size_t rn_bn_workspace(rn_backend *be, const rn_bn_desc *d);
/* Bytes of per-layer "reserve" memory a backend keeps from rn_bn_fwd_train to the
 * matching rn_bn_bwd: on CUDA a layer with ReLU keeps its ReLU mask there, one bit per
 * element (rn's kernels; the backward then reads it instead of y), or cuDNN's fused
 * BN+add+ReLU its own (RN_CUDA_BN=cudnn); 0 on CPU. The caller allocates it per layer
 * and passes the same pointer to both (NULL if 0). */
size_t rn_bn_reserve_size(rn_backend *be, const rn_bn_desc *d);

/* Training forward. x, y (m, c); residual (m, c) or NULL; gamma, beta (c);
 * save_mean, save_invstd (c) outputs kept for rn_bn_bwd; running_mean, running_var (c)
 * updated in place, or both NULL to leave them alone. y may alias x or residual.
 * Errors: RN_EINVAL for m < 2 (torch refuses one value per channel too). */
int rn_bn_fwd_train(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma,
                    const float *beta, const void *residual, void *y, float *save_mean,
                    float *save_invstd, float *running_mean, float *running_var,
                    void *reserve);
/* Inference forward with the running statistics: y = [relu](gamma*(x - running_mean)
 * / sqrt(running_var + eps) + beta [+ residual]). y may alias x or residual. */
int rn_bn_fwd_infer(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma,
                    const float *beta, const float *running_mean, const float *running_var,
                    const void *residual, void *y);
/* Backward of rn_bn_fwd_train. Inputs: x and y of the forward (y is read only when
 * d->relu, for torch's ReLU backward mask: dy where y > 0 or y is NaN, 0 where
 * y <= 0; else may be NULL), dy,
 * gamma, save_mean, save_invstd. Outputs: dx (m, c); dgamma, dbeta (c), [+]= per
 * `accumulate`; dres (m, c) = the gradient reaching the residual input (dy masked by
 * the ReLU), or NULL when the forward had no residual. dx may alias dy; dres may alias
 * dy; dx and dres must differ. */
int rn_bn_bwd(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y,
              const void *dy, const float *gamma, const float *save_mean,
              const float *save_invstd, void *dx, float *dgamma, float *dbeta, void *dres,
              void *reserve, int accumulate);
/* Backward of rn_bn_fwd_infer used while training with frozen BatchNorm (fine-tuning:
 * BN normalises with its running statistics, which are constants and stay unchanged;
 * gamma and beta still learn). With a = gamma/sqrt(running_var + eps) and dz = dy masked
 * by the ReLU: dx = a*dz, dgamma [+]= sum dz*(x - running_mean)*invstd, dbeta [+]=
 * sum dz, dres = dz. Aliasing and workspace as rn_bn_bwd; no reserve buffer. */
int rn_bn_bwd_frozen(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y,
                     const void *dy, const float *gamma, const float *running_mean,
                     const float *running_var, void *dx, float *dgamma, float *dbeta,
                     void *dres, int accumulate);

/* ---- elementwise (n elements, dtype as the descriptors) ---- */

/* y = [relu](a + b). y may alias a or b. */
int rn_add(rn_backend *be, int dtype, int64_t n, const void *a, const void *b, void *y,
           int relu);
/* y = max(x, 0). y may alias x. */
int rn_relu_fwd(rn_backend *be, int dtype, int64_t n, const void *x, void *y);
/* dx = dy where y > 0, else 0 (y the ReLU's output). dx may alias dy. */
int rn_relu_bwd(rn_backend *be, int dtype, int64_t n, const void *y, const void *dy,
                void *dx);
/* Loader batch to network input: x u8 (m, c) -> y (m, c) = (x/255 - mean[j]) / std[j]
 * for channel j, torchvision's ToTensor + Normalize. mean, std: host arrays of c. */
int rn_input_normalize(rn_backend *be, int dtype, int64_t m, int c, const uint8_t *x,
                       const float *mean, const float *std, void *y);
/* RandomErasing on one normalised image y (h, w, c): the bw x bh box at column x, row y0
 * becomes 0, or when random each element e = (row * w + col) * c + ch becomes
 * rn_erase_value(key, epoch, rec, e) (rn/augment.h: N(0, 1) from Philox). */
int rn_input_erase(rn_backend *be, int dtype, int h, int w, int c, int x, int y0, int bw, int bh,
                   int random, uint64_t key, int64_t epoch, uint32_t rec, void *y);

/* ---- pooling ----
 * Max pool: x (n, h, w, c) -> y (n, p, q, c), padding never selected (torch's -inf),
 * floor rule for p, q. Backward routes each dy to the first maximum in its window
 * (row-major scan, as torch), recomputed from x and y, so nothing is saved. */
typedef struct {
    int dtype;
    int n, h, w, c;
    int kh, kw, stride_h, stride_w, pad_h, pad_w;
    int p, q;        /* output size (set by rn_pool_desc_init) */
} rn_pool_desc;

/* Square window k, stride, pad (torch: pad <= k/2). Errors: RN_EINVAL. */
int rn_pool_desc_init(rn_pool_desc *d, int n, int h, int w, int c, int k, int stride, int pad);
int rn_maxpool_fwd(rn_backend *be, const rn_pool_desc *d, const void *x, void *y);
/* dx (n, h, w, c) = gradient; overwritten. */
int rn_maxpool_bwd(rn_backend *be, const rn_pool_desc *d, const void *x, const void *y,
                   const void *dy, void *dx);
/* Global average pool: x (n, hw, c) -> y (n, c) = mean over hw. */
int rn_avgpool_global_fwd(rn_backend *be, int dtype, int n, int hw, int c, const void *x,
                          void *y);
/* dx (n, hw, c) = dy (n, c) / hw. */
int rn_avgpool_global_bwd(rn_backend *be, int dtype, int n, int hw, int c, const void *dy,
                          void *dx);

/* ---- fully connected: x (n, in), w (out, in), b (out), y (n, out) ---- */
typedef struct {
    int dtype;       /* element type of every tensor of the layer */
    int n, in, out;
} rn_fc_desc;

/* Workspace bytes rn_fc_fwd and rn_fc_bwd may take for d on this context (the CPU's own
 * kernel packs the batch's operands); reserve it with the convs' (rn_backend_reserve). */
size_t rn_fc_workspace(rn_backend *be, const rn_fc_desc *d);
/* y = x w^T + b; b may be NULL (no bias). */
int rn_fc_fwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
              const void *b, void *y);
/* dx = dy w (overwritten; NULL to skip), dw [+]= dy^T x, db [+]= sum over n of dy
 * (NULL to skip). */
int rn_fc_bwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
              const void *dy, void *dx, void *dw, void *db, int accumulate);

/* ---- softmax cross-entropy, mean over the batch ----
 * For row i with label y_i, K classes, smoothing e (torch's label_smoothing):
 *   loss_i = (1-e) * -log softmax(z_i)[y_i] + e/K * sum_k -log softmax(z_i)[k]
 *   loss = mean_i loss_i;  dlogits_i = grad_scale * (softmax(z_i) - (1-e)*onehot(y_i) - e/K) / n
 * Soft targets of mixup/cutmix (rn/mix.h): with mix_weight m > 0 row i's target is
 *   t_i = (1-m) * onehot(y_i) + m * onehot(y_{i-1})   (y_{-1} = y_{n-1}: torch's roll(1, 0))
 * smoothed as torch smooths probability targets, (1-e) * t_i + e/K, so
 *   loss_i = (1-e) * ((1-m) * -log p_i[y_i] + m * -log p_i[y_{i-1}]) + e/K * sum_k -log p_i[k]
 *   dlogits_i = grad_scale * (softmax(z_i) - (1-e) * t_i - e/K) / n
 * m = 0 is the hard-label path, computed exactly as without mixing. */
typedef struct {
    int dtype;              /* element type of logits and dlogits; the loss is fp32 */
    int n, classes;
    float label_smoothing;  /* e in [0, 1] */
    float grad_scale;       /* multiplies dlogits: 1, 1/accum_steps, an AMP loss scale */
    double mix_weight;      /* m in [0, 1]: the rolled partner's share of the target (1 - lambda) */
    const double *mix_weight_at; /* non-NULL: m is read from here (backend memory) when the op
                                    runs, in place of mix_weight: a graph's replay reads the
                                    value of its step (rn/replay.h); the caller keeps it in [0, 1] */
} rn_xent_desc;

/* Fill d: no smoothing, grad_scale 1, dtype RN_F32. */
int rn_xent_desc_init(rn_xent_desc *d, int n, int classes);
/* logits (n, classes); labels (n) int32 in [0, classes), in backend memory; loss: one
 * float in backend memory (read it with rn_backend_download); dlogits (n, classes) or
 * NULL for the loss alone; dlogits may alias logits. Errors: RN_EINVAL for a label out of
 * range (the CPU backend names the row; a GPU backend may not check). */
int rn_softmax_xent(rn_backend *be, const rn_xent_desc *d, const void *logits,
                    const int32_t *labels, float *loss, void *dlogits);

/* ---- the train top-1: rows whose predicted class is their target ----
 * Row i's predicted class is the first j with the largest logits[i][j], NaN never the
 * largest, and class 0 when logits[i][0] is NaN: what `best = 0; for j: if (z[j] >
 * z[best]) best = j` gives. Its target (rn/mix.h's dominant label): RN_TOP1_LABEL
 * labels[i]; RN_TOP1_ROLLED labels[i-1] (row 0's: labels[n-1], its mixup/cutmix partner);
 * RN_TOP1_SMALLER the smaller of the two (a tie of the weights). logits (n, classes) fp32
 * and labels (n) in backend memory; *hits, one int32 in backend memory, is set to the
 * number of rows that hit. A label out of range hits no row. */
enum { RN_TOP1_LABEL, RN_TOP1_ROLLED, RN_TOP1_SMALLER };
int rn_top1_count(rn_backend *be, int n, int classes, const float *logits, const int32_t *labels, int target,
                  int32_t *hits);
/* The same with the target read from *target_at (one int32 in backend memory) when the op
 * runs (as rn_xent_desc.mix_weight_at); a value that is none of the three hits no row
 * (refused where the backend's memory is the host's). */
int rn_top1_count_at(rn_backend *be, int n, int classes, const float *logits, const int32_t *labels,
                     const int32_t *target_at, int32_t *hits);

/* ---- mixup / cutmix of a normalised input batch (rn/mix.h) ----
 * Image i's partner is image i-1 (image 0's the last: torch's roll(1, 0)); a and b are
 * their normalised values, (x/255 - mean)/std as rn_input_normalize computes them, then
 * erased by their own boxes as rn_input_erase erases them (torchvision erases each image
 * before the collated batch is mixed): element e = (row * w + col) * c + ch of image k
 * inside erase[k]'s box is 0, or rn_erase_value(erase_key, erase_epoch, erase[k].rec, e)
 * when erase[k].random. Each output element reads its two inputs and writes itself, so
 * erasing costs no second pass and no copy of the partner.
 *   RN_MIX_NONE:   y = a (rn_input_normalize)
 *   RN_MIX_MIXUP:  y = a * lambda + b * (1 - lambda), in fp32 (float(lambda), float(1 - lambda)
 *                  as torch's batch.mul_(lambda).add_(rolled.mul_(1 - lambda)))
 *   RN_MIX_CUTMIX: y = b inside rows [y0, y1) and columns [x0, x1), a elsewhere */
enum { RN_MIX_NONE = 0, RN_MIX_MIXUP = 1, RN_MIX_CUTMIX = 2 };
typedef struct {
    int kind;               /* RN_MIX_* */
    double lambda;          /* weight of each image's own pixels (mixup) and label */
    int y0, y1, x0, x1;     /* cutmix: the box taken from the partner, 0 <= y0 <= y1 <= h, x too */
} rn_mix_desc;

/* x (n, h, w, c) u8 NHWC in backend memory -> y (n, h, w, c) of dtype, mixed as d says;
 * mean, std (c) host floats. erase: (n) the images' erase boxes in backend memory (an
 * rn_backend_upload'ed copy on a device), box w or h 0 for none, every box inside the
 * image; NULL: nothing erased. y must not overlap x. Errors: RN_EINVAL (shape, box, lambda
 * outside [0, 1], std <= 0, an erase box outside the image where the backend is the
 * host's), RN_ENOTSUP (the CUDA backend: more than 64 channels). */
int rn_input_mix(rn_backend *be, int dtype, const rn_mix_desc *d, int n, int h, int w, int c, const uint8_t *x,
                 const float *mean, const float *std, const rn_erase *erase, uint64_t erase_key, int64_t erase_epoch,
                 void *y);

/* ---- SGD, torch.optim.SGD semantics exactly ----
 *   g = grad_scale * grad;  g = g + weight_decay * p
 *   momentum != 0:  buf = first_step ? g : momentum*buf + (1-dampening)*g
 *                   g = nesterov ? g + momentum*buf : buf
 *   p = p - lr * g
 * "first_step" is torch's momentum_buffer-is-None: true for the first update after
 * initialisation, or after loading a checkpoint without momentum buffers. */
typedef struct {
    float lr, momentum, dampening, weight_decay;
    int nesterov;
    int first_step;
    float grad_scale;      /* 1, or 1/loss_scale to unscale AMP gradients */
    int dtype;             /* element type of rn_sgd_update_copy's copy (0: RN_F32) */
    const float *lr_at;    /* non-NULL: lr is read from here (one float in backend memory)
                              when the op runs, in place of lr: a graph's replay steps with
                              the rate of its step (rn/replay.h); the caller keeps it finite */
    const int32_t *skip_if; /* non-NULL: when the op runs and this int32 (backend memory)
                               is not 0, nothing is written: rn_nonfinite's flag skips an
                               overflowed fp16 step on the device, with no read-back first */
} rn_sgd_desc;

/* Fill d: dampening 0, grad_scale 1, first_step 1, dtype RN_F32, lr_at and skip_if NULL. A grad_scale of 0 is
 * refused with RN_EINVAL (it would silently zero every gradient), here and in
 * rn_xent_desc. */
int rn_sgd_desc_init(rn_sgd_desc *d, float lr, float momentum, float weight_decay,
                     int nesterov);
/* p, grad, buf: n fp32 each (buf may be NULL when momentum == 0). Keep every parameter,
 * gradient and buffer in one flat allocation each and one call updates the whole model.
 * grad is not modified. */
int rn_sgd_update(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p,
                  const float *grad, float *buf);
/* The fused optimiser step of mixed precision: rn_sgd_update (unscale by grad_scale,
 * weight decay, momentum, update of the fp32 master weights p), and in the same pass
 * copy (n elements of d->dtype, RN_F32/RN_F16/RN_BF16 on every backend) = the new p
 * rounded to nearest even: the compute copy the next forward reads. p and buf end bit
 * for bit as rn_sgd_update leaves them. copy must not overlap p, grad or buf. Skipping
 * an overflowed step is decided before with rn_nonfinite: it must be known before the
 * first weight is written, which one pass over the weights cannot (skip_if hands that
 * verdict to the op on the device). */
int rn_sgd_update_copy(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p,
                       const float *grad, float *buf, void *copy);

/* ---- LARS over one parameter tensor, as MLPerf's ResNet-50 reference applies it ----
 * (TensorFlow's LARSOptimizer and MXNet's LARS in the MLPerf references):
 *   g = grad_scale * grad
 *   adapt:  wn = ||p||_2, gn = ||g||_2 (of the whole tensor)
 *           trust = wn > 0 && gn > 0 ? eta * wn / (gn + weight_decay * wn + eps) : 1
 *   else:   trust = 1
 *   g = g + weight_decay * p
 *   buf = momentum * buf + (lr * trust) * g;   p = p - buf
 * The momentum buffer holds the step itself (learning rate included), TensorFlow's
 * ApplyMomentum with lr 1 on grad * scaled_lr, not torch's SGD buffer. BN parameters and
 * biases are excluded by the caller: adapt 0 and weight_decay 0 (plain momentum).
 * Norms are sums of squares in double over fixed chunks of RN_LARS_CHUNK elements; a
 * chunk is summed in RN_LARS_LANES lanes (lane l takes its elements l, l + LANES, ... in
 * order), its lanes added in lane order, the chunks in chunk order: the same bits for any
 * thread count and on every backend; trust and lr * trust in double, rounded once to
 * float; the element update in float without fused multiply-add, in the order above. */
#define RN_LARS_CHUNK 16384
#define RN_LARS_LANES 256
typedef struct {
    float lr, momentum, weight_decay;
    float eta, eps;        /* trust coefficient and epsilon (adapt only) */
    int adapt;             /* 1: layer-wise trust ratio; 0: trust 1 (excluded tensors) */
    float grad_scale;      /* 1, or 1/loss_scale to unscale AMP gradients */
    int dtype;             /* element type of rn_lars_update_copy's copy (0: RN_F32) */
    const float *lr_at;    /* as rn_sgd_desc's: lr read from backend memory when the op runs */
    const int32_t *skip_if; /* as rn_sgd_desc's: not 0 when the op runs, nothing is written */
} rn_lars_desc;

/* Fill d: adapt 1, grad_scale 1, dtype RN_F32, lr_at and skip_if NULL. */
int rn_lars_desc_init(rn_lars_desc *d, float lr, float momentum, float weight_decay, float eta, float eps);
/* Workspace bytes rn_lars_update needs for a tensor of n elements (its chunk sums). */
size_t rn_lars_workspace(rn_backend *be, int64_t n);
/* One LARS step of one tensor: p, grad, buf n fp32 each (buf must start at zero before the
 * first step); grad is not modified. Errors: RN_EINVAL (bad descriptor: lr not finite
 * (without lr_at; with it on a host backend, the value there), eta, eps, weight_decay or
 * momentum negative or not finite, grad_scale not > 0; workspace short). */
int rn_lars_update(rn_backend *be, const rn_lars_desc *d, int64_t n, float *p, const float *grad, float *buf);
/* rn_lars_update and, in the same pass, copy (n elements of d->dtype) = the new p rounded
 * to nearest even, as rn_sgd_update_copy. */
int rn_lars_update_copy(rn_backend *be, const rn_lars_desc *d, int64_t n, float *p, const float *grad, float *buf,
                        void *copy);

/* ---- the sum of squares of a vector: the gradient norm of rn-train --clip-grad-norm ----
 * *out (one double in backend memory) = the sum of x[i]^2 over n fp32 values, each
 * square and sum in double, in LARS's order (above): chunks of RN_LARS_CHUNK elements, a
 * chunk in RN_LARS_LANES lanes added in lane order, the chunks in chunk order: the same
 * bits for any thread count and on every backend. Workspace: rn_sumsq_workspace(n) bytes
 * (reserve it with the convs'). Errors: RN_EINVAL (n < 0, NULL, workspace short). */
size_t rn_sumsq_workspace(rn_backend *be, int64_t n);
int rn_sumsq(rn_backend *be, int64_t n, const float *x, double *out);

/* ---- the exponential moving average of the weights (rn-train --ema-decay) ----
 * avg = keep * avg + take * x, element by element in fp32, each product and the sum
 * rounded once (no fused multiply-add), in the order torchvision's
 * ExponentialMovingAverage computes decay * avg + (1 - decay) * param: keep is the
 * decay, take 1 - decay, each rounded to float by the caller. x, avg: n fp32 each in
 * backend memory, not overlapping. The CUDA backend computes the same bits. Errors:
 * RN_EINVAL (n < 0, NULL, keep or take not finite). */
int rn_ema_update(rn_backend *be, int64_t n, const float *x, float *avg, float keep, float take);

/* ---- conversions and the overflow check of mixed precision ---- */

/* y [+]= x converted, element by element: x is n elements of src_dtype, y n elements of
 * dst_dtype (each RN_F32, RN_F16 or RN_BF16, on every backend). accumulate: the sum
 * y + x is formed in fp32 and rounded once to dst_dtype (AMP adds a half-precision
 * weight gradient into its fp32 master gradient this way). Rounding is to nearest even;
 * beyond the half range values become inf, NaN stays NaN. y must not overlap x. */
int rn_cast(rn_backend *be, int src_dtype, int dst_dtype, int64_t n, const void *x, void *y,
            int accumulate);
/* *flag, one int32 in backend memory, is set to 1 when any of the n fp32 values of x is
 * inf or NaN, and left as it was otherwise, so checks of several arrays accumulate into
 * one flag: zero it first (rn_backend_zero), read it after (rn_backend_download). */
int rn_nonfinite(rn_backend *be, int64_t n, const float *x, int32_t *flag);

/* ---- collectives across processes (a device backend's own: NCCL on a GPU) ----
 * rn/dist.h drives these; host backends have none (rn_backend_has_coll 0) and rn/dist.h
 * uses MPI on their memory instead. */
int rn_backend_has_coll(const rn_backend *be);
/* Rank 0: the communicator's id (ncclGetUniqueId) into id (cap bytes), its length in
 * *len, for the caller to broadcast. Errors: RN_ENOTSUP (no collectives), RN_EINVAL
 * (cap too small), RN_EGPU. */
int rn_backend_coll_id(rn_backend *be, void *id, size_t cap, size_t *len);
/* Join the communicator of world ranks as rank (every rank calls it with rank 0's id).
 * Init and every later collective give up when one wait for them passes timeout_s
 * seconds (another rank died or hangs; a join's wait includes the compute work queued
 * before its last bucket): the communicator is aborted and RN_EGPU names the operation.
 * Errors: RN_ENOTSUP, RN_EGPU. */
int rn_backend_coll_init(rn_backend *be, int rank, int world, const void *id, size_t len, double timeout_s);
/* x (n floats, device) = the sum of every rank's x, added left to right in rank order
 * ((x0 + x1) + x2 ..., as rn_dist_sum defines it), the same bits on every rank;
 * scratch holds n floats (device; overwritten). Blocks until done. Errors: RN_ENOTSUP,
 * RN_EGPU (a NCCL error or the timeout). */
int rn_backend_coll_sum(rn_backend *be, float *x, float *scratch, int64_t n);
/* The same sum, overlapped with the backend's compute: enqueued on a communication
 * stream after everything enqueued so far on the compute stream (an event), returning
 * once NCCL has accepted it; x and scratch must not be touched until rn_backend_coll_join.
 * A backend without a stream of its own for it sums at once (rn_backend_coll_sum).
 * Errors: those of rn_backend_coll_sum. */
int rn_backend_coll_sum_async(rn_backend *be, float *x, float *scratch, int64_t n);
/* One round of a sum over rounds (rn_dist_sum_round), enqueued as
 * rn_backend_coll_sum_async: for this rank's chunk of x (chunk r of n floats over W
 * ranks: [n*r/W, n*(r+1)/W)), run = ((run + x0) + x1) ... + xW-1, every rank's x in rank
 * order (first: run starts from x0 instead); with last, x's chunk = run and then every
 * rank's summed chunk is gathered into x, as rn_backend_coll_sum; without, x is left to
 * the caller after the join and nothing is gathered. run: this rank's chunk's running
 * sums, as many floats as the chunk (device). Errors: those of rn_backend_coll_sum. */
int rn_backend_coll_sum_round_async(rn_backend *be, float *x, float *scratch, float *run, int64_t n, int first,
                                    int last);
/* Wait (under the timeout) until every rn_backend_coll_sum_async so far is done; the
 * compute stream's later ops see the sums. Errors: RN_ENOTSUP, RN_EGPU. */
int rn_backend_coll_join(rn_backend *be);
/* poll(arg) is called, on the waiting thread, again and again (tens of microseconds
 * apart: poll limits its own work) while a collective call waits for the other ranks:
 * rn/dist.h's heartbeats, which name a rank that hangs, go on through NCCL's waits.
 * NULL: none. A backend without collectives ignores it. */
void rn_backend_coll_set_poll(rn_backend *be, void (*poll)(void *arg), void *arg);

#ifdef __cplusplus
}
#endif

#endif
