/* The CPU inference path's own GEMM: y = [relu](a w^T + (bias [+ res])) with the bias,
 * residual and ReLU applied in registers, on x86-64 CPUs with AVX2 and FMA.
 *
 * Why not OpenBLAS here. OpenBLAS packs both operands on every call (one more pass over
 * the activations after im2col's) and cannot fuse an epilogue, so the inference conv
 * paid for a fill pass before the GEMM and a ReLU pass after it; and at ResNet-50's
 * 56x56 layers (C = 64: short dot products) its kernel ran at 0.6-0.7 of its own peak.
 * This kernel reads the activation rows where they are (x itself for a 1x1 conv, the
 * im2col tile otherwise): each of MR rows is a sequential stream, one broadcast per row
 * and step, against a panel of NR output channels packed once per call. Measured on a
 * 2-core EPYC, one thread: C = 64 shapes 1.5x OpenBLAS's sgemm, C >= 1024 0.9-1.05x
 * (README, Benchmarks).
 *
 * Summation order. Every y element is sum_p a[p] w[p] accumulated by FMA in the order of
 * p from 0, through memory between KCB-long chunks of p (a float stored and reloaded is
 * exact), then + (bias + res), then ReLU as max(0, v), which passes NaN and keeps -0 as
 * v < 0 ? 0 : v does. Nothing depends on how rows and panels are cut or which thread runs
 * them, nor on OPENBLAS_CORETYPE: the bits depend only on the inputs. */
#include <stdint.h>
#include <string.h>

#include "rn/backend_cpu_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define MR RN_FUSED_MR
#define NR RN_FUSED_NR
/* Steps of p per pass over a row tile: the panel (KCB x NR floats, 16 KiB) stays in L1
 * while MR-row groups stream past it, the row tile's KCB columns (48 rows: 48 KiB) in L1/L2. */
#define KCB 256

int rn_cpu_fused_available(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* Panels [p0, p1) of w (k, kc) row-major into wp: panel t holds kc rows of NR output
 * channels (filters t*NR ..), zero past k. */
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

/* The epilogue's inputs for one MR x NR block: bias (NR), res (row stride ldc) or NULL. */
typedef struct {
    int first, last, relu;
    const float *bias, *res;
} epi;

/* c (MR x NR, row stride ldc) = [first ? 0 : c] + a (MR rows of kc, stride lda) * b
 * (kc x NR packed), then on the last chunk + (bias + res) and ReLU. */
__attribute__((target("avx2,fma"))) static void kern(int64_t kc, const float *a, int64_t lda, const float *b,
                                                     float *c, int64_t ldc, const epi *e) {
    __m256 acc[MR][2];
    /* every loop over acc fully unrolled, so that it lives in registers */
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            acc[r][h] = e->first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * ldc + h * 8);
    const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda, *a4 = a + 4 * lda,
                *a5 = a + 5 * lda;
    for (int64_t p = 0; p < kc; p++) {
        __m256 b0 = _mm256_loadu_ps(b + p * NR), b1 = _mm256_loadu_ps(b + p * NR + 8), x;
        x = _mm256_broadcast_ss(a0 + p);
        acc[0][0] = _mm256_fmadd_ps(x, b0, acc[0][0]);
        acc[0][1] = _mm256_fmadd_ps(x, b1, acc[0][1]);
        x = _mm256_broadcast_ss(a1 + p);
        acc[1][0] = _mm256_fmadd_ps(x, b0, acc[1][0]);
        acc[1][1] = _mm256_fmadd_ps(x, b1, acc[1][1]);
        x = _mm256_broadcast_ss(a2 + p);
        acc[2][0] = _mm256_fmadd_ps(x, b0, acc[2][0]);
        acc[2][1] = _mm256_fmadd_ps(x, b1, acc[2][1]);
        x = _mm256_broadcast_ss(a3 + p);
        acc[3][0] = _mm256_fmadd_ps(x, b0, acc[3][0]);
        acc[3][1] = _mm256_fmadd_ps(x, b1, acc[3][1]);
        x = _mm256_broadcast_ss(a4 + p);
        acc[4][0] = _mm256_fmadd_ps(x, b0, acc[4][0]);
        acc[4][1] = _mm256_fmadd_ps(x, b1, acc[4][1]);
        x = _mm256_broadcast_ss(a5 + p);
        acc[5][0] = _mm256_fmadd_ps(x, b0, acc[5][0]);
        acc[5][1] = _mm256_fmadd_ps(x, b1, acc[5][1]);
    }
    if (e->last) {
        const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256 add = _mm256_loadu_ps(e->bias + h * 8);
                if (e->res) add = _mm256_add_ps(add, _mm256_loadu_ps(e->res + r * ldc + h * 8));
                acc[r][h] = _mm256_add_ps(acc[r][h], add);
                /* MAXPS returns its second operand when either is NaN or both are zero */
                if (e->relu) acc[r][h] = _mm256_max_ps(zero, acc[r][h]);
            }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(c + r * ldc + h * 8, acc[r][h]);
}

/* A block of mr < MR rows or nb < NR columns: through full-size copies, so that every
 * element sees the same arithmetic as in kern's full blocks. */
__attribute__((target("avx2,fma"))) static void kern_edge(int64_t kc, int64_t mr, int64_t nb, const float *a,
                                                          int64_t lda, const float *b, float *c, int64_t ldc,
                                                          const epi *e) {
    float ta[MR * KCB], tc[MR * NR], tr[MR * NR], tb[NR];
    memset(ta, 0, sizeof ta);
    memset(tc, 0, sizeof tc);
    memset(tr, 0, sizeof tr);
    memset(tb, 0, sizeof tb);
    for (int64_t r = 0; r < mr; r++) {
        memcpy(ta + r * kc, a + r * lda, sizeof(float) * (size_t)kc);
        if (!e->first) memcpy(tc + r * NR, c + r * ldc, sizeof(float) * (size_t)nb);
        if (e->last && e->res) memcpy(tr + r * NR, e->res + r * ldc, sizeof(float) * (size_t)nb);
    }
    if (e->last) memcpy(tb, e->bias, sizeof(float) * (size_t)nb);
    epi te = {.first = e->first, .last = e->last, .relu = e->relu, .bias = tb, .res = e->res ? tr : NULL};
    kern(kc, ta, kc, b, tc, NR, &te);
    for (int64_t r = 0; r < mr; r++) memcpy(c + r * ldc, tc + r * NR, sizeof(float) * (size_t)nb);
}

/* y rows [0, rows) x output channels [p0*NR, min(p1*NR, k)) (row stride k) =
 * [relu](a (rows x kc, row stride lda) w^T + (bias + res)), wp from rn_cpu_fused_pack;
 * res has y's layout, or NULL. */
void rn_cpu_fused_gemm(const float *a, int64_t lda, int64_t rows, int64_t kc, const float *wp, int64_t k,
                       int64_t p0, int64_t p1, const float *bias, const float *res, int relu, float *y) {
    for (int64_t k0 = 0; k0 < kc; k0 += KCB) {
        int64_t kb = kc - k0 < KCB ? kc - k0 : KCB;
        for (int64_t t = p0; t < p1; t++) {
            const float *b = wp + (t * kc + k0) * NR;
            int64_t j0 = t * NR, nb = k - j0 < NR ? k - j0 : NR;
            for (int64_t r = 0; r < rows; r += MR) {
                int64_t mr = rows - r < MR ? rows - r : MR;
                epi e = {.first = k0 == 0, .last = k0 + kb == kc, .relu = relu, .bias = bias + j0,
                         .res = res ? res + r * k + j0 : NULL};
                if (mr == MR && nb == NR) kern(kb, a + r * lda + k0, lda, b, y + r * k + j0, k, &e);
                else kern_edge(kb, mr, nb, a + r * lda + k0, lda, b, y + r * k + j0, k, &e);
            }
        }
    }
}

#else

int rn_cpu_fused_available(void) { return 0; }

void rn_cpu_fused_pack(const float *w, int64_t k, int64_t kc, int64_t p0, int64_t p1, float *wp) {
    (void)w, (void)k, (void)kc, (void)p0, (void)p1, (void)wp;
}

void rn_cpu_fused_gemm(const float *a, int64_t lda, int64_t rows, int64_t kc, const float *wp, int64_t k,
                       int64_t p0, int64_t p1, const float *bias, const float *res, int relu, float *y) {
    (void)a, (void)lda, (void)rows, (void)kc, (void)wp, (void)k, (void)p0, (void)p1, (void)bias, (void)res,
        (void)relu, (void)y;
}

#endif
