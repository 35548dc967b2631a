/* rn/predict.h: one image file to a network input, with the eval transform. */
#ifndef RN_PREDICT_H
#define RN_PREDICT_H

#include <stddef.h>
#include <stdint.h>

#include "rn/image.h"
#include "rn/jpeg.h"

/* Decode JPEG bytes to RGB and apply the eval transform that rn-eval's loader applies:
 * shorter side to `resize` (antialiased bilinear; 0 keeps the size; -1 means
 * round(S*256/224)), centre crop S x S, zero padding where the image is smaller.
 * dst holds S*S*3 bytes. Errors: RN_EDATA (not a decodable JPEG; the message says why),
 * RN_ENOMEM. */
int rn_predict_prepare(rn_jpeg *j, const uint8_t *data, size_t len, int S, int resize, uint8_t *dst,
                       rn_image_ws *ws);

/* Softmax of n logits into p (float, stable). */
void rn_softmax(const float *logits, int n, float *p);

#endif
