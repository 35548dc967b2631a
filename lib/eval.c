/* Evaluation: scoring batches of logits, the loop over a loader's epoch, and rn_eval. */
#include "rn/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/net.h"
#include "rn/prof.h"
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
    o->profile_warmup = RN_EVAL_PROFILE_WARMUP;
    o->profile_steps = RN_EVAL_PROFILE_STEPS;
}

/* One image's result: what counting it takes (a few numbers, never its logits), so
 * ranks send rank 0 these instead. */
typedef struct {
    int32_t label, best;  /* the true class and the arg max (the lower index on ties) */
    int32_t above, pad;   /* classes ranked above the true one: strictly higher logits, or
                             equal ones at a lower index */
    double loss;          /* softmax cross-entropy, log-sum-exp in double */
} scored;

static void score(const float *z, int classes, int32_t y, scored *s) {
    int best = 0, above = 0;
    for (int k = 0; k < classes; k++) {
        if (z[k] > z[best]) best = k;
        if (z[k] > z[y] || (z[k] == z[y] && k < y)) above++;
    }
    double m = z[best], sum = 0;
    for (int k = 0; k < classes; k++) sum += exp((double)z[k] - m);
    *s = (scored){.label = y, .best = best, .above = above, .loss = m + log(sum) - z[y]};
}

/* The counts so far, added image by image in loader order. */
typedef struct {
    int64_t n, c1, ck;
    double loss;
} tally;

static void count(tally *t, const scored *s, int64_t n, int topk, int64_t *confusion, int nconf) {
    for (int64_t i = 0; i < n; i++) {
        t->c1 += s[i].best == s[i].label;
        t->ck += s[i].above < topk;
        t->loss += s[i].loss;
        if (confusion && s[i].label < nconf && s[i].best < nconf)
            confusion[(size_t)s[i].label * nconf + s[i].best]++;
    }
    t->n += n;
}

/* b's images through the network in runs of r->micro that start at multiples of
 * r->micro in the epoch: the runs one process makes, whichever rank holds them, so each
 * image's logits come from a forward of the same shape. Scores into s; logits into z
 * (b->n rows) when z is not NULL, else through tmp (r->micro rows). */
static int forward(rn_runner *r, const rn_batch *b, float *z, float *tmp, scored *s) {
    int64_t at = b->index + b->first;
    int rc = RN_OK;
    for (int off = 0, m; off < b->n; off += m) {
        m = r->micro - (int)((at + off) % r->micro);
        if (m > b->n - off) m = b->n - off;
        float *out = z ? z + (size_t)off * r->classes : tmp;
        if ((rc = rn_runner_logits(r, b, off, m, out))) return rc;
        for (int i = 0; i < m; i++) score(out + (size_t)i * r->classes, r->classes, b->labels[off + i], s + off + i);
    }
    return rc;
}

/* What rank 0 keeps across batches, and the gathers' buffers. */
typedef struct {
    rn_dist *d;
    int root, many, classes, topk, nconf;
    int64_t *confusion;
    float *dump;    /* rank 0's logits dump, or NULL */
    int want;       /* every rank sends its logits (rank 0 dumps them) */
    tally t;
    void *got, *gotz;
} collector;

/* One batch's scores (mine of them here, whole in the batch, which starts at index) to
 * rank 0, in rank order, which is loader order; counted there; the logits z too when
 * wanted. An error here is rank 0's alone: the caller carries it to the next agreement. */
static int collect(collector *c, const scored *s, const float *z, int mine, int whole, int64_t index) {
    size_t row = sizeof(float) * (size_t)c->classes, bytes = 0, zbytes = 0;
    int64_t n = mine;
    int rc;
    if (c->many) {
        free(c->got);
        free(c->gotz);
        c->got = c->gotz = NULL;
        if ((rc = rn_dist_gather0(c->d, s, sizeof(scored) * (size_t)mine, &c->got, &bytes, "eval: scores")))
            return rc;
        if (c->want && (rc = rn_dist_gather0(c->d, z, row * (size_t)mine, &c->gotz, &zbytes, "eval: logits")))
            return rc;
        if (!c->root) return RN_OK;
        s = c->got;
        n = (int64_t)(bytes / sizeof(scored));
        if (n != whole || (c->want && zbytes != row * (size_t)n))
            return rn_errorf(RN_EINVAL, "eval: the ranks scored %lld images of a batch of %d: was every rank's "
                             "loader opened for this dist (rn_eval_loader_open)?", (long long)n, whole);
        if (c->dump) memcpy(c->dump + (size_t)index * c->classes, c->gotz, zbytes);
    }
    count(&c->t, s, n, c->topk, c->confusion, c->nconf);
    return RN_OK;
}

/* *p holds at least n elements of size bytes (its contents are not kept). */
static int room(void **p, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return RN_OK;
    free(*p);
    if (!(*p = rn_malloc(n * size))) {
        *cap = 0;
        return RN_ENOMEM;
    }
    *cap = n;
    return RN_OK;
}

/* This rank's buffers for one slice: scores, and logits to send when ranks send them. */
typedef struct {
    void *s, *z;
    size_t s_cap, z_cap;
    float *tmp;   /* (r->micro, classes): logits on their way to their scores */
} slice_buf;

/* The loader's next batch: this rank's slice forwarded and scored into sb (its logits
 * written in place into dump for one process, or kept in sb->z to send), the batch
 * released; *mine, *whole, *index, *last describe it. */
static int next_slice(rn_runner *r, rn_loader *l, const collector *c, float *dump, slice_buf *sb, int *mine,
                      int *whole, int64_t *index, int *last) {
    rn_batch b;
    int rc = rn_loader_next(l, &b);
    if (rc) return rc;
    *mine = b.n;
    *whole = b.total;
    *index = b.index;
    *last = b.last;
    float *z = NULL;
    if ((rc = room(&sb->s, &sb->s_cap, (size_t)b.n, sizeof(scored)))) goto done;
    if ((rc = room(&sb->z, &sb->z_cap, c->want && c->many ? (size_t)b.n : 0, sizeof(float) * (size_t)r->classes)))
        goto done;
    if ((rc = rn_runner_stage(r, &b))) goto done;
    if (c->want) z = c->many ? sb->z : dump + (size_t)(b.index + b.first) * r->classes;
    rc = forward(r, &b, z, sb->tmp, sb->s);
done:;
    int wrc = rn_backend_upload_wait(r->be);
    if (rc == RN_OK) rc = wrc;
    rn_loader_release(l, &b);
    return rc;
}

/* Each batch: every rank forwards and scores its slice, the ranks agree that none
 * failed, rank 0 gathers the scores (and, for the dump, the logits) in rank order,
 * which is loader order, and counts them as one process does. A rank that fails still
 * joins the agreement of that batch, and every rank stops there. */
int rn_eval_run(rn_runner *r, rn_loader *l, int topk, rn_eval_result *res, float *dump, FILE *progress,
                int tty) {
    rn_dist *d = r->dist;
    collector c = {.d = d, .root = rn_dist_rank(d) == 0, .many = rn_dist_many(d), .classes = r->classes,
                   .topk = topk, .confusion = res->confusion, .nconf = res->n_classes};
    int64_t want = c.root && dump, total = rn_loader_info(l)->count;
    slice_buf sb = {0};
    double t0 = rn_report_clock();
    int rc = RN_OK;
    if (!(sb.tmp = rn_malloc(sizeof(float) * (size_t)r->classes * r->micro))) rc = RN_ENOMEM;
    if ((rc = rn_dist_agree(d, rc, "eval"))) goto fail;
    /* whether rank 0 wants the logits: every rank then sends its own */
    if ((rc = rn_dist_max_i64(d, &want, "eval: the logits dump"))) goto fail;
    c.want = (int)want;
    c.dump = c.root ? dump : NULL;
    for (;;) {
        int last = 0, mine = 0, whole = 0;
        int64_t index = 0;
        /* after an error (rank 0's, counting), straight to the agreement */
        if (rc == RN_OK) rc = next_slice(r, l, &c, dump, &sb, &mine, &whole, &index, &last);
        /* every rank leaves here together when any failed, before the next collective */
        if ((rc = rn_dist_agree(d, rc, "eval"))) break;
        rc = collect(&c, sb.s, sb.z, mine, whole, index);
        if (c.root && progress && tty)
            fprintf(progress, "\reval %lld/%lld images, %.1f img/s   ", (long long)c.t.n, (long long)total,
                    c.t.n / (rn_report_clock() - t0 + 1e-9));
        if (last) break;
    }
    /* an error rank 0 met counting the last batch */
    rc = rn_dist_agree(d, rc, "eval");
    if (c.root && progress && tty) fputc('\n', progress);
    if (rc == RN_OK) rc = rn_dist_bcast(d, &c.t, sizeof c.t, 0, "eval: the results");
fail:
    free(sb.tmp);
    free(sb.s);
    free(sb.z);
    free(c.got);
    free(c.gotz);
    res->n = c.t.n;
    res->top1 = c.t.n ? (double)c.t.c1 / c.t.n : 0;
    res->topk = c.t.n ? (double)c.t.ck / c.t.n : 0;
    res->loss = c.t.n ? c.t.loss / c.t.n : 0;
    return rc;
}

int rn_eval_loader_open(const char *path, int batch, int crop, int resize, int workers, const rn_dist *dist,
                        rn_backend *be, rn_loader **l) {
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
    if (rn_dist_many(dist)) {
        if ((int64_t)batch * rn_dist_world(dist) > 1 << 30)
            return rn_errorf(RN_EINVAL, "eval: batch %d on %d ranks is too many images at once", batch,
                             rn_dist_world(dist));
        lo.batch = batch * rn_dist_world(dist);
        lo.parts = rn_dist_world(dist);
        lo.part = rn_dist_rank(dist);
        lo.unit = batch;
    }
    return rn_loader_create(path, &lo, l);
}

/* One batch of --profile: the loader, the input, the forwards and the logits' download
 * (the evaluation's work less the scoring), each a span of p when p is given. */
static int profile_batch(rn_runner *r, rn_loader *l, rn_prof *p, float *out) {
    rn_batch b;
    double t0 = p ? rn_prof_begin(p, "data-wait") : 0;
    int rc = rn_loader_next(l, &b);
    if (p) rc = rn_prof_end(p, t0, "data-wait", RN_PROF_STEP, RN_PROF_HOST, 0, 0, rc);
    if (rc) return rc;
    double px = (double)b.h * b.w * b.c, k = r->classes;
    t0 = p ? rn_prof_begin(p, "input") : 0;
    rc = rn_runner_stage(r, &b);
    if (p) rc = rn_prof_end(p, t0, "input", RN_PROF_STEP, RN_PROF_COMPUTE, 0, px * b.n, rc);
    for (int off = 0, m; rc == RN_OK && off < b.n; off += m) {
        m = b.n - off < r->micro ? b.n - off : r->micro;
        t0 = p ? rn_prof_begin(p, "input") : 0;
        rc = rn_runner_input(r, &b, off, m);
        if (p) rc = rn_prof_end(p, t0, "input", RN_PROF_STEP, RN_PROF_COMPUTE, 2 * px * m, 5 * px * m, rc);
        if (rc == RN_OK) rc = rn_net_forward(r->net, m, 0);
        if (rc) break;
        t0 = p ? rn_prof_begin(p, "logits") : 0;
        rc = rn_backend_download(r->be, out, rn_net_logits(r->net), sizeof(float) * (size_t)m * r->classes);
        if (p) rc = rn_prof_end(p, t0, "logits", RN_PROF_STEP, RN_PROF_HOST, 0, 4 * k * m, rc);
    }
    /* the batch goes back to the loader once its upload is done, inside this row: with
       the release after the row, a fifth to a half of the runs left 3-5% of the step
       between the rows (on the 2-core test VM, 2 workers), with it inside none did */
    int last = b.last;
    t0 = p ? rn_prof_begin(p, "h2d-wait") : 0;
    int wrc = rn_backend_upload_wait(r->be);
    rn_loader_release(l, &b);
    if (p) wrc = rn_prof_end(p, t0, "h2d-wait", RN_PROF_STEP, RN_PROF_HOST, 0, 0, wrc);
    if (rc == RN_OK) rc = wrc;
    /* a dataset shorter than the profile: from its start again */
    if (rc == RN_OK && last) rc = rn_loader_seek(l, 0, 0);
    return rc;
}

/* rn-eval --profile: o->profile_warmup batches, then o->profile_steps profiled ones. */
static int profile_run(rn_runner *r, rn_loader *l, const rn_eval_opts *o, const rn_ckpt *ck) {
    rn_prof *p = NULL;
    float *out = rn_malloc(sizeof(float) * (size_t)r->classes * (size_t)r->micro);
    int rc = out ? rn_prof_create(r->be, &p) : RN_ENOMEM;
    for (int i = 0; rc == RN_OK && i < o->profile_warmup + o->profile_steps; i++) {
        rn_prof *on = i >= o->profile_warmup ? p : NULL;
        rn_net_set_prof(r->net, on);
        if (on && (rc = rn_prof_step_begin(p))) break;
        if ((rc = profile_batch(r, l, on, out))) break;
        if (on) rc = rn_prof_step_end(p);
    }
    rn_net_set_prof(r->net, NULL);
    char title[256], trace[4096];
    snprintf(title, sizeof title, "rn-eval --profile: %s on %s, batches of %d, crop %d, %s", ck->model->arch,
             rn_backend_name(r->be), r->micro, o->crop,
             rn_net_dtype(r->net) == RN_F32 ? "fp32" : "half precision");
    snprintf(trace, sizeof trace, "%s.json", o->profile);
    if (rc == RN_OK && (rc = rn_prof_write(p, title, o->profile, trace))) rc = rn_error_context(rc, "--profile");
    if (rc == RN_OK && o->progress) {
        int64_t steps;
        double wall, spans;
        rn_prof_totals(p, &steps, &wall, &spans);
        fprintf(o->progress,
                "rn-eval: profiled %lld batches after %d warm-up batches: %.1f ms per batch, %.1f%% of it in the "
                "rows; table in %s, trace in %s\n",
                (long long)steps, o->profile_warmup, 1e3 * wall / (double)steps, wall > 0 ? 100 * spans / wall : 0,
                o->profile, trace);
    }
    rn_prof_destroy(p);
    free(out);
    return rc;
}

int rn_eval(const rn_eval_opts *o, const rn_ckpt *ck, rn_eval_result *res) {
    memset(res, 0, sizeof *res);
    rn_loader *l = NULL;
    rn_runner r = {0};
    float *dump = NULL;
    int classes = ck->model->num_classes, root = rn_dist_rank(o->dist) == 0;
    int rc = rn_runner_open(&r, o->device, o->threads, &o->backend);
    r.dist = o->dist;
    if (rc) goto agree;
    if ((rc = rn_eval_loader_open(o->data, o->batch, o->crop, o->resize, o->workers, o->dist, r.be, &l)))
        goto agree;
    if ((rc = rn_runner_check_data(o->data, rn_loader_info(l), ck))) goto agree;
    if ((rc = rn_runner_net(&r, ck, o->batch, o->batch, o->mem_limit, o->crop, RN_NET_INFER, RN_F32))) goto agree;
    res->n_classes = classes;
    if (!(res->confusion = rn_calloc((size_t)classes * classes, sizeof(int64_t)))) {
        rc = RN_ENOMEM;
        goto agree;
    }
    if (root && o->dump_logits && !(dump = rn_calloc((size_t)rn_loader_info(l)->count * classes, sizeof(float))))
        rc = RN_ENOMEM;
agree: /* no rank starts the collectives of the run while another has stopped */
    if ((rc = rn_dist_agree(o->dist, rc, "eval: setting up"))) goto fail;
    if (o->profile) {
        rc = profile_run(&r, l, o, ck);
        goto fail;
    }
    if ((rc = rn_eval_run(&r, l, o->topk, res, dump, o->progress, o->progress_tty))) goto fail;
    if (dump) {
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
