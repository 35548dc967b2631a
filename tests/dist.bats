#!/usr/bin/env bats
# rn-eval over many processes (mpirun): every rank forwards its own slice of the records,
# rank 0 counts them in dataset order, so the output and the logits dump are the same
# bytes for 1, 2, 3 and 4 ranks, whatever the dataset size and however many ranks a batch
# leaves with nothing; a rank that fails stops every rank.
#
# Skips: the tests need mpirun and a build with MPI: rn-eval linked against libmpi (ldd).
# The last test checks the refusal of a build without MPI started as one of two
# processes, and so runs only there.
#
# Under SANITIZE=1 the ranks that mpirun starts run without LeakSanitizer (AddressSanitizer
# stays on): Open MPI 4.1 leaves some 120 kB from MPI_Init unfreed, allocated in its
# components, which MPI_Finalize dlcloses, so LeakSanitizer reports their frames as
# "<unknown module>" and no suppression by library name can match them (tried:
# leak:libmpi.so and the rest, with OMPI_MCA_/PMIX_MCA_mca_base_component_disable_dlclose=1).
# The same rn code runs single-process, with leak checks, in this file and train.bats.
load helper

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# mpi N CMD...: CMD on N ranks of this machine (more ranks than cores allowed, unbound),
# without leak checks (above)
mpi() {
    local n=$1
    shift
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        timeout 120 mpirun -np "$n" --oversubscribe --bind-to none "$@"
}

# "mpi", "nompi" (a build without MPI) or "nompirun"
mpi_state() {
    if ! ldd "$RN_BIN/rn-eval" 2>/dev/null | grep -q libmpi; then echo nompi
    elif ! command -v mpirun >/dev/null; then echo nompirun
    else echo mpi; fi
}

setup_file() {
    cd "$BATS_FILE_TMPDIR"
    [ "$(mpi_state)" = mpi ] || return 0
    # 22 records: not a multiple of 3 or 4 ranks
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src 11 1
    rn-prep -q src val.lmdb
    rn-init --arch resnet18 --classes 2 --seed 1 -o init.pb
}

setup() { in_file_dir; }
teardown() { drop_test_outputs; }

need_mpi() {
    case $(mpi_state) in
        nompi) skip "this rn build has no MPI (USE_MPI=0)" ;;
        nompirun) skip "mpirun not found (make deps installs Open MPI)" ;;
    esac
}

# eval NAME RANKS BATCH [flags]: rn-eval of init.pb on val.lmdb, stdout to NAME.out, the
# logits to NAME.st, the confusion matrix to NAME.csv
eval_on() {
    local name=$1 ranks=$2 batch=$3
    shift 3
    local cmd=(rn-eval --data val.lmdb --ckpt init.pb --crop 32 --workers 2 --batch "$batch"
        --dump-logits "$name.st" --confusion "$name.csv" "$@")
    if [ "$ranks" = 1 ]; then "${cmd[@]}" > "$name.out"; else mpi "$ranks" "${cmd[@]}" > "$name.out"; fi
}

@test "1, 2 and 3 ranks: the same text, per-class lines, confusion matrix and logits (batch 4: a rank gets nothing)" {
    need_mpi
    # 3 ranks take 12 records a step: the last step's 10 are runs of 4, 4 and 2
    # records; batch 4 of 22 records over 2 ranks ends on runs of 4 and 2
    eval_on one 1 4 --per-class
    assert_equal "$(grep -c '^class ' one.out)" 2
    assert_equal "$(head -1 one.out | sed 's/.* n=//')" 22
    for w in 2 3; do
        eval_on w$w $w 4 --per-class
        run cmp one.out w$w.out
        assert_success
        run cmp one.st w$w.st
        assert_success
        run cmp one.csv w$w.csv
        assert_success
    done
}

@test "1 to 4 ranks: the same JSON (full-precision loss) and logits at batch 1, 3 and 8" {
    plain_build_only "1 to 4 ranks at 3 batch sizes"
    need_mpi
    # batch 1: every step leaves all ranks but one empty; batch 3 (22 = 7*3 + 1): a
    # short last run; batch 8 on 4 ranks: one step of 22, rank 0 empty
    for b in 1 3 8; do
        eval_on j$b-1 1 $b --json --per-class
        for w in 2 3 4; do
            eval_on j$b-$w $w $b --json --per-class
            run cmp j$b-1.out j$b-$w.out
            assert_success
            run cmp j$b-1.st j$b-$w.st
            assert_success
        done
    done
    run "$PYTHON" -c 'import json; d = json.load(open("j8-4.out")); assert d["n"] == 22, d; print(d)'
    assert_success
}

@test "only rank 0 prints and writes; an error on one rank stops every rank, each saying which" {
    need_mpi
    run mpi 3 rn-eval --data val.lmdb --ckpt init.pb --crop 32
    assert_success
    assert_equal "$(grep -c '^top1=' <<<"$output")" 1
    mkdir -p adir
    # rank 0 alone cannot write the dump: the others stop with it instead of waiting
    run mpi 2 rn-eval --data val.lmdb --ckpt init.pb --crop 32 --dump-logits adir
    assert_failure
    assert_output --partial "rank 0: rn-eval: adir"
    assert_output --partial "rank 1: rn-eval: starting: rank 0 failed"
    refute_output --partial "top1="
    run mpi 2 rn-eval --data val.lmdb --ckpt nothere.pb --crop 32
    assert_failure
    assert_output --partial "rank 0: rn-eval: nothere.pb"
    assert_output --partial "rank 1: rn-eval: nothere.pb"
    run mpi 2 rn-eval --data val.lmdb --ckpt - --crop 32
    assert_failure 2
    assert_output --partial "under mpirun only rank 0 reads stdin"
}

@test "a build without MPI refuses to run as one of many processes" {
    [ "$(mpi_state)" = nompi ] || skip "this build has MPI"
    OMPI_COMM_WORLD_SIZE=2 run rn-eval --data none.lmdb --ckpt none.pb
    assert_failure 1
    assert_output --partial "this build has no MPI (USE_MPI=0)"
}
