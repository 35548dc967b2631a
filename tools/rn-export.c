/* rn-export: a checkpoint as safetensors (torchvision naming) or as an ONNX model. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/convert.h"
#include "rn/err.h"
#include "rn/onnx.h"

static void usage(FILE *f) {
    fprintf(f, "usage: rn-export [--format safetensors|onnx] [--fold-bn] [--preprocess] IN.pb OUT\n"
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
               "      --fold-bn   onnx: BN folded into the convs (conv weight and a bias per\n"
               "                  conv, <conv>.weight and <conv>.bias); no BatchNormalization\n"
               "      --preprocess  onnx: input is uint8 (N, H, W, 3), the RGB pixels rn's\n"
               "                  loader makes; the graph normalises them itself (Cast, Div 255,\n"
               "                  Sub mean, Div std, Transpose), so logits equal rn-eval's\n"
               "  -h, --help      this help\n"
               "  -V, --version   print the version\n"
               "\n"
               "Exit status: 0 success, 1 failure (message on stderr), 2 bad usage.\n");
}

enum { FMT_NONE, FMT_SAFETENSORS, FMT_ONNX };

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int main(int argc, char **argv) {
    enum { OPT_FOLD = 256, OPT_PRE };
    static const struct option opts[] = {{"format", required_argument, 0, 'f'},
                                         {"fold-bn", no_argument, 0, OPT_FOLD},
                                         {"preprocess", no_argument, 0, OPT_PRE},
                                         {"help", no_argument, 0, 'h'},
                                         {"version", no_argument, 0, 'V'},
                                         {0, 0, 0, 0}};
    rn_onnx_opts oo = {0};
    int fmt = FMT_NONE, c;
    while ((c = getopt_long(argc, argv, "f:hV", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
            if (strcmp(optarg, "safetensors") == 0) fmt = FMT_SAFETENSORS;
            else if (strcmp(optarg, "onnx") == 0) fmt = FMT_ONNX;
            else {
                fprintf(stderr, "rn-export: --format: unknown format '%s': want safetensors or onnx\n", optarg);
                return 2;
            }
            break;
        case OPT_FOLD: oo.fold_bn = 1; break;
        case OPT_PRE: oo.preprocess = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("rn-export %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "rn-export: see 'rn-export --help'\n"); return 2;
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
    if (fmt != FMT_ONNX && (oo.fold_bn || oo.preprocess)) {
        fprintf(stderr, "rn-export: %s is for ONNX output (give OUT.onnx or --format onnx)\n",
                oo.fold_bn ? "--fold-bn" : "--preprocess");
        return 2;
    }
    rn_ckpt *ck = NULL;
    int rc = rn_cli_output("rn-export", out, stderr);
    if (rc == RN_OK) rc = rn_ckpt_read(in, &ck);
    if (rc == RN_OK)
        rc = fmt == FMT_ONNX ? rn_onnx_export(ck, &oo, out) : rn_ckpt_export_safetensors(ck, out);
    rn_ckpt_free(ck);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-export: %s\n", rn_last_error());
        return 1;
    }
    return 0;
}
