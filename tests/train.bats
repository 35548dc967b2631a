#!/usr/bin/env bats
# rn-train and rn-eval on a tiny learnable dataset (two classes of generated images).
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

@test "rn-train and rn-eval print help and version, and exit 2 on bad usage" {
    for t in rn-train rn-eval; do
        run $t --help
        assert_success
        assert_output --partial "usage: $t"
        run $t --version
        assert_success
        run $t --bogus
        assert_failure 2
    done
    run rn-train --data train.lmdb --in init.pb
    assert_failure 2
    assert_output --partial "required"
    run rn-train --data train.lmdb --in init.pb --out x.pb --batch 10 --accum 3
    assert_failure 2
    assert_output --partial "not a multiple"
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr-schedule exponential
    assert_failure 2
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr-milestones 30,20
    assert_failure 2
    assert_output --partial "--lr-milestones: 20 after 30"
    # a number is read whole or refused, naming the flag: 2.5 is not taken as 2
    run rn-train --data train.lmdb --in init.pb --out x.pb --batch 2.5
    assert_failure 2
    assert_output "rn-train: --batch: '2.5' is not a whole number"
    run rn-train --data train.lmdb --in init.pb --out x.pb --epochs 1e3
    assert_failure 2
    assert_output --partial "--epochs: '1e3' is not a whole number written in digits (1000)"
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr 0.1x
    assert_failure 2
    assert_output --partial "--lr: '0.1x' is not a number"
    run rn-train --data train.lmdb --in init.pb --out x.pb --max-steps -1
    assert_failure 2
    assert_output --partial "--max-steps: '-1' is negative"
    run rn-train --data train.lmdb --in init.pb --out x.pb --seed 99999999999999999999
    assert_failure 2
    assert_output --partial "--seed: '99999999999999999999' is too large"
    run rn-eval --data val.lmdb --ckpt init.pb --batch 16x
    assert_failure 2
    assert_output --partial "--batch: '16x' is not a whole number"
    run rn-eval --data val.lmdb
    assert_failure 2
    [ ! -e x.pb ]
}

# 8 epochs: at 5 the validation accuracy of this tiny set still swings between 0.44 and 1.0
# with the OpenBLAS kernel's rounding (Sandybridge, Zen, Prescott); by 7 all reach 1.0
@test "a learnable dataset trains to >= 95% validation accuracy in 8 epochs" {
    run rn-train --data train.lmdb --val val.lmdb --in init.pb --out e3.pb --epochs 8 $T --lr 0.05 --log e3.jsonl
    assert_success
    run rn-eval --data val.lmdb --ckpt e3.pb --crop 32 --json
    assert_success
    echo "$output" | "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); assert d["n"]==64, d; assert d["top1"]>=0.95, d; print(d)'
    run rn-info --json e3.pb
    assert_output --partial '"epoch":8,"step":64,'
    assert_output --partial '"class_names":["horiz","vert"]'
    # an epoch without --val: its val fields are null (rn-info's table shows '-')
    rn-train --data train.lmdb --in e3.pb --out e4.pb --epochs 1 $T
    rn-info --json e4.pb | "$PYTHON" -c 'import json,sys; h=json.load(sys.stdin)["history"]; assert len(h)==9 and h[7]["val_n"]==64 and h[7]["val_top1"]>=0.95 and h[8]["val_n"]==0 and h[8]["val_top1"] is None, h'
    run rn-info e4.pb
    assert_line --regexp '^ +9 +72 .* +- +- +- '
    # the JSONL log: step lines and one epoch line per epoch with the val metrics
    run "$PYTHON" -c 'import json,sys; L=[json.loads(l) for l in open("e3.jsonl")]; E=[l for l in L if l["kind"]=="epoch"]; S=[l for l in L if l["kind"]=="step"]; assert len(E)==8 and all("val_top1" in e and "img_s" in e for e in E), E; assert S and all(k in S[0] for k in ("loss","lr","img_s","data_wait","step","epoch")), S[0]; print(len(S), "step lines")'
    assert_success
}

@test "rn-eval: text, json, per-class, confusion matrix, logits dump, top-k" {
    rn-train --data train.lmdb --in init.pb --out one.pb --max-steps 2 $T
    run rn-eval --data val.lmdb --ckpt one.pb --crop 32 --per-class --topk 1 --confusion conf.csv --dump-logits logits.safetensors
    assert_success
    assert_output --regexp "^top1=[0-9.]+ top1=[0-9.]+ loss=[0-9.]+ n=64"
    assert_output --regexp "class 0 horiz top1=[0-9.]+ n=32"
    assert_output --regexp "class 1 vert top1=[0-9.]+ n=32"
    [ "$(wc -l < conf.csv)" = 3 ]
    head -1 conf.csv | grep -q '"horiz","vert"'
    PYTHONPATH="$BATS_TEST_DIRNAME/parity" "$PYTHON" -c '
import rnst, sys
t, m = rnst.load("logits.safetensors")
assert tuple(t["logits"].shape) == (64, 2), t["logits"].shape
assert m["rows"] == "dataset order"'
    # the confusion matrix adds up to n and its diagonal to top-1 * n
    top1=$(sed -n 's/^top1=\([0-9.]*\) .*/\1/p' <<<"$output")
    "$PYTHON" -c '
import csv, sys
rows = list(csv.reader(open("conf.csv")))[1:]
m = [[int(x) for x in r[1:]] for r in rows]
assert sum(map(sum, m)) == 64, m
right = sum(m[i][i] for i in range(len(m)))
assert right == round(float(sys.argv[1]) * 64), (right, sys.argv[1], m)' "$top1"
}

@test "training 2N steps equals N steps, resume, N steps (tensors and state)" {
    rn-train --data train.lmdb --in init.pb --out full.pb --max-steps 6 $T --seed 3
    rn-train --data train.lmdb --in init.pb --out half.pb --max-steps 3 $T --seed 3
    rn-train --data train.lmdb --in half.pb --out resumed.pb --max-steps 3 $T
    tensors() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }
    diff <(tensors full.pb) <(tensors resumed.pb)
    state() { rn-info --json "$1" | "$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); print(d["epoch"], d["step"], d["data_epoch"], d["data_index"], d["seed"])'; }
    assert_equal "$(state full.pb)" "$(state resumed.pb)"
    # momentum is there and was resumed, not restarted
    run rn-info --tensors resumed.pb
    assert_output --regexp "fc\.weight +2,512 +F32 +[0-9a-f]{8} momentum"
}

@test "SIGUSR1 and SIGTERM save and exit 0; SIGINT saves and exits 130; resuming continues" {
    for sig in USR1 TERM INT; do
        rm -f sig.pb
        rn-train --data train.lmdb --in init.pb --out sig.pb --epochs 50 $T --log-every 1 2> sig.err &
        pid=$!
        for i in $(seq 1 200); do grep -q "step 2 " sig.err && break; sleep 0.1; done
        kill -$sig $pid
        code=0
        wait $pid || code=$?
        if [ $sig = INT ]; then assert_equal "$code" 130; else assert_equal "$code" 0; fi
        grep -q "stopped by signal" sig.err
        run rn-info --json sig.pb
        assert_success
        step=$(echo "$output" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["step"])')
        [ "$step" -ge 2 ]
        [ "$step" -lt 400 ]
    done
    run rn-train --data train.lmdb --in sig.pb --out sig2.pb --max-steps 1 $T
    assert_success
    run rn-info --json sig2.pb
    assert_output --partial "\"step\":$((step + 1)),"
}

@test "bad inputs: missing files, too many classes; outputs stay intact" {
    echo keep > keep.pb
    run rn-train --data nothere.lmdb --in init.pb --out keep.pb $T
    assert_failure 1
    assert_output --partial "nothere.lmdb"
    run rn-train --data train.lmdb --in nothere.pb --out keep.pb $T
    assert_failure 1
    assert_output --partial "nothere.pb"
    rn-init --arch resnet18 --classes 1 -o one.pb
    run rn-train --data train.lmdb --in one.pb --out keep.pb $T
    assert_failure 1
    assert_output --partial "2 classes, but the model has 1 outputs"
    assert_output --partial "rn-init --classes 2"
    run rn-eval --data val.lmdb --ckpt one.pb --crop 32
    assert_failure 1
    assert_equal "$(cat keep.pb)" keep
    # an output that cannot be written is refused before the first step (it used to fail
    # only after training)
    mkdir -p outdir.pb
    run timeout 20 rn-train --data train.lmdb --in init.pb --out outdir.pb $T --epochs 50
    assert_failure 1
    assert_output --partial "outdir.pb: is a directory"
    run rn-train --data train.lmdb --in init.pb --out nodir/x.pb $T
    assert_failure 1
    assert_output --partial "its folder nodir does not exist"
    run rn-eval --data val.lmdb --ckpt init.pb --crop 32 --confusion outdir.pb
    assert_failure 1
    assert_output --partial "outdir.pb: is a directory"
    # a PATH.tmp that a killed run left is removed at the next run, which says so
    echo partial > stale.pb.tmp
    run rn-train --data train.lmdb --in init.pb --out stale.pb $T --max-steps 1
    assert_success
    assert_output --partial "rn-train: removed stale.pb.tmp, left by an interrupted run"
    [ ! -e stale.pb.tmp ]
}

@test "rn-info --json escapes every string a checkpoint holds (a quote in lr_schedule broke the JSON)" {
    rn-train --data train.lmdb --in init.pb --out js.pb $T --max-steps 1 2> /dev/null
    # the schedule name "step" as protobuf writes it (field 4, length 4), made st"p
    "$PYTHON" - <<'PY'
b = open("js.pb", "rb").read()
assert b.count(b'\x22\x04step') == 1, b.count(b'\x22\x04step')
open("jsq.pb", "wb").write(b.replace(b'\x22\x04step', b'\x22\x04st"p'))
PY
    run bash -c "rn-info --json jsq.pb | $PYTHON -c 'import json, sys; print(json.load(sys.stdin)[\"lr_schedule\"])'"
    assert_success
    assert_output 'st"p'
}

@test "a damaged record stops rn-train at the step that reads it, naming it; the steps before are saved" {
    rm -rf dmg.lmdb dmg.pb
    cp -r train.lmdb dmg.lmdb
    # one bit inside record 00000040's JPEG (every copy: LMDB keeps stale pages)
    run "$PYTHON" "$BATS_TEST_DIRNAME/data/flipjpeg.py" dmg.lmdb/data.mdb 00000040
    assert_success
    # in order, 16 a step: record 40 is in the third step's batch, taken ahead during the
    # second, which must still finish and be saved
    run rn-train --data dmg.lmdb --in init.pb --out dmg.pb $T --no-shuffle --save-every 1 --max-steps 5
    assert_failure 1
    assert_output --partial "dmg.lmdb: record 00000040: its image data fails its checksum"
    run rn-info dmg.pb
    assert_output --partial "step 2, next sample: epoch 0 index 32"
}

@test "a non-finite loss stops training with a message and keeps the last good checkpoint" {
    have_torch || skip "no torch for $PYTHON to write a poisoned checkpoint"
    rn-export init.pb clean.safetensors
    PYTHONPATH="$BATS_TEST_DIRNAME/parity" "$PYTHON" -c '
import rnst
sd, meta = rnst.load("clean.safetensors")
sd["fc.bias"][0] = float("nan")
rnst.save("nan.safetensors", sd, meta)'
    rn-init --from nan.safetensors -o nan.pb
    echo keep > keep.pb
    run rn-train --data train.lmdb --in nan.pb --out keep.pb $T --max-steps 3
    assert_failure 1
    assert_output --partial "step 0: the loss is nan: training diverged"
    assert_equal "$(cat keep.pb)" keep
    # the loss is read at the log line (--log-every 20): a damaged record read at step 2,
    # before it, must not hide the divergence at step 0, the cause
    rm -rf dmg2.lmdb
    cp -r train.lmdb dmg2.lmdb
    run "$PYTHON" "$BATS_TEST_DIRNAME/data/flipjpeg.py" dmg2.lmdb/data.mdb 00000040
    assert_success
    run rn-train --data dmg2.lmdb --in nan.pb --out keep.pb $T --no-shuffle --max-steps 5
    assert_failure 1
    assert_output --partial "step 0: the loss is nan: training diverged"
    assert_equal "$(cat keep.pb)" keep
}

@test "the loss and top-1 read back every 64 steps log what a read every step gives (--log-every 100 against 1)" {
    # 512 records at batch 4 in 2 micro-batches: 128 steps an epoch, so in 100 steps the
    # 64-step ring fills inside the window, and each step has two slots
    rm -rf src/big big.lmdb every1.jsonl every100.jsonl
    run "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/big 256 3
    assert_success
    run rn-prep -q src/big big.lmdb
    assert_success
    run rn-train --data big.lmdb --in init.pb --out r1.pb --batch 4 --accum 2 --crop 32 --workers 2 --threads 2 \
        --max-steps 100 --log-every 1 --log every1.jsonl
    assert_success
    run rn-train --data big.lmdb --in init.pb --out r100.pb --batch 4 --accum 2 --crop 32 --workers 2 --threads 2 \
        --max-steps 100 --log-every 100 --log every100.jsonl
    assert_success
    # the window's mean: the steps' float losses added in double in step order, as rn-train adds them
    run "$PYTHON" -c '
import json
one = [json.loads(l) for l in open("every1.jsonl") if "\"step\"" in l and "\"kind\":\"step\"" in l]
big = [json.loads(l) for l in open("every100.jsonl") if "\"kind\":\"step\"" in l]
assert len(one) == 100 and len(big) == 1, (len(one), len(big))
w = 0.0
for d in one: w += d["loss"]
hits = sum(round(d["train_top1"] * 4) for d in one)
print("loss", repr(w / 100), repr(big[0]["loss"]), "top1", "%.6f" % (hits / 400), "%.6f" % big[0]["train_top1"])
assert w / 100 == big[0]["loss"] and "%.6f" % (hits / 400) == "%.6f" % big[0]["train_top1"]'
    echo "$output"
    assert_success
}

@test "--dump-grads matches torchvision's gradients for the same batch" {
    have_torch || skip "no torch/torchvision for $PYTHON (run make deps)"
    rn-export init.pb init.safetensors
    run rn-train --data train.lmdb --in init.pb --out g.pb --max-steps 1 $T --dump-grads grads.safetensors
    assert_success
    run "$PYTHON" "$BATS_TEST_DIRNAME/parity/grads_parity.py" init.safetensors grads.safetensors
    echo "$output"
    assert_success
    assert_output --partial "62 gradients of a batch of 16, 0 failed"
}

@test "RN_CPU_WINOGRAD=0 (im2col + GEMM) and 2 (F(2x2) only): rn-eval differs from the default Winograd by rounding only; a bad value exits 2" {
    # at --crop 128 the toy net's first- and second-stage 3x3 convs (32x32 and 16x16 outputs, 64 and 128 channels) take Winograd F(4x4,3x3) by default
    rn-train --data train.lmdb --in init.pb --out w.pb --max-steps 2 $T
    RN_CPU_WINOGRAD=0 rn-eval --data val.lmdb --ckpt w.pb --crop 128 --threads 2 --dump-logits gemm.st > gemm.out
    RN_CPU_WINOGRAD=2 rn-eval --data val.lmdb --ckpt w.pb --crop 128 --threads 2 --dump-logits two.st > two.out
    rn-eval --data val.lmdb --ckpt w.pb --crop 128 --threads 2 --dump-logits wino.st > wino.out
    RN_CPU_WINOGRAD=1 rn-eval --data val.lmdb --ckpt w.pb --crop 128 --threads 2 --dump-logits on.st > on.out
    cmp wino.st on.st
    run env PYTHONPATH="$BATS_TEST_DIRNAME/parity" "$PYTHON" -c '
import rnst
b = rnst.load("gemm.st")[0]["logits"].double()
for f in ("wino.st", "two.st"):
    a = rnst.load(f)[0]["logits"].double()
    d = (a - b).abs().max().item()
    assert 0 < d <= 1e-4 * max(1.0, b.abs().max().item()), (f, d)
    assert (a.argmax(1) == b.argmax(1)).all(), f
    print(f, "max |logit diff| from im2col", d)
a = rnst.load("wino.st")[0]["logits"].double()
t = rnst.load("two.st")[0]["logits"].double()
assert (a - t).abs().max().item() > 0, "F(2x2) only gave the default bytes"'
    echo "$output"
    assert_success
    run env RN_CPU_WINOGRAD=yes rn-eval --data val.lmdb --ckpt w.pb --crop 32
    assert_failure 2
    assert_output --partial "RN_CPU_WINOGRAD='yes': expected 0 (off), 1 (F(4x4) and F(2x2), the default) or 2 (F(2x2) only)"
}

@test "RN_CPU_GEMM=openblas: rn-eval's convs through OpenBLAS instead of rn's kernel differ by rounding only; a bad value exits 2" {
    rn-train --data train.lmdb --in init.pb --out w.pb --max-steps 2 $T
    rn-eval --data val.lmdb --ckpt w.pb --crop 64 --threads 2 --dump-logits own.st > own.out
    RN_CPU_GEMM=own rn-eval --data val.lmdb --ckpt w.pb --crop 64 --threads 3 --dump-logits own3.st > own3.out
    RN_CPU_GEMM=openblas rn-eval --data val.lmdb --ckpt w.pb --crop 64 --threads 2 --dump-logits blas.st > blas.out
    cmp own.st own3.st
    run env PYTHONPATH="$BATS_TEST_DIRNAME/parity" "$PYTHON" -c '
import rnst
a = rnst.load("own.st")[0]["logits"].double()
b = rnst.load("blas.st")[0]["logits"].double()
d = (a - b).abs().max().item()
assert d <= 1e-4 * max(1.0, b.abs().max().item()), d
assert (a.argmax(1) == b.argmax(1)).all()
print("max |logit diff|", d)'
    echo "$output"
    assert_success
    # where the CPU has AVX2 and FMA the two are different code: some logit differs
    if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
        run cmp -s own.st blas.st
        assert_failure
    fi
    run env RN_CPU_GEMM=mkl rn-eval --data val.lmdb --ckpt w.pb --crop 32
    assert_failure 2
    assert_output --partial "RN_CPU_GEMM='mkl': expected own (rn's kernel, the default), avx2 (rn's kernel without AVX-512), portable (rn's kernel in C) or openblas"
}

@test "rn-eval's logits are the same bytes at any --batch on rn's kernel (with 1000 classes the fc went through OpenBLAS, whose bits for one image changed with the batch)" {
    grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo || skip "no AVX2 and FMA: rn's kernel does not run here"
    rn-init --arch resnet18 --classes 1000 --seed 3 -o k.pb
    rn-eval --data val.lmdb --ckpt k.pb --crop 64 --threads 2 --batch 1 --dump-logits b1.st > /dev/null
    rn-eval --data val.lmdb --ckpt k.pb --crop 64 --threads 2 --batch 3 --dump-logits b3.st > /dev/null
    rn-eval --data val.lmdb --ckpt k.pb --crop 64 --threads 3 --dump-logits b64.st > /dev/null
    cmp b1.st b3.st
    cmp b1.st b64.st
}

@test "rn-predict gives the classes and probabilities rn-eval computes for the same images" {
    rn-train --data train.lmdb --in init.pb --out p.pb --max-steps 3 $T
    # raw records hold the source pixels, where the default re-encodes them (quality 90)
    rn-prep -q --encode raw --classes train.lmdb src/val valraw.lmdb
    rn-eval --data valraw.lmdb --ckpt p.pb --crop 32 --dump-logits vl.safetensors > /dev/null
    run rn-predict --ckpt p.pb --crop 32 --topk 2 --json src/val/horiz/*.jpg src/val/vert/*.jpg
    assert_success
    echo "$output" > pred.jsonl
    PYTHONPATH="$BATS_TEST_DIRNAME/parity" "$PYTHON" -c '
import json, rnst, torch
logits = rnst.load("vl.safetensors")[0]["logits"].double()
p = torch.softmax(logits, 1)
rows = [json.loads(l) for l in open("pred.jsonl")]
assert len(rows) == 64, len(rows)
for i, r in enumerate(rows):
    for t in r["top"]:
        assert abs(t["p"] - p[i, t["class"]].item()) < 1e-4, (i, r, p[i])
    assert r["top"][0]["name"] in ("horiz", "vert")
print("64 images agree")'
    run rn-predict --ckpt p.pb --crop 32 src/val/horiz/000.jpg /etc/hostname
    assert_failure 1
    assert_output --regexp "src/val/horiz/000.jpg	1	[0-9.]+	[01]	(horiz|vert)"
    assert_output --partial "/etc/hostname: not an image rn reads"
    # a PNG (with alpha, dropped) of the pixels PIL decodes from a JPEG: the same classes
    if rn-predict --help | grep -q "reads .*PNG"; then
        "$PYTHON" -c "from PIL import Image; Image.open('src/val/horiz/000.jpg').convert('RGBA').save('000.png')"
        run rn-predict --ckpt p.pb --crop 32 000.png
        assert_success
        assert_equal "$output" "$(rn-predict --ckpt p.pb --crop 32 src/val/horiz/000.jpg | sed 's|^src/val/horiz/000.jpg|000.png|')"
    fi
    # data cut short but closed with an end marker: libjpeg warns and would fill grey
    f=src/val/horiz/000.jpg
    head -c $(( $(stat -c %s $f) * 2 / 3 )) $f > cut.jpg
    printf '\xff\xd9' >> cut.jpg
    run rn-predict --ckpt p.pb --crop 32 cut.jpg
    assert_failure 1
    assert_output --partial "cut.jpg: JPEG decode: corrupt or truncated JPEG data (libjpeg: Corrupt JPEG data"
    # sizes from a header are refused before anything is allocated for them (60000x60000
    # in a 2 KB file once asked for 10.8 GB)
    "$PYTHON" "$BATS_TEST_DIRNAME/data/mkimages.py" broken br
    run timeout 10 rn-predict --ckpt p.pb --crop 32 br/odd/huge.jpg
    assert_failure 1
    assert_output --partial "huge.jpg: JPEG header says 60000x60000 (3600000000 pixels), over the limit of 100000000 pixels"
    run rn-predict --ckpt p.pb --crop 32 --max-pixels 1000 br/odd/good.jpg
    assert_failure 1
    assert_output --partial "over the limit of 1000 pixels"
    run rn-predict --ckpt p.pb --crop 32 --max-pixels 0 br/odd/good.jpg
    assert_failure 2
    run rn-predict --crop 32 x.jpg
    assert_failure 2
}

@test "--freeze-bn: torchvision's gradients with BN in eval(); BN buffers kept; K=2 micro-batches equal one batch of 2B" {
    plain_build_only "torchvision's gradients and runs at 1 and 2 micro-batches (test_amp runs frozen BN under the sanitizers)"
    have_torch || skip "no torch/torchvision for $PYTHON (run make deps)"
    # three ordinary steps first, so that the running statistics are not the initial 0 and 1
    rn-train --data train.lmdb --in init.pb --out fz0.pb --max-steps 3 $T
    rn-export fz0.pb fz0.safetensors
    run rn-train --data train.lmdb --in fz0.pb --out fz1.pb --max-steps 2 $T --freeze-bn --dump-grads fzg.safetensors
    assert_success
    run "$PYTHON" "$BATS_TEST_DIRNAME/parity/grads_parity.py" --freeze-bn fz0.safetensors fzg.safetensors
    echo "$output"
    assert_success
    assert_output --partial "(frozen BN): 62 gradients of a batch of 16, 0 failed"
    # the same gradients are far from those of batch statistics: the check can fail
    run "$PYTHON" "$BATS_TEST_DIRNAME/parity/grads_parity.py" fz0.safetensors fzg.safetensors
    assert_failure
    # running statistics and num_batches_tracked unchanged; weights moved
    [ "$(rn-info --tensors fz0.pb | grep buffer)" = "$(rn-info --tensors fz1.pb | grep buffer)" ]
    [ "$(rn-info --tensors fz0.pb | grep conv1.weight)" != "$(rn-info --tensors fz1.pb | grep conv1.weight)" ]
    # accumulation: 2 micro-batches of 8 give the weights of one batch of 16 within fp32
    # rounding with frozen BN; with batch statistics they differ (per-micro-batch BN)
    A="--batch 16 --crop 32 --workers 2 --threads 2 --augment none --no-shuffle --max-steps 3 --lr 0.05"
    for fz in "" --freeze-bn; do
        for k in 1 2; do
            rn-train --data train.lmdb --in fz0.pb --out acc$k$fz.pb $A --accum $k $fz
            rn-export acc$k$fz.pb acc$k$fz.safetensors
        done
    done
    run env PYTHONPATH="$BATS_TEST_DIRNAME/parity" "$PYTHON" "$BATS_TEST_DIRNAME/parity/ckpt_close.py" \
        acc2--freeze-bn.safetensors acc1--freeze-bn.safetensors 1e-5
    echo "$output"
    assert_success
    run env PYTHONPATH="$BATS_TEST_DIRNAME/parity" "$PYTHON" "$BATS_TEST_DIRNAME/parity/ckpt_close.py" \
        acc2.safetensors acc1.safetensors 1e-3
    echo "$output"
    assert_failure
}

@test "memory plan: --micro-batch auto under --mem-limit equals --accum; too little memory is refused with advice" {
    A="--crop 32 --workers 2 --threads 2 --augment none --no-shuffle --max-steps 2"
    # what each micro-batch needs, from the refusal (nothing fits in 1 MiB)
    need() {
        run rn-train --data train.lmdb --in init.pb --out never.pb --batch 16 --micro-batch "$1" --mem-limit 1M $A
        assert_failure 1
        assert_output --partial "needs"
        echo "$output" | sed -n 's/.*micro-batch [0-9]* of 32x32 in fp32 needs \([0-9.]*\) MiB.*/\1/p'
    }
    n4=$(need 4) n8=$(need 8) n16=$(need 16)
    echo "needs: 4 -> $n4 MiB, 8 -> $n8, 16 -> $n16"
    awk -v a="$n4" -v b="$n8" -v c="$n16" 'BEGIN { exit !(a > 0 && a < b && b < c) }'
    [ ! -e never.pb ]
    lim=$(awk -v a="$n4" -v b="$n8" 'BEGIN { printf "%dK", (a + b) / 2 * 1024 }')
    # auto takes the largest divisor of 16 that fits: 4, so 4 micro-batches, as --accum 4
    run rn-train --data train.lmdb --in init.pb --out auto.pb --batch 16 --micro-batch auto --mem-limit "$lim" $A
    assert_success
    assert_output --partial "of 16 (4 x 4)"
    rn-train --data train.lmdb --in init.pb --out acc4.pb --batch 16 --accum 4 $A
    tensors() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }
    diff <(tensors auto.pb) <(tensors acc4.pb)
    # the whole batch asked for under that limit: refused before training, with advice
    echo keep > kept.pb
    run rn-train --data train.lmdb --in init.pb --out kept.pb --batch 16 --mem-limit "$lim" $A
    assert_failure 1
    assert_output --partial "needs $n16 MiB of host memory"
    assert_output --partial "--micro-batch 4 (= --accum 4) needs $n4 MiB; --micro-batch auto picks it"
    [ "$(cat kept.pb)" = keep ]
    # auto with room for all of it runs the whole batch at once
    run rn-train --data train.lmdb --in init.pb --out all.pb --batch 16 --micro-batch auto $A
    assert_success
    assert_output --partial "of 16 (1 x 16)"
    # an allocation that fails although the plan fitted (RN_CPU_MEMORY: the CPU backend as
    # a device of that size; --mem-limit above it, as when another process took memory):
    # auto goes on to a smaller micro-batch; a given one fails naming one that fits now
    dev=$(awk -v a="$n8" -v b="$n16" 'BEGIN { printf "%dK", (a + b) / 2 * 1024 }')
    run env RN_CPU_MEMORY="$dev" rn-train --data train.lmdb --in init.pb --out oom.pb --batch 16 --mem-limit 10G $A
    assert_failure 1
    assert_output --partial "resnet18 training at micro-batch 16: network memory:"
    assert_output --partial "--micro-batch 8 (= --accum 2) needs $n8 MiB"
    [ ! -e oom.pb ]
    run env RN_CPU_MEMORY="$dev" rn-train --data train.lmdb --in init.pb --out oom.pb --batch 16 --mem-limit 10G \
        --micro-batch auto $A
    assert_success
    assert_output --partial "of 16 (2 x 8), network $(printf %.0f "$n8") MiB"
    # --deterministic changes nothing on the CPU, which always repeats bit for bit
    rn-train --data train.lmdb --in init.pb --out det.pb --batch 16 --accum 4 $A --deterministic
    diff <(tensors det.pb) <(tensors acc4.pb)
    # usage errors
    run rn-train --data train.lmdb --in init.pb --out x.pb --batch 16 --micro-batch 5
    assert_failure 2
    assert_output --partial "not a multiple of --micro-batch 5"
    run rn-train --data train.lmdb --in init.pb --out x.pb --batch 16 --micro-batch 4 --accum 4
    assert_failure 2
    run rn-train --data train.lmdb --in init.pb --out x.pb --mem-limit 12X
    assert_failure 2
    assert_output --partial "is not a size"
    # rn-eval plans too
    run rn-eval --data val.lmdb --ckpt init.pb --crop 32 --batch 32 --mem-limit 1M
    assert_failure 1
    assert_output --partial "resnet18 evaluation at batch 32"
}

@test "--clip-grad-norm is torch's clip_grad_norm_: the logged norm is torch's total norm of the dumped gradients, the step scaled by max/(norm + 1e-6)" {
    # one step from the same weights, momentum and weight decay off: p1 - p0 = -lr * g, so
    # the clipped step is the unclipped one times the coefficient, tensor by tensor (a large
    # lr, so that p1 - p0 is not lost in the rounding of p0: 8e-6 here, 8e-4 at lr 0.1)
    S="--data train.lmdb --in init.pb --max-steps 1 $T --lr 10 --momentum 0 --wd 0 --log-every 1"
    rn-train $S --out ca.pb --dump-grads ca.st
    rn-train $S --out cb.pb --clip-grad-norm 5 --log cb.jsonl
    rn-train $S --out cc.pb --clip-grad-norm 1e6 --log cc.jsonl
    for f in init ca cb; do rn-export "$f.pb" "$f.safetensors"; done
    norm=$(grep -o '"grad_norm":[0-9.e+-]*' cb.jsonl | cut -d: -f2)
    run "$PYTHON" -c '
import sys
sys.path.insert(0, sys.argv[1])
import rnst, torch
g = rnst.load("ca.st")[0]
p0, a, b = (rnst.load(f + ".safetensors")[0] for f in ("init", "ca", "cb"))
names = [n for n in p0 if n in g]
ps = [torch.nn.Parameter(p0[n].clone()) for n in names]
for p, n in zip(ps, names):
    p.grad = g[n].clone()
exact = float(torch.sqrt(sum((g[n].double() ** 2).sum() for n in names)))
total = float(torch.nn.utils.clip_grad_norm_(ps, 5.0))
rn = float(sys.argv[2])
coef = 5.0 / (total + 1e-6)
worst = 0.0
for n in names:
    da, db = (a[n] - p0[n]).double(), (b[n] - p0[n]).double()
    worst = max(worst, float((db - coef * da).norm() / max(float((coef * da).norm()), 1e-30)))
print(len(names), abs(rn - exact) <= 1e-12 * exact, abs(rn - total) <= 1e-5 * total, coef < 1, worst < 1e-4)' \
        "$BATS_TEST_DIRNAME/parity" "$norm"
    assert_success
    assert_output "62 True True True True"
    # a max above the norm changes nothing: the same bytes as no clipping
    run cmp <(rn-info --tensors ca.pb | sed -n '/^tensors:/,$p') <(rn-info --tensors cc.pb | sed -n '/^tensors:/,$p')
    assert_success
    run grep -c '"grad_norm":' cc.jsonl
    assert_output 1
    run rn-train $S --out cd.pb --clip-grad-norm 0
    assert_failure 2
    assert_output --partial "--clip-grad-norm"
}
