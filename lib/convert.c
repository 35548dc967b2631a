#include "rn/convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/tensor.h"

void rn_guess_arch(const rn_safetensors *st, char arch[16]) {
    arch[0] = 0;
    if (!rn_st_find(st, "conv1.weight") || !rn_st_find(st, "layer4.0.conv1.weight")) return;
    int bottleneck = rn_st_find(st, "layer1.0.conv3.weight") != NULL;
    int n3 = 0;
    char name[64];
    for (;;) {
        snprintf(name, sizeof name, "layer3.%d.conv1.weight", n3);
        if (!rn_st_find(st, name)) break;
        n3++;
    }
    const char *a = "";
    if (!bottleneck) a = n3 == 2 ? "resnet18" : n3 == 6 ? "resnet34" : "";
    else a = n3 == 6 ? "resnet50" : n3 == 23 ? "resnet101" : n3 == 36 ? "resnet152" : "";
    snprintf(arch, 16, "%s", a);
}

static int convert(const rn_st_tensor *s, rn_ptensor *t) {
    size_t n = t->data.len / rn_dtype_size((int)t->dtype);
    if (t->dtype == RN__DTYPE__I64) {
        int64_t *o = (int64_t *)(void *)t->data.data;
        if (s->dtype == RN_I64) memcpy(o, s->data, 8 * n);
        else if (s->dtype == RN_I32)
            for (size_t i = 0; i < n; i++) {
                int32_t v;
                memcpy(&v, s->data + 4 * i, 4);
                o[i] = v;
            }
        else return rn_errorf(RN_ECORRUPT, "tensor %s: dtype %s, expected I64", s->name, rn_dtype_name(s->dtype));
        return RN_OK;
    }
    float *o = rn_ptensor_f32(t);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        switch (s->dtype) {
        case RN_F32: memcpy(&o[i], s->data + 4 * i, 4); break;
        case RN_F16: memcpy(&h, s->data + 2 * i, 2); o[i] = rn_f16_to_f32(h); break;
        case RN_BF16: memcpy(&h, s->data + 2 * i, 2); o[i] = rn_bf16_to_f32(h); break;
        default:
            return rn_errorf(RN_ECORRUPT, "tensor %s: dtype %s, expected F32, F16 or BF16", s->name,
                             rn_dtype_name(s->dtype));
        }
    }
    return RN_OK;
}

static int same_shape(const rn_st_tensor *s, const rn_ptensor *t) {
    if ((size_t)s->ndim != t->n_shape) return 0;
    for (int i = 0; i < s->ndim; i++)
        if (s->shape[i] != t->shape[i]) return 0;
    return 1;
}

/* append to a bounded problem list; counts every problem, lists the first few */
static void problem(char *buf, size_t cap, int *count, const char *fmt, const char *name) {
    if (++*count <= 12) {
        size_t n = strlen(buf);
        snprintf(buf + n, cap - n, fmt, name);
    }
}

int rn_ckpt_from_safetensors(const rn_safetensors *st, const char *arch, int reset_fc, uint64_t seed,
                             rn_ckpt **out) {
    char guessed[16];
    if (!arch || !*arch) arch = rn_st_meta(st, "arch");
    if (!arch || !*arch) {
        rn_guess_arch(st, guessed);
        if (!*guessed)
            return rn_errorf(RN_EINVAL, "cannot tell the arch from the tensor names (not a torchvision ResNet "
                                        "state_dict?); give --arch");
        arch = guessed;
    }
    int classes = reset_fc;
    if (classes <= 0) {
        const rn_st_tensor *fc = rn_st_find(st, "fc.weight");
        if (!fc || fc->ndim != 2)
            return rn_errorf(RN_ECORRUPT, "fc.weight is missing or not 2-D: cannot tell the number of classes "
                                          "(use --reset-fc N for a new classifier)");
        /* the shape is checked against the arch before it sizes anything: a header saying
           (3000000, 0) once had 6 GB allocated before the shapes were compared */
        rn_resnet probe;
        int rc = rn_resnet_build(&probe, arch, 1);
        if (rc) return rc;
        if (fc->shape[1] != probe.fc_in || fc->shape[0] < 1 || fc->shape[0] > RN_MAX_CLASSES)
            return rn_errorf(RN_ECORRUPT, "fc.weight has shape (%lld, %lld); %s's classifier is (classes, %d) with 1 to "
                             "%d classes", (long long)fc->shape[0], (long long)fc->shape[1], arch, probe.fc_in,
                             RN_MAX_CLASSES);
        classes = (int)fc->shape[0];
    }
    rn_resnet net;
    int rc = rn_resnet_build(&net, arch, classes);
    if (rc) return rc;
    rn_ckpt *c = NULL;
    if ((rc = rn_ckpt_new(&net, &c))) return rc;
    char list[2048] = "";
    int nbad = 0;
    size_t total = c->n_params + c->n_buffers;
    for (size_t i = 0; i < total && rc == RN_OK; i++) {
        rn_ptensor *t = i < c->n_params ? c->params[i] : c->buffers[i - c->n_params];
        if (reset_fc > 0 && strncmp(t->name, "fc.", 3) == 0) continue;
        const rn_st_tensor *s = rn_st_find(st, t->name);
        if (!s) problem(list, sizeof list, &nbad, " missing %s;", t->name);
        else if (!same_shape(s, t)) problem(list, sizeof list, &nbad, " wrong shape %s;", t->name);
        else rc = convert(s, t);
    }
    for (int i = 0; i < st->n && rc == RN_OK; i++) {
        if (reset_fc > 0 && strncmp(st->t[i].name, "fc.", 3) == 0) continue;
        if (!rn_ckpt_find(c, st->t[i].name)) problem(list, sizeof list, &nbad, " unexpected %s;", st->t[i].name);
    }
    if (rc == RN_OK && nbad)
        rc = rn_errorf(RN_ECORRUPT, "%d tensor(s) do not fit %s with %d classes:%s%s", nbad, arch, classes, list,
                       nbad > 12 ? " ..." : "");
    if (rc == RN_OK && reset_fc > 0) rc = rn_ckpt_init_prefix(c, &net, seed, "fc.");
    if (rc) {
        rn_ckpt_free(c);
        return rc;
    }
    *out = c;
    return RN_OK;
}

int rn_ckpt_export_safetensors(const rn_ckpt *c, const char *path) {
    rn_resnet net;
    int rc = rn_ckpt_net(c, &net);
    if (rc) return rc;
    rn_tensor_desc *d = NULL;
    int n = 0;
    if ((rc = rn_resnet_tensors(&net, &d, &n))) return rc;
    rn_st_tensor *t = rn_calloc((size_t)n, sizeof *t);
    if (!t) {
        free(d);
        return RN_ENOMEM;
    }
    for (int i = 0; i < n && rc == RN_OK; i++) {
        const rn_ptensor *p = rn_ckpt_find(c, d[i].name);
        if (!p) {
            rc = rn_errorf(RN_ECORRUPT, "checkpoint lacks %s", d[i].name);
            break;
        }
        t[i].name = p->name;
        t[i].dtype = (int)p->dtype;
        t[i].ndim = (int)p->n_shape;
        if (p->n_shape) memcpy(t[i].shape, p->shape, sizeof(int64_t) * p->n_shape);
        t[i].data = p->data.data;
        t[i].nbytes = p->data.len;
    }
    char classes[16];
    snprintf(classes, sizeof classes, "%d", net.num_classes);
    const char *keys[] = {"format", "arch", "num_classes", "zero_init_residual", "rn_version"};
    const char *vals[] = {"pt", net.arch, classes, c->model->zero_init_residual ? "true" : "false", RN_VERSION};
    if (rc == RN_OK) rc = rn_st_write(path, t, n, keys, vals, 5);
    free(t);
    free(d);
    return rc;
}
