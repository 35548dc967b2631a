#!/usr/bin/env bash
# gpu-check step 4g: rn-train --cuda-graphs on the device. From one checkpoint, STEPS
# steps without and with --cuda-graphs (--deterministic, --augment none, --no-shuffle, so
# both runs choose the same algorithms on the same images), with --accum 1 and 2, in fp32
# and under --amp fp16, once with --optimizer lars, once with --val, --ema-decay, --freeze-bn and --recompute blocks,
# once with --mixup, --cutmix and --clip-grad-norm: the exported checkpoints and every step's logged loss and train top-1 must be
# the same bits (a graph replays the very kernels with the very arguments), the run must
# say it replayed micro-batches and optimiser steps (with --clip-grad-norm: that its
# steps ran without a graph) and must not have fallen back (no "could not be
# captured" note). DEV=cpu (gpu-check's
# dry run) checks this script: there --cuda-graphs must be refused, naming the backend.
#
# Environment: BIN (the tools), WORK (a scratch folder, emptied), DEV (cuda or cpu),
# PYTHON, ARCH, SIZE, BATCH, STEPS (default 8: eager, captured, replayed; fp16's loss
# scale may fall in the first steps, each fall an uncaptured step again).
# Everything said goes to stdout; the last line is the verdict, "ok|FAIL <detail>". Exit
# 0 for ok, 1 for FAIL.
set -u
cd "$(dirname "$0")/../.." || exit 1
STEPS=${STEPS:-8}
# shellcheck source=tests/gpu/step-setup.sh
. tests/gpu/step-setup.sh

if [ "$DEV" = cpu ]; then
    train "$WORK/cpu" off --accum 1 --cuda-graphs
    rc=$?
    cat "$WORK/cpu.err"
    [ $rc != 0 ] || verdict FAIL "--cuda-graphs on the CPU: exit 0, where it must be refused"
    grep -q "needs a backend with graphs" "$WORK/cpu.err" || verdict FAIL "--cuda-graphs on the CPU: not refused by name"
    [ ! -e "$WORK/cpu.pb" ] || verdict FAIL "--cuda-graphs on the CPU: refused, yet wrote a checkpoint"
    verdict ok "dry run: --cuda-graphs refused on the CPU (exit $rc), as it must be"
fi

detail=""
# AMP ACCUM [FLAGS]: one with validation between steps (an inference forward on the
# training net, the EMA's weights swapped in and out), frozen BN (its inference kernels in
# the training graph) and recomputed blocks; one with mixing (its weight and top-1 target
# read from the device)
for cfg in "off 1" "off 2" "fp16 1" "fp16 2" "fp16 1 --optimizer lars" "off 2 --val $WORK/train.lmdb --ema-decay 0.9 --freeze-bn --recompute blocks" \
    "fp16 2 --mixup 0.2 --cutmix 1.0 --clip-grad-norm 1.0"; do
    read -r amp accum extra <<<"$cfg"
    name="$amp --accum $accum${extra:+ ${extra//$WORK\//}}"
    tag=$amp-$accum${extra:+-x}
    for g in plain graphs; do
        o=$WORK/$tag-$g
        flags=(--log "$o.jsonl" --log-every 1)
        [ $g = graphs ] && flags+=(--cuda-graphs)
        # shellcheck disable=SC2086 # extra: flags, split
        train "$o" "$amp" --accum "$accum" "${flags[@]}" $extra
        rc=$?
        grep -v '^epoch [0-9]*/' "$o.err"
        [ $rc = 0 ] || verdict FAIL "$name $g: rn-train exit $rc: $(tail -n 1 "$o.err" | cut -c1-200)"
        "$BIN/rn-export" "$o.pb" "$o.safetensors" || verdict FAIL "$name $g: rn-export failed"
        grep -o '"step":[0-9]*,"loss":[^,]*,"train_top1":[^,]*' "$o.jsonl" >"$o.steps"
    done
    o=$WORK/$tag-graphs
    ! grep -q "could not be captured" "$o.err" ||
        verdict FAIL "$name: a capture failed: $(grep "could not be captured" "$o.err" | cut -c1-300)"
    line=$(grep -- "--cuda-graphs: " "$o.err" | tail -n 1)
    replayed=$(sed -n 's/.*--cuda-graphs: \([0-9]*\) micro-batches replayed.*/\1/p' <<<"$line")
    [ "${replayed:-0}" -gt 0 ] || verdict FAIL "$name: nothing replayed: ${line:-no --cuda-graphs line}"
    if [[ $extra == *--clip-grad-norm* ]]; then
        grep -q "optimiser steps run without a graph" <<<"$line" ||
            verdict FAIL "$name: --clip-grad-norm's steps must run without a graph: $line"
    else
        steps=$(sed -n 's/.*optimiser steps: \([0-9]*\) replayed.*/\1/p' <<<"$line")
        [ "${steps:-0}" -gt 0 ] || verdict FAIL "$name: no optimiser step replayed: $line"
    fi
    [ -s "$o.steps" ] || verdict FAIL "$name: the log holds no step's loss"
    cmp -s "$WORK/$tag-plain.steps" "$o.steps" ||
        verdict FAIL "$name: the logged losses or top-1 differ: $(diff "$WORK/$tag-plain.steps" "$o.steps" | head -n 3 | tr '\n' ' ')"
    cmp -s "$WORK/$tag-plain.safetensors" "$o.safetensors" ||
        verdict FAIL "$name: the checkpoints with and without --cuda-graphs differ ($line)"
    detail="$detail${detail:+; }$name: same bits, ${line#*--cuda-graphs: }"
done
verdict ok "$ARCH ${SIZE}px b$BATCH, $STEPS steps: $detail"
