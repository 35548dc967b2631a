"""PyTorch side of make bench-gpu: the same training as bench_gpu_step and rn-train, in
PyTorch eager as people run it fast: channels_last, cudnn.benchmark, torch.autocast
(fp16 with a GradScaler, or bf16), SGD momentum 0.9, weight decay 1e-4.

  gpu_peer.py synth  [options]   a fixed random batch already on the device
  gpu_peer.py loader --data DIR  torchvision's ImageFolder on DIR + DataLoader (pinned
                                 memory, persistent workers): RandomResizedCrop, flip,
                                 ToTensor, Normalize, as rn-train's loader does
Options: --arch resnet50 --size 224 --batch 256 --warmup 5 --steps 20 --classes 1000
         --precisions fp32,fp16,bf16 --workers N --device cuda --tf32 0|1 --lr 0.01

One line per precision, each from a fresh model and optimiser:
  precision=<p> img/s=<x> ms_per_step=<m> peak_mib=<a> reserved_mib=<r> data_wait=<w> t0=<s> t1=<s>
peak_mib is torch.cuda.max_memory_allocated over the timed steps (the warm-up, where
cudnn.benchmark tries algorithms with large workspaces, is left out); reserved_mib is what
the caching allocator held then. t0, t1: the timed window in seconds since the epoch.
--device cpu --steps 1 --batch 2 --size 64 checks this script without a GPU (its fp16
row then runs in fp32: CPU autocast knows bf16 only in older torch)."""
import argparse
import contextlib
import time

import torch
import torch.nn.functional as F
import torchvision

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["synth", "loader"])
    p.add_argument("--data")
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--precisions", default="fp32,fp16,bf16")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tf32", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.01)
    a = p.parse_args()
    if a.mode == "loader" and not a.data:
        p.error("loader needs --data DIR (an ImageFolder tree)")
    return a


def grad_scaler(enabled):
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


def batches(a, dev):
    """Endless (x, y) on the device, and a function giving the seconds spent waiting."""
    if a.mode == "synth":
        g = torch.Generator().manual_seed(1)
        x = torch.randn(a.batch, 3, a.size, a.size, generator=g).to(dev).contiguous(memory_format=torch.channels_last)
        y = (torch.arange(a.batch) * 37 % a.classes).to(dev)
        while True:
            yield x, y
    import torchvision.transforms as T

    tf = T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(a.data, transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, drop_last=True,
                                     pin_memory=dev.type == "cuda", persistent_workers=a.workers > 0)
    if len(dl) == 0:
        raise SystemExit(f"gpu_peer: {a.data}: {len(ds)} images do not fill one batch of {a.batch}")
    while True:
        for x, y in dl:
            yield (x.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last),
                   y.to(dev, non_blocking=True))


def run(a, prec, dev):
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    m = getattr(torchvision.models, a.arch)(num_classes=a.classes).to(dev).to(memory_format=torch.channels_last)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[prec]
    # CPU autocast (the dry run) knows bf16 only in the torch of some machines
    amp = prec == "bf16" or (prec == "fp16" and dev.type == "cuda")
    scaler = grad_scaler(prec == "fp16" and dev.type == "cuda")
    data = batches(a, dev)
    wait = 0.0
    t0 = w0 = 0.0
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            sync()
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            wait, t0, w0 = 0.0, time.perf_counter(), time.time()
        tw = time.perf_counter()
        x, y = next(data)
        wait += time.perf_counter() - tw
        with torch.autocast(device_type=dev.type, dtype=dtype) if amp else contextlib.nullcontext():
            loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    sync()
    dt, w1 = time.perf_counter() - t0, time.time()
    mib = (lambda b: f"{b / 2**20:.1f}") if dev.type == "cuda" else (lambda b: "-")
    peak = mib(torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0)
    held = mib(torch.cuda.memory_reserved(dev) if dev.type == "cuda" else 0)
    print(f"precision={prec} img/s={a.steps * a.batch / dt:.2f} ms_per_step={1e3 * dt / a.steps:.3f} "
          f"peak_mib={peak} reserved_mib={held} data_wait={wait / dt:.4f} t0={w0:.3f} t1={w1:.3f}", flush=True)
    # the next precision starts from nothing: no cached blocks, no worker processes
    del data, m, opt, scaler, x, y, loss
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def main():
    a = parse()
    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("gpu_peer: torch sees no CUDA device")
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = bool(a.tf32)
        torch.backends.cuda.matmul.allow_tf32 = bool(a.tf32)
    print(f"# torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, cudnn "
          f"{torch.backends.cudnn.version()}, tf32 {a.tf32}, {a.mode}, workers {a.workers}", flush=True)
    for prec in a.precisions.split(","):
        run(a, prec, dev)


if __name__ == "__main__":
    main()
