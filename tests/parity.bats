#!/usr/bin/env bats
# The network against torchvision: training-mode logits, loss, every gradient, BN
# running stats and weights after two SGD steps, and eval-mode logits (see
# tests/parity/train_parity.py for the criterion); the inference path (BN folded into the
# convs) against the exact path and torchvision (tests/parity/infer_parity.py).
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

infer_parity() {
    run "$PYTHON" infer_parity.py "$@"
    echo "$output"
    assert_success
    assert_output --regexp ": 0 failed;"
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

@test "inference path (BN folded, fused conv): resnet18 48x48 batch 3 matches the exact path and torchvision, same bits at 1, 2 and 3 threads" {
    infer_parity resnet18 48 3
}
@test "inference path (BN folded, fused conv, Winograd 3x3 convs in the first stage): resnet50 64x64 batch 2 matches the exact path and torchvision, same bits at 1, 2 and 3 threads" {
    [ -n "${RN_SANITIZE:-}" ] && skip "resnet50 under the sanitizers is too slow; covered by the plain build"
    infer_parity resnet50 64 2
}
@test "RN_CPU_GEMM=openblas: inference path with its GEMMs through OpenBLAS: resnet18 48x48 batch 3 matches the exact path and torchvision, same bits at 1, 2 and 3 threads" {
    RN_CPU_GEMM=openblas infer_parity resnet18 48 3
}
@test "RN_CPU_WINOGRAD=0: inference path with every conv as im2col + GEMM: resnet50 64x64 batch 2 matches the exact path and torchvision, same bits at 1, 2 and 3 threads" {
    [ -n "${RN_SANITIZE:-}" ] && skip "resnet50 under the sanitizers is too slow; covered by the plain build"
    RN_CPU_WINOGRAD=0 infer_parity resnet50 64 2
}
@test "inference path at 224x224 (Winograd 3x3 convs in 3 of ResNet-50's 4 stages) batch 2 matches the exact path and torchvision" {
    [ -n "${RN_SANITIZE:-}" ] && skip "resnet50 under the sanitizers is too slow; covered by the plain build"
    infer_parity resnet50 224 2
}
