#!/bin/bash
# The whole pipeline on aarch64 against x86-64: rn-prep, rn-init, rn-train (one epoch of
# resnet18, --accum 2, the default augmentation) and rn-eval, once with this machine's
# build and once with an aarch64 build run under qemu-aarch64; the records, the weights
# and the logits must be the same bytes. `make check-aarch64` runs it. Minutes: the
# aarch64 side is emulated (about 50 s for the epoch on a 2-core VM).
#
# Needs, besides the build's own packages: the cross compiler and qemu (make deps installs
# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user) and the arm64 versions of the
# libraries rn links, which Debian installs beside the native ones:
#   dpkg --add-architecture arm64 && apt-get update
#   apt-get install libopenblas-dev:arm64 liblmdb-dev:arm64 libturbojpeg0-dev:arm64 \
#     libjpeg62-turbo-dev:arm64 libprotobuf-c-dev:arm64
# Without them it says what is missing and exits 77 (skipped).
#
#   tests/xarch/whole-run.sh [WORKDIR]     (env: BUILD, the native build folder: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
A64=build-aarch64
PYTHON=${PYTHON:-/usr/bin/python3}
WORK=${1:-$(mktemp -d /tmp/rn-xarch.XXXXXX)}
TOOLS="rn-prep rn-init rn-train rn-eval rn-info"

missing=()
command -v aarch64-linux-gnu-gcc > /dev/null || missing+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 > /dev/null || missing+=(qemu-user)
for p in libopenblas-dev liblmdb-dev libturbojpeg0-dev libjpeg62-turbo-dev libprotobuf-c-dev; do
    dpkg-query -W -f='${Status}\n' "$p:arm64" 2> /dev/null | grep -q '^install ok installed' || missing+=("$p:arm64")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "whole-run: skipped: missing ${missing[*]} (the header of $0 says how to install them)"
    exit 77
fi

echo "whole-run: building the tools for aarch64 in $A64/"
PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig make -s -j"$(nproc)" BUILD=$A64 CC=aarch64-linux-gnu-gcc \
    USE_CUDA=0 USE_MPI=0 USE_NCCL=0 USE_PNG=0 USE_WEBP=0 $(for t in $TOOLS; do echo $A64/bin/$t; done) > /dev/null
make -s -j"$(nproc)" BUILD="$BUILD" $(for t in $TOOLS; do echo "$BUILD/bin/$t"; done) > /dev/null

mkdir -p "$WORK"
cd "$WORK"
"$PYTHON" "$ROOT/tests/data/toy.py" src 32 1
# the same commands on each side: $1 names the side, the rest run the tool
side() {
    local tag=$1 bin=$ROOT/$BUILD/bin q=()
    if [ "$tag" = aarch64 ]; then bin=$ROOT/$A64/bin q=(qemu-aarch64); fi
    rm -rf "$tag" && mkdir "$tag"
    "${q[@]}" "$bin/rn-prep" -q src "$tag/train.lmdb" > /dev/null
    "${q[@]}" "$bin/rn-init" --arch resnet18 --classes 2 --seed 1 -o "$tag/init.pb" 2> /dev/null
    "${q[@]}" "$bin/rn-train" --data "$tag/train.lmdb" --in "$tag/init.pb" --out "$tag/e1.pb" --epochs 1 --batch 16 \
        --accum 2 --crop 32 --workers 2 --threads 2 2> "$tag/train.log"
    "${q[@]}" "$bin/rn-eval" --data "$tag/train.lmdb" --ckpt "$tag/e1.pb" --crop 32 --threads 2 \
        --dump-logits "$tag/logits.st" > "$tag/eval.txt"
    # what the tools wrote, as text: the records' bytes (mdb_dump's data, without the
    # __info__ record, which names the command that wrote them: a path of each side's
    # own), the dataset's description without that command and the writer's version
    # (each build's own), the tensors
    mdb_dump "$tag/train.lmdb" | sed '1,/^HEADER=END/d' | awk '$1 == "5f5f696e666f5f5f" { skip = 1; next }
        skip { skip = 0; next } { print }' | sha256sum | cut -c1-16 > "$tag/records.sha"
    "$ROOT/$BUILD/bin/rn-info" "$tag/train.lmdb" | grep -v -e "^command" -e "^rn version" -e "$tag/" > "$tag/dataset.txt"
    for f in init e1; do "$ROOT/$BUILD/bin/rn-info" --tensors "$tag/$f.pb" | sed -n '/^tensors:/,$p' > "$tag/$f.tensors"; done
    sha256sum < "$tag/logits.st" | cut -c1-16 > "$tag/logits.sha"
}
t0=$(date +%s)
side x86-64
t1=$(date +%s)
side aarch64
t2=$(date +%s)
echo "whole-run: x86-64 $((t1 - t0)) s; aarch64 (qemu) $((t2 - t1)) s"
grep -h "on cpu" x86-64/train.log aarch64/train.log | sed 's/^/whole-run:   /'
fail=0
check() { # name, file: the same bytes on both sides
    if cmp -s "x86-64/$2" "aarch64/$2"; then echo "whole-run: $1: same bytes ($(sha256sum < "x86-64/$2" | cut -c1-16))"
    else echo "whole-run: $1: DIFFER (diff $WORK/x86-64/$2 $WORK/aarch64/$2)"; fail=1; fi
}
check "rn-prep records" records.sha
check "rn-prep dataset description" dataset.txt
check "rn-init weights" init.tensors
check "rn-train weights after one epoch" e1.tensors
check "rn-eval logits" logits.sha
check "rn-eval report" eval.txt
[ $fail = 0 ] && echo "whole-run: aarch64 and x86-64 agree" && rm -rf "$WORK"
exit $fail
