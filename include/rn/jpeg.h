/* rn/jpeg.h: JPEG decode and encode through libjpeg-turbo's TurboJPEG API.
 *
 * Pixels are u8, interleaved HWC, rows packed (stride = width * channels), top row
 * first. Output channels are 3 (RGB) or 1 (gray) whatever the file holds: grayscale
 * files are replicated to RGB, CMYK/YCCK files are converted to RGB the way PIL's
 * Image.convert("RGB") does (Adobe files store inverted CMYK), RGB files are reduced
 * to gray with the JPEG's own luma (Y) channel.
 *
 * Decoding can use the DCT scaling of libjpeg (1/8, 1/4, 1/2 of each side): the decoder
 * does a fraction of the work and the result is a good low-pass image of the full one.
 *
 * A handle is not thread-safe: make one per thread. All errors are RN_EDATA (the file
 * is not a usable JPEG; the message has the library's text) or RN_ENOMEM; the caller
 * adds the file or record name with rn_error_context(). */
#ifndef RN_JPEG_H
#define RN_JPEG_H

#include <stddef.h>
#include <stdint.h>

typedef struct rn_jpeg rn_jpeg;

/* What the header of a JPEG says. */
typedef struct {
    int width, height; /* full-size pixels */
    int components;    /* 1 gray, 3 YCbCr/RGB, 4 CMYK/YCCK */
    int cmyk;          /* 1 for CMYK or YCCK files */
    int adobe;         /* 1 if an Adobe APP14 marker is present (CMYK stored inverted) */
    int progressive;   /* 1 for progressive (SOF2) files */
    int subsamp;       /* TurboJPEG TJSAMP_* value, -1 if unknown */
} rn_jpeg_info;

/* The most pixels (width x height of the full image) a handle decodes by default. */
#define RN_JPEG_MAX_PIXELS 100000000ull

/* Create a handle (decompressor and compressor), decoding at most RN_JPEG_MAX_PIXELS.
 * Errors: RN_EDATA, RN_ENOMEM. */
int rn_jpeg_create(rn_jpeg **out);
void rn_jpeg_destroy(rn_jpeg *j);

/* Decode no image of more than max_pixels (width x height as the header says), and give
 * libjpeg no more working memory than such an image needs: the sizes in a header are
 * the file's word, and a 550-byte progressive file can ask for gigabytes. */
void rn_jpeg_set_max_pixels(rn_jpeg *j, uint64_t max_pixels);
/* The handle's limit (RN_JPEG_MAX_PIXELS or the last rn_jpeg_set_max_pixels). */
uint64_t rn_jpeg_max_pixels(const rn_jpeg *j);

/* Read the header of len bytes at data. Errors: RN_EDATA (not a JPEG, corrupt header,
 * or zero/absurd dimensions as the library sees them). */
int rn_jpeg_header(rn_jpeg *j, const uint8_t *data, size_t len, rn_jpeg_info *info);

/* The smallest DCT-scaled size (scale 1/8, 1/4 or 1/2: the scales libjpeg-turbo has
 * SIMD code for) whose sides are both at least need_w x need_h; the full size if none
 * is smaller. Pure function. */
void rn_jpeg_scaled_size(const rn_jpeg_info *info, int need_w, int need_h, int *w, int *h);

/* Decode into dst, which holds w * h * channels bytes, where (w, h) is the full size or
 * a size returned by rn_jpeg_scaled_size. channels is 3 (RGB) or 1 (gray).
 * Truncated or corrupt data is an error (RN_EDATA): every libjpeg warning (premature end
 * of data, bad Huffman codes, extraneous bytes, ...) is, where PIL decodes many of them
 * with grey blocks. So is an image over the handle's max_pixels. */
int rn_jpeg_decode(rn_jpeg *j, const uint8_t *data, size_t len, int channels, int w, int h,
                   uint8_t *dst);

/* Decode (at least) the window want = {x, y, w, h} of the DCT-scaled (sw x sh) image,
 * where (sw, sh) is as for rn_jpeg_decode. On success *px points to a packed image of
 * got[2] x got[3] pixels (channels each) whose top-left pixel is (got[0], got[1]) of the
 * scaled image; it contains the window, and its pixels equal those of a full decode.
 * The buffer belongs to the handle and is valid until the handle's next call.
 * Built with RN_HAVE_LIBJPEG (link -ljpeg), only the rows down to the window's bottom
 * are entropy-decoded and only the window's columns (to iMCU boundaries) are
 * reconstructed; otherwise the whole scaled image is decoded (got = {0, 0, sw, sh}).
 * A file truncated below the window is then not noticed. Errors as rn_jpeg_decode. */
int rn_jpeg_decode_region(rn_jpeg *j, const uint8_t *data, size_t len, int channels, int sw,
                          int sh, const int want[4], const uint8_t **px, int got[4]);

/* Encode w x h x channels (1 or 3) pixels at quality 1..100 (4:2:0 for RGB, as PIL's
 * default). On success *out is a malloc'ed buffer of *out_len bytes; caller frees it.
 * Errors: RN_EINVAL (bad size/quality), RN_EDATA, RN_ENOMEM. */
int rn_jpeg_encode(rn_jpeg *j, const uint8_t *src, int w, int h, int channels, int quality,
                   uint8_t **out, size_t *out_len);

#endif
