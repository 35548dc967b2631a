"""PyTorch side of make bench-gpu's data-parallel rows: the training of gpu_peer.py loader
over N processes, one per GPU, as people run it fast: DistributedDataParallel over NCCL,
channels_last, cudnn.benchmark, torch.autocast fp16 with a GradScaler (or bf16), SGD
momentum 0.9, weight decay 1e-4; ImageFolder + DistributedSampler + DataLoader (pinned
memory, persistent workers): RandomResizedCrop, flip, ToTensor, Normalize.

  torchrun --standalone --nproc_per_node N gpu_ddp_peer.py --data DIR [options]
  or N processes started with MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK set
Options: --arch resnet50 --size 224 --batch 256 (per process) --warmup 5 --steps 20
         --classes 1000 --precision fp16 --workers N (per process) --device cuda
         --tf32 0|1 --lr 0.01 --timeout 300 (seconds a collective waits for the others)

Rank 0 prints one line:
  world=<N> precision=<p> img/s=<x> ms_per_step=<m> data_wait=<w> t0=<s> t1=<s>
img/s counts every process's images over the timed steps (all processes synchronised at
both ends); data_wait is the largest share of the window any process waited on its
DataLoader. --device cpu runs on the CPU over gloo, a check of this script (fp16 then
runs in fp32, as in gpu_peer.py)."""
import argparse
import contextlib
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T

from gpu_peer import MEAN, STD, grad_scaler


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--precision", default="fp16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tf32", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--timeout", type=float, default=300)
    return p.parse_args()


def batches(a, dev, rank, world):
    tf = T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(a.data, transform=tf)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                                              seed=0, drop_last=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers, drop_last=True,
                                     pin_memory=dev.type == "cuda", persistent_workers=a.workers > 0)
    if len(dl) == 0:
        raise SystemExit(f"gpu_ddp_peer: {a.data}: {len(ds)} images do not fill one batch of {a.batch} "
                         f"on each of {world} processes")
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        for x, y in dl:
            yield (x.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last),
                   y.to(dev, non_blocking=True))
        epoch += 1


def main():
    a = parse()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("gpu_ddp_peer: torch sees no CUDA device")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = bool(a.tf32)
        torch.backends.cuda.matmul.allow_tf32 = bool(a.tf32)
        sync = torch.cuda.synchronize
    else:
        dev = torch.device("cpu")
        # the node's cores shared among its processes, as rn-train does under mpirun
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
        sync = lambda: None  # noqa: E731
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=a.timeout))
    if rank == 0:
        print(f"# torch {torch.__version__}, torchvision {torchvision.__version__}, "
              f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, {dist.get_backend()}, "
              f"world {world}, tf32 {a.tf32}, workers {a.workers} per process", flush=True)

    torch.manual_seed(0)
    m = getattr(torchvision.models, a.arch)(num_classes=a.classes).to(dev).to(memory_format=torch.channels_last)
    m.train()
    ddp = torch.nn.parallel.DistributedDataParallel(m, device_ids=[local] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.precision]
    # CPU autocast (the dry run) knows bf16 only in the torch of some machines
    amp = a.precision == "bf16" or (a.precision == "fp16" and dev.type == "cuda")
    scaler = grad_scaler(a.precision == "fp16" and dev.type == "cuda")
    data = batches(a, dev, rank, world)
    wait = 0.0
    t0 = w0 = 0.0
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            sync()
            dist.barrier()
            wait, t0, w0 = 0.0, time.perf_counter(), time.time()
        tw = time.perf_counter()
        x, y = next(data)
        wait += time.perf_counter() - tw
        with torch.autocast(device_type=dev.type, dtype=dtype) if amp else contextlib.nullcontext():
            loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    sync()
    dist.barrier()
    dt, w1 = time.perf_counter() - t0, time.time()
    most = torch.tensor([wait / dt], dtype=torch.float64, device=dev)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"world={world} precision={a.precision} img/s={a.steps * a.batch * world / dt:.2f} "
              f"ms_per_step={1e3 * dt / a.steps:.3f} data_wait={most.item():.4f} t0={w0:.3f} t1={w1:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
