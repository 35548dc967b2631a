#!/usr/bin/env bats
# When the loss does not fall: rn-train --overfit-batches (fit a few fixed batches) and
# rn-lrfind (the learning-rate range test), on the toy set train.bats learns.
load helper

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/train 64 1
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/val 32 2
    rn-prep -q src/train train.lmdb
    rn-prep -q --classes train.lmdb src/val val.lmdb
    rn-init --arch resnet18 --classes 2 --seed 1 -o init.pb
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

T="--batch 16 --crop 32 --workers 2 --threads 2"

@test "--overfit-batches 1: the training loss falls below 0.05 within 30 steps, and the check says so" {
    run rn-train --data train.lmdb --in init.pb --out of.pb --overfit-batches 1 --max-steps 30 $T --log of.jsonl
    assert_success
    assert_output --regexp 'rn-train: overfit check: loss [0-9.e+-]+ -> [0-9.e+-]+ after 30 steps over 1 batch: the model can fit the data'
    # an epoch is the one batch; the last step's loss (one batch) is below 0.05
    run "$PYTHON" -c 'import json; L=[json.loads(l) for l in open("of.jsonl")]; S=[l for l in L if l["kind"]=="step"]; assert len(S)==30, len(S); assert S[-1]["loss"]<0.05, S[-1]; assert S[0]["loss"]>0.3, S[0]; print(S[0]["loss"], "->", S[-1]["loss"], "first below 0.05 at step", next(s["step"] for s in S if s["loss"]<0.05))'
    assert_success
    # the checkpoint is written as usual: 30 epochs of one step, constant lr
    run rn-info --json of.pb
    assert_output --partial '"epoch":30,"step":30,'
}

@test "--overfit-batches 2: every epoch is the same two batches, same crops (at lr 0 the losses repeat exactly)" {
    run rn-train --data train.lmdb --in init.pb --out same.pb --overfit-batches 2 --max-steps 6 --lr 0 --log-every 1 $T --log same.jsonl
    assert_success
    assert_output --partial "after 6 steps over 2 batches"
    run "$PYTHON" -c 'import json; S=[l["loss"] for l in map(json.loads, open("same.jsonl")) if l["kind"]=="step"]; assert len(S)==6, S; assert S[0]==S[2]==S[4] and S[1]==S[3]==S[5], S; assert S[0]!=S[1], S; print(S)'
    assert_success
}

@test "--overfit-batches: bad values refused; more batches than the dataset holds: all of them, said" {
    for k in 0 -1 x 1.5; do
        run rn-train --data train.lmdb --in init.pb --out bad.pb --overfit-batches $k
        assert_failure 2
        assert_output --partial "rn-train: --overfit-batches: '$k'"
    done
    run rn-train --data train.lmdb --val val.lmdb --in init.pb --out bad.pb --overfit-batches 1
    assert_failure 2
    assert_output --partial "--overfit-batches and --val"
    [ ! -e bad.pb ]
    # 128 records make 8 batches of 16
    run rn-train --data train.lmdb --in init.pb --out all.pb --overfit-batches 9 --max-steps 2 $T
    assert_success
    assert_output --partial "rn-train: --overfit-batches 9: train.lmdb holds 8 batches of 16: overfitting all 8"
    assert_output --regexp "loss [0-9.e+-]+ -> [0-9.e+-]+ after 2 steps over 8 batches: fewer than two passes over the batches, nothing to compare"
}

@test "rn-lrfind: the suggested lr trains the toy set; JSONL geometric in lr; the checkpoint untouched" {
    cp init.pb orig.pb
    run rn-lrfind --data train.lmdb --in init.pb --out sweep.jsonl --plot sweep.png $T
    assert_success
    assert_line --regexp '^suggested lr: [0-9.e+-]+ \(steepest descent of the smoothed loss at step [0-9]+\)$'
    cmp init.pb orig.pb
    [ ! -e init.pb.tmp ]
    lr=$(sed -n 's/^suggested lr: \([^ ]*\) .*/\1/p' <<<"$output")
    echo "suggested lr $lr"
    # the JSONL: one line per step from 0, lr from 1e-7 growing by one ratio, smoothed
    # bias-corrected (the first equals the first loss); the suggestion lies before the
    # smoothed loss's minimum
    run "$PYTHON" - "$lr" <<'PY'
import json, math, sys
P = [json.loads(l) for l in open("sweep.jsonl")]
assert 20 <= len(P) <= 100, len(P)
assert [p["step"] for p in P] == list(range(len(P)))
assert all(set(p) == {"step", "lr", "loss", "smoothed"} for p in P), P[0]
assert abs(P[0]["lr"] - 1e-7) < 1e-13, P[0]
ratio = (10 / 1e-7) ** (1 / 99)
assert all(abs(b["lr"] / a["lr"] / ratio - 1) < 1e-6 for a, b in zip(P, P[1:])), "not geometric"
assert P[0]["smoothed"] == P[0]["loss"], P[0]
avg = 0
for i, p in enumerate(P):  # fastai's smoothing: beta 0.98, divided by 1 - beta^(i+1)
    avg = 0.98 * avg + 0.02 * p["loss"]
    assert abs(avg / (1 - 0.98 ** (i + 1)) - p["smoothed"]) <= 1e-6 * abs(p["smoothed"]), (i, p)
# it stopped early only at 4x the best smoothed loss before
if len(P) < 100:
    assert P[-1]["smoothed"] > 4 * min(p["smoothed"] for p in P[:-1]), P[-1]
lr, best = float(sys.argv[1]), min(P, key=lambda p: p["smoothed"])
assert 1e-6 < lr < best["lr"], (lr, best)
print(len(P), "steps; suggested", lr, "best smoothed", best["smoothed"], "at lr", best["lr"])
PY
    assert_success
    [ -s sweep.png ]
    # training with it: 4 epochs lower the training loss and learn the validation set
    run rn-train --data train.lmdb --in init.pb --out lr.pb --epochs 4 $T --lr "$lr" --log lr.jsonl
    assert_success
    run "$PYTHON" -c 'import json; E=[l["train_loss"] for l in map(json.loads, open("lr.jsonl")) if l["kind"]=="epoch"]; assert len(E)==4 and E[-1] < E[0]/2, E; print(E)'
    assert_success
    run rn-eval --data val.lmdb --ckpt lr.pb --crop 32 --json
    assert_success
    echo "$output" | "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); assert d["top1"]>=0.9, d; print(d)'
}

@test "rn-lrfind: help, version, bad flags refused with exit 2" {
    run rn-lrfind --help
    assert_success
    assert_output --partial "usage: rn-lrfind"
    run rn-lrfind --version
    assert_success
    run rn-lrfind --bogus
    assert_failure 2
    run rn-lrfind --data train.lmdb --in init.pb
    assert_failure 2
    assert_output --partial "required"
    run rn-lrfind --data train.lmdb --in init.pb --out x.jsonl --lr-min 1 --lr-max 0.1
    assert_failure 2
    assert_output --partial "--lr-min 1 is not below --lr-max 0.1"
    run rn-lrfind --data train.lmdb --in init.pb --out x.jsonl --lr-min -1
    assert_failure 2
    run rn-lrfind --data train.lmdb --in init.pb --out x.jsonl --steps 2
    assert_failure 2
    assert_output --partial "--steps: '2'"
    run rn-lrfind --data train.lmdb --in init.pb --out x.jsonl --augment random
    assert_failure 2
    run rn-lrfind --data train.lmdb --in init.pb --out x.jsonl --batch 16 --micro-batch 5
    assert_failure 2
    assert_output --partial "--batch 16 is not a multiple of --micro-batch 5"
    # no gnuplot on PATH: --plot refused before the sweep
    run env PATH="$RN_BIN" "$RN_BIN/rn-lrfind" --data train.lmdb --in init.pb --out x.jsonl --plot x.png
    assert_failure 2
    assert_output --partial "--plot: gnuplot is not installed"
    cp init.pb keep.pb
    run rn-lrfind --data train.lmdb --in init.pb --out ./init.pb
    assert_failure 2
    assert_output --partial "is the checkpoint --in: rn-lrfind never writes it"
    run rn-lrfind --data train.lmdb --in init.pb --out x.jsonl --plot init.pb
    assert_failure 2
    cmp init.pb keep.pb
    [ ! -e x.jsonl ]
}

@test "GPU utilisation: a CPU run has no gpu fields and says nothing of them, even with NVML loadable" {
    # a fake NVML (tests/data/fake_nvidia.c) first on LD_LIBRARY_PATH: the CPU has no
    # device to sample, so none of its numbers may appear
    mkdir -p fakenvml
    cc -shared -fPIC -o fakenvml/libnvidia-ml.so.1 "$BATS_TEST_DIRNAME/data/fake_nvidia.c"
    LD_LIBRARY_PATH="$PWD/fakenvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" run rn-train --data train.lmdb --in init.pb \
        --out gpu.pb --max-steps 3 --log-every 1 --device cpu $T --log gpu.jsonl
    assert_success
    refute_output --partial "GPU"
    run "$PYTHON" -c 'import json; S=[l for l in map(json.loads, open("gpu.jsonl")) if l["kind"]=="step"]; assert len(S)==3, S; assert not any(k.startswith("gpu_") for l in S for k in l), S; print(sorted(S[0]))'
    assert_success
}

@test "--gpu-sample: 0 turns it off; values outside 0.01..60 s refused with exit 2" {
    for v in 0.001 -1 x 61; do
        run rn-train --data train.lmdb --in init.pb --out bad.pb --gpu-sample $v
        assert_failure 2
        assert_output --partial "--gpu-sample"
    done
    [ ! -e bad.pb ]
    run rn-train --data train.lmdb --in init.pb --out off.pb --max-steps 1 --gpu-sample 0 $T
    assert_success
    run rn-train --help
    assert_output --partial "--gpu-sample S"
}
