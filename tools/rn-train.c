/* rn-train: train a checkpoint on a dataset. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/dataset.h"
#include "rn/dist.h"
#include "rn/err.h"
#include "rn/gpumon.h"
#include "rn/loader.h"
#include "rn/tensor.h"
#include "rn/train.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

static void usage(FILE *f) {
    fprintf(f,
            "usage: rn-train --data TRAIN.lmdb --in IN.pb --out OUT.pb [options]\n"
            "\n"
            "Train a checkpoint with SGD on an rn dataset and write the result. Runs on the GPU\n"
            "when one is usable (--device auto), else on the CPU.\n"
            "\n"
            "Run:\n"
            "  -d, --data DIR          training dataset (rn-prep output)\n"
            "  -i, --in IN.pb          checkpoint to start from (rn-init or an earlier rn-train)\n"
            "  -o, --out OUT.pb        checkpoint to write (atomically; may equal --in)\n"
            "  -e, --epochs N          epochs to train, counted from IN's epoch (default 1)\n"
            "      --max-steps N       stop after N optimiser steps in this run (default: no limit)\n"
            "      --val DIR           evaluate on this dataset after each epoch (top-1, top-5, loss)\n"
            "  -b, --batch N           images per optimiser step (default %d)\n"
            "      --accum K           split each batch into K micro-batches of N/K, run one after\n"
            "                          another with the loss divided by K, then one step: the\n"
            "                          gradient of the full batch in 1/K of the memory. BatchNorm\n"
            "                          statistics are per micro-batch, as PyTorch computes them\n"
            "                          (with --freeze-bn the gradient is exactly the full batch's)\n"
            "      --micro-batch M     images per micro-batch instead of --accum (a divisor of N),\n"
            "                          or auto: the largest divisor of N whose network fits in\n"
            "                          memory (planned before anything is allocated), so the\n"
            "                          effective batch and the schedule stay as asked\n"
            "      --mem-limit SIZE    memory the network (with the EMA and the gradient sum's\n"
            "                          buffers) may plan for, e.g. 20G or 512M (default:\n"
            "                          the device's free memory less 5%% of its total; on the CPU\n"
            "                          the memory available, shared by the node's processes of\n"
            "                          the run). A plan over it stops the run before it starts,\n"
            "                          saying which --micro-batch fits\n"
            "      --recompute MODE    none or blocks: keep only each residual block's input in the\n"
            "                          forward and recompute the block's inside in backward\n"
            "                          (activation checkpointing): the same gradients and\n"
            "                          checkpoint (bit for bit on the CPU) in less memory, for\n"
            "                          about one more forward per step. Default none; with\n"
            "                          --micro-batch auto and no --recompute, blocks when the\n"
            "                          plain micro-batch needs accumulation, on a GPU, is under\n"
            "                          32 images and recomputing fits twice as many (or when\n"
            "                          nothing fits without it)\n"
            "      --freeze-bn         BatchNorm normalises with its running statistics and keeps\n"
            "                          them (PyTorch: train() with every BN in eval(), as when\n"
            "                          fine-tuning); BN weights and biases still learn\n"
            "      --crop S            training crop (default %d)\n"
            "      --resize N          eval transform (--val, --augment none): shorter side before\n"
            "                          the centre crop (default round(S*256/224); 0: no resize)\n"
            "      --crop-schedule START:END:E1:E2\n"
            "                          progressive resizing (FFCV's): the training crop of epoch\n"
            "                          index e (from 0; the log's epoch e+1) is START up to E1,\n"
            "                          END from E2, in between the linear ramp rounded to a\n"
            "                          multiple of 32; replaces --crop for training. Memory is\n"
            "                          planned for the largest crop; the network and the loader\n"
            "                          are rebuilt at epoch boundaries (resume stays exact)\n"
            "      --val-crop S        --val's centre crop (default --crop): another size evaluates\n"
            "                          on a second, inference-only network of that size (fp32, as\n"
            "                          rn-eval), loaded with the weights at each epoch's end; its\n"
            "                          memory comes on top of the training network's\n"
            "      --val-resize N      --val's resize of the shorter side (default --resize, else\n"
            "                          round(--val-crop*256/224); 0: no resize). Both: no effect\n"
            "                          without --val\n"
            "      --augment CHAIN     training augmentation: ops joined by commas, each\n"
            "                          OP[=V][:KEY=VALUE]... (a range is LO-HI), torchvision's\n"
            "                          defaults where left out (default rrc,flip):\n"
            "                            rrc[:scale=0.08-1][:ratio=0.75-1.333] RandomResizedCrop\n"
            "                            crop-pad=N[:constant|edge|reflect][:fill=0] RandomCrop\n"
            "                              with padding N, the image at its stored size\n"
            "                            flip[=0.5]  horizontal flip with that probability\n"
            "                            erase[=0.5][:scale=0.02-0.33][:ratio=0.3-3.3][:random]\n"
            "                              RandomErasing on the normalised input (value 0)\n"
            "                            ta_wide[:bins=31]  TrivialAugmentWide\n"
            "                            randaug[=2][:m=9][:bins=31]  RandAugment(num_ops, magnitude)\n"
            "                            autoaug  AutoAugment, ImageNet policy\n"
            "                            jitter[:brightness=X][:contrast=X][:saturation=X][:hue=X]\n"
            "                              ColorJitter (each 0: off; hue at most 0.5)\n"
            "                          crop op first, then flip, the pixel ops, erase last;\n"
            "                          none: the eval transform\n"
            "                          (resize + centre crop); standard and rrc alone: rrc,flip\n"
            "      --no-shuffle        visit the records in order\n"
            "      --ra-reps K         repeated augmentation (torchvision's --ra-sampler --ra-reps):\n"
            "                          each batch holds batch/K records of the epoch's order, K\n"
            "                          copies of each with their own --augment draws, spread so\n"
            "                          that each rank's micro-batch holds a record once when\n"
            "                          ranks x --accum >= K; an epoch keeps its steps (about\n"
            "                          1/K of the records, K times). --batch a multiple of K.\n"
            "                          Default 1: off\n"
            "      --overfit-batches K train on the first K batches of epoch 0 only, the same images\n"
            "                          and crops (epoch 0's draws of --augment) every epoch of K\n"
            "                          steps, with a constant --lr unless --lr-schedule is given;\n"
            "                          at the end say whether the loss fell towards 0 (the first\n"
            "                          check when the loss does not fall). K over the dataset's\n"
            "                          batches: all of them, with a message. Default length %d\n"
            "                          steps; not with --val\n"
            "      --seed S            data order and augmentation seed (default: IN's, else 0)\n"
            "  -w, --workers N         loader threads (default %d)\n"
            "  -t, --threads N         compute threads on the CPU (default: all cores); the\n"
            "                          result is the same bytes for any N\n"
            "      --device D          auto, cpu, cuda or cuda:N (default auto)\n"
            "      --deterministic     GPU: deterministic convolution algorithms, chosen the same\n"
            "                          way in every process, so a run repeats bit for bit (the\n"
            "                          CPU backend always does); may be slower\n"
            "      --cuda-graphs       GPU: each micro-batch's forward and backward, and the\n"
            "                          optimiser step (not with --clip-grad-norm),\n"
            "                          captured as CUDA graphs and replayed as one launch each\n"
            "                          (the same results, hundreds fewer launches per step; the\n"
            "                          first step of each loss scale runs uncaptured). One\n"
            "                          process; not with --profile\n"
            "Many processes (started by mpirun or srun --mpi=pmix; one per GPU):\n"
            "  -b/--batch stays the global batch of one step: each of P processes computes\n"
            "  N/P images per step, rank r its micro-batches r, r+P, ...; with --accum K the\n"
            "  same run, bit for bit on the CPU, as one process with --accum P x K (and one\n"
            "  --micro-batch M run on any P). --device cuda and auto take the GPU of the\n"
            "  process's local rank (or the one GPU it sees); on the CPU the cores are shared\n"
            "  among a node's processes unless --threads is given, and so is the memory they\n"
            "  plan for (--mem-limit is per process). --micro-batch auto takes the smallest\n"
            "  micro-batch any process fits or gives, recomputing on all (left at the default)\n"
            "  where one must. Ranks that plan differently (device kind, given micro-batch,\n"
            "  recomputation, --sum-every, --bucket-mb) stop at once, naming the flag to give.\n"
            "  Rank 0 writes OUT, the log and the events; a run resumes on any number of processes.\n"
            "  SIGUSR1 to mpirun reaches every rank: all save at the same step and exit 0.\n"
            "  (This build: %s.)\n"
            "      --dist-timeout S    a collective that waits S seconds for the others (a rank\n"
            "                          died or hangs) stops the run, naming it and, on rank 0,\n"
            "                          the silent ranks (default %g)\n"
            "      --bucket-mb X       gradients are summed in buckets of X MB, each started while\n"
            "                          the backward goes on (default %g)\n"
            "      --sum-every micro-batch|step\n"
            "                          micro-batch (default): each micro-batch's gradients are\n"
            "                          summed over the processes as its backward goes (one\n"
            "                          all-to-all each, one all-gather a step), in one process's\n"
            "                          order: the bits of --accum P x K. step: each process adds\n"
            "                          its own micro-batches first, then one sum a step (as DDP's\n"
            "                          no_sync; --accum K moves K-1 fewer all-to-alls), equal to\n"
            "                          --accum P x K up to float rounding. Alike with --accum 1\n"
            "      --sync-bn           BatchNorm statistics over every process's images of a\n"
            "                          micro-batch (PyTorch's SyncBatchNorm; default: each\n"
            "                          process's own, as DDP): the same run as one process with\n"
            "                          the same --batch and --accum, up to float rounding; two\n"
            "                          small collectives per BN layer per micro-batch. One\n"
            "                          process: no effect. Not with --freeze-bn\n"
            "Mixed precision (GPU only; the CPU backend computes in fp32):\n"
            "      --amp MODE          off, fp16 or bf16 (default off): activations and layers in\n"
            "                          MODE; fp32 master weights, weight gradients, momentum, BN\n"
            "                          weights and statistics, and the loss\n"
            "      --loss-scale S      fp16: initial dynamic loss scale, when IN holds none\n"
            "                          (default %g); x0.5 and the step skipped on inf/NaN\n"
            "                          gradients (the step still counts for the schedule)\n"
            "      --loss-scale-growth-interval N\n"
            "                          fp16: x2 after N clean steps in a row (default %d)\n"
            "Optimiser (sgd: torch.optim.SGD semantics):\n"
            "      --lr X              base learning rate (default %g)\n"
            "      --momentum X        (default %g)\n"
            "      --wd X              weight decay (default %g)\n"
            "      --nesterov          Nesterov momentum\n"
            "      --no-wd-bn          no weight decay on BN weights/biases and the fc bias\n"
            "      --no-wd-norm        no weight decay on BN weights/biases only (torchvision's\n"
            "                          --norm-weight-decay 0.0); the last of the two given wins.\n"
            "                          Not with --optimizer lars (it spares BN and the fc bias)\n"
            "      --wd-all            weight decay on every parameter (the default; undoes a\n"
            "                          recipe's --no-wd-norm or an earlier --no-wd-bn)\n"
            "      --optimizer O       sgd or lars (default sgd). lars: MLPerf ResNet-50's LARS,\n"
            "                          per conv/fc weight trust = eta*|w|/(|g| + wd*|w| + eps)\n"
            "                          (1 if a norm is 0), v = momentum*v + lr*trust*(g + wd*w),\n"
            "                          w -= v; BN weights/biases and the fc bias: trust 1, no\n"
            "                          weight decay. Not with --nesterov\n"
            "      --lars-eta X        lars: trust coefficient (default %g)\n"
            "      --lars-eps X        lars: epsilon of the trust ratio (default %g)\n"
            "      --label-smoothing X cross-entropy label smoothing (default 0)\n"
            "      --clip-grad-norm X  before each step, scale the gradients by X/(norm + 1e-6) when\n"
            "                          their 2-norm (all together, after fp16 unscaling) is above\n"
            "                          X: torch.nn.utils.clip_grad_norm_, torchvision's\n"
            "                          --clip-grad-norm (default: off); log lines gain grad_norm,\n"
            "                          the norm before clipping\n"
            "Moving average of the weights (torchvision's --model-ema; default: IN's, else off):\n"
            "      --ema-decay D       keep an exponential moving average of the parameters and BN\n"
            "                          statistics: every --ema-every steps of an epoch avg =\n"
            "                          (1-a)*avg + a*w, a = min(1, (1-D) * batch * N / epochs), with\n"
            "                          --batch the global batch and epochs the run's length (as for\n"
            "                          cosine; --lr-epochs); a copy of the model while epoch <\n"
            "                          --warmup-epochs. Saved in OUT as its own set (rn-eval --ema,\n"
            "                          rn-export --ema); --val evaluates it too. torchvision's\n"
            "                          recipe: 0.99998. 0: off (drops IN's)\n"
            "      --ema-every N       optimiser steps between updates (default IN's, else %d)\n"
            "Mixup and cutmix (torchvision's reference: RandomMixup / RandomCutmix; off by default):\n"
            "      --mixup ALPHA       mix each micro-batch with itself rolled by one image:\n"
            "                          x*lambda + x_prev*(1-lambda), lambda ~ Beta(ALPHA, ALPHA),\n"
            "                          targets mixed the same way (soft targets, the loss on them)\n"
            "      --cutmix ALPHA      paste a box of the rolled micro-batch into each image, its\n"
            "                          area from lambda ~ Beta(ALPHA, ALPHA), lambda then set to\n"
            "                          the share of the clipped box's complement\n"
            "      --mix-prob P        probability that a micro-batch is mixed (default %g)\n"
            "      --switch-prob P     with both: probability of cutmix rather than mixup\n"
            "                          (default %g)\n"
            "                          The mixing unit is the micro-batch one forward sees; every\n"
            "                          draw is keyed by (seed, step, micro-batch), so --accum,\n"
            "                          resume and P processes vs --accum P x K give the same bytes.\n"
            "                          --label-smoothing applies to the mixed targets, as in\n"
            "                          torchvision; the logged loss is the loss on them, the\n"
            "                          train top-1 (train_top1) counts the dominant target.\n"
            "                          --augment's erase applies to each image before the\n"
            "                          mixing, as torchvision's per-image RandomErasing\n"
            "Schedule (in optimiser steps, so --accum never changes it):\n"
            "      --lr-schedule S     step, multistep, cosine, constant, poly or exp (default step);\n"
            "                          exp: lr * gamma^epoch (torch's ExponentialLR)\n"
            "      --lr-step N         step: decay every N epochs (default %d)\n"
            "      --lr-gamma X        step, multistep, exp: decay factor (default %g)\n"
            "      --lr-milestones L   multistep: comma-separated epochs, e.g. 30,60,80\n"
            "      --lr-epochs N       cosine, poly: length of the whole run in epochs (default:\n"
            "                          the epoch this run ends at); past it the rate stays at\n"
            "                          --lr-min or --lr-end (torch's cosine would rise again)\n"
            "      --lr-min X          cosine: the rate it decays to (default 0; torch's eta_min,\n"
            "                          torchvision's --lr-min), at most --lr\n"
            "      --lr-end X          poly: lr at the end of the run (default %g)\n"
            "      --lr-power X        poly: lr_end + (lr - lr_end)*(1 - t/T)^X over the T steps\n"
            "                          after the warm-up (default %g, MLPerf's pow2)\n"
            "      --warmup-epochs N   warm-up over the first N epochs (default 0)\n"
            "      --warmup-method M   ramp (default): the schedule times (k+1)/W at warm-up step k\n"
            "                          of W; linear: torch's LinearLR, lr*(d + (1-d)*k/W), then\n"
            "                          the schedule from its start, its epochs counted after the\n"
            "                          warm-up (cosine over --lr-epochs - N, StepLR's and\n"
            "                          MultiStepLR's epochs too), as torchvision's SequentialLR;\n"
            "                          constant: ConstantLR, lr*d, then the same\n"
            "      --warmup-decay D    linear, constant: the start factor d (default %g,\n"
            "                          torchvision's --lr-warmup-decay); refused with ramp\n"
            "      --lr-every U        step (default): the rate moves every optimiser step; epoch:\n"
            "                          once per epoch, at its first step, as torchvision's\n"
            "                          scheduler.step() after each epoch (warm-up in epochs too)\n"
            "      --print-lr          print each epoch's first and last step's lr for these flags\n"
            "                          (--data's records / --batch steps per epoch, at most\n"
            "                          --overfit-batches; --lr-epochs or else --epochs epochs)\n"
            "                          and exit; needs no --in or --out\n"
            "Recipes (named bundles of the flags above; see README.md and rn-train(1) for each\n"
            "value and where it comes from):\n"
            "      --recipe NAME       seed, torchvision, torchvision-v2, cifar or mlperf: its flags\n"
            "                          are read first, so every flag given on the command line\n"
            "                          overrides the recipe's, wherever it stands. --lr is the\n"
            "                          recipe's for its --batch, never rescaled: with another\n"
            "                          --batch give --lr too (linear scaling: lr * N / the\n"
            "                          recipe's batch)\n"
            "      --print-recipe      print the recipe's flags as an rn-train command line and\n"
            "                          exit (needs no --data, --in or --out)\n"
            "Output:\n"
            "      --save-every N      also write OUT every N steps\n"
            "      --log FILE.jsonl    append one JSON object per log interval and per epoch\n"
            "      --log-every N       steps between log lines (default %d); the loss is read\n"
            "                          from the device then (at most every 64 steps), so a\n"
            "                          non-finite loss stops the run there, naming its step\n"
            "      --tensorboard DIR   also write the log as a TensorBoard event file in DIR (made\n"
            "                          if missing; watch with tensorboard --logdir DIR): train/loss,\n"
            "                          train/lr, train/img_s, train/data_wait, train/loss_scale\n"
            "                          (fp16) at each log line, val/top1, val/top5, val/loss per\n"
            "                          epoch with --val, the command line as text (run/flags); a\n"
            "                          new file per run, each tag written only at steps above\n"
            "                          those DIR already holds, so resumed runs add no duplicates\n"
            "      --dump-grads FILE   write this run's first step's gradients and batch\n"
            "                          as safetensors (torchvision names and layouts)\n"
            "      --gpu-sample S      on a GPU with NVML, read its utilisation, memory and power\n"
            "                          every S seconds (default %g; 0: off): log lines gain\n"
            "                          gpu_util, gpu_mem_used, gpu_power_w (interval means),\n"
            "                          progress shows GPU busy %%, an idle GPU gets advice\n"
            "Profiling (per-layer timing; the numbers computed are an unprofiled run's):\n"
            "      --profile FILE      run --profile-warmup steps, then --profile-steps steps\n"
            "                          with every layer and direction timed (GPU: CUDA events on\n"
            "                          the compute stream, read once a step; CPU: the clock, the\n"
            "                          backend synchronised around each), write the table sorted by\n"
            "                          time to FILE and a Chrome trace to FILE.json (open in\n"
            "                          ui.perfetto.dev or chrome://tracing), and stop: OUT is\n"
            "                          not written. Not with --max-steps\n"
            "      --profile-steps N   steps profiled (default %d)\n"
            "      --profile-warmup N  unprofiled steps before them (default %d)\n"
            "  -h, --help              this help\n"
            "  -V, --version           print the version\n"
            "\n"
            "SIGINT, SIGTERM and SIGUSR1 save OUT at the next step boundary and stop (exit 130 for\n"
            "SIGINT, 0 otherwise); running the same command with --in OUT continues exactly.\n"
            "On the CPU: RN_CPU_GEMM=own|avx2|portable|openblas runs every conv and fc GEMM on\n"
            "rn's own kernel at AVX-512, AVX2 or in C on aarch64 (own, the default where the CPU\n"
            "has one: the same bytes on each, whatever OPENBLAS_CORETYPE says or OpenBLAS\n"
            "detects), in its AVX2 or C form only (the same bytes), or through OpenBLAS (each of\n"
            "its kernels rounds its own way); --val also\n"
            "takes RN_CPU_WINOGRAD=0|1|2 (Winograd 3x3 convs, default 1), as rn-eval (see\n"
            "rn-train(1)). On a GPU: RN_CUDA_BN=own|cudnn (BatchNorm by rn's kernels or cuDNN's\n"
            "fused ones), RN_CUDA_INJECT=KIND=STATUS (a test hook: cuDNN statuses returned in\n"
            "place of its calls, to check the fall-backs), and the others rn-train(1) lists.\n"
            "Exit status: 0 success, 1 failure (message on stderr), 2 bad usage, 130 interrupted.\n",
            RN_TRAIN_BATCH, RN_TRAIN_CROP, RN_TRAIN_OVERFIT_STEPS, RN_TRAIN_WORKERS,
            rn_dist_built() ? "with Open MPI" : "without MPI, one process only (make deps; make)", RN_DIST_TIMEOUT,
            RN_DIST_BUCKET_MB, RN_SCALER_INIT, RN_SCALER_INTERVAL, RN_TRAIN_LR, RN_TRAIN_MOMENTUM, RN_TRAIN_WD,
            RN_TRAIN_LARS_ETA, RN_TRAIN_LARS_EPS, RN_TRAIN_EMA_EVERY, RN_MIX_PROB, RN_MIX_SWITCH, RN_TRAIN_LR_STEP,
            RN_TRAIN_LR_GAMMA, RN_TRAIN_LR_END, RN_TRAIN_LR_POWER, RN_TRAIN_WARMUP_DECAY, RN_TRAIN_LOG_EVERY,
            RN_TRAIN_GPU_SAMPLE, RN_TRAIN_PROFILE_STEPS, RN_TRAIN_PROFILE_WARMUP);
}

/* --crop-schedule START:END:E1:E2 into sched: RN_OK, or RN_EINVAL with the message */
static int parse_crop_schedule(const char *text, int sched[4]) {
    long v[4];
    char *end = (char *)text;
    for (int i = 0; i < 4; i++) {
        const char *p = end;
        errno = 0;
        v[i] = strtol(p, &end, 10);
        if (end == p || errno || (i < 3 ? *end != ':' : *end != 0)) break;
        if (i < 3) end++;
        if (i == 3) goto parsed;
    }
    return rn_errorf(RN_EINVAL, "--crop-schedule: '%s' is not START:END:E1:E2 (four integers, e.g. 160:192:2:13)",
                     text);
parsed:
    if (v[0] < 32 || v[0] > 4096 || v[1] < 32 || v[1] > 4096)
        return rn_errorf(RN_EINVAL, "--crop-schedule %s: START and END are crops of 32 to 4096 pixels", text);
    if (v[2] < 0 || v[3] <= v[2] || v[3] > 1000000)
        return rn_errorf(RN_EINVAL, "--crop-schedule %s: the ramp's epochs need 0 <= E1 < E2 <= 1000000", text);
    for (int i = 0; i < 4; i++)
        sched[i] = (int)v[i];
    return RN_OK;
}

/* the most steps a flag may count: far beyond any run, far from int64_t's overflow */
#define MAX_STEPS 1000000000000000LL

/* The flags that only make sense together, checked once every flag is read: RN_OK, or
 * RN_EINVAL with the message for the user. */
static int check_flags(const rn_train_opts *o, const char *in, int print_lr, int nargs, char **args) {
    if (nargs) return rn_errorf(RN_EINVAL, "unexpected argument '%s'", args[0]);
    if (print_lr && !o->data)
        return rn_errorf(RN_EINVAL, "--print-lr needs --data: its record count and --batch give the steps per epoch");
    if (!print_lr && (!o->data || !in || !o->out))
        return rn_errorf(RN_EINVAL, "--data, --in and --out are required (see --help)");
    if (o->out && strcmp(o->out, "-") == 0)
        return rn_errorf(RN_EINVAL, "--out must be a file (checkpoints are written during training)");
    if (o->batch % o->accum)
        return rn_errorf(RN_EINVAL, "--batch %d is not a multiple of --accum %d", o->batch, o->accum);
    if (o->batch % o->ra_reps)
        return rn_errorf(RN_EINVAL, "--batch %d is not a multiple of --ra-reps %d (each batch holds batch/K records, "
                         "K times each)", o->batch, o->ra_reps);
    if (o->micro_batch && o->accum != 1)
        return rn_errorf(RN_EINVAL, "give --micro-batch or --accum, not both (each sets the other)");
    if (o->micro_batch > 0 && o->batch % o->micro_batch)
        return rn_errorf(RN_EINVAL, "--batch %d is not a multiple of --micro-batch %d", o->batch, o->micro_batch);
    for (int i = 1; i < o->lr.n_milestones; i++)
        if (o->lr.milestones[i] <= o->lr.milestones[i - 1])
            return rn_errorf(RN_EINVAL, "--lr-milestones: %d after %d: the epochs must increase, like 30,60,80",
                             o->lr.milestones[i], o->lr.milestones[i - 1]);
    if (o->sync_bn && o->freeze_bn)
        return rn_errorf(RN_EINVAL, "--sync-bn and --freeze-bn: frozen BatchNorm has no batch statistics to "
                                    "synchronise (give one)");
    if (o->overfit_batches && o->val)
        return rn_errorf(RN_EINVAL, "--overfit-batches and --val: the overfit check reports the training loss "
                                    "(evaluate its checkpoint afterwards with rn-eval)");
    if (o->profile && strcmp(o->profile, "-") == 0)
        return rn_errorf(RN_EINVAL, "--profile must be a file: the trace is written next to it as FILE.json");
    if (o->profile && o->max_steps)
        return rn_errorf(RN_EINVAL, "--profile runs --profile-warmup + --profile-steps steps: drop --max-steps");
    if (o->optimizer == RN_OPT_LARS && o->nesterov)
        return rn_errorf(RN_EINVAL, "--optimizer lars has no Nesterov momentum: drop --nesterov");
    if (o->optimizer == RN_OPT_LARS && o->wd_mode == RN_WD_NO_NORM)
        return rn_errorf(RN_EINVAL, "--optimizer lars excludes BN parameters and the fc bias from weight decay "
                                    "itself: drop --no-wd-norm");
    if (o->lr.schedule == RN_LR_COSINE && o->lr.lr_min > o->lr.lr)
        return rn_errorf(RN_EINVAL, "--lr-min %g is above --lr %g: cosine decays from --lr down to --lr-min",
                         o->lr.lr_min, o->lr.lr);
    if (o->lr.schedule == RN_LR_POLY && o->lr.lr_end > o->lr.lr)
        return rn_errorf(RN_EINVAL, "--lr-end %g is above --lr %g: poly decays from --lr down to --lr-end",
                         o->lr.lr_end, o->lr.lr);
    /* a graph replays its ops with the pointers and scalars it was captured with, and no
       host code between them */
    if (o->cuda_graphs && o->profile)
        return rn_errorf(RN_EINVAL, "--cuda-graphs with --profile: the profile times each op, a graph runs them as "
                                    "one launch (profile without --cuda-graphs)");
    if (o->amp != RN_F32 && strcmp(o->device, "cpu") == 0)
        return rn_errorf(RN_EINVAL, "--amp %s needs a GPU (--device cuda): the CPU backend computes in fp32",
                         rn_amp_name(o->amp));
    return RN_OK;
}

enum {
    O_MAXSTEPS = 256, O_VAL, O_ACCUM, O_CROP, O_AUG, O_NOSHUF, O_SEED, O_DEVICE, O_LR, O_MOM, O_WD, O_NEST, O_NOWDBN, O_FREEZEBN,
    O_LS, O_SCHED, O_LRSTEP, O_GAMMA, O_MILES, O_LREPOCHS, O_WARM, O_SAVE, O_LOG, O_LOGEVERY, O_DUMP, O_RESIZE,
    O_AMP, O_SCALE, O_SCALEINT, O_MICRO, O_TB, O_MEMLIMIT, O_DETERM, O_DISTTIMEOUT, O_BUCKET, O_SYNCBN,
    O_OVERFIT, O_RAREPS, O_PROFILE, O_PROFSTEPS, O_PROFWARM, O_OPTIM, O_LARSETA, O_LARSEPS, O_LREND, O_LRPOWER,
    O_GPUSAMPLE, O_RECOMPUTE, O_EMADECAY, O_EMAEVERY, O_MIXUP, O_CUTMIX, O_MIXPROB, O_SWITCHPROB,
    O_RECIPE, O_PRINTRECIPE, O_VALCROP, O_VALRESIZE, O_CROPSCHED, O_LREVERY, O_WARMMETHOD, O_WARMDECAY, O_PRINTLR,
    O_NOWDNORM, O_LRMIN, O_CLIP, O_GRAPHS, O_WDALL, O_SUMEVERY
};

/* --recipe: named bundles of existing flags, put before the command line's own flags so
 * that every flag given there wins, whatever its place. Where each value comes from is in
 * README.md (rn-train, Recipes) and rn-train(1). Values are never rescaled with --batch:
 * a user who changes it gives --lr too (linear scaling: lr * batch / the recipe's). */
/* clang-format off: flag and value pairs, read as the command line they print as */
static const char *const recipe_seed[] = {
    "--batch", "256", "--lr", "0.01", "--momentum", "0.9", "--wd", "1e-4", "--lr-schedule", "step", "--lr-step", "10",
    "--lr-gamma", "0.1", "--crop", "224", "--augment", "rrc,flip", NULL};
static const char *const recipe_torchvision[] = {
    "--batch", "256", "--lr", "0.1", "--momentum", "0.9", "--wd", "1e-4", "--lr-schedule", "step", "--lr-step", "30",
    "--lr-gamma", "0.1", "--epochs", "90", "--crop", "224", "--resize", "256", "--augment", "rrc,flip", NULL};
static const char *const recipe_torchvision_v2[] = {
    "--batch", "1024", "--lr", "0.5", "--momentum", "0.9", "--wd", "2e-5", "--no-wd-norm", "--lr-schedule", "cosine",
    "--lr-epochs", "600", "--lr-every", "epoch", "--warmup-epochs", "5", "--warmup-method", "linear", "--epochs", "600",
    "--label-smoothing", "0.1", "--mixup", "0.2", "--cutmix", "1.0", "--augment", "rrc,flip,ta_wide,erase=0.1", "--crop", "176", "--val-crop", "224",
    "--val-resize", "232", "--ema-decay", "0.99998", "--ema-every", "32", "--ra-reps", "4", NULL};
static const char *const recipe_cifar[] = {
    "--batch", "128", "--lr", "0.1", "--momentum", "0.9", "--wd", "5e-4", "--lr-schedule", "cosine",
    "--lr-epochs", "200", "--lr-every", "epoch", "--epochs", "200", "--crop", "32", "--resize", "0", "--augment",
    "crop-pad=4,flip", NULL};
static const char *const recipe_mlperf[] = {
    "--optimizer", "lars", "--batch", "3264", "--lr", "10.5", "--momentum", "0.9", "--wd", "5e-5",
    "--lars-eta", "0.001", "--lars-eps", "0", "--lr-schedule", "poly", "--lr-power", "2", "--lr-end", "1e-4",
    "--warmup-epochs", "2", "--lr-epochs", "37", "--epochs", "37", "--label-smoothing", "0.1", "--crop", "224",
    "--augment", "rrc,flip", NULL};
/* clang-format on */
static const struct {
    const char *name;
    const char *const *flags;
} recipes[] = {
    {"seed", recipe_seed},   {"torchvision", recipe_torchvision}, {"torchvision-v2", recipe_torchvision_v2},
    {"cifar", recipe_cifar}, {"mlperf", recipe_mlperf},
};
#define N_RECIPES (int)(sizeof recipes / sizeof *recipes)
#define RECIPE_NAMES "seed, torchvision, torchvision-v2, cifar or mlperf"

static const char *const *recipe_find(const char *name) {
    for (int i = 0; i < N_RECIPES; i++)
        if (strcmp(recipes[i].name, name) == 0) return recipes[i].flags;
    return NULL;
}

static int recipe_len(const char *const *flags) {
    int n = 0;
    while (flags[n])
        n++;
    return n;
}

/* After MPI started: the message of a failure (each rank's own, marked with its rank when
 * there are several), and the end of this process. A world of more than one is stopped
 * whole (MPI_Abort), so that no rank waits for this one. */
static int fail(rn_dist *d, int code) {
    if (rn_dist_world(d) > 1) {
        fprintf(stderr, "rn-train: rank %d: %s\n", rn_dist_rank(d), rn_last_error());
        fflush(stderr);
        rn_dist_abort(d, code);
    }
    fprintf(stderr, "rn-train: %s\n", rn_last_error());
    rn_dist_close(d);
    return code;
}

/* --print-lr: the rate of each epoch's first and last step for a run of `epochs` epochs
 * from epoch 0, with the steps per epoch rn-train's loader gives (records / --batch, the
 * last partial batch dropped, at most --overfit-batches), without starting one; the
 * doubles rn_lr_at returns, which the optimiser rounds to float. */
static int print_lr_table(const rn_train_opts *o, int epochs) {
    rn_dataset *ds = NULL;
    int rc = rn_dataset_open(o->data, &ds);
    if (rc) return rc;
    uint64_t count = rn_dataset_get_info(ds)->count;
    rn_dataset_close(ds);
    int64_t spe = rn_loader_epoch_batches(count, o->batch, 1, o->overfit_batches);
    if (spe < 1)
        return rn_errorf(RN_EINVAL, "--print-lr: %s holds %llu records, fewer than --batch %d: an epoch has no step",
                         o->data, (unsigned long long)count, o->batch);
    const rn_lr_schedule *s = &o->lr;
    printf("# rn-train --print-lr: %s, lr %g, %d epoch%s of %lld step%s (%llu records / batch %d)",
           rn_lr_schedule_name(s->schedule), s->lr, epochs, epochs > 1 ? "s" : "", (long long)spe, spe > 1 ? "s" : "",
           (unsigned long long)count, o->batch);
    if (s->warmup_epochs > 0) {
        printf(", %d warm-up epoch%s (%s", s->warmup_epochs, s->warmup_epochs > 1 ? "s" : "",
               rn_warmup_method_name(s->warmup_method));
        if (s->warmup_method != RN_WARMUP_RAMP) printf(" from %g", s->warmup_decay);
        printf(")");
    }
    printf(", the rate moves every %s\n# epoch first_step lr_first lr_last\n", s->per_epoch ? "epoch" : "step");
    for (int e = 0; e < epochs; e++) {
        int64_t a = (int64_t)e * spe;
        printf("%d %lld %.17g %.17g\n", e + 1, (long long)a, rn_lr_at(s, a, spe), rn_lr_at(s, a + spe - 1, spe));
    }
    if (fflush(stdout) != 0 || ferror(stdout)) return rn_errorf(RN_EIO, "--print-lr: writing the table to stdout failed");
    return RN_OK;
}

/* the command line with the recipe's flags in front (main's every exit path keeps it) */
char **rn_train_pargv; /* not static: the store must stay, so leak checkers see it reachable */

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"data", required_argument, 0, 'd'},       {"in", required_argument, 0, 'i'},
        {"out", required_argument, 0, 'o'},        {"epochs", required_argument, 0, 'e'},
        {"max-steps", required_argument, 0, O_MAXSTEPS}, {"val", required_argument, 0, O_VAL},
        {"batch", required_argument, 0, 'b'},      {"accum", required_argument, 0, O_ACCUM},
        {"micro-batch", required_argument, 0, O_MICRO}, {"deterministic", no_argument, 0, O_DETERM}, {"mem-limit", required_argument, 0, O_MEMLIMIT},
        {"crop", required_argument, 0, O_CROP},    {"augment", required_argument, 0, O_AUG},
        {"resize", required_argument, 0, O_RESIZE}, {"val-crop", required_argument, 0, O_VALCROP},
        {"val-resize", required_argument, 0, O_VALRESIZE}, {"crop-schedule", required_argument, 0, O_CROPSCHED},
        {"no-shuffle", no_argument, 0, O_NOSHUF},  {"seed", required_argument, 0, O_SEED},
        {"workers", required_argument, 0, 'w'},    {"threads", required_argument, 0, 't'},
        {"device", required_argument, 0, O_DEVICE}, {"lr", required_argument, 0, O_LR},
        {"momentum", required_argument, 0, O_MOM}, {"wd", required_argument, 0, O_WD},
        {"nesterov", no_argument, 0, O_NEST},      {"no-wd-bn", no_argument, 0, O_NOWDBN},
        {"no-wd-norm", no_argument, 0, O_NOWDNORM}, {"clip-grad-norm", required_argument, 0, O_CLIP},
        {"wd-all", no_argument, 0, O_WDALL},
        {"freeze-bn", no_argument, 0, O_FREEZEBN}, {"recompute", required_argument, 0, O_RECOMPUTE},
        {"cuda-graphs", no_argument, 0, O_GRAPHS},
        {"label-smoothing", required_argument, 0, O_LS}, {"lr-schedule", required_argument, 0, O_SCHED},
        {"lr-step", required_argument, 0, O_LRSTEP}, {"lr-gamma", required_argument, 0, O_GAMMA},
        {"lr-milestones", required_argument, 0, O_MILES}, {"lr-epochs", required_argument, 0, O_LREPOCHS},
        {"warmup-epochs", required_argument, 0, O_WARM}, {"save-every", required_argument, 0, O_SAVE},
        {"lr-every", required_argument, 0, O_LREVERY}, {"warmup-method", required_argument, 0, O_WARMMETHOD},
        {"warmup-decay", required_argument, 0, O_WARMDECAY}, {"print-lr", no_argument, 0, O_PRINTLR},
        {"log", required_argument, 0, O_LOG},      {"log-every", required_argument, 0, O_LOGEVERY},
        {"tensorboard", required_argument, 0, O_TB},
        {"dump-grads", required_argument, 0, O_DUMP}, {"amp", required_argument, 0, O_AMP},
        {"loss-scale", required_argument, 0, O_SCALE},
        {"loss-scale-growth-interval", required_argument, 0, O_SCALEINT}, {"help", no_argument, 0, 'h'},
        {"dist-timeout", required_argument, 0, O_DISTTIMEOUT}, {"bucket-mb", required_argument, 0, O_BUCKET},
        {"sync-bn", no_argument, 0, O_SYNCBN},     {"overfit-batches", required_argument, 0, O_OVERFIT},
        {"sum-every", required_argument, 0, O_SUMEVERY},
        {"ra-reps", required_argument, 0, O_RAREPS},
        {"profile", required_argument, 0, O_PROFILE},      {"profile-steps", required_argument, 0, O_PROFSTEPS},
        {"profile-warmup", required_argument, 0, O_PROFWARM}, {"gpu-sample", required_argument, 0, O_GPUSAMPLE},
        {"optimizer", required_argument, 0, O_OPTIM},   {"lars-eta", required_argument, 0, O_LARSETA},
        {"lars-eps", required_argument, 0, O_LARSEPS},  {"lr-end", required_argument, 0, O_LREND},
        {"lr-power", required_argument, 0, O_LRPOWER}, {"lr-min", required_argument, 0, O_LRMIN},
        {"ema-decay", required_argument, 0, O_EMADECAY}, {"ema-every", required_argument, 0, O_EMAEVERY},
        {"mixup", required_argument, 0, O_MIXUP},  {"cutmix", required_argument, 0, O_CUTMIX},
        {"mix-prob", required_argument, 0, O_MIXPROB}, {"switch-prob", required_argument, 0, O_SWITCHPROB},
        {"recipe", required_argument, 0, O_RECIPE}, {"print-recipe", no_argument, 0, O_PRINTRECIPE},
        {"version", no_argument, 0, 'V'},          {0, 0, 0, 0},
    };
    rn_train_opts o;
    rn_train_defaults(&o);
    /* the documented RN_* overrides first, so that flags win */
    int env_rc = rn_cli_backend_env(&o.backend);
    const char *in = NULL;
    int c, rc = env_rc, have_epochs = 0, have_schedule = 0, mix_flags = 0, have_warmup_decay = 0, print_lr = 0;
    double dist_timeout = RN_DIST_TIMEOUT, bucket_mb = RN_DIST_BUCKET_MB;
    /* --recipe and --print-recipe first (getopt on a copy, silent): the recipe's flags then go
     * in front of the command line's, so that a flag given there overrides the recipe's */
    const char *recipe = NULL;
    int print_recipe = 0;
    char **scan = malloc(sizeof *scan * (size_t)(argc + 1));
    if (!scan) {
        fprintf(stderr, "rn-train: out of memory reading the command line\n");
        return 1;
    }
    memcpy(scan, argv, sizeof *scan * (size_t)(argc + 1));
    opterr = 0;
    while ((c = getopt_long(argc, scan, "d:i:o:e:b:w:t:hV", opts, NULL)) != -1) {
        if (c == O_RECIPE)
            recipe = optarg;
        else if (c == O_PRINTRECIPE)
            print_recipe = 1;
    }
    free(scan);
    opterr = 1;
    optind = 0; /* glibc: start the next scan afresh */
    const char *const *recipe_flags = NULL;
    if (recipe && !(recipe_flags = recipe_find(recipe))) {
        fprintf(stderr, "rn-train: --recipe: '%s' is not " RECIPE_NAMES "\n", recipe);
        return 2;
    }
    int nrecipe = recipe_flags ? recipe_len(recipe_flags) : 0;
    int pargc = argc + nrecipe;
    char **pargv = malloc(sizeof *pargv * (size_t)(pargc + 1));
    rn_train_pargv = pargv; /* lives as long as the process: getopt's optarg points into it */
    if (!pargv) {
        fprintf(stderr, "rn-train: out of memory reading the command line\n");
        return 1;
    }
    pargv[0] = argv[0];
    for (int i = 0; i < nrecipe; i++)
        pargv[1 + i] = (char *)recipe_flags[i];
    memcpy(pargv + 1 + nrecipe, argv + 1, sizeof *pargv * (size_t)argc); /* argv[argc] is NULL */
    while (rc == RN_OK && (c = getopt_long(pargc, pargv, "d:i:o:e:b:w:t:hV", opts, NULL)) != -1) {
        switch (c) {
        case O_RECIPE:
        case O_PRINTRECIPE: break; /* applied above */
        case 'd': o.data = optarg; break;
        case 'i': in = optarg; break;
        case 'o': o.out = optarg; break;
        case 'e': rc = rn_cli_int("--epochs", optarg, 0, 1000000, &o.epochs); have_epochs = 1; break;
        case O_MAXSTEPS: rc = rn_cli_i64("--max-steps", optarg, 1, MAX_STEPS, &o.max_steps); break;
        case O_VAL: o.val = optarg; break;
        case 'b': rc = rn_cli_int("--batch", optarg, 1, 1 << 20, &o.batch); break;
        case O_ACCUM: rc = rn_cli_int("--accum", optarg, 1, 1 << 20, &o.accum); break;
        case O_MICRO:
            if (strcmp(optarg, "auto") == 0) o.micro_batch = -1;
            else rc = rn_cli_int("--micro-batch", optarg, 1, 1 << 20, &o.micro_batch);
            break;
        case O_MEMLIMIT: rc = rn_cli_size("--mem-limit", optarg, 1, &o.mem_limit); break;
        case O_RECOMPUTE:
            if (strcmp(optarg, "none") == 0) o.recompute = RN_TRAIN_RECOMPUTE_NONE;
            else if (strcmp(optarg, "blocks") == 0) o.recompute = RN_TRAIN_RECOMPUTE_BLOCKS;
            else rc = rn_errorf(RN_EINVAL, "--recompute: '%s' is not none or blocks", optarg);
            break;
        case O_CROP: rc = rn_cli_int("--crop", optarg, 8, 4096, &o.crop); break;
        case O_RESIZE: rc = rn_cli_int("--resize", optarg, 0, 16384, &o.resize); break;
        case O_CROPSCHED: rc = parse_crop_schedule(optarg, o.crop_sched); break;
        case O_VALCROP: rc = rn_cli_int("--val-crop", optarg, 8, 4096, &o.val_crop); break;
        case O_VALRESIZE: rc = rn_cli_int("--val-resize", optarg, 0, 16384, &o.val_resize); break;
        case O_AUG:
            if ((rc = rn_augment_parse(optarg, &o.augment))) rc = rn_error_context(rc, "--augment");
            break;
        case O_NOSHUF: o.shuffle = 0; break;
        case O_OVERFIT: rc = rn_cli_i64("--overfit-batches", optarg, 1, 1 << 30, &o.overfit_batches); break;
        case O_RAREPS: rc = rn_cli_int("--ra-reps", optarg, 1, 64, &o.ra_reps); break;
        case O_PROFILE: o.profile = optarg; break;
        case O_PROFSTEPS: rc = rn_cli_int("--profile-steps", optarg, 1, 1000000, &o.profile_steps); break;
        case O_PROFWARM: rc = rn_cli_int("--profile-warmup", optarg, 0, 1000000, &o.profile_warmup); break;
        case O_GPUSAMPLE:
            rc = rn_cli_float("--gpu-sample", optarg, 0, RN_GPUMON_INTERVAL_MAX, &o.gpu_sample);
            if (rc == RN_OK && o.gpu_sample > 0 && o.gpu_sample < RN_GPUMON_INTERVAL_MIN)
                rc = rn_errorf(RN_EINVAL, "--gpu-sample %s: give 0 (off) or %g..%g seconds", optarg,
                               RN_GPUMON_INTERVAL_MIN, RN_GPUMON_INTERVAL_MAX);
            break;
        case O_SEED: rc = rn_cli_u64("--seed", optarg, 0, UINT32_MAX, &o.seed); o.seed_given = 1; break;
        case 'w': rc = rn_cli_int("--workers", optarg, 1, 1024, &o.workers); break;
        case 't': rc = rn_cli_int("--threads", optarg, 1, 1024, &o.threads); break;
        case O_DEVICE: o.device = optarg; break;
        case O_DETERM: /* deterministic algorithms, chosen the same way in every process */
            o.backend.cuda_deterministic = 1;
            o.backend.cuda_conv_heuristic = 1;
            break;
        case O_LR: rc = rn_cli_float("--lr", optarg, 0, 1e6, &o.lr.lr); break;
        case O_MOM: rc = rn_cli_float("--momentum", optarg, 0, 1, &o.momentum); break;
        case O_WD: rc = rn_cli_float("--wd", optarg, 0, 1, &o.weight_decay); break;
        case O_OPTIM:
            if (strcmp(optarg, "sgd") == 0) o.optimizer = RN_OPT_SGD;
            else if (strcmp(optarg, "lars") == 0) o.optimizer = RN_OPT_LARS;
            else rc = rn_errorf(RN_EINVAL, "--optimizer: '%s' is not sgd or lars", optarg);
            break;
        case O_LARSETA: rc = rn_cli_float("--lars-eta", optarg, 0, 1e6, &o.lars_eta); break;
        case O_LARSEPS: rc = rn_cli_float("--lars-eps", optarg, 0, 1e6, &o.lars_eps); break;
        case O_LREND: rc = rn_cli_float("--lr-end", optarg, 0, 1e6, &o.lr.lr_end); break;
        case O_LRMIN: rc = rn_cli_float("--lr-min", optarg, 0, 1e6, &o.lr.lr_min); break;
        case O_LRPOWER: rc = rn_cli_float("--lr-power", optarg, 1e-6, 1e6, &o.lr.power); break;
        case O_NEST: o.nesterov = 1; break;
        case O_NOWDBN: o.wd_mode = RN_WD_NO_BN_BIAS; break;
        case O_NOWDNORM: o.wd_mode = RN_WD_NO_NORM; break;
        case O_WDALL: o.wd_mode = RN_WD_ALL; break;
        case O_CLIP: rc = rn_cli_float("--clip-grad-norm", optarg, 1e-12, 1e12, &o.clip_grad_norm); break;
        case O_FREEZEBN: o.freeze_bn = 1; break;
        case O_GRAPHS: o.cuda_graphs = 1; break;
        case O_SYNCBN: o.sync_bn = 1; break;
        case O_SUMEVERY:
            if (strcmp(optarg, "micro-batch") == 0) o.sum_per_step = 0;
            else if (strcmp(optarg, "step") == 0) o.sum_per_step = 1;
            else rc = rn_errorf(RN_EINVAL, "--sum-every: '%s' is not micro-batch or step", optarg);
            break;
        case O_EMADECAY: rc = rn_cli_float("--ema-decay", optarg, 0, 1, &o.ema_decay); break;
        case O_EMAEVERY: rc = rn_cli_int("--ema-every", optarg, 1, 1 << 30, &o.ema_every); break;
        case O_LS: rc = rn_cli_float("--label-smoothing", optarg, 0, 1, &o.label_smoothing); break;
        case O_MIXUP: rc = rn_cli_float("--mixup", optarg, 0, 1e6, &o.mix.mixup); break;
        case O_CUTMIX: rc = rn_cli_float("--cutmix", optarg, 0, 1e6, &o.mix.cutmix); break;
        case O_MIXPROB: rc = rn_cli_float("--mix-prob", optarg, 0, 1, &o.mix.prob); mix_flags = 1; break;
        case O_SWITCHPROB:
            rc = rn_cli_float("--switch-prob", optarg, 0, 1, &o.mix.switch_prob);
            mix_flags = 1;
            break;
        case O_SCHED:
            have_schedule = 1;
            if ((o.lr.schedule = rn_lr_schedule_parse(optarg)) < 0)
                rc = rn_errorf(RN_EINVAL, "--lr-schedule: '%s' is not step, multistep, cosine, constant, poly or exp",
                               optarg);
            break;
        case O_LRSTEP: rc = rn_cli_int("--lr-step", optarg, 1, 1000000, &o.lr.step_epochs); break;
        case O_GAMMA: rc = rn_cli_float("--lr-gamma", optarg, 0, 1e6, &o.lr.gamma); break;
        case O_MILES:
            rc = rn_cli_list("--lr-milestones", optarg, 0, 1000000, o.lr.milestones,
                             (int)(sizeof o.lr.milestones / sizeof *o.lr.milestones), &o.lr.n_milestones);
            break;
        case O_LREPOCHS: rc = rn_cli_int("--lr-epochs", optarg, 1, 1000000, &o.lr.total_epochs); break;
        case O_WARM: rc = rn_cli_int("--warmup-epochs", optarg, 0, 1000000, &o.lr.warmup_epochs); break;
        case O_LREVERY:
            if (strcmp(optarg, "epoch") == 0) o.lr.per_epoch = 1;
            else if (strcmp(optarg, "step") == 0) o.lr.per_epoch = 0;
            else rc = rn_errorf(RN_EINVAL, "--lr-every: '%s' is not step or epoch", optarg);
            break;
        case O_WARMMETHOD:
            if ((o.lr.warmup_method = rn_warmup_method_parse(optarg)) < 0)
                rc = rn_errorf(RN_EINVAL, "--warmup-method: '%s' is not ramp, linear or constant", optarg);
            break;
        case O_WARMDECAY:
            rc = rn_cli_float("--warmup-decay", optarg, 1e-12, 1, &o.lr.warmup_decay);
            have_warmup_decay = 1;
            break;
        case O_PRINTLR: print_lr = 1; break;
        case O_SAVE: rc = rn_cli_i64("--save-every", optarg, 1, MAX_STEPS, &o.save_every); break;
        case O_LOG: o.log_path = optarg; break;
        case O_TB: o.tensorboard = optarg; break;
        case O_LOGEVERY: rc = rn_cli_int("--log-every", optarg, 1, 1000000000, &o.log_every); break;
        case O_DUMP: o.dump_grads = optarg; break;
        case O_AMP:
            if ((o.amp = rn_amp_parse(optarg)) < 0)
                rc = rn_errorf(RN_EINVAL, "--amp: '%s' is not off, fp16 or bf16", optarg);
            break;
        case O_SCALE: rc = rn_cli_float("--loss-scale", optarg, 1e-30, 1e30, &o.loss_scale); break;
        case O_SCALEINT:
            rc = rn_cli_int("--loss-scale-growth-interval", optarg, 1, INT32_MAX, &o.scale_growth_interval);
            break;
        case O_DISTTIMEOUT: rc = rn_cli_float("--dist-timeout", optarg, 1, 1e7, &dist_timeout); break;
        case O_BUCKET: rc = rn_cli_float("--bucket-mb", optarg, 0.001, 1e6, &bucket_mb); break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("rn-train %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "rn-train: see 'rn-train --help'\n"); return 2;
        }
    }
    if (rc == RN_OK && print_recipe) {
        if (!recipe_flags) {
            fprintf(stderr, "rn-train: --print-recipe needs --recipe NAME (" RECIPE_NAMES ")\n");
            free(pargv);
            return 2;
        }
        printf("rn-train");
        for (int i = 0; i < nrecipe; i++) printf(" %s", recipe_flags[i]);
        printf("\n");
        free(pargv);
        return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
    }
    if (rc == RN_OK) rc = check_flags(&o, in, print_lr, pargc - optind, pargv + optind);
    if (rc == RN_OK && have_warmup_decay && o.lr.warmup_method == RN_WARMUP_RAMP)
        rc = rn_errorf(RN_EINVAL, "--warmup-decay is the start factor of --warmup-method linear or constant; the "
                       "default ramp starts at 1/W of the schedule");
    free(pargv);
    if (rc == RN_OK && mix_flags && !(o.mix.mixup > 0) && !(o.mix.cutmix > 0))
        rc = rn_errorf(RN_EINVAL, "--mix-prob and --switch-prob need --mixup ALPHA or --cutmix ALPHA (> 0)");
    if (rc != RN_OK) {
        fprintf(stderr, "rn-train: %s\n", rn_last_error());
        return 2;
    }
    if (o.overfit_batches) {
        /* a decay every few epochs of K steps would stall the check: a constant lr unless asked */
        if (!have_schedule) o.lr.schedule = RN_LR_CONSTANT;
        if (!have_epochs && !o.max_steps) o.max_steps = RN_TRAIN_OVERFIT_STEPS;
    }
    if (o.profile) {
        o.max_steps = (int64_t)o.profile_warmup + o.profile_steps;
        have_epochs = 0;
    }
    if (print_lr) { /* as a run from epoch 0 of --lr-epochs (else --epochs) epochs */
        if (!o.lr.total_epochs) o.lr.total_epochs = o.epochs; /* as rn_train's run from epoch 0 sets it */
        if (print_lr_table(&o, o.lr.total_epochs) == RN_OK) return 0;
        fprintf(stderr, "rn-train: %s\n", rn_last_error());
        return 1;
    }
    if (!have_epochs && o.max_steps) o.epochs = 1000000; /* --max-steps alone bounds the run */
    /* the processes of the run (before any thread starts) */
    rn_dist *d = NULL;
    if (rn_dist_open(&argc, &argv, rn_cli_launcher_world(), dist_timeout, &d) != RN_OK) {
        fprintf(stderr, "rn-train: %s\n", rn_last_error());
        rn_dist_close(d);
        return 1;
    }
    rn_dist_set_bucket(d, (size_t)(bucket_mb * 1e6));
    if (rn_dist_many(d) && rn_dist_world(d) == 1)
        fprintf(stderr, "rn-train: RN_DIST_SOLO=1: this one process runs the collectives of many with itself (a "
                "check: the bits of the run without it)\n");
    o.dist = d;
    o.backend.cuda_index = rn_dist_local_rank(d); /* cuda and auto: this rank's GPU */
    o.backend.cuda_local_world = rn_dist_local_world(d);
    o.threads = rn_cli_dist_threads(o.threads, rn_dist_local_world(d)); /* the node's cores, shared */
    /* outputs checked now, not after hours of training (by rank 0, which writes them) */
    if (rn_dist_rank(d) == 0 &&
        (rn_cli_output("rn-train", o.out, stderr) != RN_OK || rn_cli_output("rn-train", o.dump_grads, stderr) != RN_OK
         || rn_cli_output("rn-train", o.profile, stderr) != RN_OK))
        return fail(d, 1);
    rn_ckpt *ck = NULL;
    if (rn_ckpt_read(in, &ck) != RN_OK) return fail(d, 1);
    if (o.ema_every && (o.ema_decay == 0 || (o.ema_decay < 0 && !ck->ema))) {
        if (o.ema_decay == 0)
            fprintf(stderr, "rn-train: --ema-every %d with --ema-decay 0 (off): give one or the other\n", o.ema_every);
        else
            fprintf(stderr, "rn-train: --ema-every %d: the moving average is off (%s holds none): give --ema-decay D "
                    "too, e.g. 0.99998\n", o.ema_every, in);
        rn_ckpt_free(ck);
        rn_dist_close(d);
        return 2;
    }
    int start_epoch = ck->train ? ck->train->epoch : 0;
    if (o.lr.total_epochs == 0) o.lr.total_epochs = start_epoch + (have_epochs || !o.max_steps ? o.epochs : 1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    o.stop = &stop_signal;
    o.progress = stderr;
    o.progress_tty = isatty(2);
    o.argc = argc;
    o.argv = argv;
    rc = rn_train(&o, ck);
    rn_ckpt_free(ck);
    if (rc == RN_EINTR) { /* every rank stopped at the same step; rank 0 saved */
        int code = stop_signal == SIGINT ? 130 : 0;
        if (rn_dist_rank(d) == 0) fprintf(stderr, "rn-train: %s\n", rn_last_error());
        rn_dist_close(d);
        return code;
    }
    if (rc != RN_OK) return fail(d, 1);
    rn_dist_close(d);
    return 0;
}
