/* An rn-prep list file ("relative/path label" lines) through rn_prep_read_list. The
 * first byte picks a small --max-classes sometimes, so the limit is reached. */
#include "fuzz.h"
#include "rn/prep.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    if (!path) return 0;
    uint64_t inputs, bad;
    int n;
    (void)rn_prep_read_list(path, size && data[0] == '#' ? 10 : 0, &inputs, &bad, &n);
    return 0;
}
