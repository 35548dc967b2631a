#include "rn/predict.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"

int rn_predict_prepare(rn_jpeg *j, const uint8_t *data, size_t len, int S, int resize, uint8_t *dst,
                       rn_image_ws *ws) {
    rn_jpeg_info info;
    int rc = rn_jpeg_header(j, data, len, &info);
    if (rc) return rc;
    int W = info.width, H = info.height;
    uint8_t *full = rn_malloc((size_t)W * H * 3);
    if (!full) return RN_ENOMEM;
    if ((rc = rn_jpeg_decode(j, data, len, 3, W, H, full))) goto out;
    if (resize < 0) resize = rn_round_half_even(S * 256.0 / 224.0);
    int ow = W, oh = H;
    if (resize > 0) rn_image_resize_dims(W, H, resize, &ow, &oh);
    double box[4] = {0, 0, W, H};
    if (ow >= S && oh >= S) {
        /* torchvision's CenterCrop: offsets round((size - S) / 2) */
        int ox = rn_round_half_even((ow - S) / 2.0), oy = rn_round_half_even((oh - S) / 2.0);
        if (ow == W && oh == H) rc = rn_image_crop(full, W, H, 3, ox, oy, S, S, 0, dst);
        else rc = rn_image_resize(full, W, H, 3, box, ow, oh, ox, oy, S, S, 0, dst, ws);
        goto out;
    }
    /* smaller than the crop on a side: resize whole, then pad around the centre */
    uint8_t *tmp = rn_malloc((size_t)ow * oh * 3);
    if (!tmp) {
        rc = RN_ENOMEM;
        goto out;
    }
    if (ow == W && oh == H) memcpy(tmp, full, (size_t)W * H * 3);
    else rc = rn_image_resize(full, W, H, 3, box, ow, oh, 0, 0, ow, oh, 0, tmp, ws);
    if (rc == RN_OK) {
        memset(dst, 0, (size_t)S * S * 3);
        int sx = ow > S ? rn_round_half_even((ow - S) / 2.0) : 0, dx = ow < S ? (S - ow) / 2 : 0;
        int sy = oh > S ? rn_round_half_even((oh - S) / 2.0) : 0, dy = oh < S ? (S - oh) / 2 : 0;
        int nx = ow < S ? ow : S, ny = oh < S ? oh : S;
        for (int y = 0; y < ny; y++)
            memcpy(dst + ((size_t)(y + dy) * S + dx) * 3, tmp + ((size_t)(y + sy) * ow + sx) * 3, (size_t)nx * 3);
    }
    free(tmp);
out:
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
