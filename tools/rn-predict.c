/* rn-predict: the top classes of a checkpoint for each image file. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/imgfile.h"
#include "rn/json.h"
#include "rn/predict.h"

static void usage(FILE *f) {
    fprintf(f, "usage: rn-predict --ckpt MODEL.pb [options] IMAGE...\n"
               "\n"
               "The most probable classes for each image, with the eval transform (shorter side to\n"
               "--resize, centre crop --crop, ImageNet normalisation) and the class names stored in\n"
               "the checkpoint (rn-train copies them from the training set). One line per class:\n"
               "  IMAGE<TAB>rank<TAB>probability<TAB>class index<TAB>class name\n"
               "An image that cannot be read is reported on stderr and skipped (exit 1 at the end).\n"
               "This build reads %s files, with the pixels of PIL's Image.open(f).convert(\"RGB\")\n"
               "(alpha dropped).\n"
               "\n"
               "  -c, --ckpt MODEL.pb   checkpoint\n"
               "  -k, --topk K          classes per image (default 5)\n"
               "      --crop S          centre crop (default 224)\n"
               "      --resize N        shorter side before the crop (default round(S*256/224); 0: none)\n"
               "      --max-pixels N    refuse images over N pixels, before decoding (default 100000000)\n"
               "  -j, --json            one JSON object per image: {\"image\", \"top\": [{\"class\",\n"
               "                        \"name\", \"p\"}]}\n"
               "  -t, --threads N       compute threads on the CPU (default: all cores)\n"
               "      --device D        auto, cpu, cuda or cuda:N (default auto)\n"
               "  -h, --help            this help\n"
               "  -V, --version         print the version\n"
               "\n"
               "Environment (CPU): RN_CPU_GEMM=own|avx2|portable|openblas runs the convolutions and\n"
               "  the fc on rn's own kernel at AVX-512, AVX2 or in C on aarch64 (own, the default\n"
               "  where the CPU has one), in its AVX2 or C form only (the same bytes) or through\n"
               "  OpenBLAS;\n"
               "  RN_CPU_WINOGRAD=0 the larger 3x3 ones as im2col + GEMM instead of Winograd\n"
               "  F(4x4,3x3) or F(2x2,3x3) (1, the default), 2 as F(2x2,3x3) only. Each changes\n"
               "  the logits by rounding only.\n"
               "\n"
               "Exit status: 0 success, 1 failure (or an unreadable image), 2 bad usage.\n", rn_imgfile_formats());
}

/* The flags that only make sense together, checked once every flag is read. */
static int check_flags(const char *ckpt, int nimages) {
    if (!ckpt || !nimages) return rn_errorf(RN_EINVAL, "--ckpt and at least one IMAGE are required (see --help)");
    return RN_OK;
}

int main(int argc, char **argv) {
    enum { O_CROP = 256, O_RESIZE, O_DEVICE, O_MAXPIX };
    static const struct option opts[] = {
        {"ckpt", required_argument, 0, 'c'},   {"topk", required_argument, 0, 'k'},
        {"crop", required_argument, 0, O_CROP}, {"resize", required_argument, 0, O_RESIZE},
        {"json", no_argument, 0, 'j'},         {"threads", required_argument, 0, 't'},
        {"device", required_argument, 0, O_DEVICE}, {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},      {"max-pixels", required_argument, 0, O_MAXPIX},
        {0, 0, 0, 0},
    };
    const char *ckpt = NULL;
    rn_predict_opts po;
    rn_predict_defaults(&po);
    /* the documented RN_* overrides first, so that flags win */
    int64_t max_pixels = (int64_t)po.max_pixels;
    int topk = 5, json = 0, c, rc = rn_cli_backend_env(&po.backend);
    while (rc == RN_OK && (c = getopt_long(argc, argv, "c:k:jt:hV", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'k': rc = rn_cli_int("--topk", optarg, 1, 1 << 20, &topk); break;
        case O_CROP: rc = rn_cli_int("--crop", optarg, 8, 4096, &po.crop); break;
        case O_RESIZE: rc = rn_cli_int("--resize", optarg, 0, 16384, &po.resize); break;
        case O_MAXPIX: rc = rn_cli_i64("--max-pixels", optarg, 1, (int64_t)1 << 40, &max_pixels); break;
        case 'j': json = 1; break;
        case 't': rc = rn_cli_int("--threads", optarg, 1, 1024, &po.threads); break;
        case O_DEVICE: po.device = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("rn-predict %s\n", RN_VERSION); return 0;
        default: fprintf(stderr, "rn-predict: see 'rn-predict --help'\n"); return 2;
        }
    }
    if (rc == RN_OK) rc = check_flags(ckpt, argc - optind);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-predict: %s\n", rn_last_error());
        return 2;
    }
    po.max_pixels = (uint64_t)max_pixels;
    rn_ckpt *ck = NULL;
    rn_predictor *pr = NULL;
    rc = rn_ckpt_read(ckpt, &ck);
    if (rc == RN_OK) rc = rn_predictor_open(ck, &po, &pr);
    if (rc != RN_OK) {
        fprintf(stderr, "rn-predict: %s\n", rn_last_error());
        rn_ckpt_free(ck);
        return 1;
    }
    int K = ck->model->num_classes, bad = 0;
    if (topk > K) topk = K;
    float *p = malloc(sizeof(float) * (size_t)K);
    int *order = malloc(sizeof(int) * (size_t)K);
    if (!p || !order) rc = rn_errorf(RN_ENOMEM, "out of memory");
    for (int i = optind; i < argc && rc == RN_OK; i++) {
        uint8_t *data = NULL;
        size_t len = 0;
        int r = rn_file_read(argv[i], &data, &len);
        if (r == RN_OK) r = rn_predictor_image(pr, data, len);
        free(data);
        if (r != RN_OK) {
            fprintf(stderr, "rn-predict: %s: %s\n", argv[i], rn_last_error());
            bad++;
            continue;
        }
        if ((rc = rn_predictor_run(pr, p))) break;
        /* partial selection sort: top-k indices by probability, ties to the lower index */
        for (int k = 0; k < K; k++) order[k] = k;
        for (int k = 0; k < topk; k++) {
            int best = k;
            for (int m = k + 1; m < K; m++)
                if (p[order[m]] > p[order[best]]) best = m;
            int t = order[k];
            order[k] = order[best];
            order[best] = t;
        }
        if (json) {
            printf("{\"image\":");
            rn_json_string(stdout, argv[i]);
            printf(",\"top\":[");
        }
        for (int k = 0; k < topk; k++) {
            int cl = order[k];
            const char *name = (size_t)cl < ck->n_class_names ? ck->class_names[cl] : "";
            if (json) {
                printf("%s{\"class\":%d,\"name\":", k ? "," : "", cl);
                rn_json_string(stdout, name);
                printf(",\"p\":%.6f}", p[cl]);
            } else {
                printf("%s\t%d\t%.4f\t%d\t%s\n", argv[i], k + 1, p[cl], cl, name);
            }
        }
        if (json) printf("]}\n");
    }
    if (rc != RN_OK) fprintf(stderr, "rn-predict: %s\n", rn_last_error());
    free(p);
    free(order);
    rn_predictor_close(pr);
    rn_ckpt_free(ck);
    return rc != RN_OK || bad ? 1 : 0;
}
