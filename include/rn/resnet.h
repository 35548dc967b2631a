/* rn/resnet.h: the ResNet family as data.
 *
 * A network is an array of conv+BN units and an array of residual blocks that name
 * them, built from the arch name. The tensor list (rn_resnet_tensors) gives every
 * parameter and buffer with torchvision's name, shape and state_dict order, so a
 * checkpoint, a safetensors file and torchvision's state_dict line up one to one.
 * ResNet-50/101/152 are v1.5: the stride sits on the 3x3 conv of a bottleneck. */
#ifndef RN_RESNET_H
#define RN_RESNET_H

#include <stdint.h>

#define RN_MAX_CONVS 160
#define RN_MAX_BLOCKS 52
/* The most classes a network may have: a million (resnet50's fc is then 8 GB). Larger
 * counts come from corrupt or hostile files, never from a dataset. */
#define RN_MAX_CLASSES 1000000

/* One convolution (no bias) followed by BatchNorm. */
typedef struct {
    char conv[48]; /* torchvision module name of the conv, e.g. "layer1.0.conv2" */
    char bn[48];   /* and of its BN, e.g. "layer1.0.bn2" or "layer1.0.downsample.1" */
    int cin, cout, k, stride, pad;
} rn_convbn;

/* A residual block: out = relu(main(x) + shortcut(x)). */
typedef struct {
    int conv[3]; /* indices into rn_resnet.units: 2 for basic blocks, 3 for bottlenecks */
    int nconv;
    int down;    /* index of the downsample unit, or -1 for an identity shortcut */
} rn_block;

typedef struct {
    char arch[16];
    int num_classes;
    int bottleneck;       /* 1 for resnet50/101/152 */
    int nunits;
    rn_convbn units[RN_MAX_CONVS]; /* units[0] is the stem conv1/bn1 (7x7/2) */
    int nblocks;
    rn_block blocks[RN_MAX_BLOCKS];
    int fc_in;            /* 512 * expansion */
} rn_resnet;

/* Kinds of tensors, so init and optimiser options (e.g. no decay on BN) can tell them apart. */
typedef enum {
    RN_T_CONV_W,  /* (cout, cin, k, k) */
    RN_T_BN_W,    /* (c) gamma */
    RN_T_BN_B,    /* (c) beta */
    RN_T_BN_MEAN, /* (c) buffer */
    RN_T_BN_VAR,  /* (c) buffer */
    RN_T_BN_COUNT,/* () I64 buffer num_batches_tracked */
    RN_T_FC_W,    /* (classes, fc_in) */
    RN_T_FC_B,    /* (classes) */
} rn_tensor_kind;

typedef struct {
    char name[64];
    rn_tensor_kind kind;
    int ndim;
    int64_t shape[4];
    int is_buffer; /* running_mean, running_var, num_batches_tracked */
    int unit;      /* conv/BN unit index, -1 for fc */
} rn_tensor_desc;

/* Names of the supported archs, NULL-terminated. */
extern const char *const rn_resnet_archs[];

/* Build the network description for arch ("resnet18".."resnet152") with num_classes
 * outputs. Errors: RN_EINVAL (unknown arch: message lists the known ones; classes < 1
 * or over RN_MAX_CLASSES). */
int rn_resnet_build(rn_resnet *net, const char *arch, int num_classes);

/* Every tensor in torchvision state_dict order. *out is malloc'ed (caller frees);
 * params and buffers are interleaved per module as in state_dict. Errors: RN_ENOMEM. */
int rn_resnet_tensors(const rn_resnet *net, rn_tensor_desc **out, int *n);

/* Number of trainable parameters (resnet50/1000: 25,557,032). */
int64_t rn_resnet_param_count(const rn_resnet *net);

#endif
