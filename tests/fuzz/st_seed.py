#!/usr/bin/python3
"""Small safetensors fuzz seeds from one that rn-export wrote (SRC):
  OUT_DIR/names.safetensors  SRC's names, dtypes and metadata, every shape but fc.*'s [1] (the
                             importer guesses the arch and reports the shapes)
  OUT_DIR/mixed.safetensors  a few tensors of every dtype rn reads, 0-d and 3-d shapes

  st_seed.py SRC OUT_DIR
"""
import json
import struct
import sys

SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U8": 1, "F64": 8}


def write(path, tensors, meta):
    head, data = {}, bytearray()
    for name, dtype, shape in tensors:
        n = SIZE[dtype]
        for d in shape:
            n *= d
        head[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((len(data) + k) * 37 % 251 for k in range(n))
    if meta:
        head["__metadata__"] = meta
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)


src, out = sys.argv[1], sys.argv[2]
b = open(src, "rb").read(1 << 20)
(hl,) = struct.unpack("<Q", b[:8])
head = json.loads(b[8:8 + hl])
meta = head.pop("__metadata__", {})
write(out + "/names.safetensors",
      [(k, v["dtype"], v["shape"] if k.startswith("fc.") else [1]) for k, v in head.items()], meta)
write(out + "/mixed.safetensors",
      [("a", "F32", [2, 3]), ("b", "F16", [3]), ("c", "BF16", [1, 1, 2]), ("d", "I64", []), ("e", "I32", [0]),
       ("f", "U8", [5])], {"arch": "resnet18", "format": "pt"})
