#include "rn/dataset.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "rn.pb-c.h"
#include "rn/crc32c.h"
#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/json.h"

#define FORMAT_VERSION 1
#define DEFAULT_MAP_SIZE ((size_t)1 << 30)
/* a write transaction holds at most this many records or bytes */
#define BATCH_RECORDS 1024
#define BATCH_BYTES ((size_t)64 << 20)

static char *xstrdup(const char *s) {
    char *p = strdup(s ? s : "");
    if (!p) rn_errorf(RN_ENOMEM, "out of memory");
    return p;
}

void rn_dataset_info_clear(rn_dataset_info *info) {
    if (!info) return;
    for (int i = 0; i < info->n_classes; i++)
        if (info->class_names) free(info->class_names[i]);
    free(info->class_names);
    free(info->class_counts);
    free(info->command);
    free(info->rn_version);
    memset(info, 0, sizeof *info);
}

/* ---------------------------------------------------------------- reading */

struct rn_dataset {
    char *path;
    MDB_env *env;
    MDB_dbi dbi;
    rn_dataset_info info;
};

struct rn_dataset_reader {
    rn_dataset *ds;
    MDB_txn *txn;
    Rn__Sample *cur;
};

static int info_from_proto(const Rn__DatasetInfo *p, rn_dataset_info *info, const char *path) {
    memset(info, 0, sizeof *info);
    if (p->format_version != FORMAT_VERSION)
        return rn_errorf(RN_EDATA, "%s: dataset format version %u, this build reads %d (rebuild it with this rn-prep)",
                         path, p->format_version, FORMAT_VERSION);
    if (p->channels != 1 && p->channels != 3)
        return rn_errorf(RN_EDATA, "%s: __info__ says %u channels (1 or 3 expected): rebuild with rn-prep",
                         path, p->channels);
    if (p->enc != RN__ENCODING__RAW && p->enc != RN__ENCODING__JPEG)
        return rn_errorf(RN_EDATA, "%s: __info__ has unknown encoding %d: rebuild with rn-prep", path,
                         (int)p->enc);
    if (p->n_mean != p->channels || p->n_std != p->channels)
        return rn_errorf(RN_EDATA, "%s: __info__ has %zu means and %zu standard deviations for %u channels: rebuild "
                         "with rn-prep", path, p->n_mean, p->n_std, p->channels);
    if (p->n_class_counts && p->n_class_counts != p->n_class_names)
        return rn_errorf(RN_EDATA, "%s: __info__ has %zu class names but %zu class counts", path,
                         p->n_class_names, p->n_class_counts);
    info->count = p->count;
    info->skipped = p->skipped;
    info->channels = (int)p->channels;
    info->enc = p->enc;
    info->min_width = p->min_width;
    info->min_height = p->min_height;
    info->max_width = p->max_width;
    info->max_height = p->max_height;
    info->data_bytes = p->data_bytes;
    for (size_t c = 0; c < 3; c++) {
        info->mean[c] = c < p->n_mean ? p->mean[c] : 0.0;
        info->std[c] = c < p->n_std ? p->std[c] : 0.0;
    }
    info->n_classes = (int)p->n_class_names;
    info->class_names = rn_calloc(p->n_class_names + 1, sizeof(char *));
    info->class_counts = rn_calloc(p->n_class_names + 1, sizeof(uint64_t));
    info->command = xstrdup(p->command);
    info->rn_version = xstrdup(p->rn_version);
    if (!info->class_names || !info->class_counts || !info->command || !info->rn_version) {
        info->n_classes = 0;
        rn_dataset_info_clear(info);
        return RN_ENOMEM;
    }
    for (size_t i = 0; i < p->n_class_names; i++) {
        if (!(info->class_names[i] = xstrdup(p->class_names[i]))) {
            rn_dataset_info_clear(info);
            return RN_ENOMEM;
        }
        if (p->n_class_counts) info->class_counts[i] = p->class_counts[i];
    }
    return RN_OK;
}

int rn_dataset_info_parse(const uint8_t *data, size_t len, const char *path, rn_dataset_info *info) {
    memset(info, 0, sizeof *info);
    Rn__DatasetInfo *pi = rn__dataset_info__unpack(NULL, len, data);
    if (!pi)
        return rn_errorf(RN_EDATA, "%s: \"__info__\" record is not a valid DatasetInfo (rebuild with rn-prep)", path);
    int rc = info_from_proto(pi, info, path);
    rn__dataset_info__free_unpacked(pi, NULL);
    return rc;
}

static int lmdb_err(int code, const char *path, const char *call, int e) {
    return rn_errorf(code, "%s: %s: %s", path, call, mdb_strerror(e));
}

/* A write error of the dataset being built. LMDB reports a short write on a full disk as
 * EIO ("Input/output error"): when the file system has (almost) no room left, say so. */
static int write_err(const char *dir, const char *call, int e) {
    struct statvfs fs;
    if ((e == EIO || e == ENOSPC) && statvfs(dir, &fs) == 0 &&
        (uint64_t)fs.f_bavail * fs.f_frsize < ((uint64_t)1 << 20))
        return rn_errorf(RN_EIO, "%s: no space left on the device (%s: %s; %llu bytes free): free some space or "
                         "write the dataset elsewhere", dir, call, mdb_strerror(e),
                         (unsigned long long)fs.f_bavail * fs.f_frsize);
    return lmdb_err(RN_EIO, dir, call, e);
}

int rn_dataset_open(const char *path, rn_dataset **out) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return rn_errorf(RN_EIO, "%s: %s (make it with rn-prep)", path, strerror(errno));
    unsigned flags = MDB_RDONLY | MDB_NOTLS;
    if (!S_ISDIR(st.st_mode)) flags |= MDB_NOSUBDIR;
    else {
        char p[4096];
        snprintf(p, sizeof p, "%s/data.mdb", path);
        if (access(p, R_OK) != 0)
            return rn_errorf(RN_EDATA, "%s: no data.mdb inside: not an LMDB dataset (make it with rn-prep)", path);
    }
    rn_dataset *ds = rn_calloc(1, sizeof *ds);
    if (!ds) return RN_ENOMEM;
    int rc = RN_OK, e;
    MDB_txn *txn = NULL;
    if (!(ds->path = xstrdup(path))) { rc = RN_ENOMEM; goto fail; }
    if ((e = mdb_env_create(&ds->env)) != 0) { rc = lmdb_err(RN_EDATA, path, "mdb_env_create", e); goto fail; }
    mdb_env_set_maxreaders(ds->env, 512);
    e = mdb_env_open(ds->env, path, flags, 0644);
    if (e == EACCES || e == EROFS) {
        /* a read-only copy: no lock file possible; fine since nothing writes it */
        mdb_env_close(ds->env);
        ds->env = NULL;
        if ((e = mdb_env_create(&ds->env)) == 0) {
            mdb_env_set_maxreaders(ds->env, 512);
            e = mdb_env_open(ds->env, path, flags | MDB_NOLOCK, 0644);
        }
    }
    if (e != 0) { rc = lmdb_err(RN_EDATA, path, "mdb_env_open", e); goto fail; }
    if ((e = mdb_txn_begin(ds->env, NULL, MDB_RDONLY, &txn)) != 0) { rc = lmdb_err(RN_EDATA, path, "mdb_txn_begin", e); goto fail; }
    if ((e = mdb_dbi_open(txn, NULL, 0, &ds->dbi)) != 0) { rc = lmdb_err(RN_EDATA, path, "mdb_dbi_open", e); goto fail; }
    MDB_val k = {strlen(RN_DATASET_INFO_KEY), (void *)RN_DATASET_INFO_KEY}, v;
    e = mdb_get(txn, ds->dbi, &k, &v);
    if (e == MDB_NOTFOUND) {
        rc = rn_errorf(RN_EDATA, "%s: no \"__info__\" record: not an rn dataset (make it with rn-prep)", path);
        goto fail;
    }
    if (e != 0) { rc = lmdb_err(RN_EDATA, path, "mdb_get(__info__)", e); goto fail; }
    if ((rc = rn_dataset_info_parse(v.mv_data, v.mv_size, path, &ds->info)) != RN_OK) goto fail;
    MDB_stat ms;
    if ((e = mdb_stat(txn, ds->dbi, &ms)) != 0) { rc = lmdb_err(RN_EDATA, path, "mdb_stat", e); goto fail; }
    if (ms.ms_entries != ds->info.count + 1) {
        rc = rn_errorf(RN_EDATA, "%s: %zu entries but __info__ says %" PRIu64 " records + 1: the database is damaged (rebuild with rn-prep)",
                       path, ms.ms_entries, ds->info.count);
        goto fail;
    }
    mdb_txn_abort(txn);
    *out = ds;
    return RN_OK;
fail:
    if (txn) mdb_txn_abort(txn);
    rn_dataset_close(ds);
    return rc;
}

void rn_dataset_close(rn_dataset *ds) {
    if (!ds) return;
    if (ds->env) mdb_env_close(ds->env);
    rn_dataset_info_clear(&ds->info);
    free(ds->path);
    free(ds);
}

const rn_dataset_info *rn_dataset_get_info(const rn_dataset *ds) { return &ds->info; }
const char *rn_dataset_path(const rn_dataset *ds) { return ds->path; }

int rn_dataset_reader_open(rn_dataset *ds, rn_dataset_reader **out) {
    *out = NULL;
    rn_dataset_reader *r = rn_calloc(1, sizeof *r);
    if (!r) return RN_ENOMEM;
    r->ds = ds;
    int e = mdb_txn_begin(ds->env, NULL, MDB_RDONLY, &r->txn);
    if (e != 0) {
        free(r);
        return lmdb_err(RN_EDATA, ds->path, "mdb_txn_begin", e);
    }
    *out = r;
    return RN_OK;
}

void rn_dataset_reader_close(rn_dataset_reader *r) {
    if (!r) return;
    if (r->cur) rn__sample__free_unpacked(r->cur, NULL);
    if (r->txn) mdb_txn_abort(r->txn);
    free(r);
}

int rn_dataset_sample_parse(const uint8_t *data, size_t len, int n_classes, const char *path, const char *key,
                            rn_sample_msg **msg, rn_sample *out) {
    memset(out, 0, sizeof *out);
    *msg = NULL;
    Rn__Sample *s = rn__sample__unpack(NULL, len, data);
    if (!s)
        return rn_errorf(RN_EDATA, "%s: record %s: not a valid Sample message (rebuild with rn-prep)",
                         path, key);
    *msg = s;
    if (s->label < 0 || (n_classes > 0 && s->label >= n_classes))
        return rn_errorf(RN_EDATA, "%s: record %s: label %d outside 0..%d (rebuild with rn-prep --classes)",
                         path, key, s->label, n_classes - 1);
    if (s->width == 0 || s->height == 0 || (s->channels != 1 && s->channels != 3) || s->data.len == 0)
        return rn_errorf(RN_EDATA, "%s: record %s: bad image %ux%ux%u with %zu bytes", path, key,
                         s->width, s->height, s->channels, s->data.len);
    if (s->enc == RN__ENCODING__RAW) {
        if ((uint64_t)s->width * s->height * s->channels != s->data.len)
            return rn_errorf(RN_EDATA, "%s: record %s: raw %ux%ux%u image needs %" PRIu64 " bytes, has %zu",
                             path, key, s->width, s->height, s->channels,
                             (uint64_t)s->width * s->height * s->channels, s->data.len);
    } else if (s->enc != RN__ENCODING__JPEG) {
        return rn_errorf(RN_EDATA, "%s: record %s: unknown encoding %d", path, key, (int)s->enc);
    }
    if (s->crc32c) {
        uint32_t crc = rn_crc32c(0, s->data.data, s->data.len);
        if (crc != s->crc32c)
            return rn_errorf(RN_EDATA, "%s: record %s: its image data fails its checksum (crc32c %08x, stored %08x): "
                             "the dataset is corrupt (rebuild it with rn-prep)", path, key, crc, s->crc32c);
    }
    out->label = s->label;
    out->height = s->height;
    out->width = s->width;
    out->channels = s->channels;
    out->enc = s->enc;
    out->data = s->data.data;
    out->len = s->data.len;
    out->name = s->name ? s->name : "";
    return RN_OK;
}

void rn_dataset_sample_free(rn_sample_msg *msg) {
    if (msg) rn__sample__free_unpacked(msg, NULL);
}

int rn_dataset_read(rn_dataset_reader *r, uint64_t index, rn_sample *out) {
    const rn_dataset *ds = r->ds;
    memset(out, 0, sizeof *out);
    if (r->cur) {
        rn__sample__free_unpacked(r->cur, NULL);
        r->cur = NULL;
    }
    if (index >= ds->info.count)
        return rn_errorf(RN_EINVAL, "%s: record %08" PRIu64 " asked for, the dataset has %" PRIu64,
                         ds->path, index, ds->info.count);
    char key[32];
    int kl = snprintf(key, sizeof key, "%08" PRIu64, index);
    MDB_val k = {(size_t)kl, key}, v;
    int e = mdb_get(r->txn, ds->dbi, &k, &v);
    if (e != 0)
        return rn_errorf(RN_EDATA, "%s: record %s: %s (the dataset is incomplete: rebuild with rn-prep)",
                         ds->path, key, mdb_strerror(e));
    return rn_dataset_sample_parse(v.mv_data, v.mv_size, ds->info.n_classes, ds->path, key, &r->cur, out);
}

int rn_dataset_read_classes(const char *path, char ***names, int *n) {
    *names = NULL;
    *n = 0;
    struct stat st;
    if (stat(path, &st) != 0) return rn_errorf(RN_EIO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        rn_dataset *ds;
        int rc = rn_dataset_open(path, &ds);
        if (rc) return rc;
        /* steal the names */
        *names = ds->info.class_names;
        *n = ds->info.n_classes;
        ds->info.class_names = NULL;
        ds->info.n_classes = 0;
        rn_dataset_close(ds);
        return RN_OK;
    }
    uint8_t *buf;
    size_t len;
    int rc = rn_file_read(path, &buf, &len);
    if (rc) return rc;
    int cap = 64, cnt = 0;
    char **v = rn_malloc(cap * sizeof *v);
    if (!v) {
        free(buf);
        return RN_ENOMEM;
    }
    size_t p = 0;
    while (p < len) {
        size_t e = p;
        while (e < len && buf[e] != '\n') e++;
        size_t l = e - p;
        if (l > 0 && buf[p + l - 1] == '\r') l--;
        if (l > 0) {
            if (memchr(buf + p, 0, l)) {
                rc = rn_errorf(RN_EDATA, "%s: line %d holds a NUL byte: not a class list", path, cnt + 1);
                goto fail;
            }
            if (cnt == cap) {
                char **nv = realloc(v, 2 * cap * sizeof *v);
                if (!nv) { rc = rn_errorf(RN_ENOMEM, "out of memory"); goto fail; }
                v = nv;
                cap *= 2;
            }
            if (!(v[cnt] = strndup((char *)buf + p, l))) { rc = rn_errorf(RN_ENOMEM, "out of memory"); goto fail; }
            cnt++;
        }
        p = e + 1;
    }
    free(buf);
    if (cnt == 0) {
        free(v);
        return rn_errorf(RN_EDATA, "%s: no class names in it (one name per line expected)", path);
    }
    *names = v;
    *n = cnt;
    return RN_OK;
fail:
    for (int i = 0; i < cnt; i++) free(v[i]);
    free(v);
    free(buf);
    return rc;
}

/* ---------------------------------------------------------------- describe */

int rn_dataset_describe(const char *path, FILE *out, int json) {
    rn_dataset *ds;
    int rc = rn_dataset_open(path, &ds);
    if (rc) return rc;
    const rn_dataset_info *in = &ds->info;
    const char *enc = in->enc == RN_ENC_JPEG ? "jpeg" : "raw";
    int c = in->channels;
    if (json) {
        fputs("{\"kind\":\"dataset\",\"path\":", out);
        rn_json_string(out, path);
        fprintf(out, ",\"count\":%" PRIu64 ",\"skipped\":%" PRIu64 ",\"encoding\":\"%s\",\"channels\":%d",
                in->count, in->skipped, enc, c);
        fprintf(out, ",\"min_width\":%u,\"min_height\":%u,\"max_width\":%u,\"max_height\":%u,\"data_bytes\":%" PRIu64,
                in->min_width, in->min_height, in->max_width, in->max_height, in->data_bytes);
        fputs(",\"mean\":[", out);
        for (int i = 0; i < c; i++) fprintf(out, "%s%.6f", i ? "," : "", in->mean[i]);
        fputs("],\"std\":[", out);
        for (int i = 0; i < c; i++) fprintf(out, "%s%.6f", i ? "," : "", in->std[i]);
        fputs("],\"classes\":[", out);
        for (int i = 0; i < in->n_classes; i++) {
            fputs(i ? ",{\"label\":" : "{\"label\":", out);
            fprintf(out, "%d,\"name\":", i);
            rn_json_string(out, in->class_names[i]);
            fprintf(out, ",\"count\":%" PRIu64 "}", in->class_counts[i]);
        }
        fputs("],\"command\":", out);
        rn_json_string(out, in->command);
        fputs(",\"rn_version\":", out);
        rn_json_string(out, in->rn_version);
        fputs("}\n", out);
    } else {
        fprintf(out, "dataset:    %s\n", path);
        fprintf(out, "records:    %" PRIu64 " (%" PRIu64 " inputs skipped by rn-prep)\n", in->count, in->skipped);
        double b = (double)in->data_bytes;
        const char *unit = b >= 1e9 ? "GB" : b >= 1e6 ? "MB" : "kB";
        double scaled = b >= 1e9 ? b / 1e9 : b >= 1e6 ? b / 1e6 : b / 1e3;
        fprintf(out, "encoding:   %s, %d channel%s, %.1f %s of image data\n", enc, c, c == 1 ? "" : "s", scaled, unit);
        fprintf(out, "sizes:      %ux%u to %ux%u (width x height)\n", in->min_width, in->min_height,
                in->max_width, in->max_height);
        fputs("mean:      ", out);
        for (int i = 0; i < c; i++) fprintf(out, " %.6f", in->mean[i]);
        fputs("\nstd:       ", out);
        for (int i = 0; i < c; i++) fprintf(out, " %.6f", in->std[i]);
        fprintf(out, "\nclasses:    %d\n", in->n_classes);
        for (int i = 0; i < in->n_classes; i++)
            fprintf(out, "  %5d  %-24s %" PRIu64 "\n", i, in->class_names[i], in->class_counts[i]);
        fprintf(out, "command:    %s\n", in->command);
        fprintf(out, "rn version: %s\n", in->rn_version);
    }
    rn_dataset_close(ds);
    if (fflush(out) != 0 || ferror(out)) return rn_errorf(RN_EIO, "writing the description of %s failed", path);
    return RN_OK;
}

int rn_dataset_list(const char *path, FILE *out) {
    rn_dataset *ds;
    rn_dataset_reader *r = NULL;
    int rc = rn_dataset_open(path, &ds);
    if (rc) return rc;
    if ((rc = rn_dataset_reader_open(ds, &r)) == RN_OK) {
        for (uint64_t i = 0; i < ds->info.count && rc == RN_OK; i++) {
            rn_sample s;
            if ((rc = rn_dataset_read(r, i, &s)) != RN_OK) break;
            fprintf(out, "%08" PRIu64 " %d %ux%ux%u %s %zu %s\n", i, s.label, s.width, s.height, s.channels,
                    s.enc == RN_ENC_JPEG ? "jpeg" : "raw", s.len, s.name);
        }
    }
    rn_dataset_reader_close(r);
    rn_dataset_close(ds);
    if (rc == RN_OK && (fflush(out) != 0 || ferror(out))) rc = rn_errorf(RN_EIO, "writing the list of %s failed", path);
    return rc;
}

/* ---------------------------------------------------------------- writing */

typedef struct {
    char key[24];
    uint8_t *buf;
    size_t len;
} pending;

struct rn_dataset_writer {
    char *path, *tmp;
    MDB_env *env;
    MDB_dbi dbi;
    int dbi_open;
    size_t map_size;
    uint64_t count;
    pending *pend;
    size_t npend, pend_bytes;
};

/* Remove an rn dataset directory: every file in it, then the directory. rn writes only
 * plain files there (data.mdb, lock.mdb, classes.txt and, while writing, classes.txt.tmp),
 * and a run killed at any point may leave any of them, so all plain files go. A folder
 * inside means the directory is not rn's: it is left alone and the message says so. */
static int remove_dataset_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? RN_OK : rn_errorf(RN_EIO, "%s: cannot open: %s", dir, strerror(errno));
    int rc = RN_OK;
    char p[4096];
    struct dirent *e;
    while (rc == RN_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rc = rn_errorf(RN_EIO, "%s: holds a folder rn did not write (%s): remove it by hand or choose "
                           "another output name", dir, e->d_name);
        else if (unlink(p) != 0 && errno != ENOENT)
            rc = rn_errorf(RN_EIO, "%s: cannot remove: %s", p, strerror(errno));
    }
    closedir(d);
    if (rc == RN_OK && rmdir(dir) != 0 && errno != ENOENT)
        rc = rn_errorf(RN_EIO, "%s: cannot remove: %s", dir, strerror(errno));
    return rc;
}

static void free_pending(rn_dataset_writer *w) {
    for (size_t i = 0; i < w->npend; i++) free(w->pend[i].buf);
    w->npend = 0;
    w->pend_bytes = 0;
}

int rn_dataset_writer_create(const char *path, size_t map_size, rn_dataset_writer **out) {
    *out = NULL;
    rn_dataset_writer *w = rn_calloc(1, sizeof *w);
    if (!w) return RN_ENOMEM;
    int rc = RN_OK, e;
    size_t n = strlen(path);
    w->map_size = map_size ? map_size : DEFAULT_MAP_SIZE;
    w->path = xstrdup(path);
    w->tmp = rn_malloc(n + 5);
    w->pend = rn_calloc(BATCH_RECORDS + 1, sizeof *w->pend);
    if (!w->path || !w->tmp || !w->pend) { rc = RN_ENOMEM; goto fail; }
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp", 5);
    struct stat st;
    char dm[4096];
    snprintf(dm, sizeof dm, "%s/data.mdb", path);
    if (stat(path, &st) == 0 && (!S_ISDIR(st.st_mode) || access(dm, F_OK) != 0)) {
        rc = rn_errorf(RN_EIO, "%s: exists and is not a dataset: choose another output name or remove it", path);
        goto fail;
    }
    if ((rc = remove_dataset_dir(w->tmp)) != RN_OK) goto fail;
    if (mkdir(w->tmp, 0755) != 0) {
        rc = rn_errorf(RN_EIO, "%s: cannot create: %s", w->tmp, strerror(errno));
        goto fail;
    }
    if ((e = mdb_env_create(&w->env)) != 0) { rc = lmdb_err(RN_EDATA, w->tmp, "mdb_env_create", e); goto fail_dir; }
    if ((e = mdb_env_set_mapsize(w->env, w->map_size)) != 0) { rc = lmdb_err(RN_EDATA, w->tmp, "mdb_env_set_mapsize", e); goto fail_dir; }
    /* no sync per commit: the whole database is synced once in finish, and a crash
     * before that leaves only path.tmp, which the next run removes */
    if ((e = mdb_env_open(w->env, w->tmp, MDB_NOSYNC | MDB_NOMETASYNC, 0644)) != 0) {
        rc = lmdb_err(RN_EDATA, w->tmp, "mdb_env_open", e);
        goto fail_dir;
    }
    *out = w;
    return RN_OK;
fail_dir:
    if (w->env) mdb_env_close(w->env);
    w->env = NULL;
    remove_dataset_dir(w->tmp);
fail:
    if (w->env) mdb_env_close(w->env);
    free(w->pend);
    free(w->path);
    free(w->tmp);
    free(w);
    return rc;
}

/* Write the pending records in one transaction; on MDB_MAP_FULL double the map and
 * write the whole batch again. */
static int flush(rn_dataset_writer *w) {
    if (w->npend == 0) return RN_OK;
    for (;;) {
        MDB_txn *txn;
        int e = mdb_txn_begin(w->env, NULL, 0, &txn);
        if (e != 0) return lmdb_err(RN_EDATA, w->tmp, "mdb_txn_begin", e);
        if (!w->dbi_open) {
            if ((e = mdb_dbi_open(txn, NULL, 0, &w->dbi)) != 0) {
                mdb_txn_abort(txn);
                return lmdb_err(RN_EDATA, w->tmp, "mdb_dbi_open", e);
            }
        }
        for (size_t i = 0; i < w->npend && e == 0; i++) {
            MDB_val k = {strlen(w->pend[i].key), w->pend[i].key}, v = {w->pend[i].len, w->pend[i].buf};
            e = mdb_put(txn, w->dbi, &k, &v, 0);
            if (e != 0 && e != MDB_MAP_FULL) {
                mdb_txn_abort(txn);
                return rn_errorf(RN_EDATA, "%s: mdb_put(%s): %s", w->tmp, w->pend[i].key, mdb_strerror(e));
            }
        }
        if (e == 0) {
            e = mdb_txn_commit(txn);
            if (e == 0) {
                w->dbi_open = 1;
                free_pending(w);
                return RN_OK;
            }
            if (e != MDB_MAP_FULL) return write_err(w->tmp, "mdb_txn_commit", e);
        } else {
            mdb_txn_abort(txn);
        }
        /* MDB_MAP_FULL */
        w->map_size *= 2;
        if ((e = mdb_env_set_mapsize(w->env, w->map_size)) != 0)
            return lmdb_err(RN_EDATA, w->tmp, "mdb_env_set_mapsize", e);
    }
}

static int add_pending(rn_dataset_writer *w, const char *key, uint8_t *buf, size_t len) {
    pending *p = &w->pend[w->npend++];
    snprintf(p->key, sizeof p->key, "%s", key);
    p->buf = buf;
    p->len = len;
    w->pend_bytes += len;
    if (w->npend >= BATCH_RECORDS || w->pend_bytes >= BATCH_BYTES) return flush(w);
    return RN_OK;
}

int rn_dataset_writer_put(rn_dataset_writer *w, const rn_sample *s) {
    Rn__Sample m = RN__SAMPLE__INIT;
    m.label = s->label;
    m.height = s->height;
    m.width = s->width;
    m.channels = s->channels;
    m.enc = s->enc;
    m.data.data = (uint8_t *)s->data;
    m.data.len = s->len;
    m.name = (char *)(s->name ? s->name : "");
    m.crc32c = rn_crc32c(0, s->data, s->len);
    size_t n = rn__sample__get_packed_size(&m);
    uint8_t *buf = rn_malloc(n);
    if (!buf) return RN_ENOMEM;
    rn__sample__pack(&m, buf);
    char key[24];
    snprintf(key, sizeof key, "%08" PRIu64, w->count);
    w->count++;
    return add_pending(w, key, buf, n);
}

uint64_t rn_dataset_writer_count(const rn_dataset_writer *w) { return w->count; }

static int write_classes(const char *dir, const rn_dataset_info *info) {
    size_t len = 0;
    for (int i = 0; i < info->n_classes; i++) len += strlen(info->class_names[i]) + 1;
    char *buf = rn_malloc(len + 1), *p = buf;
    if (!buf) return RN_ENOMEM;
    for (int i = 0; i < info->n_classes; i++) p += sprintf(p, "%s\n", info->class_names[i]);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, RN_DATASET_CLASSES_FILE);
    int rc = rn_file_write_atomic(path, buf, len);
    free(buf);
    return rc;
}

int rn_dataset_writer_finish(rn_dataset_writer *w, const rn_dataset_info *info) {
    int rc = RN_OK, e;
    Rn__DatasetInfo m = RN__DATASET_INFO__INIT;
    m.format_version = FORMAT_VERSION;
    m.n_class_names = (size_t)info->n_classes;
    m.class_names = info->class_names;
    m.count = w->count;
    m.n_class_counts = (size_t)info->n_classes;
    m.class_counts = info->class_counts;
    m.n_mean = m.n_std = (size_t)info->channels;
    m.mean = (double *)info->mean;
    m.std = (double *)info->std;
    m.enc = info->enc;
    m.channels = (uint32_t)info->channels;
    m.command = info->command ? info->command : "";
    m.skipped = info->skipped;
    m.rn_version = info->rn_version ? info->rn_version : "";
    m.min_width = info->min_width;
    m.min_height = info->min_height;
    m.max_width = info->max_width;
    m.max_height = info->max_height;
    m.data_bytes = info->data_bytes;
    size_t n = rn__dataset_info__get_packed_size(&m);
    uint8_t *buf = rn_malloc(n);
    if (!buf) { rc = RN_ENOMEM; goto fail; }
    rn__dataset_info__pack(&m, buf);
    if ((rc = add_pending(w, RN_DATASET_INFO_KEY, buf, n)) != RN_OK) goto fail;
    if ((rc = flush(w)) != RN_OK) goto fail;
    if ((e = mdb_env_sync(w->env, 1)) != 0) { rc = write_err(w->tmp, "mdb_env_sync", e); goto fail; }
    mdb_env_close(w->env);
    w->env = NULL;
    if ((rc = write_classes(w->tmp, info)) != RN_OK) goto fail;
    if ((rc = rn_fsync_dir_of(w->tmp)) != RN_OK) goto fail;
    struct stat st;
    if (stat(w->path, &st) == 0) {
        /* swap the new directory in atomically, then remove the old one */
        if (renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->path, RENAME_EXCHANGE) != 0) {
            rc = rn_errorf(RN_EIO, "%s: cannot replace with %s: %s", w->path, w->tmp, strerror(errno));
            goto fail;
        }
        if (S_ISDIR(st.st_mode)) remove_dataset_dir(w->tmp);
        else unlink(w->tmp);
    } else if (rename(w->tmp, w->path) != 0) {
        rc = rn_errorf(RN_EIO, "%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
        goto fail;
    }
    rc = rn_fsync_dir_of(w->path);
    free_pending(w);
    free(w->pend);
    free(w->path);
    free(w->tmp);
    free(w);
    return rc;
fail:
    rn_dataset_writer_abort(w);
    return rc;
}

void rn_dataset_writer_abort(rn_dataset_writer *w) {
    if (!w) return;
    if (w->env) mdb_env_close(w->env);
    free_pending(w);
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", rn_last_error());
    remove_dataset_dir(w->tmp);
    rn_errorf(RN_OK, "%s", saved); /* keep the first error's message */
    free(w->pend);
    free(w->path);
    free(w->tmp);
    free(w);
}
