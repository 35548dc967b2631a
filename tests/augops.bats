#!/usr/bin/env bats
# torchvision's augmentation ops and policies (rn/augops.h) against torchvision 0.14 on uint8
# tensors: every op's pixels (identical bytes; the geometric ops' float32 grid formed in one
# fixed summation order, checked against torch's own, whose rounding depends on the machine's
# BLAS kernel), and each policy's sampler over
# 100,000 draws (chi-square / Kolmogorov-Smirnov, p > 1e-3, fixed seeds). See
# tests/parity/augops_parity.py; tests/unit/test_augops.c has the checks that need no torch.
load helper

setup() {
    have_torch || skip "no torch/torchvision for $PYTHON (run make deps)"
    RN_BUILD=${RN_BUILD:-$BATS_TEST_DIRNAME/../build}
    [ -x "$RN_BUILD/tests/parity_augops" ] || skip "no $RN_BUILD/tests/parity_augops (make it first)"
    cd "$BATS_TEST_DIRNAME/parity"
}

@test "every augmentation op gives torchvision's bytes (c=1 and 3, odd and even sizes, the policies' magnitudes)" {
    run "$PYTHON" augops_parity.py pixels "$RN_BUILD/tests/parity_augops"
    echo "$output"
    assert_success
    assert_output --regexp "checks, 0 failed"
}

@test "TrivialAugmentWide, RandAugment, AutoAugment and ColorJitter sample as torchvision does (100,000 draws)" {
    [ -n "${RN_SANITIZE:-}" ] && skip "100,000 draws under the sanitizers is too slow; covered by the plain build"
    run "$PYTHON" augops_parity.py draws "$RN_BUILD/tests/parity_augops"
    echo "$output"
    assert_success
    assert_output --regexp "checks, 0 failed"
}

@test "the harness refuses an unknown policy with exit 2 and says which" {
    run "$RN_BUILD/tests/parity_augops" draw nosuch - 1 8 8 1
    assert_failure 2
    assert_output --partial "unknown augmentation policy 'nosuch'"
}
