"""PyTorch side of make bench-dist: data-parallel training on the CPU with
DistributedDataParallel over gloo, one thread per rank, on a fixed random batch.
usage: dist_peer.py WORLD ARCH SIZE BATCH WARMUP STEPS
BATCH is the global batch of one optimiser step; each rank computes BATCH/WORLD images.
Started without RANK in the environment, it starts WORLD copies of itself on this machine
(MASTER_ADDR=127.0.0.1, a free MASTER_PORT, WORLD_SIZE, RANK: what torchrun would set;
Debian's torchrun fails at start-up) and prints rank 0's line:
"img/s=<x> step_s=<s1,s2,...> blas=<OpenBLAS kernel>".

Timing, the same as make bench-dist reads from rn-train's log: each step's time is rank
0's wall time from the end of the previous step to the end of this one (backward has
waited for DDP's all-reduce, and opt.step is done), and img/s = STEPS * BATCH / (the sum
over the STEPS steps after WARMUP)."""
import ctypes
import os
import socket
import subprocess
import sys
import time

world, arch, size, batch, warmup, steps = int(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:7])


def launch():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                   RANK=str(r), LOCAL_RANK=str(r), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env,
                                      stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL))
    out = procs[0].communicate()[0].decode()
    rcs = [p.wait() for p in procs]
    if any(rcs):
        sys.exit(f"dist_peer.py: ranks exited {rcs}")
    sys.stdout.write(out)


def blas_kernel():
    """The kernel of the OpenBLAS this process loaded (torch's BLAS on Debian), or '-'."""
    try:
        f = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
    except OSError:
        return "-"
    f.restype = ctypes.c_char_p
    return f().decode()


def rank_main():
    import torch
    import torch.distributed as dist
    import torchvision

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if batch % world:
        sys.exit(f"dist_peer.py: batch {batch} is not a multiple of the world {world}")
    local = batch // world
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    m = torchvision.models.__dict__[arch](num_classes=1000)
    m.train()
    ddp = torch.nn.parallel.DistributedDataParallel(m)  # bucket_cap_mb 25, as rn's --bucket-mb
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(local, 3, size, size, generator=g)
    y = (torch.arange(local) + rank * local) * 37 % 1000
    ends = [time.perf_counter()]
    for _ in range(warmup + steps):
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ends.append(time.perf_counter())
    dts = [b - a for a, b in zip(ends[warmup:], ends[warmup + 1:])]
    if rank == 0:
        print(f"img/s={steps * batch / sum(dts):.2f} step_s={','.join(f'{d:.3f}' for d in dts)} blas={blas_kernel()}")
    dist.destroy_process_group()


if "RANK" in os.environ:
    rank_main()
else:
    launch()
