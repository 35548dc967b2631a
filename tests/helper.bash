# Shared set-up for the bats files: bats-support/bats-assert, a scratch dir, the tools.
bats_load_library bats-support
bats_load_library bats-assert

RN_BIN=${RN_BIN:-$BATS_TEST_DIRNAME/../build/bin}
PATH="$RN_BIN:$PATH"
PYTHON=${PYTHON:-/usr/bin/python3}

# torch and torchvision import (2 s): asked once per bats run, the answer kept in its tmpdir
have_torch() {
    local f="${BATS_RUN_TMPDIR:?}/have_torch"
    [ -f "$f" ] || { "$PYTHON" -c 'import torch, torchvision' 2>/dev/null && echo yes > "$f" || echo no > "$f"; }
    [ "$(cat "$f")" = yes ]
}

# xor one byte of a file at an offset, in place
flip_byte() {
    "$PYTHON" - "$1" "$2" <<'PY'
import sys
p, off = sys.argv[1], int(sys.argv[2])
with open(p, "r+b") as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x5A]))
PY
}

# In the current folder: src/ (toy.py: two classes of N generated images each), train.lmdb
# from it, and init.pb (resnet18, 2 classes, seed 1).
toy_setup() {
    "$PYTHON" "$BATS_TEST_DIRNAME/data/toy.py" src "$1" 1
    rn-prep -q src train.lmdb
    rn-init --arch resnet18 --classes 2 --seed 1 -o init.pb
}

# Before running rn's tools under mpirun: Open MPI's components are dlopen'ed and unloaded
# at MPI_Finalize with their allocations held (about 120 KB in 3,300 blocks, reported from
# "<unknown module>", so no suppression can name them). Sanitizer builds (RN_SANITIZE)
# then check memory errors, not leaks.
mpi_no_leak_checks() {
    [ -z "${RN_SANITIZE:-}" ] || export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
}

# The sanitizer build (make test SANITIZE=1, RN_SANITIZE) checks memory and undefined
# behaviour, which one run of a code path shows. A test that only runs paths the file's
# other tests already run, again and again to compare the bytes (threads, ranks, resume,
# kill points) or against a Python reference, is the plain build's: there it skips, so
# that CI's two halves fit its time.
plain_build_only() {
    [ -z "${RN_SANITIZE:-}" ] || skip "${1:-repeats code paths other tests run} under the sanitizers: the plain build runs it"
}

# The scratch folder of a bats file whose tests share setup_file's fixtures: setup() calls
# in_file_dir, teardown() drop_test_outputs. The first test's set-up lists what is there
# (setup_file's fixtures, kept for the whole file); after each test everything else goes,
# so a file's disk use is its fixtures plus one test's outputs, not every test's (some
# hundred MB each: resnet18 checkpoints with momentum), and no test can lean on another's.
in_file_dir() {
    cd "$BATS_FILE_TMPDIR" || return 1
    [ -f .fixtures ] || ls -A > .fixtures
}
drop_test_outputs() {
    local f
    cd "$BATS_FILE_TMPDIR" && [ -f .fixtures ] || return 0
    ls -A | grep -vxF -f .fixtures | while IFS= read -r f; do rm -rf -- "$f"; done
    return 0
}
