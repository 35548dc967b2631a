/* rn/image.h: resize, crop, flip and normalise u8 images.
 *
 * Images are u8, interleaved HWC (channels 1..4), rows packed: pixel (y, x, c) is at
 * ((y * width) + x) * channels + c.
 *
 * Resizing is PIL's bilinear filter (Image.resize(..., BILINEAR), which torchvision uses
 * for PIL images): a triangle filter whose support widens with the shrink factor, so
 * shrinking is antialiased; coefficients in 22-bit fixed point; horizontal pass first,
 * rounded to u8, then vertical. Results match PIL to within rounding.
 *
 * The random crop box of torchvision's RandomResizedCrop is drawn here too, from a
 * caller-supplied source of draws, so tests can feed it the draws torch made. */
#ifndef RN_IMAGE_H
#define RN_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* Scratch memory a resize reuses between calls; zero-initialise, free with
 * rn_image_ws_free. One per thread. */
typedef struct {
    void *p;
    size_t cap;
} rn_image_ws;
void rn_image_ws_free(rn_image_ws *ws);

/* Resize and crop in one pass: conceptually, resize the source region box = {x0, y0,
 * x1, y1} (source pixel coordinates, fractions allowed, as PIL's resize(box=...)) to
 * out_w x out_h, then take the dw x dh window at (ox, oy) of that result, mirrored
 * left-right if flip. Only the window is computed. src is sw x sh x c, dst dw x dh x c.
 * Errors: RN_EINVAL (empty box, box outside the image, window outside the output),
 * RN_ENOMEM. */
int rn_image_resize(const uint8_t *src, int sw, int sh, int c, const double box[4], int out_w,
                    int out_h, int ox, int oy, int dw, int dh, int flip, uint8_t *dst,
                    rn_image_ws *ws);

/* The same when src holds only part = {x, y, w, h} of the sw x sh image (packed w x h x c):
 * results are identical to rn_image_resize on the whole image as long as the part holds
 * every pixel the filter reads (else RN_EINVAL). */
int rn_image_resize_part(const uint8_t *src, const int part[4], int sw, int sh, int c,
                         const double box[4], int out_w, int out_h, int ox, int oy, int dw,
                         int dh, int flip, uint8_t *dst, rn_image_ws *ws);

/* Copy the w x h window at (x, y) of src (sw x sh x c) to dst (w x h x c), mirrored
 * left-right if flip. Errors: RN_EINVAL if the window does not fit. */
int rn_image_crop(const uint8_t *src, int sw, int sh, int c, int x, int y, int w, int h, int flip,
                  uint8_t *dst);

/* Mirror left-right in place. */
void rn_image_flip(uint8_t *img, int w, int h, int c);

/* dst[i] = (src[i] / 255 - mean[ch]) / std[ch] for npix pixels of c channels, computed
 * in float exactly as torchvision's ToTensor + Normalize do (per channel value table). */
void rn_image_normalize(const uint8_t *src, float *dst, size_t npix, int c, const float *mean,
                        const float *std);

/* Shorter side to `size` keeping aspect, as torchvision's Resize(size): the longer side
 * becomes floor(size * long / short). */
void rn_image_resize_dims(int w, int h, int size, int *out_w, int *out_h);

/* Python's round() (half to even) of x, as torchvision uses for crop arithmetic. */
int rn_round_half_even(double x);

/* A source of random draws for the crop sampler: uniform(lo, hi) returns a float in
 * [lo, hi) as torch.empty(1).uniform_(lo, hi) does; randint(lo, hi) an int in
 * [lo, hi) as torch.randint does. */
typedef struct {
    float (*uniform)(void *ctx, float lo, float hi);
    int (*randint)(void *ctx, int lo, int hi);
    void *ctx;
} rn_draws;

/* Draws from Philox: the j-th word of the stream (key, ctr_hi, ctr_lo) is word j % 4 of
 * rn_philox(key, ctr_hi, (ctr_lo << 8) + j / 4), so a stream depends only on its
 * counters (up to 1024 words). uniform is lo + (hi - lo) * u with u a 24-bit uniform in
 * [0, 1), as torch computes float uniforms; randint(lo, hi) is lo + floor(u32 * (hi -
 * lo) / 2^32). */
typedef struct {
    uint64_t key, hi, lo;
    uint32_t w[4];
    unsigned n;
} rn_image_stream;
void rn_image_stream_init(rn_image_stream *s, rn_draws *d, uint64_t key, uint64_t ctr_hi,
                          uint64_t ctr_lo);
uint32_t rn_image_stream_next(rn_image_stream *s);

/* torchvision's RandomResizedCrop.get_params for a width x height image: up to 10
 * attempts of area scale in [scale_lo, scale_hi] and log-uniform aspect ratio in
 * [ratio_lo, ratio_hi], then the centre-crop fallback. Writes box = {x, y, w, h}
 * (torchvision's j, i, w, h). */
void rn_image_rrc_box(int width, int height, double scale_lo, double scale_hi, double ratio_lo,
                      double ratio_hi, const rn_draws *d, int box[4]);

#endif
