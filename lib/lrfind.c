/* The learning-rate range test (rn/lrfind.h): a geometric lr sweep of SGD steps, the
 * smoothed loss, and the suggestion at its steepest descent. */
#include "rn/lrfind.h"

#include <math.h>
#include <string.h>

#include "rn/err.h"
#include "rn/loader.h"
#include "rn/net.h"
#include "rn/runner.h"
#include "rn/state.h"
#include "rn/tensor.h"
#include "rn/train.h"

void rn_lrfind_defaults(rn_lrfind_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "auto";
    rn_backend_opts_init(&o->backend);
    o->workers = RN_TRAIN_WORKERS;
    o->batch = RN_TRAIN_BATCH;
    o->crop = RN_TRAIN_CROP;
    rn_augment_default(&o->augment);
    o->lr_min = RN_LRFIND_MIN;
    o->lr_max = RN_LRFIND_MAX;
    o->steps = RN_LRFIND_STEPS;
    o->momentum = RN_TRAIN_MOMENTUM;
    o->weight_decay = RN_TRAIN_WD;
}

double rn_lrfind_lr(double lr_min, double lr_max, int steps, int i) {
    return steps > 1 ? lr_min * pow(lr_max / lr_min, (double)i / (steps - 1)) : lr_min;
}

int rn_lrfind_run(const rn_lrfind_opts *o, rn_ckpt *ck, rn_lrfind_point *pts, int *n, int *diverged) {
    rn_runner r;
    rn_loader *l = NULL;
    rn_run_state st;
    *n = 0;
    *diverged = 0;
    if (!(o->lr_min > 0 && o->lr_min < o->lr_max) || o->steps < 2)
        return rn_errorf(RN_EINVAL, "lr sweep %g .. %g over %d steps: need 0 < lr_min < lr_max and 2 steps or more",
                         o->lr_min, o->lr_max, o->steps);
    rn_state_get(ck, &st);
    int rc = rn_runner_open(&r, o->device, o->threads, &o->backend);
    if (rc) goto fail;
    rn_loader_opts lo;
    rn_loader_defaults(&lo);
    rn_runner_loader_memory(&lo, r.be);
    lo.crop = o->crop;
    lo.batch = o->batch;
    lo.workers = o->workers;
    lo.train = 1;
    lo.aug = o->augment;
    lo.shuffle = 1;
    lo.drop_last = 1; /* full batches, as rn-train steps on */
    lo.seed = o->seed_given ? o->seed : st.seed;
    if ((rc = rn_loader_create(o->data, &lo, &l))) goto fail;
    if ((rc = rn_runner_check_data(o->data, rn_loader_info(l), ck))) goto fail;
    if ((rc = rn_runner_net(&r, ck, o->batch, o->micro_batch, 0, o->crop, RN_NET_TRAIN, RN_F32))) goto fail;
    int accum = o->batch / r.micro;
    double avg = 0, best = INFINITY;
    for (int i = 0; i < o->steps; i++) {
        rn_batch b;
        float loss = 0;
        double lr = rn_lrfind_lr(o->lr_min, o->lr_max, o->steps, i);
        if ((rc = rn_loader_next(l, &b))) goto fail;
        rc = rn_runner_stage(&r, &b);
        /* micro-batches: the loss and gradients of the whole batch, as rn-train --accum */
        for (int k = 0; k < accum && rc == RN_OK; k++) {
            float part = 0;
            if ((rc = rn_runner_input(&r, &b, k * r.micro, r.micro))) break;
            if ((rc = rn_net_forward(r.net, r.micro, 1))) break;
            if ((rc = rn_net_backward(r.net, b.labels + k * r.micro, r.micro, 0.0f, 1.0f / accum, k > 0, &part)))
                break;
            loss += part / accum;
        }
        int wrc = rn_backend_upload_wait(r.be);
        if (rc == RN_OK) rc = wrc;
        rn_loader_release(l, &b);
        if (rc) goto fail;
        avg = RN_LRFIND_BETA * avg + (1 - RN_LRFIND_BETA) * loss;
        double smoothed = avg / (1 - pow(RN_LRFIND_BETA, i + 1));
        pts[(*n)++] = (rn_lrfind_point){.step = i, .lr = lr, .loss = loss, .smoothed = smoothed};
        if (o->progress && (i % 10 == 0 || i == o->steps - 1))
            fprintf(o->progress, "rn-lrfind: step %d/%d lr %.3g loss %.4f smoothed %.4f\n", i, o->steps, lr, loss,
                    smoothed);
        if (!isfinite(smoothed) || smoothed > RN_LRFIND_DIVERGE * best) {
            *diverged = 1;
            if (o->progress)
                fprintf(o->progress, "rn-lrfind: step %d: lr %.3g: smoothed loss %.4g > %gx the best %.4g: diverged, "
                        "stopping\n", i, lr, smoothed, RN_LRFIND_DIVERGE, best);
            break;
        }
        if (smoothed < best) best = smoothed;
        if ((rc = rn_net_step(r.net, NULL, (float)lr, (float)o->momentum, (float)o->weight_decay, o->nesterov, 0,
                              NULL)))
            goto fail;
    }
fail:
    rn_loader_destroy(l); /* its buffers may be the backend's pinned memory */
    rn_runner_close(&r);
    return rc;
}

int rn_lrfind_suggest(const rn_lrfind_point *pts, int n, int *at) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (pts[i].smoothed < pts[best].smoothed) best = i;
    /* the skip, but never more than half of what precedes the best */
    int lo = best / 2 < RN_LRFIND_SKIP_START ? best / 2 : RN_LRFIND_SKIP_START;
    if (best - lo + 1 < 3)
        return rn_errorf(RN_EDATA, "the smoothed loss is lowest at step %d of %d: too few steps before it to find a "
                         "descent (lower --lr-min or take more --steps)", best, n);
    double steepest = INFINITY;
    *at = lo;
    for (int i = lo; i <= best; i++) {
        /* numpy.gradient: central inside, one-sided at the ends of the range */
        int a = i > lo ? i - 1 : i, b = i < best ? i + 1 : i;
        double g = (pts[b].smoothed - pts[a].smoothed) / (log(pts[b].lr) - log(pts[a].lr));
        if (g < steepest) steepest = g, *at = i;
    }
    return RN_OK;
}
