/* torchvision's pixel augmentations on u8 HWC images and its random policies (see rn/augops.h).
 *
 * The float code mirrors torchvision.transforms.functional_tensor op by op, in float32 and in
 * the same order, because uint8 results are truncated: a different rounding of one product
 * moves a pixel by a grey level. The build compiles C11 without FP contraction, so no product
 * is fused into an FMA that torch does not fuse. */
#include "rn/augops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/rng.h"

static const char *const op_names[RN_AUG_NOPS] = {
    "Identity", "ShearX",    "ShearY",    "TranslateX", "TranslateY",   "Rotate",   "Brightness", "Color",
    "Contrast", "Sharpness", "Posterize", "Solarize",   "AutoContrast", "Equalize", "Invert",     "Hue"};

const char *rn_aug_op_name(int op) { return op >= 0 && op < RN_AUG_NOPS ? op_names[op] : NULL; }

void rn_aug_ws_free(rn_aug_ws *ws) {
    if (!ws) return;
    free(ws->buf);
    ws->buf = NULL;
    ws->cap = 0;
}

/* a copy of img in ws */
static int copy_in(rn_aug_ws *ws, const uint8_t *img, size_t n, uint8_t **out) {
    if (!ws) return rn_errorf(RN_EINVAL, "augops: no workspace given (pass a zeroed rn_aug_ws)");
    if (ws->cap < n) {
        uint8_t *p = realloc(ws->buf, n);
        if (!p) return rn_errorf(RN_ENOMEM, "augops: workspace of %zu bytes", n);
        ws->buf = p;
        ws->cap = n;
    }
    memcpy(ws->buf, img, n);
    *out = ws->buf;
    return RN_OK;
}

static inline uint8_t to_u8(float v) { /* .clamp(0, 255).to(uint8): clamp, then truncate */
    if (!(v > 0.0f)) return 0;
    if (v > 255.0f) return 255;
    return (uint8_t)v;
}

/* _blend(img1, img2, ratio) for one value: ratio * a + (1.0 - ratio) * b in float32, with
 * (1.0 - ratio) computed in double first as Python does */
typedef struct {
    float r, q;
} blendk;
static blendk blend_k(double ratio) { return (blendk){(float)ratio, (float)(1.0 - ratio)}; }
static inline uint8_t blend(blendk k, float a, float b) { return to_u8(k.r * a + k.q * b); }

/* rgb_to_grayscale on uint8: (0.2989 r + 0.587 g + 0.114 b).to(uint8); the products come from
 * tables (the same float32 values), the sums in torch's order */
typedef struct {
    float r[256], g[256], b[256];
} greyk;
static void grey_k(greyk *k) {
    for (int v = 0; v < 256; v++)
        k->r[v] = 0.2989f * (float)v, k->g[v] = 0.587f * (float)v, k->b[v] = 0.114f * (float)v;
}
static inline uint8_t grey(const greyk *k, const uint8_t *p) { return (uint8_t)(k->r[p[0]] + k->g[p[1]] + k->b[p[2]]); }

/* a table of blend(k, v, b) for every v at a fixed b */
static void blend_lut(blendk k, float b, uint8_t lut[256]) {
    for (int v = 0; v < 256; v++)
        lut[v] = blend(k, (float)v, b);
}

/* tables of the two products of _blend, ratio * a and (1 - ratio) * b, for u8 a and b */
typedef struct {
    float a[256], b[256];
} blendtab;
static void blend_tab(blendk k, blendtab *t) {
    for (int v = 0; v < 256; v++)
        t->a[v] = k.r * (float)v, t->b[v] = k.q * (float)v;
}

static void apply_lut(uint8_t *img, size_t n, const uint8_t lut[256]) {
    for (size_t i = 0; i < n; i++)
        img[i] = lut[img[i]];
}

static void brightness(uint8_t *img, size_t n, double f) {
    uint8_t lut[256];
    blend_lut(blend_k(f), 0.0f, lut);
    apply_lut(img, n, lut);
}

static void saturation(uint8_t *img, size_t npix, int c, double f) {
    if (c == 1) return;
    greyk gk;
    blendtab t;
    grey_k(&gk);
    blend_tab(blend_k(f), &t);
    for (size_t i = 0; i < npix; i++, img += 3) {
        float g = t.b[grey(&gk, img)];
        for (int ch = 0; ch < 3; ch++)
            img[ch] = to_u8(t.a[img[ch]] + g);
    }
}

static void contrast(uint8_t *img, size_t npix, int c, double f) {
    /* torch.mean: a float32 sum (exact while below 2^24, i.e. up to 256 x 256 pixels) over N */
    uint64_t sum = 0;
    if (c == 3) {
        greyk gk;
        grey_k(&gk);
        for (size_t i = 0; i < npix; i++)
            sum += grey(&gk, img + 3 * i);
    } else {
        for (size_t i = 0; i < npix; i++)
            sum += img[i];
    }
    float mean = (float)sum / (float)npix;
    uint8_t lut[256];
    blend_lut(blend_k(f), mean, lut);
    apply_lut(img, npix * c, lut);
}

/* _blurred_degenerate_image: 3x3 kernel [1 1 1; 1 5 1; 1 1 1] / 13 inside, rounded; border kept.
 * The exact value k/13 is never within 1/26 of a half, so rounding the integer sum is exact. */
static int sharpness(uint8_t *img, int w, int h, int c, double f, rn_aug_ws *ws) {
    if (w <= 2 || h <= 2) return RN_OK;
    uint8_t *src;
    int rc = copy_in(ws, img, (size_t)w * h * c, &src);
    if (rc != RN_OK) return rc;
    blendtab t;
    blend_tab(blend_k(f), &t);
    uint8_t same[256];
    for (int v = 0; v < 256; v++)
        same[v] = to_u8(t.a[v] + t.b[v]);
    size_t row = (size_t)w * c;
    for (int y = 0; y < h; y++) {
        const uint8_t *s = src + y * row;
        uint8_t *o = img + y * row;
        if (y == 0 || y == h - 1) {
            apply_lut(o, row, same);
            continue;
        }
        for (int ch = 0; ch < c; ch++)
            o[ch] = same[s[ch]], o[row - c + ch] = same[s[row - c + ch]];
        for (size_t i = (size_t)c; i < row - c; i++) {
            const uint8_t *u = s + i - row, *d = s + i + row;
            int sum = u[-c] + u[0] + u[c] + s[i - c] + 5 * s[i] + s[i + c] + d[-c] + d[0] + d[c];
            o[i] = to_u8(t.a[s[i]] + t.b[(2 * sum + 13) / 26]);
        }
    }
    return RN_OK;
}

static void posterize(uint8_t *img, size_t n, int bits) {
    uint8_t mask = (uint8_t)(-(1 << (8 - bits)));
    for (size_t i = 0; i < n; i++)
        img[i] &= mask;
}

static void solarize(uint8_t *img, size_t n, double thr) {
    float t = (float)thr; /* the comparison is float32: u8 promoted, threshold rounded */
    uint8_t lut[256];
    for (int v = 0; v < 256; v++)
        lut[v] = (float)v >= t ? (uint8_t)(255 - v) : (uint8_t)v;
    apply_lut(img, n, lut);
}

static void invert(uint8_t *img, size_t n) {
    for (size_t i = 0; i < n; i++)
        img[i] = (uint8_t)(255 - img[i]);
}

static void autocontrast(uint8_t *img, size_t npix, int c) {
    for (int ch = 0; ch < c; ch++) {
        int lo = 255, hi = 0;
        for (size_t i = 0; i < npix; i++) {
            int v = img[i * c + ch];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        float mn = (float)lo, scale = 1.0f;
        if (hi > lo)
            scale = (1.0f / ((float)hi - (float)lo)) * 255.0f; /* Tensor.__rtruediv__: reciprocal, times */
        else
            mn = 0.0f; /* torchvision: a non-finite scale becomes 1 and the minimum 0 */
        uint8_t lut[256];
        for (int v = 0; v < 256; v++)
            lut[v] = to_u8(((float)v - mn) * scale);
        for (size_t i = 0; i < npix; i++)
            img[i * c + ch] = lut[img[i * c + ch]];
    }
}

/* _scale_channel: PIL's equalize with torch's integer arithmetic */
static void equalize(uint8_t *img, size_t npix, int c) {
    for (int ch = 0; ch < c; ch++) {
        int64_t hist[256] = {0}, lut[256];
        for (size_t i = 0; i < npix; i++)
            hist[img[i * c + ch]]++;
        int last = 255;
        while (last > 0 && hist[last] == 0)
            last--;
        int64_t nz = 0; /* sum of the nonzero bins but the last */
        for (int v = 0; v < last; v++)
            nz += hist[v];
        int64_t step = nz / 255;
        if (step == 0) continue;
        int64_t cum = 0;
        for (int v = 0; v < 256; v++) {
            int64_t l = v == 0 ? 0 : (cum + step / 2) / step;
            lut[v] = l > 255 ? 255 : l;
            cum += hist[v];
        }
        for (size_t i = 0; i < npix; i++)
            img[i * c + ch] = (uint8_t)lut[img[i * c + ch]];
    }
}

static inline float clamp01(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }

/* _rgb2hsv and the hue shift for n <= 64 pixels held as floats in r, g, b; writes h, s (v is
 * max(r, g, b)). Element-wise IEEE operations only, so the vectorised loop gives the scalar bytes. */
enum { HUE_BLOCK = 64 };
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math"))) static void
rgb2hsv_shift(int n, const float *restrict r, const float *restrict g, const float *restrict b, float hfac,
              float *restrict h, float *restrict s, float *restrict v) {
    for (int i = 0; i < n; i++) {
        /* no NaNs here, so plain comparisons stand in for max/min */
        float maxc = r[i] > g[i] ? r[i] : g[i], minc = r[i] < g[i] ? r[i] : g[i];
        maxc = b[i] > maxc ? b[i] : maxc;
        minc = b[i] < minc ? b[i] : minc;
        int eqc = maxc == minc;
        float cr = maxc - minc;
        s[i] = cr / (eqc ? 1.0f : maxc);
        float crd = eqc ? 1.0f : cr;
        /* torch adds the three masked terms; two are zero, so only the selected one counts */
        float rc = (maxc - r[i]) / crd, gc = (maxc - g[i]) / crd, bc = (maxc - b[i]) / crd;
        float hr = bc - gc, hg = 2.0f + rc - bc, hb = 4.0f + gc - rc;
        float hsum = maxc == r[i] ? hr : maxc == g[i] ? hg : hb;
        /* fmod(h / 6 + 1, 1) and Python's (h + hue) % 1: on these ranges one exact subtraction
         * (Sterbenz) or, below 0, the same rounded + 1 that the modulo adds */
        float hh = hsum / 6.0f + 1.0f;
        hh = hh >= 1.0f ? hh - 1.0f : hh;
        hh = hh + hfac;
        hh = hh >= 1.0f ? hh - 1.0f : hh;
        h[i] = hh < 0.0f ? hh + 1.0f : hh;
        v[i] = maxc;
    }
}

static int hue(uint8_t *img, size_t npix, int c, double hf) {
    if (c == 1) return RN_OK;
    float hfac = (float)hf, u[256];
    for (int v = 0; v < 256; v++)
        u[v] = (float)v / 255.0f;
    static const int sel[6][3] = {{0, 3, 2}, {1, 0, 2}, {2, 0, 3}, {2, 1, 0}, {3, 2, 0}, {0, 2, 1}};
    float R[HUE_BLOCK], G[HUE_BLOCK], B[HUE_BLOCK], Hh[HUE_BLOCK], Ss[HUE_BLOCK], Vv[HUE_BLOCK];
    for (size_t i0 = 0; i0 < npix; i0 += HUE_BLOCK) {
        int n = npix - i0 < HUE_BLOCK ? (int)(npix - i0) : HUE_BLOCK;
        uint8_t *px = img + 3 * i0;
        for (int i = 0; i < n; i++)
            R[i] = u[px[3 * i]], G[i] = u[px[3 * i + 1]], B[i] = u[px[3 * i + 2]];
        rgb2hsv_shift(n, R, G, B, hfac, Hh, Ss, Vv);
        for (int i = 0; i < n; i++) {
            /* _hsv2rgb */
            float v = Vv[i], s = Ss[i], h6 = Hh[i] * 6.0f;
            int ii = (int)h6; /* floor: h6 >= 0 */
            float fr = h6 - (float)ii;
            ii %= 6;
            float vals[4] = {v, clamp01(v * (1.0f - s * fr)), clamp01(v * (1.0f - s)),
                             clamp01(v * (1.0f - s * (1.0f - fr)))};
            for (int ch = 0; ch < 3; ch++)
                px[3 * i + ch] = (uint8_t)(vals[sel[ii][ch]] * 255.0f);
        }
    }
    return RN_OK;
}

/* torchvision's _get_inverse_affine_matrix (double) */
static void inverse_affine(double cx, double cy, double angle, double tx, double ty, double shx, double shy,
                           double m[6]) {
    const double d2r = M_PI / 180.0;
    double rot = angle * d2r, sx = shx * d2r, sy = shy * d2r;
    double a = cos(rot - sy) / cos(sy);
    double b = -cos(rot - sy) * tan(sx) / cos(sy) - sin(rot);
    double c = sin(rot - sy) / cos(sy);
    double d = -sin(rot - sy) * tan(sx) / cos(sy) + cos(rot);
    m[0] = d, m[1] = -b, m[2] = 0.0, m[3] = -c, m[4] = a, m[5] = 0.0;
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
}

/* nearbyintf (round half to even) without a libm call: adding and removing 1.5 * 2^23 leaves
 * the float rounded to an integer for |x| < 2^22 */
static inline float round_even(float x) {
    if (!(fabsf(x) < 4194304.0f)) return nearbyintf(x);
    float y = x + 12582912.0f; /* not folded: C11 without -ffast-math keeps IEEE semantics */
    return y - 12582912.0f;
}

/* the sampling loop; fmaf is one correctly rounded operation wherever it runs, so the FMA-instruction
 * build below gives the same bytes, only without a libm call per pixel */
#define AFFINE_LOOP(FMA)                                                                                               \
    for (int y = 0; y < h; y++) {                                                                                      \
        float yf = (float)(y + 0.5 - h * 0.5);                                                                         \
        uint8_t *restrict o = img + (size_t)y * w * c;                                                                 \
        for (int x = 0; x < w; x++, o += c) {                                                                          \
            float xf = (float)(x + 0.5 - w * 0.5);                                                                     \
            float gx = FMA(yf, a1, xf * a0) + a2;                                                                      \
            float gy = FMA(yf, b1, xf * b0) + b2;                                                                      \
            float fx = round_even((gx + 1.0f) * sw - 0.5f);                                                            \
            float fy = round_even((gy + 1.0f) * sh - 0.5f);                                                            \
            if (fx >= 0.0f && fx < fw && fy >= 0.0f && fy < fh) {                                                      \
                const uint8_t *restrict p = src + ((size_t)(int)fy * w + (size_t)(int)fx) * c;                         \
                uint8_t v0 = p[0], v1 = c == 3 ? p[1] : 0, v2 = c == 3 ? p[2] : 0;                                     \
                o[0] = v0;                                                                                             \
                if (c == 3) o[1] = v1, o[2] = v2;                                                                      \
            } else {                                                                                                   \
                o[0] = 0;                                                                                              \
                if (c == 3) o[1] = 0, o[2] = 0;                                                                        \
            }                                                                                                          \
        }                                                                                                              \
    }

typedef struct {
    float a0, a1, a2, b0, b1, b2, sw, sh;
} affk;

static void affine_loop(uint8_t *restrict img, const uint8_t *restrict src, int w, int h, int c, affk k) {
    float a0 = k.a0, a1 = k.a1, a2 = k.a2, b0 = k.b0, b1 = k.b1, b2 = k.b2, sw = k.sw, sh = k.sh;
    float fw = (float)w, fh = (float)h;
    AFFINE_LOOP(fmaf)
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("fma"))) static void affine_loop_fma(uint8_t *restrict img, const uint8_t *restrict src, int w,
                                                           int h, int c, affk k) {
    float a0 = k.a0, a1 = k.a1, a2 = k.a2, b0 = k.b0, b1 = k.b1, b2 = k.b2, sw = k.sw, sh = k.sh;
    float fw = (float)w, fh = (float)h;
    AFFINE_LOOP(__builtin_fmaf)
}
#endif

/* F_t.affine with NEAREST and zero fill: _gen_affine_grid (float32 theta rescaled by half the
 * size, base grid at pixel centres) then grid_sample(align_corners=False), which unnormalises
 * x as (gx + 1) * (w / 2) - 0.5 and rounds half to even. torch forms the grid with a float32
 * GEMM whose rounding is its BLAS kernel's: OpenBLAS's Haswell kernel computes
 * fma(y, t1, x * t0) + t2, the same here, so sampling positions within rounding of a half
 * pixel (shear 1/15 hits them) fall the same way; other kernels (SkylakeX's) may round them
 * the other way. tests/parity/augops_parity.py forms torch's grid in this order. */
static int affine(uint8_t *img, int w, int h, int c, const double m[6], rn_aug_ws *ws) {
    uint8_t *src;
    int rc = copy_in(ws, img, (size_t)w * h * c, &src);
    if (rc != RN_OK) return rc;
    float hw = (float)(0.5 * w), hh = (float)(0.5 * h);
    affk k = {(float)m[0] / hw, (float)m[1] / hw, (float)m[2] / hw, (float)m[3] / hh,
              (float)m[4] / hh, (float)m[5] / hh, (float)w / 2.0f,  (float)h / 2.0f};
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("fma")) {
        affine_loop_fma(img, src, w, h, c, k);
        return RN_OK;
    }
#endif
    affine_loop(img, src, w, h, c, k);
    return RN_OK;
}

static int check_image(const char *what, const uint8_t *img, int w, int h, int c) {
    if (!img || w <= 0 || h <= 0 || w > (1 << 15) || h > (1 << 15))
        return rn_errorf(RN_EINVAL, "augops: %s: bad image %dx%d (need 1..32768 pixels a side)", what, w, h);
    if (c != 1 && c != 3)
        return rn_errorf(RN_EINVAL, "augops: %s: %d channels (torchvision's ops take 1 or 3)", what, c);
    return RN_OK;
}

int rn_aug_adjust(int op, double f, uint8_t *img, int w, int h, int c, rn_aug_ws *ws) {
    const char *name = rn_aug_op_name(op);
    if (op != RN_AUG_BRIGHTNESS && op != RN_AUG_COLOR && op != RN_AUG_CONTRAST && op != RN_AUG_SHARPNESS &&
        op != RN_AUG_HUE)
        return rn_errorf(RN_EINVAL,
                         "augops: op %d (%s) is not an adjustment (Brightness, Color, Contrast, "
                         "Sharpness or Hue)",
                         op, name ? name : "unknown");
    int rc = check_image(name, img, w, h, c);
    if (rc != RN_OK) return rc;
    size_t npix = (size_t)w * h;
    if (op == RN_AUG_HUE) {
        if (!(f >= -0.5 && f <= 0.5))
            return rn_errorf(RN_EINVAL, "augops: Hue: hue_factor %g is not in [-0.5, 0.5]", f);
        return hue(img, npix, c, f);
    }
    if (!(f >= 0.0) || isinf(f))
        return rn_errorf(RN_EINVAL, "augops: %s: factor %g is not a finite non-negative number", name, f);
    switch (op) {
    case RN_AUG_BRIGHTNESS: brightness(img, npix * c, f); return RN_OK;
    case RN_AUG_COLOR: saturation(img, npix, c, f); return RN_OK;
    case RN_AUG_CONTRAST: contrast(img, npix, c, f); return RN_OK;
    default: return sharpness(img, w, h, c, f, ws);
    }
}

int rn_aug_op(int op, double mag, uint8_t *img, int w, int h, int c, rn_aug_ws *ws) {
    const char *name = rn_aug_op_name(op);
    if (!name) return rn_errorf(RN_EINVAL, "augops: unknown op %d (0..%d)", op, RN_AUG_NOPS - 1);
    int rc = check_image(name, img, w, h, c);
    if (rc != RN_OK) return rc;
    if (!isfinite(mag)) return rn_errorf(RN_EINVAL, "augops: %s: magnitude %g is not finite", name, mag);
    size_t npix = (size_t)w * h;
    double m[6];
    switch (op) {
    case RN_AUG_IDENTITY: return RN_OK;
    case RN_AUG_SHEAR_X:
    case RN_AUG_SHEAR_Y: {
        double deg = atan(mag) * (180.0 / M_PI);
        /* centre [0, 0] in pixels: the top-left corner, -size/2 in the centred frame */
        inverse_affine(-0.5 * w, -0.5 * h, 0.0, 0.0, 0.0, op == RN_AUG_SHEAR_X ? deg : 0.0,
                       op == RN_AUG_SHEAR_Y ? deg : 0.0, m);
        return affine(img, w, h, c, m, ws);
    }
    case RN_AUG_TRANSLATE_X:
    case RN_AUG_TRANSLATE_Y: {
        double t = trunc(mag); /* int(magnitude) */
        inverse_affine(0.0, 0.0, 0.0, op == RN_AUG_TRANSLATE_X ? t : 0.0, op == RN_AUG_TRANSLATE_Y ? t : 0.0, 0.0, 0.0,
                       m);
        return affine(img, w, h, c, m, ws);
    }
    case RN_AUG_ROTATE: inverse_affine(0.0, 0.0, -mag, 0.0, 0.0, 0.0, 0.0, m); return affine(img, w, h, c, m, ws);
    case RN_AUG_BRIGHTNESS:
    case RN_AUG_COLOR:
    case RN_AUG_CONTRAST:
    case RN_AUG_SHARPNESS: return rn_aug_adjust(op, 1.0 + mag, img, w, h, c, ws);
    case RN_AUG_HUE: return rn_aug_adjust(op, mag, img, w, h, c, ws);
    case RN_AUG_POSTERIZE: {
        double bits = trunc(mag);
        if (!(bits >= 0 && bits <= 8)) return rn_errorf(RN_EINVAL, "augops: Posterize: bits %g is not in [0, 8]", mag);
        posterize(img, npix * c, (int)bits);
        return RN_OK;
    }
    case RN_AUG_SOLARIZE:
        if (!(mag <= 255.0))
            return rn_errorf(RN_EINVAL, "augops: Solarize: threshold %g is above 255, the bound of u8", mag);
        solarize(img, npix * c, mag);
        return RN_OK;
    case RN_AUG_AUTOCONTRAST: autocontrast(img, npix, c); return RN_OK;
    case RN_AUG_EQUALIZE: equalize(img, npix, c); return RN_OK;
    default: invert(img, npix * c); return RN_OK;
    }
}

/* ---- policies ---- */

#define AA_N 25
/* AutoAugment's ImageNet policy: (op, probability, magnitude bin or -1) pairs */
static const struct {
    int op;
    float p;
    int bin;
} aa_imagenet[AA_N][2] = {
    {{RN_AUG_POSTERIZE, 0.4f, 8}, {RN_AUG_ROTATE, 0.6f, 9}},
    {{RN_AUG_SOLARIZE, 0.6f, 5}, {RN_AUG_AUTOCONTRAST, 0.6f, -1}},
    {{RN_AUG_EQUALIZE, 0.8f, -1}, {RN_AUG_EQUALIZE, 0.6f, -1}},
    {{RN_AUG_POSTERIZE, 0.6f, 7}, {RN_AUG_POSTERIZE, 0.6f, 6}},
    {{RN_AUG_EQUALIZE, 0.4f, -1}, {RN_AUG_SOLARIZE, 0.2f, 4}},
    {{RN_AUG_EQUALIZE, 0.4f, -1}, {RN_AUG_ROTATE, 0.8f, 8}},
    {{RN_AUG_SOLARIZE, 0.6f, 3}, {RN_AUG_EQUALIZE, 0.6f, -1}},
    {{RN_AUG_POSTERIZE, 0.8f, 5}, {RN_AUG_EQUALIZE, 1.0f, -1}},
    {{RN_AUG_ROTATE, 0.2f, 3}, {RN_AUG_SOLARIZE, 0.6f, 8}},
    {{RN_AUG_EQUALIZE, 0.6f, -1}, {RN_AUG_POSTERIZE, 0.4f, 6}},
    {{RN_AUG_ROTATE, 0.8f, 8}, {RN_AUG_COLOR, 0.4f, 0}},
    {{RN_AUG_ROTATE, 0.4f, 9}, {RN_AUG_EQUALIZE, 0.6f, -1}},
    {{RN_AUG_EQUALIZE, 0.0f, -1}, {RN_AUG_EQUALIZE, 0.8f, -1}},
    {{RN_AUG_INVERT, 0.6f, -1}, {RN_AUG_EQUALIZE, 1.0f, -1}},
    {{RN_AUG_COLOR, 0.6f, 4}, {RN_AUG_CONTRAST, 1.0f, 8}},
    {{RN_AUG_ROTATE, 0.8f, 8}, {RN_AUG_COLOR, 1.0f, 2}},
    {{RN_AUG_COLOR, 0.8f, 8}, {RN_AUG_SOLARIZE, 0.8f, 7}},
    {{RN_AUG_SHARPNESS, 0.4f, 7}, {RN_AUG_INVERT, 0.6f, -1}},
    {{RN_AUG_SHEAR_X, 0.6f, 5}, {RN_AUG_EQUALIZE, 1.0f, -1}},
    {{RN_AUG_COLOR, 0.4f, 0}, {RN_AUG_EQUALIZE, 0.6f, -1}},
    {{RN_AUG_EQUALIZE, 0.4f, -1}, {RN_AUG_SOLARIZE, 0.2f, 4}},
    {{RN_AUG_SOLARIZE, 0.6f, 5}, {RN_AUG_AUTOCONTRAST, 0.6f, -1}},
    {{RN_AUG_INVERT, 0.6f, -1}, {RN_AUG_EQUALIZE, 1.0f, -1}},
    {{RN_AUG_COLOR, 0.6f, 4}, {RN_AUG_CONTRAST, 1.0f, 8}},
    {{RN_AUG_EQUALIZE, 0.8f, -1}, {RN_AUG_EQUALIZE, 0.6f, -1}},
};

/* torch.linspace(start, end, n)[i] in float32 exactly as torch 1.13 computes it on x86-64 (its AVX2
 * kernel): step = (end - start) / (n - 1); while 16 or more values remain, two 8-wide vectors
 * base + k * step, the base from the scalar formula; then the scalar formula, which counts from
 * start below n / 2 and back from end above, compiled with FMA. The correctly rounded value
 * differs from it by an ulp at some bins, which moves an enhancement's factor, and pixels, by one
 * step; tests/parity/augops_parity.py checks the tables against torch's. */
static float lin(double start, double end, int n, int i) {
    float s = (float)start, e = (float)end, st = (e - s) / (float)(n - 1);
    int half = n / 2, base = i;
    float k = 0.0f;
    if (i < n / 16 * 16) {
        base = i / 8 * 8;
        k = (float)(i - base);
    }
    float b = base < half ? fmaf(st, (float)base, s) : fmaf(-st, (float)(n - base - 1), e);
    return base == i ? b : b + k * st;
}

/* The magnitude table entry of op at bin i: wide = TrivialAugmentWide's ranges, else
 * RandAugment's and AutoAugment's (translations 150/331 of the size). *sgn: signed op. Ops
 * without a magnitude give 0 and bin -1. */
static double magnitude(int op, int wide, int bins, int i, int w, int h, int *sgn, int *has) {
    *sgn = 1;
    *has = 1;
    switch (op) {
    case RN_AUG_SHEAR_X:
    case RN_AUG_SHEAR_Y: return lin(0.0, wide ? 0.99 : 0.3, bins, i);
    case RN_AUG_TRANSLATE_X: return lin(0.0, wide ? 32.0 : 150.0 / 331.0 * w, bins, i);
    case RN_AUG_TRANSLATE_Y: return lin(0.0, wide ? 32.0 : 150.0 / 331.0 * h, bins, i);
    case RN_AUG_ROTATE: return lin(0.0, wide ? 135.0 : 30.0, bins, i);
    case RN_AUG_BRIGHTNESS:
    case RN_AUG_COLOR:
    case RN_AUG_CONTRAST:
    case RN_AUG_SHARPNESS: return lin(0.0, wide ? 0.99 : 0.9, bins, i);
    case RN_AUG_POSTERIZE: {
        /* 8 - (arange(bins) / ((bins - 1) / K)).round().int(), float32 division, half to even */
        float q = (float)i / (float)((bins - 1) / (wide ? 6.0 : 4.0));
        *sgn = 0;
        return 8 - (int)nearbyintf(q);
    }
    case RN_AUG_SOLARIZE: *sgn = 0; return lin(255.0, 0.0, bins, i);
    default:
        *sgn = 0;
        *has = 0;
        return 0.0;
    }
}

static int randint(rn_image_stream *st, int n) {
    return (int)(((uint64_t)rn_image_stream_next(st) * (uint64_t)n) >> 32);
}

static int bad_policy(const rn_aug_policy *p) {
    if (!p) return rn_errorf(RN_EINVAL, "augops: no policy given");
    switch (p->kind) {
    case RN_AUG_TA_WIDE:
        if (p->bins < 2 || p->bins > 1000)
            return rn_errorf(RN_EINVAL, "augops: ta_wide: %d magnitude bins (need 2..1000)", p->bins);
        return RN_OK;
    case RN_AUG_RANDAUG:
        if (p->bins < 2 || p->bins > 1000)
            return rn_errorf(RN_EINVAL, "augops: randaug: %d magnitude bins (need 2..1000)", p->bins);
        if (p->num_ops < 0 || p->num_ops > RN_AUG_MAX_OPS)
            return rn_errorf(RN_EINVAL, "augops: randaug: num_ops %d (need 0..%d)", p->num_ops, RN_AUG_MAX_OPS);
        if (p->magnitude < 0 || p->magnitude >= p->bins)
            return rn_errorf(RN_EINVAL, "augops: randaug: magnitude %d is not a bin of 0..%d (raise the bins)",
                             p->magnitude, p->bins - 1);
        return RN_OK;
    case RN_AUG_AUTOAUG: return RN_OK;
    case RN_AUG_JITTER:
        for (int k = 0; k < 4; k++)
            if (!(p->jitter[k] >= 0.0f) || isinf(p->jitter[k]) || (k == 3 && p->jitter[k] > 0.5f))
                return rn_errorf(RN_EINVAL, "augops: jitter: %s %g (need >= 0%s)",
                                 (const char *[]){"brightness", "contrast", "saturation", "hue"}[k],
                                 (double)p->jitter[k], k == 3 ? " and <= 0.5" : "");
        return RN_OK;
    default: return rn_errorf(RN_EINVAL, "augops: unknown policy kind %d", p->kind);
    }
}

int rn_aug_magnitude(const rn_aug_policy *p, int op, int bin, int w, int h, double *mag) {
    int sgn, has, rc = bad_policy(p);
    if (rc != RN_OK) return rc;
    int bins = p->kind == RN_AUG_AUTOAUG ? RN_AUG_AA_BINS : p->bins;
    if (p->kind == RN_AUG_JITTER || op < 0 || op >= RN_AUG_NOPS || bin < 0 || bin >= bins || w <= 0 || h <= 0)
        return rn_errorf(RN_EINVAL, "augops: no magnitude for op %d bin %d of this policy (%d bins)", op, bin, bins);
    *mag = magnitude(op, p->kind == RN_AUG_TA_WIDE, bins, bin, w, h, &sgn, &has);
    return RN_OK;
}

int rn_aug_policy_words(const rn_aug_policy *p) {
    switch (p->kind) {
    case RN_AUG_TA_WIDE: return 3;
    case RN_AUG_RANDAUG: return 2 * p->num_ops;
    case RN_AUG_AUTOAUG: return 5;
    case RN_AUG_JITTER: return 7;
    default: return 0;
    }
}

static void push(rn_aug_draw *d, int op, double mag, int bin, int sign) {
    d->op[d->n] = op;
    d->mag[d->n] = mag;
    d->bin[d->n] = bin;
    d->sign[d->n] = sign;
    d->n++;
}

int rn_aug_policy_draw(const rn_aug_policy *p, rn_image_stream *st, int w, int h, rn_aug_draw *d) {
    int rc = bad_policy(p);
    if (rc != RN_OK) return rc;
    if (w <= 0 || h <= 0) return rn_errorf(RN_EINVAL, "augops: draw for a %dx%d image", w, h);
    int sgn, has;
    d->n = 0;
    switch (p->kind) {
    case RN_AUG_TA_WIDE: {
        int op = randint(st, 14), bin = randint(st, p->bins), neg = randint(st, 2);
        double m = magnitude(op, 1, p->bins, bin, w, h, &sgn, &has);
        push(d, op, sgn && neg ? -m : m, has ? bin : -1, sgn && neg);
        return RN_OK;
    }
    case RN_AUG_RANDAUG:
        for (int k = 0; k < p->num_ops; k++) {
            int op = randint(st, 14), neg = randint(st, 2);
            double m = magnitude(op, 0, p->bins, p->magnitude, w, h, &sgn, &has);
            push(d, op, sgn && neg ? -m : m, has ? p->magnitude : -1, sgn && neg);
        }
        return RN_OK;
    case RN_AUG_AUTOAUG: {
        int id = randint(st, AA_N);
        float u[2];
        int neg[2];
        u[0] = rn_u01(rn_image_stream_next(st));
        u[1] = rn_u01(rn_image_stream_next(st));
        neg[0] = randint(st, 2);
        neg[1] = randint(st, 2);
        for (int k = 0; k < 2; k++) {
            if (!(u[k] <= aa_imagenet[id][k].p)) continue;
            int op = aa_imagenet[id][k].op, bin = aa_imagenet[id][k].bin;
            double m = bin >= 0 ? magnitude(op, 0, RN_AUG_AA_BINS, bin, w, h, &sgn, &has) : 0.0;
            if (bin < 0) sgn = 0;
            /* AutoAugment negates when its sign draw is 0 (RandAugment and TA when it is 1) */
            push(d, op, sgn && !neg[k] ? -m : m, bin, sgn && !neg[k]);
        }
        return RN_OK;
    }
    default: {
        /* ColorJitter.get_params: a uniform order of the four (Fisher-Yates), then the factors */
        int order[4] = {0, 1, 2, 3};
        for (int i = 3; i > 0; i--) {
            int j = randint(st, i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        float f[4];
        for (int k = 0; k < 4; k++) {
            float v = p->jitter[k];
            float lo = k == 3 ? -v : (float)fmax(0.0, 1.0 - (double)v), hi = k == 3 ? v : (float)(1.0 + (double)v);
            f[k] = lo + (hi - lo) * rn_u01(rn_image_stream_next(st));
        }
        static const int ops[4] = {RN_AUG_BRIGHTNESS, RN_AUG_CONTRAST, RN_AUG_COLOR, RN_AUG_HUE};
        for (int i = 0; i < 4; i++)
            if (p->jitter[order[i]] > 0.0f) push(d, ops[order[i]], f[order[i]], -1, 0);
        return RN_OK;
    }
    }
}

int rn_aug_policy_apply(const rn_aug_policy *p, const rn_aug_draw *d, uint8_t *img, int w, int h, int c,
                        rn_aug_ws *ws) {
    int rc = bad_policy(p);
    if (rc != RN_OK) return rc;
    if (!d || d->n < 0 || d->n > RN_AUG_MAX_OPS) return rn_errorf(RN_EINVAL, "augops: bad draw");
    for (int i = 0; i < d->n; i++) {
        rc = p->kind == RN_AUG_JITTER ? rn_aug_adjust(d->op[i], d->mag[i], img, w, h, c, ws)
                                      : rn_aug_op(d->op[i], d->mag[i], img, w, h, c, ws);
        if (rc != RN_OK)
            return rn_error_context(rc, "%s op %d of %d", p->kind == RN_AUG_JITTER ? "jitter" : "policy", i + 1, d->n);
    }
    return RN_OK;
}

/* a comma-separated list of up to max numbers into v; returns the count or -1 */
static int parse_list(const char *s, double *v, int max) {
    int n = 0;
    if (!s || !*s) return 0;
    for (;;) {
        char *end;
        if (n == max) return -1;
        v[n] = strtod(s, &end);
        if (end == s || !isfinite(v[n])) return -1;
        n++;
        if (*end == '\0') return n;
        if (*end != ',') return -1;
        s = end + 1;
    }
}

static int is_int(double x) { return x == floor(x) && fabs(x) < 1e6; }

int rn_aug_policy_parse(const char *name, const char *args, rn_aug_policy *p) {
    double v[4];
    if (!name || !p) return rn_errorf(RN_EINVAL, "augops: no policy name given");
    memset(p, 0, sizeof *p);
    const char *a = args ? args : "";
    if (!strcmp(name, "ta_wide") || !strcmp(name, "trivialaugment")) {
        int n = parse_list(a, v, 1);
        if (n < 0 || (n == 1 && !is_int(v[0])))
            return rn_errorf(RN_EINVAL, "%s: bad arguments '%s' (want nothing or BINS, e.g. 31)", name, a);
        *p = (rn_aug_policy){.kind = RN_AUG_TA_WIDE, .bins = n ? (int)v[0] : RN_AUG_TA_BINS};
    } else if (!strcmp(name, "randaug") || !strcmp(name, "randaugment")) {
        int n = parse_list(a, v, 3);
        if (n < 0 || n == 1 || (n >= 2 && (!is_int(v[0]) || !is_int(v[1]))) || (n == 3 && !is_int(v[2])))
            return rn_errorf(RN_EINVAL, "%s: bad arguments '%s' (want nothing or NUM_OPS,MAGNITUDE[,BINS], e.g. 2,9)",
                             name, a);
        *p = (rn_aug_policy){.kind = RN_AUG_RANDAUG,
                             .num_ops = n ? (int)v[0] : RN_AUG_RA_NUM_OPS,
                             .magnitude = n ? (int)v[1] : RN_AUG_RA_MAGNITUDE,
                             .bins = n == 3 ? (int)v[2] : RN_AUG_RA_BINS};
    } else if (!strcmp(name, "autoaug") || !strcmp(name, "autoaugment")) {
        if (*a && strcmp(a, "imagenet"))
            return rn_errorf(RN_EINVAL, "%s: policy '%s' is not available (only imagenet)", name, a);
        *p = (rn_aug_policy){.kind = RN_AUG_AUTOAUG};
    } else if (!strcmp(name, "jitter") || !strcmp(name, "colorjitter")) {
        int n = parse_list(a, v, 4);
        if (n <= 0)
            return rn_errorf(RN_EINVAL, "%s: bad arguments '%s' (want B[,C[,S[,H]]], e.g. 0.4,0.4,0.4,0.1)", name, a);
        p->kind = RN_AUG_JITTER;
        for (int k = 0; k < n; k++)
            p->jitter[k] = (float)v[k];
    } else {
        return rn_errorf(RN_EINVAL, "unknown augmentation policy '%s' (ta_wide, randaug, autoaug or jitter)", name);
    }
    int rc = bad_policy(p);
    if (rc != RN_OK) return rn_error_context(rc, "%s %s", name, a);
    return RN_OK;
}
