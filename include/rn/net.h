/* rn/net.h: a ResNet on a backend: forward, loss and backward, SGD, and the exchange of
 * weights with checkpoints.
 *
 * The network is run over the layer list of rn/resnet.h and never branches on the
 * device: every op goes through rn/backend.h. Parameters, their gradients and the SGD
 * momentum each live in one flat fp32 allocation in backend memory (conv weights in the
 * backend's OHWI layout; converted from/to torchvision's OIHW only in rn_net_load and
 * rn_net_store), so one optimiser call updates a whole parameter group.
 *
 * Memory plan. Built once for a maximum batch and input size; nothing is allocated
 * afterwards. A training net keeps, per conv+BN unit, the conv output (the BN input)
 * and the BN output (the next conv's input), plus the stem's max-pool output: exactly
 * what backward reads (with RN_NET_RECOMPUTE, only each block's output, the rest
 * recomputed in backward). Gradients flow through four scratch buffers of the largest
 * activation size. An inference net keeps no activations for backward: it rotates five
 * buffers and runs BN in place, so its memory is a fraction of training's; with the
 * folded BN (RN_NET_INFER on the CPU) it also holds a second copy of the parameters, the
 * folded weights and biases.
 * rn_net_bytes() reports the total.
 *
 * Mixed precision (rn_net_create with RN_F16 or RN_BF16, the CUDA backend only):
 * activations and their gradients, the conv and fc layers, pooling and BN's inputs and
 * outputs are in that type, so activation memory halves. Weights stay fp32 masters with
 * fp32 gradients and momentum; the layers read a half-precision compute copy of them
 * that rn_net_load and every SGD step (in the same pass) make. BN's weights, biases and
 * statistics and the loss are fp32: the fc output is cast up for softmax cross-entropy
 * and the logits' gradient cast down, as torch.autocast does. A conv or fc weight
 * gradient comes out of its backward op in half precision and is at once added into
 * its fp32 gradient (so micro-batches accumulate in fp32, as PyTorch's .grad does). */
#ifndef RN_NET_H
#define RN_NET_H

#include <stddef.h>
#include <stdint.h>

#include "rn/backend.h"
#include "rn/ckpt.h"
#include "rn/prof.h"
#include "rn/resnet.h"
#include "rn/scaler.h"
#include "rn/tensor.h"

typedef struct rn_net rn_net;

/* RN_NET_INFER: inference with BatchNorm folded into the convolutions (scaled weights and
 * a bias, computed in double at rn_net_load) and bias, residual and ReLU applied by the
 * conv itself on backends that have rn_conv_bias_fwd (the CPU; elsewhere it is
 * RN_NET_INFER_EXACT). Its logits differ from the exact path's by rounding only.
 * RN_NET_INFER_EXACT: inference through the training ops (conv, then BN with the running
 * statistics), what a training net's evaluation forward computes. */
enum { RN_NET_INFER = 0, RN_NET_TRAIN = 1, RN_NET_INFER_EXACT = 2 };

/* RN_NET_TRAIN | RN_NET_RECOMPUTE: activation checkpointing (rn-train --recompute blocks).
 * A training forward keeps each residual block's output (the next block's input) and BN's
 * saved batch statistics, but the inside of a block (its conv outputs and inner BN
 * outputs, the downsample's) only until the next block overwrites it: every block shares
 * one set of scratch buffers, a slot per position in the block. Backward runs each block's
 * forward again from its kept input just before the block's backward, with the same ops
 * on the same inputs, so z and a come back bit for bit, and its BN recomputes the batch
 * statistics without touching the running ones, num_batches_tracked, a capture
 * (rn_net_bn_capture) or synchronised BN's gathers (the global statistics of the forward
 * are reused). Gradients, weights and BN buffers are then the bits of a net without it,
 * for about one more forward of the blocks per step; rn_net_plan counts the smaller
 * memory. rn_net_unit_output has only the block outputs. Training nets only (RN_EINVAL
 * otherwise). */
enum { RN_NET_RECOMPUTE = 0x100 };

/* A net for up to max_batch images of h x w x 3 on be (which it uses, not owns),
 * computing in dtype: RN_F32, or RN_F16 or RN_BF16 for mixed precision. mode
 * RN_NET_TRAIN (optionally | RN_NET_RECOMPUTE), RN_NET_INFER or RN_NET_INFER_EXACT. Weights are zero until rn_net_load.
 * Errors: RN_EINVAL (input too small for the net: the message gives the minimum; a
 * dtype other than those three), RN_ENOTSUP (be does not compute in dtype: the CPU
 * backend is fp32 only, rn_backend_has_dtype), RN_ENOMEM/RN_EGPU (the message says how
 * many bytes were asked). */
int rn_net_create(rn_backend *be, const rn_resnet *spec, int max_batch, int h, int w, int mode, int dtype,
                  rn_net **out);
void rn_net_destroy(rn_net *net);

/* The bytes of backend memory rn_net_create would hold for these arguments
 * (rn_net_bytes of the net on a context with no workspace yet), without allocating:
 * the plan behind --micro-batch auto and the out-of-memory advice. Exact where
 * rn_backend_workspace_limit is 0 (the CPU); on a GPU the convolution workspace is
 * counted at that limit, an upper bound, because asking cuDNN for a shape's exact need
 * runs its algorithms. Errors as rn_net_create, less the allocation failures. */
int rn_net_plan(rn_backend *be, const rn_resnet *spec, int max_batch, int h, int w, int mode, int dtype,
                size_t *bytes);

/* The floats of a net's parameter array (with the gaps that align each tensor: the
 * length rn_net_grads gives) and of its BN running statistics (rn_net_bn_stats_len), for
 * spec, without building it: what the memory plan counts for buffers of the parameters'
 * size outside the net (rn-train's gradient sum, the EMA weights). Errors: RN_ENOMEM,
 * RN_EINVAL (a spec the net cannot lay out). */
int rn_net_param_floats(const rn_resnet *spec, int64_t *nparams, int64_t *nstats);

/* Bytes of backend memory the net holds (weights, gradients, momentum, activations,
 * workspace). */
size_t rn_net_bytes(const rn_net *net);

/* Copy weights and BN buffers from c (validated, same arch and classes), and the SGD
 * momentum when c has it (else the next step is torch's first step). */
int rn_net_load(rn_net *net, const rn_ckpt *c);
/* Copy weights, BN buffers and momentum (if any step was taken or loaded) into c,
 * allocating c->optim as needed. */
int rn_net_store(rn_net *net, rn_ckpt *c);

/* on != 0: training forwards normalise with BN's running statistics and leave them (and
 * num_batches_tracked) unchanged, and backward treats them as constants; BN weights and
 * biases still learn. PyTorch's model.train() with every BatchNorm put in eval(), as
 * when fine-tuning. Micro-batches then give exactly the gradient of the whole batch. */
void rn_net_freeze_bn(rn_net *net, int on);

/* The input buffer: (max_batch, h, w, 3) NHWC in backend memory, elements of
 * rn_net_dtype (fp32 unless mixed precision), to fill (e.g. with rn_input_normalize)
 * before rn_net_forward. */
void *rn_net_input(rn_net *net);
/* The compute type the net was created with (RN_F32, RN_F16 or RN_BF16). */
int rn_net_dtype(const rn_net *net);

/* Forward n <= max_batch images from rn_net_input. train != 0 (training nets only): BN
 * uses batch statistics and updates its running statistics, and activations are kept
 * for rn_net_backward. train == 0: running statistics, nothing kept. */
int rn_net_forward(rn_net *net, int n, int train);
/* Graph replays (rn/replay.h) run a training forward's device work without its host
 * side. With rn_net_count_by_caller(net, 1) a training forward leaves the BN layers'
 * num_batches_tracked alone and the caller adds one batch with rn_net_count_batch for
 * each training forward of n images, however it ran (eagerly, captured or replayed),
 * which also makes n the last forward's batch (rn_net_unit_output's rows); a frozen,
 * synchronised or capturing (rn_net_bn_capture) net counts nothing there, as its
 * forwards count nothing. rn_net_weights: the buffer the layers read the weights from
 * now (rn_net_ema_swap exchanges it and the BN statistics' for the average's): part of a
 * replay's key. */
void rn_net_count_by_caller(rn_net *net, int on);
void rn_net_count_batch(rn_net *net, int n);
/* mix_weight non-NULL: the training losses read their mixing weight (rn_xent_desc's
 * mix_weight_at: one double in backend memory, in [0, 1]) from there when they run, in
 * place of the mix_weight argument, so that a replayed graph takes each step's; NULL: the
 * argument again. */
void rn_net_set_mix_at(rn_net *net, const double *mix_weight);
const void *rn_net_weights(const rn_net *net);
/* The logits of the last forward: (n, classes) fp32 in backend memory. */
const float *rn_net_logits(const rn_net *net);

/* Loss of the last forward (training or inference) without gradients: *loss is the
 * batch mean of softmax cross-entropy against labels (n, host int32). */
int rn_net_loss(rn_net *net, const int32_t *labels, int n, float label_smoothing, float *loss);

/* Softmax cross-entropy of the last training forward against labels (n, host int32),
 * its mean written to *loss; then the gradients of loss * grad_scale with respect to
 * every parameter, added to the stored gradients when accumulate (micro-batches), else
 * replacing them. Accumulating computes the micro-batch's gradients on their own (in
 * the spare buffer) and then adds them, element by element in fp32, as PyTorch adds each
 * backward into .grad: the sum of K micro-batches is ((g0 + g1) + g2) + ..., the order
 * rn_dist_sum adds ranks in. grad_scale is 1/accum, times the loss scale under fp16.
 * Training nets only. */
int rn_net_backward(rn_net *net, const int32_t *labels, int n, float label_smoothing, float grad_scale,
                    int accumulate, float *loss);
/* rn_net_backward on the soft targets of mixup/cutmix (rn/mix.h): row i's target is its
 * label with weight 1 - mix_weight and row i-1's (the last row's for row 0) with mix_weight,
 * smoothed as torch smooths probability targets (rn/backend.h, rn_xent_desc). mix_weight 0
 * is rn_net_backward exactly. */
int rn_net_backward_mix(rn_net *net, const int32_t *labels, int n, float label_smoothing, double mix_weight,
                        float grad_scale, int accumulate, float *loss);
/* rn_net_backward_mix with the labels (n int32) and the loss (one float) in backend
 * memory: nothing is uploaded and nothing read back, so a device runs on (rn-train keeps
 * each micro-batch's loss on the device and reads them once per log line). */
int rn_net_backward_dev(rn_net *net, const int32_t *labels, int n, float label_smoothing, double mix_weight,
                        float grad_scale, int accumulate, float *loss);

/* Make rn_net_step a LARS step (on 1; off: SGD, the default) with trust coefficient eta
 * and epsilon eps (rn/backend.h, rn_lars_update): conv and fc weights adapted and decayed
 * tensor by tensor, BN parameters and the fc bias plain momentum without weight decay
 * (wd_mode is ignored; nesterov is refused). The momentum buffers then hold LARS's
 * steps: a checkpoint's SGD momentum must not be resumed under LARS (rn_state_optim_kind).
 * Errors: RN_EINVAL (eta or eps negative or not finite). */
int rn_net_set_lars(rn_net *net, int on, double eta, double eps);

/* Gradient clipping for rn_net_step, torch.nn.utils.clip_grad_norm_(max_norm) before the
 * optimiser (torchvision's --clip-grad-norm): the 2-norm of every gradient together (after
 * AMP's unscaling; BN and fc included), in double over fixed chunks (rn_sumsq: the same
 * bits for any thread count, process count and backend), and when it is above max_norm
 * the step takes the gradients times max_norm / (norm + 1e-6). It reads the norm back
 * from the device each step. 0: off (the default). Errors: RN_EINVAL (negative, not
 * finite). */
int rn_net_set_clip(rn_net *net, double max_norm);
/* The last rn_net_step's gradient norm before clipping; NaN when clipping is off or the
 * step was skipped (fp16 overflow). */
double rn_net_grad_norm(const rn_net *net);

/* rn_net_step's weight decay: on every parameter (RN_WD_ALL); not on BN weights and
 * biases nor the fc bias (RN_WD_NO_BN_BIAS, rn-train --no-wd-bn); not on BN weights and
 * biases (RN_WD_NO_NORM, --no-wd-norm: torchvision's --norm-weight-decay 0.0). */
enum { RN_WD_ALL = 0, RN_WD_NO_BN_BIAS = 1, RN_WD_NO_NORM = 2 };

/* One optimiser step on the gradients accumulated since the last: SGD with momentum
 * (torch.optim.SGD), weight decay on the parameters wd_mode (RN_WD_*) says. sc NULL (fp32, bf16): the step. sc given (fp16's loss
 * scale): GradScaler's step: check the gradients for inf/NaN (the verdict read back
 * after the step, which the device skipped or took), unscale them by rn_scaler_inv(sc) in the SGD pass or skip the step, then
 * rn_scaler_update; *skipped (unless NULL) = 1 when the step was skipped. Under mixed
 * precision the same pass refreshes the weights' compute copy. The caller decides what
 * a scale that keeps falling means (rn-train stops below FLT_MIN). Training nets only. */
int rn_net_step(rn_net *net, rn_scaler *sc, float lr, float momentum, float weight_decay, int nesterov, int wd_mode,
                int *skipped);

/* rn_net_step in three calls, for a caller that captures the middle one in a graph
 * (rn-train --cuda-graphs, rn/replay.h); rn_net_step makes these calls itself whenever
 * rn_net_step_on_device says the step may: SGD or LARS without clipping (clipping reads
 * the norm back before the update). rn_net_step_lr puts the rate where the update reads
 * it (rn_sgd_desc.lr_at, rn_lars_desc.lr_at; rn_backend_put; RN_EINVAL for a rate not
 * finite). rn_net_step_ops issues the step's device ops and nothing else: with sc, the
 * inf/NaN check whose flag skips the update on the device (skip_if) and the unscaling by
 * rn_scaler_inv(sc). Its ops follow what rn_net_step_keyof fills in (the weights' buffer,
 * the unscaling, the momentum's start): a capture's key (the rest, momentum, weight
 * decay and their modes, LARS on or off and its eta and eps, is the caller's to keep the
 * same). rn_net_step_end reads the flag back (with sc), starts the momentum buffers of a
 * step that was taken and moves the scaler on (*skipped as rn_net_step). */
typedef struct {
    const void *weights;
    float unscale;
    int first;
} rn_net_step_key;
int rn_net_step_on_device(const rn_net *net);
void rn_net_step_keyof(const rn_net *net, const rn_scaler *sc, rn_net_step_key *key); /* padding zeroed */
int rn_net_step_lr(rn_net *net, float lr);
int rn_net_step_ops(rn_net *net, const rn_scaler *sc, float momentum, float weight_decay, int nesterov, int wd_mode);
int rn_net_step_end(rn_net *net, rn_scaler *sc, float momentum, int *skipped);

/* The gradient of the named parameter (torchvision name and OIHW layout) into host
 * memory of numel floats. Errors: RN_EINVAL (unknown name). */
int rn_net_grad(rn_net *net, const char *name, float *host, int64_t numel);

/* The flat fp32 gradients (backend memory, *n floats; parameters in the net's order,
 * the fc last) and the spare buffer of as many floats, free between backwards (the
 * scratch of rn_dist_sum). NULL and 0 for inference nets. */
float *rn_net_grads(rn_net *net, int64_t *n);
float *rn_net_spare(rn_net *net);

/* The overlapped gradient sum (rn/dist.h): with fn set, each later rn_net_backward calls
 * fn(ctx, off, numel) for every parameter tensor as soon as its gradient is final in
 * this backward, grads[off, off + numel) (the flat array of rn_net_grads; under
 * accumulate, the micro-batch's gradient already added into it, tensor by tensor, with
 * the same element-wise fp32 add, so the bits do not change). Order: the backward's, fc
 * first, then each conv+BN unit from the last to the stem, the same on every process; every tensor
 * exactly once (the backward fails with RN_EINVAL otherwise). fn's error stops the
 * backward and is returned. NULL: off (the default). */
typedef int (*rn_net_grad_fn)(void *ctx, int64_t off, int64_t numel);
void rn_net_set_grad_hook(rn_net *net, rn_net_grad_fn fn, void *ctx);

/* Data-parallel BatchNorm (rn/dist.h). With capture on, training forwards normalise with
 * batch statistics as always but leave the running statistics and num_batches_tracked
 * alone; each forward's per-channel batch mean and unbiased variance (what the update
 * would have used) are kept, rn_net_bn_stats_len floats, and rn_net_bn_captured copies
 * them to host memory. rn_net_bn_replay then applies nslices such sets (host,
 * nslices x rn_net_bn_stats_len) in order, running = (1 - 0.1) * running + 0.1 * x,
 * the update the CPU backend makes in place, and adds nslices to num_batches_tracked:
 * the ranks' micro-batches replayed in global order give every rank the running
 * statistics of one process with --accum W. Errors: RN_EINVAL (inference net, capture
 * off), those of the backend's copies. */
int64_t rn_net_bn_stats_len(const rn_net *net);
int rn_net_bn_capture(rn_net *net, int on);
int rn_net_bn_captured(rn_net *net, float *host);
int rn_net_bn_replay(rn_net *net, const float *stats, int nslices);

/* Synchronised BatchNorm (PyTorch's SyncBatchNorm): world processes, each with a net like
 * this one, run training forwards and backwards in lockstep, and each BN layer normalises
 * over the images of all of them. gather(ctx, mine, bytes, all) must set all (world x
 * bytes, host) to every process's `mine` (bytes, host) in rank order, the same on every
 * process (rn_dist_allgather), and return RN_OK or an error, which the forward or
 * backward returns. Per BN layer, a training forward computes this process's batch mean
 * and variance (rn_bn_fwd_train into a scratch), gathers every process's (count, mean,
 * biased variance) in double, combines them in rank order (the parallel-variance formula)
 * and normalises with the global mean and biased variance (rn_bn_fwd_infer); the running
 * statistics are updated once per forward with the global mean and unbiased variance,
 * so every process keeps the same buffers (capture/replay is not needed). The backward
 * (rn_bn_bwd_frozen on the global statistics, then a gather of the per-channel sums of
 * dz and dz*xhat) gives dx = gamma*invstd*(dz - sum dz/M - xhat*sum dz*xhat/M) with the
 * sums and count M over all processes; dgamma and dbeta stay this process's own sums
 * (the step's gradient sum adds them). Two gathers per BN layer per micro-batch, of
 * 2 x channels + 1 doubles. world 1 with a copying gather computes what plain BN does
 * (up to float rounding). gather NULL: per-process BN again. Freezing (rn_net_freeze_bn)
 * takes precedence. Errors: RN_EINVAL (inference net, world < 1), RN_ENOMEM. */
typedef int (*rn_net_gather_fn)(void *ctx, const void *mine, size_t bytes, void *all);
int rn_net_set_sync(rn_net *net, int world, rn_net_gather_fn gather, void *ctx);

/* The output of conv+BN unit `unit` (an index into the spec's units) in the last training
 * forward: after its ReLU, and after the residual add for a block's last unit. Sets
 * shape to NHWC (n, p, q, cout) for that forward's n and, unless host is NULL, copies
 * the values there (host holds the product of shape). For tests that need rn's own ReLU
 * decisions (tests/parity); call it before the backward. Errors: RN_EINVAL (no such
 * unit, no training forward yet), RN_ENOTSUP (AMP). */
int rn_net_unit_output(rn_net *net, int unit, float *host, int64_t shape[4]);

/* The exponential moving average of the weights (rn-train --ema-decay; torchvision's
 * ExponentialMovingAverage, an AveragedModel with use_buffers=True). rn_net_ema_enable
 * gives a training net a second set of parameters and BN running statistics in backend
 * memory (4 bytes per parameter and per statistic, beyond rn_net_plan's count: rn-train
 * adds it to the plan, rn_runner.also), zero
 * until the first update or rn_net_ema_load. rn_net_ema_update: copy != 0 sets the
 * average to the current weights and statistics (AveragedModel's first update, n_averaged
 * 0); else avg = keep * avg + take * w over both (rn_ema_update); num_batches_tracked is
 * copied either way. rn_net_ema_swap exchanges the average with the live weights (call it
 * again to swap back; under AMP the compute copy is remade), so that an evaluation
 * forward runs the averaged model. rn_net_ema_load/store move the set between the net and
 * c->ema's tensors (torchvision names and layouts; store allocates c->ema with
 * rn_state_ema_alloc and leaves its decay, every, alpha and updates to the caller).
 * Errors: RN_EINVAL (inference net; no set enabled; c without one), RN_ENOMEM, the
 * backend's. */
int rn_net_ema_enable(rn_net *net);
int rn_net_ema_update(rn_net *net, float keep, float take, int copy);
int rn_net_ema_swap(rn_net *net);
int rn_net_ema_load(rn_net *net, const rn_ckpt *c);
int rn_net_ema_store(rn_net *net, rn_ckpt *c);

/* Profiling (rn/prof.h): with prof given, every forward and backward times each layer
 * and direction as a span of prof (named as torchvision names the module: "conv1",
 * "layer1.0.bn2", "layer2.0.downsample.0", "maxpool", "avgpool", "fc"; a BN's span holds
 * its ReLU and residual add; the loss with its gradient as "loss" backward; an identity
 * shortcut's gradient add as the block, "layer1.1" backward; under accumulation the
 * micro-batch's gradient add as "grad-accumulate"), with the backend synchronised around
 * each. The numbers computed do not change. NULL (the default): off. The net uses prof,
 * it does not own it. */
void rn_net_set_prof(rn_net *net, rn_prof *prof);

#endif
