#!/usr/bin/env bats
# rn-gpuinfo on a machine without an NVIDIA driver (like CI), plus the driver paths played
# by a fake libcuda.so.1 / libnvidia-ml.so.1 built here and put first on LD_LIBRARY_PATH.

bats_require_minimum_version 1.5.0

setup_file() {
    export FAKE="$BATS_FILE_TMPDIR/fake" STUB="$BATS_FILE_TMPDIR/stub"
    mkdir -p "$FAKE" "$STUB"
    cc -shared -fPIC -DFAKE_CUDA -o "$FAKE/libcuda.so.1" "$BATS_TEST_DIRNAME/data/fake_nvidia.c"
    cc -shared -fPIC -o "$FAKE/libnvidia-ml.so.1" "$BATS_TEST_DIRNAME/data/fake_nvidia.c"
    # a CUDA runtime and NCCL played on the CPU, for --nccl (under each name rn-gpuinfo
    # may look for the runtime by)
    export FAKENC="$BATS_FILE_TMPDIR/fakenccl"
    mkdir -p "$FAKENC"
    cc -O2 -shared -fPIC -DFAKE_CUDART -o "$FAKENC/libcudart.so.13" "$BATS_TEST_DIRNAME/data/fake_nccl.c"
    cc -O2 -shared -fPIC -DFAKE_NCCL -o "$FAKENC/libnccl.so.2" "$BATS_TEST_DIRNAME/data/fake_nccl.c"
    for v in 12 11.0; do ln -sf libcudart.so.13 "$FAKENC/libcudart.so.$v"; done
    # a driver without its NVML library, as in a container with only libcuda mounted
    export NONVML="$BATS_FILE_TMPDIR/nonvml"
    mkdir -p "$NONVML" && cp "$FAKE/libcuda.so.1" "$NONVML/"
    # what people get by putting the toolkit's stubs directory on LD_LIBRARY_PATH
    if [ -f /usr/local/cuda/lib64/stubs/libcuda.so ]; then
        ln -sf /usr/local/cuda/lib64/stubs/libcuda.so "$STUB/libcuda.so.1"
    fi
    # the same sources built as with USE_CUDA=0: no RN_HAVE_CUDA, no CUDA headers
    local r="$BATS_TEST_DIRNAME/.."
    cc -std=c11 -D_GNU_SOURCE -DRN_VERSION='"test"' -I"$r/include" -Wall -Wextra -o "$BATS_FILE_TMPDIR/rn-gpuinfo-nocuda" \
        "$r/tools/rn-gpuinfo.c" "$r"/lib/gpuinfo*.c "$r/lib/cli.c" "$r/lib/fileio.c" "$r/lib/err.c" "$r/lib/json.c" "$r/lib/rng.c" "$r/lib/tensor.c" -ldl -lm
}

setup() {
    bats_load_library bats-support
    bats_load_library bats-assert
    # a real driver on the test machine would change every answer below
    if [ -e /proc/driver/nvidia/version ] || ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
        NVIDIA_HERE=1
    else
        NVIDIA_HERE=0
    fi
}

no_driver_only() { [ "$NVIDIA_HERE" = 0 ] || skip "this machine has an NVIDIA driver"; }

fake() { LD_LIBRARY_PATH="$FAKE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

json_get() { /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

@test "--help lists every flag and the exit codes" {
    run rn-gpuinfo --help
    assert_success
    for f in --json --check --watch --count --bench --nccl --timeout --device --version; do assert_output --partial -- "$f"; done
    assert_output --partial "3  no usable NVIDIA driver"
    assert_output --partial "7  this rn build has no GPU support"
}

@test "--version prints the version" {
    run rn-gpuinfo --version
    assert_success
    assert_output --regexp '^rn-gpuinfo [0-9]+\.[0-9]+\.[0-9]+'
}

@test "bad usage exits 2 and names the flag" {
    run rn-gpuinfo --no-such-flag
    assert_failure 2
    assert_output --partial "--no-such-flag"
    run rn-gpuinfo --watch 0
    assert_failure 2
    assert_output --partial "--watch: '0' is no interval"
    run rn-gpuinfo --watch abc
    assert_failure 2
    run rn-gpuinfo --count 2
    assert_failure 2
    assert_output --partial "--count only goes with --watch"
    run rn-gpuinfo --watch 1 --count 0
    assert_failure 2
    run rn-gpuinfo --check --bench
    assert_failure 2
    run rn-gpuinfo --nccl --bench
    assert_failure 2
    assert_output --partial "--nccl"
    run rn-gpuinfo --nccl --device 0
    assert_failure 2
    run rn-gpuinfo --timeout 5
    assert_failure 2
    assert_output --partial "--timeout only goes with --nccl"
    run rn-gpuinfo --nccl --timeout 0
    assert_failure 2
    run rn-gpuinfo --nccl --timeout soon
    assert_failure 2
    run rn-gpuinfo --device x --bench
    assert_failure 2
    run rn-gpuinfo extra-argument
    assert_failure 2
}

@test "without a driver: says no NVIDIA driver is loaded, not 'insufficient', exit 3" {
    no_driver_only
    run rn-gpuinfo
    assert_failure 3
    assert_output --partial "no NVIDIA driver is loaded"
    assert_output --partial "libcuda.so.1"
    assert_output --partial "fix: install the NVIDIA driver"
    refute_output --partial "insufficient"
}

@test "--check without a driver: one line with the fix, exit 3" {
    no_driver_only
    run --separate-stderr rn-gpuinfo --check
    assert_failure 3
    assert_equal "$output" ""
    assert_equal "$(wc -l <<<"$stderr")" 1
    [[ "$stderr" == "rn-gpuinfo: no NVIDIA driver is loaded"*"--device cpu"* ]]
}

@test "--json parses and has the version fields" {
    no_driver_only
    run --separate-stderr rn-gpuinfo --json
    assert_failure 3
    assert_equal "$(json_get 'd["schema"]' <<<"$output")" "rn-gpuinfo/1"
    assert_equal "$(json_get 'd["status"]["code"], d["status"]["name"]' <<<"$output")" "(3, 'no_driver')"
    assert_equal "$(json_get 'sorted(d["libraries"])' <<<"$output")" "['cublas', 'cuda', 'cudart', 'cudnn', 'nccl', 'nvml']"
    assert_equal "$(json_get 'all("version" in v and "path" in v for v in d["libraries"].values())' <<<"$output")" True
    assert_equal "$(json_get 'd["libraries"]["cuda"]["loaded"], d["driver"]["version"], d["devices"]' <<<"$output")" "(False, None, [])"
    assert_equal "$(json_get 'sorted(d["build"])' <<<"$output")" "['cublas', 'cuda', 'cudart', 'cudnn', 'nccl']"
    # what is installed is reported with where it came from
    if [ "$(json_get 'd["libraries"]["cudart"]["loaded"]' <<<"$output")" = True ]; then
        assert_equal "$(json_get 'd["libraries"]["cudart"]["path"].startswith("/")' <<<"$output")" True
        assert_equal "$(json_get 'd["libraries"]["cudart"]["version"].count(".")' <<<"$output")" 1
    fi
}

@test "--watch --count 2 without a driver: nothing on stdout, the diagnosis, exit 3 at once" {
    no_driver_only
    SECONDS=0
    run --separate-stderr rn-gpuinfo --watch 5 --count 2
    assert_failure 3
    assert_equal "$output" ""
    [[ "$stderr" == *"no NVIDIA driver is loaded"* ]]
    [ "$SECONDS" -lt 5 ]
}

@test "--bench without a driver: the diagnosis, exit 3" {
    no_driver_only
    run rn-gpuinfo --bench
    assert_failure 3
    assert_output --partial "no NVIDIA driver is loaded"
}

@test "--nccl without a driver: the diagnosis, exit 3" {
    no_driver_only
    run rn-gpuinfo --nccl
    assert_failure 3
    assert_output --partial "no NVIDIA driver is loaded"
}

@test "--nccl with one (fake) GPU: one line saying it was skipped, exit 0; the same in JSON" {
    no_driver_only
    FAKE_CU_NDEV=1 fake run --separate-stderr rn-gpuinfo --nccl
    assert_success
    assert_equal "$output" "rn-gpuinfo: --nccl: 1 GPU visible: an all-reduce needs 2 or more; skipped"
    FAKE_CU_NDEV=1 fake run --separate-stderr rn-gpuinfo --nccl --json
    assert_success
    assert_equal "$(json_get 'd["schema"], d["devices"], d["results"], d["verified"]' <<<"$output")" "('rn-gpuinfo-nccl/1', [0], [], False)"
    assert_equal "$(json_get 'd["skipped"]' <<<"$output")" "1 GPU visible: an all-reduce needs 2 or more"
}

fakenccl() { LD_LIBRARY_PATH="$FAKENC:$FAKE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FAKE_NCCL_TRACE=1 "$@"; }

@test "--nccl across two fake GPUs (a CPU runtime and NCCL): every size's sums checked, the table, the JSON" {
    no_driver_only
    fakenccl run --separate-stderr rn-gpuinfo --nccl
    assert_success
    assert_line --index 0 "NCCL 2.28.7 all-reduce (fp32 sum, out of place) across 2 GPUs (0,1), sums checked exact"
    assert_equal "$(grep -cE '^ +[0-9]+ MiB +[0-9.]+ +[0-9.]+ +[0-9.]+$' <<<"$output")" 6
    # the communicators destroyed, not aborted
    assert_equal "$(grep -c 'fake nccl: ncclCommDestroy' <<<"$stderr")" 2
    fakenccl run --separate-stderr rn-gpuinfo --nccl --json
    assert_success
    assert_equal "$(json_get 'd["devices"], d["verified"], [r["bytes"] >> 20 for r in d["results"]]' <<<"$output")" "([0, 1], True, [8, 16, 32, 64, 128, 256])"
    assert_equal "$(json_get 'all(r["busbw"] == r["algbw"] > 0 for r in d["results"])' <<<"$output")" "True"
}

@test "--nccl: wrong sums fail naming the GPU, the communicators aborted: a part summed twice, one corrupted, none written" {
    no_driver_only
    # (every GPU sends its own multiple of the data: with the same data everywhere, a
    # part taken twice and another left out would still sum right)
    FAKE_NCCL_FAULT=twice fakenccl run --separate-stderr rn-gpuinfo --nccl
    assert_failure 1
    assert_equal "$(grep -c 'is wrong on cuda:0 at element 0' <<<"$stderr")" 1
    assert_equal "$(grep -c 'fake nccl: ncclCommAbort' <<<"$stderr")" 2
    FAKE_NCCL_FAULT=corrupt FAKE_CU_NDEV=3 fakenccl run --separate-stderr rn-gpuinfo --nccl
    assert_failure 1
    assert_equal "$(grep -c 'the all-reduce of 8 MiB per GPU is wrong on cuda:2 at element 1048576' <<<"$stderr")" 1
    assert_equal "$(grep -c 'fake nccl: ncclCommAbort' <<<"$stderr")" 3
    # sums left from the run before are not taken for this run's
    FAKE_NCCL_FAULT=stale fakenccl run --separate-stderr rn-gpuinfo --nccl
    assert_failure 1
    assert_equal "$(grep -c 'is wrong on cuda:0 at element 0: -\?nan' <<<"$stderr")" 1
    assert_equal "$(grep -c 'fake nccl: ncclCommAbort' <<<"$stderr")" 2
    assert_equal "$(grep -c 'ncclCommDestroy' <<<"$stderr")" 0
}

@test "--nccl: an all-reduce that never finishes is given up at --timeout, naming the GPU and the fix, exit 1" {
    no_driver_only
    local t0=$SECONDS
    FAKE_CUDA_HANG=1 fakenccl run --separate-stderr rn-gpuinfo --nccl --timeout 0.5
    assert_failure 1
    [ $((SECONDS - t0)) -lt 20 ]
    assert_equal "$(grep -c 'the all-reduce of 8 MiB per GPU has not finished on cuda:0 within --timeout 0.5 s' <<<"$stderr")" 1
    assert_equal "$(grep -c 'NCCL_P2P_DISABLE=1' <<<"$stderr")" 1
    assert_equal "$(grep -c 'fake nccl: ncclCommAbort' <<<"$stderr")" 2
}

@test "the toolkit's stub libcuda is named as such, exit 3" {
    no_driver_only
    [ -e "$STUB/libcuda.so.1" ] || skip "no CUDA toolkit stubs here"
    LD_LIBRARY_PATH="$STUB" run --separate-stderr rn-gpuinfo --check
    assert_failure 3
    [[ "$stderr" == *"stub libcuda"* && "$stderr" == *"LD_LIBRARY_PATH"* ]]
}

@test "fake driver: two devices, versions, live figures, peer access; exit 0 when the CUDA libraries are there" {
    no_driver_only
    fake run --separate-stderr rn-gpuinfo --json
    local code=$(json_get 'd["status"]["code"]' <<<"$output")
    [ "$status" -eq "$code" ]
    assert_equal "$(json_get 'd["driver"]["version"], d["driver"]["cuda"], d["driver"]["init"]' <<<"$output")" "('580.65.06', '13.0', 'CUDA_SUCCESS')"
    assert_equal "$(json_get '[x["name"] for x in d["devices"]]' <<<"$output")" "['Fake GPU 0', 'Fake GPU 1']"
    assert_equal "$(json_get 'd["devices"][1]["pci_bus_id"], d["devices"][1]["compute_capability"], d["devices"][1]["multiprocessors"]' <<<"$output")" "('0000:0B:00.0', '9.0', 132)"
    assert_equal "$(json_get 'd["devices"][1]["memory"]["used"], d["devices"][1]["temperature_c"], d["devices"][1]["power_w"]' <<<"$output")" "(2147483648, 41, {'draw': 312.4, 'limit': 700})"
    assert_equal "$(json_get 'd["devices"][1]["throttle_reasons"], d["devices"][0]["ecc"]["enabled"]' <<<"$output")" "(['sw_power_cap'], True)"
    assert_equal "$(json_get 'd["devices"][0]["uuid"]' <<<"$output")" "GPU-11111111-1111-1111-1111-111111111111"
    assert_equal "$(json_get 'd["peer_access"]' <<<"$output")" "[[False, True], [True, False]]"
    assert_equal "$(json_get 'd["libraries"]["cuda"]["path"]' <<<"$output")" "$FAKE/libcuda.so.1"
    # with this machine's CUDA 13 runtime, cuBLAS and cuDNN 9 the stack is usable
    if [ "$(json_get 'd["libraries"]["cudart"]["version"], d["libraries"]["cudnn"]["loaded"]' <<<"$output")" = "('13.0', True)" ]; then
        assert_equal "$code" 0
        fake run rn-gpuinfo --check
        assert_success
        assert_output --partial "ok: 2 usable devices (Fake GPU 0)"
    fi
    fake run rn-gpuinfo
    assert_output --partial "GPU 1: Fake GPU 1, sm_90, 132 SMs"
    assert_output --partial "throttle     sw_power_cap"
    assert_output --partial "peer access"
}

@test "fake driver older than the runtime: 'driver too old' with the driver to install, exit 4" {
    no_driver_only
    run --separate-stderr rn-gpuinfo --json
    [ "$(json_get 'd["libraries"]["cudart"]["version"]' <<<"$output")" = "13.0" ] || skip "needs the CUDA 13 runtime"
    FAKE_CU_DRIVER=12040 fake run --separate-stderr rn-gpuinfo --check
    assert_failure 4
    [[ "$stderr" == *"supports CUDA up to 12.4"* && "$stderr" == *"CUDA 13.0"* && "$stderr" == *"580.65.06 or newer"* ]]
    [[ "$stderr" != *"no NVIDIA driver"* ]]
}

@test "fake driver with no devices: 'no device', exit 5; cuInit NO_DEVICE without a kernel module: exit 3" {
    no_driver_only
    FAKE_CU_NDEV=0 fake run --separate-stderr rn-gpuinfo --check
    assert_failure 5
    [[ "$stderr" == *"reports no CUDA device"* ]]
    FAKE_CU_INIT=100 fake run --separate-stderr rn-gpuinfo --check
    assert_failure 3
    [[ "$stderr" == *"CUDA_ERROR_NO_DEVICE"* && "$stderr" == *"kernel module"* ]]
}

@test "rn-train's GPU sampler reads NVML through the fake library: scripted utilisation, memory, power" {
    no_driver_only
    FAKE_NVML_UTIL=10,30,80 fake run "${RN_BUILD:-$BATS_TEST_DIRNAME/../build}/tests/test_gpumon"
    assert_success
    assert_output --partial "test_gpumon: NVML through the fake library checked"
    assert_output --regexp "test_gpumon: [0-9]+ passed, 0 failed"
}

@test "--watch --count 2 with a (fake) GPU: one line per device per sample" {
    no_driver_only
    fake run --separate-stderr rn-gpuinfo --watch 0.2 --count 2
    assert_success
    assert_equal "${#lines[@]}" 4
    [[ "${lines[0]}" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z\ gpu0\ util\ +97%.*mem\ +1024/81920\ MiB\ power\ +312/700\ W ]]
    [[ "${lines[3]}" == *" gpu1 "*"throttle sw_power_cap"* ]]
    fake run --separate-stderr rn-gpuinfo --watch 0.2 --count 3 --device cuda:1 --json
    assert_success
    assert_equal "${#lines[@]}" 3
    for l in "${lines[@]}"; do
        assert_equal "$(json_get 'd["index"], d["utilization_pct"]["gpu"], d["memory"]["total"]' <<<"$l")" "(1, 97, 85899345920)"
    done
    fake run rn-gpuinfo --watch 0.2 --count 1 --device 2
    assert_failure 1
    assert_output --partial "--device 2"
}

@test "driver without NVML: devices listed without live figures, --watch says what is missing, exit 1" {
    no_driver_only
    LD_LIBRARY_PATH="$NONVML" run --separate-stderr rn-gpuinfo --json
    assert_equal "$(json_get 'len(d["devices"]), d["devices"][0]["temperature_c"], d["libraries"]["nvml"]["loaded"]' <<<"$output")" "(2, None, False)"
    assert_equal "$(json_get 'any("libnvidia-ml.so.1" in n for n in d["notes"])' <<<"$output")" True
    LD_LIBRARY_PATH="$NONVML" run rn-gpuinfo --watch 1 --count 2
    assert_failure 1
    assert_output --partial "libnvidia-ml.so.1"
    assert_output --partial "nvidia-smi"
}

@test "--watch until interrupted: SIGINT ends it cleanly with exit 0" {
    no_driver_only
    LD_LIBRARY_PATH="$FAKE" rn-gpuinfo --watch 0.2 --device 0 >"$BATS_TEST_TMPDIR/w" 2>&1 3>&- &
    local pid=$!
    # two samples in, however slow the start (a sanitizer build on a loaded machine took
    # longer than a fixed 0.7 s), then the interrupt
    for _ in $(seq 300); do
        [ "$(grep -c ' gpu0 ' "$BATS_TEST_TMPDIR/w")" -ge 2 ] && break
        sleep 0.1
    done
    kill -INT "$pid"
    local rc=0
    wait "$pid" || rc=$?
    assert_equal "$rc" 0
    [ "$(grep -c ' gpu0 ' "$BATS_TEST_TMPDIR/w")" -ge 2 ]
}

@test "built without CUDA: says this build has no GPU support, exit 7 (--check, --json, --bench)" {
    run "$BATS_FILE_TMPDIR/rn-gpuinfo-nocuda" --check
    assert_failure 7
    assert_output --partial "this rn build has no GPU support"
    assert_output --partial "USE_CUDA=1"
    run --separate-stderr "$BATS_FILE_TMPDIR/rn-gpuinfo-nocuda" --json
    assert_failure 7
    assert_equal "$(json_get 'd["build"]["cuda"], d["status"]["name"]' <<<"$output")" "(False, 'no_build_gpu')"
    run "$BATS_FILE_TMPDIR/rn-gpuinfo-nocuda" --bench
    assert_failure 7
    run "$BATS_FILE_TMPDIR/rn-gpuinfo-nocuda" --nccl
    assert_failure 7
    assert_output --partial "this rn build has no GPU support"
    # the report still shows what the machine has
    run "$BATS_FILE_TMPDIR/rn-gpuinfo-nocuda"
    assert_failure 7
    assert_output --partial "built without GPU support"
    assert_output --partial "NVIDIA driver"
}
