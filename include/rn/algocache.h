/* A file of cuDNN convolution algorithm choices, so that a process does not time every
 * algorithm again for a shape an earlier process already searched (rn-eval after rn-train,
 * the next epoch's rn-train in a pipeline, every rank of a run). Plain C, no CUDA: the
 * CUDA backend fills the keys and values; the unit test runs anywhere.
 *
 * One text line per choice, appended with one write(2) so that concurrent processes
 * interleave whole lines:
 *   rn-algo-1 DEVICE CUDNN DTYPE N H W C K KH KW SH SW PH PW DIR FLAGS WS_LIMIT ALGO MATH WS
 * DEVICE has no spaces (the device name with '_' for ' ', and its compute capability).
 * A line that does not parse, has another version tag, or holds values out of range is
 * ignored and counted; the last line for a key wins. A cache that cannot be read or
 * written is never an error for the caller: it works without it and says so in the note. */
#ifndef RN_ALGOCACHE_H
#define RN_ALGOCACHE_H

#include <stddef.h>
#include <stdint.h>

#define RN_ALGOCACHE_MAX_LINES 100000 /* lines read past this are ignored (a runaway file) */

typedef struct {
    char device[96];   /* device identity, no spaces (e.g. "NVIDIA_H200_sm90") */
    int cudnn;         /* cudnnGetVersion() */
    int shape[12];     /* dtype n h w c k kh kw stride_h stride_w pad_h pad_w */
    int dir;           /* RN_CONV_FWD, RN_CONV_BWD_DATA or RN_CONV_BWD_FILTER */
    int flags;         /* 1: TF32 allowed, 2: deterministic algorithms only */
    uint64_t ws_limit; /* workspace bytes the choice was made within */
} rn_algo_key;

typedef struct {
    int algo;    /* the cuDNN algorithm enum of the direction */
    int math;    /* cudnnMathType_t to run it with */
    uint64_t ws; /* its workspace bytes */
} rn_algo_val;

typedef struct rn_algocache rn_algocache;

/* Read path (a missing file is an empty cache) and keep it for appends. Fails only for
 * out-of-memory (RN_ENOMEM) or a NULL/empty path (RN_EINVAL); everything else (unreadable,
 * malformed lines) ends up in rn_algocache_note. */
int rn_algocache_open(const char *path, rn_algocache **out);
/* 1 and *v when key is cached, else 0. */
int rn_algocache_get(const rn_algocache *c, const rn_algo_key *key, rn_algo_val *v);
/* Remember key -> v and append it to the file (creating the file and its folder). A write
 * that fails turns further appends off and is described by the note; returns RN_OK then
 * too, since the choice itself is good. RN_ENOMEM, or RN_EINVAL for a key with spaces. */
int rn_algocache_put(rn_algocache *c, const rn_algo_key *key, const rn_algo_val *v);
/* The device identity and cuDNN version of this process: from then on the note also says
 * how many of the choices are theirs, when some are another device's or cuDNN's (a cache
 * shared by machines, or kept across a cuDNN upgrade: those lines stay, unused here). */
void rn_algocache_set_here(rn_algocache *c, const char *device, int cudnn);
/* Entries held, and lines ignored when reading. */
size_t rn_algocache_size(const rn_algocache *c);
size_t rn_algocache_ignored(const rn_algocache *c);
/* One line for the backend's start-up line, e.g. "algorithm cache /x/algos.txt: 52
 * choices (40 for this device and cuDNN, 12 for others), 2 malformed or stale lines
 * ignored" or "... (not written: Permission denied)". */
const char *rn_algocache_note(const rn_algocache *c);
void rn_algocache_free(rn_algocache *c);

#endif
