/* One image file to class probabilities: the eval transform on a decoded image, then the
 * runner's inference step (rn-predict). */
#include "rn/predict.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/imgfile.h"
#include "rn/runner.h"
#include "rn/transform.h"

int rn_predict_prepare(rn_jpeg *j, const uint8_t *data, size_t len, int S, int resize, uint8_t *dst,
                       rn_image_ws *ws) {
    rn_img_format fmt = rn_imgfile_format(data, len);
    int W, H, rc;
    if (fmt == RN_IMG_JPEG) {
        rn_jpeg_info info;
        rc = rn_jpeg_header(j, data, len, &info);
        W = info.width, H = info.height;
    } else if (fmt == RN_IMG_UNKNOWN) {
        return rn_errorf(RN_EDATA, "not an image rn reads (it reads %s)", rn_imgfile_formats());
    } else {
        rc = rn_imgfile_header(fmt, data, len, &W, &H);
    }
    if (rc) return rc;
    uint64_t max_pixels = rn_jpeg_max_pixels(j);
    if ((uint64_t)W * H > max_pixels)
        return rn_errorf(RN_EDATA, "%s header says %dx%d (%llu pixels), over the limit of %llu pixels",
                         rn_imgfile_name(fmt), W, H, (unsigned long long)W * (unsigned long long)H,
                         (unsigned long long)max_pixels);
    uint8_t *full = rn_malloc((size_t)W * H * 3);
    if (!full) return RN_ENOMEM;
    rn_window win;
    rn_window_eval(W, H, S, resize, &win);
    int whole[4] = {0, 0, W, H};
    if (fmt == RN_IMG_JPEG) rc = rn_jpeg_decode(j, data, len, 3, W, H, full);
    else rc = rn_imgfile_decode(fmt, data, len, 3, max_pixels, full);
    if (rc) goto fail;
    rc = rn_window_render(full, whole, W, H, 3, &win, S, dst, ws);
fail:
    free(full);
    return rc;
}

void rn_softmax(const float *z, int n, float *p) {
    float m = z[0];
    for (int i = 1; i < n; i++)
        if (z[i] > m) m = z[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)z[i] - m);
    for (int i = 0; i < n; i++) p[i] = (float)(exp((double)z[i] - m) / s);
}

struct rn_predictor {
    rn_runner r;
    rn_jpeg *jpeg;
    rn_image_ws ws;
    int crop, resize;
    uint8_t *px;      /* (crop, crop, 3) the transformed image */
    float *logits;    /* (classes) */
};

void rn_predictor_close(rn_predictor *p) {
    if (!p) return;
    rn_image_ws_free(&p->ws);
    rn_jpeg_destroy(p->jpeg);
    rn_runner_close(&p->r);
    free(p->px);
    free(p->logits);
    free(p);
}

void rn_predict_defaults(rn_predict_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "auto";
    rn_backend_opts_init(&o->backend);
    o->crop = 224;
    o->resize = -1;
    o->max_pixels = RN_JPEG_MAX_PIXELS;
}

int rn_predictor_open(const rn_ckpt *ck, const rn_predict_opts *o, rn_predictor **out) {
    *out = NULL;
    rn_predictor *p = rn_calloc(1, sizeof *p);
    if (!p) return RN_ENOMEM;
    const int crop = o->crop;
    p->crop = crop;
    p->resize = o->resize;
    int rc = rn_runner_open(&p->r, o->device, o->threads, &o->backend);
    if (rc) goto fail;
    if ((rc = rn_runner_net(&p->r, ck, 1, 1, 0, crop, RN_NET_INFER, RN_F32))) goto fail;
    if ((rc = rn_jpeg_create(&p->jpeg))) goto fail;
    rn_jpeg_set_max_pixels(p->jpeg, o->max_pixels);
    p->px = rn_malloc((size_t)crop * crop * 3);
    p->logits = rn_malloc(sizeof(float) * (size_t)p->r.classes);
    if (!p->px || !p->logits) {
        rc = RN_ENOMEM;
        goto fail;
    }
    *out = p;
    return RN_OK;
fail:
    rn_predictor_close(p);
    return rc;
}

int rn_predictor_image(rn_predictor *p, const uint8_t *data, size_t len) {
    return rn_predict_prepare(p->jpeg, data, len, p->crop, p->resize, p->px, &p->ws);
}

int rn_predictor_run(rn_predictor *p, float *prob) {
    rn_batch b = {.pixels = p->px, .n = 1, .h = p->crop, .w = p->crop, .c = 3};
    int rc = rn_runner_stage(&p->r, &b);
    if (rc) return rc;
    rc = rn_runner_logits(&p->r, &b, 0, 1, p->logits);
    /* the upload is waited for even when the step failed: px is reused */
    int wrc = rn_backend_upload_wait(p->r.be);
    if (rc == RN_OK) rc = wrc;
    if (rc == RN_OK) rn_softmax(p->logits, p->r.classes, prob);
    return rc;
}
