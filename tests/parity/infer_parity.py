"""Parity of the inference path (RN_NET_INFER: BN folded into the convs, fused bias,
residual and ReLU) with the exact path (RN_NET_INFER_EXACT) and torchvision's eval mode.

usage: infer_parity.py ARCH SIZE [BATCH] [CLASSES]

rn-init's weights with BN weights, biases and running statistics made random (rn-init's
are 1, 0, 0, 1, which would leave nothing to fold), exported to safetensors; the same
batch through parity_rn_infer and through torchvision in float64 (the reference).
Checks: fast and exact logits within ||rn - ref|| <= 1e-5 ||ref|| (the eval criterion of
train_parity.py); the same top-1 class as the reference for every image; the fast logits
bit-identical at 1, 2 and 3 threads. Prints the max abs differences. Exits 1 on failure."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torchvision

import rnst

arch, size = sys.argv[1], int(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 4
classes = int(sys.argv[4]) if len(sys.argv) > 4 else 10
bindir = os.environ.get("RN_BIN", "build/bin")
harness = os.path.join(os.environ.get("RN_BUILD", "build"), "tests", "parity_rn_infer")
tmp = tempfile.mkdtemp(prefix="rn-infer-parity-")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # some hundred MB of tensors
torch.manual_seed(4321)

subprocess.run([f"{bindir}/rn-init", "--arch", arch, "--classes", str(classes), "--seed", "7", "-o", f"{tmp}/init.pb"],
               check=True)
subprocess.run([f"{bindir}/rn-export", f"{tmp}/init.pb", f"{tmp}/init.safetensors"], check=True)
sd, meta = rnst.load(f"{tmp}/init.safetensors")
for name, t in sd.items():
    if not name.endswith(("running_mean", "running_var", ".weight", ".bias")) or "bn" not in name and "downsample.1" not in name:
        continue
    if name.endswith("running_mean") or name.endswith(".bias"):
        sd[name] = 0.1 * torch.randn_like(t)
    elif name.endswith("running_var"):
        sd[name] = 0.5 + 1.5 * torch.rand_like(t)
    else:
        sd[name] = 0.5 + torch.rand_like(t)
rnst.save(f"{tmp}/bn.safetensors", sd, meta)

x = torch.randn(batch, 3, size, size)
rnst.save(f"{tmp}/in.safetensors", {"x": x.permute(0, 2, 3, 1).contiguous()})
subprocess.run([harness, f"{tmp}/bn.safetensors", f"{tmp}/in.safetensors", f"{tmp}/out.safetensors"], check=True)
rn, _ = rnst.load(f"{tmp}/out.safetensors")

m = getattr(torchvision.models, arch)(num_classes=classes)
m.load_state_dict(sd)
m = m.double().eval()
with torch.no_grad():
    ref = m(x.double())

fails = 0
fast, exact = rn["fast.2"].double(), rn["exact"].double()
for name, a in (("fast", fast), ("exact", exact)):
    err, bound = (a - ref).norm().item(), 1e-5 * ref.norm().item()
    if not err <= bound:
        fails += 1
        print(f"FAIL {name}: ||rn-ref||={err:.3e} > bound {bound:.3e}")
    if not torch.equal(a.argmax(1), ref.argmax(1)):
        fails += 1
        print(f"FAIL {name}: top-1 {a.argmax(1).tolist()} != reference {ref.argmax(1).tolist()}")
for t in ("fast.1", "fast.3"):
    if not torch.equal(rn[t], rn["fast.2"]):
        fails += 1
        print(f"FAIL {t} differs from fast.2: the result depends on the thread count")
print(f"infer parity {arch} {size}x{size} batch {batch}: {fails} failed; max |logit diff| fast-exact "
      f"{(fast - exact).abs().max().item():.3e}, fast-ref {(fast - ref).abs().max().item():.3e}, "
      f"exact-ref {(exact - ref).abs().max().item():.3e} (max |ref| {ref.abs().max().item():.3e})")
sys.exit(1 if fails else 0)
