#!/usr/bin/env bats
# rn-load and the loader: determinism, resume, epochs, eval parity with torchvision.

load helper

PY=${PYTHON:-/usr/bin/python3}
MK="$BATS_TEST_DIRNAME/data/mkimages.py"

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PY" "$MK" folder imgs --classes 3 --per-class 7 --size 96x72 --vary --seed 4
    rn-prep -q imgs data.lmdb
    rn-prep -q --encode raw imgs raw.lmdb
}

setup() {
    in_file_dir
}
teardown() { drop_test_outputs; }

sums() { rn-load -q --sums "$@" | grep '^batch '; }

@test "rn-load --help, --version and bad usage" {
    run rn-load --help
    assert_success
    assert_output --partial "usage: rn-load"
    run rn-load --version
    assert_output --regexp "^rn-load [0-9]"
    run rn-load
    assert_failure 2
    run rn-load --batch 0 data.lmdb
    assert_failure 2
    assert_output --partial "--batch: '0' is too small: want 1 to 65536"
    run rn-load --batches 2.5 data.lmdb
    assert_failure 2
    assert_output --partial "--batches: '2.5' is not a whole number"
    run rn-load --start 1 data.lmdb
    assert_failure 2
    assert_output --partial "EPOCH:INDEX"
    run rn-load --augment cutout data.lmdb
    assert_failure 2
    assert_output --partial "--augment: 'cutout' is not an op: known ops are rrc, crop-pad, flip, ta_wide, randaug, autoaug, jitter, erase"
    run rn-load --augment flip,rrc data.lmdb
    assert_failure 2
    assert_output --partial "rrc after flip"
    run rn-load --augment crop-pad=4:mirror data.lmdb
    assert_failure 2
    assert_output --partial "mode 'mirror' is not constant or edge or reflect"
}

@test "reports images/second, position and checksum" {
    run rn-load --batch 8 --epochs 2 --checksum data.lmdb
    assert_success
    assert_output --regexp "rn-load: 42 images in 6 batches, .* img/s"
    assert_line "position: 2:0"
    assert_line --regexp "^checksum: [0-9a-f]{8}$"
}

@test "batches are byte-identical for 1, 2 and 3 workers" {
    a=$(sums --batch 4 --epochs 2 --crop 32 --workers 1 --prefetch 2 --seed 9 data.lmdb)
    b=$(sums --batch 4 --epochs 2 --crop 32 --workers 2 --seed 9 data.lmdb)
    c=$(sums --batch 4 --epochs 2 --crop 32 --workers 3 --prefetch 6 --seed 9 data.lmdb)
    [ "$(wc -l <<<"$a")" -eq 12 ]
    [ "$a" = "$b" ]
    [ "$a" = "$c" ]
    d=$(sums --batch 4 --epochs 2 --crop 32 --seed 10 data.lmdb)
    [ "$a" != "$d" ]
}

@test "resume from a saved position gives the same batches as an uninterrupted run" {
    full=$(sums --batch 5 --epochs 3 --crop 24 --seed 2 data.lmdb)
    pos=$(rn-load -q --batch 5 --batches 7 --crop 24 --seed 2 data.lmdb | sed -n 's/^position: //p')
    [ "$pos" = "1:10" ]
    rest=$(sums --batch 5 --start "$pos" --epochs 2 --crop 24 --seed 2 data.lmdb)
    [ "$rest" = "$(tail -n +8 <<<"$full")" ]
}

@test "epoch boundaries and --drop-last" {
    run sums --batch 5 --crop 16 data.lmdb
    assert_line --index 4 --regexp "^batch 0 20 1 1 "
    run sums --batch 5 --crop 16 --drop-last --epochs 2 data.lmdb
    [ "${#lines[@]}" -eq 8 ]
    assert_line --index 3 --regexp "^batch 0 15 5 1 "
    assert_line --index 4 --regexp "^batch 1 0 5 0 "
    run rn-load --batch 64 --drop-last data.lmdb
    assert_failure 1
    assert_output --partial "cannot fill one batch of 64"
}

@test "eval transform with --exact matches torchvision Resize+CenterCrop on PIL" {
    rn-load -q --eval --exact --batch 21 --crop 40 --raw ev.raw raw.lmdb
    run "$PY" -c "
import numpy as np, torchvision.datasets as D, torchvision.transforms as T
ds = D.ImageFolder('imgs', transform=T.Compose([T.Resize(round(40 * 256 / 224)), T.CenterCrop(40)]))
ref = np.stack([np.asarray(im) for im, _ in ds]).astype(int)
got = np.fromfile('ev.raw', np.uint8).reshape(ref.shape).astype(int)
d = np.abs(ref - got)
print('mad %.4f max %d' % (d.mean(), d.max()))
assert d.mean() < 0.05 and d.max() <= 1"
    assert_success
    # with DCT-scaled decoding of JPEG records the result stays close
    rn-load -q --eval --batch 21 --crop 40 --raw evj.raw data.lmdb
    run "$PY" -c "
import numpy as np
a = np.fromfile('ev.raw', np.uint8).astype(int); b = np.fromfile('evj.raw', np.uint8).astype(int)
print('mad %.3f' % np.abs(a - b).mean()); assert np.abs(a - b).mean() < 4"
    assert_success
}

@test "train transform: crops vary per epoch, flips happen, --augment none is the eval transform" {
    a=$(sums --batch 21 --epochs 2 --crop 32 --no-shuffle data.lmdb | cut -d' ' -f6)
    [ "$(sed -n 1p <<<"$a")" != "$(sed -n 2p <<<"$a")" ]
    ev=$(sums --batch 21 --crop 32 --eval data.lmdb | cut -d' ' -f6)
    none=$(sums --batch 21 --crop 32 --augment none --no-shuffle data.lmdb | cut -d' ' -f6)
    [ "$ev" = "$none" ]
}

@test "--dump writes a JPEG contact sheet; --float runs" {
    run rn-load --batch 6 --batches 1 --dump sheet.jpg --float data.lmdb
    assert_success
    assert_output --partial ", float)"
    [ "$(head -c 2 sheet.jpg | od -An -tx1 | tr -d ' ')" = ffd8 ]
}

@test "gray datasets load as 1 channel" {
    rn-prep -q --gray imgs g.lmdb
    run rn-load --batch 7 --crop 20 --raw g.raw g.lmdb
    assert_success
    [ "$(stat -c %s g.raw)" -eq $((7 * 20 * 20)) ]
}

@test "a missing or non-dataset path fails with a message" {
    run rn-load nothere.lmdb
    assert_failure 1
    assert_output --partial "nothere.lmdb"
    mkdir -p notds
    run rn-load notds
    assert_failure 1
    assert_output --partial "no data.mdb"
}

@test "a flipped bit in a record's image data is an error naming the record (records carry a CRC32C)" {
    rm -rf flip.lmdb
    cp -r data.lmdb flip.lmdb
    # one bit inside each JPEG's entropy-coded data (libjpeg alone would decode most of
    # them without a word); every copy in the file, as LMDB's free pages hold stale ones
    run "$PY" "$BATS_TEST_DIRNAME/data/flipjpeg.py" flip.lmdb/data.mdb
    assert_success
    [ "$output" -ge 21 ]
    run rn-load --batch 7 --epochs 1 --crop 32 --no-shuffle flip.lmdb
    assert_failure 1
    assert_output --regexp "flip.lmdb: record [0-9]{8}: its image data fails its checksum"
    # the untouched copy loads
    run rn-load --batch 7 --epochs 1 --crop 32 --no-shuffle data.lmdb
    assert_success
}
