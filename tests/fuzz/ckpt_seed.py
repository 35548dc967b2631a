#!/usr/bin/python3
"""A small fuzz seed from an rn checkpoint: the same messages, each tensor's data cut to
at most KEEP bytes except the first FULL tensors (so the reader's checks of the model
spec, names, shapes and the first checksums all run on real structure).

  ckpt_seed.py IN.pb OUT.pb [KEEP [FULL]]
"""
import sys


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def enc(v):
    out = bytearray()
    while True:
        c = v & 0x7F
        v >>= 7
        out.append(c | (0x80 if v else 0))
        if not v:
            return bytes(out)


def fields(b):
    """(field number, wire type, raw bytes of the field including its key)"""
    i = 0
    while i < len(b):
        start = i
        key, i = varint(b, i)
        wt = key & 7
        if wt == 0:
            _, i = varint(b, i)
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        elif wt == 2:
            n, i = varint(b, i)
            i += n
        else:
            raise SystemExit("unexpected wire type %d" % wt)
        yield key >> 3, wt, b[start:i]


def payload(raw):
    _, i = varint(raw, 0)
    _, i = varint(raw, i)
    return raw[i:]


def cut_tensor(t, keep):
    out = bytearray()
    for f, wt, raw in fields(t):
        if f == 4 and wt == 2:
            d = payload(raw)[:keep]
            raw = enc(4 << 3 | 2) + enc(len(d)) + d
        out += raw
    return bytes(out)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    keep = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    full = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    b = open(src, "rb").read()
    out, seen = bytearray(), 0
    for f, wt, raw in fields(b):
        if f in (3, 4) and wt == 2:  # params, buffers
            t = payload(raw)
            seen += 1
            if seen > full:
                t = cut_tensor(t, keep)
            raw = enc(f << 3 | 2) + enc(len(t)) + t
        out += raw
    open(dst, "wb").write(out)


main()
