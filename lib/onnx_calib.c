/* rn_onnx_calibrate: the activation ranges of an int8 ONNX model (rn/onnx.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/eval.h"
#include "rn/loader.h"
#include "rn/net.h"
#include "rn/onnx.h"
#include "rn/runner.h"

/* A histogram of magnitudes over [0, hi) that doubles hi (merging bin pairs, which
 * keeps every count in the right bin) when a larger value arrives, so one pass over the
 * calibration data gives any percentile without keeping the values. */
#define NBINS 4096
typedef struct {
    double hi;
    float max;
    uint64_t total;
    uint64_t bins[NBINS];
} hist;

static void hist_add(hist *h, const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > m) m = fabsf(x[i]);
    if (m > h->max) h->max = m;
    if (h->hi == 0) h->hi = m > 0 ? m : 1;
    while (m >= h->hi) {
        for (int i = 0; i < NBINS / 2; i++)
            h->bins[i] = h->bins[2 * i] + h->bins[2 * i + 1];
        memset(h->bins + NBINS / 2, 0, sizeof(uint64_t) * NBINS / 2);
        h->hi *= 2;
    }
    double k = NBINS / h->hi;
    for (size_t i = 0; i < n; i++) {
        int b = (int)(fabsf(x[i]) * k);
        h->bins[b < NBINS ? b : NBINS - 1]++;
    }
    h->total += n;
}

/* the upper edge of the bin where the share p/100 of the magnitudes is reached */
static float hist_range(const hist *h, int method, double p) {
    if (method == RN_CALIB_MINMAX || h->total == 0) return h->max;
    double want = p / 100.0 * (double)h->total, cum = 0;
    for (int i = 0; i < NBINS; i++) {
        cum += (double)h->bins[i];
        if (cum >= want) {
            float r = (float)((i + 1) * h->hi / NBINS);
            return r < h->max ? r : h->max;
        }
    }
    return h->max;
}

/* One batch through the network: its normalised input and every unit's output (the
 * pooled features after unit `last`) into the histograms h; *buf (of *cap floats) grows
 * to the largest output. */
static int observe(rn_runner *r, const rn_batch *b, const rn_resnet *spec, int last, hist *h, float **buf, size_t *cap,
                   float *pooled) {
    int rc = rn_runner_stage(r, b);
    if (rc) goto fail;
    if ((rc = rn_runner_input(r, b, 0, b->n))) goto fail;
    rn_loader_normalize(b, *buf, RN_IMAGENET_MEAN, RN_IMAGENET_STD);
    hist_add(&h[0], *buf, (size_t)b->n * b->h * b->w * b->c);
    if ((rc = rn_net_forward(r->net, b->n, 1))) goto fail;
    for (int i = 0; i < spec->nunits; i++) {
        int64_t sh[4];
        if ((rc = rn_net_unit_output(r->net, i, NULL, sh))) goto fail;
        size_t n = (size_t)(sh[0] * sh[1] * sh[2] * sh[3]);
        if (n > *cap) {
            float *p = realloc(*buf, n * sizeof(float));
            if (!p) {
                rc = rn_errorf(RN_ENOMEM, "%zu bytes for unit %d's output", n * sizeof(float), i);
                goto fail;
            }
            *buf = p;
            *cap = n;
        }
        if ((rc = rn_net_unit_output(r->net, i, *buf, sh))) goto fail;
        hist_add(&h[1 + i], *buf, n);
        if (i != last) continue;
        /* GlobalAveragePool of the last block's output (NHWC), in double per channel */
        size_t hw = (size_t)(sh[1] * sh[2]), ch = (size_t)sh[3];
        for (int64_t m = 0; m < sh[0]; m++)
            for (size_t j = 0; j < ch; j++) {
                double s = 0;
                for (size_t p = 0; p < hw; p++)
                    s += (*buf)[((size_t)m * hw + p) * ch + j];
                pooled[(size_t)m * ch + j] = (float)(s / (double)hw);
            }
        hist_add(&h[1 + spec->nunits], pooled, (size_t)sh[0] * ch);
    }
fail:;
    /* the pixels stay the loader's until the upload is done, error or not */
    int wrc = rn_backend_upload_wait(r->be);
    return rc ? rc : wrc;
}

int rn_onnx_calibrate(const rn_ckpt *c, const rn_onnx_calib_opts *o, rn_onnx_ranges *out) {
    memset(out, 0, sizeof *out);
    if (o->batches < 1 || o->batch < 1 || o->crop < 1)
        return rn_errorf(RN_EINVAL, "calibration: batches, batch and crop must be at least 1");
    if (o->method == RN_CALIB_PERCENTILE && !(o->percentile > 0 && o->percentile <= 100))
        return rn_errorf(RN_EINVAL, "calibration: percentile %g is not in (0, 100]", o->percentile);
    rn_resnet spec;
    int rc = rn_ckpt_net(c, &spec);
    if (rc) return rc;
    rn_runner r;
    rn_loader *l = NULL;
    float *buf = NULL, *pooled = NULL;
    /* the input, every unit, the pooled features */
    hist *h = rn_calloc((size_t)spec.nunits + 2, sizeof *h);
    if (!h) return RN_ENOMEM;
    if ((rc = rn_runner_open(&r, "cpu", o->threads, NULL))) goto fail_open;
    if ((rc = rn_eval_loader_open(o->data, o->batch, o->crop, o->resize, o->workers, NULL, r.be, &l))) goto fail;
    if ((rc = rn_runner_check_data(o->data, rn_loader_info(l), c))) goto fail;
    /* a training net keeps every unit's output; frozen BN makes its forward an inference */
    if ((rc = rn_runner_net(&r, c, o->batch, o->batch, 0, o->crop, RN_NET_TRAIN, RN_F32))) goto fail;
    rn_net_freeze_bn(r.net, 1);
    size_t cap = (size_t)o->batch * o->crop * o->crop * 3;
    buf = rn_malloc(cap * sizeof(float));
    pooled = rn_malloc((size_t)o->batch * spec.fc_in * sizeof(float));
    if (!buf || !pooled) {
        rc = RN_ENOMEM;
        goto fail;
    }
    int last = spec.blocks[spec.nblocks - 1].conv[spec.blocks[spec.nblocks - 1].nconv - 1];
    for (int k = 0; k < o->batches; k++) {
        rn_batch b;
        if ((rc = rn_loader_next(l, &b))) goto fail;
        int end = b.last;
        rc = observe(&r, &b, &spec, last, h, &buf, &cap, pooled);
        rn_loader_release(l, &b);
        if (rc) goto fail;
        if (end) break;
    }
    out->input = hist_range(&h[0], o->method, o->percentile);
    for (int i = 0; i < spec.nunits; i++)
        out->unit[i] = hist_range(&h[1 + i], o->method, o->percentile);
    out->pooled = hist_range(&h[1 + spec.nunits], o->method, o->percentile);
fail:
    rn_loader_destroy(l);
    rn_runner_close(&r);
fail_open:
    free(buf);
    free(pooled);
    free(h);
    if (rc) rn_error_context(rc, "calibration");
    return rc;
}
