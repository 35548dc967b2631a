#include "rn/prep.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rn/dataset.h"
#include "rn/err.h"
#include "rn/image.h"
#include "rn/imgfile.h"
#include "rn/jpeg.h"
#include "rn/rng.h"

/* Philox purposes (stream ids) of rn-prep's randomness */
#define PURPOSE_SHUFFLE 0x70726570736875ull /* "prepshu" */
#define PURPOSE_AUGMENT 0x70726570617567ull /* "prepaug" */

void rn_prep_defaults(rn_prep_opts *o) {
    memset(o, 0, sizeof *o);
    o->enc = RN_ENC_JPEG;
    o->quality = RN_PREP_QUALITY;
    o->max_pixels = RN_PREP_MAX_PIXELS;
    o->max_classes = RN_PREP_MAX_CLASSES;
    o->aug_crop = RN_PREP_AUG_CROP;
}

/* ------------------------------------------------------------ the input list */

typedef struct {
    char *name;   /* relative to the input's root; stored in the record */
    int32_t label;
    char *skip;   /* known bad before decoding (a bad list line): the reason */
} item;

/* the paths are root + "/" + name: 1.28 M names, no second copy of each path */
typedef struct {
    item *v;
    size_t n, cap;
    char **classes;
    int n_classes;
    char root[4096];
} input;

static void item_path(const input *in, const item *it, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", in->root, it->name);
}

static void input_free(input *in) {
    for (size_t i = 0; i < in->n; i++) {
        free(in->v[i].name);
        free(in->v[i].skip);
    }
    free(in->v);
    for (int i = 0; i < in->n_classes; i++) free(in->classes[i]);
    free(in->classes);
    memset(in, 0, sizeof *in);
}

static int input_add(input *in, const char *name, int32_t label, const char *skip) {
    if (in->n == in->cap) {
        size_t nc = in->cap ? in->cap * 2 : 1024;
        item *nv = realloc(in->v, nc * sizeof *nv);
        if (!nv) return rn_errorf(RN_ENOMEM, "out of memory listing %zu inputs", nc);
        in->v = nv;
        in->cap = nc;
    }
    item *it = &in->v[in->n];
    memset(it, 0, sizeof *it);
    it->name = strdup(name);
    it->skip = skip ? strdup(skip) : NULL;
    it->label = label;
    if (!it->name || (skip && !it->skip)) {
        free(it->name);
        free(it->skip);
        return rn_errorf(RN_ENOMEM, "out of memory");
    }
    in->n++;
    return RN_OK;
}

/* torchvision's IMG_EXTENSIONS: these files are inputs; anything else is ignored */
static int is_image_name(const char *f) {
    static const char *ext[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
    size_t n = strlen(f);
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++) {
        size_t e = strlen(ext[i]);
        if (n >= e && strcasecmp(f + n - e, ext[i]) == 0) return 1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct {
    char **v;
    size_t n, cap;
} strvec;

static int sv_push(strvec *s, const char *str) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        char **nv = realloc(s->v, nc * sizeof *nv);
        if (!nv) return rn_errorf(RN_ENOMEM, "out of memory");
        s->v = nv;
        s->cap = nc;
    }
    if (!(s->v[s->n] = strdup(str))) return rn_errorf(RN_ENOMEM, "out of memory");
    s->n++;
    return RN_OK;
}

static void sv_free(strvec *s) {
    for (size_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* Names in dir, split into sub-directories and files (symlinks followed, as
 * os.walk(followlinks=True) does), each sorted. */
static int list_dir(const char *dir, strvec *dirs, strvec *files) {
    DIR *d = opendir(dir);
    if (!d) return rn_errorf(RN_EIO, "%s: cannot read folder: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = RN_OK;
    char p[4096];
    while ((e = readdir(d)) != NULL && rc == RN_OK) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(p, &st) != 0) {
            if (files) rc = sv_push(files, e->d_name); /* dangling link: reported when read */
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            if (dirs) rc = sv_push(dirs, e->d_name);
        } else if (files) {
            rc = sv_push(files, e->d_name);
        }
    }
    closedir(d);
    if (dirs && dirs->n > 1) qsort(dirs->v, dirs->n, sizeof *dirs->v, cmp_str);
    if (files && files->n > 1) qsort(files->v, files->n, sizeof *files->v, cmp_str);
    return rc;
}

/* every folder under rel (relative to top), recursively, into out */
static int walk(const char *top, const char *rel, strvec *out, int depth) {
    if (depth > 64) return rn_errorf(RN_EIO, "%s/%s: folders nested over 64 deep (a symlink loop?)", top, rel);
    int rc = sv_push(out, rel);
    if (rc) return rc;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", top, rel);
    strvec dirs = {0};
    if ((rc = list_dir(p, &dirs, NULL)) == RN_OK)
        for (size_t i = 0; i < dirs.n && rc == RN_OK; i++) {
            snprintf(p, sizeof p, "%s/%s", rel, dirs.v[i]);
            rc = walk(top, p, out, depth + 1);
        }
    sv_free(&dirs);
    return rc;
}

static int find_class(char **names, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) return i;
    return -1;
}

static int list_imagefolder(const rn_prep_opts *o, input *in, void (*skip)(void *, const char *, const char *),
                            void *ctx, uint64_t *nskip) {
    strvec classes = {0};
    snprintf(in->root, sizeof in->root, "%s", o->src);
    int rc = list_dir(o->src, &classes, NULL);
    if (rc) goto out;
    if (!in->classes) {
        if (classes.n == 0) {
            rc = rn_errorf(RN_EINVAL, "%s: no class folders in it (ImageFolder layout SRC/<class>/<file> expected)", o->src);
            goto out;
        }
        in->classes = calloc(classes.n, sizeof(char *));
        if (!in->classes) { rc = rn_errorf(RN_ENOMEM, "out of memory"); goto out; }
        for (size_t i = 0; i < classes.n; i++) {
            if (!(in->classes[i] = strdup(classes.v[i]))) { rc = rn_errorf(RN_ENOMEM, "out of memory"); goto out; }
            in->n_classes++;
        }
    }
    char p[4096], name[4096];
    for (size_t c = 0; c < classes.n && rc == RN_OK; c++) {
        int label = find_class(in->classes, in->n_classes, classes.v[c]);
        strvec dirs = {0};
        if ((rc = walk(o->src, classes.v[c], &dirs, 0)) != RN_OK) { sv_free(&dirs); break; }
        if (dirs.n > 1) qsort(dirs.v, dirs.n, sizeof *dirs.v, cmp_str);
        size_t before = in->n, seen = 0;
        for (size_t d = 0; d < dirs.n && rc == RN_OK; d++) {
            strvec files = {0};
            snprintf(p, sizeof p, "%s/%s", o->src, dirs.v[d]);
            if ((rc = list_dir(p, NULL, &files)) == RN_OK)
                for (size_t f = 0; f < files.n && rc == RN_OK; f++) {
                    if (!is_image_name(files.v[f])) continue;
                    seen++;
                    snprintf(p, sizeof p, "%s/%s/%s", o->src, dirs.v[d], files.v[f]);
                    snprintf(name, sizeof name, "%s/%s", dirs.v[d], files.v[f]);
                    char why[512] = "";
                    if (label < 0)
                        snprintf(why, sizeof why, "class folder '%s' is not in the class list %s", classes.v[c],
                                 o->classes);
                    rc = input_add(in, name, label, why[0] ? why : NULL);
                }
            sv_free(&files);
        }
        sv_free(&dirs);
        if (rc == RN_OK && seen == 0 && in->n == before) {
            snprintf(p, sizeof p, "%s/%s", o->src, classes.v[c]);
            snprintf(name, sizeof name, "empty class folder: no image files (label %d keeps its number, with no images)",
                     label);
            skip(ctx, p, name);
            (*nskip)++;
        }
    }
out:
    sv_free(&classes);
    return rc;
}

static int list_file(const rn_prep_opts *o, input *in) {
    FILE *f = fopen(o->src, "r");
    if (!f) return rn_errorf(RN_EIO, "%s: cannot open: %s", o->src, strerror(errno));
    char rootbuf[4096];
    const char *root = o->root;
    if (!root) {
        snprintf(rootbuf, sizeof rootbuf, "%s", o->src);
        char *slash = strrchr(rootbuf, '/');
        if (slash) *slash = 0;
        else snprintf(rootbuf, sizeof rootbuf, ".");
        root = rootbuf;
    }
    snprintf(in->root, sizeof in->root, "%s", root);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = RN_OK, max_label = -1, distinct = 0;
    char why[512];
    const int limit = o->max_classes > 0 ? o->max_classes : RN_PREP_MAX_CLASSES;
    uint8_t *seen = calloc((size_t)limit, 1); /* labels met so far */
    if (!seen) {
        fclose(f);
        return rn_errorf(RN_ENOMEM, "out of memory");
    }
    while ((len = getline(&line, &cap, f)) > 0 && rc == RN_OK) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0 || line[0] == '#') continue;
        char *sp = strrchr(line, ' ');
        why[0] = 0;
        long label = -1;
        if (!sp || sp == line) {
            snprintf(why, sizeof why, "%s:%ld: no label (lines are 'relative/path label')", o->src, lineno);
        } else {
            *sp = 0;
            char *end;
            errno = 0;
            label = strtol(sp + 1, &end, 10);
            if (errno || *end || end == sp + 1 || label < 0 || label > 0x7fffffff)
                snprintf(why, sizeof why, "%s:%ld: label '%s' is not a non-negative integer", o->src, lineno, sp + 1);
            else if (in->classes && label >= in->n_classes)
                snprintf(why, sizeof why, "%s:%ld: label %ld >= %d classes in %s", o->src, lineno, label,
                         in->n_classes, o->classes);
            else if (label >= limit)
                snprintf(why, sizeof why, "%s:%ld: label %ld is over the limit of %d classes (--max-classes "
                         "raises it)", o->src, lineno, label, limit);
        }
        if (why[0]) label = -1;
        else {
            if (label > max_label) max_label = (int)label;
            if (label < limit && !seen[label]) seen[label] = 1, distinct++;
        }
        rc = input_add(in, line, (int32_t)label, why[0] ? why : NULL);
    }
    if (ferror(f) && rc == RN_OK) rc = rn_errorf(RN_EIO, "%s: read error: %s", o->src, strerror(errno));
    free(line);
    free(seen);
    fclose(f);
    if (rc == RN_OK && !in->classes) {
        /* numeric labels without names: the names are the numbers */
        int k = max_label + 1;
        if (k <= 0) return rn_errorf(RN_EINVAL, "%s: no 'path label' lines in it", o->src);
        if (k > 1000 && k / 64 > distinct)
            return rn_errorf(RN_EINVAL, "%s: labels reach %d but only %d different labels occur: a list's labels "
                             "are class indices 0..K-1 (renumber them, or name the classes with --classes)",
                             o->src, max_label, distinct);
        in->classes = calloc((size_t)k, sizeof(char *));
        if (!in->classes) return rn_errorf(RN_ENOMEM, "out of memory");
        for (int i = 0; i < k; i++) {
            char b[16];
            snprintf(b, sizeof b, "%d", i);
            if (!(in->classes[i] = strdup(b))) return rn_errorf(RN_ENOMEM, "out of memory");
            in->n_classes++;
        }
    }
    return rc;
}

int rn_prep_read_list(const char *path, int max_classes, uint64_t *inputs, uint64_t *bad, int *n_classes) {
    rn_prep_opts o;
    rn_prep_defaults(&o);
    o.src = path;
    o.max_classes = max_classes;
    input in;
    memset(&in, 0, sizeof in);
    int rc = list_file(&o, &in);
    *inputs = in.n;
    *bad = 0;
    for (size_t i = 0; i < in.n; i++) *bad += in.v[i].skip != NULL;
    *n_classes = in.n_classes;
    input_free(&in);
    return rc;
}

/* ------------------------------------------------------------ per-image work */

typedef struct {
    uint8_t *data;
    size_t len;
    int w, h;
} outimg;

typedef struct {
    int state; /* 0 free, 1 taken, 2 done */
    int nout;
    outimg *out;
    uint64_t sum[3], sumsq[3], npix;
    char reason[1024];
} slot;

typedef struct {
    rn_jpeg *jpeg;
    rn_image_ws ws;
    uint8_t *file, *a, *b, *c;
    size_t file_cap, a_cap, b_cap, c_cap;
} worker_buf;

static int grow(uint8_t **p, size_t *cap, size_t n) {
    if (n <= *cap) return RN_OK;
    uint8_t *q = realloc(*p, n);
    if (!q) return rn_errorf(RN_ENOMEM, "out of memory (%zu bytes)", n);
    *p = q;
    *cap = n;
    return RN_OK;
}

/* read a whole file; the reason for failure goes to why (no path: the caller has it) */
static int read_file(const char *path, worker_buf *wb, size_t *len, char *why, size_t nwhy) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, nwhy, "cannot open: %s", strerror(errno));
        return RN_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, nwhy, "not a regular file");
        close(fd);
        return RN_EIO;
    }
    size_t n = 0, cap = (size_t)st.st_size + 1;
    if (grow(&wb->file, &wb->file_cap, cap)) {
        snprintf(why, nwhy, "out of memory for %zu bytes", cap);
        close(fd);
        return RN_ENOMEM;
    }
    for (;;) {
        if (n == wb->file_cap && grow(&wb->file, &wb->file_cap, wb->file_cap * 2)) {
            snprintf(why, nwhy, "out of memory");
            close(fd);
            return RN_ENOMEM;
        }
        ssize_t r = read(fd, wb->file + n, wb->file_cap - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            snprintf(why, nwhy, "read error: %s", strerror(errno));
            close(fd);
            return RN_EIO;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    *len = n;
    return RN_OK;
}

/* what a file holds, for a skip message */
static const char *file_kind(const uint8_t *d, size_t n) {
    switch (rn_imgfile_format(d, n)) {
    case RN_IMG_PNG: return "a PNG image";
    case RN_IMG_WEBP: return "a WebP image";
    case RN_IMG_GIF: return "a GIF image";
    case RN_IMG_BMP: return "a BMP image";
    case RN_IMG_TIFF: return "a TIFF image";
    case RN_IMG_PNM: return "a PPM/PGM image";
    default: break;
    }
    size_t text = 0, m = n < 512 ? n : 512;
    for (size_t i = 0; i < m; i++) text += (d[i] >= 0x20 && d[i] < 0x7f) || d[i] == '\n' || d[i] == '\r' || d[i] == '\t';
    if (m && text == m) return "text";
    return "unknown data";
}

/* torchvision's CenterCrop, zero-padding a side shorter than the crop */
static void center_crop(const uint8_t *src, int w, int h, int c, int cw, int ch, uint8_t *dst) {
    int sx, dx, nx, sy, dy, ny;
    if (cw > w) sx = 0, dx = (cw - w) / 2, nx = w;
    else sx = rn_round_half_even((w - cw) / 2.0), dx = 0, nx = cw;
    if (ch > h) sy = 0, dy = (ch - h) / 2, ny = h;
    else sy = rn_round_half_even((h - ch) / 2.0), dy = 0, ny = ch;
    if (cw > w || ch > h) memset(dst, 0, (size_t)cw * ch * c);
    for (int y = 0; y < ny; y++)
        memcpy(dst + ((size_t)(y + dy) * cw + dx) * c, src + ((size_t)(y + sy) * w + sx) * c, (size_t)nx * c);
}

static int process(const rn_prep_opts *o, const input *in, const item *it, uint64_t index, worker_buf *wb,
                   slot *s) {
    char *why = s->reason;
    size_t nwhy = sizeof s->reason;
    int c = o->gray ? 1 : 3, rc;
    size_t len;
    if (it->skip) {
        snprintf(why, nwhy, "%s", it->skip);
        return RN_EDATA;
    }
    char path[8192];
    item_path(in, it, path, sizeof path);
    if (read_file(path, wb, &len, why, nwhy) != RN_OK) return RN_EIO;
    if (len == 0) {
        snprintf(why, nwhy, "empty file (0 bytes)");
        return RN_EDATA;
    }
    rn_img_format fmt = rn_imgfile_format(wb->file, len);
    if (fmt != RN_IMG_JPEG && !rn_imgfile_can_decode(fmt)) {
        const char *miss = rn_imgfile_missing(fmt);
        if (!miss)
            snprintf(why, nwhy, "not an image rn-prep reads: the file holds %s (rn-prep reads %s: convert it or "
                     "remove it)", file_kind(wb->file, len), rn_imgfile_formats());
        else
            snprintf(why, nwhy, "the file holds %s, and %s", file_kind(wb->file, len), miss);
        return RN_EDATA;
    }
    int W, H;
    rn_jpeg_info info;
    if (fmt == RN_IMG_JPEG) {
        rc = rn_jpeg_header(wb->jpeg, wb->file, len, &info);
        W = info.width, H = info.height;
    } else {
        rc = rn_imgfile_header(fmt, wb->file, len, &W, &H);
    }
    if (rc != RN_OK) {
        snprintf(why, nwhy, "%s", rn_last_error());
        return RN_EDATA;
    }
    if ((uint64_t)W * H > o->max_pixels) {
        snprintf(why, nwhy, "%dx%d is %.1f megapixels, over --max-pixels %" PRIu64 " (raise it if the image is real)",
                 W, H, (double)W * H / 1e6, o->max_pixels);
        return RN_EDATA;
    }
    int tw = W, th = H;
    if (o->resize > 0) rn_image_resize_dims(W, H, o->resize, &tw, &th);
    if (tw <= 0 || th <= 0) {
        snprintf(why, nwhy, "%dx%d cannot be resized to a shorter side of %d", W, H, o->resize);
        return RN_EDATA;
    }
    int dw = W, dh = H;
    if (fmt == RN_IMG_JPEG) {
        rn_jpeg_scaled_size(&info, tw, th, &dw, &dh);
        if ((rc = grow(&wb->a, &wb->a_cap, (size_t)dw * dh * c)) != RN_OK) goto fail;
        if ((rc = rn_jpeg_decode(wb->jpeg, wb->file, len, c, dw, dh, wb->a)) != RN_OK) goto fail;
    } else {
        /* the decoder works in RGB whatever c is */
        if ((rc = grow(&wb->a, &wb->a_cap, (size_t)W * H * 3)) != RN_OK) goto fail;
        if ((rc = rn_imgfile_decode(fmt, wb->file, len, c, o->max_pixels, wb->a)) != RN_OK) goto fail;
    }
    uint8_t *img = wb->a;
    int w = dw, h = dh;
    if (tw != dw || th != dh) {
        double box[4] = {0, 0, dw, dh};
        if ((rc = grow(&wb->b, &wb->b_cap, (size_t)tw * th * c)) != RN_OK) goto fail;
        if ((rc = rn_image_resize(wb->a, dw, dh, c, box, tw, th, 0, 0, tw, th, 0, wb->b, &wb->ws)) != RN_OK)
            goto fail;
        img = wb->b, w = tw, h = th;
    }
    if (o->center_crop > 0) {
        if ((rc = grow(&wb->c, &wb->c_cap, (size_t)o->center_crop * o->center_crop * c)) != RN_OK) goto fail;
        uint8_t *dst = wb->c;
        center_crop(img, w, h, c, o->center_crop, o->center_crop, dst);
        img = dst, w = h = o->center_crop;
    }
    int k = o->augment > 0 ? o->augment : 1;
    s->out = calloc((size_t)k, sizeof *s->out);
    if (!s->out) { rc = rn_errorf(RN_ENOMEM, "out of memory"); goto fail; }
    uint8_t *aug = NULL;
    size_t S = (size_t)o->aug_crop;
    if (o->augment > 0 && !(aug = malloc(S * S * c))) { rc = rn_errorf(RN_ENOMEM, "out of memory"); goto fail; }
    uint64_t key = rn_rng_key(o->seed, PURPOSE_AUGMENT);
    for (int v = 0; v < k; v++) {
        const uint8_t *px = img;
        int ow = w, oh = h;
        if (o->augment > 0) {
            rn_image_stream st;
            rn_draws d;
            rn_image_stream_init(&st, &d, key, (uint64_t)v, index);
            int b[4];
            rn_image_rrc_box(w, h, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, &d, b);
            int flip = rn_u01(rn_image_stream_next(&st)) < 0.5f;
            double box[4] = {b[0], b[1], b[0] + b[2], b[1] + b[3]};
            if ((rc = rn_image_resize(img, w, h, c, box, (int)S, (int)S, 0, 0, (int)S, (int)S, flip, aug, &wb->ws)))
                break;
            px = aug, ow = oh = (int)S;
        }
        size_t np = (size_t)ow * oh;
        for (size_t i = 0; i < np; i++)
            for (int ch = 0; ch < c; ch++) {
                uint64_t val = px[i * c + ch];
                s->sum[ch] += val;
                s->sumsq[ch] += val * val;
            }
        s->npix += np;
        outimg *oi = &s->out[v];
        oi->w = ow, oi->h = oh;
        if (o->enc == RN_ENC_JPEG) {
            if ((rc = rn_jpeg_encode(wb->jpeg, px, ow, oh, c, o->quality, &oi->data, &oi->len)) != RN_OK) break;
        } else {
            oi->len = np * c;
            if (!(oi->data = malloc(oi->len))) { rc = rn_errorf(RN_ENOMEM, "out of memory"); break; }
            memcpy(oi->data, px, oi->len);
        }
        s->nout++;
    }
    free(aug);
    if (rc == RN_OK) return RN_OK;
fail:
    snprintf(why, nwhy, "%s", rn_last_error());
    return rc;
}

/* ------------------------------------------------------------ the pipeline */

typedef struct {
    const rn_prep_opts *o;
    input *in;
    slot *slots;
    size_t window;
    pthread_mutex_t mu;
    pthread_cond_t done, space;
    uint64_t next, written, total;
    int stop;
} pipe_t;

typedef struct {
    pipe_t *p;
    int rc;
} wctx;

static void *worker(void *arg) {
    wctx *wc = arg;
    pipe_t *p = wc->p;
    worker_buf wb;
    memset(&wb, 0, sizeof wb);
    if ((wc->rc = rn_jpeg_create(&wb.jpeg)) != RN_OK) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->done);
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    rn_jpeg_set_max_pixels(wb.jpeg, p->o->max_pixels);
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->next < p->total && p->next >= p->written + p->window)
            pthread_cond_wait(&p->space, &p->mu);
        if (p->stop || p->next >= p->total) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        uint64_t i = p->next++;
        slot *s = &p->slots[i % p->window];
        s->state = 1;
        pthread_mutex_unlock(&p->mu);
        process(p->o, p->in, &p->in->v[i], i, &wb, s);
        pthread_mutex_lock(&p->mu);
        s->state = 2;
        pthread_cond_broadcast(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
    rn_jpeg_destroy(wb.jpeg);
    rn_image_ws_free(&wb.ws);
    free(wb.file);
    free(wb.a);
    free(wb.b);
    free(wb.c);
    return NULL;
}

static void slot_clear(slot *s) {
    for (int v = 0; v < s->nout; v++) free(s->out[v].data);
    free(s->out);
    memset(s, 0, sizeof *s);
}

static void noop_skip(void *ctx, const char *f, const char *r) {}

int rn_prep_run(const rn_prep_opts *o, rn_prep_result *res) {
    memset(res, 0, sizeof *res);
    if (!o->src || !o->out) return rn_errorf(RN_EINVAL, "rn_prep_run: source and output are required");
    if (o->enc != RN_ENC_JPEG && o->enc != RN_ENC_RAW) return rn_errorf(RN_EINVAL, "unknown encoding %d", o->enc);
    if (o->quality < 1 || o->quality > 100)
        return rn_errorf(RN_EINVAL, "--quality %d: must be 1..100", o->quality);
    if (o->resize < 0 || o->center_crop < 0 || o->augment < 0 || (o->augment > 0 && o->aug_crop <= 0))
        return rn_errorf(RN_EINVAL, "--resize, --center-crop, --augment and --crop must not be negative");
    void (*skip)(void *, const char *, const char *) = o->on_skip ? o->on_skip : noop_skip;
    input in = {0};
    int rc = RN_OK;
    rn_dataset_writer *w = NULL;
    pipe_t p;
    memset(&p, 0, sizeof p);
    pthread_t *th = NULL;
    wctx *wcs = NULL;
    int nth = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nth < 1) nth = 1;
    if (nth > 256) nth = 256;
    uint64_t pre_skipped = 0;

    if (o->classes) {
        if ((rc = rn_dataset_read_classes(o->classes, &in.classes, &in.n_classes)) != RN_OK) {
            rn_error_context(rc, "--classes");
            goto out;
        }
    }
    struct stat st;
    if (stat(o->src, &st) != 0) {
        rc = rn_errorf(RN_EIO, "%s: %s", o->src, strerror(errno));
        goto out;
    }
    rc = S_ISDIR(st.st_mode) ? list_imagefolder(o, &in, skip, o->ctx, &pre_skipped) : list_file(o, &in);
    if (rc) goto out;
    if (pre_skipped && o->strict) {
        rc = rn_errorf(RN_EDATA, "%s: an empty class folder (--strict: no output written)", o->src);
        goto out;
    }
    if (o->shuffle) {
        uint64_t key = rn_rng_key(o->seed, PURPOSE_SHUFFLE);
        for (size_t i = in.n; i > 1; i--) {
            uint32_t r[4];
            rn_philox(key, 0, i, r);
            uint64_t u = ((uint64_t)r[0] << 32) | r[1];
            size_t j = (size_t)(((unsigned __int128)u * i) >> 64);
            item t = in.v[i - 1];
            in.v[i - 1] = in.v[j];
            in.v[j] = t;
        }
    }
    res->inputs = in.n;
    res->n_classes = in.n_classes;
    if ((rc = rn_dataset_writer_create(o->out, o->map_size, &w)) != RN_OK) goto out;

    p.o = o;
    p.in = &in;
    p.window = (size_t)nth * 8 + 8;
    p.total = in.n;
    p.slots = calloc(p.window, sizeof *p.slots);
    th = calloc((size_t)nth, sizeof *th);
    wcs = calloc((size_t)nth, sizeof *wcs);
    if (!p.slots || !th || !wcs) { rc = rn_errorf(RN_ENOMEM, "out of memory"); goto out; }
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.done, NULL);
    pthread_cond_init(&p.space, NULL);
    int started = 0;
    for (; started < nth; started++) {
        wcs[started].p = &p;
        if (pthread_create(&th[started], NULL, worker, &wcs[started]) != 0) {
            rc = rn_errorf(RN_ENOMEM, "cannot start decoding thread %d: %s", started + 1, strerror(errno));
            break;
        }
    }
    int c = o->gray ? 1 : 3;
    rn_dataset_info info;
    memset(&info, 0, sizeof info);
    uint64_t *class_counts = calloc((size_t)in.n_classes + 1, sizeof *class_counts);
    uint64_t sum[3] = {0}, sumsq[3] = {0}, npix = 0, sources = 0, skipped = pre_skipped;
    uint32_t minw = UINT32_MAX, minh = UINT32_MAX, maxw = 0, maxh = 0;
    uint64_t bytes = 0;
    if (!class_counts && rc == RN_OK) rc = rn_errorf(RN_ENOMEM, "out of memory");
    for (uint64_t i = 0; i < in.n && rc == RN_OK; i++) {
        slot *s = &p.slots[i % p.window];
        if (o->cancel && *o->cancel) {
            rc = rn_errorf(RN_EINTR, "interrupted after %" PRIu64 " of %zu inputs: no output written", i, in.n);
            break;
        }
        pthread_mutex_lock(&p.mu);
        while (s->state != 2 && !p.stop) pthread_cond_wait(&p.done, &p.mu);
        int ok = s->state == 2;
        pthread_mutex_unlock(&p.mu);
        if (!ok) {
            rc = rn_errorf(RN_EDATA, "a decoding thread could not start");
            for (int t = 0; t < started; t++)
                if (wcs[t].rc) rc = wcs[t].rc;
            break;
        }
        const item *it = &in.v[i];
        if (s->nout == 0) {
            char path[8192];
            item_path(&in, it, path, sizeof path);
            skipped++;
            skip(o->ctx, path, s->reason);
            if (o->strict) rc = rn_errorf(RN_EDATA, "%s: %s (--strict: no output written)", path, s->reason);
        } else {
            for (int v = 0; v < s->nout && rc == RN_OK; v++) {
                const outimg *oi = &s->out[v];
                rn_sample smp = {it->label, (uint32_t)oi->h, (uint32_t)oi->w, (uint32_t)c, o->enc, oi->data, oi->len, it->name};
                rc = rn_dataset_writer_put(w, &smp);
                if ((uint32_t)oi->w < minw) minw = (uint32_t)oi->w;
                if ((uint32_t)oi->h < minh) minh = (uint32_t)oi->h;
                if ((uint32_t)oi->w > maxw) maxw = (uint32_t)oi->w;
                if ((uint32_t)oi->h > maxh) maxh = (uint32_t)oi->h;
                bytes += oi->len;
                class_counts[it->label]++;
            }
            for (int ch = 0; ch < c; ch++) sum[ch] += s->sum[ch], sumsq[ch] += s->sumsq[ch];
            npix += s->npix;
            sources++;
        }
        slot_clear(s);
        pthread_mutex_lock(&p.mu);
        p.written = i + 1;
        if (o->limit && sources >= o->limit) p.stop = 1;
        pthread_cond_broadcast(&p.space);
        pthread_mutex_unlock(&p.mu);
        if (o->on_progress) o->on_progress(o->ctx, i + 1, in.n);
        if (o->limit && sources >= o->limit) break;
    }
    pthread_mutex_lock(&p.mu);
    p.stop = 1;
    pthread_cond_broadcast(&p.space);
    pthread_mutex_unlock(&p.mu);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    for (size_t i = 0; i < p.window; i++) slot_clear(&p.slots[i]);
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.done);
    pthread_cond_destroy(&p.space);
    res->written = rn_dataset_writer_count(w);
    res->skipped = skipped;
    if (rc == RN_OK && res->written == 0)
        rc = rn_errorf(RN_EDATA, "%s: no image could be used (%" PRIu64 " skipped): nothing written", o->src, skipped);
    if (rc == RN_OK) {
        info.count = res->written;
        info.skipped = skipped;
        info.n_classes = in.n_classes;
        info.class_names = in.classes;
        info.class_counts = class_counts;
        info.channels = c;
        info.enc = o->enc;
        for (int ch = 0; ch < c; ch++) {
            double m = (double)sum[ch] / ((double)npix * 255.0);
            double m2 = (double)sumsq[ch] / ((double)npix * 255.0 * 255.0);
            info.mean[ch] = m;
            info.std[ch] = sqrt(m2 - m * m > 0 ? m2 - m * m : 0);
        }
        info.min_width = minw, info.min_height = minh, info.max_width = maxw, info.max_height = maxh;
        info.data_bytes = bytes;
        info.command = (char *)(o->command ? o->command : "");
        info.rn_version = (char *)(o->rn_version ? o->rn_version : "");
        rc = rn_dataset_writer_finish(w, &info);
        w = NULL;
    }
    free(class_counts);
out:
    if (w) rn_dataset_writer_abort(w);
    free(p.slots);
    free(th);
    free(wcs);
    input_free(&in);
    return rc;
}
