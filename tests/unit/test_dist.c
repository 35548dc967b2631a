/* rn/dist.h: the rank-ordered sum and the gathers. Alone (make test runs it so) the
 * world is one process; tests/dist-train.bats runs it under mpirun with 2, 3 and 4 ranks:
 * every size and bucket gives, on every rank, the left-to-right sum in rank order, bit
 * for bit, and no buffer is written past its end (exact-size heap buffers, for ASan).
 * The device half of the sum (a backend with collectives of its own: NCCL's on a GPU)
 * runs here too, through an emulation of the CUDA backend's collective over MPI. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if RN_HAVE_MPI
#include <mpi.h>
#endif

#include "check.h"
#include "rn/backend.h"
#include "rn/backend_impl.h"
#include "rn/cli.h"
#include "rn/dist.h"
#include "rn/err.h"

/* rank r's value at i: different per rank, and not exactly summable in float */
static float val(int r, int64_t i) { return (float)sin(r * 1000.0 + i * 0.37) * (float)(1 + r); }

/* how many of x[0, n) differ from the (round, rank)-ordered sum of W ranks' values over
 * `rounds` rounds (round k's rank r gave val(r + 17 k, i)); 1 round: the rank-ordered sum */
static int64_t differ_from_sum(const float *x, int64_t n, int W, int rounds) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float acc = val(0, i);
        for (int k = 0; k < rounds; k++)
            for (int r = k == 0; r < W; r++) acc += val(r + 17 * k, i);
        bad += memcmp(&acc, &x[i], sizeof acc) != 0;
    }
    return bad;
}

#if RN_HAVE_MPI
/* ---- a device backend's half of rn/dist.h, on the CPU ----
 * A backend whose memory counts as not the host's (is_host 0) and whose collective does
 * what the CUDA backend's coll_sum_on does over NCCL (lib/backend_cuda.cu), here over MPI:
 * rank r's chunk [n r / W, n (r+1) / W) of a bucket is the sum of every rank's chunk in
 * rank order, added onto run (this rank's running sums: run[0, chunk)) after the first
 * round; the last round writes the chunk into x and gathers every rank's chunk into x. So
 * rn_dist's packing, its offsets into the running sums and its copy back run here as they
 * run on a GPU, checked against the host path and for the bounds of run. */
static int dev_world, dev_rank;
static float *run_lo, *run_hi; /* the running sums' buffer: nothing outside it is touched */
static int64_t run_outside;

static int64_t chunk_at(int64_t n, int r) { return n * r / dev_world; }
static int dev_calls, dev_fail_at = -1, dev_joins; /* the collective's calls; the one that fails; joins */

static int dev_sum_on(float *x, float *scratch, int64_t n, float *run, int first, int last) {
    const int W = dev_world, R = dev_rank;
    if (dev_calls++ == dev_fail_at) return rn_errorf(RN_EGPU, "the emulated collective: an injected failure");
    if (n == 0 || (W == 1 && !run)) return RN_OK;
    int64_t lo = chunk_at(n, R), mine = chunk_at(n, R + 1) - lo;
    if (run && mine && (run < run_lo || run + mine > run_hi)) {
        run_outside++;
        return rn_errorf(RN_EINVAL, "the emulated collective: running sums out of bounds");
    }
    float *recv = (W - 1) * mine <= n ? scratch : malloc(sizeof(float) * (size_t)(W * W));
    int *cnt = calloc((size_t)(4 * W), sizeof(int));
    if (!recv || !cnt) return RN_ENOMEM;
    int *sc = cnt, *sd = cnt + W, *rc = cnt + 2 * W, *rd = cnt + 3 * W;
    for (int p = 0, slot = 0; p < W; p++) {
        if (p == R) continue;
        sc[p] = (int)(chunk_at(n, p + 1) - chunk_at(n, p)), sd[p] = (int)chunk_at(n, p);
        rc[p] = (int)mine, rd[p] = (int)(slot++ * mine);
    }
    int e = MPI_Alltoallv(x, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, MPI_COMM_WORLD);
    for (int64_t i = 0; e == MPI_SUCCESS && i < mine; i++) {
        float acc = 0.0f;
        for (int p = 0, slot = 0; p < W; p++) {
            float v = p == R ? x[lo + i] : recv[(int64_t)slot++ * mine + i];
            acc = p == 0 ? (first ? v : run[i] + v) : acc + v;
        }
        if (run) run[i] = acc;
        if (last) x[lo + i] = acc;
    }
    if (recv != scratch) free(recv);
    for (int p = 0; e == MPI_SUCCESS && last && p < W; p++)
        sc[p] = (int)(chunk_at(n, p + 1) - chunk_at(n, p)), sd[p] = (int)chunk_at(n, p);
    if (e == MPI_SUCCESS && last)
        e = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, sc, sd, MPI_FLOAT, MPI_COMM_WORLD);
    free(cnt);
    return e == MPI_SUCCESS ? RN_OK : rn_errorf(RN_EIO, "the emulated collective: MPI error %d", e);
}
static int dev_sum(rn_backend *be, float *x, float *s, int64_t n) { return dev_sum_on(x, s, n, NULL, 1, 1); }
static int dev_round(rn_backend *be, float *x, float *s, float *run, int64_t n, int first, int last) {
    return dev_sum_on(x, s, n, run, first, last);
}
static int dev_join(rn_backend *be) { return dev_joins++, RN_OK; }

/* a CPU backend playing rank R of W's device (fake: its ops, the caller's; join: its
 * coll_join, or NULL); *cpu: the ops to put back before rn_backend_destroy */
static rn_backend *emulated_device(int R, int W, rn_backend_ops *fake, int (*join)(rn_backend *),
                                   const rn_backend_ops **cpu) {
    dev_world = W, dev_rank = R;
    rn_backend *dev = NULL;
    CHECK_OK(rn_backend_create("cpu", 1, NULL, &dev));
    if (!dev) return NULL;
    *cpu = dev->ops;
    *fake = **cpu;
    fake->is_host = 0;
    fake->coll_sum = dev_sum;
    fake->coll_sum_round_async = dev_round;
    fake->coll_sum_async = NULL, fake->coll_join = join, fake->coll_id = NULL, fake->coll_init = NULL;
    dev->ops = fake;
    return dev;
}

/* rn_dist's device half: sums of sizes around a bucket's and the world's, over 1 and 3
 * rounds, the parts given from the top in pieces of 7: the (round, rank)-ordered sum bit
 * for bit, as the host half gives (above), the running sums within rn_dist_run_floats */
static void test_device_half(rn_dist *d, int R, int W) {
    int wr = -1, ww = -1;
    CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &wr) == MPI_SUCCESS && MPI_Comm_size(MPI_COMM_WORLD, &ww) == MPI_SUCCESS,
          "MPI_COMM_WORLD's rank and size");
    CHECK(wr == R && ww == W, "rn_dist's rank %d of %d is MPI_COMM_WORLD's %d of %d", R, W, wr, ww);
    if (wr != R || ww != W) return;
    rn_backend_ops fake;
    const rn_backend_ops *cpu = NULL;
    rn_backend *dev = emulated_device(R, W, &fake, NULL, &cpu);
    if (!dev) return;
    const int64_t ns[] = {1, 3, 7, 1001, 20011};
    const size_t buckets[] = {0, 4, 12, 4096, 40000};
    for (size_t b = 0; b < sizeof buckets / sizeof *buckets; b++) {
        rn_dist_set_bucket(d, buckets[b]);
        for (size_t j = 0; j < sizeof ns / sizeof *ns; j++)
            for (int rounds = 1; rounds <= 3; rounds += 2) {
                const int64_t n = ns[j], nrun = rn_dist_run_floats(d, n);
                /* (at most 16 buckets: each is a collective, slow on ranks that share cores) */
                if (buckets[b] && n > 16 * (int64_t)(buckets[b] / sizeof(float))) continue;
                float *x = malloc(sizeof(float) * (size_t)n), *pack = malloc(sizeof(float) * (size_t)n);
                float *scr = malloc(sizeof(float) * (size_t)n);
                float *drun = rounds > 1 ? malloc(sizeof(float) * (size_t)nrun) : NULL;
                run_lo = drun, run_hi = drun ? drun + nrun : NULL, run_outside = 0;
                for (int k = 0; k < rounds; k++) {
                    for (int64_t i = 0; i < n; i++) x[i] = val(R + 17 * k, i);
                    CHECK_OK(rn_dist_sum_begin(d, dev, x, pack, scr, n, "test"));
                    CHECK_OK(rn_dist_sum_round(d, k, rounds, drun, drun ? nrun : 0));
                    for (int64_t hi = n; hi > 0;) {
                        int64_t lo = hi > 7 ? hi - 7 : 0;
                        CHECK_OK(rn_dist_sum_part(d, lo, hi - lo));
                        hi = lo;
                    }
                    CHECK_OK(rn_dist_sum_end(d, NULL));
                }
                int64_t bad = differ_from_sum(x, n, W, rounds);
                if (drun) { /* running sums shorter than rn_dist_run_floats: refused, naming both */
                    CHECK_OK(rn_dist_sum_begin(d, dev, x, pack, scr, n, "test"));
                    CHECK(rn_dist_sum_round(d, 0, rounds, drun, nrun - 1) == RN_EINVAL &&
                              strstr(rn_last_error(), "at least") != NULL,
                          "running sums of %lld floats where %lld are needed: %s", (long long)(nrun - 1),
                          (long long)nrun, rn_last_error());
                    CHECK_OK(rn_dist_sum_end(d, NULL));
                }
                CHECK(bad == 0 && run_outside == 0, "rank %d of %d, device half: %lld floats, buckets of %zu bytes, %d "
                      "rounds: %lld differ from the (round, rank)-ordered sum; %lld chunks outside the %lld running "
                      "sums", R, W, (long long)n, buckets[b], rounds, (long long)bad, (long long)run_outside,
                      (long long)nrun);
                free(x), free(pack), free(scr), free(drun);
            }
    }
    dev->ops = cpu;
    rn_backend_destroy(dev);
}

/* A device bucket that fails (every rank's, so no rank waits for another): the sum fails
 * with the collective's message and its buckets are joined before it returns (the caller
 * frees their memory next), in rn_dist_sum_end's last bucket as in rn_dist_sum_part's
 * (there the caller's rn_dist_sum_cancel joins); then a new sum starts and is right. */
static void test_device_failure(rn_dist *d, int R, int W) {
    rn_backend_ops fake;
    const rn_backend_ops *cpu = NULL;
    rn_backend *dev = emulated_device(R, W, &fake, dev_join, &cpu);
    if (!dev) return;
    /* buckets of 4 floats: 10 go while the parts come, the last (1 float) at the end;
       the third fails, then the last */
    enum { N = 41 };
    float x[N], pack[N], scr[N];
    rn_dist_set_bucket(d, 16);
    for (int c = 0; c < 2; c++) {
        for (int64_t i = 0; i < N; i++) x[i] = val(R, i);
        dev_calls = 0, dev_fail_at = c == 0 ? 2 : 10, dev_joins = 0;
        int rc = rn_dist_sum_begin(d, dev, x, pack, scr, N, "test");
        for (int64_t hi = N; hi > 0 && rc == RN_OK;) {
            int64_t lo = hi > 7 ? hi - 7 : 0;
            rc = rn_dist_sum_part(d, lo, hi - lo);
            hi = lo;
        }
        const int in_part = rc != RN_OK;
        if (rc == RN_OK) rc = rn_dist_sum_end(d, NULL);
        else rn_dist_sum_cancel(d);
        const char *where = c == 0 ? "rn_dist_sum_part" : "rn_dist_sum_end";
        CHECK(rc == RN_EGPU && strstr(rn_last_error(), "injected") != NULL, "a bucket failed in %s: rc %d, %s",
              where, rc, rn_last_error());
        CHECK(in_part == (c == 0), "the failure meant for %s came in the other", where);
        CHECK(dev_joins == 1, "a bucket failed in %s: %d joins after it, want 1 (the buckets' memory is freed next)",
              where, dev_joins);
        /* the next sum starts afresh */
        dev_fail_at = -1;
        for (int64_t i = 0; i < N; i++) x[i] = val(R, i);
        CHECK_OK(rn_dist_sum_begin(d, dev, x, pack, scr, N, "test"));
        CHECK_OK(rn_dist_sum_part(d, 0, N));
        CHECK_OK(rn_dist_sum_end(d, NULL));
        int64_t bad = differ_from_sum(x, N, W, 1);
        CHECK(bad == 0, "the sum after a failed one: %lld of %d differ", (long long)bad, N);
    }
    dev->ops = cpu;
    rn_backend_destroy(dev);
}
#endif

int main(int argc, char **argv) {
    rn_dist *d = NULL;
    if (rn_dist_open(&argc, &argv, rn_cli_launcher_world(), 60, &d) != RN_OK) {
        fprintf(stderr, "test_dist: %s\n", rn_last_error());
        return 1;
    }
    rn_backend *be = NULL;
    CHECK_OK(rn_backend_create("cpu", 1, NULL, &be));
    const int R = rn_dist_rank(d), W = rn_dist_world(d);
    CHECK(R >= 0 && R < W && rn_dist_local_rank(d) < rn_dist_local_world(d), "rank %d of %d", R, W);
    const int64_t ns[] = {1, 2, 3, 5, 7, 10, 11, 1000, 1001, 1003, 65537};
    const size_t buckets[] = {0, 8, 12, 4096};
    for (size_t b = 0; b < sizeof buckets / sizeof *buckets; b++) {
        rn_dist_set_bucket(d, buckets[b]);
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
            int64_t n = ns[k];
            float *x = malloc(sizeof(float) * (size_t)n), *s = malloc(sizeof(float) * (size_t)n);
            for (int64_t i = 0; i < n; i++) x[i] = val(R, i);
            CHECK_OK(rn_dist_sum(d, be, x, s, n, "test"));
            int64_t bad = differ_from_sum(x, n, W, 1);
            CHECK(bad == 0, "rank %d of %d: sum of %lld floats in buckets of %zu bytes: %lld differ from the "
                  "rank-ordered sum", R, W, (long long)n, buckets[b], (long long)bad);
            free(x);
            free(s);
        }
    }
    /* the overlapped sum: parts of odd sizes given in a shuffled order (the backward's
       order is not the array's), one range never given (it stays as it was), progress
       between the parts; every given element is the rank-ordered sum */
    for (size_t b = 0; b < sizeof buckets / sizeof *buckets; b++) {
        rn_dist_set_bucket(d, buckets[b]);
        const int64_t n = 20011, gap_lo = 5000, gap_hi = 5017;
        float *x = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) x[i] = val(R, i);
        CHECK_OK(rn_dist_sum_begin(d, be, x, NULL, NULL, n, "test"));
        /* parts [lo, hi) from a fixed cut of [0, n) less the gap, given odd ones from the
           top, then even ones from the bottom */
        int64_t cut[64][2], nc = 0;
        for (int64_t lo = 0; lo < n; nc++) {
            int64_t hi = lo + 1 + (nc * 7919) % 997;
            if (hi > n) hi = n;
            if (lo < gap_lo && hi > gap_lo) hi = gap_lo;
            if (lo == gap_lo) lo = gap_hi, hi = lo + 1;
            cut[nc][0] = lo, cut[nc][1] = hi;
            lo = hi;
            if (nc == 63) break;
        }
        int64_t last = cut[nc - 1][1];
        for (int64_t j = nc - 1; j >= 0; j -= 2) {
            CHECK_OK(rn_dist_sum_part(d, cut[j][0], cut[j][1] - cut[j][0]));
            CHECK_OK(rn_dist_sum_progress(d));
        }
        for (int64_t j = nc % 2 == 0 ? 0 : 1; j < nc; j += 2)
            CHECK_OK(rn_dist_sum_part(d, cut[j][0], cut[j][1] - cut[j][0]));
        rn_dist_sum_stats st;
        CHECK_OK(rn_dist_sum_end(d, &st));
        int64_t bad = 0, given = 0;
        for (int64_t i = 0; i < n; i++) {
            float acc = val(0, i);
            int in = (i < gap_lo || i >= gap_hi) && i < last;
            for (int r = 1; r < W && in; r++) acc += val(r, i);
            if (!in) acc = val(R, i);
            given += in;
            bad += memcmp(&acc, &x[i], sizeof acc) != 0;
        }
        CHECK(bad == 0, "rank %d of %d: overlapped sum in buckets of %zu bytes: %lld of %lld differ", R, W,
              buckets[b], (long long)bad, (long long)n);
        if (W > 1) {
            int64_t step = buckets[b] ? (int64_t)buckets[b] / 4 : n;
            CHECK(st.floats == given, "overlapped sum: %lld floats given, stats say %lld", (long long)given,
                  (long long)st.floats);
            CHECK(st.buckets == (int)((given + step - 1) / step), "overlapped sum: %d buckets of %lld floats for %lld",
                  st.buckets, (long long)step, (long long)given);
            /* one bucket for all: it can only start at the end; small ones start on the way */
            if (buckets[b] == 0) CHECK(st.started_early == 0, "one bucket started early: %d", st.started_early);
            else CHECK(st.started_early >= st.buckets - 1, "%d of %d buckets started early", st.started_early,
                       st.buckets);
        }
        free(x);
    }
    /* sums over rounds: round k's arrays added onto the running sums, rank 0 first, so
       the result is the left-to-right sum over (round, rank), as one process adds
       micro-batch k x W + r; the parts given from the top in pieces (a round repeats
       round 0's), x untouched before the last round; a round out of turn, or one whose
       parts differ from round 0's, is refused and the next sum starts afresh (a world of
       one sums nothing) */
    for (size_t b = 0; W > 1 && b < sizeof buckets / sizeof *buckets; b++) {
        rn_dist_set_bucket(d, buckets[b]);
        for (int rounds = 1; rounds <= 3; rounds++) {
            const int64_t n = 3001, piece = 457;
            float *x = malloc(sizeof(float) * (size_t)n);
            int64_t moved = 0;
            for (int k = 0; k < rounds; k++) {
                for (int64_t i = 0; i < n; i++) x[i] = val(R + 17 * k, i);
                CHECK_OK(rn_dist_sum_begin(d, be, x, NULL, NULL, n, "test"));
                CHECK_OK(rn_dist_sum_round(d, k, rounds, NULL, 0));
                for (int64_t hi = n; hi > 0; hi -= piece) CHECK_OK(rn_dist_sum_part(d, hi > piece ? hi - piece : 0,
                                                                                   hi > piece ? piece : hi));
                CHECK_OK(rn_dist_sum_end(d, NULL));
                for (int64_t i = 0; k < rounds - 1 && i < n; i++) moved += x[i] != val(R + 17 * k, i);
            }
            int64_t bad = differ_from_sum(x, n, W, rounds);
            CHECK(bad == 0 && moved == 0, "rank %d of %d: %d rounds in buckets of %zu bytes: %lld of %lld differ from "
                  "the (round, rank)-ordered sum, %lld written before the last round", R, W, rounds, buckets[b],
                  (long long)bad, (long long)n, (long long)moved);
            free(x);
        }
    }
    /* the running sums take this rank's chunk of each bucket: rn_dist_run_floats bounds
       their sum for every rank, about n / W */
    for (size_t b = 0; b < sizeof buckets / sizeof *buckets; b++) {
        rn_dist_set_bucket(d, buckets[b]);
        const int64_t ns[] = {1, 7, 3001, 1 << 20};
        for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
            int64_t n = ns[j], step = buckets[b] ? (int64_t)(buckets[b] / sizeof(float)) : n, most = 0, nb = 0;
            if (step < 1) step = 1;
            for (int r = 0; r < W; r++) {
                int64_t sum = 0;
                for (int64_t lo = 0; lo < n; lo += step) {
                    int64_t m = lo + step < n ? step : n - lo;
                    sum += m * (r + 1) / W - m * r / W;
                    nb += r == 0;
                }
                most = sum > most ? sum : most;
            }
            int64_t got = rn_dist_run_floats(d, n);
            CHECK(got >= most && got <= n / W + nb, "%lld floats in buckets of %zu bytes over %d ranks: running sums of "
                  "%lld floats (a rank needs %lld, %lld buckets)", (long long)n, buckets[b], W, (long long)got,
                  (long long)most, (long long)nb);
        }
    }
#if RN_HAVE_MPI
    if (W > 1) test_device_half(d, R, W);
    if (W > 1) test_device_failure(d, R, W);
#endif
    if (W > 1) {
        float y[8] = {0};
        CHECK_OK(rn_dist_sum_begin(d, be, y, NULL, NULL, 8, "test"));
        CHECK(rn_dist_sum_round(d, 1, 2, NULL, 0) == RN_EINVAL, "round 1 without round 0 is refused");
        CHECK_OK(rn_dist_sum_end(d, NULL)); /* (nothing given: nothing summed) */
        CHECK_OK(rn_dist_sum_begin(d, be, y, NULL, NULL, 8, "test"));
        CHECK_OK(rn_dist_sum_round(d, 0, 2, NULL, 0));
        CHECK_OK(rn_dist_sum_part(d, 0, 8));
        CHECK_OK(rn_dist_sum_end(d, NULL));
        CHECK_OK(rn_dist_sum_begin(d, be, y, NULL, NULL, 8, "test"));
        CHECK_OK(rn_dist_sum_round(d, 1, 2, NULL, 0));
        CHECK(rn_dist_sum_part(d, 0, 4) == RN_EINVAL, "a part round 0 did not give is refused");
        CHECK(strstr(rn_last_error(), "is not round 0's") != NULL, "message: %s", rn_last_error());
        CHECK(rn_dist_sum_end(d, NULL) == RN_EINVAL, "a round that gave fewer parts than round 0 fails");
        CHECK_OK(rn_dist_sum_begin(d, be, y, NULL, NULL, 8, "test"));
        CHECK(rn_dist_sum_round(d, 1, 2, NULL, 0) == RN_EINVAL, "after a failure the rounds start again at 0");
        CHECK_OK(rn_dist_sum_end(d, NULL));
    }
    /* gathers: rank order, different sizes to rank 0 */
    int64_t mine[2] = {R, 10 * R}, *all = malloc(sizeof mine * (size_t)W);
    CHECK_OK(rn_dist_allgather(d, mine, sizeof mine, all, "test"));
    for (int r = 0; r < W; r++) CHECK(all[2 * r] == r && all[2 * r + 1] == 10 * r, "allgather slot %d", r);
    free(all);
    unsigned char part[4] = {(unsigned char)R, (unsigned char)R, (unsigned char)R, (unsigned char)R};
    void *got = NULL;
    size_t total = 0;
    CHECK_OK(rn_dist_gather0(d, part, (size_t)R % 4, &got, &total, "test"));
    if (R == 0) {
        size_t want = 0, at = 0;
        for (int r = 0; r < W; r++) want += (size_t)r % 4;
        CHECK(total == want, "gather0: %zu bytes, not %zu", total, want);
        for (int r = 0; r < W && total == want; r++)
            for (int j = 0; j < r % 4; j++) CHECK(((unsigned char *)got)[at++] == r, "gather0: rank %d's bytes", r);
    } else {
        CHECK(got == NULL && total == 0, "gather0 on rank %d gives nothing", R);
    }
    free(got);
    int64_t v = R == W - 1 ? 7 : R;
    CHECK_OK(rn_dist_max_i64(d, &v, "test"));
    CHECK(v == (W > 7 ? W - 2 : 7), "max: %lld", (long long)v);
    int64_t root = R == 0 ? 42 : -1;
    CHECK_OK(rn_dist_bcast(d, &root, sizeof root, 0, "test"));
    CHECK(root == 42, "bcast: %lld", (long long)root);
    rn_backend_destroy(be);
    rn_dist_close(d);
    char name[64];
    snprintf(name, sizeof name, W > 1 ? "test_dist rank %d of %d" : "test_dist", R, W);
    return check_done(name);
}
