/* gpuinfo: probing never fails for want of a GPU, the verdict agrees with the problems
 * listed, and the writers produce what the header promises on any machine. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/err.h"
#include "rn/gpuinfo.h"

static char *render(const rn_gpuinfo *g, int json, int *rc) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    *rc = json ? rn_gpuinfo_write_json(g, f) : rn_gpuinfo_write_text(g, f);
    fclose(f);
    return buf;
}

int main(void) {
    rn_gpuinfo *g = NULL;
    CHECK_OK(rn_gpuinfo_probe(&g));
    CHECK(g != NULL, "probe gave no result");
    if (!g) return check_done("test_gpuinfo");

    int st = rn_gpuinfo_status(g);
    CHECK(st == (g->nproblems ? g->problem[0].code : 0), "status %d, first problem %d", st,
          g->nproblems ? g->problem[0].code : 0);
    CHECK(st == 0 || (st >= 3 && st <= 8), "status %d is not a documented exit code", st);
    CHECK(strcmp(rn_gpuinfo_status_name(st), "unknown") != 0, "status %d has no name", st);
    CHECK(strcmp(rn_gpuinfo_status_name(1), "unknown") == 0, "1 is the tools' failure status, not a verdict");
    for (int i = 0; i < g->nproblems; i++) {
        CHECK(g->problem[i].message[0] != 0, "problem %d has no message", i);
        CHECK(g->problem[i].fix[0] != 0, "problem %d (%s) has no fix", i, g->problem[i].message);
    }
#if defined(RN_HAVE_CUDA) && RN_HAVE_CUDA
    CHECK(g->built_with_cuda == 1 && g->built_cudart > 0, "a CUDA build records its CUDA version");
#else
    CHECK(st == RN_GPUINFO_NO_BUILD_GPU, "a build without CUDA must say so first, got %d", st);
#endif
    for (int i = 0; i < RN_GPULIB_COUNT; i++) {
        const rn_gpulib *l = &g->lib[i];
        CHECK(l->key && l->title && l->soname[0], "library %d is not named", i);
        CHECK(l->loaded ? l->path[0] == '/' || strchr(l->path, '/') != NULL : l->error[0] != 0,
              "%s: a loaded library has a path, a missing one a reason (path '%s', error '%s')", l->soname, l->path,
              l->error);
    }
    if (!g->lib[RN_GPULIB_CUDA].loaded)
        CHECK(st == RN_GPUINFO_NO_DRIVER || st == RN_GPUINFO_NO_BUILD_GPU, "no libcuda.so.1 but status %d", st);

    int rc = -1;
    char *js = render(g, 1, &rc);
    CHECK(rc == RN_OK && js, "write_json: %d %s", rc, rn_last_error());
    if (js) {
        CHECK(strncmp(js, "{\"schema\":\"rn-gpuinfo/1\",", 25) == 0, "JSON starts with the schema: %.40s", js);
        size_t n = strlen(js);
        CHECK(n > 2 && js[n - 1] == '\n' && js[n - 2] == '}' && !memchr(js, '\n', n - 1), "one JSON line");
        int depth = 0, instr = 0, bad = 0;
        for (const char *p = js; *p; p++) {
            if (instr) {
                if (*p == '\\')
                    p++;
                else if (*p == '"')
                    instr = 0;
            } else if (*p == '"')
                instr = 1;
            else if (*p == '{' || *p == '[')
                depth++;
            else if (*p == '}' || *p == ']')
                bad |= --depth < 0;
        }
        CHECK(depth == 0 && !bad && !instr, "JSON brackets balance");
        CHECK(strstr(js, "\"status\":{\"code\":") != NULL, "JSON has the status");
    }
    free(js);
    char *tx = render(g, 0, &rc);
    CHECK(rc == RN_OK && tx && strstr(tx, "\nstatus: ") != NULL, "text report ends with the status");
    free(tx);

    if (g->ndev == 0) {
        CHECK(rn_gpuinfo_watch(g, 1, 1, -1, 0, stdout, NULL) == RN_EGPU, "watch without devices is RN_EGPU");
        rn_gpubench b;
        CHECK(rn_gpuinfo_bench(g, 0, &b) != RN_OK, "bench without devices fails");
        CHECK(rn_last_error()[0] != 0, "and says why");
    }
    CHECK(rn_gpuinfo_watch(g, 1, 1, g->ndev + 3, 0, stdout, NULL) == RN_EINVAL, "watch on a missing device");
    rn_gpuinfo_free(g);
    rn_gpuinfo_free(NULL);

    /* names as cuDeviceGetName gives them */
    static const char *const names[][2] = {
        {"NVIDIA H100 80GB HBM3", "H100 SXM5"},
        {"NVIDIA H100 PCIe", "H100 PCIe"},
        {"NVIDIA H100 NVL", "H100 NVL"},
        {"NVIDIA H200", "H200 SXM"},
        {"NVIDIA H200 NVL", "H200 NVL"},
        {"NVIDIA GH200 480GB", "GH200 96GB HBM3"},
        {"NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"},
        {"NVIDIA A100-SXM4-40GB", "A100 40GB"},
        {"NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"},
        {"NVIDIA A100-PCIE-40GB", "A100 40GB"},
        {"NVIDIA A10", "A10"},
        {"NVIDIA L4", "L4"},
        {"NVIDIA L40S", "L40S"},
        {"Tesla T4", "T4"},
        {"NVIDIA A10G", NULL},
        {"NVIDIA L40", NULL},
        {"NVIDIA GeForce RTX 4090", NULL},
        {"NVIDIA H20", NULL},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *got = rn_gpuinfo_datasheet(names[i][0]);
        CHECK(got == names[i][1] || (got && names[i][1] && strcmp(got, names[i][1]) == 0), "%s: datasheet %s, want %s",
              names[i][0], got ? got : "none", names[i][1] ? names[i][1] : "none");
    }
    return check_done("test_gpuinfo");
}
