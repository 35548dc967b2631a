"""GPU utilisation and memory samples for make bench-gpu, from NVML (libnvidia-ml.so.1,
the driver's library, through ctypes: no Python package needed).

  gpu_watch.py check [--index N]
      exit 0 when NVML answers for device N (default 0), else 3 with the reason.
  gpu_watch.py sample FILE [--index N] [--interval S]
      append "time util_pct used_bytes" lines to FILE (time: seconds since the epoch)
      every S seconds (default 0.05) until SIGTERM or SIGINT. The first line is written
      and flushed before anything else happens, so a caller that waits for it has a
      baseline of the memory in use before the measured program starts. Exit 3 with
      the reason when NVML is not there or has no device N.
  gpu_watch.py window FILE T0 T1
      over the samples taken between T0 and T1: "busy_pct=<mean utilisation>
      used_mib=<most memory in use minus the baseline> samples=<n>", or "-" for each
      value when no sample falls in the window.

NVML's utilisation is the share of its last sample period (1/6 s to 1 s, by GPU) in which
any kernel was running: a GPU waiting on the host (a data-loader stall, launch overhead, a
synchronisation) shows as less than 100. rn-gpuinfo --watch reads the same counter but
stamps its samples in whole seconds, too coarse for windows of a few seconds.
NVML numbers devices by PCI bus, CUDA by speed: on a machine with one GPU they agree."""
import ctypes
import signal
import sys
import time


class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_device(index):
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        print(f"gpu_watch: no NVML ({e}): GPU utilisation cannot be sampled", file=sys.stderr)
        sys.exit(3)
    lib.nvmlErrorString.restype = ctypes.c_char_p

    def check(rc, what):
        if rc != 0:
            print(f"gpu_watch: {what}: {lib.nvmlErrorString(rc).decode()}", file=sys.stderr)
            sys.exit(3)

    check(lib.nvmlInit_v2(), "nvmlInit")
    h = ctypes.c_void_p()
    check(lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h)), f"device {index}")
    u, m = Util(), Mem()

    def read():
        check(lib.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u)), "nvmlDeviceGetUtilizationRates")
        check(lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)), "nvmlDeviceGetMemoryInfo")
        return u.gpu, m.used

    return read


def sample(path, index, interval):
    read = nvml_device(index)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    with open(path, "a") as f:
        nxt = time.monotonic()
        while not stop:
            util, used = read()
            f.write(f"{time.time():.3f} {util} {used}\n")
            f.flush()
            nxt += interval
            time.sleep(max(0.0, nxt - time.monotonic()))


def window(path, t0, t1):
    rows = [tuple(map(float, line.split())) for line in open(path) if len(line.split()) == 3]
    inside = [r for r in rows if t0 <= r[0] <= t1]
    if not rows or not inside:
        print(f"busy_pct=- used_mib=- samples={len(inside)}")
        return
    busy = sum(r[1] for r in inside) / len(inside)
    used = (max(r[2] for r in inside) - rows[0][2]) / 2**20
    print(f"busy_pct={busy:.1f} used_mib={used:.1f} samples={len(inside)}")


def main(argv):
    if argv[:1] == ["check"]:
        opts = dict(zip(argv[1::2], argv[2::2]))
        nvml_device(int(opts.get("--index", 0)))()
    elif len(argv) >= 2 and argv[0] == "sample":
        opts = dict(zip(argv[2::2], argv[3::2]))
        sample(argv[1], int(opts.get("--index", 0)), float(opts.get("--interval", 0.05)))
    elif len(argv) == 4 and argv[0] == "window":
        window(argv[1], float(argv[2]), float(argv[3]))
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
