#!/usr/bin/env bats
# rn-train --recipe and --print-recipe: each recipe prints the documented flags (the same
# line README.md shows), the printed flags parse back, a flag given on the command line
# overrides the recipe's wherever it stands, an unknown name exits 2 naming the recipes, and
# a short --recipe cifar run trains; RECIPE= in the pipelines. --val-crop/--val-resize:
# rn-eval's numbers at that transform, the same checkpoint. --crop-schedule: FFCV's crops
# per epoch, exact resume across a change, bad values refused.

load helper

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    toy_setup 12 >/dev/null
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

T="--workers 2 --threads 2 --seed 3"

# the documented flags of each recipe (README.md, rn-train: Recipes)
expected() {
    case "$1" in
    seed) echo "--batch 256 --lr 0.01 --momentum 0.9 --wd 1e-4 --lr-schedule step --lr-step 10 --lr-gamma 0.1" \
        "--crop 224 --augment rrc,flip" ;;
    torchvision) echo "--batch 256 --lr 0.1 --momentum 0.9 --wd 1e-4 --lr-schedule step --lr-step 30" \
        "--lr-gamma 0.1 --epochs 90 --crop 224 --resize 256 --augment rrc,flip" ;;
    torchvision-v2) echo "--batch 1024 --lr 0.5 --momentum 0.9 --wd 2e-5 --no-wd-norm --lr-schedule cosine" \
        "--lr-epochs 600 --lr-every epoch --warmup-epochs 5 --warmup-method linear --epochs 600" \
        "--label-smoothing 0.1 --mixup 0.2 --cutmix 1.0" \
        "--augment rrc,flip,ta_wide,erase=0.1 --crop 176 --val-crop 224 --val-resize 232 --ema-decay 0.99998" \
        "--ema-every 32 --ra-reps 4" ;;
    cifar) echo "--batch 128 --lr 0.1 --momentum 0.9 --wd 5e-4 --lr-schedule cosine --lr-epochs 200" \
        "--lr-every epoch --epochs 200" \
        "--crop 32 --resize 0 --augment crop-pad=4,flip" ;;
    mlperf) echo "--optimizer lars --batch 3264 --lr 10.5 --momentum 0.9 --wd 5e-5 --lars-eta 0.001 --lars-eps 0" \
        "--lr-schedule poly --lr-power 2 --lr-end 1e-4 --warmup-epochs 2 --lr-epochs 37 --epochs 37" \
        "--label-smoothing 0.1 --crop 224 --augment rrc,flip" ;;
    esac
}

# the lr of the JSONL log's step N
tensors() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }
lr_at() { grep '"kind":"step"' "$1" | sed -n "${2}p" | grep -o '"lr":[0-9.e-]*' | cut -d: -f2; }

@test "--print-recipe prints each recipe's documented flags as one rn-train command line, exit 0" {
    for r in seed torchvision torchvision-v2 cifar mlperf; do
        run rn-train --recipe "$r" --print-recipe
        assert_success
        assert_output "rn-train $(expected "$r")"
    done
}

@test "README.md shows each recipe's --print-recipe line verbatim (its own line in the code block)" {
    for r in seed torchvision torchvision-v2 cifar mlperf; do
        line=$(rn-train --recipe "$r" --print-recipe)
        run grep -cxF -- "  $line" "$BATS_TEST_DIRNAME/../README.md"
        assert_output 1
    done
}

@test "the printed flags parse back: rn-train accepts them and trains a step (sizes overridden)" {
    for r in seed torchvision torchvision-v2 cifar mlperf; do
        flags=$(rn-train --recipe "$r" --print-recipe | cut -d' ' -f2-)
        # shellcheck disable=SC2086
        run rn-train $flags --data train.lmdb --in init.pb --out "p-$r.pb" --max-steps 1 --batch 4 --crop 32 \
            --resize 0 $T
        assert_success
        [ -f "p-$r.pb" ]
    done
}

@test "an unknown recipe exits 2 naming the recipes; --print-recipe alone exits 2" {
    run rn-train --recipe imagenet --print-recipe
    assert_failure 2
    assert_output --partial "--recipe: 'imagenet' is not seed, torchvision, torchvision-v2, cifar or mlperf"
    run rn-train --data train.lmdb --in init.pb --out u.pb --recipe resnet
    assert_failure 2
    assert_output --partial "is not seed, torchvision, torchvision-v2, cifar or mlperf"
    [ ! -e u.pb ]
    run rn-train --print-recipe
    assert_failure 2
    assert_output --partial "--print-recipe needs --recipe NAME"
}

@test "a bad flag next to --recipe still exits 2 with its own message" {
    run rn-train --recipe cifar --data train.lmdb --in init.pb --out b.pb --lr -1
    assert_failure 2
    assert_output --partial "--lr"
    [ ! -e b.pb ]
}

@test "--recipe cifar trains on a tiny dataset: its cosine over 200 epochs, lr 0.1, moving once per epoch" {
    run rn-train --recipe cifar --data train.lmdb --in init.pb --out c.pb --epochs 2 --batch 8 $T \
        --log c.jsonl --log-every 1
    assert_success
    [ -f c.pb ]
    # epoch 1 (steps 1-3) at 0.1; epoch 2 (steps 4-6) at 0.1 * (1 + cos(pi / 200)) / 2: --lr-epochs 200, --lr-every epoch
    assert_equal "$(lr_at c.jsonl 1)" 0.10000000000000001
    assert_equal "$(lr_at c.jsonl 3)" 0.10000000000000001
    want=$("$PYTHON" -c 'import math; print(repr(0.1 * (1 + math.cos(math.pi / 200)) / 2))')
    run "$PYTHON" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-9 * b)" \
        "$(lr_at c.jsonl 4)" "$want"
    assert_success
    assert_equal "$(lr_at c.jsonl 6)" "$(lr_at c.jsonl 4)"
    run rn-info c.pb
    assert_success
    assert_output --partial "--recipe cifar"
}

@test "--print-lr equals torch's schedulers as torchvision's train.py chains them, per epoch and per step (1e-12)" {
    plain_build_only "compares with a Python reference"
    L="$BATS_TEST_DIRNAME/parity/lr_sched.py"
    # the v2 recipe: LinearLR(0.01, 5) then CosineAnnealingLR(595), stepped once per epoch, 600 epochs
    rn-train --recipe torchvision-v2 --data train.lmdb --batch 8 --print-lr > v2.txt
    run "$PYTHON" "$L" v2.txt cosine 0.5 600 3 5 linear 0.01 epoch
    assert_success
    assert_output --regexp '^epochs 600, worst relative difference [0-9.e-]+, 0 rates differ as float32$'
    run "$PYTHON" -c 'import sys; sys.exit(float(sys.argv[1].split()[5].rstrip(",")) > 2e-14)' "$output"
    assert_success
    F="--data train.lmdb --batch 8 --print-lr"
    rn-train $F --lr 0.1 --lr-schedule step --lr-step 3 --lr-gamma 0.5 --epochs 20 --warmup-epochs 2 \
        --warmup-method constant --warmup-decay 0.1 --lr-every epoch > st.txt
    run "$PYTHON" "$L" st.txt step 0.1 20 3 2 constant 0.1 epoch 3,0.5
    assert_success
    rn-train $F --lr 0.1 --lr-schedule multistep --lr-milestones 4,9 --epochs 12 --warmup-epochs 3 \
        --warmup-method linear --lr-every epoch > ms.txt
    run "$PYTHON" "$L" ms.txt multistep 0.1 12 3 3 linear 0.01 epoch 4:9,0.1
    assert_success
    # per step: the warm-up rises within an epoch and the cosine runs over the steps after it
    rn-train $F --lr 0.2 --lr-schedule cosine --epochs 30 --warmup-epochs 4 --warmup-method linear \
        --warmup-decay 0.001 > ps.txt
    run "$PYTHON" "$L" ps.txt cosine 0.2 30 3 4 linear 0.001 step
    assert_success
    # torchvision's other two: ExponentialLR, and CosineAnnealingLR's eta_min (--lr-min)
    rn-train $F --lr 0.1 --lr-schedule exp --lr-gamma 0.9 --epochs 30 --warmup-epochs 3 \
        --warmup-method linear --lr-every epoch > ex.txt
    run "$PYTHON" "$L" ex.txt exp 0.1 30 3 3 linear 0.01 epoch 0.9
    assert_success
    rn-train $F --lr 0.1 --lr-schedule cosine --lr-min 0.001 --epochs 40 --warmup-epochs 2 \
        --warmup-method constant --warmup-decay 0.5 --lr-every epoch > cm.txt
    run "$PYTHON" "$L" cm.txt cosine 0.1 40 3 2 constant 0.5 epoch 0.001
    assert_success
    run awk '$1 == 40 {print ($3 > 0.001)}' cm.txt
    assert_output 1
    # the checker sees a difference: rn's ramp is not torch's LinearLR
    rn-train $F --lr 0.1 --lr-schedule cosine --epochs 20 --warmup-epochs 2 --lr-every epoch > rp.txt
    run "$PYTHON" "$L" rp.txt cosine 0.1 20 3 2 linear 0.01 epoch
    assert_failure 1
    assert_output --regexp '^epochs 20, worst relative difference [0-9]'
    run "$PYTHON" "$L" rp.txt cosine 0.1 20 3 2 lineer 0.01 epoch
    assert_failure 2
}

@test "--print-lr is the rate training takes: each step's lr in the log is the table's, per step and per epoch" {
    plain_build_only "trains four times to compare rates"
    S="--lr 0.1 --lr-schedule cosine --lr-epochs 5 --warmup-epochs 1 --warmup-method linear --warmup-decay 0.1"
    rn-train --data train.lmdb --batch 8 $S --print-lr > pl.txt
    rn-train --data train.lmdb --in init.pb --out pl.pb --epochs 2 --batch 8 $T $S --log pl.jsonl --log-every 1
    # epoch 1 is steps 1-3 (the warm-up: 0.01 .. 0.07), epoch 2 steps 4-6
    assert_equal "$(lr_at pl.jsonl 1)" "$(awk '$1 == 1 {print $3}' pl.txt)"
    assert_equal "$(lr_at pl.jsonl 3)" "$(awk '$1 == 1 {print $4}' pl.txt)"
    assert_equal "$(lr_at pl.jsonl 4)" "$(awk '$1 == 2 {print $3}' pl.txt)"
    assert_equal "$(lr_at pl.jsonl 6)" "$(awk '$1 == 2 {print $4}' pl.txt)"
    run awk '$1 == 1 {print ($3 < $4)}' pl.txt
    assert_output 1
    rn-train --data train.lmdb --batch 8 $S --lr-every epoch --print-lr > pe.txt
    rn-train --data train.lmdb --in init.pb --out pe.pb --epochs 2 --batch 8 $T $S --lr-every epoch \
        --log pe.jsonl --log-every 1
    assert_equal "$(lr_at pe.jsonl 3)" "$(awk '$1 == 1 {print $3}' pe.txt)"
    assert_equal "$(lr_at pe.jsonl 4)" "$(awk '$1 == 2 {print $3}' pe.txt)"
    assert_equal "$(lr_at pe.jsonl 6)" "$(awk '$1 == 2 {print $4}' pe.txt)"
    # the checkpoint records the schedule's form
    run rn-info --json pe.pb
    assert_output --partial '"lr_every":"epoch","warmup_epochs":1,"warmup_method":"linear","warmup_decay":0.10000000000000001,'
    run rn-info --json pl.pb
    assert_output --partial '"lr_every":"step","warmup_epochs":1,"warmup_method":"linear",'
}

@test "--lr-every, --warmup-method, --warmup-decay and --print-lr refuse bad values with exit 2" {
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr-every batch
    assert_failure 2
    assert_output --partial "--lr-every: 'batch' is not step or epoch"
    run rn-train --data train.lmdb --in init.pb --out x.pb --warmup-method cosine
    assert_failure 2
    assert_output --partial "--warmup-method: 'cosine' is not ramp, linear or constant"
    run rn-train --data train.lmdb --in init.pb --out x.pb --warmup-method linear --warmup-decay 0
    assert_failure 2
    assert_output --partial "--warmup-decay"
    run rn-train --data train.lmdb --in init.pb --out x.pb --warmup-method linear --warmup-decay 1.5
    assert_failure 2
    run rn-train --data train.lmdb --in init.pb --out x.pb --warmup-epochs 2 --warmup-decay 0.1
    assert_failure 2
    assert_output --partial "--warmup-decay is the start factor of --warmup-method linear or constant"
    [ ! -e x.pb ]
    run rn-train --print-lr --epochs 3
    assert_failure 2
    assert_output --partial "--print-lr needs --data"
    run rn-train --print-lr --data train.lmdb --batch 64
    assert_failure 1
    assert_output --partial "holds 24 records, fewer than --batch 64"
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr 0.1 --lr-schedule cosine --lr-min 0.2
    assert_failure 2
    assert_output --partial "--lr-min 0.2 is above --lr 0.1"
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr-schedule exponential
    assert_failure 2
    assert_output --partial "is not step, multistep, cosine, constant, poly or exp"
    run rn-train --data train.lmdb --in init.pb --out x.pb --optimizer lars --no-wd-norm
    assert_failure 2
    assert_output --partial "drop --no-wd-norm"
    # the new paths once for the sanitizer build (the plain build compares them above)
    run rn-train --data train.lmdb --in init.pb --out y.pb --max-steps 1 --batch 8 $T --no-wd-norm \
        --clip-grad-norm 1 --lr-schedule cosine --lr-min 0.001 --lr-every epoch --warmup-epochs 1 \
        --warmup-method linear
    assert_success
    run rn-info --json y.pb
    assert_output --partial '"lr_schedule":"cosine","lr_every":"epoch","warmup_epochs":1,"warmup_method":"linear","warmup_decay":0.01,"lr_min":0.001,'
    # under --overfit-batches an epoch is that many steps, in the table as in training
    run rn-train --print-lr --data train.lmdb --batch 8 --overfit-batches 1 --lr-schedule cosine --epochs 3
    assert_output --partial "3 epochs of 1 step (24 records / batch 8)"
}

@test "--no-wd-norm spares BN weights and biases (torchvision's --norm-weight-decay 0.0), --no-wd-bn the fc bias too" {
    plain_build_only "compares five runs with a Python reference"
    # one step from a trained checkpoint (BN biases no longer 0), the same gradients in each
    # run: p - lr * (g + wd * p) against p - lr * g, so a tensor spared from the decay
    # differs from the decayed run's by lr * wd * p, and the others are the same bits
    rn-train --data train.lmdb --in init.pb --out w0.pb --max-steps 1 --batch 8 $T
    W="--data train.lmdb --in w0.pb --max-steps 1 --batch 8 $T --lr 0.1 --momentum 0 --wd 0.1"
    rn-train $W --out wa.pb
    rn-train $W --out wb.pb --no-wd-bn
    rn-train $W --out wn.pb --no-wd-norm
    rn-train $W --out wl.pb --no-wd-norm --no-wd-bn
    for f in w0 wa wb wn wl; do rn-export "$f.pb" "$f.safetensors"; done
    run "$PYTHON" -c '
import sys
sys.path.insert(0, sys.argv[1])
import rnst, torch
p0, a = rnst.load("w0.safetensors")[0], rnst.load("wa.safetensors")[0]
def spared(f):
    t, out = rnst.load(f)[0], []
    for n in a:
        if not n.endswith(("weight", "bias")) or torch.equal(t[n], a[n]):
            continue
        d, want = (t[n] - a[n]).double(), 0.1 * 0.1 * p0[n].double()
        assert (d - want).norm() <= 1e-3 * want.norm(), n
        out.append(n)
    return out
b, nn = spared("wb.safetensors"), spared("wn.safetensors")
bn = [n for n in a if ".bn" in n or n.startswith("bn1.") or ".downsample.1." in n]
bn = [n for n in bn if n.endswith(("weight", "bias"))]
print(sorted(nn) == sorted(bn), sorted(b) == sorted(bn + ["fc.bias"]), len(bn), spared("wl.safetensors") == b)' \
        "$BATS_TEST_DIRNAME/parity"
    assert_success
    assert_output "True True 40 True"
}

@test "--wd-all undoes --no-wd-norm and --no-wd-bn given before it (a recipe's too); the last of the three wins" {
    W="--data train.lmdb --in init.pb --max-steps 1 --batch 8 $T --lr 0.1 --momentum 0 --wd 0.1"
    rn-train $W --out da.pb
    rn-train $W --out dn.pb --no-wd-norm
    rn-train $W --out dx.pb --no-wd-norm --wd-all
    rn-train $W --out dy.pb --no-wd-bn --wd-all
    rn-train $W --out dz.pb --wd-all --no-wd-norm
    diff <(tensors da.pb) <(tensors dx.pb)
    diff <(tensors da.pb) <(tensors dy.pb)
    diff <(tensors dn.pb) <(tensors dz.pb)
    run diff -q <(tensors da.pb) <(tensors dn.pb)
    assert_failure
    # the torchvision-v2 recipe's --no-wd-norm, undone on the command line: its flags without it
    O="--data train.lmdb --in init.pb --max-steps 1 --batch 8 --crop 32 --augment none --mixup 0 --cutmix 0"
    O="$O --ra-reps 1 $T"
    R=$(rn-train --recipe torchvision-v2 --print-recipe | sed 's/^rn-train //; s/ --no-wd-norm / /')
    [[ "$R" != *no-wd* ]]
    rn-train $R $O --out ra.pb
    rn-train --recipe torchvision-v2 $O --wd-all --out rb.pb
    rn-train --recipe torchvision-v2 $O --out rc.pb
    diff <(tensors ra.pb) <(tensors rb.pb)
    run diff -q <(tensors ra.pb) <(tensors rc.pb)
    assert_failure
}

@test "a flag on the command line overrides the recipe's, before or after --recipe" {
    rn-train --recipe cifar --lr 0.05 --data train.lmdb --in init.pb --out o1.pb --max-steps 1 --batch 8 $T \
        --log o1.jsonl --log-every 1
    rn-train --lr 0.05 --data train.lmdb --in init.pb --out o2.pb --max-steps 1 --batch 8 $T --recipe cifar \
        --log o2.jsonl --log-every 1
    assert_equal "$(lr_at o1.jsonl 1)" 0.050000000000000003
    assert_equal "$(lr_at o2.jsonl 1)" 0.050000000000000003
    # the rest of the recipe still applies: the same weights either way
    run cmp <(rn-info --tensors o1.pb | sed -n '/^tensors:/,$p') <(rn-info --tensors o2.pb | sed -n '/^tensors:/,$p')
    assert_success
    # and it differs from the recipe's own lr
    rn-train --recipe cifar --data train.lmdb --in init.pb --out o3.pb --max-steps 1 --batch 8 $T
    run cmp -s <(rn-info --tensors o1.pb | sed -n '/^tensors:/,$p') <(rn-info --tensors o3.pb | sed -n '/^tensors:/,$p')
    assert_failure
}

@test "--recipe cifar with --augment none is the same run as its flags written out with --augment none" {
    rn-train --recipe cifar --augment none --data train.lmdb --in init.pb --out a1.pb --max-steps 1 --batch 8 $T
    rn-train --data train.lmdb --in init.pb --out a3.pb --max-steps 1 $T --batch 8 --lr 0.1 --momentum 0.9 \
        --wd 5e-4 --lr-schedule cosine --lr-epochs 200 --lr-every epoch --crop 32 --resize 0 --augment none
    run cmp <(rn-info --tensors a1.pb | sed -n '/^tensors:/,$p') <(rn-info --tensors a3.pb | sed -n '/^tensors:/,$p')
    assert_success
}

@test "RECIPE= in the pipelines: the recipe's values are the defaults, --recipe on every rn-train, variables win" {
    mkdir -p pipe && cd pipe
    printf 'include %s/../pipelines/train.mk\nall: train\n' "$BATS_TEST_DIRNAME" > Makefile
    run make -n RECIPE=cifar EPOCHS=3 DATA=.. TRAIN_VAL= RN_BIN="$RN_BIN"
    assert_success
    assert_output --partial "--batch 128  --lr 0.1 --lr-schedule cosine   --lr-epochs 3 "
    assert_output --partial "--crop 32 --resize 0 "
    assert_output --partial "--recipe cifar "
    assert_output --partial "printf '%s=%s\n' 'RECIPE' 'cifar'"
    run make -n RECIPE=mlperf EPOCHS=2 BATCH=64 LR=2 DATA=.. TRAIN_VAL= RN_BIN="$RN_BIN"
    assert_output --partial "--batch 64  --lr 2 --lr-schedule poly   --lr-epochs 2 "
    run make -n RECIPE=imagenet DATA=.. RN_BIN="$RN_BIN"
    assert_failure
    assert_output --partial "'imagenet' is not seed, torchvision, torchvision-v2, cifar or mlperf"
    # a real epoch, shrunk on the command line
    run make RECIPE=cifar ARCH=resnet18 EPOCHS=1 BATCH=8 WORKERS=2 THREADS=2 DATA=.. TRAIN_VAL= RN_BIN="$RN_BIN"
    assert_success
    run grep -c -- "rn-train .*--recipe cifar" runs/resnet18/commands.sh
    assert_output 1
    run rn-info --json runs/resnet18/epoch-001.pb
    assert_output --partial '"epoch":1,"step":3,'
}

@test "RECIPE=torchvision-v2 in the pipelines: rn-eval and rn-train --val at its 232/224, VAL_CROP/VAL_RESIZE win" {
    [ -d val.lmdb ] || { "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" vsrc 6 2 >/dev/null; rn-prep -q vsrc val.lmdb; }
    mkdir -p pipe2 && cd pipe2
    printf 'include %s/../pipelines/eval.mk\nall: eval\n' "$BATS_TEST_DIRNAME" > Makefile
    run make -n RECIPE=torchvision-v2 EPOCHS=2 DATA=.. RN_BIN="$RN_BIN"
    assert_success
    assert_output --partial "--crop 176  --val-crop 224 --val-resize 232 "
    assert_output --partial "--ckpt runs/resnet50/epoch-002.pb --crop 224 --resize 232 "
    run make -n RECIPE=torchvision-v2 EPOCHS=2 VAL_CROP=32 VAL_RESIZE=0 DATA=.. RN_BIN="$RN_BIN"
    assert_output --partial "--crop 176  --val-crop 32 --val-resize 0 "
    assert_output --partial "--ckpt runs/resnet50/epoch-002.pb --crop 32 --resize 0 "
    # without a recipe the eval transform is CROP/RESIZE, as before
    run make -n EPOCHS=2 CROP=32 RESIZE=0 DATA=.. RN_BIN="$RN_BIN"
    assert_output --partial "--crop 32 --resize 0 --val-crop 32 --val-resize 0 "
    assert_output --partial "--ckpt runs/resnet50/epoch-002.pb --crop 32 --resize 0 "
    # the Fashion-MNIST example takes the recipe's batch and lr, and keeps its 32 px images
    run make -n -C "$BATS_TEST_DIRNAME/../examples/fashion-mnist" OUT="$PWD/fm" RN_BIN="$RN_BIN" \
        RECIPE=torchvision-v2 EPOCHS=2
    assert_success
    assert_output --partial "--batch 1024  --lr 0.5 --lr-schedule cosine   --lr-epochs 2 "
    assert_output --partial "--crop 32 --resize 0 --val-crop 32 --val-resize 0 "
    assert_output --partial "--ckpt $PWD/fm/epoch-002.pb --crop 32 --resize 0 "
}

@test "--val-crop/--val-resize change the eval transform only: rn-eval's numbers, the same checkpoint" {
    [ -d val.lmdb ] || { "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" vsrc 6 2 >/dev/null; rn-prep -q vsrc val.lmdb; }
    V="--data train.lmdb --val val.lmdb --in init.pb --epochs 1 --batch 8 --crop 32 $T --ema-decay 0.9 --ema-every 1"
    rn-train $V --out vc.pb --val-crop 24 --val-resize 28 --log vc.jsonl
    rn-train $V --out vd.pb --log vd.jsonl
    # training untouched: the same weights, momentum and moving average
    run cmp <(rn-info --tensors vc.pb | sed -n '/^tensors:/,$p') <(rn-info --tensors vd.pb | sed -n '/^tensors:/,$p')
    assert_success
    rn-export --ema vc.pb vc-ema.safetensors
    rn-export --ema vd.pb vd-ema.safetensors
    run cmp vc-ema.safetensors vd-ema.safetensors
    assert_success
    # the logged validation is rn-eval's at crop 24 of a 28 resize, for the weights and the EMA
    loss=$(rn-eval --data val.lmdb --ckpt vc.pb --crop 24 --resize 28 --threads 2 --json | grep -o '"loss":[0-9.e-]*')
    ema=$(rn-eval --data val.lmdb --ckpt vc.pb --crop 24 --resize 28 --threads 2 --ema --json |
        grep -o '"loss":[0-9.e-]*')
    run "$PYTHON" -c "import json,sys; e=[json.loads(l) for l in open('vc.jsonl') if '\"epoch\"' in l][-1]
a, b = float(sys.argv[1].split(':')[1]), float(sys.argv[2].split(':')[1])
print(abs(e['val_loss'] - a) < 1e-5, abs(e['ema_val_loss'] - b) < 1e-5)" "$loss" "$ema"
    assert_output "True True"
    # and the default transform is rn-eval's default, a different number here
    run "$PYTHON" -c "import json; print([json.loads(l) for l in open('vd.jsonl') if '\"epoch\"' in l][-1]['val_loss'])"
    refute_output "$(grep -o '"val_loss":[0-9.e-]*' vc.jsonl | cut -d: -f2)"
    run rn-train $V --out bad.pb --val-crop 4
    assert_failure 2
    assert_output --partial "--val-crop"
}

@test "--crop-schedule: the crop of each epoch follows FFCV's formula; resume is exact across a change" {
    plain_build_only "runs resumed across crop changes"
    C="--data train.lmdb --batch 8 --crop-schedule 32:96:0:3 $T"
    run rn-train $C --in init.pb --out cs.pb --epochs 5 --log cs.jsonl
    assert_success
    # each epoch's record in the log names its crop
    assert_equal "$(grep '"kind":"epoch"' cs.jsonl | grep -o '"crop":[0-9]*' | cut -d: -f2 | tr '\n' ' ')" "32 64 64 96 96 "
    # a line at the first epoch and at each change: epoch (1-based) and crop
    got=$(grep -o 'epoch [0-9]*: crop [0-9]*' <<<"$output" | tr '\n' ' ')
    want=$("$PYTHON" -c '
import numpy as np
def res(e, lo=32, hi=96, e1=0, e2=3):  # ffcv examples/imagenet get_resolution
    if e <= e1: return lo
    if e >= e2: return hi
    return int(np.round(np.interp([e], [e1, e2], [lo, hi])[0] / 32)) * 32
prev, out = None, []
for e in range(5):
    if res(e) != prev: out.append("epoch %d: crop %d" % (e + 1, res(e)))
    prev = res(e)
print(" ".join(out), end=" ")')
    assert_equal "$got" "$want"
    assert_equal "$want" "epoch 1: crop 32 epoch 2: crop 64 epoch 4: crop 96 "
    # stopped inside epoch 3 (crop 64, 96 next), and at the end of epoch 2: the same bytes
    rn-train $C --in init.pb --out m.pb --epochs 5 --max-steps 7
    rn-train $C --in m.pb --out m5.pb --epochs 3
    rn-train $C --in init.pb --out e2.pb --epochs 2
    rn-train $C --in e2.pb --out e5.pb --epochs 3
    rn-train $C --in init.pb --out w1.pb --epochs 5 --workers 1
    want=$(rn-info --tensors cs.pb | sed -n '/^tensors:/,$p' | md5sum)
    assert_equal "$(rn-info --tensors m5.pb | sed -n '/^tensors:/,$p' | md5sum)" "$want"
    assert_equal "$(rn-info --tensors e5.pb | sed -n '/^tensors:/,$p' | md5sum)" "$want"
    assert_equal "$(rn-info --tensors w1.pb | sed -n '/^tensors:/,$p' | md5sum)" "$want"
    # the crops matter: a constant crop is another run
    rn-train --data train.lmdb --batch 8 --crop 32 $T --in init.pb --out k.pb --epochs 5
    refute [ "$(rn-info --tensors k.pb | sed -n '/^tensors:/,$p' | md5sum)" = "$want" ]
}

@test "--crop-schedule with --val and the moving average: resume exact, val at --val-crop" {
    [ -d val.lmdb ] || { "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" vsrc 6 2 >/dev/null; rn-prep -q vsrc val.lmdb; }
    # (the moving average's alpha depends on the run's length: --lr-epochs fixes it across the resume)
    C="--data train.lmdb --val val.lmdb --val-crop 32 --batch 8 --crop-schedule 64:32:0:2 $T --ema-decay 0.9"
    C="$C --ema-every 1 --lr-epochs 3"
    rn-train $C --in init.pb --out a3.pb --epochs 3 --log a3.jsonl
    rn-train $C --in init.pb --out a1.pb --epochs 1
    rn-train $C --in a1.pb --out b3.pb --epochs 2
    rn-export --ema a3.pb a3.safetensors
    rn-export --ema b3.pb b3.safetensors
    run cmp a3.safetensors b3.safetensors
    assert_success
    run cmp <(rn-info --tensors a3.pb | sed -n '/^tensors:/,$p') <(rn-info --tensors b3.pb | sed -n '/^tensors:/,$p')
    assert_success
    loss=$(rn-eval --data val.lmdb --ckpt a3.pb --crop 32 --threads 2 --json | grep -o '"loss":[0-9.e-]*' | cut -d: -f2)
    run "$PYTHON" -c "import json,sys; e=[json.loads(l) for l in open('a3.jsonl') if '\"epoch\"' in l][-1]
print(abs(e['val_loss'] - float(sys.argv[1])) < 1e-5)" "$loss"
    assert_output True
}

@test "bad --crop-schedule values exit 2 with a message" {
    for bad in 1:2:3 a:b:c:d 16:64:0:2 32:64:3:3 32:64:0:2x 32:8000:0:2 32:64:-1:2; do
        run rn-train --data train.lmdb --in init.pb --out bad.pb --crop-schedule "$bad"
        assert_failure 2
        assert_output --partial "--crop-schedule"
    done
    [ ! -e bad.pb ]
}
