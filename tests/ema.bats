#!/usr/bin/env bats
# rn-train --ema-decay/--ema-every (torchvision's --model-ema), the EMA set in the
# checkpoint, rn-eval --ema, rn-export --ema and rn-info, on a tiny generated dataset
# (64 images: 4 steps of 16 per epoch).
load helper

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/train 32 1
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/val 16 2
    rn-prep -q src/train train.lmdb
    rn-prep -q --classes train.lmdb src/val val.lmdb
    rn-init --arch resnet18 --classes 2 --seed 1 -o init.pb
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

T="--batch 16 --crop 32 --workers 2"
E="--ema-decay 0.99 --ema-every 2 --lr-epochs 3 --warmup-epochs 1 --lr 0.02"

# the tensors of one set of a checkpoint (rn-info --tensors: name, shape, dtype, crc32c)
set_lines() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p' | grep -E " $2\$"; }

@test "flags: --help names them; bad values and --ema-every without an EMA exit 2" {
    run rn-train --help
    assert_output --partial "--ema-decay D"
    assert_output --partial "--ema-every N"
    run rn-eval --help
    assert_output --partial "--ema"
    run rn-export --help
    assert_output --partial "--ema"
    run rn-train --data train.lmdb --in init.pb --out x.pb --ema-decay 1.5
    assert_failure 2
    assert_output --partial "--ema-decay"
    run rn-train --data train.lmdb --in init.pb --out x.pb --ema-decay 0.9 --ema-every 0
    assert_failure 2
    assert_output --partial "--ema-every"
    run rn-train --data train.lmdb --in init.pb --out x.pb --ema-every 4
    assert_failure 2
    assert_output --partial "--ema-every 4: the moving average is off (init.pb holds none): give --ema-decay D"
    run rn-train --data train.lmdb --in init.pb --out x.pb --ema-every 4 --ema-decay 0
    assert_failure 2
    assert_output --partial "--ema-every 4 with --ema-decay 0 (off)"
    [ ! -e x.pb ]
}

@test "without --ema-decay nothing changes: no EMA set, rn-info says none, --ema is refused with advice" {
    rn-train --data train.lmdb --in init.pb --out plain.pb --max-steps 2 $T
    run rn-info plain.pb
    refute_output --partial "ema:"
    run rn-info --json plain.pb
    assert_output --partial '"ema":null'
    run rn-eval --data val.lmdb --ckpt plain.pb --crop 32 --ema
    assert_failure 1
    assert_output --partial "plain.pb holds no EMA weights (--ema asks for them): train with rn-train --ema-decay D"
    run rn-export --ema plain.pb out.safetensors
    assert_failure 1
    assert_output --partial "plain.pb holds no EMA weights"
    [ ! -e out.safetensors ]
    # the protobuf holds no field 10 (EmaState) at all: older readers see the file they know
    run "$PYTHON" -c '
import sys
b = open("plain.pb", "rb").read()
i, fields = 0, set()
def varint(i):
    v, s = 0, 0
    while True:
        c = b[i]; i += 1; v |= (c & 0x7F) << s; s += 7
        if c < 0x80: return v, i
while i < len(b):
    key, i = varint(i)
    fields.add(key >> 3)
    t = key & 7
    if t == 0: _, i = varint(i)
    elif t == 2: n, i = varint(i); i += n
    elif t == 1: i += 8
    elif t == 5: i += 4
    else: sys.exit("bad wire type")
print(sorted(fields))'
    assert_success
    refute_output --partial "10"
}

@test "the EMA set equals torchvision's ExponentialMovingAverage over the same weights (12 steps, warm-up reset)" {
    plain_build_only "12 one-step runs against torchvision"
    have_torch || skip "no torch/torchvision for $PYTHON (run make deps)"
    # one step per run (resume is exact, tested below), the weights after each exported
    prev=init.pb
    ws=()
    for k in $(seq 1 12); do
        rn-train --data train.lmdb --in $prev --out s$k.pb --max-steps 1 $T $E --threads 2 2> /dev/null
        rn-export s$k.pb w$k.safetensors
        ws+=(w$k.safetensors)
        prev=s$k.pb
    done
    rn-export --ema s12.pb ema12.safetensors
    run rn-info --json s12.pb
    assert_output --regexp '"ema":\{"decay":0\.98999[0-9]*,"every":2,"alpha":0\.10666[0-9]*,'
    # 6 updates: 2 in epoch 1, each reset (warm-up), then a copy and 3 averages in epochs 2 and 3
    assert_output --partial '"updates":4}'
    run "$PYTHON" "$BATS_TEST_DIRNAME/parity/ema_ref.py" resnet18 2 0.99 2 16 3 4 1 ema12.safetensors "${ws[@]}"
    echo "$output"
    assert_success
    assert_output --partial "6 updates, n_averaged 4: 102 floating tensors, 0 differ beyond float rounding"
    # and it is not just the model: the average differs from the last weights
    run cmp -s ema12.safetensors w12.safetensors
    assert_failure
}

@test "the average starts as a copy of the input model (AveragedModel's deepcopy), not zeros" {
    rn-train --data train.lmdb --in init.pb --out a.pb --max-steps 1 $T --threads 2 2> /dev/null
    # step 1 of the epoch: 1 % 4 != 0, no update in this run
    rn-train --data train.lmdb --in a.pb --out b.pb --max-steps 1 $T --threads 2 --ema-decay 0.9 --ema-every 4 \
        2> /dev/null
    run rn-info --json b.pb
    assert_output --partial '"updates":0}'
    rn-export a.pb a.safetensors
    rn-export --ema b.pb b_ema.safetensors
    cmp a.safetensors b_ema.safetensors
}

@test "resume with EMA is exact, and the EMA set is the same bytes for --threads 1, 2 and 3" {
    plain_build_only "runs at 1, 2 and 3 threads and resumed"
    for t in 1 2 3; do
        rn-train --data train.lmdb --in init.pb --out full$t.pb --max-steps 10 $T $E --threads $t 2> /dev/null
    done
    rn-train --data train.lmdb --in init.pb --out half.pb --max-steps 5 $T $E --threads 2 2> /dev/null
    rn-train --data train.lmdb --in half.pb --out resumed.pb --max-steps 5 $T $E --threads 3 2> /dev/null
    [ -n "$(set_lines full1.pb ema)" ]
    [ -n "$(set_lines full1.pb 'ema buffer')" ]
    diff <(set_lines full1.pb ema) <(set_lines full2.pb ema)
    diff <(set_lines full1.pb ema) <(set_lines full3.pb ema)
    diff <(set_lines full1.pb 'ema buffer') <(set_lines full3.pb 'ema buffer')
    diff <(set_lines full1.pb ema) <(set_lines resumed.pb ema)
    diff <(set_lines full1.pb 'ema buffer') <(set_lines resumed.pb 'ema buffer')
    all() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }
    diff <(all full1.pb) <(all resumed.pb)
    ema() { rn-info --json "$1" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["ema"])'; }
    assert_equal "$(ema full1.pb)" "$(ema resumed.pb)"
    # a resume without the flags keeps the checkpoint's EMA going; --ema-decay 0 drops it
    rn-train --data train.lmdb --in half.pb --out kept.pb --max-steps 5 $T --lr-epochs 3 --warmup-epochs 1 \
        --lr 0.02 --threads 2 2> /dev/null
    diff <(set_lines full1.pb ema) <(set_lines kept.pb ema)
    run rn-train --data train.lmdb --in half.pb --out dropped.pb --max-steps 1 $T --ema-decay 0
    assert_success
    assert_output --partial "the EMA weights of the input are dropped"
    run rn-info --json dropped.pb
    assert_output --partial '"ema":null'
}

@test "--val reports the EMA's accuracy too; rn-eval --ema and rn-export --ema read the EMA set" {
    run rn-train --data train.lmdb --in init.pb --out v.pb --epochs 2 $T --ema-decay 0.999 --ema-every 1 \
        --val val.lmdb --log v.jsonl --threads 2
    assert_success
    assert_output --partial "epoch 2: val EMA top1="
    run rn-info v.pb
    assert_output --partial "ema:           decay 0.999, every 1 steps"
    assert_output --partial "ema_top1"
    # the last epoch's EMA validation is what rn-eval --ema measures on the saved set
    logged=$("$PYTHON" -c '
import json
e = [json.loads(l) for l in open("v.jsonl") if "\"epoch\"" in l and "ema_val_top1" in l][-1]
print("%.4f %.3f" % (e["ema_val_top1"], e["ema_val_loss"]))')
    measured=$(rn-eval --data val.lmdb --ckpt v.pb --crop 32 --ema --json --threads 2 | "$PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
print("%.4f %.3f" % (r["top1"], r["loss"]))')
    assert_equal "$logged" "$measured"
    # rn-eval without --ema measures the model, a different loss
    plain=$(rn-eval --data val.lmdb --ckpt v.pb --crop 32 --json --threads 2 | "$PYTHON" -c '
import json, sys
print("%.6f" % json.load(sys.stdin)["loss"])')
    ema_loss=$(rn-eval --data val.lmdb --ckpt v.pb --crop 32 --ema --json --threads 2 | "$PYTHON" -c '
import json, sys
print("%.6f" % json.load(sys.stdin)["loss"])')
    [ "$plain" != "$ema_loss" ]
    # rn-export --ema: the EMA tensors (safetensors) and an ONNX graph with them as initializers
    rn-export --ema v.pb v_ema.safetensors
    rn-export --ema v.pb v_ema.onnx
    rn-export v.pb v.onnx
    run "$PYTHON" -c '
import sys
sys.path.insert(0, sys.argv[1])
import rnst, onnx, torch
from onnx import numpy_helper
st, _ = rnst.load("v_ema.safetensors")
def inits(p):
    return {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in onnx.load(p).graph.initializer}
e, m = inits("v_ema.onnx"), inits("v.onnx")
same = [n for n in st if n in e and torch.equal(e[n].reshape(st[n].shape).to(st[n].dtype), st[n])]
differ = [n for n in st if n in m and st[n].is_floating_point()
          and not torch.equal(m[n].reshape(st[n].shape), st[n])]
print(len(same), "EMA tensors in the EMA graph;", len(differ), "differ from the model graph")' \
        "$BATS_TEST_DIRNAME/parity"
    echo "$output"
    assert_success
    assert_output --regexp "^(10[0-9]|1[1-9][0-9]) EMA tensors in the EMA graph; [1-9][0-9]* differ"
}

@test "2 processes (mpirun) keep the EMA of one process with --accum 2, bit for bit: --batch is the global batch" {
    command -v mpirun > /dev/null || skip "mpirun not installed (make deps installs openmpi-bin)"
    rn-train --help | grep -q "This build: with Open MPI" || skip "this rn build has no MPI (USE_MPI=0)"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpi_no_leak_checks
    A="--batch 8 --crop 32 --workers 1 --threads 1 --max-steps 5 --ema-decay 0.99 --ema-every 2 --lr-epochs 2"
    rn-train --data train.lmdb --in init.pb --out one.pb $A --accum 2 2> /dev/null
    mpirun --oversubscribe -np 2 rn-train --data train.lmdb --in init.pb --out two.pb $A 2> /dev/null
    [ -n "$(set_lines one.pb ema)" ]
    diff <(set_lines one.pb ema) <(set_lines two.pb ema)
    diff <(set_lines one.pb 'ema buffer') <(set_lines two.pb 'ema buffer')
    ema() { rn-info --json "$1" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["ema"])'; }
    assert_equal "$(ema one.pb)" "$(ema two.pb)"
}
