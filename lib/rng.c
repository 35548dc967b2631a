#include "rn/rng.h"

#include <math.h>

#include "rn/philox.h"

void rn_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]) {
    rn_philox4x32_10(key, ctr_hi, ctr_lo, out);
}

static uint64_t splitmix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t rn_rng_key(uint64_t seed, uint64_t stream) { return splitmix(splitmix(seed) ^ stream); }

void rn_rng_normal(uint64_t key, float *x, int64_t n, float mean, float std) {
    /* Box-Muller: one Philox call gives two pairs, i.e. four normals. */
    for (int64_t i = 0; i < n; i += 4) {
        uint32_t r[4];
        rn_philox(key, 0, (uint64_t)(i / 4), r);
        for (int j = 0; j < 2; j++) {
            double u1 = ((double)r[2 * j] + 1.0) * (1.0 / 4294967297.0); /* (0, 1) */
            double u2 = (double)r[2 * j + 1] * (1.0 / 4294967296.0);
            double rad = sqrt(-2.0 * log(u1));
            double z0 = rad * cos(2.0 * M_PI * u2), z1 = rad * sin(2.0 * M_PI * u2);
            if (i + 2 * j < n) x[i + 2 * j] = mean + std * (float)z0;
            if (i + 2 * j + 1 < n) x[i + 2 * j + 1] = mean + std * (float)z1;
        }
    }
}

void rn_rng_uniform(uint64_t key, float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i += 4) {
        uint32_t r[4];
        rn_philox(key, 0, (uint64_t)(i / 4), r);
        for (int j = 0; j < 4 && i + j < n; j++) x[i + j] = lo + (hi - lo) * rn_u01(r[j]);
    }
}
