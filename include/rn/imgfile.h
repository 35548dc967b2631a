/* rn/imgfile.h: image files other than JPEG (PNG through libspng, WebP through libwebp,
 * binary PPM/PGM of maxval 255 or 65535 and uncompressed BMP read here), decoded to the
 * pixels PIL gives: Image.open(f).convert("RGB"), or convert("L").
 *
 * Pixels are u8, interleaved HWC, rows packed, top row first, 3 (RGB) or 1 (gray)
 * channels whatever the file holds:
 * - alpha is dropped, never composited (tRNS transparency too): PIL's convert("RGB");
 * - palettes are expanded, grey is replicated, grey of 1/2/4 bits is scaled to 0..255;
 * - 16-bit colour samples keep their high byte (PIL's "RGB;16B" unpacking);
 * - 16-bit grey saturates at 255: PIL opens it as mode "I" (0..65535) and
 *   convert("RGB") clips each value to 0..255, so every value over 255 becomes 255
 *   (16-bit PNG grey and P5 of maxval 65535 alike);
 * - P6 of maxval 65535 is PIL's round(v / 65535 * 255);
 * - gray output is PIL's convert("L") of that RGB: (19595 R + 38470 G + 7471 B +
 *   0x8000) >> 16, which leaves grey files unchanged;
 * - gamma (gAMA), colour profiles (iCCP) and sBIT are ignored, as PIL ignores them.
 *
 * Decoding is stateless and thread-safe. All errors are RN_EDATA (the file is not a
 * usable image of its kind; the message has the library's text) or RN_ENOMEM; the
 * caller adds the file name. */
#ifndef RN_IMGFILE_H
#define RN_IMGFILE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    RN_IMG_UNKNOWN = 0,
    RN_IMG_JPEG, /* rn/jpeg.h decodes these */
    RN_IMG_PNG,
    RN_IMG_WEBP,
    RN_IMG_GIF,
    RN_IMG_BMP,
    RN_IMG_TIFF,
    RN_IMG_PNM,
} rn_img_format;

/* The format the first bytes of a file say (magic numbers only). */
rn_img_format rn_imgfile_format(const uint8_t *data, size_t len);

/* "JPEG", "PNG", ...; "unknown" for RN_IMG_UNKNOWN. */
const char *rn_imgfile_name(rn_img_format f);

/* 1 if this build decodes f with rn_imgfile_decode (JPEG: 0, see rn/jpeg.h). */
int rn_imgfile_can_decode(rn_img_format f);

/* Why this build cannot decode f (which library it was built without, and what to do);
 * "" if it can; NULL for a format no build of rn reads. */
const char *rn_imgfile_missing(rn_img_format f);

/* The formats this build reads, JPEG included, e.g. "JPEG, PNG, WebP". */
const char *rn_imgfile_formats(void);

/* Width and height from the header alone: nothing is allocated for pixels, so a caller
 * can refuse an image by its size before decoding it. Errors: RN_EDATA. */
int rn_imgfile_header(rn_img_format f, const uint8_t *data, size_t len, int *w, int *h);

/* Decode the whole image (w x h as rn_imgfile_header says) into dst, which holds
 * w * h * 3 bytes even when channels is 1 (it is the working space: the first w * h
 * bytes are the gray result). Images of more than max_pixels are refused before any
 * allocation. Truncated or corrupt data is an error. Errors: RN_EDATA, RN_ENOMEM,
 * RN_EINVAL (channels not 1 or 3). */
int rn_imgfile_decode(rn_img_format f, const uint8_t *data, size_t len, int channels, uint64_t max_pixels,
                      uint8_t *dst);

#endif
