/* rn/cli.h: every kind of flag value, what it accepts and what it refuses, and that a
 * refusal leaves the value alone and names the flag and the text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rn/cli.h"
#include "rn/err.h"

/* a refused value: RN_EINVAL, and a message naming the flag, the text and the word why */
#define REFUSED(call, flag, text, why)                                                                                 \
    do {                                                                                                               \
        int rc_ = (call);                                                                                              \
        CHECK(rc_ == RN_EINVAL, "%s accepted", #call);                                                                 \
        CHECK(strstr(rn_last_error(), flag ": '") == rn_last_error(), "%s: no flag first: %s", #call,                  \
              rn_last_error());                                                                                        \
        CHECK(strstr(rn_last_error(), "'" text "'") != NULL, "%s: the text is not quoted: %s", #call,                  \
              rn_last_error());                                                                                        \
        CHECK(strstr(rn_last_error(), why) != NULL, "%s: '%s' not in: %s", #call, why, rn_last_error());               \
    } while (0)

static void test_ints(void) {
    struct {
        const char *s;
        int want;
    } ok[] = {
        {"1", 1}, {"256", 256}, {"+3", 3}, {"0007", 7}, {"1048576", 1048576}, {"-0", 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        int v = -1;
        CHECK(rn_cli_int("--batch", ok[i].s, 0, 1 << 20, &v) == RN_OK && v == ok[i].want, "int '%s' -> %d (%s)",
              ok[i].s, v, rn_last_error());
    }
    int v = 42;
    REFUSED(rn_cli_int("--batch", "2.5", 1, 1 << 20, &v), "--batch", "2.5", "is not a whole number");
    REFUSED(rn_cli_int("--batch", "16x", 1, 1 << 20, &v), "--batch", "16x", "is not a whole number");
    REFUSED(rn_cli_int("--batch", "16 ", 1, 1 << 20, &v), "--batch", "16 ", "is not a whole number");
    REFUSED(rn_cli_int("--batch", " 16", 1, 1 << 20, &v), "--batch", " 16", "is not a whole number");
    REFUSED(rn_cli_int("--batch", "", 1, 1 << 20, &v), "--batch", "", "is not a whole number");
    REFUSED(rn_cli_int("--batch", "-", 1, 1 << 20, &v), "--batch", "-", "is not a whole number");
    REFUSED(rn_cli_int("--batch", "0x10", 1, 1 << 20, &v), "--batch", "0x10", "is not a whole number");
    REFUSED(rn_cli_int("--batch", "abc", 1, 1 << 20, &v), "--batch", "abc", "is not a whole number");
    /* a whole value written otherwise is refused, with the digits to write instead */
    REFUSED(rn_cli_int("--batch", "1e3", 1, 1 << 20, &v), "--batch", "1e3", "written in digits (1000)");
    REFUSED(rn_cli_int("--batch", "16.0", 1, 1 << 20, &v), "--batch", "16.0", "written in digits (16)");
    REFUSED(rn_cli_int("--batch", "-3", 1, 1 << 20, &v), "--batch", "-3", "is negative: want 1 to 1048576");
    REFUSED(rn_cli_int("--batch", "0", 1, 1 << 20, &v), "--batch", "0", "is too small: want 1 to 1048576");
    REFUSED(rn_cli_int("--batch", "1048577", 1, 1 << 20, &v), "--batch", "1048577", "is too large");
    /* beyond int, beyond 64 bits: out of range, never wrapped */
    REFUSED(rn_cli_int("--batch", "4294967297", 1, 1 << 20, &v), "--batch", "4294967297", "is too large");
    REFUSED(rn_cli_int("--batch", "99999999999999999999999", 1, 1 << 20, &v), "--batch", "99999999999999999999999",
            "is too large");
    REFUSED(rn_cli_int("--x", "-99999999999999999999999", -5, 5, &v), "--x", "-99999999999999999999999",
            "is too small: want -5 to 5");
    CHECK(v == 42, "a refused value changed the output: %d", v);
    CHECK(rn_cli_int("--x", "-5", -5, 5, &v) == RN_OK && v == -5, "negative where allowed");

    int64_t w = 0;
    CHECK(rn_cli_i64("--max-steps", "9223372036854775807", 1, INT64_MAX, &w) == RN_OK && w == INT64_MAX, "INT64_MAX");
    CHECK(rn_cli_i64("--x", "-9223372036854775808", INT64_MIN, 0, &w) == RN_OK && w == INT64_MIN, "INT64_MIN");
    REFUSED(rn_cli_i64("--max-steps", "9223372036854775808", 1, INT64_MAX, &w), "--max-steps", "9223372036854775808",
            "is too large: want at least 1");
    REFUSED(rn_cli_i64("--x", "-9223372036854775809", INT64_MIN, 0, &w), "--x", "-9223372036854775809", "is too small");

    uint64_t u = 0;
    CHECK(rn_cli_u64("--seed", "18446744073709551615", 0, UINT64_MAX, &u) == RN_OK && u == UINT64_MAX, "UINT64_MAX");
    CHECK(rn_cli_u64("--seed", "0", 0, UINT64_MAX, &u) == RN_OK && u == 0, "seed 0");
    REFUSED(rn_cli_u64("--seed", "18446744073709551616", 0, UINT64_MAX, &u), "--seed", "18446744073709551616",
            "is too large");
    /* strtoull would have taken -1 as 2^64 - 1 */
    REFUSED(rn_cli_u64("--seed", "-1", 0, UINT64_MAX, &u), "--seed", "-1", "is negative: want at least 0");
    REFUSED(rn_cli_u64("--limit", "0", 1, UINT64_MAX, &u), "--limit", "0", "is too small: want at least 1");
    REFUSED(rn_cli_u64("--seed", "1.5", 0, UINT64_MAX, &u), "--seed", "1.5", "is not a whole number");
    CHECK(u == 0, "a refused value changed the output");
}

static void test_floats(void) {
    struct {
        const char *s;
        double want;
    } ok[] = {
        {"0.1", 0.1}, {"1e-4", 1e-4}, {"5", 5}, {".5", 0.5}, {"+0.25", 0.25}, {"0", 0}, {"1E2", 100},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        double v = -1;
        CHECK(rn_cli_float("--lr", ok[i].s, 0, 1e6, &v) == RN_OK && v == ok[i].want, "float '%s' -> %g (%s)", ok[i].s,
              v, rn_last_error());
    }
    double v = 42;
    REFUSED(rn_cli_float("--lr", "0.1x", 0, 1e6, &v), "--lr", "0.1x", "is not a number");
    REFUSED(rn_cli_float("--lr", "", 0, 1e6, &v), "--lr", "", "is not a number");
    REFUSED(rn_cli_float("--lr", " 0.1", 0, 1e6, &v), "--lr", " 0.1", "is not a number");
    REFUSED(rn_cli_float("--lr", "0x1p3", 0, 1e6, &v), "--lr", "0x1p3", "is not a number");
    REFUSED(rn_cli_float("--lr", "nan", 0, 1e6, &v), "--lr", "nan", "is not a number");
    REFUSED(rn_cli_float("--lr", "1e999", 0, 1e6, &v), "--lr", "1e999", "is not a finite number");
    REFUSED(rn_cli_float("--lr", "-0.1", 0, 1e6, &v), "--lr", "-0.1", "is negative: want 0 to 1e+06");
    REFUSED(rn_cli_float("--momentum", "1.5", 0, 1, &v), "--momentum", "1.5", "is too large: want 0 to 1");
    REFUSED(rn_cli_float("--loss-scale", "0", 1e-30, 1e30, &v), "--loss-scale", "0", "is too small");
    CHECK(v == 42, "a refused value changed the output: %g", v);
}

static void test_sizes(void) {
    struct {
        const char *s;
        size_t want;
    } ok[] = {
        {"1", 1},
        {"4096", 4096},
        {"8K", 8192},
        {"8k", 8192},
        {"512M", (size_t)512 << 20},
        {"2G", (size_t)2 << 30},
        {"1.5g", (size_t)3 << 29},
        {"3GiB", (size_t)3 << 30},
        {"1T", (size_t)1 << 40},
        {"64MB", (size_t)64 << 20},
        {"100B", 100},
        {"0.5K", 512},
        {"9007199254740993", (size_t)9007199254740993ull},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        size_t v = 0;
        CHECK(rn_cli_size("--mem-limit", ok[i].s, 1, &v) == RN_OK && v == ok[i].want, "size '%s' -> %zu, want %zu (%s)",
              ok[i].s, v, ok[i].want, rn_last_error());
    }
    const char *bad[] = {"", "G", "0", "-1G", "12X", "1GG", "1 G", " 1G", "1G ", "0.5", "nan", "0x10", "1KiBB"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t v = 7;
        CHECK(rn_cli_size("--mem-limit", bad[i], 1, &v) == RN_EINVAL && v == 7, "size '%s' accepted", bad[i]);
        CHECK(strstr(rn_last_error(), "--mem-limit: '") == rn_last_error() &&
                  strstr(rn_last_error(), "is not a size like 8G"),
              "size '%s': %s", bad[i], rn_last_error());
    }
    size_t v = 7;
    REFUSED(rn_cli_size("--mem-limit", "1e30T", 1, &v), "--mem-limit", "1e30T", "is too large");
    REFUSED(rn_cli_size("--mem-limit", "99999999999999999999999", 1, &v), "--mem-limit", "99999999999999999999999",
            "is too large");
    REFUSED(rn_cli_size("--mem-limit", "16777216T", 1, &v), "--mem-limit", "16777216T", "is too large");
    REFUSED(rn_cli_size("--map-size", "1K", 65536, &v), "--map-size", "1K", "is too small: want at least 65536 bytes");
    CHECK(rn_cli_size("--map-size", "64K", 65536, &v) == RN_OK && v == 65536, "the minimum itself");
}

static void test_lists(void) {
    int m[4] = {-1, -1, -1, -1}, n = -1;
    CHECK(rn_cli_list("--lr-milestones", "30,60,80", 0, 1000000, m, 4, &n) == RN_OK && n == 3 && m[0] == 30 &&
              m[1] == 60 && m[2] == 80 && m[3] == -1,
          "30,60,80 -> %d: %d %d %d", n, m[0], m[1], m[2]);
    CHECK(rn_cli_list("--lr-milestones", "0", 0, 1000000, m, 4, &n) == RN_OK && n == 1 && m[0] == 0, "one entry");
    CHECK(rn_cli_list("--lr-milestones", "1,2,3,4", 0, 1000000, m, 4, &n) == RN_OK && n == 4 && m[3] == 4, "cap");
    int keep[4] = {9, 9, 9, 9};
    n = 5;
    REFUSED(rn_cli_list("--lr-milestones", "", 0, 100, keep, 4, &n), "--lr-milestones", "", "is not a list");
    REFUSED(rn_cli_list("--lr-milestones", "30,,60", 0, 100, keep, 4, &n), "--lr-milestones", "30,,60",
            "is not a list");
    REFUSED(rn_cli_list("--lr-milestones", "30,", 0, 100, keep, 4, &n), "--lr-milestones", "30,", "is not a list");
    REFUSED(rn_cli_list("--lr-milestones", "1,2,3,4,5", 0, 100, keep, 4, &n), "--lr-milestones", "1,2,3,4,5",
            "has more than 4 entries");
    REFUSED(rn_cli_list("--lr-milestones", "30,6.5", 0, 100, keep, 4, &n), "--lr-milestones", "6.5",
            "is not a whole number (in '30,6.5')");
    REFUSED(rn_cli_list("--lr-milestones", "30,-5", 0, 100, keep, 4, &n), "--lr-milestones", "-5", "is negative");
    REFUSED(rn_cli_list("--lr-milestones", "30,500", 0, 100, keep, 4, &n), "--lr-milestones", "500", "is too large");
    REFUSED(rn_cli_list("--lr-milestones", "30 60", 0, 100, keep, 4, &n), "--lr-milestones", "30 60",
            "is not a whole number");
    CHECK(n == 5 && keep[0] == 9 && keep[1] == 9, "a refused list changed the output");
}

/* The backend's environment overrides land in rn_backend_opts, and only there: the
 * backends read no variable themselves. */
static void test_backend_env(void) {
    const char *vars[] = {"RN_SYNC", "RN_CPU_MEMORY", "RN_CUDA_TF32", "RN_CUDA_DETERMINISTIC", "RN_CUDA_CONV_ALGO",
                          "RN_CUDA_BN", "RN_CUDA_STEM", "RN_CUDA_WORKSPACE_MB", "RN_CUDA_ALGO_CACHE", "RN_CPU_WINOGRAD", "RN_CPU_GEMM",
                          "XDG_CACHE_HOME", "HOME"};
    const char *h = getenv("HOME");
    char *home = h ? strdup(h) : NULL;
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    rn_backend_opts o, d;
    rn_backend_opts_init(&d);
    rn_backend_opts_init(&o);
    CHECK_OK(rn_cli_backend_env(&o));
    CHECK(memcmp(&o, &d, sizeof o) == 0, "no variables: the defaults");
    CHECK(d.cuda_workspace == RN_CUDA_WORKSPACE_DEFAULT && !d.sync_each_op && !d.cpu_memory, "defaults");
    setenv("RN_SYNC", "1", 1);
    setenv("RN_CPU_MEMORY", "64M", 1);
    setenv("RN_CUDA_TF32", "1", 1);
    setenv("RN_CUDA_DETERMINISTIC", "1", 1);
    setenv("RN_CUDA_CONV_ALGO", "heuristic", 1);
    setenv("RN_CUDA_BN", "cudnn", 1);
    setenv("RN_CUDA_STEM", "plain", 1);
    setenv("RN_CUDA_WORKSPACE_MB", "256", 1);
    CHECK(!d.cuda_stem_plain, "the stem padded by default");
    CHECK_OK(rn_cli_backend_env(&o));
    CHECK(o.sync_each_op && o.cpu_memory == (size_t)64 << 20 && o.cuda_tf32 && o.cuda_deterministic &&
              o.cuda_conv_heuristic && o.cuda_bn_cudnn && o.cuda_stem_plain && o.cuda_workspace == (size_t)256 << 20,
          "every variable read");
    setenv("RN_CUDA_STEM", "pad", 1);
    CHECK_OK(rn_cli_backend_env(&o));
    CHECK(!o.cuda_stem_plain, "RN_CUDA_STEM=pad");
    CHECK(d.cpu_winograd == 1 && d.cpu_gemm == RN_CPU_GEMM_OWN, "CPU defaults: Winograd 1, own GEMM kernel");
    const char *wino[] = {"0", "1", "2"};
    for (int i = 0; i < 3; i++) {
        setenv("RN_CPU_WINOGRAD", wino[i], 1);
        CHECK_OK(rn_cli_backend_env(&o));
        CHECK(o.cpu_winograd == i, "RN_CPU_WINOGRAD=%s: %d", wino[i], o.cpu_winograd);
    }
    unsetenv("RN_CPU_WINOGRAD");
    const char *bad[][2] = {{"RN_SYNC", "yes"}, {"RN_CPU_MEMORY", "lots"}, {"RN_CUDA_CONV_ALGO", "fast"},
                            {"RN_CUDA_BN", "bogus"}, {"RN_CUDA_STEM", "4"}, {"RN_CUDA_WORKSPACE_MB", "-1"}, {"RN_CPU_WINOGRAD", "3"},
                            {"RN_CPU_WINOGRAD", "yes"}, {"RN_CPU_GEMM", "mkl"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv(bad[i][0], bad[i][1], 1);
        CHECK(rn_cli_backend_env(&o) == RN_EINVAL && strstr(rn_last_error(), bad[i][0]), "%s=%s accepted: %s",
              bad[i][0], bad[i][1], rn_last_error());
        unsetenv(bad[i][0]);
    }
    /* the algorithm cache: the user's XDG cache folder unless told otherwise */
    setenv("HOME", "/home/u", 1);
    CHECK_OK(rn_cli_backend_env(&o));
    CHECK(strcmp(o.cuda_algo_cache, "/home/u/.cache/rn/cudnn-algos.txt") == 0, "HOME: %s", o.cuda_algo_cache);
    setenv("XDG_CACHE_HOME", "/var/cache/u", 1);
    CHECK_OK(rn_cli_backend_env(&o));
    CHECK(strcmp(o.cuda_algo_cache, "/var/cache/u/rn/cudnn-algos.txt") == 0, "XDG: %s", o.cuda_algo_cache);
    setenv("RN_CUDA_ALGO_CACHE", "/tmp/a.txt", 1);
    CHECK_OK(rn_cli_backend_env(&o));
    CHECK(strcmp(o.cuda_algo_cache, "/tmp/a.txt") == 0, "RN_CUDA_ALGO_CACHE: %s", o.cuda_algo_cache);
    setenv("RN_CUDA_ALGO_CACHE", "off", 1);
    CHECK_OK(rn_cli_backend_env(&o));
    CHECK(o.cuda_algo_cache[0] == 0, "off: %s", o.cuda_algo_cache);
    char longp[2000];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    setenv("RN_CUDA_ALGO_CACHE", longp, 1);
    CHECK(rn_cli_backend_env(&o) == RN_EINVAL && strstr(rn_last_error(), "RN_CUDA_ALGO_CACHE"), "a long path: %s",
          rn_last_error());
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    if (home) setenv("HOME", home, 1);
    free(home);
}

int main(void) {
    test_backend_env();
    test_ints();
    test_floats();
    test_sizes();
    test_lists();
    return check_done("test_cli");
}
