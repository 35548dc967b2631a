/* Image files other than JPEG (PNG, WebP, PPM/PGM, BMP: what rn/imgfile.h reads) through the
 * format sniffer, the header reader and a full decode. Input: 1 parameter byte (bit 0:
 * gray output), then the file. Images over 4 Mpixel are refused, as a small --max-pixels
 * would; the decoder is also given that limit, so a header it reads differently from
 * rn_imgfile_header cannot make it write past the buffer. */
#include <stdlib.h>

#include "fuzz.h"
#include "rn/imgfile.h"

#define MAX_PIXELS (4u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int channels = data[0] & 1 ? 1 : 3;
    const uint8_t *img = data + 1;
    size_t len = size - 1;
    rn_img_format f = rn_imgfile_format(img, len);
    (void)rn_imgfile_name(f);
    (void)rn_imgfile_missing(f);
    int w, h;
    if (f == RN_IMG_JPEG || rn_imgfile_header(f, img, len, &w, &h) != 0) return 0;
    if (w <= 0 || h <= 0) abort();
    if ((uint64_t)w * h > MAX_PIXELS) return 0;
    uint8_t *dst = malloc((size_t)w * h * 3);
    if (!dst) return 0;
    if (rn_imgfile_decode(f, img, len, channels, (uint64_t)w * h, dst) == 0) {
        volatile uint8_t sink = dst[0];
        sink ^= dst[(size_t)w * h * channels - 1];
        (void)sink;
    }
    free(dst);
    return 0;
}
