/* TensorBoard event files: the record framing, the writer with its per-tag step rule,
 * the validating reader, and the report sink rn-train writes them with. */
#include "rn/tbevent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rn/crc32c.h"
#include "rn/err.h"
#include "rn/tensor.h"
#include "tensorboard.pb-c.h"

/* TensorFlow's tensorflow/core/framework/types.proto */
#define DT_STRING 7
/* a record longer than this is taken for damage, not data (rn's are under 4 KB) */
#define MAX_RECORD (64u << 20)

uint32_t rn_tb_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* the largest step written so far of one tag */
typedef struct {
    char *tag;
    int64_t step;
} tag_step;

struct rn_tb_writer {
    FILE *f;
    char *path;
    tag_step *tags;
    int n_tags, cap_tags;
    int64_t max_step; /* in the folder when opened */
    int failed;       /* a write failed: every call fails from then on */
};

static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static tag_step *find_tag(rn_tb_writer *w, const char *tag) {
    for (int i = 0; i < w->n_tags; i++)
        if (strcmp(w->tags[i].tag, tag) == 0) return &w->tags[i];
    return NULL;
}

/* record that tag has step (the table keeps each tag's largest) */
static int note_step(rn_tb_writer *w, const char *tag, int64_t step) {
    tag_step *t = find_tag(w, tag);
    if (t) {
        if (step > t->step) t->step = step;
        return RN_OK;
    }
    if (w->n_tags == w->cap_tags) {
        int cap = w->cap_tags ? 2 * w->cap_tags : 16;
        tag_step *n = realloc(w->tags, sizeof *n * (size_t)cap);
        if (!n) return rn_errorf(RN_ENOMEM, "out of memory for the tags of %s", w->path);
        w->tags = n;
        w->cap_tags = cap;
    }
    char *copy = strdup(tag);
    if (!copy) return rn_errorf(RN_ENOMEM, "out of memory for the tags of %s", w->path);
    w->tags[w->n_tags++] = (tag_step){copy, step};
    return RN_OK;
}

static int write_failed(rn_tb_writer *w, int err) {
    w->failed = err ? err : EIO;
    return rn_errorf(RN_EIO, "%s: cannot write: %s", w->path, strerror(w->failed));
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* One Event, framed: length, masked CRC of the length, data, masked CRC of the data. */
static int write_event(rn_tb_writer *w, const Tensorboard__Event *ev) {
    if (w->failed) return rn_errorf(RN_EIO, "%s: cannot write: %s", w->path, strerror(w->failed));
    size_t n = tensorboard__event__get_packed_size(ev);
    uint8_t *buf = rn_malloc(n + 16);
    if (!buf) return RN_ENOMEM;
    uint8_t *data = buf + 12;
    tensorboard__event__pack(ev, data);
    uint64_t len = n;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(len >> (8 * i));
    put_u32(buf + 8, rn_tb_mask(rn_crc32c(0, buf, 8)));
    put_u32(data + n, rn_tb_mask(rn_crc32c(0, data, n)));
    errno = 0;
    size_t put = fwrite(buf, 1, n + 16, w->f);
    int err = errno;
    free(buf);
    return put == n + 16 ? RN_OK : write_failed(w, err);
}

/* ---- reading ---- */

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* the items of one decoded Event, through fn */
static int visit(const Tensorboard__Event *ev, int64_t index, int (*fn)(void *, const rn_tb_item *), void *ctx) {
    rn_tb_item it = {.index = index, .wall_time = ev->wall_time, .step = ev->step, .kind = RN_TB_OTHER};
    int rc;
    if (ev->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION) {
        it.kind = RN_TB_VERSION;
        it.text = ev->file_version;
        return fn(ctx, &it);
    }
    if (ev->what_case != TENSORBOARD__EVENT__WHAT_SUMMARY) return fn(ctx, &it);
    for (size_t i = 0; i < ev->summary->n_value; i++) {
        const Tensorboard__Summary__Value *v = ev->summary->value[i];
        it.tag = v->tag;
        it.kind = RN_TB_OTHER;
        it.text = NULL;
        it.value = 0;
        const Tensorboard__TensorProto *t = v->tensor;
        char *copy = NULL;
        if (v->value_case == TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE) {
            it.kind = RN_TB_SCALAR;
            it.value = v->simple_value;
        } else if (v->value_case == TENSORBOARD__SUMMARY__VALUE__VALUE_TENSOR && t->dtype == DT_STRING &&
                   t->n_string_val == 1 && v->metadata && v->metadata->plugin_data &&
                   strcmp(v->metadata->plugin_data->plugin_name, "text") == 0) {
            /* bytes are not 0-terminated */
            if (!(copy = rn_malloc(t->string_val[0].len + 1))) return RN_ENOMEM;
            if (t->string_val[0].len) memcpy(copy, t->string_val[0].data, t->string_val[0].len);
            copy[t->string_val[0].len] = 0;
            it.kind = RN_TB_TEXT;
            it.text = copy;
        }
        rc = fn(ctx, &it);
        free(copy);
        if (rc) return rc;
    }
    return RN_OK;
}

int rn_tb_read(const char *path, int tail_ok, int (*fn)(void *ctx, const rn_tb_item *it), void *ctx) {
    FILE *f = fopen(path, "rb");
    if (!f) return rn_errorf(RN_EIO, "%s: %s", path, strerror(errno));
    int rc = RN_OK;
    uint8_t head[12] = {0}, tail[4] = {0}, *data = NULL;
    uint64_t off = 0;
    for (int64_t index = 0;; index++) {
        size_t got = fread(head, 1, sizeof head, f);
        if (got == 0 && !ferror(f)) {
            /* (an empty file is one its writer has just made) */
            if (index == 0 && !tail_ok) rc = rn_errorf(RN_ECORRUPT, "%s: empty: not an event file", path);
            break;
        }
        if (got < sizeof head) {
            if (ferror(f)) rc = rn_errorf(RN_EIO, "%s: %s", path, strerror(errno));
            else if (!tail_ok)
                rc = rn_errorf(RN_ECORRUPT, "%s: record %lld at byte %llu: truncated (%zu of its 12 header bytes)",
                               path, (long long)index, (unsigned long long)off, got);
            break;
        }
        uint64_t len = get_u64(head);
        if (rn_tb_mask(rn_crc32c(0, head, 8)) != get_u32(head + 8)) {
            rc = rn_errorf(RN_ECORRUPT, "%s: record %lld at byte %llu: the length fails its CRC32C", path,
                           (long long)index, (unsigned long long)off);
            break;
        }
        if (len > MAX_RECORD) {
            rc = rn_errorf(RN_ECORRUPT, "%s: record %lld at byte %llu: length %llu is not an event's", path,
                           (long long)index, (unsigned long long)off, (unsigned long long)len);
            break;
        }
        free(data);
        if (!(data = rn_malloc(len + 1))) {
            rc = RN_ENOMEM;
            break;
        }
        got = fread(data, 1, len, f);
        if (got == len) got += fread(tail, 1, sizeof tail, f);
        if (got < len + sizeof tail) {
            if (ferror(f)) rc = rn_errorf(RN_EIO, "%s: %s", path, strerror(errno));
            else if (!tail_ok)
                rc = rn_errorf(RN_ECORRUPT, "%s: record %lld at byte %llu: truncated (%llu of its %llu bytes)", path,
                               (long long)index, (unsigned long long)off, (unsigned long long)got + 12,
                               (unsigned long long)len + 16);
            break;
        }
        if (rn_tb_mask(rn_crc32c(0, data, len)) != get_u32(tail)) {
            rc = rn_errorf(RN_ECORRUPT, "%s: record %lld at byte %llu: the data fails its CRC32C", path,
                           (long long)index, (unsigned long long)off);
            break;
        }
        Tensorboard__Event *ev = tensorboard__event__unpack(NULL, len, data);
        if (!ev) {
            rc = rn_errorf(RN_ECORRUPT, "%s: record %lld at byte %llu: not an Event message", path, (long long)index,
                           (unsigned long long)off);
            break;
        }
        if (index == 0 && (ev->what_case != TENSORBOARD__EVENT__WHAT_FILE_VERSION ||
                           strncmp(ev->file_version, "brain.Event:", 12) != 0)) {
            tensorboard__event__free_unpacked(ev, NULL);
            rc = rn_errorf(RN_ECORRUPT, "%s: the first record is not a file_version \"brain.Event:N\"", path);
            break;
        }
        rc = visit(ev, index, fn, ctx);
        tensorboard__event__free_unpacked(ev, NULL);
        if (rc) break;
        off += len + 16;
    }
    free(data);
    fclose(f);
    return rc;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void rn_tb_list_free(char **paths, int n) {
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

int rn_tb_list(const char *dir, char ***paths, int *n) {
    *paths = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return rn_errorf(RN_EIO, "%s: %s", dir, strerror(errno));
    int rc = RN_OK, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, RN_TB_NAME)) continue;
        char *p = NULL;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **np = realloc(*paths, sizeof *np * (size_t)cap);
            if (!np) {
                rc = rn_errorf(RN_ENOMEM, "out of memory listing %s", dir);
                break;
            }
            *paths = np;
        }
        if (asprintf(&p, "%s/%s", dir, e->d_name) < 0) {
            rc = rn_errorf(RN_ENOMEM, "out of memory listing %s", dir);
            break;
        }
        struct stat st;
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(p);
            continue;
        }
        (*paths)[(*n)++] = p;
    }
    closedir(d);
    if (rc) {
        rn_tb_list_free(*paths, *n);
        *paths = NULL;
        *n = 0;
        return rc;
    }
    if (*n) qsort(*paths, (size_t)*n, sizeof **paths, by_name);
    return RN_OK;
}

/* ---- writing ---- */

/* the scan of a folder's files: every tag's largest step */
static int scan_item(void *ctx, const rn_tb_item *it) {
    rn_tb_writer *w = ctx;
    if (!it->tag) return RN_OK;
    if (it->step > w->max_step) w->max_step = it->step;
    return note_step(w, it->tag, it->step);
}

static int mkdirs(const char *dir) {
    char *p = strdup(dir);
    if (!p) return rn_errorf(RN_ENOMEM, "out of memory");
    int rc = RN_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        struct stat st;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            rc = rn_errorf(RN_EIO, "%s: cannot make the folder %s: %s", dir, p, strerror(errno));
        else if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
            rc = rn_errorf(RN_EIO, "%s: %s is not a folder", dir, p);
        *s = c;
        if (rc || !c) break;
    }
    free(p);
    return rc;
}

static void writer_free(rn_tb_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_tags; i++) free(w->tags[i].tag);
    free(w->tags);
    free(w->path);
    free(w);
}

/* w with its file f open: the file_version record, flushed */
static int start_file(rn_tb_writer *w) {
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_now();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = RN_TB_FILE_VERSION;
    int rc = write_event(w, &ev);
    if (rc == RN_OK) rc = rn_tb_flush(w);
    return rc;
}

int rn_tb_open_file(const char *path, rn_tb_writer **out) {
    *out = NULL;
    rn_tb_writer *w = rn_calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return rn_errorf(RN_ENOMEM, "out of memory");
    }
    w->max_step = -1;
    if (!(w->f = fopen(path, "ab"))) {
        int rc = rn_errorf(RN_EIO, "%s: cannot open for writing: %s", path, strerror(errno));
        writer_free(w);
        return rc;
    }
    int rc = start_file(w);
    if (rc) {
        fclose(w->f);
        writer_free(w);
        return rc;
    }
    *out = w;
    return RN_OK;
}

int rn_tb_open(const char *dir, rn_tb_writer **out) {
    *out = NULL;
    int rc = mkdirs(dir);
    if (rc) return rc;
    rn_tb_writer *w = rn_calloc(1, sizeof *w);
    if (!w) return RN_ENOMEM;
    w->max_step = -1;
    char **old = NULL;
    int n_old = 0;
    if ((rc = rn_tb_list(dir, &old, &n_old))) goto fail;
    for (int i = 0; i < n_old; i++)
        if ((rc = rn_tb_read(old[i], 1, scan_item, w))) {
            rn_error_context(rc, "the steps already in %s (move the file out of it to go on)", dir);
            goto fail;
        }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    for (char *h = host; *h; h++)
        if (*h == '/') *h = '_';
    /* microseconds and the pid after the second: two runs in one second get two files, in
       the order they started when sorted by name (the order TensorBoard reads them in) */
    for (int tries = 0; !w->f; tries++) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        free(w->path);
        w->path = NULL;
        if (asprintf(&w->path, "%s/events.out.%s.%010lld.%s.%06ld.%ld", dir, RN_TB_NAME, (long long)t.tv_sec,
                     host[0] ? host : "localhost", t.tv_nsec / 1000, (long)getpid()) < 0) {
            w->path = NULL;
            rc = rn_errorf(RN_ENOMEM, "out of memory");
            goto fail;
        }
        int fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
        if (fd < 0 && (errno != EEXIST || tries == 100)) {
            rc = rn_errorf(RN_EIO, "%s: cannot create %s: %s", dir, w->path, strerror(errno));
            goto fail;
        }
        if (fd >= 0 && !(w->f = fdopen(fd, "ab"))) {
            rc = rn_errorf(RN_EIO, "%s: %s", w->path, strerror(errno));
            close(fd);
            goto fail;
        }
    }
    if ((rc = start_file(w))) goto fail;
    rn_tb_list_free(old, n_old);
    *out = w;
    return RN_OK;
fail:
    rn_tb_list_free(old, n_old);
    if (w->f) {
        fclose(w->f);
        if (w->path) unlink(w->path); /* made here, holding nothing whole */
    }
    writer_free(w);
    return rc;
}

const char *rn_tb_path(const rn_tb_writer *w) { return w->path; }
int64_t rn_tb_max_step(const rn_tb_writer *w) { return w->max_step; }

/* whether tag may take step (above the largest it has), noting it when so: 1, 0, or an error */
static int take_step(rn_tb_writer *w, const char *tag, int64_t step) {
    const tag_step *t = find_tag(w, tag);
    if (t && t->step >= step) return 0;
    int rc = note_step(w, tag, step);
    return rc ? rc : 1;
}

static int write_value(rn_tb_writer *w, int64_t step, Tensorboard__Summary__Value *v) {
    if (w->failed) return rn_errorf(RN_EIO, "%s: cannot write: %s", w->path, strerror(w->failed));
    int rc = take_step(w, v->tag, step);
    if (rc <= 0) return rc;
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = &v;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_now();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(w, &ev);
}

int rn_tb_scalar(rn_tb_writer *w, const char *tag, int64_t step, double value) {
    Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = (float)value;
    return write_value(w, step, &v);
}

int rn_tb_text(rn_tb_writer *w, const char *tag, int64_t step, const char *text) {
    /* as tf.summary.text and torch's add_text: the "text" plugin (its content, an empty
       TextPluginData, is no bytes) over a DT_STRING tensor of shape [1] */
    Tensorboard__SummaryMetadata__PluginData pd = TENSORBOARD__SUMMARY_METADATA__PLUGIN_DATA__INIT;
    pd.plugin_name = "text";
    Tensorboard__SummaryMetadata md = TENSORBOARD__SUMMARY_METADATA__INIT;
    md.plugin_data = &pd;
    Tensorboard__TensorShapeProto__Dim dim = TENSORBOARD__TENSOR_SHAPE_PROTO__DIM__INIT, *dims = &dim;
    dim.size = 1;
    Tensorboard__TensorShapeProto shape = TENSORBOARD__TENSOR_SHAPE_PROTO__INIT;
    shape.n_dim = 1;
    shape.dim = &dims;
    ProtobufCBinaryData s = {strlen(text), (uint8_t *)text};
    Tensorboard__TensorProto t = TENSORBOARD__TENSOR_PROTO__INIT;
    t.dtype = DT_STRING;
    t.tensor_shape = &shape;
    t.n_string_val = 1;
    t.string_val = &s;
    Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.metadata = &md;
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_TENSOR;
    v.tensor = &t;
    return write_value(w, step, &v);
}

int rn_tb_flush(rn_tb_writer *w) {
    if (w->failed) return rn_errorf(RN_EIO, "%s: cannot write: %s", w->path, strerror(w->failed));
    errno = 0;
    return fflush(w->f) == 0 ? RN_OK : write_failed(w, errno);
}

int rn_tb_close(rn_tb_writer *w) {
    if (!w) return RN_OK;
    int rc = rn_tb_flush(w); /* (a writer that failed before fails here again) */
    errno = 0;
    if (fclose(w->f) != 0 && rc == RN_OK) rc = write_failed(w, errno);
    writer_free(w);
    return rc;
}

/* ---- the report sink ---- */

typedef struct {
    rn_tb_writer *w;
    const char *tool;
    FILE *err;
    int argc;
    char **argv;
    int reported; /* the write error is on err */
} sink;

/* a failed write, once */
static void sink_check(sink *s, int rc) {
    if (rc == RN_OK || s->reported) return;
    s->reported = 1;
    fprintf(s->err, "%s: --tensorboard %s; no more events are written (training goes on)\n", s->tool,
            rn_last_error());
    fflush(s->err);
}

static void sink_begin(void *ctx, const rn_run_info *run) {
    sink *s = ctx;
    if (rn_tb_max_step(s->w) > run->step)
        fprintf(s->err, "%s: --tensorboard: the folder holds steps up to %lld and this run starts at %lld: "
                        "steps already there are not written again\n",
                s->tool, (long long)rn_tb_max_step(s->w), (long long)run->step);
    /* the command line as a Markdown code block, one argument a line when long */
    size_t n = 256;
    for (int i = 0; i < s->argc; i++) n += strlen(s->argv[i]) + 8;
    char *text = rn_malloc(n);
    if (!text) return;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    size_t len = (size_t)snprintf(text, n, "rn %s on %s, from step %lld:\n\n    ", RN_VERSION, host,
                                  (long long)run->step);
    for (int i = 0; i < s->argc; i++) {
        int flag = i > 0 && s->argv[i][0] == '-' && s->argv[i][1] == '-';
        len += (size_t)snprintf(text + len, n - len, "%s%s", i == 0 ? "" : flag ? " \\\n      " : " ", s->argv[i]);
    }
    sink_check(s, rn_tb_text(s->w, "run/flags", run->step, text));
    free(text);
    sink_check(s, rn_tb_flush(s->w));
}

static void sink_step(void *ctx, const rn_step_info *st) {
    sink *s = ctx;
    if (s->reported) return;
    int64_t k = st->step;
    int rc = rn_tb_scalar(s->w, "train/loss", k, st->loss);
    if (rc == RN_OK) rc = rn_tb_scalar(s->w, "train/lr", k, st->lr);
    if (rc == RN_OK) rc = rn_tb_scalar(s->w, "train/img_s", k, st->img_s);
    if (rc == RN_OK) rc = rn_tb_scalar(s->w, "train/data_wait", k, st->data_wait);
    if (rc == RN_OK && st->scaled) rc = rn_tb_scalar(s->w, "train/loss_scale", k, st->loss_scale);
    if (rc == RN_OK && st->has_grad_norm) rc = rn_tb_scalar(s->w, "train/grad_norm", k, st->grad_norm);
    if (rc == RN_OK) rc = rn_tb_flush(s->w);
    sink_check(s, rc);
}

static void sink_epoch(void *ctx, const rn_epoch_info *e) {
    sink *s = ctx;
    if (s->reported || !e->has_val) return;
    int rc = rn_tb_scalar(s->w, "val/top1", e->step, e->val_top1);
    if (rc == RN_OK) rc = rn_tb_scalar(s->w, "val/top5", e->step, e->val_top5);
    if (rc == RN_OK) rc = rn_tb_scalar(s->w, "val/loss", e->step, e->val_loss);
    if (rc == RN_OK && e->has_ema_val) rc = rn_tb_scalar(s->w, "val_ema/top1", e->step, e->ema_top1);
    if (rc == RN_OK && e->has_ema_val) rc = rn_tb_scalar(s->w, "val_ema/top5", e->step, e->ema_top5);
    if (rc == RN_OK && e->has_ema_val) rc = rn_tb_scalar(s->w, "val_ema/loss", e->step, e->ema_loss);
    if (rc == RN_OK) rc = rn_tb_flush(s->w);
    sink_check(s, rc);
}

static void sink_close(void *ctx) {
    sink *s = ctx;
    int rc = rn_tb_close(s->w);
    if (!s->reported) sink_check(s, rc);
    free(s);
}

int rn_report_tensorboard(rn_tb_writer *w, const char *tool, int argc, char **argv, FILE *err, rn_reporter *out) {
    sink *s = rn_calloc(1, sizeof *s);
    if (!s) {
        rn_tb_close(w);
        return RN_ENOMEM;
    }
    *s = (sink){.w = w, .tool = tool, .err = err, .argc = argc, .argv = argv};
    *out = (rn_reporter){.begin = sink_begin, .step = sink_step, .epoch = sink_epoch, .close = sink_close, .ctx = s};
    return RN_OK;
}
