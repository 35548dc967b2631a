/* Parity harness for rn/augops.h (tests/parity/augops_parity.py drives it).
 *   parity_augops apply CASES OUT
 *     CASES: int32 count, then per case int32 kind (0: rn_aug_op, 1: rn_aug_adjust), int32 op,
 *     float64 value, int32 w, h, c, then w*h*c bytes (HWC); OUT: the results, concatenated.
 *   parity_augops draw POLICY ARGS N W H SEED
 *     N draws, one line each: the applied ops as NAME:MAGNITUDE (jitter: NAME:FACTOR), draw i
 *     from the stream (rn_rng_key(SEED, 7), 0, i). ARGS "-" for none.
 *   parity_augops table POLICY ARGS W H
 *     every op's magnitude table, one "NAME BIN VALUE" line per entry (%.9g).
 *   parity_augops time REPS
 *     microseconds per call of each op on a 224x224x3 image. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rn/augops.h"
#include "rn/err.h"
#include "rn/rng.h"

static int rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n ? 0 : -1; }

static int apply(const char *in, const char *out) {
    FILE *f = fopen(in, "rb"), *o = fopen(out, "wb");
    if (!f || !o) { fprintf(stderr, "parity_augops: cannot open %s or %s\n", in, out); return 1; }
    int32_t n, hdr[3], kind, op;
    double v;
    rn_aug_ws ws = {0};
    if (rd(f, &n, 4)) return 1;
    for (int i = 0; i < n; i++) {
        if (rd(f, &kind, 4) || rd(f, &op, 4) || rd(f, &v, 8) || rd(f, hdr, 12)) {
            fprintf(stderr, "parity_augops: %s: case %d truncated\n", in, i);
            return 1;
        }
        size_t sz = (size_t)hdr[0] * hdr[1] * hdr[2];
        uint8_t *img = malloc(sz);
        if (!img || rd(f, img, sz)) return 1;
        int rc = kind ? rn_aug_adjust(op, v, img, hdr[0], hdr[1], hdr[2], &ws)
                      : rn_aug_op(op, v, img, hdr[0], hdr[1], hdr[2], &ws);
        if (rc != RN_OK) {
            fprintf(stderr, "parity_augops: case %d: %s\n", i, rn_last_error());
            return 1;
        }
        fwrite(img, 1, sz, o);
        free(img);
    }
    rn_aug_ws_free(&ws);
    fclose(f);
    return fclose(o) ? 1 : 0;
}

static int draw(char **argv) {
    rn_aug_policy p;
    if (rn_aug_policy_parse(argv[0], strcmp(argv[1], "-") ? argv[1] : "", &p) != RN_OK) {
        fprintf(stderr, "parity_augops: %s\n", rn_last_error());
        return 2;
    }
    long n = atol(argv[2]);
    int w = atoi(argv[3]), h = atoi(argv[4]);
    uint64_t key = rn_rng_key(strtoull(argv[5], NULL, 10), 7);
    for (long i = 0; i < n; i++) {
        rn_image_stream st;
        rn_aug_draw d;
        rn_image_stream_init(&st, NULL, key, 0, (uint64_t)i);
        if (rn_aug_policy_draw(&p, &st, w, h, &d) != RN_OK) {
            fprintf(stderr, "parity_augops: %s\n", rn_last_error());
            return 1;
        }
        if ((int)st.n != rn_aug_policy_words(&p)) {
            fprintf(stderr, "parity_augops: draw %ld took %u words, not %d\n", i, st.n, rn_aug_policy_words(&p));
            return 1;
        }
        for (int k = 0; k < d.n; k++)
            if (p.kind == RN_AUG_JITTER) printf("%s%s:%.9g", k ? " " : "", rn_aug_op_name(d.op[k]), d.mag[k]);
            else printf("%s%s:%.3f", k ? " " : "", rn_aug_op_name(d.op[k]), d.mag[k] + 0.0);
        putchar('\n');
    }
    return 0;
}

static int table(char **argv) {
    rn_aug_policy p;
    if (rn_aug_policy_parse(argv[0], strcmp(argv[1], "-") ? argv[1] : "", &p) != RN_OK) {
        fprintf(stderr, "parity_augops: %s\n", rn_last_error());
        return 2;
    }
    int bins = p.kind == RN_AUG_AUTOAUG ? RN_AUG_AA_BINS : p.bins;
    for (int op = 0; op < RN_AUG_NOPS; op++)
        for (int b = 0; b < bins; b++) {
            double m;
            if (rn_aug_magnitude(&p, op, b, atoi(argv[2]), atoi(argv[3]), &m) != RN_OK) {
                fprintf(stderr, "parity_augops: %s\n", rn_last_error());
                return 1;
            }
            printf("%s %d %.9g\n", rn_aug_op_name(op), b, m);
        }
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int timing(int reps) {
    enum { S = 224, C = 3 };
    static uint8_t img[S * S * C], ref[S * S * C];
    for (int i = 0; i < S * S * C; i++) ref[i] = (uint8_t)((i * 2654435761u) >> 24);
    static const double mags[RN_AUG_NOPS] = {0, 0.5, 0.5, 20, 20, 45, 0.5, 0.5, 0.5, 0.5, 4, 128, 0, 0, 0, 0.1};
    rn_aug_ws ws = {0};
    printf("op\tus_per_call\n");
    for (int op = 0; op < RN_AUG_NOPS; op++) {
        double best = 1e9;
        for (int r = 0; r < reps; r++) {
            memcpy(img, ref, sizeof img);
            double t0 = now();
            if (rn_aug_op(op, mags[op], img, S, S, C, &ws) != RN_OK) return 1;
            double t = now() - t0;
            best = t < best ? t : best;
        }
        printf("%s\t%.1f\n", rn_aug_op_name(op), best * 1e6);
    }
    rn_aug_ws_free(&ws);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "apply")) return apply(argv[2], argv[3]);
    if (argc == 8 && !strcmp(argv[1], "draw")) return draw(argv + 2);
    if (argc == 6 && !strcmp(argv[1], "table")) return table(argv + 2);
    if (argc == 3 && !strcmp(argv[1], "time")) return timing(atoi(argv[2]));
    fprintf(stderr, "usage: parity_augops apply CASES OUT | draw POLICY ARGS N W H SEED | table POLICY ARGS W H"
                    " | time REPS\n");
    return 2;
}
