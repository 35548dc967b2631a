/* dataset + loader: write a small dataset, then check that batches are byte-identical
 * across worker counts and prefetch depths, that seek resumes exactly, that epochs are
 * permutations, drop-last, labels, the allocator hook and normalisation. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "rn.pb-c.h"
#include "rn/crc32c.h"
#include "rn/dataset.h"
#include "rn/err.h"
#include "rn/jpeg.h"
#include "rn/loader.h"
#include "rn/rng.h"

#define N 37
static char dir[] = "/tmp/rn-test-loader-XXXXXX";
static char path[256];

static void picture(uint8_t *p, int w, int h, int c, uint64_t seed) {
    float noise[1024];
    rn_rng_uniform(rn_rng_key(seed, 2), noise, 1024, -15.0f, 15.0f);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int ch = 0; ch < c; ch++) {
                float v = 120 + 80 * sinf(x * 0.3f * (ch + 1) + y * 0.11f * (seed % 5 + 1)) + noise[(y * w + x + ch) % 1024];
                p[((size_t)y * w + x) * c + ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
}

/* N records, odd sizes, half raw and half JPEG, labels k % 4 */
static void make_dataset(void) {
    rn_dataset_writer *w;
    CHECK_OK(rn_dataset_writer_create(path, 1 << 16, &w));
    rn_jpeg *j;
    CHECK_OK(rn_jpeg_create(&j));
    uint64_t counts[4] = {0};
    for (int k = 0; k < N; k++) {
        int iw = 30 + (k * 7) % 41, ih = 20 + (k * 13) % 37;
        uint8_t *px = malloc((size_t)iw * ih * 3), *jpg = NULL;
        picture(px, iw, ih, 3, (uint64_t)k);
        rn_sample s = {k % 4, (uint32_t)ih, (uint32_t)iw, 3, RN_ENC_RAW, px, (size_t)iw * ih * 3, "x"};
        size_t len;
        if (k % 2) {
            CHECK_OK(rn_jpeg_encode(j, px, iw, ih, 3, 90, &jpg, &len));
            s.enc = RN_ENC_JPEG, s.data = jpg, s.len = len;
        }
        CHECK_OK(rn_dataset_writer_put(w, &s));
        counts[k % 4]++;
        free(px);
        free(jpg);
    }
    rn_jpeg_destroy(j);
    char *names[4] = {"a", "b", "c", "d"};
    rn_dataset_info info = {0};
    info.n_classes = 4;
    info.class_names = names;
    info.class_counts = counts;
    info.channels = 3;
    info.enc = RN_ENC_JPEG;
    info.command = "test_loader";
    info.rn_version = "test";
    CHECK_OK(rn_dataset_writer_finish(w, &info));
}

/* crc of every batch over `epochs` epochs */
static int run(rn_loader_opts *o, int nb, uint32_t *crcs, int64_t *epochs, int32_t *labels) {
    rn_loader *l;
    int rc = rn_loader_create(path, o, &l);
    CHECK(rc == 0, "create: %s", rn_last_error());
    if (rc) return 0;
    int k = 0;
    for (; k < nb; k++) {
        rn_batch b;
        if (rn_loader_next(l, &b) != RN_OK) {
            CHECK(0, "next: %s", rn_last_error());
            break;
        }
        crcs[k] = rn_crc32c(rn_crc32c(0, b.pixels, (size_t)b.n * b.h * b.w * b.c), b.labels, (size_t)b.n * 4);
        if (b.erase) crcs[k] = rn_crc32c(crcs[k], b.erase, (size_t)b.n * sizeof *b.erase);
        if (epochs) epochs[k] = b.epoch * 1000 + b.index;
        if (labels) memcpy(labels + (size_t)k * o->batch, b.labels, (size_t)b.n * 4);
        rn_loader_release(l, &b);
    }
    rn_loader_destroy(l);
    return k;
}

static void test_determinism(void) {
    enum { NB = 24 };
    uint32_t ref[NB], got[NB];
    int64_t pos[NB];
    rn_loader_opts o;
    rn_loader_defaults(&o);
    o.crop = 24;
    o.batch = 5;
    o.seed = 11;
    o.workers = 1;
    o.prefetch = 2;
    CHECK(run(&o, NB, ref, pos, NULL) == NB, "reference run");
    int workers[] = {2, 3, 5}, prefetch[] = {3, 2, 7};
    for (int t = 0; t < 3; t++) {
        o.workers = workers[t];
        o.prefetch = prefetch[t];
        run(&o, NB, got, NULL, NULL);
        CHECK(memcmp(ref, got, sizeof ref) == 0, "batches differ with %d workers, prefetch %d", o.workers, o.prefetch);
    }
    /* epoch boundaries: 37 records in batches of 5 -> 8 batches, the last of 2 */
    CHECK(pos[7] == 35 && pos[8] == 1000 && pos[16] == 2000, "positions %" PRId64 " %" PRId64 " %" PRId64, pos[7], pos[8], pos[16]);
    /* another seed changes the batches; the eval transform does not depend on the seed */
    o.seed = 12;
    run(&o, NB, got, NULL, NULL);
    CHECK(memcmp(ref, got, sizeof ref) != 0, "seed has no effect");
    o.train = 0;
    uint32_t e1[8], e2[8];
    run(&o, 8, e1, NULL, NULL);
    o.seed = 99;
    o.workers = 1;
    run(&o, 8, e2, NULL, NULL);
    CHECK(memcmp(e1, e2, sizeof e1) == 0, "eval batches depend on seed or workers");
    CHECK(memcmp(e1, e1 + 8 - 8, sizeof e1) == 0, "self");
}

static void test_seek(void) {
    rn_loader_opts o;
    rn_loader_defaults(&o);
    o.crop = 16;
    o.batch = 4;
    o.seed = 3;
    o.workers = 2;
    enum { NB = 25 };
    uint32_t ref[NB];
    run(&o, NB, ref, NULL, NULL);
    rn_loader *l;
    CHECK_OK(rn_loader_create(path, &o, &l));
    if (!l) return;
    /* take 13 batches, save the position, take more, seek back, compare */
    rn_batch b;
    int64_t e, i;
    for (int k = 0; k < 13; k++) {
        CHECK_OK(rn_loader_next(l, &b));
        rn_loader_release(l, &b);
    }
    rn_loader_position(l, &e, &i);
    CHECK(e == 1 && i == 12, "position after 13 batches of 4 (10 per epoch): %" PRId64 ":%" PRId64, e, i);
    for (int k = 0; k < 3; k++) {
        CHECK_OK(rn_loader_next(l, &b));
        rn_loader_release(l, &b);
    }
    CHECK_OK(rn_loader_seek(l, e, i));
    int same = 1;
    for (int k = 13; k < NB; k++) {
        CHECK_OK(rn_loader_next(l, &b));
        uint32_t c = rn_crc32c(rn_crc32c(0, b.pixels, (size_t)b.n * b.h * b.w * b.c), b.labels, (size_t)b.n * 4);
        same &= c == ref[k];
        rn_loader_release(l, &b);
    }
    CHECK(same, "batches after seek differ from an uninterrupted run");
    /* holding every buffer is an error, not a deadlock */
    rn_batch held[5];
    for (int k = 0; k < 4; k++) CHECK_OK(rn_loader_next(l, &held[k]));
    CHECK(rn_loader_next(l, &held[4]) == RN_EINVAL, "next with all %d buffers held", o.prefetch);
    CHECK(rn_loader_seek(l, 0, N + 1) == RN_EINVAL, "seek past the end accepted");
    rn_loader_destroy(l);
}

static void test_epochs_and_labels(void) {
    rn_loader_opts o;
    rn_loader_defaults(&o);
    o.crop = 8;
    o.batch = 5;
    o.drop_last = 1;
    o.workers = 2;
    enum { NB = 14 };
    uint32_t crc[NB];
    int64_t pos[NB];
    int32_t labels[NB * 5];
    run(&o, NB, crc, pos, labels);
    /* drop-last: 7 full batches per epoch, 2 records unused */
    CHECK(pos[6] == 30 && pos[7] == 1000, "drop-last positions %" PRId64 " %" PRId64, pos[6], pos[7]);
    int hist[2][4] = {{0}};
    for (int k = 0; k < NB * 5; k++) {
        CHECK(labels[k] >= 0 && labels[k] < 4, "label %d", labels[k]);
        if (labels[k] >= 0 && labels[k] < 4) hist[k / 35][labels[k]]++;
    }
    /* 37 records: labels 0 x10, 1..3 x9; 35 of them used per epoch */
    for (int e = 0; e < 2; e++) {
        int total = hist[e][0] + hist[e][1] + hist[e][2] + hist[e][3];
        CHECK(total == 35 && hist[e][0] >= 8 && hist[e][1] >= 7, "epoch %d label counts %d %d %d %d", e, hist[e][0],
              hist[e][1], hist[e][2], hist[e][3]);
    }
    CHECK(memcmp(labels, labels + 35, 35 * 4) != 0, "epochs 0 and 1 in the same order: no reshuffle");
    /* without shuffle the labels follow the record order */
    o.shuffle = 0;
    o.drop_last = 0;
    o.train = 0;
    run(&o, 8, crc, pos, labels);
    int inorder = 1;
    for (int k = 0; k < N; k++) inorder &= labels[k] == k % 4;
    CHECK(inorder, "unshuffled labels are not in record order");
    CHECK(pos[7] == 35, "last batch index %" PRId64, pos[7]);
    o.batch = 64;
    o.drop_last = 1;
    rn_loader *l = NULL;
    CHECK(rn_loader_create(path, &o, &l) == RN_EINVAL, "drop-last with batch > records accepted");
}

static int allocs, frees;
static void *my_alloc(size_t n, void *ctx) {
    allocs++;
    (*(size_t *)ctx) += n;
    return malloc(n);
}
static void my_free(void *p, void *ctx) {
    frees++;
    free(p);
}

static void test_alloc_and_normalize(void) {
    rn_loader_opts o;
    rn_loader_defaults(&o);
    size_t bytes = 0;
    o.crop = 12;
    o.batch = 3;
    o.prefetch = 3;
    o.alloc = my_alloc;
    o.free = my_free;
    o.alloc_ctx = &bytes;
    rn_loader *l;
    CHECK_OK(rn_loader_create(path, &o, &l));
    if (!l) return;
    CHECK(allocs == 6 && bytes == 3 * (3 * 12 * 12 * 3 + 3 * 4), "allocator hook: %d calls, %zu bytes", allocs, bytes);
    rn_batch b;
    CHECK_OK(rn_loader_next(l, &b));
    CHECK(b.n == 3 && b.h == 12 && b.w == 12 && b.c == 3, "batch shape %d %d %d %d", b.n, b.h, b.w, b.c);
    float *f = malloc(sizeof(float) * 3 * 12 * 12 * 3);
    rn_loader_normalize(&b, f, RN_IMAGENET_MEAN, RN_IMAGENET_STD);
    int ok = 1, nonconst = 0;
    for (int k = 0; k < 3 * 12 * 12 * 3; k++) {
        float want = ((float)b.pixels[k] / 255.0f - RN_IMAGENET_MEAN[k % 3]) / RN_IMAGENET_STD[k % 3];
        ok &= f[k] == want;
        nonconst |= b.pixels[k] != b.pixels[0];
    }
    CHECK(ok && nonconst, "normalised values (ok %d, pixels vary %d)", ok, nonconst);
    free(f);
    rn_loader_release(l, &b);
    rn_loader_destroy(l);
    CHECK(frees == 6, "freed %d of 6 buffers", frees);
    CHECK(rn_loader_create("/nonexistent.lmdb", &o, &l) == RN_EIO, "missing dataset");
    CHECK(strstr(rn_last_error(), "/nonexistent.lmdb") != NULL, "message names the path: %s", rn_last_error());
}

static void test_dataset_reader(void) {
    rn_dataset *ds;
    CHECK_OK(rn_dataset_open(path, &ds));
    if (!ds) return;
    const rn_dataset_info *in = rn_dataset_get_info(ds);
    CHECK(in->count == N && in->n_classes == 4 && in->class_counts[0] == 10, "info count %" PRIu64, in->count);
    rn_dataset_reader *r;
    CHECK_OK(rn_dataset_reader_open(ds, &r));
    rn_sample s;
    CHECK_OK(rn_dataset_read(r, 4, &s));
    CHECK(s.label == 0 && s.enc == RN_ENC_RAW && s.len == (size_t)s.width * s.height * 3, "record 4");
    CHECK(rn_dataset_read(r, N, &s) == RN_EINVAL, "read past the end");
    CHECK(strstr(rn_last_error(), "record 00000037") != NULL, "message: %s", rn_last_error());
    rn_dataset_reader_close(r);
    rn_dataset_close(ds);
}

/* eval without resize on images smaller than the crop: centred, zero padding around */
static void test_pad(void) {
    rn_loader_opts o;
    rn_loader_defaults(&o);
    o.train = 0;
    o.resize = 0;
    o.crop = 80;
    o.batch = N;
    o.workers = 2;
    rn_loader *l;
    CHECK_OK(rn_loader_create(path, &o, &l));
    if (!l) return;
    rn_batch b;
    CHECK_OK(rn_loader_next(l, &b));
    rn_dataset *ds;
    CHECK_OK(rn_dataset_open(path, &ds));
    rn_dataset_reader *r;
    CHECK_OK(rn_dataset_reader_open(ds, &r));
    int ok = 1;
    for (int k = 0; k < b.n && ds && r; k++) {
        rn_sample s;
        if (rn_dataset_read(r, (uint64_t)k, &s) != RN_OK) break;
        int w = (int)s.width, h = (int)s.height, dx = (80 - w) / 2, dy = (80 - h) / 2;
        const uint8_t *img = b.pixels + (size_t)k * 80 * 80 * 3;
        /* corners outside the image are zero, the centre is the image (raw records exactly) */
        ok &= img[0] == 0 && img[(80 * 80 - 1) * 3] == 0;
        if (s.enc == RN_ENC_RAW)
            ok &= memcmp(img + ((size_t)dy * 80 + dx) * 3, s.data, (size_t)w * 3) == 0 &&
                  memcmp(img + ((size_t)(dy + h - 1) * 80 + dx) * 3, s.data + (size_t)(h - 1) * w * 3, (size_t)w * 3) == 0;
    }
    CHECK(ok, "padded eval crops: image not centred or border not zero");
    rn_dataset_reader_close(r);
    rn_dataset_close(ds);
    rn_loader_release(l, &b);
    rn_loader_destroy(l);
}

/* a record that does not decode: next() fails naming the record and its source; the
 * loader then goes on with the next batch */
static void test_bad_record(void) {
    char bad[300];
    snprintf(bad, sizeof bad, "%s/bad.lmdb", dir);
    rn_dataset_writer *w;
    CHECK_OK(rn_dataset_writer_create(bad, 0, &w));
    if (!w) return;
    uint8_t px[16 * 12 * 3], junk[64];
    picture(px, 16, 12, 3, 1);
    for (int i = 0; i < 64; i++) junk[i] = (uint8_t)(i * 37 + 1);
    junk[0] = 0xFF, junk[1] = 0xD8, junk[2] = 0xFF;
    uint64_t counts[1] = {4};
    for (int k = 0; k < 4; k++) {
        rn_sample smp = {0, 12, 16, 3, RN_ENC_RAW, px, sizeof px, "fine.jpg"};
        if (k == 2) smp.enc = RN_ENC_JPEG, smp.data = junk, smp.len = sizeof junk, smp.name = "broken.jpg";
        CHECK_OK(rn_dataset_writer_put(w, &smp));
    }
    char *names[1] = {"only"};
    rn_dataset_info info = {0};
    info.n_classes = 1, info.class_names = names, info.class_counts = counts, info.channels = 3;
    info.enc = RN_ENC_RAW, info.command = "test", info.rn_version = "test";
    CHECK_OK(rn_dataset_writer_finish(w, &info));
    rn_loader_opts o;
    rn_loader_defaults(&o);
    o.crop = 8, o.batch = 2, o.shuffle = 0, o.workers = 2;
    rn_loader *l;
    CHECK_OK(rn_loader_create(bad, &o, &l));
    if (!l) return;
    rn_batch b;
    CHECK_OK(rn_loader_next(l, &b));
    rn_loader_release(l, &b);
    CHECK(rn_loader_next(l, &b) == RN_EDATA, "a batch with an undecodable record was delivered");
    CHECK(strstr(rn_last_error(), "record 00000002") && strstr(rn_last_error(), "broken.jpg"),
          "message names the record and file: %s", rn_last_error());
    CHECK_OK(rn_loader_next(l, &b)); /* epoch 1 starts */
    CHECK(b.epoch == 1 && b.index == 0, "after the error: batch %" PRId64 ":%" PRId64, b.epoch, b.index);
    rn_loader_release(l, &b);
    rn_loader_destroy(l);
}

/* A DatasetInfo must hold one mean and one std per channel: one with fewer was accepted
 * and left the others 0 (normalisation by 0). */
static void test_info_stats(void) {
    double mean[3] = {0.5, 0.4, 0.3}, sd[3] = {0.2, 0.2, 0.2};
    char *names[2] = {"a", "b"};
    for (size_t n = 1; n <= 3; n++) {
        Rn__DatasetInfo m = RN__DATASET_INFO__INIT;
        m.format_version = 1;
        m.channels = 3;
        m.enc = RN__ENCODING__JPEG;
        m.count = 2;
        m.n_class_names = 2;
        m.class_names = names;
        m.n_mean = m.n_std = n;
        m.mean = mean;
        m.std = sd;
        size_t len = rn__dataset_info__get_packed_size(&m);
        uint8_t *buf = malloc(len);
        rn__dataset_info__pack(&m, buf);
        rn_dataset_info info;
        int rc = rn_dataset_info_parse(buf, len, "x.lmdb", &info);
        if (n == 3) {
            CHECK(rc == RN_OK && info.mean[2] == 0.3, "3 means for 3 channels: %s", rn_last_error());
            if (rc == RN_OK) rn_dataset_info_clear(&info);
        } else {
            CHECK(rc == RN_EDATA && strstr(rn_last_error(), "means and"), "%zu means for 3 channels accepted: %s",
                  n, rn_last_error());
        }
        free(buf);
    }
}

/* Slices in whole units (rn_loader_opts.unit): over the parts, every record exactly once
 * with its own label. Consecutive units (the sharded evaluation's): each slice starts at
 * a multiple of the unit in the epoch; the last batch (37 = 2*15 + 7: units of 5 and 2)
 * leaves part 0 empty. Interleaved (rn-train's ranks): part p's k-th image is image
 * (k/U x P + p) x U + k%U of the batch; the last batch (37 = 3 x 12 + 1) leaves parts 1
 * and 2 empty. */
static void test_unit_slices(int interleave) {
    const int P = 3, U = interleave ? 2 : 5;
    const char *what = interleave ? "interleaved slices" : "unit slices";
    int seen[N] = {0}, empty = 0, misaligned = 0, wrong = 0;
    for (int part = 0; part < P; part++) {
        rn_loader_opts o;
        rn_loader_defaults(&o);
        o.crop = 8;
        o.batch = (interleave ? 2 : 1) * P * U;
        o.workers = 2;
        o.train = 0;
        o.shuffle = 0;
        o.part = part;
        o.parts = P;
        o.unit = U;
        o.interleave = interleave;
        rn_loader *l = NULL;
        CHECK_OK(rn_loader_create(path, &o, &l));
        if (!l) return;
        for (int last = 0; !last;) {
            rn_batch b;
            if (rn_loader_next(l, &b) != RN_OK) break;
            empty += b.n == 0;
            misaligned += b.n > 0 && (interleave ? b.first != part * U : (b.index + b.first) % U != 0);
            for (int k = 0; k < b.n; k++) {
                int64_t at = b.index + (interleave ? (k / U * P + part) * U + k % U : b.first + k);
                if (at < N) seen[at]++;
                wrong += at >= N || b.labels[k] != at % 4;
            }
            last = b.last;
            rn_loader_release(l, &b);
        }
        rn_loader_destroy(l);
    }
    int once = 1;
    for (int k = 0; k < N; k++) once &= seen[k] == 1;
    CHECK(once, "%s: a record missed or seen twice", what);
    CHECK(misaligned == 0 && wrong == 0, "%s: %d misaligned, %d wrong images or labels", what, misaligned, wrong);
    CHECK(empty == (interleave ? 2 : 1), "%s: %d empty slices, expected %d", what, empty, interleave ? 2 : 1);
}

/* the new ops: byte-identical batches (and erase boxes) for any worker count and after a
 * seek; each op changes the batches */
static void test_chains(void) {
    const char *chains[] = {"crop-pad=4:reflect,flip,erase=0.5:value=random",
                            "rrc:scale=0.35-1:ratio=0.5-2,flip=0.3,erase=1",
                            "crop-pad=3:edge,erase=0.7",
                            "crop-pad=2:fill=7",
                            "flip",
                            "erase=1",
                            "rrc,flip,ta_wide,erase=0.1",
                            "crop-pad=4,flip,randaug=2:m=9",
                            "autoaug",
                            "flip,jitter:brightness=0.4:contrast=0.4:saturation=0.4:hue=0.1"};
    enum { NB = 20, NC = sizeof chains / sizeof *chains };
    uint32_t ref[NC][NB], got[NB];
    for (int t = 0; t < NC; t++) {
        rn_loader_opts o;
        rn_loader_defaults(&o);
        CHECK_OK(rn_augment_parse(chains[t], &o.aug));
        o.crop = 24, o.batch = 4, o.seed = 5, o.workers = 1, o.prefetch = 2;
        CHECK(run(&o, NB, ref[t], NULL, NULL) == NB, "%s: reference run", chains[t]);
        o.workers = 3, o.prefetch = 5;
        run(&o, NB, got, NULL, NULL);
        CHECK(memcmp(ref[t], got, sizeof got) == 0, "%s: batches differ with 3 workers", chains[t]);
        /* seek back to a saved position: the same batches as the uninterrupted run */
        rn_loader *l;
        CHECK_OK(rn_loader_create(path, &o, &l));
        if (!l) continue;
        rn_batch b;
        int64_t e, i;
        for (int k = 0; k < 11; k++) {
            CHECK_OK(rn_loader_next(l, &b));
            rn_loader_release(l, &b);
        }
        rn_loader_position(l, &e, &i);
        for (int k = 0; k < 4; k++) {
            CHECK_OK(rn_loader_next(l, &b));
            rn_loader_release(l, &b);
        }
        CHECK_OK(rn_loader_seek(l, e, i));
        int same = 1;
        for (int k = 11; k < NB; k++) {
            CHECK_OK(rn_loader_next(l, &b));
            uint32_t c = rn_crc32c(rn_crc32c(0, b.pixels, (size_t)b.n * b.h * b.w * b.c), b.labels, (size_t)b.n * 4);
            if (b.erase) c = rn_crc32c(c, b.erase, (size_t)b.n * sizeof *b.erase);
            same &= c == ref[t][k];
            rn_loader_release(l, &b);
        }
        CHECK(same, "%s: batches after a seek differ from an uninterrupted run", chains[t]);
        rn_loader_destroy(l);
    }
    for (int t = 1; t < NC; t++)
        CHECK(memcmp(ref[t], ref[t - 1], sizeof got) != 0, "%s: same batches as %s", chains[t], chains[t - 1]);
}

/* erase: value 0 is exactly 0 after normalisation, random values are rn_erase_value's,
 * everything outside the boxes is the plain normalisation */
static void test_erase_normalize(void) {
    for (int random = 0; random < 2; random++) {
        rn_loader_opts o;
        rn_loader_defaults(&o);
        const char *chain = random ? "crop-pad=4,erase=1:value=random:scale=0.1-0.33" : "crop-pad=4,erase=1";
        CHECK_OK(rn_augment_parse(chain, &o.aug));
        o.crop = 24, o.batch = 8, o.seed = 3, o.workers = 2;
        rn_loader *l;
        CHECK_OK(rn_loader_create(path, &o, &l));
        if (!l) return;
        rn_batch b;
        int boxes = 0, inside = 0, bad_in = 0, bad_out = 0;
        double sum = 0, sq = 0;
        for (int k = 0; k < 12; k++) {
            CHECK_OK(rn_loader_next(l, &b));
            size_t n = (size_t)b.n * b.h * b.w * b.c;
            float *x = malloc(n * sizeof *x), *plain = malloc(n * sizeof *plain);
            rn_loader_normalize(&b, x, RN_IMAGENET_MEAN, RN_IMAGENET_STD);
            rn_image_normalize(b.pixels, plain, (size_t)b.n * b.h * b.w, b.c, RN_IMAGENET_MEAN, RN_IMAGENET_STD);
            CHECK(b.erase != NULL, "no erase boxes in the batch");
            for (int m = 0; b.erase && m < b.n; m++) {
                const rn_erase *e = &b.erase[m];
                boxes += e->w > 0;
                for (int y = 0; y < b.h; y++)
                    for (int xx = 0; xx < b.w; xx++)
                        for (int c = 0; c < b.c; c++) {
                            size_t el = ((size_t)y * b.w + xx) * b.c + c, at = (size_t)m * b.h * b.w * b.c + el;
                            int in = xx >= e->x && xx < e->x + e->w && y >= e->y && y < e->y + e->h;
                            if (!in) {
                                bad_out += memcmp(&x[at], &plain[at], sizeof *x) != 0;
                                continue;
                            }
                            inside++;
                            float want =
                                random ? rn_erase_value(b.erase_key, b.erase_epoch, e->rec, (uint32_t)el) : 0.0f;
                            bad_in += memcmp(&x[at], &want, sizeof want) != 0;
                            sum += x[at], sq += (double)x[at] * x[at];
                        }
            }
            free(x);
            free(plain);
            rn_loader_release(l, &b);
        }
        rn_loader_destroy(l);
        CHECK(boxes >= 90, "erase p=1: only %d of 96 images erased", boxes);
        CHECK(bad_in == 0 && bad_out == 0, "erase (%s): %d wrong inside, %d changed outside", chain, bad_in, bad_out);
        if (random && inside > 1000) {
            double mean = sum / inside, var = sq / inside - mean * mean;
            CHECK(fabs(mean) < 0.05 && fabs(var - 1) < 0.05, "random erase values: mean %g variance %g of %d", mean,
                  var, inside);
        } else if (random) {
            CHECK(0, "too few erased elements: %d", inside);
        }
    }
}

/* Repeated augmentation (rn_loader_opts.repeats = K): batch b of n holds the n/K records
 * order[b*n/K ..], K times each, copy r of the j-th at j + r*n/K. Copy 0 draws as the
 * record itself, so a batch's copies 0 are the batch of n/K a loader without repeats
 * gives at the same place in the order; the other copies draw their own crops, flips and
 * erase boxes (sample id rec + r*N); slices, seeks and K = 1 as without. */
static void test_repeats(void) {
    enum { K = 4, B = 8, PER = B / K, NB = 10 };
    const size_t img = 24 * 24 * 3;
    rn_loader_opts o;
    rn_loader_defaults(&o);
    CHECK_OK(rn_augment_parse("rrc,flip,erase=0.5:value=random", &o.aug));
    o.crop = 24, o.batch = B, o.seed = 5, o.workers = 2, o.drop_last = 1, o.repeats = K;
    rn_loader_opts one = o;
    one.batch = PER, one.repeats = 1;
    rn_loader *l = NULL, *l1 = NULL;
    CHECK_OK(rn_loader_create(path, &o, &l));
    CHECK_OK(rn_loader_create(path, &one, &l1));
    if (!l || !l1) goto done;
    CHECK(rn_loader_batches_per_epoch(l) == N / B, "%" PRId64 " batches per epoch, want %d",
          rn_loader_batches_per_epoch(l), N / B);
    uint32_t crcs[NB];
    int same0 = 0, labels = 0, ids = 0, differ = 0, copies = 0;
    for (int k = 0; k < NB; k++) {
        rn_batch b, c;
        CHECK_OK(rn_loader_next(l, &b));
        CHECK(b.n == B && b.erase, "batch %d: %d images, erase %p", k, b.n, (void *)b.erase);
        crcs[k] = rn_crc32c(0, b.pixels, b.n * img);
        CHECK_OK(rn_loader_seek(l1, b.epoch, b.index / B * PER));
        CHECK_OK(rn_loader_next(l1, &c));
        same0 += c.n == PER && memcmp(b.pixels, c.pixels, PER * img) == 0 && memcmp(b.labels, c.labels, PER * 4) == 0 &&
                 memcmp(b.erase, c.erase, PER * sizeof *c.erase) == 0;
        for (int r = 1; r < K; r++)
            for (int j = 0; j < PER; j++) {
                int m = j + r * PER;
                copies++;
                labels += b.labels[m] == b.labels[j];
                ids += b.erase[m].rec == b.erase[j].rec + (uint32_t)(r * N);
                differ += memcmp(b.pixels + m * img, b.pixels + j * img, img) != 0;
            }
        rn_loader_release(l1, &c);
        rn_loader_release(l, &b);
    }
    CHECK(same0 == NB, "copies 0 equal the batch without repeats in %d of %d batches", same0, NB);
    CHECK(labels == copies && ids == copies, "copies: %d of %d with the record's label, %d with id rec + r*N", labels,
          copies, ids);
    CHECK(differ >= copies * 9 / 10, "only %d of %d copies drew other pixels than copy 0", differ, copies);
    /* two ranks' slices are the whole batch's halves; a seek lands where the run was */
    for (int part = 0; part < 2; part++) {
        rn_loader_opts h = o;
        h.part = part, h.parts = 2;
        rn_loader *lh = NULL, *lw = NULL;
        CHECK_OK(rn_loader_create(path, &h, &lh));
        CHECK_OK(rn_loader_create(path, &o, &lw));
        for (int k = 0; lh && lw && k < 3; k++) {
            rn_batch b, w;
            CHECK_OK(rn_loader_next(lh, &b));
            CHECK_OK(rn_loader_next(lw, &w));
            CHECK(b.n == B / 2 && memcmp(b.pixels, w.pixels + part * (B / 2) * img, b.n * img) == 0,
                  "part %d of batch %d is not the whole batch's half", part, k);
            rn_loader_release(lh, &b);
            rn_loader_release(lw, &w);
        }
        rn_loader_destroy(lh);
        rn_loader_destroy(lw);
    }
    CHECK_OK(rn_loader_seek(l, 1, B));
    rn_batch b;
    CHECK_OK(rn_loader_next(l, &b));
    CHECK(rn_crc32c(0, b.pixels, b.n * img) == crcs[N / B + 1], "seek to (1, %d): another batch", B);
    rn_loader_release(l, &b);
    /* a seek between blocks (rn-load --start, a position saved by a run of another
       --batch): each position's image is the one the aligned run has there */
    CHECK_OK(rn_loader_seek(l, 0, B / 2));
    CHECK_OK(rn_loader_next(l, &b));
    {
        rn_loader *la = NULL;
        rn_batch a0, a1;
        CHECK_OK(rn_loader_create(path, &o, &la));
        if (la && rn_loader_next(la, &a0) == RN_OK && rn_loader_next(la, &a1) == RN_OK) {
            CHECK(memcmp(b.pixels, a0.pixels + (B / 2) * img, (B / 2) * img) == 0 &&
                      memcmp(b.pixels + (B / 2) * img, a1.pixels, (B / 2) * img) == 0,
                  "seek to (0, %d): the images are not the aligned run's at those positions", B / 2);
            rn_loader_release(la, &a0);
            rn_loader_release(la, &a1);
        }
        rn_loader_destroy(la);
    }
    rn_loader_release(l, &b);
    /* K = 1 is no repeats */
    uint32_t r0[6], r1[6];
    rn_loader_opts p = o;
    p.repeats = 0;
    run(&p, 6, r0, NULL, NULL);
    p.repeats = 1;
    run(&p, 6, r1, NULL, NULL);
    CHECK(memcmp(r0, r1, sizeof r0) == 0, "repeats 1 differs from 0");
    /* refused: a batch not a multiple of K, the eval transform, one batch taking more
       records than there are */
    rn_loader *bad = NULL;
    p.repeats = 3;
    CHECK(rn_loader_create(path, &p, &bad) == RN_EINVAL && strstr(rn_last_error(), "multiple of the repeats"),
          "batch 8 x3: %s", rn_last_error());
    p.repeats = 2, p.train = 0;
    CHECK(rn_loader_create(path, &p, &bad) == RN_EINVAL && strstr(rn_last_error(), "training batches only"),
          "eval x2: %s", rn_last_error());
    p = o, p.batch = 80, p.drop_last = 0, p.repeats = 2;
    CHECK(rn_loader_create(path, &p, &bad) == RN_EINVAL && strstr(rn_last_error(), "fewer records"),
          "batch 80 x2 of %d: %s", N, rn_last_error());
    rn_loader_destroy(bad);
done:
    rn_loader_destroy(l);
    rn_loader_destroy(l1);
}

int main(void) {
    test_info_stats();
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof path, "%s/t.lmdb", dir);
    make_dataset();
    test_dataset_reader();
    test_determinism();
    test_seek();
    test_epochs_and_labels();
    test_unit_slices(0);
    test_unit_slices(1);
    test_alloc_and_normalize();
    test_pad();
    test_bad_record();
    test_chains();
    test_erase_normalize();
    test_repeats();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_done("test_loader");
}
