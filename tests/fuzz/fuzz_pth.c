/* A .pth (torch.save's zip of data.pkl and storages) through rn_weights_read (the zip
 * directory, the restricted unpickler, tensors gathered by their strides), and a valid
 * one on to the checkpoint import (rn-init --from) with its arch guessed from the names. */
#include "fuzz.h"
#include "rn/convert.h"
#include "rn/pth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    rn_safetensors *st = NULL;
    if (!path || rn_weights_read(path, &st) != 0) return 0;
    /* touch every byte of every tensor, so a range past the file shows under ASan */
    unsigned sum = 0;
    for (int i = 0; i < st->n; i++)
        for (size_t k = 0; k < st->t[i].nbytes; k++)
            sum += st->t[i].data[k];
    (void)sum;
    char arch[16];
    rn_guess_arch(st, arch);
    rn_ckpt *c = NULL;
    if (arch[0] && rn_ckpt_from_safetensors(st, NULL, 0, 1, &c) == 0) rn_ckpt_free(c);
    rn_st_free(st);
    return 0;
}
