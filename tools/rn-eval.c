/* rn-eval: accuracy and loss of a checkpoint on a dataset. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/dist.h"
#include "rn/err.h"
#include "rn/eval.h"
#include "rn/fileio.h"
#include "rn/json.h"
#include "rn/state.h"


static void usage(FILE *f) {
    fprintf(f, "usage: rn-eval --data VAL.lmdb --ckpt MODEL.pb [options]\n"
               "\n"
               "Top-1 and top-k accuracy and the mean cross-entropy loss of a checkpoint on an rn\n"
               "dataset, in inference mode (running BN statistics, no gradients, no activations\n"
               "kept). Eval transform: resize the shorter side, centre crop. Prints\n"
               "  top1=0.7613 top5=0.9286 loss=0.9612 n=50000\n"
               "\n"
               "  -d, --data DIR            dataset (rn-prep output)\n"
               "  -c, --ckpt MODEL.pb       checkpoint (\"-\" for stdin)\n"
               "  -j, --json                the result as one JSON object\n"
               "      --per-class           accuracy per class (names from the checkpoint or dataset)\n"
               "      --confusion FILE.csv  write the confusion matrix (rows: true, columns: predicted)\n"
               "      --ema                 evaluate the checkpoint's moving average of the weights\n"
               "                            (rn-train --ema-decay; its BN statistics too) instead of\n"
               "                            its weights; an error when it holds none\n"
               "  -k, --topk K              the second accuracy is top-K (default 5)\n"
               "  -b, --batch N             images per forward (default 64)\n"
               "      --mem-limit SIZE      memory the network may plan for, e.g. 4G (default: the\n"
               "                            device's free memory less 5%% of its total; on the\n"
               "                            CPU the memory available, shared by the node's\n"
               "                            processes of the run); a batch over it stops\n"
               "                            before anything is allocated\n"
               "      --crop S              centre crop (default 224)\n"
               "      --resize N            shorter side before the crop (default round(S*256/224);\n"
               "                            0: no resize)\n"
               "      --dump-logits FILE    per-sample logits in dataset order, as safetensors\n"
               "  -w, --workers N           loader threads (default 4)\n"
               "  -t, --threads N           compute threads on the CPU (default: all cores); the\n"
               "                            result is the same bytes for any N\n"
               "      --device D            auto, cpu, cuda or cuda:N (default auto)\n"
               "      --deterministic       GPU: deterministic convolution algorithms, chosen the\n"
               "                            same way in every process (results repeat bit for bit)\n"
               "      --dist-timeout S      many processes: seconds a rank waits for the others\n"
               "                            before it gives up (default %.0f)\n"
               "      --profile FILE        instead of evaluating: forward --profile-warmup batches,\n"
               "                            then --profile-steps batches with every layer timed,\n"
               "                            write the table to FILE and a Chrome trace to FILE.json\n"
               "                            (as rn-train --profile); prints no result. One process\n"
               "      --profile-steps N     batches profiled (default %d)\n"
               "      --profile-warmup N    batches forwarded before them (default %d)\n"
               "  -h, --help                this help\n"
               "  -V, --version             print the version\n"
               "\n"
               "Many processes: mpirun -np 4 rn-eval --data val.lmdb --ckpt e1.pb\n"
               "  Each rank forwards its own slice of the records, --batch images at a time, in\n"
               "  the runs one process makes; rank 0 counts every image in dataset order. The\n"
               "  output and the --dump-logits file are the same bytes for any number of ranks;\n"
               "  no record is padded or repeated. --device auto or cuda takes the GPU of the\n"
               "  rank's local rank (or the one GPU it sees); --threads 0 shares the cores among a\n"
               "  machine's ranks. Rank 0 prints and writes the files; an error prints on its\n"
               "  rank as \"rank R: ...\" and the job exits non-zero.\n"
               "\n"
               "Environment (CPU): RN_CPU_GEMM=own|avx2|portable|openblas runs the convolutions and\n"
               "  the fc on rn's own kernel at AVX-512, AVX2 or in C on aarch64 (own, the default\n"
               "  where the CPU has one: an image's logits are then the same bytes at any --batch,\n"
               "  whatever OPENBLAS_CORETYPE says), in its AVX2 or C form only (the same bytes)\n"
               "  or through OpenBLAS;\n"
               "  RN_CPU_WINOGRAD=0 the larger 3x3 ones as im2col + GEMM instead of Winograd\n"
               "  F(4x4,3x3) or F(2x2,3x3) (1, the default), 2 as F(2x2,3x3) only. Each changes\n"
               "  the logits by rounding only.\n"
               "\n"
               "Exit status: 0 success, 1 failure (message on stderr), 2 bad usage.\n",
            RN_DIST_TIMEOUT, RN_EVAL_PROFILE_STEPS, RN_EVAL_PROFILE_WARMUP);
}

/* The flags that only make sense together, checked once every flag is read. */
static int check_flags(const rn_eval_opts *o, const char *ckpt, int nargs, char **args) {
    if (nargs) return rn_errorf(RN_EINVAL, "unexpected argument '%s'", args[0]);
    if (!o->data || !ckpt) return rn_errorf(RN_EINVAL, "--data and --ckpt are required (see --help)");
    if (rn_dist_world(o->dist) > 1 && strcmp(ckpt, "-") == 0)
        return rn_errorf(RN_EINVAL, "--ckpt -: under mpirun only rank 0 reads stdin; give the checkpoint's path");
    if (o->profile && strcmp(o->profile, "-") == 0)
        return rn_errorf(RN_EINVAL, "--profile must be a file: the trace is written next to it as FILE.json");
    if (o->profile && rn_dist_world(o->dist) > 1)
        return rn_errorf(RN_EINVAL, "--profile times one process: run it without mpirun");
    return RN_OK;
}

/* rn-eval's message for the last error; "rank R: " first when there are many ranks. */
static void say_error(const rn_dist *d) {
    /* one write per line, so that the ranks' lines do not interleave */
    if (rn_dist_world(d) > 1) fprintf(stderr, "rank %d: rn-eval: %s\n", rn_dist_rank(d), rn_last_error());
    else fprintf(stderr, "rn-eval: %s\n", rn_last_error());
}

static int write_confusion(const char *path, const rn_eval_result *r, const rn_ckpt *ck) {
    size_t cap = 1 << 16, n = 0;
    char *buf = rn_malloc(cap);
    if (!buf) return RN_ENOMEM;
    for (int i = -1; i < r->n_classes; i++) {
        for (int j = -1; j < r->n_classes; j++) {
            int k = i < 0 ? j : j < 0 ? i : -2;
            const char *name = k >= 0 && (size_t)k < ck->n_class_names ? ck->class_names[k] : NULL;
            /* room for the name with every quote doubled (CSV), or a number */
            size_t need = (name ? 2 * strlen(name) : 0) + 64;
            while (cap - n < need) {
                char *nb = realloc(buf, cap *= 2);
                if (!nb) {
                    free(buf);
                    return rn_errorf(RN_ENOMEM, "out of memory");
                }
                buf = nb;
            }
            if (i < 0 && j < 0) n += (size_t)snprintf(buf + n, cap - n, "true\\predicted");
            else if (k >= 0 && name) {
                if (j >= 0) buf[n++] = ',';
                buf[n++] = '"';
                for (const char *s = name; *s; s++) {
                    if (*s == '"') buf[n++] = '"';
                    buf[n++] = *s;
                }
                buf[n++] = '"';
            } else if (k >= 0) n += (size_t)snprintf(buf + n, cap - n, "%s%d", j >= 0 ? "," : "", k);
            else n += (size_t)snprintf(buf + n, cap - n, ",%lld", (long long)r->confusion[(size_t)i * r->n_classes + j]);
        }
        buf[n++] = '\n';
    }
    int rc = rn_file_write_atomic(path, buf, n);
    free(buf);
    return rc;
}

int main(int argc, char **argv) {
    enum { O_PERCLASS = 256, O_CONF, O_CROP, O_RESIZE, O_DUMP, O_DEVICE, O_MEMLIMIT, O_DETERM, O_DISTTIMEOUT,
           O_PROFILE, O_PROFSTEPS, O_PROFWARM, O_EMA };
    static const struct option opts[] = {
        {"data", required_argument, 0, 'd'},     {"ckpt", required_argument, 0, 'c'},
        {"json", no_argument, 0, 'j'},           {"per-class", no_argument, 0, O_PERCLASS},
        {"confusion", required_argument, 0, O_CONF}, {"topk", required_argument, 0, 'k'},
        {"batch", required_argument, 0, 'b'},    {"crop", required_argument, 0, O_CROP},
        {"mem-limit", required_argument, 0, O_MEMLIMIT}, {"deterministic", no_argument, 0, O_DETERM},
        {"resize", required_argument, 0, O_RESIZE}, {"dump-logits", required_argument, 0, O_DUMP},
        {"workers", required_argument, 0, 'w'},  {"threads", required_argument, 0, 't'},
        {"device", required_argument, 0, O_DEVICE}, {"dist-timeout", required_argument, 0, O_DISTTIMEOUT},
        {"profile", required_argument, 0, O_PROFILE}, {"profile-steps", required_argument, 0, O_PROFSTEPS},
        {"profile-warmup", required_argument, 0, O_PROFWARM}, {"ema", no_argument, 0, O_EMA},
        {"help", no_argument, 0, 'h'},           {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    rn_eval_opts o;
    rn_eval_defaults(&o);
    /* the documented RN_* overrides first, so that flags win */
    int env_rc = rn_cli_backend_env(&o.backend);
    const char *ckpt = NULL, *confusion = NULL;
    double dist_timeout = RN_DIST_TIMEOUT;
    int json = 0, per_class = 0, ema = 0, c, rc = env_rc, status = 1;
    while (rc == RN_OK && (c = getopt_long(argc, argv, "d:c:jk:b:w:t:hV", opts, NULL)) != -1) {
        switch (c) {
        case 'd': o.data = optarg; break;
        case 'c': ckpt = optarg; break;
        case 'j': json = 1; break;
        case O_PERCLASS: per_class = 1; break;
        case O_EMA: ema = 1; break;
        case O_CONF: confusion = optarg; break;
        case 'k': rc = rn_cli_int("--topk", optarg, 1, 1 << 20, &o.topk); break;
        case 'b': rc = rn_cli_int("--batch", optarg, 1, 1 << 20, &o.batch); break;
        case O_MEMLIMIT: rc = rn_cli_size("--mem-limit", optarg, 1, &o.mem_limit); break;
        case O_CROP: rc = rn_cli_int("--crop", optarg, 8, 4096, &o.crop); break;
        case O_RESIZE: rc = rn_cli_int("--resize", optarg, 0, 16384, &o.resize); break;
        case O_DUMP: o.dump_logits = optarg; break;
        case 'w': rc = rn_cli_int("--workers", optarg, 1, 1024, &o.workers); break;
        case 't': rc = rn_cli_int("--threads", optarg, 1, 1024, &o.threads); break;
        case O_DEVICE: o.device = optarg; break;
        case O_DETERM: /* deterministic algorithms, chosen the same way in every process */
            o.backend.cuda_deterministic = 1;
            o.backend.cuda_conv_heuristic = 1;
            break;
        case O_DISTTIMEOUT: rc = rn_cli_float("--dist-timeout", optarg, 1e-3, 1e9, &dist_timeout); break;
        case O_PROFILE: o.profile = optarg; break;
        case O_PROFSTEPS: rc = rn_cli_int("--profile-steps", optarg, 1, 1000000, &o.profile_steps); break;
        case O_PROFWARM: rc = rn_cli_int("--profile-warmup", optarg, 0, 1000000, &o.profile_warmup); break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("rn-eval %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "rn-eval: see 'rn-eval --help'\n"); return 2;
        }
    }
    /* the ranks, before any thread starts (MPI_Init) */
    rn_dist *d = NULL;
    if (rc == RN_OK && (rc = rn_dist_open(&argc, &argv, rn_cli_launcher_world(), dist_timeout, &d)) != RN_OK) {
        say_error(d);
        rn_dist_close(d);
        return 1;
    }
    o.dist = d;
    if (rn_dist_many(d) && rn_dist_world(d) == 1)
        fprintf(stderr, "rn-eval: RN_DIST_SOLO=1: this one process runs the collectives of many with itself (a "
                "check: the output of the run without it)\n");
    if (rc == RN_OK) rc = check_flags(&o, ckpt, argc - optind, argv + optind);
    if (rc != RN_OK) {
        say_error(d);
        rn_dist_close(d);
        return 2;
    }
    const int root = rn_dist_rank(d) == 0;
    o.progress_tty = root && isatty(2);
    o.threads = rn_cli_dist_threads(o.threads, rn_dist_local_world(d));
    rn_ckpt *ck = NULL;
    rn_eval_result r = {0};
    o.backend.cuda_index = rn_dist_local_rank(d); /* cuda and auto: this rank's GPU */
    o.backend.cuda_local_world = rn_dist_local_world(d);
    /* rank 0 writes the files */
    if (root && (rc = rn_cli_output("rn-eval", confusion, stderr)) != RN_OK) goto agree;
    if (root && (rc = rn_cli_output("rn-eval", o.dump_logits, stderr)) != RN_OK) goto agree;
    if (root && (rc = rn_cli_output("rn-eval", o.profile, stderr)) != RN_OK) goto agree;
    rc = rn_ckpt_read(ckpt, &ck);
    if (rc == RN_OK && ema) rc = rn_state_use_ema(ck, ckpt);
agree:
    if ((rc = rn_dist_agree(d, rc, "starting")) != RN_OK) goto out;
    if ((rc = rn_eval(&o, ck, &r)) != RN_OK) goto out;
    if (root && confusion && (rc = write_confusion(confusion, &r, ck)) != RN_OK) goto out;
    status = 0;
    if (!root || o.profile) goto out;
    int K = r.n_classes;
    if (json) {
        printf("{\"top1\":");
        rn_json_number(stdout, r.top1);
        printf(",\"top%d\":", o.topk);
        rn_json_number(stdout, r.topk);
        printf(",\"topk\":%d,\"loss\":", o.topk);
        rn_json_number(stdout, r.loss);
        printf(",\"n\":%lld", (long long)r.n);
        if (per_class) {
            printf(",\"per_class\":[");
            for (int i = 0, first = 1; i < K; i++) {
                int64_t tot = 0;
                for (int j = 0; j < K; j++) tot += r.confusion[(size_t)i * K + j];
                if (!tot) continue;
                printf("%s{\"class\":%d,\"name\":", first ? "" : ",", i);
                first = 0;
                rn_json_string(stdout, (size_t)i < ck->n_class_names ? ck->class_names[i] : "");
                printf(",\"n\":%lld,\"top1\":", (long long)tot);
                rn_json_number(stdout, (double)r.confusion[(size_t)i * K + i] / tot);
                printf("}");
            }
            printf("]");
        }
        printf("}\n");
    } else {
        printf("top1=%.4f top%d=%.4f loss=%.4f n=%lld\n", r.top1, o.topk, r.topk, r.loss, (long long)r.n);
        if (per_class)
            for (int i = 0; i < K; i++) {
                int64_t tot = 0;
                for (int j = 0; j < K; j++) tot += r.confusion[(size_t)i * K + j];
                if (!tot) continue;
                printf("class %d %s top1=%.4f n=%lld\n", i, (size_t)i < ck->n_class_names ? ck->class_names[i] : "",
                       (double)r.confusion[(size_t)i * K + i] / tot, (long long)tot);
            }
    }
out:
    if (status) say_error(d);
    free(r.confusion);
    rn_ckpt_free(ck);
    rn_dist_close(d);
    return status;
}
