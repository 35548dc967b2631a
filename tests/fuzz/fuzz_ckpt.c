/* Checkpoint bytes (rn.Checkpoint) through rn_ckpt_parse, the reader of every tool. */
#include <stdlib.h>

#include "fuzz.h"
#include "rn/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rn_ckpt *c = NULL;
    if (rn_ckpt_parse(data, size, "fuzz.pb", &c) != 0) return 0;
    rn_resnet net;
    if (rn_ckpt_net(c, &net) == 0) (void)rn_ckpt_find(c, "fc.weight");
    rn_ckpt_free(c);
    return 0;
}
