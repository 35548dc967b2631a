#include "rn/onnx.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"
#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/json.h"
#include "rn/loader.h"

#define BN_EPS 1e-5
/* room for the attributes of any node rn writes (Conv has five) */
#define MAX_ATTRS 6

/* The model under construction. Every message, string and folded tensor is allocated
 * here and listed in mem, so one free releases all of it; initializers that are a copy
 * of a checkpoint tensor point at the checkpoint's bytes instead. */
typedef struct {
    void **mem;
    size_t nmem, capmem;
    Onnx__NodeProto **node;
    size_t nnode, capnode;
    Onnx__TensorProto **init;
    size_t ninit, capinit;
    const rn_onnx_ranges *q; /* int8 model: the activation ranges; NULL: float */
} builder;

/* room for one more entry in an array of cap entries (doubling); one per element type,
 * so that each realloc'ed array is only ever accessed through its own type */
#define GROW(arr, n, cap)                                                                                              \
    do {                                                                                                               \
        if ((n) < (cap)) break;                                                                                        \
        size_t c_ = (cap) ? 2 * (cap) : 64;                                                                            \
        void *p_ = realloc((arr), c_ * sizeof *(arr));                                                                 \
        if (!p_) return rn_errorf(RN_ENOMEM, "out of memory building the ONNX graph");                                 \
        (arr) = p_;                                                                                                    \
        (cap) = c_;                                                                                                    \
    } while (0)

static int grow_mem(builder *b) {
    GROW(b->mem, b->nmem, b->capmem);
    return RN_OK;
}
static int grow_node(builder *b) {
    GROW(b->node, b->nnode, b->capnode);
    return RN_OK;
}
static int grow_init(builder *b) {
    GROW(b->init, b->ninit, b->capinit);
    return RN_OK;
}

/* zeroed memory owned by the builder, or NULL (RN_ENOMEM recorded) */
static void *bcalloc(builder *b, size_t n) {
    if (grow_mem(b)) return NULL;
    void *p = rn_calloc(1, n ? n : 1);
    if (p) b->mem[b->nmem++] = p;
    return p;
}

static char *bstr(builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *bstr(builder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = bcalloc(b, (size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

static void builder_free(builder *b) {
    for (size_t i = 0; i < b->nmem; i++)
        free(b->mem[i]);
    free(b->mem);
    free(b->node);
    free(b->init);
}

/* A node op(in...) -> out, named out (node and value names are separate namespaces in
 * ONNX; one name for both reads best in a viewer). */
static Onnx__NodeProto *node(builder *b, const char *op, const char *out, int nin, ...) {
    Onnx__NodeProto *n = bcalloc(b, sizeof *n);
    if (!n) return NULL;
    onnx__node_proto__init(n);
    n->op_type = bstr(b, "%s", op);
    n->name = bstr(b, "%s", out);
    n->input = bcalloc(b, (size_t)nin * sizeof(char *));
    n->output = bcalloc(b, sizeof(char *));
    n->attribute = bcalloc(b, MAX_ATTRS * sizeof(Onnx__AttributeProto *));
    if (!n->op_type || !n->name || !n->input || !n->output || !n->attribute) return NULL;
    n->n_output = 1;
    n->output[0] = n->name;
    va_list ap;
    va_start(ap, nin);
    for (int i = 0; i < nin; i++)
        n->input[n->n_input++] = va_arg(ap, char *);
    va_end(ap);
    if (grow_node(b)) return NULL;
    b->node[b->nnode++] = n;
    return n;
}

static Onnx__AttributeProto *attr(builder *b, Onnx__NodeProto *n, const char *name, int type) {
    Onnx__AttributeProto *a = bcalloc(b, sizeof *a);
    if (!a) return NULL;
    onnx__attribute_proto__init(a);
    a->name = bstr(b, "%s", name);
    if (!a->name) return NULL;
    a->has_type = 1;
    a->type = type;
    n->attribute[n->n_attribute++] = a;
    return a;
}

static int attr_int(builder *b, Onnx__NodeProto *n, const char *name, int64_t v) {
    Onnx__AttributeProto *a = attr(b, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (!a) return RN_ENOMEM;
    a->has_i = 1;
    a->i = v;
    return RN_OK;
}

static int attr_float(builder *b, Onnx__NodeProto *n, const char *name, float v) {
    Onnx__AttributeProto *a = attr(b, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (!a) return RN_ENOMEM;
    a->has_f = 1;
    a->f = v;
    return RN_OK;
}

static int attr_ints(builder *b, Onnx__NodeProto *n, const char *name, int k, const int64_t *v) {
    Onnx__AttributeProto *a = attr(b, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    if (!a) return RN_ENOMEM;
    a->ints = bcalloc(b, (size_t)k * sizeof(int64_t));
    if (!a->ints) return RN_ENOMEM;
    memcpy(a->ints, v, (size_t)k * sizeof(int64_t));
    a->n_ints = (size_t)k;
    return RN_OK;
}

/* An initializer of ndim dims; data is not copied and must outlive the builder. */
static int initializer(builder *b, const char *name, int dtype, int ndim, const int64_t *dims, const void *data,
                       size_t nbytes) {
    Onnx__TensorProto *t = bcalloc(b, sizeof *t);
    if (!t) return RN_ENOMEM;
    onnx__tensor_proto__init(t);
    t->name = bstr(b, "%s", name);
    t->dims = bcalloc(b, (size_t)ndim * sizeof(int64_t));
    if (!t->name || !t->dims) return RN_ENOMEM;
    memcpy(t->dims, dims, (size_t)ndim * sizeof(int64_t));
    t->n_dims = (size_t)ndim;
    t->has_data_type = 1;
    t->data_type = dtype;
    t->has_raw_data = 1;
    t->raw_data.data = (uint8_t *)data;
    t->raw_data.len = nbytes;
    if (grow_init(b)) return RN_ENOMEM;
    b->init[b->ninit++] = t;
    return RN_OK;
}

/* checkpoint tensor "<module>.<what>" as an initializer of the same name */
static int ckpt_init(builder *b, const rn_ckpt *c, const char *module, const char *what, const rn_ptensor **out) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", module, what);
    const rn_ptensor *p = rn_ckpt_find(c, name);
    if (!p || !rn_ptensor_f32(p)) return rn_errorf(RN_ECORRUPT, "checkpoint lacks F32 tensor %s", name);
    if (out) *out = p;
    return initializer(b, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, (int)p->n_shape, p->shape, p->data.data,
                       p->data.len);
}

/* BN of unit u folded into its conv (rn/onnx.h): *w (cout, cin, k, k) and *bias (cout),
 * owned by the builder */
static int fold(builder *b, const rn_ckpt *c, const rn_convbn *u, float **w, float **bias) {
    const char *what[5] = {"weight", "weight", "bias", "running_mean", "running_var"};
    const float *v[5];
    for (int i = 0; i < 5; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s.%s", i ? u->bn : u->conv, what[i]);
        const rn_ptensor *p = rn_ckpt_find(c, name);
        if (!p || !rn_ptensor_f32(p)) return rn_errorf(RN_ECORRUPT, "checkpoint lacks F32 tensor %s", name);
        v[i] = rn_ptensor_f32(p);
    }
    size_t per = (size_t)u->cin * u->k * u->k;
    *w = bcalloc(b, (size_t)u->cout * per * sizeof(float));
    *bias = bcalloc(b, (size_t)u->cout * sizeof(float));
    if (!*w || !*bias) return RN_ENOMEM;
    for (int o = 0; o < u->cout; o++) {
        double s = (double)v[1][o] / sqrt((double)v[4][o] + BN_EPS);
        for (size_t i = 0; i < per; i++)
            (*w)[o * per + i] = (float)(v[0][o * per + i] * s);
        (*bias)[o] = (float)(v[2][o] - v[3][o] * s);
    }
    return RN_OK;
}

/* A weight (rows, ...) as int8, symmetric per row (output channel): initializers
 * NAME_quantized, NAME_scale (max|row|/127, 1 for an all-zero row) and NAME_zero_point
 * (zeros), and the DequantizeLinear (axis 0) whose output value is NAME. */
static int quant_weight(builder *b, const char *name, const float *w, int ndim, const int64_t *dims) {
    int64_t rows = dims[0];
    size_t per = 1;
    for (int i = 1; i < ndim; i++)
        per *= (size_t)dims[i];
    int8_t *q = bcalloc(b, (size_t)rows * per);
    float *scale = bcalloc(b, (size_t)rows * sizeof(float));
    int8_t *zp = bcalloc(b, (size_t)rows);
    char *qn = bstr(b, "%s_quantized", name), *sn = bstr(b, "%s_scale", name), *zn = bstr(b, "%s_zero_point", name);
    if (!q || !scale || !zp || !qn || !sn || !zn) return RN_ENOMEM;
    for (int64_t o = 0; o < rows; o++) {
        const float *r = w + (size_t)o * per;
        float m = 0;
        for (size_t i = 0; i < per; i++)
            if (fabsf(r[i]) > m) m = fabsf(r[i]);
        scale[o] = m > 0 ? m / 127.0f : 1.0f;
        for (size_t i = 0; i < per; i++) {
            float v = nearbyintf(r[i] / scale[o]);
            q[(size_t)o * per + i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
    int rc;
    if ((rc = initializer(b, qn, ONNX__TENSOR_PROTO__DATA_TYPE__INT8, ndim, dims, q, (size_t)rows * per))) return rc;
    if ((rc = initializer(b, sn, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, &rows, scale, (size_t)rows * 4))) return rc;
    if ((rc = initializer(b, zn, ONNX__TENSOR_PROTO__DATA_TYPE__INT8, 1, &rows, zp, (size_t)rows))) return rc;
    Onnx__NodeProto *n = node(b, "DequantizeLinear", name, 3, qn, sn, zn);
    if (!n) return RN_ENOMEM;
    return attr_int(b, n, "axis", 0);
}

/* An activation x through QuantizeLinear and DequantizeLinear, per tensor: int8
 * symmetric (scale range/127) when it may be negative, else uint8 with zero point 0
 * (scale range/255). A float model (no ranges) passes x through. */
static int qdq(builder *b, char *x, float range, int is_signed, char **y) {
    if (!b->q) {
        *y = x;
        return RN_OK;
    }
    float *scale = bcalloc(b, sizeof(float));
    uint8_t *zp = bcalloc(b, 1);
    char *sn = bstr(b, "%s.scale", x), *zn = bstr(b, "%s.zero_point", x);
    char *qn = bstr(b, "%s.quantized", x), *dn = bstr(b, "%s.dequantized", x);
    if (!scale || !zp || !sn || !zn || !qn || !dn) return RN_ENOMEM;
    *scale = range > 0 && isfinite(range) ? range / (is_signed ? 127.0f : 255.0f) : 1.0f;
    int64_t none = 0;
    int rc;
    if ((rc = initializer(b, sn, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0, &none, scale, 4))) return rc;
    if ((rc = initializer(b, zn, is_signed ? ONNX__TENSOR_PROTO__DATA_TYPE__INT8 : ONNX__TENSOR_PROTO__DATA_TYPE__UINT8,
                          0, &none, zp, 1)))
        return rc;
    Onnx__NodeProto *qz = node(b, "QuantizeLinear", qn, 3, x, sn, zn);
    Onnx__NodeProto *dq = qz ? node(b, "DequantizeLinear", dn, 3, qz->output[0], sn, zn) : NULL;
    if (!dq) return RN_ENOMEM;
    *y = dq->output[0];
    return RN_OK;
}

/* conv (+ BN) of unit u on value x; its output value in *y */
static int convbn(builder *b, const rn_ckpt *c, const rn_convbn *u, char *x, int folded, char **y) {
    int rc;
    char *wname = bstr(b, "%s.weight", u->conv), *bname = bstr(b, "%s.bias", u->conv);
    if (!wname || !bname) return RN_ENOMEM;
    /* weights first: a DequantizeLinear feeding the Conv must come before it */
    if (folded) {
        float *w = NULL, *bias = NULL;
        int64_t wd[4] = {u->cout, u->cin, u->k, u->k}, bd[1] = {u->cout};
        if ((rc = fold(b, c, u, &w, &bias))) return rc;
        if (b->q)
            rc = quant_weight(b, wname, w, 4, wd);
        else
            rc = initializer(b, wname, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, wd, w,
                             (size_t)u->cout * u->cin * u->k * u->k * sizeof(float));
        if (rc) return rc;
        if ((rc = initializer(b, bname, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, bd, bias, (size_t)u->cout * 4)))
            return rc;
    }
    Onnx__NodeProto *n = folded ? node(b, "Conv", u->conv, 3, x, wname, bname) : node(b, "Conv", u->conv, 2, x, wname);
    if (!n) return RN_ENOMEM;
    int64_t k[2] = {u->k, u->k}, s[2] = {u->stride, u->stride}, d[2] = {1, 1};
    int64_t p[4] = {u->pad, u->pad, u->pad, u->pad};
    if ((rc = attr_ints(b, n, "kernel_shape", 2, k))) return rc;
    if ((rc = attr_ints(b, n, "strides", 2, s))) return rc;
    if ((rc = attr_ints(b, n, "pads", 4, p))) return rc;
    if ((rc = attr_ints(b, n, "dilations", 2, d))) return rc;
    if ((rc = attr_int(b, n, "group", 1))) return rc;
    if (folded) {
        *y = n->output[0];
        return RN_OK;
    }
    if ((rc = ckpt_init(b, c, u->conv, "weight", NULL))) return rc;
    const char *what[4] = {"weight", "bias", "running_mean", "running_var"};
    char *in[4];
    for (int i = 0; i < 4; i++) {
        if ((rc = ckpt_init(b, c, u->bn, what[i], NULL))) return rc;
        if (!(in[i] = bstr(b, "%s.%s", u->bn, what[i]))) return RN_ENOMEM;
    }
    Onnx__NodeProto *bn = node(b, "BatchNormalization", u->bn, 5, n->output[0], in[0], in[1], in[2], in[3]);
    if (!bn) return RN_ENOMEM;
    if ((rc = attr_float(b, bn, "epsilon", (float)BN_EPS))) return rc;
    *y = bn->output[0];
    return RN_OK;
}

/* a one-operand node op(x) named name; output in *y */
static int unary(builder *b, const char *op, const char *name, char *x, char **y) {
    Onnx__NodeProto *n = node(b, op, name, 1, x);
    if (!n) return RN_ENOMEM;
    *y = n->output[0];
    return RN_OK;
}

/* Cast, Div 255, Sub mean, Div std, Transpose: rn_input_normalize's arithmetic, in its
 * order, so the network sees the same floats as in rn */
static int preprocess(builder *b, char *x, char **y) {
    static const float scale = 255.0f;
    int64_t one = 1, three = 3;
    int rc;
    if ((rc = initializer(b, "preprocess.scale", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0, &one, &scale, 4))) return rc;
    if ((rc = initializer(b, "preprocess.mean", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, &three, RN_IMAGENET_MEAN, 12)))
        return rc;
    if ((rc = initializer(b, "preprocess.std", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, &three, RN_IMAGENET_STD, 12)))
        return rc;
    Onnx__NodeProto *cast = node(b, "Cast", "preprocess.cast", 1, x);
    if (!cast) return RN_ENOMEM;
    if ((rc = attr_int(b, cast, "to", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT))) return rc;
    Onnx__NodeProto *div = node(b, "Div", "preprocess.div_255", 2, cast->output[0], b->init[b->ninit - 3]->name);
    Onnx__NodeProto *sub =
        div ? node(b, "Sub", "preprocess.sub_mean", 2, div->output[0], b->init[b->ninit - 2]->name) : NULL;
    Onnx__NodeProto *dstd =
        sub ? node(b, "Div", "preprocess.div_std", 2, sub->output[0], b->init[b->ninit - 1]->name) : NULL;
    Onnx__NodeProto *tr = dstd ? node(b, "Transpose", "preprocess.nchw", 1, dstd->output[0]) : NULL;
    if (!tr) return RN_ENOMEM;
    int64_t perm[4] = {0, 3, 1, 2};
    if ((rc = attr_ints(b, tr, "perm", 4, perm))) return rc;
    *y = tr->output[0];
    return RN_OK;
}

/* residual block k: relu(main(x) + shortcut(x)) */
static int block(builder *b, const rn_ckpt *c, const rn_resnet *net, int k, char *x, int fold, char **y) {
    const rn_block *blk = &net->blocks[k];
    char prefix[48];
    snprintf(prefix, sizeof prefix, "%s", net->units[blk->conv[0]].conv);
    char *dot = strrchr(prefix, '.');
    if (dot) *dot = 0;
    char *h = x, *sc = x;
    int rc;
    for (int i = 0; i < blk->nconv; i++) {
        if ((rc = convbn(b, c, &net->units[blk->conv[i]], h, fold, &h))) return rc;
        if (i + 1 < blk->nconv) {
            char name[64];
            snprintf(name, sizeof name, "%s.relu%d", prefix, i + 1);
            if ((rc = unary(b, "Relu", name, h, &h))) return rc;
            if ((rc = qdq(b, h, b->q ? b->q->unit[blk->conv[i]] : 0, 0, &h))) return rc;
        }
    }
    if (blk->down >= 0 && (rc = convbn(b, c, &net->units[blk->down], x, fold, &sc))) return rc;
    char name[64];
    snprintf(name, sizeof name, "%s.add", prefix);
    Onnx__NodeProto *add = node(b, "Add", name, 2, h, sc);
    if (!add) return RN_ENOMEM;
    snprintf(name, sizeof name, "%s.relu", prefix);
    if ((rc = unary(b, "Relu", name, add->output[0], y))) return rc;
    return qdq(b, *y, b->q ? b->q->unit[blk->conv[blk->nconv - 1]] : 0, 0, y);
}

/* a value's type: elem (N, d1, d2, d3...), a dim < 0 symbolic with the name in sym */
static Onnx__ValueInfoProto *value_info(builder *b, const char *name, int elem, int ndim, const int64_t *dims,
                                        const char *const *sym) {
    Onnx__ValueInfoProto *v = bcalloc(b, sizeof *v);
    Onnx__TypeProto *t = bcalloc(b, sizeof *t);
    Onnx__TypeProto__Tensor *tt = bcalloc(b, sizeof *tt);
    Onnx__TensorShapeProto *sh = bcalloc(b, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **d = bcalloc(b, (size_t)ndim * sizeof *d);
    if (!v || !t || !tt || !sh || !d) return NULL;
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(t);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    for (int i = 0; i < ndim; i++) {
        if (!(d[i] = bcalloc(b, sizeof *d[i]))) return NULL;
        onnx__tensor_shape_proto__dimension__init(d[i]);
        if (dims[i] >= 0) {
            d[i]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d[i]->dim_value = dims[i];
        } else {
            d[i]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            if (!(d[i]->dim_param = bstr(b, "%s", sym[i]))) return NULL;
        }
    }
    sh->dim = d;
    sh->n_dim = (size_t)ndim;
    tt->has_elem_type = 1;
    tt->elem_type = elem;
    tt->shape = sh;
    t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    t->tensor_type = tt;
    v->type = t;
    v->name = bstr(b, "%s", name);
    return v->name ? v : NULL;
}

/* class names as a JSON array, owned by the builder */
static char *class_json(builder *b, const rn_ckpt *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fputc('[', f);
    for (size_t i = 0; i < c->n_class_names; i++) {
        if (i) fputc(',', f);
        rn_json_string(f, c->class_names[i]);
    }
    fputc(']', f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    char *s = bstr(b, "%s", buf);
    free(buf);
    return s;
}

static int metadata(builder *b, Onnx__ModelProto *m, const rn_ckpt *c, const rn_resnet *net, int pre) {
    const char *keys[] = {"arch", "num_classes", "class_names", "input", "producer", "rn_version", "quantization"};
    enum { NKEYS = sizeof keys / sizeof keys[0] };
    char *vals[NKEYS];
    vals[0] = bstr(b, "%s", net->arch);
    vals[1] = bstr(b, "%d", net->num_classes);
    vals[2] = class_json(b, c);
    vals[3] = pre ? bstr(b,
                         "uint8 (N, H, W, 3) RGB pixels as rn's loader makes them; normalised inside: "
                         "(x/255 - mean) / std, mean %.3f %.3f %.3f, std %.3f %.3f %.3f",
                         RN_IMAGENET_MEAN[0], RN_IMAGENET_MEAN[1], RN_IMAGENET_MEAN[2], RN_IMAGENET_STD[0],
                         RN_IMAGENET_STD[1], RN_IMAGENET_STD[2])
                  : bstr(b,
                         "float (N, 3, H, W) RGB, normalised: (x/255 - mean) / std, mean %.3f %.3f %.3f, "
                         "std %.3f %.3f %.3f",
                         RN_IMAGENET_MEAN[0], RN_IMAGENET_MEAN[1], RN_IMAGENET_MEAN[2], RN_IMAGENET_STD[0],
                         RN_IMAGENET_STD[1], RN_IMAGENET_STD[2]);
    vals[4] = bstr(b, "rn-export");
    vals[5] = bstr(b, "%s", RN_VERSION);
    vals[6] = bstr(b, "%s",
                   b->q ? "int8 QDQ: weights int8 symmetric per output channel; activations per tensor "
                          "(input int8 symmetric, ReLU outputs uint8), scales from calibration"
                        : "none (float32)");
    m->metadata_props = bcalloc(b, NKEYS * sizeof *m->metadata_props);
    if (!m->metadata_props) return RN_ENOMEM;
    for (int i = 0; i < NKEYS; i++) {
        Onnx__StringStringEntryProto *e = bcalloc(b, sizeof *e);
        if (!e || !vals[i]) return rn_errorf(RN_ENOMEM, "out of memory building the ONNX metadata");
        onnx__string_string_entry_proto__init(e);
        e->key = (char *)keys[i];
        e->value = vals[i];
        m->metadata_props[m->n_metadata_props++] = e;
    }
    return RN_OK;
}

int rn_onnx_build(const rn_ckpt *c, const rn_onnx_opts *o, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    rn_resnet net;
    int rc = rn_ckpt_net(c, &net);
    if (rc) return rc;
    builder b = {.q = o->int8};
    int folded = o->fold_bn || o->int8;
    Onnx__ModelProto m;
    Onnx__GraphProto g;
    Onnx__OperatorSetIdProto opset;
    Onnx__OperatorSetIdProto *opsets[1] = {&opset};
    Onnx__ValueInfoProto *vin, *vout;
    onnx__model_proto__init(&m);
    onnx__graph_proto__init(&g);
    onnx__operator_set_id_proto__init(&opset);
    opset.domain = "";
    opset.has_version = 1;
    opset.version = RN_ONNX_OPSET;
    m.has_ir_version = 1;
    m.ir_version = RN_ONNX_IR_VERSION;
    m.opset_import = opsets;
    m.n_opset_import = 1;
    m.producer_name = "rn";
    m.producer_version = RN_VERSION;
    m.graph = &g;
    g.name = net.arch;

    char *x = "input";
    if (o->preprocess) {
        const int64_t d[4] = {-1, -1, -1, 3};
        const char *sym[4] = {"N", "H", "W", NULL};
        vin = value_info(&b, x, ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, 4, d, sym);
        if ((rc = preprocess(&b, x, &x))) goto fail;
    } else {
        const int64_t d[4] = {-1, 3, -1, -1};
        const char *sym[4] = {"N", NULL, "H", "W"};
        vin = value_info(&b, x, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 4, d, sym);
    }
    const int64_t od[2] = {-1, net.num_classes};
    const char *osym[2] = {"N", NULL};
    vout = value_info(&b, "logits", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, od, osym);
    if (!vin || !vout) {
        rc = RN_ENOMEM;
        goto fail;
    }
    g.input = &vin;
    g.n_input = 1;
    g.output = &vout;
    g.n_output = 1;

    if ((rc = qdq(&b, x, b.q ? b.q->input : 0, 1, &x))) goto fail;
    if ((rc = convbn(&b, c, &net.units[0], x, folded, &x))) goto fail;
    if ((rc = unary(&b, "Relu", "relu", x, &x))) goto fail;
    Onnx__NodeProto *pool = node(&b, "MaxPool", "maxpool", 1, x);
    if (!pool) {
        rc = RN_ENOMEM;
        goto fail;
    }
    const int64_t k3[2] = {3, 3}, s2[2] = {2, 2}, p1[4] = {1, 1, 1, 1};
    if ((rc = attr_ints(&b, pool, "kernel_shape", 2, k3))) goto fail;
    if ((rc = attr_ints(&b, pool, "strides", 2, s2))) goto fail;
    if ((rc = attr_ints(&b, pool, "pads", 4, p1))) goto fail;
    if ((rc = qdq(&b, pool->output[0], b.q ? b.q->unit[0] : 0, 0, &x))) goto fail;
    for (int k = 0; k < net.nblocks; k++)
        if ((rc = block(&b, c, &net, k, x, folded, &x))) goto fail;
    if ((rc = unary(&b, "GlobalAveragePool", "avgpool", x, &x))) goto fail;
    if ((rc = qdq(&b, x, b.q ? b.q->pooled : 0, 0, &x))) goto fail;
    Onnx__NodeProto *flat = node(&b, "Flatten", "flatten", 1, x);
    if (!flat) {
        rc = RN_ENOMEM;
        goto fail;
    }
    if ((rc = attr_int(&b, flat, "axis", 1))) goto fail;
    const rn_ptensor *fcw = NULL;
    if (b.q) {
        if (!(fcw = rn_ckpt_find(c, "fc.weight")) || !rn_ptensor_f32(fcw) || fcw->n_shape != 2) {
            rc = rn_errorf(RN_ECORRUPT, "checkpoint lacks F32 tensor fc.weight");
            goto fail;
        }
        rc = quant_weight(&b, "fc.weight", rn_ptensor_f32(fcw), 2, fcw->shape);
    } else
        rc = ckpt_init(&b, c, "fc", "weight", NULL);
    if (rc) goto fail;
    if ((rc = ckpt_init(&b, c, "fc", "bias", NULL))) goto fail;
    Onnx__NodeProto *fc = node(&b, "Gemm", "fc", 3, flat->output[0], "fc.weight", "fc.bias");
    if (!fc) {
        rc = RN_ENOMEM;
        goto fail;
    }
    if ((rc = attr_int(&b, fc, "transB", 1))) goto fail;
    /* the graph output is the fc node's value, renamed */
    fc->output[0] = "logits";
    if ((rc = metadata(&b, &m, c, &net, o->preprocess))) goto fail;
    g.node = b.node;
    g.n_node = b.nnode;
    g.initializer = b.init;
    g.n_initializer = b.ninit;

    size_t n = onnx__model_proto__get_packed_size(&m);
    /* protobuf messages are limited to 2 GiB (int32 sizes in every reader) */
    if (n > (size_t)INT32_MAX) {
        rc = rn_errorf(RN_EINVAL, "%s with %d classes makes a %.1f GiB ONNX model, over protobuf's 2 GiB limit",
                       net.arch, net.num_classes, (double)n / (1 << 30));
        goto fail;
    }
    uint8_t *buf = rn_malloc(n ? n : 1);
    if (!buf) {
        rc = RN_ENOMEM;
        goto fail;
    }
    onnx__model_proto__pack(&m, buf);
    *out = buf;
    *len = n;
fail:
    builder_free(&b);
    return rc;
}

int rn_onnx_export(const rn_ckpt *c, const rn_onnx_opts *o, const char *path) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = rn_onnx_build(c, o, &buf, &len);
    if (rc == RN_OK) rc = rn_file_write_atomic(path, buf, len);
    free(buf);
    return rc;
}
