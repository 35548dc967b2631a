/* The --augment chain: the parser (good and bad chains, their messages, the old
 * spellings), the canonical form, crop-pad's pixels against hand-made padding, and the
 * erase box sampler's bounds. Distributions against torchvision: tests/parity.bats. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/augment.h"
#include "rn/augops.h"
#include "rn/err.h"
#include "rn/image.h"
#include "rn/rng.h"

static int same_chain(const rn_augment *a, const rn_augment *b) {
    if (a->n != b->n) return 0;
    for (int k = 0; k < a->n; k++) {
        if (a->step[k].op != b->step[k].op) return 0;
        for (int v = 0; v < RN_AUG_NVAL; v++)
            if (a->step[k].v[v] != b->step[k].v[v]) return 0;
    }
    return 1;
}

static void good(const char *text, const char *want) {
    rn_augment a;
    int rc = rn_augment_parse(text, &a);
    CHECK(rc == RN_OK, "'%s' refused: %s", text, rn_last_error());
    if (rc) return;
    char got[1024];
    rn_augment_format(&a, got, sizeof got);
    CHECK(strcmp(got, want) == 0, "'%s' reads as\n  %s\nwant\n  %s", text, got, want);
    /* the canonical form parses back to the same chain */
    rn_augment b;
    CHECK_OK(rn_augment_parse(got, &b));
    CHECK(same_chain(&a, &b), "'%s' does not read back as itself", got);
}

static void bad(const char *text, const char *part) {
    rn_augment a;
    int rc = rn_augment_parse(text, &a);
    CHECK(rc == RN_EINVAL, "'%s' accepted (rc %d)", text, rc);
    CHECK(strstr(rn_last_error(), part) != NULL, "'%s': message '%s' lacks '%s'", text, rn_last_error(), part);
}

#define RRC_DEF "rrc:scale=0.08-1:ratio=0.75-1.3333333333333333"
#define FLIP_DEF "flip:p=0.5"

static void test_parse(void) {
    /* the old spellings keep their meaning */
    good("standard", RRC_DEF "," FLIP_DEF);
    good("rrc", RRC_DEF "," FLIP_DEF);
    good("none", "none");
    rn_augment a, d;
    rn_augment_default(&d);
    CHECK_OK(rn_augment_parse("rrc,flip", &a));
    CHECK(same_chain(&a, &d), "rrc,flip is not the default chain");
    /* chains, main values, keys, ranges, bare words */
    good("rrc,flip=0", RRC_DEF ",flip:p=0");
    good("rrc:scale=0.35-1,flip,erase=0.25", "rrc:scale=0.35-1:ratio=0.75-1.3333333333333333," FLIP_DEF
                                             ",erase:p=0.25:scale=0.02-0.33:ratio=0.3-3.3:value=0");
    good("crop-pad=4,flip", "crop-pad:pad=4:mode=constant:fill=0," FLIP_DEF);
    good("crop-pad=4:reflect,flip", "crop-pad:pad=4:mode=reflect:fill=0," FLIP_DEF);
    good("crop-pad=4:mode=edge", "crop-pad:pad=4:mode=edge:fill=0");
    good("crop-pad:pad=2:fill=128", "crop-pad:pad=2:mode=constant:fill=128");
    good("flip", FLIP_DEF);
    good("flip=1", "flip:p=1");
    good("erase", "erase:p=0.5:scale=0.02-0.33:ratio=0.3-3.3:value=0");
    good("erase=0.1:random:scale=0.1-0.2:ratio=1e-1-10", "erase:p=0.1:scale=0.1-0.2:ratio=0.1-10:value=random");
    good("rrc:ratio=0.5-2:scale=0.25-0.5", "rrc:scale=0.25-0.5:ratio=0.5-2");
    /* the pixel ops (rn/augops.h policies) */
    good("rrc,flip,ta_wide,erase=0.1", RRC_DEF "," FLIP_DEF ",ta_wide:bins=31,erase:p=0.1:scale=0.02-0.33:ratio=0.3-3.3:value=0");
    good("ta_wide:bins=5", "ta_wide:bins=5");
    good("randaug", "randaug:n=2:m=9:bins=31");
    good("randaug=1:m=30", "randaug:n=1:m=30:bins=31");
    good("autoaug", "autoaug:policy=imagenet");
    good("autoaug:imagenet", "autoaug:policy=imagenet");
    good("jitter:brightness=0.4:contrast=0.4:saturation=0.4:hue=0.1",
         "jitter:brightness=0.4:contrast=0.4:saturation=0.4:hue=0.1");
    good("crop-pad=4,flip,jitter:hue=0.5,randaug", "crop-pad:pad=4:mode=constant:fill=0," FLIP_DEF
                                                 ",jitter:brightness=0:contrast=0:saturation=0:hue=0.5,randaug:n=2:m=9:bins=31");
    {
        rn_augment c;
        rn_aug_policy p;
        CHECK_OK(rn_augment_parse("randaug=3:m=7:bins=11", &c));
        CHECK_OK(rn_augment_policy(&c.step[0], &p));
        CHECK(p.kind == RN_AUG_RANDAUG && p.num_ops == 3 && p.magnitude == 7 && p.bins == 11, "randaug policy");
        CHECK_OK(rn_augment_parse("jitter:brightness=0.4:hue=0.1", &c));
        CHECK_OK(rn_augment_policy(&c.step[0], &p));
        CHECK(p.kind == RN_AUG_JITTER && p.jitter[0] == 0.4f && p.jitter[1] == 0 && p.jitter[3] == 0.1f,
              "jitter policy");
        CHECK(rn_augment_policy(&d.step[0], &p) == RN_EINVAL, "rrc is not a pixel op");
    }
    /* bad chains: each message names what is wrong and what is known */
    bad("", "empty chain");
    bad("rrc,,flip", "empty op");
    bad("rrc,", "empty op");
    bad("mixup", "'mixup' is not an op: known ops are rrc, crop-pad, flip, ta_wide, randaug, autoaug, jitter, erase");
    bad("Flip", "'Flip' is not an op");
    bad("flip=2", "p 2 is outside 0..1");
    bad("flip=x", "p 'x' is not a number");
    bad("flip=0.5:q=1", "flip has no parameter 'q': its parameters are p");
    bad("rrc=0.5", "rrc takes no value after '='");
    bad("rrc:scale=0.5", "scale '0.5' is not a range LO-HI");
    bad("rrc:scale=0.9-0.2", "want 0 < LO <= HI <= 1");
    bad("rrc:scale=0-1", "want 0 < LO <= HI <= 1");
    bad("rrc:ratio=2-1", "ratio 2-1");
    bad("crop-pad=-1", "outside 0..4096");
    bad("crop-pad=2.5", "is not a whole number");
    bad("crop-pad=4:mirror", "mode 'mirror' is not constant or edge or reflect");
    bad("crop-pad=4:fill=256", "fill 256 is outside 0..255");
    bad("erase:value=1", "value '1' is not 0 or random");
    bad("flip:random", "flip: 'random' is not KEY=VALUE");
    bad("rrc,crop-pad=4", "at most one crop op");
    bad("flip,rrc", "rrc after flip: the order is a crop op");
    bad("erase,flip", "flip after erase");
    bad("flip,flip", "flip appears twice");
    bad("none,flip", "'none' is not an op");
    bad("standard,erase", "'standard' is not an op");
    bad("ta_wide,flip", "flip after ta_wide");
    bad("erase,randaug", "randaug after erase");
    bad("ta_wide:bins=1", "bins 1 is outside 2..1024");
    bad("randaug:m=31", "randaug: m 31 is not a bin of 0..30");
    bad("randaug=17", "n 17 is outside 0..16");
    bad("jitter:hue=0.6", "hue 0.6 is outside 0..0.5");
    bad("jitter:brightness=-1", "brightness -1 is outside");
    bad("autoaug:cifar10", "policy 'cifar10' is not imagenet");
    bad("ta_wide,ta_wide", "ta_wide appears twice");
    CHECK(rn_augment_find(&d, RN_AUG_OP_ERASE) == NULL && rn_augment_find(&d, RN_AUG_OP_FLIP) == &d.step[1],
          "rn_augment_find");
    CHECK(strcmp(rn_augment_op_name(RN_AUG_OP_CROP_PAD), "crop-pad") == 0, "op name");
}

/* crop-pad's pixels: against the padded image built by hand, every mode, with and
 * without flip, at every offset */
static void test_crop_pad(void) {
    const int w = 7, h = 5, c = 3, pad = 3, S = 6;
    uint8_t src[7 * 5 * 3], padded[13 * 11 * 3], got[6 * 6 * 3];
    for (int k = 0; k < w * h * c; k++)
        src[k] = (uint8_t)(k * 37 + 11);
    const int PW = w + 2 * pad, PH = h + 2 * pad;
    int bad = 0;
    for (int mode = 0; mode < 3; mode++) {
        for (int y = 0; y < PH; y++)
            for (int x = 0; x < PW; x++) {
                int sy = y - pad, sx = x - pad;
                int in = sx >= 0 && sx < w && sy >= 0 && sy < h;
                if (mode == RN_AUG_PAD_EDGE)
                    sx = sx < 0 ? 0 : sx >= w ? w - 1 : sx, sy = sy < 0 ? 0 : sy >= h ? h - 1 : sy;
                if (mode == RN_AUG_PAD_REFLECT) {
                    sx = sx < 0 ? -sx : sx >= w ? 2 * w - 2 - sx : sx;
                    sy = sy < 0 ? -sy : sy >= h ? 2 * h - 2 - sy : sy;
                }
                for (int ch = 0; ch < c; ch++)
                    padded[(y * PW + x) * c + ch] =
                        mode == RN_AUG_PAD_CONSTANT && !in ? 9 : src[(sy * w + sx) * c + ch];
            }
        for (int i = 0; i + S <= PH; i++)
            for (int j = 0; j + S <= PW; j++)
                for (int flip = 0; flip < 2; flip++) {
                    rn_aug_crop_pad(src, w, h, c, pad, mode, 9, i, j, S, flip, got);
                    for (int y = 0; y < S; y++)
                        for (int x = 0; x < S; x++)
                            for (int ch = 0; ch < c; ch++) {
                                int sx = flip ? S - 1 - x : x;
                                bad += got[(y * S + x) * c + ch] != padded[((i + y) * PW + j + sx) * c + ch];
                            }
                }
    }
    CHECK(bad == 0, "crop-pad: %d pixels differ from the hand-padded image", bad);
}

/* the samplers' bounds over many draws */
static void test_samplers(void) {
    int out = 0, erased = 0, seen_hi = 0;
    for (uint32_t r = 0; r < 20000; r++) {
        rn_image_stream st;
        rn_draws d;
        rn_image_stream_init(&st, &d, rn_rng_key(1, 2), 0, r);
        int i, j, b[4];
        CHECK(rn_aug_crop_offsets(32, 30, 4, 32, &d, &i, &j) == 0, "crop offsets");
        out += i < 0 || i > 6 || j < 0 || j > 8;
        seen_hi |= (i == 6) | (j == 8) << 1;
        rn_aug_erase_box(32, 24, 0.02, 0.33, 0.3, 3.3, &d, b);
        if (b[2]) {
            erased++;
            out += b[0] < 0 || b[1] < 0 || b[2] >= 32 || b[3] >= 24 || b[0] + b[2] > 32 || b[1] + b[3] > 24;
        }
    }
    rn_image_stream st;
    rn_draws d;
    rn_image_stream_init(&st, &d, 1, 0, 0);
    int i, j;
    CHECK(rn_aug_crop_offsets(10, 10, 2, 15, &d, &i, &j) == -1, "a padded image smaller than the crop accepted");
    CHECK(out == 0, "%d draws outside their bounds", out);
    CHECK(seen_hi == 3, "the largest offsets never drawn");
    CHECK(erased > 19000, "only %d of 20000 erase boxes found a place", erased);
}

static void test_erase_value(void) {
    /* element-keyed: the same value for the same (key, epoch, rec, element) only */
    float a = rn_erase_value(7, 1, 3, 10), b = rn_erase_value(7, 1, 3, 10);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "erase value not a function of its key");
    CHECK(rn_erase_value(7, 2, 3, 10) != a && rn_erase_value(7, 1, 4, 10) != a && rn_erase_value(7, 1, 3, 11) != a &&
              rn_erase_value(8, 1, 3, 10) != a,
          "erase value ignores part of its key");
    double s = 0, q = 0;
    int n = 200000;
    for (int e = 0; e < n; e++) {
        double v = rn_erase_value(5, 0, (uint32_t)(e / 1000), (uint32_t)e);
        s += v, q += v * v;
    }
    double mean = s / n, var = q / n - mean * mean;
    CHECK(fabs(mean) < 0.01 && fabs(var - 1) < 0.01, "erase values: mean %g variance %g", mean, var);
}

int main(void) {
    test_parse();
    test_crop_pad();
    test_samplers();
    test_erase_value();
    return check_done("test_augment");
}
