/* A dataset record (rn.Sample bytes) through the loader's real path: the validation of
 * rn_dataset_read, then rn_loader_transform with the train (RandomResizedCrop + flip, crop-pad, erase,
 * DCT-scaled region decode) or eval (resize + centre crop) transform.
 * Input: 8 parameter bytes (transform, crop, resize, seed, epoch, record), then the
 * Sample. JPEGs over 4 Mpixel are refused. */
#include <stdlib.h>

#include "fuzz.h"
#include "rn/dataset.h"
#include "rn/loader.h"

#define MAX_PIXELS (4u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static rn_loader_scratch sc;
    if (!sc.jpeg) {
        if (rn_jpeg_create(&sc.jpeg) != 0) abort();
        rn_jpeg_set_max_pixels(sc.jpeg, MAX_PIXELS);
    }
    if (size < 8) return 0;
    const uint8_t *p = data;
    rn_sample_msg *msg = NULL;
    rn_sample s;
    if (rn_dataset_sample_parse(data + 8, size - 8, p[7] & 1 ? 0 : 1000, "fuzz.lmdb", "00000000", &msg, &s) == 0) {
        rn_loader_opts o;
        rn_loader_defaults(&o);
        o.train = p[0] & 1;
        if (p[0] & 2) o.aug.n = 0;
        o.exact = (p[0] & 4) != 0;
        int channels = p[0] & 8 ? 4 - (int)s.channels : (int)s.channels; /* sometimes wrong */
        o.crop = 1 + p[1] % 64;
        o.resize = p[0] & 16 ? -1 : p[2] % 96;
        o.seed = p[3];
        if (p[0] & 32) o.aug.step[0].v[0] = 0.5, o.aug.step[0].v[2] = 0.1, o.aug.step[0].v[3] = 10;
        if (p[0] & 64)
            (void)rn_augment_parse(p[0] & 128 ? "crop-pad=4:reflect,flip,erase=1" : "crop-pad=2,erase=1", &o.aug);
        uint8_t *dst = malloc((size_t)o.crop * o.crop * 3);
        rn_erase er;
        if (dst) (void)rn_loader_transform(&o, channels, &s, p[4], p[5] | (uint32_t)p[6] << 8, &sc, dst, &er);
        free(dst);
    }
    rn_dataset_sample_free(msg);
    return 0;
}
