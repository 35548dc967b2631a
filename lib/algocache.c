/* The cuDNN algorithm cache file (rn/algocache.h). */
#include "rn/algocache.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rn/err.h"

#define TAG "rn-algo-1"

typedef struct {
    rn_algo_key k;
    rn_algo_val v;
} entry;

struct rn_algocache {
    char *path;
    entry *e;
    size_t n, cap;
    size_t ignored;
    char here[96];   /* this process's device and cuDNN (rn_algocache_set_here), "" unset */
    int here_cudnn;
    int write_off;   /* a write failed: keep working from memory */
    char why[256];   /* why the file was not read or written, "" if it was */
    char note[1400];
};

static int same_key(const rn_algo_key *a, const rn_algo_key *b) {
    return strcmp(a->device, b->device) == 0 && a->cudnn == b->cudnn && memcmp(a->shape, b->shape, sizeof a->shape) == 0 &&
           a->dir == b->dir && a->flags == b->flags && a->ws_limit == b->ws_limit;
}

static int add(rn_algocache *c, const rn_algo_key *k, const rn_algo_val *v) {
    for (size_t i = 0; i < c->n; i++)
        if (same_key(&c->e[i].k, k)) {
            c->e[i].v = *v; /* the last line wins */
            return RN_OK;
        }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        entry *ne = realloc(c->e, cap * sizeof *ne);
        if (!ne) return rn_errorf(RN_ENOMEM, "algorithm cache: out of memory for %zu entries", cap);
        c->e = ne;
        c->cap = cap;
    }
    c->e[c->n].k = *k;
    c->e[c->n++].v = *v;
    return RN_OK;
}

static int valid(const rn_algo_key *k, const rn_algo_val *v) {
    if (k->device[0] == 0 || k->cudnn <= 0 || (k->dir != 1 && k->dir != 2 && k->dir != 4) || k->flags < 0 || k->flags > 3)
        return 0;
    for (int i = 1; i < 12; i++)
        if (k->shape[i] < (i >= 10 ? 0 : 1)) return 0;
    if (k->shape[0] < 0 || k->shape[0] > 16) return 0;
    return v->algo >= 0 && v->algo < 64 && v->math >= 0 && v->math < 16;
}

/* One line into k and v; 0 when it is not a valid line of this version. */
static int parse(const char *line, rn_algo_key *k, rn_algo_val *v) {
    char tag[16], dev[sizeof k->device];
    int s[12], used = -1;
    unsigned long long wl, ws;
    memset(k, 0, sizeof *k);
    int got = sscanf(line,
                     "%15s %95s %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %llu %d %d %llu %n",
                     tag, dev, &k->cudnn, &s[0], &s[1], &s[2], &s[3], &s[4], &s[5], &s[6], &s[7], &s[8], &s[9],
                     &s[10], &s[11], &k->dir, &k->flags, &wl, &v->algo, &v->math, &ws, &used);
    if (got != 21 || used < 0 || line[used] != 0 || strcmp(tag, TAG) != 0) return 0;
    memcpy(k->device, dev, sizeof dev);
    memcpy(k->shape, s, sizeof s);
    k->ws_limit = wl;
    v->ws = ws;
    return valid(k, v);
}

static void set_note(rn_algocache *c) {
    int n = snprintf(c->note, sizeof c->note, "algorithm cache %s: %zu choice%s", c->path, c->n, c->n == 1 ? "" : "s");
    if (c->here[0] && n > 0 && (size_t)n < sizeof c->note) {
        size_t mine = 0;
        for (size_t i = 0; i < c->n; i++) mine += strcmp(c->e[i].k.device, c->here) == 0 && c->e[i].k.cudnn == c->here_cudnn;
        if (mine < c->n) /* (kept: another device or cuDNN of a shared cache may use them) */
            n += snprintf(c->note + n, sizeof c->note - (size_t)n, " (%zu for this device and cuDNN, %zu for others)",
                          mine, c->n - mine);
    }
    if (c->ignored && n > 0 && (size_t)n < sizeof c->note)
        n += snprintf(c->note + n, sizeof c->note - (size_t)n, ", %zu malformed or stale line%s ignored", c->ignored,
                      c->ignored == 1 ? "" : "s");
    if (c->why[0] && n > 0 && (size_t)n < sizeof c->note)
        snprintf(c->note + n, sizeof c->note - (size_t)n, " (%s)", c->why);
}

int rn_algocache_open(const char *path, rn_algocache **out) {
    *out = NULL;
    if (!path || !*path) return rn_errorf(RN_EINVAL, "algorithm cache: no path");
    rn_algocache *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        return rn_errorf(RN_ENOMEM, "algorithm cache: out of memory");
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno != ENOENT) snprintf(c->why, sizeof c->why, "not read: %s", strerror(errno));
    } else {
        char line[512];
        size_t lines = 0;
        while (fgets(line, sizeof line, f)) {
            size_t len = strlen(line);
            int whole = len > 0 && line[len - 1] == '\n';
            if (!whole && !feof(f)) { /* too long: skip the rest of it */
                int ch;
                while ((ch = fgetc(f)) != EOF && ch != '\n') {}
            }
            if (++lines > RN_ALGOCACHE_MAX_LINES) {
                c->ignored++;
                continue;
            }
            if (whole) line[--len] = 0;
            rn_algo_key k;
            rn_algo_val v;
            /* a last line without its newline is a write cut short: ignored too */
            if (!whole || !parse(line, &k, &v)) {
                c->ignored++;
                continue;
            }
            if (add(c, &k, &v) != RN_OK) {
                fclose(f);
                rn_algocache_free(c);
                return RN_ENOMEM;
            }
        }
        if (ferror(f)) snprintf(c->why, sizeof c->why, "read error: %s", strerror(errno));
        fclose(f);
    }
    set_note(c);
    *out = c;
    return RN_OK;
}

int rn_algocache_get(const rn_algocache *c, const rn_algo_key *key, rn_algo_val *v) {
    for (size_t i = c ? c->n : 0; i-- > 0;)
        if (same_key(&c->e[i].k, key)) {
            *v = c->e[i].v;
            return 1;
        }
    return 0;
}

/* mkdir -p of path's folder; 0 or an errno */
static int make_parent(const char *path) {
    char d[1024];
    size_t n = strlen(path);
    if (n >= sizeof d) return ENAMETOOLONG;
    memcpy(d, path, n + 1);
    char *slash = strrchr(d, '/');
    if (!slash || slash == d) return 0;
    *slash = 0;
    for (char *p = d + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(d, 0755) != 0 && errno != EEXIST) return errno;
        *p = '/';
    }
    return mkdir(d, 0755) != 0 && errno != EEXIST ? errno : 0;
}

int rn_algocache_put(rn_algocache *c, const rn_algo_key *key, const rn_algo_val *v) {
    if (strpbrk(key->device, " \t\n") || !valid(key, v))
        return rn_errorf(RN_EINVAL, "algorithm cache: bad entry for device '%s'", key->device);
    int rc = add(c, key, v);
    if (rc != RN_OK || c->write_off) return rc;
    char line[512];
    const int *s = key->shape;
    int n = snprintf(line, sizeof line, "%s %s %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %" PRIu64 " %d %d %" PRIu64 "\n",
                     TAG, key->device, key->cudnn, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10],
                     s[11], key->dir, key->flags, key->ws_limit, v->algo, v->math, v->ws);
    int err = n <= 0 || (size_t)n >= sizeof line ? EOVERFLOW : make_parent(c->path);
    if (!err) {
        int fd = open(c->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) err = errno;
        else {
            ssize_t w = write(fd, line, (size_t)n);
            if (w != n) err = w < 0 ? errno : EIO;
            if (close(fd) != 0 && !err) err = errno;
        }
    }
    if (err) {
        c->write_off = 1;
        snprintf(c->why, sizeof c->why, "not written: %s", strerror(err));
    }
    set_note(c);
    return RN_OK;
}

void rn_algocache_set_here(rn_algocache *c, const char *device, int cudnn) {
    if (!c) return;
    snprintf(c->here, sizeof c->here, "%s", device ? device : "");
    c->here_cudnn = cudnn;
    set_note(c);
}

size_t rn_algocache_size(const rn_algocache *c) { return c ? c->n : 0; }
size_t rn_algocache_ignored(const rn_algocache *c) { return c ? c->ignored : 0; }
const char *rn_algocache_note(const rn_algocache *c) { return c ? c->note : ""; }

void rn_algocache_free(rn_algocache *c) {
    if (!c) return;
    free(c->path);
    free(c->e);
    free(c);
}
