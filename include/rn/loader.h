/* rn/loader.h: batches of augmented images from an rn dataset, on worker threads.
 *
 *   rn_loader_opts o;
 *   rn_loader_defaults(&o);              // crop 224, batch 256, train transform
 *   o.seed = 1;
 *   rn_loader *l;
 *   if (rn_loader_create("train.lmdb", &o, &l)) fail(rn_last_error());
 *   rn_loader_seek(l, state.data_epoch, state.data_index);   // resume (optional)
 *   for (each step) {
 *       rn_batch b;
 *       if (rn_loader_next(l, &b)) fail(rn_last_error());   // blocks until ready
 *       use b.pixels (b.n, b.h, b.w, b.c) u8 NHWC and b.labels (b.n) int32;
 *       rn_loader_normalize(&b, x, RN_IMAGENET_MEAN, RN_IMAGENET_STD);  // CPU path
 *       rn_loader_release(l, &b);                             // slot back to the workers
 *       rn_loader_position(l, &state.data_epoch, &state.data_index);  // for checkpoints
 *   }
 *   rn_loader_destroy(l);
 *
 * Order and randomness: epoch e visits the records in a permutation drawn from
 * (seed, e) (identity without shuffle). The augmentation of record r in epoch e is drawn
 * from (seed, e, r) with Philox. Workers only decide who computes what, never what is
 * computed: the batches are byte-identical for any worker count, prefetch depth or
 * timing, and after a seek to a saved position.
 *
 * Train transform: the chain o.aug (rn/augment.h), by default torchvision's
 * RandomResizedCrop(crop) (10 attempts, then the centre-crop fallback) and a horizontal
 * flip with p = 0.5. Its crop op and flip make the u8 pixels; erase only draws each
 * image's box, carried in b.erase and written by the normalisation (rn_loader_normalize
 * here, rn_input_erase on a backend), as torchvision erases the normalised tensor.
 * Eval transform (train = 0, or an empty chain): resize the shorter side to `resize` (default
 * round(crop * 256 / 224)), then centre crop crop x crop (zero padding where the image is
 * smaller, as torchvision; rn/transform.h, shared with rn-predict). Resizing is PIL's
 * antialiased bilinear (see rn/image.h).
 * JPEG records are decoded at the smallest DCT scale that still holds the crop at full
 * output resolution (exact = 1 decodes at full size: pixels then match torchvision+PIL).
 *
 * Epochs: a batch never spans two epochs. With drop_last the records of an epoch that do
 * not fill a batch are not used; otherwise the epoch's last batch is short (n < batch).
 * The loader runs on across epochs; b.epoch and b.last tell where a batch belongs.
 *
 * Memory: `prefetch` batch buffers (pixels + labels), allocated once through the
 * allocator hook (rn-train and rn-eval pass the backend's rn_backend_host_alloc: pinned
 * host memory on a GPU, from which each batch is copied asynchronously; the default is
 * ordinary aligned host memory). The caller may hold
 * at most prefetch - 1 batches at a time. */
#ifndef RN_LOADER_H
#define RN_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "rn/augment.h"
#include "rn/augops.h"
#include "rn/dataset.h"
#include "rn/image.h"
#include "rn/jpeg.h"

#define RN_LOADER_CROP 224
#define RN_LOADER_BATCH 256
#define RN_LOADER_PREFETCH 4

/* ImageNet per-channel mean and std (torchvision's), for rn_loader_normalize. */
extern const float RN_IMAGENET_MEAN[3], RN_IMAGENET_STD[3];

typedef struct {
    int crop;       /* output side S in pixels */
    int batch;      /* images per batch */
    int workers;    /* decoding threads (0: all cores) */
    int prefetch;   /* batch buffers in the ring, >= 2 */
    int train;      /* 1: training transform; 0: eval transform */
    rn_augment aug; /* train: the chain (rn/augment.h; n = 0: the eval transform) */
    int resize;     /* eval: shorter side before the centre crop; -1: round(S*256/224); 0: none */
    int shuffle;    /* -1: same as train; 0 or 1 */
    int drop_last;  /* drop the incomplete last batch of each epoch */
    int exact;      /* decode JPEGs at full size (no DCT scaling) */
    uint64_t seed;
    int64_t epoch_batches; /* > 0: every epoch is only the first N batches of epoch 0, in
                       epoch 0's order with epoch 0's augmentation draws: the same images,
                       crops and flips every epoch (rn-train --overfit-batches); 0: whole
                       epochs */
    int part, parts;/* parts > 1: deliver only slice `part` of each batch (data-parallel
                       ranks): of a batch of n, images [part*n/parts, (part+1)*n/parts);
                       the order, the augmentation and the position stay the whole
                       batch's, so every rank walks the same batches. 0, 0: all of it */
    int repeats;    /* train: repeated augmentation (torchvision's RASampler, rn-train
                       --ra-reps): K > 1 copies of each record, each with its own draws,
                       where one record stood. The epoch's positions are cut into blocks
                       of `batch` (n, a multiple of K); block b holds the n / K records
                       order[b * n/K ..], each K times, copy r of its j-th at position
                       j + r * n/K of the block, so that a batch (a block, unless a seek
                       put it between two) cut into K or more slices (ranks x
                       micro-batches) holds each record once per slice. An epoch keeps its
                       count of images: about count / K records, each K times. Copy r of
                       record i draws as sample i + r * count (0 or 1: off) */
    int unit;       /* parts > 1: slice in whole runs of `unit` images (0 or 1: images):
                       of a batch of n, units U = ceil(n/unit) (the last one short), slice
                       `part` holds units [part*U/parts, (part+1)*U/parts). Evaluation
                       uses it so that every slice starts at a multiple of its forward's
                       size within the epoch (rn_eval_loader_open) */
    int interleave; /* parts > 1, 1: slice `part` holds units part, part + parts,
                       part + 2 x parts, ... in that order (rn-train's ranks: unit = the
                       micro-batch, so a rank's k-th micro-batch is micro-batch
                       k x parts + part of the whole batch); rn_batch.first is then the
                       first unit's first image. 0: consecutive units, as above */
    /* buffer allocator (NULL: aligned host memory); free gets the same ctx */
    void *(*alloc)(size_t bytes, void *ctx);
    void (*free)(void *p, void *ctx);
    void *alloc_ctx;
} rn_loader_opts;

/* Defaults: crop 224, batch 256, all cores, prefetch 4, train, the chain rrc,flip
 * (rn_augment_default), resize -1, shuffle -1, no drop_last, seed 0. */
void rn_loader_defaults(rn_loader_opts *o);

typedef struct {
    uint8_t *pixels;  /* (n, h, w, c) u8 NHWC; owned by the loader */
    int32_t *labels;  /* (n) */
    int n, h, w, c;   /* n <= batch; h = w = crop; c = dataset channels (1 or 3) */
    int64_t epoch;    /* the epoch these samples belong to */
    int64_t index;    /* position of the first sample of the whole batch within that
                         epoch's order (with parts, this slice starts at index + first) */
    int first;        /* parts: the slice's first image within the whole batch */
    int total;        /* images in the whole batch (n when not sliced) */
    int last;         /* 1 for the last batch of its epoch */
    const rn_erase *erase; /* (n) each image's erase box, to write after normalising
                         (rn_erase_apply, rn_input_erase); NULL: the chain has no erase */
    uint64_t erase_key;   /* the key and epoch of the random erase values */
    int64_t erase_epoch;
    int slot;         /* internal: which ring buffer */
} rn_batch;

typedef struct rn_loader rn_loader;

/* Open the dataset and start the workers at position (0, 0). Errors: RN_EINVAL (bad
 * options, e.g. batch larger than the dataset with drop_last), RN_EIO/RN_EDATA (dataset),
 * RN_ENOMEM. */
int rn_loader_create(const char *path, const rn_loader_opts *o, rn_loader **out);

/* The next batch, blocking until it is ready. Errors: RN_EDATA (a record could not be
 * decoded: the message names the record key and its source file), RN_EINVAL (all
 * buffers are held: release some). */
int rn_loader_next(rn_loader *l, rn_batch *b);

/* Give a batch's buffer back to the workers. b must not be used afterwards. */
void rn_loader_release(rn_loader *l, rn_batch *b);

/* Position after the last batch returned by rn_loader_next: (epoch, index) of the next
 * sample to be delivered. Save it with a checkpoint; rn_loader_seek resumes there. */
void rn_loader_position(const rn_loader *l, int64_t *epoch, int64_t *index);

/* Continue from (epoch, index): work in flight is dropped and held batches are
 * released. index may be any value 0..count (count means the start of epoch + 1).
 * Errors: RN_EINVAL. */
int rn_loader_seek(rn_loader *l, int64_t epoch, int64_t index);

/* Batches in one epoch, and the dataset's description (classes, mean/std). */
int64_t rn_loader_batches_per_epoch(const rn_loader *l);
/* The same count without a loader: an epoch of count records in batches of `batch`, the
 * last partial one dropped when drop_last, at most epoch_batches of them when that is > 0
 * (rn_loader_opts' fields of those names; rn-train --print-lr). */
int64_t rn_loader_epoch_batches(uint64_t count, int batch, int drop_last, int64_t epoch_batches);
const rn_dataset_info *rn_loader_info(const rn_loader *l);

/* Stop the workers and free everything (also buffers still held). NULL is a no-op. */
void rn_loader_destroy(rn_loader *l);

/* A worker's span of work, for a profile's trace (rn/prof.h): worker (0-based) decoded
 * and transformed `images` images of batch number seq (counted from the loader's start)
 * between t0 and t1, seconds on CLOCK_MONOTONIC (rn_report_clock's time base). Called on
 * the worker's thread with the loader's lock held: it must be quick and must not call
 * the loader. */
typedef void (*rn_loader_trace_fn)(void *ctx, int worker, int64_t seq, int images, double t0, double t1);
/* Report every chunk the workers finish from now on to fn (NULL: stop). Once this returns
 * with NULL, fn is not called again, so its ctx may be freed. */
void rn_loader_set_trace(rn_loader *l, rn_loader_trace_fn fn, void *ctx);

/* dst (n, h, w, c) float NHWC = (pixels / 255 - mean[c]) / std[c], as torchvision's
 * ToTensor + Normalize compute it (but channels-last), then the batch's erase boxes
 * (rn_erase_apply). */
void rn_loader_normalize(const rn_batch *b, float *dst, const float *mean, const float *std);

/* What one worker keeps between records for rn_loader_transform: zero-initialise, set
 * jpeg to a handle of the caller's (its max pixels apply; the caller destroys it), free
 * the rest with rn_loader_scratch_free. */
typedef struct {
    rn_jpeg *jpeg;
    rn_image_ws ws;
    rn_aug_ws aws; /* the pixel ops' (rn/augops.h) */
} rn_loader_scratch;
void rn_loader_scratch_free(rn_loader_scratch *sc);
/* One record through the loader's transform, as a worker applies it after reading the
 * record: o's train or eval transform (crop, resize, aug, exact) with
 * the draws of (o->seed, epoch, rec), rec the sample (the record's index, or with
 * o->repeats copy r of record i: i + r * count), the JPEG decoded at its DCT scale and only over the
 * region the crop reads. channels is the dataset's (1 or 3); dst holds crop x crop x
 * channels bytes; erase (NULL when not wanted) gets the image's erase box (w = 0: none).
 * o is as rn_loader_create accepts it. Errors (without the record's name; the loader adds it): RN_EDATA (the
 * record's channels, sizes or encoding disagree, or its JPEG does not decode), RN_EINVAL
 * (crop <= 0), RN_ENOMEM. */
int rn_loader_transform(const rn_loader_opts *o, int channels, const rn_sample *s, int64_t epoch, uint32_t rec,
                        rn_loader_scratch *sc, uint8_t *dst, rn_erase *erase);
/* A JPEG contact sheet of the batch (a grid of its images, cols per row; 0: square-ish)
 * into a malloc'ed buffer. Errors: RN_ENOMEM, RN_EDATA. */
int rn_loader_contact_sheet(const rn_batch *b, int cols, uint8_t **jpeg, size_t *len);

#endif
