#!/usr/bin/env bash
# make demo: the main job on an embedded default. Creates a ResNet-50 with torchvision's
# initialisation, shows what is inside, exports it for PyTorch and, where torchvision is
# installed, loads it there with strict=True.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/bin
OUT=${DEMO_DIR:-$BUILD/demo}
PYTHON=${PYTHON:-/usr/bin/python3}
mkdir -p "$OUT"

echo "== rn-init: resnet50, 1000 classes, seed 0"
"$BIN/rn-init" --arch resnet50 --classes 1000 --seed 0 -o "$OUT/init.pb"
echo "== rn-info"
"$BIN/rn-info" "$OUT/init.pb"
echo "== rn-export: torchvision-named safetensors"
"$BIN/rn-export" "$OUT/init.pb" "$OUT/init.safetensors"
ls -l "$OUT/init.pb" "$OUT/init.safetensors"
if "$PYTHON" -c 'import torch, torchvision' 2>/dev/null; then
    echo "== torchvision.models.resnet50().load_state_dict(..., strict=True)"
    (cd tests/parity && "$PYTHON" strict_load.py "../../$OUT/init.safetensors" resnet50 1000)
else
    echo "(torchvision not importable with $PYTHON: skipping the strict load)"
fi
