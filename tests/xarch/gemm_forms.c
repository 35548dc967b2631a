/* rn's GEMM kernel alone (lib/backend_cpu_fused.c), for comparing its forms and CPUs:
 * runs a fixed set of products through rn_cpu_gemm and prints one line per product, its
 * name and a hash of the output's bytes. The same lines from every form (AVX-512, AVX2,
 * the portable C one) and every CPU (x86-64; aarch64, built with the cross compiler and
 * run under qemu by tests/kernels.bats) are what "the same bits" means.
 *
 *   gemm_forms [widest|avx2|portable]    (default widest: the form the CPU runs)
 *   gemm_forms --which                   the widest form's name, nothing else
 *
 * Inputs come from an integer hash, not from libm or rand(), so that they are the same
 * bits everywhere; they span several binades, so that the order of the sums shows. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/backend_cpu_impl.h"

#define NR RN_FUSED_NR

/* a float in (-4, 4) from (seed, i): a 24-bit mantissa scaled by 2^-e, e in 0..7 */
static float input(uint32_t seed, int64_t i) {
    uint64_t z = (uint64_t)seed * 0x9E3779B97F4A7C15u + (uint64_t)i * 0xD1B54A32D192ED03u;
    z ^= z >> 31, z *= 0xBF58476D1CE4E5B9u, z ^= z >> 29;
    float m = (float)(int32_t)(z & 0xFFFFFF) / (float)0x800000 - 1.0f; /* [-1, 1) */
    return m * (float)(4 >> (z >> 60 & 3)) / (float)(1 << (z >> 56 & 3));
}

static float *fill(uint32_t seed, int64_t n) {
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!v) {
        fprintf(stderr, "gemm_forms: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) v[i] = input(seed, i);
    return v;
}

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3u;
    return h;
}

/* C (m x n) = A B [+ epilogue], A row-major or transposed, B packed or in place */
static void product(int isa, const char *name, int64_t m, int64_t n, int64_t kc, int trans, int packed, int acc,
                    int bias, int res, int relu, uint32_t seed) {
    int64_t npad = (n + NR - 1) / NR * NR;
    float *a = fill(seed, m * kc), *b = fill(seed + 1, kc * npad), *c = fill(seed + 2, m * n),
          *bv = fill(seed + 3, n), *rv = fill(seed + 4, m * n), *bp = NULL;
    if (relu) /* some exact zeros of both signs reach the ReLU */
        for (int64_t i = 0; i < n; i += 7) a[i % (m * kc)] = 0.0f, bv[i] = i % 2 ? -0.0f : 0.0f;
    rn_cpu_gemm_args g = {.isa = isa, .m = m, .n = n, .kc = kc, .a = a, .c = c, .ldc = n, .accumulate = acc,
                          .bias = bias ? bv : NULL, .res = res ? rv : NULL, .relu = relu};
    if (trans) g.ars = 1, g.aps = m, g.a_trans = 1; /* a holds A^T (kc x m) */
    else g.ars = kc, g.aps = 1;
    if (packed) {
        bp = malloc(sizeof(float) * (size_t)(kc * npad));
        if (!bp) exit(1);
        rn_cpu_gemm_pack_n(b, npad, kc, n, 0, npad / NR, bp);
        g.b = bp, g.bps = kc * NR, g.bpp = NR;
    } else {
        g.b = b, g.bps = NR, g.bpp = npad; /* row-major, row stride npad */
    }
    rn_cpu_gemm(&g);
    printf("%-28s %016llx\n", name, (unsigned long long)fnv(c, sizeof(float) * (size_t)(m * n)));
    free(a), free(b), free(c), free(bv), free(rv), free(bp);
}

int main(int argc, char **argv) {
    const char *form = argc > 1 ? argv[1] : "widest";
    int widest = rn_cpu_gemm_isa(), isa;
    if (strcmp(form, "--which") == 0) {
        puts(widest == RN_GEMM_AVX512 ? "AVX-512" : widest == RN_GEMM_AVX2 ? "AVX2" : widest ? "portable C" : "none");
        return 0;
    }
    if (strcmp(form, "widest") == 0) isa = widest;
    else if (strcmp(form, "avx2") == 0) isa = widest == RN_GEMM_AVX512 || widest == RN_GEMM_AVX2 ? RN_GEMM_AVX2 : 0;
    else if (strcmp(form, "portable") == 0) isa = widest ? RN_GEMM_PORTABLE : 0;
    else {
        fprintf(stderr, "usage: gemm_forms [widest|avx2|portable]\n");
        return 2;
    }
    if (!isa) {
        fprintf(stderr, "gemm_forms: this CPU does not run rn's kernel in the %s form\n", form);
        return 3;
    }
    /* name, m, n, kc, trans, packed, accumulate, bias, res, relu */
    product(isa, "rowmajor-packed", 37, 45, 600, 0, 1, 0, 0, 0, 0, 11);
    product(isa, "rowmajor-packed-epilogue", 50, 70, 300, 0, 1, 0, 1, 1, 1, 12);
    product(isa, "rowmajor-bias-relu", 13, 33, 257, 0, 1, 0, 1, 0, 1, 13);
    product(isa, "rowmajor-inplace-accumulate", 24, 40, 513, 0, 0, 1, 0, 0, 0, 14);
    product(isa, "transposed-accumulate", 29, 70, 900, 1, 1, 1, 0, 0, 0, 15);
    product(isa, "transposed-inplace", 48, 64, 2048, 1, 0, 0, 0, 0, 0, 16);
    product(isa, "short-k", 7, 17, 3, 0, 1, 0, 1, 1, 0, 17);
    product(isa, "one-row", 1, 100, 1000, 0, 1, 0, 0, 1, 1, 18);
    return 0;
}
