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
 * input's layout and normalisation in words), "producer" "rn-export", "rn_version",
 * "quantization" ("none (float32)" or the int8 scheme in words). */
#ifndef RN_ONNX_H
#define RN_ONNX_H

#include <stddef.h>
#include <stdint.h>

#include "rn/ckpt.h"
#include "rn/resnet.h"

#define RN_ONNX_OPSET 17
#define RN_ONNX_IR_VERSION 8

/* Activation ranges for an int8 model, from rn_onnx_calibrate: the largest magnitude
 * (minmax) or a percentile of the magnitudes of each tensor that feeds a Conv or the
 * Gemm, over the calibration images. */
typedef struct {
    float input;              /* the normalised input (signed: int8 symmetric) */
    float unit[RN_MAX_CONVS]; /* unit i's output after its ReLU (a block's last unit:
                                 after the add and ReLU); downsample units unused */
    float pooled;             /* GlobalAveragePool's output */
} rn_onnx_ranges;

enum { RN_CALIB_MINMAX = 0, RN_CALIB_PERCENTILE = 1 };

typedef struct {
    const char *data; /* an rn dataset (rn-prep), read with rn-eval's transform */
    int batches;      /* batches of `batch` images from the start (fewer if it ends) */
    int batch, crop, workers, threads;
    int resize;        /* shorter side before the crop, as rn-eval's --resize (-1: rn's
                          default round(crop*256/224); 0: none) */
    int method;        /* RN_CALIB_MINMAX or RN_CALIB_PERCENTILE */
    double percentile; /* e.g. 99.99: the range covers this share of the magnitudes */
} rn_onnx_calib_opts;

typedef struct {
    int fold_bn;    /* fold BatchNormalization into the convs */
    int preprocess; /* uint8 NHWC input, normalised inside the graph */
    /* non-NULL: static int8 QDQ model (BN folded whatever fold_bn says): weights int8
       symmetric per output channel (DequantizeLinear axis 0, scale max|w|/127), the
       input int8 symmetric (scale range/127), ReLU outputs and the pooled features
       uint8 with zero point 0 (scale range/255), each through QuantizeLinear and
       DequantizeLinear before the Conv or Gemm that reads it; biases, Add and the
       pooling stay float. The stem's MaxPool output takes the stem's scale. */
    const rn_onnx_ranges *int8;
} rn_onnx_opts;

/* Run c in inference (running BN statistics) on o->batches batches of o->data on the
 * CPU and measure the ranges an int8 model quantises with. Errors: those of the loader
 * and the network (RN_EDATA, RN_EIO, RN_ENOMEM), RN_EINVAL (bad options). */
int rn_onnx_calibrate(const rn_ckpt *c, const rn_onnx_calib_opts *o, rn_onnx_ranges *out);

/* The serialized ModelProto of checkpoint c (validated, as from rn_ckpt_read) into a
 * malloc'ed buffer *out of *len bytes (caller frees). Errors: RN_ECORRUPT (a tensor
 * missing from c), RN_EINVAL (a model over protobuf's 2 GiB message limit), RN_ENOMEM. */
int rn_onnx_build(const rn_ckpt *c, const rn_onnx_opts *o, uint8_t **out, size_t *len);

/* rn_onnx_build, then the bytes written atomically to path (rn_file_write_atomic;
 * "-" = stdout): on failure an existing path is left as it was. Errors: as
 * rn_onnx_build, RN_EIO. */
int rn_onnx_export(const rn_ckpt *c, const rn_onnx_opts *o, const char *path);

#endif
