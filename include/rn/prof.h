/* rn/prof.h: per-layer timing of training steps (rn-train --profile).
 *
 * A profile is a list of timed spans: a layer and direction (torchvision's module name,
 * "forward" or "backward"), or a stage of the step (data-wait, input, loss, sgd,
 * grad-sum, ...). How a span is timed depends on the backend:
 *  - with stream timestamps (rn_backend_has_marks: CUDA events), a span on the compute
 *    track is the time between a mark recorded on the compute stream at its begin and
 *    one at its end: nothing is synchronised inside a step, so the GPU runs as it does
 *    unprofiled. The marks are read once per step (rn_prof_step_end), and the spans placed
 *    on the host's time line from the step's start. Host-track spans (the loader wait, the
 *    copy wait) keep the host clock: they are the host's time, not the stream's. The
 *    step's uploads on the copy stream (rn_backend_copy_spans) become "h2d" spans on the
 *    copy track, in the trace only (they overlap the compute stream's work).
 *  - otherwise (the CPU), by the clock on the host with the backend synchronised before
 *    and after it (rn_backend_sync), so a span holds exactly its own work.
 * Either way a profiled step computes what an unprofiled one does. In a CUDA build with the NVTX v3 header, each span
 * is also an NVTX range of the same name, so Nsight Systems shows rn's layers.
 *
 * Each span carries an estimate of its floating-point operations and the bytes it moves
 * (inputs and weights read once, outputs written once; see rn-train(1)), from which the
 * report derives GFLOP/s and GB/s.
 *
 * Usage: rn_prof_create, then rn_prof_begin/rn_prof_end around each span while steps are
 * being profiled (rn_prof_step_begin/rn_prof_step_end around each step), and
 * rn_prof_write at the end. rn_prof_loader_span puts the loader's workers on tracks of
 * their own. A NULL rn_prof is "profiling off": callers test for it and
 * call nothing, so an unprofiled run pays one branch per layer. */
#ifndef RN_PROF_H
#define RN_PROF_H

#include <stdint.h>

#include "rn/backend.h"

typedef struct rn_prof rn_prof;

/* Span directions (the table's second column). */
enum { RN_PROF_FWD = 0, RN_PROF_BWD = 1, RN_PROF_STEP = 2 };
/* Tracks of the trace (Chrome trace-event tids): the step's stages on the host thread
 * (data-wait, input staging) and the layers' work on the backend's compute stream. */
enum { RN_PROF_HOST = 1, RN_PROF_COMPUTE = 2 };
/* The copy stream's track (a GPU's async uploads, "h2d" spans, trace only), and loader
 * worker w's track RN_PROF_LOADER + w ("loader worker w+1" in the trace). */
enum { RN_PROF_COPY = 3, RN_PROF_LOADER = 16 };

/* A profile of work on be: marks when be has them, else syncs around every span.
 * Errors: RN_ENOMEM. */
int rn_prof_create(rn_backend *be, rn_prof **out);
void rn_prof_destroy(rn_prof *p);

/* Start a span: synchronise the backend (what was issued before is not counted) or, with
 * marks, record one; open an NVTX range named name, and return the start time for
 * rn_prof_end. Spans nest (begin/end pairs in LIFO order), at most 16 deep. */
double rn_prof_begin(rn_prof *p, const char *name);
/* End the span begun at t0: synchronise (or record a mark), close the NVTX range and
 * record (name, dir, track, flops, bytes). rc is the traced op's status: returned as is (an error of the
 * sync or mark only when rc is RN_OK), so `return rn_prof_end(p, t0, ..., op(...))` reads
 * as the op's call. Errors: rc, the backend's sync or mark errors (a mark's error at
 * rn_prof_begin is returned here), RN_EINVAL (spans nested too deep), RN_ENOMEM. */
int rn_prof_end(rn_prof *p, double t0, const char *name, int dir, int track, double flops, double bytes, int rc);

/* A span measured elsewhere (another thread: a loader worker), for the trace only: it is
 * not a row of the table nor part of the spans' sum, since it overlaps the step's own.
 * t0, t1 in rn_report_clock seconds. Safe to call from any thread. Errors: RN_ENOMEM. */
int rn_prof_add_trace(rn_prof *p, const char *name, int track, double t0, double t1);

/* rn_loader_set_trace's callback (rn/loader.h) with ctx an rn_prof: each chunk a worker
 * finishes becomes a "load" span on its loader track. */
void rn_prof_loader_span(void *ctx, int worker, int64_t seq, int images, double t0, double t1);

/* A profiled step: rn_prof_step_begin synchronises and starts its wall clock (and, with
 * marks, records mark 0), rn_prof_step_end reads the step's marks into its spans' times,
 * synchronises and adds the step's wall time (the reference that the spans' sum is
 * compared with). Errors: the backend's sync and mark errors, RN_ENOMEM. */
int rn_prof_step_begin(rn_prof *p);
int rn_prof_step_end(rn_prof *p);

/* The report of the steps profiled so far: a table (one row per name and direction, its
 * mean milliseconds per step, share of the step, GFLOP/s, GB/s, FLOPs and bytes per
 * step, sorted by time, then the rows' sum against the steps' wall time) written
 * atomically to table_path, and the Chrome trace-event JSON (one "X" event per span,
 * ts and dur in microseconds, args flops and bytes; one tid per track) to trace_path.
 * title is the table's first line. Errors: RN_EIO naming the file, RN_ENOMEM. */
int rn_prof_write(const rn_prof *p, const char *title, const char *table_path, const char *trace_path);

/* The number of profiled steps, their summed wall time and the sum of every span in
 * them, in seconds (for tests and the closing line). */
void rn_prof_totals(const rn_prof *p, int64_t *steps, double *wall, double *spans);

#endif
