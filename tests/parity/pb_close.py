"""Are two rn checkpoints (.pb) equal within a relative tolerance, tensor by tensor,
momentum included (which rn-export leaves out)?
usage: pb_close.py A.pb B.pb TOL
Reads the protobuf wire format directly (proto/rn.proto: Checkpoint.params = 3,
.buffers = 4, .optim = 5 with OptimState.momentum = 2; Tensor name = 1, shape = 2,
dtype = 3, data = 4), so it needs numpy only. F32 tensors: ||a - b|| / ||b||; other
dtypes (num_batches_tracked) must be equal. Prints the largest difference of each group
and exits 0 when every one is <= TOL, 1 otherwise."""
import sys

import numpy as np

F32, I64 = 1, 6


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b):
    """(field number, value) of a message: ints for varints, bytes otherwise."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        else:
            raise ValueError(f"wire type {wt}")
        yield num, v


def tensor(b):
    name, dtype, data = None, None, b""
    for num, v in fields(b):
        if num == 1:
            name = bytes(v).decode()
        elif num == 3:
            dtype = v
        elif num == 4:
            data = bytes(v)
    return name, np.frombuffer(data, np.float32 if dtype == F32 else np.int64 if dtype == I64 else np.uint8)


def load(path):
    groups = {"params": {}, "buffers": {}, "momentum": {}}
    with open(path, "rb") as f:
        b = memoryview(f.read())
    for num, v in fields(b):
        if num in (3, 4):
            n, t = tensor(v)
            groups["params" if num == 3 else "buffers"][n] = t
        elif num == 5:
            for k, w in fields(v):
                if k == 2:
                    n, t = tensor(w)
                    groups["momentum"][n] = t
    return groups


a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
ok = True
for g in a:
    assert a[g].keys() == b[g].keys(), f"{g}: different tensor sets"
    assert a[g], f"{g}: no tensors"
    worst, worst_name = 0.0, None
    for n, x in a[g].items():
        y = b[g][n]
        if x.dtype != np.float32:
            r = 0.0 if np.array_equal(x, y) else float("inf")
        else:
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            r = np.linalg.norm(x64 - y64) / max(np.linalg.norm(y64), 1e-30)
        if r > worst or worst_name is None:
            worst, worst_name = r, n
    ok = ok and worst <= tol
    print(f"{g}: {len(a[g])} tensors, max relative difference {worst:.3e} ({worst_name})")
print(f"tolerance {tol:g}: {'within' if ok else 'over'}")
sys.exit(0 if ok else 1)
