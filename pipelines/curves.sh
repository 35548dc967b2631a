#!/bin/sh
# curves.sh RUN OUT.png: plot a run's training curves with gnuplot, from the rn-train logs
# RUN/epoch-*.jsonl ("step" lines: loss and lr against the global step; "epoch" lines: the
# epoch's mean training loss, lr and, with --val, val top-1/top-5/loss) and, when present,
# RUN/results.tsv (rn-eval of each epoch, eval.mk). Writes OUT.png atomically.
set -eu
run=$1
out=$2
command -v gnuplot > /dev/null || { echo "curves.sh: gnuplot is not installed (Debian: apt-get install gnuplot-nox)" >&2; exit 1; }
set -- "$run"/epoch-*.jsonl
[ -f "$1" ] || { echo "curves.sh: no logs $run/epoch-*.jsonl: train first (make train)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# flat JSON objects, one a line: field k, or NaN when absent
cat "$@" | awk -v steps="$tmp/steps.dat" -v epochs="$tmp/epochs.dat" '
function get(k,   m) {
    if (!match($0, "\"" k "\":[^,}]*")) return "NaN"
    m = substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3)
    return m == "null" ? "NaN" : m
}
/"kind":"step"/ { print get("step"), get("loss"), get("lr") > steps }
/"kind":"epoch"/ { print get("epoch"), get("step"), get("train_loss"), get("lr"), get("val_top1"), get("val_top5"), get("val_loss") > epochs }'
touch "$tmp/steps.dat" "$tmp/epochs.dat"
# "set logscale y" when the values in columns C... of FILE span more than a factor of 20
logy() {
    f=$1; shift
    awk -v cols="$*" 'BEGIN { n = split(cols, c, " ") }
        { for (i = 1; i <= n; i++) { v = $c[i]; if (v != "NaN" && v != "" && v > 0) { if (!k++ || v < lo) lo = v; if (v > hi) hi = v } } }
        END { if (k && hi / lo > 20) print "set logscale y" }' "$f"
}
has() { awk -v c="$2" '$c != "NaN" && $c != "" { n++ } END { exit !n }' "$1"; }
res=
[ -f "$run/results.tsv" ] && awk 'NR > 1' "$run/results.tsv" > "$tmp/results.dat" && has "$tmp/results.dat" 2 && res=1

{
    echo "set terminal pngcairo size 1200,900 font ',10'"
    echo "set output '$tmp/curves.png'"
    echo "set multiplot layout 2,2 title '$(basename "$run")'"
    echo "set grid; set key top right"
    echo "set xlabel 'step'; set ylabel 'loss'; set title 'training loss'"
    logy "$tmp/steps.dat" 2
    p=
    has "$tmp/steps.dat" 2 && p="'$tmp/steps.dat' using 1:2 with lines lc rgb '#9ecae1' title 'per log line'"
    has "$tmp/epochs.dat" 3 && p="$p${p:+, }'$tmp/epochs.dat' using 2:3 with linespoints lc rgb '#08519c' pt 7 title 'epoch mean'"
    if [ -n "$p" ]; then echo "plot $p"; else echo "set label 1 'no step lines' at graph 0.4,0.5; plot NaN notitle; unset label 1"; fi

    echo "unset logscale y; set xlabel 'step'; set ylabel 'lr'; set title 'learning rate'; set ytics format '%g'"
    logy "$tmp/steps.dat" 3
    # a constant lr would give gnuplot an empty range
    awk '$3 != "NaN" && $3 > 0 { if (!n++ || $3 < lo) lo = $3; if ($3 > hi) hi = $3 } END { if (n && lo == hi) printf "set yrange [%g:%g]\n", lo / 2, hi * 2 }' "$tmp/steps.dat"
    if has "$tmp/steps.dat" 3; then echo "plot '$tmp/steps.dat' using 1:3 with steps lc rgb '#d94801' title 'lr'"
    elif has "$tmp/epochs.dat" 4; then echo "plot '$tmp/epochs.dat' using 2:4 with steps lc rgb '#d94801' title 'lr'"
    else echo "plot 1 notitle"; fi
    echo "unset logscale y; set autoscale y; set ytics format '% h'"

    [ "$(awk 'END { print NR }' "$tmp/epochs.dat")" -le 10 ] && echo "set xtics 1"
    echo "set xlabel 'epoch'; set ylabel 'accuracy'; set title 'validation accuracy'; set key bottom right; set yrange [0:1.02]"
    p=
    has "$tmp/epochs.dat" 5 && p="'$tmp/epochs.dat' using 1:5 with linespoints pt 7 title 'top-1 (rn-train --val)', '$tmp/epochs.dat' using 1:6 with linespoints pt 5 title 'top-5 (rn-train --val)'"
    [ -n "$res" ] && p="$p${p:+, }'$tmp/results.dat' using 1:2 with points pt 6 ps 2 title 'top-1 (rn-eval)', '$tmp/results.dat' using 1:3 with points pt 4 ps 2 title '$(awk -F'\t' 'NR == 1 { print $3 }' "$run/results.tsv") (rn-eval)'"
    if [ -n "$p" ]; then echo "plot $p"; else echo "set label 1 'no validation yet' at graph 0.35,0.5; plot [0:1] NaN notitle; unset label 1"; fi

    echo "set xlabel 'epoch'; set ylabel 'loss'; set title 'loss per epoch'; set key top right; set autoscale y"
    logy "$tmp/epochs.dat" 3 7
    p=
    has "$tmp/epochs.dat" 3 && p="'$tmp/epochs.dat' using 1:3 with linespoints pt 7 title 'train'"
    has "$tmp/epochs.dat" 7 && p="$p${p:+, }'$tmp/epochs.dat' using 1:7 with linespoints pt 5 title 'val (rn-train --val)'"
    [ -n "$res" ] && p="$p${p:+, }'$tmp/results.dat' using 1:4 with points pt 6 ps 2 title 'val (rn-eval)'"
    if [ -n "$p" ]; then echo "plot $p"; else echo "set label 1 'no finished epoch yet' at graph 0.35,0.5; plot [0:1] NaN notitle; unset label 1"; fi
    echo "unset multiplot"
} > "$tmp/curves.gp"
# one-point curves make gnuplot warn about empty ranges; it copes, so the warning goes
gnuplot "$tmp/curves.gp" 2> "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
grep -v '^Warning: empty [xy]2* *range' "$tmp/err" >&2 || true
mv -f "$tmp/curves.png" "$out.tmp"
mv -f "$out.tmp" "$out"
