"""rn's augmentation ops (rn/augops.h) against torchvision.transforms.functional on uint8 tensors.

  augops_parity.py pixels PARITY_AUGOPS   every op, several images and magnitudes
  augops_parity.py draws PARITY_AUGOPS    each policy's sampler against torchvision's, 100,000 draws

pixels: seeded random images (c = 3 and 1, odd and even sizes, one not square, a low-contrast one and a flat one),
each op at the magnitudes the policies use (both ends of every table, signs, a middle value),
through autoaugment._apply_op (the code the policies call) and F.adjust_hue / F.adjust_* with
ColorJitter's factors. The criterion is identical bytes for every op. The geometric ops'
sampling grid is torchvision's float32 GEMM (K = 3), whose rounding depends on the BLAS kernel
the machine picks, and shear 1/15 puts many sampling points exactly on half pixels, where that
rounding decides the pixel: the reference forms the grid in one fixed order (fixed_order_grid,
the order rn documents) and checks that it is torch's own grid up to the rounding of a sum of
three products, so the outcome is the same on every machine.
The magnitude tables rn's policies draw from are checked entry by entry against torchvision's.
draws: op/magnitude combinations against torchvision's own sampler (its forward with
_apply_op replaced by a recorder; ColorJitter.get_params), Pearson's chi-square test of
homogeneity, p > 1e-3; ColorJitter's factors with a two-sample Kolmogorov-Smirnov test. Seeds
are fixed, so the outcome is the same on every run. Prints one line per check and a closing
"N checks, M failed" line."""
import collections
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torchvision.transforms as T
import torchvision.transforms.autoaugment as AA
import torchvision.transforms.functional as F

OPS = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
       "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert", "Hue"]
P_MIN = 1e-3
failed = 0
checks = 0


def report(ok, msg):
    global failed, checks
    checks += 1
    failed += 0 if ok else 1
    print(("ok   " if ok else "FAIL ") + msg)


def images():
    g = torch.Generator().manual_seed(20)
    out = []
    for s, c in [(33, 3), (32, 3), (17, 1), (24, 1), (57, 3), (224, 3)]:
        out.append((f"random {s}x{s}x{c}", torch.randint(0, 256, (c, s, s), generator=g, dtype=torch.uint8)))
    out.append(("random 20x13x3 (w x h)", torch.randint(0, 256, (3, 13, 20), generator=g, dtype=torch.uint8)))
    smooth = torch.nn.functional.interpolate(torch.rand(1, 3, 5, 5, generator=g), size=(40, 40), mode="bilinear")
    out.append(("smooth 40x40x3", (smooth[0] * 255).to(torch.uint8)))
    out.append(("low-contrast 31x31x3", torch.randint(90, 130, (3, 31, 31), generator=g, dtype=torch.uint8)))
    out.append(("low-contrast 20x20x1", torch.randint(40, 49, (1, 20, 20), generator=g, dtype=torch.uint8)))
    out.append(("flat 9x9x3", torch.full((3, 9, 9), 77, dtype=torch.uint8)))
    out.append(("tiny 2x2x3", torch.randint(0, 256, (3, 2, 2), generator=g, dtype=torch.uint8)))
    return out


def magnitudes(op, size):
    """the values _apply_op sees under TrivialAugmentWide, RandAugment and AutoAugment, both signs"""
    def tables(nb):
        ta = AA.TrivialAugmentWide()._augmentation_space(nb)
        ra = AA.RandAugment()._augmentation_space(nb, (size, size))
        return ta, ra
    vals = set()
    for nb in (31, 10):
        for space in tables(nb):
            if op not in space:
                continue
            mags, signed = space[op]
            if mags.ndim == 0:
                vals.add(0.0)
                continue
            for i in sorted({0, 1, 2, 9, len(mags) // 2, len(mags) - 2, len(mags) - 1}):
                m = float(mags[i].item())
                vals.add(m)
                if signed:
                    vals.add(-m)
    if op == "Posterize":
        vals |= {0.0, 1.0, 8.0}
    if op == "Solarize":
        vals |= {0.0, 127.5, 128.0, 255.0}
    if op == "Hue":
        vals = {-0.5, -0.25, -0.1, -0.033, 0.0, 0.01, 0.1, 0.3, 0.5}
    return sorted(vals)


try:  # torchvision >= 0.15 renamed it
    import torchvision.transforms._functional_tensor as F_t
except ImportError:
    import torchvision.transforms.functional_tensor as F_t


def fma32(a, b, c):
    """fma(a, b, c) rounded once to float32, for float64 tensors holding float32 values: a * b is
    exact in float64; the sum's rounding error (TwoSum) settles a float64 result that lands on a
    float32 half-way point, the one place rounding twice could differ from rounding once"""
    prod = a * b
    s = prod + c
    bv = s - prod
    err = (prod - (s - bv)) + (c - bv)
    r = s.float()
    other = torch.nextafter(r, torch.where(s > r.double(), torch.tensor(float("inf")), torch.tensor(float("-inf"))))
    halfway = (s != r.double()) & (s == (r.double() + other.double()) / 2)
    towards_other = (other.double() - s) * err > 0
    return torch.where(halfway & towards_other, other, r)


grid_dev = [0.0]  # the furthest torch's own GEMM grid was from the fixed order's (units below)
GRID_DEV_MAX = 8
grid_calls = [0]
_gen_affine_grid = F_t._gen_affine_grid


def fixed_order_grid(theta, w, h, ow, oh):
    """torchvision's _gen_affine_grid with its float32 GEMM (base grid x rescaled theta, K = 3)
    summed in one fixed order, fma(y, t1, x * t0) + t2, OpenBLAS's on x86-64 with its Haswell
    kernel and rn's (lib/augops.c): what another kernel gives for a sampling point within
    rounding of a half pixel depends on the machine, so the reference must not"""
    grid_calls[0] += 1
    d = 0.5
    x = torch.linspace(-ow * 0.5 + d, ow * 0.5 + d - 1, steps=ow).double().view(1, ow).expand(oh, ow)
    y = torch.linspace(-oh * 0.5 + d, oh * 0.5 + d - 1, steps=oh).double().view(oh, 1).expand(oh, ow)
    rt = (theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=theta.dtype))[0].double()
    cols = []
    # torch's own product, compared in units of 2^-24 times the sum of the three terms'
    # magnitudes: two summation orders of three products differ by at most about 6 of them
    theirs = _gen_affine_grid(theta, w, h, ow, oh)[0]
    for j in range(2):
        xt0 = x * rt[0, j]  # exact in float64
        cols.append((fma32(y, rt[1, j], xt0.float().double()).double() + rt[2, j]).float())  # each rounded once
        mag = xt0.abs() + (y * rt[1, j]).abs() + rt[2, j].abs()
        diff = (theirs[..., j].double() - cols[j].double()).abs()
        # (where all three terms are 0 both must be 0: no division by 0 to hide a NaN)
        dev = torch.where(mag > 0, diff / (mag * 2.0**-24), torch.where(diff > 0, float("inf"), 0.0))
        grid_dev[0] = max(grid_dev[0], float(dev.max()))
    return torch.stack(cols, -1).view(1, oh, ow, 2)


F_t._gen_affine_grid = fixed_order_grid


def torch_op(img, op, mag):
    if op == "Hue":
        return F.adjust_hue(img, mag)
    return AA._apply_op(img, op, mag, interpolation=T.InterpolationMode.NEAREST, fill=None)


def pixels(binary):
    cases = []  # (label, kind, op index, value, image CHW, expected CHW)
    for name, img in images():
        for op_i, op in enumerate(OPS):
            for m in magnitudes(op, img.shape[-1]):
                cases.append((f"{op}({m:g}) on {name}", 0, op_i, m, img, torch_op(img, op, m)))
        # ColorJitter's direct factors: brightness, contrast, saturation (0.6..1.4 at 0.4) and beyond
        for op, fn in (("Brightness", F.adjust_brightness), ("Contrast", F.adjust_contrast),
                       ("Color", F.adjust_saturation), ("Sharpness", F.adjust_sharpness)):
            for f in (0.0, 0.6, 0.7313, 1.0, 1.25, 1.4, 2.0):
                cases.append((f"adjust {op}({f:g}) on {name}", 1, OPS.index(op), f, img, fn(img, f)))
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "cases"), os.path.join(d, "out")
        with open(inp, "wb") as f:
            f.write(struct.pack("<i", len(cases)))
            for _, kind, op_i, m, img, _ in cases:
                c, h, w = img.shape
                f.write(struct.pack("<iidiii", kind, op_i, m, w, h, c))
                f.write(img.permute(1, 2, 0).contiguous().numpy().tobytes())
        subprocess.run([binary, "apply", inp, out], check=True)
        got = open(out, "rb").read()
    per_op = collections.defaultdict(lambda: [0, 0, 0, 0])  # cases, differing pixels, pixels, max diff
    off = 0
    worst = {}
    for label, kind, op_i, m, img, want in cases:
        c, h, w = img.shape
        n = c * h * w
        mine = torch.frombuffer(bytearray(got[off:off + n]), dtype=torch.uint8).view(h, w, c).permute(2, 0, 1)
        off += n
        diff = (mine.int() - want.int()).abs()
        pix_bad = int((diff.amax(dim=0) > 0).sum())
        key = OPS[op_i] + (" (factor)" if kind else "")
        st = per_op[key]
        st[0] += 1
        st[1] += pix_bad
        st[2] += h * w
        st[3] = max(st[3], int(diff.max()))
        frac = pix_bad / (h * w)
        if pix_bad and frac > worst.get(key, (0, ""))[0]:
            worst[key] = (frac, label)
        if pix_bad:
            report(False, f"{label}: {pix_bad} of {h * w} pixels differ, by up to {int(diff.max())}")
    for key, (ncase, bad, tot, mx) in per_op.items():
        extra = f", worst: {worst[key][1]}" if key in worst else ""
        report(bad == 0, f"{key}: {ncase} cases, {bad} of {tot} pixels differ (max {mx}; criterion identical){extra}")
    report(grid_calls[0] > 0 and grid_dev[0] <= GRID_DEV_MAX,
           f"the geometric ops' grid in the fixed order ({grid_calls[0]} grids) is torch's own GEMM's on this "
           f"machine within {grid_dev[0]:.2f} x 2^-24 x the terms' magnitudes (at most {GRID_DEV_MAX})")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def tables(binary):
    """rn's magnitude tables against torchvision's _augmentation_space (torch.linspace in float32)"""
    for label, policy, args, nb, space in (
            ("TrivialAugmentWide(31)", "ta_wide", "-", 31, lambda s: AA.TrivialAugmentWide()._augmentation_space(31)),
            ("TrivialAugmentWide(5)", "ta_wide", "5", 5, lambda s: AA.TrivialAugmentWide()._augmentation_space(5)),
            ("TrivialAugmentWide(100)", "ta_wide", "100", 100,
             lambda s: AA.TrivialAugmentWide()._augmentation_space(100)),
            ("RandAugment(31 bins)", "randaug", "-", 31, lambda s: AA.RandAugment()._augmentation_space(31, (s, s))),
            ("RandAugment(64 bins)", "randaug", "2,9,64", 64,
             lambda s: AA.RandAugment()._augmentation_space(64, (s, s))),
            ("AutoAugment(imagenet)", "autoaug", "-", 10,
             lambda s: AA.AutoAugment()._augmentation_space(10, (s, s)))):
        bad, n = [], 0
        for size in (8, 17, 32, 100, 224, 331, 512):
            out = subprocess.run([binary, "table", policy, args, str(size), str(size)], check=True,
                                 capture_output=True, text=True).stdout
            # %.9g round-trips a float32: compare as float32
            mine = {(o, int(b)): f32(float(v)) for o, b, v in (l.split() for l in out.splitlines())}
            for op, (mags, _) in space(size).items():
                if mags.ndim == 0:
                    continue
                for i in range(nb):
                    n += 1
                    want = f32(float(mags[i].item()))
                    if mine[(op, i)] != want:
                        bad.append(f"{op}[{i}] at {size}: {mine[(op, i)]!r} != {want!r}")
        report(not bad, f"{label}: {n} magnitude table entries (7 sizes) against torchvision's" +
               (f"; {len(bad)} differ, e.g. {bad[:3]}" if bad else ""))


def gammaq(a, x):
    """regularised upper incomplete gamma Q(a, x) (Numerical Recipes' gammq)"""
    if x <= 0:
        return 1.0
    gln = math.lgamma(a)
    if x < a + 1:
        s = term = 1.0 / a
        ap = a
        for _ in range(100000):
            ap += 1
            term *= x / ap
            s += term
            if abs(term) < abs(s) * 1e-15:
                break
        return 1.0 - s * math.exp(-x + a * math.log(x) - gln)
    b = x + 1 - a
    c = 1 / 1e-300
    d = 1 / b
    h = d
    for i in range(1, 100000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        de = d * c
        h *= de
        if abs(de - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - gln) * h


def chi2_homogeneity(a, b):
    """two equal-size samples of categories: chi-square statistic, degrees of freedom, p; categories
    with fewer than 10 expected per sample pooled into one"""
    na, nb = sum(a.values()), sum(b.values())
    keys = set(a) | set(b)
    small = [k for k in keys if (a[k] + b[k]) * min(na, nb) / (na + nb) < 10]
    cells = [(a[k], b[k]) for k in keys if k not in small]
    if small:
        cells.append((sum(a[k] for k in small), sum(b[k] for k in small)))
    stat = 0.0
    for oa, ob in cells:
        tot = oa + ob
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (oa - ea) ** 2 / ea + (ob - eb) ** 2 / eb
    df = len(cells) - 1
    return stat, df, gammaq(df / 2, stat / 2) if df > 0 else 1.0


def ks_2samp(x, y):
    x, y = sorted(x), sorted(y)
    i = j = 0
    d = 0.0
    while i < len(x) and j < len(y):
        v = min(x[i], y[j])
        while i < len(x) and x[i] == v:
            i += 1
        while j < len(y) and y[j] == v:
            j += 1
        d = max(d, abs(i / len(x) - j / len(y)))
    ne = len(x) * len(y) / (len(x) + len(y))
    lam = (math.sqrt(ne) + 0.12 + 0.11 / math.sqrt(ne)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(max(p, 0.0), 1.0)


def torch_draws(transform, n, size):
    rec = []
    orig = AA._apply_op

    def record(img, op_name, magnitude, interpolation, fill):
        rec[-1].append(f"{op_name}:{magnitude + 0.0:.3f}")
        return img
    AA._apply_op = record
    try:
        img = torch.zeros((3, size, size), dtype=torch.uint8)
        for _ in range(n):
            rec.append([])
            transform(img)
    finally:
        AA._apply_op = orig
    return collections.Counter(" ".join(r) for r in rec)


def rn_lines(binary, policy, args, n, size, seed=1):
    out = subprocess.run([binary, "draw", policy, args, str(n), str(size), str(size), str(seed)], check=True,
                         capture_output=True, text=True).stdout
    return out.splitlines()


def draws(binary, n=100000):
    torch.manual_seed(1)
    size = 224
    # the defaults with n draws each; a non-default setting of each with n / 5
    for label, policy, args, tf, k in (
            ("TrivialAugmentWide", "ta_wide", "-", AA.TrivialAugmentWide(), n),
            ("TrivialAugmentWide(bins=5)", "ta_wide", "5", AA.TrivialAugmentWide(num_magnitude_bins=5), n // 5),
            ("RandAugment(2, 9)", "randaug", "-", AA.RandAugment(), n),
            ("RandAugment(1, 30, 31)", "randaug", "1,30,31", AA.RandAugment(num_ops=1, magnitude=30), n // 5),
            ("AutoAugment(imagenet)", "autoaug", "-", AA.AutoAugment(AA.AutoAugmentPolicy.IMAGENET), n)):
        theirs = torch_draws(tf, k, size)
        mine = collections.Counter(rn_lines(binary, policy, args, k, size))
        only = set(mine) - set(theirs)
        report(not only,
               f"{label}: rn draws nothing torchvision cannot ({len(only)} unseen outcomes"
               + (f", e.g. {sorted(only)[:3]})" if only else ")"))
        stat, df, p = chi2_homogeneity(mine, theirs)
        report(p > P_MIN, f"{label}: {k} draws, {len(set(mine) | set(theirs))} outcomes, chi2 {stat:.1f} "
               f"df {df} p {p:.3g} (need > {P_MIN:g})")
    jit = (0.4, 0.4, 0.4, 0.1)
    cj = T.ColorJitter(*jit)
    names = ["Brightness", "Contrast", "Color", "Hue"]
    orders, factors = collections.Counter(), collections.defaultdict(list)
    for _ in range(n):
        idx, b, c, s, h = cj.get_params(cj.brightness, cj.contrast, cj.saturation, cj.hue)
        orders[" ".join(names[i] for i in idx.tolist())] += 1
        for k, v in zip(names, (b, c, s, h)):
            factors[k].append(v)
    my_orders, my_factors = collections.Counter(), collections.defaultdict(list)
    for line in rn_lines(binary, "jitter", ",".join(map(str, jit)), n, size):
        parts = [t.split(":") for t in line.split()]
        my_orders[" ".join(k for k, _ in parts)] += 1
        for k, v in parts:
            my_factors[k].append(float(v))
    stat, df, p = chi2_homogeneity(my_orders, orders)
    report(p > P_MIN and len(my_orders) == 24, f"ColorJitter{jit}: order of the 4 adjustments, {len(my_orders)} "
           f"orders, chi2 {stat:.1f} df {df} p {p:.3g} (need > {P_MIN:g})")
    for k in names:
        d, p = ks_2samp(my_factors[k], factors[k])
        lo, hi = min(my_factors[k]), max(my_factors[k])
        report(p > P_MIN, f"ColorJitter{jit}: {k} factor in [{lo:.4f}, {hi:.4f}], KS D {d:.4f} p {p:.3g} "
               f"(need > {P_MIN:g})")


def main():
    what, binary = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    if what == "pixels":
        tables(binary)
        pixels(binary)
    else:
        draws(binary, int(sys.argv[3]) if len(sys.argv) > 3 else 100000)
    print(f"{checks} checks, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
