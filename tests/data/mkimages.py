#!/usr/bin/python3
"""Generate JPEG test inputs for rn-prep/rn-load tests and benchmarks (seeded).

  mkimages.py folder DIR --classes K --per-class N [--size WxH] [--vary] [--seed S] [--noise SIGMA]
      ImageFolder tree DIR/class_XX/img_YYYY.jpg with smooth, textured content.
  mkimages.py broken DIR
      one of each bad or unusual input rn-prep must handle (see the names).
  mkimages.py list DIR LIST
      a Caffe list file 'relative/path label' for the ImageFolder tree DIR.
"""
import argparse
import os
import struct
import sys

import numpy as np
from PIL import Image


def picture(rng, w, h, noise=6.0):
    """Gradients, blobs and mild noise: compresses like a photograph, never flat."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 60 * np.sin(a * x / 17 + b * y / 23 + p * 6)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(5, max(w, h) / 3)
        col = rng.uniform(-80, 80, 3)
        m = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
        img += m[..., None] * col
    img += rng.normal(0, noise, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def folder(a):
    rng = np.random.default_rng(a.seed)
    w, h = map(int, a.size.split("x"))
    for k in range(a.classes):
        d = os.path.join(a.dir, "class_%02d" % k)
        os.makedirs(d, exist_ok=True)
        for i in range(a.per_class):
            ww, hh = (w, h)
            if a.vary:
                ww = int(rng.integers(w // 2, w + 1))
                hh = int(rng.integers(h // 2, h + 1))
            picture(rng, ww, hh, a.noise).save(os.path.join(d, "img_%04d.jpg" % i), quality=a.quality)


def listfile(a):
    classes = sorted(e.name for e in os.scandir(a.dir) if e.is_dir())
    with open(a.list, "w") as f:
        for k, c in enumerate(classes):
            for fn in sorted(os.listdir(os.path.join(a.dir, c))):
                f.write("%s/%s %d\n" % (c, fn, k))


def broken(a):
    rng = np.random.default_rng(1)
    d = os.path.join(a.dir, "odd")
    os.makedirs(d, exist_ok=True)
    good = picture(rng, 96, 72)
    good.save(os.path.join(d, "good.jpg"), quality=90)
    good.save(os.path.join(d, "progressive.jpg"), quality=90, progressive=True)
    good.save(os.path.join(d, "s444.jpg"), quality=90, subsampling=0)
    good.save(os.path.join(d, "s422.jpg"), quality=90, subsampling=1)
    good.convert("L").save(os.path.join(d, "gray.jpg"), quality=90)
    good.convert("CMYK").save(os.path.join(d, "cmyk.jpg"), quality=90)
    data = open(os.path.join(d, "good.jpg"), "rb").read()
    open(os.path.join(d, "truncated.jpg"), "wb").write(data[: len(data) // 2])
    open(os.path.join(d, "zero.jpg"), "wb").close()
    open(os.path.join(d, "text.jpg"), "w").write("this is not a picture\n")
    good.save(os.path.join(d, "png_named.jpg"), format="PNG")
    # huge dimensions in the frame header (SOF0): 60000 x 60000
    b = bytearray(data)
    i = 2
    while i < len(b):
        assert b[i] == 0xFF
        m, n = b[i + 1], struct.unpack(">H", b[i + 2:i + 4])[0]
        if m in (0xC0, 0xC1, 0xC2):
            b[i + 5:i + 9] = struct.pack(">HH", 60000, 60000)
            break
        i += 2 + n
    open(os.path.join(d, "huge.jpg"), "wb").write(bytes(b))
    # garbage in the entropy-coded data after a valid header
    c = bytearray(data)
    for j in range(len(c) // 2, len(c) - 2):
        c[j] = (c[j] * 7 + 13) & 0xFF
        if c[j] == 0xFF:
            c[j] = 0xFE
    open(os.path.join(d, "corrupt.jpg"), "wb").write(bytes(c))
    # data that stops early but is closed properly: libjpeg warns "premature end of data
    # segment" and fills the rest with grey (PIL decodes both without a word)
    prog = open(os.path.join(d, "progressive.jpg"), "rb").read()
    open(os.path.join(d, "prog_cut.jpg"), "wb").write(prog[: len(prog) * 2 // 3] + b"\xff\xd9")
    # a restart marker where none belongs, in the middle of the entropy-coded data
    r = bytearray(data)
    sos = r.find(b"\xff\xda")
    r[sos + 300:sos + 302] = b"\xff\xd0"
    open(os.path.join(d, "stray_rst.jpg"), "wb").write(bytes(r))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("folder")
    f.add_argument("dir")
    f.add_argument("--classes", type=int, default=3)
    f.add_argument("--per-class", type=int, default=4)
    f.add_argument("--size", default="64x48")
    f.add_argument("--vary", action="store_true")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--quality", type=int, default=90)
    f.add_argument("--noise", type=float, default=6.0, help="pixel noise sigma (more: bigger files)")
    b = sub.add_parser("broken")
    b.add_argument("dir")
    li = sub.add_parser("list")
    li.add_argument("dir")
    li.add_argument("list")
    a = p.parse_args()
    {"folder": folder, "broken": broken, "list": listfile}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
