"""A tiny learnable dataset: two classes of 40x40 JPEGs, horizontal vs vertical
stripes over noise, in ImageFolder layout.
usage: toy.py OUT_DIR PER_CLASS SEED"""
import os
import sys

import numpy as np
from PIL import Image

out, per_class, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
for cls in ("horiz", "vert"):
    d = os.path.join(out, cls)
    os.makedirs(d, exist_ok=True)
    for i in range(per_class):
        img = rng.integers(0, 60, (40, 40, 3)).astype(np.uint8)
        period = int(rng.integers(4, 8))
        for k in range(int(rng.integers(0, period)), 40, period):
            if cls == "horiz":
                img[k:k + 2, :, :] += 150
            else:
                img[:, k:k + 2, :] += 150
        Image.fromarray(img).save(os.path.join(d, f"{i:03d}.jpg"), quality=95)
