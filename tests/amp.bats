#!/usr/bin/env bats
# rn-train --amp: refused without a GPU (the CPU backend computes in fp32), the fp32 log
# and checkpoint unchanged by it, and, where the CUDA backend starts, fp16 and bf16
# training: the loss scale in the log and the checkpoint, overflowing steps skipped and
# counted, and exact resume with the scaler's state. The network's mixed-precision path
# itself is checked on the CPU by tests/unit/test_amp.c.
load helper
bats_require_minimum_version 1.5.0

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    toy_setup 16
    # a GPU counts when the CUDA backend itself starts on it
    if rn-train --data train.lmdb --in init.pb --out probe.pb --max-steps 1 --batch 8 --crop 32 --workers 1 \
        --device cuda >/dev/null 2>&1; then touch gpu; fi
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

T="--data train.lmdb --in init.pb --batch 8 --crop 32 --workers 1 --threads 2"

need_gpu() { [ -e gpu ] || skip "no usable GPU: the CUDA backend did not start"; }

# a field of rn-info --json
info() { rn-info --json "$1" | "$PYTHON" -c "import json,sys; print(json.load(sys.stdin)[\"$2\"])"; }

@test "--amp with --device cpu: exit 2, it needs a GPU; bad --amp values and scaler flags: exit 2" {
    for p in fp16 bf16; do
        run --separate-stderr rn-train $T --out cpu.pb --max-steps 1 --amp $p --device cpu
        assert_failure 2
        [[ "$stderr" == *"--amp $p needs a GPU (--device cuda): the CPU backend computes in fp32"* ]]
    done
    run rn-train $T --out cpu.pb --amp fp8
    assert_failure 2
    assert_output --partial "--amp: 'fp8' is not off, fp16 or bf16"
    run rn-train $T --out cpu.pb --amp fp16 --loss-scale 0
    assert_failure 2
    run rn-train $T --out cpu.pb --amp fp16 --loss-scale-growth-interval 0
    assert_failure 2
    [ ! -e cpu.pb ]
}

@test "--amp with --device auto and no usable GPU: exit 1 before training, no checkpoint" {
    [ -e gpu ] && skip "a GPU is usable here: --device auto trains on it"
    for p in fp16 bf16; do
        run --separate-stderr rn-train $T --out auto.pb --max-steps 1 --amp $p --device auto --log auto.jsonl
        assert_failure 1
        [[ "$stderr" == *"--amp $p needs a GPU (--device cuda): the CPU backend computes in fp32"* ]]
        [[ "$stderr" != *"epoch 1 step"* ]]
        [ ! -e auto.pb ]
        [ ! -s auto.jsonl ]
    done
}

@test "without --amp: the log says loss_scale 1 and skipped 0, the checkpoint holds no loss scale" {
    rn-train $T --out f32.pb --max-steps 2 --log-every 1 --log f32.jsonl --device cpu
    run "$PYTHON" -c '
import json
S = [json.loads(l) for l in open("f32.jsonl") if json.loads(l)["kind"] == "step"]
assert len(S) == 2 and all(s["loss_scale"] == 1 and s["skipped"] == 0 for s in S), S'
    assert_success
    [ "$(info f32.pb loss_scale)" = 0 ]
    [ "$(info f32.pb skipped_steps)" = 0 ]
}

@test "--amp fp16 on the GPU: trains; the loss scale is logged and saved" {
    need_gpu
    run --separate-stderr rn-train $T --out h.pb --max-steps 8 --log-every 1 --log h.jsonl --device cuda --amp fp16 \
        --lr 0.05
    assert_success
    [[ "$stderr" == *"AMP fp16 (loss scale 65536)"* ]]
    run "$PYTHON" -c '
import json, math
S = [json.loads(l) for l in open("h.jsonl") if json.loads(l)["kind"] == "step"]
assert len(S) == 8 and all(math.isfinite(s["loss"]) for s in S), S
assert all(s["loss_scale"] <= 65536 and s["skipped"] in (0, 1) for s in S), S
print(sum(s["skipped"] for s in S), S[-1]["loss_scale"])'
    assert_success
    read skipped scale <<<"$output"
    [ "$(info h.pb skipped_steps)" = "$skipped" ]
    [ "$(info h.pb loss_scale)" = "$scale" ]
    [ "$(info h.pb step)" = 8 ]
}

@test "--amp fp16 on the GPU: a loss scale that overflows skips steps and halves, the steps still count" {
    need_gpu
    rn-train $T --out o.pb --max-steps 6 --log-every 1 --log o.jsonl --device cuda --amp fp16 --loss-scale 1e10
    run "$PYTHON" -c '
import json
S = [json.loads(l) for l in open("o.jsonl") if json.loads(l)["kind"] == "step"]
assert [s["step"] for s in S] == [1, 2, 3, 4, 5, 6], S
# 1e10 times a logit gradient is far past fp16: the first steps overflow
assert S[0]["skipped"] == 1 and S[0]["loss_scale"] == 5e9, S[0]
for a, b in zip(S, S[1:]):
    assert b["loss_scale"] == (a["loss_scale"] / 2 if b["skipped"] else a["loss_scale"]), (a, b)
print(sum(s["skipped"] for s in S))'
    assert_success
    [ "$(info o.pb skipped_steps)" = "$output" ]
    [ "$(info o.pb step)" = 6 ]
}

@test "--amp fp16 on the GPU: 2N steps equal N, resume, N (tensors, loss scale and its growth count)" {
    need_gpu
    # deterministic algorithms, chosen without timing: the same in each process
    A="--amp fp16 --device cuda --seed 3 --loss-scale-growth-interval 2 --deterministic"
    rn-train $T --out full.pb --max-steps 6 $A
    rn-train $T --out half.pb --max-steps 3 $A
    rn-train --data train.lmdb --in half.pb --out resumed.pb --max-steps 3 --batch 8 --crop 32 --workers 1 $A
    tensors() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }
    diff <(tensors full.pb) <(tensors resumed.pb)
    for f in step loss_scale scale_growth_tracker skipped_steps; do
        assert_equal "$(info full.pb $f)" "$(info resumed.pb $f)"
    done
}

@test "--amp bf16 on the GPU: trains without a loss scale" {
    need_gpu
    run --separate-stderr rn-train $T --out b.pb --max-steps 4 --log-every 1 --log b.jsonl --device cuda --amp bf16
    assert_success
    [[ "$stderr" == *"AMP bf16"* ]]
    run "$PYTHON" -c '
import json, math
S = [json.loads(l) for l in open("b.jsonl") if json.loads(l)["kind"] == "step"]
assert len(S) == 4 and all(math.isfinite(s["loss"]) and s["loss_scale"] == 1 and s["skipped"] == 0 for s in S), S'
    assert_success
    [ "$(info b.pb loss_scale)" = 0 ]
}

@test "--deterministic on the GPU: two runs give the same tensors bit for bit (fp32 and bf16)" {
    need_gpu
    tensors() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }
    for p in off bf16; do
        for k in 1 2; do
            rn-train $T --out det$k-$p.pb --max-steps 3 --device cuda --amp $p --deterministic
        done
        diff <(tensors det1-$p.pb) <(tensors det2-$p.pb)
        rn-eval --data train.lmdb --ckpt det1-$p.pb --crop 32 --device cuda --deterministic --json >e1.json
        rn-eval --data train.lmdb --ckpt det1-$p.pb --crop 32 --device cuda --deterministic --json >e2.json
        cmp e1.json e2.json
    done
}
