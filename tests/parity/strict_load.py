"""Load rn-export output into torchvision with strict=True and compare every tensor.
usage: strict_load.py OUT.safetensors ARCH CLASSES [ZERO_INIT(0|1)]
Prints one summary line; exits 1 on any mismatch."""
import math
import sys

import torch
import torchvision

import rnst

path, arch, classes = sys.argv[1], sys.argv[2], int(sys.argv[3])
zero_init = len(sys.argv) > 4 and sys.argv[4] == "1"
sd, meta = rnst.load(path)
assert meta.get("arch") == arch, f"metadata arch {meta.get('arch')} != {arch}"
assert int(meta.get("num_classes")) == classes, meta
model = getattr(torchvision.models, arch)(num_classes=classes)
ref_names = list(model.state_dict().keys())
assert list(sd.keys()) == ref_names, "tensor order differs from torchvision's state_dict"
model.load_state_dict(sd, strict=True)
bad = 0
for name, t in model.state_dict().items():
    if not torch.equal(t, sd[name]):
        print(f"mismatch after load: {name}")
        bad += 1
# the values follow torchvision's init distributions
conv = sd["layer1.0.conv1.weight"]
fan_out = conv.shape[0] * conv.shape[2] * conv.shape[3]
std = conv.std().item()
if abs(std - math.sqrt(2.0 / fan_out)) > 0.1 * math.sqrt(2.0 / fan_out):
    print(f"conv std {std} is not kaiming fan_out {math.sqrt(2.0 / fan_out)}")
    bad += 1
bound = 1.0 / math.sqrt(sd["fc.weight"].shape[1])
if sd["fc.weight"].abs().max().item() > bound or sd["fc.bias"].abs().max().item() > bound:
    print("fc values exceed 1/sqrt(fan_in)")
    bad += 1
last_bn = "layer1.0.bn3.weight" if "layer1.0.bn3.weight" in sd else "layer1.0.bn2.weight"
want = 0.0 if zero_init else 1.0
if not torch.all(sd[last_bn] == want):
    print(f"{last_bn} is not {want}")
    bad += 1
nparams = sum(p.numel() for p in model.parameters())
print(f"strict load ok: {arch} {len(sd)} tensors {nparams} parameters, {bad} mismatches")
sys.exit(1 if bad else 0)
