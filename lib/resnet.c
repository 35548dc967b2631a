#include "rn/resnet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/err.h"

const char *const rn_resnet_archs[] = {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", NULL};

static const struct {
    const char *name;
    int bottleneck;
    int layers[4];
} archs[] = {
    {"resnet18", 0, {2, 2, 2, 2}},   {"resnet34", 0, {3, 4, 6, 3}},  {"resnet50", 1, {3, 4, 6, 3}},
    {"resnet101", 1, {3, 4, 23, 3}}, {"resnet152", 1, {3, 8, 36, 3}},
};

static int add_unit(rn_resnet *net, const char *conv, const char *bn, int cin, int cout, int k, int stride) {
    rn_convbn *u = &net->units[net->nunits];
    snprintf(u->conv, sizeof u->conv, "%s", conv);
    snprintf(u->bn, sizeof u->bn, "%s", bn);
    u->cin = cin;
    u->cout = cout;
    u->k = k;
    u->stride = stride;
    u->pad = k / 2;
    return net->nunits++;
}

int rn_resnet_build(rn_resnet *net, const char *arch, int num_classes) {
    int a = -1;
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
        if (strcmp(arch, archs[i].name) == 0) a = (int)i;
    if (a < 0)
        return rn_errorf(RN_EINVAL, "unknown arch '%s' (known: resnet18, resnet34, resnet50, resnet101, resnet152)",
                         arch);
    if (num_classes < 1 || num_classes > RN_MAX_CLASSES)
        return rn_errorf(RN_EINVAL, "number of classes must be 1..%d, not %d", RN_MAX_CLASSES, num_classes);
    memset(net, 0, sizeof *net);
    snprintf(net->arch, sizeof net->arch, "%s", arch);
    net->num_classes = num_classes;
    net->bottleneck = archs[a].bottleneck;
    int expansion = net->bottleneck ? 4 : 1;
    add_unit(net, "conv1", "bn1", 3, 64, 7, 2);
    int inplanes = 64;
    char c[48], b[48];
    for (int l = 0; l < 4; l++) {
        int planes = 64 << l;
        for (int i = 0; i < archs[a].layers[l]; i++) {
            int stride = (i == 0 && l > 0) ? 2 : 1;
            rn_block *blk = &net->blocks[net->nblocks++];
            blk->down = -1;
            int cin = inplanes;
            if (net->bottleneck) {
                int ks[3] = {1, 3, 1}, outs[3] = {planes, planes, planes * 4};
                for (int j = 0; j < 3; j++) {
                    snprintf(c, sizeof c, "layer%d.%d.conv%d", l + 1, i, j + 1);
                    snprintf(b, sizeof b, "layer%d.%d.bn%d", l + 1, i, j + 1);
                    /* v1.5: the stride is on the 3x3 conv */
                    blk->conv[j] = add_unit(net, c, b, cin, outs[j], ks[j], j == 1 ? stride : 1);
                    cin = outs[j];
                }
                blk->nconv = 3;
            } else {
                for (int j = 0; j < 2; j++) {
                    snprintf(c, sizeof c, "layer%d.%d.conv%d", l + 1, i, j + 1);
                    snprintf(b, sizeof b, "layer%d.%d.bn%d", l + 1, i, j + 1);
                    blk->conv[j] = add_unit(net, c, b, cin, planes, 3, j == 0 ? stride : 1);
                    cin = planes;
                }
                blk->nconv = 2;
            }
            if (stride != 1 || inplanes != planes * expansion) {
                snprintf(c, sizeof c, "layer%d.%d.downsample.0", l + 1, i);
                snprintf(b, sizeof b, "layer%d.%d.downsample.1", l + 1, i);
                blk->down = add_unit(net, c, b, inplanes, planes * expansion, 1, stride);
                net->units[blk->down].pad = 0;
            }
            inplanes = planes * expansion;
        }
    }
    net->fc_in = 512 * expansion;
    return RN_OK;
}

static void desc(rn_tensor_desc *d, const char *module, const char *leaf, rn_tensor_kind kind, int unit, int ndim,
                 int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s.%s", module, leaf);
    d->kind = kind;
    d->unit = unit;
    d->ndim = ndim;
    d->shape[0] = s0;
    d->shape[1] = s1;
    d->shape[2] = s2;
    d->shape[3] = s3;
    d->is_buffer = kind == RN_T_BN_MEAN || kind == RN_T_BN_VAR || kind == RN_T_BN_COUNT;
}

/* state_dict order follows module registration: per block conv1, bn1, conv2, bn2,
 * (conv3, bn3,) downsample; the units array was filled in that same order. */
int rn_resnet_tensors(const rn_resnet *net, rn_tensor_desc **out, int *n) {
    rn_tensor_desc *t = rn_calloc((size_t)net->nunits * 6 + 2, sizeof *t);
    if (!t) return RN_ENOMEM;
    int k = 0;
    for (int u = 0; u < net->nunits; u++) {
        const rn_convbn *cb = &net->units[u];
        desc(&t[k++], cb->conv, "weight", RN_T_CONV_W, u, 4, cb->cout, cb->cin, cb->k, cb->k);
        desc(&t[k++], cb->bn, "weight", RN_T_BN_W, u, 1, cb->cout, 0, 0, 0);
        desc(&t[k++], cb->bn, "bias", RN_T_BN_B, u, 1, cb->cout, 0, 0, 0);
        desc(&t[k++], cb->bn, "running_mean", RN_T_BN_MEAN, u, 1, cb->cout, 0, 0, 0);
        desc(&t[k++], cb->bn, "running_var", RN_T_BN_VAR, u, 1, cb->cout, 0, 0, 0);
        desc(&t[k++], cb->bn, "num_batches_tracked", RN_T_BN_COUNT, u, 0, 0, 0, 0, 0);
    }
    desc(&t[k++], "fc", "weight", RN_T_FC_W, -1, 2, net->num_classes, net->fc_in, 0, 0);
    desc(&t[k++], "fc", "bias", RN_T_FC_B, -1, 1, net->num_classes, 0, 0, 0);
    *out = t;
    *n = k;
    return RN_OK;
}

int64_t rn_resnet_param_count(const rn_resnet *net) {
    int64_t n = 0;
    for (int u = 0; u < net->nunits; u++) {
        const rn_convbn *cb = &net->units[u];
        n += (int64_t)cb->cout * cb->cin * cb->k * cb->k + 2 * cb->cout;
    }
    return n + (int64_t)net->num_classes * net->fc_in + net->num_classes;
}
