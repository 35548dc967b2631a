#!/usr/bin/env bats
# rn-train --optimizer lars and --lr-schedule poly: the update against a numpy reference
# of MLPerf's LARS over several resumed steps (BN parameters and the fc bias excluded),
# exact resume, the same bytes for any thread count and for 2 ranks as for --accum 2,
# bad values refused.

load helper

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    toy_setup 24 >/dev/null
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

T="--batch 8 --crop 32 --workers 2 --threads 2 --seed 3"
L="--optimizer lars --momentum 0.9 --wd 0.01 --lars-eta 0.02 --lars-eps 0.001"

tensors() { rn-info --tensors "$1" | sed -n '/^tensors:/,$p'; }

@test "bad LARS and poly values exit 2 with a message" {
    run rn-train --data train.lmdb --in init.pb --out x.pb --optimizer adam
    assert_failure 2
    assert_output --partial "--optimizer: 'adam' is not sgd or lars"
    run rn-train --data train.lmdb --in init.pb --out x.pb --optimizer lars --lars-eta -1
    assert_failure 2
    assert_output --partial "--lars-eta"
    run rn-train --data train.lmdb --in init.pb --out x.pb --optimizer lars --lars-eps nan
    assert_failure 2
    assert_output --partial "--lars-eps"
    run rn-train --data train.lmdb --in init.pb --out x.pb --optimizer lars --nesterov
    assert_failure 2
    assert_output --partial "--optimizer lars has no Nesterov momentum"
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr-schedule poly --lr-power 0
    assert_failure 2
    assert_output --partial "--lr-power"
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr-schedule poly --lr-end -0.1
    assert_failure 2
    assert_output --partial "--lr-end"
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr-schedule poly --lr 0.01 --lr-end 0.1
    assert_failure 2
    assert_output --partial "--lr-end 0.1 is above --lr 0.01"
    run rn-train --data train.lmdb --in init.pb --out x.pb --lr-schedule pow2
    assert_failure 2
    assert_output --partial "is not step, multistep, cosine, constant, poly or exp"
    [ ! -e x.pb ]
}

@test "three LARS steps (each resumed from the last) match the numpy reference, excluded tensors included" {
    rn-train --data train.lmdb --in init.pb --out s1.pb --max-steps 1 $T $L --lr-schedule constant --lr 0.5 \
        --dump-grads g1.safetensors
    rn-train --data train.lmdb --in s1.pb --out s2.pb --max-steps 1 $T $L --lr-schedule constant --lr 0.4 \
        --dump-grads g2.safetensors
    rn-train --data train.lmdb --in s2.pb --out s3.pb --max-steps 1 $T $L --lr-schedule constant --lr 0.3 \
        --dump-grads g3.safetensors
    rn-export init.pb init.safetensors
    rn-export s3.pb s3.safetensors
    run "$PYTHON" "$BATS_TEST_DIRNAME/data/lars_ref.py" init.safetensors s3.safetensors 0.9 0.01 0.02 0.001 \
        g1.safetensors:0.5 g2.safetensors:0.4 g3.safetensors:0.3
    assert_success
    assert_output --regexp "62 tensors \(21 adapted, 41 excluded\) after 3 steps"
}

@test "the checkpoint says lars, its eta and eps, and the poly schedule" {
    rn-train --data train.lmdb --in init.pb --out info.pb --max-steps 1 $T $L --lr-schedule poly --lr-end 0.001 \
        --lr-power 3
    run rn-info info.pb
    assert_output --partial "optimiser:     lars lr 0.01 momentum 0.9 weight decay 0.01 eta 0.02 eps 0.001"
    run rn-info --json info.pb
    assert_output --partial '"lr_schedule":"poly"'
    assert_output --partial '"lr_end":0.001,"lr_power":3'
    assert_output --partial '"lars_eta":0.02,"lars_eps":0.001'
    run rn-info --tensors info.pb
    assert_output --regexp "fc\.bias +2 +F32 +[0-9a-f]{8} momentum"
}

@test "LARS with poly and warm-up: 2N steps equal N steps, resume, N steps; --threads 1, 2, 3 the same bytes" {
    plain_build_only "runs at 1, 2 and 3 threads and resumed"
    P="$L --lr 2 --lr-schedule poly --warmup-epochs 1 --lr-epochs 3"
    rn-train --data train.lmdb --in init.pb --out full.pb --max-steps 8 $T $P --log full.jsonl --log-every 1
    rn-train --data train.lmdb --in init.pb --out half.pb --max-steps 4 $T $P
    rn-train --data train.lmdb --in half.pb --out resumed.pb --max-steps 4 $T $P
    diff <(tensors full.pb) <(tensors resumed.pb)
    rn-train --data train.lmdb --in init.pb --out t1.pb --max-steps 8 $T $P --threads 1
    rn-train --data train.lmdb --in init.pb --out t3.pb --max-steps 8 $T $P --threads 3
    diff <(tensors full.pb) <(tensors t1.pb)
    diff <(tensors full.pb) <(tensors t3.pb)
    # the lr the log reports at step s is the schedule's at step s-1 (6 steps an epoch):
    # warm-up 2*(k+1)/6 over 6 steps, then 1e-4 + (2 - 1e-4)*(1 - (k-6)/12)^2
    run "$PYTHON" -c '
import json
lines = [json.loads(l) for l in open("full.jsonl")]
got = [(d["step"], d["lr"]) for d in lines if d["kind"] == "step"]
assert [s for s, _ in got] == list(range(1, 9)), got
for s, lr in got:
    k = s - 1
    want = 2 * (k + 1) / 6 if k < 6 else 1e-4 + (2 - 1e-4) * (1 - (k - 6) / 12) ** 2
    assert abs(lr - want) <= 1e-6 * want, (s, lr, want)
print("ok")'
    assert_success
}

@test "a checkpoint's SGD momentum is not resumed as LARS momentum (and the other way)" {
    rn-train --data train.lmdb --in init.pb --out sgd.pb --max-steps 1 $T
    run rn-train --data train.lmdb --in sgd.pb --out x.pb --max-steps 1 $T $L
    assert_failure 1
    assert_output --partial "holds sgd momentum and this run asks for --optimizer lars: resume with --optimizer sgd"
    rn-train --data train.lmdb --in init.pb --out lars.pb --max-steps 1 $T $L
    run rn-train --data train.lmdb --in lars.pb --out x.pb --max-steps 1 $T
    assert_failure 1
    assert_output --partial "holds lars momentum"
    [ ! -e x.pb ]
}

@test "--optimizer sgd is the default, byte for byte" {
    rn-train --data train.lmdb --in init.pb --out d.pb --max-steps 2 $T
    rn-train --data train.lmdb --in init.pb --out s.pb --max-steps 2 $T --optimizer sgd
    diff <(tensors d.pb) <(tensors s.pb)
}

@test "LARS on 2 ranks equals one process with --accum 2, bit for bit" {
    command -v mpirun >/dev/null || skip "mpirun not installed (make deps installs openmpi-bin)"
    rn-train --help | grep -q "This build: with Open MPI" || skip "this rn build has no MPI (USE_MPI=0)"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpi_no_leak_checks
    A="--batch 8 --crop 32 --seed 3 --workers 1 --threads 1 $L --lr 1"
    rn-train --data train.lmdb --in init.pb --out one.pb --max-steps 3 --accum 2 $A
    mpirun --oversubscribe -np 2 rn-train --data train.lmdb --in init.pb --out two.pb --max-steps 3 $A
    diff <(tensors one.pb) <(tensors two.pb)
}
