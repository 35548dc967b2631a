"""MLPerf's LARS in numpy (float64), replayed over the gradients rn-train dumped, checked
against the weights rn-train wrote. The reference is TensorFlow's LARSOptimizer of the
MLPerf ResNet-50 reference: per tensor trust = eta*|w|/(|g| + wd*|w| + eps) (1 when a norm
is 0), v = m*v + lr*trust*(g + wd*w), w -= v; BN weights/biases and biases are skipped
(trust 1, no weight decay).
usage: lars_ref.py INIT.safetensors OUT.safetensors MOMENTUM WD ETA EPS GRADS1:LR1 [GRADS2:LR2 ...]"""
import json
import struct
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "I32": np.int32, "U8": np.uint8, "I64": np.int64}
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=kinds[t["dtype"]]).reshape(t["shape"])
    return out


def excluded(name):
    return ".bn" in name or name.startswith("bn") or "downsample.1" in name or name.endswith(".bias")


def run(w0, steps, m, wd, eta, eps, lars=True):
    w = {k: v.astype(np.float64) for k, v in w0.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    for grads, lr in steps:
        for k in w:
            g = grads[k].astype(np.float64)
            trust, decay = 1.0, 0.0
            if lars and not excluded(k):
                decay = wd
                wn, gn = np.linalg.norm(w[k]), np.linalg.norm(g)
                if wn > 0 and gn > 0:
                    trust = eta * wn / (gn + wd * wn + eps)
            v[k] = m * v[k] + lr * trust * (g + decay * w[k])
            w[k] = w[k] - v[k]
    return w


def main():
    init, out = load(sys.argv[1]), load(sys.argv[2])
    m, wd, eta, eps = (float(x) for x in sys.argv[3:7])
    steps = []
    for spec in sys.argv[7:]:
        path, lr = spec.rsplit(":", 1)
        steps.append((load(path), float(lr)))
    names = [k for k in steps[0][0] if not k.startswith("input.")]
    w0 = {k: init[k] for k in names}
    ref = run(w0, steps, m, wd, eta, eps)
    plain = run(w0, steps, m, wd, eta, eps, lars=False)
    worst, n_ex, n_ad, apart = 0.0, 0, 0, np.inf
    for k in names:
        moved = np.max(np.abs(ref[k] - w0[k]))
        assert moved > 0, f"{k}: the reference did not move"
        err = np.max(np.abs(out[k].astype(np.float64) - ref[k])) / moved
        worst = max(worst, err)
        assert err < 1e-4, f"{k}: rn's weights are {err:.3g} of the step away from the reference"
        if excluded(k):
            n_ex += 1
        else:
            n_ad += 1
            # the property under test: without the trust ratio the weights land elsewhere
            apart = min(apart, np.max(np.abs(plain[k] - ref[k])) / moved)
    assert n_ex > 0 and n_ad > 0, (n_ex, n_ad)
    assert apart > 0.1, f"plain momentum SGD lands within {apart:.3g} of LARS: the check cannot tell them apart"
    print(f"{len(names)} tensors ({n_ad} adapted, {n_ex} excluded) after {len(steps)} steps: worst error "
          f"{worst:.2g} of the step")


main()
