/* rn-lrfind: the learning-rate range test from a checkpoint (rn/lrfind.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/loader.h"
#include "rn/lrfind.h"
#include "rn/train.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: rn-lrfind --data TRAIN.lmdb --in IN.pb --out SWEEP.jsonl [--plot SWEEP.png] [options]\n"
            "\n"
            "The learning-rate range test: from IN's weights (in memory; IN is never written), SGD\n"
            "steps with the lr growing geometrically from --lr-min to --lr-max, recording the loss\n"
            "and its smoothed value (moving average, beta %g, bias-corrected, as fastai); stops\n"
            "when the smoothed loss passes %gx its best (fastai's rule). Prints\n"
            "  suggested lr: X (steepest descent of the smoothed loss at step S)\n"
            "the lr where the smoothed loss falls fastest against log lr, before its minimum.\n"
            "\n"
            "  -d, --data DIR          training dataset (rn-prep output)\n"
            "  -i, --in IN.pb          checkpoint to start from (left untouched)\n"
            "  -o, --out FILE.jsonl    one JSON object per step: step, lr, loss, smoothed (- stdout)\n"
            "      --plot FILE.png     smoothed loss against lr (log x) with the suggestion marked,\n"
            "                          drawn by gnuplot (Debian: gnuplot-nox)\n"
            "      --lr-min X          lr of the first step (default %g)\n"
            "      --lr-max X          lr of the last step (default %g)\n"
            "      --steps N           steps of the sweep (default %d)\n"
            "  -b, --batch N           images per step (default %d); use the batch you train with\n"
            "      --micro-batch M     images per forward, a divisor of N (gradients accumulated,\n"
            "                          as rn-train); default: the largest divisor that fits in memory\n"
            "      --crop S            training crop (default %d)\n"
            "      --augment CHAIN     training augmentation, as rn-train (default rrc,flip)\n"
            "      --momentum X        (default %g)\n"
            "      --wd X              weight decay (default %g)\n"
            "      --nesterov          Nesterov momentum\n"
            "      --seed S            data order and augmentation seed (default: IN's)\n"
            "  -w, --workers N         loader threads (default %d)\n"
            "  -t, --threads N         compute threads on the CPU (default: all cores)\n"
            "      --device D          auto, cpu, cuda or cuda:N (default auto)\n"
            "  -h, --help              this help\n"
            "  -V, --version           print the version\n"
            "\n"
            "Exit status: 0 success, 1 failure (message on stderr), 2 bad usage.\n",
            RN_LRFIND_BETA, RN_LRFIND_DIVERGE, RN_LRFIND_MIN, RN_LRFIND_MAX, RN_LRFIND_STEPS, RN_TRAIN_BATCH,
            RN_TRAIN_CROP, RN_TRAIN_MOMENTUM, RN_TRAIN_WD, RN_TRAIN_WORKERS);
}

/* gnuplot on PATH */
static int have_gnuplot(void) {
    const char *path = getenv("PATH");
    char dir[4096];
    while (path && *path) {
        size_t len = strcspn(path, ":");
        snprintf(dir, sizeof dir, "%.*s/gnuplot", (int)len, path);
        if (len && access(dir, X_OK) == 0) return 1;
        path += len + (path[len] == ':');
    }
    return 0;
}

/* Whether path names the file in is (so writing it would replace the checkpoint). */
static int same_file(const char *path, const char *in) {
    struct stat a, b;
    return path && in && stat(path, &a) == 0 && stat(in, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* The PNG through gnuplot, written to PATH.tmp and renamed. */
static int plot(const char *png, const rn_lrfind_point *p, int n, int at) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", png);
    FILE *g = popen("gnuplot", "w");
    if (!g) return rn_errorf(RN_EIO, "--plot %s: cannot start gnuplot: %s", png, strerror(errno));
    fprintf(g, "set terminal pngcairo size 900,600 font ',10'\nset output '%s'\n", tmp);
    fprintf(g, "set logscale x\nset format x '%%.0e'\nset xlabel 'learning rate'\nset ylabel 'loss'\nset grid\n"
               "set title 'LR range test: suggested lr %.3g (step %lld)'\n", p[at].lr, (long long)p[at].step);
    fprintf(g, "plot '-' using 1:2 with lines lw 2 title 'smoothed loss', '-' using 1:2 with points pt 7 ps 2 "
               "title 'suggested lr'\n");
    for (int i = 0; i < n; i++) fprintf(g, "%.9g %.9g\n", p[i].lr, p[i].smoothed);
    fprintf(g, "e\n%.9g %.9g\ne\n", p[at].lr, p[at].smoothed);
    int st = pclose(g);
    if (st != 0) {
        remove(tmp);
        return rn_errorf(RN_EIO, "--plot %s: gnuplot failed (status %d)", png, st);
    }
    if (rename(tmp, png)) return rn_errorf(RN_EIO, "--plot %s: %s", png, strerror(errno));
    return rn_fsync_dir_of(png);
}

/* The points as JSON lines, written atomically. */
static int write_jsonl(const char *path, const rn_lrfind_point *p, int n) {
    size_t cap = (size_t)n * 128 + 1, len = 0;
    char *buf = malloc(cap);
    if (!buf) return rn_errorf(RN_ENOMEM, "out of memory for %d lines", n);
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, cap - len, "{\"step\":%lld,\"lr\":%.9g,\"loss\":%.9g,\"smoothed\":%.9g}\n",
                                (long long)p[i].step, p[i].lr, p[i].loss, p[i].smoothed);
    int rc = rn_file_write_atomic(path, buf, len);
    free(buf);
    return rc;
}

enum { O_PLOT = 256, O_LRMIN, O_LRMAX, O_STEPS, O_CROP, O_AUG, O_MOM, O_WD, O_NEST, O_SEED, O_DEVICE, O_MICRO };

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"data", required_argument, 0, 'd'},        {"in", required_argument, 0, 'i'},
        {"out", required_argument, 0, 'o'},         {"plot", required_argument, 0, O_PLOT},
        {"lr-min", required_argument, 0, O_LRMIN},  {"lr-max", required_argument, 0, O_LRMAX},
        {"steps", required_argument, 0, O_STEPS},   {"batch", required_argument, 0, 'b'},
        {"micro-batch", required_argument, 0, O_MICRO}, {"crop", required_argument, 0, O_CROP},     {"augment", required_argument, 0, O_AUG},
        {"momentum", required_argument, 0, O_MOM},  {"wd", required_argument, 0, O_WD},
        {"nesterov", no_argument, 0, O_NEST},       {"seed", required_argument, 0, O_SEED},
        {"workers", required_argument, 0, 'w'},     {"threads", required_argument, 0, 't'},
        {"device", required_argument, 0, O_DEVICE}, {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},           {0, 0, 0, 0},
    };
    rn_lrfind_opts o;
    rn_lrfind_defaults(&o);
    int rc = rn_cli_backend_env(&o.backend), c;
    const char *in = NULL, *out = NULL, *png = NULL;
    while (rc == RN_OK && (c = getopt_long(argc, argv, "d:i:o:b:w:t:hV", opts, NULL)) != -1) {
        switch (c) {
        case 'd': o.data = optarg; break;
        case 'i': in = optarg; break;
        case 'o': out = optarg; break;
        case O_PLOT: png = optarg; break;
        case O_LRMIN: rc = rn_cli_float("--lr-min", optarg, 1e-30, 1e6, &o.lr_min); break;
        case O_LRMAX: rc = rn_cli_float("--lr-max", optarg, 1e-30, 1e6, &o.lr_max); break;
        case O_STEPS: rc = rn_cli_int("--steps", optarg, 5, 1000000, &o.steps); break;
        case 'b': rc = rn_cli_int("--batch", optarg, 1, 1 << 20, &o.batch); break;
        case O_MICRO: rc = rn_cli_int("--micro-batch", optarg, 1, 1 << 20, &o.micro_batch); break;
        case O_CROP: rc = rn_cli_int("--crop", optarg, 8, 4096, &o.crop); break;
        case O_AUG:
            if ((rc = rn_augment_parse(optarg, &o.augment))) rc = rn_error_context(rc, "--augment");
            break;
        case O_MOM: rc = rn_cli_float("--momentum", optarg, 0, 1, &o.momentum); break;
        case O_WD: rc = rn_cli_float("--wd", optarg, 0, 1, &o.weight_decay); break;
        case O_NEST: o.nesterov = 1; break;
        case O_SEED: rc = rn_cli_u64("--seed", optarg, 0, UINT32_MAX, &o.seed); o.seed_given = 1; break;
        case 'w': rc = rn_cli_int("--workers", optarg, 1, 1024, &o.workers); break;
        case 't': rc = rn_cli_int("--threads", optarg, 1, 1024, &o.threads); break;
        case O_DEVICE: o.device = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("rn-lrfind %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "rn-lrfind: see 'rn-lrfind --help'\n"); return 2;
        }
    }
    if (rc == RN_OK && optind < argc) rc = rn_errorf(RN_EINVAL, "unexpected argument '%s'", argv[optind]);
    if (rc == RN_OK && (!o.data || !in || !out))
        rc = rn_errorf(RN_EINVAL, "--data, --in and --out are required (see --help)");
    if (rc == RN_OK && !(o.lr_min < o.lr_max))
        rc = rn_errorf(RN_EINVAL, "--lr-min %g is not below --lr-max %g", o.lr_min, o.lr_max);
    if (rc == RN_OK && o.micro_batch && o.batch % o.micro_batch)
        rc = rn_errorf(RN_EINVAL, "--batch %d is not a multiple of --micro-batch %d", o.batch, o.micro_batch);
    if (rc == RN_OK && (same_file(out, in) || same_file(png, in)))
        rc = rn_errorf(RN_EINVAL, "--out/--plot %s is the checkpoint --in: rn-lrfind never writes it (name another file)",
                       same_file(out, in) ? out : png);
    if (rc == RN_OK && png && !have_gnuplot())
        rc = rn_errorf(RN_EINVAL, "--plot: gnuplot is not installed (Debian: apt-get install gnuplot-nox)");
    if (rc != RN_OK) {
        fprintf(stderr, "rn-lrfind: %s\n", rn_last_error());
        return 2;
    }
    /* outputs checked before the sweep, not after it */
    if (rn_cli_output("rn-lrfind", out, stderr) != RN_OK || rn_cli_output("rn-lrfind", png, stderr) != RN_OK) {
        fprintf(stderr, "rn-lrfind: %s\n", rn_last_error());
        return 1;
    }
    o.progress = stderr;
    rn_ckpt *ck = NULL;
    rn_lrfind_point *pts = calloc((size_t)o.steps, sizeof *pts);
    int n = 0, diverged = 0, at = 0;
    if (!pts) rc = rn_errorf(RN_ENOMEM, "out of memory for %d steps", o.steps);
    if (rc == RN_OK) rc = rn_ckpt_read(in, &ck);
    if (rc == RN_OK) rc = rn_lrfind_run(&o, ck, pts, &n, &diverged);
    if (rc == RN_OK) rc = write_jsonl(out, pts, n);
    if (rc == RN_OK) rc = rn_lrfind_suggest(pts, n, &at);
    if (rc == RN_OK && png) rc = plot(png, pts, n, at);
    if (rc == RN_OK)
        printf("suggested lr: %.3g (steepest descent of the smoothed loss at step %lld)\n", pts[at].lr,
               (long long)pts[at].step);
    rn_ckpt_free(ck);
    free(pts);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-lrfind: %s\n", rn_last_error());
        return 1;
    }
    return 0;
}
