#!/usr/bin/env bats
# rn-prep: image folders and list files to rn datasets.

load helper

PY=${PYTHON:-/usr/bin/python3}
MK="$BATS_TEST_DIRNAME/data/mkimages.py"
MKF="$BATS_TEST_DIRNAME/data/mkformats.py"

# the formats this build reads, as rn-prep --help names them
have_format() { rn-prep --help | grep -q "^This build reads .*$1"; }

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PY" "$MK" folder imgs --classes 3 --per-class 4 --size 64x48 --vary --seed 1
    "$PY" "$MK" broken broken
    "$PY" "$MK" list imgs list.txt
    "$PY" "$MKF" png pngs
    "$PY" "$MKF" pngbroken pngbad
    "$PY" "$MKF" webp webps
    "$PY" "$MKF" webpbroken webpbad
    "$PY" "$MKF" pnm pnms
    "$PY" "$MKF" pnmbroken pnmbad
    "$PY" "$MKF" bmp bmps
    "$PY" "$MKF" bmpbroken bmpbad
}

setup() {
    in_file_dir
}
teardown() { drop_test_outputs; }

@test "rn-prep --help, --version and bad usage" {
    run rn-prep --help
    assert_success
    assert_output --partial "usage: rn-prep"
    run rn-prep --version
    assert_success
    assert_output --regexp "^rn-prep [0-9]"
    run rn-prep imgs
    assert_failure 2
    run rn-prep --encode png imgs out.lmdb
    assert_failure 2
    assert_output --partial "--encode: 'png'"
    run rn-prep --quality 90.5 imgs out.lmdb
    assert_failure 2
    assert_output --partial "--quality: '90.5' is not a whole number"
    run rn-prep --seed -1 imgs out.lmdb
    assert_failure 2
    assert_output --partial "--seed: '-1' is negative"
    run rn-prep --map-size 1K imgs out.lmdb
    assert_failure 2
    assert_output --partial "--map-size: '1K' is too small"
    run rn-prep --bogus imgs out.lmdb
    assert_failure 2
}

@test "ImageFolder: labels and order are torchvision's ImageFolder's" {
    run rn-prep -q imgs if.lmdb
    assert_success
    assert_output --partial "wrote 12 records"
    rn-load --list if.lmdb | awk '{print $6, $2}' > rn.txt
    "$PY" -c "
import torchvision.datasets as D
for p, l in D.ImageFolder('imgs').samples:
    print(p[len('imgs/'):], l)" > tv.txt
    run diff rn.txt tv.txt
    assert_success
    run cat if.lmdb/classes.txt
    assert_output "$(printf 'class_00\nclass_01\nclass_02')"
}

@test "mdb_stat works on the output and counts records + __info__" {
    rn-prep -q imgs st.lmdb
    run mdb_stat st.lmdb
    assert_success
    assert_output --partial "Entries: 13"
}

@test "list file with --root gives the same records as the folder" {
    rn-prep -q list.txt --root imgs lst.lmdb
    rn-prep -q imgs fold.lmdb
    run diff <(rn-load --list lst.lmdb | cut -d' ' -f2-) <(rn-load --list fold.lmdb | cut -d' ' -f2-)
    assert_success
    printf 'class_00/img_0000.jpg 0\nno_label_here\nclass_01/img_0000.jpg x\nmissing.jpg 1\n' > bad_list.txt
    run rn-prep -q bad_list.txt --root imgs badl.lmdb
    assert_success
    assert_output --partial "wrote 1 records"
    assert_output --partial "no label"
    assert_output --partial "label 'x' is not a non-negative integer"
    assert_output --partial "missing.jpg: cannot open"
}

@test "huge labels in a list file are refused, quickly (INT_MAX overflowed; 10^8 took 49 s and 6.8 GB)" {
    printf 'class_00/img_0000.jpg 2147483647\nclass_00/img_0001.jpg 0\n' > big1.txt
    run timeout 20 rn-prep -q big1.txt --root imgs big1.lmdb
    assert_success
    assert_output --partial "big1.txt:1: label 2147483647 is over the limit of 100000 classes (--max-classes raises it)"
    run rn-info --json big1.lmdb
    assert_output --partial '"count":1,'
    printf 'class_00/img_0000.jpg 100000000\nclass_00/img_0001.jpg 1\n' > big2.txt
    run timeout 20 rn-prep -q --strict big2.txt --root imgs big2.lmdb
    assert_failure 1
    assert_output --partial "label 100000000 is over the limit"
    [ ! -e big2.lmdb ]
    # within the limit but sparse: 5001 classes for 2 labels
    printf 'class_00/img_0000.jpg 5000\nclass_00/img_0001.jpg 1\n' > sparse.txt
    run rn-prep -q sparse.txt --root imgs sparse.lmdb
    assert_failure 1
    assert_output --partial "labels reach 5000 but only 2 different labels occur"
    [ ! -e sparse.lmdb ]
    # --max-classes lowers (or raises) the limit
    printf 'class_00/img_0000.jpg 0\nclass_00/img_0001.jpg 1\n' > two.txt
    run rn-prep --max-classes 1 two.txt --root imgs lim.lmdb
    assert_success
    assert_output --partial "two.txt:2: label 1 is over the limit of 1 classes"
    run rn-prep --max-classes 0 big2.txt x.lmdb
    assert_failure 2
}

@test "--classes reuses the training labels for a validation folder" {
    rn-prep -q imgs train.lmdb
    mkdir -p val
    cp -r imgs/class_02 val/
    rn-prep -q --classes train.lmdb val val.lmdb
    run rn-load --list val.lmdb
    assert_line --regexp "^00000000 2 "
    rn-prep -q --classes train.lmdb/classes.txt val val2.lmdb
    run diff <(rn-load --list val.lmdb) <(rn-load --list val2.lmdb)
    assert_success
    run rn-info val.lmdb
    assert_output --partial "classes:    3"
    mkdir -p val_bad/zebra && cp imgs/class_00/img_0000.jpg val_bad/zebra/
    run rn-prep -q --classes train.lmdb val_bad vb.lmdb
    assert_failure 1
    assert_output --partial "class folder 'zebra' is not in the class list"
}

@test "--gray stores 1 channel; --encode raw stores H*W*C bytes" {
    rn-prep -q --gray imgs gray.lmdb
    run rn-info --json gray.lmdb
    assert_output --partial '"channels":1'
    rn-prep -q --encode raw imgs raw.lmdb
    run rn-load --list raw.lmdb
    assert_success
    while read -r key label dims enc bytes name; do
        IFS=x read -r w h c <<<"$dims"
        [ "$enc" = raw ]
        [ "$bytes" -eq $((w * h * c)) ]
    done < <(rn-load --list raw.lmdb)
}

@test "--resize N sets the shorter side as torchvision's Resize(N); --center-crop crops" {
    rn-prep -q --resize 20 imgs rs.lmdb
    rn-load --list rs.lmdb | awk '{print $6, $3}' > rn.txt
    "$PY" -c "
import torchvision.datasets as D, torchvision.transforms as T
ds = D.ImageFolder('imgs', transform=T.Resize(20))
for (p, l), (im, _) in zip(ds.samples, ds):
    print(p[len('imgs/'):], '%dx%dx3' % im.size)" > tv.txt
    run diff rn.txt tv.txt
    assert_success
    rn-prep -q --resize 20 --center-crop 16 imgs cc.lmdb
    run rn-info cc.lmdb
    assert_output --partial "16x16 to 16x16"
}

@test "broken and unusual files: skipped with reasons, the rest written" {
    run rn-prep --report rep.txt broken br.lmdb
    assert_success
    # png_named.jpg is a PNG: read by its content where the build reads PNG, as PIL does
    if have_format PNG; then
        assert_output --partial "wrote 7 records"
        assert_output --partial "(7 skipped)"
    else
        assert_output --partial "wrote 6 records"
        assert_output --partial "(8 skipped)"
        assert_output --partial "broken/odd/png_named.jpg: the file holds a PNG image, and this build has no PNG support"
    fi
    assert_output --partial "broken/odd/truncated.jpg: JPEG decode: corrupt or truncated JPEG data (libjpeg: Premature end of JPEG file)"
    # damaged data that libjpeg only warns about (PIL decodes these with grey blocks)
    assert_output --partial "broken/odd/prog_cut.jpg: JPEG decode: corrupt or truncated JPEG data (libjpeg: Corrupt JPEG data: premature end of data segment)"
    assert_output --partial "broken/odd/stray_rst.jpg: JPEG decode: corrupt or truncated JPEG data"
    assert_output --partial "broken/odd/corrupt.jpg: JPEG decode: corrupt or truncated JPEG data"
    assert_output --partial "broken/odd/zero.jpg: empty file"
    assert_output --partial "broken/odd/text.jpg: not an image rn-prep reads: the file holds text"
    assert_output --partial "broken/odd/huge.jpg: 60000x60000 is 3600.0 megapixels, over --max-pixels"
    run wc -l < rep.txt
    if have_format PNG; then assert_output 7; else assert_output 8; fi
    # CMYK, gray, progressive and 4:4:4/4:2:2 inputs all come out as RGB
    run rn-load --list br.lmdb
    assert_output --partial "odd/cmyk.jpg"
    assert_output --partial "odd/progressive.jpg"
    assert_output --partial "odd/gray.jpg"
    refute_output --partial "x1 jpeg"
}

@test "--strict refuses JPEGs whose data libjpeg only warns about (they were once accepted)" {
    for f in prog_cut stray_rst corrupt; do
        mkdir -p "w$f/a"
        cp broken/odd/good.jpg "broken/odd/$f.jpg" "w$f/a/"
        for resize in "" "--resize 40"; do
            # with --resize the DCT-scaled region decoder (libjpeg) reads the file
            run rn-prep -q --strict $resize "w$f" "w$f.lmdb"
            assert_failure 1
            assert_output --partial "$f.jpg: JPEG decode: corrupt or truncated JPEG data (libjpeg: Corrupt JPEG data"
            [ ! -e "w$f.lmdb" ]
        done
    done
}

@test "a file whose header cannot be read does not spoil the next image on the same thread" {
    mkdir -p hdr/a
    cp imgs/*/*.jpg hdr/a/ 2>/dev/null || true
    n=$(ls hdr/a | wc -l)
    # cut inside the header: TurboJPEG fails the header read itself (sorted first: "0")
    head -c 300 "$(ls -d hdr/a/* | head -1)" > hdr/a/0cut.jpg
    run rn-prep --threads 1 hdr hdr.lmdb
    assert_success
    assert_output --partial "wrote $n records"
    assert_output --partial "(1 skipped)"
    refute_output --partial "0x0 pixels"
}

@test "--strict: a bad input fails the run and leaves no output" {
    run rn-prep -q --strict broken strict.lmdb
    assert_failure 1
    assert_output --partial "--strict"
    [ ! -e strict.lmdb ]
    [ ! -e strict.lmdb.tmp ]
    # an existing dataset under that name survives the failed run
    rn-prep -q imgs keep.lmdb
    run rn-prep -q --strict broken keep.lmdb
    assert_failure 1
    run rn-info --json keep.lmdb
    assert_output --partial '"count":12'
}

@test "identical output for 1 and 2 threads" {
    rn-prep -q --threads 1 --shuffle --seed 3 --resize 24 imgs t1.lmdb
    rn-prep -q --threads 2 --shuffle --seed 3 --resize 24 imgs t2.lmdb
    # every record byte-identical (DatasetInfo differs: it holds the command line)
    records() { mdb_dump "$1" | awk '/^ 5f5f696e666f5f5f$/ {skip = 2} skip > 0 {skip--; next} {print}'; }
    [ "$(records t1.lmdb | wc -l)" -gt 20 ]
    run diff <(records t1.lmdb) <(records t2.lmdb)
    assert_success
}

@test "--shuffle --seed changes the order reproducibly; --limit caps" {
    rn-prep -q --shuffle --seed 5 imgs s5.lmdb
    rn-prep -q --shuffle --seed 5 imgs s5b.lmdb
    rn-prep -q imgs s0.lmdb
    run diff <(rn-load --list s5.lmdb) <(rn-load --list s5b.lmdb)
    assert_success
    run diff <(rn-load --list s5.lmdb) <(rn-load --list s0.lmdb)
    assert_failure
    run diff <(rn-load --list s5.lmdb | cut -d' ' -f2- | sort) <(rn-load --list s0.lmdb | cut -d' ' -f2- | sort)
    assert_success
    rn-prep -q --limit 5 imgs lim.lmdb
    run rn-info --json lim.lmdb
    assert_output --partial '"count":5'
}

@test "--augment K writes K crops per image; a tiny map grows instead of failing" {
    rn-prep -q --augment 3 --crop 24 --seed 1 --map-size 64K imgs aug.lmdb
    run rn-info aug.lmdb
    assert_output --partial "records:    36"
    assert_output --partial "24x24 to 24x24"
    rn-prep -q --augment 3 --crop 24 --seed 1 imgs aug2.lmdb
    run diff <(rn-load --list aug.lmdb) <(rn-load --list aug2.lmdb)
    assert_success
}

@test "rn-info on a dataset: count, classes, sizes, encoding, mean/std, command" {
    rn-prep -q --resize 32 imgs info.lmdb
    run rn-info info.lmdb
    assert_success
    assert_output --partial "records:    12"
    assert_output --partial "class_01"
    assert_output --partial "encoding:   jpeg, 3 channels"
    assert_output --partial "mean:"
    assert_output --partial "rn-prep -q --resize 32 imgs info.lmdb"
    run rn-info --json info.lmdb
    assert_success
    run "$PY" -c "
import json, sys
d = json.loads(sys.argv[1])
assert d['count'] == 12 and len(d['classes']) == 3 and sum(c['count'] for c in d['classes']) == 12
assert all(0 < m < 1 for m in d['mean']) and all(0 < s < 0.5 for s in d['std'])
print('ok')" "$output"
    assert_output ok
}

@test "mean/std are those of the stored pixels (checked with numpy)" {
    rn-prep -q --encode raw --resize 16 --center-crop 16 imgs ms.lmdb
    run "$PY" -c "
import json, subprocess, numpy as np, torchvision.datasets as D, torchvision.transforms as T
ds = D.ImageFolder('imgs', transform=T.Compose([T.Resize(16), T.CenterCrop(16)]))
x = np.stack([np.asarray(im, dtype=np.float64) / 255 for im, _ in ds])
d = json.loads(subprocess.check_output(['rn-info', '--json', 'ms.lmdb']))
m, s = x.mean(axis=(0, 1, 2)), x.std(axis=(0, 1, 2))
assert np.allclose(m, d['mean'], atol=0.01) and np.allclose(s, d['std'], atol=0.01), (m, s, d)
print('ok')"
    assert_output ok
}

@test "an empty class folder is reported; the class keeps its label" {
    mkdir -p withempty/a withempty/b withempty/c
    cp imgs/class_00/img_0000.jpg withempty/a/
    cp imgs/class_00/img_0001.jpg withempty/c/
    run rn-prep -q withempty we.lmdb
    assert_success
    assert_output --partial "withempty/b: empty class folder"
    run rn-load --list we.lmdb
    assert_line --regexp "^00000001 2 "
    run rn-prep -q --strict withempty we2.lmdb
    assert_failure 1
    [ ! -e we2.lmdb ]
}

@test "a killed rn-prep never leaves a partial dataset under the final name" {
    "$PY" "$MK" folder many --classes 2 --per-class 150 --size 160x120 --seed 2
    rn-prep -q imgs kill.lmdb
    # 15000 small records: about a second of work, so the kill lands mid-run
    rn-prep -q --threads 1 --augment 50 --crop 48 many kill.lmdb &
    pid=$!
    sleep 0.3
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" || true
    # either the old dataset (12) or a complete new one (15000), never anything else
    run rn-info --json kill.lmdb
    assert_success
    [[ "$output" == *'"count":12,'* || "$output" == *'"count":15000,'* ]]
    # the next run cleans the leftover temporary and succeeds
    run rn-prep -q imgs kill.lmdb
    assert_success
    [ ! -e kill.lmdb.tmp ]
}

@test "whatever a killed rn-prep left in OUT.lmdb.tmp, the next run cleans it (a kill while writing classes.txt blocked every later run)" {
    mkdir -p left.lmdb.tmp
    touch left.lmdb.tmp/classes.txt.tmp left.lmdb.tmp/data.mdb left.lmdb.tmp/lock.mdb
    run rn-prep -q imgs left.lmdb
    assert_success
    [ ! -e left.lmdb.tmp ]
    run rn-info --json left.lmdb
    assert_output --partial '"count":12,'
    # a folder inside is not rn's doing: left alone, and the message says what to do
    mkdir -p mine.lmdb.tmp/photos
    run rn-prep -q imgs mine.lmdb
    assert_failure 1
    assert_output --partial "mine.lmdb.tmp: holds a folder rn did not write (photos)"
    [ -d mine.lmdb.tmp/photos ]
    [ ! -e mine.lmdb ]
}

@test "SIGTERM stops rn-prep cleanly: exit 1, no output, no leftover" {
    [ -d many ] || "$PY" "$MK" folder many --classes 2 --per-class 150 --size 160x120 --seed 2
    rm -rf term.lmdb
    rn-prep -q --threads 1 --augment 50 --crop 48 many term.lmdb 2> term.err &
    pid=$!
    sleep 0.3
    kill -TERM "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" || rc=$?
    if [ "$rc" -eq 0 ]; then
        # it finished before the signal: then the dataset is complete
        run rn-info --json term.lmdb
        assert_output --partial '"count":15000,'
    else
        [ "$rc" -eq 1 ]
        grep -q "interrupted" term.err
        [ ! -e term.lmdb ]
        [ ! -e term.lmdb.tmp ]
    fi
}

@test "a full disk: exit 1, 'no space left' naming the output, the previous dataset intact" {
    [ "$(id -u)" = 0 ] || skip "needs root to mount a small tmpfs"
    mkdir -p small
    mount -t tmpfs -o size=1M tmpfs small 2> /dev/null || skip "cannot mount a tmpfs here"
    rn-prep -q imgs small/d.lmdb
    "$PY" "$MK" folder bigimgs --classes 2 --per-class 20 --size 320x240 --noise 30 --seed 5
    run rn-prep -q bigimgs small/d.lmdb
    umount_rc=0
    run_out=$output run_status=$status
    run rn-info --json small/d.lmdb
    info=$output
    leftover=$(ls small)
    umount small || umount_rc=$?
    [ "$run_status" -eq 1 ]
    [[ "$run_out" == *"small/d.lmdb.tmp: no space left on the device"* ]]
    [[ "$info" == *'"count":12,'* ]]
    [ "$leftover" = d.lmdb ]
    [ "$umount_rc" -eq 0 ]
}

@test "missing source and unwritable output fail with a message" {
    run rn-prep -q nosuchdir out1.lmdb
    assert_failure 1
    assert_output --partial "nosuchdir"
    touch plainfile
    run rn-prep -q imgs plainfile
    assert_failure 1
    assert_output --partial "plainfile: exists and is not a dataset"
}

@test "PNG of every kind: the pixels of PIL's convert(\"RGB\") and convert(\"L\"), exactly" {
    have_format PNG || skip "this build reads no PNG (make deps installs libspng-dev)"
    n=$(ls pngs/png | wc -l)
    [ "$n" -ge 48 ]
    run rn-prep -q --encode raw pngs png.lmdb
    assert_success
    assert_output --partial "wrote $n records"
    # all 29x29: the eval transform without resize is the identity on them
    rn-load -q --eval --exact --resize 0 --crop 29 --batch "$n" --batches 1 --raw png.raw png.lmdb
    "$PY" "$MKF" ref pngs pil.raw 2>/dev/null
    run "$PY" -c "
import numpy as np, os
a = np.fromfile('png.raw', np.uint8).reshape(-1, 29, 29, 3)
b = np.fromfile('pil.raw', np.uint8).reshape(-1, 29, 29, 3)
names = sorted(os.listdir('pngs/png'))
bad = [(f, int((a[i] != b[i]).sum())) for i, f in enumerate(names) if (a[i] != b[i]).any()]
assert a.shape == b.shape == ($n, 29, 29, 3) and not bad, bad
print('%d PNGs equal' % len(names))"
    assert_output "$n PNGs equal"
    rn-prep -q --gray --encode raw pngs pngg.lmdb
    rn-load -q --eval --exact --resize 0 --crop 29 --batch "$n" --batches 1 --raw pngg.raw pngg.lmdb
    "$PY" "$MKF" ref pngs pilg.raw --gray 2>/dev/null
    run cmp pngg.raw pilg.raw
    assert_success
}

@test "PNG: --resize and --center-crop as torchvision on PIL; identical output for any thread count" {
    have_format PNG || skip "this build reads no PNG (make deps installs libspng-dev)"
    rn-prep -q --encode raw --resize 20 --center-crop 18 --threads 1 pngs pr1.lmdb
    rn-prep -q --encode raw --resize 20 --center-crop 18 --threads 3 pngs pr3.lmdb
    records() { mdb_dump "$1" | awk '/^ 5f5f696e666f5f5f$/ {skip = 2} skip > 0 {skip--; next} {print}'; }
    run diff <(records pr1.lmdb) <(records pr3.lmdb)
    assert_success
    n=$(ls pngs/png | wc -l)
    rn-load -q --eval --exact --resize 0 --crop 18 --batch "$n" --batches 1 --raw pr.raw pr1.lmdb
    run "$PY" -c "
import numpy as np, torchvision.datasets as D, torchvision.transforms as T
ds = D.ImageFolder('pngs', transform=T.Compose([T.Resize(20), T.CenterCrop(18)]))
ref = np.stack([np.asarray(im) for im, _ in ds]).astype(int)
got = np.fromfile('pr.raw', np.uint8).reshape(ref.shape).astype(int)
d = np.abs(ref - got)
print('max %d' % d.max()); assert d.max() <= 1"
    assert_success
    # the default JPEG records and --augment run on PNG input too
    run rn-prep -q --augment 2 --crop 16 pngs pa.lmdb
    assert_success
    assert_output --partial "wrote $((2 * n)) records"
}

@test "broken, truncated and hostile PNGs: skipped with the reason, or fail under --strict" {
    have_format PNG || skip "this build reads no PNG (make deps installs libspng-dev)"
    run rn-prep -q --report pbad.txt pngbad pbad.lmdb
    assert_success
    assert_output --partial "pngbad/odd/truncated.png: PNG decode: "
    assert_output --partial "pngbad/odd/header_only.png: PNG header: "
    assert_output --partial "pngbad/odd/corrupt.png: PNG decode: "
    assert_output --partial "pngbad/odd/bigchunk.png: PNG "
    assert_output --partial "pngbad/odd/zero_width.png: PNG header: invalid image width"
    # sizes come from the header: refused before anything is allocated for them
    assert_output --partial "pngbad/odd/huge.png: 100000x100000 is 10000.0 megapixels, over --max-pixels"
    refute_output --partial "good.png"
    run cut -f1 pbad.txt
    assert_output "$(printf '%s\n' bigchunk corrupt header_only huge truncated zero_width | sed 's|.*|pngbad/odd/&.png|')"
    run rn-prep -q --max-pixels 1000 pngbad pmax.lmdb
    assert_output --partial "pngbad/odd/good.png: 40x40 is 0.0 megapixels, over --max-pixels 1000"
    run rn-prep -q --strict pngbad pstrict.lmdb
    assert_failure 1
    assert_output --partial "(--strict: no output written)"
    [ ! -e pstrict.lmdb ]
}

@test "WebP lossy, lossless, with alpha: the pixels of PIL's convert(\"RGB\") and convert(\"L\"), exactly" {
    have_format WebP || skip "this build reads no WebP (make deps installs libwebp-dev)"
    n=$(ls webps/webp | wc -l)
    [ "$n" -ge 11 ]
    run rn-prep -q --encode raw webps webp.lmdb
    assert_success
    assert_output --partial "wrote $n records"
    rn-load -q --eval --exact --resize 0 --crop 29 --batch "$n" --batches 1 --raw webp.raw webp.lmdb
    "$PY" "$MKF" ref webps pilw.raw
    run cmp webp.raw pilw.raw
    assert_success
    rn-prep -q --gray --encode raw webps webpg.lmdb
    rn-load -q --eval --exact --resize 0 --crop 29 --batch "$n" --batches 1 --raw webpg.raw webpg.lmdb
    "$PY" "$MKF" ref webps pilwg.raw --gray
    run cmp webpg.raw pilwg.raw
    assert_success
    rn-prep -q --encode raw --resize 20 --threads 1 webps wr1.lmdb
    rn-prep -q --encode raw --resize 20 --threads 3 webps wr3.lmdb
    records() { mdb_dump "$1" | awk '/^ 5f5f696e666f5f5f$/ {skip = 2} skip > 0 {skip--; next} {print}'; }
    run diff <(records wr1.lmdb) <(records wr3.lmdb)
    assert_success
}

@test "broken, truncated, hostile and animated WebPs: skipped with the reason" {
    have_format WebP || skip "this build reads no WebP (make deps installs libwebp-dev)"
    run rn-prep -q --report wbad.txt webpbad wbad.lmdb
    assert_success
    assert_output --partial "wrote 1 records"
    assert_output --partial "webpbad/odd/truncated.webp: WebP decode: truncated data (libwebp)"
    assert_output --partial "webpbad/odd/header_only.webp: WebP header: "
    assert_output --partial "webpbad/odd/corrupt.webp: WebP "
    assert_output --partial "webpbad/odd/huge.webp: 16384x16384 is 268.4 megapixels, over --max-pixels"
    assert_output --partial "webpbad/odd/animated.webp: animated WebP: rn reads still images only"
    run wc -l < wbad.txt
    assert_output 5
}

@test "PPM/PGM (P6/P5, maxval 255 and 65535): the pixels of PIL's convert(\"RGB\") and convert(\"L\"), exactly" {
    n=$(ls pnms/pnm | wc -l)
    [ "$n" -ge 10 ]
    run rn-prep -q --encode raw pnms pnm.lmdb
    assert_success
    assert_output --partial "wrote $n records"
    rn-load -q --eval --exact --resize 0 --crop 29 --batch "$n" --batches 1 --raw pnm.raw pnm.lmdb
    "$PY" "$MKF" ref pnms pilp.raw
    run cmp pnm.raw pilp.raw
    assert_success
    rn-prep -q --gray --encode raw pnms pnmg.lmdb
    rn-load -q --eval --exact --resize 0 --crop 29 --batch "$n" --batches 1 --raw pnmg.raw pnmg.lmdb
    "$PY" "$MKF" ref pnms pilpg.raw --gray
    run cmp pnmg.raw pilpg.raw
    assert_success
}

@test "PPM/PGM that rn does not read, truncated or huge: skipped with the reason" {
    run rn-prep -q pnmbad pnmbad.lmdb
    assert_success
    assert_output --partial "wrote 1 records"
    assert_output --partial "pnmbad/odd/truncated.ppm: PPM/PGM: truncated (2393 bytes of samples, 4800 needed)"
    assert_output --partial "pnmbad/odd/plain.ppm: PPM/PGM: only binary P5 (grey) and P6 (RGB) files are read, not P3"
    assert_output --partial "pnmbad/odd/maxval1000.pgm: PPM/PGM: maxval 1000 (rn reads maxval 255 and 65535: convert it)"
    assert_output --partial "pnmbad/odd/huge.pgm: 100000x100000 is 10000.0 megapixels, over --max-pixels"
    assert_output --partial "pnmbad/odd/badsize.pgm: PPM/PGM header: bad number"
}

@test "BMP (1/4/8-bit palettes, 24/32 bits, bitfields, top-down, OS/2 and V5 headers): PIL's pixels, exactly" {
    n=$(ls bmps/bmp | wc -l)
    [ "$n" -ge 24 ]
    run rn-prep -q --encode raw bmps bmp.lmdb
    assert_success
    assert_output --partial "wrote $n records"
    rn-load -q --eval --exact --resize 0 --crop 29 --batch "$n" --batches 1 --raw bmp.raw bmp.lmdb
    "$PY" "$MKF" ref bmps pilb.raw
    run cmp bmp.raw pilb.raw
    assert_success
    rn-prep -q --gray --encode raw bmps bmpg.lmdb
    rn-load -q --eval --exact --resize 0 --crop 29 --batch "$n" --batches 1 --raw bmpg.raw bmpg.lmdb
    "$PY" "$MKF" ref bmps pilbg.raw --gray
    run cmp bmpg.raw pilbg.raw
    assert_success
}

@test "BMP that rn does not read (RLE, 16-bit), truncated or huge: skipped with the reason" {
    run rn-prep -q bmpbad bmpbad.lmdb
    assert_success
    assert_output --partial "wrote 1 records"
    assert_output --partial "bmpbad/odd/truncated.bmp: BMP: truncated (2373 bytes of pixels, 4800 needed)"
    assert_output --partial "bmpbad/odd/header_only.bmp: BMP header: truncated"
    assert_output --partial "bmpbad/odd/rle8.bmp: BMP: RLE compression (rn reads uncompressed BMPs: convert it)"
    assert_output --partial "bmpbad/odd/bits16.bmp: BMP: 16 bits per pixel"
    assert_output --partial "bmpbad/odd/bad_header_size.bmp: BMP: unsupported header size 99"
    assert_output --partial "bmpbad/odd/huge.bmp: 100000x100000 is 10000.0 megapixels, over --max-pixels"
}
