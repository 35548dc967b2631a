# Sourced by gpu-check's step scripts (recompute-check.sh, graphs-check.sh), from the
# repository root: the defaults of DEV, PYTHON, ARCH, SIZE and BATCH, verdict (the last
# line, "ok|FAIL <detail>", and the exit status), and WORK emptied and given a toy dataset
# of BATCH images per class (WORK/train.lmdb) and an ARCH checkpoint (WORK/init.pb).
DEV=${DEV:-cuda} PYTHON=${PYTHON:-python3} ARCH=${ARCH:-resnet50} SIZE=${SIZE:-64} BATCH=${BATCH:-32}
verdict() { echo "$1 $2"; [ "$1" = FAIL ] && exit 1; exit 0; }

[ -n "${BIN:-}" ] && [ -n "${WORK:-}" ] || verdict FAIL "$(basename "$0"): BIN and WORK must be set"
rm -rf "$WORK" && mkdir -p "$WORK" || verdict FAIL "cannot create $WORK"
"$PYTHON" tests/data/toy.py "$WORK/src" "$BATCH" 1 >"$WORK/setup.txt" 2>&1 &&
    "$BIN/rn-prep" -q "$WORK/src" "$WORK/train.lmdb" >>"$WORK/setup.txt" 2>&1 &&
    "$BIN/rn-init" --arch "$ARCH" --classes 2 --seed 1 -o "$WORK/init.pb" >>"$WORK/setup.txt" 2>&1 ||
    verdict FAIL "making the toy dataset or checkpoint failed: $(tail -n 1 "$WORK/setup.txt" | cut -c1-200)"
