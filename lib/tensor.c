#include "rn/tensor.h"

#include <string.h>

size_t rn_dtype_size(int dtype) {
    switch (dtype) {
    case RN_F32: case RN_I32: return 4;
    case RN_F16: case RN_BF16: return 2;
    case RN_U8: return 1;
    case RN_I64: return 8;
    default: return 0;
    }
}

static const char *names[] = {"?", "F32", "F16", "BF16", "U8", "I32", "I64"};

const char *rn_dtype_name(int dtype) { return dtype >= RN_F32 && dtype <= RN_I64 ? names[dtype] : "?"; }

int rn_dtype_from_name(const char *name) {
    for (int d = RN_F32; d <= RN_I64; d++)
        if (strcmp(name, names[d]) == 0) return d;
    return 0;
}

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float rn_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) return from_bits(sign | 0x7f800000u | (man << 13));
    return from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t rn_f32_to_f16(float f) {
    uint32_t u = bits(f), sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* subnormal half: round a * 2^24 to nearest even integer */
        float v = from_bits(a) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1))) m++;
        return (uint16_t)(sign | m);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1); /* round to nearest even on bit 13 */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float rn_bf16_to_f32(uint16_t h) { return from_bits((uint32_t)h << 16); }

uint16_t rn_f32_to_bf16(float f) {
    uint32_t u = bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

int64_t rn_numel(const int64_t *shape, size_t ndim) {
    int64_t n = 1;
    for (size_t i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

void rn_conv_oihw_to_ohwi(const float *src, float *dst, int k, int c, int kh, int kw) {
    for (int o = 0; o < k; o++)
        for (int i = 0; i < c; i++)
            for (int r = 0; r < kh; r++)
                for (int s = 0; s < kw; s++)
                    dst[(((size_t)o * kh + r) * kw + s) * c + i] =
                        src[(((size_t)o * c + i) * kh + r) * kw + s];
}

void rn_conv_ohwi_to_oihw(const float *src, float *dst, int k, int c, int kh, int kw) {
    for (int o = 0; o < k; o++)
        for (int i = 0; i < c; i++)
            for (int r = 0; r < kh; r++)
                for (int s = 0; s < kw; s++)
                    dst[(((size_t)o * c + i) * kh + r) * kw + s] =
                        src[(((size_t)o * kh + r) * kw + s) * c + i];
}
