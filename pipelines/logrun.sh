#!/bin/sh
# logrun.sh LOG [-o FILE] COMMAND [ARG...]: append the command line (quoted for the shell)
# and the time to LOG, then run it; with -o, its stdout goes to FILE.tmp, renamed to FILE
# when the command succeeds. The pipelines keep LOG as the run's commands.sh.
set -u
log=$1
shift
out=
if [ "${1-}" = -o ]; then out=$2; shift 2; fi
line=
for a in "$@"; do
    case $a in
    '' | *[!A-Za-z0-9_./:=,+@%^-]*) a="'$(printf '%s' "$a" | sed "s/'/'\\\\''/g")'" ;;
    esac
    line="$line${line:+ }$a"
done
[ -n "$out" ] && line="$line > $out"
mkdir -p "$(dirname "$log")"
printf '%s  # %s\n' "$line" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$log"
if [ -z "$out" ]; then exec "$@"; fi
"$@" > "$out.tmp" || { rc=$?; rm -f "$out.tmp"; exit $rc; }
mv -f "$out.tmp" "$out"
