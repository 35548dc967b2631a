/* Per-layer timing: spans timed between backend syncs, a table and a Chrome trace. */
#include "rn/prof.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/report.h"

#ifdef RN_HAVE_NVTX /* the CUDA build, with the toolkit's nvtx3 headers (Makefile) */
#include <nvtx3/nvToolsExt.h>
#define RN_NVTX 1
#endif

typedef struct {
    char name[48];
    int dir, track;
    int64_t step;
    double t0, t1;  /* seconds, rn_report_clock */
    int64_t m0, m1; /* with marks: the marks at its begin and end; else -1 */
    double flops, bytes;
    int trace_only; /* rn_prof_add_trace: in the trace, not in the table or the sums */
} span;

#define MAX_DEPTH 16

struct rn_prof {
    rn_backend *be;
    pthread_mutex_t mu; /* the spans: loader workers add theirs from their threads */
    int marks;          /* time compute spans by the backend's stream marks */
    span *s;
    int64_t n, cap;
    int64_t steps;
    double wall, step_t0, origin;
    int64_t step_first; /* the first span of the step in progress */
    int64_t nmark;      /* marks recorded in the step in progress */
    double *msec;       /* (cap_msec) the marks' times read at the step's end */
    int64_t cap_msec;
    int64_t open[MAX_DEPTH]; /* the begun spans' marks, innermost last */
    int depth;
    int err; /* a mark's error at rn_prof_begin, for its rn_prof_end */
};

int rn_prof_create(rn_backend *be, rn_prof **out) {
    rn_prof *p = rn_calloc(1, sizeof *p);
    if (!p) return RN_ENOMEM;
    p->be = be;
    pthread_mutex_init(&p->mu, NULL);
    p->marks = rn_backend_has_marks(be);
    p->origin = -1;
    *out = p;
    return RN_OK;
}

void rn_prof_destroy(rn_prof *p) {
    if (!p) return;
    pthread_mutex_destroy(&p->mu);
    free(p->s);
    free(p->msec);
    free(p);
}

/* with marks: record the next one of this step; its number, or -1 after an error (kept
   in p->err for the span's end) */
static int64_t mark(rn_prof *p) {
    int rc = rn_backend_mark(p->be, p->nmark);
    if (rc) {
        if (!p->err) p->err = rc;
        return -1;
    }
    return p->nmark++;
}

/* append a copy of *x named name (the step in progress), under the lock */
static int push(rn_prof *p, const span *x, const char *name) {
    int rc = RN_OK;
    pthread_mutex_lock(&p->mu);
    if (p->n == p->cap) {
        int64_t cap = p->cap ? 2 * p->cap : 1024;
        span *s = realloc(p->s, sizeof *s * (size_t)cap);
        if (!s) {
            rc = rn_errorf(RN_ENOMEM, "profile: %lld spans", (long long)cap);
            goto out;
        }
        p->s = s, p->cap = cap;
    }
    span *s = &p->s[p->n++];
    *s = *x;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->step = p->steps;
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

double rn_prof_begin(rn_prof *p, const char *name) {
    int64_t m = -1;
    if (p->marks) {
        /* outside a step (no mark 0 yet) a span has nothing to be timed against */
        m = p->nmark > 0 ? mark(p) : -1;
    } else {
        /* a sync error here is the previous op's: its own rn_prof_end or call reports it */
        (void)rn_backend_sync(p->be);
    }
    if (p->depth < MAX_DEPTH) p->open[p->depth] = m;
    p->depth++;
#ifdef RN_NVTX
    nvtxRangePushA(name);
#endif
    return rn_report_clock();
}

int rn_prof_end(rn_prof *p, double t0, const char *name, int dir, int track, double flops, double bytes, int rc) {
    int src = RN_OK;
    int64_t m0 = -1, m1 = -1;
    int deep = p->depth > MAX_DEPTH;
    if (p->depth > 0) p->depth--;
    if (p->marks) {
        if (!deep) m0 = p->open[p->depth];
        if (m0 >= 0) m1 = mark(p);
        src = p->err;
        p->err = RN_OK;
    } else {
        src = rn_backend_sync(p->be);
    }
    double t1 = rn_report_clock();
#ifdef RN_NVTX
    nvtxRangePop();
#endif
    if (rc) return rc;
    if (src) return src;
    if (deep) return rn_errorf(RN_EINVAL, "profile: span %s nested more than %d deep", name, MAX_DEPTH);
    /* host-track spans are the host's waits: the clock times them in either mode */
    if (track == RN_PROF_HOST) m0 = m1 = -1;
    return push(
        p, &(span){.dir = dir, .track = track, .t0 = t0, .t1 = t1, .m0 = m0, .m1 = m1, .flops = flops, .bytes = bytes},
        name);
}

int rn_prof_add_trace(rn_prof *p, const char *name, int track, double t0, double t1) {
    return push(
        p, &(span){.dir = RN_PROF_STEP, .track = track, .t0 = t0, .t1 = t1, .m0 = -1, .m1 = -1, .trace_only = 1}, name);
}

void rn_prof_loader_span(void *ctx, int worker, int64_t seq, int images, double t0, double t1) {
    (void)seq, (void)images;
    /* (the trace loses a span it has no memory for; the table never held these) */
    (void)rn_prof_add_trace(ctx, "load", RN_PROF_LOADER + worker, t0, t1);
}

int rn_prof_step_begin(rn_prof *p) {
    int rc = rn_backend_sync(p->be);
    p->step_t0 = rn_report_clock();
    if (p->origin < 0) p->origin = p->step_t0;
    pthread_mutex_lock(&p->mu);
    p->step_first = p->n;
    pthread_mutex_unlock(&p->mu);
    p->nmark = 0;
    p->err = RN_OK;
    /* mark 0 right after the sync: the stream is idle, so its time is step_t0's */
    if (rc == RN_OK && p->marks && (rc = rn_backend_mark(p->be, 0)) == RN_OK) p->nmark = 1;
    return rc;
}

/* the step's compute spans, timed by its marks (read once, here) */
static int read_marks(rn_prof *p) {
    if (p->nmark < 1) return RN_OK;
    if (p->nmark > p->cap_msec) {
        double *m = realloc(p->msec, sizeof *m * (size_t)p->nmark);
        if (!m) return rn_errorf(RN_ENOMEM, "profile: %lld stream marks", (long long)p->nmark);
        p->msec = m, p->cap_msec = p->nmark;
    }
    int rc = rn_backend_marks_read(p->be, p->nmark, p->msec);
    if (rc) return rc;
    pthread_mutex_lock(&p->mu);
    for (int64_t i = p->step_first; i < p->n; i++) {
        span *s = &p->s[i];
        if (s->m0 < 0 || s->m1 < 0) continue;
        s->t0 = p->step_t0 + p->msec[s->m0];
        s->t1 = p->step_t0 + p->msec[s->m1];
    }
    pthread_mutex_unlock(&p->mu);
    return RN_OK;
}

/* the step's uploads on the copy stream, as trace-only spans */
static int read_copies(rn_prof *p) {
    double t0[16], t1[16];
    int64_t n = 0;
    int rc = rn_backend_copy_spans(p->be, 16, t0, t1, &n);
    if (rc == RN_ENOTSUP) return RN_OK;
    for (int64_t i = 0; rc == RN_OK && i < n; i++)
        rc = rn_prof_add_trace(p, "h2d", RN_PROF_COPY, p->step_t0 + t0[i], p->step_t0 + t1[i]);
    return rc;
}

int rn_prof_step_end(rn_prof *p) {
    int rc = p->marks ? read_marks(p) : RN_OK;
    if (rc == RN_OK && p->marks && p->nmark > 0) rc = read_copies(p);
    int src = rn_backend_sync(p->be);
    p->wall += rn_report_clock() - p->step_t0;
    pthread_mutex_lock(&p->mu);
    p->steps++;
    pthread_mutex_unlock(&p->mu);
    p->nmark = 0;
    return rc ? rc : src;
}

void rn_prof_totals(const rn_prof *p, int64_t *steps, double *wall, double *spans) {
    double sum = 0;
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    for (int64_t i = 0; i < p->n; i++)
        if (!p->s[i].trace_only) sum += p->s[i].t1 - p->s[i].t0;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    *steps = p->steps, *wall = p->wall, *spans = sum;
}

static const char *const dir_name[] = {"forward", "backward", "step"};

/* one row of the table: every span of a name and direction */
typedef struct {
    const char *name;
    int dir;
    int64_t calls;
    double sec, flops, bytes;
} row;

static int by_time(const void *a, const void *b) {
    const row *x = a, *y = b;
    if (x->sec != y->sec) return x->sec < y->sec ? 1 : -1;
    int c = strcmp(x->name, y->name);
    return c ? c : x->dir - y->dir;
}

/* close the memstream f (which sets *buf and *len) and write its bytes to path */
static int write_buf(const char *path, FILE *f, char **buf, size_t *len) {
    int rc = fclose(f) ? rn_errorf(RN_ENOMEM, "%s: building the output", path) : RN_OK;
    if (rc == RN_OK) rc = rn_file_write_atomic(path, *buf, *len);
    free(*buf);
    return rc;
}

static int write_table(const rn_prof *p, const char *title, const char *path) {
    row *r = rn_calloc((size_t)(p->n ? p->n : 1), sizeof *r);
    if (!r) return RN_ENOMEM;
    int64_t nr = 0;
    /* (spans of a step come in the same order every step: a linear search is cheap) */
    for (int64_t i = 0; i < p->n; i++) {
        const span *s = &p->s[i];
        if (s->trace_only) continue;
        int64_t j = 0;
        while (j < nr && (r[j].dir != s->dir || strcmp(r[j].name, s->name) != 0))
            j++;
        if (j == nr) r[nr++] = (row){.name = s->name, .dir = s->dir};
        r[j].calls++;
        r[j].sec += s->t1 - s->t0;
        r[j].flops += s->flops;
        r[j].bytes += s->bytes;
    }
    qsort(r, (size_t)nr, sizeof *r, by_time);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        free(r);
        return rn_errorf(RN_ENOMEM, "%s: building the table", path);
    }
    double steps = p->steps ? (double)p->steps : 1, sum = 0;
    for (int64_t j = 0; j < nr; j++)
        sum += r[j].sec;
    fprintf(f, "# %s\n", title);
    fprintf(f, "# %lld profiled steps; per step: ms (mean), share of the step's wall time, calls, FLOPs and bytes\n",
            (long long)p->steps);
    fprintf(f, "%-28s %-8s %10s %7s %6s %9s %8s %12s %12s\n", "name", "dir", "ms", "share", "calls", "GFLOP/s", "GB/s",
            "flops", "bytes");
    for (int64_t j = 0; j < nr; j++) {
        const row *x = &r[j];
        double gf = x->sec > 0 ? x->flops / x->sec / 1e9 : 0, gb = x->sec > 0 ? x->bytes / x->sec / 1e9 : 0;
        fprintf(f, "%-28s %-8s %10.3f %6.2f%% %6lld %9.2f %8.2f %12.4g %12.4g\n", x->name, dir_name[x->dir],
                1e3 * x->sec / steps, p->wall > 0 ? 100 * x->sec / p->wall : 0, (long long)((double)x->calls / steps),
                gf, gb, x->flops / steps, x->bytes / steps);
    }
    fprintf(f, "# rows sum to %.3f ms per step; measured step %.3f ms (%.2f%% of it in the rows)\n", 1e3 * sum / steps,
            1e3 * p->wall / steps, p->wall > 0 ? 100 * sum / p->wall : 0);
    free(r);
    return write_buf(path, f, &buf, &len);
}

static int write_trace(const rn_prof *p, const char *path) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return rn_errorf(RN_ENOMEM, "%s: building the trace", path);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"rn-train\"}},\n",
            RN_PROF_HOST);
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"host\"}},\n",
            RN_PROF_HOST);
    /* the compute track is the stream's own time line where marks timed it */
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
            RN_PROF_COMPUTE, p->marks ? "compute stream (events)" : "compute");
    /* the copy stream's track and one per loader worker, where they left a span (the
       loader takes at most 1024 workers) */
    unsigned char seen[1024] = {0};
    int copies = 0;
    for (int64_t i = 0; i < p->n; i++) {
        int w = p->s[i].track - RN_PROF_LOADER;
        if (p->s[i].track == RN_PROF_COPY && !copies++)
            fprintf(f,
                    ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":"
                    "\"copy stream (events)\"}}",
                    RN_PROF_COPY);
        if (w >= 0 && w < 1024 && !seen[w]++)
            fprintf(f,
                    ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":"
                    "\"loader worker %d\"}}",
                    RN_PROF_LOADER + w, w + 1);
    }
    for (int64_t i = 0; i < p->n; i++) {
        span c = p->s[i];
        const span *s = &c;
        /* a worker's chunk begun before the first profiled step: only its part inside */
        if (s->t1 < p->origin) continue;
        if (c.t0 < p->origin) c.t0 = p->origin;
        /* "layer1.0.conv1 forward", or a stage's own name ("sgd"); names are torchvision
           module names and fixed stage names: nothing to escape */
        fprintf(f,
                ",\n{\"name\":\"%s%s%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                "\"args\":{\"layer\":\"%s\",\"dir\":\"%s\",\"step\":%lld,\"flops\":%.0f,\"bytes\":%.0f}}",
                s->name, s->dir == RN_PROF_STEP ? "" : " ", s->dir == RN_PROF_STEP ? "" : dir_name[s->dir],
                dir_name[s->dir], s->track, 1e6 * (s->t0 - p->origin), 1e6 * (s->t1 - s->t0), s->name, dir_name[s->dir],
                (long long)s->step, s->flops, s->bytes);
    }
    fprintf(f, "\n]}\n");
    return write_buf(path, f, &buf, &len);
}

int rn_prof_write(const rn_prof *p, const char *title, const char *table_path, const char *trace_path) {
    /* (loader workers may still be adding spans) */
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    int rc = write_table(p, title, table_path);
    if (rc == RN_OK) rc = write_trace(p, trace_path);
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return rc;
}
