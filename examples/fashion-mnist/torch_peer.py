"""The same Fashion-MNIST recipe in PyTorch/torchvision, for comparison with rn:
ImageFolder over the JPEG folders the example makes, Resize(SIZE) + CenterCrop(SIZE) (what
rn-prep --resize --center-crop stores), then RandomResizedCrop(SIZE) + flip + ImageNet
normalisation for training and the identity for testing; SGD momentum 0.9, weight decay
1e-4, StepLR; batch; drop_last, as rn-train.
usage: torch_peer.py JPEG_DIR ARCH SIZE EPOCHS BATCH LR LR_STEP THREADS WORKERS [options]
Options give the torchvision-v2-style recipe, each as rn-train's flag of the same name:
  --crop-pad N         RandomCrop(SIZE, padding=N) in place of RandomResizedCrop (crop-pad=N)
  --ta-wide            TrivialAugmentWide after the flip (ta_wide)
  --erase P            RandomErasing(P) after Normalize (erase=P)
  --label-smoothing X  cross-entropy label smoothing
  --lr-schedule cosine cosine in place of StepLR: over EPOCHS, times the ramp (rn's), or
                       over EPOCHS - W after a linear or constant warm-up; per step, or
                       per epoch with --lr-every epoch
  --mixup A, --cutmix A  torchvision's reference RandomMixup / RandomCutmix (p=1), one of the
                       two per batch with probability 1/2 when both are given
  --wd W               weight decay (default 1e-4); --no-wd-bn: none on BN and biases (rn's);
                       --no-wd-norm: none on BN only (torchvision's --norm-weight-decay 0.0)
  --warmup-epochs W    warm-up; --warmup-method ramp (rn's default: the schedule times
                       (k+1)/W at warm-up step k), or linear / constant from --warmup-decay D
                       (torchvision's LinearLR / ConstantLR, then the schedule from its start
                       through SequentialLR, as train.py)
  --lr-every epoch     the scheduler steps once per epoch, as train.py (default: every step)
  --ema-decay D, --ema-every N  torchvision's reference ExponentialMovingAverage (its
                       adjustment for batch and N, reset during the warm-up), evaluated too
Prints one line per epoch (with the lr of its last step) and 'peer: top1=... seconds=...'."""
import argparse
import math
import sys
import time

import torch
import torchvision
from torchvision import transforms as T

root, arch = sys.argv[1], sys.argv[2]
size, epochs, batch = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
lr, lr_step, threads, workers = float(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
ap = argparse.ArgumentParser(prog="torch_peer.py JPEG_DIR ARCH SIZE EPOCHS BATCH LR LR_STEP THREADS WORKERS")
ap.add_argument("--crop-pad", type=int, default=None)
ap.add_argument("--ta-wide", action="store_true")
ap.add_argument("--erase", type=float, default=0.0)
ap.add_argument("--label-smoothing", type=float, default=0.0)
ap.add_argument("--lr-schedule", choices=["step", "cosine"], default="step")
ap.add_argument("--mixup", type=float, default=0.0)
ap.add_argument("--cutmix", type=float, default=0.0)
ap.add_argument("--wd", type=float, default=1e-4)
wd_group = ap.add_mutually_exclusive_group()
wd_group.add_argument("--no-wd-bn", action="store_true")
wd_group.add_argument("--no-wd-norm", action="store_true")
ap.add_argument("--warmup-epochs", type=int, default=0)
ap.add_argument("--warmup-method", choices=["ramp", "linear", "constant"], default="ramp")
ap.add_argument("--warmup-decay", type=float, default=0.01)
ap.add_argument("--lr-every", choices=["step", "epoch"], default="step")
ap.add_argument("--ema-decay", type=float, default=0.0)
ap.add_argument("--ema-every", type=int, default=32)
opt_args = ap.parse_args(sys.argv[10:])
torch.set_num_threads(threads)
torch.manual_seed(0)
norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
base = [T.Resize(size), T.CenterCrop(size)]
rgb = T.Lambda(lambda im: im.convert("RGB"))
crop = T.RandomCrop(size, padding=opt_args.crop_pad) if opt_args.crop_pad is not None else T.RandomResizedCrop(size)
aug = [crop, T.RandomHorizontalFlip()] + ([T.TrivialAugmentWide()] if opt_args.ta_wide else [])
after = [T.RandomErasing(opt_args.erase)] if opt_args.erase > 0 else []
train = torchvision.datasets.ImageFolder(f"{root}/train", T.Compose([rgb] + base + aug + [T.ToTensor(), norm] + after))
test = torchvision.datasets.ImageFolder(f"{root}/test", T.Compose([rgb] + base + [T.ToTensor(), norm]))
tl = torch.utils.data.DataLoader(train, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers)
vl = torch.utils.data.DataLoader(test, batch_size=256, num_workers=workers)
model = getattr(torchvision.models, arch)(num_classes=len(train.classes))
if opt_args.no_wd_bn:  # rn's --no-wd-bn: BN weights and biases, and every bias (1-D tensors)
    groups = [{"params": [p for p in model.parameters() if p.ndim > 1]},
              {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0}]
elif opt_args.no_wd_norm:  # torchvision's set_weight_decay with norm_weight_decay 0.0
    bn = {id(p) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters()}
    groups = [{"params": [p for p in model.parameters() if id(p) not in bn]},
              {"params": [p for p in model.parameters() if id(p) in bn], "weight_decay": 0.0}]
else:
    groups = model.parameters()
opt = torch.optim.SGD(groups, lr=lr, momentum=0.9, weight_decay=opt_args.wd)
unit = len(tl) if opt_args.lr_every == "step" else 1  # scheduler steps per epoch
warm = opt_args.warmup_epochs * unit


def warmup(i):
    return (i + 1) / warm if i < warm else 1.0


if warm and opt_args.warmup_method != "ramp":  # train.py: SequentialLR([warm-up, main], [W])
    if opt_args.lr_schedule == "cosine":
        main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs * unit - warm, unit))
    else:
        main = torch.optim.lr_scheduler.StepLR(opt, lr_step * unit, 0.1)
    if opt_args.warmup_method == "linear":
        first = torch.optim.lr_scheduler.LinearLR(opt, start_factor=opt_args.warmup_decay, total_iters=warm)
    else:
        first = torch.optim.lr_scheduler.ConstantLR(opt, factor=opt_args.warmup_decay, total_iters=warm)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [first, main], milestones=[warm])
elif opt_args.lr_schedule == "cosine":  # rn's cosine: over the whole run, times the ramp
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(1.0, i / (epochs * unit)))) * warmup(i))
elif warm:
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.1 ** ((i // unit) // lr_step) * warmup(i))
else:
    sched = torch.optim.lr_scheduler.StepLR(opt, lr_step, 0.1)
# stepped every optimiser step, or once per epoch (StepLR alone is the same either way)
per_step = opt_args.lr_every == "step" and (opt_args.lr_schedule == "cosine" or warm > 0)
ema = None
if opt_args.ema_decay > 0:  # references/classification/train.py and utils.py
    alpha = min(1.0, (1.0 - opt_args.ema_decay) * batch * opt_args.ema_every / epochs)
    decay = 1.0 - alpha
    ema = torch.optim.swa_utils.AveragedModel(
        model, avg_fn=lambda avg, p, n: decay * avg + (1.0 - decay) * p, use_buffers=True)


def mix(x, y):
    """torchvision's references/classification/transforms.py RandomMixup / RandomCutmix, p=1,
    in a RandomChoice when both are on: x (N, C, H, W) and one-hot y mixed with their roll by one."""
    use_cutmix = opt_args.cutmix > 0 and (opt_args.mixup <= 0 or torch.rand(1).item() < 0.5)
    alpha = opt_args.cutmix if use_cutmix else opt_args.mixup
    lam = float(torch._sample_dirichlet(torch.tensor([alpha, alpha]))[0])
    xr, yr = x.roll(1, 0), y.roll(1, 0)
    if use_cutmix:
        H, W = x.shape[-2:]
        rx, ry = int(torch.randint(W, (1,))), int(torch.randint(H, (1,)))
        r = 0.5 * math.sqrt(1.0 - lam)
        rw, rh = int(r * W), int(r * H)
        x1, y1, x2, y2 = max(rx - rw, 0), max(ry - rh, 0), min(rx + rw, W), min(ry + rh, H)
        x = x.clone()
        x[:, :, y1:y2, x1:x2] = xr[:, :, y1:y2, x1:x2]
        lam = 1.0 - float((x2 - x1) * (y2 - y1)) / (W * H)
    else:
        x = x * lam + xr * (1.0 - lam)
    return x, y * lam + yr * (1.0 - lam)


def top1(m):
    m.eval()
    correct = n = 0
    with torch.no_grad():
        for x, y in vl:
            correct += (m(x).argmax(1) == y).sum().item()
            n += len(y)
    return correct / n, n


t0 = time.time()
for epoch in range(epochs):
    model.train()
    for i, (x, y) in enumerate(tl):
        if opt_args.mixup > 0 or opt_args.cutmix > 0:
            x, y = mix(x, torch.nn.functional.one_hot(y, len(train.classes)).float())
        loss = torch.nn.functional.cross_entropy(model(x), y, label_smoothing=opt_args.label_smoothing)
        opt.zero_grad()
        loss.backward()
        opt.step()
        last_lr = opt.param_groups[0]["lr"]
        if ema is not None and i % opt_args.ema_every == 0:
            ema.update_parameters(model)
            if epoch < opt_args.warmup_epochs:
                ema.n_averaged.fill_(0)
        if per_step:
            sched.step()
    if not per_step:
        sched.step()
    acc, n = top1(model)
    ema_text = f" ema_top1={top1(ema)[0]:.4f}" if ema is not None else ""
    print(f"epoch {epoch + 1}: top1={acc:.4f}{ema_text} n={n} lr={last_lr:.6g} ({time.time() - t0:.0f} s)",
          flush=True)
print(f"peer: top1={acc:.4f}{ema_text} seconds={time.time() - t0:.0f}")
