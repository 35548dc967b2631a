/* rn-init: create a checkpoint with torchvision's initialisation, or import
 * torchvision-named weights from a safetensors file or a torch.save'd .pth. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/convert.h"
#include "rn/err.h"
#include "rn/pth.h"

#define DEFAULT_ARCH "resnet50"
#define DEFAULT_CLASSES 1000
#define DEFAULT_SEED 0

static void usage(FILE *f) {
    fprintf(f,
            "usage: rn-init [--arch A] [--classes N] [--seed S] [--zero-init-residual] -o OUT.pb\n"
            "       rn-init --from WEIGHTS.pth|WEIGHTS.safetensors [--arch A] [--reset-fc N] [--seed S] -o OUT.pb\n"
            "\n"
            "Create a ResNet checkpoint initialised as torchvision does (conv kaiming-normal fan_out,\n"
            "BN weight 1 bias 0, fc uniform +-1/sqrt(fan_in)), or import pretrained weights that use\n"
            "torchvision's names (F32, F16 or BF16; num_batches_tracked I64).\n"
            "\n"
            "--from reads a state_dict saved with torch.save (the zip format of torch >= 1.6, as\n"
            "torchvision's resnet50-*.pth) or safetensors, told apart by the file's first bytes. A .pth\n"
            "is read by rn's own restricted unpickler: tensors, storages and OrderedDict only, nothing\n"
            "in it is run; a whole model (torch.save(model)) or the legacy format is refused with the\n"
            "python3 line that re-saves it.\n"
            "\n"
            "  -a, --arch A              resnet18|resnet34|resnet50|resnet101|resnet152 (default %s;\n"
            "                            with --from: the file's metadata, else guessed from its names)\n"
            "  -c, --classes N           number of classes (default %d)\n"
            "  -s, --seed S              random seed (default %d); the same seed gives identical bytes\n"
            "  -z, --zero-init-residual  zero the last BN weight of each residual block\n"
            "  -f, --from FILE           import a torchvision state_dict: a .pth (torch.save) or\n"
            "                            safetensors file\n"
            "  -r, --reset-fc N          with --from: replace the classifier by a new N-class one\n"
            "                            (fine-tuning); its weights come from --seed\n"
            "  -o, --output OUT.pb       where to write the checkpoint (\"-\" for stdout); written\n"
            "                            atomically, an existing file is replaced only on success\n"
            "  -h, --help                this help\n"
            "  -V, --version             print the version\n"
            "\n"
            "Exit status: 0 success, 1 failure (message on stderr), 2 bad usage.\n",
            DEFAULT_ARCH, DEFAULT_CLASSES, DEFAULT_SEED);
}

/* The flags that only make sense together, checked once every flag is read. */
static int check_flags(const char *out, const char *from, int have_classes, int zero_init, int reset_fc, int nargs,
                       char **args) {
    if (nargs) return rn_errorf(RN_EINVAL, "unexpected argument '%s' (the output goes after -o)", args[0]);
    if (!out) return rn_errorf(RN_EINVAL, "no output given: add -o OUT.pb");
    if (from && (have_classes || zero_init))
        return rn_errorf(RN_EINVAL, "--classes and --zero-init-residual do not apply to --from (use --reset-fc N)");
    if (!from && reset_fc) return rn_errorf(RN_EINVAL, "--reset-fc needs --from WEIGHTS.pth or WEIGHTS.safetensors");
    return RN_OK;
}

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"arch", required_argument, 0, 'a'},     {"classes", required_argument, 0, 'c'},
        {"seed", required_argument, 0, 's'},     {"zero-init-residual", no_argument, 0, 'z'},
        {"from", required_argument, 0, 'f'},     {"reset-fc", required_argument, 0, 'r'},
        {"output", required_argument, 0, 'o'},   {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},        {0, 0, 0, 0},
    };
    const char *arch = NULL, *from = NULL, *out = NULL;
    int classes = DEFAULT_CLASSES, seed = DEFAULT_SEED, reset_fc = 0;
    int zero_init = 0, have_classes = 0, c, rc = RN_OK;
    while (rc == RN_OK && (c = getopt_long(argc, argv, "a:c:s:zf:r:o:hV", opts, NULL)) != -1) {
        switch (c) {
        case 'a': arch = optarg; break;
        case 'c':
            rc = rn_cli_int("--classes", optarg, 1, 1 << 24, &classes);
            have_classes = 1;
            break;
        case 's': rc = rn_cli_int("--seed", optarg, 0, INT32_MAX, &seed); break;
        case 'z': zero_init = 1; break;
        case 'f': from = optarg; break;
        case 'r': rc = rn_cli_int("--reset-fc", optarg, 1, 1 << 24, &reset_fc); break;
        case 'o': out = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("rn-init %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "rn-init: see 'rn-init --help'\n"); return 2;
        }
    }
    if (rc == RN_OK) rc = check_flags(out, from, have_classes, zero_init, reset_fc, argc - optind, argv + optind);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-init: %s\n", rn_last_error());
        return 2;
    }

    if (rn_cli_output("rn-init", out, stderr) != RN_OK) {
        fprintf(stderr, "rn-init: %s\n", rn_last_error());
        return 1;
    }
    rn_ckpt *ck = NULL;
    rn_resnet net;
    if (from) {
        rn_safetensors *st = NULL;
        rc = rn_weights_read(from, &st);
        if (rc == RN_OK) {
            rc = rn_ckpt_from_safetensors(st, arch, reset_fc, (uint64_t)seed, &ck);
            if (rc != RN_OK) rn_error_context(rc, "%s", from);
            rn_st_free(st);
        }
    } else {
        rc = rn_resnet_build(&net, arch ? arch : DEFAULT_ARCH, classes);
        if (rc == RN_OK) rc = rn_ckpt_new(&net, &ck);
        if (rc == RN_OK) rc = rn_ckpt_init(ck, &net, (uint64_t)seed, zero_init);
    }
    if (rc == RN_OK) rc = rn_ckpt_set_provenance(ck, argc, argv, from, 0);
    if (rc == RN_OK) rc = rn_ckpt_write(out, ck);
    rn_ckpt_free(ck);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-init: %s\n", rn_last_error());
        return rc == RN_EINVAL && !from ? 2 : 1;
    }
    return 0;
}
