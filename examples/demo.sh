#!/usr/bin/env bash
# make demo: the main job on an embedded default. Fashion-MNIST (Debian's
# dataset-fashion-mnist, installed by make deps): 6,000 training and 1,000 test images
# as 32x32 JPEG folders -> rn-prep -> rn-init resnet18 -> rn-train, one checkpoint per
# epoch -> rn-eval, on whatever device is present. A few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${DEMO_DIR:-$PWD/$BUILD/demo}
EPOCHS=${EPOCHS:-3}
start=$(date +%s)
make --no-print-directory -C examples/fashion-mnist RN_BIN="$PWD/$BUILD/bin" OUT="$OUT" \
    TRAIN_N=6000 TEST_N=1000 EPOCHS="$EPOCHS" LR=0.05 ARCH=resnet18
echo
echo "== the last checkpoint"
"$BUILD/bin/rn-info" "$OUT/epoch-$(printf %03d "$EPOCHS").pb" | sed -n '1,4p;/^history/,$p'
echo
echo "demo: resnet18, $EPOCHS epochs on 6,000 Fashion-MNIST images, $(($(date +%s) - start)) s:" \
    "$(cat "$OUT/result.txt") (outputs in $OUT)"
