/* The augmentation samplers as the loader draws them, for tests/parity/aug_parity.py:
 * N draws, draw r from the stream of (key(seed), epoch 0, record r) as the loader keys
 * them, one line each on stdout.
 *
 *   parity_aug_draws crop  W H PAD S         N SEED   -> i j        (RandomCrop.get_params)
 *   parity_aug_draws rrc   W H SLO SHI RLO RHI N SEED -> i j h w    (RandomResizedCrop.get_params)
 *   parity_aug_draws erase W H SLO SHI RLO RHI N SEED -> i j h w    (RandomErasing.get_params;
 *                                                         0 0 H W when it erases nothing)
 *   parity_aug_draws flip  P                 N SEED   -> 0 or 1     (RandomHorizontalFlip)
 *
 * (the loader's erase first draws whether to erase at all: that is the flip sampler's
 * comparison, tested by `flip`). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/augment.h"
#include "rn/image.h"
#include "rn/rng.h"

static int usage(void) {
    fprintf(stderr, "usage: parity_aug_draws crop W H PAD S N SEED | rrc|erase W H SLO SHI RLO RHI N SEED | "
                    "flip P N SEED\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *what = argv[1];
    int need = strcmp(what, "crop") == 0 ? 8 : strcmp(what, "flip") == 0 ? 5 : 10;
    if (argc != need || (strcmp(what, "crop") && strcmp(what, "flip") && strcmp(what, "rrc") && strcmp(what, "erase")))
        return usage();
    long n = atol(argv[argc - 2]);
    uint64_t key = rn_rng_key(strtoull(argv[argc - 1], NULL, 10), 0x6c6f616461756765ull);
    for (long r = 0; r < n; r++) {
        rn_image_stream st;
        rn_draws d;
        rn_image_stream_init(&st, &d, key, 0, (uint64_t)r);
        if (strcmp(what, "flip") == 0) {
            printf("%d\n", rn_u01(rn_image_stream_next(&st)) < (float)atof(argv[2]));
            continue;
        }
        int W = atoi(argv[2]), H = atoi(argv[3]), b[4];
        if (strcmp(what, "crop") == 0) {
            int i, j;
            if (rn_aug_crop_offsets(W, H, atoi(argv[4]), atoi(argv[5]), &d, &i, &j)) return 1;
            printf("%d %d\n", i, j);
            continue;
        }
        double s0 = atof(argv[4]), s1 = atof(argv[5]), r0 = atof(argv[6]), r1 = atof(argv[7]);
        if (strcmp(what, "rrc") == 0) {
            rn_image_rrc_box(W, H, s0, s1, r0, r1, &d, b);
            printf("%d %d %d %d\n", b[1], b[0], b[3], b[2]);
        } else {
            rn_aug_erase_box(W, H, s0, s1, r0, r1, &d, b);
            if (b[2] == 0)
                printf("0 0 %d %d\n", H, W);
            else
                printf("%d %d %d %d\n", b[1], b[0], b[3], b[2]);
        }
    }
    return 0;
}
