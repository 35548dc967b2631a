/* Mixup and cutmix draws (rn/mix.h): Beta(alpha, alpha) from Philox and the batch-level
 * choices of torchvision's reference, keyed by (seed, step, micro-batch). */
#include "rn/mix.h"

#include <math.h>

#include "rn/rng.h"

#define PURPOSE_MIX 0x6d69786d69786d69ull  /* "mixmixmi": the choices and the cutmix centre */
#define PURPOSE_BETA 0x6d69786265746161ull /* "mixbetaa": lambda */
/* attempts of one gamma draw: Marsaglia-Tsang accepts > 95% of them, so this is never reached */
#define GAMMA_TRIES (1 << 22)

/* uniform in (0, 1), never 0 (logs are taken): 53 bits plus half a step */
static double u01_open(uint32_t hi, uint32_t lo) {
    return ((double)(((uint64_t)hi << 21) ^ (lo >> 11)) + 0.5) * (1.0 / 9007199254740992.0);
}

/* log of a Gamma(a, 1) draw. Attempt t >= 1 of gamma g reads counter (lo << 24) | (g << 23) | t:
 * a normal by Box-Muller from words 0 and 1, the acceptance uniform from words 2 and 3;
 * t = 0 holds the uniform of the alpha < 1 boost. */
static double log_gamma(uint64_t key, uint64_t hi, uint64_t lo, int g, double a) {
    uint64_t base = (lo << 24) | ((uint64_t)g << 23);
    uint32_t w[4];
    int boost = a < 1;
    double aa = boost ? a + 1 : a, d = aa - 1.0 / 3, c = 1 / sqrt(9 * d), lg = log(d);
    for (uint64_t t = 1; t < GAMMA_TRIES; t++) {
        rn_philox(key, hi, base | t, w);
        double u1 = ((double)w[0] + 1.0) * (1.0 / 4294967297.0), u2 = (double)w[1] * (1.0 / 4294967296.0);
        double x = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2), v = 1 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        if (log(u01_open(w[2], w[3])) < 0.5 * x * x + d - d * v + d * log(v)) {
            lg += log(v);
            break;
        }
    }
    if (boost) {
        rn_philox(key, hi, base, w);
        lg += log(u01_open(w[0], w[1])) / a;
    }
    return lg;
}

double rn_mix_beta(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, double alpha) {
    double lx = log_gamma(key, ctr_hi, ctr_lo, 0, alpha), ly = log_gamma(key, ctr_hi, ctr_lo, 1, alpha);
    /* X / (X + Y) from the logs: no underflow of X and Y for small alpha */
    return 1 / (1 + exp(ly - lx));
}

/* torch.randint(n, (1,)) from one word */
static int randint(uint32_t w, int n) { return (int)(((uint64_t)w * (uint64_t)n) >> 32); }

void rn_mix_draw(const rn_mix_opts *o, uint64_t seed, int64_t step, int64_t micro, int h, int w, rn_mix_desc *d) {
    *d = (rn_mix_desc){.kind = RN_MIX_NONE, .lambda = 1};
    if (!(o->mixup > 0) && !(o->cutmix > 0)) return;
    uint32_t r[4];
    rn_philox(rn_rng_key(seed, PURPOSE_MIX), (uint64_t)step, (uint64_t)micro, r);
    if (!(rn_u01(r[0]) < o->prob)) return;
    int cut = o->cutmix > 0 && (!(o->mixup > 0) || rn_u01(r[1]) < o->switch_prob);
    double alpha = cut ? o->cutmix : o->mixup;
    double lam = rn_mix_beta(rn_rng_key(seed, PURPOSE_BETA), (uint64_t)step, (uint64_t)micro, alpha);
    if (!cut) {
        *d = (rn_mix_desc){.kind = RN_MIX_MIXUP, .lambda = lam};
        return;
    }
    /* RandomCutmix: a box of half sizes int(r*W), int(r*H), r = sqrt(1 - lambda)/2, around a
       uniform centre, clipped to the image; lambda then is the share the box left */
    int rx = randint(r[2], w), ry = randint(r[3], h);
    double rr = 0.5 * sqrt(1.0 - lam);
    int hw = (int)(rr * w), hh = (int)(rr * h);
    int x0 = rx - hw < 0 ? 0 : rx - hw, y0 = ry - hh < 0 ? 0 : ry - hh;
    int x1 = rx + hw > w ? w : rx + hw, y1 = ry + hh > h ? h : ry + hh;
    *d = (rn_mix_desc){.kind = RN_MIX_CUTMIX,
                       .lambda = 1.0 - (double)(x1 - x0) * (y1 - y0) / ((double)w * h),
                       .y0 = y0,
                       .y1 = y1,
                       .x0 = x0,
                       .x1 = x1};
}
