/* Data parallelism across processes: MPI for the world, the host collectives and the
 * NCCL bootstrap; a watchdog thread that ends a process whose collective waits too long. */
#include "rn/dist.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rn/err.h"

#ifdef RN_HAVE_MPI
#include <mpi.h>
#endif

struct rn_dist {
    int rank, world, local_rank, local_world;
    int many;            /* the collectives run: world > 1, or RN_DIST_SOLO=1 */
    int mpi;             /* MPI was initialised by rn_dist_open */
    double timeout;
    size_t bucket;       /* bytes per bucket of rn_dist_sum (0: one) */
    /* the watchdog: the collective in progress (op[0] = 0: none) since when */
    pthread_t dog;
    int dog_started, dog_stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char op[96];
    double since;
    /* the overlapped sum (rn_dist_sum_begin .. rn_dist_sum_end): x's parts copied into
       pack in the order given, cut into buckets there, recv the other ranks' chunks */
    int active;
    rn_backend *dev;               /* a device backend's sum (its pack and scratch), else NULL */
    float *x, *pack, *recv, *dpack, *dscratch;
    int64_t n, cap, fill, open_lo; /* floats: x's, pack's room, given so far, the open bucket's start */
    int64_t nseg, segcap;
    int64_t (*seg)[3];             /* (offset in x, offset in pack, floats) per part */
    struct obucket *b;
    int nb, bcap, first, next_gather, started_early, done_early;
    /* rounds (rn_dist_sum_round): this sum is round `round` of `rounds`; the running sums
       of this rank's chunks live in run (a device backend's: drun), one after the other
       in bucket order (run_fill: floats so far this round), about n / world floats
       (rn_dist_run_floats).
       Round 0's parts (seg) are the layout every later round must repeat. ended: the
       rounds of a sum of ended_n floats in ended_of rounds done so far (0: none) */
    int round, rounds, ended, ended_of;
    float *run, *drun;
    int64_t run_cap, run_fill, ended_n, nseg0;
    size_t ended_bucket;
    char what[96];
    /* heartbeats (rank 0 names the ranks a timed-out collective waits for): collectives
       started so far on each channel (HB_WORLD: MPI_COMM_WORLD's, waited at once;
       HB_EX, HB_AG: the buckets' exchanges and gathers, each in the same order on every
       rank; on a device, HB_EX counts the NCCL sums, bucket by bucket); the one the main
       thread waits for (wait_ch < 0: none known); rank 0: every rank's counts as last
       heard (world x HB_CH, under mu) */
    int64_t cnt[3], sent[3], hb_out[4], hb_in[4];
    int64_t *hb_last, wait_idx;
    double hb_at, *hb_when; /* this rank's last heartbeat sent; rank 0: when each was heard */
    double polled;          /* the last heartbeat poll from inside a device's wait (dev_poll) */
    int wait_ch, hb_on, hb_closed, byes;
#ifdef RN_HAVE_MPI
    MPI_Comm hb;                /* the heartbeats' own communicator */
    MPI_Request hb_send, hb_recv; /* this rank's heartbeat in flight; rank 0's next one */
    MPI_Comm local;
    MPI_Comm ex, ag; /* the buckets' exchanges and gathers: each started in bucket order on
                        every rank, on a communicator of its own, as MPI wants */
#endif
};

/* One bucket of the overlapped sum: pack[lo, lo + n). */
enum { B_EXCH = 1, B_EXCHANGED, B_GATHER, B_DONE };
enum { HB_WORLD, HB_EX, HB_AG, HB_CH };
struct obucket {
    int64_t lo, n;
    int64_t run_off; /* where its chunk's running sums start in run (rounds) */
    int64_t ex_idx, ag_idx; /* its exchange's and gather's places on HB_EX and HB_AG */
    int phase;
    int *cnt;     /* (5, world): counts and displacements, alive until the collective ends */
    float *own;   /* the other ranks' chunks when recv's room is too small (tiny buckets) */
#ifdef RN_HAVE_MPI
    MPI_Request req;
#endif
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int rn_dist_built(void) {
#ifdef RN_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

/* no collective runs: every one is a copy or nothing */
static int alone(const rn_dist *d) { return !d || !d->many; }

int rn_dist_many(const rn_dist *d) { return !alone(d); }
int rn_dist_rank(const rn_dist *d) { return d ? d->rank : 0; }
int rn_dist_world(const rn_dist *d) { return d ? d->world : 1; }
int rn_dist_local_rank(const rn_dist *d) { return d ? d->local_rank : 0; }
int rn_dist_local_world(const rn_dist *d) { return d ? d->local_world : 1; }
double rn_dist_timeout(const rn_dist *d) { return d ? d->timeout : RN_DIST_TIMEOUT; }
void rn_dist_set_bucket(rn_dist *d, size_t bytes) {
    if (d) d->bucket = bytes;
}
size_t rn_dist_bucket(const rn_dist *d) { return d ? d->bucket : 0; }

/* Chunk r of a bucket of n floats over W ranks is [n*r/W, n*(r+1)/W): its length. */
static int64_t chunk_len(int64_t n, int r, int W) { return n * (r + 1) / W - n * r / W; }

/* Floats per bucket of a sum of n floats (--bucket-mb; 0: one bucket of all), the cut
 * every sum makes: whole buckets from its start, then the rest. */
static int64_t bucket_floats(const rn_dist *d, int64_t n) {
    int64_t step = d && d->bucket ? (int64_t)(d->bucket / sizeof(float)) : n;
    return step < 1 ? 1 : step;
}

int64_t rn_dist_run_floats(const rn_dist *d, int64_t n) {
    int W = d ? d->world : 1;
    int64_t step = bucket_floats(d, n);
    if (n <= 0) return 0;
    /* whole buckets of step floats, then the rest; a chunk is at most ceil(bucket / W) */
    return n / step * ((step + W - 1) / W) + (n % step + W - 1) / W;
}

#ifdef RN_HAVE_MPI
/* Rank 0, at a timeout (mu held): the ranks it waits for, into who. A rank that waits in
 * a collective says so at least every half second (hb_poll); one silent for longer than
 * HB_SILENT seconds is not waiting with the others (it died, hangs, or computes without
 * end), and one whose counts say it has not started this collective waits elsewhere. */
#define HB_SILENT 1.5
#define HB_GRACE 3.0 /* seconds the other ranks wait past the timeout, after rank 0 */
static void missing(const rn_dist *d, char *who, size_t cap) {
    int n = 0, len = 0;
    double t = now();
    char list[240] = "";
    for (int r = 1; r < d->world; r++) {
        double quiet = t - d->hb_when[r];
        int ended = d->hb_when[r] < 0, behind = d->hb_last[(size_t)r * HB_CH + d->wait_ch] < d->wait_idx;
        if (!ended && quiet <= HB_SILENT && !behind) continue;
        if (++n > 4 || len > (int)sizeof list - 64) continue;
        const char *sep = n > 1 ? "; " : "";
        if (ended)
            len += snprintf(list + len, sizeof list - (size_t)len, "%srank %d has ended its run", sep, r);
        else if (quiet > HB_SILENT && d->hb_when[r] > 0)
            len += snprintf(list + len, sizeof list - (size_t)len, "%srank %d silent for %.0f s: it died or hangs",
                            sep, r, quiet);
        else if (quiet > HB_SILENT)
            len += snprintf(list + len, sizeof list - (size_t)len, "%srank %d never heard from: it died or hangs",
                            sep, r);
        else
            len += snprintf(list + len, sizeof list - (size_t)len, "%srank %d waits in another collective", sep, r);
    }
    if (n == 0) snprintf(who, cap, "every other rank waits in it too (a network or MPI fault?)");
    else snprintf(who, cap, "%s%s", list, n > 4 ? "; ..." : "");
}

/* The watchdog wakes four times a second; a collective that has waited past the timeout
 * means another rank died or hangs: say which operation (rank 0: which ranks it waits
 * for) and end this process (exit status 1), which makes mpirun stop the job. It never
 * calls MPI (only the main thread may). */
static void *watch(void *arg) {
    rn_dist *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->dog_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000; /* a quarter of a second */
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&d->cv, &d->mu, &ts);
        /* (the other ranks wait HB_GRACE s more, so that rank 0, which hears every
           rank's heartbeats, speaks first and names the ranks missing) */
        double limit = d->timeout + (d->rank && d->hb_on ? HB_GRACE : 0);
        if (d->op[0] && now() - d->since > limit) {
            char who[160] = "a rank died or hangs";
            if (d->hb_last && d->wait_ch >= 0) missing(d, who, sizeof who);
            fprintf(stderr,
                    "rank %d: no answer from the other ranks for %.0f s in %s (--dist-timeout %.0f): %s; stopping "
                    "this one (the last checkpoint written stays as it was)\n",
                    d->rank, now() - d->since, d->op, d->timeout, who);
            fflush(stderr);
            _exit(1);
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}
#endif

/* The main thread waits for a collective: what it is, and (ch >= 0) which one, the
 * idx-th started on channel ch, for rank 0's report of who has not started it. */
static void op_wait(rn_dist *d, const char *what, int ch, int64_t idx) {
    pthread_mutex_lock(&d->mu);
    snprintf(d->op, sizeof d->op, "%s", what);
    d->since = now();
    d->wait_ch = ch;
    d->wait_idx = idx;
    pthread_mutex_unlock(&d->mu);
}
static void op_begin(rn_dist *d, const char *what) { op_wait(d, what, -1, 0); }

static void op_end(rn_dist *d) {
    pthread_mutex_lock(&d->mu);
    d->op[0] = 0;
    d->wait_ch = -1;
    pthread_mutex_unlock(&d->mu);
}

#ifdef RN_HAVE_MPI
/* Heartbeats. Each rank but 0 tells rank 0 its collective counts (cnt) when they have
 * changed and its last heartbeat has gone (one in flight at most: no queue, no wait), at
 * every collective started and while it waits; rank 0 takes them in while it waits, and
 * at the end each rank's last one (hb_out[3] = -1) before MPI_Finalize. Main thread. */
static void hb_poll(rn_dist *d, int waiting) {
    if (!d->hb_on || d->hb_closed) return;
    int done = 0;
    if (d->rank != 0) {
        if (d->hb_send != MPI_REQUEST_NULL &&
            (MPI_Test(&d->hb_send, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done))
            return;
        /* changed counts go at once while waiting, at most every quarter second otherwise
           (the waits send what is left); unchanged ones every half second while waiting */
        int same = memcmp(d->sent, d->cnt, sizeof d->cnt) == 0;
        if (same && !waiting) return;
        double t = now();
        if (t - d->hb_at < (same ? 0.5 : waiting ? 0 : 0.25)) return;
        d->hb_at = t;
        memcpy(d->sent, d->cnt, sizeof d->cnt);
        memcpy(d->hb_out, d->cnt, sizeof d->cnt);
        d->hb_out[3] = 0;
        if (MPI_Isend(d->hb_out, 4, MPI_INT64_T, 0, 0, d->hb, &d->hb_send) != MPI_SUCCESS)
            d->hb_send = MPI_REQUEST_NULL; /* (a failed send: rank 0 hears less, nothing else) */
        return;
    }
    MPI_Status st;
    while (d->hb_recv != MPI_REQUEST_NULL && MPI_Test(&d->hb_recv, &done, &st) == MPI_SUCCESS && done) {
        int r = st.MPI_SOURCE;
        if (r > 0 && r < d->world) {
            pthread_mutex_lock(&d->mu);
            if (d->hb_in[3] < 0) d->byes++, d->hb_when[r] = -1; /* its last: it ended its run */
            else memcpy(d->hb_last + (size_t)r * HB_CH, d->hb_in, sizeof(int64_t) * HB_CH), d->hb_when[r] = now();
            pthread_mutex_unlock(&d->mu);
        }
        if (d->byes < d->world - 1 &&
            MPI_Irecv(d->hb_in, 4, MPI_INT64_T, MPI_ANY_SOURCE, 0, d->hb, &d->hb_recv) != MPI_SUCCESS)
            d->hb_recv = MPI_REQUEST_NULL;
    }
}

/* A collective started on channel ch: its place there (1, 2, ...) */
static int64_t started(rn_dist *d, int ch) {
    int64_t idx = ++d->cnt[ch];
    hb_poll(d, 0);
    return idx;
}

/* The run's end: every rank's last heartbeat is in before MPI_Finalize (no send left
 * in flight), under the watchdog. */
static void hb_close(rn_dist *d) {
    if (!d->hb_on || d->hb_closed) return;
    op_begin(d, "the end of the run (each rank's last heartbeat)");
    if (d->rank != 0) {
        if (d->hb_send != MPI_REQUEST_NULL) MPI_Wait(&d->hb_send, MPI_STATUS_IGNORE);
        d->hb_out[3] = -1;
        MPI_Send(d->hb_out, 4, MPI_INT64_T, 0, 0, d->hb);
    } else {
        while (d->byes < d->world - 1 && d->hb_recv != MPI_REQUEST_NULL) {
            hb_poll(d, 1);
            sched_yield();
        }
    }
    op_end(d);
    d->hb_closed = 1;
}

/* Called by a device backend while it waits for NCCL (rn_backend_coll_set_poll): the
 * heartbeats go on as in the host's waits, at most once a millisecond. */
static void dev_poll(void *arg) {
    rn_dist *d = arg;
    double t = now();
    if (t - d->polled < 1e-3) return;
    d->polled = t;
    hb_poll(d, 1);
}
#else
static int64_t started(rn_dist *d, int ch) { return ++d->cnt[ch]; }
#endif

/* The overlapped sum's buckets freed (their collectives ended, or the run is failing). */
static void free_buckets(rn_dist *d) {
    for (int i = 0; d->b && i < d->nb; i++) { /* (a device sum counts buckets, keeps none) */
        free(d->b[i].cnt);
        free(d->b[i].own);
    }
    free(d->b);
    d->b = NULL;
    d->nb = d->bcap = 0;
    d->active = 0;
    d->ended = 0; /* (a sum in rounds that failed starts again at round 0) */
}

/* A sum ended well: the next round may follow. */
static void round_ended(rn_dist *d) {
    if (d->round == 0) d->nseg0 = d->nseg;
    free_buckets(d);
    d->ended = d->round + 1 < d->rounds ? d->round + 1 : 0;
    d->ended_of = d->rounds;
    d->ended_n = d->n;
    d->ended_bucket = d->bucket;
}

#ifdef RN_HAVE_MPI
static int mpi_fail(int err, const char *call, const char *what) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(err, msg, &len);
    return rn_errorf(RN_EIO, "%s (%s): %s", call, what, msg);
}
#define MPI_CHECK(call, what)                                  \
    do {                                                       \
        int e_ = (call);                                       \
        if (e_ != MPI_SUCCESS) return mpi_fail(e_, #call, what); \
    } while (0)
#endif

int rn_dist_open(int *argc, char ***argv, int launched, double timeout_s, rn_dist **out) {
    *out = NULL;
    if (!(timeout_s > 0))
        return rn_errorf(RN_EINVAL, "--dist-timeout %g: give a number of seconds above 0", timeout_s);
    const char *so = getenv("RN_DIST_SOLO");
    int solo = so && strcmp(so, "1") == 0;
    if (so && !solo && strcmp(so, "0") != 0 && so[0])
        return rn_errorf(RN_EINVAL, "RN_DIST_SOLO=%s: give 1 (one process runs the collectives with itself) or 0", so);
#ifndef RN_HAVE_MPI
    if (solo)
        return rn_errorf(RN_ENOTSUP, "RN_DIST_SOLO=1 runs the collectives of many processes, but this build has no MPI "
                         "(USE_MPI=0): rebuild with Open MPI, or unset it");
    if (launched > 1)
        return rn_errorf(RN_ENOTSUP,
                         "started as one of %d processes, but this build has no MPI (USE_MPI=0): every process "
                         "would train alone; rebuild with Open MPI (make deps installs libopenmpi-dev, then make), "
                         "or run one process",
                         launched);
#endif
    rn_dist *d = rn_calloc(1, sizeof *d);
    if (!d) return RN_ENOMEM;
    d->world = d->local_world = 1;
    d->timeout = timeout_s;
    d->wait_ch = -1;
#ifdef RN_HAVE_MPI
    d->local = d->ex = d->ag = d->hb = MPI_COMM_NULL;
    d->hb_send = d->hb_recv = MPI_REQUEST_NULL;
#endif
    d->bucket = (size_t)(RN_DIST_BUCKET_MB * 1e6);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    *out = d;
#ifdef RN_HAVE_MPI
    if (launched > 1 || solo) {
        int provided = 0, rc;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return rn_errorf(RN_EIO, "MPI_Init_thread failed: is this process started by mpirun or srun --mpi=pmix?");
        d->mpi = 1;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank), "world");
        MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &d->world), "world");
        d->many = d->world > 1 || solo;
        MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &d->local),
                  "local ranks");
        MPI_CHECK(MPI_Comm_rank(d->local, &d->local_rank), "local ranks");
        MPI_CHECK(MPI_Comm_size(d->local, &d->local_world), "local ranks");
        MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &d->ex), "the gradient sum's communicators");
        MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &d->ag), "the gradient sum's communicators");
        if (d->world > 1) {
            MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &d->hb), "the heartbeats' communicator");
            if (d->rank == 0) {
                if (!(d->hb_last = rn_calloc((size_t)d->world * HB_CH, sizeof(int64_t))) ||
                    !(d->hb_when = rn_calloc((size_t)d->world, sizeof(double))))
                    return RN_ENOMEM;
                MPI_CHECK(MPI_Irecv(d->hb_in, 4, MPI_INT64_T, MPI_ANY_SOURCE, 0, d->hb, &d->hb_recv), "heartbeats");
            }
            d->hb_on = 1;
        }
        if ((rc = pthread_create(&d->dog, NULL, watch, d)))
            return rn_errorf(RN_ENOMEM, "cannot start the collectives' watchdog thread (%s)", strerror(rc));
        d->dog_started = 1;
    }
#else
    (void)argc, (void)argv;
#endif
    return RN_OK;
}

void rn_dist_close(rn_dist *d) {
    if (!d) return;
#ifdef RN_HAVE_MPI
    if (d->mpi) hb_close(d); /* (under the watchdog) */
#endif
    if (d->dog_started) {
        pthread_mutex_lock(&d->mu);
        d->dog_stop = 1;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->dog, NULL);
    }
#ifdef RN_HAVE_MPI
    if (d->mpi) {
        if (d->hb != MPI_COMM_NULL) MPI_Comm_free(&d->hb);
        if (d->local != MPI_COMM_NULL) MPI_Comm_free(&d->local);
        if (d->ex != MPI_COMM_NULL) MPI_Comm_free(&d->ex);
        if (d->ag != MPI_COMM_NULL) MPI_Comm_free(&d->ag);
        MPI_Finalize();
    }
#endif
    free_buckets(d);
    free(d->pack);
    free(d->recv);
    free(d->run);
    free(d->seg);
    free(d->hb_last);
    free(d->hb_when);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
}

void rn_dist_abort(rn_dist *d, int code) {
#ifdef RN_HAVE_MPI
    if (d && d->mpi) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    (void)d;
    exit(code);
}

int rn_dist_attach(rn_dist *d, rn_backend *be) {
    if (alone(d) || !rn_backend_has_coll(be)) return RN_OK;
    unsigned char id[512];
    size_t len = 0;
    int rc = d->rank == 0 ? rn_backend_coll_id(be, id, sizeof id, &len) : RN_OK;
    /* a failure on rank 0 still broadcasts (length 0), so the others fail too, not wait */
    uint64_t l64 = rc ? 0 : len;
    int brc = rn_dist_bcast(d, &l64, sizeof l64, 0, "the NCCL id's length");
    if (rc) return rc;
    if (brc) return brc;
    if (l64 == 0 || l64 > sizeof id)
        return rn_errorf(RN_EGPU, "rank 0 could not make the NCCL communicator's id (see rank 0's message)");
    if ((rc = rn_dist_bcast(d, id, (size_t)l64, 0, "the NCCL id"))) return rc;
    double limit = d->timeout;
#ifdef RN_HAVE_MPI
    /* the watchdog times the waits for NCCL as it times MPI's, rank 0 first naming the
       ranks it waits for (the heartbeats go on from inside the backend's waits): the
       backend's own limit, past every rank's watchdog, is for the waits outside it */
    if (d->hb_on) limit += HB_GRACE + 2;
#endif
#ifdef RN_HAVE_MPI
    if (d->hb_on) rn_backend_coll_set_poll(be, dev_poll, d);
#endif
    /* under the watchdog, counted as a collective of the world as every later one, so
       that rank 0 names a rank that never comes (every rank attaches at this point) */
    op_wait(d, "the NCCL communicator's init", HB_WORLD, started(d, HB_WORLD));
    rc = rn_backend_coll_init(be, d->rank, d->world, id, (size_t)l64, limit);
    op_end(d);
    return rc;
}

#ifdef RN_HAVE_MPI
/* Wait for req under the watchdog (a blocking MPI call cannot be timed from inside). */
static int wait_req(rn_dist *d, MPI_Request *req, const char *what) {
    op_wait(d, what, HB_WORLD, started(d, HB_WORLD));
    /* MPI_Wait spins: a rank that waits for a slower one would take a core from the
       loader's and the compute threads of its own node (the ranks share the cores);
       test and yield instead, as Open MPI's mpi_yield_when_idle does */
    int done = 0, e;
    while ((e = MPI_Test(req, &done, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !done) {
        hb_poll(d, 1);
        sched_yield();
    }
    op_end(d);
    return e == MPI_SUCCESS ? RN_OK : mpi_fail(e, "MPI_Test", what);
}

/* The overlapped sum on host memory. Bucket b is pack[lo, lo + n): its chunk r
 * ([n*r/W, n*(r+1)/W), fixed by n and W) goes to rank r (an all-to-all on d->ex), which
 * adds the world's copies of it in rank order (its own copy stays in pack), then every
 * rank gathers the sums (an all-gather on d->ag). The same split and order as the CUDA
 * backend's NCCL version (cuda_coll_sum). Exchanges start in bucket order as the parts
 * arrive, gathers in bucket order as the exchanges finish, so each communicator sees the
 * same sequence on every rank whatever the timing. */
static int bucket_start(rn_dist *d, int64_t lo, int64_t n) {
    int W = d->world, R = d->rank;
    if (W > 1024) return rn_errorf(RN_EINVAL, "%d ranks: rn's collectives take up to 1024", W);
    if (n / W > 0x7fffffff)
        return rn_errorf(RN_EINVAL, "%s: a bucket of %lld floats is too large", d->what, (long long)n);
    if (d->nb == d->bcap) {
        int cap = d->bcap ? 2 * d->bcap : 64;
        struct obucket *nb = realloc(d->b, sizeof *nb * (size_t)cap);
        if (!nb) return rn_errorf(RN_ENOMEM, "%s: no memory for %d buckets", d->what, cap);
        d->b = nb;
        d->bcap = cap;
    }
    struct obucket *b = &d->b[d->nb];
    *b = (struct obucket){.lo = lo, .n = n};
    if (!(b->cnt = rn_calloc(5 * (size_t)W, sizeof(int)))) return RN_ENOMEM;
    d->nb++; /* (counted now, so that a failure below frees it) */
    int *cnt = b->cnt, *dsp = cnt + W, *scnt = dsp + W, *rcnt = scnt + W, *rdsp = rcnt + W;
    for (int r = 0; r < W; r++) {
        int64_t clo = n * r / W, chi = n * (r + 1) / W;
        cnt[r] = (int)(chi - clo);
        dsp[r] = (int)clo;
    }
    int mine = cnt[R];
    b->run_off = d->run_fill;
    d->run_fill += mine;
    for (int r = 0, slot = 0; r < W; r++) {
        if (r == R) continue; /* nothing to or from this rank itself */
        scnt[r] = cnt[r];
        rcnt[r] = mine;
        rdsp[r] = slot++ * mine;
    }
    /* the other ranks' copies need (W-1)*mine floats: more than the bucket's own room in
     * recv only for a bucket of fewer than about W*W floats */
    if ((int64_t)(W - 1) * mine > n && !(b->own = rn_malloc(sizeof(float) * (size_t)(W - 1) * (size_t)mine)))
        return RN_ENOMEM;
    float *recv = b->own ? b->own : d->recv + lo;
    int e = MPI_Ialltoallv(d->pack + lo, scnt, dsp, MPI_FLOAT, recv, rcnt, rdsp, MPI_FLOAT, d->ex, &b->req);
    if (e != MPI_SUCCESS) return mpi_fail(e, "MPI_Ialltoallv", d->what);
    b->ex_idx = started(d, HB_EX);
    b->phase = B_EXCH;
    return RN_OK;
}

/* ((x0 + x1) + ...) + xW-1, element by element, in loops that vectorise: the ranks before
 * this one fold into recv's first copy, then this rank's own, then the rest; then the
 * gather of the sums. */
static int bucket_gather(rn_dist *d, struct obucket *b) {
    int W = d->world, R = d->rank, *cnt = b->cnt, *dsp = cnt + W, mine = cnt[R];
    float *acc = d->pack + b->lo + dsp[R], *first = b->own ? b->own : d->recv + b->lo;
    if (d->rounds > 1) {
        /* rounds: the running sum of this chunk, ((run + x0) + x1) + ..., round 0 starting
           from x0; before the last round nothing is gathered */
        float *run = d->run + b->run_off;
        for (int r = 0; r < W; r++) {
            const float *p = r == R ? acc : first + (size_t)(r < R ? r : r - 1) * mine;
            if (r == 0 && d->round == 0) memcpy(run, p, sizeof(float) * (size_t)mine);
            else
                for (int i = 0; i < mine; i++) run[i] += p[i];
        }
        if (d->round < d->rounds - 1) {
            b->phase = B_DONE;
            return RN_OK;
        }
        memcpy(acc, run, sizeof(float) * (size_t)mine);
    } else {
        for (int r = 1; r < R; r++) {
            const float *p = first + (size_t)r * mine;
            for (int i = 0; i < mine; i++) first[i] += p[i];
        }
        if (R > 0)
            for (int i = 0; i < mine; i++) acc[i] = first[i] + acc[i];
        for (int r = R + 1; r < W; r++) {
            const float *p = first + (size_t)(r - 1) * mine;
            for (int i = 0; i < mine; i++) acc[i] += p[i];
        }
    }
    int e = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d->pack + b->lo, cnt, dsp, MPI_FLOAT, d->ag, &b->req);
    if (e != MPI_SUCCESS) return mpi_fail(e, "MPI_Iallgatherv", d->what);
    b->ag_idx = started(d, HB_AG);
    b->phase = B_GATHER;
    return RN_OK;
}

/* One look at every bucket in flight (MPI_Test also moves Open MPI's schedules on). */
static int progress(rn_dist *d) {
    for (int i = d->first; i < d->nb; i++) {
        struct obucket *b = &d->b[i];
        int done = 0, e, rc;
        if (b->phase == B_EXCH) {
            if ((e = MPI_Test(&b->req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
                return mpi_fail(e, "MPI_Test", d->what);
            if (done) b->phase = B_EXCHANGED;
        }
        if (b->phase == B_EXCHANGED && i == d->next_gather) {
            if ((rc = bucket_gather(d, b))) return rc;
            d->next_gather++;
        }
        if (b->phase == B_GATHER) {
            if ((e = MPI_Test(&b->req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
                return mpi_fail(e, "MPI_Test", d->what);
            if (done) b->phase = B_DONE;
        }
    }
    while (d->first < d->nb && d->b[d->first].phase == B_DONE) {
        free(d->b[d->first].cnt);
        free(d->b[d->first].own);
        d->b[d->first].cnt = NULL;
        d->b[d->first].own = NULL;
        d->first++;
    }
    return RN_OK;
}

/* Wait (under the watchdog) until at most `left` buckets are in flight. As wait_req,
 * test and yield rather than spin in MPI_Wait. */
static int drain(rn_dist *d, int left) {
    int rc = progress(d);
    if (rc || d->nb - d->first <= left) return rc;
    op_begin(d, d->what);
    while ((rc = progress(d)) == RN_OK && d->nb - d->first > left) {
        /* the collective waited for: the oldest bucket's exchange or gather */
        const struct obucket *b = &d->b[d->first];
        int ch = b->phase == B_EXCH ? HB_EX : b->phase == B_GATHER ? HB_AG : -1;
        int64_t idx = ch == HB_EX ? b->ex_idx : b->ag_idx;
        if (ch != d->wait_ch || idx != d->wait_idx) {
            pthread_mutex_lock(&d->mu);
            d->wait_ch = ch;
            d->wait_idx = idx;
            pthread_mutex_unlock(&d->mu);
        }
        hb_poll(d, 1);
        sched_yield();
    }
    op_end(d);
    return rc;
}
#endif

/* buckets in flight at most: each holds a request and its count arrays */
#define MAX_IN_FLIGHT 64

int rn_dist_sum_begin(rn_dist *d, rn_backend *be, float *x, float *pack, float *scratch, int64_t n, const char *what) {
    if (alone(d)) return RN_OK;
    if (d->active) return rn_errorf(RN_EINVAL, "%s: a sum of the %s is still in progress", what, d->what);
    int ended = d->ended; /* (a round of a sum over rounds may follow) */
    free_buckets(d);
    d->ended = ended;
    d->dev = rn_backend_is_host(be) ? NULL : be;
    if (d->dev && !rn_backend_has_coll(be))
        return rn_errorf(RN_ENOTSUP, "%s: the %s backend has no collectives (a build without NCCL)", what,
                         rn_backend_name(be));
    if (d->dev && (!pack || !scratch))
        return rn_errorf(RN_EINVAL, "the sum of the %s on %s: give pack and scratch buffers", what,
                         rn_backend_name(be));
    if (!d->dev && n > d->cap) {
        free(d->pack);
        free(d->recv);
        d->recv = NULL;
        d->cap = 0;
        if (!(d->pack = rn_malloc(sizeof(float) * (size_t)n)) || !(d->recv = rn_malloc(sizeof(float) * (size_t)n)))
            return rn_errorf(RN_ENOMEM, "the sum of the %s: no memory for 2 x %lld floats", what, (long long)n);
        d->cap = n;
    }
    d->dpack = pack;
    d->dscratch = scratch;
    snprintf(d->what, sizeof d->what, "the sum of the %s", what);
    d->x = x;
    d->n = n;
    d->round = 0;
    d->rounds = 1;
    d->fill = d->open_lo = d->nseg = d->run_fill = 0;
    d->first = d->next_gather = d->started_early = d->done_early = 0;
    d->active = 1;
    return RN_OK;
}

int rn_dist_sum_round(rn_dist *d, int round, int rounds, float *run, int64_t run_len) {
    if (alone(d)) return RN_OK;
    if (!d->active || d->fill || d->round || d->rounds != 1)
        return rn_errorf(RN_EINVAL, "rn_dist_sum_round: right after rn_dist_sum_begin, before any part");
    if (rounds < 1 || round < 0 || round >= rounds)
        return rn_errorf(RN_EINVAL, "%s: round %d of %d", d->what, round, rounds);
    /* (a later round's running sums are where round 0 left them: the same chunks, and on
       a device the same buffer, d->drun still the round before's) */
    if (round > 0 && (d->ended != round || d->ended_of != rounds || d->ended_n != d->n ||
                      d->ended_bucket != d->bucket || (d->dev && d->drun != run)))
        return rn_errorf(RN_EINVAL, "%s: round %d of %d of %lld floats follows %s", d->what, round, rounds,
                         (long long)d->n, d->ended ? "another sum (or other buckets, another buffer)" : "no round 0");
    if (rounds > 1 && d->dev && !run)
        return rn_errorf(RN_EINVAL, "%s in rounds on %s: give a buffer for the running sums", d->what,
                         rn_backend_name(d->dev));
    int64_t need = rn_dist_run_floats(d, d->n);
    if (rounds > 1 && d->dev && run_len < need)
        return rn_errorf(RN_EINVAL, "%s in rounds: running sums of %lld floats, at least %lld needed "
                         "(rn_dist_run_floats at this bucket size)", d->what, (long long)run_len, (long long)need);
    if (rounds > 1 && !d->dev && need > d->run_cap) {
        free(d->run);
        d->run_cap = 0;
        if (!(d->run = rn_malloc(sizeof(float) * (size_t)need)))
            return rn_errorf(RN_ENOMEM, "%s in rounds: no memory for %lld floats", d->what, (long long)need);
        d->run_cap = need;
    }
    d->drun = run;
    d->round = round;
    d->rounds = rounds;
    return RN_OK;
}

/* A device bucket: enqueued behind the backward on the backend's communication stream. */
static int dev_bucket(rn_dist *d, int64_t lo, int64_t len) {
    op_wait(d, d->what, HB_EX, started(d, HB_EX)); /* (its enqueue can wait for the peers) */
    float *run = d->rounds > 1 ? d->drun + d->run_fill : NULL; /* (one round: no running sums) */
    float *pack = d->dpack + lo, *scratch = d->dscratch + lo;
    int rc = d->rounds > 1 ? rn_backend_coll_sum_round_async(d->dev, pack, scratch, run, len, d->round == 0,
                                                             d->round == d->rounds - 1)
                           : rn_backend_coll_sum_async(d->dev, pack, scratch, len);
    op_end(d);
    if (rc) return rc;
    d->nb++;
    d->run_fill += chunk_len(len, d->rank, d->world);
    return RN_OK;
}

int rn_dist_sum_part(rn_dist *d, int64_t off, int64_t len) {
    if (alone(d)) return RN_OK;
    if (!d->active) return rn_errorf(RN_EINVAL, "rn_dist_sum_part without rn_dist_sum_begin");
    if (off < 0 || len < 0 || off + len > d->n || d->fill + len > d->n)
        return rn_errorf(RN_EINVAL, "%s: part [%lld, +%lld) outside its %lld floats, or given twice", d->what,
                         (long long)off, (long long)len, (long long)d->n);
#ifdef RN_HAVE_MPI
    int rc;
    if (len > 0) {
        if (d->round > 0) {
            /* a later round repeats round 0's parts: its running sums are laid out by them */
            if (d->nseg >= d->nseg0 || d->seg[d->nseg][0] != off || d->seg[d->nseg][2] != len)
                return rn_errorf(RN_EINVAL, "%s, round %d: part %lld [%lld, +%lld) is not round 0's", d->what,
                                 d->round, (long long)d->nseg, (long long)off, (long long)len);
        } else {
            if (d->nseg == d->segcap) {
                int64_t cap = d->segcap ? 2 * d->segcap : 256;
                int64_t(*ns)[3] = realloc(d->seg, sizeof *ns * (size_t)cap);
                if (!ns) return rn_errorf(RN_ENOMEM, "%s: no memory for %lld parts", d->what, (long long)cap);
                d->seg = ns;
                d->segcap = cap;
            }
            d->seg[d->nseg][0] = off;
            d->seg[d->nseg][1] = d->fill;
            d->seg[d->nseg][2] = len;
        }
        d->nseg++;
        if (d->dev) rc = rn_backend_copy(d->dev, d->dpack + d->fill, d->x + off, sizeof(float) * (size_t)len);
        else memcpy(d->pack + d->fill, d->x + off, sizeof(float) * (size_t)len), rc = RN_OK;
        if (rc) return rc;
        d->fill += len;
    }
    int64_t step = bucket_floats(d, d->n);
    while (d->fill - d->open_lo >= step) {
        if (d->dev) rc = dev_bucket(d, d->open_lo, step);
        else if ((rc = drain(d, MAX_IN_FLIGHT - 1)) == RN_OK) rc = bucket_start(d, d->open_lo, step);
        if (rc) return rc;
        d->open_lo += step;
        d->started_early++;
    }
    return d->dev ? RN_OK : progress(d);
#else
    return RN_ENOTSUP;
#endif
}

int rn_dist_sum_progress(rn_dist *d) {
    if (alone(d) || !d->active || d->dev) return RN_OK;
#ifdef RN_HAVE_MPI
    return progress(d);
#else
    return RN_ENOTSUP;
#endif
}

/* The device sum's end: the last bucket, the join, the sums copied back (stream order). */
static int dev_end(rn_dist *d, rn_dist_sum_stats *st) {
    int rc = RN_OK;
    if (d->fill > d->open_lo && (rc = dev_bucket(d, d->open_lo, d->fill - d->open_lo))) return rc;
    op_wait(d, d->what, HB_EX, d->cnt[HB_EX]); /* (the last bucket: the others came before it) */
    rc = rn_backend_coll_join(d->dev);
    op_end(d);
    /* (before the last round the sums stay in drun: x is not written) */
    for (int64_t i = 0; d->round == d->rounds - 1 && i < d->nseg && rc == RN_OK; i++)
        rc = rn_backend_copy(d->dev, d->x + d->seg[i][0], d->dpack + d->seg[i][1],
                             sizeof(float) * (size_t)d->seg[i][2]);
    /* (when a bucket finished on the device is not known to the host: done_early 0) */
    if (rc == RN_OK && st) *st = (rn_dist_sum_stats){.buckets = d->nb, .started_early = d->started_early,
                                                     .floats = d->fill};
    return rc;
}

void rn_dist_sum_cancel(rn_dist *d) {
    if (!d || !d->active || !d->dev) return; /* (a host sum's memory is d's own) */
    char kept[512];
    snprintf(kept, sizeof kept, "%s", rn_last_error());
    op_begin(d, d->what);
    int rc = rn_backend_coll_join(d->dev);
    op_end(d);
    rn_errorf(rc ? rc : RN_EIO, "%s", kept);
    free_buckets(d);
}

int rn_dist_sum_end(rn_dist *d, rn_dist_sum_stats *st) {
    if (st) *st = (rn_dist_sum_stats){0};
    if (alone(d)) return RN_OK;
    if (!d->active) return rn_errorf(RN_EINVAL, "rn_dist_sum_end without rn_dist_sum_begin");
    int rc;
    if (d->round > 0 && d->nseg != d->nseg0) {
        rc = rn_errorf(RN_EINVAL, "%s, round %d: %lld parts given, round 0 gave %lld", d->what, d->round,
                       (long long)d->nseg, (long long)d->nseg0);
        rn_dist_sum_cancel(d);
#ifdef RN_HAVE_MPI
        if (!d->dev) (void)drain(d, 0); /* (requests in flight read the buckets' counts) */
#endif
        free_buckets(d);
        return rc;
    }
    if (d->dev) {
        /* a failure may leave earlier buckets queued on the device: joined before the
           caller may free their memory (rn_dist_sum_cancel keeps this error's message) */
        if ((rc = dev_end(d, st))) rn_dist_sum_cancel(d);
        else round_ended(d);
        return rc;
    }
#ifdef RN_HAVE_MPI
    /* the buckets done while the parts still came: the overlap, as far as it went */
    int done = d->first;
    if ((rc = progress(d))) goto fail;
    if (d->fill > d->open_lo) {
        if ((rc = drain(d, MAX_IN_FLIGHT - 1)) || (rc = bucket_start(d, d->open_lo, d->fill - d->open_lo))) goto fail;
        d->open_lo = d->fill;
    }
    if ((rc = drain(d, 0))) goto fail;
    for (int64_t i = 0; d->round == d->rounds - 1 && i < d->nseg; i++)
        memcpy(d->x + d->seg[i][0], d->pack + d->seg[i][1], sizeof(float) * (size_t)d->seg[i][2]);
    if (st) *st = (rn_dist_sum_stats){.buckets = d->nb, .started_early = d->started_early, .done_early = done,
                                      .floats = d->fill};
    round_ended(d);
    return RN_OK;
fail:
    free_buckets(d);
    return rc;
#else
    (void)st;
    return RN_ENOTSUP;
#endif
}

int rn_dist_sum(rn_dist *d, rn_backend *be, float *x, float *scratch, int64_t n, const char *what) {
    if (alone(d) || n == 0) return RN_OK;
    int dev = !rn_backend_is_host(be);
    if (dev && !rn_backend_has_coll(be))
        return rn_errorf(RN_ENOTSUP, "%s: the %s backend has no collectives (a build without NCCL)", what,
                         rn_backend_name(be));
    int64_t step = bucket_floats(d, n);
    int rc;
    if (!dev) {
        /* the overlapped sum's machinery, the whole array given at once from the top down */
        if ((rc = rn_dist_sum_begin(d, be, x, NULL, NULL, n, what))) return rc;
        for (int64_t hi = n; hi > 0;) {
            int64_t lo = hi > step ? hi - step : 0;
            if ((rc = rn_dist_sum_part(d, lo, hi - lo))) {
                free_buckets(d);
                return rc;
            }
            hi = lo;
        }
        return rn_dist_sum_end(d, NULL);
    }
    char op[96];
    snprintf(op, sizeof op, "the sum of the %s", what);
    /* buckets from the top down: backward produces the last layers' gradients first */
    for (int64_t hi = n; hi > 0;) {
        int64_t lo = hi > step ? hi - step : 0;
        op_wait(d, op, HB_EX, started(d, HB_EX));
        rc = rn_backend_coll_sum(be, x + lo, scratch + lo, hi - lo);
        op_end(d);
        if (rc) return rc;
        hi = lo;
    }
    return RN_OK;
}

int rn_dist_allgather(rn_dist *d, const void *mine, size_t bytes, void *all, const char *what) {
    if (alone(d)) {
        if (bytes) memmove(all, mine, bytes);
        return RN_OK;
    }
#ifdef RN_HAVE_MPI
    if (bytes > 0x7fffffff) return rn_errorf(RN_EINVAL, "%s: %zu bytes per rank is too many", what, bytes);
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD, &req), what);
    return wait_req(d, &req, what);
#else
    return RN_ENOTSUP;
#endif
}

int rn_dist_gather0(rn_dist *d, const void *mine, size_t bytes, void **all, size_t *total, const char *what) {
    *all = NULL;
    *total = 0;
    if (alone(d)) {
        if (!(*all = rn_malloc(bytes ? bytes : 1))) return RN_ENOMEM;
        if (bytes) memcpy(*all, mine, bytes);
        *total = bytes;
        return RN_OK;
    }
#ifdef RN_HAVE_MPI
    int W = d->world;
    if (W > 1024) return rn_errorf(RN_EINVAL, "%d ranks: rn's collectives take up to 1024", W);
    if (bytes > 0x7fffffff) return rn_errorf(RN_EINVAL, "%s: %zu bytes from one rank is too many", what, bytes);
    int b = (int)bytes, cnt[1024], dsp[1024];
    MPI_Request req;
    MPI_CHECK(MPI_Igather(&b, 1, MPI_INT, cnt, 1, MPI_INT, 0, MPI_COMM_WORLD, &req), what);
    int rc = wait_req(d, &req, what);
    if (rc) return rc;
    uint8_t *buf = NULL;
    if (d->rank == 0) {
        int64_t sum = 0;
        for (int r = 0; r < W; r++) {
            dsp[r] = (int)sum;
            sum += cnt[r];
        }
        if (sum > 0x7fffffff) return rn_errorf(RN_EINVAL, "%s: %lld bytes gathered is too many", what, (long long)sum);
        if (!(buf = rn_malloc(sum ? (size_t)sum : 1))) return RN_ENOMEM;
        *total = (size_t)sum;
    }
    int e = MPI_Igatherv(mine, b, MPI_BYTE, buf, cnt, dsp, MPI_BYTE, 0, MPI_COMM_WORLD, &req);
    if (e != MPI_SUCCESS) rc = mpi_fail(e, "MPI_Igatherv", what);
    else rc = wait_req(d, &req, what);
    if (rc) {
        free(buf);
        *total = 0;
        return rc;
    }
    *all = buf;
    return RN_OK;
#else
    return RN_ENOTSUP;
#endif
}

int rn_dist_max_i64(rn_dist *d, int64_t *v, const char *what) {
    if (alone(d)) return RN_OK;
#ifdef RN_HAVE_MPI
    int64_t in = *v;
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(&in, v, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD, &req), what);
    return wait_req(d, &req, what);
#else
    return RN_ENOTSUP;
#endif
}

int rn_dist_agree(rn_dist *d, int rc, const char *what) {
    if (alone(d)) return rc;
    int64_t v = rc != RN_OK ? d->rank + 1 : 0;
    int e = rn_dist_max_i64(d, &v, what);
    if (rc != RN_OK) return rc;
    if (e != RN_OK) return e;
    if (v) return rn_errorf(RN_EIO, "%s: rank %lld failed (its message is on its stderr)", what, (long long)(v - 1));
    return RN_OK;
}

int rn_dist_bcast(rn_dist *d, void *buf, size_t bytes, int root, const char *what) {
    if (alone(d)) return RN_OK;
#ifdef RN_HAVE_MPI
    if (bytes > 0x7fffffff) return rn_errorf(RN_EINVAL, "%s: %zu bytes is too many to broadcast", what, bytes);
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD, &req), what);
    return wait_req(d, &req, what);
#else
    return RN_ENOTSUP;
#endif
}
