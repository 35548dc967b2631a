/* rn/replay.h: a piece of device work run eagerly the first time, captured into a graph
 * the second time and replayed as one launch after that (CUDA graphs: rn-train
 * --cuda-graphs makes each micro-batch's forward and backward, some hundreds of kernel
 * and cuDNN launches, one, and the optimiser step another).
 *
 * The work is a function that issues ops on a backend. Whenever its key is the same it
 * must issue the same ops on the same pointers with the same host scalars: the key holds
 * whatever the caller knows changes them (the micro-batch size, the loss scale, the
 * weights' buffers); memory the backend allocates anew (rn_backend_moved: its workspace,
 * its own buffers) counts as a new key. A new key runs eagerly once more, so that what the ops set up on
 * first use (buffers grown, cuDNN's algorithm search) is done before a capture, which
 * could not hold it; the next run with that key captures.
 *
 * A replay does the device work only: the function is not called. Host-side effects of
 * the work are the caller's to repeat (*how says which way it ran). The function may be
 * called twice in one rn_replay_run (a capture that failed, then eagerly), so its host
 * side must not count anything.
 *
 * A capture that fails (the function's error inside it, or the backend's: an op that
 * cannot be captured) turns graphs off for this replay: rn_replay_run writes why into
 * r->why, sets r->off, runs the function eagerly and returns its result. The results are
 * the same bits either way, where the ops themselves are deterministic (on CUDA with
 * --deterministic: cuDNN's non-deterministic algorithms differ between two eager runs
 * too); only the launches differ. A backend without graphs (the CPU) always runs
 * eagerly. */
#ifndef RN_REPLAY_H
#define RN_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "rn/backend.h"

#define RN_REPLAY_KEY 64 /* bytes of key at most */

/* *how of rn_replay_run */
enum { RN_REPLAY_EAGER = 0, RN_REPLAY_CAPTURED, RN_REPLAY_REPLAYED };

typedef struct {
    rn_graph *graph;                  /* the captured work, or NULL */
    unsigned char key[RN_REPLAY_KEY]; /* its key (klen bytes) */
    size_t klen;
    int seen;                         /* key ran eagerly: the next run with it captures */
    int off;                          /* a capture failed: eagerly from then on */
    char why[320];                    /* ... and why */
    int64_t nodes;                    /* the graph's nodes (kernels, copies, memsets) */
    int64_t moved;                    /* rn_backend_moved when it was captured */
    int64_t eager, captures, replays; /* runs each way */
} rn_replay;

typedef int (*rn_replay_fn)(void *ctx);

/* r zeroed (= {0}) is an empty replay. Runs the work once (above); *how (may be NULL)
 * says how. Errors: fn's, RN_EINVAL (klen over RN_REPLAY_KEY), the backend's (a graph
 * launch that failed). */
int rn_replay_run(rn_replay *r, rn_backend *be, const void *key, size_t klen, rn_replay_fn fn, void *ctx, int *how);
/* Frees the graph and forgets the key (the buffers it names are going away); the counts
 * and off stay. */
void rn_replay_reset(rn_replay *r, rn_backend *be);

#endif
