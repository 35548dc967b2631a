/* A CUDA runtime and NCCL for tests/gpuinfo.bats, played on the CPU: built as
 * libcudart.so.13 (-DFAKE_CUDART) and libnccl.so.2 (-DFAKE_NCCL) and put first on
 * LD_LIBRARY_PATH beside fake_nvidia.c's driver, so that rn-gpuinfo --nccl runs whole
 * where no GPU is. "Device" memory is host memory; streams finish at once; an
 * all-reduce's group runs when its last rank's call comes, each element summed in rank
 * order. Faults, by the environment:
 *   FAKE_CUDA_HANG=1     cudaStreamQuery answers "not ready" for ever (a hung all-reduce)
 *   FAKE_NCCL_FAULT=twice   rank 0's part summed twice, the last rank's left out
 *   FAKE_NCCL_FAULT=corrupt one element of the last rank's sums off by one
 *   FAKE_NCCL_FAULT=stale   only the first all-reduce of each size writes its sums
 *   FAKE_NCCL_TRACE=1    "fake nccl: ncclCommDestroy" / "ncclCommAbort" on stderr per call */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env(const char *k) {
    const char *v = getenv(k);
    return v ? v : "";
}

#ifdef FAKE_CUDART
int cudaRuntimeGetVersion(int *v) { return *v = 13000, 0; }
int cudaSetDevice(int d) { return d >= 0 ? 0 : 101; }
int cudaMalloc(void **p, size_t n) { return (*p = malloc(n ? n : 1)) ? 0 : 2; }
int cudaFree(void *p) { return free(p), 0; }
int cudaMemcpy(void *dst, const void *src, size_t n, int kind) { return (void)kind, memcpy(dst, src, n), 0; }
int cudaMemset(void *p, int v, size_t n) { return memset(p, v, n), 0; }
int cudaStreamCreate(void **s) { return *s = malloc(1), 0; }
int cudaStreamQuery(void *s) { return (void)s, strcmp(env("FAKE_CUDA_HANG"), "1") == 0 ? 600 : 0; }
int cudaStreamDestroy(void *s) { return free(s), 0; }
const char *cudaGetErrorString(int e) { return e == 600 ? "device not ready" : e ? "fake CUDA error" : "no error"; }
#endif

#ifdef FAKE_NCCL
typedef struct {
    int rank, world;
} comm;
typedef struct {
    const float *send;
    float *recv;
    size_t count;
} call;
static call pending[64];
static int npending, depth;
static size_t last_count;

int ncclGetVersion(int *v) { return *v = 22807, 0; }
const char *ncclGetErrorString(int e) { return e ? "fake NCCL error" : "no error"; }
int ncclCommInitAll(void **c, int n, const int *dev) {
    (void)dev;
    if (n < 1 || n > 64) return 4;
    for (int r = 0; r < n; r++) {
        comm *k = malloc(sizeof *k);
        k->rank = r, k->world = n;
        c[r] = k;
    }
    return 0;
}
static int finish(void *c, const char *how) {
    if (strcmp(env("FAKE_NCCL_TRACE"), "1") == 0) fprintf(stderr, "fake nccl: %s rank %d\n", how, ((comm *)c)->rank);
    free(c);
    return 0;
}
int ncclCommDestroy(void *c) { return finish(c, "ncclCommDestroy"); }
int ncclCommAbort(void *c) { return finish(c, "ncclCommAbort"); }
int ncclGroupStart(void) { return depth++, 0; }

/* every rank's call has come: the sums, rank 0 first */
static void reduce(int world) {
    const char *fault = env("FAKE_NCCL_FAULT");
    size_t n = pending[0].count;
    int stale = strcmp(fault, "stale") == 0 && n == last_count;
    last_count = n;
    const float *part[64];
    for (int r = 0; r < world; r++)
        part[r] = strcmp(fault, "twice") == 0 && r == world - 1 ? pending[0].send : pending[r].send;
    for (size_t i = 0; i < n && !stale; i++) {
        float acc = part[0][i];
        for (int r = 1; r < world; r++)
            acc += part[r][i];
        for (int r = 0; r < world; r++)
            pending[r].recv[i] = acc;
    }
    if (strcmp(fault, "corrupt") == 0) pending[world - 1].recv[n / 2] += 1.0f;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *c, void *stream) {
    (void)stream;
    comm *k = c;
    if (dtype != 7 || op != 0 || !depth) return 4; /* fp32 sums inside a group only */
    pending[k->rank] = (call){send, recv, count};
    npending++;
    return 0;
}
int ncclGroupEnd(void) {
    if (!depth) return 4;
    if (--depth == 0 && npending) {
        int world = npending;
        for (int r = 0; r < world; r++)
            if (pending[r].count != pending[0].count) return 4;
        reduce(world);
        npending = 0;
    }
    return 0;
}
#endif
