#!/usr/bin/python3
"""Small .pth fuzz seeds (a few KB each), written by torch.save into OUT_DIR:
  tiny.pth     float32/float16/bfloat16/int64/int32 tensors, a transposed view, two slices
               of one storage, an nn.Parameter, a 0-d and an empty tensor
  expand.pth   every resnet18 (2 classes) tensor at its shape as an expanded view of one
               element: the importer guesses the arch and builds the whole checkpoint
  names.pth    resnet18's names, every tensor but fc.*'s of shape [1]: the importer lists the shapes
  proto4.pth   tiny's tensors pickled with protocol 4 (FRAME, SHORT_BINUNICODE, MEMOIZE)
  legacy.pth   the pre-1.6 format (refused)
and hostile ones, each refused with a message: evil.pth (os.system through REDUCE),
huge.pth (sizes whose product overflows), past.pth (an offset past the storage),
expandbomb.pth (a 2^40-element expanded view of 4 floats),
memo.pth (a memo index never set), bigmemo.pth (memo index 2^32-1), nokey.pth (a storage
with no zip entry), cut.pth (tiny.pth cut short), f64.pth (a float64 storage)

  pth_seed.py OUT_DIR
"""
import os
import pickle
import sys
import zipfile

import torch
import torchvision

out = sys.argv[1]
torch.manual_seed(0)
a = torch.randn(2, 3)
both = torch.randn(5)
tiny = {"a": a, "b": torch.randn(3).half(), "c": torch.randn(1, 1, 2).bfloat16(), "d": torch.tensor(7),
        "e": torch.zeros(0, dtype=torch.int32), "t": a.t().contiguous().t(), "s1": both[:2], "s2": both[2:],
        "p": torch.nn.Parameter(torch.randn(2))}
torch.save(tiny, out + "/tiny.pth")
torch.save(tiny, out + "/proto4.pth", pickle_protocol=4)
sd = torchvision.models.resnet18(num_classes=2).state_dict()
one, n = torch.tensor(1.0), torch.tensor(0)
torch.save({k: (n if v.dtype == torch.int64 else one).expand(v.shape) for k, v in sd.items()}, out + "/expand.pth")
torch.save({k: (n if v.dtype == torch.int64 else one).expand(v.shape) if k.startswith("fc.") else
            (n if v.dtype == torch.int64 else one).reshape(1) for k, v in sd.items()}, out + "/names.pth")
torch.save({"a": a}, out + "/legacy.pth", _use_new_zipfile_serialization=False)
torch.save({"a": torch.zeros(3, dtype=torch.float64)}, out + "/f64.pth")
b = open(out + "/tiny.pth", "rb").read()
open(out + "/cut.pth", "wb").write(b[: len(b) * 2 // 3])


def zip_pickle(name, pkl, extra=None):
    with zipfile.ZipFile(out + "/" + name, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        for k, v in (extra or {}).items():
            z.writestr("archive/" + k, v)


class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def tensor(offset, sizes, strides, key=b"0"):
    """a pickled {'a': tensor} over storage KEY of 4 floats, sizes and strides as LONG1s"""
    def ints(v):
        return b"(" + b"".join(b"\x8a\x08" + x.to_bytes(8, "little", signed=True) for x in v) + b"t"
    return (b"\x80\x02}X\x01\x00\x00\x00actorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
            b"ctorch\nFloatStorage\nX" + len(key).to_bytes(4, "little") + key + b"X\x03\x00\x00\x00cpuK\x04tQ"
            + b"\x8a\x08" + offset.to_bytes(8, "little", signed=True) + ints(sizes) + ints(strides) + b"\x89}tRs.")


zip_pickle("evil.pth", pickle.dumps({"conv1.weight": Evil()}, protocol=2))
zip_pickle("huge.pth", tensor(0, [1 << 62, 1 << 62], [1, 1]), {"data/0": b"\0" * 16})
zip_pickle("past.pth", tensor(3, [2], [1]), {"data/0": b"\0" * 16})
zip_pickle("expandbomb.pth", tensor(0, [1 << 20, 1 << 20], [0, 0]), {"data/0": b"\0" * 16})
zip_pickle("nokey.pth", tensor(0, [2], [1], b"7"), {"data/0": b"\0" * 16})
zip_pickle("memo.pth", b"\x80\x02}q\x00X\x01\x00\x00\x00ah\x07s.")
zip_pickle("bigmemo.pth", b"\x80\x02}r\xff\xff\xff\xffX\x01\x00\x00\x00aj\xff\xff\xff\xffs.")
