#!/usr/bin/env bash
# make gpu-check on a lent GPU machine (CUDA toolkit and PyTorch, none of rn's other build
# dependencies, no network), as one command of the device tool:
#     tests/gpu/device-deps.sh                       # here, once: fills .gpudeps/
#     run(command="tests/gpu/device-run.sh", carry=[".gpudeps"], timeout_s=570)
# It unpacks .gpudeps/*.deb under /tmp/rn-deps (never over /), finds cuDNN and cuBLAS (in
# the CUDA toolkit, else in PyTorch's nvidia-* wheels), points the compiler, linker and
# loader at them, then runs tests/gpu/gpu-check.sh with a fresh build in build-device/,
# then `make bench-gpu` on that build (tests/bench/gpu.sh; BENCH_GPU=0 leaves it out), with
# what is left of DEVICE_RUN_SECONDS (default 540: the whole call under the tool's 10
# minutes; under 120 s left it is not started, and says so).
# Results: $GPU_CHECK_OUT (default $OUT/gpu-check, the folder the device tool brings back):
# gpu-check.log, results.md, build.log, ops.txt, train-compare.txt, dist.txt; $OUT/bench-gpu.log (the
# benchmark's lines and notes) and $OUT/bench-gpu/ (its raw outputs, a few KB).
# Exit status: gpu-check's when it failed, else bench-gpu's.
set -u
cd "$(dirname "$0")/../.." || exit 1
M=x86_64-linux-gnu
ROOT=/tmp/rn-deps
CUDA=${CUDA:-/usr/local/cuda}
PY=${PYTHON:-python3}
say() { echo "device-run: $*"; }

mkdir -p "$ROOT"
for f in .gpudeps/*.deb; do
    [ -e "$f" ] || { say "no .gpudeps/*.deb: run tests/gpu/device-deps.sh here first and carry .gpudeps"; break; }
    case $f in
        # the machine's own runtime libraries of these are newer: keep them
        */libgfortran5_*) ldconfig -p 2>/dev/null | grep -q 'libgfortran\.so\.5 ' && continue ;;
        */libquadmath0_*) ldconfig -p 2>/dev/null | grep -q 'libquadmath\.so\.0 ' && continue ;;
    esac
    if command -v dpkg >/dev/null; then
        dpkg -x "$f" "$ROOT" || exit 1
    else
        data=$(ar t "$f" | grep '^data.tar')
        ar p "$f" "$data" | tar -x -C "$ROOT" -f - || exit 1
    fi
done
export PATH="$PATH:$ROOT/usr/bin"
# bats from .gpudeps finds its own files from where it lies; its libraries it is told of
export BATS_LIB_PATH="${BATS_LIB_PATH:-/usr/lib/bats}:$ROOT/usr/lib/bats"
export CPATH="$ROOT/usr/include:$ROOT/usr/include/$M:$ROOT/usr/include/$M/openblas-pthread${CPATH:+:$CPATH}"
libdirs="$ROOT/usr/lib/$M:$ROOT/usr/lib/$M/openblas-pthread"

# cuDNN, cuBLAS, cudart: headers and libraries, wherever this machine keeps them
NV=$("$PY" -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null)
find_one() { local n=$1 d; shift; for d in "$@"; do [ -d "$d" ] && find -L "$d" -name "$n" -print 2>/dev/null | sort | head -n 1; done | head -n 1; }
LINK=/tmp/rn-devlib
mkdir -p "$LINK"
for pair in cudnn.h:libcudnn.so cublas_v2.h:libcublas.so cublasLt.h:libcublasLt.so cuda_runtime.h:libcudart.so; do
    h=${pair%%:*} l=${pair#*:}
    hf=$(find_one "$h" "$CUDA/include" /usr/include $NV "$PWD/.gpudeps/cudnn-include")
    lf=$(find_one "$l" "$CUDA/lib64" "/usr/lib/$M" $NV)
    [ -n "$lf" ] || lf=$(find_one "$l.*" "$CUDA/lib64" "/usr/lib/$M" $NV)
    if [ -z "$hf" ] || [ -z "$lf" ]; then
        say "cannot find $h and $l under $CUDA, /usr or python's nvidia packages ($NV)"
        exit 1
    fi
    say "$h: $hf; $l: $lf"
    CPATH="$(dirname "$hf"):$CPATH"
    libdirs="$(dirname "$lf"):$libdirs"
    ln -sf "$lf" "$LINK/$l"
done
export CPATH
export LIBRARY_PATH="$LINK:$libdirs${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v make >/dev/null || { say "no make on PATH"; exit 1; }
command -v nvcc >/dev/null || [ -x "$CUDA/bin/nvcc" ] || { say "no nvcc under $CUDA/bin"; exit 1; }

export GPU_CHECK_OUT=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}/gpu-check}
export GPU_CHECK_WORK=${GPU_CHECK_WORK:-/tmp/rn-gpu-check-work}
export BUILD=${BUILD:-build-device}
export GPU_CHECK_MAKE_ARGS="USE_CUDA=1 CUDA=$CUDA ${GPU_CHECK_MAKE_ARGS:-}"
export PYTHON=$PY
t0=$(date +%s)
tests/gpu/gpu-check.sh
rc=$?
[ "${BENCH_GPU:-1}" = 0 ] && exit $rc
left=$((${DEVICE_RUN_SECONDS:-540} - ($(date +%s) - t0)))
out=${OUT:-gpu-check-out}
mkdir -p "$out/bench-gpu"
if [ $left -lt 120 ]; then
    say "bench-gpu: not run: only $left s of DEVICE_RUN_SECONDS left after gpu-check" | tee "$out/bench-gpu.log"
    exit $rc
fi
say "bench-gpu, at most $left s (log: $out/bench-gpu.log)"
export BENCH_GPU_DIR=${BENCH_GPU_DIR:-/tmp/rn-bench-gpu}
timeout "$left" make --no-print-directory BUILD="$BUILD" $GPU_CHECK_MAKE_ARGS bench-gpu 2>&1 |
    grep -v -e '^cc ' -e '^ar ' -e 'nvcc' | tee "$out/bench-gpu.log"
brc=${PIPESTATUS[0]}
[ $brc = 124 ] && say "bench-gpu: stopped after $left s" | tee -a "$out/bench-gpu.log"
cp "$BENCH_GPU_DIR"/run/*.txt "$BENCH_GPU_DIR"/run/*.err "$BENCH_GPU_DIR"/run/*.jsonl "$out/bench-gpu/" 2>/dev/null
[ $rc != 0 ] && exit $rc
exit $brc
