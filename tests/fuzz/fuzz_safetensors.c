/* A safetensors file through rn_st_read, and a valid one on to the checkpoint import
 * (rn-init --from) with its arch guessed from the names. */
#include "fuzz.h"
#include "rn/convert.h"
#include "rn/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    rn_safetensors *st = NULL;
    if (!path || rn_st_read(path, &st) != 0) return 0;
    if (st->n > 0) (void)rn_st_find(st, st->t[0].name);
    (void)rn_st_meta(st, "arch");
    char arch[16];
    rn_guess_arch(st, arch);
    rn_ckpt *c = NULL;
    if (arch[0] && rn_ckpt_from_safetensors(st, NULL, 0, 1, &c) == 0) rn_ckpt_free(c);
    rn_st_free(st);
    return 0;
}
