#include "rn/safetensors.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/tensor.h"

/* A small JSON reader for the safetensors header only: objects, arrays, strings,
 * integers. Anything else is a corrupt header. */
typedef struct {
    const char *p, *end, *start;
    const char *path;
} json;

static void ws(json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

static int expect(json *j, char c) {
    ws(j);
    if (j->p >= j->end || *j->p != c)
        return rn_errorf(RN_ECORRUPT, "%s: bad safetensors header: expected '%c' at byte %td", j->path, c,
                         j->p - j->start);
    j->p++;
    return RN_OK;
}

static int peek(json *j, char c) {
    ws(j);
    return j->p < j->end && *j->p == c;
}

/* append c to the growing string *s (freed on failure) */
static int push(char **s, size_t *n, size_t *cap, char c) {
    if (*n + 2 >= *cap) {
        char *ns = realloc(*s, *cap *= 2);
        if (!ns) {
            free(*s);
            return rn_errorf(RN_ENOMEM, "out of memory");
        }
        *s = ns;
    }
    (*s)[(*n)++] = c;
    return RN_OK;
}

/* string -> malloc'ed, escapes decoded (\uXXXX limited to ASCII/BMP as UTF-8) */
static int jstring(json *j, char **out) {
    int rc = expect(j, '"');
    if (rc) return rc;
    size_t cap = 32, n = 0;
    char *s = rn_malloc(cap);
    if (!s) return RN_ENOMEM;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\') {
            if (j->p >= j->end) break;
            char e = *j->p++;
            if (e == 'n') c = '\n';
            else if (e == 't') c = '\t';
            else if (e == 'r') c = '\r';
            else if (e == 'b') c = '\b';
            else if (e == 'f') c = '\f';
            else if (e == 'u') {
                if (j->end - j->p < 4) break;
                unsigned v = 0;
                sscanf(j->p, "%4x", &v);
                j->p += 4;
                char u[3];
                int k = 0;
                if (v < 0x80) u[k++] = (char)v;
                else if (v < 0x800) u[k++] = (char)(0xc0 | (v >> 6)), u[k++] = (char)(0x80 | (v & 0x3f));
                else u[k++] = '?';
                for (int i = 0; i < k; i++)
                    if (push(&s, &n, &cap, u[i])) return RN_ENOMEM;
                continue;
            } else c = e;
        }
        if (push(&s, &n, &cap, c)) return RN_ENOMEM;
    }
    if (j->p >= j->end) {
        free(s);
        return rn_errorf(RN_ECORRUPT, "%s: bad safetensors header: unterminated string", j->path);
    }
    j->p++;
    s[n] = 0;
    *out = s;
    return RN_OK;
}

/* a non-negative integer that fits int64, read within the header's bytes only (the
 * header is not NUL-terminated: strtoll could read past it) */
static int jint(json *j, int64_t *out) {
    ws(j);
    const char *p = j->p;
    int64_t v = 0;
    while (p < j->end && *p >= '0' && *p <= '9') {
        int d = *p++ - '0';
        if (v > (INT64_MAX - d) / 10)
            return rn_errorf(RN_ECORRUPT, "%s: bad safetensors header: a number over 2^63 at byte %td", j->path,
                             j->p - j->start);
        v = v * 10 + d;
    }
    if (p == j->p)
        return rn_errorf(RN_ECORRUPT, "%s: bad safetensors header: expected a non-negative number at byte %td",
                         j->path, j->p - j->start);
    j->p = p;
    *out = v;
    return RN_OK;
}

static int jint_array(json *j, int64_t *v, int max, int *n) {
    int rc = expect(j, '[');
    *n = 0;
    if (rc) return rc;
    if (peek(j, ']')) return expect(j, ']');
    for (;;) {
        if (*n >= max) return rn_errorf(RN_ECORRUPT, "%s: bad safetensors header: more than %d dims", j->path, max);
        if ((rc = jint(j, &v[(*n)++]))) return rc;
        if (peek(j, ',')) j->p++;
        else return expect(j, ']');
    }
}

static int parse_entry(json *j, rn_st_tensor *t, int64_t off[2]) {
    int rc = expect(j, '{');
    int have = 0;
    while (rc == RN_OK && !peek(j, '}')) {
        char *key = NULL;
        if ((rc = jstring(j, &key)) || (rc = expect(j, ':'))) {
            free(key);
            break;
        }
        if (strcmp(key, "dtype") == 0) {
            char *dt = NULL;
            if ((rc = jstring(j, &dt)) == RN_OK) {
                t->dtype = rn_dtype_from_name(dt);
                if (!t->dtype)
                    rc = rn_errorf(RN_ECORRUPT, "%s: tensor %s: dtype %s is not supported", j->path, t->name, dt);
                have |= 1;
            }
            free(dt);
        } else if (strcmp(key, "shape") == 0) {
            rc = jint_array(j, t->shape, RN_ST_MAX_DIMS, &t->ndim);
            have |= 2;
        } else if (strcmp(key, "data_offsets") == 0) {
            int n = 0;
            rc = jint_array(j, off, 2, &n);
            if (rc == RN_OK && n != 2) rc = rn_errorf(RN_ECORRUPT, "%s: tensor %s: bad data_offsets", j->path, t->name);
            have |= 4;
        } else {
            rc = rn_errorf(RN_ECORRUPT, "%s: tensor %s: unknown header field %s", j->path, t->name, key);
        }
        free(key);
        if (rc == RN_OK && peek(j, ',')) j->p++;
    }
    if (rc == RN_OK) rc = expect(j, '}');
    if (rc == RN_OK && have != 7)
        rc = rn_errorf(RN_ECORRUPT, "%s: tensor %s: header lacks dtype, shape or data_offsets", j->path, t->name);
    return rc;
}

void rn_st_free(rn_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) free(st->t[i].name);
    for (int i = 0; i < st->nmeta; i++) free(st->meta_key[i]), free(st->meta_val[i]);
    free(st->t);
    free(st->meta_key);
    free(st->meta_val);
    free(st->file);
    free(st->owned);
    free(st);
}

static int parse_meta(json *j, rn_safetensors *st) {
    int rc = expect(j, '{');
    while (rc == RN_OK && !peek(j, '}')) {
        char **k = realloc(st->meta_key, sizeof(char *) * (size_t)(st->nmeta + 1));
        if (k) st->meta_key = k;
        char **v = realloc(st->meta_val, sizeof(char *) * (size_t)(st->nmeta + 1));
        if (v) st->meta_val = v;
        if (!k || !v) return rn_errorf(RN_ENOMEM, "out of memory");
        char *key = NULL, *val = NULL;
        if ((rc = jstring(j, &key)) == RN_OK && (rc = expect(j, ':')) == RN_OK) rc = jstring(j, &val);
        if (rc != RN_OK) {
            free(key);
            free(val);
            break;
        }
        st->meta_key[st->nmeta] = key;
        st->meta_val[st->nmeta++] = val;
        if (peek(j, ',')) j->p++;
    }
    return rc == RN_OK ? expect(j, '}') : rc;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const rn_st_tensor *const *)a)->name, (*(const rn_st_tensor *const *)b)->name);
}

static int by_offset(const void *a, const void *b) {
    const rn_st_tensor *x = *(const rn_st_tensor *const *)a, *y = *(const rn_st_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* Every name once; data ranges that do not overlap (empty tensors aside). Sorted copies
 * of the list, so a hostile header with many entries costs n log n, not n^2. */
static int check_unique(const char *path, rn_safetensors *st) {
    if (st->n < 2) return RN_OK;
    const rn_st_tensor **v = malloc(sizeof *v * (size_t)st->n);
    if (!v) return rn_errorf(RN_ENOMEM, "out of memory");
    int rc = RN_OK;
    for (int i = 0; i < st->n; i++) v[i] = &st->t[i];
    qsort(v, (size_t)st->n, sizeof *v, by_name);
    for (int i = 1; i < st->n && rc == RN_OK; i++)
        if (strcmp(v[i - 1]->name, v[i]->name) == 0)
            rc = rn_errorf(RN_ECORRUPT, "%s: tensor %s appears twice in the header", path, v[i]->name);
    qsort(v, (size_t)st->n, sizeof *v, by_offset);
    const rn_st_tensor *prev = NULL;
    for (int i = 0; i < st->n && rc == RN_OK; i++) {
        if (v[i]->nbytes == 0) continue;
        if (prev && v[i]->data < prev->data + prev->nbytes)
            rc = rn_errorf(RN_ECORRUPT, "%s: tensors %s and %s share data bytes (overlapping data_offsets)", path,
                           prev->name, v[i]->name);
        prev = v[i];
    }
    free(v);
    return rc;
}

int rn_st_read(const char *path, rn_safetensors **out) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = rn_file_read(path, &buf, &len);
    if (rc != RN_OK) return rc;
    return rn_st_parse(path, buf, len, out);
}

int rn_st_parse(const char *path, uint8_t *buf, size_t len, rn_safetensors **out) {
    rn_safetensors *st = rn_calloc(1, sizeof *st);
    if (!st) {
        free(buf);
        return RN_ENOMEM;
    }
    st->file = buf;
    st->len = len;
    int rc = RN_OK;
    uint64_t hlen = 0;
    if (st->len < 8) {
        rc = rn_errorf(RN_ECORRUPT, "%s: %zu bytes: too short for a safetensors file", path, st->len);
        goto fail;
    }
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | st->file[i];
    if (hlen > st->len - 8) {
        rc = rn_errorf(RN_ECORRUPT, "%s: header of %llu bytes does not fit in a %zu-byte file (truncated, or not safetensors)",
                       path, (unsigned long long)hlen, st->len);
        goto fail;
    }
    const uint8_t *data = st->file + 8 + hlen;
    size_t dlen = st->len - 8 - hlen;
    json j = {(const char *)st->file + 8, (const char *)st->file + 8 + hlen, (const char *)st->file + 8, path};
    if ((rc = expect(&j, '{'))) goto fail;
    int cap = 0;
    while (!peek(&j, '}')) {
        char *name = NULL;
        if ((rc = jstring(&j, &name)) || (rc = expect(&j, ':'))) {
            free(name);
            goto fail;
        }
        if (strcmp(name, "__metadata__") == 0) {
            free(name);
            if ((rc = parse_meta(&j, st))) goto fail;
        } else {
            if (st->n == cap) {
                cap = cap ? cap * 2 : 64;
                rn_st_tensor *nt = realloc(st->t, sizeof *nt * (size_t)cap);
                if (!nt) {
                    free(name);
                    rc = rn_errorf(RN_ENOMEM, "out of memory");
                    goto fail;
                }
                st->t = nt;
            }
            rn_st_tensor *t = &st->t[st->n++];
            memset(t, 0, sizeof *t);
            t->name = name;
            int64_t off[2] = {0, 0};
            if ((rc = parse_entry(&j, t, off))) goto fail;
            int64_t numel = rn_numel(t->shape, (size_t)t->ndim);
            if (off[0] < 0 || off[1] < off[0] || (uint64_t)off[1] > dlen) {
                rc = rn_errorf(RN_ECORRUPT, "%s: tensor %s: data_offsets [%lld, %lld] outside the %zu data bytes (truncated?)",
                               path, name, (long long)off[0], (long long)off[1], dlen);
                goto fail;
            }
            /* numel is checked against the bytes present before it is multiplied: [2^62] F32
               would wrap to 0 bytes */
            size_t es = rn_dtype_size(t->dtype);
            if (numel < 0 || (uint64_t)numel > dlen / es || (uint64_t)(off[1] - off[0]) != (uint64_t)numel * es) {
                rc = rn_errorf(RN_ECORRUPT, "%s: tensor %s: %lld bytes do not match its shape and dtype", path, name,
                               (long long)(off[1] - off[0]));
                goto fail;
            }
            t->data = data + off[0];
            t->nbytes = (size_t)(off[1] - off[0]);
        }
        if (peek(&j, ',')) j.p++;
    }
    if ((rc = expect(&j, '}'))) goto fail;
    ws(&j);
    if (j.p != j.end) {
        rc = rn_errorf(RN_ECORRUPT, "%s: bad safetensors header: bytes after its closing brace (at byte %td of %llu)",
                       path, j.p - j.start, (unsigned long long)hlen);
        goto fail;
    }
    if ((rc = check_unique(path, st))) goto fail;
    *out = st;
    return RN_OK;
fail:
    rn_st_free(st);
    return rc;
}

const rn_st_tensor *rn_st_find(const rn_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0) return &st->t[i];
    return NULL;
}

const char *rn_st_meta(const rn_safetensors *st, const char *key) {
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta_key[i], key) == 0) return st->meta_val[i];
    return NULL;
}

/* growable string for the header */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t ncap = b->cap * 2 + (size_t)k + 64;
        char *ns = realloc(b->s, ncap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = ncap;
    }
}

static void sb_str(sbuf *b, const char *s) {
    sb_add(b, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') sb_add(b, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) sb_add(b, "\\u%04x", (unsigned char)*s);
        else sb_add(b, "%c", *s);
    }
    sb_add(b, "\"");
}

int rn_st_write(const char *path, const rn_st_tensor *t, int n, const char *const *meta_key,
                const char *const *meta_val, int nmeta) {
    sbuf h = {rn_malloc(4096), 0, 4096, 0};
    if (!h.s) return RN_ENOMEM;
    sb_add(&h, "{");
    if (nmeta > 0) {
        sb_add(&h, "\"__metadata__\":{");
        for (int i = 0; i < nmeta; i++) {
            sb_add(&h, i ? "," : "");
            sb_str(&h, meta_key[i]);
            sb_add(&h, ":");
            sb_str(&h, meta_val[i]);
        }
        sb_add(&h, "}");
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t numel = rn_numel(t[i].shape, (size_t)t[i].ndim);
        if (numel < 0 || (size_t)numel * rn_dtype_size(t[i].dtype) != t[i].nbytes) {
            free(h.s);
            return rn_errorf(RN_EINVAL, "%s: tensor %s: %zu bytes do not match its shape", path, t[i].name, t[i].nbytes);
        }
        sb_add(&h, (nmeta > 0 || i) ? "," : "");
        sb_str(&h, t[i].name);
        sb_add(&h, ":{\"dtype\":\"%s\",\"shape\":[", rn_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++) sb_add(&h, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        sb_add(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    sb_add(&h, "}");
    /* pad the header with spaces to a multiple of 8 so tensor data stays aligned */
    while (!h.oom && h.n % 8) sb_add(&h, " ");
    if (h.oom) {
        free(h.s);
        return rn_errorf(RN_ENOMEM, "out of memory");
    }
    size_t total = 8 + h.n + off;
    uint8_t *buf = rn_malloc(total);
    if (!buf) {
        free(h.s);
        return RN_ENOMEM;
    }
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    memcpy(buf + 8, h.s, h.n);
    size_t pos = 8 + h.n;
    for (int i = 0; i < n; i++) {
        memcpy(buf + pos, t[i].data, t[i].nbytes);
        pos += t[i].nbytes;
    }
    free(h.s);
    int rc = rn_file_write_atomic(path, buf, total);
    free(buf);
    return rc;
}
