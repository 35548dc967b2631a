#!/usr/bin/env bats
# rn-train --profile: per-layer timing of a few steps, as a table and a Chrome trace, on
# the toy set (resnet18, 32x32 crops, two threads).
load helper

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    toy_setup 64
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

T="--batch 16 --crop 32 --workers 2 --threads 2"

# Every layer and direction of resnet18 as torchvision names the modules, the rows the
# table and the trace must hold (a BN row holds its ReLU and residual add; a block with an
# identity shortcut has a backward row of its own, the gradient add; the loss with its
# gradient is one backward row), then the step's stages.
expected_rows() {
    "$PYTHON" - <<'PY'
rows = [("conv1", d) for d in ("forward", "backward")] + [("bn1", d) for d in ("forward", "backward")]
rows += [(m, d) for m in ("maxpool", "avgpool", "fc") for d in ("forward", "backward")]
rows += [("loss", "backward")]
for l in range(1, 5):
    for b in range(2):
        p = f"layer{l}.{b}"
        for m in ("conv1", "bn1", "conv2", "bn2"):
            rows += [(f"{p}.{m}", d) for d in ("forward", "backward")]
        if l > 1 and b == 0:
            rows += [(f"{p}.downsample.{i}", d) for i in (0, 1) for d in ("forward", "backward")]
        else:
            rows += [(p, "backward")]
for s in ("data-wait", "input", "h2d-wait", "sgd"):
    rows += [(s, "step")]
for n, d in sorted(rows):
    print(n, d)
PY
}

@test "--profile: one row per layer and direction, sorted by time, summing to the measured step; no checkpoint" {
    run rn-train --data train.lmdb --in init.pb --out prof.pb $T --profile prof.txt --profile-warmup 1 --profile-steps 3
    assert_success
    assert_line --regexp '^rn-train: profiled 3 steps after 1 warm-up steps: [0-9.]+ ms per step, [0-9.]+% of it in the rows; table in prof.txt, trace in prof.txt.json; no checkpoint written$'
    [ ! -e prof.pb ]
    expected_rows > want.txt
    # the rows: name and direction, every one expected once and nothing else
    grep -v '^#' prof.txt | tail -n +2 | awk '{print $1, $2}' | sort > got.txt
    run diff want.txt got.txt
    assert_success
    # sorted by time, one call per step (input: staging and the normalise), shares add up
    run "$PYTHON" - <<'PY'
rows = [l.split() for l in open("prof.txt") if not l.startswith("#")][1:]
ms = [float(r[2]) for r in rows]
assert ms == sorted(ms, reverse=True), ms
for r in rows:
    assert int(r[4]) == (2 if r[0] == "input" else 1), r
    assert float(r[7]) > 0 or r[0] in ("data-wait", "h2d-wait"), r  # FLOPs
share = sum(float(r[3].rstrip("%")) for r in rows)
assert 95 <= share <= 100.5, share
print("shares sum to", share)
PY
    assert_success
    # the closing line: the rows' sum against the wall time of the profiled steps
    run "$PYTHON" - <<'PY'
import re
rows = [l.split() for l in open("prof.txt") if not l.startswith("#")][1:]
last = open("prof.txt").read().splitlines()[-1]
m = re.fullmatch(r"# rows sum to ([0-9.]+) ms per step; measured step ([0-9.]+) ms \(([0-9.]+)% of it in the rows\)", last)
assert m, last
total, step = float(m[1]), float(m[2])
assert abs(sum(float(r[2]) for r in rows) - total) < 0.01 * len(rows), (total, rows)
assert 0.95 * step <= total <= step * 1.001, (total, step)
print(total, "of", step, "ms")
PY
    assert_success
}

@test "--profile: Chrome trace JSON, one event per layer and direction per step, the loader workers on tracks of their own" {
    run rn-train --data train.lmdb --in init.pb --out prof.pb $T --profile tr.txt --profile-warmup 1 --profile-steps 2
    assert_success
    expected_rows > want.txt
    run "$PYTHON" - <<'PY'
import collections, json
d = json.load(open("tr.txt.json"))
ev = d["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
workers = {t: n for t, n in names.items() if t >= 16}
assert {t: n for t, n in names.items() if t < 16} == {1: "host", 2: "compute"}, names
# --workers 2: tracks 16 and 17, named for the worker, each with its "load" chunks only
assert workers and all(n == "loader worker %d" % (t - 15) and t in (16, 17) for t, n in workers.items()), names
L = [e for e in ev if e["ph"] == "X" and e["tid"] >= 16]
assert L and all(e["name"] == "load" and e["tid"] in workers and e["dur"] >= 0 and e["ts"] >= 0 for e in L), L
X = [e for e in ev if e["ph"] == "X" and e["tid"] < 16]
count = collections.Counter((e["args"]["layer"], e["args"]["dir"]) for e in X)
want = [tuple(l.split()) for l in open("want.txt")]
assert set(count) == set(want), set(count) ^ set(want)
for k, c in count.items():
    assert c == (4 if k[0] == "input" else 2), (k, c)
for e in X:
    assert e["name"] == (e["args"]["layer"] if e["args"]["dir"] == "step" else e["args"]["layer"] + " " + e["args"]["dir"]), e
    assert e["dur"] >= 0 and e["ts"] >= 0 and e["tid"] in (1, 2), e
    assert e["args"]["step"] in (0, 1) and e["args"]["flops"] >= 0 and e["args"]["bytes"] >= 0, e
# one track at a time: the spans follow each other
X.sort(key=lambda e: e["ts"])
for a, b in zip(X, X[1:]):
    assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)
print(len(X), "events,", len(L), "loader chunks")
PY
    assert_success
    # the workers' chunks are in the trace only: no row of the table
    run grep -c '^load ' tr.txt
    assert_output 0
}

@test "--profile computes what an unprofiled run does: the same losses bit for bit" {
    run rn-train --data train.lmdb --in init.pb --out plain.pb $T --max-steps 4 --log-every 1 --log plain.jsonl
    assert_success
    run rn-train --data train.lmdb --in init.pb --out prof.pb $T --profile p.txt --profile-warmup 1 --profile-steps 3 --log-every 1 --log prof.jsonl
    assert_success
    # steps 2..4 profiled: their losses depend on the profiled forwards, backwards and steps
    run "$PYTHON" -c 'import json, sys; L = lambda p: [l["loss"] for l in map(json.loads, open(p)) if l["kind"] == "step"]; a, b = L("plain.jsonl"), L("prof.jsonl"); print(a, b); sys.exit(not (len(a) == 4 and a == b))'
    assert_success
}

@test "--profile with --accum 2: each layer twice per step, and the micro-batches' gradient add" {
    run rn-train --data train.lmdb --in init.pb --out prof.pb $T --accum 2 --profile acc.txt --profile-warmup 1 --profile-steps 2
    assert_success
    run cat acc.txt
    assert_line --regexp '^layer1\.0\.conv1 +forward +[0-9.]+ +[0-9.]+% +2 '
    assert_line --regexp '^grad-accumulate +backward +[0-9.]+ +[0-9.]+% +1 '
    assert_line --regexp '^sgd +step +[0-9.]+ +[0-9.]+% +1 '
}

@test "--profile: bad values refused (exit 2), an unwritable FILE refused before training" {
    for v in 0 -1 x 1.5; do
        run rn-train --data train.lmdb --in init.pb --out bad.pb --profile bad.txt --profile-steps $v
        assert_failure 2
        assert_output --partial "rn-train: --profile-steps: '$v'"
    done
    for v in -1 x; do
        run rn-train --data train.lmdb --in init.pb --out bad.pb --profile bad.txt --profile-warmup $v
        assert_failure 2
        assert_output --partial "rn-train: --profile-warmup: '$v'"
    done
    run rn-train --data train.lmdb --in init.pb --out bad.pb --profile -
    assert_failure 2
    assert_output --partial "--profile must be a file"
    run rn-train --data train.lmdb --in init.pb --out bad.pb --profile bad.txt --max-steps 3
    assert_failure 2
    assert_output --partial "drop --max-steps"
    run rn-train --data train.lmdb --in init.pb --out bad.pb $T --profile nodir/bad.txt
    assert_failure 1
    assert_output --partial "nodir/bad.txt"
    [ ! -e bad.pb ]
    [ ! -e bad.txt ]
}

@test "rn-eval --profile: one forward row per conv (BN folded in) and pool, the stages, a valid trace; no result printed" {
    run rn-eval --data train.lmdb --ckpt init.pb --batch 32 --crop 32 --threads 2 --workers 2 --profile ev.txt --profile-warmup 1 --profile-steps 2
    assert_success
    assert_line --regexp '^rn-eval: profiled 2 batches after 1 warm-up batches: [0-9.]+ ms per batch, [0-9.]+% of it in the rows; table in ev.txt, trace in ev.txt.json$'
    refute_output --partial "top1="
    run "$PYTHON" - <<'PY'
import collections, json, re
want = {("conv1", "forward"), ("maxpool", "forward"), ("avgpool", "forward"), ("fc", "forward")}
for l in range(1, 5):
    for b in range(2):
        want |= {(f"layer{l}.{b}.conv{i}", "forward") for i in (1, 2)}
    if l > 1:
        want.add((f"layer{l}.0.downsample.0", "forward"))
want |= {(s, "step") for s in ("data-wait", "input", "logits", "h2d-wait")}
rows = [l.split() for l in open("ev.txt") if not l.startswith("#")][1:]
got = [(r[0], r[1]) for r in rows]
assert sorted(got) == sorted(want), set(got) ^ want
m = re.search(r"rows sum to ([0-9.]+) ms per step; measured step ([0-9.]+) ms", open("ev.txt").read())
assert 0.95 * float(m[2]) <= float(m[1]) <= 1.001 * float(m[2]), m.group(0)
X = [e for e in json.load(open("ev.txt.json"))["traceEvents"] if e["ph"] == "X"]
count = collections.Counter((e["args"]["layer"], e["args"]["dir"]) for e in X)
assert set(count) == want, set(count) ^ want
assert all(c == (4 if k[0] == "input" else 2) for k, c in count.items()), count
PY
    assert_success
    for v in 0 x; do
        run rn-eval --data train.lmdb --ckpt init.pb --profile bad.txt --profile-steps $v
        assert_failure 2
        assert_output --partial "rn-eval: --profile-steps: '$v'"
    done
    run rn-eval --data train.lmdb --ckpt init.pb --profile -
    assert_failure 2
    assert_output --partial "--profile must be a file"
}

@test "--profile with 2 processes: rank 0 writes the profile, with the gradient sum as a row" {
    command -v mpirun >/dev/null || skip "mpirun not installed (make deps installs openmpi-bin)"
    rn-train --help | grep -q "This build: with Open MPI" || skip "this rn build has no MPI (USE_MPI=0)"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpi_no_leak_checks
    run mpirun --oversubscribe -np 2 rn-train --data train.lmdb --in init.pb --out dist.pb --batch 16 --crop 32 --workers 1 --threads 1 --profile dist.txt --profile-warmup 1 --profile-steps 2
    assert_success
    assert_output --partial "rn-train: profiled 2 steps after 1 warm-up steps"
    [ ! -e dist.pb ]
    run cat dist.txt
    assert_line --regexp '^grad-sum +step +[0-9.]+ +[0-9.]+% +1 '
    # the overlapped part of the sum: one call per parameter tensor (resnet18: 62)
    assert_line --regexp '^grad-sum-overlap +step +[0-9.]+ +[0-9.]+% +62 '
    assert_line --regexp '^layer4\.1\.conv2 +backward +[0-9.]+ +[0-9.]+% +1 '
}
