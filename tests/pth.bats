#!/usr/bin/env bats
# rn-init --from FILE.pth: torch.save's zip format read in C, against the safetensors
# import of the same weights and against torch.load; hostile files refused.
load helper

setup_file() {
    have_torch || return 0
    "$PYTHON" "$BATS_TEST_DIRNAME/data/mkpth.py" good "$BATS_FILE_TMPDIR/good"
    "$PYTHON" "$BATS_TEST_DIRNAME/data/mkpth.py" hostile "$BATS_FILE_TMPDIR/bad"
}

setup() {
    have_torch || skip "no torch for $PYTHON (run make deps)"
    cd "$BATS_TEST_TMPDIR"
    G=$BATS_FILE_TMPDIR/good
    B=$BATS_FILE_TMPDIR/bad
}

tensors() { rn-info -t "$1" | grep -A999 '^tensors:'; }

@test "a .pth imports to the same tensors as the safetensors of the same weights (resnet18/50, fp32, fp16, bf16, pickle protocol 4)" {
    plain_build_only "torch.save and imports of 2 archs in 2 dtypes"
    for n in r18 r50 r18h r50h r18b r18p4; do
        run rn-init --from "$G/$n.pth" -o $n.pth.pb
        assert_success
        rn-init --from "$G/$n.safetensors" -o $n.st.pb
        diff <(tensors $n.pth.pb) <(tensors $n.st.pb)
    done
    run rn-info --json r50.pth.pb
    assert_output --partial '"arch":"resnet50"'
    assert_output --partial '"num_classes":1000'
    run rn-info --json r18h.pth.pb
    assert_output --partial '"arch":"resnet18"'
    assert_output --partial '"num_classes":10'
}

@test "rn-export of a .pth import gives back torch.load's tensors bit for bit" {
    rn-init --from "$G/r18.pth" -o r18.pb
    rn-export r18.pb r18.safetensors
    run "$PYTHON" - "$G/r18.pth" r18.safetensors "$BATS_TEST_DIRNAME/parity" <<'PY'
import sys, torch
sys.path.insert(0, sys.argv[3])
import rnst
want, (got, _) = torch.load(sys.argv[1]), rnst.load(sys.argv[2])
assert list(want) == list(got), "names or order differ"
bad = [k for k in want if not torch.equal(want[k], got[k])]
print(len(want), "tensors,", len(bad), "differ:", bad[:5])
PY
    assert_success
    assert_output "122 tensors, 0 differ: []"
}

@test "non-contiguous views, two tensors on one storage and nn.Parameter values come out as torch.load gives them" {
    run "$PYTHON" -c "import torch; d = torch.load('$G/strided.pth'); print(d['fc.weight'].stride(), d['layer2.0.conv2.weight'].is_contiguous(), d['bn1.running_var'].storage_offset(), d['bn1.running_mean'].data_ptr() + 256 == d['bn1.running_var'].data_ptr(), type(d['conv1.weight']).__name__)"
    assert_output "(1, 10) False 64 True Parameter"
    rn-init --from "$G/strided.pth" -o s.pb
    rn-init --from "$G/strided.safetensors" -o t.pb
    diff <(tensors s.pb) <(tensors t.pb)
    rn-init --from "$G/r18.safetensors" -o r.pb
    diff <(tensors s.pb) <(tensors r.pb)
}

@test "--reset-fc from a .pth keeps the backbone and makes a new classifier" {
    rn-init --from "$G/r18.pth" -o a.pb
    run rn-init --from "$G/r18.pth" --reset-fc 3 --seed 9 -o b.pb
    assert_success
    run rn-info --json b.pb
    assert_output --partial '"num_classes":3'
    diff <(tensors a.pb | grep -v '^  fc\.') <(tensors b.pb | grep -v '^  fc\.')
    rn-init --from "$G/r18.safetensors" --reset-fc 3 --seed 9 -o c.pb
    diff <(tensors b.pb) <(tensors c.pb)
}

@test "the reader is chosen by the first bytes, not the name; stdin works" {
    cp "$G/r18.pth" weights.safetensors
    cp "$G/r18.safetensors" weights.pth
    rn-init --from weights.safetensors -o a.pb
    rn-init --from weights.pth -o b.pb
    rn-init --from - -o c.pb < "$G/r18.pth"
    diff <(tensors a.pb) <(tensors b.pb)
    diff <(tensors a.pb) <(tensors c.pb)
}

@test "hostile and unsupported .pth files: exit 1 with a clear message, no output, nothing run" {
    declare -A want=(
        [evil]="system is not allowed in a state_dict; refused"
        [model]="a whole model saved with torch.save(model) (it names the class torchvision.models.resnet.ResNet), not a state_dict"
        [legacy]="the legacy torch.save format of torch < 1.6"
        [deflated]="is compressed (zip method 8)"
        [f64]="storage type torch.DoubleStorage is not one rn reads"
        [trunc]="the file is truncated"
        [huge]="tensor a: its offset, sizes and strides reach past its storage '0' of 4 elements"
        [memo]="memo index 7 was never set"
    )
    for n in "${!want[@]}"; do
        run rn-init --from "$B/$n.pth" -o $n.pb
        assert_failure 1
        assert_output --partial "$B/$n.pth: "
        assert_output --partial "${want[$n]}"
        [ ! -e $n.pb ]
        [ ! -e $n.pb.tmp ]
    done
    [ ! -e pwned ]
    [ ! -e "$B/pwned" ]
    # an existing output survives a refused import
    rn-init --arch resnet18 -o out.pb
    before=$(md5sum < out.pb)
    run rn-init --from "$B/evil.pth" -o out.pb
    assert_failure 1
    assert_equal "$(md5sum < out.pb)" "$before"
}

@test "the commands the refusals print work: a whole model and a legacy file re-saved import" {
    cp "$B/model.pth" model.pth
    cp "$B/legacy.pth" legacy.pth
    run rn-init --from model.pth -o m.pb
    assert_output --partial "python3 -c \"import torch; torch.save(torch.load('model.pth', map_location='cpu', weights_only=False).state_dict(), 'model.sd.pth')\""
    cmd=$(sed -n "s/.*python3 -c \"\(.*\)\" (this.*/\1/p" <<<"$output")
    "$PYTHON" -c "$cmd"
    run rn-init --from model.sd.pth -o m.pb
    assert_success
    run rn-init --from legacy.pth -o l.pb
    assert_output --partial "'legacy.zip.pth')"
    cmd=$(sed -n "s/.*python3 -c \"\(.*\)\"$/\1/p" <<<"$output")
    "$PYTHON" -c "$cmd"
    run rn-init --from legacy.zip.pth -o l.pb
    assert_success
}
