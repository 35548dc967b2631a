#!/usr/bin/env bash
# make bench-dist: data-parallel training on the CPU, rn-train under mpirun against
# PyTorch's DistributedDataParallel over gloo (tests/bench/dist_peer.py), the same model,
# image size and global batch as bench-cpu's cpu-train line (ResNet-50, 64x64, batch 32),
# NP ranks of one compute thread each. Lines:
#   dist-cpu-<NP>rank: rn=<img/s> peer=<img/s> ratio=<rn/peer>
#   dist-cpu-scaling: rn<NP>rank=<img/s> rn1proc<NP>thr=<img/s> ratio=<r>
# the second being rn on NP ranks over rn as one process of NP threads, the same global
# batch: what the rank-ordered gradient sum and the split into processes cost (1 is free).
#
# Timing, identical on both sides: rank 0's wall time of each step, from the end of the
# previous step to the end of this one (rn: the img_s of each step line of rn-train's
# --log with --log-every 1, a step's time being BATCH / img_s; the peer: perf_counter
# around each step), summed over STEPS steps after WARMUP; img/s = STEPS * BATCH / sum.
# Both ranks' processes start alike (mpirun --bind-to none, the peer unbound too).
# The peer trains on a fixed random batch in memory; rn reads a generated 64x64 dataset
# through its loader (one worker thread per rank, --augment none: decode and copy only),
# so rn does a little more work per step than the peer. The best of ROUNDS alternating
# rounds counts, as in bench-cpu. Knobs: NP, WARMUP, STEPS, ROUNDS, MPIRUN, MPIFLAGS, DIR
# (the dataset and logs, default $BUILD/bench-dist); DRY=1 checks the script in seconds
# (ResNet-18, 16x16, batch 4, one round of 1 + 1 steps: its numbers mean nothing).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
BIN=$BUILD/bin
NP=${NP:-2}
ARCH=resnet50
SIZE=64
BATCH=32
WARMUP=${WARMUP:-2}
STEPS=${STEPS:-6}
ROUNDS=${ROUNDS:-2}
if [ "${DRY:-0}" = 1 ]; then ARCH=resnet18 SIZE=16 BATCH=4 WARMUP=1 STEPS=1 ROUNDS=1; fi
MPIRUN=${MPIRUN:-mpirun}
# --oversubscribe only where NP is more than the cores (mpirun refuses it otherwise)
MPIFLAGS=${MPIFLAGS:---bind-to none$([ "$(nproc)" -ge "$NP" ] || echo ' --oversubscribe')}
DIR=${DIR:-$BUILD/bench-dist}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
best() { awk -v a="$1" -v b="$2" 'BEGIN { print (a + 0 > b + 0) ? a : b }'; }
field() { sed -n "s|.*$1=\([0-9.]*\).*|\1|p"; }
note() { echo "# $*" >&2; }

if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if ! command -v "$MPIRUN" >/dev/null; then
    echo "bench-dist: skipped: no $MPIRUN (make deps installs Open MPI)"
    exit 0
fi

# WARMUP + STEPS batches within one epoch, so no epoch's end falls in a timed step
mkdir -p "$DIR"
n=$(((WARMUP + STEPS) * BATCH))
if [ "$(cat "$DIR/data.stamp" 2>/dev/null)" != "$n $SIZE" ]; then
    rm -rf "$DIR/imgs" "$DIR/data.lmdb" "$DIR/data.stamp"
    "$PYTHON" tests/data/mkimages.py folder "$DIR/imgs" --classes 8 --per-class $(((n + 7) / 8)) \
        --size "${SIZE}x$SIZE" --seed 0
    "$BIN/rn-prep" -q "$DIR/imgs" "$DIR/data.lmdb" >&2
    echo "$n $SIZE" >"$DIR/data.stamp"
fi
# 1000 classes, as the peer's model (and bench-cpu's)
"$BIN/rn-init" --arch "$ARCH" --classes 1000 --seed 1 -o "$DIR/init.pb"

# rn_run NAME LAUNCHER... -- RN-TRAIN FLAGS...: the img/s of rank 0's log (above)
rn_run() {
    local name=$1 launch=()
    shift
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    rm -f "$DIR/$name.jsonl"
    "${launch[@]}" "$BIN/rn-train" --device cpu --data "$DIR/data.lmdb" --in "$DIR/init.pb" \
        --out "$DIR/$name.pb" --epochs 1 --max-steps $((WARMUP + STEPS)) --batch "$BATCH" \
        --crop "$SIZE" --resize 0 --augment none --workers 1 --lr 0.01 --log-every 1 \
        --log "$DIR/$name.jsonl" "$@" 2>"$DIR/$name.err" ||
        { echo "bench-dist: $name: rn-train failed: $(tail -n 3 "$DIR/$name.err")" >&2; return 1; }
    awk -v w="$WARMUP" -v s="$STEPS" -v b="$BATCH" '/"kind":"step"/ { n++
            if (n > w && n <= w + s) { match($0, /"img_s":[0-9.]+/); v = substr($0, RSTART + 8, RLENGTH - 8)
                t += b / v; list = list (list ? "," : "") sprintf("%.3f", b / v) } }
        END { if (n >= w + s && t > 0) printf "img/s=%.2f step_s=%s\n", s * b / t, list }' "$DIR/$name.jsonl"
}

note "$ARCH, ${SIZE}x$SIZE, global batch $BATCH, $NP ranks x 1 thread, $WARMUP warm-up + $STEPS timed steps, best of $ROUNDS rounds; $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg); $MPIRUN $MPIFLAGS"
ri=0 pi=0 si=0
for round in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086 # MPIFLAGS is a list of flags
    r=$(rn_run "rn-${NP}rank" "$MPIRUN" -np "$NP" $MPIFLAGS -- --threads 1)
    p=$("$PYTHON" tests/bench/dist_peer.py "$NP" "$ARCH" "$SIZE" "$BATCH" "$WARMUP" "$STEPS")
    s=$(rn_run "rn-1proc" env -- --threads "$NP")
    for v in "$r" "$p" "$s"; do
        case $v in img/s=*) ;; *) echo "bench-dist: round $round: a run gave no img/s (logs in $DIR)" >&2; exit 1 ;; esac
    done
    note "round $round (load $(cut -d' ' -f1 /proc/loadavg)) rn ${NP} ranks: $r"
    note "round $round peer DDP ${NP} ranks: $p"
    note "round $round rn 1 process, $NP threads: $s"
    ri=$(best "$ri" "$(field img/s <<<"$r")")
    pi=$(best "$pi" "$(field img/s <<<"$p")")
    si=$(best "$si" "$(field img/s <<<"$s")")
done
rm -f "$DIR"/rn-*.pb
echo "dist-cpu-${NP}rank: rn=$ri peer=$pi ratio=$(ratio "$ri" "$pi")"
echo "dist-cpu-scaling: rn${NP}rank=$ri rn1proc${NP}thr=$si ratio=$(ratio "$ri" "$si")"
