#!/usr/bin/env bash
# Run HERE (a Debian machine with apt), before tests/gpu/device-run.sh on a GPU machine
# that has the CUDA toolkit and PyTorch but not rn's other build dependencies and no
# network: downloads the Debian packages rn needs to build and run (protobuf-c, LMDB,
# TurboJPEG, libjpeg-turbo, OpenBLAS and their libraries, make) and bats with
# bats-support and bats-assert (gpu-check runs tests/amp.bats) into .gpudeps/ (about
# 16 MB), which git ignores (.git/info/exclude) and the device call carries, with this
# machine's cuDNN headers (for a GPU machine whose cuDNN came without them). Quick when
# they are there.
set -eu
cd "$(dirname "$0")/../.."
PKGS="protobuf-c-compiler libprotobuf32 libprotoc32 libprotobuf-c-dev libprotobuf-c1 libturbojpeg0-dev
      libturbojpeg0 libjpeg62-turbo-dev libjpeg62-turbo liblmdb-dev liblmdb0 libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread
      libopenblas0 libgfortran5 libquadmath0 make bats bats-support bats-assert"
mkdir -p .gpudeps
grep -qx '/.gpudeps/' .git/info/exclude 2>/dev/null || echo '/.gpudeps/' >>.git/info/exclude
cd .gpudeps
missing=
for p in $PKGS; do ls "${p}"_*.deb >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    echo "device-deps: downloading$missing"
    apt-get download $missing
fi
# cuDNN's headers, in case the GPU machine has its libraries (PyTorch's wheel) only
CUDA=${CUDA:-/usr/local/cuda}
if ls "$CUDA"/include/cudnn*.h >/dev/null 2>&1; then
    mkdir -p cudnn-include
    cp -u "$CUDA"/include/cudnn*.h cudnn-include/
fi
echo "device-deps: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in .gpudeps/"
