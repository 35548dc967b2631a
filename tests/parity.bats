#!/usr/bin/env bats
# The network against torchvision: training-mode logits, loss, every gradient, BN
# running stats and weights after two SGD steps, and eval-mode logits (see
# tests/parity/train_parity.py for the criterion).
load helper

setup() {
    have_torch || skip "no torch/torchvision for $PYTHON (run make deps)"
    cd "$BATS_TEST_DIRNAME/parity"
}

parity() {
    run "$PYTHON" train_parity.py "$@"
    echo "$output"
    assert_success
    assert_output --regexp "tensors, 0 failed"
}

@test "resnet18 32x32 batch 4 matches torchvision" { parity resnet18 32; }
@test "resnet18 64x64 batch 4 matches torchvision" { parity resnet18 64; }
@test "resnet50 32x32 batch 4 matches torchvision" {
    [ -n "${RN_SANITIZE:-}" ] && skip "resnet50 under the sanitizers is too slow; covered by the plain build"
    parity resnet50 32
}
@test "resnet50 64x64 batch 4 matches torchvision" {
    [ -n "${RN_SANITIZE:-}" ] && skip "resnet50 under the sanitizers is too slow; covered by the plain build"
    parity resnet50 64
}
