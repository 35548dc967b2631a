/* rn/runner.h: what training and evaluation both run on: a backend, a network sized by
 * the memory plan, and the staging of loader batches onto the device.
 *
 *   rn_runner r;
 *   rn_runner_open(&r, "auto", 0, NULL);             // the backend, before the loaders
 *   rn_runner_loader_memory(&loader_opts, r.be);     // batches in pinned memory on a GPU
 *   ... rn_loader_create ...
 *   rn_runner_net(&r, ck, batch, micro, 0, crop, RN_NET_TRAIN, RN_F32);
 *   for each batch b:
 *       rn_runner_stage(&r, &b);                     // upload, overlapping compute
 *       rn_runner_input(&r, &b, first, n);           // normalise into the net's input
 *       rn_net_forward(r.net, n, ...) ...            // or, inference: rn_runner_logits
 *       rn_backend_upload_wait(r.be); rn_loader_release(l, &b);
 *   ... rn_loader_destroy (its buffers may be the backend's) ...
 *   rn_runner_close(&r);
 *
 * Memory plan: before allocating, the network's bytes at the micro-batch (rn_net_plan,
 * plus two staging buffers of a batch of u8 pixels on a device, plus what the caller
 * holds beside the net: r->also, and r->also_split when micro < batch) are checked against
 * mem_limit or the device's free memory less 5% of its total; a plan that does not fit
 * fails with RN_ENOMEM naming the largest micro-batch (a divisor of batch) that does,
 * and micro = 0 (auto) takes it. */
#ifndef RN_RUNNER_H
#define RN_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "rn/backend.h"
#include "rn/ckpt.h"
#include "rn/dataset.h"
#include "rn/dist.h"
#include "rn/loader.h"
#include "rn/net.h"

typedef struct {
    rn_backend *be;
    rn_net *net;
    rn_dist *dist;       /* the ranks this run is split over (set after rn_runner_open;
                            NULL: this process alone): rn_eval_run shards over them */
    uint8_t *staging[2]; /* non-host backends: device copies of a loader batch of u8 pixels
                            and, at staged_cap, its int32 labels, used in turn so that one
                            fills while the other is read */
    const uint8_t *px;   /* the pixels of the batch last staged: staging[i] or the batch's own */
    const int32_t *labels; /* its labels, in backend memory: after px's, or the batch's own
                              (NULL for a batch without labels) */
    int next;            /* staging buffer the next batch goes to */
    int micro, crop;     /* images per forward, and their side */
    int classes;         /* logits per image */
    size_t staged_cap;   /* pixel bytes per staging buffer (the labels' offset) */
    int staged_n;        /* images per staging buffer */
    rn_erase *erase;     /* non-host backends: (micro) device copy of a micro-batch's erase boxes for
                            rn_input_mix, uploaded by rn_runner_input_mix */
    int recompute;       /* the net recomputes its blocks' insides (RN_NET_RECOMPUTE) */
    size_t recompute_saved; /* then the bytes that saves at this micro-batch, by the plan */
    size_t also;         /* bytes the run holds in the same memory beside the net at any
                            micro-batch, set before planning (0: none): counted by the plan */
    size_t also_split;   /* and more when the batch is split into micro-batches (micro < batch) */
    char also_what[96];  /* what those are, for messages ("the EMA weights") */
    size_t shared_budget; /* the node's processes share the machine's memory: this process's
                             share as first read (0: not yet), kept for r's later plans */
    char shared_how[224]; /* what that figure is, for messages */
} rn_runner;

/* rn_runner_net's mode RN_NET_TRAIN | RN_RUNNER_RECOMPUTE_AUTO with micro 0: when the
 * largest micro-batch that fits needs accumulation, also plan with recomputation
 * (RN_NET_RECOMPUTE) and take its larger micro-batch where that should be faster: on a
 * GPU, when the plain micro-batch is below 32 images and recomputation fits at least
 * twice as many (or when nothing fits without it); never on the CPU, where an image costs
 * the same at any micro-batch and recomputation adds a forward. With a given micro: only
 * when that micro-batch does not fit without recomputation and does with it (the
 * micro-batch many processes agreed on). r->recompute says which. */
enum { RN_RUNNER_RECOMPUTE_AUTO = 0x200 };

/* Zero r and open the backend for device ("auto", "cpu", "cuda[:N]") with threads CPU
 * threads (0: all cores) and the backend settings opts (NULL: defaults). Errors as
 * rn_backend_create. */
int rn_runner_open(rn_runner *r, const char *device, int threads, const rn_backend_opts *opts);

/* Point the loader's batch allocator at be's pinned host memory when be is a device
 * (batches then copy asynchronously); nothing on the CPU. Loaders so made must be
 * destroyed before the runner closes. */
void rn_runner_loader_memory(rn_loader_opts *lo, rn_backend *be);

/* Build the network for ck's model: batches of `batch` images of crop x crop in
 * micro-batches of `micro` (0: the largest divisor of batch that fits), mode
 * RN_NET_TRAIN (| RN_NET_RECOMPUTE, or | RN_RUNNER_RECOMPUTE_AUTO) or RN_NET_INFER,
 * compute type dtype; checked against the memory plan
 * (mem_limit bytes, or 0 for the device's free memory less 5%) before anything is
 * allocated, then loaded with ck's weights (rn_net_load), plus staging for batches of
 * `batch`. Sets r->net, r->micro, r->crop, r->recompute and r->recompute_saved.
 * Errors: RN_ENOMEM (the plan does not fit, or an allocation failed: the message gives the need, what is usable and what
 * micro-batch or batch fits), RN_ENOTSUP (dtype on a backend that cannot compute in
 * it), those of rn_net_create and rn_net_load. */
int rn_runner_net(rn_runner *r, const rn_ckpt *ck, int batch, int micro, size_t mem_limit, int crop, int mode,
                  int dtype);

/* The micro-batch (*micro_out) and recomputation (*recompute_out: 0 or 1) that
 * rn_runner_net would build with the same arguments, planned against the memory budget
 * without allocating anything: what many processes compare before they build (rn-train
 * takes one plan for all). With a given micro and RN_RUNNER_RECOMPUTE_AUTO, both
 * functions recompute when the micro-batch fits only that way. Errors: rn_runner_net's
 * planning ones (RN_ENOMEM: nothing fits, naming what does; RN_ENOTSUP). */
int rn_runner_plan(rn_runner *r, const rn_ckpt *ck, int batch, int micro, size_t mem_limit, int crop, int mode,
                   int dtype, int *micro_out, int *recompute_out);

/* Start b's pixels and labels on their way to the device (the whole batch, overlapping
 * whatever the device is still computing; r->px and r->labels then point at them); on
 * the CPU the batch is read in place. Call
 * rn_backend_upload_wait before releasing b. Errors: RN_EINVAL (a batch larger than
 * rn_runner_net's), those of rn_backend_upload_async. */
int rn_runner_stage(rn_runner *r, const rn_batch *b);

/* Normalise n images starting at image `first` of the batch last staged (ImageNet
 * mean/std) into the network's input. */
int rn_runner_input(rn_runner *r, const rn_batch *b, int first, int n);
/* rn_runner_input with the images mixed as d says (rn_input_mix: mixup or cutmix within
 * images [first, first + n), the mixing unit of rn/mix.h). Each image and its partner are
 * erased by their own b->erase boxes before they are mixed, as torchvision's per-image
 * RandomErasing runs before the batch's RandomMixup / RandomCutmix. */
int rn_runner_input_mix(rn_runner *r, const rn_batch *b, int first, int n, const rn_mix_desc *d);

/* Forward n images from image `first` of the batch last staged (rn_runner_stage) with
 * running BN statistics, and copy their logits ((n, classes) fp32) into host memory:
 * the inference step of rn-eval, --val and rn-predict. Errors: those of the network
 * and the backend. */
int rn_runner_logits(rn_runner *r, const rn_batch *b, int first, int n, float *logits);

/* A dataset the network can take: RGB, no more classes than the model's outputs.
 * Errors: RN_EDATA naming path and the fix. */
int rn_runner_check_data(const char *path, const rn_dataset_info *info, const rn_ckpt *ck);

/* Free the network, the staging buffers and the backend; r is zeroed. */
void rn_runner_close(rn_runner *r);

#endif
