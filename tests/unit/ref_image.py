#!/usr/bin/python3
"""Reference values from PIL/torchvision for tests/unit/test_image.c.

  ref_image.py resize IN W H C OW OH X0 Y0 X1 Y1 OUT   PIL bilinear resize of raw u8 HWC
  ref_image.py decode IN.jpg OUT C                     PIL decode to RGB (C=3) or L (C=1), raw
  ref_image.py cmyk OUT.jpg OUT.raw                    a CMYK JPEG saved by PIL and its RGB
  ref_image.py rrc N OUT                               RandomResizedCrop.get_params with the draws
"""
import sys

from PIL import Image


def main():
    cmd = sys.argv[1]
    if cmd == "resize":
        src, w, h, c, ow, oh, x0, y0, x1, y1, out = sys.argv[2:]
        w, h, c, ow, oh = map(int, (w, h, c, ow, oh))
        mode = {1: "L", 3: "RGB"}[c]
        im = Image.frombytes(mode, (w, h), open(src, "rb").read())
        r = im.resize((ow, oh), Image.BILINEAR, box=tuple(map(float, (x0, y0, x1, y1))))
        open(out, "wb").write(r.tobytes())
    elif cmd == "decode":
        src, out, c = sys.argv[2], sys.argv[3], int(sys.argv[4])
        im = Image.open(src).convert("RGB" if c == 3 else "L")
        open(out, "wb").write(im.tobytes())
    elif cmd == "cmyk":
        import numpy as np
        rng = np.random.default_rng(3)
        a = rng.integers(0, 256, (24, 40, 4), dtype=np.uint8)
        im = Image.fromarray(a, "CMYK")
        im.save(sys.argv[2], quality=95)
        back = Image.open(sys.argv[2])
        assert back.mode == "CMYK"
        open(sys.argv[3], "wb").write(back.convert("RGB").tobytes())
    elif cmd == "rrc":
        import torch
        import torchvision.transforms as T
        n, out = int(sys.argv[2]), sys.argv[3]
        real_empty, real_randint = torch.empty, torch.randint
        draws = []

        def empty(*a, **k):
            t = real_empty(*a, **k)
            draws.append(("u", t))
            return t

        def randint(lo, hi, size):
            r = real_randint(lo, hi, size)
            draws.append(("i", int(r.item())))
            return r

        torch.empty, torch.randint = empty, randint
        g = torch.Generator().manual_seed(0)
        with open(out, "w") as f:
            for t in range(n):
                torch.manual_seed(t)
                w = int(real_randint(1, 600, (1,), generator=g).item())
                h = int(real_randint(1, 600, (1,), generator=g).item())
                if t % 7 == 0:  # very elongated images exercise the fallback
                    h = max(1, w // 9)
                draws.clear()
                img = Image.new("L", (w, h))
                i, j, hh, ww = T.RandomResizedCrop.get_params(img, (0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0))
                vals = []
                for kind, v in draws:
                    vals.append("u%.9g" % v.item() if kind == "u" else "i%d" % v)
                f.write("%d %d %d %d %d %d %d %s\n" % (w, h, j, i, ww, hh, len(vals), " ".join(vals)))
        torch.empty, torch.randint = real_empty, real_randint


if __name__ == "__main__":
    main()
