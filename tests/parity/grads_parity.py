"""rn-train --dump-grads against torchvision: the first step's gradients recomputed in
float64 (reference) and float32 (yardstick) from the batch stored in the dump.
usage: grads_parity.py [--freeze-bn] [--label-smoothing E] [--top1 X] INIT.safetensors GRADS.safetensors
(--freeze-bn: torchvision in train() with every BatchNorm in eval(), as rn-train --freeze-bn;
--label-smoothing: as rn-train's, torch's cross_entropy label_smoothing)
A dump of a run with --mixup/--cutmix says how its micro-batch was mixed (metadata "mix": kind,
lambda, cutmix box): the batch is mixed here by torchvision's reference code (RandomMixup /
RandomCutmix of references/classification/transforms.py, given rn's lambda and box) and the
loss taken on the soft targets, as train.py does. A dump of a run with --augment ...,erase lists
each image's erase box (metadata "erase"): the boxes are written into the normalised batch
(zeros, or rn's N(0, 1) values from Philox) before it is mixed, as torchvision erases each image.
--top1 X: rn-train's train_top1 of that step, checked against train.py's acc1 (utils.accuracy: the
float32 model's top-1 against target.max(dim=1), the dominant target) on the same batch.
Criterion, tensor by tensor: ||rn - ref|| <= 10 * ||torch32 - ref|| + 1e-6 * ||ref||."""
import math
import sys

import torch
import torchvision

import rnst

args = sys.argv[1:]
freeze_bn = args[:1] == ["--freeze-bn"]
if freeze_bn:
    args = args[1:]
smoothing, top1 = 0.0, None
while args[:1] in (["--label-smoothing"], ["--top1"]):
    if args[0] == "--top1":
        top1 = float(args[1])
    else:
        smoothing = float(args[1])
    args = args[2:]
init, _ = rnst.load(args[0])
dump, meta = rnst.load(args[1])
pixels, labels = dump.pop("input.pixels"), dump.pop("input.labels").long()
mean = torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64)
std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64)
x = ((pixels.double() / 255.0 - mean) / std).permute(0, 3, 1, 2).contiguous()


def philox(key, hi, lo):
    """lib/rng.c's rn_philox: Philox-4x32-10 of counter (hi, lo) under key"""
    M = 0xFFFFFFFF
    c0, c1, c2, c3 = lo & M, lo >> 32, hi & M, hi >> 32
    k0, k1 = key & M, key >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M, (p0 >> 32) ^ c3 ^ k1, p0 & M
        k0, k1 = (k0 + 0x9E3779B9) & M, (k1 + 0xBB67AE85) & M
    return c0, c1, c2, c3


def erase_value(key, epoch, rec, e):
    """rn_erase_value: N(0, 1) by Box-Muller in double, rounded to float32"""
    r = philox(key, epoch & 0xFFFFFFFFFFFFFFFF, (rec << 32) | (e >> 2))
    pair = (e & 3) >> 1
    u1 = (r[2 * pair] + 1.0) * (1.0 / 4294967297.0)
    u2 = r[2 * pair + 1] * (1.0 / 4294967296.0)
    rad, th = math.sqrt(-2.0 * math.log(u1)), 6.283185307179586 * u2
    return float(torch.tensor(rad * math.sin(th) if e & 1 else rad * math.cos(th), dtype=torch.float32))


# --augment's erase (metadata "erase": the pixels are u8 before it): torchvision's RandomErasing on
# each normalised image, before the batch is mixed
if meta.get("erase"):
    head, *boxes = meta["erase"].split(";")
    ekey, eepoch = map(int, head.split())
    _, H, W, C = pixels.shape
    for k, box in enumerate(boxes):
        bx, by, bw, bh, rec, rnd = map(int, box.split())
        for yy in range(by, by + bh):
            for xx in range(bx, bx + bw):
                for ch in range(C):
                    x[k, ch, yy, xx] = erase_value(ekey, eepoch, rec, (yy * W + xx) * C + ch) if rnd else 0.0
classes = init["fc.weight"].shape[0]
mix = [m.split() for m in meta.get("mix", "").split(";") if m]
if len(mix) > 1:
    sys.exit("grads_parity.py: a mixed dump of several micro-batches (one forward here): dump with --accum 1")
kind, lam, y0, y1, x0, x1 = (mix[0][0], float(mix[0][1]), *map(int, mix[0][2:])) if mix else ("none", 1.0, 0, 0, 0, 0)


def mixed(x, dtype):
    """torchvision's RandomMixup / RandomCutmix forward with rn's lambda and box: (batch, soft target)"""
    batch = x.to(dtype)
    if kind == "none":
        return batch, labels
    target = torch.nn.functional.one_hot(labels, num_classes=classes).to(dtype)
    batch_rolled, target_rolled = batch.roll(1, 0), target.roll(1, 0)
    if kind == "mixup":
        batch_rolled.mul_(1.0 - lam)
        batch = batch.mul(lam).add_(batch_rolled)
    else:
        batch = batch.clone()
        batch[:, :, y0:y1, x0:x1] = batch_rolled[:, :, y0:y1, x0:x1]
    target_rolled.mul_(1.0 - lam)
    target.mul_(lam).add_(target_rolled)
    return batch, target


acc1 = {}


def grads(dtype):
    m = getattr(torchvision.models, meta["arch"])(num_classes=classes)
    m.load_state_dict(init)
    m = m.to(dtype).train()
    if freeze_bn:
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.eval()
    batch, target = mixed(x, dtype)
    out = m(batch)
    dominant = target.max(dim=1)[1] if target.ndim == 2 else target
    acc1[dtype] = (out.argmax(dim=1) == dominant).double().mean().item()
    loss = torch.nn.functional.cross_entropy(out, target, label_smoothing=smoothing)
    loss.backward()
    return {n: p.grad.double() for n, p in m.named_parameters()}


ref, t32 = grads(torch.float64), grads(torch.float32)
fails, worst = 0, 0.0
for name, r in ref.items():
    a = dump[name].double()
    err, terr = (a - r).norm().item(), (t32[name] - r).norm().item()
    bound = 10 * terr + 1e-6 * r.norm().item()
    worst = max(worst, err / bound if bound > 0 else 0.0)
    if not err <= bound:
        fails += 1
        print(f"FAIL {name}: ||rn-ref||={err:.3e} > {bound:.3e}")
how = (" (frozen BN)" if freeze_bn else "") + (f" ({kind} lambda {lam:.4f})" if kind != "none" else "") + \
    (f" (label smoothing {smoothing})" if smoothing else "")
print(f"dump-grads parity{how}: {len(ref)} gradients of a batch of {len(labels)}, {fails} failed "
      f"(worst error {worst:.3f} of its bound)")
if top1 is not None:
    ok = abs(top1 - acc1[torch.float32]) < 1e-6
    fails += not ok
    print(f"train top-1 against the dominant target: rn {top1:.6f}, torchvision's reference {acc1[torch.float32]:.6f}"
          f"{'' if ok else ' FAIL'}")
sys.exit(1 if fails else 0)
