#!/usr/bin/env bash
# The checks of a lent GPU machine (CUDA toolkit and PyTorch there, none of rn's other build
# dependencies, no network), in commands of the device tool that each end well inside its
# 10 minutes:
#     tests/gpu/device-deps.sh                       # here, once: fills .gpudeps/
#     run(command="tests/gpu/device-run.sh check", carry=[".gpudeps"], timeout_s=400)
#     run(command="tests/gpu/device-run.sh bench", carry=[".gpudeps"], timeout_s=340)
# PART check: a fresh build in build-device/, then make gpu-check (tests/gpu/gpu-check.sh).
#      bench: make bench-gpu on that build (tests/bench/gpu.sh; on a fresh machine the build
#             comes first): fp16, bf16, then fp32 synthetic rows, each precision's lines as it
#             finishes, the loader rows last. BENCH_GPU_LIMIT (default 120 s here) caps a run.
#      all (the default): check, then bench with what is left (not started under 120 s), as
#             one command: run(..., timeout_s=570).
# Each first says what the machine provides (the GPU and its driver, nvcc, cuDNN, cuBLAS,
# python3 with torch, torchvision, numpy, PIL, tensorboard) and what is done without what is
# missing, then runs for at most DEVICE_RUN_SECONDS (check 360, bench 300, all 540: with
# the machine's start, check and bench fit 15 minutes of device time): what still runs
# then is stopped (SIGTERM, SIGKILL 15 s later), saying so, and what finished is in its
# files (check: a STOPPED row in results.md; bench: a line in bench-gpu.log).
# It unpacks .gpudeps/*.deb under /tmp/rn-deps (never over /; DEVICE_RUN_TMP for /tmp), finds cuDNN and cuBLAS (in
# the CUDA toolkit, else in PyTorch's nvidia-* wheels) and points the compiler, linker and
# loader at them.
# Results: $GPU_CHECK_OUT (default $OUT/gpu-check, the folder the device tool brings back):
# gpu-check.log, results.md, build.log, ops.txt, train-compare.txt, dist.txt; $OUT/bench-gpu.log (the
# benchmark's lines and notes) and $OUT/bench-gpu/ (its raw outputs, a few KB).
# Exit status: gpu-check's when it failed (124: stopped at DEVICE_RUN_SECONDS), else bench-gpu's.
# DEVICE_RUN_DRY=1 runs it where there is no GPU, the CPU in the GPU's place (GPU_CHECK_DRY,
# BENCH_GPU_DRY): a check of this script. GPU_CHECK_BUILD=0 uses the build in BUILD as it is,
# for both parts (bench then runs tests/bench/gpu.sh itself, not make).
set -u
cd "$(dirname "$0")/../.." || exit 1
PART=${1:-all}
case $PART in
    check | bench | all) ;;
    *) echo "usage: tests/gpu/device-run.sh [check|bench|all]" >&2; exit 2 ;;
esac
M=x86_64-linux-gnu
TMPROOT=${DEVICE_RUN_TMP:-/tmp} # (the packages unpacked, the library links, the scratch)
ROOT=$TMPROOT/rn-deps
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
LINK=$TMPROOT/rn-devlib
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
    [ "$h" = cudnn.h ] && cudnn_dir=$(dirname "$hf")
    CPATH="$(dirname "$hf"):$CPATH"
    libdirs="$(dirname "$lf"):$libdirs"
    ln -sf "$lf" "$LINK/$l"
done
export CPATH
export LIBRARY_PATH="$LINK:$libdirs${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v make >/dev/null || { say "no make on PATH"; exit 1; }
command -v nvcc >/dev/null || [ -x "$CUDA/bin/nvcc" ] || { say "no nvcc under $CUDA/bin"; exit 1; }

# what the machine provides, and what the checks do without what it lacks
provides() {
    local nvcc v
    say "machine: $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
    if command -v nvidia-smi >/dev/null; then
        v=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | paste -sd ';')
        say "GPUs (nvidia-smi): ${v:-none listed}"
    else
        say "GPUs: no nvidia-smi here; rn-gpuinfo, after the build, says what CUDA sees"
    fi
    nvcc=$(command -v nvcc || echo "$CUDA/bin/nvcc")
    say "nvcc: $nvcc, $("$nvcc" --version 2>&1 | grep -o 'release [^,]*' || echo 'no version')"
    v=$(awk '/define CUDNN_MAJOR/ { a = $3 } /define CUDNN_MINOR/ { b = $3 } /define CUDNN_PATCHLEVEL/ { c = $3 }
             END { if (a != "") print a "." b "." c }' "${cudnn_dir:-/nonexistent}/cudnn_version.h" 2>/dev/null)
    say "cuDNN: ${v:-version unknown (no cudnn_version.h beside cudnn.h)}"
    v=$("$PY" - <<'PYEOF' 2>&1
import importlib, sys
out = ["python " + sys.version.split()[0]]
for m in ("torch", "torchvision", "numpy", "PIL", "tensorboard", "onnx", "onnxruntime"):
    try:
        out.append(m + " " + getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:
        out.append(m + " missing")
try:
    import torch
    out.append("torch sees %d GPU(s)" % torch.cuda.device_count())
except Exception:
    pass
print(", ".join(out))
PYEOF
)
    say "$PY: $v"
    case $v in
        *"torch missing"* | *"torchvision missing"*)
            say "without torch and torchvision: gpu-check compares rn's GPU and CPU curves at a fixed 1e-3 (not 10x torch's own CPU-GPU difference), and bench-gpu has no peer (peer=- ratio=-)" ;;
    esac
    case $v in *"numpy missing"* | *"PIL missing"*)
        say "without numpy and PIL: bench-gpu cannot make its JPEGs: no loader rows, no data-parallel rows" ;; esac
    case $v in *"tensorboard missing"*) say "without tensorboard: gpu-check's step 6 is skipped" ;; esac
}
provides

export GPU_CHECK_OUT=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}/gpu-check}
export GPU_CHECK_WORK=${GPU_CHECK_WORK:-$TMPROOT/rn-gpu-check-work}
export BUILD=${BUILD:-build-device}
export GPU_CHECK_MAKE_ARGS="USE_CUDA=1 CUDA=$CUDA ${GPU_CHECK_MAKE_ARGS:-}"
export PYTHON=$PY
if [ "${DEVICE_RUN_DRY:-0}" = 1 ]; then
    export GPU_CHECK_DRY=1 BENCH_GPU_DRY=1
    say "DRY RUN (DEVICE_RUN_DRY=1): the CPU in the GPU's place, a check of this script only"
fi
case $PART in check) budget=360 ;; bench) budget=300 ;; all) budget=540 ;; esac
budget=${DEVICE_RUN_SECONDS:-$budget}
t0=$(date +%s)
out=${OUT:-gpu-check-out}
rc=0
if [ $PART != bench ]; then
    say "gpu-check, at most $budget s (results: $GPU_CHECK_OUT/results.md)"
    timeout -k 15 "$budget" tests/gpu/gpu-check.sh
    rc=$?
    if [ $rc = 124 ]; then
        say "gpu-check: stopped after $budget s (DEVICE_RUN_SECONDS): results.md holds the rows that finished"
        mkdir -p "$GPU_CHECK_OUT"
        printf '| %s | %s | %s |\n' "device-run" STOPPED "after $budget s (DEVICE_RUN_SECONDS); the rows above finished" \
            >>"$GPU_CHECK_OUT/results.md"
    fi
    [ $PART = check ] && exit $rc
fi
[ "${BENCH_GPU:-1}" = 0 ] && exit $rc
left=$((budget - ($(date +%s) - t0)))
mkdir -p "$out/bench-gpu"
if [ $PART = all ] && [ $left -lt 120 ]; then
    say "bench-gpu: not run: only $left s of DEVICE_RUN_SECONDS left after gpu-check" | tee "$out/bench-gpu.log"
    exit $rc
fi
say "bench-gpu, at most $left s (log: $out/bench-gpu.log)"
export BENCH_GPU_DIR=${BENCH_GPU_DIR:-$TMPROOT/rn-bench-gpu}
export BENCH_GPU_LIMIT=${BENCH_GPU_LIMIT:-120}
if [ "${GPU_CHECK_BUILD:-1}" = 0 ]; then
    timeout -k 15 "$left" tests/bench/gpu.sh 2>&1 | tee "$out/bench-gpu.log"
else
    timeout -k 15 "$left" make --no-print-directory -j"$(nproc)" BUILD="$BUILD" $GPU_CHECK_MAKE_ARGS bench-gpu 2>&1 |
        grep --line-buffered -v -e '^cc ' -e '^ar ' -e 'nvcc' -e '^protoc-c ' | tee "$out/bench-gpu.log"
fi
brc=${PIPESTATUS[0]}
[ $brc = 124 ] && say "bench-gpu: stopped after $left s (DEVICE_RUN_SECONDS): the lines above finished" | tee -a "$out/bench-gpu.log"
cp "$BENCH_GPU_DIR"/run/*.txt "$BENCH_GPU_DIR"/run/*.err "$BENCH_GPU_DIR"/run/*.jsonl "$out/bench-gpu/" 2>/dev/null
[ $rc != 0 ] && exit $rc
exit $brc
