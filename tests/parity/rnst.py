"""Minimal safetensors reader/writer for the parity tests (Debian ships torch but not
the safetensors package). Tensors come back as torch tensors."""
import json
import struct

import numpy as np
import torch

_NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def load(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = buf[8 + n:]
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        if h["dtype"] == "BF16":
            raw = np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(data[a:b], dtype=_NP[h["dtype"]])
        out[name] = torch.from_numpy(arr.copy().reshape(h["shape"]))
    return out, meta


def save(path, tensors, meta=None):
    header, blobs, off = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    names = {np.dtype(v): k for k, v in _NP.items()}
    for name, t in tensors.items():
        if t.dtype == torch.bfloat16:
            raw = (t.float().contiguous().numpy().view(np.uint32) >> 16).astype(np.uint16).tobytes()
            dt = "BF16"
        else:
            arr = t.contiguous().numpy()
            raw, dt = arr.tobytes(), names[arr.dtype]
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
