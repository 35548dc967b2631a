/* rn/dist.h: data parallelism across processes. Open MPI starts and bootstraps the
 * processes (mpirun, srun --mpi=pmix) and carries the CPU backend's collectives; a GPU
 * backend's collectives go through NCCL (rn_backend_coll_*, rn/backend.h), its
 * communicator bootstrapped over MPI here. Nothing home-made on the wire.
 *
 *   rn_dist *d;
 *   rn_dist_open(&argc, &argv, rn_cli_launcher_world(), timeout_s, &d);  // before threads
 *   rn_dist_rank(d), rn_dist_world(d), rn_dist_local_rank(d) ...
 *   rn_dist_attach(d, be);                 // a GPU backend: its NCCL communicator
 *   rn_dist_sum(d, be, grads, scratch, n, "gradients");   // every optimiser step, or
 *   rn_dist_sum_begin/part/end during the backward         // the same, overlapped
 *   rn_dist_close(d);                      // MPI_Finalize
 *
 * A world of one (no launcher, or a build without MPI) makes no MPI call at all: every
 * collective is then a copy or nothing, and a single process runs exactly as before.
 * RN_DIST_SOLO=1 in the environment is the exception, a check of the many-process path
 * on one device: one process (mpirun -np 1, or alone) starts MPI and runs every
 * collective with itself (on a GPU: a NCCL communicator of one), and must give the bits
 * of the same run without it (rn_dist_many: 1).
 *
 * Order. rn_dist_sum adds the ranks' arrays left to right in rank order,
 * ((x0 + x1) + x2) + ..., every element on the rank that owns its chunk, then shares the
 * sums: the order in which one process with --accum W adds its micro-batches'
 * gradients (rn_net_backward), so W ranks give the bits of one process. The order never
 * depends on the chunking, the bucket size, or the MPI/NCCL algorithm (an all-to-all
 * moves the chunks, an all-gather returns the sums; nothing is summed in the network).
 *
 * Faults. Every collective runs under a watchdog: one not finished after timeout_s
 * seconds (a rank died or hangs) prints "rank R: no answer from the other ranks for N s
 * in <op> ..." and ends the process with exit status 1, so mpirun stops the job; a rank
 * that fails with an error exits non-zero and mpirun stops the others. Rank 0 names the
 * ranks it waits for: every other rank sends it a heartbeat (its counts of collectives
 * started, on a communicator of their own) at each collective it starts and every half
 * second while it waits, one in flight at most, never waited for; rank 0 takes them in
 * while it waits. A rank silent for 1.5 s is not waiting with the others; one whose count
 * is short waits in another collective. The other ranks time out 3 s later than rank 0,
 * which so speaks first. rn_dist_close collects each rank's last heartbeat before
 * MPI_Finalize. A GPU rank's heartbeats go on while it waits for NCCL (the gradient sum
 * on a device): rn_dist_attach gives the backend a poll for its waits. Only the main
 * thread calls MPI (MPI_THREAD_FUNNELED), so a device backend's collectives are called
 * from it too; none after rn_dist_close (the backend's poll would find d gone). */
#ifndef RN_DIST_H
#define RN_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "rn/backend.h"

#define RN_DIST_TIMEOUT 300.0   /* seconds a collective may wait (--dist-timeout) */
#define RN_DIST_BUCKET_MB 25.0  /* gradient bucket size in MB (--bucket-mb), as DDP's */

typedef struct rn_dist rn_dist;

/* 1 when this build has MPI (USE_MPI), else 0. */
int rn_dist_built(void);

/* Join the job. launched: the world size the launcher announced (rn_cli_launcher_world:
 * 0 or 1 when the process was started alone). launched > 1 initialises MPI
 * (MPI_Init_thread, funneled), takes rank and world from MPI_COMM_WORLD and the local
 * rank from a shared-memory split of it; otherwise the world is this process alone and
 * MPI is not touched (unless RN_DIST_SOLO=1). timeout_s (> 0) bounds every collective.
 * Errors: RN_ENOTSUP (launched > 1 or RN_DIST_SOLO=1 in a build without MPI: the message
 * says to rebuild or run one process), RN_EINVAL (timeout, an RN_DIST_SOLO other than 0
 * or 1), RN_EIO (MPI failed to start), RN_ENOMEM. */
int rn_dist_open(int *argc, char ***argv, int launched, double timeout_s, rn_dist **out);
/* Finish MPI (after every rank's last collective) and free d. NULL is a no-op. */
void rn_dist_close(rn_dist *d);
/* Stop the whole job now (MPI_Abort) with exit status code: for a rank that cannot go
 * on while the others wait in a collective. In a world of one: exit(code). */
void rn_dist_abort(rn_dist *d, int code);

int rn_dist_many(const rn_dist *d);        /* 1 when the collectives run: world > 1, or
                                              RN_DIST_SOLO=1; 0 for NULL */
int rn_dist_rank(const rn_dist *d);        /* 0 .. world-1; 0 for NULL */
int rn_dist_world(const rn_dist *d);       /* 1 for NULL */
int rn_dist_local_rank(const rn_dist *d);  /* rank among the processes of this node */
int rn_dist_local_world(const rn_dist *d); /* processes on this node */
double rn_dist_timeout(const rn_dist *d);

/* Bytes of a bucket of the gradient sum (0: the whole array at once). */
void rn_dist_set_bucket(rn_dist *d, size_t bytes);
size_t rn_dist_bucket(const rn_dist *d);

/* A device backend's collectives: rank 0 makes the NCCL id, MPI broadcasts it, every
 * rank joins the communicator (rn_backend_coll_init), and with several ranks the
 * backend's waits keep the heartbeats going (rn_backend_coll_set_poll); the backend's
 * own limit is then the timeout + 5 s, past every rank's watchdog, which times the
 * waits for the sums. A host backend or a world of one: nothing. Errors: those of
 * rn_backend_coll_*, RN_EIO (MPI). */
int rn_dist_attach(rn_dist *d, rn_backend *be);

/* x (n floats in be's memory) = the sum over ranks of every rank's x, in rank order
 * (above), the same bits on every rank; scratch holds n floats of be's memory (its
 * contents are lost; a host backend uses the overlapped sum's own buffers instead and
 * leaves it alone). In buckets of rn_dist_set_bucket's size, highest offsets first
 * (backward's order). what names the array in messages. Errors: RN_EIO (MPI), those of
 * rn_backend_coll_sum. */
int rn_dist_sum(rn_dist *d, rn_backend *be, float *x, float *scratch, int64_t n, const char *what);

/* The sum overlapped with backward: as rn_dist_sum, but
 * the array is given part by part as its values become final, and a bucket's reduction
 * starts as soon as its parts are in, while the caller goes on computing.
 *
 *   rn_dist_sum_begin(d, be, x, pack, scratch, n, "gradients");
 *   ... rn_dist_sum_part(d, off, len) for each final range, in the order they finish,
 *       rn_dist_sum_progress(d) between other work (MPI moves only inside MPI calls) ...
 *   rn_dist_sum_end(d, &stats);            // x = the sums, every part given
 *
 * Parts are copied, in the order given, into a packed array of n floats (a host backend:
 * d's own memory, with as much again for the other ranks' chunks, pack and scratch
 * NULL; a device backend: pack and scratch, n floats each of be's memory, the caller's,
 * untouched by it until the end, each full bucket enqueued behind the compute with
 * rn_backend_coll_sum_async and joined by rn_backend_coll_join); every rank must give the same
 * parts in the same order (the caller's order is the backward's, the same code on every
 * rank). The packed array is cut into buckets of rn_dist_set_bucket's size (0: one), each
 * summed as rn_dist_sum sums (an all-to-all of chunks, the rank-ordered additions, an
 * all-gather), so every element of every given part gets the same bits as rn_dist_sum
 * gives it: an element's sum never depends on which bucket or chunk it travels in. At
 * most 64 buckets are in flight; a part that would start a 65th first waits for the
 * oldest. Elements of x never given are left as they were. A world of one: nothing.
 * Errors: RN_EINVAL (a part outside x, more floats than n, calls out of order),
 * RN_ENOMEM, RN_EIO (MPI). After an error the sum is abandoned (rn_dist_sum_begin starts
 * afresh); the caller is failing, and its rank with it. */
typedef struct {
    int buckets;       /* buckets summed */
    int started_early; /* of them, started by rn_dist_sum_part (before rn_dist_sum_end) */
    int done_early;    /* of them, finished before rn_dist_sum_end was called (host only;
                          a device backend's are not seen by the host: 0) */
    int64_t floats;    /* elements given */
} rn_dist_sum_stats;
int rn_dist_sum_begin(rn_dist *d, rn_backend *be, float *x, float *pack, float *scratch, int64_t n, const char *what);
/* This sum is round `round` (0 .. rounds-1) of a sum over rounds: called right after
 * rn_dist_sum_begin, before any part. Each round every rank gives its array of that
 * round (the same parts, in the same order, as round 0 gave: RN_EINVAL otherwise); the
 * rank owning an element adds the ranks' values onto its running sum, rank 0 first:
 * ((((x0,0 + x1,0) + ...) + x0,1) + x1,1) + ... for round-0 values x0,0 (rank 0),
 * x1,0 (rank 1) ..., then round 1's. That is the order in which one process with
 * --accum rounds x world adds its micro-batches' gradients when rank r's round-k array
 * is micro-batch k x world + r (rn-train deals them out so), and so P ranks with
 * --accum A give the bits of one process with --accum P x A. Only the last round
 * writes x (the sums); before it, rn_dist_sum_end waits for the round's exchanges and
 * leaves x alone, and the next round may begin (it reuses the round's buffers). The
 * running sums, this rank's chunk of each bucket one after the other, are d's own memory
 * on a host backend (kept for the next sum); a device backend's are run, run_len floats
 * of be's memory, the caller's, at least rn_dist_run_floats(d, n) (NULL and 0 for one
 * round, and on a host backend). Cost: each round moves as much as an all-to-all of x;
 * the all-gather runs once, at the last. Rounds 1 of 1 is the plain sum. A failure
 * abandons the rounds (the next sum starts again at round 0). Errors: RN_EINVAL (called
 * out of place, a round not following the one before, no run on a device or one shorter
 * than the running sums), RN_ENOMEM. */
int rn_dist_sum_round(rn_dist *d, int round, int rounds, float *run, int64_t run_len);
/* The floats a sum of n floats in rounds keeps as running sums on each rank: its chunk
 * of every bucket of the current size, about n / world (at most one float more per
 * bucket); n for a world of one. */
int64_t rn_dist_run_floats(const rn_dist *d, int64_t n);
int rn_dist_sum_part(rn_dist *d, int64_t off, int64_t len);
int rn_dist_sum_progress(rn_dist *d);
/* Start the last bucket, wait for all of them (under the watchdog), copy the sums back
 * into x; stats (unless NULL) says how much overlapped. On a failure a device backend's
 * buckets are joined first, as rn_dist_sum_cancel does, so the caller may free pack,
 * scratch and run. */
int rn_dist_sum_end(rn_dist *d, rn_dist_sum_stats *stats);
/* A failing caller's sum, begun and not ended: a device backend's enqueued buckets read
 * and write pack and scratch, so they are joined (under the watchdog's timeout) before
 * the caller frees those; the error message is left as it was. Nothing when none, or
 * for a host backend (its sum's memory is d's own). */
void rn_dist_sum_cancel(rn_dist *d);

/* all (world * bytes, host) = every rank's `mine` (bytes, host), in rank order. */
int rn_dist_allgather(rn_dist *d, const void *mine, size_t bytes, void *all, const char *what);

/* Rank 0 receives every rank's `mine` (bytes may differ per rank) concatenated in rank
 * order into a malloc'ed *all of *total bytes (the caller frees it); other ranks get
 * NULL and 0. In a world of one, a copy. Errors: RN_EIO, RN_ENOMEM. */
int rn_dist_gather0(rn_dist *d, const void *mine, size_t bytes, void **all, size_t *total, const char *what);

/* *v = the largest of every rank's *v (the stop flag, an error seen anywhere). */
int rn_dist_max_i64(rn_dist *d, int64_t *v, const char *what);

/* Whether any rank failed, agreed by all, so that none goes on into a collective that a
 * failed rank will never join: every rank calls it with its own status rc. Returns rc
 * when it is an error (this rank's message kept); RN_EIO "what: rank R failed (its
 * message is on its stderr)" when another rank's was (R: the highest such); else RN_OK,
 * or an error of the collective itself. A world of one: rc. */
int rn_dist_agree(rn_dist *d, int rc, const char *what);

/* buf (bytes, host) on every rank = rank root's. */
int rn_dist_bcast(rn_dist *d, void *buf, size_t bytes, int root, const char *what);

#endif
