#include "rn/pth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/tensor.h"

/* Bounds on what a hostile data.pkl can make us hold; torchvision's resnet152 needs
 * about 20,000 objects, a stack of a few hundred and memo indices under 10,000. */
#define MAX_OBJECTS (1 << 21)
#define MAX_STACK (1 << 20)
#define MAX_MEMO (1 << 20)
/* bytes the strided views of a file of n bytes may gather: each storage viewed twice, plus
   room for small expanded views */
#define MAX_GATHER(n) (2 * (size_t)(n) + ((size_t)256 << 20))

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* ---- the zip container: the central directory, stored entries only ---- */

typedef struct {
    const char *name; /* not NUL-terminated: points into the file */
    size_t nlen;
    const uint8_t *data;
    uint64_t size;
} zentry;

typedef struct {
    const char *path;
    size_t len; /* the file's bytes */
    zentry *e;  /* sorted by name */
    size_t n;
    const char *prefix; /* the archive folder: "<prefix>/data.pkl" */
    size_t plen;
} zipdir;

static int by_zname(const void *a, const void *b) {
    const zentry *x = a, *y = b;
    size_t n = x->nlen < y->nlen ? x->nlen : y->nlen;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->nlen > y->nlen) - (x->nlen < y->nlen);
}

/* the entry <prefix>/<rest>, or NULL */
static const zentry *zfind(const zipdir *z, const char *rest, size_t rlen) {
    char buf[512];
    if (z->plen + 1 + rlen > sizeof buf) return NULL;
    memcpy(buf, z->prefix, z->plen);
    buf[z->plen] = '/';
    memcpy(buf + z->plen + 1, rest, rlen);
    zentry key = {buf, z->plen + 1 + rlen, NULL, 0};
    return bsearch(&key, z->e, z->n, sizeof *z->e, by_zname);
}

/* the sizes and offset a zip64 extra field holds for those the entry marks 0xffffffff */
static int zip64_extra(const uint8_t *x, size_t xlen, uint64_t *usize, uint64_t *csize, uint64_t *off) {
    while (xlen >= 4) {
        uint16_t id = rd16(x), sz = rd16(x + 2);
        if ((size_t)sz > xlen - 4) return -1;
        if (id == 1) {
            const uint8_t *p = x + 4;
            size_t left = sz;
            uint64_t *v[3] = {usize, csize, off};
            for (int i = 0; i < 3; i++) {
                if (*v[i] != 0xffffffffu) continue;
                if (left < 8) return -1;
                *v[i] = rd64(p);
                p += 8;
                left -= 8;
            }
            return 0;
        }
        x += 4 + sz;
        xlen -= 4 + (size_t)sz;
    }
    return 0;
}

static int zip_open(const char *path, const uint8_t *b, size_t len, zipdir *z) {
    memset(z, 0, sizeof *z);
    z->path = path;
    z->len = len;
    if (len < 22) return rn_errorf(RN_ECORRUPT, "%s: %zu bytes: too short for a .pth (zip) file", path, len);
    size_t eocd = 0;
    int found = 0;
    for (size_t i = len - 22 + 1; i-- > 0 && len - 22 - i <= 65535;)
        if (rd32(b + i) == 0x06054b50u) {
            eocd = i;
            found = 1;
            break;
        }
    if (!found)
        return rn_errorf(RN_ECORRUPT,
                         "%s: no zip end-of-directory record: the file is truncated or not a .pth "
                         "written by torch.save",
                         path);
    uint64_t count = rd16(b + eocd + 10), cdsize = rd32(b + eocd + 12), cdoff = rd32(b + eocd + 16);
    /* torch (miniz) writes the zip64 records whatever the size; they are the ones to trust */
    if (eocd >= 20 && rd32(b + eocd - 20) == 0x07064b50u) {
        uint64_t at = rd64(b + eocd - 20 + 8);
        if (at > len || len - at < 56 || rd32(b + at) != 0x06064b50u)
            return rn_errorf(RN_ECORRUPT, "%s: bad zip64 end-of-directory record (truncated?)", path);
        count = rd64(b + at + 32);
        cdsize = rd64(b + at + 40);
        cdoff = rd64(b + at + 48);
    }
    if (cdoff > len || cdsize > len - cdoff)
        return rn_errorf(RN_ECORRUPT,
                         "%s: the zip directory (%llu bytes at %llu) lies past the end of the %zu-byte "
                         "file (truncated?)",
                         path, (unsigned long long)cdsize, (unsigned long long)cdoff, len);
    if (count > cdsize / 46)
        return rn_errorf(RN_ECORRUPT, "%s: the zip directory says %llu entries in %llu bytes", path,
                         (unsigned long long)count, (unsigned long long)cdsize);
    z->e = rn_calloc(count ? (size_t)count : 1, sizeof *z->e);
    if (!z->e) return RN_ENOMEM;
    const uint8_t *p = b + cdoff, *end = b + cdoff + cdsize;
    for (uint64_t k = 0; k < count; k++) {
        if (end - p < 46 || rd32(p) != 0x02014b50u)
            return rn_errorf(RN_ECORRUPT, "%s: zip directory entry %llu is damaged", path, (unsigned long long)k);
        uint16_t flags = rd16(p + 8), method = rd16(p + 10), nlen = rd16(p + 28), xlen = rd16(p + 30),
                 clen = rd16(p + 32);
        uint64_t csize = rd32(p + 20), usize = rd32(p + 24), off = rd32(p + 42);
        if ((size_t)(end - p - 46) < (size_t)nlen + xlen + clen)
            return rn_errorf(RN_ECORRUPT, "%s: zip directory entry %llu runs past the directory", path,
                             (unsigned long long)k);
        zentry *e = &z->e[z->n++];
        e->name = (const char *)p + 46;
        e->nlen = nlen;
        if (zip64_extra(p + 46 + nlen, xlen, &usize, &csize, &off))
            return rn_errorf(RN_ECORRUPT, "%s: entry %.*s: bad zip64 field", path, (int)nlen, e->name);
        if (flags & 1)
            return rn_errorf(RN_ECORRUPT, "%s: entry %.*s is encrypted: not a file torch.save wrote", path, (int)nlen,
                             e->name);
        if (method != 0)
            return rn_errorf(RN_ECORRUPT,
                             "%s: entry %.*s is compressed (zip method %u); rn reads the stored "
                             "(uncompressed) entries torch.save writes: load and torch.save it again, or unzip and "
                             "re-zip with 'zip -0'",
                             path, (int)nlen, e->name, method);
        if (csize != usize)
            return rn_errorf(RN_ECORRUPT, "%s: entry %.*s: stored, yet %llu bytes hold %llu", path, (int)nlen, e->name,
                             (unsigned long long)csize, (unsigned long long)usize);
        if (off > len || len - off < 30 || rd32(b + off) != 0x04034b50u)
            return rn_errorf(RN_ECORRUPT, "%s: entry %.*s: no local header at byte %llu (truncated?)", path, (int)nlen,
                             e->name, (unsigned long long)off);
        uint64_t data = off + 30 + rd16(b + off + 26) + rd16(b + off + 28);
        if (data > len || usize > len - data)
            return rn_errorf(RN_ECORRUPT,
                             "%s: entry %.*s: %llu bytes at %llu lie past the end of the %zu-byte file "
                             "(truncated?)",
                             path, (int)nlen, e->name, (unsigned long long)usize, (unsigned long long)data, len);
        e->data = b + data;
        e->size = usize;
        p += 46 + (size_t)nlen + xlen + clen;
    }
    /* the archive folder is the one holding data.pkl (torch names it after the file) */
    for (size_t i = 0; i < z->n && !z->prefix; i++) {
        const zentry *e = &z->e[i];
        const char *slash = memchr(e->name, '/', e->nlen);
        if (slash && (size_t)(e->name + e->nlen - slash) == 9 && memcmp(slash, "/data.pkl", 9) == 0) {
            z->prefix = e->name;
            z->plen = (size_t)(slash - e->name);
        }
    }
    if (!z->prefix)
        return rn_errorf(RN_ECORRUPT, "%s: a zip file without <archive>/data.pkl: not a .pth written by torch.save",
                         path);
    qsort(z->e, z->n, sizeof *z->e, by_zname);
    for (size_t i = 1; i < z->n; i++)
        if (by_zname(&z->e[i - 1], &z->e[i]) == 0)
            return rn_errorf(RN_ECORRUPT, "%s: entry %.*s appears twice in the zip directory", path, (int)z->e[i].nlen,
                             z->e[i].name);
    return RN_OK;
}

/* ---- the restricted unpickler ---- */

enum { V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_TUPLE, V_LIST, V_DICT, V_GLOBAL, V_STORAGE, V_TENSOR };
static const char *const KIND[] = {"None", "bool", "int",    "float",   "str",   "tuple",
                                   "list", "dict", "global", "storage", "tensor"};

/* the callables a state_dict's pickle may name */
enum { G_ODICT = 1, G_REBUILD, G_PARAM, G_STORAGE };

typedef struct {
    int kind;
    int64_t i;     /* BOOL, INT; GLOBAL: G_*; STORAGE, TENSOR: index in stor[] / tens[] */
    int dtype;     /* GLOBAL G_STORAGE: the storage's rn_dtype */
    const char *s; /* STR: points into data.pkl, not NUL-terminated */
    size_t slen;
    int32_t *items; /* TUPLE, LIST; DICT: key, value, key, value... */
    size_t n, cap;
} val;

typedef struct {
    int dtype;
    const uint8_t *data;
    uint64_t numel;
    const char *key; /* into data.pkl */
    size_t klen;
} storage;

typedef struct {
    int32_t stor;
    int64_t offset;
    int ndim;
    int64_t size[RN_ST_MAX_DIMS], stride[RN_ST_MAX_DIMS];
} tensor;

typedef struct {
    const char *path;
    const zipdir *z;
    const uint8_t *pk;
    size_t pklen, pos, op; /* op: where the current opcode began */
    val *v;
    size_t nv, capv;
    int32_t *stack;
    size_t sp, capstack;
    size_t *marks;
    size_t nmarks, capmarks;
    int32_t *memo;          /* -1: not set */
    size_t nmemo, memo_set; /* memo_set: indices set, MEMOIZE's next index */
    storage *stor;
    size_t nstor, capstor;
    tensor *tens;
    size_t ntens, captens;
} unpickler;

/* grow *p (of *cap elements of size sz) to hold need; 0 or RN_ENOMEM */
static int grow(void *p, size_t *cap, size_t need, size_t sz) {
    if (need <= *cap) return RN_OK;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*(void **)p, nc * sz);
    if (!q) return rn_errorf(RN_ENOMEM, "out of memory reading a .pth (%zu items)", nc);
    *(void **)p = q;
    *cap = nc;
    return RN_OK;
}

static int bad(unpickler *u, const char *what) {
    return rn_errorf(RN_ECORRUPT, "%s: data.pkl byte %zu: %s", u->path, u->op, what);
}

static int new_val(unpickler *u, int kind, int32_t *out) {
    if (u->nv >= MAX_OBJECTS) return bad(u, "more than 2^21 objects: not a state_dict");
    if (grow(&u->v, &u->capv, u->nv + 1, sizeof *u->v)) return RN_ENOMEM;
    memset(&u->v[u->nv], 0, sizeof *u->v);
    u->v[u->nv].kind = kind;
    *out = (int32_t)u->nv++;
    return RN_OK;
}

static int push(unpickler *u, int32_t x) {
    if (u->sp >= MAX_STACK) return bad(u, "the pickle stack grows past 2^20 items: not a state_dict");
    if (grow(&u->stack, &u->capstack, u->sp + 1, sizeof *u->stack)) return RN_ENOMEM;
    u->stack[u->sp++] = x;
    return RN_OK;
}

static int push_new(unpickler *u, int kind, int64_t i) {
    int32_t x;
    int rc = new_val(u, kind, &x);
    if (rc) return rc;
    u->v[x].i = i;
    return push(u, x);
}

/* the stack's floor: the last mark, or 0 */
static size_t floor_of(const unpickler *u) { return u->nmarks ? u->marks[u->nmarks - 1] : 0; }

static int pop(unpickler *u, int32_t *x) {
    if (u->sp <= floor_of(u)) return bad(u, "pops an empty stack");
    *x = u->stack[--u->sp];
    return RN_OK;
}

static int pop_mark(unpickler *u, size_t *from) {
    if (!u->nmarks) return bad(u, "no MARK to pop to");
    *from = u->marks[--u->nmarks];
    return RN_OK;
}

/* append items to a TUPLE, LIST or DICT */
static int add_items(unpickler *u, int32_t to, const int32_t *items, size_t n) {
    val *t = &u->v[to];
    if (grow(&t->items, &t->cap, t->n + n, sizeof *t->items)) return RN_ENOMEM;
    memcpy(t->items + t->n, items, n * sizeof *items);
    t->n += n;
    return RN_OK;
}

/* a tuple of the top stack items from `from` up, which are popped */
static int make_tuple(unpickler *u, size_t from) {
    int32_t x;
    int rc = new_val(u, V_TUPLE, &x);
    if (rc == RN_OK) rc = add_items(u, x, u->stack + from, u->sp - from);
    if (rc) return rc;
    u->sp = from;
    return push(u, x);
}

static int need(unpickler *u, size_t n) {
    if (u->pklen - u->pos < n) return bad(u, "the pickle ends inside an opcode (truncated)");
    return RN_OK;
}

static int memo_put(unpickler *u, uint64_t idx) {
    if (!u->sp || u->sp <= floor_of(u)) return bad(u, "memoises an empty stack");
    if (idx >= MAX_MEMO) {
        char m[96];
        snprintf(m, sizeof m, "memo index %llu is out of range (over 2^20)", (unsigned long long)idx);
        return bad(u, m);
    }
    if (idx >= u->nmemo) {
        size_t n = u->nmemo;
        if (grow(&u->memo, &n, (size_t)idx + 1, sizeof *u->memo)) return RN_ENOMEM;
        for (size_t i = u->nmemo; i < n; i++)
            u->memo[i] = -1;
        u->nmemo = n;
    }
    if (u->memo[idx] < 0) u->memo_set++;
    u->memo[idx] = u->stack[u->sp - 1];
    return RN_OK;
}

static int memo_get(unpickler *u, uint64_t idx) {
    if (idx >= u->nmemo || u->memo[idx] < 0) {
        char m[96];
        snprintf(m, sizeof m, "memo index %llu was never set", (unsigned long long)idx);
        return bad(u, m);
    }
    return push(u, u->memo[idx]);
}

static int streq(const val *v, const char *s) {
    return v->kind == V_STR && v->slen == strlen(s) && memcmp(v->s, s, v->slen) == 0;
}

/* path with its .pth or .pt ending replaced by suffix: the output a suggested command writes */
static void renamed(const char *path, const char *suffix, char *out, size_t cap) {
    size_t pl = strlen(path);
    size_t stem = pl > 4 && strcmp(path + pl - 4, ".pth") == 0  ? pl - 4
                  : pl > 3 && strcmp(path + pl - 3, ".pt") == 0 ? pl - 3
                                                                : pl;
    snprintf(out, cap, "%.*s%s", (int)(stem < 200 ? stem : 200), path, suffix);
}

/* the one line that turns a whole model into its state_dict */
static int whole_model(unpickler *u, const char *what, const char *mod, size_t mlen, const char *name, size_t nlen) {
    char out[256];
    renamed(u->path, ".sd.pth", out, sizeof out);
    if (mlen >= 9 && memcmp(mod, "__torch__", 9) == 0)
        return rn_errorf(RN_ECORRUPT,
                         "%s: a TorchScript archive (torch.jit.save; it names %.*s.%.*s), not a state_dict. "
                         "Save its state_dict: python3 -c \"import torch; torch.save(torch.jit.load('%s', "
                         "map_location='cpu').state_dict(), '%s')\"",
                         u->path, (int)mlen, mod, (int)nlen, name, u->path, out);
    return rn_errorf(RN_ECORRUPT,
                     "%s: %s (it names the class %.*s.%.*s), not a state_dict. Save its state_dict: "
                     "python3 -c \"import torch; torch.save(torch.load('%s', map_location='cpu', weights_only=False)"
                     ".state_dict(), '%s')\" (this runs the file's pickle: only for a file you trust)",
                     u->path, what, (int)mlen, mod, (int)nlen, name, u->path, out);
}

static int is(const char *s, size_t n, const char *lit) { return n == strlen(lit) && memcmp(s, lit, n) == 0; }

static int global(unpickler *u, const char *mod, size_t mlen, const char *name, size_t nlen) {
    static const struct {
        const char *name;
        int dtype;
    } st[] = {{"FloatStorage", RN_F32},
              {"HalfStorage", RN_F16},
              {"BFloat16Storage", RN_BF16},
              {"LongStorage", RN_I64},
              {"IntStorage", RN_I32}};
    int g = 0, dtype = 0;
    if (is(mod, mlen, "collections") && is(name, nlen, "OrderedDict"))
        g = G_ODICT;
    else if (is(mod, mlen, "torch._utils") && is(name, nlen, "_rebuild_tensor_v2"))
        g = G_REBUILD;
    else if (is(mod, mlen, "torch._utils") && is(name, nlen, "_rebuild_parameter"))
        g = G_PARAM;
    else if (is(mod, mlen, "torch"))
        for (size_t i = 0; i < sizeof st / sizeof *st; i++)
            if (is(name, nlen, st[i].name)) g = G_STORAGE, dtype = st[i].dtype;
    if (!g && is(mod, mlen, "torch") && nlen > 7 && memcmp(name + nlen - 7, "Storage", 7) == 0)
        return rn_errorf(RN_ECORRUPT,
                         "%s: data.pkl byte %zu: storage type torch.%.*s is not one rn reads (float32, "
                         "float16, bfloat16, int64, int32): convert the tensors with .float() and save again",
                         u->path, u->op, (int)nlen, name);
    if (!g &&
        ((mlen >= 12 && memcmp(mod, "torchvision.", 12) == 0) || (mlen >= 9 && memcmp(mod, "torch.nn.", 9) == 0) ||
         (mlen >= 9 && memcmp(mod, "__torch__", 9) == 0) || is(mod, mlen, "__main__")))
        return whole_model(u, "a whole model saved with torch.save(model)", mod, mlen, name, nlen);
    if (!g)
        return rn_errorf(RN_ECORRUPT,
                         "%s: data.pkl byte %zu: global %.*s.%.*s is not allowed in a state_dict; "
                         "refused (rn reads only tensors, storages and OrderedDict, and never runs code from a pickle)",
                         u->path, u->op, (int)(mlen < 100 ? mlen : 100), mod, (int)(nlen < 100 ? nlen : 100), name);
    int rc = push_new(u, V_GLOBAL, g);
    if (rc == RN_OK) u->v[u->stack[u->sp - 1]].dtype = dtype;
    return rc;
}

/* BINPERSID: ('storage', storage type, key, location, numel) -> the entry data/<key> */
static int persid(unpickler *u) {
    int32_t x = 0;
    int rc = pop(u, &x);
    if (rc) return rc;
    const val *t = &u->v[x];
    if (t->kind != V_TUPLE || t->n != 5 || !streq(&u->v[t->items[0]], "storage") ||
        u->v[t->items[1]].kind != V_GLOBAL || u->v[t->items[1]].i != G_STORAGE || u->v[t->items[2]].kind != V_STR ||
        u->v[t->items[4]].kind != V_INT)
        return bad(u, "a persistent id that is not ('storage', type, key, location, numel)");
    const val *key = &u->v[t->items[2]];
    int dtype = u->v[t->items[1]].dtype;
    int64_t numel = u->v[t->items[4]].i;
    const zentry *e = NULL;
    char rest[300];
    if (key->slen < 256 && !memchr(key->s, '/', key->slen)) {
        snprintf(rest, sizeof rest, "data/%.*s", (int)key->slen, key->s);
        e = zfind(u->z, rest, strlen(rest));
    }
    if (!e)
        return rn_errorf(RN_ECORRUPT, "%s: storage '%.*s': no entry %.*s/data/%.*s in the zip (truncated?)", u->path,
                         (int)(key->slen < 64 ? key->slen : 64), key->s, (int)u->z->plen, u->z->prefix,
                         (int)(key->slen < 64 ? key->slen : 64), key->s);
    size_t es = rn_dtype_size(dtype);
    if (numel < 0 || (uint64_t)numel > e->size / es)
        return rn_errorf(RN_ECORRUPT, "%s: storage '%.*s' of %lld %s elements does not fit its %llu bytes", u->path,
                         (int)key->slen, key->s, (long long)numel, rn_dtype_name(dtype), (unsigned long long)e->size);
    if (grow(&u->stor, &u->capstor, u->nstor + 1, sizeof *u->stor)) return RN_ENOMEM;
    u->stor[u->nstor] = (storage){dtype, e->data, (uint64_t)numel, key->s, key->slen};
    return push_new(u, V_STORAGE, (int64_t)u->nstor++);
}

static int int_tuple(unpickler *u, int32_t x, int64_t *v, int *n) {
    const val *t = &u->v[x];
    if (t->kind != V_TUPLE) return bad(u, "tensor sizes or strides are not a tuple");
    if (t->n > RN_ST_MAX_DIMS) return bad(u, "a tensor of more than 8 dimensions");
    for (size_t i = 0; i < t->n; i++) {
        if (u->v[t->items[i]].kind != V_INT) return bad(u, "tensor sizes or strides that are not integers");
        v[i] = u->v[t->items[i]].i;
    }
    *n = (int)t->n;
    return RN_OK;
}

/* REDUCE: only OrderedDict(), _rebuild_tensor_v2(...) and _rebuild_parameter(...) */
static int reduce(unpickler *u) {
    int32_t fx = 0, ax = 0;
    int rc = pop(u, &ax);
    if (rc == RN_OK) rc = pop(u, &fx);
    if (rc) return rc;
    const val *f = &u->v[fx], *a = &u->v[ax];
    if (a->kind != V_TUPLE) return bad(u, "REDUCE with arguments that are not a tuple");
    if (f->kind != V_GLOBAL || f->i == G_STORAGE) {
        char m[96];
        snprintf(m, sizeof m, "REDUCE calls a %s%s: refused", f->kind == V_GLOBAL ? "storage type" : KIND[f->kind],
                 f->kind == V_GLOBAL ? "" : " value");
        return bad(u, m);
    }
    if (f->i == G_ODICT) {
        if (a->n) return bad(u, "OrderedDict called with arguments: refused");
        return push_new(u, V_DICT, 0);
    }
    if (f->i == G_PARAM) {
        if (a->n < 1 || u->v[a->items[0]].kind != V_TENSOR) return bad(u, "_rebuild_parameter without a tensor");
        return push(u, a->items[0]);
    }
    /* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata]) */
    if (a->n < 4 || u->v[a->items[0]].kind != V_STORAGE || u->v[a->items[1]].kind != V_INT)
        return bad(u, "_rebuild_tensor_v2 without (storage, offset, size, stride, ...)");
    tensor t = {(int32_t)u->v[a->items[0]].i, u->v[a->items[1]].i, 0, {0}, {0}};
    int ns = 0;
    if ((rc = int_tuple(u, a->items[2], t.size, &t.ndim)) || (rc = int_tuple(u, a->items[3], t.stride, &ns))) return rc;
    if (ns != t.ndim) return bad(u, "a tensor with as many strides as sizes");
    if (grow(&u->tens, &u->captens, u->ntens + 1, sizeof *u->tens)) return RN_ENOMEM;
    u->tens[u->ntens] = t;
    return push_new(u, V_TENSOR, (int64_t)u->ntens++);
}

static int run(unpickler *u, int32_t *result) {
    int rc = RN_OK;
    int32_t x = 0, y = 0, z = 0;
    size_t from = 0;
    while (rc == RN_OK) {
        if (u->pos >= u->pklen) return bad(u, "the pickle ends without STOP (truncated)");
        u->op = u->pos;
        uint8_t op = u->pk[u->pos++];
        const uint8_t *a = u->pk + u->pos;
        switch (op) {
        case 0x80: /* PROTO */
            if ((rc = need(u, 1))) break;
            if (a[0] < 2 || a[0] > 5) rc = bad(u, "pickle protocol outside 2..5");
            u->pos += 1;
            break;
        case 0x95: /* FRAME (protocol 4): framing only */
            if ((rc = need(u, 8)) == RN_OK) u->pos += 8;
            break;
        case '.': /* STOP */
            if ((rc = pop(u, result))) break;
            return RN_OK;
        case '(': /* MARK */
            if (u->nmarks >= MAX_STACK)
                rc = bad(u, "too many MARKs");
            else if ((rc = grow(&u->marks, &u->capmarks, u->nmarks + 1, sizeof *u->marks)) == RN_OK)
                u->marks[u->nmarks++] = u->sp;
            break;
        case 'N': rc = push_new(u, V_NONE, 0); break;
        case 0x88: rc = push_new(u, V_BOOL, 1); break;
        case 0x89: rc = push_new(u, V_BOOL, 0); break;
        case 'K':
            if ((rc = need(u, 1)) == RN_OK) rc = push_new(u, V_INT, a[0]), u->pos += 1;
            break;
        case 'M':
            if ((rc = need(u, 2)) == RN_OK) rc = push_new(u, V_INT, rd16(a)), u->pos += 2;
            break;
        case 'J':
            if ((rc = need(u, 4)) == RN_OK) rc = push_new(u, V_INT, (int32_t)rd32(a)), u->pos += 4;
            break;
        case 0x8a: { /* LONG1: little-endian two's complement of n bytes, n <= 8 here */
            if ((rc = need(u, 1))) break;
            size_t n = a[0];
            if (n > 8) {
                rc = bad(u, "an integer of more than 64 bits");
                break;
            }
            if ((rc = need(u, 1 + n))) break;
            uint64_t v = 0;
            for (size_t i = 0; i < n; i++)
                v |= (uint64_t)a[1 + i] << (8 * i);
            if (n > 0 && n < 8 && (a[n] & 0x80)) v |= ~(uint64_t)0 << (8 * n);
            rc = push_new(u, V_INT, (int64_t)v);
            u->pos += 1 + n;
            break;
        }
        case 'G': /* BINFLOAT: a training checkpoint's numbers; the value is not needed */
            if ((rc = need(u, 8)) == RN_OK) rc = push_new(u, V_FLOAT, 0), u->pos += 8;
            break;
        case 'X':    /* BINUNICODE */
        case 0x8c: { /* SHORT_BINUNICODE */
            size_t hl = op == 'X' ? 4 : 1;
            if ((rc = need(u, hl))) break;
            size_t n = op == 'X' ? rd32(a) : a[0];
            if ((rc = need(u, hl + n))) break;
            if ((rc = new_val(u, V_STR, &x))) break;
            u->v[x].s = (const char *)a + hl;
            u->v[x].slen = n;
            u->pos += hl + n;
            rc = push(u, x);
            break;
        }
        case 'c': { /* GLOBAL: "module\nname\n" */
            const uint8_t *end = u->pk + u->pklen;
            const uint8_t *nl1 = memchr(a, '\n', (size_t)(end - a));
            const uint8_t *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(end - nl1 - 1)) : NULL;
            if (!nl2) {
                rc = bad(u, "GLOBAL without its two lines (truncated)");
                break;
            }
            u->pos = (size_t)(nl2 + 1 - u->pk);
            rc = global(u, (const char *)a, (size_t)(nl1 - a), (const char *)nl1 + 1, (size_t)(nl2 - nl1 - 1));
            break;
        }
        case 0x93: /* STACK_GLOBAL (protocol 4) */
            if ((rc = pop(u, &y)) || (rc = pop(u, &x))) break;
            if (u->v[x].kind != V_STR || u->v[y].kind != V_STR)
                rc = bad(u, "STACK_GLOBAL of non-strings");
            else
                rc = global(u, u->v[x].s, u->v[x].slen, u->v[y].s, u->v[y].slen);
            break;
        case ')': rc = push_new(u, V_TUPLE, 0); break;
        case ']': rc = push_new(u, V_LIST, 0); break;
        case '}': rc = push_new(u, V_DICT, 0); break;
        case 't':
            if ((rc = pop_mark(u, &from)) == RN_OK) rc = make_tuple(u, from);
            break;
        case 0x85:
        case 0x86:
        case 0x87: {
            size_t n = (size_t)(op - 0x84);
            if (u->sp < floor_of(u) + n)
                rc = bad(u, "TUPLE of more items than the stack holds");
            else
                rc = make_tuple(u, u->sp - n);
            break;
        }
        case 'a':   /* APPEND */
        case 's':   /* SETITEM */
        case 'e':   /* APPENDS */
        case 'u': { /* SETITEMS */
            int dict = op == 's' || op == 'u';
            if (op == 'a' || op == 's') {
                if (u->sp < floor_of(u) + (dict ? 3 : 2)) {
                    rc = bad(u, "SETITEM or APPEND on a stack too short");
                    break;
                }
                from = u->sp - (size_t)(dict ? 2 : 1);
            } else {
                if ((rc = pop_mark(u, &from))) break;
                if (from <= floor_of(u) || from < 1) {
                    rc = bad(u, "SETITEMS or APPENDS with nothing under its MARK");
                    break;
                }
                if (dict && (u->sp - from) % 2) {
                    rc = bad(u, "SETITEMS with a key without a value");
                    break;
                }
            }
            z = u->stack[from - 1];
            if (u->v[z].kind != (dict ? V_DICT : V_LIST)) {
                rc = bad(u, dict ? "SETITEM on something not a dict" : "APPEND on something not a list");
                break;
            }
            if ((rc = add_items(u, z, u->stack + from, u->sp - from))) break;
            u->sp = from;
            break;
        }
        case 'q':
            if ((rc = need(u, 1)) == RN_OK) rc = memo_put(u, a[0]), u->pos += 1;
            break;
        case 'r':
            if ((rc = need(u, 4)) == RN_OK) rc = memo_put(u, rd32(a)), u->pos += 4;
            break;
        case 0x94: rc = memo_put(u, u->memo_set); break; /* MEMOIZE */
        case 'h':
            if ((rc = need(u, 1)) == RN_OK) rc = memo_get(u, a[0]), u->pos += 1;
            break;
        case 'j':
            if ((rc = need(u, 4)) == RN_OK) rc = memo_get(u, rd32(a)), u->pos += 4;
            break;
        case 'Q': rc = persid(u); break;
        case 'R': rc = reduce(u); break;
        case 'b': /* BUILD: a state_dict's _metadata, or a parameter's state: kept out */
            if ((rc = pop(u, &y)) || (rc = pop(u, &x))) break;
            if (u->v[x].kind != V_DICT && u->v[x].kind != V_TENSOR)
                rc = bad(u, "BUILD on something not a dict or tensor");
            else
                rc = push(u, x);
            break;
        default: {
            char m[128];
            snprintf(m, sizeof m, "opcode 0x%02x%s%c%s is not one torch.save writes for a state_dict: refused", op,
                     op >= 0x20 && op < 0x7f ? " ('" : "", op >= 0x20 && op < 0x7f ? op : ' ',
                     op >= 0x20 && op < 0x7f ? "')" : "");
            rc = bad(u, m);
        }
        }
    }
    return rc;
}

static void unpickler_free(unpickler *u) {
    for (size_t i = 0; i < u->nv; i++)
        free(u->v[i].items);
    free(u->v);
    free(u->stack);
    free(u->marks);
    free(u->memo);
    free(u->stor);
    free(u->tens);
}

/* ---- tensors out of storages ---- */

/* numel and the last element's index, both checked for overflow; -1 when they overflow */
static int extent(const tensor *t, int64_t *numel, int64_t *last) {
    int64_t n = 1, hi = t->offset;
    if (t->offset < 0) return -1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->size[d] < 0 || t->stride[d] < 0) return -1;
        if (__builtin_mul_overflow(n, t->size[d], &n)) return -1;
    }
    for (int d = 0; d < t->ndim && n > 0; d++) {
        int64_t span;
        if (__builtin_mul_overflow(t->size[d] - 1, t->stride[d], &span) || __builtin_add_overflow(hi, span, &hi))
            return -1;
    }
    *numel = n;
    *last = hi;
    return 0;
}

static int contiguous(const tensor *t) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->size[d] != 1 && t->stride[d] != want) return 0;
        want *= t->size[d];
    }
    return 1;
}

/* copy a strided view into dst, element by element in row-major order */
static void gather(const tensor *t, const uint8_t *src, size_t es, uint8_t *dst, int64_t numel) {
    /* unsigned: stepping past a dimension of size 1 may overshoot by a huge stride, undone
       at once; every element read is inside the checked extent */
    int64_t idx[RN_ST_MAX_DIMS] = {0};
    uint64_t at = (uint64_t)t->offset;
    for (int64_t k = 0; k < numel; k++) {
        memcpy(dst + (size_t)k * es, src + (size_t)at * es, es);
        for (int d = t->ndim - 1; d >= 0; d--) {
            at += (uint64_t)t->stride[d];
            if (++idx[d] < t->size[d]) break;
            at -= (uint64_t)t->stride[d] * (uint64_t)t->size[d];
            idx[d] = 0;
        }
    }
}

static int by_tname(const void *a, const void *b) {
    return strcmp((*(const rn_st_tensor *const *)a)->name, (*(const rn_st_tensor *const *)b)->name);
}

/* the state_dict's (name, tensor) pairs into st->t */
static int collect(unpickler *u, int32_t dict, rn_safetensors *st) {
    const val *d = &u->v[dict];
    size_t npairs = d->n / 2, gathered = 0;
    st->t = rn_calloc(npairs ? npairs : 1, sizeof *st->t);
    if (!st->t) return RN_ENOMEM;
    for (int pass = 0; pass < 2; pass++) {
        size_t at = 0;
        for (size_t i = 0; i < npairs; i++) {
            const val *k = &u->v[d->items[2 * i]], *v = &u->v[d->items[2 * i + 1]];
            if (k->kind != V_STR)
                return rn_errorf(RN_ECORRUPT, "%s: a state_dict key that is a %s, not a name", u->path, KIND[k->kind]);
            int kl = (int)(k->slen < 200 ? k->slen : 200);
            if (v->kind != V_TENSOR)
                return rn_errorf(RN_ECORRUPT, "%s: state_dict entry %.*s is a %s, not a tensor", u->path, kl, k->s,
                                 KIND[v->kind]);
            const tensor *t = &u->tens[v->i];
            const storage *s = &u->stor[t->stor];
            size_t es = rn_dtype_size(s->dtype);
            int64_t numel = 0, last = 0;
            if (extent(t, &numel, &last) || (numel > 0 && (uint64_t)last >= s->numel))
                return rn_errorf(RN_ECORRUPT,
                                 "%s: tensor %.*s: its offset, sizes and strides reach past its storage "
                                 "'%.*s' of %llu elements",
                                 u->path, kl, k->s, (int)(s->klen < 64 ? s->klen : 64), s->key,
                                 (unsigned long long)s->numel);
            int copy = numel > 0 && !contiguous(t);
            if (pass == 0) {
                /* an expanded view (stride 0) gathers more than its storage holds: a few
                   bytes of file must not ask for terabytes */
                size_t bytes;
                if (copy && (__builtin_mul_overflow((size_t)numel, es, &bytes) ||
                             __builtin_add_overflow(gathered, bytes, &gathered) || gathered > MAX_GATHER(u->z->len)))
                    return rn_errorf(RN_ECORRUPT,
                                     "%s: tensor %.*s: its strided views gather more than %zu MB from a "
                                     "%zu-byte file (expanded views?): refused; save the tensors .contiguous()",
                                     u->path, kl, k->s, MAX_GATHER(u->z->len) >> 20, u->z->len);
                continue;
            }
            rn_st_tensor *o = &st->t[st->n];
            o->name = rn_malloc(k->slen + 1);
            if (!o->name) return RN_ENOMEM;
            memcpy(o->name, k->s, k->slen);
            o->name[k->slen] = 0;
            st->n++;
            o->dtype = s->dtype;
            o->ndim = t->ndim;
            memcpy(o->shape, t->size, sizeof(int64_t) * (size_t)t->ndim);
            o->nbytes = (size_t)numel * es;
            if (!copy)
                o->data = numel > 0 ? s->data + (size_t)t->offset * es : s->data;
            else {
                gather(t, s->data, es, st->owned + at, numel);
                o->data = st->owned + at;
                at += o->nbytes;
            }
        }
        if (pass == 0 && gathered && !(st->owned = rn_malloc(gathered))) return RN_ENOMEM;
    }
    if (st->n < 2) return RN_OK;
    const rn_st_tensor **v = malloc(sizeof *v * (size_t)st->n);
    if (!v) return rn_errorf(RN_ENOMEM, "out of memory");
    int rc = RN_OK;
    for (int i = 0; i < st->n; i++)
        v[i] = &st->t[i];
    qsort(v, (size_t)st->n, sizeof *v, by_tname);
    for (int i = 1; i < st->n && rc == RN_OK; i++)
        if (strcmp(v[i - 1]->name, v[i]->name) == 0)
            rc = rn_errorf(RN_ECORRUPT, "%s: tensor %s appears twice in the state_dict", u->path, v[i]->name);
    free(v);
    return rc;
}

/* a training checkpoint {"state_dict": {...}, "epoch": ...}: the dict of tensors inside */
static int32_t state_dict_of(const unpickler *u, int32_t top) {
    const val *d = &u->v[top];
    for (size_t i = 0; i + 1 < d->n; i += 2)
        if (u->v[d->items[i + 1]].kind == V_TENSOR) return top;
    for (size_t i = 0; i + 1 < d->n; i += 2)
        if ((streq(&u->v[d->items[i]], "state_dict") || streq(&u->v[d->items[i]], "model")) &&
            u->v[d->items[i + 1]].kind == V_DICT)
            return d->items[i + 1];
    return top;
}

static const uint8_t LEGACY_MAGIC[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
                                       0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

int rn_pth_parse(const char *path, uint8_t *buf, size_t len, rn_safetensors **out) {
    zipdir z = {0};
    unpickler u = {0};
    rn_safetensors *st = rn_calloc(1, sizeof *st);
    if (!st) {
        free(buf);
        return RN_ENOMEM;
    }
    st->file = buf;
    st->len = len;
    int rc = RN_OK;
    if (len >= sizeof LEGACY_MAGIC && memcmp(buf, LEGACY_MAGIC, sizeof LEGACY_MAGIC) == 0) {
        char re[256];
        renamed(path, ".zip.pth", re, sizeof re);
        rc = rn_errorf(RN_ECORRUPT,
                       "%s: the legacy torch.save format of torch < 1.6, which rn does not read. Save it "
                       "again in the zip format (torch >= 1.6): python3 -c \"import torch; torch.save(torch.load('%s', "
                       "map_location='cpu'), '%s')\"",
                       path, path, re);
        goto fail;
    }
    if ((rc = zip_open(path, buf, len, &z))) goto fail;
    const zentry *bo = zfind(&z, "byteorder", 9);
    if (bo && !(bo->size == 6 && memcmp(bo->data, "little", 6) == 0)) {
        rc = rn_errorf(RN_ECORRUPT,
                       "%s: saved on a big-endian machine (byteorder '%.*s'); rn reads little-endian "
                       "files: load and save it again on a little-endian one",
                       path, (int)(bo->size < 16 ? bo->size : 16), (const char *)bo->data);
        goto fail;
    }
    const zentry *pk = zfind(&z, "data.pkl", 8);
    u = (unpickler){.path = path, .z = &z, .pk = pk->data, .pklen = (size_t)pk->size};
    int32_t top;
    if ((rc = run(&u, &top))) goto fail;
    if (u.v[top].kind != V_DICT) {
        rc = rn_errorf(RN_ECORRUPT, "%s: the pickle holds a %s, not a state_dict (a dict of tensors)", path,
                       KIND[u.v[top].kind]);
        goto fail;
    }
    if ((rc = collect(&u, state_dict_of(&u, top), st))) goto fail;
    unpickler_free(&u);
    free(z.e);
    *out = st;
    return RN_OK;
fail:
    unpickler_free(&u);
    free(z.e);
    rn_st_free(st);
    return rc;
}

int rn_weights_read(const char *path, rn_safetensors **out) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = rn_file_read(path, &buf, &len);
    if (rc != RN_OK) return rc;
    if ((len >= 4 && memcmp(buf, "PK\3\4", 4) == 0) ||
        (len >= sizeof LEGACY_MAGIC && memcmp(buf, LEGACY_MAGIC, sizeof LEGACY_MAGIC) == 0))
        return rn_pth_parse(path, buf, len, out);
    return rn_st_parse(path, buf, len, out);
}
