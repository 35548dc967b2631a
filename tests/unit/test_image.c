/* image and jpeg modules: resize against PIL, RandomResizedCrop against torchvision
 * (same draws), decode against PIL (incl. CMYK), crop/flip/normalise. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "rn/err.h"
#include "rn/image.h"
#include "rn/jpeg.h"
#include "rn/rng.h"

static char tmpdir[] = "/tmp/rn-test-image-XXXXXX";
static const char *python;

static int have_python(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s -c 'import PIL' 2>/dev/null", python);
    return system(cmd) == 0;
}

static int write_file(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(d, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(d, 1, (size_t)len, f);
    fclose(f);
    return d;
}

/* a smooth seeded picture with texture (never all zeros) */
static void picture(uint8_t *p, int w, int h, int c, uint64_t seed) {
    float noise[4096];
    rn_rng_uniform(rn_rng_key(seed, 1), noise, 4096, -20.0f, 20.0f);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int ch = 0; ch < c; ch++) {
                float v = 128 + 90 * sinf(x * 0.21f * (ch + 1) + y * 0.13f) + noise[(y * w + x + ch) % 4096];
                p[((size_t)y * w + x) * c + ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
}

static void test_resize_vs_pil(void) {
    struct { int w, h, c, ow, oh; double box[4]; } cases[] = {
        {97, 83, 3, 40, 30, {0, 0, 97, 83}},        /* shrink */
        {97, 83, 3, 224, 224, {0, 0, 97, 83}},      /* enlarge */
        {97, 83, 3, 31, 57, {0, 0, 97, 83}},        /* shrink x, grow y */
        {97, 83, 3, 24, 24, {10, 7, 77, 60}},       /* integer box (a crop) */
        {97, 83, 3, 33, 21, {3.5, 2.25, 90.75, 70}}, /* fractional box */
        {200, 150, 1, 17, 13, {0, 0, 200, 150}},    /* gray, strong shrink */
        {500, 375, 3, 224, 224, {120, 40, 420, 300}},
    };
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        int w = cases[t].w, h = cases[t].h, c = cases[t].c, ow = cases[t].ow, oh = cases[t].oh;
        const double *b = cases[t].box;
        uint8_t *src = malloc((size_t)w * h * c), *dst = malloc((size_t)ow * oh * c);
        picture(src, w, h, c, t);
        rn_image_ws ws = {0};
        CHECK_OK(rn_image_resize(src, w, h, c, b, ow, oh, 0, 0, ow, oh, 0, dst, &ws));
        char in[512], out[512], cmd[2048];
        snprintf(in, sizeof in, "%s/in.raw", tmpdir);
        snprintf(out, sizeof out, "%s/out.raw", tmpdir);
        write_file(in, src, (size_t)w * h * c);
        snprintf(cmd, sizeof cmd, "%s tests/unit/ref_image.py resize %s %d %d %d %d %d %.17g %.17g %.17g %.17g %s",
                 python, in, w, h, c, ow, oh, b[0], b[1], b[2], b[3], out);
        CHECK(system(cmd) == 0, "%s failed", cmd);
        size_t n = 0;
        uint8_t *ref = read_all(out, &n);
        CHECK(ref && n == (size_t)ow * oh * c, "reference size %zu", n);
        if (ref && n == (size_t)ow * oh * c) {
            double mad = 0;
            int maxd = 0;
            for (size_t i = 0; i < n; i++) {
                int d = abs((int)ref[i] - (int)dst[i]);
                mad += d;
                if (d > maxd) maxd = d;
            }
            mad /= (double)n;
            CHECK(mad < 1.0, "case %zu %dx%d->%dx%d: mean abs diff %.3f grey levels vs PIL", t, w, h, ow, oh, mad);
            CHECK(maxd <= 1, "case %zu: max diff %d vs PIL", t, maxd);
        }
        /* a window of the output equals the same window of the full output, flipped too */
        if (ow > 8 && oh > 6) {
            int dw = ow - 5, dh = oh - 4;
            uint8_t *win = malloc((size_t)dw * dh * c);
            CHECK_OK(rn_image_resize(src, w, h, c, b, ow, oh, 3, 2, dw, dh, 1, win, &ws));
            int same = 1;
            for (int y = 0; y < dh; y++)
                for (int x = 0; x < dw; x++)
                    for (int ch = 0; ch < c; ch++)
                        same &= win[((size_t)y * dw + (dw - 1 - x)) * c + ch] ==
                                dst[((size_t)(y + 2) * ow + x + 3) * c + ch];
            CHECK(same, "case %zu: flipped window differs from the full resize", t);
            free(win);
        }
        free(ref);
        free(src);
        free(dst);
        rn_image_ws_free(&ws);
    }
}

typedef struct {
    float u[32];
    int i[32];
    int nu, ni, cu, ci;
} replay;

static float rp_uniform(void *ctx, float lo, float hi) {
    replay *r = ctx;
    return r->cu < r->nu ? r->u[r->cu++] : -1000.0f;
}
static int rp_randint(void *ctx, int lo, int hi) {
    replay *r = ctx;
    return r->ci < r->ni ? r->i[r->ci++] : -1000;
}

static void test_rrc_vs_torchvision(void) {
    char out[512], cmd[1024];
    snprintf(out, sizeof out, "%s/rrc.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "%s -c 'import torch, torchvision' 2>/dev/null", python);
    if (system(cmd) != 0) {
        printf("skip: RandomResizedCrop parity (torch/torchvision not importable by %s)\n", python);
        return;
    }
    snprintf(cmd, sizeof cmd, "%s tests/unit/ref_image.py rrc 3000 %s", python, out);
    CHECK(system(cmd) == 0, "%s failed", cmd);
    FILE *f = fopen(out, "r");
    CHECK(f != NULL, "no %s", out);
    if (!f) return;
    int w, h, x, y, bw, bh, nd, trials = 0, same = 0, fallbacks = 0;
    while (fscanf(f, "%d %d %d %d %d %d %d", &w, &h, &x, &y, &bw, &bh, &nd) == 7) {
        replay r;
        memset(&r, 0, sizeof r);
        for (int k = 0; k < nd; k++) {
            char tok[64];
            if (fscanf(f, "%63s", tok) != 1) break;
            if (tok[0] == 'u' && r.nu < 32) r.u[r.nu++] = strtof(tok + 1, NULL);
            else if (tok[0] == 'i' && r.ni < 32) r.i[r.ni++] = atoi(tok + 1);
        }
        rn_draws d = {rp_uniform, rp_randint, &r};
        int box[4];
        rn_image_rrc_box(w, h, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, &d, box);
        int ok = box[0] == x && box[1] == y && box[2] == bw && box[3] == bh && r.cu == r.nu && r.ci == r.ni;
        if (!ok && trials - same < 5)
            fprintf(stderr, "rrc %dx%d: rn (%d,%d,%d,%d) torchvision (%d,%d,%d,%d)\n", w, h, box[0], box[1],
                    box[2], box[3], x, y, bw, bh);
        same += ok;
        fallbacks += r.nu == 20;
        trials++;
    }
    fclose(f);
    CHECK(trials == 3000, "read %d trials", trials);
    CHECK(same == trials, "%d of %d crop boxes differ from torchvision's", trials - same, trials);
    CHECK(fallbacks > 10, "only %d trials reached the centre-crop fallback", fallbacks);
}

static void test_jpeg_vs_pil(void) {
    rn_jpeg *j;
    CHECK_OK(rn_jpeg_create(&j));
    int w = 61, h = 45;
    uint8_t *src = malloc((size_t)w * h * 3), *dec = malloc((size_t)w * h * 3);
    picture(src, w, h, 3, 9);
    uint8_t *jpg;
    size_t len;
    CHECK_OK(rn_jpeg_encode(j, src, w, h, 3, 90, &jpg, &len));
    rn_jpeg_info info;
    CHECK_OK(rn_jpeg_header(j, jpg, len, &info));
    CHECK(info.width == w && info.height == h && info.components == 3 && !info.cmyk, "header %dx%d", info.width, info.height);
    CHECK_OK(rn_jpeg_decode(j, jpg, len, 3, w, h, dec));
    double mad = 0;
    for (size_t i = 0; i < (size_t)w * h * 3; i++) mad += abs((int)src[i] - (int)dec[i]);
    mad /= (double)w * h * 3;
    /* the picture carries +-20 grey levels of pixel noise and 4:2:0 halves chroma */
    CHECK(mad < 12.0, "quality-90 round trip mean abs diff %.2f", mad);
    /* decode matches PIL exactly (both are libjpeg-turbo, islow DCT, fancy upsampling) */
    char p[512], o[512], cmd[2048];
    snprintf(p, sizeof p, "%s/a.jpg", tmpdir);
    snprintf(o, sizeof o, "%s/a.raw", tmpdir);
    write_file(p, jpg, len);
    for (int c = 1; c <= 3; c += 2) {
        snprintf(cmd, sizeof cmd, "%s tests/unit/ref_image.py decode %s %s %d", python, p, o, c);
        CHECK(system(cmd) == 0, "%s", cmd);
        size_t n;
        uint8_t *ref = read_all(o, &n);
        CHECK_OK(rn_jpeg_decode(j, jpg, len, c, w, h, dec));
        int maxd = 0;
        for (size_t i = 0; ref && i < n && i < (size_t)w * h * c; i++)
            if (abs((int)ref[i] - (int)dec[i]) > maxd) maxd = abs((int)ref[i] - (int)dec[i]);
        CHECK(ref && n == (size_t)w * h * c && maxd <= (c == 3 ? 0 : 1), "decode to %d channels vs PIL: max diff %d", c, maxd);
        free(ref);
    }
    /* DCT-scaled decode: smallest size covering the need */
    int sw, sh;
    rn_jpeg_scaled_size(&info, 20, 10, &sw, &sh);
    CHECK(sw == 31 && sh == 23, "scaled size for 20x10 of 61x45: %dx%d (1/2 expected)", sw, sh);
    rn_jpeg_scaled_size(&info, 9, 5, &sw, &sh);
    CHECK(sw == 16 && sh == 12, "scaled size for 9x5 of 61x45: %dx%d (1/4 expected)", sw, sh);
    rn_jpeg_scaled_size(&info, 40, 5, &sw, &sh);
    CHECK(sw == 61 && sh == 45, "scaled size for 40x5 of 61x45: %dx%d (full expected)", sw, sh);
    CHECK_OK(rn_jpeg_decode(j, jpg, len, 3, sw, sh, dec));
    CHECK(rn_jpeg_decode(j, jpg, len, 3, 30, 30, dec) == RN_EINVAL, "a size that is no DCT scale is refused");
    /* truncated and garbage data fail with a message, never crash */
    CHECK(rn_jpeg_decode(j, jpg, len / 2, 3, w, h, dec) == RN_EDATA, "truncated accepted");
    CHECK(strstr(rn_last_error(), "truncated") != NULL, "message: %s", rn_last_error());
    /* data cut short but closed with an end marker: only a libjpeg warning ("premature
       end of data segment"), refused by both decoders all the same */
    size_t cut = len * 2 / 3;
    uint8_t *closed = malloc(cut + 2);
    memcpy(closed, jpg, cut);
    closed[cut] = 0xFF, closed[cut + 1] = 0xD9;
    CHECK(rn_jpeg_decode(j, closed, cut + 2, 3, w, h, dec) == RN_EDATA, "data cut short accepted");
    CHECK(strstr(rn_last_error(), "premature end of data segment") != NULL, "message: %s", rn_last_error());
    const uint8_t *px;
    int want[4] = {4, 4, 20, 20}, got[4];
    CHECK(rn_jpeg_decode_region(j, closed, cut + 2, 3, w, h, want, &px, got) == RN_EDATA,
          "data cut short accepted by the region decoder");
    CHECK(strstr(rn_last_error(), "corrupt or truncated JPEG data") != NULL, "message: %s", rn_last_error());
    free(closed);
    /* a size over the handle's limit is refused from the header, before any allocation */
    rn_jpeg_set_max_pixels(j, (uint64_t)w * h - 1);
    CHECK(rn_jpeg_decode(j, jpg, len, 3, w, h, dec) == RN_EDATA && strstr(rn_last_error(), "over the limit"),
          "over max_pixels: %s", rn_last_error());
    CHECK(rn_jpeg_decode_region(j, jpg, len, 3, w, h, want, &px, got) == RN_EDATA, "region over max_pixels");
    rn_jpeg_set_max_pixels(j, RN_JPEG_MAX_PIXELS);
    CHECK_OK(rn_jpeg_decode(j, jpg, len, 3, w, h, dec));
    CHECK(rn_jpeg_header(j, (const uint8_t *)"hello world", 11, &info) == RN_EDATA, "text accepted");
    free(jpg);
    /* CMYK (Adobe, inverted) as PIL writes it, to RGB as PIL converts it */
    snprintf(cmd, sizeof cmd, "%s tests/unit/ref_image.py cmyk %s/c.jpg %s/c.raw", python, tmpdir, tmpdir);
    CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(p, sizeof p, "%s/c.jpg", tmpdir);
    snprintf(o, sizeof o, "%s/c.raw", tmpdir);
    size_t n, rn;
    uint8_t *cj = read_all(p, &n), *ref = read_all(o, &rn);
    CHECK(cj && ref, "cmyk files");
    if (cj && ref) {
        CHECK_OK(rn_jpeg_header(j, cj, n, &info));
        CHECK(info.cmyk && info.components == 4 && info.adobe, "cmyk header: cmyk %d comps %d adobe %d", info.cmyk,
              info.components, info.adobe);
        uint8_t *rgb = malloc((size_t)info.width * info.height * 3);
        CHECK_OK(rn_jpeg_decode(j, cj, n, 3, info.width, info.height, rgb));
        int maxd = 0;
        for (size_t i = 0; i < rn && i < (size_t)info.width * info.height * 3; i++)
            if (abs((int)ref[i] - (int)rgb[i]) > maxd) maxd = abs((int)ref[i] - (int)rgb[i]);
        CHECK(rn == (size_t)info.width * info.height * 3 && maxd <= 1, "CMYK to RGB vs PIL: max diff %d", maxd);
        free(rgb);
    }
    free(cj);
    free(ref);
    free(src);
    free(dec);
    rn_jpeg_destroy(j);
}

/* a decoded window equals the same window of a full decode, at every DCT scale */
static void test_region_decode(void) {
    rn_jpeg *j;
    CHECK_OK(rn_jpeg_create(&j));
    int w = 301, h = 227;
    uint8_t *src = malloc((size_t)w * h * 3), *full = malloc((size_t)w * h * 3), *jpg;
    picture(src, w, h, 3, 21);
    size_t len;
    CHECK_OK(rn_jpeg_encode(j, src, w, h, 3, 90, &jpg, &len));
    rn_jpeg_info info;
    CHECK_OK(rn_jpeg_header(j, jpg, len, &info));
    uint64_t key = rn_rng_key(5, 5);
    int bad = 0, tries = 0;
    for (int t = 0; t < 60; t++) {
        uint32_t r[4];
        rn_philox(key, 0, (uint64_t)t, r);
        int c = t % 5 == 4 ? 1 : 3, need = 1 + (int)(r[0] % (unsigned)w), sw, sh;
        rn_jpeg_scaled_size(&info, need, 1, &sw, &sh);
        int want[4], got[4];
        want[2] = 1 + (int)(r[1] % (unsigned)sw);
        want[3] = 1 + (int)(r[2] % (unsigned)sh);
        want[0] = (int)(r[3] % (unsigned)(sw - want[2] + 1));
        want[1] = (int)((r[3] >> 16) % (unsigned)(sh - want[3] + 1));
        CHECK_OK(rn_jpeg_decode(j, jpg, len, c, sw, sh, full));
        const uint8_t *px = NULL;
        CHECK_OK(rn_jpeg_decode_region(j, jpg, len, c, sw, sh, want, &px, got));
        if (!px) continue;
        int inside = got[0] <= want[0] && got[1] <= want[1] && got[0] + got[2] >= want[0] + want[2] &&
                     got[1] + got[3] >= want[1] + want[3];
        CHECK(inside, "window (%d,%d %dx%d) not inside the decoded (%d,%d %dx%d)", want[0], want[1], want[2],
              want[3], got[0], got[1], got[2], got[3]);
        if (!inside) continue;
        int diff = 0;
        for (int y = want[1]; y < want[1] + want[3]; y++)
            diff |= memcmp(px + ((size_t)(y - got[1]) * got[2] + (want[0] - got[0])) * c,
                           full + ((size_t)y * sw + want[0]) * c, (size_t)want[2] * c) != 0;
        if (diff && bad < 3)
            fprintf(stderr, "region (%d,%d %dx%d) of %dx%d x%d differs from the full decode\n", want[0], want[1],
                    want[2], want[3], sw, sh, c);
        bad += diff;
        tries++;
    }
    CHECK(bad == 0, "%d of %d decoded windows differ from the full decode", bad, tries);
    int want[4] = {0, 0, w + 1, 1}, got[4];
    const uint8_t *px;
    CHECK(rn_jpeg_decode_region(j, jpg, len, 3, w, h, want, &px, got) == RN_EINVAL, "window outside accepted");
    free(jpg);
    free(src);
    free(full);
    rn_jpeg_destroy(j);
}

static void test_small_ops(void) {
    uint8_t img[2 * 3 * 2] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, out[8];
    CHECK_OK(rn_image_crop(img, 3, 2, 2, 1, 0, 2, 2, 1, out));
    uint8_t want[8] = {5, 6, 3, 4, 11, 12, 9, 10};
    CHECK(memcmp(out, want, 8) == 0, "crop+flip");
    CHECK(rn_image_crop(img, 3, 2, 2, 2, 0, 2, 2, 0, out) == RN_EINVAL, "crop outside accepted");
    rn_image_flip(img, 3, 2, 2);
    CHECK(img[0] == 5 && img[1] == 6 && img[4] == 1 && img[6] == 11, "flip");
    int w, h;
    rn_image_resize_dims(500, 375, 256, &w, &h);
    CHECK(w == 341 && h == 256, "resize dims %dx%d", w, h);
    rn_image_resize_dims(375, 500, 256, &w, &h);
    CHECK(w == 256 && h == 341, "resize dims %dx%d", w, h);
    CHECK(rn_round_half_even(2.5) == 2 && rn_round_half_even(3.5) == 4 && rn_round_half_even(-0.5) == 0, "round");
    uint8_t px[6] = {0, 128, 255, 10, 20, 30};
    float f[6], mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    rn_image_normalize(px, f, 2, 3, mean, std);
    for (int i = 0; i < 6; i++) {
        float want_f = ((float)px[i] / 255.0f - mean[i % 3]) / std[i % 3];
        CHECK(f[i] == want_f, "normalize %d: %g vs %g", i, f[i], want_f);
    }
    /* Philox draws: uniform in range, randint in range, deterministic */
    rn_image_stream s1, s2;
    rn_draws d1, d2;
    rn_image_stream_init(&s1, &d1, 5, 1, 2);
    rn_image_stream_init(&s2, &d2, 5, 1, 2);
    int inrange = 1, same = 1;
    for (int i = 0; i < 100; i++) {
        float a = d1.uniform(d1.ctx, 0.08f, 1.0f), b = d2.uniform(d2.ctx, 0.08f, 1.0f);
        int r = d1.randint(d1.ctx, 3, 9), q = d2.randint(d2.ctx, 3, 9);
        inrange &= a >= 0.08f && a < 1.0f && r >= 3 && r < 9;
        same &= a == b && r == q;
    }
    CHECK(inrange && same, "stream draws in range %d, repeatable %d", inrange, same);
}

int main(void) {
    python = getenv("PYTHON") ? getenv("PYTHON") : "/usr/bin/python3";
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_small_ops();
    test_region_decode();
    if (have_python()) {
        test_resize_vs_pil();
        test_rrc_vs_torchvision();
        test_jpeg_vs_pil();
    } else {
        printf("skip: PIL comparisons (%s cannot import PIL)\n", python);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return check_done("test_image");
}
