#!/usr/bin/env bats
# rn-train --recompute: activation checkpointing gives the same checkpoint bits in less
# memory, and --micro-batch auto can choose it.
load helper

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src 32 1
    rn-prep -q src train.lmdb
    rn-init --arch resnet18 --classes 2 --seed 1 -o init18.pb
    rn-init --arch resnet50 --classes 2 --seed 1 -o init50.pb
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

A="--crop 32 --workers 2 --max-steps 3 --lr 0.05"

# the trained tensors' bytes: rn-export to safetensors (the .pb embeds provenance)
digest() {
    rn-export "$1" "$1.safetensors"
    sha256sum < "$1.safetensors" | cut -d' ' -f1
}

@test "--recompute blocks: the checkpoint's tensors are the bits of none, for 1, 2 and 3 threads" {
    plain_build_only "runs at 1, 2 and 3 threads, with and without recomputing"
    for t in 1 2 3; do
        rn-train --data train.lmdb --in init18.pb --out n$t.pb --batch 8 --accum 2 --threads $t $A --recompute none
        run rn-train --data train.lmdb --in init18.pb --out b$t.pb --batch 8 --accum 2 --threads $t $A --recompute blocks
        assert_success
        assert_output --partial "recomputing blocks in backward (saves"
        [ "$(digest n$t.pb)" = "$(digest b$t.pb)" ]
    done
    # and across thread counts, as every rn-train run
    [ "$(digest b1.pb)" = "$(digest b3.pb)" ]
    # the check can fail: another step gives other tensors
    rn-train --data train.lmdb --in init18.pb --out other.pb --batch 8 --accum 2 --threads 2 $A --max-steps 4
    [ "$(digest other.pb)" != "$(digest b2.pb)" ]
}

@test "--recompute blocks: resnet50 (bottlenecks, downsamples) keeps the bits too" {
    rn-train --data train.lmdb --in init50.pb --out n50.pb --batch 8 --threads 2 $A --max-steps 2
    rn-train --data train.lmdb --in init50.pb --out b50.pb --batch 8 --threads 2 $A --max-steps 2 --recompute blocks
    [ "$(digest n50.pb)" = "$(digest b50.pb)" ]
}

# the plan's need at --micro-batch M (nothing fits in 1 MiB), in MiB; extra flags after M
need() {
    local m=$1
    shift
    run rn-train --data train.lmdb --in init18.pb --out never.pb --batch 8 --micro-batch "$m" --mem-limit 1M \
        --crop 64 --workers 2 --threads 2 "$@"
    [ "$status" -eq 1 ]
    echo "$output" | sed -n 's/.*micro-batch [0-9]* of 64x64 in fp32 needs \([0-9.]*\) MiB.*/\1/p'
}

@test "memory plan: smaller with --recompute blocks; --micro-batch auto recomputes when nothing fits without" {
    p1=$(need 1) p8=$(need 8) r1=$(need 1 --recompute blocks) r8=$(need 8 --recompute blocks)
    echo "plain: 1 -> $p1 MiB, 8 -> $p8; recomputing: 1 -> $r1, 8 -> $r8"
    awk -v p="$p1" -v r="$r1" 'BEGIN { exit !(r > 0 && r < p) }'
    awk -v p="$p8" -v r="$r8" 'BEGIN { exit !(r > 0 && r < p) }'
    # it saves activations: more at a larger micro-batch
    awk -v a="$p1" -v b="$r1" -v c="$p8" -v d="$r8" 'BEGIN { exit !(c - d > a - b) }'
    [ ! -e never.pb ]
    # between the two plans at micro-batch 1: only recomputation fits; auto takes it
    lim=$(awk -v a="$r1" -v b="$p1" 'BEGIN { printf "%dK", (a + b) / 2 * 1024 }')
    B="--batch 8 --crop 64 --workers 2 --threads 2 --max-steps 1 --mem-limit $lim"
    run rn-train --data train.lmdb --in init18.pb --out auto.pb $B --micro-batch auto
    assert_success
    assert_output --partial "of 8 (8 x 1)"
    assert_output --partial "recomputing blocks in backward"
    # a given micro-batch that fits only with recomputation is refused, saying so
    run rn-train --data train.lmdb --in init18.pb --out given.pb $B --micro-batch 1
    assert_failure 1
    assert_output --partial "no smaller micro-batch fits"
    assert_output --partial "; or --recompute blocks, which needs $r1 MiB"
    [ ! -e given.pb ]
    # an explicit --recompute none keeps auto from it: nothing fits
    run rn-train --data train.lmdb --in init18.pb --out none.pb $B --micro-batch auto --recompute none
    assert_failure 1
    assert_output --partial "does not fit"
    [ ! -e none.pb ]
    # on the CPU, when plain accumulation fits, auto does not recompute (an image costs the
    # same at any micro-batch there, and recomputing adds a forward)
    lim=$(awk -v a="$p1" -v b="$r8" 'BEGIN { printf "%dK", (b > a ? b : a) * 1.001 * 1024 }')
    run rn-train --data train.lmdb --in init18.pb --out acc.pb --batch 8 --crop 64 --workers 2 --threads 2 \
        --max-steps 1 --mem-limit "$lim" --micro-batch auto
    assert_success
    refute_output --partial "recomputing"
}

@test "--recompute: bad values exit 2 with the choices" {
    run rn-train --data train.lmdb --in init18.pb --out x.pb --recompute all
    assert_failure 2
    assert_output --partial "--recompute: 'all' is not none or blocks"
    run rn-train --data train.lmdb --in init18.pb --out x.pb --recompute
    assert_failure 2
    [ ! -e x.pb ]
}
