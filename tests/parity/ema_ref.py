"""The reference for rn-train --ema-decay: torchvision's ExponentialMovingAverage (an
AveragedModel with use_buffers=True) driven as references/classification/train.py drives
it, over the sequence of weights rn-train's steps produced, compared with rn's EMA set.

usage: ema_ref.py ARCH CLASSES DECAY EVERY BATCH EPOCHS STEPS_PER_EPOCH WARMUP EMA.safetensors
                  W1.safetensors ... WK.safetensors
Wk holds the model after optimiser step k (1-based) of the run; EMA.safetensors is the run's
EMA set after step K (rn-export --ema). Exits non-zero when a floating tensor differs by more
than float rounding."""
import sys

import torch
import torchvision
from torch.optim.swa_utils import AveragedModel

sys.path.insert(0, __import__("os").path.dirname(__file__))
import rnst  # noqa: E402


class ExponentialMovingAverage(AveragedModel):
    """torchvision references/classification/utils.py, verbatim in substance."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def main():
    arch, classes = sys.argv[1], int(sys.argv[2])
    decay, every, batch, epochs = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    spe, warmup = int(sys.argv[7]), int(sys.argv[8])
    ema_path, steps = sys.argv[9], sys.argv[10:]
    # train.py: adjust = world_size * batch_size * model_ema_steps / epochs (rn: --batch is global)
    adjust = batch * every / epochs
    alpha = min(1.0, (1.0 - decay) * adjust)
    model = getattr(torchvision.models, arch)(num_classes=classes)
    ema = ExponentialMovingAverage(model, decay=1.0 - alpha)
    updates = 0
    for k, path in enumerate(steps):
        w, _ = rnst.load(path)
        model.load_state_dict(w, strict=True)
        epoch, i = k // spe, k % spe
        # train_one_epoch: after the optimiser step of batch i
        if i % every == 0:
            ema.update_parameters(model)
            updates += 1
            if epoch < warmup:
                ema.n_averaged.fill_(0)
    got, _ = rnst.load(ema_path)
    want = ema.module.state_dict()
    worst, bad, nfloat = 0.0, 0, 0
    for name, t in want.items():
        g = got[name]
        if not t.is_floating_point():
            # torch averages num_batches_tracked in float and truncates; rn copies the model's
            continue
        nfloat += 1
        err = ((g.double() - t.double()).abs() / t.double().abs().clamp(min=1.0)).max().item()
        worst = max(worst, err)
        if err > 2e-7:
            bad += 1
            print(f"{name}: max rel err {err:.3g}")
    print(f"alpha {alpha:.9g}, {updates} updates, n_averaged {int(ema.n_averaged)}: {nfloat} floating tensors, "
          f"{bad} differ beyond float rounding, max rel err {worst:.3g}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
