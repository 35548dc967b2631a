#!/usr/bin/env bash
# Finds bats lines whose first check can never fail: bats fails a test only on the last
# command of `a && b`, so `[ "$x" -ge 2 ] && [ "$x" -lt 400 ]` never enforces its first
# test. A line that starts with a test command ([ ], [[ ]] or test) chained by && is
# reported, unless what follows is control flow or a message (`&& skip`, `&& return`,
# `&& continue`, `&& break`, `&& echo`). Write one assertion per line instead.
# Usage: tests/lint-bats.sh FILE.bats...; prints FILE:LINE: TEXT per finding, exits 1 if any.
set -u
# (the && of a line's own [[ a && b ]] is one condition, which fails as a whole: fine)
found=$(grep -nHE '^[[:space:]]*(\[\[? .*\]\]?|test [^|&]*)[[:space:]]+&&([[:space:]]|$)' "$@" |
    grep -vE '&&[[:space:]]*(skip|return|continue|break|echo)([[:space:]]|$)')
[ -z "$found" ] && exit 0
echo "$found"
echo "one assertion per line: bats fails a test only on the last command of 'a && b'" >&2
exit 1
