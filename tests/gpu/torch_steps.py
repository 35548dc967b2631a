#!/usr/bin/env python3
"""Peer for make gpu-check: how far PyTorch's own fp32 runs of the same training steps on
the CPU and on the GPU drift apart (TF32 off, channels_last), so that rn's GPU-vs-CPU
drift can be judged against it: ResNet-50 training is badly conditioned at
initialisation, so a fixed tolerance would say little.

Same recipe as tests/parity/device_steps.c: one fixed batch of u8 pixels normalised with
ImageNet mean/std and random labels, SGD lr 0.01 momentum 0.9 weight decay 1e-4.
Prints the two loss curves and `torch_rel=<max over steps of |gpu - cpu| / cpu[0]>`, or
`torch_rel=unavailable (<why>)` (exit 0) when torch, torchvision or a CUDA device is
missing."""
import argparse
import copy
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        import torchvision
    except Exception as e:  # noqa: BLE001 - any import failure means: no peer
        print(f"torch_rel=unavailable (cannot import torch/torchvision: {e})")
        return 0
    if not torch.cuda.is_available():
        print("torch_rel=unavailable (torch sees no CUDA device)")
        return 0
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(a.seed)
    state = copy.deepcopy(getattr(torchvision.models, a.arch)(num_classes=1000).state_dict())
    g = torch.Generator().manual_seed(a.seed)
    x = torch.randint(0, 256, (a.batch, 3, a.size, a.size), generator=g, dtype=torch.uint8).float() / 255
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    x = (x - mean) / std
    y = torch.randint(0, 1000, (a.batch,), generator=g)

    ms = {}

    def run(dev):
        m = getattr(torchvision.models, a.arch)(num_classes=1000)
        m.load_state_dict(state)
        m = m.to(dev).to(memory_format=torch.channels_last).train()
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        xs = x.to(dev).contiguous(memory_format=torch.channels_last)
        ys = y.to(dev)
        out = []
        t0 = None
        for s in range(a.steps):
            if s == 1:  # step 0 warms up (cuDNN's choices, allocator), as in device_steps.c
                if dev == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(m(xs), ys)
            loss.backward()
            opt.step()
            out.append(loss.item())
        ms[dev] = 1e3 * (time.perf_counter() - t0) / (a.steps - 1) if a.steps > 1 else 0.0
        return out

    cpu, gpu = run("cpu"), run("cuda")
    print("torch_cpu " + " ".join(f"{v:.9g}" for v in cpu))
    print("torch_gpu " + " ".join(f"{v:.9g}" for v in gpu))
    rel = max(abs(p - q) for p, q in zip(gpu, cpu)) / abs(cpu[0])
    print(f"torch_rel={rel:.6g} torch={torch.__version__} device={torch.cuda.get_device_name(0)} "
          f"ms_per_step_cpu={ms['cpu']:.2f} ms_per_step_gpu={ms['cuda']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
