"""torch's learning-rate schedulers as torchvision's references/classification/train.py
builds them, against `rn-train --print-lr`'s table.

usage: lr_sched.py TABLE SCHED LR EPOCHS SPE WARMUP METHOD DECAY CLOCK [ARG]
  TABLE   rn-train --print-lr's output (epoch first_step lr_first lr_last per line)
  SCHED   cosine | step | multistep | exp | constant
  ARG     step: "STEP_SIZE,GAMMA"; multistep: "M1:M2:...,GAMMA"; exp: "GAMMA";
          cosine: "ETA_MIN" (default 0)
  METHOD  linear | constant (torchvision's --lr-warmup-method; WARMUP 0: none)
  CLOCK   epoch: scheduler.step() once per epoch, as train.py; step: once per optimiser
          step, every length in steps (epochs x SPE)

Builds the main scheduler (StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR with
T_max = EPOCHS - WARMUP and ETA_MIN, or none for constant), and with WARMUP > 0 LinearLR(start_factor =
DECAY, total_iters = WARMUP) or ConstantLR(factor = DECAY, ...), chained by
SequentialLR(milestones=[WARMUP]) as train.py does. It reads the optimiser's lr at each
step of the table's first and last step of every epoch and prints one line:
"epochs N, worst relative difference X, K rates differ as float32" (the optimiser's
precision) and exits 1 when X > 1e-12 or a row is missing, 2 on bad arguments. torch
computes its rates recursively (each from the last), rn in closed form: the two agree to
the last bits of a double, not to the bit."""
import sys
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")


def main():
    table, sched, lr, epochs, spe, warm, method, decay, clock = sys.argv[1:10]
    arg = sys.argv[10] if len(sys.argv) > 10 else ""
    lr, epochs, spe, warm, decay = float(lr), int(epochs), int(spe), int(warm), float(decay)
    if method not in ("linear", "constant") or clock not in ("step", "epoch"):
        print(f"lr_sched.py: METHOD {method!r} is not linear or constant, or CLOCK {clock!r} not step or epoch")
        sys.exit(2)
    unit = spe if clock == "step" else 1  # scheduler steps per epoch
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr, momentum=0.9)
    if sched == "cosine":
        main_s = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=(epochs - warm) * unit,
                                                            eta_min=float(arg) if arg else 0.0)
    elif sched == "exp" and clock == "epoch":
        main_s = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=float(arg))
    elif sched == "step":
        size, gamma = arg.split(",")
        main_s = torch.optim.lr_scheduler.StepLR(opt, step_size=int(size) * unit, gamma=float(gamma))
    elif sched == "multistep":
        miles, gamma = arg.split(",")
        main_s = torch.optim.lr_scheduler.MultiStepLR(
            opt, milestones=[int(m) * unit for m in miles.split(":")], gamma=float(gamma))
    elif sched == "constant":
        main_s = torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)
    else:
        print("lr_sched.py: unknown schedule " + sched)
        sys.exit(2)
    s = main_s
    if warm > 0:
        if method == "linear":
            w = torch.optim.lr_scheduler.LinearLR(opt, start_factor=decay, total_iters=warm * unit)
        else:
            w = torch.optim.lr_scheduler.ConstantLR(opt, factor=decay, total_iters=warm * unit)
        s = torch.optim.lr_scheduler.SequentialLR(opt, schedulers=[w, main_s], milestones=[warm * unit])
    # torch's rate at each optimiser step of the run
    want = []
    for e in range(epochs):
        for k in range(spe):
            want.append(opt.param_groups[0]["lr"])
            opt.step()
            if clock == "step" or k == spe - 1:
                s.step()
    rows = [line.split() for line in open(table) if line.strip() and not line.startswith("#")]
    worst, n, f32 = 0.0, 0, 0
    for r in rows:
        e, first, lr_first, lr_last = int(r[0]), int(r[1]), float(r[2]), float(r[3])
        for step, got in ((first, lr_first), (first + spe - 1, lr_last)):
            ref = want[step]
            d = abs(got - ref) / max(abs(ref), 1e-300) if ref != got else 0.0
            worst = max(worst, d)
            f32 += int(np.float32(got) != np.float32(ref))
        n += 1
    print(f"epochs {n}, worst relative difference {worst:.3g}, {f32} rates differ as float32")
    sys.exit(0 if n == epochs and worst <= 1e-12 else 1)


if __name__ == "__main__":
    main()
