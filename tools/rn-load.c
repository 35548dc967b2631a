/* rn-load: run the data loader alone: throughput, determinism checks, a look at batches. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "rn/cli.h"
#include "rn/crc32c.h"
#include "rn/dataset.h"
#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/loader.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: rn-load [options] DATA.lmdb\n"
            "Run the rn data loader on a dataset made by rn-prep and report images/second: the\n"
            "tool to reach for when GPU utilisation is low. Batches are u8 NHWC, byte-identical\n"
            "for any --workers.\n"
            "\n"
            "  --crop S           output size (default %d)\n"
            "  --batch N          images per batch (default %d)\n"
            "  --workers N        decoding threads (default: all cores)\n"
            "  --prefetch N       batch buffers in the ring (default %d, at least 2)\n"
            "  --epochs N         epochs to run (default 1, or as many as --batches needs)\n"
            "  --batches N        stop after N batches (or at the end of --epochs)\n"
            "  --seed S           shuffle and augmentation seed (default 0)\n"
            "  --eval             eval transform: resize to round(S*256/224), centre crop S, no shuffle\n"
            "  --augment CHAIN    training transform, ops OP[=V][:KEY=VALUE] joined by commas, as\n"
            "                     rn-train: rrc, crop-pad=N[:constant|edge|reflect], flip[=P],\n"
            "                     ta_wide, randaug[=N][:m=M], autoaug, jitter[:brightness=X]...,\n"
            "                     erase[=P][:random]; none: the eval transform (default rrc,flip)\n"
            "  --resize N         eval resize of the shorter side (0: none)\n"
            "  --no-shuffle       keep the record order\n"
            "  --ra-reps K        repeated augmentation, as rn-train --ra-reps: batch/K records per\n"
            "                     batch, K copies each with their own draws (--batch a multiple of K)\n"
            "  --drop-last        drop each epoch's incomplete last batch\n"
            "  --exact            decode JPEGs at full size (pixels as torchvision+PIL)\n"
            "  --float            also normalise each batch to float (ImageNet mean/std), as the CPU\n"
            "                     trainer does\n"
            "  --start E:I        start at epoch E, index I (a saved loader position)\n"
            "  --sums             print one line per batch: epoch index n last crc32c\n"
            "  --checksum         print the crc32c of all batches (pixels and labels, and the\n"
            "                     erase boxes when the chain erases) at the end\n"
            "  --dump FILE.jpg    write a contact sheet of the first batch\n"
            "  --raw FILE         write the first batch's u8 NHWC pixels to FILE (raw bytes)\n"
            "  --list             list the records (key label WxHxC enc bytes name) and exit\n"
            "  -q, --quiet        no progress output\n"
            "  -h, --help         this help\n"
            "      --version      print the version\n"
            "\n"
            "Exit status: 0 done, 1 failed (bad dataset or record), 2 bad usage.\n",
            RN_LOADER_CROP, RN_LOADER_BATCH, RN_LOADER_PREFETCH);
}

/* --start E:I, both whole numbers from 0 */
static int parse_start(const char *text, int64_t *epoch, int64_t *index) {
    const char *colon = strchr(text, ':');
    char e[32];
    size_t n = colon ? (size_t)(colon - text) : 0;
    if (!colon || n >= sizeof e) goto bad;
    memcpy(e, text, n);
    e[n] = 0;
    if (rn_cli_i64("--start", e, 0, INT64_MAX, epoch) || rn_cli_i64("--start", colon + 1, 0, INT64_MAX, index)) goto bad;
    return RN_OK;
bad:
    return rn_errorf(RN_EINVAL, "--start: '%s' is not EPOCH:INDEX, e.g. 3:1024", text);
}

/* The flags and arguments that only make sense together, checked once every flag is read. */
static int check_flags(int nargs) {
    if (nargs != 1) return rn_errorf(RN_EINVAL, "expected one DATA.lmdb, got %d arguments", nargs);
    return RN_OK;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --dump and --raw: each erase box painted in the colour its normalised value stands for
 * (value 0: the ImageNet mean colour), so the pictures show what the network sees */
static void paint_erase(rn_batch *b) {
    for (int k = 0; k < b->n; k++) {
        const rn_erase *e = &b->erase[k];
        uint8_t *img = b->pixels + (size_t)k * b->h * b->w * b->c;
        for (int y = e->y; y < e->y + e->h; y++)
            for (int x = e->x; x < e->x + e->w; x++)
                for (int ch = 0; ch < b->c; ch++) {
                    uint32_t el = (uint32_t)(((size_t)y * b->w + x) * b->c + ch);
                    int mc = b->c == 3 ? ch : 0;
                    float v = e->random ? rn_erase_value(b->erase_key, b->erase_epoch, e->rec, el) : 0.0f;
                    float u = (v * RN_IMAGENET_STD[mc] + RN_IMAGENET_MEAN[mc]) * 255.0f;
                    img[el] = (uint8_t)(u < 0 ? 0 : u > 255 ? 255 : lrintf(u));
                }
    }
}

int main(int argc, char **argv) {
    rn_loader_opts o;
    rn_loader_defaults(&o);
    int64_t epochs = 0, max_batches = 0;
    int to_float = 0, sums = 0, list = 0, quiet = 0, checksum = 0;
    int64_t start_e = 0, start_i = 0;
    const char *dump = NULL, *raw = NULL;
    enum { O_CROP = 256, O_BATCH, O_WORKERS, O_PREFETCH, O_EPOCHS, O_BATCHES, O_SEED, O_EVAL, O_AUGMENT,
           O_RESIZE, O_NOSHUF, O_DROP, O_EXACT, O_FLOAT, O_START, O_SUMS, O_DUMP, O_LIST, O_VERSION, O_RAW, O_CHECKSUM, O_RAREPS };
    static const struct option lo[] = {
        {"crop", required_argument, 0, O_CROP},         {"batch", required_argument, 0, O_BATCH},
        {"workers", required_argument, 0, O_WORKERS},   {"prefetch", required_argument, 0, O_PREFETCH},
        {"epochs", required_argument, 0, O_EPOCHS},     {"batches", required_argument, 0, O_BATCHES},
        {"seed", required_argument, 0, O_SEED},         {"eval", no_argument, 0, O_EVAL},
        {"augment", required_argument, 0, O_AUGMENT},   {"resize", required_argument, 0, O_RESIZE},
        {"no-shuffle", no_argument, 0, O_NOSHUF},       {"drop-last", no_argument, 0, O_DROP},
        {"exact", no_argument, 0, O_EXACT},             {"float", no_argument, 0, O_FLOAT},
        {"start", required_argument, 0, O_START},       {"sums", no_argument, 0, O_SUMS},
        {"dump", required_argument, 0, O_DUMP},         {"raw", required_argument, 0, O_RAW},
        {"checksum", no_argument, 0, O_CHECKSUM},         {"list", no_argument, 0, O_LIST},
        {"ra-reps", required_argument, 0, O_RAREPS},
        {"quiet", no_argument, 0, 'q'},                 {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, O_VERSION},         {0, 0, 0, 0}};
    int c, rc = RN_OK;
    while (rc == RN_OK && (c = getopt_long(argc, argv, "qh", lo, NULL)) != -1) {
        switch (c) {
        case O_CROP: rc = rn_cli_int("--crop", optarg, 1, 4096, &o.crop); break;
        case O_BATCH: rc = rn_cli_int("--batch", optarg, 1, 65536, &o.batch); break;
        case O_WORKERS: rc = rn_cli_int("--workers", optarg, 1, 1024, &o.workers); break;
        case O_PREFETCH: rc = rn_cli_int("--prefetch", optarg, 2, 64, &o.prefetch); break;
        case O_EPOCHS: rc = rn_cli_i64("--epochs", optarg, 1, 1000000, &epochs); break;
        case O_BATCHES: rc = rn_cli_i64("--batches", optarg, 1, INT64_C(1) << 40, &max_batches); break;
        case O_SEED: rc = rn_cli_u64("--seed", optarg, 0, UINT64_MAX, &o.seed); break;
        case O_EVAL: o.train = 0; break;
        case O_AUGMENT:
            if ((rc = rn_augment_parse(optarg, &o.aug))) rc = rn_error_context(rc, "--augment");
            break;
        case O_RESIZE: rc = rn_cli_int("--resize", optarg, 0, 65535, &o.resize); break;
        case O_NOSHUF: o.shuffle = 0; break;
        case O_RAREPS: rc = rn_cli_int("--ra-reps", optarg, 1, 64, &o.repeats); break;
        case O_DROP: o.drop_last = 1; break;
        case O_EXACT: o.exact = 1; break;
        case O_FLOAT: to_float = 1; break;
        case O_START: rc = parse_start(optarg, &start_e, &start_i); break;
        case O_SUMS: sums = 1; break;
        case O_CHECKSUM: checksum = 1; break;
        case O_DUMP: dump = optarg; break;
        case O_RAW: raw = optarg; break;
        case O_LIST: list = 1; break;
        case 'q': quiet = 1; break;
        case 'h': usage(stdout); return 0;
        case O_VERSION: printf("rn-load %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "Try 'rn-load --help'.\n"); return 2;
        }
    }
    if (rc == RN_OK) rc = check_flags(argc - optind);
    if (rc == RN_OK && o.repeats > 1 && !o.train)
        rc = rn_errorf(RN_EINVAL, "--ra-reps repeats training batches: not with --eval");
    if (rc == RN_OK && o.repeats > 1 && o.batch % o.repeats)
        rc = rn_errorf(RN_EINVAL, "--batch %d is not a multiple of --ra-reps %d", o.batch, o.repeats);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-load: %s\nTry 'rn-load --help'.\n", rn_last_error());
        return 2;
    }
    const char *path = argv[optind];
    if (rn_cli_output("rn-load", dump, stderr) != RN_OK || rn_cli_output("rn-load", raw, stderr) != RN_OK) {
        fprintf(stderr, "rn-load: %s\n", rn_last_error());
        return 1;
    }
    if (list) {
        if (rn_dataset_list(path, stdout) != RN_OK) {
            fprintf(stderr, "rn-load: %s\n", rn_last_error());
            return 1;
        }
        return 0;
    }
    double t0 = now(), last = t0;
    rn_loader *l;
    if (rn_loader_create(path, &o, &l) != RN_OK) {
        fprintf(stderr, "rn-load: %s\n", rn_last_error());
        return 1;
    }
    if ((start_e || start_i) && rn_loader_seek(l, start_e, start_i) != RN_OK) {
        fprintf(stderr, "rn-load: --start: %s\n", rn_last_error());
        rn_loader_destroy(l);
        return 1;
    }
    int tty = isatty(2), status = 0, nworkers = o.workers ? o.workers : (int)sysconf(_SC_NPROCESSORS_ONLN);
    float *fbuf = NULL;
    if (to_float) {
        fbuf = malloc((size_t)o.batch * o.crop * o.crop * 3 * sizeof(float));
        if (!fbuf) {
            fprintf(stderr, "rn-load: out of memory for the --float buffer\n");
            rn_loader_destroy(l);
            return 1;
        }
    }
    /* --batches alone runs as many epochs as it takes */
    int64_t end_epoch = epochs ? start_e + epochs : max_batches ? INT64_MAX : start_e + 1, images = 0, batches = 0;
    uint32_t crc = 0;
    for (;;) {
        int64_t e, i;
        rn_loader_position(l, &e, &i);
        if (e >= end_epoch || (max_batches && batches >= max_batches)) break;
        rn_batch b;
        if (rn_loader_next(l, &b) != RN_OK) {
            fprintf(stderr, "rn-load: %s\n", rn_last_error());
            status = 1;
            break;
        }
        size_t nbytes = (size_t)b.n * b.h * b.w * b.c;
        if (to_float) rn_loader_normalize(&b, fbuf, RN_IMAGENET_MEAN, RN_IMAGENET_STD);
        if (sums) {
            uint32_t bc = rn_crc32c(rn_crc32c(0, b.pixels, nbytes), b.labels, (size_t)b.n * sizeof(int32_t));
            printf("batch %" PRId64 " %" PRId64 " %d %d %08x\n", b.epoch, b.index, b.n, b.last, bc);
        }
        if (checksum) {
            crc = rn_crc32c(crc, b.pixels, nbytes);
            crc = rn_crc32c(crc, b.labels, (size_t)b.n * sizeof(int32_t));
            if (b.erase) crc = rn_crc32c(crc, b.erase, (size_t)b.n * sizeof *b.erase);
        }
        if (b.erase && (dump || raw) && batches == 0) paint_erase(&b);
        if (dump && batches == 0) {
            uint8_t *jpg;
            size_t len;
            if (rn_loader_contact_sheet(&b, 0, &jpg, &len) != RN_OK || rn_file_write_atomic(dump, jpg, len) != RN_OK) {
                fprintf(stderr, "rn-load: --dump %s: %s\n", dump, rn_last_error());
                status = 1;
            }
            if (status == 0) free(jpg);
        }
        if (raw && batches == 0 && rn_file_write_atomic(raw, b.pixels, nbytes) != RN_OK) {
            fprintf(stderr, "rn-load: --raw: %s\n", rn_last_error());
            status = 1;
        }
        images += b.n;
        batches++;
        rn_loader_release(l, &b);
        if (status) break;
        double t = now();
        if (!quiet && t - last >= (tty ? 0.5 : 10.0)) {
            last = t;
            fprintf(stderr, tty ? "\rrn-load: epoch %" PRId64 ", %" PRId64 " images, %.0f img/s " : "rn-load: epoch %" PRId64 ", %" PRId64 " images, %.0f img/s\n",
                    b.epoch, images, images / (t - t0));
        }
    }
    double secs = now() - t0;
    if (!quiet && tty) fputc('\n', stderr);
    int64_t pe, pi;
    rn_loader_position(l, &pe, &pi);
    rn_loader_destroy(l);
    free(fbuf);
    if (status == 0) {
        printf("rn-load: %" PRId64 " images in %" PRId64 " batches, %.2f s: %.1f img/s (%d workers, batch %d, crop %d%s)\n",
               images, batches, secs, images / (secs > 1e-9 ? secs : 1e-9), nworkers, o.batch, o.crop,
               to_float ? ", float" : "");
        printf("position: %" PRId64 ":%" PRId64 "\n", pe, pi);
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0) {
            double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
            printf("cpu: %.2f s (%.1f img per cpu-second)\n", cpu, images / (cpu > 1e-9 ? cpu : 1e-9));
        }
        if (checksum) printf("checksum: %08x\n", crc);
        char chain[1024];
        if (o.train) rn_augment_format(&o.aug, chain, sizeof chain);
        printf("augment: %s\n", o.train ? chain : "eval transform");
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "rn-load: writing to stdout failed\n");
        status = 1;
    }
    return status;
}
