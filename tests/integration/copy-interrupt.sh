#!/bin/bash
# SIGINT or SIGTERM during a copy or a sum: it stops within a second or
# two even when the server is stuck (the requests in flight are
# abandoned) or a local read blocks (a pipe nobody writes), says how far
# it got in one line, and dies by the signal (a shell reports 128 + the
# signal; copy-signals.sh tells the death from an exit). It never reports
# success. A SIGINT ignored from the start (a script's background job)
# stays ignored.
. "$(dirname "$0")/lib.sh"
need nbdkit
tmpdir_make

# Every read takes 30 s: the copy is stuck in flight when the signal
# comes. The log filter, outside the delay, shows when reads have gone out.
kit "$TMP/slow.sock" --filter=log --filter=delay pattern 64M delay-read=30 \
    logfile="$TMP/reads.log"
src=$(uri "$TMP/slow.sock")
reads () { grep -c " Read id=" "$TMP/reads.log" 2>/dev/null || true; }

# start ARGS...: nbdflow ARGS in the background with SIGINT at its default
# (a script's background job would ignore it); sets PID.
start () {
    ( trap - INT; exec "$NBDFLOW" "$@" >"$TMP/out" 2>"$TMP/err" ) &
    PID=$!
}

# stopped_by SIG WANT_RC WANT WHAT: sends SIG to PID, which must exit
# within 10 s with WANT_RC and one line on stderr containing WANT.
stopped_by () {
    local sig=$1 want_rc=$2 want=$3 what=$4 i rc=0
    kill -s "$sig" "$PID"
    for ((i = 0; i < 100; i++)); do
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$PID" 2>/dev/null; then
        kill -KILL "$PID"
        fail "$what: still running 10 s after SIG$sig"
    fi
    wait "$PID" || rc=$?
    [ "$rc" = "$want_rc" ] ||
        fail "$what after SIG$sig: exit $rc, not $want_rc: $(cat "$TMP/err")"
    grep -qF "$want" "$TMP/err" || fail "$what after SIG$sig: $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$what: $(cat "$TMP/err")"
    note "ok: $what after SIG$sig: $(cat "$TMP/err")"
}

# in_flight N: waits until reads beyond the N already logged have gone out.
more_reads () { [ "$(reads)" -gt "$1" ]; }
in_flight () { wait_for more_reads "$1"; }

n=$(reads); start copy "$src" "$TMP/out.img"; in_flight "$n"
stopped_by INT 130 "interrupted by SIGINT after 0 of $((64 << 20)) bytes: the destination is incomplete" \
    "copy from a stuck server"
n=$(reads); start copy --json "$src" "$TMP/out.img"; in_flight "$n"
stopped_by TERM 143 "interrupted by SIGTERM after 0 of $((64 << 20)) bytes" \
    "copy --json from a stuck server"
[ ! -s "$TMP/out" ] || fail "an interrupted copy printed a report"
n=$(reads); start sum "$src"; in_flight "$n"
stopped_by INT 130 "interrupted by SIGINT after 0 of $((64 << 20)) bytes" \
    "sum of a stuck server"
[ ! -s "$TMP/out" ] || fail "an interrupted sum printed a digest"
grep -q "destination" "$TMP/err" && fail "sum spoke of a destination"

# A pipe nobody writes: the read blocks in a worker, and cannot be
# abandoned; the process still ends about a second after the signal.
mkfifo "$TMP/fifo"
sleep 60 >"$TMP/fifo" &
writer=$!
on_exit "kill $writer 2>/dev/null"
( trap - INT; exec "$NBDFLOW" copy - null: <"$TMP/fifo" >"$TMP/out" 2>"$TMP/err" ) &
PID=$!
wait_for in_pipe_read "$PID"
stopped_by TERM 143 "interrupted by SIGTERM after 0 bytes" \
    "copy from a silent pipe"

# Ignored from the start, SIGINT stays ignored; SIGTERM still works.
n=$(reads)
"$NBDFLOW" copy "$src" null: >"$TMP/out" 2>"$TMP/err" &
PID=$!
in_flight "$n"
kill -INT "$PID"
sleep 1
kill -0 "$PID" 2>/dev/null || fail "an ignored SIGINT stopped the copy"
stopped_by TERM 143 "interrupted by SIGTERM" "copy after an ignored SIGINT"
echo "PASS"
