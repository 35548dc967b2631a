#!/usr/bin/env bash
# make bench-cpu: ResNet-50 on the CPU, rn against PyTorch (same threads, batch, size),
# side by side. Lines: <name>: rn=<value> peer=<value> ratio=<r>, higher is better
# (for memory the ratio is peer/rn). The last line is cpu-train at 64x64 batch 32.
#
# OpenBLAS's kernel (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE, or what it detects) changes the
# speed of whatever runs through OpenBLAS: rn's GEMMs only under RN_CPU_GEMM=openblas or on
# a CPU without AVX2 and FMA (rn's own kernel otherwise), and a forced kernel can slow one
# side far more than the other. The log names the kernel each side ran. When the environment sets OPENBLAS_* variables, the
# lines are given twice: as the environment is (names ending -env), then with every
# OPENBLAS_* variable unset for rn and peer alike (the plain names, the fair comparison).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-2}
STEPS=${STEPS:-4}
body=$BUILD/tests/bench_cpu_step
field() { sed -n "s|.*$1=\([0-9.]*\).*|\1|p"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

# rn and the peer run alternately ROUNDS times and the best run of each counts: on a
# shared machine that is the run least disturbed by other work (as bench-loader does).
ROUNDS=${ROUNDS:-2}
best() { awk -v a="$1" -v b="$2" 'BEGIN { print (a + 0 > b + 0) ? a : b }'; }

# the environment for both sides: as it is, or without OPENBLAS_* (run_all's argument)
blas_vars=$(env | grep '^OPENBLAS_' | sort | tr '\n' ' ' || true)
unset_args=()
for v in $(env | sed -n 's/^\(OPENBLAS_[A-Za-z0-9_]*\)=.*/\1/p'); do unset_args+=(-u "$v"); done
ENVCMD=(env)

run_pair() { # name size batch steps mode
    local r p ri=0 pi=0 rm pm
    for round in $(seq "$ROUNDS"); do
        r=$("${ENVCMD[@]}" "$body" resnet50 "$2" "$3" "$4" "$THREADS" "$5")
        p=$("${ENVCMD[@]}" "$PYTHON" tests/bench/cpu_peer.py resnet50 "$2" "$3" "$4" "$THREADS" "$5")
        echo "# $1 round $round rn: $r" >&2
        echo "# $1 round $round peer: $p" >&2
        ri=$(best "$ri" "$(field img/s <<<"$r")")
        pi=$(best "$pi" "$(field img/s <<<"$p")")
        rm=$(field peak_rss_mib <<<"$r") pm=$(field peak_rss_mib <<<"$p")
    done
    echo "# $1 OpenBLAS kernel: rn $(sed -n 's/.*blas=\([^ ]*\).*/\1/p' <<<"$r") (its GEMMs on $(sed -n 's/.*gemm=\([^ ]*\).*/\1/p' <<<"$r")), peer $(sed -n 's/.*blas=\([^ ]*\).*/\1/p' <<<"$p")" >&2
    echo "$1: rn=$ri peer=$pi ratio=$(ratio "$ri" "$pi")"
    if [ "$5" = train ]; then
        echo "$1-peak-rss-mib: rn=$rm peer=$pm ratio=$(ratio "$pm" "$rm")"
    fi
}

echo "# resnet50, $THREADS threads, $STEPS timed steps after one warm-up, best of $ROUNDS rounds; $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)" >&2
run_all() { # name suffix
    run_pair "cpu-train-224-b8$1" 224 8 2 train
    run_pair "cpu-eval-64-b32$1" 64 32 "$STEPS" eval
    run_pair "cpu-train$1" 64 32 "$STEPS" train
}

if [ -n "$blas_vars" ]; then
    echo "# as the environment is: $blas_vars" >&2
    run_all -env
    echo "# with ${unset_args[*]} for rn and peer alike" >&2
    ENVCMD=(env "${unset_args[@]}")
else
    echo "# no OPENBLAS_* variables set: each side runs the kernel OpenBLAS detects" >&2
fi
run_all ""
