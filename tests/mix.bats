#!/usr/bin/env bats
# rn-train --mixup / --cutmix: flags, mixing off is the hard-label run bit for bit, the
# mixed run repeats for any thread count, equals itself resumed, under --accum, and across
# ranks, with erasing applied to each image before it is mixed; one step's gradients match
# torchvision's reference mixing of the same batch.
load helper

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    toy_setup 24 >/dev/null
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

A="--crop 32 --seed 3 --workers 1 --log-every 1"
M="--mixup 0.4 --cutmix 1.0 --label-smoothing 0.1"
tensors() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }

@test "--help and the man page list the mixing flags; bad values exit 2" {
    run rn-train --help
    assert_output --partial "--mixup ALPHA"
    assert_output --partial "--switch-prob P"
    run grep -c 'mix\\-prob' "$BATS_TEST_DIRNAME/../man/rn-train.1"
    assert_success
    run rn-train --data train.lmdb --in init.pb --out x.pb --mixup -1
    assert_failure 2
    assert_output --partial "--mixup"
    run rn-train --data train.lmdb --in init.pb --out x.pb --cutmix 1 --mix-prob 1.5
    assert_failure 2
    assert_output --partial "--mix-prob"
    run rn-train --data train.lmdb --in init.pb --out x.pb --switch-prob 0.3
    assert_failure 2
    assert_output --partial "need --mixup ALPHA or --cutmix ALPHA"
    [ ! -e x.pb ]
}

@test "mixing off (alphas 0) is the run without the flags, bit for bit; mixing on changes it" {
    rn-train --data train.lmdb --in init.pb --out plain.pb $A --batch 8 --max-steps 2 --threads 2
    rn-train --data train.lmdb --in init.pb --out off.pb $A --batch 8 --max-steps 2 --threads 2 --mixup 0 --cutmix 0
    diff <(tensors plain.pb) <(tensors off.pb)
    rn-train --data train.lmdb --in init.pb --out on.pb $A --batch 8 --max-steps 2 --threads 2 $M
    run diff <(tensors plain.pb) <(tensors on.pb)
    assert_failure
}

@test "a mixed run is the same bytes for 1 and 2 threads, and for 2 steps or 1 + resume + 1" {
    rn-train --data train.lmdb --in init.pb --out t1.pb $A --batch 8 --max-steps 4 --threads 1 $M --log t1.jsonl
    rn-train --data train.lmdb --in init.pb --out t2.pb $A --batch 8 --max-steps 4 --threads 2 $M
    diff <(tensors t1.pb) <(tensors t2.pb)
    rn-train --data train.lmdb --in init.pb --out h.pb $A --batch 8 --max-steps 2 --threads 2 $M
    rn-train --data train.lmdb --in h.pb --out r.pb $A --batch 8 --max-steps 2 --threads 2 $M
    diff <(tensors t1.pb) <(tensors r.pb)
    # the log reports the loss on the mixed targets: a finite number per step
    run "$PYTHON" -c 'import json, math
S = [l for l in map(json.loads, open("t1.jsonl")) if l["kind"] == "step"]
print(len(S), all(math.isfinite(l["loss"]) and 0 <= l["train_top1"] <= 1 for l in S))'
    assert_output "4 True"
}

@test "--accum 2 mixes its micro-batches as --micro-batch 4 does, and mixing per micro-batch differs from per batch" {
    rn-train --data train.lmdb --in init.pb --out a2.pb $A --batch 8 --max-steps 2 --threads 2 $M --accum 2
    rn-train --data train.lmdb --in init.pb --out m4.pb $A --batch 8 --max-steps 2 --threads 2 $M --micro-batch 4
    diff <(tensors a2.pb) <(tensors m4.pb)
    rn-train --data train.lmdb --in init.pb --out a1.pb $A --batch 8 --max-steps 2 --threads 2 $M
    run diff <(tensors a1.pb) <(tensors a2.pb)
    assert_failure
}

@test "2 ranks with mixing equal one process with --accum 2, bit for bit" {
    command -v mpirun >/dev/null || skip "mpirun not installed (make deps installs openmpi-bin)"
    rn-train --help | grep -q "This build: with Open MPI" || skip "this rn build has no MPI (USE_MPI=0)"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpi_no_leak_checks
    rn-train --data train.lmdb --in init.pb --out one2.pb $A --batch 8 --max-steps 3 --threads 1 $M --accum 2 \
        --log one2.jsonl
    mpirun --oversubscribe -np 2 rn-train --data train.lmdb --in init.pb --out two.pb $A --batch 8 --max-steps 3 \
        --threads 1 $M --log two.jsonl
    diff <(tensors one2.pb) <(tensors two.pb)
    # the loss and the train top-1 are every rank's, summed: the one process's
    top1() {
        "$PYTHON" -c 'import json, sys
print([(l["loss"], l["train_top1"]) for l in map(json.loads, open(sys.argv[1])) if l["kind"] == "step"])' "$1"
    }
    assert_equal "$(top1 two.jsonl)" "$(top1 one2.jsonl)"
}

E="--augment crop-pad=4,flip,erase=0.5:random"

@test "mixing with --augment ...,erase erases each image before it is mixed; the same bytes for 1 and 2 threads" {
    rn-train --data train.lmdb --in init.pb --out ne.pb $A --batch 8 --max-steps 2 --threads 2 $M \
        --augment crop-pad=4,flip
    rn-train --data train.lmdb --in init.pb --out e1.pb $A --batch 8 --max-steps 2 --threads 1 $M $E
    rn-train --data train.lmdb --in init.pb --out e2.pb $A --batch 8 --max-steps 2 --threads 2 $M $E
    # the erase draws come after the crop and flip: without the boxes the two runs would be equal
    run diff <(tensors ne.pb) <(tensors e2.pb)
    assert_failure
    diff <(tensors e1.pb) <(tensors e2.pb)
    rn-train --data train.lmdb --in init.pb --out ea2.pb $A --batch 8 --max-steps 2 --threads 2 $M $E --accum 2
    rn-train --data train.lmdb --in init.pb --out em4.pb $A --batch 8 --max-steps 2 --threads 2 $M $E --micro-batch 4
    diff <(tensors ea2.pb) <(tensors em4.pb)
}

@test "2 ranks mixing erased images equal one process with --accum 2, bit for bit" {
    command -v mpirun >/dev/null || skip "mpirun not installed (make deps installs openmpi-bin)"
    rn-train --help | grep -q "This build: with Open MPI" || skip "this rn build has no MPI (USE_MPI=0)"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpi_no_leak_checks
    rn-train --data train.lmdb --in init.pb --out eone2.pb $A --batch 8 --max-steps 3 --threads 1 $M $E --accum 2
    mpirun --oversubscribe -np 2 rn-train --data train.lmdb --in init.pb --out etwo.pb $A --batch 8 --max-steps 3 \
        --threads 1 $M $E
    diff <(tensors eone2.pb) <(tensors etwo.pb)
    rn-train --data train.lmdb --in init.pb --out eone1.pb $A --batch 8 --max-steps 3 --threads 1 $M \
        --augment crop-pad=4,flip --accum 2
    run diff <(tensors eone1.pb) <(tensors etwo.pb)
    assert_failure
}

@test "--dump-grads with mixup, cutmix and label smoothing matches torchvision's reference mixing" {
    plain_build_only "4 mixing settings against torchvision"
    have_torch || skip "no torch/torchvision for $PYTHON (run make deps)"
    rn-export init.pb init.safetensors
    for how in "--mixup 4" "--cutmix 1.0" "--mixup 0.2 --label-smoothing 0.1" "--cutmix 1.0 --label-smoothing 0.1"; do
        ls=0
        case "$how" in *smoothing*) ls=0.1 ;; esac
        rm -f mg.safetensors
        rm -f mg.jsonl
        run rn-train --data train.lmdb --in init.pb --out mg.pb $A --batch 16 --max-steps 1 --threads 2 $how \
            --dump-grads mg.safetensors --log mg.jsonl
        assert_success
        top1=$("$PYTHON" -c 'import json; print([json.loads(l) for l in open("mg.jsonl")][0]["train_top1"])')
        run "$PYTHON" "$BATS_TEST_DIRNAME/parity/grads_parity.py" --label-smoothing $ls --top1 "$top1" \
            init.safetensors mg.safetensors
        echo "$how: $output"
        assert_success
        assert_output --regexp "\((mixup|cutmix) lambda [01]\.[0-9]+\).*62 gradients of a batch of 16, 0 failed"
        assert_output --partial "train top-1 against the dominant target: rn $(printf %.6f "$top1")"
    done
}

@test "--dump-grads of a mixed run with erase lists the boxes, and grads_parity.py erases before mixing to match" {
    have_torch || skip "no torch/torchvision for $PYTHON (run make deps)"
    rn-export init.pb init.safetensors
    for how in "--mixup 4" "--cutmix 1.0"; do
        rm -f me.safetensors
        rm -f me.jsonl
        run rn-train --data train.lmdb --in init.pb --out me.pb $A --batch 16 --max-steps 1 --threads 2 $how \
            --augment crop-pad=4,flip,erase=0.7:random --dump-grads me.safetensors --log me.jsonl
        assert_success
        top1=$("$PYTHON" -c 'import json; print([json.loads(l) for l in open("me.jsonl")][0]["train_top1"])')
        run "$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1]); import rnst
e = rnst.load(sys.argv[2])[1]["erase"].split(";")
print(len(e) - 1, sum(b.split()[2] != "0" for b in e[1:]) > 0)' "$BATS_TEST_DIRNAME/parity" me.safetensors
        assert_output "16 True"
        run "$PYTHON" "$BATS_TEST_DIRNAME/parity/grads_parity.py" --top1 "$top1" init.safetensors me.safetensors
        echo "$how: $output"
        assert_success
        assert_output --regexp "\((mixup|cutmix) lambda [01]\.[0-9]+\).*62 gradients of a batch of 16, 0 failed"
    done
}
