/* rn-export: a checkpoint as safetensors (torchvision naming) or as an ONNX model. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/convert.h"
#include "rn/err.h"
#include "rn/onnx.h"
#include "rn/state.h"

/* calibration defaults, each next to its flag in the usage */
#define DEF_CALIB_BATCHES 10
#define DEF_PERCENTILE 99.99
#define DEF_BATCH 32
#define DEF_CROP 224
#define DEF_WORKERS 4

static void usage(FILE *f) {
    fprintf(f,
            "usage: rn-export [--format safetensors|onnx] [--ema] [--fold-bn] [--preprocess]\n"
            "                 [--int8 --calib DATA.lmdb [calibration options]] IN.pb OUT\n"
            "\n"
            "safetensors (default; OUT.safetensors): the parameters and BN buffers of a\n"
            "checkpoint with torchvision's names and layouts, in state_dict order, the model\n"
            "spec (arch, num_classes, zero_init_residual) in its metadata. In Python:\n"
            "  from safetensors.torch import load_file   # or any safetensors reader\n"
            "  torchvision.models.resnet50(num_classes=N).load_state_dict(load_file(OUT), strict=True)\n"
            "\n"
            "onnx (--format onnx, or OUT ending in .onnx): the inference graph, opset 17:\n"
            "Conv, BatchNormalization, Relu, MaxPool, Add, GlobalAveragePool, Flatten, Gemm,\n"
            "initializers in torchvision's names. Input \"input\": float (N, 3, H, W),\n"
            "normalised as rn does ((x/255 - mean) / std, ImageNet mean/std); N, H, W free.\n"
            "Output \"logits\": float (N, num_classes). metadata_props: arch, num_classes,\n"
            "class_names (a JSON array of strings), input (the input's layout in words).\n"
            "\n"
            "IN may be \"-\" (stdin), OUT may be \"-\" (stdout); OUT is written atomically.\n"
            "\n"
            "  -f, --format F  safetensors or onnx (default: onnx for OUT.onnx, else\n"
            "                  safetensors); contradicting OUT's extension is an error\n"
            "      --ema       the checkpoint's moving average of the weights (rn-train\n"
            "                  --ema-decay; its BN statistics too) instead of its weights,\n"
            "                  in either format; an error when IN holds none\n"
            "      --fold-bn   onnx: BN folded into the convs (conv weight and a bias per\n"
            "                  conv, <conv>.weight and <conv>.bias); no BatchNormalization\n"
            "      --preprocess  onnx: input is uint8 (N, H, W, 3), the RGB pixels rn's\n"
            "                  loader makes; the graph normalises them itself (Cast, Div 255,\n"
            "                  Sub mean, Div std, Transpose), so logits equal rn-eval's\n"
            "      --int8      onnx: a static int8 QDQ model (BN folded): weights int8 per\n"
            "                  output channel, activations per tensor with scales from\n"
            "                  running the checkpoint over --calib (rn-eval's transform)\n"
            "      --calib DATA.lmdb  --int8: the calibration images (an rn-prep dataset)\n"
            "      --calib-batches N  batches of --batch images from its start (default %d)\n"
            "      --calib-method M   minmax (the largest magnitude, default) or percentile\n"
            "                  (the --percentile share of the magnitudes)\n"
            "      --percentile P     for --calib-method percentile (default %g)\n"
            "  -b, --batch N   calibration images per forward (default %d)\n"
            "      --crop S    calibration crop, as rn-eval's (default %d)\n"
            "      --resize N  calibration resize of the shorter side, as rn-eval's\n"
            "                  (default round(S*256/224); 0: none)\n"
            "  -w, --workers N calibration loader threads (default %d)\n"
            "  -t, --threads N calibration compute threads (default: all cores)\n"
            "  -h, --help      this help\n"
            "  -V, --version   print the version\n"
            "\n"
            "Exit status: 0 success, 1 failure (message on stderr), 2 bad usage.\n",
            DEF_CALIB_BATCHES, DEF_PERCENTILE, DEF_BATCH, DEF_CROP, DEF_WORKERS);
}

enum { FMT_NONE, FMT_SAFETENSORS, FMT_ONNX };

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int main(int argc, char **argv) {
    enum {
        OPT_FOLD = 256, OPT_PRE, OPT_INT8, OPT_CALIB, OPT_CBATCHES, OPT_METHOD, OPT_PCT, OPT_CROP, OPT_RESIZE, OPT_EMA
    };
    static const struct option opts[] = {{"format", required_argument, 0, 'f'},
                                         {"fold-bn", no_argument, 0, OPT_FOLD},
                                         {"ema", no_argument, 0, OPT_EMA},
                                         {"preprocess", no_argument, 0, OPT_PRE},
                                         {"int8", no_argument, 0, OPT_INT8},
                                         {"calib", required_argument, 0, OPT_CALIB},
                                         {"calib-batches", required_argument, 0, OPT_CBATCHES},
                                         {"calib-method", required_argument, 0, OPT_METHOD},
                                         {"percentile", required_argument, 0, OPT_PCT},
                                         {"batch", required_argument, 0, 'b'},
                                         {"crop", required_argument, 0, OPT_CROP},
                                         {"resize", required_argument, 0, OPT_RESIZE},
                                         {"workers", required_argument, 0, 'w'},
                                         {"threads", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {"version", no_argument, 0, 'V'},
                                         {0, 0, 0, 0}};
    rn_onnx_opts oo = {0};
    rn_onnx_calib_opts co = {.batches = DEF_CALIB_BATCHES,
                             .batch = DEF_BATCH,
                             .crop = DEF_CROP,
                             .resize = -1,
                             .workers = DEF_WORKERS,
                             .method = RN_CALIB_MINMAX,
                             .percentile = DEF_PERCENTILE};
    int fmt = FMT_NONE, c, int8 = 0, bad = 0, ema = 0;
    while ((c = getopt_long(argc, argv, "f:b:w:t:hV", opts, NULL)) != -1) {
        switch (c) {
        case OPT_INT8: int8 = 1; break;
        case OPT_CALIB: co.data = optarg; break;
        case OPT_CBATCHES: bad = rn_cli_int("--calib-batches", optarg, 1, 1 << 20, &co.batches); break;
        case OPT_PCT: bad = rn_cli_float("--percentile", optarg, 1e-9, 100, &co.percentile); break;
        case 'b': bad = rn_cli_int("--batch", optarg, 1, 1 << 16, &co.batch); break;
        case OPT_CROP: bad = rn_cli_int("--crop", optarg, 1, 1 << 14, &co.crop); break;
        case OPT_RESIZE: bad = rn_cli_int("--resize", optarg, 0, 16384, &co.resize); break;
        case 'w': bad = rn_cli_int("--workers", optarg, 0, 1024, &co.workers); break;
        case 't': bad = rn_cli_int("--threads", optarg, 0, 1024, &co.threads); break;
        case OPT_METHOD:
            if (strcmp(optarg, "minmax") == 0)
                co.method = RN_CALIB_MINMAX;
            else if (strcmp(optarg, "percentile") == 0)
                co.method = RN_CALIB_PERCENTILE;
            else {
                fprintf(stderr, "rn-export: --calib-method: unknown method '%s': want minmax or percentile\n", optarg);
                return 2;
            }
            break;
        case 'f':
            if (strcmp(optarg, "safetensors") == 0)
                fmt = FMT_SAFETENSORS;
            else if (strcmp(optarg, "onnx") == 0)
                fmt = FMT_ONNX;
            else {
                fprintf(stderr, "rn-export: --format: unknown format '%s': want safetensors or onnx\n", optarg);
                return 2;
            }
            break;
        case OPT_FOLD: oo.fold_bn = 1; break;
        case OPT_EMA: ema = 1; break;
        case OPT_PRE: oo.preprocess = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("rn-export %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "rn-export: see 'rn-export --help'\n"); return 2;
        }
        if (bad) {
            fprintf(stderr, "rn-export: %s\n", rn_last_error());
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "rn-export: expected IN.pb OUT (see --help)\n");
        return 2;
    }
    const char *in = argv[optind], *out = argv[optind + 1];
    int ext = ends_with(out, ".onnx") ? FMT_ONNX : ends_with(out, ".safetensors") ? FMT_SAFETENSORS : FMT_NONE;
    if (fmt != FMT_NONE && ext != FMT_NONE && fmt != ext) {
        fprintf(stderr, "rn-export: --format %s, but %s ends in .%s (rename OUT or drop --format)\n",
                fmt == FMT_ONNX ? "onnx" : "safetensors", out, ext == FMT_ONNX ? "onnx" : "safetensors");
        return 2;
    }
    if (fmt == FMT_NONE) fmt = ext == FMT_ONNX ? FMT_ONNX : FMT_SAFETENSORS;
    if (fmt != FMT_ONNX && (oo.fold_bn || oo.preprocess || int8)) {
        fprintf(stderr, "rn-export: %s is for ONNX output (give OUT.onnx or --format onnx)\n",
                oo.fold_bn      ? "--fold-bn"
                : oo.preprocess ? "--preprocess"
                                : "--int8");
        return 2;
    }
    if (int8 != (co.data != NULL)) {
        fprintf(stderr, "rn-export: %s\n",
                int8 ? "--int8 needs --calib DATA.lmdb (images to measure the activations on)"
                     : "--calib is for --int8");
        return 2;
    }
    rn_ckpt *ck = NULL;
    rn_onnx_ranges ranges;
    int rc;
    if ((rc = rn_cli_output("rn-export", out, stderr))) goto fail;
    if ((rc = rn_ckpt_read(in, &ck))) goto fail;
    if (ema && (rc = rn_state_use_ema(ck, in))) goto fail;
    if (int8) {
        if ((rc = rn_onnx_calibrate(ck, &co, &ranges))) goto fail;
        oo.int8 = &ranges;
    }
    rc = fmt == FMT_ONNX ? rn_onnx_export(ck, &oo, out) : rn_ckpt_export_safetensors(ck, out);
fail:
    rn_ckpt_free(ck);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-export: %s\n", rn_last_error());
        return 1;
    }
    return 0;
}
