"""Helpers for tests/export-onnx.bats.
usage: check.py nchw RAW.u8 N S OUT.f32      rn-load's u8 NHWC batch, normalised as rn
                                              does, to float32 NCHW
       check.py compare RN.safetensors ORT.f32 TOL [MIN]
                                              max relative difference of onnxruntime's
                                              logits against rn-eval's; exit 1 over TOL
                                              (or under MIN: an int8 model that is not
                                              quantised)
       check.py checker MODEL.onnx            onnx.checker full_check; prints the
                                              metadata_props as key=value lines, and the
                                              count of each op as op:Name=N"""
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    head.pop("__metadata__", None)
    (name, t), = head.items()
    a, b = t["data_offsets"]
    assert t["dtype"] == "F32", t
    return np.frombuffer(data[a:b], dtype=np.float32).reshape(t["shape"])


def main():
    cmd = sys.argv[1]
    if cmd == "nchw":
        raw, n, s, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        x = np.fromfile(raw, dtype=np.uint8).reshape(n, s, s, 3)
        # the same float32 operations in the same order as rn_input_normalize
        mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
        std = np.array([0.229, 0.224, 0.225], dtype=np.float32)
        y = (x.astype(np.float32) / np.float32(255.0) - mean) / std
        np.ascontiguousarray(y.transpose(0, 3, 1, 2)).astype("<f4").tofile(out)
    elif cmd == "compare":
        ref = read_safetensors(sys.argv[2]).astype(np.float64)
        got = np.fromfile(sys.argv[3], dtype="<f4").astype(np.float64).reshape(ref.shape)
        tol = float(sys.argv[4])
        least = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
        # relative to the larger of the element and the largest logit of its row: a
        # logit near 0 would make a pure element-wise relative error meaningless
        scale = np.maximum(np.abs(ref), np.abs(ref).max(axis=1, keepdims=True))
        rel = np.abs(got - ref) / np.maximum(scale, 1e-30)
        worst = float(rel.max())
        print(f"n={ref.shape[0]} classes={ref.shape[1]} max_rel={worst:.3g} tol={tol:g}")
        if worst < least:
            print(f"max_rel {worst:.3g} under {least:g}: the model computes in float")
            sys.exit(1)
        if not np.isfinite(got).all() or worst > tol:
            i = np.unravel_index(int(np.argmax(rel)), rel.shape)
            print(f"worst at {tuple(int(v) for v in i)}: rn {ref[i]!r} onnxruntime {got[i]!r}")
            sys.exit(1)
    elif cmd == "checker":
        import onnx
        m = onnx.load(sys.argv[2])
        onnx.checker.check_model(m, full_check=True)
        for p in m.metadata_props:
            print(f"{p.key}={p.value}")
        ops = {}
        for n in m.graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        for k in sorted(ops):
            print(f"op:{k}={ops[k]}")
        kinds = {}
        for t in m.graph.initializer:
            kinds[t.data_type] = kinds.get(t.data_type, 0) + 1
        for k in sorted(kinds):
            print(f"initializers:{onnx.TensorProto.DataType.Name(k)}={kinds[k]}")
    else:
        sys.exit(f"check.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
