/* rn/rng.h: Philox-4x32-10 counter-based random numbers.
 *
 * A value depends only on (key, counter): no state advances, so results never depend
 * on thread count, scheduling or the order in which values are asked for. Callers
 * build the key from (seed, purpose) with rn_rng_key and the counter from what the
 * value is for (epoch, sample index, element index). */
#ifndef RN_RNG_H
#define RN_RNG_H

#include <stdint.h>

/* Four 32-bit random words for (key, counter). */
void rn_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]);

/* Mix a seed with a purpose/stream id into one key (splitmix64 of both). */
uint64_t rn_rng_key(uint64_t seed, uint64_t stream);

/* Uniform in [0, 1) with 24 random bits (exactly representable in float). */
static inline float rn_u01(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }
/* Uniform in [0, 1) with 53 random bits. */
static inline double rn_u01d(uint32_t hi, uint32_t lo) {
    return (double)(((uint64_t)hi << 21) ^ (lo >> 11)) * (1.0 / 9007199254740992.0);
}

/* Fill n floats with N(mean, std) drawn from (key, element index): element i depends
 * only on key and i. */
void rn_rng_normal(uint64_t key, float *x, int64_t n, float mean, float std);
/* Fill n floats uniform in [lo, hi), element i depending only on key and i. */
void rn_rng_uniform(uint64_t key, float *x, int64_t n, float lo, float hi);

#endif
