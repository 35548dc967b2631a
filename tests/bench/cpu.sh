#!/usr/bin/env bash
# make bench-cpu: ResNet-50 on the CPU, rn against PyTorch (same threads, batch, size),
# side by side. Lines: <name>: rn=<value> peer=<value> ratio=<r>, higher is better
# (for memory the ratio is peer/rn). The last line is cpu-train at 64x64 batch 32.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-2}
STEPS=${STEPS:-4}
body=$BUILD/tests/bench_cpu_step
field() { sed -n "s|.*$1=\([0-9.]*\).*|\1|p"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

run_pair() { # name size batch steps mode
    local r p
    r=$("$body" resnet50 "$2" "$3" "$4" "$THREADS" "$5")
    p=$("$PYTHON" tests/bench/cpu_peer.py resnet50 "$2" "$3" "$4" "$THREADS" "$5")
    echo "# $1 rn: $r" >&2
    echo "# $1 peer: $p" >&2
    local ri pi
    ri=$(field img/s <<<"$r")
    pi=$(field img/s <<<"$p")
    echo "$1: rn=$ri peer=$pi ratio=$(ratio "$ri" "$pi")"
    if [ "$5" = train ]; then
        echo "$1-peak-rss-mib: rn=$(field peak_rss_mib <<<"$r") peer=$(field peak_rss_mib <<<"$p") ratio=$(ratio "$(field peak_rss_mib <<<"$p")" "$(field peak_rss_mib <<<"$r")")"
    fi
}

echo "# resnet50, $THREADS threads, $STEPS timed steps after one warm-up; $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)" >&2
run_pair cpu-train-224-b8 224 8 2 train
run_pair cpu-eval-64-b32 64 32 "$STEPS" eval
run_pair cpu-train 64 32 "$STEPS" train
