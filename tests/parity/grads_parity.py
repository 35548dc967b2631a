"""rn-train --dump-grads against torchvision: the first step's gradients recomputed in
float64 (reference) and float32 (yardstick) from the batch stored in the dump.
usage: grads_parity.py [--freeze-bn] INIT.safetensors GRADS.safetensors
(--freeze-bn: torchvision in train() with every BatchNorm in eval(), as rn-train --freeze-bn)
Criterion, tensor by tensor: ||rn - ref|| <= 10 * ||torch32 - ref|| + 1e-6 * ||ref||."""
import sys

import torch
import torchvision

import rnst

args = sys.argv[1:]
freeze_bn = args[:1] == ["--freeze-bn"]
if freeze_bn:
    args = args[1:]
init, _ = rnst.load(args[0])
dump, meta = rnst.load(args[1])
pixels, labels = dump.pop("input.pixels"), dump.pop("input.labels").long()
mean = torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64)
std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64)
x = ((pixels.double() / 255.0 - mean) / std).permute(0, 3, 1, 2).contiguous()
classes = init["fc.weight"].shape[0]


def grads(dtype):
    m = getattr(torchvision.models, meta["arch"])(num_classes=classes)
    m.load_state_dict(init)
    m = m.to(dtype).train()
    if freeze_bn:
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.eval()
    loss = torch.nn.functional.cross_entropy(m(x.to(dtype)), labels)
    loss.backward()
    return {n: p.grad.double() for n, p in m.named_parameters()}


ref, t32 = grads(torch.float64), grads(torch.float32)
fails = 0
for name, r in ref.items():
    a = dump[name].double()
    err, terr = (a - r).norm().item(), (t32[name] - r).norm().item()
    bound = 10 * terr + 1e-6 * r.norm().item()
    if not err <= bound:
        fails += 1
        print(f"FAIL {name}: ||rn-ref||={err:.3e} > {bound:.3e}")
print(f"dump-grads parity{' (frozen BN)' if freeze_bn else ''}: {len(ref)} gradients of a batch of {len(labels)}, {fails} failed")
sys.exit(1 if fails else 0)
