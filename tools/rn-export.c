/* rn-export: a checkpoint's parameters and buffers as safetensors, in torchvision naming. */
#include <getopt.h>
#include <stdio.h>

#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/convert.h"
#include "rn/err.h"

static void usage(FILE *f) {
    fprintf(f, "usage: rn-export IN.pb OUT.safetensors\n"
               "\n"
               "Write the parameters and BN buffers of a checkpoint as a safetensors file with\n"
               "torchvision's names and layouts, in state_dict order, the model spec (arch,\n"
               "num_classes, zero_init_residual) in its metadata. In Python:\n"
               "  from safetensors.torch import load_file   # or any safetensors reader\n"
               "  torchvision.models.resnet50(num_classes=N).load_state_dict(load_file(OUT), strict=True)\n"
               "IN may be \"-\" (stdin), OUT may be \"-\" (stdout); OUT is written atomically.\n"
               "\n"
               "  -h, --help     this help\n"
               "  -V, --version  print the version\n"
               "\n"
               "Exit status: 0 success, 1 failure (message on stderr), 2 bad usage.\n");
}

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"help", no_argument, 0, 'h'}, {"version", no_argument, 0, 'V'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "hV", opts, NULL)) != -1) {
        switch (c) {
        case 'h': usage(stdout); return 0;
        case 'V': printf("rn-export %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "rn-export: see 'rn-export --help'\n"); return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "rn-export: expected IN.pb OUT.safetensors (see --help)\n");
        return 2;
    }
    rn_ckpt *ck = NULL;
    int rc = rn_cli_output("rn-export", argv[optind + 1], stderr);
    if (rc == RN_OK) rc = rn_ckpt_read(argv[optind], &ck);
    if (rc == RN_OK) rc = rn_ckpt_export_safetensors(ck, argv[optind + 1]);
    rn_ckpt_free(ck);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-export: %s\n", rn_last_error());
        return 1;
    }
    return 0;
}
