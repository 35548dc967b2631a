#!/usr/bin/env bats
# rn-export --format onnx: the file runs in an outside runtime (onnxruntime's Node.js
# binding, tests/onnx/run_ort.js) and its logits equal rn-eval's on the same images, for
# resnet18 and resnet50 (one training step, so BN statistics are not the identity) with
# each option, and for the other archs at initialisation; Debian's python3-onnx checker
# accepts it; names follow torchvision; bad usage and failures keep an existing file.
#
# Agreement: max |ort - rn| / max(|rn|, max |rn| of that image's logits) <= 1e-4. The
# row's largest logit is in the denominator because a logit near 0 has no meaningful
# relative error of its own: the float32 error of a logit is of the order of the
# largest terms summed into it, which scale with the row's largest logits.
#
# int8 (--int8 --calib): the same images calibrate and are compared; the logits stay
# within 0.2 of the row's largest fp32 logit (measured 0.05 to 0.12 on these two-class
# networks) and differ from fp32 by more than 1e-3 (the model does compute in int8).
# --resize changes the calibration images as rn-eval's does. make -C examples/fashion-mnist
# int8 on a tiny slice (200/100 images, 1 epoch): its report's format, fp32's top-1 through
# onnxruntime equal to rn-eval's, every test image scored by both, the int8 file under 0.35
# of fp32's; without onnxruntime it says how to get it and fails before training.
#
# Skips: without node or onnxruntime-node in $RN_BUILD/node (make onnxruntime installs
# it with npm from the npm registry; make test runs it) the runtime tests skip with the
# reason; without python3-onnx the checker test skips; without torchvision the name test;
# without Debian's dataset-fashion-mnist the example's test.
load helper

ORT_DIR=${RN_BUILD:-$BATS_TEST_DIRNAME/../build}/node
TOOLS=$BATS_TEST_DIRNAME/onnx
TOL=1e-4
# the images: 8 generated 40x40 JPEGs, evaluated at rn's eval transform to 32x32
N=8
S=32

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src 4 1
    rn-prep -q src val.lmdb
    rn-load -q --eval --crop $S --batch $N --no-shuffle --batches 1 --raw px.u8 val.lmdb 2> /dev/null
    "$PYTHON" "$TOOLS/check.py" nchw px.u8 $N $S px.f32
    # one SGD step moves the BN running statistics off mean 0, var 1 and gives the
    # checkpoint the dataset's class names
    for a in resnet18 resnet50; do
        rn-init --arch $a --classes 2 --seed 1 -o $a-init.pb
        rn-train --data val.lmdb --in $a-init.pb --out $a.pb --epochs 1 --batch $N --crop $S --lr 0.01 \
            --workers 2 --threads 2 2> /dev/null
        rn-eval --data val.lmdb --ckpt $a.pb --crop $S --workers 2 --threads 2 --dump-logits $a.st > /dev/null
    done
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

# why make onnxruntime did not install onnxruntime-node: npm's fetch error, else the first line
ort_missing_why() {
    local log=$ORT_DIR/install.log
    [ -f "$log" ] || { echo "never installed"; return; }
    grep -m 1 -E 'FetchError|no npm' "$log" || head -n 1 "$log"
}

need_ort() {
    command -v node > /dev/null || skip "no node (apt-get install nodejs npm) to run onnxruntime-node"
    [ -f "$ORT_DIR/node_modules/onnxruntime-node/package.json" ] ||
        skip "onnxruntime-node is not in $ORT_DIR ($(ort_missing_why)): make onnxruntime installs it with npm from the npm registry"
}

need_onnx() {
    "$PYTHON" -c 'import onnx' 2> /dev/null || skip "no python3-onnx (make deps installs it) for the ONNX checker"
}

# ort_matches ARCH [rn-export options]: ARCH.pb to ONNX, run by onnxruntime on the
# images, logits compared with rn-eval's
ort_matches() {
    local a=$1
    shift
    local m="$a$(tr -d ' -' <<< "$*").onnx"
    run rn-export "$@" $a.pb "$m"
    assert_success
    if [[ " $* " == *" --preprocess "* ]]; then
        run node "$TOOLS/run_ort.js" "$ORT_DIR" "$m" px.u8 uint8 $N,$S,$S,3 out.f32
    else
        run node "$TOOLS/run_ort.js" "$ORT_DIR" "$m" px.f32 float32 $N,3,$S,$S out.f32
    fi
    assert_success
    assert_output "input -> logits: logits ${N}x2"
    run "$PYTHON" "$TOOLS/check.py" compare $a.st out.f32 $TOL
    echo "$a${*:+ $*}: $output ($(stat -c %s "$m") bytes)" >&3
    assert_success
}

@test "rn-export --help describes the ONNX file and its options" {
    run rn-export --help
    assert_success
    assert_output --partial "--format F"
    assert_output --partial "--fold-bn"
    assert_output --partial "--preprocess"
    assert_output --partial "opset 17"
    assert_output --partial "class_names"
}

@test "bad usage exits 2 naming the fault and writes nothing" {
    run rn-export --format tflite resnet18.pb m.tflite
    assert_failure 2
    assert_output "rn-export: --format: unknown format 'tflite': want safetensors or onnx"
    run rn-export --format onnx resnet18.pb m.safetensors
    assert_failure 2
    assert_output --partial "rn-export: --format onnx, but m.safetensors ends in .safetensors (rename OUT or drop --format)"
    run rn-export --format safetensors resnet18.pb m.onnx
    assert_failure 2
    assert_output --partial "rn-export: --format safetensors, but m.onnx ends in .onnx"
    run rn-export --fold-bn resnet18.pb m.safetensors
    assert_failure 2
    assert_output --partial "--fold-bn is for ONNX output"
    run rn-export --preprocess resnet18.pb m.bin
    assert_failure 2
    assert_output --partial "--preprocess is for ONNX output"
    run rn-export resnet18.pb
    assert_failure 2
    assert_output --partial "expected IN.pb OUT"
    [ ! -e m.tflite ]
    [ ! -e m.safetensors ]
    [ ! -e m.onnx ]
    [ ! -e m.bin ]
}

@test "a missing or corrupt checkpoint exits 1 naming it; an existing OUT.onnx survives" {
    run rn-export nothere.pb new.onnx
    assert_failure 1
    assert_output --partial "rn-export: nothere.pb"
    [ ! -e new.onnx ]
    rn-export resnet18.pb keep.onnx
    before=$(md5sum < keep.onnx)
    head -c 5000 resnet18.pb > cut.pb
    run rn-export --fold-bn cut.pb keep.onnx
    assert_failure 1
    assert_output --partial "rn-export: cut.pb"
    assert_equal "$(md5sum < keep.onnx)" "$before"
    [ ! -e keep.onnx.tmp ]
    mkdir -p adir.onnx
    run rn-export resnet18.pb adir.onnx
    assert_failure 1
    assert_output --partial "adir.onnx: is a directory"
}

@test "the format follows the extension; --format onnx writes to any name and to stdout" {
    rn-export resnet18.pb a.onnx
    rn-export --format onnx resnet18.pb a.model
    cmp a.onnx a.model
    rn-export --format onnx - - < resnet18.pb > b.onnx
    cmp a.onnx b.onnx
    # other names stay safetensors, as before
    rn-export resnet18.pb a.bin
    rn-export resnet18.pb a.safetensors
    cmp a.bin a.safetensors
}

@test "python3-onnx's checker (full_check) accepts every option; metadata has arch, num_classes, class_names" {
    need_onnx
    for o in "" --fold-bn --preprocess "--fold-bn --preprocess"; do
        rn-export $o resnet18.pb c.onnx
        run "$PYTHON" "$TOOLS/check.py" checker c.onnx
        assert_success
        assert_line "arch=resnet18"
        assert_line "num_classes=2"
        assert_line 'class_names=["horiz","vert"]'
    done
    rn-export resnet50.pb c.onnx
    run "$PYTHON" "$TOOLS/check.py" checker c.onnx
    assert_success
    assert_line "arch=resnet50"
}

@test "initializers carry torchvision's state_dict names (BN folded: conv weight and bias)" {
    need_onnx
    have_torch || skip "no torch/torchvision in $PYTHON"
    rn-export resnet50.pb n.onnx
    rn-export --fold-bn resnet50.pb f.onnx
    run "$PYTHON" - <<'PY'
import onnx, torchvision
sd = torchvision.models.resnet50(num_classes=2).state_dict()
want = {k for k in sd if not k.endswith("num_batches_tracked")}
got = {t.name for t in onnx.load("n.onnx").graph.initializer}
assert got == want, (sorted(got - want)[:5], sorted(want - got)[:5])
convs = {k[:-len(".weight")] for k in sd if k.endswith(".weight") and sd[k].dim() == 4}
want = {c + s for c in convs for s in (".weight", ".bias")} | {"fc.weight", "fc.bias"}
got = {t.name for t in onnx.load("f.onnx").graph.initializer}
assert got == want, (sorted(got - want)[:5], sorted(want - got)[:5])
print("names ok", len(got))
PY
    assert_success
    assert_output --partial "names ok"
}

@test "resnet18: onnxruntime's logits equal rn-eval's" {
    need_ort
    ort_matches resnet18
}

@test "resnet18 --fold-bn: onnxruntime's logits equal rn-eval's" {
    need_ort
    ort_matches resnet18 --fold-bn
}

@test "resnet18 --preprocess: onnxruntime on rn's u8 NHWC pixels equals rn-eval" {
    need_ort
    ort_matches resnet18 --preprocess
}

@test "resnet18 --fold-bn --preprocess: onnxruntime's logits equal rn-eval's" {
    need_ort
    ort_matches resnet18 --fold-bn --preprocess
}

@test "resnet50: onnxruntime's logits equal rn-eval's" {
    need_ort
    ort_matches resnet50
}

@test "resnet50 --fold-bn: onnxruntime's logits equal rn-eval's" {
    need_ort
    ort_matches resnet50 --fold-bn
}

@test "resnet50 --preprocess: onnxruntime on rn's u8 NHWC pixels equals rn-eval" {
    need_ort
    ort_matches resnet50 --preprocess
}

@test "resnet50 --fold-bn --preprocess: onnxruntime's logits equal rn-eval's" {
    need_ort
    ort_matches resnet50 --fold-bn --preprocess
}

@test "resnet34, resnet101 and resnet152 at initialisation: onnxruntime's logits equal rn-eval's" {
    need_ort
    for a in resnet34 resnet101 resnet152; do
        rn-init --arch $a --classes 2 --seed 3 -o $a.pb
        rn-eval --data val.lmdb --ckpt $a.pb --crop $S --workers 2 --threads 2 --dump-logits $a.st > /dev/null
        ort_matches $a --fold-bn
        rm -f "$a"*.onnx
    done
}

@test "--int8 bad usage exits 2 naming the flag" {
    run rn-export --int8 resnet18.pb q.onnx
    assert_failure 2
    assert_output "rn-export: --int8 needs --calib DATA.lmdb (images to measure the activations on)"
    run rn-export --calib val.lmdb resnet18.pb q.onnx
    assert_failure 2
    assert_output "rn-export: --calib is for --int8"
    run rn-export --int8 --calib val.lmdb resnet18.pb q.safetensors
    assert_failure 2
    assert_output --partial "--int8 is for ONNX output"
    run rn-export --int8 --calib val.lmdb --calib-method kl resnet18.pb q.onnx
    assert_failure 2
    assert_output "rn-export: --calib-method: unknown method 'kl': want minmax or percentile"
    run rn-export --int8 --calib val.lmdb --calib-batches 0 resnet18.pb q.onnx
    assert_failure 2
    assert_output --partial "--calib-batches: '0' is too small"
    run rn-export --int8 --calib val.lmdb --percentile 101 resnet18.pb q.onnx
    assert_failure 2
    assert_output --partial "--percentile: '101'"
    run rn-export --int8 --calib val.lmdb --resize -1 resnet18.pb q.onnx
    assert_failure 2
    assert_output --partial "--resize: '-1'"
    [ ! -e q.onnx ]
    [ ! -e q.safetensors ]
}

@test "--int8 with a missing calibration set exits 1 naming it; an existing output survives" {
    rn-export resnet18.pb keep8.onnx
    before=$(md5sum < keep8.onnx)
    run rn-export --int8 --calib nothere.lmdb --crop $S resnet18.pb keep8.onnx
    assert_failure 1
    assert_output --partial "rn-export: calibration: nothere.lmdb"
    assert_equal "$(md5sum < keep8.onnx)" "$before"
}

@test "--int8 --resize: calibration resizes as rn-eval --resize does (default round(S*256/224), 0: none)" {
    rn-export --int8 --calib val.lmdb --crop $S --batch 4 --calib-batches 2 resnet18.pb r-default.onnx
    rn-export --int8 --calib val.lmdb --crop $S --resize 37 --batch 4 --calib-batches 2 resnet18.pb r-37.onnx
    rn-export --int8 --calib val.lmdb --crop $S --resize 0 --batch 4 --calib-batches 2 resnet18.pb r-0.onnx
    cmp r-default.onnx r-37.onnx
    run cmp -s r-default.onnx r-0.onnx
    assert_failure
}

# int8_matches ARCH METHOD [options]: an int8 model calibrated on the images, checked,
# run by onnxruntime and compared with rn-eval's fp32 logits
int8_matches() {
    local a=$1 method=$2
    shift 2
    local m="$a-int8-$method$(tr -d ' -' <<< "$*").onnx"
    run rn-export --int8 --calib val.lmdb --calib-method $method --crop $S --batch 4 --calib-batches 2 \
        --workers 2 --threads 2 "$@" $a.pb "$m"
    assert_success
    if "$PYTHON" -c 'import onnx' 2> /dev/null; then
        run "$PYTHON" "$TOOLS/check.py" checker "$m"
        assert_success
        assert_line --partial "quantization=int8 QDQ"
        assert_line --regexp "^op:QuantizeLinear=[1-9]"
        assert_line --regexp "^initializers:INT8=[1-9]"
        refute_line --regexp "^op:BatchNormalization"
    fi
    if [[ " $* " == *" --preprocess "* ]]; then
        run node "$TOOLS/run_ort.js" "$ORT_DIR" "$m" px.u8 uint8 $N,$S,$S,3 out.f32
    else
        run node "$TOOLS/run_ort.js" "$ORT_DIR" "$m" px.f32 float32 $N,3,$S,$S out.f32
    fi
    assert_success
    run "$PYTHON" "$TOOLS/check.py" compare $a.st out.f32 0.2 1e-3
    echo "$a --int8 $method${*:+ $*}: $output ($(stat -c %s "$m") bytes)" >&3
    assert_success
}

@test "resnet18 --int8 (minmax, percentile; --preprocess): checked, and onnxruntime within 0.2 of rn-eval's fp32" {
    need_ort
    int8_matches resnet18 minmax
    int8_matches resnet18 percentile
    int8_matches resnet18 minmax --preprocess
}

@test "resnet50 --int8 (minmax, percentile; --preprocess): checked, and onnxruntime within 0.2 of rn-eval's fp32" {
    need_ort
    int8_matches resnet50 minmax
    int8_matches resnet50 percentile --preprocess
}

@test "examples/fashion-mnist int8: fp32 and int8 top-1 through onnxruntime on every test image, the int8 file under 0.35 of fp32's" {
    need_ort
    [ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] ||
        skip "no Fashion-MNIST IDX files (apt-get install dataset-fashion-mnist)"
    run make -C "$BATS_TEST_DIRNAME/../examples/fashion-mnist" RN_BIN="$RN_BIN" ORT_DIR="$ORT_DIR" OUT="$PWD/fm" \
        TRAIN_N=200 TEST_N=100 EPOCHS=1 BATCH=50 CALIB_BATCHES=2 int8
    assert_success
    assert_line --regexp '^model=fp32 runtime=onnxruntime top1=[01]\.[0-9]{4} correct=[0-9]+ n=100 bytes=[0-9]+$'
    assert_line --regexp '^model=int8 runtime=onnxruntime top1=[01]\.[0-9]{4} correct=[0-9]+ n=100 bytes=[0-9]+ calib=2x32 method=minmax$'
    assert_line --regexp '^model=fp32 runtime=rn-eval top1=[01]\.[0-9]+ n=100 checkpoint=epoch-001\.pb$'
    assert_line --regexp '^int8-fp32 points=[-+][0-9]+\.[0-9]{2} size=0\.[0-9]{3}$'
    [ "$(cat fm/int8.txt)" = "$(grep -E '^(model|int8-fp32)' <<< "$output")" ]
    # top-1 in [0, 1] for both; the same correct count as the rn-eval line gives
    awk '/runtime=onnxruntime/ { split($3, t, "="); if (t[2] < 0 || t[2] > 1) exit 1 }' fm/int8.txt
    fp32=$(awk '$1 == "model=fp32" && $2 == "runtime=onnxruntime" { sub(/top1=/, "", $3); print $3 }' fm/int8.txt)
    ref=$(awk '$2 == "runtime=rn-eval" { sub(/top1=/, "", $3); print $3 }' fm/int8.txt)
    awk -v a="$fp32" -v b="$ref" 'BEGIN { exit !((a - b) ^ 2 < 1e-8) }'
    size=$(awk '$1 == "int8-fp32" { sub(/size=/, "", $3); print $3 }' fm/int8.txt)
    awk -v s="$size" 'BEGIN { exit !(s > 0 && s < 0.35) }'
}

@test "examples/fashion-mnist int8 without onnxruntime: says how to get it, exit 1, nothing trained" {
    run make -C "$BATS_TEST_DIRNAME/../examples/fashion-mnist" RN_BIN="$RN_BIN" ORT_DIR="$PWD/no-ort" OUT="$PWD/fm-none" \
        TRAIN_N=200 TEST_N=100 EPOCHS=1 int8
    assert_failure
    assert_output --regexp "onnxruntime-node is not in .*/no-ort: run make onnxruntime at the top of rn|no node to run onnxruntime-node"
    [ ! -e fm-none/epoch-001.pb ]
}
