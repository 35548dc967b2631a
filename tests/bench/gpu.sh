#!/usr/bin/env bash
# make bench-gpu: ResNet-50 training on one GPU (and on 2..N where there are), rn against
# PyTorch eager (channels_last, cudnn.benchmark, autocast) at the same batch, size and
# precision, one after the other:
#   1. synthetic input (a fixed random batch on the device): rn's tests/bench/gpu_step.c
#      and tests/bench/gpu_peer.py synth, for each of PRECISIONS in turn (fp16, bf16, fp32:
#      each precision's lines printed as it finishes)
#   2. the real loader on generated JPEGs: rn-prep + rn-train (img/s from its --log
#      JSONL) against gpu_peer.py loader (ImageFolder + DataLoader), same workers
#   3. with 2 or more usable GPUs (rn-gpuinfo), data parallel for N = 2, 4, 8, ... and the
#      GPU count: `mpirun -np N rn-train --amp fp16` (--batch N x BATCH) against
#      tests/bench/gpu_ddp_peer.py (DDP over NCCL, autocast + GradScaler, channels_last,
#      cudnn.benchmark; started by torchrun) on 2's JPEGs: BATCH images and
#      (WORKERS + 1) / N - 1 loader workers per GPU, the same steps
# and NVML samples (tests/bench/gpu_watch.py) during every run's timed steps for the GPU
# busy share and the device memory in use. Lines, higher is better:
#   gpu-train-P, gpu-train-loader-P  img/s                          ratio rn/peer
#   gpu-busy-P, gpu-busy-loader-P    mean NVML utilisation, %       ratio rn/peer
#   gpu-peak-mib-P                   rn: what the net holds; peer: max_memory_allocated
#                                    over the timed steps           ratio peer/rn
#   gpu-device-mib-P                 NVML: device memory in use, most over the timed
#                                    steps, less what was in use before the run  peer/rn
#   gpu-train-ddp-N-fp16             img/s of all N GPUs together     ratio rn/peer
#   gpu-scaling-N-fp16               img/s at N / (N x gpu-train-loader-fp16's)  rn/peer
#   gpu-busy                         gpu-busy-fp16 (fp32's when rn's fp16 did not run, said so)
#   gpu-train-amp                    gpu-train-fp16, the last line
# rn's fp16 and bf16 are rn-train --amp's step (fp16 with its dynamic loss scale; steps
# an overflow skipped in the timed window are noted). A precision rn cannot train in (fp16
# and bf16 on the CPU backend) gets "<name>: not run: <why> (peer: <x> img/s)" and no
# number of rn's. Without a usable GPU: "bench-gpu: skipped: <why>", exit 0, no lines;
# with one: "gpu-train-ddp: skipped: 1 GPU visible, scaling needs 2 or more" for step 3.
# Knobs (environment or make variables): BENCH_GPU_STEPS (20 timed steps), _WARMUP (5),
# _BATCH (256), _SIZE (224), _ARCH (resnet50), _PRECISIONS ("fp16 bf16 fp32"),
# _LOADER_PRECISIONS ("fp16 fp32"), _VARIANTS ("RN_CUDA_BN=cudnn RN_CUDA_STEM=plain
# RN_BENCH_CUDA_GRAPHS=1": rn's synthetic fp16 run again with each setting, noted as img/s
# and launches per step against its default; the last replays each step's forward and
# backward as a CUDA graph, as rn-train --cuda-graphs; the dry run's in fp32; empty: none), _WORKERS (cores - 1), _IMAGES (5120), _TF32 (1: TF32
# for fp32 convolutions and GEMMs in both, PyTorch's cuDNN default), _LIMIT (300 s per
# run), _DIR (data and raw outputs: $BUILD/bench-gpu), _DEVICE (cuda; NVML samples GPU 0),
# _DDP_N (the Ns of step 3), _DDP_WORKERS (per process), _DDP_PRECISION (fp16),
# _DDP_LAUNCH (torchrun, or direct: the peer's processes started here with RANK etc.).
# BENCH_GPU_DRY=1 runs all of it on the CPU at a toy size: a check of this script only
# (step 3: 2 processes in fp32, rn under mpirun --oversubscribe, the peer on gloo, direct).
# Exit 1 when a run failed (the other lines still come), else 0: never on a speed.
set -uo pipefail
export LC_ALL=C # EPOCHREALTIME and printf with a decimal point
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
case $BUILD in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
BIN=$BUILD/bin
DRY=${BENCH_GPU_DRY:-0}
# knobs (BENCH_GPU_*, as make bench-gpu takes them), and their defaults: the issue's
# benchmark, or a toy size for the dry run
if [ "$DRY" = 1 ]; then
    d=(cpu resnet18 64 2 1 6 8 80x60 2 1) # 6 timed steps: several 50 ms NVML samples in the window
else
    # loader workers: every core but one, which runs the training step
    d=(cuda resnet50 224 256 5 20 5120 500x375 16 $(($(nproc) > 2 ? $(nproc) - 1 : 1)))
fi
DEVICE=${BENCH_GPU_DEVICE:-${d[0]}}
ARCH=${BENCH_GPU_ARCH:-${d[1]}}
SIZE=${BENCH_GPU_SIZE:-${d[2]}}
BATCH=${BENCH_GPU_BATCH:-${d[3]}}
WARMUP=${BENCH_GPU_WARMUP:-${d[4]}}   # untimed steps first: cuDNN's algorithm search, allocator growth
STEPS=${BENCH_GPU_STEPS:-${d[5]}}     # timed steps
IMAGES=${BENCH_GPU_IMAGES:-${d[6]}}   # generated once; 500x375 as a typical ImageNet photo
IMG_SIZE=${BENCH_GPU_IMG_SIZE:-${d[7]}}
CLASSES=${BENCH_GPU_CLASSES:-${d[8]}}
WORKERS=${BENCH_GPU_WORKERS:-${d[9]}} # rn-train's loader threads, the DataLoader's processes
PRECISIONS=${BENCH_GPU_PRECISIONS:-fp16 bf16 fp32} # mixed precision first: the rows that matter most
LOADER_PRECISIONS=${BENCH_GPU_LOADER_PRECISIONS-fp16 fp32} # empty: no loader runs
VARIANTS=${BENCH_GPU_VARIANTS-RN_CUDA_BN=cudnn RN_CUDA_STEM=plain RN_BENCH_CUDA_GRAPHS=1} # rn's VP step again under each
VP=$([ "$DRY" = 1 ] && echo fp32 || echo fp16) # (the dry run's CPU backend has fp32 only)
TF32=${BENCH_GPU_TF32:-1}             # TF32 tensor cores for fp32 in both (PyTorch's cuDNN default)
LIMIT=${BENCH_GPU_LIMIT:-300}         # seconds per run
DIR=${BENCH_GPU_DIR:-$BUILD/bench-gpu}
# data parallel: rn-train can do fp16 on a GPU only, so the dry run trains fp32
DDP_PRECISION=${BENCH_GPU_DDP_PRECISION:-$([ "$DRY" = 1 ] && echo fp32 || echo fp16)}
DDP_LAUNCH=${BENCH_GPU_DDP_LAUNCH:-$([ "$DRY" = 1 ] && echo direct || echo torchrun)}
W=$DIR/run
body=$BUILD/tests/bench_gpu_step
failed=0

note() { echo "# $*" >&2; }
field() { sed -n "s|.*$1=\([^ ]*\).*|\1|p" | head -n 1; }
num() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
ratio() { if num "$1" && num "$2" && awk -v b="$2" 'BEGIN { exit !(b > 0) }'; then
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; else echo -; fi; }
line() { echo "$1: rn=${2:--} peer=${3:--} ratio=$(ratio "${2:--}" "${3:--}")"; }
line_inv() { echo "$1: rn=${2:--} peer=${3:--} ratio=$(ratio "${3:--}" "${2:--}")"; }

[ -x "$body" ] || { echo "bench-gpu: $body is missing: make BUILD=$BUILD all" >&2; exit 1; }
if [ "$DEVICE" != cpu ]; then
    why=$("$body" probe "$DEVICE" 2>&1)
    case $? in
        0) ;;
        77) echo "bench-gpu: skipped: $why"; exit 0 ;;
        *) echo "bench-gpu: $body probe failed: $why" >&2; exit 1 ;;
    esac
else
    why=$("$body" probe cpu) || exit 1
fi
mkdir -p "$W" || exit 1
rm -f "$W"/*

# NVML for utilisation and memory; without it those lines carry "-"
WPID=
NVML=0
# (the dry run samples too where NVML answers: a check of the sampling, not of a GPU)
if nv=$("$PYTHON" tests/bench/gpu_watch.py check 2>&1); then NVML=1; else note "no GPU busy or device memory figures: $nv"; fi
watch_start() {
    ts=$SECONDS # for "took": what each run costs, to plan a device session's minutes
    [ $NVML = 1 ] || return 0
    "$PYTHON" tests/bench/gpu_watch.py sample "$1" &
    WPID=$!
    for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.05; done
}
watch_stop() { [ -n "$WPID" ] && kill "$WPID" 2>/dev/null && wait "$WPID" 2>/dev/null; WPID=; took=$((SECONDS - ${ts:-$SECONDS})); }
trap watch_stop EXIT
window() { # watch-file t0 t1 -> busy_pct=.. used_mib=.. samples=..
    if [ $NVML = 1 ] && num "${2:-x}" && num "${3:-x}"; then "$PYTHON" tests/bench/gpu_watch.py window "$1" "$2" "$3"
    else echo "busy_pct=- used_mib=- samples=0"; fi
}

peer_ok=1
if ! pv=$("$PYTHON" -c 'import sys, torch, torchvision
sys.exit(0 if sys.argv[1] == "cpu" or torch.cuda.is_available() else 1)' "$DEVICE" 2>&1); then
    peer_ok=0
    note "no PyTorch peer: $PYTHON cannot import torch and torchvision or sees no GPU: $(tail -n 1 <<<"$pv")"
fi
[ "$DRY" = 1 ] && echo "bench-gpu: DRY RUN on the CPU (BENCH_GPU_DRY=1): a check of the script; no number below is a GPU's" >&2
note "$ARCH ${SIZE}x$SIZE batch $BATCH, $WARMUP warm-up + $STEPS timed steps, TF32 $TF32, $WORKERS loader workers; rn on $why; $(nproc) cores"
PEER=(tests/bench/gpu_peer.py --arch "$ARCH" --size "$SIZE" --batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS"
    --device "$DEVICE" --tf32 "$TF32" --workers "$WORKERS")

# peer KIND KEY P [ARGS]: the peer's KIND run (synth or loader) at precision P alone, its
# "precision=P ..." line with its NVML window into P[KEY] ("" when it gave none)
peer() {
    local kind=$1 key=$2 p=$3 f=$W/peer-$1-$3
    shift 3
    if [ $peer_ok = 1 ]; then
        watch_start "$f.watch"
        timeout "$LIMIT" "$PYTHON" "${PEER[@]}" "$kind" "$@" --precisions "$p" >"$f.txt" 2>"$f.err" ||
            { failed=1; note "peer $kind $p FAILED: $(tail -n 3 "$f.err")"; }
        watch_stop
        [ "$kind" = synth ] && grep '^#' "$f.txt" >&2
        note "peer $kind $p took $took s"
    fi
    P[$key]=$(grep "^precision=$p " "$f.txt" 2>/dev/null)
    [ -n "${P[$key]}" ] && P[$key]="${P[$key]} $(window "$f.watch" "$(field t0 <<<"${P[$key]}")" "$(field t1 <<<"${P[$key]}")")"
    return 0
}

# ---- 1. synthetic input: for each precision rn's run, the peer's, then its lines (each
# precision's lines as soon as it is done: a run stopped by the device's minutes keeps them) ----
declare -A R P
for p in $PRECISIONS; do
    watch_start "$W/rn-$p.watch"
    RN_CUDA_TF32=$TF32 timeout "$LIMIT" "$body" "$ARCH" "$SIZE" "$BATCH" "$WARMUP" "$STEPS" "$p" "$DEVICE" \
        >"$W/rn-$p.txt" 2>"$W/rn-$p.err"
    rc=$?
    watch_stop
    case $rc in
        0) R[$p]=$(cat "$W/rn-$p.txt")
           R[$p]="${R[$p]} $(window "$W/rn-$p.watch" "$(field t0 <<<"${R[$p]}")" "$(field t1 <<<"${R[$p]}")")"
           note "rn $p: ${R[$p]} (took $took s)"
           sk=$(field skipped <<<"${R[$p]}")
           [ "${sk:-0}" = 0 ] || note "rn $p: $sk of the $STEPS timed steps were skipped by the fp16 loss scale (an overflow: no SGD step), and still counted" ;;
        3) R[$p]="not run: $(sed -n 's/^bench_gpu_step: [a-z0-9]*: //p' "$W/rn-$p.err" | tail -n 1)"
           note "rn $p: ${R[$p]}" ;;
        *) failed=1
           R[$p]="failed"
           note "rn $p: FAILED (exit $rc): $(tail -n 3 "$W/rn-$p.err")" ;;
    esac
    peer synth "$p" "$p"
    note "peer $p: ${P[$p]:-none}"
    case ${R[$p]} in
        "not run"*) echo "gpu-train-$p: ${R[$p]} (peer: $(field img/s <<<"${P[$p]}" | grep . || echo -) img/s)"; continue ;;
    esac
    note "rn $p: $(field launches_per_step <<<"${R[$p]}") launches per step (kernels, cuDNN/cuBLAS calls, copies, memsets)"
    line "gpu-train-$p" "$(field img/s <<<"${R[$p]}")" "$(field img/s <<<"${P[$p]}")"
    line "gpu-busy-$p" "$(field busy_pct <<<"${R[$p]}")" "$(field busy_pct <<<"${P[$p]}")"
    line_inv "gpu-peak-mib-$p" "$(field net_mib <<<"${R[$p]}")" "$(field peak_mib <<<"${P[$p]}")"
    line_inv "gpu-device-mib-$p" "$(field used_mib <<<"${R[$p]}")" "$(field used_mib <<<"${P[$p]}")"
done

# ---- 1b. rn's VP step again under each of VARIANTS (a backend setting each), against
# its default: which to make the default (a note each, no summary line: no peer) ----
for v in $VARIANTS; do
    case ${R[$VP]:-none} in "not run"* | failed | none) note "rn $VP with $v: not run (rn's default $VP did not run)"; continue ;; esac
    f=$W/rn-$VP-${v//[^A-Za-z0-9]/_}
    env RN_CUDA_TF32="$TF32" "$v" timeout "$LIMIT" "$body" "$ARCH" "$SIZE" "$BATCH" "$WARMUP" "$STEPS" "$VP" "$DEVICE" \
        >"$f.txt" 2>"$f.err"
    rc=$?
    if [ $rc = 0 ]; then
        a=$(field img/s <"$f.txt") b=$(field img/s <<<"${R[$VP]}")
        la=$(field launches_per_step <"$f.txt") lb=$(field launches_per_step <<<"${R[$VP]}")
        note "rn $VP with $v: img/s=${a:--} against ${b:--} by default: ratio $(ratio "${a:--}" "${b:--}"); launches per step ${la:--} against ${lb:--}"
    elif [ $rc = 3 ]; then
        note "rn $VP with $v: not run: $(sed -n 's/^bench_gpu_step: //p' "$f.err" | tail -n 1)"
    else
        failed=1
        note "rn $VP with $v: FAILED (exit $rc): $(tail -n 3 "$f.err")"
    fi
done

# ---- 2. the real loader: generated JPEGs, rn-prep + rn-train against ImageFolder + DataLoader ----
loader_data() {
    local per=$(((IMAGES + CLASSES - 1) / CLASSES)) t=$SECONDS
    local stamp="$per $CLASSES $IMG_SIZE"
    if [ "$(cat "$DIR/imgs.stamp" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "$DIR/imgs" "$DIR/imgs.tmp" "$DIR/data.lmdb" "$DIR/imgs.stamp"
        mkdir -p "$DIR/imgs" "$DIR/imgs.tmp" || return 1
        # one generator per class, all cores at once: seconds, not minutes, on a GPU machine
        seq 0 $((CLASSES - 1)) | xargs -P "$(nproc)" -I{} "$PYTHON" tests/data/mkimages.py folder "$DIR/imgs.tmp/{}" \
            --classes 1 --per-class "$per" --size "$IMG_SIZE" --seed {} --noise 12 || return 1
        for k in $(seq 0 $((CLASSES - 1))); do
            mv "$DIR/imgs.tmp/$k/class_00" "$(printf '%s/imgs/class_%02d' "$DIR" "$k")" || return 1
        done
        rm -rf "$DIR/imgs.tmp"
        echo "$stamp" >"$DIR/imgs.stamp"
        note "generated $((per * CLASSES)) $IMG_SIZE JPEGs in $DIR/imgs in $((SECONDS - t)) s (kept for the next run)"
    fi
    if [ ! -s "$DIR/data.lmdb/classes.txt" ]; then
        "$BIN/rn-prep" -q "$DIR/imgs" "$DIR/data.lmdb" >&2 || return 1
    fi
    "$BIN/rn-init" --arch "$ARCH" --classes "$CLASSES" --seed 1 -o "$W/init.pb"
}
# the GPUs data parallelism can spread over: CUDA's usable devices (after
# CUDA_VISIBLE_DEVICES), as rn-gpuinfo sees them; the dry run: 2 processes on the CPU
ddp_ns() { local n=2; while [ $n -lt "$1" ]; do echo $n; n=$((n * 2)); done; echo "$1"; }
if [ "$DRY" = 1 ]; then
    ngpu=2
else
    ngpu=$("$BIN/rn-gpuinfo" --json 2>/dev/null |
        "$PYTHON" -c 'import json,sys; print(sum(d["usable"] for d in json.load(sys.stdin)["devices"]))' 2>/dev/null)
    num "${ngpu:-x}" || ngpu=0
fi
DDP_NS=${BENCH_GPU_DDP_N-$([ "$ngpu" -ge 2 ] && ddp_ns "$ngpu")}
if { [ -n "$LOADER_PRECISIONS" ] || [ -n "$DDP_NS" ]; } && ! loader_data; then
    failed=1
    note "the loader and data-parallel runs are left out: making their JPEGs, dataset or checkpoint in $DIR failed (see above)"
    LOADER_PRECISIONS='' DDP_NS='' DDP_NODATA=1
fi
has_amp=0
# (not `rn-train --help | grep -q`: under pipefail grep's early exit can SIGPIPE rn-train)
grep -q -- '--amp' <<<"$("$BIN/rn-train" --help)" && has_amp=1
# each JSONL line stamped with the wall-clock time it was written, for the NVML window
stamp_lines() { while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }
# stamped JSONL, images per step -> img/s=.. data_wait=.. t0=.. t1=..: step lines WARMUP
# and WARMUP+STEPS bound the timed steps
timed() {
    awk -v w="$WARMUP" -v s="$STEPS" -v b="$2" '/"kind":"step"/ { n++
            if (n == w) t0 = $1
            if (n > w && n <= w + s) { match($0, /"data_wait":[0-9.]+/); dw += substr($0, RSTART + 12, RLENGTH - 12) }
            if (n == w + s) t1 = $1 }
        END { if (t1 > t0 && t0 > 0) printf "img/s=%.2f data_wait=%.4f t0=%.3f t1=%.3f", s * b / (t1 - t0), dw / s, t0, t1 }' "$1"
}
# each precision: rn's run, the peer's, then its lines
for p in $LOADER_PRECISIONS; do
    amp=()
    R[L$p]=
    if [ "$p" != fp32 ]; then
        # the interface rn-train is expected to get; until then this row is not run
        if [ $has_amp = 0 ]; then R[L$p]="not run: rn-train has no --amp yet"
        elif [ "$DEVICE" = cpu ]; then R[L$p]="not run: rn-train --amp needs a GPU"; fi
        [ -n "${R[L$p]}" ] && note "rn loader $p: ${R[L$p]}"
        amp=(--amp "$p")
    fi
    if [ -z "${R[L$p]}" ]; then
        watch_start "$W/rn-loader-$p.watch"
        RN_CUDA_TF32=$TF32 timeout "$LIMIT" "$BIN/rn-train" --device "$DEVICE" --data "$DIR/data.lmdb" --in "$W/init.pb" \
            --out "$W/loader.pb" --epochs 1000 --max-steps $((WARMUP + STEPS)) --batch "$BATCH" --crop "$SIZE" \
            --workers "$WORKERS" --lr 0.01 --log-every 1 --log /dev/stdout "${amp[@]}" 2>"$W/rn-loader-$p.err" |
            stamp_lines >"$W/rn-loader-$p.jsonl"
        rc=${PIPESTATUS[0]}
        watch_stop
        rm -f "$W/loader.pb"
        if [ "$rc" != 0 ]; then
            failed=1
            R[L$p]=failed
            note "rn loader $p: FAILED (exit $rc): $(tail -n 3 "$W/rn-loader-$p.err")"
        else
            R[L$p]=$(timed "$W/rn-loader-$p.jsonl" "$BATCH")
            R[L$p]="${R[L$p]} $(window "$W/rn-loader-$p.watch" "$(field t0 <<<"${R[L$p]}")" "$(field t1 <<<"${R[L$p]}")")"
            case ${R[L$p]} in img/s=*) ;; *) failed=1; note "rn loader $p: rn-train logged fewer than $((WARMUP + STEPS)) steps" ;; esac
            note "rn loader $p: ${R[L$p]} (took $took s; $(grep -m1 ' on ' "$W/rn-loader-$p.err"))"
        fi
    fi
    peer loader "L$p" "$p" --data "$DIR/imgs" --classes "$CLASSES"
    note "peer loader $p: ${P[L$p]:-none}"
    case ${R[L$p]} in
        "not run"*) echo "gpu-train-loader-$p: ${R[L$p]} (peer: $(field img/s <<<"${P[L$p]}" | grep . || echo -) img/s)"; continue ;;
    esac
    line "gpu-train-loader-$p" "$(field img/s <<<"${R[L$p]}")" "$(field img/s <<<"${P[L$p]}")"
    line "gpu-busy-loader-$p" "$(field busy_pct <<<"${R[L$p]}")" "$(field busy_pct <<<"${P[L$p]}")"
done

# ---- 3. data parallel on N GPUs: mpirun rn-train against DDP, on the loader's images ----
# rn-train reads a dataset only, so both sides take step 2's generated JPEGs, BATCH images
# per GPU per step (rn's --batch is the global N x BATCH), each process WORKERS/N loader
# workers; scaling divides by N x step 2's one-GPU img/s of the same precision
scaling() { if num "$1" && num "$3" && awk -v b="$3" 'BEGIN { exit !(b > 0) }'; then
    awk -v a="$1" -v n="$2" -v b="$3" 'BEGIN { printf "%.3f", a / (n * b) }'; else echo -; fi; }
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# N args... -> the peer's N processes: torchrun (as $PYTHON -m torch.distributed.run, the
# same interpreter), or started here with the variables torchrun would set
peer_ddp() {
    local n=$1 r rc=0 port pid pids=()
    shift
    if [ "$DDP_LAUNCH" = torchrun ]; then
        timeout "$LIMIT" "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$n" "$@"
        return
    fi
    port=$(free_port) || return 1
    for r in $(seq 0 $((n - 1))); do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$n RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n \
            timeout "$LIMIT" "$PYTHON" "$@" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || { r=$?; [ $rc != 0 ] || rc=$r; }; done
    return $rc
}
DP=$DDP_PRECISION
ddp_rn=
grep -q "This build: with Open MPI" <<<"$("$BIN/rn-train" --help)" || ddp_rn="this rn build has no MPI (make deps; make)"
command -v mpirun >/dev/null || ddp_rn="no mpirun on PATH (Open MPI: make deps installs openmpi-bin)"
if [ "$DP" != fp32 ]; then
    [ $has_amp = 1 ] || ddp_rn="rn-train has no --amp yet"
    [ "$DEVICE" != cpu ] || ddp_rn="rn-train --amp needs a GPU"
fi
if [ "$DDP_LAUNCH" = torchrun ] && [ $peer_ok = 1 ] && ! "$PYTHON" -c 'import torch.distributed.run' 2>/dev/null; then
    DDP_LAUNCH=direct
    note "peer ddp: $PYTHON has no torch.distributed.run (torchrun): its processes are started directly"
fi
DW=${BENCH_GPU_DDP_WORKERS:-}
[ "$DRY" = 1 ] && [ -n "$DDP_NS" ] &&
    note "DRY: data parallel, N = $DDP_NS processes on the CPU (mpirun --oversubscribe; the peer on gloo, started $DDP_LAUNCH), $DP: a check of the script, no GPU's scaling"
nimg=$(((IMAGES + CLASSES - 1) / CLASSES * CLASSES))
for n in $DDP_NS; do
    dw=${DW:-$(((WORKERS + 1) / n > 2 ? (WORKERS + 1) / n - 1 : 1))}
    if [ $((n * BATCH)) -gt $nimg ]; then
        echo "gpu-train-ddp-$n-$DP: not run: $n x $BATCH images per step is more than the $nimg generated (BENCH_GPU_IMAGES)"
        continue
    fi
    if [ -n "$ddp_rn" ]; then
        R[D$n]="not run: $ddp_rn"
    else
        mpi=(mpirun -np "$n" --bind-to none)
        [ "$DEVICE" = cpu ] && mpi+=(--oversubscribe)
        amp=()
        [ "$DP" = fp32 ] || amp=(--amp "$DP")
        ts=$SECONDS
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 RN_CUDA_TF32=$TF32 timeout "$LIMIT" "${mpi[@]}" \
            "$BIN/rn-train" --device "${DEVICE%%:*}" --data "$DIR/data.lmdb" --in "$W/init.pb" --out "$W/ddp.pb" \
            --epochs 1000 --max-steps $((WARMUP + STEPS)) --batch $((n * BATCH)) --crop "$SIZE" --workers "$dw" \
            --lr 0.01 --log-every 1 --log /dev/stdout "${amp[@]}" 2>"$W/rn-ddp-$n.err" | stamp_lines >"$W/rn-ddp-$n.jsonl"
        rc=${PIPESTATUS[0]}
        rm -f "$W/ddp.pb"
        if [ "$rc" != 0 ]; then
            failed=1
            R[D$n]=failed
            note "rn ddp $n: FAILED (exit $rc): $(grep -E '^(rn-train|rank [0-9]+):' "$W/rn-ddp-$n.err" | tail -n 3)"
        else
            R[D$n]=$(timed "$W/rn-ddp-$n.jsonl" $((n * BATCH)))
            case ${R[D$n]} in img/s=*) ;; *) failed=1; note "rn ddp $n: rn-train logged fewer than $((WARMUP + STEPS)) steps" ;; esac
            note "rn ddp $n: ${R[D$n]} (took $((SECONDS - ts)) s; $dw loader workers per process)"
        fi
    fi
    if [ $peer_ok = 1 ]; then
        ts=$SECONDS
        peer_ddp "$n" tests/bench/gpu_ddp_peer.py --data "$DIR/imgs" --classes "$CLASSES" --arch "$ARCH" --size "$SIZE" \
            --batch "$BATCH" --warmup "$WARMUP" --steps "$STEPS" --precision "$DP" --device "${DEVICE%%:*}" --tf32 "$TF32" \
            --workers "$dw" --timeout "$LIMIT" >"$W/peer-ddp-$n.txt" 2>"$W/peer-ddp-$n.err" ||
            { failed=1; note "peer ddp $n FAILED: $(grep -v -e '^ ' -e '^\*' -e '^$' "$W/peer-ddp-$n.err" | tail -n 3)"; }
        grep '^#' "$W/peer-ddp-$n.txt" >&2
        P[D$n]=$(grep "^world=$n " "$W/peer-ddp-$n.txt")
        note "peer ddp $n: ${P[D$n]:-none} (took $((SECONDS - ts)) s, $DDP_LAUNCH)"
    fi
    pi=$(field img/s <<<"${P[D$n]:-}")
    ps=$(scaling "$pi" "$n" "$(field img/s <<<"${P[L$DP]:-}")")
    case ${R[D$n]} in
        "not run"*) echo "gpu-train-ddp-$n-$DP: ${R[D$n]} (peer: ${pi:--} img/s)"
                    echo "gpu-scaling-$n-$DP: ${R[D$n]} (peer: $ps)"; continue ;;
    esac
    line "gpu-train-ddp-$n-$DP" "$(field img/s <<<"${R[D$n]}")" "$pi"
    line "gpu-scaling-$n-$DP" "$(scaling "$(field img/s <<<"${R[D$n]}")" "$n" "$(field img/s <<<"${R[L$DP]:-}")")" "$ps"
done
if [ "${DDP_NODATA:-0}" = 1 ]; then
    echo "gpu-train-ddp: not run: making the loader's dataset failed"
elif [ -z "$DDP_NS" ] && [ "$ngpu" -lt 2 ]; then
    echo "gpu-train-ddp: skipped: $ngpu GPU visible, scaling needs 2 or more"
fi

# ---- headline: AMP fp16, and its GPU busy share ----
h=fp16
case ${R[fp16]:-not run} in "not run"*) h=fp32 ;; esac
[ $h = fp32 ] && note "gpu-busy below is fp32's: rn has no fp16 run (${R[fp16]:-fp16 not in PRECISIONS})"
line gpu-busy "$(field busy_pct <<<"${R[$h]:-}")" "$(field busy_pct <<<"${P[$h]:-}")"
case ${R[fp16]:-not run} in
    "not run"*) echo "gpu-train-amp: not run: ${R[fp16]:-fp16 not in PRECISIONS}" \
        "(peer fp16: $(field img/s <<<"${P[fp16]:-}" | grep . || echo -) img/s)" | sed 's/not run: not run: /not run: /' ;;
    *) line gpu-train-amp "$(field img/s <<<"${R[fp16]}")" "$(field img/s <<<"${P[fp16]:-}")" ;;
esac
note "bench-gpu took $SECONDS s"
[ "$DRY" = 1 ] && echo "bench-gpu: DRY RUN on the CPU: the numbers above are not a GPU's" >&2
exit $failed
