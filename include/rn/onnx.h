/* rn/onnx.h: a checkpoint as an ONNX inference model (proto/onnx.proto), for runtimes
 * outside rn (onnxruntime, TensorRT, OpenVINO ...).
 *
 * The graph is torchvision's ResNet in eval mode (v1.5: stride on the 3x3 conv of a
 * bottleneck), opset 17, IR version 8, operators Conv, BatchNormalization
 * (epsilon 1e-5, running statistics), Relu, MaxPool, Add, GlobalAveragePool, Flatten
 * and Gemm. Initializers carry torchvision's names (conv1.weight,
 * layer1.0.bn1.running_mean, fc.bias ...); a node is named after its module
 * (layer1.0.conv1, layer1.0.downsample.1), its output value likewise.
 *
 *   input   float (N, 3, H, W), normalised as rn normalises ((x/255 - mean) / std,
 *           ImageNet mean/std); N, H and W are symbolic (dim_param "N", "H", "W"),
 *           so any batch and any image size runs (GlobalAveragePool before fc)
 *   logits  float (N, num_classes), before softmax
 *
 * Options:
 *   fold_bn     each BN folded into its conv: weight * gamma/sqrt(var + eps) per
 *               output channel and a bias beta - mean * gamma/sqrt(var + eps) (computed
 *               in double), named <conv>.weight and <conv>.bias; no BatchNormalization
 *   preprocess  input is uint8 (N, H, W, 3), the pixels rn's loader produces (RGB,
 *               channels last); the graph does rn's normalisation itself, in rn's order
 *               and in float: Cast, Div 255, Sub mean, Div std, Transpose to NCHW,
 *               with initializers preprocess.scale (255), preprocess.mean and
 *               preprocess.std (3 values each)
 *
 * metadata_props: "arch" (resnet50), "num_classes" (decimal), "class_names" (a JSON
 * array of strings, index = class; [] when the checkpoint has none), "input" (the
 * input's layout and normalisation in words), "producer" "rn-export", "rn_version". */
#ifndef RN_ONNX_H
#define RN_ONNX_H

#include <stddef.h>
#include <stdint.h>

#include "rn/ckpt.h"

#define RN_ONNX_OPSET 17
#define RN_ONNX_IR_VERSION 8

typedef struct {
    int fold_bn;    /* fold BatchNormalization into the convs */
    int preprocess; /* uint8 NHWC input, normalised inside the graph */
} rn_onnx_opts;

/* The serialized ModelProto of checkpoint c (validated, as from rn_ckpt_read) into a
 * malloc'ed buffer *out of *len bytes (caller frees). Errors: RN_ECORRUPT (a tensor
 * missing from c), RN_EINVAL (a model over protobuf's 2 GiB message limit), RN_ENOMEM. */
int rn_onnx_build(const rn_ckpt *c, const rn_onnx_opts *o, uint8_t **out, size_t *len);

/* rn_onnx_build, then the bytes written atomically to path (rn_file_write_atomic;
 * "-" = stdout): on failure an existing path is left as it was. Errors: as
 * rn_onnx_build, RN_EIO. */
int rn_onnx_export(const rn_ckpt *c, const rn_onnx_opts *o, const char *path);

#endif
