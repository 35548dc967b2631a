#!/usr/bin/env bats
# --device on a machine without a usable GPU (CI, most machines): "cuda" fails with a
# message that points at rn-gpuinfo, "auto" trains on the CPU and says so once. The
# GPU-vs-CPU comparisons themselves are test_cuda_ops and make gpu-check.
load helper
bats_require_minimum_version 1.5.0

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    toy_setup 16
}

setup() {
    in_file_dir
    if rn-gpuinfo --check >/dev/null 2>&1; then skip "a GPU is usable here: make gpu-check covers it"; fi
}
teardown() { drop_test_outputs; }

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

@test "RN_CUDA_INJECT: a malformed value is refused by each tool (exit 2, the form said); on the CPU a good one changes nothing" {
    for v in bogus find=x find=0 conv=3002 "find=3002,bn"; do
        run --separate-stderr env RN_CUDA_INJECT="$v" rn-train $T --out bad.pb
        assert_failure 2
        [[ "$stderr" == *"RN_CUDA_INJECT='$v': expected KIND=STATUS"* ]]
    done
    [ ! -e bad.pb ]
    run --separate-stderr env RN_CUDA_INJECT=find=4004 rn-eval --data train.lmdb --ckpt init.pb --crop 32
    assert_success
    run --separate-stderr env RN_CUDA_INJECT=bn rn-eval --data train.lmdb --ckpt init.pb --crop 32
    assert_failure 2
    # (the CPU calls no cuDNN: the same tensors)
    rn-train $T --out plain.pb --device cpu
    RN_CUDA_INJECT=find=4004,bn=3002,bn-bwd=3002 rn-train $T --out injected.pb --device cpu
    diff <(rn-info --tensors plain.pb | sed -n '/^tensors:/,$p') <(rn-info --tensors injected.pb | sed -n '/^tensors:/,$p')
}

@test "--cuda-graphs without a backend with graphs: refused by name, exit 1, no checkpoint" {
    run --separate-stderr rn-train $T --out graphs.pb --cuda-graphs
    assert_failure 1
    [[ "$stderr" == *"--cuda-graphs needs a backend with graphs (--device cuda); this run is on cpu"* ]]
    [ ! -e graphs.pb ]
}

@test "--cuda-graphs with --profile: exit 2, saying why" {
    run --separate-stderr rn-train --data train.lmdb --in init.pb --batch 8 --crop 32 --out graphs.pb --cuda-graphs \
        --profile prof.txt
    assert_failure 2
    [[ "$stderr" == *"--cuda-graphs with --profile: the profile times each op"* ]]
    [ ! -e graphs.pb ]
}

@test "test_cuda_ops skips cleanly without a GPU" {
    run "${RN_BUILD:-$BATS_TEST_DIRNAME/../build}/tests/test_cuda_ops"
    assert_success
    assert_output --partial "SKIP"
}

@test "make bench-gpu without a usable GPU: 'bench-gpu: skipped: <why>', exit 0, no benchmark line" {
    run make --no-print-directory -C "$BATS_TEST_DIRNAME/.." BUILD="${RN_BUILD:-$BATS_TEST_DIRNAME/../build}" \
        PYTHON="$PYTHON" BENCH_GPU_DIR="$BATS_TEST_TMPDIR/bg" bench-gpu
    assert_success
    if cuda_build; then
        assert_output --regexp 'bench-gpu: skipped: cuda:0: no usable NVIDIA GPU: [^ ]'
    else
        assert_output --partial "bench-gpu: skipped: device 'cuda': this rn build has no CUDA support"
    fi
    refute_output --regexp ': rn='
}

@test "bench-gpu's dry run on the CPU: every line in the summary form, rows rn cannot run say so with no number" {
    have_torch || skip "needs PyTorch for the peer"
    plain_build_only "a dry run of the benchmark script (rn-train and PyTorch runs)"
    mpi_no_leak_checks # its DDP row runs rn-train under mpirun
    # a stand-in NVML, so that the sampling and its windows run too
    cc -shared -fPIC -o "$BATS_TEST_TMPDIR/libnvidia-ml.so.1" "$BATS_TEST_DIRNAME/gpu/fake-nvml.c"
    run --separate-stderr env LD_LIBRARY_PATH="$BATS_TEST_TMPDIR" BENCH_GPU_DRY=1 BENCH_GPU_DIR="$BATS_TEST_TMPDIR/bg" \
        BUILD="${RN_BUILD:-$BATS_TEST_DIRNAME/../build}" PYTHON="$PYTHON" "$BATS_TEST_DIRNAME/bench/gpu.sh"
    assert_success
    [[ "$stderr" == *"DRY RUN on the CPU"* ]]
    n='[0-9]+(\.[0-9]+)?'
    # the backend variants, each against the default (fp32 here; fp16 on a GPU)
    [[ "$stderr" =~ "rn fp32 with RN_CUDA_BN=cudnn: img/s="$n" against "$n" by default: ratio "$n ]]
    [[ "$stderr" =~ "rn fp32 with RN_CUDA_STEM=plain: img/s="$n" against "$n" by default: ratio "$n"; launches per step "$n" against "$n ]]
    # no graphs on the CPU: the graph variant says so
    [[ "$stderr" == *"rn fp32 with RN_BENCH_CUDA_GRAPHS=1: not run: RN_BENCH_CUDA_GRAPHS=1: the cpu"*"backend has no graphs"* ]]
    assert_line --regexp "^gpu-train-fp32: rn=$n peer=$n ratio=$n\$"
    assert_line --regexp "^gpu-train-loader-fp32: rn=$n peer=$n ratio=$n\$"
    # the stand-in's 87% busy, and its 1 GiB more in use once the run started
    assert_line "gpu-busy-fp32: rn=87.0 peer=87.0 ratio=1.00"
    assert_line "gpu-device-mib-fp32: rn=1024.0 peer=1024.0 ratio=1.00"
    assert_line "gpu-busy-loader-fp32: rn=87.0 peer=87.0 ratio=1.00"
    # no CUDA allocator to ask on the CPU: no number, no ratio
    assert_line --regexp "^gpu-peak-mib-fp32: rn=$n peer=- ratio=-\$"
    # the CPU backend computes in fp32: the AMP rows say so, with the peer's figure only
    assert_line --regexp "^gpu-train-fp16: not run: AMP needs a GPU: .*\(peer: $n img/s\)\$"
    assert_line --regexp "^gpu-train-amp: not run: .*\(peer fp16: $n img/s\)\$"
    refute_line --regexp '^gpu-(train|busy|peak-mib|device-mib)-(fp16|bf16): rn='
    # data parallel: 2 CPU processes in fp32, rn under mpirun where it can, the peer on gloo
    if command -v mpirun >/dev/null && grep -q "This build: with Open MPI" <<<"$(rn-train --help)"; then
        assert_line --regexp "^gpu-train-ddp-2-fp32: rn=$n peer=$n ratio=$n\$"
        assert_line --regexp "^gpu-scaling-2-fp32: rn=$n peer=$n ratio=$n\$"
    else
        assert_line --regexp "^gpu-train-ddp-2-fp32: not run: .*\(peer: $n img/s\)\$"
    fi
    # mixed precision first, each precision's lines together, the loader's after the synthetic ones
    order=$(grep -oE '^gpu-(train|train-loader)-(fp16|bf16|fp32):' <<<"$output" | tr '\n' ' ')
    assert_equal "$order" "gpu-train-fp16: gpu-train-bf16: gpu-train-fp32: gpu-train-loader-fp16: gpu-train-loader-fp32: "
    # every line is the summary form or says what was not run; gpu-train-amp comes last
    bad=$(grep -Ev '^[a-z0-9-]+: (rn=[^ ]+ peer=[^ ]+ ratio=[^ ]+|not run: .*)$' <<<"$output" || true)
    [ -z "$bad" ] || { echo "not a benchmark line: $bad"; false; }
    [[ "${lines[-1]}" == gpu-train-amp:* ]]
}

@test "device-run.sh: says what the machine provides; a part stops at DEVICE_RUN_SECONDS, saying so; bench's lines" {
    cuda_build || skip "a CPU-only build: the device script wants the CUDA backend built"
    plain_build_only "a dry run of the device script (gpu-check and bench-gpu's own dry runs are tested above and below)"
    [ -e /usr/local/cuda/include/cudnn.h ] || skip "needs the CUDA toolkit with cuDNN under /usr/local/cuda"
    mpi_no_leak_checks
    T=$BATS_TEST_TMPDIR
    E=(env DEVICE_RUN_DRY=1 DEVICE_RUN_TMP="$T" GPU_CHECK_BUILD=0 BUILD="${RN_BUILD:-$BATS_TEST_DIRNAME/../build}"
        OUT="$T/out" PYTHON="$PYTHON")
    run "${E[@]}" "$BATS_TEST_DIRNAME/gpu/device-run.sh" nonsense
    assert_failure 2
    assert_output --partial "usage: tests/gpu/device-run.sh [check|bench|all]"
    # gpu-check given 3 s: stopped, said so, the row in results.md
    run "${E[@]}" DEVICE_RUN_SECONDS=3 "$BATS_TEST_DIRNAME/gpu/device-run.sh" check
    assert_failure 124
    assert_line --regexp "^device-run: machine: .*, [0-9]+ cores, [0-9]+ GiB\$"
    assert_line --regexp "^device-run: nvcc: .*, release [0-9]+\.[0-9]+\$"
    assert_line --regexp "^device-run: cuDNN: [0-9]+\.[0-9]+\.[0-9]+\$"
    assert_line --regexp "^device-run: $PYTHON: python [0-9.]+, torch .*, tensorboard [^,]+, onnx"
    assert_output --partial "device-run: DRY RUN (DEVICE_RUN_DRY=1)"
    assert_output --partial "device-run: gpu-check: stopped after 3 s (DEVICE_RUN_SECONDS)"
    run tail -n 1 "$T/out/gpu-check/results.md"
    assert_output --partial "| device-run | STOPPED | after 3 s"
    # bench alone, one precision: its line, in the log too
    run "${E[@]}" BENCH_GPU_DIR="$T/bg" BENCH_GPU_PRECISIONS=fp32 BENCH_GPU_LOADER_PRECISIONS= BENCH_GPU_VARIANTS= \
        BENCH_GPU_DDP_N= "$BATS_TEST_DIRNAME/gpu/device-run.sh" bench
    assert_success
    assert_output --partial "device-run: bench-gpu, at most"
    assert_line --regexp "^gpu-train-fp32: rn=[0-9.]+ peer=([0-9.]+|-) ratio=([0-9.]+|-)\$"
    grep -q "^gpu-train-fp32: rn=" "$T/out/bench-gpu.log"
    [ -s "$T/out/bench-gpu/rn-fp32.txt" ]
}

@test "gpu-check's dry run on the CPU: every row it can run passes (the op harness CPU against CPU, training, ranks)" {
    cuda_build || skip "a CPU-only build: gpu-check wants the CUDA backend built"
    plain_build_only "a dry run of the GPU check script (the op harness, training, ranks)"
    mpi_no_leak_checks # its data-parallel row runs rn-train under mpirun
    # (resnet18: the script's steps at a third of resnet50's CPU time)
    run env GPU_CHECK_DRY=1 GPU_CHECK_BUILD=0 GPU_CHECK_ARCH=resnet18 GPU_CHECK_OUT="$BATS_TEST_TMPDIR/gc" \
        BUILD="${RN_BUILD:-$BATS_TEST_DIRNAME/../build}" PYTHON="$PYTHON" "$BATS_TEST_DIRNAME/gpu/gpu-check.sh"
    assert_success
    assert_output --partial "gpu-check: passed"
    assert_line --regexp '^\| ops: GPU vs CPU \(fp32, fp16, bf16\) \| ok \| test_cuda_ops: [0-9]+ passed, 0 failed'
    # (step 4e's last part, where ranks can run: a rank stopped, named by rank 0)
    if command -v mpirun >/dev/null && rn-train --help | grep -q "This build: with Open MPI"; then
        assert_line --regexp '^\| dist: .* \| ok \| .*; rank 1 of 2 hung \(stopped\), named by rank 0 in the .*; the job ended in [0-9]+ s \|'
    else
        assert_line --regexp '^\| dist: .* \| skipped \| '
    fi
    run grep -E '^\| [^|]+ \| FAIL' "$BATS_TEST_TMPDIR/gc/results.md"
    assert_failure
}

@test "gpu_watch.py without NVML exits 3 and says why" {
    "$PYTHON" -c 'import ctypes; ctypes.CDLL("libnvidia-ml.so.1")' 2>/dev/null && skip "this machine has NVML"
    run "$PYTHON" "$BATS_TEST_DIRNAME/bench/gpu_watch.py" check
    [ "$status" -eq 3 ]
    assert_output --partial "no NVML"
}
