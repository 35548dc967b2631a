# Sourced by gpu-check's step scripts (recompute-check.sh, graphs-check.sh,
# inject-check.sh), from the repository root, after they set STEPS: the defaults of DEV,
# PYTHON, ARCH, SIZE and BATCH, verdict (the last line, "ok|FAIL <detail>", and the exit
# status), train (one run of theirs), and WORK emptied and given a toy dataset of BATCH
# images per class (WORK/train.lmdb) and an ARCH checkpoint (WORK/init.pb).
DEV=${DEV:-cuda} PYTHON=${PYTHON:-python3} ARCH=${ARCH:-resnet50} SIZE=${SIZE:-64} BATCH=${BATCH:-32}
verdict() { echo "$1 $2"; [ "$1" = FAIL ] && exit 1; exit 0; }

[ -n "${BIN:-}" ] && [ -n "${WORK:-}" ] || verdict FAIL "$(basename "$0"): BIN and WORK must be set"
rm -rf "$WORK" && mkdir -p "$WORK" || verdict FAIL "cannot create $WORK"
"$PYTHON" tests/data/toy.py "$WORK/src" "$BATCH" 1 >"$WORK/setup.txt" 2>&1 &&
    "$BIN/rn-prep" -q "$WORK/src" "$WORK/train.lmdb" >>"$WORK/setup.txt" 2>&1 &&
    "$BIN/rn-init" --arch "$ARCH" --classes 2 --seed 1 -o "$WORK/init.pb" >>"$WORK/setup.txt" 2>&1 ||
    verdict FAIL "making the toy dataset or checkpoint failed: $(tail -n 1 "$WORK/setup.txt" | cut -c1-200)"

# OUT AMP [FLAGS...]: STEPS steps of rn-train from WORK/init.pb on WORK/train.lmdb, as
# every step script compares its runs (--deterministic, --augment none, --no-shuffle: the
# same algorithms on the same images), its checkpoint OUT.pb, its stderr OUT.err
train() {
    local o=$1 amp=$2
    shift 2
    "$BIN/rn-train" --device "$DEV" --data "$WORK/train.lmdb" --in "$WORK/init.pb" --out "$o.pb" --batch "$BATCH" \
        --crop "$SIZE" --augment none --no-shuffle --workers 2 --max-steps "$STEPS" --deterministic --amp "$amp" \
        "$@" >"$o.err" 2>&1
}
