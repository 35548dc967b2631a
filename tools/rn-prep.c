/* rn-prep: a folder of images (ImageFolder layout or a list file) to an rn dataset. */
#include <getopt.h>
#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rn/cli.h"
#include "rn/dataset.h"
#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/imgfile.h"
#include "rn/prep.h"

static const char *usage_text =
    "usage: rn-prep [options] SRC OUT.lmdb\n"
    "Decode images, optionally resize/crop/augment, and write an rn dataset (LMDB of Sample\n"
    "records, keys %%08u, plus __info__ and OUT.lmdb/classes.txt).\n"
    "\n"
    "SRC is a folder in ImageFolder layout (SRC/<class>/<file>.jpg; labels are the sorted\n"
    "class names, as torchvision's ImageFolder) or a list file of 'relative/path label' lines.\n"
    "This build reads %s files (by their content, whatever the name says). Pixels are\n"
    "PIL's Image.open(f).convert(\"RGB\"): alpha and tRNS dropped (not composited), palettes\n"
    "expanded, 16-bit colour to its high byte, 16-bit grey clipped to 0..255 (PIL's mode I).\n"
    "\n"
    "  --root DIR          list file paths are relative to DIR (default: the list's folder)\n"
    "  --classes FILE      take class names/labels from FILE (one per line) or a dataset\n"
    "                      (e.g. --classes train.lmdb so val labels match train)\n"
    "  --resize N          shorter side to N pixels, keeping aspect (default 0: keep)\n"
    "  --center-crop N     centre crop N x N after the resize (default: none)\n"
    "  --encode jpeg|raw   store re-encoded JPEG (default) or raw u8 HWC pixels (lossless:\n"
    "                      what a PNG dataset may prefer, at a larger size)\n"
    "  --quality Q         JPEG quality 1..100 (default %d)\n"
    "  --gray              store 1 channel (luma) instead of RGB: the JPEG's Y channel, or\n"
    "                      PIL's convert(\"L\") for other formats\n"
    "  --shuffle           shuffle the record order (seeded by --seed)\n"
    "  --seed S            seed for --shuffle and --augment (default 0)\n"
    "  --limit N           write at most N source images\n"
    "  --threads N         decoding threads (default: all cores; output identical for any N)\n"
    "  --augment K         write K RandomResizedCrop+flip variants per image (offline augmentation)\n"
    "  --crop S            size of the --augment variants (default %d)\n"
    "  --max-pixels N      skip images over N pixels, read from the header before decoding\n"
    "                      (default %llu)\n"
    "  --max-classes N     list files: labels must be below N (default %d)\n"
    "  --report FILE       write every skipped input and why to FILE (tab separated)\n"
    "  --strict            any bad input fails the run (exit 1, no output written)\n"
    "  --map-size SIZE     initial LMDB map size, e.g. 4G or 1073741824 (bytes; default 1G;\n"
    "                      it grows when full)\n"
    "  -q, --quiet         no progress output\n"
    "  -h, --help          this help\n"
    "      --version       print the version\n"
    "\n"
    "Bad inputs (unreadable, empty, in no format read, corrupt, truncated, too large) are\n"
    "skipped and reported on stderr. A JPEG is corrupt when libjpeg reports anything wrong\n"
    "with its data, warnings included (PIL decodes some of these with grey blocks; rn does\n"
    "not); a PNG or WebP when libspng or libwebp does (a bad CRC, a cut stream). An\n"
    "animated WebP is skipped (PIL would read its first frame).\n"
    "Exit status: 0 done, 1 failed, 2 bad usage.\n";

static void usage(FILE *f) {
    fprintf(f, usage_text, rn_imgfile_formats(), RN_PREP_QUALITY, RN_PREP_AUG_CROP, (unsigned long long)RN_PREP_MAX_PIXELS,
            RN_PREP_MAX_CLASSES);
}

/* The flags and arguments that only make sense together, checked once every flag is read. */
static int check_flags(int nargs) {
    if (nargs != 2) return rn_errorf(RN_EINVAL, "expected SRC and OUT.lmdb, got %d argument%s", nargs, nargs == 1 ? "" : "s");
    return RN_OK;
}

typedef struct {
    int quiet, tty;
    double t0, last;
    char *report;
    size_t report_len, report_cap;
    int report_oom;
} ui;

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = 1; }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void on_skip(void *ctx, const char *file, const char *reason) {
    ui *u = ctx;
    if (u->tty && !u->quiet) fputc('\n', stderr);
    fprintf(stderr, "rn-prep: skipped %s: %s\n", file, reason);
    size_t need = strlen(file) + strlen(reason) + 3;
    if (u->report_len + need > u->report_cap) {
        size_t nc = (u->report_cap + need) * 2;
        char *p = realloc(u->report, nc);
        if (!p) {
            u->report_oom = 1;
            return;
        }
        u->report = p;
        u->report_cap = nc;
    }
    u->report_len += (size_t)sprintf(u->report + u->report_len, "%s\t%s\n", file, reason);
}

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    ui *u = ctx;
    if (u->quiet) return;
    double t = now();
    if (done < total && t - u->last < (u->tty ? 0.2 : 10.0)) return;
    u->last = t;
    double rate = done / (t - u->t0 > 1e-9 ? t - u->t0 : 1e-9);
    double eta = rate > 0 ? (total - done) / rate : 0;
    if (u->tty) {
        int width = 30, fill = total ? (int)(width * done / total) : width;
        fprintf(stderr, "\r[%.*s%*s] %" PRIu64 "/%" PRIu64 " %.0f img/s ETA %.0fs ", fill,
                "##############################", width - fill, "", done, total, rate, eta);
        if (done == total) fputc('\n', stderr);
    } else {
        fprintf(stderr, "rn-prep: %" PRIu64 "/%" PRIu64 " images, %.0f img/s, ETA %.0f s\n", done, total, rate, eta);
    }
}

static char *join_argv(int argc, char **argv) {
    size_t n = 1;
    for (int i = 0; i < argc; i++) n += strlen(argv[i]) * 2 + 3;
    char *s = malloc(n), *p = s;
    if (!s) return NULL;
    for (int i = 0; i < argc; i++) {
        if (i) *p++ = ' ';
        int q = argv[i][0] == 0 || strpbrk(argv[i], " \t'\"\\$") != NULL;
        if (q) *p++ = '\'';
        for (const char *a = argv[i]; *a; a++) {
            if (*a == '\'' && q) {
                memcpy(p, "'\\''", 4);
                p += 4;
            } else {
                *p++ = *a;
            }
        }
        if (q) *p++ = '\'';
    }
    *p = 0;
    return s;
}

int main(int argc, char **argv) {
    rn_prep_opts o;
    rn_prep_defaults(&o);
    const char *report = NULL;
    ui u;
    memset(&u, 0, sizeof u);
    enum { O_ROOT = 256, O_CLASSES, O_RESIZE, O_CCROP, O_ENCODE, O_QUALITY, O_GRAY, O_SHUFFLE, O_SEED,
           O_LIMIT, O_THREADS, O_AUGMENT, O_CROP, O_MAXPIX, O_MAXCLS, O_REPORT, O_STRICT, O_MAPSIZE, O_VERSION };
    static const struct option longopts[] = {
        {"root", required_argument, 0, O_ROOT},       {"classes", required_argument, 0, O_CLASSES},
        {"resize", required_argument, 0, O_RESIZE},   {"center-crop", required_argument, 0, O_CCROP},
        {"encode", required_argument, 0, O_ENCODE},   {"quality", required_argument, 0, O_QUALITY},
        {"gray", no_argument, 0, O_GRAY},             {"shuffle", no_argument, 0, O_SHUFFLE},
        {"seed", required_argument, 0, O_SEED},       {"limit", required_argument, 0, O_LIMIT},
        {"threads", required_argument, 0, O_THREADS}, {"augment", required_argument, 0, O_AUGMENT},
        {"crop", required_argument, 0, O_CROP},       {"max-pixels", required_argument, 0, O_MAXPIX},
        {"report", required_argument, 0, O_REPORT},   {"strict", no_argument, 0, O_STRICT},
        {"map-size", required_argument, 0, O_MAPSIZE}, {"quiet", no_argument, 0, 'q'},
        {"max-classes", required_argument, 0, O_MAXCLS},
        {"help", no_argument, 0, 'h'},                {"version", no_argument, 0, O_VERSION},
        {0, 0, 0, 0}};
    int opt, rc = RN_OK;
    while (rc == RN_OK && (opt = getopt_long(argc, argv, "qh", longopts, NULL)) != -1) {
        switch (opt) {
        case O_ROOT: o.root = optarg; break;
        case O_CLASSES: o.classes = optarg; break;
        case O_RESIZE: rc = rn_cli_int("--resize", optarg, 0, 65535, &o.resize); break;
        case O_CCROP: rc = rn_cli_int("--center-crop", optarg, 1, 65535, &o.center_crop); break;
        case O_ENCODE:
            if (strcmp(optarg, "jpeg") == 0) o.enc = RN_ENC_JPEG;
            else if (strcmp(optarg, "raw") == 0) o.enc = RN_ENC_RAW;
            else rc = rn_errorf(RN_EINVAL, "--encode: '%s' is not jpeg or raw", optarg);
            break;
        case O_QUALITY: rc = rn_cli_int("--quality", optarg, 1, 100, &o.quality); break;
        case O_GRAY: o.gray = 1; break;
        case O_SHUFFLE: o.shuffle = 1; break;
        case O_SEED: rc = rn_cli_u64("--seed", optarg, 0, UINT64_MAX, &o.seed); break;
        case O_LIMIT: rc = rn_cli_u64("--limit", optarg, 1, UINT64_MAX, &o.limit); break;
        case O_THREADS: rc = rn_cli_int("--threads", optarg, 1, 256, &o.threads); break;
        case O_AUGMENT: rc = rn_cli_int("--augment", optarg, 0, 1000, &o.augment); break;
        case O_CROP: rc = rn_cli_int("--crop", optarg, 1, 65535, &o.aug_crop); break;
        case O_MAXPIX: rc = rn_cli_u64("--max-pixels", optarg, 1, UINT64_MAX, &o.max_pixels); break;
        case O_MAXCLS: rc = rn_cli_int("--max-classes", optarg, 1, 1 << 24, &o.max_classes); break;
        case O_REPORT: report = optarg; break;
        case O_STRICT: o.strict = 1; break;
        case O_MAPSIZE: rc = rn_cli_size("--map-size", optarg, 65536, &o.map_size); break;
        case 'q': u.quiet = 1; break;
        case 'h': usage(stdout); return 0;
        case O_VERSION: printf("rn-prep %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "Try 'rn-prep --help'.\n"); return 2;
        }
    }
    if (rc == RN_OK) rc = check_flags(argc - optind);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-prep: %s\nTry 'rn-prep --help'.\n", rn_last_error());
        return 2;
    }
    o.src = argv[optind];
    o.out = argv[optind + 1];
    if (rn_cli_output("rn-prep", report, stderr) != RN_OK) {
        fprintf(stderr, "rn-prep: %s\n", rn_last_error());
        return 1;
    }
    char *cmd = join_argv(argc, argv);
    o.command = cmd;
    o.rn_version = RN_VERSION;
    o.on_skip = on_skip;
    o.on_progress = on_progress;
    o.ctx = &u;
    /* SIGINT/SIGTERM: stop cleanly, removing the partial OUT.tmp */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    o.cancel = (const volatile int *)&interrupted;
    u.tty = isatty(2);
    u.t0 = u.last = now();
    rn_prep_result res;
    rc = rn_prep_run(&o, &res);
    double secs = now() - u.t0;
    int status = 0;
    if (report) {
        if (u.report_oom) fprintf(stderr, "rn-prep: --report %s: out of memory, the report is incomplete\n", report);
        if (rn_file_write_atomic(report, u.report ? u.report : "", u.report_len) != RN_OK) {
            fprintf(stderr, "rn-prep: --report: %s\n", rn_last_error());
            status = 1;
        }
    }
    if (rc != RN_OK) {
        fprintf(stderr, "rn-prep: %s\n", rn_last_error());
        status = 1;
    } else {
        printf("rn-prep: wrote %" PRIu64 " records to %s from %" PRIu64 " inputs (%" PRIu64
               " skipped), %d classes, in %.2f s: %.1f img/s\n",
               res.written, o.out, res.inputs, res.skipped, res.n_classes, secs,
               (res.inputs ? (double)(res.inputs) : 0.0) / (secs > 1e-9 ? secs : 1e-9));
    }
    free(u.report);
    free(cmd);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "rn-prep: writing to stdout failed\n");
        status = 1;
    }
    return status;
}
