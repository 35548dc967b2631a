/* A TensorBoard event file (rn-train --tensorboard) through rn_tb_read, the reader rn-info
 * and rn-train's scan of a --tensorboard folder use; the first byte picks tail_ok. */
#include "fuzz.h"
#include "rn/tbevent.h"

/* touch every string the reader hands out */
static int visit(void *ctx, const rn_tb_item *it) {
    size_t *n = ctx;
    if (it->tag) *n += strlen(it->tag);
    if (it->text) *n += strlen(it->text);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    size_t n = 0;
    if (path) rn_tb_read(path, fuzz_byte(data, size, 0) & 1, visit, &n);
    return 0;
}
