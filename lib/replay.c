/* Eager, then captured, then replayed: rn/replay.h. */
#include "rn/replay.h"

#include <stdio.h>
#include <string.h>

#include "rn/err.h"

void rn_replay_reset(rn_replay *r, rn_backend *be) {
    rn_backend_graph_free(be, r->graph);
    r->graph = NULL;
    r->klen = 0;
    r->seen = 0;
    r->nodes = 0;
}

static int eager(rn_replay *r, rn_replay_fn fn, void *ctx, int *how) {
    r->eager++;
    if (how) *how = RN_REPLAY_EAGER;
    return fn(ctx);
}

/* the capture of fn: RN_OK with r->graph set, or an error with the capture ended */
static int capture(rn_replay *r, rn_backend *be, rn_replay_fn fn, void *ctx) {
    int rc = rn_backend_capture_begin(be);
    if (rc) return rc;
    rc = fn(ctx);
    if (rc) {
        char kept[256];
        snprintf(kept, sizeof kept, "%s", rn_last_error());
        (void)rn_backend_capture_end(be, 0, NULL, NULL);
        return rn_errorf(rc, "%s", kept);
    }
    return rn_backend_capture_end(be, 1, &r->graph, &r->nodes);
}

int rn_replay_run(rn_replay *r, rn_backend *be, const void *key, size_t klen, rn_replay_fn fn, void *ctx, int *how) {
    if (how) *how = RN_REPLAY_EAGER;
    if (klen > RN_REPLAY_KEY) return rn_errorf(RN_EINVAL, "replay key of %zu bytes, at most %d", klen, RN_REPLAY_KEY);
    if (r->off || !rn_backend_has_graphs(be)) return eager(r, fn, ctx, how);
    int same = klen == r->klen && memcmp(key, r->key, klen) == 0 && (!r->graph || r->moved == rn_backend_moved(be));
    if (!same) {
        rn_replay_reset(r, be);
        memcpy(r->key, key, klen);
        r->klen = klen;
    }
    if (r->graph) {
        r->replays++;
        if (how) *how = RN_REPLAY_REPLAYED;
        return rn_backend_graph_launch(be, r->graph);
    }
    if (!r->seen) {
        int rc = eager(r, fn, ctx, how);
        r->seen = rc == RN_OK;
        return rc;
    }
    int rc = capture(r, be, fn, ctx);
    if (rc) {
        snprintf(r->why, sizeof r->why, "%s", rn_last_error());
        r->off = 1;
        rn_replay_reset(r, be);
        return eager(r, fn, ctx, how);
    }
    r->moved = rn_backend_moved(be);
    r->captures++;
    if (how) *how = RN_REPLAY_CAPTURED;
    return rn_backend_graph_launch(be, r->graph);
}
