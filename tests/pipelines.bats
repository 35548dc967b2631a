#!/usr/bin/env bats
# pipelines/*.mk on a tiny learnable dataset: prep, one checkpoint per epoch, eval, plot,
# resume, the run record, NPROC's mpirun prefix; bench.mk's table on fake benchmarks;
# bench-dist's and bench-infer's dry runs.
load helper

PIPES="$BATS_TEST_DIRNAME/../pipelines"

# the tensors (names, shapes, crc32c of parameters, BN buffers, momentum) and the epoch and
# step of a checkpoint; provenance (with its time) and history timings are left out
tensors() {
    rn-info --json --tensors "$1" | "$PYTHON" -c '
import json, sys
d = json.load(sys.stdin)
print(d["epoch"], d["step"], len(d["tensors"]), json.dumps(d["tensors"], sort_keys=True))'
}

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/train 24 1
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/val 8 2
    cat > Makefile <<EOF
ARCH = resnet18
EPOCHS = 2
BATCH = 16
CROP = 16
RESIZE = 0
WORKERS = 2
THREADS = 2
LR = 0.05
TRAIN_SRC = src/train
VAL_SRC = src/val
PREP_FLAGS = -q
RUN = run
include $PIPES/prep.mk
include $PIPES/eval.mk
include $PIPES/plot.mk
all: eval plot
EOF
    make all RN_BIN="$RN_BIN" > make.log 2>&1
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

@test "make: datasets, one checkpoint per epoch, results.tsv, best.pb, curves.png" {
    [ -d data/train.lmdb ]
    [ -d data/val.lmdb ]
    for e in 000 001 002; do run rn-info run/epoch-$e.pb; assert_success; done
    run rn-info --json run/epoch-002.pb
    assert_output --partial '"epoch":2,"step":6,'
    [ ! -e run/epoch-003.pb ]
    [ ! -e run/epoch-002.pb.part ]
    # results.tsv: a header and one row per epoch
    [ "$(head -1 run/results.tsv)" = "$(printf 'epoch\ttop1\ttop5\tloss\tn\tcheckpoint')" ]
    run awk -F'\t' 'NR > 1 { printf "%s %s %s|", $1, $5, $6 }' run/results.tsv
    assert_output "1 16 epoch-001.pb|2 16 epoch-002.pb|"
    # best.pb: a link to the epoch with the highest top-1
    [ -L run/best.pb ]
    best=$(readlink run/best.pb)
    top=$(awk -F'\t' 'NR > 1 { print $2 }' run/results.tsv | sort -g | tail -1)
    awk -F'\t' -v b="$best" -v t="$top" '$6 == b && $2 == t { f = 1 } END { exit !f }' run/results.tsv
    # curves.png: a PNG (signature) of non-trivial size
    [ "$(head -c 8 run/curves.png | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
    [ "$(stat -c %s run/curves.png)" -gt 20000 ]
    # per-epoch logs with step and epoch lines
    grep -q '"kind":"step"' run/epoch-001.jsonl
    [ "$(grep -c '"kind":"epoch"' run/epoch-002.jsonl)" = 1 ]
}

@test "the run records its commands, the rn version and the datasets' identity" {
    [ "$(grep -c 'rn-init --arch resnet18 --classes 2 --seed 0 -o run/epoch-000.pb ' run/commands.sh)" = 1 ]
    [ "$(grep -c 'rn-train --data data/train.lmdb --in run/epoch-001.pb --out run/epoch-002.pb.part --epochs 1 ' run/commands.sh)" = 1 ]
    [ "$(grep -c 'rn-eval .*> run/eval/epoch-00[12].txt  # 20' run/commands.sh)" = 2 ]
    grep -q 'rn-prep -q --classes data/train.lmdb src/val data/val.lmdb' data/commands.sh
    grep -q "^# rn-train $(rn-train --version | awk '{ print $NF }')" run/run.txt
    grep -qx 'EPOCHS=2' run/run.txt
    grep -q '"count":48,' run/train-data.json
    grep -q '"count":16,' run/val-data.json
    # the commands replay: the recorded rn-init makes the same tensors (the provenance
    # records the output name, so the bytes differ there)
    cmd=$(grep 'rn-init ' run/commands.sh | sed 's/  #.*//; s/-o run\/epoch-000.pb/-o replay.pb/')
    eval "$cmd"
    [ "$(tensors replay.pb)" = "$(tensors run/epoch-000.pb)" ]
    # make -n shows the whole experiment; after a run there is nothing left to do
    run make -n all RN_BIN="$RN_BIN" RUN=other
    assert_success
    [ "$(grep -c 'rn-train --data' <<<"$output")" = 2 ]
    run make -q all RN_BIN="$RN_BIN"
    assert_success
}

@test "NPROC=2 starts rn-train and rn-eval with mpirun; NPROC=1 runs them alone" {
    run make -n all RN_BIN="$RN_BIN" RUN=other NPROC=2 MPIFLAGS=--oversubscribe
    assert_success
    [ "$(grep -c "mpirun -np 2 --oversubscribe $RN_BIN/rn-train --data" <<<"$output")" = 2 ]
    [ "$(grep -c "mpirun -np 2 --oversubscribe $RN_BIN/rn-eval --data" <<<"$output")" = 2 ]
    [ "$(grep -c 'mpirun.*rn-init' <<<"$output")" = 0 ]
    run make -n all RN_BIN="$RN_BIN" RUN=other MPIRUN=/opt/mpi/bin/mpirun NPROC=4
    assert_success
    [ "$(grep -c "/opt/mpi/bin/mpirun -np 4 $RN_BIN/rn-train --data" <<<"$output")" = 2 ]
    run make -n all RN_BIN="$RN_BIN" RUN=other NPROC=1
    assert_success
    [ "$(grep -c "commands.sh $RN_BIN/rn-train --data" <<<"$output")" = 2 ]
    [ "$(grep -c 'mpirun -np' <<<"$output")" = 0 ]
}

@test "deleting epoch-002.pb and running make rebuilds only it, with the same tensors" {
    before=$(tensors run/epoch-002.pb)
    t1=$(stat -c %Y.%y run/epoch-001.pb)
    n=$(grep -c 'rn-train --data' run/commands.sh)
    rm run/epoch-002.pb
    run make train RN_BIN="$RN_BIN"
    assert_success
    [ "$(grep -c 'rn-train --data' run/commands.sh)" = $((n + 1)) ]
    [ "$(stat -c %Y.%y run/epoch-001.pb)" = "$t1" ]
    [ "$(tensors run/epoch-002.pb)" = "$before" ]
    # results and plot follow the new checkpoint
    run make all RN_BIN="$RN_BIN"
    assert_success
    run make -q all RN_BIN="$RN_BIN"
    assert_success
}

@test "epoch by epoch gives the tensors of one uninterrupted rn-train --epochs 2" {
    flags=$(grep -- '--in run/epoch-001.pb ' run/commands.sh | tail -1 | sed 's/.*--epochs 1 //; s/ --log .*//')
    rn-train --data data/train.lmdb --in run/epoch-000.pb --out direct.pb --epochs 2 $flags 2>/dev/null
    [ "$(tensors direct.pb)" = "$(tensors run/epoch-002.pb)" ]
}

@test "an epoch stopped part-way continues from its .part file on the next make" {
    before=$(tensors run/epoch-002.pb)
    # an rn-train that stops after one step, exit 0, as after SIGTERM or SIGUSR1
    mkdir -p stop
    for t in "$RN_BIN"/rn-*; do ln -sf "$t" stop/; done
    rm stop/rn-train
    printf '#!/bin/sh\nexec "%s/rn-train" "$@" --max-steps 1\n' "$RN_BIN" > stop/rn-train
    chmod +x stop/rn-train
    rm run/epoch-002.pb
    run make train RN_BIN="$PWD/stop"
    assert_failure
    assert_output --partial "stopped inside epoch 002"
    [ ! -e run/epoch-002.pb ]
    run rn-info --json run/epoch-002.pb.part
    assert_output --partial '"epoch":1,"step":4,'
    run make train RN_BIN="$RN_BIN"
    assert_success
    assert_output --partial "continuing epoch 002 from run/epoch-002.pb.part"
    [ ! -e run/epoch-002.pb.part ]
    [ "$(tensors run/epoch-002.pb)" = "$before" ]
}

@test "Ctrl-C during make: the next make continues the epoch, same tensors as no interruption" {
    command -v setsid > /dev/null || skip "no setsid"
    # a new process group, as a shell's job: Ctrl-C signals all of it (make and rn-train);
    # batch 2 makes 24 steps an epoch, so that the signal lands inside one
    setsid sh -c 'echo $$ > sig.pid; exec make train RN_BIN="$1" RUN=sig EPOCHS=1 BATCH=2 LOG_EVERY=1' sh "$RN_BIN" > sig.log 2>&1 &
    for _ in $(seq 3000); do
        [ -s sig.pid ] && grep -q '"kind":"step"' sig/epoch-001.jsonl 2>/dev/null && break
        sleep 0.01
    done
    pg=$(cat sig.pid)
    kill -INT -- -"$pg"
    for _ in $(seq 3000); do kill -0 "$pg" 2>/dev/null || break; sleep 0.01; done
    [ -f sig/epoch-001.pb.part ] || skip "the epoch finished before the signal arrived"
    [ ! -e sig/epoch-001.pb ]
    grep -q 'stopped by signal' sig.log
    run make train RN_BIN="$RN_BIN" RUN=sig EPOCHS=1 BATCH=2 LOG_EVERY=1
    assert_success
    assert_output --partial "continuing epoch 001 from sig/epoch-001.pb.part"
    flags=$(grep -- '--in sig/epoch-000.pb ' sig/commands.sh | sed 's/  #.*//; s/.*--epochs 1 //; s/ --log .*//')
    rn-train --data data/train.lmdb --in sig/epoch-000.pb --out sig-direct.pb --epochs 1 $flags 2>/dev/null
    [ "$(tensors sig-direct.pb)" = "$(tensors sig/epoch-001.pb)" ]
    [ "$(grep -c '"kind":"step"' sig/epoch-001.jsonl)" = 24 ]
}

@test "a run refuses to go on with a dataset other than the one it started with" {
    cp run/train-data.json saved.json
    touch -r run/epoch-001.pb saved.json
    sed -i 's/"count":48/"count":47/' run/train-data.json
    touch run/epoch-001.pb
    run make train RN_BIN="$RN_BIN"
    assert_failure
    assert_output --partial "data/train.lmdb is not the dataset this run started with"
    [ -f run/epoch-002.pb ]
    ! grep -q '^rn-train' <<<"$output"
    cp saved.json run/train-data.json
    touch -r saved.json run/epoch-001.pb
    rm -f run/train-data.json.now
    run make -q train RN_BIN="$RN_BIN"
    assert_success
}

@test "EVAL_CMD swaps rn-eval for another evaluator" {
    rm run/eval/epoch-001.txt
    run make eval RN_BIN="$RN_BIN" EVAL_CMD='echo top1=0.9999 top5=1 loss=0.001 n=16'
    assert_success
    assert_output --partial "run/best.pb -> epoch-001.pb: top1=0.9999 top5=1 loss=0.001 n=16"
    grep -q "echo top1=0.9999 top5=1 loss=0.001 n=16 > run/eval/epoch-001.txt" run/commands.sh
    rm run/eval/epoch-001.txt
    run make eval RN_BIN="$RN_BIN"
    assert_success
    [ "$(readlink run/best.pb)" = "$(awk -F'\t' 'NR > 1 { print $2, $4, $6 }' run/results.tsv | sort -k1,1gr -k2,2g | head -1 | cut -d' ' -f3)" ]
}

@test "prep.mk says which variable is missing" {
    mkdir -p empty && cd empty
    printf 'include %s/prep.mk\n' "$PIPES" > Makefile
    run make prep RN_BIN="$RN_BIN"
    assert_failure
    assert_output --partial "set TRAIN_SRC"
}

@test "README.md's pipeline example, with the installed fragments, trains and evaluates with a plain make" {
    cd "$BATS_TEST_TMPDIR"
    make -C "$BATS_TEST_DIRNAME/.." -f man/man.mk install-pipelines DESTDIR="$PWD/root" PREFIX=/usr/local
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/train 8 1
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src/val 4 2
    # the Makefile exactly as README.md shows it, the fragments where they were installed
    awk '/^## Pipelines/ { p = 1 } p && /^```make/ { f = 1; next } f && /^```/ { exit } f' \
        "$BATS_TEST_DIRNAME/../README.md" | sed "s|/usr/local/share/rn/pipelines|$PWD/root/usr/local/share/rn/pipelines|" > Makefile
    cat Makefile
    [ "$(grep -c '^include .*/root/usr/local/share/rn/pipelines/' Makefile)" = 3 ]
    [ "$(tail -n 1 Makefile)" = "all: eval plot" ]
    # a plain make, the tools on $PATH as installed fragments find them; the command line
    # only shrinks the run (README: set variables before the includes or on the command line)
    run env -u RN_BIN make ARCH=resnet18 EPOCHS=1 BATCH=8 CROP=16 RESIZE=0 WORKERS=2 THREADS=2 \
        TRAIN_SRC=src/train VAL_SRC=src/val PREP_FLAGS=-q
    assert_success
    assert_output --partial "runs/resnet18/best.pb -> epoch-001.pb: top1="
    run rn-info --json runs/resnet18/epoch-001.pb
    assert_output --partial '"epoch":1,"step":2,'
    run awk -F'\t' 'NR > 1 { print $1, $5, $6 }' runs/resnet18/results.tsv
    assert_output "1 8 epoch-001.pb"
    [ -s runs/resnet18/curves.png ]
    # and nothing is left to do
    run env -u RN_BIN make -q ARCH=resnet18 EPOCHS=1 BATCH=8 CROP=16 RESIZE=0 WORKERS=2 THREADS=2 \
        TRAIN_SRC=src/train VAL_SRC=src/val PREP_FLAGS=-q
    assert_success
}

@test "bench.mk collects the bench-* summary lines into one table" {
    mkdir -p fake/pipelines
    cat > fake/Makefile <<'EOF'
-include pipelines/bench-*.mk
EOF
    printf 'bench-one:\n\t@echo noise; echo "one: rn=100 peer=50 ratio=2.00"; echo "one-mem: rn=1 peer=2 ratio=2.00"\n' > fake/pipelines/bench-one.mk
    printf 'bench-two:\n\t@echo "two: rn=1 peer=4 ratio=0.25"; exit 3\n' > fake/pipelines/bench-two.mk
    printf 'bench-three:\n\t@echo nothing to say\n' > fake/pipelines/bench-three.mk
    run make -f "$PIPES/bench.mk" bench-table RN_SRC="$PWD/fake" RUN=benchrun
    assert_success
    run cat benchrun/bench/bench.tsv
    assert_line --index 0 "$(printf 'benchmark\tname\trn\tpeer\tratio')"
    assert_line "$(printf 'bench-one\tone\t100\t50\t2.00')"
    assert_line "$(printf 'bench-one\tone-mem\t1\t2\t2.00')"
    assert_line --partial "$(printf 'bench-two\t(failed')"
    assert_line "$(printf 'bench-three\t(no summary line)\t-\t-\t-')"
}

@test "bench-dist's dry run: rn-train on 2 ranks and the DDP peer each give img/s, in the summary form" {
    plain_build_only "a dry run of the benchmark script (rn-train and PyTorch runs)"
    command -v mpirun >/dev/null || skip "no mpirun"
    have_torch || skip "no torch/torchvision for $PYTHON"
    mpi_no_leak_checks
    run env DRY=1 DIR="$PWD/bdist" BUILD="${RN_BUILD:-$BATS_TEST_DIRNAME/../build}" PYTHON="$PYTHON" \
        "$BATS_TEST_DIRNAME/bench/dist.sh"
    assert_success
    assert_line --regexp '^dist-cpu-2rank: rn=[0-9.]+ peer=[0-9.]+ ratio=[0-9.]+$'
    assert_line --regexp '^dist-cpu-scaling: rn2rank=[0-9.]+ rn1proc2thr=[0-9.]+ ratio=[0-9.]+$'
    refute_line --regexp '(rn|peer|rn2rank|rn1proc2thr)=0(\.0*)? '
    grep -q '"world_size":2' bdist/rn-2rank.jsonl
}

@test "examples/quickstart runs end to end (1 epoch on fewer images)" {
    run make -C "$BATS_TEST_DIRNAME/../examples/quickstart" RN_BIN="$RN_BIN" OUT="$PWD/qs" \
        EPOCHS=1 PER_CLASS=8 VAL_PER_CLASS=4 CROP=16 THREADS=2
    assert_success
    assert_output --regexp "quickstart: resnet18, 1 epochs: top1=[0-9.]+ top5=[0-9.]+ loss=[0-9.]+ n=12"
    [ "$(ls qs/images/train)" = "$(printf 'checker\nhorizontal\nvertical')" ]
    [ -s qs/run/curves.png ]
    [ -L qs/run/best.pb ]
}

@test "examples/finetune with PTH: rn-init reads torch.save's file itself, no Python step" {
    have_torch || skip "no torch/torchvision for $PYTHON"
    "$PYTHON" -c "import torch, torchvision; torch.manual_seed(0); torch.save(torchvision.models.resnet18().state_dict(), 'r18.pth')"
    run make -C "$BATS_TEST_DIRNAME/../examples/finetune" RN_BIN="$RN_BIN" PYTHON=/nonexistent/python OUT="$PWD/ft" \
        PTH="$PWD/r18.pth" ARCH=resnet18 EPOCHS=1 BATCH=8 PER_CLASS=8 VAL_PER_CLASS=4 CROP=16 THREADS=2
    assert_success
    assert_output --regexp "finetune: resnet18 from .*/r18.pth, 1 epochs: top1="
    refute_output --partial "save_torchvision.py"
    [ ! -e ft/weights.safetensors ]
    grep -q -- "--from $PWD/r18.pth --reset-fc 3 " ft/run/commands.sh
    run rn-info --json ft/run/epoch-000.pb
    assert_output --partial '"arch":"resnet18","num_classes":3,'
    rn-init --from r18.pth --reset-fc 3 --seed 0 -o direct.pb
    diff <(rn-info -t direct.pb | grep -A999 '^tensors:' | grep -v '^  fc\.') \
         <(rn-info -t ft/run/epoch-000.pb | grep -A999 '^tensors:' | grep -v '^  fc\.')
}

@test "examples/finetune: torchvision weights as safetensors, rn-init --from --reset-fc, training" {
    have_torch || skip "no torch/torchvision for $PYTHON"
    run make -C "$BATS_TEST_DIRNAME/../examples/finetune" RN_BIN="$RN_BIN" PYTHON="$PYTHON" OUT="$PWD/ft" \
        ARCH=resnet18 EPOCHS=1 BATCH=8 PER_CLASS=8 VAL_PER_CLASS=4 CROP=16 THREADS=2
    assert_success
    assert_output --partial "a randomly initialised resnet18 stands in for pretrained weights"
    assert_output --regexp "finetune: resnet18 from .*weights.safetensors, 1 epochs: top1="
    # the backbone is torchvision's, the new fc has the dataset's 3 classes
    run rn-info --json ft/run/epoch-000.pb
    assert_output --partial '"arch":"resnet18","num_classes":3,'
    grep -q -- '--from .*weights.safetensors --reset-fc 3 ' ft/run/commands.sh
    PYTHONPATH="$BATS_TEST_DIRNAME/parity" "$PYTHON" - <<'PY'
import subprocess, rnst, torch
w, meta = rnst.load("ft/weights.safetensors")
assert meta["arch"] == "resnet18", meta
subprocess.run(["rn-export", "ft/run/epoch-000.pb", "ft/e0.safetensors"], check=True)
e, _ = rnst.load("ft/e0.safetensors")
for k, t in e.items():
    if not k.startswith("fc."):
        assert torch.equal(t, w[k]), k
assert e["fc.weight"].shape == (3, 512), e["fc.weight"].shape
PY
}

@test "examples/imagenet: make -n shows the recipe; a flat val/ with LOC_val_solution.csv is labelled by class" {
    ex="$BATS_TEST_DIRNAME/../examples/imagenet"
    run make -n -C "$ex" IMAGENET=/nonexistent OUT="$PWD/in" RN_BIN="$RN_BIN"
    assert_success
    [ "$(grep -c 'rn-train --data' <<<"$output")" = 30 ]
    assert_output --partial "--epochs 1 --batch 256  --lr 0.01 --lr-schedule step --lr-step 10 --lr-gamma 0.1"
    run make -n -C "$ex" IMAGENET=/nonexistent OUT="$PWD/in" RN_BIN="$RN_BIN" RECIPE=torchvision
    [ "$(grep -c 'rn-train --data' <<<"$output")" = 90 ]
    assert_output --partial "--lr 0.1 --lr-schedule step --lr-step 30 "
    # a tiny stand-in: train/<class>/ and the Kaggle layout for val
    mkdir -p inet/val && cp -r src/train inet/train
    printf 'ImageId,PredictionString\n' > inet/LOC_val_solution.csv
    for c in horiz vert; do
        for f in src/val/$c/00[0-2].jpg; do
            id=v$c$(basename "$f" .jpg); cp "$f" "inet/val/$id.JPEG"; echo "$id,$c 1 2 3 4" >> inet/LOC_val_solution.csv
        done
    done
    run make -C "$ex" IMAGENET="$PWD/inet" OUT="$PWD/in" RN_BIN="$RN_BIN" VAL_CLASSES=2 PREP_FLAGS=-q VAL_PREP_FLAGS=-q prep
    assert_success
    [ "$(ls in/val-folders/vert)" = "$(printf 'vvert000.JPEG\nvvert001.JPEG\nvvert002.JPEG')" ]
    run rn-info --json in/data/val.lmdb
    assert_output --partial '"count":6,'
    assert_output --partial '"classes":[{"label":0,"name":"horiz","count":3},{"label":1,"name":"vert","count":3}]'
}

@test "bench-infer's dry run: rn, onnxruntime and PyTorch each give a rate in the summary form, and the log each round's rn/onnxruntime ratio" {
    plain_build_only "a dry run of the benchmark script (rn, onnxruntime and PyTorch runs)"
    have_torch || skip "no torch/torchvision for $PYTHON"
    run env DRY=1 DIR="$PWD/binfer" BUILD="${RN_BUILD:-$BATS_TEST_DIRNAME/../build}" PYTHON="$PYTHON" \
        "$BATS_TEST_DIRNAME/bench/infer.sh"
    assert_success
    assert_line --regexp '^infer-cpu-b4-torch: rn=[0-9.]+ peer=[0-9.]+ ratio=[0-9.]+$'
    assert_line --regexp '^infer-cpu-b1-ms-torch: rn=[0-9.]+ peer=[0-9.]+ ratio=[0-9.]+$'
    refute_line --regexp '(rn|peer)=0(\.0*)? '
    if [[ "$output" == *"infer-cpu-b4: skipped"* ]]; then
        assert_line --regexp '^infer-cpu-b1-ms: skipped: .+'
        skip "onnxruntime-node is not installed here: its rows said skipped"
    fi
    assert_line --regexp '^infer-cpu-b4: rn=[0-9.]+ peer=[0-9.]+ ratio=[0-9.]+$'
    assert_line --regexp '^infer-cpu-b1-ms: rn=[0-9.]+ peer=[0-9.]+ ratio=[0-9.]+$'
    assert_line --regexp '^# b4 rounds rn/onnxruntime \(sorted\): [0-9.]+ [0-9.]+; rn ahead in [0-2] of 2, median [0-9.]+$'
}

@test "bench-infer with ORT=0: the onnxruntime rows say skipped and why, the PyTorch rows still come, exit 0" {
    plain_build_only "a dry run of the benchmark script (rn and PyTorch runs)"
    have_torch || skip "no torch/torchvision for $PYTHON"
    run env ORT=0 DRY=1 DIR="$PWD/binfer" BUILD="${RN_BUILD:-$BATS_TEST_DIRNAME/../build}" PYTHON="$PYTHON" \
        "$BATS_TEST_DIRNAME/bench/infer.sh"
    assert_success
    assert_line 'infer-cpu-b4: skipped: ORT=0'
    assert_line 'infer-cpu-b1-ms: skipped: ORT=0'
    assert_line --regexp '^infer-cpu-b4-torch: rn=[0-9.]+ peer=[0-9.]+ ratio=[0-9.]+$'
    refute_line --partial 'rounds rn/onnxruntime'
}
