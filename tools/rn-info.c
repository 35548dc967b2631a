/* rn-info: what is inside an rn checkpoint (.pb), an rn dataset (.lmdb folder) or a
 * TensorBoard event file (rn-train --tensorboard). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "rn/ckpt.h"
#include "rn/dataset.h"
#include "rn/err.h"
#include "rn/json.h"
#include "rn/tbevent.h"
#include "rn/tensor.h"

static void usage(FILE *f) {
    fprintf(f, "usage: rn-info [--json] [--tensors] FILE\n"
               "\n"
               "Describe an rn checkpoint (.pb): arch, classes, parameter count, epoch and step,\n"
               "optimiser, the moving average of the weights (rn-train --ema-decay: its decay,\n"
               "update interval, alpha and update count) when it holds one, provenance (who wrote\n"
               "it, when, with which command) and the training history (with the EMA's validation\n"
               "when it was validated). The file is fully validated first (names, shapes, checksums).\n"
               "FILE may be \"-\" (stdin). A dataset folder (DATA.lmdb, made by rn-prep) is\n"
               "described instead: count, classes with counts, sizes, encoding, mean/std, command.\n"
               "A TensorBoard event file (a name holding \"tfevents\", rn-train --tensorboard), or a\n"
               "folder of them read in name order as TensorBoard reads them, is checked record by\n"
               "record (both CRC32Cs, the Event message) and printed: a line '# FILE: VERSION' per\n"
               "file, then 'TAG STEP VALUE' per scalar and 'TAG STEP \"TEXT\"' per text (JSON-quoted).\n"
               "\n"
               "  -j, --json     machine-readable output (one JSON object)\n"
               "  -t, --tensors  list every tensor (parameters, BN buffers, SGD momentum, the EMA's\n"
               "                 parameters and buffers): name, shape, dtype, crc32c\n"
               "  -h, --help     this help\n"
               "  -V, --version  print the version\n"
               "\n"
               "Exit status: 0 success, 1 failure (unreadable or invalid file), 2 bad usage.\n");
}

static int print_item(void *ctx, const rn_tb_item *it) {
    const char *path = ctx;
    if (it->kind == RN_TB_VERSION) printf("# %s: %s\n", path, it->text);
    else if (it->kind == RN_TB_SCALAR) printf("%s %lld %.9g\n", it->tag, (long long)it->step, it->value);
    else if (it->kind == RN_TB_TEXT) {
        printf("%s %lld ", it->tag, (long long)it->step);
        rn_json_string(stdout, it->text);
        putchar('\n');
    }
    return 0;
}

/* an event file, or a folder of them: 0, or 1 at the first bad record */
static int print_events(const char *path, int is_dir) {
    char **files = NULL, *one[1] = {(char *)path};
    int n = 1, rc = RN_OK;
    if (is_dir && (rc = rn_tb_list(path, &files, &n)) != RN_OK) {
        fprintf(stderr, "rn-info: %s\n", rn_last_error());
        return 1;
    }
    for (int i = 0; i < n && rc == RN_OK; i++) {
        char *file = is_dir ? files[i] : one[0];
        rc = rn_tb_read(file, 0, print_item, file);
    }
    if (is_dir) rn_tb_list_free(files, n);
    if (rc != RN_OK) {
        fflush(stdout);
        fprintf(stderr, "rn-info: %s\n", rn_last_error());
        return 1;
    }
    return 0;
}

static void shape_str(const rn_ptensor *t, char *buf, size_t cap) {
    buf[0] = 0;
    for (size_t i = 0; i < t->n_shape; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%lld", i ? "," : "", (long long)t->shape[i]);
}

static int64_t count(rn_ptensor **t, size_t n) {
    int64_t s = 0;
    for (size_t i = 0; i < n; i++) s += rn_numel(t[i]->shape, t[i]->n_shape);
    return s;
}

static const char *str(const char *s) { return s ? s : ""; }

/* The tensor sets of a checkpoint: 0 params, 1 buffers, 2 SGD momentum, 3 and 4 the EMA's
 * params and buffers. */
#define NSETS 5
static const char *set_names[] = {"", " buffer", " momentum", " ema", " ema buffer"},
                  *set_keys[] = {"param", "buffer", "momentum", "ema_param", "ema_buffer"};

static rn_ptensor **tensor_set(const rn_ckpt *c, int set, size_t *n) {
    if (set == 0) return *n = c->n_params, c->params;
    if (set == 1) return *n = c->n_buffers, c->buffers;
    if (set == 3) return *n = c->ema ? c->ema->n_params : 0, c->ema ? c->ema->params : NULL;
    if (set == 4) return *n = c->ema ? c->ema->n_buffers : 0, c->ema ? c->ema->buffers : NULL;
    *n = c->optim ? c->optim->n_momentum : 0;
    return c->optim ? c->optim->momentum : NULL;
}

/* An epoch validated with EMA weights too (a loss of exactly 0 is no evaluation) */
static int has_ema_val(const Rn__EpochMetrics *h) { return h->val_n && h->ema_val_loss != 0; }

static void print_text(const char *path, const rn_ckpt *c, int tensors) {
    printf("file:          %s\n", path);
    printf("format:        rn checkpoint v%u\n", c->format_version);
    printf("arch:          %s\n", c->model->arch);
    printf("classes:       %d%s\n", c->model->num_classes, c->n_class_names ? "" : " (no class names)");
    printf("parameters:    %lld in %zu tensors\n", (long long)count(c->params, c->n_params), c->n_params);
    printf("buffers:       %zu tensors\n", c->n_buffers);
    printf("zero-init-res: %s\n", c->model->zero_init_residual ? "yes" : "no");
    if (c->train)
        printf("progress:      epoch %d, step %lld, next sample: epoch %lld index %lld, seed %llu\n", c->train->epoch,
               (long long)c->train->step, (long long)c->train->data_epoch, (long long)c->train->data_index,
               (unsigned long long)c->train->seed);
    else printf("progress:      not trained (epoch 0, step 0)\n");
    if (c->train && c->train->loss_scale > 0)
        printf("loss scale:    %g (fp16 AMP; %d clean steps since it last changed, %lld steps skipped)\n",
               c->train->loss_scale, c->train->scale_growth_tracker, (long long)c->train->skipped_steps);
    if (c->optim && c->optim->n_momentum) {
        printf("optimiser:     %s lr %g momentum %g weight decay %g%s", str(c->optim->kind), c->optim->lr,
               c->optim->momentum_coef, c->optim->weight_decay, c->optim->nesterov ? " nesterov" : "");
        if (c->optim->kind && strcmp(c->optim->kind, "lars") == 0)
            printf(" eta %g eps %g", c->optim->lars_eta, c->optim->lars_eps);
        printf("\n");
    } else printf("optimiser:     no state\n");
    if (c->ema)
        printf("ema:           decay %g, every %d steps, alpha %g, %lld updates since the last copy (rn-eval --ema, "
               "rn-export --ema)\n", c->ema->decay, c->ema->every, c->ema->alpha, (long long)c->ema->updates);
    if (c->provenance) {
        const Rn__Provenance *p = c->provenance;
        printf("written by:    rn %s on %s%s%s\n", str(p->rn_version), str(p->host), p->created && *p->created ? " at " : "",
               str(p->created));
        printf("command:       %s\n", str(p->command));
        if (p->parent && *p->parent) printf("from:          %s\n", p->parent);
        if (p->dataset && *p->dataset) printf("dataset:       %s\n", p->dataset);
    }
    if (c->n_history) {
        int ema = 0; /* a column of the EMA's validation when any epoch has one */
        for (size_t i = 0; i < c->n_history; i++) ema |= has_ema_val(c->history[i]);
        printf("history:\n  %5s %9s %10s %10s %8s %8s %9s %8s%s\n", "epoch", "step", "train_loss", "lr", "val_top1",
               "val_top5", "val_loss", "img/s", ema ? " ema_top1 ema_top5  ema_loss" : "");
        for (size_t i = 0; i < c->n_history; i++) {
            const Rn__EpochMetrics *h = c->history[i];
            printf("  %5d %9lld %10.4f %10.3g ", h->epoch, (long long)h->step, h->train_loss, h->lr);
            if (h->val_n) printf("%8.4f %8.4f %9.4f", h->val_top1, h->val_top5, h->val_loss);
            else printf("%8s %8s %9s", "-", "-", "-"); /* not validated */
            printf(" %8.1f", h->images_per_second);
            if (ema && has_ema_val(h)) printf(" %8.4f %8.4f %9.4f", h->ema_val_top1, h->ema_val_top5, h->ema_val_loss);
            else if (ema) printf(" %8s %8s %9s", "-", "-", "-");
            printf("\n");
        }
    }
    if (tensors) {
        char shape[96];
        printf("tensors:\n");
        for (int pass = 0; pass < NSETS; pass++) {
            size_t n;
            rn_ptensor **t = tensor_set(c, pass, &n);
            for (size_t i = 0; i < n; i++) {
                shape_str(t[i], shape, sizeof shape);
                printf("  %-44s %-18s %-4s %08x%s\n", t[i]->name, shape, rn_dtype_name((int)t[i]->dtype), t[i]->crc32c,
                       set_names[pass]);
            }
        }
    }
}

static void json_kv(const char *k, const char *v, int comma) {
    rn_json_string(stdout, k);
    putchar(':');
    rn_json_string(stdout, v);
    if (comma) putchar(',');
}

static void print_json(const char *path, const rn_ckpt *c, int tensors) {
    printf("{");
    json_kv("file", path, 1);
    json_kv("kind", "checkpoint", 1);
    printf("\"format_version\":%u,", c->format_version);
    json_kv("arch", c->model->arch, 1);
    printf("\"num_classes\":%d,\"zero_init_residual\":%s,", c->model->num_classes,
           c->model->zero_init_residual ? "true" : "false");
    printf("\"parameters\":%lld,\"param_tensors\":%zu,\"buffer_tensors\":%zu,", (long long)count(c->params, c->n_params),
           c->n_params, c->n_buffers);
    printf("\"epoch\":%d,\"step\":%lld,", c->train ? c->train->epoch : 0, c->train ? (long long)c->train->step : 0LL);
    if (c->train) {
        printf("\"data_epoch\":%lld,\"data_index\":%lld,\"seed\":%llu,", (long long)c->train->data_epoch,
               (long long)c->train->data_index, (unsigned long long)c->train->seed);
        json_kv("lr_schedule", str(c->train->lr_schedule), 1);
        json_kv("lr_every", c->train->lr_per_epoch ? "epoch" : "step", 1);
        const char *wm = c->train->warmup_method && *c->train->warmup_method ? c->train->warmup_method : "ramp";
        printf("\"warmup_epochs\":%d,", c->train->warmup_epochs);
        json_kv("warmup_method", wm, 1);
        if (strcmp(wm, "ramp") != 0) {
            printf("\"warmup_decay\":");
            rn_json_number(stdout, c->train->warmup_decay);
            printf(",");
        }
        if (c->train->lr_schedule && strcmp(c->train->lr_schedule, "cosine") == 0 && c->train->lr_end > 0) {
            printf("\"lr_min\":");
            rn_json_number(stdout, c->train->lr_end);
            printf(",");
        }
        if (c->train->lr_schedule && strcmp(c->train->lr_schedule, "poly") == 0) {
            printf("\"lr_end\":");
            rn_json_number(stdout, c->train->lr_end);
            printf(",\"lr_power\":");
            rn_json_number(stdout, c->train->lr_power);
            printf(",");
        }
        printf("\"loss_scale\":");
        rn_json_number(stdout, c->train->loss_scale);
        printf(",\"scale_growth_tracker\":%d,\"skipped_steps\":%lld,", c->train->scale_growth_tracker,
               (long long)c->train->skipped_steps);
    }
    printf("\"class_names\":[");
    for (size_t i = 0; i < c->n_class_names; i++) {
        if (i) putchar(',');
        rn_json_string(stdout, c->class_names[i]);
    }
    printf("],\"optimiser\":");
    if (c->optim && c->optim->n_momentum) {
        printf("{");
        json_kv("kind", str(c->optim->kind), 1);
        printf("\"lr\":");
        rn_json_number(stdout, c->optim->lr);
        printf(",\"momentum\":");
        rn_json_number(stdout, c->optim->momentum_coef);
        printf(",\"weight_decay\":");
        rn_json_number(stdout, c->optim->weight_decay);
        printf(",\"nesterov\":%s", c->optim->nesterov ? "true" : "false");
        if (c->optim->kind && strcmp(c->optim->kind, "lars") == 0) {
            printf(",\"lars_eta\":");
            rn_json_number(stdout, c->optim->lars_eta);
            printf(",\"lars_eps\":");
            rn_json_number(stdout, c->optim->lars_eps);
        }
        printf("}");
    } else printf("null");
    printf(",\"ema\":");
    if (c->ema) {
        printf("{\"decay\":");
        rn_json_number(stdout, c->ema->decay);
        printf(",\"every\":%d,\"alpha\":", c->ema->every);
        rn_json_number(stdout, c->ema->alpha);
        printf(",\"updates\":%lld}", (long long)c->ema->updates);
    } else printf("null");
    printf(",\"provenance\":");
    if (c->provenance) {
        const Rn__Provenance *p = c->provenance;
        printf("{");
        json_kv("rn_version", str(p->rn_version), 1);
        json_kv("command", str(p->command), 1);
        json_kv("created", str(p->created), 1);
        json_kv("host", str(p->host), 1);
        json_kv("parent", str(p->parent), 1);
        json_kv("dataset", str(p->dataset), 0);
        printf("}");
    } else printf("null");
    printf(",\"history\":[");
    for (size_t i = 0; i < c->n_history; i++) {
        const Rn__EpochMetrics *h = c->history[i];
        printf("%s{\"epoch\":%d,\"step\":%lld", i ? "," : "", h->epoch, (long long)h->step);
        const char *k[] = {"train_loss", "lr", "val_top1", "val_top5", "val_loss", "seconds", "images_per_second"};
        double v[] = {h->train_loss, h->lr, h->val_top1, h->val_top5, h->val_loss, h->seconds, h->images_per_second};
        for (int j = 0; j < 7; j++) {
            printf(",\"%s\":", k[j]);
            if (j >= 2 && j <= 4 && h->val_n == 0) printf("null"); /* not validated */
            else rn_json_number(stdout, v[j]);
        }
        printf(",\"val_n\":%lld", (long long)h->val_n);
        if (has_ema_val(h)) {
            printf(",\"ema_val_top1\":");
            rn_json_number(stdout, h->ema_val_top1);
            printf(",\"ema_val_top5\":");
            rn_json_number(stdout, h->ema_val_top5);
            printf(",\"ema_val_loss\":");
            rn_json_number(stdout, h->ema_val_loss);
        }
        printf("}");
    }
    printf("]");
    if (tensors) {
        printf(",\"tensors\":[");
        int first = 1;
        for (int pass = 0; pass < NSETS; pass++) {
            size_t n;
            rn_ptensor **t = tensor_set(c, pass, &n);
            for (size_t i = 0; i < n; i++) {
                printf("%s{", first ? "" : ",");
                first = 0;
                json_kv("name", t[i]->name, 1);
                printf("\"shape\":[");
                for (size_t d = 0; d < t[i]->n_shape; d++) printf("%s%lld", d ? "," : "", (long long)t[i]->shape[d]);
                printf("],");
                json_kv("dtype", rn_dtype_name((int)t[i]->dtype), 1);
                printf("\"crc32c\":\"%08x\",\"set\":\"%s\"}", t[i]->crc32c, set_keys[pass]);
            }
        }
        printf("]");
    }
    printf("}\n");
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"tensors", no_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {"version", no_argument, 0, 'V'},
                                         {0, 0, 0, 0}};
    int json = 0, tensors = 0, c;
    while ((c = getopt_long(argc, argv, "jthV", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 't': tensors = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("rn-info %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "rn-info: see 'rn-info --help'\n"); return 2;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "rn-info: expected one FILE (see --help)\n");
        return 2;
    }
    const char *path = argv[optind];
    char mdb[4096];
    struct stat st;
    snprintf(mdb, sizeof mdb, "%s/data.mdb", path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) && stat(mdb, &st) == 0) {
        if (rn_dataset_describe(path, stdout, json) != RN_OK) {
            fprintf(stderr, "rn-info: %s\n", rn_last_error());
            return 1;
        }
        return 0;
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    int is_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    char **files = NULL;
    int n_files = 0;
    if (is_dir && rn_tb_list(path, &files, &n_files) == RN_OK) rn_tb_list_free(files, n_files);
    if (strstr(base, RN_TB_NAME) || n_files) {
        if (json || tensors) {
            fprintf(stderr, "rn-info: %s: --json and --tensors are for checkpoints and datasets, not event files\n", path);
            return 2;
        }
        return print_events(path, is_dir);
    }
    rn_ckpt *ck = NULL;
    if (rn_ckpt_read(path, &ck) != RN_OK) {
        fprintf(stderr, "rn-info: %s\n", rn_last_error());
        return 1;
    }
    if (json) print_json(path, ck, tensors);
    else print_text(path, ck, tensors);
    rn_ckpt_free(ck);
    return 0;
}
