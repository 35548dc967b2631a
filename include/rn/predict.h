/* rn/predict.h: the classes of single image files (rn-predict): the eval transform
 * (rn/transform.h, the one rn-eval's loader applies) on a decoded JPEG, and the
 * inference step of rn/runner.h on one image at a time.
 *
 *   rn_predict_opts o;
 *   rn_predict_defaults(&o);                            // device auto, crop 224, ...
 *   rn_predictor *p;
 *   rn_predictor_open(ck, &o, &p);
 *   for each file: rn_predictor_image(p, bytes, len)   // bad image: report, go on
 *                  rn_predictor_run(p, prob)          // (classes) probabilities
 *   rn_predictor_close(p);
 */
#ifndef RN_PREDICT_H
#define RN_PREDICT_H

#include <stddef.h>
#include <stdint.h>

#include "rn/backend.h"
#include "rn/ckpt.h"
#include "rn/image.h"
#include "rn/jpeg.h"

/* Decode an image file's bytes (JPEG, or another format of rn/imgfile.h this build reads;
 * no larger than j's max_pixels) to RGB at full size and apply the eval transform that rn-eval's
 * loader applies: shorter side to `resize` (antialiased bilinear; 0 keeps the size; -1
 * means round(S*256/224)), centre crop S x S, zero padding where the image is smaller.
 * dst holds S*S*3 bytes. Errors: RN_EDATA (not a decodable image; the message says why),
 * RN_ENOMEM. */
int rn_predict_prepare(rn_jpeg *j, const uint8_t *data, size_t len, int S, int resize, uint8_t *dst,
                       rn_image_ws *ws);

/* Softmax of n logits into p (float, stable). */
void rn_softmax(const float *logits, int n, float *p);

typedef struct rn_predictor rn_predictor;

typedef struct {
    const char *device;      /* as rn_backend_create ("auto") */
    int threads;             /* CPU threads, 0: all cores */
    rn_backend_opts backend; /* the backend's settings */
    int crop, resize;        /* the eval transform (224, -1: round(crop*256/224)) */
    uint64_t max_pixels;     /* images whose header claims more are refused, before any
                                allocation (RN_JPEG_MAX_PIXELS) */
} rn_predict_opts;

void rn_predict_defaults(rn_predict_opts *o);

/* ck's network for one crop x crop image at a time on o->device, inference mode, fp32,
 * within the memory plan (rn/runner.h). ck is only read here. Errors: those of
 * rn_runner_open, rn_runner_net and rn_jpeg_create. */
int rn_predictor_open(const rn_ckpt *ck, const rn_predict_opts *o, rn_predictor **out);
/* Decode and transform one JPEG file's bytes (rn_predict_prepare) as the next input.
 * Errors of the image alone: RN_EDATA, RN_ENOMEM; the predictor stays usable. */
int rn_predictor_image(rn_predictor *p, const uint8_t *data, size_t len);
/* The class probabilities (softmax of the logits) of the last image into prob
 * (classes floats). Errors: those of the backend. */
int rn_predictor_run(rn_predictor *p, float *prob);
/* NULL is a no-op. */
void rn_predictor_close(rn_predictor *p);

#endif
