#!/usr/bin/env bash
# Runs every test: the C unit tests in $BUILD/tests, the fuzz harnesses' replay of
# tests/fuzz/seeds/ and tests/fuzz/regress/ (inputs that once crashed), the bats lint (tests/lint-bats.sh), then
# the bats files in tests/.
# Each unit test's and each bats file's seconds are printed after it, each bats test's
# milliseconds on its line (where CI time goes).
# Ends with one line "tests: N passed, N failed, N skipped" and exits non-zero on a failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac # relative to the source tree, or absolute
export RN_BIN="$BUILD/bin" RN_BUILD="$BUILD" PYTHON=${PYTHON:-/usr/bin/python3}
export PATH="$RN_BIN:$PATH"
# CUDA's runtime reserves the shadow gap ASan wants; harmless without sanitizers.
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=1}
passed=0 failed=0 skipped=0
failures=()
# The tests' temporary files go to a folder of this run's own (TMPDIR: bats, mktemp,
# Python's tempfile, Open MPI), checked at the end for what they left (CI's disk is
# small) and removed.
TMPROOT=$(mktemp -d "${TMPDIR:-/tmp}/rn-tests.XXXXXX") || exit 1
trap 'rm -rf "$TMPROOT"' EXIT
export TMPDIR=$TMPROOT

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    t0=$SECONDS
    if out=$("$t" 2>&1); then
        passed=$((passed + 1))
        echo "ok unit $(basename "$t"): $(tail -n 1 <<<"$out") ($((SECONDS - t0)) s)"
    else
        failed=$((failed + 1))
        failures+=("unit $(basename "$t")")
        echo "not ok unit $(basename "$t")"
        sed 's/^/  # /' <<<"$out" | tail -n 40
    fi
done

# every input a fuzzer once crashed on, and the committed seeds, through the harness that
# found it (built with tests/fuzz/replay.c; make fuzz finds new ones)
for t in "$BUILD"/tests/fuzzreplay_*; do
    [ -x "$t" ] || continue
    name=${t##*/fuzzreplay_}
    dirs=()
    for d in tests/fuzz/seeds/"$name" tests/fuzz/regress/"$name"; do [ -d "$d" ] && dirs+=("$d"); done
    [ ${#dirs[@]} -gt 0 ] || continue
    if out=$("$t" "${dirs[@]}" 2>&1); then
        passed=$((passed + 1))
        echo "ok fuzz replay $name: $(tail -n 1 <<<"$out" | sed 's/^.*: //')"
    else
        failed=$((failed + 1))
        failures+=("fuzz replay $name")
        echo "not ok fuzz replay $name"
        sed 's/^/  # /' <<<"$out" | tail -n 40
    fi
done

# a test too: no bats line may chain an assertion with && (only the last part would count)
if out=$(tests/lint-bats.sh tests/*.bats 2>&1); then
    passed=$((passed + 1))
    echo "ok lint tests/*.bats: one assertion per line, none chained by &&"
else
    failed=$((failed + 1))
    failures+=("lint tests/*.bats (&&-chained assertions)")
    echo "not ok lint tests/*.bats: assertions chained by && (bats fails a test only on the last command)"
    sed 's/^/  # /' <<<"$out"
fi

if command -v bats >/dev/null; then
    for f in tests/*.bats; do
        [ -f "$f" ] || continue
        t0=$SECONDS
        out=$(bats --tap --timing "$f" 2>&1) # --timing: each test's milliseconds
        echo "$out"
        echo "# $f: $((SECONDS - t0)) s"
        p=$(grep -c '^ok .*# skip' <<<"$out")
        skipped=$((skipped + p))
        passed=$((passed + $(grep '^ok ' <<<"$out" | grep -vc '# skip')))
        n=$(grep -c '^not ok ' <<<"$out")
        failed=$((failed + n))
        [ "$n" -gt 0 ] && failures+=("$f ($n)")
        # a bats file that could not even be parsed reports no test lines
        grep -qE '^(ok|not ok) ' <<<"$out" || { failed=$((failed + 1)); failures+=("$f (did not run)"); }
    done
else
    echo "bats is not installed: run 'make deps' as root" >&2
    failed=$((failed + 1))
fi

# a test's files belong in bats' folders or its own, removed after it: more than 10 MB
# left fails the run, named (the parity scripts once left 2.3 GB a run)
left=$(ls -A "$TMPROOT" 2>/dev/null | while IFS= read -r f; do du -sm "$TMPROOT/$f" 2>/dev/null; done | sort -rn)
left_mb=$(awk '{s += $1} END {print s + 0}' <<<"$left")
if [ "$left_mb" -gt 10 ]; then
    failed=$((failed + 1))
    failures+=("$left_mb MB left in TMPDIR")
    echo "not ok the tests left $left_mb MB in their TMPDIR:"
    head -n 10 <<<"$left" | sed 's/^/  # /'
else
    passed=$((passed + 1))
    echo "ok the tests left ${left_mb} MB in their TMPDIR (10 at most)"
fi

[ ${#failures[@]} -gt 0 ] && printf 'failed: %s\n' "${failures[@]}"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
