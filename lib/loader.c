#include "rn/loader.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rn/err.h"
#include "rn/image.h"
#include "rn/jpeg.h"
#include "rn/rng.h"
#include "rn/transform.h"

const float RN_IMAGENET_MEAN[3] = {0.485f, 0.456f, 0.406f};
const float RN_IMAGENET_STD[3] = {0.229f, 0.224f, 0.225f};

/* Philox purposes of the loader's randomness */
#define PURPOSE_SHUFFLE 0x6c6f61647368756full /* "loadshuo" */
#define PURPOSE_AUGMENT 0x6c6f616461756765ull /* "loadauge" */
#define PURPOSE_ERASE 0x6c6f616465726173ull   /* "loaderas": erase's random values */
/* samples per work item: small enough to spread a batch over the workers */
#define CHUNK 8

void rn_loader_defaults(rn_loader_opts *o) {
    memset(o, 0, sizeof *o);
    o->crop = RN_LOADER_CROP;
    o->batch = RN_LOADER_BATCH;
    o->prefetch = RN_LOADER_PREFETCH;
    o->train = 1;
    rn_augment_default(&o->aug);
    o->resize = -1;
    o->shuffle = -1;
}

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD };

typedef struct {
    int state;
    int64_t seq, epoch, index;
    int n, last, chunks, done;
    int first, total;  /* the slice: images [first, first + n) of a batch of total */
    uint32_t *ids;     /* (batch) record indices */
    uint8_t *pixels;   /* (batch, S, S, c) */
    int32_t *labels;   /* (batch) */
    rn_erase *erase;   /* (batch) erase boxes, or NULL when the chain has none */
    int err;           /* first error of a sample, with its message */
    char msg[1024];
} slot;

typedef struct worker worker;

struct rn_loader {
    rn_loader_opts o;
    rn_dataset *ds;
    uint64_t count;
    int c, S, shuffle, nslots, nworkers;
    slot *slots;
    worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t work, ready, idle;
    int stop, paused, active;
    /* work distribution */
    int64_t task_seq;
    int task_chunk;
    int64_t fill_epoch, fill_index; /* where the next planned batch starts */
    uint32_t *perm;                 /* (count) order of perm_epoch */
    int64_t perm_epoch;
    /* consumer */
    int64_t cons_seq, pos_epoch, pos_index;
    rn_loader_trace_fn trace; /* rn_loader_set_trace, under mu */
    void *trace_ctx;
};

struct worker {
    rn_loader *l;
    int index;
    pthread_t th;
    int started;
    rn_dataset_reader *rd;
    rn_loader_scratch sc;
};

static void *def_alloc(size_t n, void *ctx) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0) return NULL;
    rn_advise_huge(p, n);
    return p;
}
static void def_free(void *p, void *ctx) { free(p); }

/* records an epoch visits: all count, or the first epoch_batches batches' */
static uint64_t epoch_records(uint64_t count, int batch, int64_t epoch_batches) {
    uint64_t k = (uint64_t)epoch_batches * (uint64_t)batch;
    return epoch_batches > 0 && k < count ? k : count;
}

static uint64_t epoch_end(const rn_loader *l) { return epoch_records(l->count, l->o.batch, l->o.epoch_batches); }

/* normalise a position: past the end of an epoch (or, with drop_last, too few records
 * left for a batch) is the start of the next one */
static void norm_pos(const rn_loader *l, int64_t *e, int64_t *i) {
    uint64_t end = epoch_end(l);
    if ((uint64_t)*i >= end || (l->o.drop_last && end - (uint64_t)*i < (uint64_t)l->o.batch)) {
        ++*e;
        *i = 0;
    }
}

static void make_perm(rn_loader *l, int64_t epoch) {
    for (uint64_t i = 0; i < l->count; i++) l->perm[i] = (uint32_t)i;
    if (l->shuffle) {
        uint64_t key = rn_rng_key(l->o.seed, PURPOSE_SHUFFLE);
        for (uint64_t i = l->count; i > 1; i--) {
            uint32_t r[4];
            rn_philox(key, (uint64_t)epoch, i, r);
            uint64_t u = ((uint64_t)r[0] << 32) | r[1];
            uint64_t j = (uint64_t)(((unsigned __int128)u * i) >> 64);
            uint32_t t = l->perm[i - 1];
            l->perm[i - 1] = l->perm[j];
            l->perm[j] = t;
        }
    }
    l->perm_epoch = epoch;
}

/* assign the next batch (from the fill cursor) to slot s; called with mu held */
static void plan(rn_loader *l, slot *s, int64_t seq) {
    int64_t e = l->fill_epoch, i = l->fill_index;
    int64_t pe = l->o.epoch_batches > 0 ? 0 : e; /* epoch_batches: epoch 0's order, every epoch */
    if (pe != l->perm_epoch) make_perm(l, pe);
    int64_t left = (int64_t)epoch_end(l) - i;
    int total = left < l->o.batch ? (int)left : l->o.batch, P = l->o.parts > 1 ? l->o.parts : 1,
        p = P > 1 ? l->o.part : 0;
    int64_t u = l->o.unit > 1 ? l->o.unit : 1, U = (total + u - 1) / u;
    int stripes = P > 1 && l->o.interleave;
    if (stripes) {
        /* units p, p + P, p + 2P, ...: the last of them may be the batch's short one */
        int64_t held = U > p ? (U - p + P - 1) / P : 0, last = ((held - 1) * P + p) * u; /* its first image */
        s->first = (int)(held ? p * u : total);
        s->n = held ? (int)((held - 1) * u + (total - last < u ? total - last : u)) : 0;
    } else {
        int64_t lo = U * p / P * u, hi = U * (p + 1) / P * u;
        s->first = (int)(lo < total ? lo : total);
        s->n = (int)(hi < total ? hi : total) - s->first;
    }
    s->total = total;
    /* position p, in block b = p / n at j + r * n/K: copy r of record order[b * n/K + j]
       (a function of the position, so a seek between blocks lands on the same images;
       without repeats, K = 1, that is order[p]) */
    int64_t n = l->o.batch, per = n / (l->o.repeats > 1 ? l->o.repeats : 1);
    for (int k = 0; k < s->n; k++) {
        int64_t at = stripes ? (k / u * P + l->o.part) * u + k % u : s->first + k; /* in the batch */
        int64_t p = i + at, o = p % n;
        s->ids[k] = l->perm[p / n * per + o % per] + (uint32_t)(o / per * (int64_t)l->count);
    }
    s->seq = seq;
    s->epoch = e;
    s->index = i;
    s->chunks = s->n ? (s->n + CHUNK - 1) / CHUNK : 1; /* an empty slice: one empty chunk */
    s->done = 0;
    s->err = 0;
    s->msg[0] = 0;
    s->state = SLOT_FILLING;
    int64_t ne = e, ni = i + total;
    norm_pos(l, &ne, &ni);
    s->last = ne != e;
    l->fill_epoch = ne;
    l->fill_index = ni;
}

/* --------------------------------------------------------------- one sample */

void rn_loader_scratch_free(rn_loader_scratch *sc) {
    rn_image_ws_free(&sc->ws);
    rn_aug_ws_free(&sc->aws);
}

static int render(const rn_loader_opts *o, int c, const rn_sample *s, int W, int H, const rn_jpeg_info *jip,
                  rn_window *wp, rn_loader_scratch *w, uint8_t *dst);

/* crop-pad: the image at its stored size, padded, an S x S window drawn over the padded
 * image (torchvision's RandomCrop), mirrored when flip */
static int crop_pad(const rn_aug_step *cp, int S, int c, const rn_sample *smp, int W, int H, rn_draws *d,
                    const rn_aug_step *flip, rn_image_stream *st, rn_loader_scratch *w, uint8_t *dst) {
    int pad = (int)cp->v[0], mode = (int)cp->v[1], fill = (int)cp->v[2], i, j, rc;
    if (rn_aug_crop_offsets(W, H, pad, S, d, &i, &j))
        return rn_errorf(RN_EDATA, "a %dx%d image padded by %d is smaller than the %d crop of crop-pad (use rrc, a "
                         "smaller --crop, or more padding)", W, H, pad, S);
    if (mode == RN_AUG_PAD_REFLECT && (pad >= W || pad >= H))
        return rn_errorf(RN_EDATA, "crop-pad: reflect padding %d needs an image wider and taller than that, not "
                         "%dx%d (use edge or constant)", pad, W, H);
    int fl = flip && rn_u01(rn_image_stream_next(st)) < (float)flip->v[0];
    const uint8_t *px = smp->data;
    if (smp->enc == RN_ENC_JPEG) {
        int want[4] = {0, 0, W, H}, got[4];
        if ((rc = rn_jpeg_decode_region(w->jpeg, smp->data, smp->len, c, W, H, want, &px, got)) != RN_OK) return rc;
        if (got[0] || got[1] || got[2] != W || got[3] != H)
            return rn_errorf(RN_EDATA, "crop-pad: the JPEG decoded to a %dx%d part, not the whole %dx%d", got[2],
                             got[3], W, H);
    }
    rn_aug_crop_pad(px, W, H, c, pad, mode, fill, i, j, S, fl, dst);
    return RN_OK;
}

int rn_loader_transform(const rn_loader_opts *o, int c, const rn_sample *s, int64_t epoch, uint32_t rec,
                        rn_loader_scratch *w, uint8_t *dst, rn_erase *erase) {
    const int S = o->crop;
    const rn_sample smp = *s;
    int rc = RN_OK;
    if (S <= 0) return rn_errorf(RN_EINVAL, "loader: crop %d must be positive", S);
    if ((int)smp.channels != c || (c != 1 && c != 3))
        return rn_errorf(RN_EDATA, "%u channels, the dataset says %d (rebuild with rn-prep)", smp.channels, c);
    if (smp.width == 0 || smp.height == 0 || smp.width > INT32_MAX || smp.height > INT32_MAX ||
        (smp.enc == RN_ENC_RAW && (uint64_t)smp.width * smp.height * c != smp.len) ||
        (smp.enc != RN_ENC_RAW && smp.enc != RN_ENC_JPEG))
        return rn_errorf(RN_EDATA, "bad image %ux%ux%u (encoding %d) with %zu bytes", smp.width, smp.height,
                         smp.channels, smp.enc, smp.len);
    int W = (int)smp.width, H = (int)smp.height;
    rn_jpeg_info ji;
    memset(&ji, 0, sizeof ji);
    if (smp.enc == RN_ENC_JPEG) {
        if ((rc = rn_jpeg_header(w->jpeg, smp.data, smp.len, &ji)) != RN_OK) return rc;
        if (ji.width != W || ji.height != H)
            return rn_errorf(RN_EDATA, "JPEG is %dx%d, the record says %dx%d", ji.width, ji.height, W, H);
    }
    /* the chain's draws, in its order, from one stream of (seed, epoch, record) */
    const rn_augment *aug = &o->aug;
    const rn_aug_step *rrc = o->train ? rn_augment_find(aug, RN_AUG_OP_RRC) : NULL;
    const rn_aug_step *cp = o->train ? rn_augment_find(aug, RN_AUG_OP_CROP_PAD) : NULL;
    const rn_aug_step *flip = o->train ? rn_augment_find(aug, RN_AUG_OP_FLIP) : NULL;
    const rn_aug_step *er = o->train ? rn_augment_find(aug, RN_AUG_OP_ERASE) : NULL;
    rn_image_stream st;
    rn_draws d;
    rn_image_stream_init(&st, &d, rn_rng_key(o->seed, PURPOSE_AUGMENT), (uint64_t)epoch, rec);
    if (erase) *erase = (rn_erase){.rec = rec};
    if (cp) {
        if ((rc = crop_pad(cp, S, c, &smp, W, H, &d, flip, &st, w, dst)) != RN_OK) return rc;
    } else {
        /* geometry in source pixels: resize box -> out_w x out_h, then window (ox, oy, S, S) */
        rn_window win;
        int flip_after = 0;
        if (rrc) {
            int b[4];
            rn_image_rrc_box(W, H, rrc->v[0], rrc->v[1], rrc->v[2], rrc->v[3], &d, b);
            win = (rn_window){.box = {b[0], b[1], b[0] + b[2], b[1] + b[3]}, .out_w = S, .out_h = S};
            win.flip = flip && rn_u01(rn_image_stream_next(&st)) < (float)flip->v[0];
        } else {
            rn_window_eval(W, H, S, o->resize, &win); /* resize < 0: round(S*256/224), there */
            /* after the centre crop, as torchvision's [Resize, CenterCrop, RandomHorizontalFlip] */
            flip_after = flip && rn_u01(rn_image_stream_next(&st)) < (float)flip->v[0];
        }
        if ((rc = render(o, c, &smp, W, H, &ji, &win, w, dst)) != RN_OK) return rc;
        if (flip_after) rn_image_flip(dst, S, S, c);
    }
    /* the pixel ops (rn/augops.h), in chain order, on the S x S crop */
    for (int k = 0; o->train && k < aug->n; k++) {
        if (rn_augment_op_stage(aug->step[k].op) != RN_AUG_STAGE_PIXEL) continue;
        rn_aug_policy pol;
        rn_aug_draw dr;
        if ((rc = rn_augment_policy(&aug->step[k], &pol)) != RN_OK ||
            (rc = rn_aug_policy_draw(&pol, &st, S, S, &dr)) != RN_OK ||
            (rc = rn_aug_policy_apply(&pol, &dr, dst, S, S, c, &w->aws)) != RN_OK)
            return rc;
    }
    if (er && erase && rn_u01(rn_image_stream_next(&st)) < (float)er->v[0]) {
        int b[4];
        rn_aug_erase_box(S, S, er->v[1], er->v[2], er->v[3], er->v[4], &d, b);
        *erase = (rn_erase){.x = b[0], .y = b[1], .w = b[2], .h = b[3], .rec = rec, .random = (int32_t)er->v[5]};
    }
    return RN_OK;
}

/* render an eval or rrc window of the record, decoding only what it reads */
static int render(const rn_loader_opts *o, int c, const rn_sample *s, int W, int H, const rn_jpeg_info *jip,
                  rn_window *wp, rn_loader_scratch *w, uint8_t *dst) {
    const int S = o->crop;
    const rn_sample smp = *s;
    const rn_jpeg_info ji = *jip;
    rn_window win = *wp;
    int rc = RN_OK;
    double *box = win.box;
    const int out_w = win.out_w, out_h = win.out_h, ox = win.ox, oy = win.oy, pad = win.pad;
    const uint8_t *px = smp.data;
    int pw = W, ph = H, part[4] = {0, 0, W, H}; /* px holds part of the pw x ph image */
    if (smp.enc == RN_ENC_JPEG) {
        /* smallest DCT scale at which the box still has >= output pixels per side */
        int sw = W, sh = H;
        if (!o->exact) {
            double bw = box[2] - box[0], bh = box[3] - box[1];
            int need_w = (int)ceil(W * (double)out_w / bw), need_h = (int)ceil(H * (double)out_h / bh);
            rn_jpeg_scaled_size(&ji, need_w, need_h, &sw, &sh);
        }
        if (sw != W || sh != H) {
            double fx = (double)sw / W, fy = (double)sh / H;
            box[0] *= fx, box[2] *= fx, box[1] *= fy, box[3] *= fy;
            if (box[2] > sw) box[2] = sw;
            if (box[3] > sh) box[3] = sh;
        }
        /* the source pixels the output window reads: its filter span plus a margin
         * (whole image when padding); only they are decoded where libjpeg allows */
        int want[4] = {0, 0, sw, sh}, got[4];
        if (!pad) {
            double scx = (box[2] - box[0]) / out_w, scy = (box[3] - box[1]) / out_h;
            double spx = (scx < 1 ? 1 : scx) + 2, spy = (scy < 1 ? 1 : scy) + 2;
            int x0 = (int)floor(box[0] + ox * scx - spx), x1 = (int)ceil(box[0] + (ox + S) * scx + spx);
            int y0 = (int)floor(box[1] + oy * scy - spy), y1 = (int)ceil(box[1] + (oy + S) * scy + spy);
            if (x0 < 0) x0 = 0;
            if (y0 < 0) y0 = 0;
            if (x1 > sw) x1 = sw;
            if (y1 > sh) y1 = sh;
            want[0] = x0, want[1] = y0, want[2] = x1 - x0, want[3] = y1 - y0;
        }
        if ((rc = rn_jpeg_decode_region(w->jpeg, smp.data, smp.len, c, sw, sh, want, &px, got)) != RN_OK) return rc;
        memcpy(part, got, sizeof part);
        pw = sw, ph = sh;
    }
    return rn_window_render(px, part, pw, ph, c, &win, S, dst, &w->ws);
}

/* sample id: the record, or with repeats copy r of record i, i + r * count */
static int do_sample(worker *w, int64_t epoch, uint32_t id, uint8_t *dst, int32_t *label, rn_erase *erase) {
    rn_loader *l = w->l;
    rn_sample smp;
    uint32_t rec = (uint32_t)(id % l->count);
    int rc = rn_dataset_read(w->rd, rec, &smp);
    if (rc) return rc;
    *label = smp.label;
    if ((rc = rn_loader_transform(&l->o, l->c, &smp, epoch, id, &w->sc, dst, erase)) != RN_OK)
        return rn_error_context(rc, "%s: record %08u (%s)", rn_dataset_path(l->ds), rec, smp.name);
    return RN_OK;
}

static void *work(void *arg) {
    worker *w = arg;
    rn_loader *l = w->l;
    size_t img = (size_t)l->S * l->S * l->c;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        slot *s = NULL;
        while (!l->stop) {
            s = &l->slots[l->task_seq % l->nslots];
            if (!l->paused && (l->task_chunk > 0 || s->state == SLOT_FREE)) break;
            pthread_cond_wait(&l->work, &l->mu);
        }
        if (l->stop) break;
        if (l->task_chunk == 0) plan(l, s, l->task_seq);
        int chunk = l->task_chunk;
        if (++l->task_chunk == s->chunks) {
            l->task_seq++;
            l->task_chunk = 0;
        }
        l->active++;
        int64_t epoch = l->o.epoch_batches > 0 ? 0 : s->epoch; /* epoch_batches: epoch 0's draws */
        pthread_mutex_unlock(&l->mu);

        int64_t seq = s->seq;
        int k0 = chunk * CHUNK, k1 = k0 + CHUNK < s->n ? k0 + CHUNK : s->n, err = 0;
        char msg[1024] = "";
        struct timespec ta, tb;
        clock_gettime(CLOCK_MONOTONIC, &ta);
        for (int k = k0; k < k1 && !err; k++) {
            err = do_sample(w, epoch, s->ids[k], s->pixels + (size_t)k * img, &s->labels[k],
                            s->erase ? &s->erase[k] : NULL);
            if (err) snprintf(msg, sizeof msg, "%s", rn_last_error());
        }

        clock_gettime(CLOCK_MONOTONIC, &tb);
        pthread_mutex_lock(&l->mu);
        if (l->trace)
            l->trace(l->trace_ctx, w->index, seq, k1 - k0, (double)ta.tv_sec + 1e-9 * (double)ta.tv_nsec,
                     (double)tb.tv_sec + 1e-9 * (double)tb.tv_nsec);
        l->active--;
        if (err && !s->err) {
            s->err = err;
            memcpy(s->msg, msg, sizeof msg);
        }
        if (++s->done == s->chunks) {
            s->state = SLOT_READY;
            pthread_cond_broadcast(&l->ready);
        }
        if (l->active == 0) pthread_cond_broadcast(&l->idle);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int rn_loader_create(const char *path, const rn_loader_opts *o, rn_loader **out) {
    *out = NULL;
    if (o->crop <= 0 || o->batch <= 0 || o->prefetch < 2 || o->workers < 0 || o->workers > 1024)
        return rn_errorf(RN_EINVAL, "loader: crop %d, batch %d, prefetch %d, workers %d: crop and batch must be "
                         "positive, prefetch >= 2, workers 0..1024", o->crop, o->batch, o->prefetch, o->workers);
    if (o->aug.n < 0 || o->aug.n > RN_AUG_MAX) return rn_errorf(RN_EINVAL, "loader: a chain of %d ops", o->aug.n);
    if (o->parts > 1 && (o->part < 0 || o->part >= o->parts))
        return rn_errorf(RN_EINVAL, "loader: part %d of %d", o->part, o->parts);
    if (o->unit < 0) return rn_errorf(RN_EINVAL, "loader: slices of %d images", o->unit);
    rn_loader *l = rn_calloc(1, sizeof *l);
    if (!l) return RN_ENOMEM;
    int rc = RN_OK;
    l->o = *o;
    if (!l->o.alloc || !l->o.free) l->o.alloc = def_alloc, l->o.free = def_free, l->o.alloc_ctx = NULL;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->work, NULL);
    pthread_cond_init(&l->ready, NULL);
    pthread_cond_init(&l->idle, NULL);
    if ((rc = rn_dataset_open(path, &l->ds)) != RN_OK) goto fail;
    const rn_dataset_info *info = rn_dataset_get_info(l->ds);
    l->count = info->count;
    l->c = info->channels;
    l->S = o->crop;
    l->shuffle = o->shuffle < 0 ? o->train : o->shuffle;
    if (l->count == 0 || l->count > UINT32_MAX) {
        rc = rn_errorf(RN_EINVAL, "%s: %" PRIu64 " records: the loader needs 1 .. 2^32-1", path, l->count);
        goto fail;
    }
    if (o->repeats > 1) {
        /* each block of `batch` positions takes batch / repeats records from the order:
           the epoch's positions (below count) reach ceil(count / batch) blocks */
        uint64_t B = (uint64_t)o->batch, nb = (l->count + B - 1) / B;
        const char *why = !o->train                                  ? "training batches only"
                          : o->batch % o->repeats                    ? "the batch must be a multiple of the repeats"
                          : l->count * (uint64_t)o->repeats > UINT32_MAX ? "records x repeats past 2^32-1"
                          : nb * (B / (uint64_t)o->repeats) > l->count   ? "fewer records than one batch takes"
                                                                         : NULL;
        if (why) {
            rc = rn_errorf(RN_EINVAL, "%s: repeated augmentation x%d, batch %d, %" PRIu64 " records: %s", path,
                           o->repeats, o->batch, l->count, why);
            goto fail;
        }
    }
    if (o->drop_last && l->count < (uint64_t)o->batch) {
        rc = rn_errorf(RN_EINVAL, "%s: %" PRIu64 " records cannot fill one batch of %d with drop-last (use a smaller batch)",
                       path, l->count, o->batch);
        goto fail;
    }
    l->perm = rn_malloc(l->count * sizeof *l->perm);
    l->nslots = o->prefetch;
    l->slots = rn_calloc((size_t)l->nslots, sizeof *l->slots);
    if (!l->perm || !l->slots) { rc = RN_ENOMEM; goto fail; }
    l->perm_epoch = -1;
    size_t img = (size_t)l->S * l->S * l->c;
    for (int i = 0; i < l->nslots; i++) {
        slot *s = &l->slots[i];
        s->ids = rn_malloc((size_t)o->batch * sizeof *s->ids);
        s->pixels = l->o.alloc(img * o->batch, l->o.alloc_ctx);
        s->labels = l->o.alloc((size_t)o->batch * sizeof(int32_t), l->o.alloc_ctx);
        if (o->train && rn_augment_find(&o->aug, RN_AUG_OP_ERASE) &&
            !(s->erase = rn_malloc((size_t)o->batch * sizeof *s->erase))) {
            rc = RN_ENOMEM;
            goto fail;
        }
        if (!s->ids || !s->pixels || !s->labels) {
            rc = rn_errorf(RN_ENOMEM, "out of memory for %d batch buffers of %zu bytes (lower --prefetch or --batch)",
                           l->nslots, img * o->batch);
            goto fail;
        }
    }
    l->nworkers = o->workers > 0 ? o->workers : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (l->nworkers < 1) l->nworkers = 1;
    l->workers = rn_calloc((size_t)l->nworkers, sizeof *l->workers);
    if (!l->workers) { rc = RN_ENOMEM; goto fail; }
    for (int i = 0; i < l->nworkers; i++) {
        worker *w = &l->workers[i];
        w->l = l;
        w->index = i;
        if ((rc = rn_dataset_reader_open(l->ds, &w->rd)) != RN_OK) goto fail;
        if ((rc = rn_jpeg_create(&w->sc.jpeg)) != RN_OK) goto fail;
        /* the largest image the dataset says it holds, and never less than the default */
        const rn_dataset_info *di = rn_dataset_get_info(l->ds);
        uint64_t most = (uint64_t)di->max_width * di->max_height;
        rn_jpeg_set_max_pixels(w->sc.jpeg, most > RN_JPEG_MAX_PIXELS ? most : RN_JPEG_MAX_PIXELS);
    }
    for (int i = 0; i < l->nworkers; i++) {
        if (pthread_create(&l->workers[i].th, NULL, work, &l->workers[i]) != 0) {
            rc = rn_errorf(RN_ENOMEM, "cannot start loader worker %d: %s", i + 1, strerror(errno));
            goto fail;
        }
        l->workers[i].started = 1;
    }
    *out = l;
    return RN_OK;
fail:
    rn_loader_destroy(l);
    return rc;
}

void rn_loader_set_trace(rn_loader *l, rn_loader_trace_fn fn, void *ctx) {
    pthread_mutex_lock(&l->mu);
    l->trace = fn;
    l->trace_ctx = ctx;
    pthread_mutex_unlock(&l->mu);
}

int rn_loader_next(rn_loader *l, rn_batch *b) {
    memset(b, 0, sizeof *b);
    pthread_mutex_lock(&l->mu);
    slot *s = &l->slots[l->cons_seq % l->nslots];
    if (s->state == SLOT_HELD) {
        pthread_mutex_unlock(&l->mu);
        return rn_errorf(RN_EINVAL, "loader: all %d batch buffers are held: release a batch before asking for the next",
                         l->nslots);
    }
    while (!(s->state == SLOT_READY && s->seq == l->cons_seq)) pthread_cond_wait(&l->ready, &l->mu);
    l->cons_seq++;
    int64_t e = s->epoch, i = s->index + s->total;
    norm_pos(l, &e, &i);
    l->pos_epoch = e;
    l->pos_index = i;
    if (s->err) {
        int rc = rn_errorf(s->err, "%s", s->msg);
        s->state = SLOT_FREE;
        pthread_cond_broadcast(&l->work);
        pthread_mutex_unlock(&l->mu);
        return rc;
    }
    s->state = SLOT_HELD;
    b->pixels = s->pixels;
    b->labels = s->labels;
    b->n = s->n;
    b->h = b->w = l->S;
    b->c = l->c;
    b->epoch = s->epoch;
    b->index = s->index;
    b->first = s->first;
    b->total = s->total;
    b->last = s->last;
    b->erase = s->erase;
    b->erase_key = rn_rng_key(l->o.seed, PURPOSE_ERASE);
    b->erase_epoch = l->o.epoch_batches > 0 ? 0 : s->epoch; /* the epoch of the draws */
    b->slot = (int)(s - l->slots);
    pthread_mutex_unlock(&l->mu);
    return RN_OK;
}

void rn_loader_release(rn_loader *l, rn_batch *b) {
    if (!b->pixels) return;
    pthread_mutex_lock(&l->mu);
    slot *s = &l->slots[b->slot];
    if (s->state == SLOT_HELD && s->pixels == b->pixels) {
        s->state = SLOT_FREE;
        pthread_cond_broadcast(&l->work);
    }
    pthread_mutex_unlock(&l->mu);
    memset(b, 0, sizeof *b);
}

void rn_loader_position(const rn_loader *l, int64_t *epoch, int64_t *index) {
    pthread_mutex_lock((pthread_mutex_t *)&l->mu);
    *epoch = l->pos_epoch;
    *index = l->pos_index;
    pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
}

int rn_loader_seek(rn_loader *l, int64_t epoch, int64_t index) {
    if (epoch < 0 || index < 0 || (uint64_t)index > l->count)
        return rn_errorf(RN_EINVAL, "loader: position (%" PRId64 ", %" PRId64 ") outside the dataset of %" PRIu64
                         " records (a checkpoint from another dataset?)", epoch, index, l->count);
    pthread_mutex_lock(&l->mu);
    l->paused = 1;
    while (l->active > 0) pthread_cond_wait(&l->idle, &l->mu);
    for (int i = 0; i < l->nslots; i++) l->slots[i].state = SLOT_FREE;
    norm_pos(l, &epoch, &index);
    l->task_seq = l->task_chunk = 0;
    l->cons_seq = 0;
    l->fill_epoch = l->pos_epoch = epoch;
    l->fill_index = l->pos_index = index;
    l->paused = 0;
    pthread_cond_broadcast(&l->work);
    pthread_mutex_unlock(&l->mu);
    return RN_OK;
}

int64_t rn_loader_epoch_batches(uint64_t count, int batch, int drop_last, int64_t epoch_batches) {
    uint64_t b = (uint64_t)batch, n = epoch_records(count, batch, epoch_batches);
    return (int64_t)(drop_last ? n / b : (n + b - 1) / b);
}

int64_t rn_loader_batches_per_epoch(const rn_loader *l) {
    return rn_loader_epoch_batches(l->count, l->o.batch, l->o.drop_last, l->o.epoch_batches);
}

const rn_dataset_info *rn_loader_info(const rn_loader *l) { return rn_dataset_get_info(l->ds); }

void rn_loader_destroy(rn_loader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->work);
    pthread_mutex_unlock(&l->mu);
    if (l->workers) {
        for (int i = 0; i < l->nworkers; i++) {
            worker *w = &l->workers[i];
            if (w->started) pthread_join(w->th, NULL);
            rn_dataset_reader_close(w->rd);
            rn_jpeg_destroy(w->sc.jpeg);
            rn_loader_scratch_free(&w->sc);
        }
        free(l->workers);
    }
    if (l->slots) {
        for (int i = 0; i < l->nslots; i++) {
            free(l->slots[i].ids);
            free(l->slots[i].erase);
            if (l->slots[i].pixels) l->o.free(l->slots[i].pixels, l->o.alloc_ctx);
            if (l->slots[i].labels) l->o.free(l->slots[i].labels, l->o.alloc_ctx);
        }
        free(l->slots);
    }
    free(l->perm);
    rn_dataset_close(l->ds);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->work);
    pthread_cond_destroy(&l->ready);
    pthread_cond_destroy(&l->idle);
    free(l);
}

void rn_loader_normalize(const rn_batch *b, float *dst, const float *mean, const float *std) {
    rn_image_normalize(b->pixels, dst, (size_t)b->n * b->h * b->w, b->c, mean, std);
    if (b->erase) rn_erase_apply(b->erase, b->n, b->h, b->w, b->c, b->erase_key, b->erase_epoch, dst);
}

int rn_loader_contact_sheet(const rn_batch *b, int cols, uint8_t **jpeg, size_t *len) {
    *jpeg = NULL;
    *len = 0;
    if (b->n <= 0) return rn_errorf(RN_EINVAL, "contact sheet of an empty batch");
    if (cols <= 0) cols = (int)ceil(sqrt((double)b->n));
    int rows = (b->n + cols - 1) / cols, gap = 2, S = b->w;
    int W = cols * (S + gap) + gap, H = rows * (S + gap) + gap;
    uint8_t *sheet = rn_malloc((size_t)W * H * 3);
    if (!sheet) return RN_ENOMEM;
    memset(sheet, 40, (size_t)W * H * 3);
    for (int k = 0; k < b->n; k++) {
        int x0 = gap + (k % cols) * (S + gap), y0 = gap + (k / cols) * (S + gap);
        const uint8_t *src = b->pixels + (size_t)k * S * S * b->c;
        for (int y = 0; y < S; y++)
            for (int x = 0; x < S; x++) {
                uint8_t *d = sheet + ((size_t)(y0 + y) * W + x0 + x) * 3;
                const uint8_t *s = src + ((size_t)y * S + x) * b->c;
                d[0] = s[0];
                d[1] = b->c == 3 ? s[1] : s[0];
                d[2] = b->c == 3 ? s[2] : s[0];
            }
    }
    rn_jpeg *j;
    int rc = rn_jpeg_create(&j);
    if (rc == RN_OK) {
        rc = rn_jpeg_encode(j, sheet, W, H, 3, 90, jpeg, len);
        rn_jpeg_destroy(j);
    }
    free(sheet);
    return rc;
}
