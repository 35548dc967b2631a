/* A pretend NVIDIA driver for the tests (tests/gpuinfo.bats, tests/troubleshoot.bats):
 * built as libcuda.so.1 with -DFAKE_CUDA and as libnvidia-ml.so.1 without, and put first
 * on LD_LIBRARY_PATH. FAKE_CU_INIT (cuInit's result), FAKE_CU_DRIVER (the CUDA it
 * supports), FAKE_CU_NDEV (devices), FAKE_NVML_UTIL (utilisation, below). Two GPUs on
 * 0000:0A:00.0 and 0000:0B:00.0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int env(const char *k, int d) { const char *v = getenv(k); return v ? atoi(v) : d; }
#ifdef FAKE_CUDA
int cuInit(unsigned f) { (void)f; return env("FAKE_CU_INIT", 0); }
int cuDriverGetVersion(int *v) { *v = env("FAKE_CU_DRIVER", 13000); return 0; }
int cuGetErrorName(int e, const char **s) {
    *s = e == 0 ? "CUDA_SUCCESS" : e == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN"; return 0; }
int cuDeviceGetCount(int *n) { *n = env("FAKE_CU_NDEV", 2); return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *s, int n, int d) { snprintf(s, n, "Fake GPU %d", d); return 0; }
int cuDeviceGetAttribute(int *v, int a, int d) {
    (void)d;
    switch (a) { case 75: *v = 9; return 0; case 76: *v = 0; return 0; case 16: *v = 132; return 0;
                 case 20: *v = 0; return 0; case 36: *v = 2619000; return 0; case 37: *v = 5120; return 0; }
    return 1; }
int cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = (size_t)80 << 30; return 0; }
int cuDeviceGetPCIBusId(char *s, int n, int d) { snprintf(s, n, "0000:%02X:00.0", 10 + d); return 0; }
int cuDeviceGetUuid_v2(unsigned char *u, int d) { memset(u, 0x11 * (d + 1), 16); return 0; }
int cuDeviceCanAccessPeer(int *c, int d, int p) { *c = d != p; return 0; }
#else
static int dev[2] = {0, 1};
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int e) { return e ? "fake error" : "Success"; }
int nvmlSystemGetDriverVersion(char *s, unsigned n) { snprintf(s, n, "580.65.06"); return 0; }
int nvmlSystemGetNVMLVersion(char *s, unsigned n) { snprintf(s, n, "13.580.65.06"); return 0; }
int nvmlDeviceGetHandleByPciBusId_v2(const char *b, void **h) {
    if (strstr(b, ":0A:")) *h = &dev[0]; else if (strstr(b, ":0B:")) *h = &dev[1]; else return 6;
    return 0; }
typedef struct { unsigned long long total, free, used; } mem;
int nvmlDeviceGetMemoryInfo(void *h, mem *m) {
    m->total = 80ULL << 30; m->used = (1ULL << 30) * (1 + *(int *)h); m->free = m->total - m->used; return 0; }
int nvmlDeviceGetClockInfo(void *h, int t, unsigned *v) { (void)h; *v = t == 1 ? 1980 : 2619; return 0; }
int nvmlDeviceGetMaxClockInfo(void *h, int t, unsigned *v) { (void)h; *v = t == 1 ? 1980 : 2619; return 0; }
int nvmlDeviceGetTemperature(void *h, int t, unsigned *v) { (void)t; *v = 40 + *(int *)h; return 0; }
int nvmlDeviceGetPowerUsage(void *h, unsigned *v) { (void)h; *v = 312400; return 0; }
int nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned *v) { (void)h; *v = 700000; return 0; }
typedef struct { unsigned gpu, memory; } util;
/* FAKE_NVML_UTIL="10,30,80": successive calls answer 10, 30, 80, 10, ... (default 97) */
int nvmlDeviceGetUtilizationRates(void *h, util *u) {
    static int call;
    const char *v = getenv("FAKE_NVML_UTIL");
    (void)h;
    u->gpu = 97, u->memory = 41;
    if (v && *v) {
        int n = 1, k;
        for (const char *p = v; *p; p++) n += *p == ',';
        k = call++ % n;
        while (k-- > 0) v = strchr(v, ',') + 1;
        u->gpu = (unsigned)atoi(v);
    }
    return 0; }
int nvmlDeviceGetEccMode(void *h, int *c, int *p) { (void)h; *c = *p = 1; return 0; }
int nvmlDeviceGetTotalEccErrors(void *h, int t, int c, unsigned long long *v) { (void)h; (void)t; (void)c; *v = 0; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *r) { *r = *(int *)h ? 0x4 : 0; return 0; }
int nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *v) { (void)h; *v = 5; return 0; }
int nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *v) { (void)h; *v = 16; return 0; }
#endif
