/* shapes: a small learnable image set, generated: 32x32 JPEGs of horizontal stripes,
 * vertical stripes and checkerboards (random period, phase, colours and noise), in the
 * ImageFolder layout rn-prep reads: OUT/<class>/<index>.jpg.
 *   shapes OUT PER_CLASS SEED
 * The same SEED gives the same images. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>

#define S 32

static const char *classes[] = {"checker", "horizontal", "vertical"};

/* splitmix64: small, seedable, the same on every machine */
static uint64_t next(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int below(uint64_t *x, int n) { return (int)(next(x) % (uint64_t)n); }

static int mkdir_p(const char *p) {
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "shapes: %s: %s\n", p, strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: shapes OUT PER_CLASS SEED\n");
        return 2;
    }
    const char *out = argv[1];
    int per = atoi(argv[2]);
    uint64_t rng = strtoull(argv[3], NULL, 10) * 1000003u + 1;
    if (per <= 0) {
        fprintf(stderr, "shapes: PER_CLASS must be a positive number, not '%s'\n", argv[2]);
        return 2;
    }
    tjhandle tj = tjInitCompress();
    if (!tj || mkdir_p(out)) return 1;
    uint8_t img[S * S * 3];
    char path[4096];
    for (int c = 0; c < 3; c++) {
        snprintf(path, sizeof path, "%s/%s", out, classes[c]);
        if (mkdir_p(path)) return 1;
        for (int i = 0; i < per; i++) {
            int period = 4 + below(&rng, 5), phase = below(&rng, period), w = 1 + period / 3;
            uint8_t fg[3], bg[3];
            for (int k = 0; k < 3; k++) {
                bg[k] = (uint8_t)below(&rng, 90);
                fg[k] = (uint8_t)(140 + below(&rng, 116));
            }
            for (int y = 0; y < S; y++)
                for (int x = 0; x < S; x++) {
                    int on = c == 1   ? (y + phase) % period < w
                             : c == 2 ? (x + phase) % period < w
                                      : (((x + phase) / period) + ((y + phase) / period)) % 2;
                    for (int k = 0; k < 3; k++) {
                        int v = (on ? fg[k] : bg[k]) + below(&rng, 41) - 20;
                        img[(y * S + x) * 3 + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                    }
                }
            unsigned char *jpg = NULL;
            unsigned long len = 0;
            if (tjCompress2(tj, img, S, 0, S, TJPF_RGB, &jpg, &len, TJSAMP_444, 95, 0) != 0) {
                fprintf(stderr, "shapes: JPEG encode: %s\n", tjGetErrorStr2(tj));
                return 1;
            }
            snprintf(path, sizeof path, "%s/%s/%04d.jpg", out, classes[c], i);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(jpg, 1, len, f) != len || fclose(f) != 0) {
                fprintf(stderr, "shapes: %s: %s\n", path, strerror(errno));
                return 1;
            }
            tjFree(jpg);
        }
    }
    tjDestroy(tj);
    return 0;
}
