#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/crc32c.h"
#include "rn/err.h"
#include "rn/json.h"
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
    /* ties go to the even neighbour, in the normal and (f16) the subnormal range alike:
     * rn-gpuinfo --bench narrows its data with these */
    CHECK(rn_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00 && rn_f32_to_f16(1.0f + 0x3p-11f) == 0x3c02, "f16 ties to even");
    CHECK(rn_f32_to_f16(0x1p-25f) == 0 && rn_f32_to_f16(0x3p-25f) == 2 && rn_f32_to_f16(-0x1p-20f) == 0x8010,
          "f16 subnormals rounded, not flushed");
    CHECK(rn_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80 && rn_f32_to_bf16(1.0f + 0x3p-8f) == 0x3f82, "bf16 ties to even");
    int64_t shape[] = {3, 4, 5};
    CHECK(rn_numel(shape, 3) == 60, "numel");
    CHECK(rn_dtype_from_name("BF16") == RN_BF16 && rn_dtype_size(RN_I64) == 8, "dtype names");
}

/* the text one JSON writer call puts on a stream: json_begin gives the stream, json_end
 * closes it and returns the text (o->text, until the next json_end) */
typedef struct {
    FILE *f;
    char *buf;
    size_t len;
    char text[128];
} json_out;
static FILE *json_begin(json_out *o) {
    o->buf = NULL;
    o->f = open_memstream(&o->buf, &o->len);
    return o->f;
}
static const char *json_end(json_out *o) {
    fclose(o->f);
    snprintf(o->text, sizeof o->text, "%s", o->buf ? o->buf : "(nothing)");
    free(o->buf);
    return o->text;
}

static void test_json(void) {
    json_out o;
    rn_json_string(json_begin(&o), "a\"b\\c\n\t\x01");
    CHECK(!strcmp(json_end(&o), "\"a\\\"b\\\\c\\n\\t\\u0001\""), "string escapes: %s", o.text);
    rn_json_number(json_begin(&o), 0.1);
    CHECK(!strcmp(json_end(&o), "0.10000000000000001"), "number: %s", o.text);
    rn_json_number(json_begin(&o), NAN);
    CHECK(!strcmp(json_end(&o), "null"), "NaN: %s", o.text);
    rn_json_string_or_null(json_begin(&o), NULL);
    CHECK(!strcmp(json_end(&o), "null"), "NULL string: %s", o.text);
    rn_json_string_or_null(json_begin(&o), "");
    CHECK(!strcmp(json_end(&o), "null"), "empty string: %s", o.text);
    rn_json_string_or_null(json_begin(&o), "x\"");
    CHECK(!strcmp(json_end(&o), "\"x\\\"\""), "string: %s", o.text);
    rn_json_count(json_begin(&o), -1);
    CHECK(!strcmp(json_end(&o), "null"), "unknown count: %s", o.text);
    rn_json_count(json_begin(&o), 0);
    CHECK(!strcmp(json_end(&o), "0"), "zero count: %s", o.text);
    rn_json_count(json_begin(&o), 85899345920LL);
    CHECK(!strcmp(json_end(&o), "85899345920"), "count: %s", o.text);
    rn_json_reading(json_begin(&o), -1);
    CHECK(!strcmp(json_end(&o), "null"), "unknown reading: %s", o.text);
    rn_json_reading(json_begin(&o), INFINITY);
    CHECK(!strcmp(json_end(&o), "null"), "infinite reading: %s", o.text);
    rn_json_reading(json_begin(&o), 312.4);
    CHECK(!strcmp(json_end(&o), "312.4"), "reading: %s", o.text);
    rn_json_reading(json_begin(&o), 1.0 / 3);
    CHECK(!strcmp(json_end(&o), "0.333333"), "6 digits: %s", o.text);
    rn_json_reading(json_begin(&o), 1e7);
    CHECK(!strcmp(json_end(&o), "1e+07"), "large reading: %s", o.text);
}

/* the VmFlags of the mapping that holds p in /proc/self/smaps ("" if none is found) */
static void vm_flags(const void *p, char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return;
    char line[512];
    int inside = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        /* a mapping's first line starts with its lowercase hex range, the others with a
         * capitalised name */
        int head = (line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f');
        if (head && sscanf(line, "%lx-%lx ", &a, &b) == 2)
            inside = (uintptr_t)p >= a && (uintptr_t)p < b;
        else if (inside && !strncmp(line, "VmFlags:", 8)) {
            snprintf(out, cap, "%s", line + 8);
            break;
        }
    }
    fclose(f);
}

/* rn_malloc and rn_calloc advise huge pages on big blocks (MADV_HUGEPAGE: the mapping's
 * "hg" flag), not on small ones; rn_advise_huge takes any pointer and size */
static void test_advise_huge(void) {
    rn_advise_huge(NULL, (size_t)64 << 20);
    char small[100];
    rn_advise_huge(small, sizeof small);
    size_t n = (size_t)24 << 20;
    uint8_t *a = rn_malloc(n), *c = rn_calloc(n / 4, 4);
    CHECK(a && c, "allocations");
    if (!a || !c) return;
    memset(a, 7, n);
    CHECK(a[n - 1] == 7 && c[n - 1] == 0, "the memory is usable, calloc's zeroed");
    FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "";
    if (thp) {
        if (!fgets(mode, sizeof mode, thp)) mode[0] = 0;
        fclose(thp);
    }
    if (!strstr(mode, "[always]") && !strstr(mode, "[madvise]")) {
        printf("test_basics: huge-page advice not checked: transparent huge pages are off here (%s)\n",
               mode[0] ? mode : "no /sys/kernel/mm/transparent_hugepage/enabled");
    } else {
        char fl[512];
        vm_flags(a + n / 2, fl, sizeof fl);
        CHECK(strstr(fl, " hg") != NULL, "rn_malloc's %zu bytes advised: VmFlags%s", n, fl);
        vm_flags(c + n / 2, fl, sizeof fl);
        CHECK(strstr(fl, " hg") != NULL, "rn_calloc's %zu bytes advised: VmFlags%s", n, fl);
    }
    free(a);
    free(c);
}

int main(void) {
    test_crc32c();
    test_advise_huge();
    test_philox();
    test_half();
    test_json();
    return check_done("test_basics");
}
