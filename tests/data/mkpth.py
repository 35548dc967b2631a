#!/usr/bin/python3
"""The .pth files tests/pth.bats reads, made by torch.save, each with the safetensors file
of the same weights (contiguous, through tests/parity/rnst.py) where one applies:

  mkpth.py good DIR      r18, r50 (fp32), r18h, r50h (.half()), r18b (.bfloat16()),
                         r18p4 (pickle protocol 4),
                         strided (non-contiguous views, shared storages, nn.Parameter):
                         NAME.pth and NAME.safetensors; torchvision models, seed 0, 10 classes
                         for resnet18 and 1000 for resnet50
  mkpth.py hostile DIR   evil.pth (os.system through REDUCE), model.pth (torch.save(model)),
                         legacy.pth (the pre-1.6 format), deflated.pth (compressed entries),
                         f64.pth (a float64 tensor), trunc.pth (r18 cut short), huge.pth (a
                         tensor whose sizes overflow), memo.pth (a memo index never set)
"""
import io
import os
import pickle
import sys
import zipfile

import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import rnst  # noqa: E402


def both(d, name, sd, **kw):
    torch.save(sd, f"{d}/{name}.pth", **kw)
    rnst.save(f"{d}/{name}.safetensors", {k: v.detach().contiguous() for k, v in sd.items()})


def cast(sd, dt):
    return {k: (v.to(dt) if v.is_floating_point() else v) for k, v in sd.items()}


def good(d):
    torch.manual_seed(0)
    r18 = torchvision.models.resnet18(num_classes=10).state_dict()
    for k, v in r18.items():  # BN stats that are not 0 and 1, so a mix-up shows
        if "running" in k:
            v.uniform_(0.5, 1.5)
    r50 = torchvision.models.resnet50().state_dict()
    both(d, "r18", r18)
    both(d, "r50", r50)
    both(d, "r18h", cast(r18, torch.float16))
    both(d, "r50h", cast(r50, torch.float16))
    both(d, "r18b", cast(r18, torch.bfloat16))
    both(d, "r18p4", r18, pickle_protocol=4)
    s = dict(r18)
    # a transposed view, a permuted one, a slice with a storage offset and a step
    s["fc.weight"] = r18["fc.weight"].t().contiguous().t()
    w = r18["layer1.0.conv1.weight"]
    s["layer1.0.conv1.weight"] = w.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    big = torch.stack([r18["layer2.0.conv2.weight"], torch.zeros_like(r18["layer2.0.conv2.weight"])], dim=1)
    s["layer2.0.conv2.weight"] = big[:, 0]
    # two tensors viewing one storage, one at an offset
    both_stats = torch.cat([r18["bn1.running_mean"], r18["bn1.running_var"]])
    s["bn1.running_mean"], s["bn1.running_var"] = both_stats[:64], both_stats[64:]
    # nn.Parameter values (torch._utils._rebuild_parameter)
    s["conv1.weight"] = torch.nn.Parameter(r18["conv1.weight"].clone())
    assert not s["fc.weight"].is_contiguous() and not s["layer2.0.conv2.weight"].is_contiguous()
    torch.save(s, f"{d}/strided.pth")
    rnst.save(f"{d}/strided.safetensors", {k: v.detach().contiguous() for k, v in s.items()})


class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def zip_pickle(path, pkl, extra=None):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
        for k, v in (extra or {}).items():
            z.writestr("archive/" + k, v)


def hostile(d):
    zip_pickle(f"{d}/evil.pth", pickle.dumps({"conv1.weight": Evil()}, protocol=2))
    torch.save(torchvision.models.resnet18(), f"{d}/model.pth")
    sd = torchvision.models.resnet18().state_dict()
    torch.save(sd, f"{d}/legacy.pth", _use_new_zipfile_serialization=False)
    torch.save(sd, f"{d}/r18.pth")
    with zipfile.ZipFile(f"{d}/r18.pth") as src, zipfile.ZipFile(f"{d}/deflated.pth", "w", zipfile.ZIP_DEFLATED) as z:
        for i in src.infolist():
            z.writestr(i.filename, src.read(i.filename))
    torch.save({"a": torch.zeros(3, dtype=torch.float64)}, f"{d}/f64.pth")
    b = open(f"{d}/r18.pth", "rb").read()
    open(f"{d}/trunc.pth", "wb").write(b[: len(b) // 2])
    # a tensor over storage '0' of 4 floats whose sizes multiply past 2^63
    pkl = (b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00\x00storage"
           b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00(\x8a\x08\x00\x00\x00\x00\x00\x00"
           b"\x00\x40\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40t(K\x01K\x01t\x89}tRs.")
    zip_pickle(f"{d}/huge.pth", pkl, {"data/0": b"\0" * 16})
    zip_pickle(f"{d}/memo.pth", b"\x80\x02}q\x00X\x01\x00\x00\x00ah\x07s.")
    os.remove(f"{d}/r18.pth")


if __name__ == "__main__":
    os.makedirs(sys.argv[2], exist_ok=True)
    {"good": good, "hostile": hostile}[sys.argv[1]](sys.argv[2])
