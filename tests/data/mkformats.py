#!/usr/bin/python3
"""Generate non-JPEG test inputs for rn-prep (seeded), and PIL's pixels for them.

  mkformats.py png DIR [--size N]
      DIR/png/<variant>.png: every PNG kind rn-prep reads: grey 1/2/4/8/16 bits, grey+alpha,
      RGB and RGBA at 8 and 16 bits, palettes of 1/2/4/8 bits, tRNS transparency,
      Adam7 interlacing; written by PIL where PIL can, by a small writer here where it
      cannot (16-bit colour, low bit depths, interlacing). All N x N (default 29).
  mkformats.py pngbroken DIR
      DIR/odd/*.png: truncated, corrupt and hostile PNGs (see the names).
  mkformats.py webp DIR [--size N]
      DIR/webp/<variant>.webp: lossy and lossless, with and without alpha, from RGB and
      grey sources, at a few qualities; written by PIL (libwebp). All N x N.
  mkformats.py webpbroken DIR
      DIR/odd/*.webp: truncated, corrupt and hostile WebPs.
  mkformats.py pnm DIR [--size N]
      DIR/pnm/*.ppm|pgm: binary P6 and P5 of maxval 255 and 65535, with header comments.
  mkformats.py pnmbroken DIR
      DIR/odd/*.ppm|pgm: truncated, plain (P3), other maxval, huge, bad header.
  mkformats.py bmp DIR [--size N]
      DIR/bmp/*.bmp: 1/4/8-bit palettes, 24 and 32 bits, BITFIELDS, top-down, OS/2 and
      V5 headers; by PIL and by a small writer here.
  mkformats.py bmpbroken DIR
      DIR/odd/*.bmp: truncated, RLE, 16-bit, huge, bad header.
  mkformats.py ref DIR OUT [--gray]
      the pixels of every image under DIR, in ImageFolder order, as PIL's
      Image.open(f).convert("RGB") (or "L") gives them, concatenated u8 HWC.
"""
import argparse
import io
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def chunk(kind, data):
    c = kind + data
    return struct.pack(">I", len(data)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)


def pack_rows(a, depth):
    """(h, w, c) samples to PNG scanlines, each with filter byte 0."""
    out = bytearray()
    for row in a:
        out.append(0)
        flat = row.reshape(-1)
        if depth == 16:
            out += flat.astype(">u2").tobytes()
        elif depth == 8:
            out += flat.astype(np.uint8).tobytes()
        else:
            per = 8 // depth
            pad = (-len(flat)) % per
            v = np.concatenate([flat.astype(np.uint8), np.zeros(pad, np.uint8)]).reshape(-1, per)
            shifts = np.array([8 - depth * (i + 1) for i in range(per)], np.uint8)
            out += np.bitwise_or.reduce(v << shifts, axis=1).astype(np.uint8).tobytes()
    return bytes(out)


def write_png(path, a, ctype, depth, interlace=False, plte=None, trns=None):
    """a: (h, w, channels) samples (palette indices for ctype 3)."""
    h, w = a.shape[:2]
    if interlace:
        raw = b"".join(pack_rows(a[ys::yst, xs::xst], depth) for xs, ys, xst, yst in ADAM7
                       if a[ys::yst, xs::xst].size)
    else:
        raw = pack_rows(a, depth)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, int(interlace)))
    if plte is not None:
        png += chunk(b"PLTE", bytes(plte))
    if trns is not None:
        png += chunk(b"tRNS", trns)
    png += chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def samples(rng, n, ch, depth):
    """smooth gradients plus noise over the whole range of the depth: never flat"""
    top = (1 << depth) - 1
    y, x = np.mgrid[0:n, 0:n].astype(np.float64) / max(n - 1, 1)
    a = np.zeros((n, n, ch))
    for c in range(ch):
        p, q = rng.uniform(-1, 1, 2)
        a[..., c] = 0.5 + 0.4 * np.sin(3 * p * x + 4 * q * y + c)
    a += rng.normal(0, 0.08, a.shape)
    return np.clip(np.round(a * top), 0, top).astype(np.uint16 if depth == 16 else np.uint8)


def png(a):
    rng = np.random.default_rng(7)
    n = a.size
    d = os.path.join(a.dir, "png")
    os.makedirs(d, exist_ok=True)
    p = lambda name: os.path.join(d, name + ".png")
    for il in (False, True):
        s = "_adam7" if il else ""
        for depth in (1, 2, 4, 8, 16):
            write_png(p("grey%d%s" % (depth, s)), samples(rng, n, 1, depth), 0, depth, il)
        for depth in (8, 16):
            write_png(p("greyalpha%d%s" % (depth, s)), samples(rng, n, 2, depth), 4, depth, il)
            write_png(p("rgb%d%s" % (depth, s)), samples(rng, n, 3, depth), 2, depth, il)
            write_png(p("rgba%d%s" % (depth, s)), samples(rng, n, 4, depth), 6, depth, il)
        for depth in (1, 2, 4, 8):
            k = 1 << depth
            plte = rng.integers(0, 256, 3 * k, dtype=np.uint8)
            idx = rng.integers(0, k, (n, n, 1), dtype=np.uint8)
            write_png(p("palette%d%s" % (depth, s)), idx, 3, depth, il, plte=plte)
            trns = bytes(rng.integers(0, 256, k // 2 + 1, dtype=np.uint8))
            write_png(p("palette%d_trns%s" % (depth, s)), idx, 3, depth, il, plte=plte, trns=trns)
    write_png(p("grey8_trns"), samples(rng, n, 1, 8), 0, 8, trns=struct.pack(">H", 77))
    write_png(p("grey16_trns"), samples(rng, n, 1, 16), 0, 16, trns=struct.pack(">H", 4000))
    write_png(p("rgb8_trns"), samples(rng, n, 3, 8), 2, 8, trns=struct.pack(">HHH", 1, 2, 3))
    write_png(p("rgb16_trns"), samples(rng, n, 3, 16), 2, 16, trns=struct.pack(">HHH", 1, 2, 3))
    # PIL's own writer (adaptive filters, its zlib settings)
    rgb = samples(rng, n, 4, 8)
    Image.fromarray(rgb[..., :3], "RGB").save(p("pil_rgb"))
    Image.fromarray(rgb, "RGBA").save(p("pil_rgba"))
    Image.fromarray(rgb[..., 0], "L").save(p("pil_l"))
    Image.fromarray(rgb[..., :2], "LA").save(p("pil_la"))
    Image.fromarray(samples(rng, n, 1, 16)[..., 0], "I;16").save(p("pil_i16"))
    Image.fromarray(rgb[..., :3], "RGB").quantize(37).save(p("pil_p"), transparency=3)


def pngbroken(a):
    rng = np.random.default_rng(3)
    d = os.path.join(a.dir, "odd")
    os.makedirs(d, exist_ok=True)
    p = lambda name: os.path.join(d, name + ".png")
    write_png(p("good"), samples(rng, 40, 3, 8), 2, 8)
    good = open(p("good"), "rb").read()
    open(p("truncated"), "wb").write(good[: len(good) * 2 // 3])
    open(p("header_only"), "wb").write(good[:20])
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x55  # inside IDAT: the chunk's CRC no longer matches
    open(p("corrupt"), "wb").write(bytes(bad))
    # a 100000 x 100000 header over a tiny IDAT: refused before any pixel memory
    hdr = struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
    open(p("huge"), "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", hdr) +
                                chunk(b"IDAT", zlib.compress(b"\0" * 100)) + chunk(b"IEND", b""))
    # a chunk that claims 2 GB
    open(p("bigchunk"), "wb").write(good[:33] + struct.pack(">I", 0x7FFFFFF0) + b"tEXt" + b"x" * 64)
    # a zero width
    hdr = struct.pack(">IIBBBBB", 0, 10, 8, 2, 0, 0, 0)
    open(p("zero_width"), "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", hdr) + chunk(b"IEND", b""))
    # a decompression bomb: a small IDAT that inflates far past the image
    hdr = struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0)
    open(p("bomb"), "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", hdr) +
                                chunk(b"IDAT", zlib.compress(b"\0" * (64 << 20), 9)) + chunk(b"IEND", b""))


def webp(a):
    rng = np.random.default_rng(11)
    n = a.size
    d = os.path.join(a.dir, "webp")
    os.makedirs(d, exist_ok=True)
    p = lambda name: os.path.join(d, name + ".webp")
    for q in (30, 90):
        rgba = samples(rng, n, 4, 8)
        Image.fromarray(rgba[..., :3], "RGB").save(p("lossy_rgb_q%d" % q), quality=q)
        Image.fromarray(rgba, "RGBA").save(p("lossy_rgba_q%d" % q), quality=q)
        Image.fromarray(rgba[..., 0], "L").save(p("lossy_grey_q%d" % q), quality=q)
    rgba = samples(rng, n, 4, 8)
    rgba[: n // 3, :, 3] = 0  # fully transparent rows: the colour under them is kept (exact)
    Image.fromarray(rgba[..., :3], "RGB").save(p("lossless_rgb"), lossless=True)
    Image.fromarray(rgba, "RGBA").save(p("lossless_rgba"), lossless=True, exact=True)
    Image.fromarray(rgba, "RGBA").save(p("lossless_rgba_inexact"), lossless=True)
    Image.fromarray(rgba[..., 0], "L").save(p("lossless_grey"), lossless=True)
    Image.fromarray(rgba, "RGBA").save(p("lossy_rgba_alpha_lossless"), quality=70, alpha_quality=100)


def webpbroken(a):
    rng = np.random.default_rng(5)
    d = os.path.join(a.dir, "odd")
    os.makedirs(d, exist_ok=True)
    p = lambda name: os.path.join(d, name + ".webp")
    Image.fromarray(samples(rng, 40, 3, 8), "RGB").save(p("good"), quality=80)
    good = open(p("good"), "rb").read()
    open(p("truncated"), "wb").write(good[: len(good) * 2 // 3])
    open(p("header_only"), "wb").write(good[:16])
    # a VP8 key frame without its start code (lossy data damaged further on decodes to
    # other pixels, in libwebp as in PIL: lossy WebP has no checksum)
    bad = bytearray(good)
    assert bad[12:16] == b"VP8 " and bad[23:26] == b"\x9d\x01\x2a"
    bad[23:26] = b"\x00\x00\x00"
    open(p("corrupt"), "wb").write(bytes(bad))
    # a lossless header claiming 16384 x 16384 (268 Mpixel) over a few bytes of data
    buf = io.BytesIO()
    Image.fromarray(samples(rng, 8, 3, 8), "RGB").save(buf, "WEBP", lossless=True)
    ll = bytearray(buf.getvalue())
    assert ll[12:16] == b"VP8L" and ll[20] == 0x2F
    ll[21] = ll[22] = ll[23] = 0xFF
    ll[24] |= 0x0F
    open(p("huge"), "wb").write(bytes(ll))
    # an animation of two frames
    frames = [Image.fromarray(samples(rng, 16, 3, 8), "RGB") for _ in range(2)]
    frames[0].save(p("animated"), save_all=True, append_images=frames[1:], duration=100)


def pnm(a):
    rng = np.random.default_rng(13)
    n = a.size
    d = os.path.join(a.dir, "pnm")
    os.makedirs(d, exist_ok=True)
    for magic, ch, ext in ((b"P5", 1, "pgm"), (b"P6", 3, "ppm")):
        for depth in (8, 16):
            px = samples(rng, n, ch, depth)
            hdr = magic + b"\n# a comment\n%d %d\n%d\n" % (n, n, (1 << depth) - 1)
            with open(os.path.join(d, "%s%d.%s" % (ext, depth, ext)), "wb") as f:
                f.write(hdr + px.astype(">u2" if depth == 16 else np.uint8).tobytes())
            # tabs, comments between the numbers, a CR for the last whitespace
            hdr = magic + b" %d\t%d # size\n %d\r" % (n, n, (1 << depth) - 1)
            with open(os.path.join(d, "%s%d_spaced.%s" % (ext, depth, ext)), "wb") as f:
                f.write(hdr + samples(rng, n, ch, depth).astype(">u2" if depth == 16 else np.uint8).tobytes())
    Image.fromarray(samples(rng, n, 3, 8), "RGB").save(os.path.join(d, "pil.ppm"))
    Image.fromarray(samples(rng, n, 1, 8)[..., 0], "L").save(os.path.join(d, "pil.pgm"))


def pnmbroken(a):
    rng = np.random.default_rng(17)
    d = os.path.join(a.dir, "odd")
    os.makedirs(d, exist_ok=True)
    p = lambda name: os.path.join(d, name)
    good = b"P6\n40 40\n255\n" + samples(rng, 40, 3, 8).tobytes()
    open(p("good.ppm"), "wb").write(good)
    open(p("truncated.ppm"), "wb").write(good[: len(good) // 2])
    open(p("plain.ppm"), "wb").write(b"P3\n1 1\n255\n1 2 3\n")
    open(p("maxval1000.pgm"), "wb").write(b"P5\n2 2\n1000\n" + b"\0\1" * 4)
    open(p("huge.pgm"), "wb").write(b"P5\n100000 100000\n255\n" + b"\0" * 64)
    open(p("badsize.pgm"), "wb").write(b"P5\n-3 2\n255\n" + b"\0" * 64)


def write_bmp(path, px, bits, hsize=40, topdown=False, comp=0, masks=None, pal=None, offset=None):
    """px: (h, w, bytes per pixel) already in file order (BGR...), or (h, w) indices."""
    h, w = px.shape[:2]
    stride = ((w * bits + 31) >> 3) & ~3
    rows = []
    for y in range(h):
        r = px[y]
        if bits >= 8:
            b = r.astype(np.uint8).tobytes()
        else:
            per = 8 // bits
            v = np.concatenate([r.astype(np.uint8), np.zeros((-w) % per, np.uint8)]).reshape(-1, per)
            b = np.bitwise_or.reduce(v << np.array([8 - bits * (i + 1) for i in range(per)], np.uint8), 1)
            b = b.astype(np.uint8).tobytes()
        rows.append(b + b"\0" * (stride - len(b)))
    if not topdown:
        rows = rows[::-1]
    if hsize == 12:
        dib = struct.pack("<IHHHH", 12, w, h, 1, bits)
    else:
        dib = struct.pack("<IiiHHIIiiII", hsize, w, -h if topdown else h, 1, bits, comp, stride * h, 2835, 2835,
                          0 if pal is None else len(pal), 0)
        if hsize > 40:
            ext = b"" if masks is None else struct.pack("<4I", *masks)
            dib += (ext + b"\0" * hsize)[: hsize - 40]
        elif masks is not None:
            dib += struct.pack("<3I", *masks[:3])
    palb = b"" if pal is None else b"".join(bytes([c[2], c[1], c[0]] + ([] if hsize == 12 else [0])) for c in pal)
    off = 14 + len(dib) + len(palb) if offset is None else offset
    data = b"".join(rows)
    with open(path, "wb") as f:
        f.write(b"BM" + struct.pack("<IHHI", 14 + len(dib) + len(palb) + len(data), 0, 0, off) + dib + palb + data)


def bmp(a):
    rng = np.random.default_rng(19)
    n = a.size
    d = os.path.join(a.dir, "bmp")
    os.makedirs(d, exist_ok=True)
    p = lambda name: os.path.join(d, name + ".bmp")
    for bits in (1, 4, 8):
        k = 1 << bits
        pal = [tuple(int(v) for v in c) for c in rng.integers(0, 256, (k, 3))]
        idx = rng.integers(0, k, (n, n))
        write_bmp(p("pal%d" % bits), idx, bits, pal=pal)
        write_bmp(p("pal%d_topdown" % bits), idx, bits, pal=pal, topdown=True)
        write_bmp(p("pal%d_os2" % bits), idx, bits, hsize=12, pal=pal)
    pal = [tuple(int(v) for v in c) for c in rng.integers(0, 256, (100, 3))]
    write_bmp(p("pal8_100colours"), rng.integers(0, 100, (n, n)), 8, pal=pal)
    write_bmp(p("pal8_offset_at_palette"), rng.integers(0, 100, (n, n)), 8, pal=pal, offset=54)
    bgr = samples(rng, n, 4, 8)
    write_bmp(p("bgr24"), bgr[..., :3], 24)
    write_bmp(p("bgr24_topdown"), bgr[..., :3], 24, topdown=True)
    write_bmp(p("bgr24_os2"), bgr[..., :3], 24, hsize=12)
    write_bmp(p("bgrx32"), bgr, 32)
    write_bmp(p("bgra32_v5"), bgr, 32, hsize=124, comp=3, masks=(0xFF0000, 0xFF00, 0xFF, 0xFF000000))
    write_bmp(p("rgba32_v4"), bgr, 32, hsize=108, comp=3, masks=(0xFF, 0xFF00, 0xFF0000, 0xFF000000))
    write_bmp(p("xbgr32_bitfields"), bgr, 32, comp=3, masks=(0xFF000000, 0xFF0000, 0xFF00, 0))
    write_bmp(p("bgr24_bitfields"), bgr[..., :3], 24, comp=3, masks=(0xFF0000, 0xFF00, 0xFF, 0))
    rgba = samples(rng, n, 4, 8)
    Image.fromarray(rgba[..., :3], "RGB").save(p("pil_rgb"))
    Image.fromarray(rgba, "RGBA").save(p("pil_rgba"))
    Image.fromarray(rgba[..., 0], "L").save(p("pil_l"))
    Image.fromarray(rgba[..., :3], "RGB").quantize(50).save(p("pil_p"))
    Image.fromarray(rgba[..., 0] > 128).save(p("pil_1"))


def bmpbroken(a):
    rng = np.random.default_rng(23)
    d = os.path.join(a.dir, "odd")
    os.makedirs(d, exist_ok=True)
    p = lambda name: os.path.join(d, name + ".bmp")
    write_bmp(p("good"), samples(rng, 40, 3, 8), 24)
    good = open(p("good"), "rb").read()
    open(p("truncated"), "wb").write(good[: len(good) // 2])
    open(p("header_only"), "wb").write(good[:30])
    # RLE8 in the header (the data is not RLE: rn refuses by the header alone)
    write_bmp(p("rle8"), rng.integers(0, 4, (16, 16)), 8, comp=1, pal=[(i, i, i) for i in range(4)])
    write_bmp(p("bits16"), rng.integers(0, 256, (8, 8, 2)), 16)
    b = bytearray(good)
    b[18:26] = struct.pack("<ii", 100000, 100000)
    open(p("huge"), "wb").write(bytes(b))
    b = bytearray(good)
    b[14:18] = struct.pack("<I", 99)
    open(p("bad_header_size"), "wb").write(bytes(b))


def ref(a):
    out = []
    for c in sorted(e.name for e in os.scandir(a.dir) if e.is_dir()):
        for root, dirs, files in sorted(os.walk(os.path.join(a.dir, c), followlinks=True)):
            for f in sorted(files):
                im = Image.open(os.path.join(root, f))
                out.append(np.asarray(im.convert("L" if a.gray else "RGB")).tobytes())
    with open(a.out, "wb") as f:
        f.write(b"".join(out))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("png")
    s.add_argument("dir")
    s.add_argument("--size", type=int, default=29)
    s.set_defaults(fn=png)
    s = sub.add_parser("pngbroken")
    s.add_argument("dir")
    s.set_defaults(fn=pngbroken)
    s = sub.add_parser("webp")
    s.add_argument("dir")
    s.add_argument("--size", type=int, default=29)
    s.set_defaults(fn=webp)
    s = sub.add_parser("webpbroken")
    s.add_argument("dir")
    s.set_defaults(fn=webpbroken)
    s = sub.add_parser("pnm")
    s.add_argument("dir")
    s.add_argument("--size", type=int, default=29)
    s.set_defaults(fn=pnm)
    s = sub.add_parser("pnmbroken")
    s.add_argument("dir")
    s.set_defaults(fn=pnmbroken)
    s = sub.add_parser("bmp")
    s.add_argument("dir")
    s.add_argument("--size", type=int, default=29)
    s.set_defaults(fn=bmp)
    s = sub.add_parser("bmpbroken")
    s.add_argument("dir")
    s.set_defaults(fn=bmpbroken)
    s = sub.add_parser("ref")
    s.add_argument("dir")
    s.add_argument("out")
    s.add_argument("--gray", action="store_true")
    s.set_defaults(fn=ref)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
