/* rn/philox.h: the counter-based generator's arithmetic, written once for the host and for
 * CUDA device code, so that the CPU and the GPU draw the same bits by construction:
 * Philox-4x32-10 (rn_philox in rn/rng.h calls it) and the Box-Muller pair of random
 * erasing's values (rn_erase_value in rn/augment.h, the CUDA erase and mix kernels). */
#ifndef RN_PHILOX_H
#define RN_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define RN_HOST_DEVICE __host__ __device__
#else
#define RN_HOST_DEVICE
#endif

/* Four 32-bit words for (key, counter hi, counter lo). */
static inline RN_HOST_DEVICE void rn_philox4x32_10(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32), c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The Box-Muller pair of erase element e of record rec in epoch `epoch`: its radius and
 * angle, in double, from Philox word pair (e % 4) / 2 of (key, epoch, (rec << 32) | e / 4);
 * the value is rad * cos(th) for even e, rad * sin(th) for odd e. */
static inline RN_HOST_DEVICE void rn_erase_pair(uint64_t key, uint64_t epoch, uint32_t rec, uint32_t e, double *rad,
                                                double *th) {
    uint32_t r[4];
    rn_philox4x32_10(key, epoch, ((uint64_t)rec << 32) | (e >> 2), r);
    int pair = (e & 3) >> 1;
    double u1 = ((double)r[2 * pair] + 1.0) * (1.0 / 4294967297.0); /* (0, 1] */
    double u2 = (double)r[2 * pair + 1] * (1.0 / 4294967296.0);
    *rad = sqrt(-2.0 * log(u1));
    *th = 6.283185307179586 * u2;
}

#endif
