/* JPEG bytes through rn_jpeg_header, a full decode and a region decode at a DCT scale.
 * Input: 8 parameter bytes (channels, the size the scale must hold, the window), then
 * the JPEG file. Images over 4 Mpixel are refused, as a small --max-pixels would. */
#include <stdlib.h>

#include "fuzz.h"
#include "rn/jpeg.h"

#define MAX_PIXELS (4u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static rn_jpeg *j;
    if (!j) {
        if (rn_jpeg_create(&j) != 0) abort();
        rn_jpeg_set_max_pixels(j, MAX_PIXELS);
    }
    if (size < 8) return 0;
    const uint8_t *p = data;
    const uint8_t *jpg = data + 8;
    size_t len = size - 8;
    int channels = p[0] & 1 ? 1 : 3;
    rn_jpeg_info info;
    if (rn_jpeg_header(j, jpg, len, &info) != 0) return 0;
    if ((uint64_t)info.width * info.height > MAX_PIXELS) return 0;
    int sw, sh;
    rn_jpeg_scaled_size(&info, 1 + p[1] * 4, 1 + p[2] * 4, &sw, &sh);
    uint8_t *dst = malloc((size_t)sw * sh * channels);
    if (!dst) return 0;
    if (p[0] & 2) (void)rn_jpeg_decode(j, jpg, len, channels, sw, sh, dst);
    free(dst);
    int want[4] = {p[3] * sw / 256, p[4] * sh / 256, 0, 0};
    want[2] = 1 + p[5] * (sw - want[0] - 1) / 255;
    want[3] = 1 + p[6] * (sh - want[1] - 1) / 255;
    const uint8_t *px;
    int got[4];
    if (rn_jpeg_decode_region(j, jpg, len, channels, sw, sh, want, &px, got) == 0) {
        /* the window must lie inside what came back: touch its corners */
        volatile uint8_t sink = px[0];
        sink ^= px[((size_t)got[3] * got[2] - 1) * channels];
        (void)sink;
        if (want[0] < got[0] || want[1] < got[1] || want[0] + want[2] > got[0] + got[2] ||
            want[1] + want[3] > got[1] + got[3])
            abort();
    }
    return 0;
}
