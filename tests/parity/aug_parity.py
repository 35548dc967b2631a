#!/usr/bin/env python3
"""The --augment ops against torchvision (tests/augment.bats).

  aug_parity.py dist
      rn's samplers (parity_aug_draws: the loader's Philox draws) against torchvision's
      get_params, 100,000 draws each with fixed seeds: RandomCrop offsets over the padded
      image, RandomResizedCrop boxes with non-default scale and ratio, RandomErasing boxes,
      the flip rate. Each marginal is compared with a two-sample chi-square test of
      homogeneity (cells with fewer than 10 draws in both samples together merged) at
      significance 0.001. Deterministic: the same draws every run.
  aug_parity.py images DIR
      writes DIR/a/*.png, DIR/b/*.png: RGB images of several sizes (rn-prep --encode raw
      keeps their pixels exactly).
  aug_parity.py pixels DIR OUT.raw S PAD MODE FILL
      every S x S image in OUT.raw (rn-load --raw of --augment crop-pad=PAD:MODE:fill=FILL,flip)
      must equal torchvision.transforms.functional's pad(PAD, FILL, MODE) + crop + (hflip)
      of one source image at some offset: identical bytes. Also checks that both flips
      and several offsets occur, and that another padding mode would not match.
"""
import glob
import os
import subprocess
import sys

import numpy as np
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image

N = 100_000
ALPHA = 1e-3
BIN = os.path.join(os.environ.get("RN_BUILD", "build"), "tests", "parity_aug_draws")


def chi2_homogeneity(a, b):
    """two samples of equal size, integer values: statistic, df, p"""
    lo, hi = min(a.min(), b.min()), max(a.max(), b.max())
    ca = np.bincount(a - lo, minlength=hi - lo + 1).astype(np.float64)
    cb = np.bincount(b - lo, minlength=hi - lo + 1).astype(np.float64)
    cells_a, cells_b, acc_a, acc_b = [], [], 0.0, 0.0
    for x, y in zip(ca, cb):
        acc_a += x
        acc_b += y
        if acc_a + acc_b >= 10:
            cells_a.append(acc_a)
            cells_b.append(acc_b)
            acc_a = acc_b = 0.0
    if acc_a + acc_b > 0:
        if cells_a:
            cells_a[-1] += acc_a
            cells_b[-1] += acc_b
        else:
            cells_a.append(acc_a)
            cells_b.append(acc_b)
    ca, cb = np.array(cells_a), np.array(cells_b)
    stat = float(((ca - cb) ** 2 / (ca + cb)).sum())
    df = len(ca) - 1
    if df == 0:
        return stat, 0, 1.0
    p = float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                      torch.tensor(stat / 2.0, dtype=torch.float64)))
    return stat, df, p


def rn_draws(*args):
    out = subprocess.run([BIN] + [str(a) for a in args + (N, 7)], check=True, capture_output=True, text=True).stdout
    return np.array([[int(v) for v in line.split()] for line in out.splitlines()], dtype=np.int64)


def compare(name, rn, tv, cols):
    failed = 0
    assert rn.shape == tv.shape, (rn.shape, tv.shape)
    for k, col in enumerate(cols):
        stat, df, p = chi2_homogeneity(rn[:, k], tv[:, k])
        ok = p > ALPHA
        failed += not ok
        print(f"{name} {col}: chi2 {stat:.1f} df {df} p {p:.4f} {'ok' if ok else 'FAIL'} "
              f"(rn mean {rn[:, k].mean():.4f}, torchvision {tv[:, k].mean():.4f})")
    return failed


def dist():
    torch.manual_seed(20)
    failed = 0
    # RandomCrop(32, padding=4) on a 32x30 image: the offset over the 40x38 padded image
    img = torch.empty(3, 30 + 8, 32 + 8)
    tv = np.array([T.RandomCrop.get_params(img, (32, 32))[:2] for _ in range(N)], dtype=np.int64)
    failed += compare("crop-pad=4 32x30 -> 32", rn_draws("crop", 32, 30, 4, 32), tv, ["i", "j"])
    # RandomResizedCrop with scale (0.35, 1), ratio (0.5, 2) on 64x48
    img = torch.empty(3, 48, 64)
    tv = np.array([T.RandomResizedCrop.get_params(img, [0.35, 1.0], [0.5, 2.0]) for _ in range(N)], dtype=np.int64)
    failed += compare("rrc scale 0.35-1 ratio 0.5-2 64x48", rn_draws("rrc", 64, 48, 0.35, 1, 0.5, 2), tv,
                      ["i", "j", "h", "w"])
    # RandomErasing's boxes, defaults and wider ones, on a 32x24 image
    for s0, s1, r0, r1 in [(0.02, 0.33, 0.3, 3.3), (0.1, 0.6, 0.2, 5.0)]:
        img = torch.empty(3, 24, 32)
        tv = np.array([T.RandomErasing.get_params(img, (s0, s1), (r0, r1), [0])[:4] for _ in range(N)],
                      dtype=np.int64)
        failed += compare(f"erase scale {s0}-{s1} ratio {r0}-{r1} 32x24", rn_draws("erase", 32, 24, s0, s1, r0, r1),
                          tv, ["i", "j", "h", "w"])
    # RandomHorizontalFlip(p): forward draws torch.rand(1) < p
    for p in (0.5, 0.3):
        tv = np.array([[int(torch.rand(1) < p)] for _ in range(N)], dtype=np.int64)
        failed += compare(f"flip p={p}", rn_draws("flip", p), tv, ["flipped"])
    print(f"distributions: {failed} failed")
    return 1 if failed else 0


def images(d):
    rng = np.random.default_rng(5)
    sizes = [(24, 24), (30, 26), (27, 31), (40, 24), (24, 36), (25, 25)]
    for k, (w, h) in enumerate(sizes):
        cls = "ab"[k % 2]
        os.makedirs(os.path.join(d, cls), exist_ok=True)
        px = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        Image.fromarray(px).save(os.path.join(d, cls, f"{k:02d}.png"))
    return 0


def pixels(d, raw, S, pad, mode, fill):
    S, pad, fill = int(S), int(pad), int(fill)
    srcs = [torch.from_numpy(np.array(Image.open(p).convert("RGB"))).permute(2, 0, 1).contiguous()
            for p in sorted(glob.glob(os.path.join(d, "*", "*.png")))]
    out = np.fromfile(raw, dtype=np.uint8).reshape(-1, S, S, 3)
    other = "constant" if mode != "constant" else "reflect"

    def candidates(m):
        for src in srcs:
            p = F.pad(src, [pad], fill=fill, padding_mode=m)
            H, W = p.shape[1], p.shape[2]
            for i in range(H - S + 1):
                for j in range(W - S + 1):
                    c = F.crop(p, i, j, S, S)
                    yield (i, j, 0), c.permute(1, 2, 0).numpy().tobytes()
                    yield (i, j, 1), F.hflip(c).permute(1, 2, 0).numpy().tobytes()

    table = {}
    for key, b in candidates(mode):
        table.setdefault(b, key)
    alt = {b for _, b in candidates(other)}
    matched, flips, offsets, unlike_other = 0, set(), set(), 0
    for img in out:
        b = img.tobytes()
        if b in table:
            matched += 1
            i, j, f = table[b]
            flips.add(f)
            offsets.add((i, j))
        unlike_other += b not in alt
    print(f"crop-pad={pad}:{mode}:fill={fill},flip: {matched} of {len(out)} images equal torchvision's "
          f"pad+crop(+hflip); flips seen {sorted(flips)}, {len(offsets)} offsets; "
          f"{unlike_other} unlike any {other} padding")
    ok = matched == len(out) and flips == {0, 1} and len(offsets) >= 5 and unlike_other > 0
    print("pixels: " + ("ok" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "dist":
        sys.exit(dist())
    if cmd == "images":
        sys.exit(images(sys.argv[2]))
    if cmd == "pixels":
        sys.exit(pixels(*sys.argv[2:8]))
    print(__doc__)
    sys.exit(2)
