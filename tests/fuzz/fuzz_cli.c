/* Flag values through rn/cli.h: the first byte picks the parser and its range, the rest
 * is the value text (cut at its first NUL, as argv would). */
#include <stdlib.h>

#include "fuzz.h"
#include "rn/cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    unsigned k = data[0];
    int iv = 7, list[16], n = 0;
    int64_t lv = 7;
    uint64_t uv = 7;
    double dv = 7;
    size_t sv = 7;
    switch (k % 6) {
    case 0: (void)rn_cli_int("--batch", text, k & 8 ? -5 : 1, k & 16 ? 1 << 20 : 0x7fffffff, &iv); break;
    case 1: (void)rn_cli_i64("--step", text, k & 8 ? INT64_MIN : 0, INT64_MAX, &lv); break;
    case 2: (void)rn_cli_u64("--seed", text, 0, k & 8 ? 1000 : UINT64_MAX, &uv); break;
    case 3: (void)rn_cli_float("--lr", text, k & 8 ? -1e300 : 0, 1e6, &dv); break;
    case 4: (void)rn_cli_size("--cpu-memory", text, k & 8 ? 1 << 20 : 0, &sv); break;
    default: (void)rn_cli_list("--milestones", text, 0, 1000, list, k & 8 ? 1 : 16, &n); break;
    }
    if (n < 0 || n > 16) abort();
    free(text);
    return 0;
}
