#!/usr/bin/env bats
# man/rn-*.1: one page per tool, every long flag of --help in it, rendered by man without
# warnings.
load helper

MAN="$BATS_TEST_DIRNAME/../man"

tools() { for t in "$RN_BIN"/rn-*; do [ -x "$t" ] && basename "$t"; done; }

render() { MANWIDTH=200 man -E ascii -l -P cat "$1"; }

setup() {
    command -v man > /dev/null || skip "man is not installed (Debian: man-db)"
}

@test "every tool has a man page and every page a tool" {
    [ -n "$(tools)" ]
    for t in $(tools); do [ -f "$MAN/$t.1" ] || { echo "no man page for $t"; return 1; }; done
    for p in "$MAN"/rn-*.1; do t=$(basename "$p" .1); [ -x "$RN_BIN/$t" ] || { echo "$p: no tool $t"; return 1; }; done
}

@test "every long flag in a tool's --help appears in its man page" {
    missing=
    for t in $(tools); do
        text=$(render "$MAN/$t.1")
        for f in $("$RN_BIN/$t" --help 2>&1 | grep -o -- '--[a-z][a-z0-9-]*' | sort -u); do
            grep -qE -- "$f([^a-z0-9-]|$)" <<<"$text" || missing="$missing $t:$f"
        done
    done
    [ -z "$missing" ] || { echo "not in the man pages:$missing"; return 1; }
}

@test "the man pages render with man -l, without warnings, with the usual sections" {
    for p in "$MAN"/rn-*.1; do
        t=$(basename "$p" .1)
        run bash -c "MANWIDTH=80 man --warnings -E UTF-8 -l -P cat '$p' 2>&1 >/dev/null"
        assert_success
        assert_output ""
        run render "$p"
        assert_success
        for s in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" "SEE ALSO"; do
            grep -qx "$s" <<<"$output" || { echo "$p: no $s section"; return 1; }
        done
        assert_output --partial "$t - "
    done
}

@test "man/man.mk installs the man pages and the pipeline fragments" {
    cd "$BATS_TEST_DIRNAME/.."
    run make -f man/man.mk install-man install-pipelines DESTDIR="$BATS_TEST_TMPDIR/root" PREFIX=/usr/local
    assert_success
    for p in man/rn-*.1; do cmp "$p" "$BATS_TEST_TMPDIR/root/usr/local/share/man/man1/$(basename "$p")"; done
    for f in common prep train eval plot; do [ -f "$BATS_TEST_TMPDIR/root/usr/local/share/rn/pipelines/$f.mk" ]; done
    run env MANPATH="$BATS_TEST_TMPDIR/root/usr/local/share/man" man -P cat rn-train
    assert_success
    assert_output --partial "rn-train - train a ResNet checkpoint"
}
