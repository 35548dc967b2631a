#!/usr/bin/env bash
# make bench-infer: ResNet-50 inference at 224x224 on the CPU, rn's inference path
# (bench_infer_step: rn-eval's net, BN folded, fused conv) against onnxruntime (its Node.js
# binding, onnxruntime-node, on torchvision's model exported by torch.onnx.export, opset
# 17, dynamic batch) and against PyTorch (torchvision, eval, no_grad), the same random
# weights on every side (rn-init, rn-export to safetensors, loaded into torchvision) and
# the same threads. Each side's rate is marginal: forwards after one warm-up, no start-up,
# loading or data. Lines:
#   infer-cpu-b32: rn=<img/s> peer=<onnxruntime img/s> ratio=<rn/peer>
#   infer-cpu-b1-ms: rn=<ms> peer=<onnxruntime ms> ratio=<peer/rn>
#   infer-cpu-b32-torch, infer-cpu-b1-ms-torch: the same against PyTorch
# so a ratio above 1 is rn ahead (each the best round of each side), and before them a
# comment per batch with every round's rn/onnxruntime ratio (rn against the onnxruntime
# run right after it), how many rn led and their median. Every OPENBLAS_* variable is unset for all sides (the
# kernel OpenBLAS detects; see cpu.sh for why a forced one is unfair). Without node or
# npm the onnxruntime rows say "skipped". onnxruntime-node is installed into
# $BUILD/node by npm (--ignore-scripts: the Linux x64 CPU library ships in the package).
# ORT=0 leaves onnxruntime out (its lines say "skipped"). DRY=1: a dry run of the script
# itself (tests/pipelines.bats): resnet18 at 64x64, batches 4 and 1, one step, two rounds,
# in $DIR (default $BUILD/bench-infer-dry); its lines are named after those batches.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-2}
STEPS32=${STEPS32:-3}
STEPS1=${STEPS1:-20}
ROUNDS=${ROUNDS:-2}
ARCH=resnet50 SIZE=224 BIG=32 dir=$BUILD/bench-infer
if [ "${DRY:-0}" = 1 ]; then
    ARCH=resnet18 SIZE=64 BIG=4 STEPS32=1 STEPS1=1 ROUNDS=2 dir=${DIR:-$BUILD/bench-infer-dry}
fi
body=$BUILD/tests/bench_infer_step
field() { sed -n "s|.*$1=\([0-9.]*\).*|\1|p"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
best() { awk -v a="$1" -v b="$2" -v lo="$3" 'BEGIN { if (b == "") print a; else if (lo) print (a + 0 < b + 0) ? a : b; else print (a + 0 > b + 0) ? a : b }'; }
ENVCMD=(env)
for v in $(env | sed -n 's/^\(OPENBLAS_[A-Za-z0-9_]*\)=.*/\1/p'); do ENVCMD+=(-u "$v"); done

mkdir -p "$dir"
if [ ! -f "$dir/r50.onnx" ]; then
    "$BUILD/bin/rn-init" --arch "$ARCH" --classes 1000 --seed 7 -o "$dir/r50.pb"
    "$BUILD/bin/rn-export" "$dir/r50.pb" "$dir/r50.safetensors"
    "$PYTHON" tests/bench/infer_peer.py export "$dir/r50.safetensors" "$ARCH" "$dir/r50.onnx.tmp" "$SIZE" 2>"$dir/export.log"
    mv "$dir/r50.onnx.tmp" "$dir/r50.onnx"
fi
ort=1
if [ "${ORT:-1}" = 0 ]; then
    ort=0 why="ORT=0"
elif ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    ort=0 why="no node/npm"
elif [ ! -d "$BUILD/node/node_modules/onnxruntime-node" ] &&
     ! npm install --ignore-scripts --no-audit --no-fund --prefix "$BUILD/node" onnxruntime-node >&2; then
    ort=0 why="npm install onnxruntime-node failed"
fi

# sides alternate ROUNDS times and the best run of each counts: on a shared machine the
# run least disturbed by other work
run_batch() { # batch steps -> sets R O T (rn, onnxruntime, torch outputs: best img/s and ms)
    local r o t pairs=()
    R_ips="" R_ms="" O_ips="" O_ms="" T_ips="" T_ms=""
    for round in $(seq "$ROUNDS"); do
        r=$("${ENVCMD[@]}" "$body" "$dir/r50.pb" "$SIZE" "$1" "$2" "$THREADS" fast)
        echo "# b$1 round $round rn: $r" >&2
        R_ips=$(best "$(field img/s <<<"$r")" "$R_ips" 0) R_ms=$(best "$(field ms <<<"$r")" "$R_ms" 1)
        if [ "$ort" = 1 ]; then
            o=$("${ENVCMD[@]}" NODE_PATH="$BUILD/node/node_modules" node tests/bench/infer_ort.js "$dir/r50.onnx" "$1" "$2" "$THREADS" "$SIZE")
            echo "# b$1 round $round onnxruntime: $o" >&2
            O_ips=$(best "$(field img/s <<<"$o")" "$O_ips" 0) O_ms=$(best "$(field ms <<<"$o")" "$O_ms" 1)
            pairs+=("$(ratio "$(field img/s <<<"$r")" "$(field img/s <<<"$o")")")
        fi
        t=$("${ENVCMD[@]}" "$PYTHON" tests/bench/infer_peer.py time "$dir/r50.safetensors" "$ARCH" "$SIZE" "$1" "$2" "$THREADS")
        echo "# b$1 round $round torch: $t" >&2
        T_ips=$(best "$(field img/s <<<"$t")" "$T_ips" 0) T_ms=$(best "$(field ms <<<"$t")" "$T_ms" 1)
    done
    # each round's rn against the onnxruntime run right after it: less exposed to a
    # disturbance than the best of each side, which may come from different rounds
    if [ "${#pairs[@]}" -gt 0 ]; then printf '%s\n' "${pairs[@]}" | sort -n | awk -v b="$1" '
        { r[NR] = $1; s = s " " $1; if ($1 > 1) up++ }
        END { m = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
              printf "# b%s rounds rn/onnxruntime (sorted):%s; rn ahead in %d of %d, median %.2f\n", b, s, up, NR, m }' >&2
    fi
}

echo "# $ARCH ${SIZE}x$SIZE, $THREADS threads, best of $ROUNDS rounds, OPENBLAS_* unset; $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)" >&2
run_batch "$BIG" "$STEPS32"
if [ "$ort" = 1 ]; then echo "infer-cpu-b$BIG: rn=$R_ips peer=$O_ips ratio=$(ratio "$R_ips" "$O_ips")"
else echo "infer-cpu-b$BIG: skipped: $why"; fi
echo "infer-cpu-b$BIG-torch: rn=$R_ips peer=$T_ips ratio=$(ratio "$R_ips" "$T_ips")"
run_batch 1 "$STEPS1"
if [ "$ort" = 1 ]; then echo "infer-cpu-b1-ms: rn=$R_ms peer=$O_ms ratio=$(ratio "$O_ms" "$R_ms")"
else echo "infer-cpu-b1-ms: skipped: $why"; fi
echo "infer-cpu-b1-ms-torch: rn=$R_ms peer=$T_ms ratio=$(ratio "$T_ms" "$R_ms")"
