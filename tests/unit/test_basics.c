#include <string.h>

#include "check.h"
#include "rn/crc32c.h"
#include "rn/err.h"
#include "rn/rng.h"
#include "rn/tensor.h"

static void test_crc32c(void) {
    /* RFC 3720 B.4 check values */
    uint8_t zeros[32] = {0}, ones[32], inc[32];
    memset(ones, 0xff, 32);
    for (int i = 0; i < 32; i++) inc[i] = (uint8_t)i;
    CHECK(rn_crc32c(0, zeros, 32) == 0x8A9136AAu, "zeros %08x", rn_crc32c(0, zeros, 32));
    CHECK(rn_crc32c(0, ones, 32) == 0x62A8AB43u, "ones %08x", rn_crc32c(0, ones, 32));
    CHECK(rn_crc32c(0, inc, 32) == 0x46DD794Eu, "inc %08x", rn_crc32c(0, inc, 32));
    CHECK(rn_crc32c(0, "123456789", 9) == 0xE3069283u, "check string");
    /* chunked == whole */
    CHECK(rn_crc32c(rn_crc32c(0, inc, 13), inc + 13, 19) == 0x46DD794Eu, "chunked");
}

static void test_philox(void) {
    /* Random123 known-answer tests for philox4x32_10 */
    uint32_t r[4];
    rn_philox(0, 0, 0, r);
    CHECK(r[0] == 0x6627e8d5u && r[1] == 0xe169c58du && r[2] == 0xbc57ac4cu && r[3] == 0x9b00dbd8u,
          "zero KAT %08x %08x %08x %08x", r[0], r[1], r[2], r[3]);
    rn_philox(~0ull, ~0ull, ~0ull, r);
    CHECK(r[0] == 0x408f276du && r[1] == 0x41c83b0eu && r[2] == 0xa20bc7c6u && r[3] == 0x6d5451fdu,
          "ones KAT %08x %08x %08x %08x", r[0], r[1], r[2], r[3]);
    /* normal fill: moments of 100k draws */
    enum { N = 100000 };
    static float x[N];
    rn_rng_normal(rn_rng_key(7, 1), x, N, 0.0f, 2.0f);
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) s += x[i], s2 += (double)x[i] * x[i];
    double mean = s / N, var = s2 / N - mean * mean;
    CHECK(fabs(mean) < 0.03, "normal mean %g", mean);
    CHECK(fabs(var - 4.0) < 0.1, "normal var %g", var);
    /* element i independent of n */
    float y[7];
    rn_rng_normal(rn_rng_key(7, 1), y, 7, 0.0f, 2.0f);
    CHECK(memcmp(x, y, sizeof y) == 0, "prefix property");
}

static void test_half(void) {
    float vals[] = {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333333f};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        float h = rn_f16_to_f32(rn_f32_to_f16(vals[i]));
        CHECK(fabsf(h - vals[i]) <= fabsf(vals[i]) * 1e-3f, "f16 round trip %g -> %g", vals[i], h);
        float b = rn_bf16_to_f32(rn_f32_to_bf16(vals[i]));
        CHECK(fabsf(b - vals[i]) <= fabsf(vals[i]) * 8e-3f, "bf16 round trip %g -> %g", vals[i], b);
    }
    CHECK(rn_f32_to_f16(1e6f) == 0x7c00, "overflow to inf");
    CHECK(rn_f32_to_f16(1.0f) == 0x3c00, "one");
    CHECK(rn_f32_to_bf16(1.0f) == 0x3f80, "bf16 one");
    int64_t shape[] = {3, 4, 5};
    CHECK(rn_numel(shape, 3) == 60, "numel");
    CHECK(rn_dtype_from_name("BF16") == RN_BF16 && rn_dtype_size(RN_I64) == 8, "dtype names");
}

int main(void) {
    test_crc32c();
    test_philox();
    test_half();
    return check_done("test_basics");
}
