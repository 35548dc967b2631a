#!/usr/bin/env bats
# rn-init, rn-info and rn-export on checkpoints.
load helper

setup() { cd "$BATS_TEST_TMPDIR"; }

@test "every tool prints help and version, and exits 2 on a bad flag" {
    for t in rn-init rn-info rn-export; do
        run $t --help
        assert_success
        assert_output --partial "usage: $t"
        run $t --version
        assert_success
        assert_output --regexp "^$t [0-9]+\.[0-9]+\.[0-9]+"
        run $t --no-such-flag
        assert_equal "$status" 2
    done
}

@test "rn-init usage errors exit 2 with a message" {
    run rn-init --arch resnet50
    assert_equal "$status" 2
    assert_output --partial "add -o OUT.pb"
    run rn-init --arch resnet51 -o x.pb
    assert_equal "$status" 2
    assert_output --partial "unknown arch 'resnet51'"
    run rn-init --classes 0 -o x.pb
    assert_equal "$status" 2
    run rn-init --classes abc -o x.pb
    assert_equal "$status" 2
    assert_output "rn-init: --classes: 'abc' is not a whole number"
    run rn-init --seed 1.5 -o x.pb
    assert_equal "$status" 2
    assert_output "rn-init: --seed: '1.5' is not a whole number"
    run rn-init --reset-fc 10 -o x.pb
    assert_equal "$status" 2
    assert_output --partial "--reset-fc needs --from"
    [ ! -e x.pb ]
}

@test "parameter counts of the whole family match torchvision's" {
    declare -A want=([resnet18]=11689512 [resnet34]=21797672 [resnet50]=25557032 [resnet101]=44549160 [resnet152]=60192808)
    for a in resnet18 resnet34 resnet50 resnet101 resnet152; do
        run bash -c "rn-init --arch $a -o - | rn-info --json -"
        assert_success
        assert_output --partial "\"parameters\":${want[$a]},"
        assert_output --partial "\"arch\":\"$a\""
    done
    run bash -c "rn-init --arch resnet18 --classes 10 -o - | rn-info -"
    assert_output --partial "parameters:    11181642 in 62 tensors"
}

@test "the same seed gives identical bytes; another seed differs" {
    rn-init --arch resnet18 --seed 3 -o a.pb
    mv a.pb first.pb
    rn-init --arch resnet18 --seed 3 -o a.pb
    cmp first.pb a.pb
    rn-init --arch resnet18 --seed 3 -o b.pb
    rn-init --arch resnet18 --seed 4 -o c.pb
    # the command line (output name) is recorded too, so compare the tensors
    diff <(rn-info -t a.pb | grep -A999 '^tensors:') <(rn-info -t b.pb | grep -A999 '^tensors:')
    run diff <(rn-info -t a.pb | grep -A999 '^tensors:') <(rn-info -t c.pb | grep -A999 '^tensors:')
    assert_failure
}

@test "rn-info lists tensors and provenance" {
    rn-init --arch resnet18 --classes 7 --zero-init-residual -o a.pb
    run rn-info --tensors a.pb
    assert_success
    assert_output --partial "zero-init-res: yes"
    assert_output --partial "command:       rn-init --arch resnet18 --classes 7 --zero-init-residual -o a.pb"
    assert_output --regexp "layer4\.1\.bn2\.num_batches_tracked +I64 +[0-9a-f]{8} buffer"
    assert_output --regexp "fc\.weight +7,512 +F32"
    run rn-info --json --tensors a.pb
    assert_success
    echo "$output" | "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); assert len(d["tensors"])==122, len(d["tensors"])'
}

@test "bad checkpoints: missing, empty, truncated, flipped byte, wrong version" {
    run rn-info nothere.pb
    assert_failure 1
    assert_output --partial "nothere.pb: cannot open"
    : > empty.pb
    run rn-info empty.pb
    assert_failure 1
    assert_output --partial "empty file"
    rn-init --arch resnet18 -o good.pb
    head -c 1000000 good.pb > trunc.pb
    run rn-info trunc.pb
    assert_failure 1
    assert_output --partial "trunc.pb: not a valid rn checkpoint"
    cp good.pb flip.pb
    flip_byte flip.pb 3000000
    run rn-info flip.pb
    assert_failure 1
    assert_output --regexp "flip.pb: params: tensor layer[0-9.]+conv[0-9].weight fails its checksum"
    cp good.pb v2.pb
    printf '\x02' | dd of=v2.pb bs=1 seek=1 conv=notrunc 2>/dev/null
    run rn-info v2.pb
    assert_failure 1
    assert_output --partial "format version 2, this build reads version 1"
    echo "just text" > text.pb
    run rn-export text.pb out.safetensors
    assert_failure 1
    [ ! -e out.safetensors ]
}

@test "a failed write leaves the existing output intact" {
    rn-init --arch resnet18 -o out.pb
    before=$(md5sum < out.pb)
    run rn-init --from nothere.safetensors -o out.pb
    assert_failure 1
    assert_equal "$(md5sum < out.pb)" "$before"
    mkdir ro && chmod 555 ro
    if [ "$(id -u)" != 0 ]; then
        run rn-init --arch resnet18 -o ro/x.pb
        assert_failure 1
    fi
    ls | grep -v '\.tmp$' > /dev/null
    [ ! -e out.pb.tmp ]
    # a PATH.tmp a killed run left is removed at the next run, which says so
    echo partial > out.pb.tmp
    run rn-init --arch resnet18 -o out.pb
    assert_success
    assert_output --partial "rn-init: removed out.pb.tmp, left by an interrupted run"
    [ ! -e out.pb.tmp ]
    echo partial > out.safetensors.tmp
    run rn-export out.pb out.safetensors
    assert_success
    assert_output --partial "rn-export: removed out.safetensors.tmp"
    [ ! -e out.safetensors.tmp ]
    mkdir -p adir
    run rn-init --arch resnet18 -o adir
    assert_failure 1
    assert_output --partial "adir: is a directory"
}

@test "export then import gives back the same tensors" {
    rn-init --arch resnet18 --classes 10 --seed 5 -o a.pb
    rn-export a.pb a.safetensors
    rn-init --from a.safetensors -o b.pb
    diff <(rn-info -t a.pb | grep -A999 '^tensors:') <(rn-info -t b.pb | grep -A999 '^tensors:')
    # stdin and stdout work
    rn-export - - < a.pb > c.safetensors
    cmp a.safetensors c.safetensors
}

@test "rn-init --reset-fc swaps the classifier and keeps the rest" {
    rn-init --arch resnet18 --classes 10 -o a.pb
    rn-export a.pb a.safetensors
    rn-init --from a.safetensors --reset-fc 3 --seed 9 -o b.pb
    run rn-info --json b.pb
    assert_output --partial '"num_classes":3'
    diff <(rn-info -t a.pb | grep -A999 '^tensors:' | grep -v '^  fc\.') \
         <(rn-info -t b.pb | grep -A999 '^tensors:' | grep -v '^  fc\.')
}

@test "import reports missing, extra and mis-shaped tensors by name" {
    have_torch || skip "no torch for $PYTHON (run make deps)"
    PYTHONPATH="$BATS_TEST_DIRNAME/parity" "$PYTHON" - <<'PY'
import torch, torchvision, rnst
sd = torchvision.models.resnet18(num_classes=10).state_dict()
bad = dict(sd)
del bad["layer2.0.bn1.running_var"]
bad["layer3.1.conv1.weight"] = torch.zeros(3, 3)
bad["extra.weight"] = torch.zeros(2)
rnst.save("bad.safetensors", bad)
rnst.save("half.safetensors", {k: (v.half() if v.is_floating_point() else v) for k, v in sd.items()})
rnst.save("bf16.safetensors", {k: (v.bfloat16() if v.is_floating_point() else v) for k, v in sd.items()})
PY
    run rn-init --from bad.safetensors -o bad.pb
    assert_failure 1
    assert_output --partial "missing layer2.0.bn1.running_var"
    assert_output --partial "wrong shape layer3.1.conv1.weight"
    assert_output --partial "unexpected extra.weight"
    [ ! -e bad.pb ]
    run rn-init --from half.safetensors -o half.pb
    assert_success
    run rn-info --json half.pb
    assert_output --partial '"arch":"resnet18"'
    assert_output --partial '"num_classes":10'
    run rn-init --from bf16.safetensors -o bf16.pb
    assert_success
    head -c 100 half.safetensors > cut.safetensors
    run rn-init --from cut.safetensors -o cut.pb
    assert_failure 1
    assert_output --partial "cut.safetensors"
}

@test "torchvision loads rn-export output with strict=True (every arch)" {
    plain_build_only "torchvision loading every arch"
    have_torch || skip "no torch for $PYTHON (run make deps)"
    for a in resnet18 resnet34 resnet50; do
        rn-init --arch $a --classes 1000 -o $a.pb
        rn-export $a.pb $a.safetensors
        run "$PYTHON" "$BATS_TEST_DIRNAME/parity/strict_load.py" $a.safetensors $a 1000
        assert_success
        assert_output --partial "0 mismatches"
    done
    rn-init --arch resnet101 --classes 17 --zero-init-residual -o z.pb
    rn-export z.pb z.safetensors
    run "$PYTHON" "$BATS_TEST_DIRNAME/parity/strict_load.py" z.safetensors resnet101 17 1
    assert_success
}
