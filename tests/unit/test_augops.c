/* augops: determinism of draws and pixels, every op on c = 1 and c = 3, the ops that must leave
 * an image unchanged, known results that need no torch, and bad arguments refused with a
 * message. Pixel parity with torchvision is tests/augops.bats. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/augops.h"
#include "rn/err.h"
#include "rn/rng.h"

enum { W = 23, H = 18 };

static void fill(uint8_t *img, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i += 4) {
        uint32_t r[4];
        rn_philox(seed, 0, i, r);
        for (size_t k = 0; k < 4 && i + k < n; k++)
            img[i + k] = (uint8_t)r[k];
    }
}

static int differs(const uint8_t *a, const uint8_t *b, size_t n) { return memcmp(a, b, n) != 0; }

/* the same stream gives the same draw and the same bytes; another record another draw */
static void test_determinism(void) {
    static const char *const pol[][2] = {
        {"ta_wide", ""}, {"randaug", "2,9"}, {"autoaug", ""}, {"jitter", "0.4,0.4,0.4,0.1"}};
    uint8_t ref[W * H * 3], a[W * H * 3], b[W * H * 3];
    rn_aug_ws ws = {0};
    fill(ref, sizeof ref, 5);
    for (int k = 0; k < 4; k++) {
        rn_aug_policy p;
        CHECK_OK(rn_aug_policy_parse(pol[k][0], pol[k][1], &p));
        int changed = 0, distinct = 0;
        rn_aug_draw first = {0};
        for (uint64_t rec = 0; rec < 40; rec++) {
            rn_image_stream s1, s2;
            rn_aug_draw d1, d2;
            rn_image_stream_init(&s1, NULL, rn_rng_key(3, 1), 2, rec);
            rn_image_stream_init(&s2, NULL, rn_rng_key(3, 1), 2, rec);
            CHECK_OK(rn_aug_policy_draw(&p, &s1, W, H, &d1));
            CHECK_OK(rn_aug_policy_draw(&p, &s2, W, H, &d2));
            CHECK((int)s1.n == rn_aug_policy_words(&p), "%s: draw took %u words, header says %d", pol[k][0], s1.n,
                  rn_aug_policy_words(&p));
            CHECK(d1.n == d2.n && !memcmp(d1.op, d2.op, sizeof(int) * d1.n) &&
                      !memcmp(d1.mag, d2.mag, sizeof(double) * d1.n),
                  "%s record %d: two draws from one stream differ", pol[k][0], (int)rec);
            memcpy(a, ref, sizeof a);
            memcpy(b, ref, sizeof b);
            CHECK_OK(rn_aug_policy_apply(&p, &d1, a, W, H, 3, &ws));
            CHECK_OK(rn_aug_policy_apply(&p, &d2, b, W, H, 3, &ws));
            CHECK(!differs(a, b, sizeof a), "%s record %d: same draw, different bytes", pol[k][0], (int)rec);
            changed += differs(a, ref, sizeof a);
            if (rec == 0)
                first = d1;
            else
                distinct += d1.n != first.n || memcmp(d1.op, first.op, sizeof(int) * d1.n) ||
                            memcmp(d1.mag, first.mag, sizeof(double) * d1.n);
        }
        CHECK(changed > 5, "%s: only %d of 40 images changed", pol[k][0], changed);
        CHECK(distinct > 5, "%s: only %d of 39 draws differ from the first", pol[k][0], distinct);
    }
    rn_aug_ws_free(&ws);
}

/* every op runs on grey and colour images, odd and even sizes; the right ones change them */
static void test_every_op(void) {
    static const double mag[RN_AUG_NOPS] = {0, 0.4, -0.4, 5, -5, 30, 0.5, 0.5, -0.5, 0.9, 3, 100, 0, 0, 0, 0.2};
    rn_aug_ws ws = {0};
    for (int c = 1; c <= 3; c += 2)
        for (int s = 16; s <= 17; s++) {
            size_t n = (size_t)s * s * c;
            uint8_t *ref = malloc(n), *img = malloc(n);
            fill(ref, n, 9 + s);
            /* values 40..199, so autocontrast and equalize have something to stretch */
            for (size_t i = 0; i < n; i++)
                ref[i] = (uint8_t)(40 + ref[i] % 160);
            for (int op = 0; op < RN_AUG_NOPS; op++) {
                memcpy(img, ref, n);
                CHECK_OK(rn_aug_op(op, mag[op], img, s, s, c, &ws));
                /* Identity changes nothing; grey images have no saturation or hue */
                int same = op == RN_AUG_IDENTITY || (c == 1 && (op == RN_AUG_COLOR || op == RN_AUG_HUE));
                CHECK(differs(img, ref, n) != same, "%s on %dx%dx%d: %s", rn_aug_op_name(op), s, s, c,
                      same ? "changed the image" : "left the image unchanged");
            }
            free(ref);
            free(img);
        }
    rn_aug_ws_free(&ws);
}

/* magnitudes at which torchvision's op is the identity give the same bytes back */
static void test_identities(void) {
    static const struct {
        int op;
        double m;
    } id[] = {{RN_AUG_SHEAR_X, 0},   {RN_AUG_SHEAR_Y, 0},    {RN_AUG_TRANSLATE_X, 0}, {RN_AUG_TRANSLATE_Y, 0.9},
              {RN_AUG_ROTATE, 0},    {RN_AUG_BRIGHTNESS, 0}, {RN_AUG_COLOR, 0},       {RN_AUG_CONTRAST, 0},
              {RN_AUG_SHARPNESS, 0}, {RN_AUG_POSTERIZE, 8},  {RN_AUG_IDENTITY, 12}};
    rn_aug_ws ws = {0};
    for (int c = 1; c <= 3; c += 2) {
        uint8_t ref[W * H * 3], img[W * H * 3];
        size_t n = (size_t)W * H * c;
        fill(ref, n, 11);
        for (size_t k = 0; k < sizeof id / sizeof id[0]; k++) {
            memcpy(img, ref, n);
            CHECK_OK(rn_aug_op(id[k].op, id[k].m, img, W, H, c, &ws));
            CHECK(!differs(img, ref, n), "%s(%g) on c=%d changed the image", rn_aug_op_name(id[k].op), id[k].m, c);
        }
        /* invert twice, solarize at 256 - x on a flat image */
        memcpy(img, ref, n);
        CHECK_OK(rn_aug_op(RN_AUG_INVERT, 0, img, W, H, c, &ws));
        CHECK_OK(rn_aug_op(RN_AUG_INVERT, 0, img, W, H, c, &ws));
        CHECK(!differs(img, ref, n), "invert twice on c=%d is not the identity", c);
    }
    rn_aug_ws_free(&ws);
}

/* results known without torch */
static void test_known(void) {
    rn_aug_ws ws = {0};
    uint8_t img[4 * 4], want[4 * 4];
    for (int i = 0; i < 16; i++)
        img[i] = (uint8_t)(i * 16 + 7);
    memcpy(want, img, sizeof want);
    /* translate x by 1: column 0 becomes 0, the rest shift right */
    CHECK_OK(rn_aug_op(RN_AUG_TRANSLATE_X, 1.7, img, 4, 4, 1, &ws));
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++)
            CHECK(img[y * 4 + x] == (x ? want[y * 4 + x - 1] : 0), "translate: pixel (%d,%d) is %d", x, y,
                  img[y * 4 + x]);
    for (int i = 0; i < 16; i++)
        img[i] = (uint8_t)(100 + i);
    CHECK_OK(rn_aug_op(RN_AUG_AUTOCONTRAST, 0, img, 4, 4, 1, &ws));
    CHECK(img[0] == 0 && img[15] == 255, "autocontrast stretches 100..115 to 0..255, got %d..%d", img[0], img[15]);
    memset(img, 200, sizeof img);
    CHECK_OK(rn_aug_op(RN_AUG_SOLARIZE, 128, img, 4, 4, 1, &ws));
    CHECK(img[3] == 55, "solarize(128) of 200 is 55, got %d", img[3]);
    CHECK_OK(rn_aug_op(RN_AUG_POSTERIZE, 2, img, 4, 4, 1, &ws));
    CHECK(img[3] == 0, "posterize(2) of 55 is 0, got %d", img[3]);
    /* rotate 180 degrees of an even image is a point reflection */
    for (int i = 0; i < 16; i++)
        img[i] = (uint8_t)i;
    CHECK_OK(rn_aug_op(RN_AUG_ROTATE, 180, img, 4, 4, 1, &ws));
    for (int i = 0; i < 16; i++)
        CHECK(img[i] == 15 - i, "rotate 180: pixel %d is %d", i, img[i]);
    rn_aug_ws_free(&ws);
}

static void refused(int rc, const char *what, const char *needle) {
    CHECK(rc == RN_EINVAL, "%s: returned %d, not RN_EINVAL", what, rc);
    CHECK(strstr(rn_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what, rn_last_error(), needle);
}

static void test_bad_arguments(void) {
    uint8_t img[8 * 8 * 3] = {1};
    rn_aug_ws ws = {0};
    rn_aug_policy p;
    refused(rn_aug_op(RN_AUG_INVERT, 0, img, 8, 8, 2, &ws), "2 channels", "1 or 3");
    refused(rn_aug_op(RN_AUG_INVERT, 0, img, 0, 8, 3, &ws), "width 0", "bad image");
    refused(rn_aug_op(RN_AUG_NOPS, 0, img, 8, 8, 3, &ws), "op out of range", "unknown op");
    refused(rn_aug_op(RN_AUG_POSTERIZE, 9, img, 8, 8, 3, &ws), "posterize 9", "[0, 8]");
    refused(rn_aug_op(RN_AUG_SOLARIZE, 256, img, 8, 8, 3, &ws), "solarize 256", "above 255");
    refused(rn_aug_op(RN_AUG_BRIGHTNESS, -1.5, img, 8, 8, 3, &ws), "brightness factor -0.5", "non-negative");
    refused(rn_aug_op(RN_AUG_HUE, 0.6, img, 8, 8, 3, &ws), "hue 0.6", "[-0.5, 0.5]");
    refused(rn_aug_adjust(RN_AUG_INVERT, 1, img, 8, 8, 3, &ws), "adjust invert", "not an adjustment");
    refused(rn_aug_op(RN_AUG_ROTATE, 10, img, 8, 8, 3, NULL), "no workspace", "workspace");
    refused(rn_aug_policy_parse("nosuch", "", &p), "policy nosuch", "unknown augmentation policy 'nosuch'");
    refused(rn_aug_policy_parse("randaug", "2", &p), "randaug 2", "NUM_OPS,MAGNITUDE");
    refused(rn_aug_policy_parse("randaug", "2,31", &p), "randaug 2,31", "magnitude 31");
    refused(rn_aug_policy_parse("randaug", "17,9", &p), "randaug 17,9", "num_ops 17");
    refused(rn_aug_policy_parse("randaug", "2,9x", &p), "randaug 2,9x", "bad arguments");
    refused(rn_aug_policy_parse("ta_wide", "1", &p), "ta_wide 1", "magnitude bins");
    refused(rn_aug_policy_parse("ta_wide", "2.5", &p), "ta_wide 2.5", "bad arguments");
    refused(rn_aug_policy_parse("autoaug", "cifar10", &p), "autoaug cifar10", "only imagenet");
    refused(rn_aug_policy_parse("jitter", "0.4,0.4,0.4,0.6", &p), "jitter hue 0.6", "hue");
    refused(rn_aug_policy_parse("jitter", "-0.1", &p), "jitter -0.1", "brightness");
    refused(rn_aug_policy_parse("jitter", "", &p), "jitter without values", "bad arguments");
    /* defaults are torchvision's */
    CHECK_OK(rn_aug_policy_parse("randaug", NULL, &p));
    CHECK(p.num_ops == 2 && p.magnitude == 9 && p.bins == 31, "randaug defaults %d,%d,%d", p.num_ops, p.magnitude,
          p.bins);
    CHECK_OK(rn_aug_policy_parse("trivialaugment", "", &p));
    CHECK(p.kind == RN_AUG_TA_WIDE && p.bins == 31, "ta_wide default bins %d", p.bins);
    rn_aug_ws_free(&ws);
}

int main(void) {
    test_determinism();
    test_every_op();
    test_identities();
    test_known();
    test_bad_arguments();
    return check_done("test_augops");
}
