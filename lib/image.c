#include "rn/image.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/rng.h"

/* PIL's fixed-point precision for 8-bit resampling (Resample.c). */
#define PREC 22

void rn_image_ws_free(rn_image_ws *ws) {
    free(ws->p);
    ws->p = NULL;
    ws->cap = 0;
}

static void *ws_get(rn_image_ws *ws, size_t n) {
    if (n > ws->cap) {
        void *p = realloc(ws->p, n);
        if (!p) return NULL;
        ws->p = p;
        ws->cap = n;
    }
    return ws->p;
}

static int ksize_for(double in0, double in1, int out_size) {
    double scale = (in1 - in0) / out_size;
    double fs = scale < 1.0 ? 1.0 : scale;
    return (int)ceil(fs) * 2 + 1;
}

/* PIL's precompute_coeffs + normalize_coeffs_8bpc for outputs off..off+n-1 of a resize
 * of [in0, in1) to out_size: bounds[2i] = first input, bounds[2i+1] = count. */
static void coeffs(int in_size, double in0, double in1, int out_size, int off, int n, int ksize,
                   int *bounds, int32_t *kk, double *tmp) {
    double scale = (in1 - in0) / out_size;
    double fs = scale < 1.0 ? 1.0 : scale;
    double support = fs, ss = 1.0 / fs;
    for (int i = 0; i < n; i++) {
        double center = in0 + (off + i + 0.5) * scale, ww = 0.0;
        int xmin = (int)(center - support + 0.5), xmax;
        if (xmin < 0) xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            double t = fabs((x + xmin - center + 0.5) * ss);
            double w = t < 1.0 ? 1.0 - t : 0.0;
            tmp[x] = w;
            ww += w;
        }
        int32_t *k = kk + (size_t)i * ksize;
        for (int x = 0; x < ksize; x++) {
            double v = x < xmax ? (ww != 0.0 ? tmp[x] / ww : tmp[x]) : 0.0;
            k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PREC)) : (int32_t)(0.5 + v * (1 << PREC));
        }
        bounds[2 * i] = xmin;
        bounds[2 * i + 1] = xmax;
    }
}

/* The two passes are where the loader spends its time after decoding; GCC's -O2
 * cost model does not vectorise them, -O3 does (4-8x on the vertical pass). */
#if defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((optimize("O3")))
#else
#define HOT
#endif

/* acc[i] += p[i] * w over a row: the vertical pass's inner loop */
static HOT void row_madd(int32_t *restrict acc, const uint8_t *restrict p, int32_t w, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] += p[i] * w;
}

static inline uint8_t clip8(int32_t v) {
    v >>= PREC;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* One RGB row of the horizontal pass. K > 0 is the (constant) kernel size: coefficients
 * past a pixel's tap count are zero, so where K pixels fit in the row every output
 * runs the same fully unrolled loop; K = 0 loops over the tap count. */
static inline __attribute__((always_inline)) void hrow3(const uint8_t *row, uint8_t *out, const int *bx,
                                                        const int32_t *cx, int dw, int kx, int K,
                                                        int flip, int sw) {
    for (int x = 0; x < dw; x++) {
        const int32_t *k = cx + (size_t)x * kx;
        const uint8_t *p = row + (size_t)bx[2 * x] * 3;
        int xo = flip ? dw - 1 - x : x;
        int32_t s0 = 1 << (PREC - 1), s1 = s0, s2 = s0;
        if (K && bx[2 * x] + K <= sw) {
            for (int i = 0; i < K; i++) {
                s0 += p[3 * i] * k[i];
                s1 += p[3 * i + 1] * k[i];
                s2 += p[3 * i + 2] * k[i];
            }
        } else {
            for (int i = 0, n = bx[2 * x + 1]; i < n; i++) {
                s0 += p[3 * i] * k[i];
                s1 += p[3 * i + 1] * k[i];
                s2 += p[3 * i + 2] * k[i];
            }
        }
        out[3 * xo] = clip8(s0);
        out[3 * xo + 1] = clip8(s1);
        out[3 * xo + 2] = clip8(s2);
    }
}

#ifdef __SSE2__
#include <emmintrin.h>

/* The RGB horizontal pass with SSE2, exactly equal to hrow3: pmaddwd multiplies 16-bit
 * values, so each 22-bit coefficient k is split as (k >> 11) << 11 + (k & 2047) and the
 * two products are summed separately (Σ p*k < 2^31 keeps both exact in int32). Two taps
 * per step: lanes [r0 r1 g0 g1 b0 b1 - -] against [k0 k1 k0 k1 k0 k1 0 0].
 * co holds, per output and tap pair, the hi and lo coefficient vectors. */
static void hcoeffs_sse2(const int *bx, const int32_t *cx, int dw, int kx, int pairs, __m128i *co) {
    for (int x = 0; x < dw; x++) {
        const int32_t *k = cx + (size_t)x * kx;
        int n = bx[2 * x + 1];
        for (int j = 0; j < pairs; j++) {
            int16_t a_hi = 0, a_lo = 0, b_hi = 0, b_lo = 0;
            if (2 * j < n) a_hi = (int16_t)(k[2 * j] >> 11), a_lo = (int16_t)(k[2 * j] & 2047);
            if (2 * j + 1 < n) b_hi = (int16_t)(k[2 * j + 1] >> 11), b_lo = (int16_t)(k[2 * j + 1] & 2047);
            co[((size_t)x * pairs + j) * 2] = _mm_setr_epi16(a_hi, b_hi, a_hi, b_hi, a_hi, b_hi, 0, 0);
            co[((size_t)x * pairs + j) * 2 + 1] = _mm_setr_epi16(a_lo, b_lo, a_lo, b_lo, a_lo, b_lo, 0, 0);
        }
    }
}

/* one RGB pixel as 16-bit lanes [r g b ?]; 4-byte load unless it is the row's last pixel */
static inline __m128i px16(const uint8_t *p, int last) {
    uint32_t v;
    if (last) v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
    else memcpy(&v, p, 4);
    return _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)v), _mm_setzero_si128());
}

/* out must have one writable byte past the row: each pixel is stored as 4 bytes, the
 * 4th overwritten by the next pixel (so the loop runs in output order, also when flipped) */
static void hrow3_sse2(const uint8_t *row, uint8_t *out, const int *bx, const __m128i *co, int dw,
                       int pairs, int flip, int sw) {
    const __m128i round = _mm_set1_epi32(1 << (PREC - 1));
    for (int t = 0; t < dw; t++) {
        int x = flip ? dw - 1 - t : t;
        int x0 = bx[2 * x], n = bx[2 * x + 1];
        const uint8_t *p = row + (size_t)x0 * 3;
        const __m128i *k = co + (size_t)x * pairs * 2;
        __m128i hi = _mm_setzero_si128(), lo = _mm_setzero_si128();
        for (int j = 0, i = 0; i < n; j++, i += 2) {
            __m128i a = px16(p + 3 * i, x0 + i == sw - 1);
            __m128i b = i + 1 < n ? px16(p + 3 * i + 3, x0 + i + 1 == sw - 1) : _mm_setzero_si128();
            __m128i ab = _mm_unpacklo_epi16(a, b);
            hi = _mm_add_epi32(hi, _mm_madd_epi16(ab, k[2 * j]));
            lo = _mm_add_epi32(lo, _mm_madd_epi16(ab, k[2 * j + 1]));
        }
        __m128i v = _mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(hi, 11), lo), round);
        v = _mm_srai_epi32(v, PREC);
        v = _mm_packs_epi32(v, v);
        v = _mm_packus_epi16(v, v);
        uint32_t w = (uint32_t)_mm_cvtsi128_si32(v);
        memcpy(out + 3 * (size_t)t, &w, 4);
    }
}

/* One output row of the vertical pass, 16 bytes at a time with the same hi/lo split as
 * the horizontal pass: lanes [row r, row r+1] against [k_r, k_r+1], accumulators in
 * registers. Same sums as the scalar loop, so the same results. */
static void vrow_sse2(const uint8_t *tmp, size_t rowlen, size_t i, int first, int n, const int32_t *k,
                      uint8_t *out) {
    const __m128i z = _mm_setzero_si128(), round = _mm_set1_epi32(1 << (PREC - 1));
    for (; i + 16 <= rowlen; i += 16) {
        __m128i hi[4] = {z, z, z, z}, lo[4] = {z, z, z, z};
        for (int r = 0; r < n; r += 2) {
            const uint8_t *pa = tmp + (size_t)(first + r) * rowlen + i;
            __m128i a = _mm_loadu_si128((const __m128i *)pa);
            __m128i b = r + 1 < n ? _mm_loadu_si128((const __m128i *)(pa + rowlen)) : z;
            int32_t k0 = k[r], k1 = r + 1 < n ? k[r + 1] : 0;
            __m128i kh = _mm_set1_epi32((int)(((uint32_t)(k1 >> 11) << 16) | (uint32_t)(k0 >> 11)));
            __m128i kl = _mm_set1_epi32((int)(((uint32_t)(k1 & 2047) << 16) | (uint32_t)(k0 & 2047)));
            __m128i a0 = _mm_unpacklo_epi8(a, z), a1 = _mm_unpackhi_epi8(a, z);
            __m128i b0 = _mm_unpacklo_epi8(b, z), b1 = _mm_unpackhi_epi8(b, z);
            __m128i q[4] = {_mm_unpacklo_epi16(a0, b0), _mm_unpackhi_epi16(a0, b0), _mm_unpacklo_epi16(a1, b1),
                            _mm_unpackhi_epi16(a1, b1)};
            for (int j = 0; j < 4; j++) {
                hi[j] = _mm_add_epi32(hi[j], _mm_madd_epi16(q[j], kh));
                lo[j] = _mm_add_epi32(lo[j], _mm_madd_epi16(q[j], kl));
            }
        }
        __m128i v[4];
        for (int j = 0; j < 4; j++)
            v[j] = _mm_srai_epi32(_mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(hi[j], 11), lo[j]), round), PREC);
        __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(v[0], v[1]), _mm_packs_epi32(v[2], v[3]));
        _mm_storeu_si128((__m128i *)(out + i), bytes);
    }
    for (; i < rowlen; i++) {
        int32_t acc = 1 << (PREC - 1);
        for (int r = 0; r < n; r++) acc += tmp[(size_t)(first + r) * rowlen + i] * k[r];
        out[i] = clip8(acc);
    }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_PATH 1
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2")))

/* The horizontal pass with AVX2, exactly equal to hrow3: four taps per step, taps
 * (i, i+1) in the low 128-bit lane and (i+2, i+3) in the high one, each lane laid out
 * as in hrow3_sse2. One 16-byte load and one byte shuffle gather the four pixels.
 * co holds, per output and tap quad, the hi and lo coefficient vectors. */
static AVX2 void hcoeffs_avx2(const int *bx, const int32_t *cx, int dw, int kx, int quads, __m256i *co) {
    for (int x = 0; x < dw; x++) {
        const int32_t *k = cx + (size_t)x * kx;
        int n = bx[2 * x + 1];
        for (int q = 0; q < quads; q++) {
            int16_t hi[4] = {0}, lo[4] = {0};
            for (int t = 0; t < 4; t++)
                if (4 * q + t < n) hi[t] = (int16_t)(k[4 * q + t] >> 11), lo[t] = (int16_t)(k[4 * q + t] & 2047);
            /* unaligned stores: the workspace is only 16-byte aligned */
            _mm256_storeu_si256(co + ((size_t)x * quads + q) * 2,
                                _mm256_setr_epi16(hi[0], hi[1], hi[0], hi[1], hi[0], hi[1], 0, 0, hi[2], hi[3], hi[2],
                                                  hi[3], hi[2], hi[3], 0, 0));
            _mm256_storeu_si256(co + ((size_t)x * quads + q) * 2 + 1,
                                _mm256_setr_epi16(lo[0], lo[1], lo[0], lo[1], lo[0], lo[1], 0, 0, lo[2], lo[3], lo[2],
                                                  lo[3], lo[2], lo[3], 0, 0));
        }
    }
}

/* The byte shuffle that spreads a 16-byte load (4 RGB pixels) into the 16-bit tap pairs
 * of hcoeffs_avx2's layout. */
static AVX2 __m256i hshuf_avx2(void) {
    return _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 6, -1, 9, -1, 7, -1, 10, -1, 8,
                            -1, 11, -1, -1, -1, -1, -1);
}

/* The pixels from x0 on that an output's 16-byte loads read: row itself, or, where those
 * loads would pass the row's end (sw pixels), a zero-padded copy of its end in pad. */
static const uint8_t *htaps(const uint8_t *row, int x0, int quads, int sw, uint8_t pad[16 * 8 + 16]) {
    const uint8_t *p = row + (size_t)x0 * 3;
    if (3 * x0 + 12 * (quads - 1) + 16 <= 3 * sw) return p;
    size_t have = (size_t)(sw - x0) * 3, cap = 16 * 8 + 16;
    memset(pad, 0, cap);
    memcpy(pad, p, have < cap ? have : cap);
    return pad;
}

/* quads <= 8. out must have one writable byte past the row, as for hrow3_sse2. The
 * 16-byte loads never leave the row: outputs that would read past it read from a
 * zero-padded copy of its end. */
static AVX2 void hrow3_avx2(const uint8_t *row, uint8_t *out, const int *bx, const __m256i *co, int dw,
                            int quads, int flip, int sw) {
    const __m256i shuf = hshuf_avx2();
    const __m128i round = _mm_set1_epi32(1 << (PREC - 1));
    uint8_t pad[16 * 8 + 16];
    for (int t = 0; t < dw; t++) {
        int x = flip ? dw - 1 - t : t;
        int x0 = bx[2 * x];
        const uint8_t *p = htaps(row, x0, quads, sw, pad);
        const __m256i *k = co + (size_t)x * quads * 2;
        __m256i hi = _mm256_setzero_si256(), lo = _mm256_setzero_si256();
        for (int q = 0; q < quads; q++) {
            __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 12 * q)));
            v = _mm256_shuffle_epi8(v, shuf);
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(v, _mm256_loadu_si256(k + 2 * q)));
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(v, _mm256_loadu_si256(k + 2 * q + 1)));
        }
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
        __m128i l = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
        __m128i v = _mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(h, 11), l), round);
        v = _mm_srai_epi32(v, PREC);
        v = _mm_packs_epi32(v, v);
        v = _mm_packus_epi16(v, v);
        uint32_t w = (uint32_t)_mm_cvtsi128_si32(v);
        memcpy(out + 3 * (size_t)t, &w, 4);
    }
}

/* hrow3_avx2 on two rows at once: each coefficient load serves both, and one
 * cross-lane add finishes both sums */
static AVX2 void hrow3x2_avx2(const uint8_t *ra, const uint8_t *rb, uint8_t *oa, uint8_t *ob, const int *bx,
                              const __m256i *co, int dw, int quads, int flip, int sw) {
    const __m256i shuf = hshuf_avx2();
    const __m256i round = _mm256_set1_epi32(1 << (PREC - 1));
    uint8_t pada[16 * 8 + 16], padb[16 * 8 + 16];
    for (int t = 0; t < dw; t++) {
        int x = flip ? dw - 1 - t : t;
        int x0 = bx[2 * x];
        const uint8_t *pa = htaps(ra, x0, quads, sw, pada), *pb = htaps(rb, x0, quads, sw, padb);
        const __m256i *k = co + (size_t)x * quads * 2;
        __m256i ha = _mm256_setzero_si256(), la = ha, hb = ha, lb = ha;
        for (int q = 0; q < quads; q++) {
            __m256i kh = _mm256_loadu_si256(k + 2 * q), kl = _mm256_loadu_si256(k + 2 * q + 1);
            __m256i va = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(pa + 12 * q))), shuf);
            __m256i vb = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(pb + 12 * q))), shuf);
            ha = _mm256_add_epi32(ha, _mm256_madd_epi16(va, kh));
            la = _mm256_add_epi32(la, _mm256_madd_epi16(va, kl));
            hb = _mm256_add_epi32(hb, _mm256_madd_epi16(vb, kh));
            lb = _mm256_add_epi32(lb, _mm256_madd_epi16(vb, kl));
        }
        /* [a taps 01 | a taps 23] and [b ..] -> [a | b] */
        __m256i h = _mm256_add_epi32(_mm256_permute2x128_si256(ha, hb, 0x20), _mm256_permute2x128_si256(ha, hb, 0x31));
        __m256i l = _mm256_add_epi32(_mm256_permute2x128_si256(la, lb, 0x20), _mm256_permute2x128_si256(la, lb, 0x31));
        __m256i v = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(h, 11), l), round), PREC);
        v = _mm256_packs_epi32(v, v);
        v = _mm256_packus_epi16(v, v);
        uint32_t wa = (uint32_t)_mm256_cvtsi256_si32(v), wb = (uint32_t)_mm256_extract_epi32(v, 4);
        /* row a's last pixel takes 3 bytes: a 4th would land on row b's first */
        if (t < dw - 1) memcpy(oa + 3 * (size_t)t, &wa, 4);
        else memcpy(oa + 3 * (size_t)t, &wa, 3);
        memcpy(ob + 3 * (size_t)t, &wb, 4);
    }
}

/* vrow_sse2 32 bytes at a time: the unpacks and packs work within 128-bit lanes and
 * undo each other, so no cross-lane shuffles are needed */
static AVX2 void vrow_avx2(const uint8_t *tmp, size_t rowlen, int first, int n, const int32_t *k, uint8_t *out) {
    const __m256i z = _mm256_setzero_si256(), round = _mm256_set1_epi32(1 << (PREC - 1));
    __m256i kh[64], kl[64];
    int np = (n + 1) / 2;
    if (np > 64) {
        vrow_sse2(tmp, rowlen, 0, first, n, k, out);
        return;
    }
    for (int j = 0; j < np; j++) {
        int32_t k0 = k[2 * j], k1 = 2 * j + 1 < n ? k[2 * j + 1] : 0;
        kh[j] = _mm256_set1_epi32((int)(((uint32_t)(k1 >> 11) << 16) | (uint32_t)(k0 >> 11)));
        kl[j] = _mm256_set1_epi32((int)(((uint32_t)(k1 & 2047) << 16) | (uint32_t)(k0 & 2047)));
    }
    size_t i = 0;
    for (; i + 32 <= rowlen; i += 32) {
        __m256i hi[4] = {z, z, z, z}, lo[4] = {z, z, z, z};
        for (int j = 0; j < np; j++) {
            const uint8_t *pa = tmp + (size_t)(first + 2 * j) * rowlen + i;
            __m256i a = _mm256_loadu_si256((const __m256i *)pa);
            __m256i b = 2 * j + 1 < n ? _mm256_loadu_si256((const __m256i *)(pa + rowlen)) : z;
            __m256i a0 = _mm256_unpacklo_epi8(a, z), a1 = _mm256_unpackhi_epi8(a, z);
            __m256i b0 = _mm256_unpacklo_epi8(b, z), b1 = _mm256_unpackhi_epi8(b, z);
            __m256i q[4] = {_mm256_unpacklo_epi16(a0, b0), _mm256_unpackhi_epi16(a0, b0),
                            _mm256_unpacklo_epi16(a1, b1), _mm256_unpackhi_epi16(a1, b1)};
            for (int m = 0; m < 4; m++) {
                hi[m] = _mm256_add_epi32(hi[m], _mm256_madd_epi16(q[m], kh[j]));
                lo[m] = _mm256_add_epi32(lo[m], _mm256_madd_epi16(q[m], kl[j]));
            }
        }
        __m256i v[4];
        for (int m = 0; m < 4; m++)
            v[m] = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi[m], 11), lo[m]), round),
                                     PREC);
        __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256((__m256i *)(out + i), bytes);
    }
    if (i < rowlen) vrow_sse2(tmp, rowlen, i, first, n, k, out);
}
#endif

int rn_image_resize(const uint8_t *src, int sw, int sh, int c, const double box[4], int out_w,
                    int out_h, int ox, int oy, int dw, int dh, int flip, uint8_t *dst,
                    rn_image_ws *ws) {
    const int part[4] = {0, 0, sw, sh};
    return rn_image_resize_part(src, part, sw, sh, c, box, out_w, out_h, ox, oy, dw, dh, flip, dst, ws);
}

HOT int rn_image_resize_part(const uint8_t *src, const int part[4], int sw, int sh, int c,
                             const double box[4], int out_w, int out_h, int ox, int oy, int dw,
                             int dh, int flip, uint8_t *dst, rn_image_ws *ws) {
    if (sw <= 0 || sh <= 0 || c < 1 || c > 4 || out_w <= 0 || out_h <= 0 || dw <= 0 || dh <= 0)
        return rn_errorf(RN_EINVAL, "resize %dx%dx%d to %dx%d (window %dx%d): bad size", sw, sh, c,
                         out_w, out_h, dw, dh);
    if (!(box[0] >= 0 && box[1] >= 0 && box[2] <= sw && box[3] <= sh && box[2] > box[0] &&
          box[3] > box[1]))
        return rn_errorf(RN_EINVAL, "resize box (%g,%g)-(%g,%g) is empty or outside the %dx%d image",
                         box[0], box[1], box[2], box[3], sw, sh);
    if (ox < 0 || oy < 0 || ox + dw > out_w || oy + dh > out_h)
        return rn_errorf(RN_EINVAL, "window %dx%d at (%d,%d) outside the %dx%d output", dw, dh, ox,
                         oy, out_w, out_h);
    int kx = ksize_for(box[0], box[2], out_w), ky = ksize_for(box[1], box[3], out_h);
    int kmax = kx > ky ? kx : ky;
    /* one allocation: bounds, coefficients, a double row for the weights, the
     * horizontally resized rows, and a vertical accumulator */
    size_t nb = 2 * (size_t)(dw + dh), nk = (size_t)dw * kx + (size_t)dh * ky;
    size_t off_k = nb * sizeof(int), off_d = off_k + nk * sizeof(int32_t);
    off_d = (off_d + 7) & ~(size_t)7;
    size_t off_acc = off_d + (size_t)kmax * sizeof(double);
    size_t off_t = off_acc + (size_t)dw * c * sizeof(int32_t);
    /* rows the vertical pass reads: bounded by the filter span of the window */
    double scale_y = (box[3] - box[1]) / out_h;
    size_t max_rows = (size_t)ceil(dh * scale_y) + (size_t)ky + 2;
    if (max_rows > (size_t)sh) max_rows = (size_t)sh;
    size_t off_co = (off_t + max_rows * (size_t)dw * c + 16 + 15) & ~(size_t)15; /* +16: hrow3_sse2 */
    int pairs = (kx + 1) / 2, quads = (kx + 3) / 4;
    size_t total = off_co + (size_t)dw * (pairs * 32 > quads * 64 ? pairs * 32 : quads * 64);
    uint8_t *base = ws_get(ws, total);
    if (!base) return rn_errorf(RN_ENOMEM, "out of memory: resize workspace of %zu bytes", total);
    int *bx = (int *)base, *by = bx + 2 * dw;
    int32_t *cx = (int32_t *)(base + off_k), *cy = cx + (size_t)dw * kx;
    double *dtmp = (double *)(base + off_d);
    int32_t *acc = (int32_t *)(base + off_acc);
    uint8_t *tmp = base + off_t;

    coeffs(sw, box[0], box[2], out_w, ox, dw, kx, bx, cx, dtmp);
    coeffs(sh, box[1], box[3], out_h, oy, dh, ky, by, cy, dtmp);
    /* src holds only part of the image: move the bounds into it */
    for (int i = 0; i < dw; i++) {
        bx[2 * i] -= part[0];
        if (bx[2 * i] < 0 || bx[2 * i] + bx[2 * i + 1] > part[2])
            return rn_errorf(RN_EINVAL, "resize: the part (%d,%d %dx%d) lacks columns the filter reads", part[0],
                             part[1], part[2], part[3]);
    }
    for (int i = 0; i < dh; i++) {
        by[2 * i] -= part[1];
        if (by[2 * i] < 0 || by[2 * i] + by[2 * i + 1] > part[3])
            return rn_errorf(RN_EINVAL, "resize: the part (%d,%d %dx%d) lacks rows the filter reads", part[0],
                             part[1], part[2], part[3]);
    }
    sw = part[2];
    int y0 = by[0], y1 = by[2 * (dh - 1)] + by[2 * (dh - 1) + 1];
    if ((size_t)(y1 - y0) > max_rows)
        return rn_errorf(RN_EINVAL, "resize: internal row bound %d > %zu", y1 - y0, max_rows);

    /* horizontal pass over rows y0..y1-1 into tmp (mirrored if flip) */
#ifdef HAVE_AVX2_PATH
    int avx2 = __builtin_cpu_supports("avx2");
    if (avx2 && c == 3 && quads <= 8) {
        __m256i *co2 = (__m256i *)(base + off_co);
        hcoeffs_avx2(bx, cx, dw, kx, quads, co2);
        int y = y0;
        for (; y + 2 <= y1; y += 2) {
            const uint8_t *r = src + (size_t)y * sw * c;
            uint8_t *o = tmp + (size_t)(y - y0) * dw * c;
            hrow3x2_avx2(r, r + (size_t)sw * c, o, o + (size_t)dw * c, bx, co2, dw, quads, flip, sw);
        }
        if (y < y1)
            hrow3_avx2(src + (size_t)y * sw * c, tmp + (size_t)(y - y0) * dw * c, bx, co2, dw, quads, flip, sw);
        goto vertical;
    }
#endif
#ifdef __SSE2__
    __m128i *co = (__m128i *)(base + off_co);
    if (c == 3) hcoeffs_sse2(bx, cx, dw, kx, pairs, co);
#endif
    for (int y = y0; y < y1; y++) {
        const uint8_t *row = src + (size_t)y * sw * c;
        uint8_t *out = tmp + (size_t)(y - y0) * dw * c;
#ifdef __SSE2__
        if (c == 3) {
            hrow3_sse2(row, out, bx, co, dw, pairs, flip, sw);
            continue;
        }
#endif
        if (c == 3) {
            switch (kx) {
            case 3: hrow3(row, out, bx, cx, dw, 3, 3, flip, sw); break;
            case 5: hrow3(row, out, bx, cx, dw, 5, 5, flip, sw); break;
            case 7: hrow3(row, out, bx, cx, dw, 7, 7, flip, sw); break;
            default: hrow3(row, out, bx, cx, dw, kx, 0, flip, sw); break;
            }
            continue;
        }
        for (int x = 0; x < dw; x++) {
            const int32_t *k = cx + (size_t)x * kx;
            const uint8_t *p = row + (size_t)bx[2 * x] * c;
            int n = bx[2 * x + 1], xo = flip ? dw - 1 - x : x;
            for (int ch = 0; ch < c; ch++) {
                int32_t s = 1 << (PREC - 1);
                for (int i = 0; i < n; i++) s += p[c * i + ch] * k[i];
                out[c * xo + ch] = clip8(s);
            }
        }
    }
    /* vertical pass */
#ifdef HAVE_AVX2_PATH
vertical:;
#endif
    size_t rowlen = (size_t)dw * c;
    for (int y = 0; y < dh; y++) {
        const int32_t *k = cy + (size_t)y * ky;
        int first = by[2 * y] - y0, n = by[2 * y + 1];
#ifdef HAVE_AVX2_PATH
        if (avx2) {
            vrow_avx2(tmp, rowlen, first, n, k, dst + (size_t)y * rowlen);
            continue;
        }
#endif
#ifdef __SSE2__
        vrow_sse2(tmp, rowlen, 0, first, n, k, dst + (size_t)y * rowlen);
        continue;
#endif
        for (size_t i = 0; i < rowlen; i++) acc[i] = 1 << (PREC - 1);
        for (int r = 0; r < n; r++) {
            const uint8_t *p = tmp + (size_t)(first + r) * rowlen;
            row_madd(acc, p, k[r], rowlen);
        }
        uint8_t *out = dst + (size_t)y * rowlen;
        for (size_t i = 0; i < rowlen; i++) out[i] = clip8(acc[i]);
    }
    return RN_OK;
}

int rn_image_crop(const uint8_t *src, int sw, int sh, int c, int x, int y, int w, int h, int flip,
                  uint8_t *dst) {
    if (x < 0 || y < 0 || w <= 0 || h <= 0 || x + w > sw || y + h > sh)
        return rn_errorf(RN_EINVAL, "crop %dx%d at (%d,%d) does not fit the %dx%d image", w, h, x, y,
                         sw, sh);
    for (int r = 0; r < h; r++) {
        const uint8_t *s = src + ((size_t)(y + r) * sw + x) * c;
        uint8_t *d = dst + (size_t)r * w * c;
        if (!flip) {
            memcpy(d, s, (size_t)w * c);
        } else {
            for (int i = 0; i < w; i++) memcpy(d + (size_t)(w - 1 - i) * c, s + (size_t)i * c, c);
        }
    }
    return RN_OK;
}

void rn_image_flip(uint8_t *img, int w, int h, int c) {
    for (int r = 0; r < h; r++) {
        uint8_t *row = img + (size_t)r * w * c;
        for (int i = 0, j = w - 1; i < j; i++, j--)
            for (int ch = 0; ch < c; ch++) {
                uint8_t t = row[i * c + ch];
                row[i * c + ch] = row[j * c + ch];
                row[j * c + ch] = t;
            }
    }
}

#ifdef HAVE_AVX2_PATH
/* The same float operations as the table (IEEE division and subtraction round the same
 * in every lane), 8 RGB pixels per step; returns how many pixels it did. */
static AVX2 size_t normalize3_avx2(const uint8_t *src, float *dst, size_t npix, const float *mean, const float *std) {
    __m256 m[3], sd[3];
    const __m256 d255 = _mm256_set1_ps(255.0f);
    for (int j = 0; j < 3; j++) {
        float mm[8], ss[8];
        for (int l = 0; l < 8; l++) mm[l] = mean[(8 * j + l) % 3], ss[l] = std[(8 * j + l) % 3];
        m[j] = _mm256_loadu_ps(mm);
        sd[j] = _mm256_loadu_ps(ss);
    }
    size_t i = 0;
    for (; i + 8 <= npix; i += 8) {
        const uint8_t *p = src + 3 * i;
        for (int j = 0; j < 3; j++) {
            __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * j))));
            v = _mm256_div_ps(_mm256_sub_ps(_mm256_div_ps(v, d255), m[j]), sd[j]);
            _mm256_storeu_ps(dst + 3 * i + 8 * j, v);
        }
    }
    return i;
}
#endif

void rn_image_normalize(const uint8_t *src, float *dst, size_t npix, int c, const float *mean,
                        const float *std) {
    float lut[4][256];
    for (int ch = 0; ch < c && ch < 4; ch++)
        for (int v = 0; v < 256; v++) lut[ch][v] = ((float)v / 255.0f - mean[ch]) / std[ch];
    if (c == 3) {
        size_t i = 0;
#ifdef HAVE_AVX2_PATH
        if (__builtin_cpu_supports("avx2")) i = normalize3_avx2(src, dst, npix, mean, std);
#endif
        for (; i < npix; i++) {
            dst[3 * i] = lut[0][src[3 * i]];
            dst[3 * i + 1] = lut[1][src[3 * i + 1]];
            dst[3 * i + 2] = lut[2][src[3 * i + 2]];
        }
        return;
    }
    for (size_t i = 0; i < npix; i++)
        for (int ch = 0; ch < c; ch++) dst[i * c + ch] = lut[ch][src[i * c + ch]];
}

void rn_image_resize_dims(int w, int h, int size, int *out_w, int *out_h) {
    int shrt = w <= h ? w : h, lng = w <= h ? h : w;
    int nl = (int)((double)((int64_t)size * lng) / shrt);
    if (w <= h) {
        *out_w = size;
        *out_h = nl;
    } else {
        *out_w = nl;
        *out_h = size;
    }
}

int rn_round_half_even(double x) { return (int)nearbyint(x); }

void rn_image_rrc_box(int width, int height, double scale_lo, double scale_hi, double ratio_lo,
                      double ratio_hi, const rn_draws *d, int box[4]) {
    double area = (double)width * height;
    float lr0 = logf((float)ratio_lo), lr1 = logf((float)ratio_hi);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (double)d->uniform(d->ctx, (float)scale_lo, (float)scale_hi);
        double aspect = (double)expf(d->uniform(d->ctx, lr0, lr1));
        int w = rn_round_half_even(sqrt(target * aspect));
        int h = rn_round_half_even(sqrt(target / aspect));
        if (w > 0 && w <= width && h > 0 && h <= height) {
            int i = d->randint(d->ctx, 0, height - h + 1);
            int j = d->randint(d->ctx, 0, width - w + 1);
            box[0] = j;
            box[1] = i;
            box[2] = w;
            box[3] = h;
            return;
        }
    }
    double in_ratio = (double)width / height;
    int w, h;
    if (in_ratio < ratio_lo) {
        w = width;
        h = rn_round_half_even(w / ratio_lo);
    } else if (in_ratio > ratio_hi) {
        h = height;
        w = rn_round_half_even(h * ratio_hi);
    } else {
        w = width;
        h = height;
    }
    box[0] = (width - w) / 2;
    box[1] = (height - h) / 2;
    box[2] = w;
    box[3] = h;
}

uint32_t rn_image_stream_next(rn_image_stream *s) {
    if ((s->n & 3) == 0) rn_philox(s->key, s->hi, (s->lo << 8) + (s->n >> 2), s->w);
    return s->w[s->n++ & 3];
}

static float stream_uniform(void *ctx, float lo, float hi) {
    return lo + (hi - lo) * rn_u01(rn_image_stream_next(ctx));
}

static int stream_randint(void *ctx, int lo, int hi) {
    return lo + (int)(((uint64_t)rn_image_stream_next(ctx) * (uint64_t)(hi - lo)) >> 32);
}

void rn_image_stream_init(rn_image_stream *s, rn_draws *d, uint64_t key, uint64_t ctr_hi,
                          uint64_t ctr_lo) {
    s->key = key;
    s->hi = ctr_hi;
    s->lo = ctr_lo;
    s->n = 0;
    if (d) {
        d->uniform = stream_uniform;
        d->randint = stream_randint;
        d->ctx = s;
    }
}
