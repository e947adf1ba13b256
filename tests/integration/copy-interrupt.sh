#!/bin/bash
# SIGINT or SIGTERM during a copy or a sum: it stops within a second or
# two even when the server is stuck (the requests in flight are
# abandoned), says how far it got in one line, and exits with 128 + the
# signal, as a shell reports it. It never reports success.
. "$(dirname "$0")/lib.sh"
need nbdkit
tmpdir_make

# Every read takes 30 s: the copy is stuck in flight when the signal comes.
kit "$TMP/slow.sock" --filter=delay pattern 64M delay-read=30
src=$(uri "$TMP/slow.sock")

# run_interrupted SIG WANT_RC ARGS...: nbdflow ARGS gets SIG after 1 s.
run_interrupted () {
    local sig=$1 want_rc=$2 rc=0 t0 t1
    shift 2
    t0=$(date +%s)
    timeout --preserve-status -s "$sig" -k 20 1 "$NBDFLOW" "$@" \
        >"$TMP/out" 2>"$TMP/err" || rc=$?
    t1=$(date +%s)
    [ "$rc" = "$want_rc" ] ||
        fail "$* after SIG$sig: exit $rc, not $want_rc: $(cat "$TMP/err")"
    [ $((t1 - t0)) -le 10 ] || fail "$*: took $((t1 - t0)) s to stop"
    grep -q "interrupted by SIG$sig after [0-9]* of $((64 << 20)) bytes" \
        "$TMP/err" || fail "$* after SIG$sig: $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$*: $(cat "$TMP/err")"
    note "ok: $* after SIG$sig: $(cat "$TMP/err")"
}

run_interrupted INT 130 copy "$src" "$TMP/out.img"
grep -q "the destination is incomplete" "$TMP/err" ||
    fail "copy: the incomplete destination is not named: $(cat "$TMP/err")"
run_interrupted TERM 143 copy --json "$src" "$TMP/out.img"
[ ! -s "$TMP/out" ] || fail "an interrupted copy printed a report"
run_interrupted INT 130 sum "$src"
[ ! -s "$TMP/out" ] || fail "an interrupted sum printed a digest"
echo "PASS"
