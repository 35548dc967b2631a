/* rn/pth.h: read a PyTorch state_dict saved with torch.save (the zip format torch has
 * written since 1.6, as torchvision's downloaded resnet50-*.pth files) into the same
 * (name, dtype, shape, data) list the safetensors reader gives (rn/safetensors.h), so the
 * import that follows (rn/convert.h) is shared.
 *
 * The zip container is read from its central directory (zip64 records too); every entry
 * must be stored, as torch writes them. data.pkl goes through a restricted unpickler
 * that only builds values: it implements the opcodes torch's pickler (protocol 2) emits
 * for a state_dict and accepts only the globals collections.OrderedDict,
 * torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter and the storage
 * types torch.FloatStorage, HalfStorage, BFloat16Storage, LongStorage and IntStorage;
 * storages are the persistent ids ('storage', type, key, location, numel) naming the
 * entry <archive>/data/<key>. Anything else is refused with a message that names it;
 * nothing from the file is ever called or executed. */
#ifndef RN_PTH_H
#define RN_PTH_H

#include <stddef.h>
#include <stdint.h>

#include "rn/safetensors.h"

/* Parse a .pth already read (buf, len bytes, malloc'ed; taken, and freed on failure).
 * path only names the file in messages. Tensors are in the state_dict's order; a tensor
 * that is a contiguous view points into the file, a strided one (a transposed view, a
 * slice) is gathered by its strides into st->owned; two tensors may view one storage.
 * A dict whose values are not tensors but which holds a "state_dict" or "model" dict is
 * read through that (training checkpoints). Errors: RN_ECORRUPT (message names the file,
 * the zip entry or the pickle byte, and what to do: a whole model saved with
 * torch.save(model) and the legacy format of torch < 1.6 get the command that re-saves
 * them), RN_ENOMEM. */
int rn_pth_parse(const char *path, uint8_t *buf, size_t len, rn_safetensors **out);

/* Read weights from path ("-" = stdin), a .pth (zip) or a safetensors file, told apart by
 * their first bytes, not the name. Errors: those of rn_pth_parse and rn_st_read. */
int rn_weights_read(const char *path, rn_safetensors **out);

#endif
