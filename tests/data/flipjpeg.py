#!/usr/bin/env python3
"""Flip one bit inside the entropy-coded data of JPEGs stored in an LMDB data file
(libjpeg alone would decode most such images without a word; rn's records carry a
CRC32C that catches it). Every copy in the file, as LMDB's free pages hold stale ones.

    flipjpeg.py DATA.mdb [KEY]    KEY: only the JPEG of that record (e.g. 00000040):
                                  a leaf node holds the key, then within a few bytes
                                  the Sample with its JPEG
Prints the number of JPEGs changed; exits 1 when none was.
"""
import sys

path, key = sys.argv[1], (sys.argv[2].encode() if len(sys.argv) > 2 else None)
b = bytearray(open(path, "rb").read())
i = n = 0
while True:
    if key:
        k = b.find(key, i)
        if k < 0:
            break
        i = k + len(key)
        soi = b.find(b"\xff\xd8\xff", k)
        if not 0 <= soi - k < 64:
            continue
    else:
        soi = b.find(b"\xff\xd8\xff", i)
        if soi < 0:
            break
    sos = b.find(b"\xff\xda", soi)
    b[sos + 40] ^= 0x10
    i, n = max(i, sos + 41), n + 1
open(path, "wb").write(bytes(b))
print(n)
sys.exit(0 if n else 1)
