/* rn/transform.h: the geometry of a crop window and rendering it from a decoded image:
 * the one eval transform (torchvision's Resize(resize) + CenterCrop(S), zero padding
 * where the image is smaller), shared by the loader (rn/loader.h: rn-eval, --val) and
 * rn-predict (rn/predict.h), and the frame the loader's RandomResizedCrop renders in.
 *
 * A window is: resize the source box (source pixel coordinates) to out_w x out_h, then
 * take the S x S window at (ox, oy), mirrored when flip; or, when pad (an image
 * smaller than S on a side), resize the whole box and centre it in S x S on zeros. */
#ifndef RN_TRANSFORM_H
#define RN_TRANSFORM_H

#include <stdint.h>

#include "rn/image.h"

typedef struct {
    double box[4];      /* x0, y0, x1, y1 in source pixels */
    int out_w, out_h;   /* the box resized */
    int ox, oy;         /* the window's corner in the resized box (not when pad) */
    int flip;           /* mirror left-right */
    int pad;            /* smaller than S: centre the resized box on zeros */
} rn_window;

/* The eval transform's window for a w x h image: shorter side to resize (-1:
 * round(S*256/224), 0: no resize), centre crop S x S with torchvision's offsets
 * round((size - S) / 2), padding where the resized image is smaller than S. */
void rn_window_eval(int w, int h, int S, int resize, rn_window *win);

/* Render win into dst (S x S x c) from src, which holds part = {x, y, w, h} (packed
 * w x h x c) of a pw x ph image: a crop where the box is the whole image at its own
 * size, else PIL's antialiased bilinear (rn_image_resize_part). The part must hold
 * every pixel the window's filter reads (the whole image when pad). Errors: RN_EINVAL
 * (a window outside the image, a part too small), RN_ENOMEM. */
int rn_window_render(const uint8_t *src, const int part[4], int pw, int ph, int c, const rn_window *win, int S,
                     uint8_t *dst, rn_image_ws *ws);

#endif
