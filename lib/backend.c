/* The backend front: context creation, argument checks shared by every backend, and
 * dispatch through the backend's table (rn/backend_impl.h). */
#include "rn/backend.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn/backend_impl.h"
#include "rn/err.h"
#include "rn/tensor.h"

void rn_backend_opts_init(rn_backend_opts *o) {
    memset(o, 0, sizeof *o);
    o->cuda_workspace = RN_CUDA_WORKSPACE_DEFAULT;
    o->cpu_winograd = 1;
}

int rn_backend_create(const char *device, int nthreads, const rn_backend_opts *opts, rn_backend **out) {
    *out = NULL;
    if (!device) device = "auto";
    int want_cuda = 0, index = opts ? opts->cuda_index : 0, local_world = opts ? opts->cuda_local_world : 0;
    if (strcmp(device, "cuda") == 0) want_cuda = 1;
    else if (strncmp(device, "cuda:", 5) == 0) {
        char *end;
        long v = strtol(device + 5, &end, 10);
        if (end == device + 5 || *end || v < 0 || v > INT_MAX)
            return rn_errorf(RN_EINVAL, "device '%s': expected cuda:N with N a GPU index (rn-gpuinfo "
                             "lists them)", device);
        want_cuda = 1;
        index = (int)v;
        local_world = 0; /* the GPU named, whatever the node's processes */
    } else if (strcmp(device, "cpu") != 0 && strcmp(device, "auto") != 0)
        return rn_errorf(RN_EINVAL, "device '%s': expected cpu, cuda, cuda:N or auto", device);
#ifndef RN_HAVE_CUDA
    (void)index;
    if (want_cuda)
        return rn_errorf(RN_ENOTSUP, "device '%s': this rn build has no CUDA support (use --device "
                         "cpu, or rebuild where the CUDA toolkit, cuDNN and cuBLAS are installed)", device);
#endif
    if (nthreads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 0 ? (int)n : 1;
    }
    rn_backend *be = rn_calloc(1, sizeof *be);
    if (!be) return RN_ENOMEM;
    be->nthreads = nthreads;
    if (opts) be->opts = *opts;
    else rn_backend_opts_init(&be->opts);
    be->opts.cuda_index = index, be->opts.cuda_local_world = local_world;
    int rc, fell_back = 0;
#ifdef RN_HAVE_CUDA
    if (want_cuda || strcmp(device, "auto") == 0) {
        rc = rn_backend_cuda_init(be, index);
        if (rc == RN_OK || want_cuda || rc != RN_EGPU) {
            if (rc != RN_OK) free(be);
            else *out = be;
            return rc;
        }
        fell_back = 1; /* auto without a usable GPU: the CPU, and its name says why */
    }
#endif
    rc = rn_backend_cpu_init(be);
    if (rc != RN_OK) {
        free(be);
        return rc;
    }
    if (fell_back) {
        size_t len = strlen(be->name);
        snprintf(be->name + len, sizeof be->name - len, " (auto: no usable GPU)");
    }
    *out = be;
    return RN_OK;
}

void rn_backend_destroy(rn_backend *be) {
    if (!be) return;
    rn_backend_unreserve(be);
    if (be->ops->destroy) be->ops->destroy(be);
    free(be);
}

const char *rn_backend_name(const rn_backend *be) { return be->name; }
int64_t rn_backend_launches(const rn_backend *be) { return be->launches; }
int rn_backend_is_host(const rn_backend *be) { return be->ops->is_host; }
int rn_backend_threads(const rn_backend *be) { return be->nthreads; }
int rn_backend_has_dtype(const rn_backend *be, int dtype) {
    return dtype >= 0 && dtype <= 31 && (be->ops->dtypes & (1u << dtype)) != 0;
}

/* a host-side call inside a graph capture: refused by name (the capture cannot hold it) */
static int capturing(const rn_backend *be, const char *what) {
    return be->capturing ? rn_errorf(RN_EINVAL, "%s while a graph is being captured (a capture holds device ops "
                                                "only: this is a bug in the caller)", what)
                         : RN_OK;
}

int rn_backend_alloc(rn_backend *be, size_t bytes, void **out) {
    int rc = capturing(be, "rn_backend_alloc");
    return rc ? rc : be->ops->alloc(be, bytes, out);
}
void rn_backend_free(rn_backend *be, void *p) {
    if (p) be->ops->free(be, p);
}
int rn_backend_upload(rn_backend *be, void *dst, const void *src, size_t bytes) {
    int rc = capturing(be, "rn_backend_upload");
    return rc ? rc : bytes ? be->ops->upload(be, dst, src, bytes) : RN_OK;
}
int rn_backend_put(rn_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes > RN_BACKEND_PUT_MAX)
        return rn_errorf(RN_EINVAL, "rn_backend_put: %zu bytes, at most %d (rn_backend_upload takes more)", bytes,
                         RN_BACKEND_PUT_MAX);
    if (bytes && (!dst || !src)) return rn_errorf(RN_EINVAL, "rn_backend_put: NULL %s", dst ? "source" : "destination");
    int rc = capturing(be, "rn_backend_put");
    if (rc || !bytes) return rc;
    return be->ops->put ? be->ops->put(be, dst, src, bytes) : be->ops->upload(be, dst, src, bytes);
}
int rn_backend_download(rn_backend *be, void *dst, const void *src, size_t bytes) {
    int rc = capturing(be, "rn_backend_download");
    return rc ? rc : bytes ? be->ops->download(be, dst, src, bytes) : RN_OK;
}
int rn_backend_copy(rn_backend *be, void *dst, const void *src, size_t bytes) {
    return bytes && dst != src ? be->ops->copy(be, dst, src, bytes) : RN_OK;
}
int rn_backend_zero(rn_backend *be, void *dst, size_t bytes) {
    return bytes ? be->ops->zero(be, dst, bytes) : RN_OK;
}
int rn_backend_sync(rn_backend *be) {
    int rc = capturing(be, "rn_backend_sync");
    return rc ? rc : be->ops->sync(be);
}
int rn_backend_mem_info(rn_backend *be, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    return be->ops->mem_info(be, free_bytes, total_bytes);
}
int rn_backend_mem_shared(const rn_backend *be) { return rn_backend_is_host(be) && !be->opts.cpu_memory; }
size_t rn_backend_workspace_limit(const rn_backend *be) { return be->ops->ws_limit; }
int rn_backend_host_alloc(rn_backend *be, size_t bytes, void **out) {
    *out = NULL;
    return be->ops->host_alloc(be, bytes, out);
}
void rn_backend_host_free(rn_backend *be, void *p) {
    if (p) be->ops->host_free(be, p);
}
int rn_backend_upload_async(rn_backend *be, void *dst, const void *src, size_t bytes) {
    rn_upload_part p = {dst, src, bytes};
    return rn_backend_upload_parts_async(be, &p, 1);
}

int rn_backend_upload_parts_async(rn_backend *be, const rn_upload_part *parts, int n) {
    enum { MAX_PARTS = 8 };
    rn_upload_part keep[MAX_PARTS];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!parts[i].bytes) continue;
        if (k == MAX_PARTS) return rn_errorf(RN_EINVAL, "upload: more than %d parts in one copy", MAX_PARTS);
        if (!parts[i].dst || !parts[i].src) return rn_errorf(RN_EINVAL, "upload: part %d has no address", i);
        keep[k++] = parts[i];
    }
    int rc = capturing(be, "rn_backend_upload_async");
    return rc ? rc : k ? be->ops->upload_async(be, keep, k) : RN_OK;
}
int rn_backend_upload_wait(rn_backend *be) {
    int rc = capturing(be, "rn_backend_upload_wait");
    return rc ? rc : be->ops->upload_wait(be);
}

int rn_backend_has_coll(const rn_backend *be) { return be->ops->coll_sum != NULL; }

int rn_backend_pci_bus_id(rn_backend *be, char *buf, size_t cap) {
    if (cap) buf[0] = 0;
    if (!be->ops->pci_bus_id) return rn_errorf(RN_ENOTSUP, "the %s backend has no PCI device", be->ops->kind);
    return be->ops->pci_bus_id(be, buf, cap);
}

int rn_backend_has_marks(const rn_backend *be) { return be->ops->mark != NULL && be->ops->marks_read != NULL; }

int rn_backend_mark(rn_backend *be, int64_t i) {
    if (!rn_backend_has_marks(be))
        return rn_errorf(RN_ENOTSUP, "the %s backend has no stream timestamps", be->ops->kind);
    if (i < 0) return rn_errorf(RN_EINVAL, "rn_backend_mark: mark %lld is negative", (long long)i);
    return be->ops->mark(be, i);
}

int rn_backend_copy_spans(rn_backend *be, int64_t cap, double *t0, double *t1, int64_t *n) {
    *n = 0;
    if (!rn_backend_has_marks(be) || !be->ops->copy_spans)
        return rn_errorf(RN_ENOTSUP, "the %s backend has no copy stream to time", be->ops->kind);
    return be->ops->copy_spans(be, cap, t0, t1, n);
}

int rn_backend_marks_read(rn_backend *be, int64_t n, double *sec) {
    if (!rn_backend_has_marks(be))
        return rn_errorf(RN_ENOTSUP, "the %s backend has no stream timestamps", be->ops->kind);
    if (n < 1) return rn_errorf(RN_EINVAL, "rn_backend_marks_read: %lld marks", (long long)n);
    return be->ops->marks_read(be, n, sec);
}

int rn_backend_has_graphs(const rn_backend *be) {
    return be->ops->capture_begin && be->ops->capture_end && be->ops->graph_launch && be->ops->graph_free;
}

int rn_backend_capture_begin(rn_backend *be) {
    if (!rn_backend_has_graphs(be)) return rn_errorf(RN_ENOTSUP, "the %s backend has no graphs", be->ops->kind);
    if (be->capturing) return rn_errorf(RN_EINVAL, "rn_backend_capture_begin: a capture is already open");
    int rc = be->ops->capture_begin(be);
    if (rc == RN_OK) be->capturing = 1;
    return rc;
}

int rn_backend_capture_end(rn_backend *be, int keep, rn_graph **graph, int64_t *nodes) {
    if (graph) *graph = NULL;
    if (nodes) *nodes = 0;
    if (!be->capturing) return rn_errorf(RN_EINVAL, "rn_backend_capture_end: no capture is open");
    be->capturing = 0;
    if (keep && !graph) {
        (void)be->ops->capture_end(be, 0, NULL, NULL); /* (ended all the same) */
        return rn_errorf(RN_EINVAL, "rn_backend_capture_end: keep without a place for the graph");
    }
    int64_t n = 0;
    rn_graph *g = NULL;
    int rc = be->ops->capture_end(be, keep, keep ? &g : NULL, &n);
    if (rc == RN_OK && keep) *graph = g;
    if (rc == RN_OK && nodes) *nodes = n;
    return rc;
}

int rn_backend_graph_launch(rn_backend *be, rn_graph *graph) {
    if (!rn_backend_has_graphs(be)) return rn_errorf(RN_ENOTSUP, "the %s backend has no graphs", be->ops->kind);
    if (!graph) return rn_errorf(RN_EINVAL, "rn_backend_graph_launch: no graph");
    if (be->capturing) return rn_errorf(RN_EINVAL, "rn_backend_graph_launch: inside a capture");
    int rc = be->ops->graph_launch(be, graph);
    if (rc == RN_OK && be->opts.sync_each_op) rc = be->ops->sync(be);
    return rc;
}

void rn_backend_graph_free(rn_backend *be, rn_graph *graph) {
    if (graph && be->ops->graph_free) be->ops->graph_free(be, graph);
}

static int no_coll(const rn_backend *be) {
    return rn_errorf(RN_ENOTSUP, "the %s backend has no collectives of its own (MPI carries them)", be->ops->kind);
}

int rn_backend_coll_id(rn_backend *be, void *id, size_t cap, size_t *len) {
    return be->ops->coll_id ? be->ops->coll_id(be, id, cap, len) : no_coll(be);
}

int rn_backend_coll_init(rn_backend *be, int rank, int world, const void *id, size_t len, double timeout_s) {
    return be->ops->coll_init ? be->ops->coll_init(be, rank, world, id, len, timeout_s) : no_coll(be);
}

int rn_backend_coll_sum(rn_backend *be, float *x, float *scratch, int64_t n) {
    if (n < 0) return rn_errorf(RN_EINVAL, "coll_sum of %lld floats", (long long)n);
    return be->ops->coll_sum ? be->ops->coll_sum(be, x, scratch, n) : no_coll(be);
}

int rn_backend_coll_sum_async(rn_backend *be, float *x, float *scratch, int64_t n) {
    if (n < 0) return rn_errorf(RN_EINVAL, "coll_sum_async of %lld floats", (long long)n);
    if (!be->ops->coll_sum) return no_coll(be);
    return be->ops->coll_sum_async ? be->ops->coll_sum_async(be, x, scratch, n) : be->ops->coll_sum(be, x, scratch, n);
}

int rn_backend_coll_sum_round_async(rn_backend *be, float *x, float *scratch, float *run, int64_t n, int first,
                                    int last) {
    if (n < 0) return rn_errorf(RN_EINVAL, "coll_sum_round_async of %lld floats", (long long)n);
    if (!be->ops->coll_sum_round_async)
        return be->ops->coll_sum ? rn_errorf(RN_ENOTSUP, "the %s backend sums no rounds", rn_backend_name(be))
                                 : no_coll(be);
    return be->ops->coll_sum_round_async(be, x, scratch, run, n, first, last);
}

void rn_backend_coll_set_poll(rn_backend *be, void (*poll)(void *arg), void *arg) {
    if (be->ops->coll_set_poll) be->ops->coll_set_poll(be, poll, arg);
}

int rn_backend_coll_join(rn_backend *be) {
    if (!be->ops->coll_sum) return no_coll(be);
    return be->ops->coll_join ? be->ops->coll_join(be) : RN_OK;
}

int rn_backend_reserve(rn_backend *be, size_t bytes) {
    if (bytes <= be->ws_bytes) return RN_OK;
    void *p = NULL;
    int rc = be->ops->alloc(be, bytes, &p);
    if (rc != RN_OK) return rn_error_context(rc, "reserving %zu bytes of workspace", bytes);
    if (be->ws) be->ops->free(be, be->ws);
    be->ws = p;
    be->ws_bytes = bytes;
    be->moved++;
    return RN_OK;
}
void rn_backend_unreserve(rn_backend *be) {
    if (be->ws) be->ops->free(be, be->ws);
    be->ws = NULL;
    be->ws_bytes = 0;
    be->moved++;
}
int64_t rn_backend_moved(const rn_backend *be) { return be->moved; }
size_t rn_backend_reserved(const rn_backend *be) { return be->ws_bytes; }

/* ---- descriptors ---- */

static int out_size(int in, int pad, int k, int stride) {
    return (int)(((int64_t)in + 2 * (int64_t)pad - k) / stride + 1);
}

int rn_conv_desc_init(rn_conv_desc *d, int n, int h, int w, int c, int k, int kh, int kw,
                      int stride, int pad) {
    memset(d, 0, sizeof *d);
    if (n < 1 || h < 1 || w < 1 || c < 1 || k < 1 || kh < 1 || kw < 1 || stride < 1 || pad < 0)
        return rn_errorf(RN_EINVAL, "conv: bad shape n=%d h=%d w=%d c=%d k=%d kernel %dx%d "
                         "stride %d pad %d", n, h, w, c, k, kh, kw, stride, pad);
    if (h + 2 * (int64_t)pad < kh || w + 2 * (int64_t)pad < kw)
        return rn_errorf(RN_EINVAL, "conv: kernel %dx%d larger than padded input %dx%d (pad %d)",
                         kh, kw, h, w, pad);
    *d = (rn_conv_desc){.dtype = RN_F32, .n = n, .h = h, .w = w, .c = c, .k = k, .kh = kh,
                        .kw = kw, .stride_h = stride, .stride_w = stride, .pad_h = pad, .dirs = RN_CONV_ALL,
                        .pad_w = pad};
    d->p = out_size(h, pad, kh, stride);
    d->q = out_size(w, pad, kw, stride);
    return RN_OK;
}

int rn_bn_desc_init(rn_bn_desc *d, int64_t m, int c, int relu) {
    *d = (rn_bn_desc){.dtype = RN_F32, .m = m, .c = c, .eps = RN_BN_EPS,
                      .momentum = RN_BN_MOMENTUM, .relu = relu != 0};
    if (m < 1 || c < 1) return rn_errorf(RN_EINVAL, "bn: bad shape m=%lld c=%d", (long long)m, c);
    return RN_OK;
}

int rn_pool_desc_init(rn_pool_desc *d, int n, int h, int w, int c, int k, int stride, int pad) {
    memset(d, 0, sizeof *d);
    if (n < 1 || h < 1 || w < 1 || c < 1 || k < 1 || stride < 1 || pad < 0 || pad > k / 2)
        return rn_errorf(RN_EINVAL, "pool: bad shape n=%d h=%d w=%d c=%d window %d stride %d "
                         "pad %d (pad must be <= window/2)", n, h, w, c, k, stride, pad);
    if (h + 2 * pad < k || w + 2 * pad < k)
        return rn_errorf(RN_EINVAL, "pool: window %d larger than padded input %dx%d", k, h, w);
    *d = (rn_pool_desc){.dtype = RN_F32, .n = n, .h = h, .w = w, .c = c, .kh = k, .kw = k,
                        .stride_h = stride, .stride_w = stride, .pad_h = pad, .pad_w = pad};
    d->p = out_size(h, pad, k, stride);
    d->q = out_size(w, pad, k, stride);
    return RN_OK;
}

int rn_xent_desc_init(rn_xent_desc *d, int n, int classes) {
    *d = (rn_xent_desc){.dtype = RN_F32, .n = n, .classes = classes, .grad_scale = 1.0f};
    if (n < 1 || classes < 1)
        return rn_errorf(RN_EINVAL, "softmax_xent: bad shape n=%d classes=%d", n, classes);
    return RN_OK;
}

int rn_sgd_desc_init(rn_sgd_desc *d, float lr, float momentum, float weight_decay,
                     int nesterov) {
    *d = (rn_sgd_desc){.lr = lr, .momentum = momentum, .weight_decay = weight_decay,
                       .nesterov = nesterov != 0, .first_step = 1, .grad_scale = 1.0f};
    return RN_OK;
}

/* ---- checks shared by every backend ---- */

static int check_dtype(rn_backend *be, const char *op, int *dtype) {
    if (*dtype == 0) *dtype = RN_F32;
    if (*dtype < 0 || *dtype > 31 || !(be->ops->dtypes & (1u << *dtype)))
        return rn_errorf(RN_ENOTSUP, "%s: dtype %s is not supported by the %s backend", op,
                         rn_dtype_name(*dtype), be->ops->kind);
    return RN_OK;
}

#define NEED(ptr, op) do { if (!(ptr)) return rn_errorf(RN_EINVAL, "%s: %s is NULL", op, #ptr); } while (0)

static int after(rn_backend *be, int rc) {
    if (rn_backend_is_host(be)) be->launches++; /* CUDA counts its own, finer */
    /* (a capture records the op: RN_SYNC=1 syncs after the graph's launch instead) */
    if (rc == RN_OK && be->opts.sync_each_op && !be->capturing) rc = be->ops->sync(be);
    return rc;
}

static int check_ws(rn_backend *be, const char *op, size_t need) {
    if (need > be->ws_bytes)
        return rn_errorf(RN_EINVAL, "%s: needs %zu bytes of workspace, %zu reserved (call "
                         "rn_backend_reserve with the largest workspace query of the plan)",
                         op, need, be->ws_bytes);
    return RN_OK;
}

/* dir: the op's own direction; its workspace alone is checked (and on CUDA chosen) */
static int check_conv(rn_backend *be, const char *op, rn_conv_desc *d, int dir) {
    d->dirs = dir;
    int rc = check_dtype(be, op, &d->dtype);
    if (rc) return rc;
    if (d->n < 1 || d->h < 1 || d->w < 1 || d->c < 1 || d->k < 1 || d->kh < 1 || d->kw < 1 ||
        d->stride_h < 1 || d->stride_w < 1 || d->pad_h < 0 || d->pad_w < 0 ||
        d->p != out_size(d->h, d->pad_h, d->kh, d->stride_h) ||
        d->q != out_size(d->w, d->pad_w, d->kw, d->stride_w) || d->p < 1 || d->q < 1)
        return rn_errorf(RN_EINVAL, "%s: inconsistent descriptor n=%d h=%d w=%d c=%d k=%d "
                         "kernel %dx%d stride %d,%d pad %d,%d out %dx%d (use rn_conv_desc_init)",
                         op, d->n, d->h, d->w, d->c, d->k, d->kh, d->kw, d->stride_h,
                         d->stride_w, d->pad_h, d->pad_w, d->p, d->q);
    return check_ws(be, op, be->ops->conv_workspace(be, d));
}

const char *rn_conv_algo(rn_backend *be, const rn_conv_desc *d, int dir) {
    const char *a = be->ops->conv_algo ? be->ops->conv_algo(be, d, dir) : NULL;
    return a ? a : "not chosen yet";
}

size_t rn_conv_workspace(rn_backend *be, const rn_conv_desc *d) {
    rn_conv_desc dd = *d;
    if (!(dd.dirs & RN_CONV_ALL)) dd.dirs = RN_CONV_ALL; /* a descriptor filled by hand */
    return be->ops->conv_workspace(be, &dd);
}

int rn_conv_fwd(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w, void *y) {
    rn_conv_desc dd = *d;
    int rc = check_conv(be, "conv_fwd", &dd, RN_CONV_FWD);
    if (rc) return rc;
    NEED(x, "conv_fwd"); NEED(w, "conv_fwd"); NEED(y, "conv_fwd");
    return after(be, be->ops->conv_fwd(be, &dd, x, w, y));
}

int rn_backend_has_conv_bias(const rn_backend *be) { return be->ops->conv_bias_fwd != NULL; }

/* The checks rn_conv_bias_fwd, _fwd_packed and _pack share: the op exists, d is
 * consistent and F32, and with packed a packed form exists for d on be. */
static int bias_check(rn_backend *be, const char *op, rn_conv_desc *d, int packed) {
    if (!be->ops->conv_bias_fwd) return rn_errorf(RN_ENOTSUP, "%s: the %s backend has no fused conv", op, be->ops->kind);
    int rc = check_conv(be, op, d, RN_CONV_FWD);
    if (rc) return rc;
    if (d->dtype != RN_F32) return rn_errorf(RN_ENOTSUP, "%s: F32 only, not %s", op, rn_dtype_name(d->dtype));
    if (packed && !be->ops->conv_bias_packed_bytes(be, d))
        return rn_errorf(RN_EINVAL, "%s: this shape takes unpacked weights on %s (rn_conv_bias_packed_bytes is 0): "
                         "call rn_conv_bias_fwd", op, be->name);
    return RN_OK;
}

static int bias_fwd(rn_backend *be, const char *op, const rn_conv_desc *d, const void *x, const void *w,
                    const float *bias, const void *residual, int relu, int packed, void *y) {
    rn_conv_desc dd = *d;
    int rc = bias_check(be, op, &dd, packed);
    if (rc) return rc;
    NEED(x, op); NEED(w, op); NEED(bias, op); NEED(y, op);
    return after(be, be->ops->conv_bias_fwd(be, &dd, x, w, bias, residual, relu, packed, y));
}

int rn_conv_bias_fwd(rn_backend *be, const rn_conv_desc *d, const void *x, const void *w,
                     const float *bias, const void *residual, int relu, void *y) {
    return bias_fwd(be, "conv_bias_fwd", d, x, w, bias, residual, relu, 0, y);
}

int rn_conv_bias_fwd_packed(rn_backend *be, const rn_conv_desc *d, const void *x, const void *packed,
                            const float *bias, const void *residual, int relu, void *y) {
    return bias_fwd(be, "conv_bias_fwd_packed", d, x, packed, bias, residual, relu, 1, y);
}

size_t rn_conv_bias_packed_bytes(rn_backend *be, const rn_conv_desc *d) {
    return be->ops->conv_bias_packed_bytes ? be->ops->conv_bias_packed_bytes(be, d) : 0;
}

int rn_conv_bias_pack(rn_backend *be, const rn_conv_desc *d, const void *w, void *packed) {
    rn_conv_desc dd = *d;
    int rc = bias_check(be, "conv_bias_pack", &dd, 1);
    if (rc) return rc;
    NEED(w, "conv_bias_pack"); NEED(packed, "conv_bias_pack");
    return after(be, be->ops->conv_bias_pack(be, &dd, w, packed));
}

int rn_conv_bwd_data(rn_backend *be, const rn_conv_desc *d, const void *dy, const void *w,
                     void *dx, int accumulate) {
    rn_conv_desc dd = *d;
    int rc = check_conv(be, "conv_bwd_data", &dd, RN_CONV_BWD_DATA);
    if (rc) return rc;
    NEED(dy, "conv_bwd_data"); NEED(w, "conv_bwd_data"); NEED(dx, "conv_bwd_data");
    return after(be, be->ops->conv_bwd_data(be, &dd, dy, w, dx, accumulate != 0));
}

int rn_conv_bwd_filter(rn_backend *be, const rn_conv_desc *d, const void *x, const void *dy,
                       void *dw, int accumulate) {
    rn_conv_desc dd = *d;
    int rc = check_conv(be, "conv_bwd_filter", &dd, RN_CONV_BWD_FILTER);
    if (rc) return rc;
    NEED(x, "conv_bwd_filter"); NEED(dy, "conv_bwd_filter"); NEED(dw, "conv_bwd_filter");
    return after(be, be->ops->conv_bwd_filter(be, &dd, x, dy, dw, accumulate != 0));
}

/* ---- batch norm ---- */

static int check_bn(rn_backend *be, const char *op, rn_bn_desc *d, int training) {
    int rc = check_dtype(be, op, &d->dtype);
    if (rc) return rc;
    if (d->m < 1 || d->c < 1 || !(d->eps >= 0) || !(d->momentum >= 0 && d->momentum <= 1))
        return rn_errorf(RN_EINVAL, "%s: bad descriptor m=%lld c=%d eps=%g momentum=%g", op,
                         (long long)d->m, d->c, d->eps, d->momentum);
    if (training && d->m < 2)
        return rn_errorf(RN_EINVAL, "%s: expected more than 1 value per channel when "
                         "training (m=%lld, c=%d)", op, (long long)d->m, d->c);
    return training ? check_ws(be, op, be->ops->bn_workspace(be, d)) : RN_OK;
}

size_t rn_bn_workspace(rn_backend *be, const rn_bn_desc *d) {
    return be->ops->bn_workspace(be, d);
}
size_t rn_bn_reserve_size(rn_backend *be, const rn_bn_desc *d) {
    return be->ops->bn_reserve_size(be, d);
}

int rn_bn_fwd_train(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma,
                    const float *beta, const void *residual, void *y, float *save_mean,
                    float *save_invstd, float *running_mean, float *running_var,
                    void *reserve) {
    const char *op = "bn_fwd_train";
    rn_bn_desc dd = *d;
    int rc = check_bn(be, op, &dd, 1);
    if (rc) return rc;
    NEED(x, op); NEED(gamma, op); NEED(beta, op); NEED(y, op); NEED(save_mean, op);
    NEED(save_invstd, op);
    if (!running_mean != !running_var)
        return rn_errorf(RN_EINVAL, "%s: give both running_mean and running_var or neither", op);
    if (be->ops->bn_reserve_size(be, &dd) && !reserve)
        return rn_errorf(RN_EINVAL, "%s: this backend needs a reserve buffer (rn_bn_reserve_size)", op);
    return after(be, be->ops->bn_fwd_train(be, &dd, x, gamma, beta, residual, y, save_mean,
                                           save_invstd, running_mean, running_var, reserve));
}

int rn_bn_fwd_infer(rn_backend *be, const rn_bn_desc *d, const void *x, const float *gamma,
                    const float *beta, const float *running_mean, const float *running_var,
                    const void *residual, void *y) {
    const char *op = "bn_fwd_infer";
    rn_bn_desc dd = *d;
    int rc = check_bn(be, op, &dd, 0);
    if (rc) return rc;
    NEED(x, op); NEED(gamma, op); NEED(beta, op); NEED(running_mean, op);
    NEED(running_var, op); NEED(y, op);
    return after(be, be->ops->bn_fwd_infer(be, &dd, x, gamma, beta, running_mean, running_var,
                                           residual, y));
}

int rn_bn_bwd(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y,
              const void *dy, const float *gamma, const float *save_mean,
              const float *save_invstd, void *dx, float *dgamma, float *dbeta, void *dres,
              void *reserve, int accumulate) {
    const char *op = "bn_bwd";
    rn_bn_desc dd = *d;
    int rc = check_bn(be, op, &dd, 1);
    if (rc) return rc;
    NEED(x, op); NEED(dy, op); NEED(gamma, op); NEED(save_mean, op); NEED(save_invstd, op);
    NEED(dx, op); NEED(dgamma, op); NEED(dbeta, op);
    if (dd.relu) NEED(y, op);
    if (dres && dres == dx) return rn_errorf(RN_EINVAL, "%s: dx and dres must differ", op);
    if (be->ops->bn_reserve_size(be, &dd) && !reserve)
        return rn_errorf(RN_EINVAL, "%s: this backend needs a reserve buffer (rn_bn_reserve_size)", op);
    return after(be, be->ops->bn_bwd(be, &dd, x, y, dy, gamma, save_mean, save_invstd, dx,
                                     dgamma, dbeta, dres, reserve, accumulate != 0));
}

int rn_bn_bwd_frozen(rn_backend *be, const rn_bn_desc *d, const void *x, const void *y,
                     const void *dy, const float *gamma, const float *running_mean,
                     const float *running_var, void *dx, float *dgamma, float *dbeta,
                     void *dres, int accumulate) {
    const char *op = "bn_bwd_frozen";
    rn_bn_desc dd = *d;
    int rc = check_bn(be, op, &dd, 0);
    if (rc || (rc = check_ws(be, op, be->ops->bn_workspace(be, &dd)))) return rc;
    NEED(x, op); NEED(dy, op); NEED(gamma, op); NEED(running_mean, op); NEED(running_var, op);
    NEED(dx, op); NEED(dgamma, op); NEED(dbeta, op);
    if (dd.relu) NEED(y, op);
    if (dres && dres == dx) return rn_errorf(RN_EINVAL, "%s: dx and dres must differ", op);
    return after(be, be->ops->bn_bwd_frozen(be, &dd, x, y, dy, gamma, running_mean, running_var, dx,
                                            dgamma, dbeta, dres, accumulate != 0));
}

/* ---- elementwise ---- */

static int check_n(rn_backend *be, const char *op, int *dtype, int64_t n) {
    int rc = check_dtype(be, op, dtype);
    if (rc) return rc;
    if (n < 0) return rn_errorf(RN_EINVAL, "%s: negative element count %lld", op, (long long)n);
    return RN_OK;
}

int rn_add(rn_backend *be, int dtype, int64_t n, const void *a, const void *b, void *y,
           int relu) {
    int rc = check_n(be, "add", &dtype, n);
    if (rc || n == 0) return rc;
    NEED(a, "add"); NEED(b, "add"); NEED(y, "add");
    return after(be, be->ops->add(be, dtype, n, a, b, y, relu != 0));
}

int rn_relu_fwd(rn_backend *be, int dtype, int64_t n, const void *x, void *y) {
    int rc = check_n(be, "relu_fwd", &dtype, n);
    if (rc || n == 0) return rc;
    NEED(x, "relu_fwd"); NEED(y, "relu_fwd");
    return after(be, be->ops->relu_fwd(be, dtype, n, x, y));
}

int rn_relu_bwd(rn_backend *be, int dtype, int64_t n, const void *y, const void *dy, void *dx) {
    int rc = check_n(be, "relu_bwd", &dtype, n);
    if (rc || n == 0) return rc;
    NEED(y, "relu_bwd"); NEED(dy, "relu_bwd"); NEED(dx, "relu_bwd");
    return after(be, be->ops->relu_bwd(be, dtype, n, y, dy, dx));
}

int rn_input_normalize(rn_backend *be, int dtype, int64_t m, int c, const uint8_t *x,
                       const float *mean, const float *std, void *y) {
    const char *op = "input_normalize";
    int rc = check_n(be, op, &dtype, m);
    if (rc || m == 0) return rc;
    if (c < 1) return rn_errorf(RN_EINVAL, "%s: %d channels", op, c);
    NEED(x, op); NEED(mean, op); NEED(std, op); NEED(y, op);
    for (int j = 0; j < c; j++)
        if (!(std[j] > 0) || !isfinite(mean[j]))
            return rn_errorf(RN_EINVAL, "%s: channel %d: mean %g std %g (std must be > 0)", op,
                             j, mean[j], std[j]);
    return after(be, be->ops->input_normalize(be, dtype, m, c, x, mean, std, y));
}

int rn_input_erase(rn_backend *be, int dtype, int h, int w, int c, int x, int y0, int bw, int bh,
                   int random, uint64_t key, int64_t epoch, uint32_t rec, void *y) {
    const char *op = "input_erase";
    int rc = check_n(be, op, &dtype, (int64_t)h * w * c);
    if (rc) return rc;
    if (h < 1 || w < 1 || c < 1 || bw < 0 || bh < 0 || x < 0 || y0 < 0 || x + bw > w || y0 + bh > h)
        return rn_errorf(RN_EINVAL, "%s: box %dx%d at (%d, %d) outside a %dx%dx%d image", op, bw, bh, x, y0, w, h,
                         c);
    if (bw == 0 || bh == 0) return RN_OK;
    NEED(y, op);
    return after(be, be->ops->input_erase(be, dtype, h, w, c, x, y0, bw, bh, random, key, epoch, rec, y));
}

int rn_input_mix(rn_backend *be, int dtype, const rn_mix_desc *d, int n, int h, int w, int c, const uint8_t *x,
                 const float *mean, const float *std, const rn_erase *erase, uint64_t erase_key, int64_t erase_epoch,
                 void *y) {
    const char *op = "input_mix";
    int rc = check_n(be, op, &dtype, (int64_t)n * h * w);
    if (rc) return rc;
    NEED(d, op);
    if (n < 1 || h < 1 || w < 1 || c < 1)
        return rn_errorf(RN_EINVAL, "%s: bad shape n=%d h=%d w=%d c=%d", op, n, h, w, c);
    if (d->kind != RN_MIX_NONE && d->kind != RN_MIX_MIXUP && d->kind != RN_MIX_CUTMIX)
        return rn_errorf(RN_EINVAL, "%s: kind %d (RN_MIX_NONE, RN_MIX_MIXUP or RN_MIX_CUTMIX)", op, d->kind);
    if (!(d->lambda >= 0 && d->lambda <= 1)) return rn_errorf(RN_EINVAL, "%s: lambda %g outside [0, 1]", op, d->lambda);
    if (d->kind == RN_MIX_CUTMIX &&
        !(0 <= d->y0 && d->y0 <= d->y1 && d->y1 <= h && 0 <= d->x0 && d->x0 <= d->x1 && d->x1 <= w))
        return rn_errorf(RN_EINVAL, "%s: box rows [%d, %d) columns [%d, %d) outside the %dx%d image", op, d->y0, d->y1,
                         d->x0, d->x1, h, w);
    NEED(x, op); NEED(mean, op); NEED(std, op); NEED(y, op);
    for (int j = 0; j < c; j++)
        if (!(std[j] > 0) || !isfinite(mean[j]))
            return rn_errorf(RN_EINVAL, "%s: channel %d: mean %g std %g (std must be > 0)", op, j, mean[j], std[j]);
    for (int k = 0; erase && rn_backend_is_host(be) && k < n; k++) {
        const rn_erase *e = &erase[k];
        if (e->w < 0 || e->h < 0 || e->x < 0 || e->y < 0 || e->x + e->w > w || e->y + e->h > h)
            return rn_errorf(RN_EINVAL, "%s: image %d: erase box %dx%d at (%d, %d) outside the %dx%d image", op, k,
                             e->w, e->h, e->x, e->y, w, h);
    }
    if (!be->ops->input_mix) return rn_errorf(RN_ENOTSUP, "%s: the %s backend has no mixing", op, be->ops->kind);
    return after(be, be->ops->input_mix(be, dtype, d, n, h, w, c, x, mean, std, erase, erase_key, erase_epoch, y));
}

/* ---- pooling ---- */

static int check_pool(rn_backend *be, const char *op, rn_pool_desc *d) {
    int rc = check_dtype(be, op, &d->dtype);
    if (rc) return rc;
    if (d->n < 1 || d->h < 1 || d->w < 1 || d->c < 1 || d->kh < 1 || d->kw < 1 ||
        d->stride_h < 1 || d->stride_w < 1 || d->pad_h < 0 || d->pad_w < 0 ||
        d->pad_h > d->kh / 2 || d->pad_w > d->kw / 2 ||
        d->p != out_size(d->h, d->pad_h, d->kh, d->stride_h) ||
        d->q != out_size(d->w, d->pad_w, d->kw, d->stride_w) || d->p < 1 || d->q < 1)
        return rn_errorf(RN_EINVAL, "%s: inconsistent descriptor (use rn_pool_desc_init)", op);
    return RN_OK;
}

int rn_maxpool_fwd(rn_backend *be, const rn_pool_desc *d, const void *x, void *y) {
    rn_pool_desc dd = *d;
    int rc = check_pool(be, "maxpool_fwd", &dd);
    if (rc) return rc;
    NEED(x, "maxpool_fwd"); NEED(y, "maxpool_fwd");
    return after(be, be->ops->maxpool_fwd(be, &dd, x, y));
}

int rn_maxpool_bwd(rn_backend *be, const rn_pool_desc *d, const void *x, const void *y,
                   const void *dy, void *dx) {
    rn_pool_desc dd = *d;
    int rc = check_pool(be, "maxpool_bwd", &dd);
    if (rc) return rc;
    NEED(x, "maxpool_bwd"); NEED(y, "maxpool_bwd"); NEED(dy, "maxpool_bwd");
    NEED(dx, "maxpool_bwd");
    return after(be, be->ops->maxpool_bwd(be, &dd, x, y, dy, dx));
}

static int check_gap(rn_backend *be, const char *op, int *dtype, int n, int hw, int c) {
    int rc = check_dtype(be, op, dtype);
    if (rc) return rc;
    if (n < 1 || hw < 1 || c < 1)
        return rn_errorf(RN_EINVAL, "%s: bad shape n=%d hw=%d c=%d", op, n, hw, c);
    return RN_OK;
}

int rn_avgpool_global_fwd(rn_backend *be, int dtype, int n, int hw, int c, const void *x,
                          void *y) {
    int rc = check_gap(be, "avgpool_global_fwd", &dtype, n, hw, c);
    if (rc) return rc;
    NEED(x, "avgpool_global_fwd"); NEED(y, "avgpool_global_fwd");
    return after(be, be->ops->avgpool_global_fwd(be, dtype, n, hw, c, x, y));
}

int rn_avgpool_global_bwd(rn_backend *be, int dtype, int n, int hw, int c, const void *dy,
                          void *dx) {
    int rc = check_gap(be, "avgpool_global_bwd", &dtype, n, hw, c);
    if (rc) return rc;
    NEED(dy, "avgpool_global_bwd"); NEED(dx, "avgpool_global_bwd");
    return after(be, be->ops->avgpool_global_bwd(be, dtype, n, hw, c, dy, dx));
}

/* ---- fully connected, loss, optimiser ---- */

static int check_fc(rn_backend *be, const char *op, rn_fc_desc *d) {
    int rc = check_dtype(be, op, &d->dtype);
    if (rc) return rc;
    if (d->n < 1 || d->in < 1 || d->out < 1)
        return rn_errorf(RN_EINVAL, "%s: bad shape n=%d in=%d out=%d", op, d->n, d->in, d->out);
    return RN_OK;
}

size_t rn_fc_workspace(rn_backend *be, const rn_fc_desc *d) {
    return be->ops->fc_workspace ? be->ops->fc_workspace(be, d) : 0;
}

int rn_fc_fwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
              const void *b, void *y) {
    rn_fc_desc dd = *d;
    int rc = check_fc(be, "fc_fwd", &dd);
    if (!rc) rc = check_ws(be, "fc_fwd", rn_fc_workspace(be, &dd));
    if (rc) return rc;
    NEED(x, "fc_fwd"); NEED(w, "fc_fwd"); NEED(y, "fc_fwd");
    return after(be, be->ops->fc_fwd(be, &dd, x, w, b, y));
}

int rn_fc_bwd(rn_backend *be, const rn_fc_desc *d, const void *x, const void *w,
              const void *dy, void *dx, void *dw, void *db, int accumulate) {
    rn_fc_desc dd = *d;
    int rc = check_fc(be, "fc_bwd", &dd);
    if (!rc) rc = check_ws(be, "fc_bwd", rn_fc_workspace(be, &dd));
    if (rc) return rc;
    NEED(x, "fc_bwd"); NEED(w, "fc_bwd"); NEED(dy, "fc_bwd"); NEED(dw, "fc_bwd");
    return after(be, be->ops->fc_bwd(be, &dd, x, w, dy, dx, dw, db, accumulate != 0));
}

int rn_softmax_xent(rn_backend *be, const rn_xent_desc *d, const void *logits,
                    const int32_t *labels, float *loss, void *dlogits) {
    const char *op = "softmax_xent";
    rn_xent_desc dd = *d;
    int rc = check_dtype(be, op, &dd.dtype);
    if (rc) return rc;
    if (dd.n < 1 || dd.classes < 1 || !(dd.label_smoothing >= 0 && dd.label_smoothing <= 1) ||
        !(dd.grad_scale > 0) || !isfinite(dd.grad_scale) || !(dd.mix_weight >= 0 && dd.mix_weight <= 1))
        return rn_errorf(RN_EINVAL, "%s: bad descriptor n=%d classes=%d label_smoothing=%g "
                         "grad_scale=%g mix_weight=%g (use rn_xent_desc_init)", op, dd.n, dd.classes,
                         dd.label_smoothing, dd.grad_scale, dd.mix_weight);
    /* (a weight in device memory is the caller's to keep in range: read only here on the host) */
    if (dd.mix_weight_at && rn_backend_is_host(be) && !(*dd.mix_weight_at >= 0 && *dd.mix_weight_at <= 1))
        return rn_errorf(RN_EINVAL, "%s: mix_weight_at holds %g, want [0, 1]", op, *dd.mix_weight_at);
    NEED(logits, op); NEED(labels, op); NEED(loss, op);
    return after(be, be->ops->softmax_xent(be, &dd, logits, labels, loss, dlogits));
}

int rn_top1_count(rn_backend *be, int n, int classes, const float *logits, const int32_t *labels, int target,
                  int32_t *hits) {
    const char *op = "top1_count";
    if (n < 1 || classes < 1 || target < RN_TOP1_LABEL || target > RN_TOP1_SMALLER)
        return rn_errorf(RN_EINVAL, "%s: bad arguments n=%d classes=%d target=%d", op, n, classes, target);
    NEED(logits, op); NEED(labels, op); NEED(hits, op);
    return after(be, be->ops->top1_count(be, n, classes, logits, labels, target, NULL, hits));
}

int rn_top1_count_at(rn_backend *be, int n, int classes, const float *logits, const int32_t *labels,
                     const int32_t *target_at, int32_t *hits) {
    const char *op = "top1_count_at";
    if (n < 1 || classes < 1) return rn_errorf(RN_EINVAL, "%s: bad arguments n=%d classes=%d", op, n, classes);
    NEED(logits, op); NEED(labels, op); NEED(target_at, op); NEED(hits, op);
    if (rn_backend_is_host(be) && (*target_at < RN_TOP1_LABEL || *target_at > RN_TOP1_SMALLER))
        return rn_errorf(RN_EINVAL, "%s: target_at holds %d", op, *target_at);
    return after(be, be->ops->top1_count(be, n, classes, logits, labels, RN_TOP1_LABEL, target_at, hits));
}

/* Conversions are storage, not compute: every backend takes these three. */
static int check_storage(const char *op, const char *which, int *dtype) {
    if (*dtype == 0) *dtype = RN_F32;
    if (*dtype != RN_F32 && *dtype != RN_F16 && *dtype != RN_BF16)
        return rn_errorf(RN_EINVAL, "%s: %s dtype %s: expected F32, F16 or BF16", op, which,
                         rn_dtype_name(*dtype));
    return RN_OK;
}

/* a rate in backend memory (rn_sgd_desc.lr_at, rn_lars_desc.lr_at): where that memory is
 * the host's, it is checked as a rate passed would be */
static int check_lr_at(rn_backend *be, const char *op, const float *lr_at) {
    if (lr_at && rn_backend_is_host(be) && !isfinite(*lr_at))
        return rn_errorf(RN_EINVAL, "%s: lr_at holds %g, want a finite rate", op, *lr_at);
    return RN_OK;
}

static int sgd(rn_backend *be, const char *op, const rn_sgd_desc *d, int64_t n, float *p,
               const float *grad, float *buf, void *copy) {
    if (n < 0) return rn_errorf(RN_EINVAL, "%s: negative element count", op);
    if ((!d->lr_at && !isfinite(d->lr)) || !isfinite(d->momentum) || !isfinite(d->dampening) ||
        !isfinite(d->weight_decay) || !(d->grad_scale > 0) || !isfinite(d->grad_scale) ||
        (d->nesterov && (d->momentum <= 0 || d->dampening != 0)))
        return rn_errorf(RN_EINVAL, "%s: bad descriptor lr=%g momentum=%g dampening=%g "
                         "weight_decay=%g nesterov=%d grad_scale=%g (nesterov needs momentum "
                         "> 0 and dampening 0; use rn_sgd_desc_init)", op, d->lr, d->momentum,
                         d->dampening, d->weight_decay, d->nesterov, d->grad_scale);
    rn_sgd_desc dd = *d;
    int rc = copy ? check_storage(op, "copy", &dd.dtype) : RN_OK;
    if (rc || n == 0) return rc;
    NEED(p, op); NEED(grad, op);
    if (d->momentum != 0) NEED(buf, op);
    if ((rc = check_lr_at(be, op, d->lr_at))) return rc;
    return after(be, be->ops->sgd_update(be, &dd, n, p, grad, buf, copy));
}

int rn_sgd_update(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p,
                  const float *grad, float *buf) {
    return sgd(be, "sgd_update", d, n, p, grad, buf, NULL);
}

int rn_sgd_update_copy(rn_backend *be, const rn_sgd_desc *d, int64_t n, float *p,
                       const float *grad, float *buf, void *copy) {
    const char *op = "sgd_update_copy";
    if (n > 0) NEED(copy, op);
    return sgd(be, op, d, n, p, grad, buf, copy);
}

int rn_lars_desc_init(rn_lars_desc *d, float lr, float momentum, float weight_decay, float eta, float eps) {
    *d = (rn_lars_desc){.lr = lr, .momentum = momentum, .weight_decay = weight_decay, .eta = eta, .eps = eps,
                        .adapt = 1, .grad_scale = 1.0f};
    return RN_OK;
}

size_t rn_lars_workspace(rn_backend *be, int64_t n) {
    (void)be;
    int64_t chunks = n > 0 ? (n + RN_LARS_CHUNK - 1) / RN_LARS_CHUNK : 0;
    /* two double sums per chunk, then the scaled learning rate */
    return (size_t)chunks * 2 * sizeof(double) + 2 * sizeof(double);
}

static int lars(rn_backend *be, const char *op, const rn_lars_desc *d, int64_t n, float *p, const float *grad,
                float *buf, void *copy) {
    if (n < 0) return rn_errorf(RN_EINVAL, "%s: negative element count", op);
    if ((!d->lr_at && !isfinite(d->lr)) || !(d->momentum >= 0) || !isfinite(d->momentum) || !(d->weight_decay >= 0) ||
        !isfinite(d->weight_decay) || !(d->eta >= 0) || !isfinite(d->eta) || !(d->eps >= 0) || !isfinite(d->eps) ||
        !(d->grad_scale > 0) || !isfinite(d->grad_scale))
        return rn_errorf(RN_EINVAL, "%s: bad descriptor lr=%g momentum=%g weight_decay=%g eta=%g eps=%g "
                         "grad_scale=%g (momentum, weight_decay, eta, eps >= 0 and finite, grad_scale > 0; use "
                         "rn_lars_desc_init)", op, d->lr, d->momentum, d->weight_decay, d->eta, d->eps,
                         d->grad_scale);
    rn_lars_desc dd = *d;
    int rc = copy ? check_storage(op, "copy", &dd.dtype) : RN_OK;
    if (rc || n == 0) return rc;
    NEED(p, op); NEED(grad, op); NEED(buf, op);
    if ((rc = check_lr_at(be, op, d->lr_at))) return rc;
    if ((rc = check_ws(be, op, rn_lars_workspace(be, n)))) return rc;
    return after(be, be->ops->lars_update(be, &dd, n, p, grad, buf, copy));
}

int rn_lars_update(rn_backend *be, const rn_lars_desc *d, int64_t n, float *p, const float *grad, float *buf) {
    return lars(be, "lars_update", d, n, p, grad, buf, NULL);
}

int rn_lars_update_copy(rn_backend *be, const rn_lars_desc *d, int64_t n, float *p, const float *grad, float *buf,
                        void *copy) {
    const char *op = "lars_update_copy";
    if (n > 0) NEED(copy, op);
    return lars(be, op, d, n, p, grad, buf, copy);
}

int rn_cast(rn_backend *be, int src_dtype, int dst_dtype, int64_t n, const void *x, void *y,
            int accumulate) {
    const char *op = "cast";
    int rc = check_storage(op, "source", &src_dtype);
    if (rc || (rc = check_storage(op, "destination", &dst_dtype))) return rc;
    if (n < 0) return rn_errorf(RN_EINVAL, "%s: negative element count %lld", op, (long long)n);
    if (n == 0) return RN_OK;
    NEED(x, op); NEED(y, op);
    return after(be, be->ops->cast(be, src_dtype, dst_dtype, n, x, y, accumulate != 0));
}

size_t rn_sumsq_workspace(rn_backend *be, int64_t n) {
    (void)be;
    int64_t chunks = n > 0 ? (n + RN_LARS_CHUNK - 1) / RN_LARS_CHUNK : 0;
    return (size_t)chunks * sizeof(double); /* a chunk's sum each */
}

int rn_sumsq(rn_backend *be, int64_t n, const float *x, double *out) {
    const char *op = "sumsq";
    if (n < 0) return rn_errorf(RN_EINVAL, "%s: negative element count %lld", op, (long long)n);
    NEED(out, op);
    if (n > 0) NEED(x, op);
    int rc = check_ws(be, op, rn_sumsq_workspace(be, n));
    if (rc) return rc;
    if (!be->ops->sumsq) return rn_errorf(RN_ENOTSUP, "%s: not implemented by %s", op, be->name);
    return after(be, be->ops->sumsq(be, n, x, out));
}

int rn_ema_update(rn_backend *be, int64_t n, const float *x, float *avg, float keep, float take) {
    const char *op = "ema_update";
    if (n < 0) return rn_errorf(RN_EINVAL, "%s: negative element count %lld", op, (long long)n);
    if (!isfinite(keep) || !isfinite(take))
        return rn_errorf(RN_EINVAL, "%s: keep %g and take %g must be finite", op, keep, take);
    if (n == 0) return RN_OK;
    NEED(x, op); NEED(avg, op);
    if (!be->ops->ema_update) return rn_errorf(RN_ENOTSUP, "%s: not implemented by %s", op, be->name);
    return after(be, be->ops->ema_update(be, n, x, avg, keep, take));
}

int rn_nonfinite(rn_backend *be, int64_t n, const float *x, int32_t *flag) {
    const char *op = "nonfinite";
    if (n < 0) return rn_errorf(RN_EINVAL, "%s: negative element count %lld", op, (long long)n);
    NEED(flag, op);
    if (n == 0) return RN_OK;
    NEED(x, op);
    return after(be, be->ops->nonfinite(be, n, x, flag));
}
