#!/bin/bash
# copy-cut.sh: the network path to the destination dies in the middle of
# a copy without a FIN or a reset (cutrelay.py stops relaying and keeps
# its sockets open), so no read or write on the socket ever fails.
# - without --retry: the copy fails with ETIMEDOUT, naming the silent
#   server and its oldest request, within --timeout (plus the watchdog's
#   0.2 s and a margin) of the cut: it does not hang;
# - with --retry: the watchdog's timeout counts as a lost connection; the
#   copy reconnects (through the relay, which relays new connections),
#   sends what was in flight again and lands whole, and --json counts the
#   reconnection; from buffers (the default over loopback TCP) and by
#   sendfile (--zero-copy).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need timeout coreutils
tmpdir_make

make_random "$TMP/src.img" 32
truncate -s 32M "$TMP/dst.img"
kit "$TMP/kit.sock" --filter=delay file "$TMP/dst.img" wdelay=100ms

relay_n=0
# relay_start: cutrelay.py in front of nbdkit; sets RELAY_PID and RURI.
relay_start () {
    relay_n=$((relay_n + 1))
    local pf=$TMP/relay.$relay_n.port
    python3 "$LIB_DIR/cutrelay.py" 0 "$TMP/kit.sock" "$pf" &
    RELAY_PID=$!
    SERVER_PIDS+=("$RELAY_PID")
    wait_for test -s "$pf"
    RURI=nbd://127.0.0.1:$(cat "$pf")/
}

# copy_and_cut ARGS...: starts a copy into the relay with ARGS, cuts the
# relay's connections once writes have completed, waits for the copy;
# sets rc and CUT_S (seconds from the cut to the copy's end).
copy_and_cut () {
    # Emptied here, not only by the redirection below: that one runs in
    # the background job, after the loop may already have read the last
    # case's progress lines and taken them for this copy's.
    : >"$TMP/err"
    timeout 60 "$NBDFLOW" copy --timeout 2 --progress=json --json \
        --request-size 256K --inflight 1M "$@" "$TMP/src.img" "$RURI" \
        >"$TMP/out" 2>"$TMP/err" &
    local pid=$! i t0 alive=exited
    # Up to 30 s: the sanitizers on a loaded machine are slow to start.
    for ((i = 0; i < 600; i++)); do
        grep -q '"done": [1-9]' "$TMP/err" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill -0 "$pid" 2>/dev/null && alive="still running"
    if ! grep -q '"done": [1-9]' "$TMP/err"; then
        # Leave what a failure needs to be understood (threads, sockets,
        # nbdkit's log).
        local cpid
        cpid=$(pgrep -P "$pid" | head -n 1) # under timeout(1)
        if [ -n "$cpid" ]; then
            note "copy $cpid: $(tr '\0' ' ' </proc/$cpid/cmdline 2>/dev/null)"
            ss -tnpi 2>/dev/null | grep -A1 "pid=$cpid," >&2 || true
            command -v gdb >/dev/null &&
                command timeout 20 gdb -p "$cpid" -batch \
                    -ex "thread apply all bt" >&2 2>&1 || true
        fi
        tail -n 20 "$TMP/kit.log" >&2 2>/dev/null || true
        fail "the copy never made progress ($alive): $(cat "$TMP/err")"
    fi
    kill -USR1 "$RELAY_PID"
    t0=$(date +%s.%N)
    rc=0
    wait "$pid" || rc=$?
    CUT_S=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
    [ "$rc" != 124 ] || fail "still running after 60 s (hung)"
    grep -v '^{' "$TMP/err" >"$TMP/err.lines" || true
}

# 1. No --retry: a clear ETIMEDOUT within the bound.
relay_start
copy_and_cut
mv "$TMP/err.lines" "$TMP/err"
check_copy_failed "cut without --retry" "$rc" "Connection timed out"
grep -qF "$RURI: no reply for 2 s" "$TMP/err" ||
    fail "the error does not name the silent server: $(cat "$TMP/err")"
awk -v s="$CUT_S" 'BEGIN { exit !(s < 6) }' ||
    fail "the dead path was noticed after $CUT_S s, not within 2 s + margin"
note "ok: dead path noticed $CUT_S s after the cut (--timeout 2)"

# 2. --retry: the copy reconnects and lands whole.
relay_start
copy_and_cut --retry 3,0.2
[ "$rc" = 0 ] || fail "cut with --retry: exit $rc: $(cat "$TMP/err.lines")"
grep -q '"reconnects": [1-9]' "$TMP/out" ||
    fail "cut with --retry: no reconnection counted: $(cat "$TMP/out")"
grep -q "reconnected" "$TMP/err.lines" ||
    fail "cut with --retry: no line says it reconnected: $(cat "$TMP/err.lines")"
same "$TMP/src.img" "$TMP/dst.img"
note "ok: cut with --retry: $(grep -o '"reconnects": [0-9]*, "bytes_resent": [0-9]*' "$TMP/out") after $CUT_S s"

# 3. The same on the sendfile path (over loopback TCP only with
# --zero-copy): payloads that had left from the file are sent again.
truncate -s 0 "$TMP/dst.img"; truncate -s 32M "$TMP/dst.img"
relay_start
copy_and_cut --retry 3,0.2 --zero-copy
[ "$rc" = 0 ] || fail "cut with --retry --zero-copy: exit $rc: $(cat "$TMP/err.lines")"
grep -q '"data_path": "sendfile"' "$TMP/out" ||
    fail "--zero-copy did not take the sendfile path: $(cat "$TMP/out")"
grep -q '"reconnects": [1-9]' "$TMP/out" ||
    fail "cut with --retry --zero-copy: no reconnection counted: $(cat "$TMP/out")"
same "$TMP/src.img" "$TMP/dst.img"
note "ok: cut with --retry --zero-copy (sendfile): $(grep -o '"reconnects": [0-9]*, "bytes_resent": [0-9]*' "$TMP/out")"
echo "PASS"
