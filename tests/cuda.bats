#!/usr/bin/env bats
# --device on a machine without a usable GPU (CI, most machines): "cuda" fails with a
# message that points at rn-gpuinfo, "auto" trains on the CPU and says so once. The
# GPU-vs-CPU comparisons themselves are test_cuda_ops and make gpu-check.
load helper
bats_require_minimum_version 1.5.0

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src 16 1
    rn-prep -q src train.lmdb
    rn-init --arch resnet18 --classes 2 --seed 1 -o init.pb
}

setup() {
    cd "$BATS_FILE_TMPDIR"
    if rn-gpuinfo --check >/dev/null 2>&1; then skip "a GPU is usable here: make gpu-check covers it"; fi
}

T="--data train.lmdb --in init.pb --max-steps 2 --batch 8 --crop 32 --workers 1 --threads 2"

cuda_build() { ar t "${RN_BUILD:-$BATS_TEST_DIRNAME/../build}/librn.a" | grep -q '^backend_cuda\.cu\.o$'; }

@test "--device cuda without a usable GPU: exit 1, says why and points at rn-gpuinfo and --device cpu" {
    for dev in cuda cuda:1; do
        run --separate-stderr rn-train $T --out gpu.pb --device $dev
        assert_failure 1
        if cuda_build; then
            [[ "$stderr" == *"no usable NVIDIA GPU"*"rn-gpuinfo"*"--device cpu"* ]]
            # not cudart's "driver version is insufficient" alone, which misleads without a driver
            [[ "$stderr" != *"insufficient"* ]] || [[ "$stderr" == *"driver supports CUDA"* ]]
        else
            [[ "$stderr" == *"this rn build has no CUDA support"*"--device cpu"* ]]
        fi
        [ ! -e gpu.pb ]
    done
}

@test "--device cuda:x is refused, naming the device" {
    run --separate-stderr rn-train $T --out bad.pb --device cuda:x
    assert_failure
    [[ "$stderr" == *"cuda:x"* ]]
    [ ! -e bad.pb ]
}

@test "--device auto without a usable GPU trains on the CPU and says so once" {
    run --separate-stderr rn-train $T --out auto.pb --device auto
    assert_success
    [ -s auto.pb ]
    [ "$(grep -c ' on cpu: ' <<<"$stderr")" -eq 1 ]
    if cuda_build; then [[ "$stderr" == *"(auto: no usable GPU)"* ]]; fi
}

@test "test_cuda_ops skips cleanly without a GPU" {
    run "${RN_BUILD:-$BATS_TEST_DIRNAME/../build}/tests/test_cuda_ops"
    assert_success
    assert_output --partial "SKIP"
}
