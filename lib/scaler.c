#include "rn/scaler.h"

#include <math.h>

#include "rn/err.h"

int rn_scaler_init(rn_scaler *s, double init_scale, double growth_factor, double backoff_factor,
                   int growth_interval) {
    float f = (float)init_scale;
    if (!(f > 0) || !isfinite(f))
        return rn_errorf(RN_EINVAL, "loss scale %g: expected a finite value > 0 in fp32", init_scale);
    if (!(growth_factor > 1) || !isfinite(growth_factor))
        return rn_errorf(RN_EINVAL, "loss-scale growth factor %g: expected > 1", growth_factor);
    if (!(backoff_factor > 0 && backoff_factor < 1))
        return rn_errorf(RN_EINVAL, "loss-scale backoff factor %g: expected in (0, 1)", backoff_factor);
    if (growth_interval < 1)
        return rn_errorf(RN_EINVAL, "loss-scale growth interval %d: expected >= 1", growth_interval);
    *s = (rn_scaler){.scale = f, .growth_tracker = 0, .growth_factor = growth_factor,
                     .backoff_factor = backoff_factor, .growth_interval = growth_interval};
    return RN_OK;
}

int rn_scaler_update(rn_scaler *s, int found_inf) {
    if (found_inf) {
        s->scale = (float)((double)s->scale * s->backoff_factor);
        s->growth_tracker = 0;
        return 1;
    }
    /* a clean step counts before the comparison, as in torch's kernel */
    int32_t clean = s->growth_tracker + 1;
    if (clean == s->growth_interval) {
        float grown = (float)((double)s->scale * s->growth_factor);
        if (isfinite(grown)) s->scale = grown; /* never past fp32's range to inf */
        s->growth_tracker = 0;
    } else {
        s->growth_tracker = clean;
    }
    return 0;
}

float rn_scaler_inv(const rn_scaler *s) { return (float)(1.0 / (double)s->scale); }
