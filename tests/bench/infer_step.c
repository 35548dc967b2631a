/* Inference benchmark body for make bench-infer: forwards of a random batch through the
 * inference net of MODEL.pb at SIZE x SIZE, timed after one warm-up forward, so start-up,
 * loading and data are left out (rn-eval's marginal rate).
 *   bench_infer_step MODEL.pb SIZE BATCH STEPS THREADS fast|im2col|openblas|exact
 * fast: rn-eval's inference path (RN_NET_INFER); im2col: the same with Winograd off
 * (cpu_winograd 0, RN_CPU_WINOGRAD=0); openblas: the same with its convs' GEMMs through
 * OpenBLAS (cpu_gemm, RN_CPU_GEMM=openblas); exact: the training ops with BN in inference mode
 * (RN_NET_INFER_EXACT). Prints "img/s=<x> ms=<per batch>". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rn/backend.h"
#include "rn/ckpt.h"
#include "rn/err.h"
#include "rn/net.h"
#include "rn/rng.h"

#define TRY(call) do { if ((call) != RN_OK) { fprintf(stderr, "bench_infer_step: %s: %s\n", #call, rn_last_error()); return 1; } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: bench_infer_step MODEL.pb SIZE BATCH STEPS THREADS fast|im2col|openblas|exact\n");
        return 2;
    }
    int size = atoi(argv[2]), batch = atoi(argv[3]), steps = atoi(argv[4]), threads = atoi(argv[5]);
    int mode = strcmp(argv[6], "exact") == 0 ? RN_NET_INFER_EXACT : RN_NET_INFER;
    rn_resnet spec;
    rn_ckpt *ck = NULL;
    rn_backend *be = NULL;
    rn_net *net = NULL;
    TRY(rn_ckpt_read(argv[1], &ck));
    TRY(rn_ckpt_net(ck, &spec));
    rn_backend_opts bo;
    rn_backend_opts_init(&bo);
    bo.cpu_winograd = strcmp(argv[6], "im2col") != 0;
    if (strcmp(argv[6], "openblas") == 0) bo.cpu_gemm = RN_CPU_GEMM_OPENBLAS;
    TRY(rn_backend_create("cpu", threads, &bo, &be));
    TRY(rn_net_create(be, &spec, batch, size, size, mode, RN_F32, &net));
    TRY(rn_net_load(net, ck));
    rn_ckpt_free(ck);
    rn_rng_normal(rn_rng_key(1, 2), rn_net_input(net), (int64_t)batch * size * size * 3, 0.0f, 1.0f);
    double t0 = 0;
    for (int s = 0; s <= steps; s++) {
        if (s == 1) t0 = now(); /* step 0 warms caches and the thread pools */
        TRY(rn_net_forward(net, batch, 0));
    }
    double dt = now() - t0;
    printf("img/s=%.2f ms=%.2f\n", steps * batch / dt, 1000 * dt / steps);
    rn_net_destroy(net);
    rn_backend_destroy(be);
    return 0;
}
