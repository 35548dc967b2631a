/* The CPU backend's own GEMM: C = [relu](A B + (bias [+ res])), or C += A B, on x86-64
 * CPUs with AVX2 and FMA (six rows by 16 columns at a time) or AVX-512 (eight rows by
 * 32 columns), and in a portable C form (six by 16, fmaf on each term) on other CPUs
 * with a fused multiply-add instruction (aarch64). Every convolution and fully
 * connected layer of training and inference runs on it where the CPU has one of them
 * (backend_cpu_gemm.c), unless RN_CPU_GEMM=openblas.
 *
 * Summation order, the point of it. Every C element is sum_p A(r,p) B(p,j) in two
 * levels: the terms of each KCB-long chunk of p (p = 0..255, 256..511, ...) accumulated
 * by one FMA each, in the order of p, from 0; then the chunks' sums added in turn onto C
 * (onto 0, or onto C's own value when accumulating); then + (bias + res), then ReLU as
 * max(0, v), which passes NaN and keeps -0 as v < 0 ? 0 : v does. Summing by chunks keeps
 * the error of long sums (a weight gradient's thousands of rows) near sqrt(KCB) + sqrt(kc /
 * KCB) roundings rather than sqrt(kc), as a blocked BLAS does. A vector lane holds one
 * element's whole computation, so the vector width, the block sizes, how rows and columns
 * are cut into tasks and which thread runs them change nothing: the AVX2, AVX-512 and C
 * forms give the same bits, for any thread count, on x86-64 and aarch64 alike, whatever
 * OPENBLAS_CORETYPE says (OpenBLAS's kernels each sum in their own order); one exception,
 * a NaN the arithmetic itself makes (inf x 0, inf - inf): x86-64 writes 0xFFC00000,
 * aarch64 0x7FC00000, a difference of sign bit only, in a run that has diverged. The
 * chunks start where the call's inner index starts, so a caller that splits a sum over
 * calls (the weight gradient's row tiles) fixes its split from the shape alone. test_ops
 * checks the forms against each other bit for bit; tests/xarch/gemm_forms.c runs the
 * kernel alone, on aarch64 too.
 *
 * Why not OpenBLAS's sgemm, besides the order. It packs both operands on every call (one
 * more pass over the activations after im2col's) and cannot fuse an epilogue, and at
 * ResNet-50's 56x56 layers (C = 64: short dot products) its kernel ran at 0.6-0.7 of its
 * own peak. Here A is read where it is (x itself for a 1x1 conv, the im2col tile, dy)
 * with one broadcast per row and step, against B packed once per call into panels of
 * NR columns (the weights; in the weight gradient the im2col tile) or read in place.
 *
 * Operands (rn_cpu_gemm_args): A (m x kc) at a[r*ars + p*aps], either row-major (aps 1)
 * or transposed (ars 1: the weight gradient's dy^T); B (kc x n) at
 * b[(j / NR) * bps + p * bpp + j % NR], packed panels (bps = kc * NR, bpp = NR) or a
 * row-major matrix (bps = NR, bpp = its row stride); C row-major. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rn/backend_cpu_impl.h"

#define NR RN_FUSED_NR
/* Steps of p per pass: a block of B (KCB x 32 floats, 32 KiB) stays in L1 while MR-row
 * groups of A stream past it. */
#define KCB 256

/* B (kc x n, row stride ldb) into panels [t0, t1) of NR columns (zero past n). */
void rn_cpu_gemm_pack_n(const float *b, int64_t ldb, int64_t kc, int64_t n, int64_t t0, int64_t t1, float *out) {
    for (int64_t t = t0; t < t1; t++) {
        float *dst = out + t * kc * NR;
        int64_t j0 = t * NR, nb = n - j0 < NR ? n - j0 : NR;
        for (int64_t p = 0; p < kc; p++) {
            memcpy(dst + p * NR, b + p * ldb + j0, sizeof(float) * (size_t)nb);
            if (nb < NR) memset(dst + p * NR + nb, 0, sizeof(float) * (size_t)(NR - nb));
        }
    }
}

/* Panels [p0, p1) of w (k, kc) row-major, used as B = w^T (kc x k): panel t holds kc rows
 * of NR output channels (filters t*NR ..), zero past k. */
void rn_cpu_fused_pack(const float *w, int64_t k, int64_t kc, int64_t p0, int64_t p1, float *wp) {
    for (int64_t t = p0; t < p1; t++) {
        float *dst = wp + t * kc * NR;
        for (int64_t j = 0; j < NR; j++) {
            int64_t f = t * NR + j;
            if (f >= k) {
                for (int64_t p = 0; p < kc; p++) dst[p * NR + j] = 0.0f;
                continue;
            }
            const float *src = w + f * kc;
            for (int64_t p = 0; p < kc; p++) dst[p * NR + j] = src[p];
        }
    }
}

/* One block's epilogue: first (C holds nothing yet: the chunk's sum is not added onto
 * it), last (the chunk that ends the sum: add bias and res, then ReLU), bias (the block's columns) and res (C's layout) or NULL. */
typedef struct {
    int first, last, relu;
    const float *bias, *res;
} epi;

/* One block: rows x (NR * 2) floats on AVX-512 / rows x NR on AVX2 and in C, the rows of
 * A from a, kb steps of p. rows < MR only with row-major A (the missing rows read the
 * first one again and are not stored). */
typedef struct {
    int64_t kb, rows;
    const float *a;
    int64_t ars, aps;
    const float *b;
    int64_t bps, bpp;
    float *c;
    int64_t ldc;
} blk;

/* ---- The portable form: six rows by one panel, in C ----
 * fmaf on each term, so every compiler and CPU give the same bits as the AVX2 and AVX-512
 * forms: the production form where the CPU is not x86-64 but has a fused multiply-add
 * instruction (FP_FAST_FMAF: aarch64, ppc64le, s390x, riscv64), which the compiler
 * vectorises along the panel's 16 columns. On x86-64 it is there to be compared
 * (RN_CPU_GEMM=portable) and compiled for AVX2 and FMA, where the other forms run. */
#define MR2 6
#define MR5 8 /* the AVX-512 form's rows */

#if defined(__x86_64__) && defined(__GNUC__)
#define RN_PORTABLE_TARGET __attribute__((target("avx2,fma")))
#else
#define RN_PORTABLE_TARGET
#endif

static inline __attribute__((always_inline)) RN_PORTABLE_TARGET void kp_body(const blk *k, const epi *e,
                                                                             const int trans) {
    float acc[MR2][NR];
    const int64_t rows = k->rows, ldc = k->ldc, bpp = k->bpp, kb = k->kb;
    const float *ar[MR2]; /* row r's A(r, p) at ar[r][p * as]; rows past `rows` (row-major A only) read the first */
    const int64_t as = trans ? k->aps : 1;
    float *c = k->c;
    for (int r = 0; r < MR2; r++) {
        ar[r] = trans ? k->a + r : k->a + (r < rows ? r : 0) * k->ars;
        for (int j = 0; j < NR; j++) acc[r][j] = 0.0f;
    }
    for (int64_t p = 0; p < kb; p++) {
        const float *b = k->b + p * bpp;
#pragma GCC unroll 6
        for (int r = 0; r < MR2; r++) {
            const float x = ar[r][p * as];
#pragma GCC unroll 16
            for (int j = 0; j < NR; j++) acc[r][j] = fmaf(x, b[j], acc[r][j]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < NR; j++) {
            float v = acc[r][j];
            if (!e->first) v = c[r * ldc + j] + v; /* the chunk's sum onto what C holds */
            if (e->last) {
                if (e->bias || e->res) {
                    float add = e->bias ? e->bias[j] : 0.0f;
                    if (e->res) add = e->bias ? add + e->res[r * ldc + j] : e->res[r * ldc + j];
                    v = v + add;
                }
                if (e->relu) v = 0.0f > v ? 0.0f : v; /* as MAXPS(0, v): NaN and -0 pass */
            }
            c[r * ldc + j] = v;
        }
}

RN_PORTABLE_TARGET static void kp_n(const blk *k, const epi *e) { kp_body(k, e, 0); }
RN_PORTABLE_TARGET static void kp_t(const blk *k, const epi *e) { kp_body(k, e, 1); }

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RN_GEMM_X86 1

int rn_cpu_gemm_isa(void) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return RN_GEMM_NONE;
    return __builtin_cpu_supports("avx512f") ? RN_GEMM_AVX512 : RN_GEMM_AVX2;
}

/* ---- AVX2: six rows by one panel (two ymm) ---- */

static inline __attribute__((always_inline, target("avx2,fma"))) void k2_body(const blk *k, const epi *e,
                                                                              const int trans) {
    __m256 acc[MR2][2];
    const int64_t rows = k->rows, ldc = k->ldc;
    float *c = k->c;
#pragma GCC unroll 6
    for (int r = 0; r < MR2; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            acc[r][h] = _mm256_setzero_ps();
    const float *b = k->b;
    const int64_t bpp = k->bpp, kb = k->kb;
#define F2(r, x)                                          \
    acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);        \
    acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
    if (!trans) {
        const int64_t l = k->ars;
        const float *a0 = k->a, *a1 = a0 + (rows > 1 ? l : 0), *a2 = a0 + (rows > 2 ? 2 * l : 0),
                    *a3 = a0 + (rows > 3 ? 3 * l : 0), *a4 = a0 + (rows > 4 ? 4 * l : 0),
                    *a5 = a0 + (rows > 5 ? 5 * l : 0);
        for (int64_t p = 0; p < kb; p++) {
            __m256 b0 = _mm256_loadu_ps(b + p * bpp), b1 = _mm256_loadu_ps(b + p * bpp + 8), x;
            x = _mm256_broadcast_ss(a0 + p);
            F2(0, x) x = _mm256_broadcast_ss(a1 + p);
            F2(1, x) x = _mm256_broadcast_ss(a2 + p);
            F2(2, x) x = _mm256_broadcast_ss(a3 + p);
            F2(3, x) x = _mm256_broadcast_ss(a4 + p);
            F2(4, x) x = _mm256_broadcast_ss(a5 + p);
            F2(5, x)
        }
    } else {
        const float *ap = k->a;
        const int64_t s = k->aps;
        for (int64_t p = 0; p < kb; p++, ap += s) {
            __m256 b0 = _mm256_loadu_ps(b + p * bpp), b1 = _mm256_loadu_ps(b + p * bpp + 8), x;
            x = _mm256_broadcast_ss(ap);
            F2(0, x) x = _mm256_broadcast_ss(ap + 1);
            F2(1, x) x = _mm256_broadcast_ss(ap + 2);
            F2(2, x) x = _mm256_broadcast_ss(ap + 3);
            F2(3, x) x = _mm256_broadcast_ss(ap + 4);
            F2(4, x) x = _mm256_broadcast_ss(ap + 5);
            F2(5, x)
        }
    }
#undef F2
    if (!e->first) /* the chunk's sum onto what C holds */
#pragma GCC unroll 6
        for (int r = 0; r < MR2; r++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
                if (r < rows) acc[r][h] = _mm256_add_ps(_mm256_loadu_ps(c + r * ldc + h * 8), acc[r][h]);
    if (e->last) {
        const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 6
        for (int r = 0; r < MR2; r++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                if (r >= rows) continue;
                if (e->bias || e->res) {
                    __m256 add = e->bias ? _mm256_loadu_ps(e->bias + h * 8) : zero;
                    if (e->res) {
                        __m256 v = _mm256_loadu_ps(e->res + r * ldc + h * 8);
                        add = e->bias ? _mm256_add_ps(add, v) : v;
                    }
                    acc[r][h] = _mm256_add_ps(acc[r][h], add);
                }
                /* MAXPS returns its second operand when either is NaN or both are zero */
                if (e->relu) acc[r][h] = _mm256_max_ps(zero, acc[r][h]);
            }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR2; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            if (r < rows) _mm256_storeu_ps(c + r * ldc + h * 8, acc[r][h]);
}

__attribute__((target("avx2,fma"))) static void k2_n(const blk *k, const epi *e) { k2_body(k, e, 0); }
__attribute__((target("avx2,fma"))) static void k2_t(const blk *k, const epi *e) { k2_body(k, e, 1); }

/* ---- AVX-512: eight rows by two panels (two zmm) ---- */

static inline __attribute__((always_inline, target("avx512f"))) void k5_body(const blk *k, const epi *e,
                                                                             const int trans) {
    __m512 acc[MR5][2];
    const int64_t rows = k->rows, ldc = k->ldc;
    float *c = k->c;
#pragma GCC unroll 8
    for (int r = 0; r < MR5; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            acc[r][h] = _mm512_setzero_ps();
    const float *b = k->b, *bh = k->b + k->bps;
    const int64_t bpp = k->bpp, kb = k->kb;
#define F5(r, x)                                          \
    acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);        \
    acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    if (!trans) {
        const int64_t l = k->ars;
        const float *a0 = k->a, *a1 = a0 + (rows > 1 ? l : 0), *a2 = a0 + (rows > 2 ? 2 * l : 0),
                    *a3 = a0 + (rows > 3 ? 3 * l : 0), *a4 = a0 + (rows > 4 ? 4 * l : 0),
                    *a5 = a0 + (rows > 5 ? 5 * l : 0), *a6 = a0 + (rows > 6 ? 6 * l : 0),
                    *a7 = a0 + (rows > 7 ? 7 * l : 0);
        for (int64_t p = 0; p < kb; p++) {
            __m512 b0 = _mm512_loadu_ps(b + p * bpp), b1 = _mm512_loadu_ps(bh + p * bpp), x;
            x = _mm512_set1_ps(a0[p]);
            F5(0, x) x = _mm512_set1_ps(a1[p]);
            F5(1, x) x = _mm512_set1_ps(a2[p]);
            F5(2, x) x = _mm512_set1_ps(a3[p]);
            F5(3, x) x = _mm512_set1_ps(a4[p]);
            F5(4, x) x = _mm512_set1_ps(a5[p]);
            F5(5, x) x = _mm512_set1_ps(a6[p]);
            F5(6, x) x = _mm512_set1_ps(a7[p]);
            F5(7, x)
        }
    } else {
        const float *ap = k->a;
        const int64_t s = k->aps;
        for (int64_t p = 0; p < kb; p++, ap += s) {
            __m512 b0 = _mm512_loadu_ps(b + p * bpp), b1 = _mm512_loadu_ps(bh + p * bpp), x;
            x = _mm512_set1_ps(ap[0]);
            F5(0, x) x = _mm512_set1_ps(ap[1]);
            F5(1, x) x = _mm512_set1_ps(ap[2]);
            F5(2, x) x = _mm512_set1_ps(ap[3]);
            F5(3, x) x = _mm512_set1_ps(ap[4]);
            F5(4, x) x = _mm512_set1_ps(ap[5]);
            F5(5, x) x = _mm512_set1_ps(ap[6]);
            F5(6, x) x = _mm512_set1_ps(ap[7]);
            F5(7, x)
        }
    }
#undef F5
    if (!e->first) /* the chunk's sum onto what C holds */
#pragma GCC unroll 8
        for (int r = 0; r < MR5; r++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
                if (r < rows) acc[r][h] = _mm512_add_ps(_mm512_loadu_ps(c + r * ldc + h * NR), acc[r][h]);
    if (e->last) {
        const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int r = 0; r < MR5; r++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                if (r >= rows) continue;
                if (e->bias || e->res) {
                    __m512 add = e->bias ? _mm512_loadu_ps(e->bias + h * NR) : zero;
                    if (e->res) {
                        __m512 v = _mm512_loadu_ps(e->res + r * ldc + h * NR);
                        add = e->bias ? _mm512_add_ps(add, v) : v;
                    }
                    acc[r][h] = _mm512_add_ps(acc[r][h], add);
                }
                /* as MAXPS: the second operand when either is NaN or both are zero */
                if (e->relu) acc[r][h] = _mm512_max_ps(zero, acc[r][h]);
            }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR5; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            if (r < rows) _mm512_storeu_ps(c + r * ldc + h * NR, acc[r][h]);
}

__attribute__((target("avx512f"))) static void k5_n(const blk *k, const epi *e) { k5_body(k, e, 0); }
__attribute__((target("avx512f"))) static void k5_t(const blk *k, const epi *e) { k5_body(k, e, 1); }

#endif /* x86-64 */

#if !defined(RN_GEMM_X86)
/* the portable form where fmaf is one instruction; OpenBLAS elsewhere (fmaf in software
 * would cost tens of times the GEMM's time) */
int rn_cpu_gemm_isa(void) {
#if defined(FP_FAST_FMAF)
    return RN_GEMM_PORTABLE;
#else
    return RN_GEMM_NONE;
#endif
}
#endif

/* One block through the form isa names. */
static void run_block(int isa, int trans, const blk *k, const epi *e) {
#if defined(RN_GEMM_X86)
    if (isa == RN_GEMM_AVX512) {
        trans ? k5_t(k, e) : k5_n(k, e);
        return;
    }
    if (isa == RN_GEMM_AVX2) {
        trans ? k2_t(k, e) : k2_n(k, e);
        return;
    }
#else
    (void)isa; /* the portable form is the one there is */
#endif
    trans ? kp_t(k, e) : kp_n(k, e);
}

/* A block the kernels do not take as it is: fewer columns than their width (C, bias and
 * res through zero-padded copies; B, tb, was copied once for all the rows by the caller),
 * or fewer rows than MR from a transposed A (ta: those rows copied row-major by the
 * caller, once per chunk). Copies are exact, so every element sees the same arithmetic
 * as in a full block. */
static void edge(int isa, int trans, const float *ta, int64_t nb, const blk *k, const epi *e, const float *tb) {
    enum { W = 2 * NR, M = MR5 > MR2 ? MR5 : MR2 };
    const int64_t width = isa == RN_GEMM_AVX512 ? W : NR;
    float tc[M * W], tr[M * W], tbias[W];
    blk t = *k;
    epi te = *e;
    if (ta) t.a = ta, t.ars = k->kb, t.aps = 1, trans = 0; /* a transposed A's last rows, copied row-major */
    if (nb < width) {
        memset(tc, 0, sizeof tc);
        memset(tr, 0, sizeof tr);
        memset(tbias, 0, sizeof tbias);
        for (int64_t r = 0; r < k->rows; r++) {
            if (!e->first) memcpy(tc + r * width, k->c + r * k->ldc, sizeof(float) * (size_t)nb);
            if (e->last && e->res) memcpy(tr + r * width, e->res + r * k->ldc, sizeof(float) * (size_t)nb);
        }
        if (e->last && e->bias) memcpy(tbias, e->bias, sizeof(float) * (size_t)nb);
        t.b = tb, t.bps = NR, t.bpp = width, t.c = tc, t.ldc = width;
        te.bias = e->bias ? tbias : NULL;
        te.res = e->res ? tr : NULL;
    }
    run_block(isa, trans, &t, &te);
    if (nb < width)
        for (int64_t r = 0; r < k->rows; r++) memcpy(k->c + r * k->ldc, tc + r * width, sizeof(float) * (size_t)nb);
}

void rn_cpu_gemm(const rn_cpu_gemm_args *g) {
    const int wide = g->isa == RN_GEMM_AVX512, trans = g->a_trans;
    const int64_t mr = wide ? MR5 : MR2, width = wide ? 2 * NR : NR;
    float tb[KCB * 2 * NR]; /* a block of B narrower than the kernel, zero-padded */
    float ta[MR5 * KCB];    /* a transposed A's last rows when fewer than MR, row-major, zero-padded */
    const int64_t redge = trans && g->m % mr ? g->m - g->m % mr : -1; /* where those rows start */
    for (int64_t k0 = 0; k0 < g->kc; k0 += KCB) {
        const int64_t kb = g->kc - k0 < KCB ? g->kc - k0 : KCB;
        if (redge >= 0) { /* once per chunk, for every column block */
            memset(ta, 0, sizeof(float) * (size_t)(mr * kb));
            for (int64_t r = redge; r < g->m; r++)
                for (int64_t p = 0; p < kb; p++) ta[(r - redge) * kb + p] = g->a[r * g->ars + (k0 + p) * g->aps];
        }
        for (int64_t j0 = 0; j0 < g->n; j0 += width) {
            const int64_t nb = g->n - j0 < width ? g->n - j0 : width;
            const float *b = g->b + j0 / NR * g->bps + k0 * g->bpp;
            if (nb < width)
                for (int64_t p = 0; p < kb; p++)
                    for (int64_t j = 0; j < width; j++)
                        tb[p * width + j] = j < nb ? b[j / NR * g->bps + p * g->bpp + j % NR] : 0.0f;
            for (int64_t r0 = 0; r0 < g->m; r0 += mr) {
                blk k = {.kb = kb,
                         .rows = g->m - r0 < mr ? g->m - r0 : mr,
                         .a = g->a + r0 * g->ars + k0 * g->aps,
                         .ars = g->ars,
                         .aps = g->aps,
                         .b = b,
                         .bps = g->bps,
                         .bpp = g->bpp,
                         .c = g->c + r0 * g->ldc + j0,
                         .ldc = g->ldc};
                epi e = {.first = k0 == 0 && !g->accumulate,
                         .last = k0 + kb == g->kc,
                         .relu = g->relu,
                         .bias = g->bias ? g->bias + j0 : NULL,
                         .res = g->res ? g->res + r0 * g->ldc + j0 : NULL};
                if (nb < width || r0 == redge) edge(g->isa, trans, r0 == redge ? ta : NULL, nb, &k, &e, tb);
                else run_block(g->isa, trans, &k, &e);
            }
        }
    }
}

/* y rows [0, rows) x output channels [p0*NR, min(p1*NR, k)) (row stride k) =
 * [relu](a (rows x kc, row stride lda) w^T + (bias + res)), wp from rn_cpu_fused_pack;
 * res has y's layout, or NULL. */
void rn_cpu_fused_gemm(int isa, const float *a, int64_t lda, int64_t rows, int64_t kc, const float *wp, int64_t k,
                       int64_t p0, int64_t p1, const float *bias, const float *res, int relu, float *y) {
    int64_t j0 = p0 * NR, j1 = p1 * NR < k ? p1 * NR : k;
    if (j1 <= j0) return;
    rn_cpu_gemm_args g = {.isa = isa,
                          .m = rows,
                          .n = j1 - j0,
                          .kc = kc,
                          .a = a,
                          .ars = lda,
                          .aps = 1,
                          .b = wp + p0 * kc * NR,
                          .bps = kc * NR,
                          .bpp = NR,
                          .c = y + j0,
                          .ldc = k,
                          .bias = bias ? bias + j0 : NULL,
                          .res = res ? res + j0 : NULL,
                          .relu = relu};
    rn_cpu_gemm(&g);
}
