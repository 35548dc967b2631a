#!/usr/bin/env bats
# rn-train --tensorboard DIR: TensorBoard event files, read back by rn-info (every record's
# two CRC32Cs checked) over a run resumed epoch by epoch as the pipelines run it, and a
# resume from an older checkpoint that overlaps the steps already written.
load helper

# Three invocations into one DIR: epoch 1 from init.pb, epoch 2 from e1.pb (both logged to
# run.jsonl), then epochs 2-3 again from e1.pb (dup.jsonl): steps 5-8 are in DIR already.
setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/train 32 1 >/dev/null
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/val 16 2 >/dev/null
    rn-prep -q src/train train.lmdb
    rn-prep -q --classes train.lmdb src/val val.lmdb
    rn-init --arch resnet18 --classes 2 --seed 1 -o init.pb
    T="--data train.lmdb --val val.lmdb --batch 16 --crop 32 --workers 2 --threads 2 --log-every 3 --tensorboard tb"
    rn-train $T --in init.pb --out e1.pb --epochs 1 --log run.jsonl 2>/dev/null
    rn-train $T --in e1.pb --out e2.pb --epochs 1 --log run.jsonl 2>/dev/null
    rn-train $T --in e1.pb --out e3.pb --epochs 2 --log dup.jsonl 2>dup.err
    rn-info tb > events.txt
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

@test "rn-train --help and the man page name --tensorboard" {
    run rn-train --help
    assert_success
    assert_output --partial "--tensorboard DIR"
    run grep -c -- "tensorboard" "$BATS_TEST_DIRNAME/../man/rn-train.1"
    assert_success
}

@test "one event file per invocation, named as TensorBoard expects, every record's CRCs valid" {
    run rn-info tb
    assert_success
    assert_equal "$(ls tb | wc -l)" 3
    # events.out.tfevents.<unix seconds>.<host>.<microseconds>.<pid>
    for f in $(ls tb); do
        [[ $f =~ ^events\.out\.tfevents\.[0-9]{10}\..+\.[0-9]{6}\.[0-9]+$ ]]
    done
    run grep -c ': brain.Event:2$' events.txt
    assert_output 3
    # each file alone too, in the order of the listing
    for f in tb/*; do
        run rn-info "$f"
        assert_success
        assert_line --index 0 "# $f: brain.Event:2"
    done
}

@test "the tags: train scalars, val per epoch, the flags as text; no loss scale without fp16" {
    for tag in train/loss train/lr train/img_s train/data_wait val/top1 val/top5 val/loss run/flags; do
        run grep -c "^$tag " events.txt
        assert_success
    done
    run grep -c "^train/loss_scale " events.txt
    assert_output 0
    run grep '^run/flags 0 ' events.txt
    assert_output --partial '--in init.pb'
    assert_output --partial '--tensorboard tb'
}

@test "resumed invocations: steps strictly increase per tag across the files, none repeated" {
    run "$PYTHON" - <<'PY'
steps = {}
for line in open("events.txt"):
    if line.startswith("#"):
        continue
    tag, step = line.split(" ", 2)[:2]
    steps.setdefault(tag, []).append(int(step))
for tag, s in steps.items():
    assert all(a < b for a, b in zip(s, s[1:])), (tag, s)
assert steps["train/loss"] == [3, 4, 7, 8, 11, 12], steps["train/loss"]
assert steps["val/top1"] == [4, 8, 12], steps["val/top1"]
# the flags of the first two invocations; the third started at step 4, which the tag has
assert steps["run/flags"] == [0, 4], steps["run/flags"]
print("ok")
PY
    assert_success
    assert_output ok
    run cat dup.err
    assert_output --partial "rn-train: --tensorboard: the folder holds steps up to 8 and this run starts at 4: steps already there are not written again"
}

@test "the scalars equal the JSONL log's values at the same steps" {
    run "$PYTHON" - <<'PY'
import json, struct
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
ev = {}
for line in open("events.txt"):
    if line.startswith("#") or line.startswith("run/flags"):
        continue
    tag, step, value = line.split()
    ev[(tag, int(step))] = f32(float(value))  # %.9g of a float32 names it exactly
# steps 1-8 from the first two invocations; 9-12 from the third (its 5-8 were dropped)
log = [json.loads(l) for l in open("run.jsonl")]
log += [l for l in map(json.loads, open("dup.jsonl")) if l["step"] > 8]
n = 0
for l in log:
    k = l["step"]
    if l["kind"] == "step":
        # loss and lr exactly (as float32); img_s and data_wait as rounded in the log
        assert ev[("train/loss", k)] == f32(l["loss"]), (k, l)
        assert ev[("train/lr", k)] == f32(l["lr"]), (k, l)
        assert abs(ev[("train/img_s", k)] - l["img_s"]) <= 0.005 + 1e-6 * l["img_s"], (k, l)
        assert abs(ev[("train/data_wait", k)] - l["data_wait"]) <= 0.00005 + 1e-7, (k, l)
    else:
        for t in ("top1", "top5", "loss"):
            assert abs(ev[("val/" + t, k)] - l["val_" + t]) <= 5e-7 + 1e-6 * abs(l["val_" + t]), (t, k, l)
    n += 1
assert n == 9, n
assert len(ev) == 4 * 6 + 3 * 3, sorted(ev)
print("ok")
PY
    assert_success
    assert_output ok
}

@test "a flipped byte is found by the reader: the record and the check that failed" {
    f=$(ls tb/* | head -n 1)
    cp "$f" flipped.tfevents
    flip_byte flipped.tfevents 60
    run rn-info flipped.tfevents
    assert_failure 1
    assert_output --regexp "rn-info: flipped\.tfevents: record [0-9]+ at byte [0-9]+: the (data|length) fails its CRC32C"
    cp "$f" cut.tfevents
    truncate -s -2 cut.tfevents
    run rn-info cut.tfevents
    assert_failure 1
    assert_output --regexp "cut\.tfevents: record [0-9]+ at byte [0-9]+: truncated"
    # and a run into a folder holding a damaged file stops before training
    mkdir -p damaged
    cp flipped.tfevents damaged/
    run rn-train --data train.lmdb --in init.pb --out x.pb --batch 16 --crop 32 --max-steps 1 --tensorboard damaged
    assert_failure 1
    assert_output --partial "fails its CRC32C"
    assert_output --partial "move the file out of it to go on"
    [ ! -e x.pb ]
}

@test "an unwritable --tensorboard DIR: a clear error, exit 1, nothing trained" {
    touch plain
    run rn-train --data train.lmdb --in init.pb --out x.pb --batch 16 --crop 32 --max-steps 1 --tensorboard plain/tb
    assert_failure 1
    assert_output --partial "rn-train: --tensorboard: plain/tb: plain is not a folder"
    [ ! -e x.pb ]
    run rn-info --json tb
    assert_failure 2
    assert_output --partial "not event files"
}

@test "many processes: rank 0 alone writes the event file" {
    command -v mpirun >/dev/null || skip "mpirun not installed (make deps installs openmpi-bin)"
    rn-train --help | grep -q "This build: with Open MPI" || skip "this rn build has no MPI (USE_MPI=0)"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpi_no_leak_checks
    run mpirun --oversubscribe -np 2 rn-train --data train.lmdb --in init.pb --out m.pb --batch 16 --crop 32 \
        --workers 1 --threads 1 --max-steps 2 --log-every 1 --tensorboard mtb
    assert_success
    run ls mtb
    assert_equal "$(ls mtb | wc -l)" 1
    run rn-info mtb
    assert_success
    assert_line "train/lr 2 0.00999999978"
}

@test "pipelines: TENSORBOARD=DIR gives every epoch's rn-train --tensorboard DIR, one curve across the epochs" {
    mkdir -p pipe
    cat > pipe/Makefile <<MK
ARCH = resnet18
EPOCHS = 2
BATCH = 16
CROP = 32
WORKERS = 2
THREADS = 2
LOG_EVERY = 2
TRAIN_LMDB = ../train.lmdb
VAL_LMDB = ../val.lmdb
RUN = run
include $BATS_TEST_DIRNAME/../pipelines/train.mk
MK
    run make -n -C pipe train RN_BIN="$RN_BIN"
    assert_success
    refute_output --partial "--tensorboard"
    run make -C pipe train RN_BIN="$RN_BIN" TENSORBOARD=run/tb
    assert_success
    assert_equal "$(grep -c -- '--tensorboard run/tb' pipe/run/commands.sh)" 2
    assert_equal "$(ls pipe/run/tb | wc -l)" 2
    run grep '^TENSORBOARD=run/tb$' pipe/run/run.txt
    assert_success
    run rn-info pipe/run/tb
    assert_success
    assert_equal "$(grep -c '^train/loss ' <<<"$output")" 4
    assert_line --regexp '^val/top1 4 '
    assert_line --regexp '^val/top1 8 '
}

@test "a disk that fills mid-run: said once on stderr, training goes on, the cut file does not stop the next run" {
    [ "$(id -u)" = 0 ] || skip "needs root to mount a tmpfs"
    mkdir -p full
    mount -t tmpfs -o size=4k tmpfs full 2> /dev/null || skip "cannot mount a tmpfs here"
    # 24 log lines of about 200 bytes each: past the 4 KiB disk within the run
    run rn-train --data train.lmdb --in init.pb --out full-run.pb --batch 16 --crop 32 --workers 2 --threads 2 \
        --max-steps 24 --log-every 1 --tensorboard full/tb
    train_status=$status train_out=$output
    cp full/tb/* full-cut.tfevents
    umount full
    assert_equal "$train_status" 0
    assert_equal "$(grep -c 'no more events are written' <<<"$train_out")" 1
    [[ "$train_out" == *"rn-train: --tensorboard full/tb/events.out.tfevents."*": cannot write: No space left on device; no more events are written (training goes on)"* ]]
    run rn-info --json full-run.pb
    assert_output --partial '"step":24,'
    mkdir -p cut
    cp full-cut.tfevents cut/
    run rn-train --data train.lmdb --in full-run.pb --out full-more.pb --batch 16 --crop 32 --workers 2 --threads 2 \
        --max-steps 2 --log-every 1 --tensorboard cut
    assert_success
    run rn-info "$(ls cut/events.out.* | tail -n 1)"
    assert_success
    assert_line --regexp '^train/loss 26 '
}
