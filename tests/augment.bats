#!/usr/bin/env bats
# The --augment chain: bad chains exit 2 in every tool that takes it; crop-pad (each
# padding mode) and flip give torchvision's pixels; the samplers' distributions match
# torchvision's get_params (tests/parity/aug_parity.py); training and resume with the new ops.
load helper

AP="$BATS_TEST_DIRNAME/parity/aug_parity.py"

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src 32 1
    rn-prep -q src train.lmdb
    rn-init --arch resnet18 --classes 2 --seed 1 -o init.pb
    if have_torch; then
        "$PYTHON" "$AP" images pngs
        rn-prep -q --encode raw pngs pngs.lmdb
    fi
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

T="--batch 8 --crop 32 --workers 2 --threads 2"

@test "a bad chain exits 2 naming the op and the known ones, in rn-train, rn-lrfind and rn-load" {
    run rn-train --data train.lmdb --in init.pb --out x.pb --augment rrc,mixup $T
    assert_failure 2
    assert_output --partial "--augment: 'mixup' is not an op: known ops are rrc, crop-pad, flip, ta_wide, randaug, autoaug, jitter, erase"
    run rn-lrfind --data train.lmdb --in init.pb --out x.jsonl --augment erase=2
    assert_failure 2
    assert_output --partial "--augment: erase: p 2 is outside 0..1"
    run rn-load --augment "rrc:scale=1-0.5" train.lmdb
    assert_failure 2
    assert_output --partial "--augment: rrc: scale 1-0.5"
    run rn-load --augment "erase,flip" train.lmdb
    assert_failure 2
    assert_output --partial "flip after erase: the order is a crop op (rrc or crop-pad) first, then flip, then the pixel ops (ta_wide, randaug, autoaug, jitter), erase last"
    [ ! -e x.pb ]
}

@test "old spellings keep their meaning: standard and rrc are rrc,flip; none is the eval transform" {
    sum() { rn-load --batch 8 --crop 32 --epochs 2 --seed 4 --checksum "$@" train.lmdb 2>&1 | grep '^checksum'; }
    def=$(sum)
    [ "$def" = "$(sum --augment rrc)" ]
    [ "$def" = "$(sum --augment standard)" ]
    [ "$def" = "$(sum --augment rrc,flip)" ]
    [ "$def" = "$(sum --augment rrc:scale=0.08-1:ratio=0.75-1.3333333333333333,flip=0.5)" ]
    [ "$def" != "$(sum --augment rrc,flip=0)" ]
    [ "$(sum --augment none --no-shuffle)" = "$(sum --eval)" ]
}

@test "rn-load reports the chain; new chains give the same batches for 1 and 3 workers" {
    run rn-load --batch 8 --crop 32 --augment crop-pad=4:reflect,flip,erase=0.5 train.lmdb
    assert_success
    assert_output --partial "augment: crop-pad:pad=4:mode=reflect:fill=0,flip:p=0.5,erase:p=0.5:scale=0.02-0.33"
    for chain in crop-pad=4:reflect,flip,erase=0.5 "rrc:scale=0.35-1,flip,erase=0.25:random" flip; do
        a=$(rn-load --batch 8 --crop 32 --epochs 2 --workers 1 --checksum --augment "$chain" train.lmdb 2>&1)
        b=$(rn-load --batch 8 --crop 32 --epochs 2 --workers 3 --checksum --augment "$chain" train.lmdb 2>&1)
        [ "$(grep '^checksum' <<<"$a")" = "$(grep '^checksum' <<<"$b")" ]
    done
}

@test "crop-pad (constant, fill 9) and flip: identical bytes to torchvision's pad + crop + hflip" {
    have_torch || skip "no torch/torchvision for $PYTHON"
    for s in 1 2 3 4 5 6; do
        rn-load --batch 6 --crop 24 --seed $s --augment crop-pad=4:fill=9,flip --raw c$s.raw pngs.lmdb
    done
    cat c[1-6].raw > c.raw
    run "$PYTHON" "$AP" pixels pngs c.raw 24 4 constant 9
    echo "$output"
    assert_success
    assert_output --partial "36 of 36 images equal torchvision's"
}

@test "crop-pad edge and flip: identical bytes to torchvision's pad + crop + hflip" {
    have_torch || skip "no torch/torchvision for $PYTHON"
    for s in 1 2 3 4 5 6; do
        rn-load --batch 6 --crop 24 --seed $s --augment crop-pad=5:edge,flip --raw e$s.raw pngs.lmdb
    done
    cat e[1-6].raw > e.raw
    run "$PYTHON" "$AP" pixels pngs e.raw 24 5 edge 0
    echo "$output"
    assert_success
    assert_output --partial "36 of 36 images equal torchvision's"
}

@test "crop-pad reflect and flip: identical bytes to torchvision's pad + crop + hflip" {
    have_torch || skip "no torch/torchvision for $PYTHON"
    for s in 1 2 3 4 5 6; do
        rn-load --batch 6 --crop 24 --seed $s --augment crop-pad=4:reflect,flip --raw r$s.raw pngs.lmdb
    done
    cat r[1-6].raw > r.raw
    run "$PYTHON" "$AP" pixels pngs r.raw 24 4 reflect 0
    echo "$output"
    assert_success
    assert_output --partial "36 of 36 images equal torchvision's"
}

@test "crop-pad refuses an image too small for the crop, naming the record" {
    run rn-load --batch 2 --crop 500 --augment crop-pad=2 train.lmdb
    assert_failure 1
    assert_output --partial "smaller than the 500 crop of crop-pad"
    assert_output --regexp "train.lmdb: record [0-9]{8} "
}

@test "sampled parameters match torchvision's get_params over 100,000 draws (chi-square, p > 0.001)" {
    have_torch || skip "no torch/torchvision for $PYTHON"
    run "$PYTHON" "$AP" dist
    echo "$output"
    assert_success
    assert_output --partial "distributions: 0 failed"
}

@test "training with crop-pad, flip and random erasing: 2N steps equal N, resume, N" {
    A="$T --augment crop-pad=4:reflect,flip,erase=0.5:random --seed 3"
    rn-train --data train.lmdb --in init.pb --out full.pb --max-steps 4 $A
    rn-train --data train.lmdb --in init.pb --out half.pb --max-steps 2 $A
    rn-train --data train.lmdb --in half.pb --out resumed.pb --max-steps 2 $A
    tensors() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }
    diff <(tensors full.pb) <(tensors resumed.pb)
    # erasing changes what the network sees
    rn-train --data train.lmdb --in init.pb --out noerase.pb --max-steps 4 $T --augment crop-pad=4:reflect,flip --seed 3
    run diff -q <(tensors full.pb) <(tensors noerase.pb)
    assert_failure
}

@test "--ra-reps: repeated augmentation trains other bytes than without, resumes exactly, says so; bad values exit 2" {
    A="$T --ra-reps 4 --seed 3"
    run rn-train --data train.lmdb --in init.pb --out ra.pb --max-steps 4 $A
    assert_success
    assert_output --partial "steps per epoch of 8 (1 x 8; 2 records x 4 copies)"
    rn-train --data train.lmdb --in init.pb --out half.pb --max-steps 2 $A
    rn-train --data train.lmdb --in half.pb --out resumed.pb --max-steps 2 $A
    tensors() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }
    diff <(tensors ra.pb) <(tensors resumed.pb)
    rn-train --data train.lmdb --in init.pb --out plain.pb --max-steps 4 $T --seed 3
    run diff -q <(tensors ra.pb) <(tensors plain.pb)
    assert_failure
    run rn-train --data train.lmdb --in init.pb --out x.pb $T --ra-reps 3
    assert_failure 2
    assert_output --partial "--batch 8 is not a multiple of --ra-reps 3"
    run rn-train --data train.lmdb --in init.pb --out x.pb $T --ra-reps 0
    assert_failure 2
    run rn-load --ra-reps 2 --eval train.lmdb
    assert_failure 2
    assert_output --partial "--ra-reps repeats training batches: not with --eval"
    [ ! -e x.pb ]
}
