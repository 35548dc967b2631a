"""PyTorch side of make bench-infer, on rn's weights (WEIGHTS.safetensors from rn-export).
usage: infer_peer.py export WEIGHTS.safetensors ARCH OUT.onnx [SIZE]
         torchvision's model with those weights, eval mode, through torch.onnx.export
         (opset 17, input "input" NCHW with a dynamic batch, traced at SIZE x SIZE
         (default 224), output "logits")
       infer_peer.py time WEIGHTS.safetensors ARCH SIZE BATCH STEPS THREADS
         eval forwards of a random batch under no_grad, timed after one warm-up;
         prints "img/s=<x> ms=<per batch> torch=<version>"."""
import os
import sys
import time

import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import rnst  # noqa: E402


def model(weights, arch):
    sd, _ = rnst.load(weights)
    m = getattr(torchvision.models, arch)(num_classes=sd["fc.weight"].shape[0])
    m.load_state_dict(sd)
    return m.eval()


if sys.argv[1] == "export":
    m = model(sys.argv[2], sys.argv[3])
    size = int(sys.argv[5]) if len(sys.argv) > 5 else 224
    torch.onnx.export(m, torch.randn(1, 3, size, size), sys.argv[4], opset_version=17, input_names=["input"],
                      output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    sys.exit(0)
weights, arch, size, batch, steps, threads = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8])
torch.set_num_threads(threads)
torch.manual_seed(0)
m = model(weights, arch)
x = torch.randn(batch, 3, size, size)
with torch.no_grad():
    m(x)
    t0 = time.perf_counter()
    for _ in range(steps):
        m(x)
    dt = time.perf_counter() - t0
print(f"img/s={steps * batch / dt:.2f} ms={1000 * dt / steps:.2f} torch={torch.__version__}")
