#!/usr/bin/python3
"""Save torchvision ResNet weights as safetensors, a file rn-init --from reads.

rn-init --from also reads a torch.save'd .pth itself (the finetune example hands it PTH
directly); this script is for torchvision's weights by name, a random model, or a
state_dict to check against torchvision (strict=True) before it is imported.

usage:
  save_torchvision.py --arch resnet50 --pth resnet50-11ad3fa6.pth OUT.safetensors
  save_torchvision.py --arch resnet50 --weights IMAGENET1K_V2 OUT.safetensors
  save_torchvision.py --arch resnet18 --random --seed 0 OUT.safetensors

--pth       a state_dict saved with torch.save, e.g. the files torchvision keeps in
            ~/.cache/torch/hub/checkpoints/
--weights   a torchvision weights name (IMAGENET1K_V1, IMAGENET1K_V2, DEFAULT): torchvision
            loads it from its cache, or downloads it if it may (rn itself never does)
--random    a randomly initialised model (torchvision's initialisation, torch.manual_seed);
            for trying the fine-tuning path without pretrained weights

Needs torch and torchvision (Debian: python3-torch python3-torchvision), not the
safetensors package: the format (8-byte header length, JSON header, raw little-endian
data) is written here. The model is loaded into torchvision with strict=True first, so a
file that is written is one torchvision accepts.
"""
import argparse
import json
import os
import struct
import sys

import torch
import torchvision

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}


def save(path, state, meta):
    header, blobs, off = {"__metadata__": meta}, [], 0
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in DTYPES:
            sys.exit(f"save_torchvision.py: {name}: dtype {t.dtype} is not one rn reads")
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="resnet50", choices=["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--pth", help="a torchvision state_dict saved with torch.save")
    src.add_argument("--weights", help="a torchvision weights name, e.g. IMAGENET1K_V2")
    src.add_argument("--random", action="store_true", help="random initialisation (no pretrained weights)")
    p.add_argument("--seed", type=int, default=0, help="with --random: torch.manual_seed (default 0)")
    p.add_argument("out", help="the .safetensors file to write")
    a = p.parse_args()

    ctor = getattr(torchvision.models, a.arch)
    if a.weights:
        model = ctor(weights=a.weights)
    else:
        torch.manual_seed(a.seed)
        model = ctor()
        if a.pth:
            state = torch.load(a.pth, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state) if isinstance(state, dict) else state
            if "fc.weight" in state and state["fc.weight"].shape[0] != 1000:
                model = ctor(num_classes=state["fc.weight"].shape[0])
            model.load_state_dict(state, strict=True)
    state = model.state_dict()
    meta = {"arch": a.arch, "num_classes": str(model.fc.out_features),
            "source": a.pth or (f"torchvision {a.weights}" if a.weights else f"random, seed {a.seed}")}
    save(a.out, state, meta)
    n = sum(t.numel() for k, t in state.items() if "running" not in k and "num_batches" not in k)
    print(f"{a.out}: {a.arch}, {len(state)} tensors, {n} parameters, {model.fc.out_features} classes ({meta['source']})")


if __name__ == "__main__":
    main()
