#!/usr/bin/env bash
# gpu-check step 7: the fall-backs on cuDNN statuses, through RN_CUDA_INJECT (each call of
# a kind returns the given status instead of running). Every run is STEPS steps of
# rn-train --deterministic from one checkpoint:
#   - Find out of device memory (find=4004, CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED):
#     the heuristic chooses instead; the run trains, and the algorithm cache it was given
#     stays empty (only Find's timed choices are kept);
#   - Find with a fatal status (find=2000, CUDNN_STATUS_BAD_PARAM): the run stops, exit
#     non-zero, naming cudnnFindConvolution and the status, and writes no checkpoint;
#   - RN_CUDA_BN=cudnn under --amp fp16 with the fused BN refusing every shape
#     (bn=3002, CUDNN_STATUS_NOT_SUPPORTED_SHAPE): rn's kernels run every BN, so the
#     checkpoint is the bits of RN_CUDA_BN=own;
#   - RN_CUDA_BN=cudnn with its backward refusing (bn-bwd=3002): cuDNN's forward, rn's
#     backward (which reads y where cuDNN's reserve holds its own state); the run trains;
#   - RN_CUDA_BN=cudnn with the fused BN out of memory (bn=4004): no fall-back there (it
#     is not a shape matter): the run stops naming cudnnBatchNormalizationForwardTrainingEx.
# DEV=cpu (gpu-check's dry run) checks this script: the CPU backend calls no cuDNN, so it
# checks only that a malformed RN_CUDA_INJECT is refused (exit 2, saying the form).
#
# Environment: BIN (the tools), WORK (a scratch folder, emptied), DEV (cuda or cpu),
# PYTHON, ARCH, SIZE, BATCH, STEPS (default 3). Everything said goes to stdout; the last
# line is the verdict, "ok|FAIL <detail>". Exit 0 for ok, 1 for FAIL.
set -u
cd "$(dirname "$0")/../.." || exit 1
STEPS=${STEPS:-3}
# shellcheck source=tests/gpu/step-setup.sh
. tests/gpu/step-setup.sh

# the last line a run said of its own (not the progress lines)
said() { grep -v '^epoch ' "$1" | tail -n 1 | cut -c1-200; }
# NAME CALL WHAT AMP: a run that must stop (its exit status into stopped), naming CALL,
# writing no checkpoint; WHAT says which in a verdict
must_stop() {
    local name=$1 call=$2 what=$3
    train "$WORK/$name" "$4"
    stopped=$?
    cat "$WORK/$name.err"
    [ $stopped != 0 ] || verdict FAIL "$what: rn-train exit 0 where it must stop"
    grep -q "$call" "$WORK/$name.err" || verdict FAIL "$what: the message does not name $call: $(said "$WORK/$name.err")"
    [ ! -e "$WORK/$name.pb" ] || verdict FAIL "$what: a checkpoint was written"
}

if [ "$DEV" = cpu ]; then
    RN_CUDA_INJECT=find=oom train "$WORK/bad" off
    rc=$?
    cat "$WORK/bad.err"
    [ $rc = 2 ] || verdict FAIL "RN_CUDA_INJECT=find=oom: exit $rc, where 2 (a malformed variable) was due"
    grep -q "RN_CUDA_INJECT='find=oom': expected KIND=STATUS" "$WORK/bad.err" ||
        verdict FAIL "RN_CUDA_INJECT=find=oom: not refused by name: $(said "$WORK/bad.err")"
    verdict ok "dry run: a malformed RN_CUDA_INJECT refused (exit 2); the fall-backs need cuDNN"
fi

detail=""
# Find out of memory: the heuristic, nothing cached
RN_CUDA_ALGO_CACHE=$WORK/algos.txt RN_CUDA_INJECT=find=4004 train "$WORK/find-oom" off
rc=$?
cat "$WORK/find-oom.err"
[ $rc = 0 ] || verdict FAIL "find=4004: rn-train exit $rc (Find out of memory must give way to the heuristic): $(said "$WORK/find-oom.err")"
grep -q "cuDNN statuses injected (RN_CUDA_INJECT)" "$WORK/find-oom.err" ||
    verdict FAIL "find=4004: the start-up line does not say RN_CUDA_INJECT is on"
[ ! -s "$WORK/algos.txt" ] || verdict FAIL "find=4004: the heuristic's choices went to the algorithm cache ($(wc -l <"$WORK/algos.txt") lines)"
detail="find=4004: trained on the heuristic, nothing cached"

# Find failing for good: stop, name it
RN_CUDA_ALGO_CACHE=off RN_CUDA_INJECT=find=2000 must_stop find-bad cudnnFindConvolution find=2000 off
detail="$detail; find=2000: exit $stopped naming cudnnFindConvolution"

# the fused BN refusing every shape: rn's BN throughout, the bits of RN_CUDA_BN=own
export RN_CUDA_ALGO_CACHE=off
RN_CUDA_BN=own train "$WORK/bn-own" fp16
rc=$?
[ $rc = 0 ] || { cat "$WORK/bn-own.err"; verdict FAIL "RN_CUDA_BN=own --amp fp16: exit $rc: $(said "$WORK/bn-own.err")"; }
RN_CUDA_BN=cudnn RN_CUDA_INJECT=bn=3002 train "$WORK/bn-refused" fp16
rc=$?
cat "$WORK/bn-refused.err"
[ $rc = 0 ] || verdict FAIL "RN_CUDA_BN=cudnn bn=3002: exit $rc (a refused shape must run rn's BN): $(said "$WORK/bn-refused.err")"
for r in bn-own bn-refused; do
    "$BIN/rn-export" "$WORK/$r.pb" "$WORK/$r.safetensors" >>"$WORK/setup.txt" 2>&1 || verdict FAIL "rn-export $r.pb failed"
done
cmp -s "$WORK/bn-own.safetensors" "$WORK/bn-refused.safetensors" ||
    verdict FAIL "RN_CUDA_BN=cudnn with every shape refused: not the bits of RN_CUDA_BN=own"
detail="$detail; bn=3002: the bits of RN_CUDA_BN=own"

# its backward refusing: cuDNN's forward, rn's backward
RN_CUDA_BN=cudnn RN_CUDA_INJECT=bn-bwd=3002 train "$WORK/bwd-refused" fp16 --log "$WORK/bwd-refused.jsonl"
rc=$?
cat "$WORK/bwd-refused.err"
[ $rc = 0 ] || verdict FAIL "RN_CUDA_BN=cudnn bn-bwd=3002: exit $rc: $(said "$WORK/bwd-refused.err")"
loss=$(grep -o '"loss":[^,]*' "$WORK/bwd-refused.jsonl" | tail -n 1 | cut -d: -f2)
awk -v l="${loss:-nan}" 'BEGIN { exit !(l + 0 == l && l > 0 && l < 100) }' ||
    verdict FAIL "RN_CUDA_BN=cudnn bn-bwd=3002: last loss ${loss:-none}"
detail="$detail; bn-bwd=3002: trained (loss $loss)"

# the fused BN out of memory: no fall-back, named
RN_CUDA_BN=cudnn RN_CUDA_INJECT=bn=4004 must_stop bn-oom cudnnBatchNormalizationForwardTrainingEx \
    "RN_CUDA_BN=cudnn bn=4004" fp16
verdict ok "$ARCH ${SIZE}px b$BATCH, $STEPS steps: $detail; bn=4004: exit $stopped naming the call"
