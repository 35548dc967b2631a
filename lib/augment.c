/* The --augment chain: the op table, the parser, and the geometric and erasing ops. */
#include "rn/augment.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/augops.h"
#include "rn/err.h"
#include "rn/philox.h"
#include "rn/rng.h"

enum { P_NUM, P_INT, P_RANGE, P_WORD };

typedef struct {
    const char *key;
    int kind, slot;
    double def[2];   /* default (lo, hi for a range) */
    double min, max; /* allowed values, inclusive; open_min: > min */
    int open_min;
    const char *words[4];
} param;

typedef struct {
    const char *name;
    int stage;
    int main;         /* the parameter `op=V` sets, or -1 */
    const char *what; /* for messages */
    param p[5];
} op_def;

/* torchvision's defaults (transforms.RandomResizedCrop, RandomCrop, RandomHorizontalFlip,
 * RandomErasing). Adding an op: a row here and its stage's case in the loader. */
static const op_def OPS[RN_AUG_OP_COUNT] = {
    [RN_AUG_OP_RRC] = {"rrc",
                       RN_AUG_STAGE_CROP,
                       -1,
                       "RandomResizedCrop",
                       {{"scale", P_RANGE, 0, {0.08, 1.0}, 0, 1, 1, {0}},
                        {"ratio", P_RANGE, 2, {3.0 / 4.0, 4.0 / 3.0}, 0, 1e6, 1, {0}}}},
    [RN_AUG_OP_CROP_PAD] = {"crop-pad",
                            RN_AUG_STAGE_CROP,
                            0,
                            "RandomCrop with padding",
                            {{"pad", P_INT, 0, {0}, 0, 4096, 0, {0}},
                             {"mode", P_WORD, 1, {RN_AUG_PAD_CONSTANT}, 0, 0, 0, {"constant", "edge", "reflect"}},
                             {"fill", P_INT, 2, {0}, 0, 255, 0, {0}}}},
    [RN_AUG_OP_FLIP] = {"flip", RN_AUG_STAGE_FLIP, 0, "RandomHorizontalFlip", {{"p", P_NUM, 0, {0.5}, 0, 1, 0, {0}}}},
    [RN_AUG_OP_ERASE] = {"erase",
                         RN_AUG_STAGE_ERASE,
                         0,
                         "RandomErasing",
                         {{"p", P_NUM, 0, {0.5}, 0, 1, 0, {0}},
                          {"scale", P_RANGE, 1, {0.02, 0.33}, 0, 1, 1, {0}},
                          {"ratio", P_RANGE, 3, {0.3, 3.3}, 0, 1e6, 1, {0}},
                          {"value", P_WORD, 5, {RN_AUG_ERASE_ZERO}, 0, 0, 0, {"0", "random"}}}},
    /* the pixel ops: rn/augops.h's policies, torchvision's defaults */
    [RN_AUG_OP_TA_WIDE] = {"ta_wide",
                           RN_AUG_STAGE_PIXEL,
                           -1,
                           "TrivialAugmentWide",
                           {{"bins", P_INT, 0, {RN_AUG_TA_BINS}, 2, 1024, 0, {0}}}},
    [RN_AUG_OP_RANDAUG] = {"randaug",
                           RN_AUG_STAGE_PIXEL,
                           0,
                           "RandAugment",
                           {{"n", P_INT, 0, {RN_AUG_RA_NUM_OPS}, 0, RN_AUG_MAX_OPS, 0, {0}},
                            {"m", P_INT, 1, {RN_AUG_RA_MAGNITUDE}, 0, 1023, 0, {0}},
                            {"bins", P_INT, 2, {RN_AUG_RA_BINS}, 2, 1024, 0, {0}}}},
    [RN_AUG_OP_AUTOAUG] = {"autoaug",
                           RN_AUG_STAGE_PIXEL,
                           -1,
                           "AutoAugment",
                           {{"policy", P_WORD, 0, {0}, 0, 0, 0, {"imagenet"}}}},
    [RN_AUG_OP_JITTER] = {"jitter",
                          RN_AUG_STAGE_PIXEL,
                          -1,
                          "ColorJitter",
                          {{"brightness", P_NUM, 0, {0}, 0, 1e6, 0, {0}},
                           {"contrast", P_NUM, 1, {0}, 0, 1e6, 0, {0}},
                           {"saturation", P_NUM, 2, {0}, 0, 1e6, 0, {0}},
                           {"hue", P_NUM, 3, {0}, 0, 0.5, 0, {0}}}},
};

#define KNOWN                                                                                                         \
    "rrc, crop-pad, flip, ta_wide, randaug, autoaug, jitter, erase (or the whole chain standard, rrc or none)"

const char *rn_augment_op_name(int op) { return op >= 0 && op < RN_AUG_OP_COUNT ? OPS[op].name : "?"; }
int rn_augment_op_stage(int op) { return op >= 0 && op < RN_AUG_OP_COUNT ? OPS[op].stage : -1; }

static void step_defaults(int op, rn_aug_step *s) {
    memset(s, 0, sizeof *s);
    s->op = op;
    for (const param *p = OPS[op].p; p->key; p++) {
        s->v[p->slot] = p->def[0];
        if (p->kind == P_RANGE) s->v[p->slot + 1] = p->def[1];
    }
}

void rn_augment_default(rn_augment *a) {
    memset(a, 0, sizeof *a);
    a->n = 2;
    step_defaults(RN_AUG_OP_RRC, &a->step[0]);
    step_defaults(RN_AUG_OP_FLIP, &a->step[1]);
}

const rn_aug_step *rn_augment_find(const rn_augment *a, int op) {
    for (int k = 0; k < a->n; k++)
        if (a->step[k].op == op) return &a->step[k];
    return NULL;
}

static void list_params(const op_def *o, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (const param *p = o->p; p->key && n < cap; p++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", p == o->p ? "" : ", ", p->key);
}

static int in_range(const param *p, double v) { return (p->open_min ? v > p->min : v >= p->min) && v <= p->max; }

/* one number of a value, the whole of [s, e) */
static int number(const char *s, const char *e, double *v) {
    char tmp[64];
    size_t n = (size_t)(e - s);
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *end;
    *v = strtod(tmp, &end);
    return *end || !isfinite(*v) ? -1 : 0;
}

static int set_param(const op_def *o, const param *p, const char *val, const char *vend, rn_aug_step *s) {
    int len = (int)(vend - val);
    double v, w;
    switch (p->kind) {
    case P_WORD:
        for (int k = 0; k < 4 && p->words[k]; k++)
            if ((int)strlen(p->words[k]) == len && strncmp(p->words[k], val, (size_t)len) == 0) {
                s->v[p->slot] = k;
                return RN_OK;
            }
        {
            char ws[128] = "";
            for (int k = 0; k < 4 && p->words[k]; k++)
                snprintf(ws + strlen(ws), sizeof ws - strlen(ws), "%s%s", k ? " or " : "", p->words[k]);
            return rn_errorf(RN_EINVAL, "%s: %s '%.*s' is not %s", o->name, p->key, len, val, ws);
        }
    case P_RANGE: {
        const char *dash = NULL;
        /* the dash after the first number (a number may hold 'e-' itself) */
        for (const char *c = val + 1; c < vend; c++)
            if (*c == '-' && c[-1] != 'e' && c[-1] != 'E') {
                dash = c;
                break;
            }
        if (!dash || number(val, dash, &v) || number(dash + 1, vend, &w))
            return rn_errorf(RN_EINVAL, "%s: %s '%.*s' is not a range LO-HI (e.g. %s=%g-%g)", o->name, p->key, len, val,
                             p->key, p->def[0], p->def[1]);
        if (!in_range(p, v) || !in_range(p, w) || v > w)
            return rn_errorf(RN_EINVAL, "%s: %s %g-%g: want %s%g < LO <= HI <= %g", o->name, p->key, v, w,
                             p->open_min ? "" : "=", p->min, p->max);
        s->v[p->slot] = v;
        s->v[p->slot + 1] = w;
        return RN_OK;
    }
    default:
        if (number(val, vend, &v) || (p->kind == P_INT && v != floor(v)))
            return rn_errorf(RN_EINVAL, "%s: %s '%.*s' is not a %s", o->name, p->key, len, val,
                             p->kind == P_INT ? "whole number" : "number");
        if (!in_range(p, v))
            return rn_errorf(RN_EINVAL, "%s: %s %g is outside %g..%g", o->name, p->key, v, p->min, p->max);
        s->v[p->slot] = v;
        return RN_OK;
    }
}

/* one op, the text [s, e) */
static int parse_op(const char *s, const char *e, rn_aug_step *st) {
    const char *ne = s;
    while (ne < e && *ne != '=' && *ne != ':')
        ne++;
    int nl = (int)(ne - s), op = -1;
    for (int k = 0; k < RN_AUG_OP_COUNT; k++)
        if ((int)strlen(OPS[k].name) == nl && strncmp(OPS[k].name, s, (size_t)nl) == 0) op = k;
    if (op < 0) {
        if (nl == 0)
            return rn_errorf(RN_EINVAL, "an empty op (two commas, or a comma at an end?): known ops are " KNOWN);
        return rn_errorf(RN_EINVAL, "'%.*s' is not an op: known ops are " KNOWN, nl, s);
    }
    const op_def *o = &OPS[op];
    char names[128];
    list_params(o, names, sizeof names);
    step_defaults(op, st);
    const char *c = ne;
    if (c < e && *c == '=') {
        const char *ve = ++c;
        while (ve < e && *ve != ':')
            ve++;
        if (o->main < 0)
            return rn_errorf(RN_EINVAL, "%s takes no value after '=' (give parameters as %s:KEY=VALUE; keys: %s)",
                             o->name, o->name, names);
        int rc = set_param(o, &o->p[o->main], c, ve, st);
        if (rc) return rc;
        c = ve;
    }
    while (c < e) { /* c at ':' */
        const char *ks = ++c, *ke = c, *pe;
        while (ke < e && *ke != ':' && *ke != '=')
            ke++;
        pe = ke;
        while (pe < e && *pe != ':')
            pe++;
        const param *p = NULL;
        int rc;
        if (ke < e && *ke == '=') {
            for (const param *q = o->p; q->key; q++)
                if ((int)strlen(q->key) == (int)(ke - ks) && strncmp(q->key, ks, (size_t)(ke - ks)) == 0) p = q;
            if (!p)
                return rn_errorf(RN_EINVAL, "%s has no parameter '%.*s': its parameters are %s", o->name,
                                 (int)(ke - ks), ks, names);
            rc = set_param(o, p, ke + 1, pe, st);
        } else {
            /* a bare word: the value of the op's word parameter */
            for (const param *q = o->p; q->key; q++)
                if (q->kind == P_WORD) p = q;
            if (!p || ks == pe)
                return rn_errorf(RN_EINVAL, "%s: '%.*s' is not KEY=VALUE (its parameters are %s)", o->name,
                                 (int)(pe - ks), ks, names);
            rc = set_param(o, p, ks, pe, st);
        }
        if (rc) return rc;
        c = pe;
    }
    return RN_OK;
}

int rn_augment_parse(const char *text, rn_augment *a) {
    memset(a, 0, sizeof *a);
    if (!text || !*text) return rn_errorf(RN_EINVAL, "an empty chain: give ops such as rrc,flip, or none");
    if (strcmp(text, "standard") == 0 || strcmp(text, "rrc") == 0) {
        rn_augment_default(a);
        return RN_OK;
    }
    if (strcmp(text, "none") == 0) return RN_OK;
    const char *s = text;
    for (;;) {
        const char *e = strchr(s, ',');
        if (!e) e = s + strlen(s);
        if (a->n == RN_AUG_MAX) return rn_errorf(RN_EINVAL, "more than %d ops in one chain", RN_AUG_MAX);
        rn_aug_step *st = &a->step[a->n];
        int rc = parse_op(s, e, st);
        if (rc) return rc;
        if (OPS[st->op].stage == RN_AUG_STAGE_PIXEL) {
            rn_aug_policy pol;
            if ((rc = rn_augment_policy(st, &pol))) return rc;
        }
        if (rn_augment_find(a, st->op))
            return rn_errorf(RN_EINVAL, "%s appears twice: each op at most once", OPS[st->op].name);
        if (a->n > 0) {
            const rn_aug_step *prev = &a->step[a->n - 1];
            int ps = OPS[prev->op].stage, ss = OPS[st->op].stage;
            if (ss == RN_AUG_STAGE_CROP && ps == RN_AUG_STAGE_CROP)
                return rn_errorf(RN_EINVAL, "%s and %s: at most one crop op (rrc or crop-pad)", OPS[prev->op].name,
                                 OPS[st->op].name);
            if (ss < ps)
                return rn_errorf(RN_EINVAL,
                                 "%s after %s: the order is a crop op (rrc or crop-pad) first, then "
                                 "flip, then the pixel ops (ta_wide, randaug, autoaug, jitter), erase last",
                                 OPS[st->op].name, OPS[prev->op].name);
        }
        a->n++;
        if (!*e) break;
        s = e + 1;
    }
    return RN_OK;
}

int rn_augment_policy(const rn_aug_step *s, rn_aug_policy *p) {
    char args[128];
    const char *name;
    switch (s->op) {
    case RN_AUG_OP_TA_WIDE:
        name = "ta_wide";
        snprintf(args, sizeof args, "%d", (int)s->v[0]);
        break;
    case RN_AUG_OP_RANDAUG:
        name = "randaug";
        if (s->v[1] >= s->v[2])
            return rn_errorf(RN_EINVAL, "randaug: m %d is not a bin of 0..%d (raise bins, or lower m)", (int)s->v[1],
                             (int)s->v[2] - 1);
        snprintf(args, sizeof args, "%d,%d,%d", (int)s->v[0], (int)s->v[1], (int)s->v[2]);
        break;
    case RN_AUG_OP_AUTOAUG:
        name = "autoaug";
        snprintf(args, sizeof args, "imagenet");
        break;
    case RN_AUG_OP_JITTER:
        name = "jitter";
        snprintf(args, sizeof args, "%.17g,%.17g,%.17g,%.17g", s->v[0], s->v[1], s->v[2], s->v[3]);
        break;
    default: return rn_errorf(RN_EINVAL, "%s is not a pixel op", rn_augment_op_name(s->op));
    }
    return rn_aug_policy_parse(name, args, p);
}

/* the shortest plain decimal that reads back as v (else %.17g) */
static int num(char *buf, size_t cap, double v) {
    char tmp[64];
    for (int prec = 0; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*f", prec, v);
        if (strtod(tmp, NULL) == v) return snprintf(buf, cap, "%s", tmp);
    }
    return snprintf(buf, cap, "%.17g", v);
}

int rn_augment_format(const rn_augment *a, char *buf, size_t cap) {
    char tmp[1024];
    size_t n = 0;
#define PUT(...) (n += (size_t)snprintf(tmp + n, n < sizeof tmp ? sizeof tmp - n : 0, __VA_ARGS__))
    if (a->n == 0) PUT("none");
    for (int k = 0; k < a->n && n < sizeof tmp; k++) {
        const rn_aug_step *s = &a->step[k];
        const op_def *o = &OPS[s->op];
        char x[64], y[64];
        PUT("%s%s", k ? "," : "", o->name);
        for (const param *p = o->p; p->key && n < sizeof tmp; p++) {
            if (p->kind == P_WORD) {
                PUT(":%s=%s", p->key, p->words[(int)s->v[p->slot]]);
                continue;
            }
            num(x, sizeof x, s->v[p->slot]);
            if (p->kind == P_RANGE) {
                num(y, sizeof y, s->v[p->slot + 1]);
                PUT(":%s=%s-%s", p->key, x, y);
            } else {
                PUT(":%s=%s", p->key, x);
            }
        }
    }
#undef PUT
    return snprintf(buf, cap, "%s", tmp);
}

/* ---- crop with padding */

int rn_aug_crop_offsets(int w, int h, int pad, int S, const rn_draws *d, int *i, int *j) {
    int ph = h + 2 * pad, pw = w + 2 * pad;
    if (ph < S || pw < S) return -1;
    *i = d->randint(d->ctx, 0, ph - S + 1);
    *j = d->randint(d->ctx, 0, pw - S + 1);
    return 0;
}

/* source index of padded coordinate q (-pad .. n + pad - 1 after the shift), or -1 for fill */
static int src_index(int q, int n, int mode) {
    if (q >= 0 && q < n) return q;
    switch (mode) {
    case RN_AUG_PAD_EDGE: return q < 0 ? 0 : n - 1;
    case RN_AUG_PAD_REFLECT: return q < 0 ? -q : 2 * (n - 1) - q; /* the edge pixel is not repeated */
    default: return -1;
    }
}

void rn_aug_crop_pad(const uint8_t *src, int w, int h, int c, int pad, int mode, int fill, int i, int j, int S,
                     int flip, uint8_t *dst) {
    /* columns [x0, x1) read the image itself: one copy per row when not flipped */
    int x0 = pad - j > 0 ? pad - j : 0, x1 = w + pad - j < S ? w + pad - j : S;
    for (int y = 0; y < S; y++) {
        int sy = src_index(i + y - pad, h, mode);
        for (int x = 0; x < S; x++) {
            if (!flip && sy >= 0 && x == x0 && x1 > x0) {
                memcpy(dst + ((size_t)y * S + x0) * c, src + ((size_t)sy * w + x0 + j - pad) * c, (size_t)(x1 - x0) * c);
                x = x1 - 1;
                continue;
            }
            int sx = src_index(j + x - pad, w, mode);
            uint8_t *o = dst + ((size_t)y * S + (flip ? S - 1 - x : x)) * c;
            if (sy < 0 || sx < 0)
                memset(o, fill, (size_t)c);
            else
                memcpy(o, src + ((size_t)sy * w + sx) * c, (size_t)c);
        }
    }
}

/* ---- random erasing */

void rn_aug_erase_box(int w, int h, double scale_lo, double scale_hi, double ratio_lo, double ratio_hi,
                      const rn_draws *d, int box[4]) {
    double area = (double)w * h;
    /* torch.log(torch.tensor(ratio)): float32 */
    float lr0 = logf((float)ratio_lo), lr1 = logf((float)ratio_hi);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (double)d->uniform(d->ctx, (float)scale_lo, (float)scale_hi);
        double aspect = (double)expf(d->uniform(d->ctx, lr0, lr1));
        int eh = rn_round_half_even(sqrt(target * aspect));
        int ew = rn_round_half_even(sqrt(target / aspect));
        if (!(eh < h && ew < w)) continue;
        int i = d->randint(d->ctx, 0, h - eh + 1);
        int j = d->randint(d->ctx, 0, w - ew + 1);
        box[0] = j, box[1] = i, box[2] = ew, box[3] = eh;
        return;
    }
    box[0] = box[1] = box[2] = box[3] = 0;
}

float rn_erase_value(uint64_t key, int64_t epoch, uint32_t rec, uint32_t e) {
    double rad, th;
    rn_erase_pair(key, (uint64_t)epoch, rec, e, &rad, &th);
    return (float)(e & 1 ? rad * sin(th) : rad * cos(th));
}

void rn_erase_apply(const rn_erase *boxes, int n, int h, int w, int c, uint64_t key, int64_t epoch, float *y) {
    for (int k = 0; k < n; k++) {
        const rn_erase *b = &boxes[k];
        if (b->w <= 0 || b->h <= 0) continue;
        float *img = y + (size_t)k * h * w * c;
        /* elements 2m and 2m+1 share a pair: rn_erase_value's numbers, half the work */
        uint32_t have = UINT32_MAX;
        double rad = 0, th = 0;
        for (int yy = b->y; yy < b->y + b->h; yy++)
            for (int xx = b->x; xx < b->x + b->w; xx++)
                for (int ch = 0; ch < c; ch++) {
                    uint32_t e = (uint32_t)(((size_t)yy * w + xx) * c + ch);
                    if (!b->random) {
                        img[e] = 0.0f;
                        continue;
                    }
                    if (e >> 1 != have) rn_erase_pair(key, (uint64_t)epoch, b->rec, e, &rad, &th), have = e >> 1;
                    img[e] = (float)(e & 1 ? rad * sin(th) : rad * cos(th));
                }
    }
}
