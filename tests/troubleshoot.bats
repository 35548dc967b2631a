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

setup() { cd "$BATS_FILE_TMPDIR"; }

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
