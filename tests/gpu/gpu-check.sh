#!/usr/bin/env bash
# make gpu-check: everything about the CUDA backend that needs a GPU, in one run.
#   1. build (make all) here, with CUDA
#   2. rn-gpuinfo --check: is a GPU usable? If not: "gpu-check: skipped: <why>", exit 0
#      (exit 77 with GPU_CHECK_STRICT=1)
#   3. every CUDA op against the CPU op on fresh random inputs (test_cuda_ops, RN_SYNC=1):
#      fp32 with TF32 off within 1e-4 relative, fp16/bf16 within their own tolerances
#   4. ResNet-50 at 64x64, batch 32, 30 fp32 training steps from one rn-init checkpoint on
#      the GPU and on the CPU (tests/parity/device_steps.c): the loss curves may differ by
#      at most 10x what PyTorch's own CPU and GPU runs of the same recipe differ by on this
#      machine (tests/gpu/torch_steps.py; without torch: a fixed 1e-3, said so), and so may
#      an inference forward with the trained weights; the GPU curve must be finite and end
#      below where it started
#   4b. mixed precision: rn-train --amp fp16 and bf16 on the GPU, the same arch, size, batch
#      and steps on one fixed batch of toy images: losses finite, and the mean of the last
#      5 below the mean of the first 5
#   4c. tests/amp.bats (its GPU tests: fp16/bf16 training, overflow skips, exact resume)
#   4d. memory plan: --micro-batch auto under a --mem-limit between the plans of BATCH/4
#      and BATCH/2 images takes BATCH/4, trains, and holds no more than it planned
#   4e. data parallel over NCCL (tests/gpu/dist-check.sh): rn-gpuinfo --nccl; one process
#      through the collectives (mpirun -np 1, RN_DIST_SOLO=1: a NCCL communicator of one)
#      against the plain run, the same bits at --accum 1, within 1e-5 at --accum 2; then
#      with 2 or more GPUs `mpirun -np 2 rn-train` against one process with --accum 2,
#      weights within 1e-5, and a hung rank (stopped) named by rank 0 within --dist-timeout
#      (with one GPU left out, saying why: one rank per GPU)
#   4f. rn-train --recompute blocks against none (tests/gpu/recompute-check.sh)
#   4g. rn-train --cuda-graphs against the same run without: the same bits (checkpoints and
#      logged losses), fp32 and fp16, --accum 1 and 2, with --val, EMA, frozen BN and
#      recomputation, with mixup and cutmix (tests/gpu/graphs-check.sh)
#   5. rn-train and rn-eval --device cuda on train.bats's toy dataset: 8 epochs reach a
#      validation top-1 of at least 0.95, as on the CPU
#   5b. the algorithm cache those runs wrote: a second rn-train reads it, searches nothing new
#   5c. rn-train's gpu_util/gpu_mem_used/gpu_power_w through NVML, and --profile timed by
#      CUDA events (the trace's compute stream track)
#   6. rn-train --tensorboard, two epochs in two runs (--amp fp16), loaded by tensorboard's
#      own EventAccumulator (tests/gpu/tb_check.py): the same scalars as rn-info reads and
#      the log holds, the flags in the text plugin; skipped without the tensorboard package
#   7. the fall-backs on cuDNN statuses, injected (RN_CUDA_INJECT): Find out of memory
#      takes the heuristic, a fatal status stops the run by name, the fused BN refused
#      runs rn's (tests/gpu/inject-check.sh); last, so that a device run short of time
#      loses this before the tools' checks
# GPU_CHECK_MEMCHECK=1 adds the op test under compute-sanitizer (minutes more).
# GPU_CHECK_BUILD=0 skips step 1 and uses the build already in $BUILD.
# Output in $GPU_CHECK_OUT (default gpu-check-out): gpu-check.log (everything said),
# results.md (one row per check), build.log, ops.txt (the op test's output),
# train-compare.txt (the two loss curves), amp-bats.txt and dist.txt (step 4e); checkpoints and raw outputs go to
# $GPU_CHECK_WORK (default $GPU_CHECK_OUT/work). GPU_CHECK_MAKE_ARGS are passed to make.
# Exit 0 when every check passed, 1 otherwise.
# GPU_CHECK_DRY=1 (below) runs it on the CPU; the AMP rows then say "not run: needs a GPU".
# About 3-5 minutes on an H200 (most of it the build and the CPU's 30 steps; 4b and 4c
# under a minute together).
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${GPU_CHECK_OUT:-gpu-check-out}
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$PWD/$BUILD ;; esac # step 5 runs the tools from $WORK
MAKE=${MAKE:-make}
PYTHON=${PYTHON:-python3}
SIZE=64 BATCH=32 STEPS=${GPU_CHECK_STEPS:-30} ARCH=${GPU_CHECK_ARCH:-resnet50}
# GPU_CHECK_DRY=1 runs every step with the CPU in place of the GPU: a check of this script
# on a machine without one (it proves nothing about the GPU)
DEV=cuda
[ "${GPU_CHECK_DRY:-0}" = 1 ] && DEV=cpu
FIXED_TOL=1e-3
WORK=${GPU_CHECK_WORK:-$OUT/work}
mkdir -p "$OUT" "$WORK" || { echo "gpu-check: cannot create $OUT and $WORK" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)
WORK=$(cd "$WORK" && pwd)
LOG=$OUT/gpu-check.log
RES=$OUT/results.md
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
t_start=$(date +%s)
failed=0
row() { printf '| %s | %s | %s |\n' "$1" "$2" "$3" >>"$RES"; }
# a step of its own script, tests/gpu/STEP-check.sh (NAME STEP): its output in
# $OUT/STEP.txt, its scratch in $WORK/STEP, its last line the verdict ("ok|FAIL <detail>")
script_step() {
    local name=$1 step=$2 v
    say "$name"
    BIN=$BIN WORK=$WORK/$step DEV=$DEV PYTHON=$PYTHON ARCH=$ARCH SIZE=$SIZE BATCH=$BATCH \
        "tests/gpu/$step-check.sh" >"$OUT/$step.txt" 2>&1
    cat "$OUT/$step.txt"
    v=$(tail -n 1 "$OUT/$step.txt")
    case $v in
        ok\ *) row "$name" ok "${v#ok }" ;;
        *) failed=1; row "$name" FAIL "${v#FAIL }; see $step.txt" ;;
    esac
}
say() { echo "gpu-check: $*"; }

{
    echo "# rn gpu-check $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
    echo
    echo "| check | result | detail |"
    echo "|---|---|---|"
} >"$RES"

if [ "${GPU_CHECK_BUILD:-1}" = 0 ]; then
    # a build made elsewhere and copied here (a machine without the build dependencies)
    say "using the existing build in $BUILD (GPU_CHECK_BUILD=0)"
    # (in the words of make's build line, which step 4e reads: NCCL, Open MPI)
    {
        printf 'rn (prebuilt): %s' "$(ar t "$BUILD/librn.a" 2>/dev/null | grep -q backend_cuda && echo GPU and CPU backends || echo CPU backend only)"
        ldd "$BUILD/bin/rn-train" 2>/dev/null | grep -q libnccl && printf ', NCCL'
        "$BUILD/bin/rn-train" --help 2>/dev/null | grep -q 'This build: with Open MPI' && printf ', Open MPI'
        echo
    } >"$OUT/build.log"
else
    say "building in $BUILD (log: $OUT/build.log)"
fi
if [ "${GPU_CHECK_BUILD:-1}" != 0 ] && ! $MAKE -j"$(nproc)" BUILD="$BUILD" ${GPU_CHECK_MAKE_ARGS:-} all >"$OUT/build.log" 2>&1; then
    tail -n 30 "$OUT/build.log"
    row build FAIL "see build.log"
    say "FAILED: the build (see $OUT/build.log)"
    exit 1
fi
if ! grep -q '^rn .*GPU and CPU backends' "$OUT/build.log" && [ $DEV != cpu ] && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    why="no NVIDIA device (/dev/nvidia*) and a CPU-only build: $(grep '^rn ' "$OUT/build.log" | head -n 1)"
    row gpu skipped "$why"
    say "skipped: $why"
    [ "${GPU_CHECK_STRICT:-0}" = 1 ] && exit 77
    exit 0
fi
grep -q '^rn .*GPU and CPU backends' "$OUT/build.log" || {
    row build FAIL "built without CUDA: $(grep '^rn ' "$OUT/build.log" | head -n 1)"
    say "FAILED: this build has no CUDA backend: $(grep '^rn ' "$OUT/build.log" | head -n 1)"
    exit 1
}
row build ok "$(grep '^rn ' "$OUT/build.log" | head -n 1)"

BIN=$BUILD/bin TESTS=$BUILD/tests
if [ $DEV = cpu ]; then
    echo "dry run: the CPU stands in for the GPU" >"$WORK/gpuinfo-check.txt"
elif ! "$BIN/rn-gpuinfo" --check >"$WORK/gpuinfo-check.txt" 2>&1 &&
    # rn-gpuinfo may object to something the backend does not need: the backend decides
    "$TESTS/test_cuda_ops" 2>&1 | grep -q SKIP; then
    why=$(tail -n 1 "$WORK/gpuinfo-check.txt")
    row gpu skipped "$why"
    say "skipped: no usable GPU: $why"
    [ "${GPU_CHECK_STRICT:-0}" = 1 ] && exit 77
    exit 0
fi
"$BIN/rn-gpuinfo" >"$WORK/gpuinfo.txt" 2>&1
row gpu ok "$(head -n 1 "$WORK/gpuinfo-check.txt")"
cat "$WORK/gpuinfo.txt"

# 3. ops
seed=${RN_TEST_SEED:-$(date +%s)}
say "op comparison, seed $seed"
if RN_TEST_DEVICE=$DEV RN_SYNC=1 RN_TEST_SEED=$seed timeout 300 "$TESTS/test_cuda_ops" >"$OUT/ops.txt" 2>&1 &&
    ! grep -q SKIP "$OUT/ops.txt"; then
    row "ops: GPU vs CPU (fp32, fp16, bf16)" ok "$(tail -n 1 "$OUT/ops.txt"), seed $seed"
else
    failed=1
    grep -E 'FAIL|mismatch|SKIP|Error|error' "$OUT/ops.txt" | head -n 40
    row "ops: GPU vs CPU (fp32, fp16, bf16)" FAIL "$(tail -n 1 "$OUT/ops.txt" | cut -c1-200), seed $seed; see ops.txt"
fi
grep -E '^test_cuda_ops: (F32|F16|BF16|cuda|pinned)' "$OUT/ops.txt"

# 3b. optional: the op test under compute-sanitizer (slow: heuristic algorithms, no Find)
if [ "${GPU_CHECK_MEMCHECK:-0}" = 1 ]; then
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x "$CS" ]; then
        say "op test under compute-sanitizer memcheck"
        if RN_TEST_REAL_SIZES=0 RN_CUDA_CONV_ALGO=heuristic RN_TEST_SEED=$seed timeout 600 "$CS" --tool memcheck --error-exitcode 9 \
            "$TESTS/test_cuda_ops" >"$WORK/memcheck.txt" 2>&1; then
            row "ops under compute-sanitizer memcheck" ok "$(tail -n 1 "$WORK/memcheck.txt")"
        else
            failed=1
            grep -m 20 -E 'Invalid|ERROR|error' "$WORK/memcheck.txt"
            row "ops under compute-sanitizer memcheck" FAIL "see work/memcheck.txt"
        fi
    else
        row "ops under compute-sanitizer memcheck" skipped "compute-sanitizer not found"
    fi
fi

# 4. training steps, GPU and CPU, from one checkpoint
say "$ARCH ${SIZE}x$SIZE batch $BATCH: $STEPS fp32 steps on the GPU and on the CPU"
"$BIN/rn-init" --arch $ARCH --seed 1 -o "$WORK/init.pb" || { row "train: init" FAIL "rn-init"; exit 1; }
train_ok=1
timeout 300 "$TESTS/parity_device_steps" $DEV "$WORK/init.pb" $SIZE $BATCH $STEPS 1 >"$WORK/train-gpu.txt" 2>"$WORK/train-gpu.err" ||
    { train_ok=0; cat "$WORK/train-gpu.err"; }
timeout 400 "$TESTS/parity_device_steps" cpu "$WORK/init.pb" $SIZE $BATCH $STEPS 1 >"$WORK/train-cpu.txt" 2>"$WORK/train-cpu.err" ||
    { train_ok=0; cat "$WORK/train-cpu.err"; }
timeout 400 "$PYTHON" tests/gpu/torch_steps.py --arch $ARCH --size $SIZE --batch $BATCH --steps $STEPS \
    >"$WORK/torch.txt" 2>&1 || echo "torch_rel=unavailable (torch_steps.py failed: $(tail -n 1 "$WORK/torch.txt"))" >>"$WORK/torch.txt"
cat "$WORK/torch.txt"
torch_line=$(grep '^torch_rel=' "$WORK/torch.txt" | tail -n 1)
torch_rel=${torch_line#torch_rel=}
torch_rel=${torch_rel%% *}
if [ "$train_ok" = 1 ]; then
    verdict=$(awk -v trel="$torch_rel" -v fixed=$FIXED_TOL -v steps=$STEPS '
        FNR == 1 { f++ }
        /^step / { if (f == 1) g[$2] = $4; else c[$2] = $4 }
        /^eval loss / { if (f == 1) ge = $3; else ce = $3 }
        END {
            n = 0; worst = 0; finite = 1
            for (i in g) if (i in c) { n++; d = g[i] - c[i]; d = d < 0 ? -d : d; if (d > worst) worst = d
                                         if (g[i] !~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/) finite = 0 }
            rel = worst / (c[0] < 0 ? -c[0] : c[0])
            if (trel ~ /^[0-9.eE+-]+$/) { tol = 10 * trel; if (tol < 1e-6) tol = 1e-6; how = "10x torch " trel }
            else { tol = fixed; how = "fixed (no torch peer)" }
            de = ge - ce; de = de < 0 ? -de : de; erel = de / (c[0] < 0 ? -c[0] : c[0])
            ok = n == steps && finite && rel <= tol && erel <= tol && g[steps - 1] < g[0]
            printf "%s rel=%.3g eval_rel=%.3g tol=%.3g (%s) gpu %.5g->%.5g cpu %.5g->%.5g eval gpu %.5g cpu %.5g steps=%d\n",
                   ok ? "ok" : "FAIL", rel, erel, tol, how, g[0], g[steps - 1], c[0], c[steps - 1], ge, ce, n
        }' "$WORK/train-gpu.txt" "$WORK/train-cpu.txt")
    paste <(grep '^step' "$WORK/train-gpu.txt") <(grep '^step' "$WORK/train-cpu.txt") |
        awk 'BEGIN { print "step  gpu_loss  cpu_loss  diff" } { printf "%4d  %.7f  %.7f  %.3g\n", $2, $4, $8, $4 - $8 }' |
        tee "$OUT/train-compare.txt"
    ms_gpu=$(sed -n 's/^ms_per_step=\([0-9.]*\).*/\1/p' "$WORK/train-gpu.txt")
    ms_cpu=$(sed -n 's/^ms_per_step=\([0-9.]*\).*/\1/p' "$WORK/train-cpu.txt")
    row "train: $ARCH ${SIZE}px b$BATCH $STEPS steps GPU vs CPU" "${verdict%% *}" "${verdict#* }; ms/step gpu $ms_gpu cpu $ms_cpu"
    case $verdict in ok*) ;; *) failed=1 ;; esac
    say "training: $verdict"
else
    failed=1
    row "train: $ARCH ${SIZE}px b$BATCH $STEPS steps GPU vs CPU" FAIL "a run failed: see gpu-check.log"
fi
row "torch peer" info "${torch_line:-none}"

# 4b. mixed precision on the GPU: rn-train --amp fp16 and bf16 with the arch, size, batch
#     and number of steps of step 4, on a toy dataset of exactly one batch (two classes of
#     stripes; no augmentation, no shuffle, constant lr: every step sees the same images,
#     as in step 4). The losses must be finite and go down: the mean of the last 5 below
#     the mean of the first 5 (not last < first: fp16's loss scale may skip the first
#     steps, and one step's loss is noisy). Seconds on an H200.
amp_train() { # fp16|bf16: one run, one row
    local p=$1 name="train: --amp $1, $ARCH ${SIZE}px b$BATCH $STEPS steps" rc v
    rm -f "$A/$p.jsonl" "$A/$p.pb"
    timeout 60 "$BIN/rn-train" --device $DEV --amp "$p" --data "$A/train.lmdb" --in "$A/init.pb" --out "$A/$p.pb" \
        --epochs "$STEPS" --max-steps "$STEPS" --batch $BATCH --crop $SIZE --augment none --no-shuffle --workers 2 \
        --lr 0.01 --lr-schedule constant --log-every 1 --log "$A/$p.jsonl" >"$A/$p.err" 2>&1
    rc=$?
    grep -m 1 '^rn-train: .* on ' "$A/$p.err"
    if [ $rc != 0 ]; then
        failed=1
        tail -n 5 "$A/$p.err"
        row "$name" FAIL "rn-train exit $rc$([ $rc = 124 ] && echo ' (over 60 s)'): $(tail -n 1 "$A/$p.err" | cut -c1-200)"
        return
    fi
    v=$("$PYTHON" - "$A/$p.jsonl" "$STEPS" <<'PY'
import json, math, statistics, sys
steps = int(sys.argv[2])
S = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "step"]
L = [r.get("loss") for r in S]
bad = [i for i, x in enumerate(L) if not isinstance(x, (int, float)) or not math.isfinite(x)]
if len(S) != steps or bad or steps < 2:
    print(f"FAIL {len(S)} step lines of {steps}; non-finite loss at steps {bad[:5]}")
    sys.exit()
k = min(5, steps // 2)
first, last = sum(L[:k]) / k, sum(L[-k:]) / k
ips = statistics.median(r["img_s"] for r in S[1:])
print(f"{'ok' if last < first else 'FAIL'} loss {L[0]:.4g}->{L[-1]:.4g}, mean of the last {k} {last:.4g} "
      f"{'<' if last < first else 'not <'} first {k} {first:.4g}; loss scale {S[-1]['loss_scale']:g}, "
      f"{sum(r['skipped'] for r in S)} skipped; {ips:.0f} img/s")
PY
    ) || v="FAIL reading $A/$p.jsonl"
    row "$name" "${v%% *}" "${v#* }"
    case $v in ok*) ;; *) failed=1 ;; esac
    say "--amp $p: $v"
}
A=$WORK/amp
if [ $DEV = cpu ]; then
    for p in fp16 bf16; do
        row "train: --amp $p, $ARCH ${SIZE}px b$BATCH $STEPS steps" "not run" "needs a GPU (dry run: the CPU backend computes in fp32 only)"
    done
else
    say "$ARCH ${SIZE}x$SIZE batch $BATCH: $STEPS steps with rn-train --amp fp16 and bf16"
    if rm -rf "$A" && mkdir -p "$A" && "$PYTHON" tests/data/toy.py "$A/src" $((BATCH / 2)) 1 >"$A/setup.txt" 2>&1 &&
        "$BIN/rn-prep" -q "$A/src" "$A/train.lmdb" >>"$A/setup.txt" 2>&1 &&
        "$BIN/rn-init" --arch $ARCH --classes 2 --seed 1 -o "$A/init.pb" >>"$A/setup.txt" 2>&1; then
        amp_train fp16
        amp_train bf16
    else
        failed=1
        cat "$A/setup.txt"
        row "train: --amp fp16/bf16" FAIL "making the toy dataset or checkpoint failed: $(tail -n 1 "$A/setup.txt" | cut -c1-200)"
    fi
fi

# 4c. tests/amp.bats where the CUDA backend starts (its GPU tests skip elsewhere): rn-train
#     --amp as a user runs it: the loss scale logged and saved, overflowing steps skipped
#     and counted, exact resume, bf16 without a scale. Under a minute on an H200.
name="amp.bats (rn-train --amp on the GPU)"
if [ $DEV = cpu ]; then
    row "$name" "not run" "needs a GPU (dry run; its CPU tests run in make test)"
elif ! command -v bats >/dev/null; then
    row "$name" "not run" "bats is not installed (make deps; tests/gpu/device-run.sh brings its own)"
    say "amp.bats not run: no bats"
else
    say "tests/amp.bats"
    RN_BIN=$BIN RN_BUILD=$BUILD PYTHON=$PYTHON timeout 120 bats --tap tests/amp.bats \
        >"$OUT/amp-bats.txt" 2>&1
    cat "$OUT/amp-bats.txt"
    plan=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' "$OUT/amp-bats.txt" | head -n 1)
    n_ok=$(grep -c '^ok ' "$OUT/amp-bats.txt")
    n_bad=$(grep -c '^not ok ' "$OUT/amp-bats.txt")
    n_skip=$(grep -c '^ok .*# skip' "$OUT/amp-bats.txt")
    # its GPU tests skip when the CUDA backend did not start: here that is a failure
    n_gpu_skip=$(grep -c '^ok .*# skip no usable GPU' "$OUT/amp-bats.txt")
    skips=$(sed -n 's/^ok .*# skip //p' "$OUT/amp-bats.txt" | sort -u | paste -sd ';')
    if [ -n "$plan" ] && [ "$n_bad" = 0 ] && [ "$n_gpu_skip" = 0 ] && [ "$n_ok" = "$plan" ]; then
        row "$name" ok "$((n_ok - n_skip)) passed, $n_skip skipped${skips:+ ($skips)}"
    else
        failed=1
        row "$name" FAIL "${plan:-?} tests: $((n_ok - n_skip)) passed, $n_bad failed, $n_skip skipped ($n_gpu_skip for no GPU); see amp-bats.txt"
    fi
fi

# 4d. memory plan on the device: under a 1 MiB --mem-limit rn-train refuses, naming what
#     micro-batches of BATCH/4 and BATCH/2 need; under a limit between those two needs,
#     --micro-batch auto must take BATCH/4 (4 micro-batches) and train 2 steps, holding no
#     more memory than it planned ("network N MiB"; the plan counts the convolution
#     workspace at its limit, the net holds what cuDNN's chosen algorithms take). Seconds.
M=$WORK/mem
mib() { # "<value> <G|M>" -> MiB
    awk '{ printf "%.1f", $2 == "G" ? $1 * 1024 : $1 }'
}
mem_need() { # micro-batch -> MiB planned, from the refusal
    "$BIN/rn-train" --device $DEV --data "$M/train.lmdb" --in "$M/init.pb" --out "$M/never.pb" --batch $BATCH \
        --crop $SIZE --micro-batch "$1" --mem-limit 1M 2>&1 |
        sed -n 's/.* needs \([0-9.]*\) \([GM]\)iB of .*/\1 \2/p' | head -n 1 | mib
}
name="memory plan: --micro-batch auto, $ARCH ${SIZE}px b$BATCH"
say "$name"
if rm -rf "$M" && mkdir -p "$M" && "$PYTHON" tests/data/toy.py "$M/src" $BATCH 1 >"$M/setup.txt" 2>&1 &&
    "$BIN/rn-prep" -q "$M/src" "$M/train.lmdb" >>"$M/setup.txt" 2>&1 &&
    "$BIN/rn-init" --arch $ARCH --classes 2 --seed 1 -o "$M/init.pb" >>"$M/setup.txt" 2>&1; then
    q=$((BATCH / 4)) h=$((BATCH / 2))
    nq=$(mem_need $q) nh=$(mem_need $h)
    lim=$(awk -v a="${nq:-0}" -v b="${nh:-0}" 'BEGIN { printf "%dK", (a + b) / 2 * 1024 }')
    timeout 120 "$BIN/rn-train" --device $DEV --data "$M/train.lmdb" --in "$M/init.pb" --out "$M/auto.pb" \
        --batch $BATCH --crop $SIZE --micro-batch auto --mem-limit "$lim" --max-steps 2 --workers 2 >"$M/auto.err" 2>&1
    rc=$?
    cat "$M/auto.err"
    held=$(sed -n 's/.*, network \([0-9]*\) MiB.*/\1/p' "$M/auto.err" | head -n 1)
    detail="plans: micro-batch $q ${nq:-?} MiB, $h ${nh:-?} MiB; limit $lim; auto: $(grep -o "of $BATCH ([0-9]* x [0-9]*)" "$M/auto.err" | head -n 1), holds ${held:-?} MiB"
    if [ $rc = 0 ] && [ -n "$nq" ] && [ -n "$held" ] && grep -q "of $BATCH (4 x $q)" "$M/auto.err" &&
        awk -v a="$held" -v p="$nq" 'BEGIN { exit !(a <= p + 1) }'; then
        row "$name" ok "$detail"
    else
        failed=1
        row "$name" FAIL "$detail; rn-train exit $rc: $(tail -n 1 "$M/auto.err" | cut -c1-160)"
    fi
else
    failed=1
    row "$name" FAIL "making the toy dataset or checkpoint failed: $(tail -n 1 "$M/setup.txt" | cut -c1-200)"
fi

# 4e. data parallel over NCCL: one process through the collectives against the plain run,
#     two ranks against --accum 2, a hung rank named (tests/gpu/dist-check.sh says what
#     and when it leaves out). Seconds.
name="dist: RN_DIST_SOLO=1 vs plain; mpirun -np 2 rn-train vs --accum 2; a hung rank named, $ARCH ${SIZE}px b$BATCH"
say "$name"
BIN=$BIN WORK=$WORK/dist DEV=$DEV PYTHON=$PYTHON ARCH=$ARCH SIZE=$SIZE BATCH=$BATCH BUILD_LOG=$OUT/build.log \
    tests/gpu/dist-check.sh >"$OUT/dist.txt" 2>&1
cat "$OUT/dist.txt"
v=$(tail -n 1 "$OUT/dist.txt")
case $v in
    ok\ * | skipped\ *) row "$name" "${v%% *}" "${v#* }" ;;
    *) failed=1; row "$name" FAIL "${v#FAIL }; see dist.txt" ;;
esac

# 4f. activation recomputation: rn-train --recompute blocks against none, fp32 and fp16
#     (tests/gpu/recompute-check.sh says what). Seconds.
script_step "recompute: --recompute blocks vs none, $ARCH ${SIZE}px b$BATCH" recompute

# 4g. CUDA graphs: rn-train --cuda-graphs against the same run without, the same bits
#     (tests/gpu/graphs-check.sh says what). Seconds.
script_step "graphs: --cuda-graphs vs without, $ARCH ${SIZE}px b$BATCH" graphs


# 5. the tools end to end on the GPU: rn-train and rn-eval on the toy dataset train.bats
#    learns on the CPU (two classes of stripes), --device as a user gives it
say "rn-train and rn-eval --device $DEV on the toy dataset"
tools_ok=0
# (5b below) Find's choices go to a fresh cache file that a later process reads
export RN_CUDA_ALGO_CACHE=$WORK/algos.txt
rm -f "$RN_CUDA_ALGO_CACHE"
if (cd "$WORK" && rm -rf toy && "$PYTHON" "$OLDPWD/tests/data/toy.py" toy/train 64 1 &&
    "$PYTHON" "$OLDPWD/tests/data/toy.py" toy/val 32 2 &&
    "$BIN/rn-prep" -q toy/train toy/train.lmdb && "$BIN/rn-prep" -q --classes toy/train.lmdb toy/val toy/val.lmdb &&
    "$BIN/rn-init" --arch resnet18 --classes 2 --seed 1 -o toy/init.pb &&
    "$BIN/rn-train" --device $DEV --data toy/train.lmdb --val toy/val.lmdb --in toy/init.pb --out toy/e5.pb \
        --epochs 8 --batch 16 --crop 32 --workers 2 --lr 0.05 &&
    "$BIN/rn-eval" --device $DEV --data toy/val.lmdb --ckpt toy/e5.pb --crop 32 --json >toy/eval.json) \
    >"$WORK/tools.txt" 2>&1; then
    top1=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["top1"])' "$WORK/toy/eval.json" 2>/dev/null)
    awk -v t="${top1:-0}" 'BEGIN { exit !(t >= 0.95) }' && tools_ok=1
fi
grep -E '^rn-train: .* on ' "$WORK/tools.txt" | head -n 1
if [ $tools_ok = 1 ]; then
    row "rn-train/rn-eval --device $DEV, toy data, 8 epochs" ok "val top1 $top1 (>= 0.95)"
else
    failed=1
    tail -n 20 "$WORK/tools.txt"
    row "rn-train/rn-eval --device $DEV, toy data, 8 epochs" FAIL "top1 ${top1:-none}; see gpu-check.log"
fi

# 5b. the algorithm cache: rn-train and rn-eval above searched and wrote their choices; a
#     second rn-train on the same shapes must start from them (its start-up line counts
#     them) and search nothing new (the file does not grow)
name="algorithm cache (RN_CUDA_ALGO_CACHE)"
if [ "$DEV" != cuda ]; then
    row "$name" "not run" "needs a GPU (the CPU backend has no algorithms to choose)"
elif [ $tools_ok = 1 ] && [ -s "$RN_CUDA_ALGO_CACHE" ]; then
    lines=$(wc -l <"$RN_CUDA_ALGO_CACHE")
    (cd "$WORK" && "$BIN/rn-train" --device cuda --data toy/train.lmdb --in toy/e5.pb --out toy/e6.pb \
        --epochs 1 --batch 16 --crop 32 --workers 2 --lr 0.05 >toy/again.out 2>&1)
    rc=$?
    seen=$(grep -o 'algorithm cache [^;]*: [0-9]* choices*' "$WORK/toy/again.out" | head -n 1)
    after=$(wc -l <"$RN_CUDA_ALGO_CACHE")
    if [ $rc = 0 ] && [ "${seen##*: }" = "$lines choices" ] && [ "$after" = "$lines" ]; then
        row "$name" ok "$lines choices written; the next rn-train read them all and searched nothing new"
    else
        failed=1
        row "$name" FAIL "$lines lines, then $after; second rn-train exit $rc, said '${seen:-no cache line}'"
    fi
else
    failed=1
    row "$name" FAIL "no cache file written at $RN_CUDA_ALGO_CACHE"
fi
unset RN_CUDA_ALGO_CACHE

# 5c. GPU utilisation in the log and --profile by CUDA events (#15): two epochs with
#     --log-every 1 on step 5's toy set: where NVML answers, every step line has gpu_util
#     in 0..100 and gpu_mem_used > 0 and the progress lines show "GPU N%" (without NVML:
#     said once, reported as not run); then --profile: the trace is valid JSON, its compute
#     track is "compute stream (events)" with one event or more per layer and direction,
#     the "copy stream (events)" track holds the batches' h2d copies, every duration >= 0.
#     Seconds.
name="GPU utilisation in the log (NVML), --profile by CUDA events"
say "$name"
if [ "$DEV" != cuda ]; then
    row "$name" "not run" "needs a GPU (a CPU run logs no gpu fields: tests/troubleshoot.bats)"
elif [ $tools_ok != 1 ]; then
    failed=1
    row "$name" FAIL "step 5 made no toy data"
else
    (cd "$WORK" && rm -f toy/gpu.jsonl && "$BIN/rn-train" --device cuda --data toy/train.lmdb --in toy/init.pb \
        --out toy/gpu.pb --epochs 2 --batch 16 --crop 32 --workers 2 --log-every 1 --log toy/gpu.jsonl &&
        "$BIN/rn-train" --device cuda --data toy/train.lmdb --in toy/init.pb --out toy/prof.pb --batch 16 \
        --crop 32 --workers 2 --profile toy/prof.txt) >"$WORK/toy/gpu.out" 2>&1
    rc=$?
    verdict=$("$PYTHON" - "$WORK/toy" <<'PYEOF' 2>&1
import json, sys
d = sys.argv[1]
S = [l for l in map(json.loads, open(d + "/gpu.jsonl")) if l["kind"] == "step"]
out = open(d + "/gpu.out").read()
tr = json.load(open(d + "/prof.txt.json"))["traceEvents"]
names = [e["args"]["name"] for e in tr if e.get("name") == "thread_name"]
X = [e for e in tr if e.get("ph") == "X"]
assert "compute stream (events)" in names, names
# the batches' uploads on the copy stream (a GPU stages every batch through it)
assert "copy stream (events)" in names and any(e["name"] == "h2d" and e["tid"] == 3 for e in X), names
assert X and all(e["dur"] >= 0 for e in X), "an event with a negative duration"
rows = open(d + "/prof.txt").read().splitlines()[-1]
if not any("gpu_util" in l for l in S):
    assert out.count("GPU utilisation is not logged") == 1, "no gpu fields and nothing said"
    print("NVML: not run (" + out.split("GPU utilisation is not logged")[1].split("\n")[0].strip(" :(") + "); profile:", rows)
    sys.exit(0)
U = [l["gpu_util"] for l in S]
assert len(U) == len(S), "a step line without gpu_util"
assert all(0 <= u <= 100 for u in U), U
assert all(l["gpu_mem_used"] > 0 for l in S), "gpu_mem_used"
assert " GPU " in out, "no GPU %% on the progress lines"
P = [l["gpu_power_w"] for l in S if "gpu_power_w" in l]
print("%d lines, util mean %.0f%% (min %.0f), mem %.0f MiB, power %s W; profile: %s" % (len(U), sum(U) / len(U),
      min(U), S[-1]["gpu_mem_used"] / 2**20, "%.0f" % (sum(P) / len(P)) if P else "n/a", rows))
PYEOF
)
    vrc=$?
    say "$verdict"
    if [ $rc = 0 ] && [ $vrc = 0 ]; then
        row "$name" ok "$verdict"
    else
        failed=1
        tail -n 20 "$WORK/toy/gpu.out"
        row "$name" FAIL "rn-train exit $rc; $verdict"
    fi
fi

# 6. rn-train --tensorboard as TensorBoard itself reads it: two invocations, epoch by epoch
#    as the pipelines run them (--amp fp16 on the GPU, so the loss scale is logged too), on
#    step 5's toy dataset into one folder, loaded with tensorboard's EventAccumulator
#    (tests/gpu/tb_check.py) and compared with rn-info's reading and the JSONL log: the
#    same tags, steps and float32 values, steps strictly increasing, run/flags in the text
#    plugin. Skipped, saying so, where this python has no tensorboard package. Seconds.
name="tensorboard: EventAccumulator reads rn-train --tensorboard"
say "$name"
TB=$WORK/tb
tb_amp=() tb_scale=0
[ $DEV = cuda ] && tb_amp=(--amp fp16) tb_scale=1
tb_runs() {
    local e in=$WORK/toy/init.pb
    for e in 1 2; do
        "$BIN/rn-train" --device $DEV "${tb_amp[@]}" --data "$WORK/toy/train.lmdb" --val "$WORK/toy/val.lmdb" \
            --in "$in" --out "$TB/e$e.pb" --epochs 1 --batch 16 --crop 32 --workers 2 --log-every 2 \
            --log "$TB/train.jsonl" --tensorboard "$TB/events" || return 1
        in=$TB/e$e.pb
    done
    "$BIN/rn-info" "$TB/events" >"$TB/rn-info.txt"
}
rm -rf "$TB" && mkdir -p "$TB"
if [ ! -d "$WORK/toy/train.lmdb" ] || [ ! -f "$WORK/toy/init.pb" ]; then
    failed=1
    row "$name" FAIL "step 5's toy dataset is missing"
elif ! tb_runs >"$TB/train.txt" 2>&1; then
    failed=1
    tail -n 10 "$TB/train.txt"
    row "$name" FAIL "rn-train or rn-info failed: $(tail -n 1 "$TB/train.txt" | cut -c1-200)"
else
    "$PYTHON" tests/gpu/tb_check.py "$TB/events" "$TB/rn-info.txt" "$TB/train.jsonl" $tb_scale >"$TB/check.txt" 2>"$TB/check.err"
    cat "$TB/check.txt"
    v=$(tail -n 1 "$TB/check.txt")
    [ -n "$v" ] || v="FAIL tb_check.py printed nothing: $(tail -n 1 "$TB/check.err" | cut -c1-200)"
    case $v in
        ok\ * | skipped\ *) row "$name" "${v%% *}" "${v#* }; $(ls "$TB/events" | wc -l) files, $(cat "$TB"/events/* | wc -c) bytes" ;;
        *) failed=1; row "$name" FAIL "${v#FAIL }; see work/tb/check.txt" ;;
    esac
    say "tensorboard: $v"
fi

# 7. cuDNN statuses injected (RN_CUDA_INJECT): the fall-backs, and the stops that name the
#    call (tests/gpu/inject-check.sh says which). Seconds.
script_step "cuDNN statuses injected: Find's and BN's fall-backs, $ARCH ${SIZE}px b$BATCH" inject

row "not run" - "the benchmark: make bench-gpu (tests/gpu/device-run.sh runs it after this)"
echo
cat "$RES"
say "$( [ $failed = 0 ] && echo passed || echo FAILED ) in $(($(date +%s) - t_start)) s; results in $RES"
exit $failed
