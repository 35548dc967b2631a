#!/usr/bin/env bash
# gpu-check step 4f: rn-train --recompute blocks on the device. From one checkpoint,
# STEPS steps with --recompute none and with blocks (--deterministic, --augment none,
# --no-shuffle, so both runs choose the same algorithms on the same images), in fp32 and,
# on a GPU, under --amp fp16: the exported checkpoints must agree within TOL relative per
# tensor (tests/parity/ckpt_close.py; 1e-5 in fp32, 1e-3 in fp16, where one rounding
# apart compounds), and the verdict says whether they are the same bits (as they are on
# the CPU: tests/recompute.bats); the recomputing network must hold less memory
# ("network N MiB" at start-up). DEV=cpu (gpu-check's dry run) checks this script: fp32
# only, and there the bits must match.
#
# Environment: BIN (the tools), WORK (a scratch folder, emptied), DEV (cuda or cpu),
# PYTHON, ARCH, SIZE, BATCH, STEPS (default 3). Everything said goes to stdout; the last
# line is the verdict, "ok|FAIL <detail>". Exit 0 for ok, 1 for FAIL.
set -u
cd "$(dirname "$0")/../.." || exit 1
STEPS=${STEPS:-3}
# shellcheck source=tests/gpu/step-setup.sh
. tests/gpu/step-setup.sh

amps="off"
[ "$DEV" = cuda ] && amps="off fp16"
detail=""
for amp in $amps; do
    for r in none blocks; do
        o=$WORK/$amp-$r
        train "$o" "$amp" --recompute $r
        rc=$?
        grep -v '^epoch' "$o.err"
        [ $rc = 0 ] || verdict FAIL "$amp --recompute $r: rn-train exit $rc: $(tail -n 1 "$o.err" | cut -c1-200)"
        "$BIN/rn-export" "$o.pb" "$o.safetensors" || verdict FAIL "$amp --recompute $r: rn-export failed"
    done
    held() { sed -n 's/.*, network \([0-9]*\) MiB.*/\1/p' "$WORK/$amp-$1.err" | head -n 1; }
    hn=$(held none) hb=$(held blocks)
    awk -v n="${hn:-0}" -v b="${hb:-0}" 'BEGIN { exit !(b > 0 && b < n) }' ||
        verdict FAIL "$amp: the recomputing network holds ${hb:-?} MiB, the plain one ${hn:-?} MiB"
    tol=1e-5
    [ "$amp" = off ] || tol=1e-3
    if cmp -s "$WORK/$amp-none.safetensors" "$WORK/$amp-blocks.safetensors"; then
        same="same bits"
    else
        [ "$DEV" = cpu ] && verdict FAIL "$amp: the checkpoints differ on the CPU, where they must be the same bits"
        close=$(PYTHONPATH=tests/parity "$PYTHON" tests/parity/ckpt_close.py "$WORK/$amp-blocks.safetensors" \
            "$WORK/$amp-none.safetensors" $tol 2>&1)
        crc=$?
        echo "$close"
        [ $crc = 0 ] || verdict FAIL "$amp: $(echo "$close" | tail -n 1 | cut -c1-200)"
        same="not the same bits: $(echo "$close" | tail -n 1)"
    fi
    detail="$detail${detail:+; }$amp: network $hn -> $hb MiB, $same"
done
verdict ok "$ARCH ${SIZE}px b$BATCH, $STEPS steps: $detail"
