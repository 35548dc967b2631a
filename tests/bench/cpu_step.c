/* CPU benchmark body for make bench-cpu: ResNet training steps (forward, backward, SGD)
 * or eval forwards on random input, timed after one warm-up step.
 *   bench_cpu_step ARCH SIZE BATCH STEPS THREADS train|eval
 * The context takes RN_CPU_GEMM and the rest from the environment, as the tools do.
 * Prints "img/s=<x> peak_rss_mib=<y> net_mib=<z> blas=<OpenBLAS kernel> gemm=<what runs
 * the GEMMs: rn-AVX-512, rn-AVX2 or OpenBLAS>". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <cblas.h>

#include "rn/backend.h"
#include "rn/ckpt.h"
#include "rn/cli.h"
#include "rn/err.h"
#include "rn/net.h"
#include "rn/rng.h"

#define TRY(call) do { if ((call) != RN_OK) { fprintf(stderr, "bench_cpu_step: %s: %s\n", #call, rn_last_error()); return 1; } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: bench_cpu_step ARCH SIZE BATCH STEPS THREADS train|eval\n");
        return 2;
    }
    int size = atoi(argv[2]), batch = atoi(argv[3]), steps = atoi(argv[4]), threads = atoi(argv[5]);
    int train = strcmp(argv[6], "train") == 0;
    rn_resnet spec;
    rn_ckpt *ck = NULL;
    rn_backend *be = NULL;
    rn_net *net = NULL;
    TRY(rn_resnet_build(&spec, argv[1], 1000));
    TRY(rn_ckpt_new(&spec, &ck));
    TRY(rn_ckpt_init(ck, &spec, 0, 0));
    rn_backend_opts o;
    rn_backend_opts_init(&o);
    TRY(rn_cli_backend_env(&o));
    TRY(rn_backend_create("cpu", threads, &o, &be));
    TRY(rn_net_create(be, &spec, batch, size, size, train ? RN_NET_TRAIN : RN_NET_INFER, RN_F32, &net));
    TRY(rn_net_load(net, ck));
    rn_ckpt_free(ck);
    int64_t nx = (int64_t)batch * size * size * 3;
    rn_rng_normal(rn_rng_key(1, 2), rn_net_input(net), nx, 0.0f, 1.0f);
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)batch);
    for (int i = 0; i < batch; i++) labels[i] = (i * 37) % 1000;
    double t0 = 0;
    for (int s = 0; s <= steps; s++) {
        if (s == 1) t0 = now(); /* step 0 warms caches and the thread pools */
        float loss;
        TRY(rn_net_forward(net, batch, train));
        if (train) {
            TRY(rn_net_backward(net, labels, batch, 0.0f, 1.0f, 0, &loss));
            TRY(rn_net_step(net, NULL, 0.01f, 0.9f, 1e-4f, 0, 0, NULL));
        }
    }
    double dt = now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const char *name = rn_backend_name(be);
    const char *gemm = strstr(name, "AVX-512") ? "rn-AVX-512"
                       : strstr(name, "AVX2")  ? "rn-AVX2"
                       : strstr(name, "portable") ? "rn-portable"
                                                  : "OpenBLAS";
    printf("img/s=%.2f peak_rss_mib=%.1f net_mib=%.1f blas=%s gemm=%s\n", steps * batch / dt,
           ru.ru_maxrss / 1024.0, rn_net_bytes(net) / 1048576.0, openblas_get_corename(), gemm);
    free(labels);
    rn_net_destroy(net);
    rn_backend_destroy(be);
    return 0;
}
