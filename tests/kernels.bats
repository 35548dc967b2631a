#!/usr/bin/env bats
# The same bytes on every OpenBLAS kernel: the CPU backend's ops (test_threads) and a short
# rn-train + rn-eval give identical results for 1, 2 and 3 threads, under the kernel
# OpenBLAS picks as the environment stands and under each kernel named below that this
# CPU can execute; and, on rn's own GEMM kernel (the default where the CPU has AVX2 and
# FMA), identical results across all those kernels and at AVX2 as at AVX-512 (the last
# test). A kernel the CPU cannot run (AVX-512 on a CPU without it) is skipped, saying so.
# OPENBLAS_CORETYPE is set here per test to cover kernels beyond the one this machine
# would pick: the environment's own choice is always tested first, unchanged.
load helper

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    toy_setup 16
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

UNIT="$RN_BUILD/tests/test_threads"

# run "$@" with OpenBLAS's kernel forced to $1 ("" leaves the environment as it is;
# "unset": the kernel OpenBLAS detects itself, OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset)
with_core() {
    local core=$1
    shift
    case $core in
        "") "$@" ;;
        unset) env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$@" ;;
        *) OPENBLAS_CORETYPE=$core "$@" ;;
    esac
}

# skip unless the kernel $1 runs on this CPU (the probe dies of SIGILL where it cannot)
need_core() {
    [ -x "$UNIT" ] || skip "$UNIT not built (make all)"
    run with_core "$1" "$UNIT" --probe
    [ "$status" -eq 0 ] || skip "this CPU cannot execute OpenBLAS's $1 kernel (probe exit $status)"
}

# test_threads, then rn-train for 3 steps and rn-eval at 1, 2 and 3 threads: every
# tensor and every logit identical
same_bytes_on() {
    need_core "$1"
    run with_core "$1" "$UNIT"
    echo "$output"
    assert_success
    # under the sanitizers (slow) the tools run with the environment's kernel only; the
    # plain build runs them under every kernel
    if [ -n "${RN_SANITIZE:-}" ] && [ -n "$1" ]; then return 0; fi
    local k=k${1:-env}
    for t in 1 2 3; do
        with_core "$1" rn-train --data train.lmdb --in init.pb --out $k-$t.pb --batch 8 --crop 32 \
            --workers 2 --threads $t --max-steps 3 --lr 0.05 2> /dev/null
        # every tensor's name, shape, type and CRC32C (not the provenance: it names --threads)
        rn-info --tensors $k-$t.pb | grep '^  [a-z]' > $k-$t.tensors
        with_core "$1" rn-eval --data train.lmdb --ckpt $k-$t.pb --crop 32 --threads $t \
            --dump-logits $k-$t.logits > /dev/null
    done
    [ "$(wc -l < $k-1.tensors)" -eq 184 ]
    for t in 2 3; do
        run diff $k-1.tensors $k-$t.tensors
        assert_success
        run cmp $k-1.logits $k-$t.logits
        assert_success
    done
}

@test "same bytes for 1, 2 and 3 threads: OpenBLAS's kernel as the environment picks it" {
    same_bytes_on ""
}

@test "same bytes for 1, 2 and 3 threads: the kernel OpenBLAS detects (OPENBLAS_* unset)" {
    same_bytes_on unset
}

@test "same bytes for 1, 2 and 3 threads: Haswell kernel" { same_bytes_on Haswell; }
@test "same bytes for 1, 2 and 3 threads: SkylakeX kernel" { same_bytes_on SkylakeX; }
@test "same bytes for 1, 2 and 3 threads: Cooperlake kernel" { same_bytes_on Cooperlake; }
@test "same bytes for 1, 2 and 3 threads: Zen kernel" { same_bytes_on Zen; }
@test "same bytes for 1, 2 and 3 threads: Sandybridge kernel" { same_bytes_on Sandybridge; }
@test "same bytes for 1, 2 and 3 threads: Prescott kernel" { same_bytes_on Prescott; }

# rn's own GEMM kernel (lib/backend_cpu_fused.c) runs every conv and fc GEMM of training
# and inference and sums each element in one order: whichever kernel OpenBLAS would pick,
# and in each of the kernel's forms (RN_CPU_GEMM=avx2 on a CPU with AVX-512; the portable
# C form, RN_CPU_GEMM=portable), the tensors and logits are the same bytes. (Through
# OpenBLAS, RN_CPU_GEMM=openblas, each kernel rounds its own way.)
@test "one result on every OpenBLAS kernel and in every form of rn's own GEMM kernel (AVX-512, AVX2, portable C)" {
    plain_build_only "it runs the tools under every kernel"
    [ -x "$UNIT" ] || skip "$UNIT not built (make all)"
    run rn-train --data train.lmdb --in init.pb --out own-probe.pb --batch 8 --crop 32 --max-steps 1
    assert_success
    [[ "$output" == *"on cpu: rn GEMM"* ]] ||
        skip "rn's own GEMM kernel does not run here (no AVX2 and FMA): each OpenBLAS kernel rounds its own way"
    local runs=0 core
    for core in "" unset Haswell SkylakeX Cooperlake Zen Sandybridge Prescott avx2 portable; do
        local pre=(with_core "$core")
        if [ "$core" = avx2 ] || [ "$core" = portable ]; then
            pre=(env RN_CPU_GEMM=$core)
        elif ! with_core "$core" "$UNIT" --probe > /dev/null 2>&1; then
            echo "# OpenBLAS's $core kernel cannot run on this CPU: not compared"
            continue
        fi
        local k=own-${core:-env}
        "${pre[@]}" rn-train --data train.lmdb --in init.pb --out $k.pb --batch 8 --crop 32 --workers 2 \
            --threads 2 --max-steps 3 --lr 0.05 2> /dev/null
        rn-info --tensors $k.pb | grep '^  [a-z]' > $k.tensors
        "${pre[@]}" rn-eval --data train.lmdb --ckpt $k.pb --crop 32 --threads 2 --dump-logits $k.logits > /dev/null
        runs=$((runs + 1))
        [ "$k" = own-env ] && continue
        run diff own-env.tensors $k.tensors
        assert_success
        run cmp own-env.logits $k.logits
        assert_success
    done
    [ "$(wc -l < own-env.tensors)" -eq 184 ]
    echo "# $runs runs compared"
    [ "$runs" -ge 4 ]
}

# The portable C form is the one a non-x86 CPU with a fused multiply-add runs (aarch64:
# Grace, Graviton). tests/xarch/gemm_forms.c runs a set of products through the kernel
# alone; built for aarch64 (make, where aarch64-linux-gnu-gcc is installed: make deps
# installs it) and run under qemu-aarch64, it must print the hashes the x86-64 forms print.
@test "rn's GEMM kernel gives the same bits on aarch64 (under qemu) as in each x86-64 form" {
    local x86=$RN_BUILD/tests/gemm_forms a64=$RN_BUILD/tests/gemm_forms.aarch64
    [ -x "$x86" ] || skip "$x86 not built (make all)"
    command -v qemu-aarch64 > /dev/null || skip "no qemu-aarch64 (make deps installs qemu-user)"
    [ -x "$a64" ] || skip "$a64 not built: no aarch64-linux-gnu-gcc (make deps installs it)"
    run "$x86" widest
    assert_success
    [ "$(grep -c '^[a-z]' <<< "$output")" -eq 8 ]
    local want=$output form
    for form in avx2 portable; do
        run "$x86" $form
        if [ "$status" -eq 3 ]; then
            echo "# no $form form on this CPU"
            continue
        fi
        assert_success
        assert_output "$want"
    done
    run qemu-aarch64 "$a64" --which
    assert_output "portable C"
    run qemu-aarch64 "$a64" widest
    assert_success
    assert_output "$want"
}
