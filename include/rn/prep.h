/* rn/prep.h: build an rn dataset from a folder of images (what rn-prep runs).
 *
 * Input: an ImageFolder tree (SRC/<class>/.../<file>, class names sorted, labels 0..K-1,
 * files sorted as torchvision's ImageFolder sorts them) or a list file of
 * "relative/path label" lines (Caffe's convention; the path is everything before the
 * last space) resolved against root. Files are decoded (JPEG by rn/jpeg.h, the other
 * formats by rn/imgfile.h, told apart by their content), optionally resized / centre
 * cropped / augmented, re-encoded, and written in input order (after the optional
 * seeded shuffle) with keys 0, 1, 2, ...: the output is byte-identical for any thread
 * count. Memory is bounded by the in-flight window, never by the dataset size.
 *
 * Bad inputs (unreadable, empty, in no format this build reads, corrupt, truncated, over
 * max_pixels by their header, bad list lines, empty class folders) are skipped and
 * reported through on_skip; with strict the first one fails the run and no output is
 * left. */
#ifndef RN_PREP_H
#define RN_PREP_H

#include <stddef.h>
#include <stdint.h>

#define RN_PREP_QUALITY 90
#define RN_PREP_MAX_PIXELS 100000000ull
/* list files: labels at or above this are refused (a typo would ask for millions of
 * classes); also the most classes a list's labels may spread over, see max_classes */
#define RN_PREP_MAX_CLASSES 100000
#define RN_PREP_AUG_CROP 224

typedef struct {
    const char *src;     /* ImageFolder directory or list file */
    const char *root;    /* list file paths are relative to this (NULL: the list's folder) */
    const char *out;     /* output dataset directory */
    const char *classes; /* class list file or dataset to take labels from (NULL: derive) */
    int resize;          /* shorter side to this many pixels, keeping aspect (0: keep) */
    int center_crop;     /* centre crop to this square size after resize (0: none) */
    int enc;             /* RN_ENC_JPEG or RN_ENC_RAW */
    int quality;         /* JPEG quality 1..100 */
    int gray;            /* store 1 channel instead of RGB */
    int shuffle;         /* shuffle the input order with seed */
    uint64_t seed;
    uint64_t limit;      /* write at most this many source images (0: all) */
    int threads;         /* decoding threads (0: all cores) */
    int augment;         /* K > 0: write K RandomResizedCrop + flip variants per image */
    int aug_crop;        /* output size of the augmented variants */
    uint64_t max_pixels; /* skip images with more pixels than this */
    int max_classes;     /* list files: a label >= this is a bad line; and the labels may not
                            reach more than 64x the number of distinct labels when that is
                            over 1000 (classes 0..max label are made: a sparse list would
                            make mostly empty ones) */
    int strict;          /* the first skip fails the run */
    size_t map_size;     /* initial LMDB map size (0: default) */
    const char *command; /* recorded in DatasetInfo */
    const char *rn_version;
    /* called on the calling thread: a skipped input and why */
    void (*on_skip)(void *ctx, const char *file, const char *reason);
    /* called on the calling thread after each source image */
    void (*on_progress)(void *ctx, uint64_t done, uint64_t total);
    void *ctx;
    /* if set and it becomes non-zero (e.g. from a signal handler), the run stops:
     * RN_EINTR, no output written */
    const volatile int *cancel;
} rn_prep_opts;

/* Fill o with the defaults (jpeg, quality 90, all threads, 100 MP, crop 224). */
void rn_prep_defaults(rn_prep_opts *o);

typedef struct {
    uint64_t inputs;  /* source images listed */
    uint64_t written; /* records written */
    uint64_t skipped; /* inputs skipped */
    int n_classes;
} rn_prep_result;

/* Run the whole conversion. Errors: RN_EINVAL (bad options), RN_EIO (source missing,
 * output not writable), RN_EDATA (strict and an input was bad; nothing was written),
 * RN_EINTR (cancelled), RN_ENOMEM. On any error no dataset is left at o->out (a previous
 * one stays). */
int rn_prep_run(const rn_prep_opts *o, rn_prep_result *res);

/* Read a list file as rn_prep_run does, without touching the images: *inputs lines taken
 * as inputs, *bad of them bad (they would be skipped), *n_classes classes made (0 .. the
 * largest label). max_classes as in rn_prep_opts (0: RN_PREP_MAX_CLASSES). For tests and
 * the fuzz harness. Errors: RN_EIO, RN_EINVAL (no usable line, too sparse labels),
 * RN_ENOMEM. */
int rn_prep_read_list(const char *path, int max_classes, uint64_t *inputs, uint64_t *bad, int *n_classes);
#endif
