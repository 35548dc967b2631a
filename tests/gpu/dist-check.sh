#!/usr/bin/env bash
# gpu-check step 4e: data parallelism over NCCL. First one process through the collectives
# (mpirun -np 1 with RN_DIST_SOLO=1: a NCCL communicator of one, every gradient bucket
# through rn_backend_coll_*, the BN statistics, loss and stop flag over MPI): --accum 1 must
# give the tensors of the plain run bit for bit, --accum 2 within the tolerance below (the
# sum's running sums add what the backward's accumulation adds inside cuDNN). Then, with 2
# or more GPUs, `mpirun -np 2 rn-train --batch B` (each
# rank on its own GPU, the gradients summed by rn_backend_coll_sum) must train the weights
# of one process with --accum 2 (micro-batches of B/2, the same halves of each batch, BN
# statistics per half) within the fp32 tolerance train.bats gives --accum: 1e-5 relative
# per tensor (tests/parity/ckpt_close.py), with --deterministic so that both runs choose
# their convolution algorithms alike. Then a hung rank (SIGSTOP) must be named by rank 0
# (whose wait is then most likely NCCL's) within --dist-timeout. rn-gpuinfo --nccl runs
# first (its preflight table, or its skip line on one GPU).
#
# NCCL refuses two ranks of one communicator on the same GPU (ncclInvalidUsage, "Duplicate
# GPU detected", since NCCL 2.5; NVIDIA/nccl#418: it would not work even without the
# check), so with fewer than 2 GPUs the 2-rank comparison is left out and the verdict says
# so; without mpirun or a build with Open MPI and NCCL the whole step is skipped. DEV=cpu
# (gpu-check's dry run) runs the same comparisons on the CPU backend, whose sum goes over
# MPI: a check of this script.
#
# Environment: BIN (the tools), WORK (a scratch folder, emptied), DEV (cuda or cpu),
# PYTHON, ARCH, SIZE, BATCH (even), STEPS (default 5), BUILD_LOG (the build's log, for its
# summary line). Everything said goes to stdout; the last line is the verdict,
# "ok|FAIL|skipped <detail>". Exit 0 for ok and skipped, 1 for FAIL.
set -u
cd "$(dirname "$0")/../.." || exit 1
DEV=${DEV:-cuda} PYTHON=${PYTHON:-python3} ARCH=${ARCH:-resnet50} SIZE=${SIZE:-64} BATCH=${BATCH:-32}
STEPS=${STEPS:-5} TOL=1e-5
verdict() { echo "$1 $2"; [ "$1" = FAIL ] && exit 1; exit 0; }
# a failed run's own last message, not mpirun's closing banner
why() { { grep -E '^(rn-train|rank [0-9]+):' "$1" || tail -n 1 "$1"; } | tail -n 1 | cut -c1-200; }

[ -n "${BIN:-}" ] && [ -n "${WORK:-}" ] || verdict FAIL "dist-check.sh: BIN and WORK must be set"
rm -rf "$WORK" && mkdir -p "$WORK" || verdict FAIL "cannot create $WORK"

if [ "$DEV" = cuda ]; then
    echo "rn-gpuinfo --nccl:"
    "$BIN/rn-gpuinfo" --nccl >"$WORK/gpuinfo-nccl.txt" 2>&1
    nrc=$?
    cat "$WORK/gpuinfo-nccl.txt"
    [ $nrc = 0 ] || verdict FAIL "rn-gpuinfo --nccl exit $nrc: $(tail -n 1 "$WORK/gpuinfo-nccl.txt" | cut -c1-200)"
    ngpu=$("$BIN/rn-gpuinfo" --json 2>/dev/null |
        "$PYTHON" -c 'import json,sys; print(sum(d["usable"] for d in json.load(sys.stdin)["devices"]))' 2>/dev/null)
fi
summary=$(grep -m 1 '^rn ' "${BUILD_LOG:-/dev/null}" 2>/dev/null)
if [ -n "$summary" ]; then
    case $summary in *"Open MPI"*) ;; *) verdict skipped "this build has no MPI: $summary" ;; esac
    [ "$DEV" = cpu ] || case $summary in *NCCL*) ;; *) verdict skipped "this build has no NCCL: $summary" ;; esac
fi
command -v mpirun >/dev/null || verdict skipped "no mpirun on PATH (Open MPI: make deps installs openmpi-bin)"

if ! { "$PYTHON" tests/data/toy.py "$WORK/src" "$BATCH" 1 &&
    "$BIN/rn-prep" -q "$WORK/src" "$WORK/train.lmdb" &&
    "$BIN/rn-init" --arch "$ARCH" --classes 2 --seed 1 -o "$WORK/init.pb"; } >"$WORK/setup.txt" 2>&1; then
    cat "$WORK/setup.txt"
    verdict FAIL "making the toy dataset or checkpoint failed: $(tail -n 1 "$WORK/setup.txt" | cut -c1-200)"
fi
T=(--device "$DEV" --data "$WORK/train.lmdb" --in "$WORK/init.pb" --batch "$BATCH" --crop "$SIZE" --augment none
    --no-shuffle --workers 2 --lr 0.01 --lr-schedule constant --max-steps "$STEPS" --epochs "$STEPS" --deterministic)
[ "$DEV" = cpu ] && T+=(--threads 2)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tensors() { "$BIN/rn-info" --tensors "$1" | sed -n '/^tensors:/,$p'; }
# close A B: whether the two checkpoints' tensors are within TOL (ckpt_close.py's words in $cmp)
close() {
    local r
    for r in "$1" "$2"; do
        "$BIN/rn-export" "$WORK/$r.pb" "$WORK/$r.safetensors" >>"$WORK/setup.txt" 2>&1 ||
            verdict FAIL "rn-export $r.pb: $(tail -n 1 "$WORK/setup.txt" | cut -c1-200)"
    done
    cmp=$(PYTHONPATH=tests/parity "$PYTHON" tests/parity/ckpt_close.py "$WORK/$1.safetensors" "$WORK/$2.safetensors" \
        $TOL 2>&1)
}
# one process through the many-process path (RN_DIST_SOLO=1: on a GPU a NCCL communicator
# of one, every bucket through rn_backend_coll_*): --accum 1 the bits of the plain run;
# --accum 2 (the sum's running sums against the backward's accumulation) within TOL
for a in 1 2; do
    echo "rn-train ${T[*]} --accum $a, plain and under mpirun -np 1 with RN_DIST_SOLO=1"
    timeout 300 "$BIN/rn-train" "${T[@]}" --accum $a --out "$WORK/plain$a.pb" >"$WORK/plain$a.err" 2>&1 ||
        { cat "$WORK/plain$a.err"; verdict FAIL "rn-train --accum $a: $(why "$WORK/plain$a.err")"; }
    timeout 300 mpirun -np 1 -x RN_DIST_SOLO=1 "$BIN/rn-train" "${T[@]}" --accum $a --out "$WORK/solo$a.pb" \
        --log "$WORK/solo$a.jsonl" >"$WORK/solo$a.err" 2>&1
    rc=$?
    cat "$WORK/solo$a.err"
    [ $rc = 0 ] || verdict FAIL "RN_DIST_SOLO=1 mpirun -np 1 rn-train --accum $a exit $rc: $(why "$WORK/solo$a.err")"
    grep -q '"buckets":[1-9]' "$WORK/solo$a.jsonl" || verdict FAIL "RN_DIST_SOLO=1 --accum $a: no bucket in its log"
done
diff <(tensors "$WORK/plain1.pb") <(tensors "$WORK/solo1.pb") >"$WORK/solo1.diff" ||
    verdict FAIL "RN_DIST_SOLO=1 --accum 1: not the bits of the plain run ($(grep -c '^>' "$WORK/solo1.diff") tensors differ)"
close plain2 solo2
rc=$?
echo "$cmp"
[ $rc = 0 ] || verdict FAIL "RN_DIST_SOLO=1 --accum 2: $(tail -n 1 <<<"$cmp" | cut -c1-200)"
solo="one process through the collectives: the plain run's bits (--accum 1), within $TOL (--accum 2)"
if [ "$DEV" = cuda ] && [ "${ngpu:-0}" -lt 2 ]; then
    verdict ok "$solo; 2 ranks: ${ngpu:-0} usable GPU, NCCL refuses two ranks on one GPU (ncclInvalidUsage 'Duplicate GPU detected', NCCL >= 2.5): needs 2 or more"
fi

# the same run twice but for how the batch is split: over two processes, or two
# micro-batches (plain2, the run above)
echo "mpirun -np 2 rn-train ${T[*]} --out $WORK/dist.pb"
timeout 300 mpirun -np 2 --oversubscribe "$BIN/rn-train" "${T[@]}" --out "$WORK/dist.pb" >"$WORK/dist.err" 2>&1
rc=$?
cat "$WORK/dist.err"
[ $rc = 0 ] || verdict FAIL "mpirun -np 2 rn-train exit $rc$([ $rc = 124 ] && echo ' (over 300 s)'): $(why "$WORK/dist.err")"
close dist plain2
rc=$?
echo "$cmp"
[ $rc = 0 ] || verdict FAIL "2 ranks, $STEPS steps: $(tail -n 1 <<<"$cmp" | cut -c1-200)"
two="$solo; 2 ranks, $STEPS steps: $(tail -n 1 <<<"$cmp")"

# a hung rank while the others wait, most likely in the gradients' NCCL sum: rank 0 must
# name it (the heartbeats go on from inside the backend's NCCL waits), the job end within
# --dist-timeout and a few seconds. P ranks, one per GPU (3 where there are 3: one that
# waits with rank 0 must not be named), the last one stopped (SIGSTOP) after step 2.
# (the batch a multiple of P; the run as long as it must be, under a timeout of its own)
P=2
[ "$DEV" = cuda ] && [ "${ngpu:-0}" -ge 3 ] && P=3
echo "mpirun -np $P rn-train (--dist-timeout 5), rank $((P - 1)) stopped after step 2"
timeout 120 mpirun -np $P --oversubscribe "$BIN/rn-train" "${T[@]}" --batch $((BATCH / P * P)) --max-steps 100000 \
    --epochs 1000 --log-every 1 --dist-timeout 5 --out "$WORK/hung.pb" >"$WORK/hung.err" 2>&1 &
tpid=$!
for _ in $(seq 1 600); do
    grep -q "step 3 " "$WORK/hung.err" && break
    kill -0 $tpid 2>/dev/null || break
    sleep 0.1
done
victim=
mpid=$(pgrep -P $tpid mpirun)
for p in $(pgrep -P "${mpid:-0}" rn-train); do
    tr '\0' '\n' <"/proc/$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$((P - 1))" && victim=$p
done
[ -n "$victim" ] && kill -STOP "$victim"
[ -n "$victim" ] || kill $tpid 2>/dev/null
t0=$SECONDS
wait $tpid
rc=$?
took=$((SECONDS - t0))
[ -n "$victim" ] && kill -9 "$victim" 2>/dev/null
cat "$WORK/hung.err"
[ -n "$victim" ] || verdict FAIL "$two; hung rank: no rank $((P - 1)) found under mpirun (did the run reach step 3?): $(why "$WORK/hung.err")"
[ $rc != 124 ] || verdict FAIL "$two; hung rank: the job still ran after 120 s (rank $((P - 1)) stopped)"
[ $rc != 0 ] || verdict FAIL "$two; hung rank: mpirun exited 0"
named=$(grep -E "^rank 0: no answer from the other ranks for [0-9]+ s in .*: rank $((P - 1)) silent for [0-9]+ s: it died or hangs; stopping" \
    "$WORK/hung.err" | sed -E 's/^rank 0: no answer from the other ranks for [0-9]+ s in (.*) \(--dist-timeout.*$/\1/')
[ -n "$named" ] || verdict FAIL "$two; hung rank: rank 0 did not name rank $((P - 1)): $(why "$WORK/hung.err")"
[ $took -le 30 ] || verdict FAIL "$two; hung rank: the job took $took s to end (--dist-timeout 5)"
verdict ok "$two; rank $((P - 1)) of $P hung (stopped), named by rank 0 in $named; the job ended in $took s"
