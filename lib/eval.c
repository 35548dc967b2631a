/* Evaluation: scoring batches of logits, the loop over a loader's epoch, and rn_eval. */
#include "rn/eval.h"

#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/net.h"
#include "rn/report.h"
#include "rn/safetensors.h"
#include "rn/tensor.h"

void rn_eval_defaults(rn_eval_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "auto";
    rn_backend_opts_init(&o->backend);
    o->workers = RN_EVAL_WORKERS;
    o->batch = RN_EVAL_BATCH;
    o->crop = RN_EVAL_CROP;
    o->resize = -1;
    o->topk = RN_EVAL_TOPK;
    o->progress = stderr;
}

/* Top-1 / top-k counts and the confusion matrix for one batch of logits. */
static void score(const float *logits, const int32_t *labels, int n, int classes, int topk, int64_t *c1, int64_t *ck,
                  int64_t *confusion, int nconf) {
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * classes;
        int y = labels[i], best = 0, above = 0;
        for (int k = 0; k < classes; k++) {
            if (z[k] > z[best]) best = k;
            /* rank of the true class: classes strictly above it, ties to the lower index */
            if (z[k] > z[y] || (z[k] == z[y] && k < y)) above++;
        }
        *c1 += best == y;
        *ck += above < topk;
        if (confusion && y < nconf && best < nconf) confusion[(size_t)y * nconf + best]++;
    }
}

int rn_eval_run(rn_runner *r, rn_loader *l, int topk, rn_eval_result *res, float *dump, FILE *progress,
                int tty) {
    int classes = r->classes;
    float *logits = rn_malloc(sizeof(float) * (size_t)r->micro * classes);
    if (!logits) return RN_ENOMEM;
    int64_t c1 = 0, ck = 0, n = 0, total = rn_loader_info(l)->count;
    double loss_sum = 0, t0 = rn_report_clock();
    int rc = RN_OK;
    for (;;) {
        rn_batch b;
        if ((rc = rn_loader_next(l, &b))) break;
        rc = rn_runner_stage(r, &b);
        for (int off = 0; off < b.n && rc == RN_OK; off += r->micro) {
            int m = b.n - off < r->micro ? b.n - off : r->micro;
            float loss;
            if ((rc = rn_runner_logits(r, &b, off, m, logits))) break;
            if ((rc = rn_net_loss(r->net, b.labels + off, m, 0.0f, &loss))) break;
            loss_sum += (double)loss * m;
            score(logits, b.labels + off, m, classes, topk, &c1, &ck, res->confusion, res->n_classes);
            if (dump)
                memcpy(dump + (size_t)(n + off) * classes, logits, sizeof(float) * (size_t)m * classes);
        }
        n += b.n;
        int last = b.last;
        int wrc = rn_backend_upload_wait(r->be);
        if (rc == RN_OK) rc = wrc;
        rn_loader_release(l, &b);
        if (progress && tty)
            fprintf(progress, "\reval %lld/%lld images, %.1f img/s   ", (long long)n, (long long)total,
                    n / (rn_report_clock() - t0 + 1e-9));
        if (rc || last) break;
    }
    if (progress && tty) fputc('\n', progress);
    free(logits);
    res->n = n;
    res->top1 = n ? (double)c1 / n : 0;
    res->topk = n ? (double)ck / n : 0;
    res->loss = n ? loss_sum / n : 0;
    return rc;
}

int rn_eval_loader_open(const char *path, int batch, int crop, int resize, int workers, rn_backend *be,
                        rn_loader **l) {
    rn_loader_opts lo;
    rn_loader_defaults(&lo);
    rn_runner_loader_memory(&lo, be);
    lo.crop = crop;
    lo.batch = batch;
    lo.workers = workers;
    lo.train = 0;
    lo.shuffle = 0;
    lo.resize = resize;
    lo.drop_last = 0;
    return rn_loader_create(path, &lo, l);
}

int rn_eval(const rn_eval_opts *o, const rn_ckpt *ck, rn_eval_result *res) {
    memset(res, 0, sizeof *res);
    rn_loader *l = NULL;
    rn_runner r = {0};
    float *dump = NULL;
    int classes = ck->model->num_classes;
    int rc = rn_runner_open(&r, o->device, o->threads, &o->backend);
    if (rc) goto fail;
    if ((rc = rn_eval_loader_open(o->data, o->batch, o->crop, o->resize, o->workers, r.be, &l))) goto fail;
    if ((rc = rn_runner_check_data(o->data, rn_loader_info(l), ck))) goto fail;
    if ((rc = rn_runner_net(&r, ck, o->batch, o->batch, o->mem_limit, o->crop, RN_NET_INFER, RN_F32))) goto fail;
    res->n_classes = classes;
    if (!(res->confusion = rn_calloc((size_t)classes * classes, sizeof(int64_t)))) {
        rc = RN_ENOMEM;
        goto fail;
    }
    if (o->dump_logits && !(dump = rn_calloc((size_t)rn_loader_info(l)->count * classes, sizeof(float)))) {
        rc = RN_ENOMEM;
        goto fail;
    }
    if ((rc = rn_eval_run(&r, l, o->topk, res, dump, o->progress, o->progress_tty))) goto fail;
    if (o->dump_logits) {
        rn_st_tensor t = {.name = "logits", .dtype = RN_F32, .ndim = 2, .shape = {res->n, classes},
                          .data = (const uint8_t *)dump, .nbytes = sizeof(float) * (size_t)res->n * classes};
        const char *k[] = {"arch", "rows"}, *v[] = {ck->model->arch, "dataset order"};
        rc = rn_st_write(o->dump_logits, &t, 1, k, v, 2);
    }
fail:
    free(dump);
    rn_loader_destroy(l); /* its buffers may be the backend's pinned memory */
    rn_runner_close(&r);
    if (rc != RN_OK) {
        free(res->confusion);
        res->confusion = NULL;
    }
    return rc;
}
