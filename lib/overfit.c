/* The verdict of rn-train --overfit-batches: did the loss over a few fixed batches fall
 * towards zero, and if not, what to try (the first check of the troubleshooting list:
 * a network that cannot memorise one batch has a bug or a wrong learning rate, not too
 * little data). */
#include <stdio.h>

#include "rn/train.h"

int rn_train_overfit_verdict(double first, double last, int64_t passes, int64_t steps, int64_t batches, char *buf,
                             size_t cap) {
    int n = snprintf(buf, cap, "loss %.4g -> %.4g after %lld steps over %lld batch%s: ", first, last, (long long)steps,
                     (long long)batches, batches == 1 ? "" : "es");
    if (n < 0 || (size_t)n >= cap) return last < RN_TRAIN_OVERFIT_FIT;
    buf += n, cap -= (size_t)n;
    if (last < RN_TRAIN_OVERFIT_FIT) {
        snprintf(buf, cap, "the model can fit the data");
        return 1;
    }
    if (passes < 2)
        snprintf(buf, cap, "fewer than two passes over the batches, nothing to compare: give more --max-steps or "
                           "--epochs");
    else if (last < first / 2)
        snprintf(buf, cap, "the loss falls but is not near 0 yet: train longer (--max-steps) or raise --lr");
    else if (last >= first)
        snprintf(buf, cap, "the loss did not fall: lower --lr (rn-lrfind suggests one), and check the labels and "
                           "the images with rn-load --dump");
    else
        snprintf(buf, cap, "the loss barely falls: raise --lr (rn-lrfind suggests one), and check the labels and "
                           "the images with rn-load --dump");
    return 0;
}
