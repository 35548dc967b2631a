"""PyTorch side of make bench-cpu: the same work as bench_cpu_step.
usage: cpu_peer.py ARCH SIZE BATCH STEPS THREADS train|eval
Prints "img/s=<x> peak_rss_mib=<y> blas=<OpenBLAS kernel>"."""
import ctypes
import resource
import sys
import time

import torch
import torchvision

arch, size, batch, steps, threads, mode = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
torch.set_num_threads(threads)
torch.manual_seed(0)
m = getattr(torchvision.models, arch)(num_classes=1000)
x = torch.randn(batch, 3, size, size)
y = torch.arange(batch) * 37 % 1000
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
if mode == "train":
    m.train()
else:
    m.eval()
t0 = 0.0
for s in range(steps + 1):
    if s == 1:
        t0 = time.perf_counter()
    if mode == "train":
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    else:
        with torch.no_grad():
            m(x)
dt = time.perf_counter() - t0


def blas_kernel():
    """The kernel of the OpenBLAS this process loaded (torch's BLAS on Debian), or '-'."""
    try:
        f = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
    except OSError:
        return "-"
    f.restype = ctypes.c_char_p
    return f().decode()


print(f"img/s={steps * batch / dt:.2f} peak_rss_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} blas={blas_kernel()}")
