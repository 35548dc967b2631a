/* A stand-in for libnvidia-ml.so.1 for tests on machines without a GPU (tests/cuda.bats):
 * the five calls tests/bench/gpu_watch.py makes, one device, always 87% busy, 4 GiB in use
 * at the first memory read and 5 GiB after it. Build: cc -shared -fPIC -o
 * DIR/libnvidia-ml.so.1 tests/gpu/fake-nvml.c, then LD_LIBRARY_PATH=DIR. */
typedef struct {
    unsigned gpu, memory;
} util_t;
typedef struct {
    unsigned long long total, free, used;
} mem_t;

static int reads;

int nvmlInit_v2(void) { return 0; }
const char *nvmlErrorString(int rc) { return rc == 2 ? "Invalid Argument" : "Unknown Error"; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
    if (i) return 2;
    *h = (void *)1;
    return 0;
}
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) {
    (void)h;
    u->gpu = 87;
    u->memory = 40;
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    (void)h;
    m->total = 1ULL << 36;
    m->used = (reads++ ? 5ULL : 4ULL) << 30;
    m->free = m->total - m->used;
    return 0;
}
