#!/usr/bin/env bats
# Faults a real machine has: a tool killed with SIGKILL at any point, a full disk, a
# read-only folder, an output that is a directory. Whatever happens, the previous output
# stays intact and loadable, nothing partial appears under the final name, and the next
# run succeeds. The disk tests mount a small tmpfs and need root (skipped otherwise).
load helper

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    toy_setup 16
    rn-init --arch resnet50 --classes 10 --seed 3 -o big.pb
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

# start "$@" in the background, SIGKILL it after $1 seconds (it may have finished)
kill_after() {
    local t=$1
    shift
    "$@" > /dev/null 2>&1 &
    local pid=$!
    sleep "$t"
    kill -9 "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
}

@test "rn-train killed at 12 points during --save-every 1: the checkpoint is always a whole one; the next run succeeds" {
    plain_build_only "12 killed runs"
    A="--data train.lmdb --batch 8 --crop 32 --workers 1 --threads 2 --save-every 1"
    rn-train $A --in init.pb --out run.pb --max-steps 1 2> /dev/null
    for t in 0.1 0.3 0.5 0.7 0.9 1.1 1.3 1.6 1.9 2.2 2.6 3.0; do
        kill_after "$t" rn-train $A --in run.pb --out run.pb --max-steps 6
        # a whole checkpoint: it loads and passes every checksum
        run rn-info --json run.pb
        assert_success
    done
    run rn-train $A --in run.pb --out run.pb --max-steps 2
    assert_success
    [ ! -e run.pb.tmp ]
}

@test "rn-init and rn-export killed at 8 points: the old file or the whole new one, never a part; the next run succeeds" {
    plain_build_only "8 killed runs of each"
    rn-init --arch resnet50 --classes 10 --seed 4 -o keep.pb
    rn-init --arch resnet50 --classes 10 --seed 5 -o new.pb
    rn-export keep.pb keep.safetensors
    rn-export big.pb new.safetensors
    # tensors (a checkpoint's provenance holds the time it was written) and exports
    tsum() { rn-info --tensors "$1" | grep '^  [a-z]' | md5sum; }
    sums="$(tsum keep.pb) $(tsum new.pb) $(md5sum < keep.safetensors) $(md5sum < new.safetensors)"
    for t in 0.05 0.1 0.2 0.3 0.5 0.7 0.9 1.2; do
        kill_after "$t" rn-init --arch resnet50 --classes 10 --seed 5 -o keep.pb
        run rn-info keep.pb
        assert_success
        [[ "$sums" == *"$(tsum keep.pb)"* ]]
        kill_after "$t" rn-export big.pb keep.safetensors
        [[ "$sums" == *"$(md5sum < keep.safetensors)"* ]]
    done
    run rn-init --arch resnet50 --classes 10 --seed 4 -o keep.pb
    assert_success
    [ ! -e keep.pb.tmp ]
    run rn-export keep.pb keep.safetensors
    assert_success
    [ ! -e keep.safetensors.tmp ]
}

@test "rn-prep killed at 8 points: the previous dataset intact, the next run succeeds" {
    rn-prep -q src keep.lmdb
    "$PYTHON" "$BATS_TEST_DIRNAME/data/mkimages.py" folder many --classes 2 --per-class 60 --size 160x120 --seed 2
    for t in 0.02 0.05 0.1 0.2 0.3 0.4 0.6 0.8; do
        kill_after "$t" rn-prep --threads 1 --augment 20 --crop 48 many keep.lmdb
        run rn-info --json keep.lmdb
        assert_success
        [[ "$output" == *'"count":32,'* || "$output" == *'"count":2400,'* ]]
    done
    run rn-prep -q src keep.lmdb
    assert_success
    [ ! -e keep.lmdb.tmp ]
}

# a tmpfs of $2 at folder $1 (mount options $3), or skip
small_disk() {
    [ "$(id -u)" = 0 ] || skip "needs root to mount a tmpfs"
    mkdir -p "$1"
    mount -t tmpfs -o "size=$2${3:+,$3}" tmpfs "$1" 2> /dev/null || skip "cannot mount a tmpfs here"
}

@test "a full disk: rn-train and rn-init exit 1 naming the file and the cause; the previous checkpoint intact" {
    small_disk full 200M
    rn-init --arch resnet18 --classes 2 --seed 1 -o full/ck.pb
    rn-info --tensors full/ck.pb | grep '^  [a-z]' > ck.tensors
    # fill what is left
    dd if=/dev/zero of=full/filler bs=1M count=400 2> /dev/null || true
    run rn-train --data train.lmdb --in full/ck.pb --out full/ck.pb --batch 8 --crop 32 --workers 1 --max-steps 1
    train_status=$status train_out=$output
    run rn-init --arch resnet50 -o full/other.pb
    init_status=$status init_out=$output
    run rn-info --tensors full/ck.pb
    info=$(rn-info --tensors full/ck.pb | grep '^  [a-z]' | diff - ck.tensors && echo same)
    left=$(ls full | sort | tr '\n' ' ')
    umount full
    [ "$train_status" -eq 1 ]
    [[ "$train_out" == *"full/ck.pb.tmp"*"No space left on device"* ]]
    [ "$init_status" -eq 1 ]
    [[ "$init_out" == *"full/other.pb.tmp"*"No space left on device"* ]]
    [ "$info" = same ]
    [ "$left" = "ck.pb filler " ]
}

@test "a read-only folder: every tool exits 1 at once with the cause, nothing written" {
    small_disk ro 1M ro
    run rn-init --arch resnet18 -o ro/a.pb
    init_status=$status init_out=$output
    run rn-train --data train.lmdb --in init.pb --out ro/b.pb --batch 8 --crop 32 --workers 1 --max-steps 1
    train_status=$status train_out=$output
    run rn-prep -q src ro/c.lmdb
    prep_status=$status prep_out=$output
    run rn-export init.pb ro/d.safetensors
    export_status=$status export_out=$output
    left=$(ls -A ro)
    umount ro
    [ "$init_status" -eq 1 ]
    [[ "$init_out" == *"ro/a.pb: cannot write in ro: Read-only file system"* ]]
    [ "$train_status" -eq 1 ]
    [[ "$train_out" == *"ro/b.pb: cannot write in ro: Read-only file system"* ]]
    [ "$prep_status" -eq 1 ]
    [[ "$prep_out" == *"ro/c.lmdb.tmp: cannot create: Read-only file system"* ]]
    [ "$export_status" -eq 1 ]
    [[ "$export_out" == *"ro/d.safetensors: cannot write in ro: Read-only file system"* ]]
    [ -z "$left" ]
}

@test "an output that is a directory: refused before any work, by every tool" {
    mkdir -p isdir.pb isdir.safetensors
    run rn-init --arch resnet18 -o isdir.pb
    assert_failure 1
    assert_output --partial "isdir.pb: is a directory"
    run rn-train --data train.lmdb --in init.pb --out isdir.pb --batch 8 --crop 32 --epochs 50
    assert_failure 1
    assert_output --partial "isdir.pb: is a directory"
    run rn-export init.pb isdir.safetensors
    assert_failure 1
    assert_output --partial "isdir.safetensors: is a directory"
    run rn-eval --data train.lmdb --ckpt init.pb --crop 32 --dump-logits isdir.safetensors
    assert_failure 1
    assert_output --partial "isdir.safetensors: is a directory"
    run rn-prep -q --report isdir.pb src never.lmdb
    assert_failure 1
    assert_output --partial "isdir.pb: is a directory"
    [ ! -e never.lmdb ]
    run rn-load --crop 32 --dump isdir.pb train.lmdb
    assert_failure 1
    assert_output --partial "isdir.pb: is a directory"
}
