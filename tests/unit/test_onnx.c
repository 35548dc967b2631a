/* rn_onnx_build: the model parses back with the ONNX schema, and its graph is the
 * ResNet the options ask for (opset, inputs and outputs, node kinds and order, names,
 * initializers, metadata, folding, int8 weights). The runtime checks are in
 * tests/export-onnx.bats. */
#include <string.h>

#include "check.h"
#include "onnx.pb-c.h"
#include "rn/ckpt.h"
#include "rn/err.h"
#include "rn/onnx.h"

static int count_op(const Onnx__GraphProto *g, const char *op) {
    int n = 0;
    for (size_t i = 0; i < g->n_node; i++)
        n += strcmp(g->node[i]->op_type, op) == 0;
    return n;
}

static const Onnx__TensorProto *find_init(const Onnx__GraphProto *g, const char *name) {
    for (size_t i = 0; i < g->n_initializer; i++)
        if (strcmp(g->initializer[i]->name, name) == 0) return g->initializer[i];
    return NULL;
}

static const char *meta(const Onnx__ModelProto *m, const char *key) {
    for (size_t i = 0; i < m->n_metadata_props; i++)
        if (strcmp(m->metadata_props[i]->key, key) == 0) return m->metadata_props[i]->value;
    return NULL;
}

/* every node input is the graph input, an initializer or an earlier node's output */
static int topological(const Onnx__GraphProto *g) {
    for (size_t i = 0; i < g->n_node; i++)
        for (size_t k = 0; k < g->node[i]->n_input; k++) {
            const char *v = g->node[i]->input[k];
            int ok = strcmp(v, g->input[0]->name) == 0 || find_init(g, v) != NULL;
            for (size_t j = 0; j < i && !ok; j++)
                ok = strcmp(g->node[j]->output[0], v) == 0;
            if (!ok) {
                fprintf(stderr, "node %s reads %s before it exists\n", g->node[i]->name, v);
                return 0;
            }
        }
    return 1;
}

static Onnx__ModelProto *build(const rn_ckpt *c, rn_onnx_opts o) {
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_OK(rn_onnx_build(c, &o, &buf, &len));
    Onnx__ModelProto *m = buf ? onnx__model_proto__unpack(NULL, len, buf) : NULL;
    free(buf);
    CHECK(m != NULL, "the model parses back");
    return m;
}

static void test_plain(const rn_ckpt *c) {
    Onnx__ModelProto *m = build(c, (rn_onnx_opts){0});
    if (!m) return;
    const Onnx__GraphProto *g = m->graph;
    CHECK(m->ir_version == RN_ONNX_IR_VERSION && m->n_opset_import == 1 && m->opset_import[0]->version == RN_ONNX_OPSET,
          "ir %lld opset", (long long)m->ir_version);
    CHECK(g->n_input == 1 && strcmp(g->input[0]->name, "input") == 0, "input");
    const Onnx__TensorShapeProto *s = g->input[0]->type->tensor_type->shape;
    CHECK(g->input[0]->type->tensor_type->elem_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && s->n_dim == 4 &&
              strcmp(s->dim[0]->dim_param, "N") == 0 && s->dim[1]->dim_value == 3,
          "input float (N, 3, H, W)");
    CHECK(g->n_output == 1 && strcmp(g->output[0]->name, "logits") == 0 &&
              g->output[0]->type->tensor_type->shape->dim[1]->dim_value == 10,
          "output logits (N, 10)");
    /* resnet18: 20 convs each with a BN, 17 ReLUs (stem, 8 blocks x 2), 8 adds */
    CHECK(count_op(g, "Conv") == 20 && count_op(g, "BatchNormalization") == 20, "convs and BNs");
    CHECK(count_op(g, "Relu") == 17 && count_op(g, "Add") == 8 && count_op(g, "MaxPool") == 1 &&
              count_op(g, "GlobalAveragePool") == 1 && count_op(g, "Gemm") == 1,
          "relu %d add %d", count_op(g, "Relu"), count_op(g, "Add"));
    CHECK(strcmp(g->node[g->n_node - 1]->output[0], "logits") == 0, "the Gemm makes logits");
    CHECK(topological(g), "nodes in order");
    const Onnx__TensorProto *t = find_init(g, "layer2.0.downsample.1.running_var");
    CHECK(t && t->n_dims == 1 && t->dims[0] == 128 && t->raw_data.len == 128 * 4, "a BN buffer by its name");
    CHECK(find_init(g, "layer1.0.bn1.num_batches_tracked") == NULL, "no num_batches_tracked");
    t = find_init(g, "conv1.weight");
    const rn_ptensor *p = rn_ckpt_find(c, "conv1.weight");
    CHECK(t && p && t->raw_data.len == p->data.len && memcmp(t->raw_data.data, p->data.data, p->data.len) == 0,
          "conv1.weight is the checkpoint's bytes");
    CHECK(strcmp(meta(m, "arch"), "resnet18") == 0 && strcmp(meta(m, "num_classes"), "10") == 0, "metadata");
    CHECK(strcmp(meta(m, "class_names"),
                 "[\"c0\",\"c1\",\"c\\\"2\",\"c3\",\"c4\",\"c5\",\"c6\",\"c7\",\"c8\",\"c9\"]") == 0,
          "class_names %s", meta(m, "class_names"));
    onnx__model_proto__free_unpacked(m, NULL);
}

static void test_fold_preprocess(const rn_ckpt *c) {
    Onnx__ModelProto *m = build(c, (rn_onnx_opts){.fold_bn = 1, .preprocess = 1});
    if (!m) return;
    const Onnx__GraphProto *g = m->graph;
    CHECK(count_op(g, "BatchNormalization") == 0 && count_op(g, "Conv") == 20, "BN folded");
    CHECK(find_init(g, "layer1.0.conv1.bias") && !find_init(g, "layer1.0.bn1.weight"), "folded names");
    CHECK(g->input[0]->type->tensor_type->elem_type == ONNX__TENSOR_PROTO__DATA_TYPE__UINT8 &&
              g->input[0]->type->tensor_type->shape->dim[3]->dim_value == 3,
          "uint8 NHWC input");
    CHECK(strcmp(g->node[0]->op_type, "Cast") == 0 && strcmp(g->node[4]->op_type, "Transpose") == 0,
          "Cast ... Transpose first");
    CHECK(topological(g), "nodes in order");
    /* bn1: gamma 2, var 3, mean 0.5, beta 0.25: w' = w * 2/sqrt(3 + 1e-5), b' = 0.25 - 0.5 * 2/sqrt(3 + 1e-5) */
    const Onnx__TensorProto *w = find_init(g, "conv1.weight"), *b = find_init(g, "conv1.bias");
    const float *w0 = rn_ptensor_f32(rn_ckpt_find(c, "conv1.weight"));
    float wf, bf;
    memcpy(&wf, w->raw_data.data, 4);
    memcpy(&bf, b->raw_data.data, 4);
    double s = 2.0 / sqrt(3.0 + 1e-5);
    CHECK(fabs(wf - w0[0] * s) <= 1e-6 * fabs(w0[0] * s) && fabs(bf - (0.25 - 0.5 * s)) < 1e-6, "folded %g %g", wf, bf);
    onnx__model_proto__free_unpacked(m, NULL);
}

static void test_int8(const rn_ckpt *c) {
    rn_onnx_ranges r = {.input = 2.5f, .pooled = 1};
    for (int i = 0; i < RN_MAX_CONVS; i++)
        r.unit[i] = 4;
    Onnx__ModelProto *m = build(c, (rn_onnx_opts){.int8 = &r});
    if (!m) return;
    const Onnx__GraphProto *g = m->graph;
    CHECK(count_op(g, "BatchNormalization") == 0, "int8 folds BN");
    /* input, stem (after the pool), 8 blocks x 2 (inner ReLU, block output), pooled */
    CHECK(count_op(g, "QuantizeLinear") == 19, "activation QDQ pairs: %d", count_op(g, "QuantizeLinear"));
    CHECK(count_op(g, "DequantizeLinear") == 19 + 21, "DQ: activations and 21 weights");
    const Onnx__TensorProto *q = find_init(g, "layer1.0.conv1.weight_quantized");
    const Onnx__TensorProto *sc = find_init(g, "layer1.0.conv1.weight_scale");
    CHECK(q && q->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT8 && q->raw_data.len == 64 * 64 * 9, "int8 weight");
    CHECK(sc && sc->n_dims == 1 && sc->dims[0] == 64, "per-channel scale");
    int peak = 0;
    for (size_t i = 0; q && i < 64 * 9; i++)
        peak |= (int8_t)q->raw_data.data[i] == 127 || (int8_t)q->raw_data.data[i] == -127;
    CHECK(peak, "the largest weight of channel 0 maps to +-127");
    const Onnx__TensorProto *is = find_init(g, "input.scale");
    float v = 0;
    if (is) memcpy(&v, is->raw_data.data, 4);
    CHECK(is && v == 2.5f / 127, "input scale %g", v);
    CHECK(find_init(g, "avgpool.scale") != NULL && find_init(g, "fc.weight_quantized") != NULL, "fc quantised");
    CHECK(topological(g), "nodes in order");
    CHECK(strncmp(meta(m, "quantization"), "int8 QDQ", 8) == 0, "quantization metadata");
    onnx__model_proto__free_unpacked(m, NULL);
}

int main(void) {
    rn_resnet net;
    rn_ckpt *c = NULL;
    CHECK_OK(rn_resnet_build(&net, "resnet18", 10));
    CHECK_OK(rn_ckpt_new(&net, &c));
    CHECK_OK(rn_ckpt_init(c, &net, 7, 0));
    if (!c) return check_done("test_onnx");
    c->class_names = calloc(10, sizeof(char *));
    c->n_class_names = 10;
    for (int i = 0; i < 10; i++) {
        char name[8];
        snprintf(name, sizeof name, i == 2 ? "c\"%d" : "c%d", i);
        c->class_names[i] = strdup(name);
    }
    const char *bn[4] = {"bn1.weight", "bn1.running_var", "bn1.running_mean", "bn1.bias"};
    const float val[4] = {2, 3, 0.5f, 0.25f};
    for (int k = 0; k < 4; k++) {
        float *p = rn_ptensor_f32(rn_ckpt_find(c, bn[k]));
        for (int i = 0; i < 64; i++)
            p[i] = val[k];
    }
    test_plain(c);
    test_fold_preprocess(c);
    test_int8(c);
    rn_ckpt_free(c);
    return check_done("test_onnx");
}
