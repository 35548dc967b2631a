/* idx2jpeg: MNIST-style IDX files (as shipped in Debian's dataset-fashion-mnist) to a
 * JPEG ImageFolder that rn-prep reads: OUT/<label>-<name>/<index>.jpg.
 *   idx2jpeg IMAGES.idx LABELS.idx OUT [LIMIT]
 * The files are the uncompressed IDX (gzip -dc them first). Class folders are named
 * "0-tshirt" ... "9-ankle-boot" so that sorting them (as rn-prep and torchvision's
 * ImageFolder do) keeps the original label numbers. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>

static const char *names[10] = {"0-tshirt", "1-trouser", "2-pullover", "3-dress", "4-coat",
                                "5-sandal", "6-shirt",   "7-sneaker",  "8-bag",   "9-ankle-boot"};

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "idx2jpeg: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) fprintf(stderr, "idx2jpeg: out of memory reading %s\n", path);
    *len = n;
    return buf;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: idx2jpeg IMAGES.idx LABELS.idx OUT [LIMIT]\n");
        return 2;
    }
    size_t ilen, llen;
    uint8_t *img = slurp(argv[1], &ilen), *lab = slurp(argv[2], &llen);
    if (!img || !lab) return 1;
    if (ilen < 16 || be32(img) != 0x803 || llen < 8 || be32(lab) != 0x801) {
        fprintf(stderr, "idx2jpeg: %s / %s: not IDX image (0x803) and label (0x801) files (gunzip them first?)\n",
                argv[1], argv[2]);
        return 1;
    }
    uint32_t n = be32(img + 4), h = be32(img + 8), w = be32(img + 12);
    if (be32(lab + 4) != n || ilen < 16 + (size_t)n * h * w || llen < 8 + (size_t)n) {
        fprintf(stderr, "idx2jpeg: %s and %s disagree on the count or are truncated\n", argv[1], argv[2]);
        return 1;
    }
    if (argc == 5 && atol(argv[4]) > 0 && (uint32_t)atol(argv[4]) < n) n = (uint32_t)atol(argv[4]); /* 0: all */
    char path[4096];
    mkdir(argv[3], 0755);
    for (int c = 0; c < 10; c++) {
        snprintf(path, sizeof path, "%s/%s", argv[3], names[c]);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "idx2jpeg: %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    tjhandle tj = tjInitCompress();
    for (uint32_t i = 0; i < n; i++) {
        int label = lab[8 + i];
        if (label > 9) {
            fprintf(stderr, "idx2jpeg: record %u: label %d is not 0..9\n", i, label);
            return 1;
        }
        unsigned char *jpeg = NULL;
        unsigned long jlen = 0;
        if (tjCompress2(tj, img + 16 + (size_t)i * h * w, (int)w, 0, (int)h, TJPF_GRAY, &jpeg, &jlen, TJSAMP_GRAY, 95,
                        0) != 0) {
            fprintf(stderr, "idx2jpeg: record %u: %s\n", i, tjGetErrorStr2(tj));
            return 1;
        }
        snprintf(path, sizeof path, "%s/%s/%05u.jpg", argv[3], names[label], i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(jpeg, 1, jlen, f) != jlen || fclose(f) != 0) {
            fprintf(stderr, "idx2jpeg: %s: %s\n", path, strerror(errno));
            return 1;
        }
        tjFree(jpeg);
    }
    tjDestroy(tj);
    printf("idx2jpeg: %u images of %ux%u into %s\n", n, w, h, argv[3]);
    free(img);
    free(lab);
    return 0;
}
