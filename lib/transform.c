/* The eval transform's geometry, and rendering a crop window from a decoded image. */
#include "rn/transform.h"

#include <stdlib.h>
#include <string.h>

#include "rn/err.h"

void rn_window_eval(int w, int h, int S, int resize, rn_window *win) {
    *win = (rn_window){.box = {0, 0, w, h}, .out_w = w, .out_h = h};
    if (resize < 0) resize = rn_round_half_even(S * 256.0 / 224.0);
    if (resize > 0) rn_image_resize_dims(w, h, resize, &win->out_w, &win->out_h);
    if (win->out_w < S || win->out_h < S) win->pad = 1;
    else win->ox = rn_round_half_even((win->out_w - S) / 2.0), win->oy = rn_round_half_even((win->out_h - S) / 2.0);
}

/* centre crop S x S of an image already resized to w x h, zero-padding short sides */
static void crop_pad(const uint8_t *src, int w, int h, int c, int S, uint8_t *dst) {
    int sx, dx, nx, sy, dy, ny;
    if (S > w) sx = 0, dx = (S - w) / 2, nx = w;
    else sx = rn_round_half_even((w - S) / 2.0), dx = 0, nx = S;
    if (S > h) sy = 0, dy = (S - h) / 2, ny = h;
    else sy = rn_round_half_even((h - S) / 2.0), dy = 0, ny = S;
    memset(dst, 0, (size_t)S * S * c);
    for (int y = 0; y < ny; y++)
        memcpy(dst + ((size_t)(y + dy) * S + dx) * c, src + ((size_t)(y + sy) * w + sx) * c, (size_t)nx * c);
}

int rn_window_render(const uint8_t *px, const int part[4], int pw, int ph, int c, const rn_window *win, int S,
                     uint8_t *dst, rn_image_ws *ws) {
    const double *box = win->box;
    int out_w = win->out_w, out_h = win->out_h;
    int whole = box[0] == 0 && box[1] == 0 && box[2] == pw && box[3] == ph && out_w == pw && out_h == ph;
    if (!win->pad) {
        if (whole) return rn_image_crop(px, part[2], part[3], c, win->ox - part[0], win->oy - part[1], S, S, win->flip, dst);
        return rn_image_resize_part(px, part, pw, ph, c, box, out_w, out_h, win->ox, win->oy, S, S, win->flip, dst,
                                    ws);
    }
    /* an image smaller than the crop: resize whole, then centre crop with zero padding */
    if (part[0] || part[1] || part[2] != pw || part[3] != ph)
        return rn_errorf(RN_EINVAL, "a padded window needs the whole %dx%d image, not a %dx%d part", pw, ph, part[2],
                         part[3]);
    int rc = RN_OK;
    uint8_t *tmp = NULL;
    if (out_w == pw && out_h == ph) {
        crop_pad(px, pw, ph, c, S, dst);
        return RN_OK;
    }
    if (!(tmp = rn_malloc((size_t)out_w * out_h * c))) return RN_ENOMEM;
    if ((rc = rn_image_resize(px, pw, ph, c, box, out_w, out_h, 0, 0, out_w, out_h, 0, tmp, ws)) == RN_OK)
        crop_pad(tmp, out_w, out_h, c, S, dst);
    free(tmp);
    return rc;
}
