#!/bin/bash
# copy-retry.sh: --retry N[,DELAY] against servers that die in the middle
# of a copy and come back.
# - the destination (nbdkit, and our own server over TCP) killed with
#   SIGKILL and restarted: the copy reconnects, sends what was in flight
#   again, and lands whole (--verify, then cmp); --json counts the
#   reconnection and the bytes sent twice;
# - a destination that loses acknowledged but unflushed writes with the
#   kill (a writeback cache): the copy writes them again;
# - the source killed and restarted: the same, reading;
# - a source that comes back with other content, or a destination of
#   another size: the copy stops, saying it is not the same disk;
# - a server that never comes back: the copy fails after N attempts,
#   within the documented waits, with one error line;
# - an error reply (EIO) is not a lost connection: no reconnection, the
#   copy fails as without --retry.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need timeout coreutils
tmpdir_make

make_random "$TMP/src.img" 16

# kit_at SOCK ARGS...: (re)starts nbdkit on SOCK, as kit does.
kit_at () {
    rm -f "$1"
    kit "$@"
}

# kit_kill: SIGKILL to the last nbdkit.
kit_kill () {
    kill -KILL "$KIT_PID"
    wait "$KIT_PID" 2>/dev/null || true
    forget_pid "$KIT_PID"
}

# start_copy ARGS...: a copy with --progress=json in the background
# (COPY_PID), its report in $TMP/out and its lines in $TMP/err; returns
# once a write or read has completed.
start_copy () {
    : >"$TMP/err" # not the last copy's lines: the redirection below is late
    timeout 60 "$NBDFLOW" copy --progress=json --json --request-size 256K \
        --inflight 1M "$@" >"$TMP/out" 2>"$TMP/err" &
    COPY_PID=$!
    local i
    for ((i = 0; i < 200; i++)); do
        grep -q '"done": [1-9]' "$TMP/err" && return 0
        kill -0 "$COPY_PID" 2>/dev/null || break
        sleep 0.05
    done
    fail "the copy never made progress: $(cat "$TMP/err")"
}

# end_copy: waits for the copy; rc is its status, $TMP/err its lines but
# the progress.
end_copy () {
    rc=0
    wait "$COPY_PID" || rc=$?
    [ "$rc" != 124 ] || fail "copy still running after 60 s (hung)"
    grep -v '^{' "$TMP/err" >"$TMP/err.lines" || true
    mv "$TMP/err.lines" "$TMP/err"
}

# counts_add_up NAME: the report's copied, zeroed and skipped bytes make
# its total (after a rewind, replays are counted once, and none is lost).
counts_add_up () {
    python3 - "$TMP/out" "$1" <<'PY' || fail "$1: the report's counts do not add up: $(cat "$TMP/out")"
import json, sys
d = json.load(open(sys.argv[1]))
n = d["bytes_copied"] + d["bytes_zeroed"] + d["bytes_skipped"]
sys.exit(0 if n == d["bytes_total"] else 1)
PY
}

# expect_resumed NAME: the copy succeeded after at least one reconnection.
expect_resumed () {
    [ "$rc" = 0 ] || fail "$1: exit $rc: $(cat "$TMP/err")"
    counts_add_up "$1"
    grep -q '"reconnects": [1-9]' "$TMP/out" ||
        fail "$1: no reconnection counted: $(cat "$TMP/out")"
    grep -q '"verified": true' "$TMP/out" || fail "$1: not verified"
    note "ok: $1: $(grep -o '"reconnects": [0-9]*, "bytes_resent": [0-9]*' "$TMP/out")"
}

# 1. nbdkit as destination, killed and restarted on the same socket.
truncate -s 16M "$TMP/dst.img"
dsock=$TMP/dst.sock
kit_at "$dsock" --filter=delay file "$TMP/dst.img" wdelay=100ms
start_copy --retry 5,0.3 --verify "$TMP/src.img" "$(uri "$dsock")"
kit_kill
sleep 0.5
kit_at "$dsock" --filter=delay file "$TMP/dst.img" wdelay=100ms
end_copy
expect_resumed "nbdkit destination killed and restarted"
same "$TMP/src.img" "$TMP/dst.img"
grep -q "connection lost" "$TMP/err" ||
    fail "no line says the connection was lost: $(cat "$TMP/err")"
kit_kill

# 1b. The same, but the destination holds acknowledged writes in a cache
# until a FLUSH (nbdkit's cache filter, writeback), as NBD allows: the
# kill loses them. The copy must write them again, not count them as
# landed (no --verify here: only the final cmp can tell).
rm -f "$TMP/dst.img"
truncate -s 16M "$TMP/dst.img"
# Writes of 250 ms: the copy lasts seconds, so the kill lands inside it
# even on a loaded machine.
kit_at "$dsock" --filter=delay --filter=cache file "$TMP/dst.img" \
    wdelay=250ms cache=writeback
start_copy --retry 5,0.3 "$TMP/src.img" "$(uri "$dsock")"
kit_kill
sleep 0.5
kit_at "$dsock" --filter=delay --filter=cache file "$TMP/dst.img" \
    wdelay=250ms cache=writeback
end_copy
[ "$rc" = 0 ] || fail "a destination that lost its cache: exit $rc: $(cat "$TMP/err")"
counts_add_up "a destination that lost its cache"
grep -q "acknowledged on the lost connection but not flushed: writing them again" \
    "$TMP/err" || fail "no line says the unflushed writes go again: $(cat "$TMP/err")"
same "$TMP/src.img" "$TMP/dst.img"
kit_kill

# 1c. A rewind from inside a long hole: the checkpoint's mark lies in it
# (on the 4 MiB grid), while the first run's zero pieces were cut from the
# hole's start, 1 MiB off that grid, so a replayed piece would run past
# where the first run stopped. The bytes past that point are new: they
# must be counted and hashed (--verify), not taken for replays.
make_sparse "$TMP/hole.img" 1000 "0:5 999:1"
rm -f "$TMP/dst.img" "$TMP/j1c"
truncate -s 1000M "$TMP/dst.img"
kit_at "$dsock" --filter=delay file "$TMP/dst.img" delay-zero=1 \
    delay-write=20ms
start_copy --retry 5,0.3 --checkpoint "$TMP/j1c" --checkpoint-interval 1 \
    --max-requests 4 --verify "$TMP/hole.img" "$(uri "$dsock")"
for ((i = 0; i < 300; i++)); do # until the journal's mark is in the hole
    d=$(sed -n 's/^done \([0-9]*\)$/\1/p' "$TMP/j1c" 2>/dev/null || true)
    [ -n "$d" ] && [ "$d" -gt $((5 << 20)) ] && break
    kill -0 "$COPY_PID" 2>/dev/null || break
    sleep 0.05
done
[ -n "$d" ] && [ "$d" -gt $((5 << 20)) ] ||
    fail "no checkpoint inside the hole: $(cat "$TMP/err")"
kit_kill
sleep 0.3
kit_at "$dsock" --filter=delay file "$TMP/dst.img" delay-zero=1 \
    delay-write=20ms
end_copy
expect_resumed "a rewind from inside a hole"
grep -q "writing them again" "$TMP/err" ||
    fail "a rewind from inside a hole: no rewind: $(cat "$TMP/err")"
same "$TMP/hole.img" "$TMP/dst.img"
kit_kill
rm -f "$TMP/hole.img" "$TMP/dst.img"

# 2. Our own server as destination over TCP, the source slow, the server
# killed and started again on the same port.
ssock=$TMP/src.sock
kit_at "$ssock" --filter=delay file "$TMP/src.img" rdelay=100ms
rm -f "$TMP/dst.img"
truncate -s 16M "$TMP/dst.img"
serve_tcp "$TMP/dst.img"
start_copy --retry 5,0.3 --verify "$(uri "$ssock")" "$URI/"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
forget_pid "$SERVER_PID"
sleep 0.5
serve_start --listen "127.0.0.1:$PORT" "$TMP/dst.img"
end_copy
expect_resumed "our server as destination killed and restarted"
same "$TMP/src.img" "$TMP/dst.img"
serve_stop

# 3. The source killed and restarted: reads are simply redone.
rm -f "$TMP/dst.img"
start_copy --retry 5,0.3 --verify "$(uri "$ssock")" "$TMP/dst.img"
kit_kill
sleep 0.5
kit_at "$ssock" --filter=delay file "$TMP/src.img" rdelay=100ms
end_copy
expect_resumed "source killed and restarted"
same "$TMP/src.img" "$TMP/dst.img"
kit_kill

# 4. The source comes back with other content of the same size.
make_random "$TMP/other.img" 16
kit_at "$ssock" --filter=delay file "$TMP/src.img" rdelay=100ms
start_copy --retry 5,0.3 "$(uri "$ssock")" "$TMP/dst.img"
kit_kill
kit_at "$ssock" --filter=delay file "$TMP/other.img" rdelay=100ms
end_copy
check_copy_failed "source back with other content" "$rc" \
    "not the same disk"
grep -q "content differs" "$TMP/err" ||
    fail "the error does not say the content differs: $(cat "$TMP/err")"
kit_kill

# 5. The destination comes back with another size.
truncate -s 16M "$TMP/dst.img"
truncate -s 32M "$TMP/big.img"
kit_at "$dsock" --filter=delay file "$TMP/dst.img" wdelay=100ms
start_copy --retry 5,0.3 "$TMP/src.img" "$(uri "$dsock")"
kit_kill
kit_at "$dsock" --filter=delay file "$TMP/big.img" wdelay=100ms
end_copy
check_copy_failed "destination back with another size" "$rc" \
    "its size is 33554432 bytes, was 16777216: not the same disk"
kit_kill

# 6. A server that never comes back: 3 attempts, 0.2 + 0.4 + 0.8 s apart.
kit_at "$dsock" --filter=delay file "$TMP/dst.img" wdelay=100ms
start_copy --retry 3,0.2 "$TMP/src.img" "$(uri "$dsock")"
kit_kill
t0=$(date +%s)
end_copy
t=$(( $(date +%s) - t0 ))
check_copy_failed "server gone for good" "$rc" \
    "gave up after 3 reconnection attempts"
[ "$t" -le 10 ] || fail "server gone for good: gave up after $t s"
[ "$(grep -c 'reconnection attempt' "$TMP/err")" -ge 2 ] ||
    fail "server gone for good: failed attempts not reported: $(cat "$TMP/err")"

# 7. An error reply is not a lost connection.
kit_at "$TMP/eio.sock" --filter=error memory 16M error=EIO \
    error-pwrite-rate=100%
rc=0
"$NBDFLOW" copy --retry 5,0.2 --json "$TMP/src.img" \
    "$(uri "$TMP/eio.sock")" >"$TMP/out" 2>"$TMP/err" || rc=$?
check_copy_failed "EIO with --retry" "$rc" "Input/output error"
! grep -q "reconnect" "$TMP/err" || fail "EIO with --retry: reconnected"

# Bad values are refused with a usage error.
for bad in 0 x 3,x 3,-1 1001 "3,"; do
    rc=0
    "$NBDFLOW" copy --retry "$bad" "$TMP/src.img" null: 2>"$TMP/err" ||
        rc=$?
    [ "$rc" = 2 ] || fail "--retry $bad: exit $rc"
    grep -q -- "--retry: N\[,DELAY\]" "$TMP/err" ||
        fail "--retry $bad: $(cat "$TMP/err")"
done
note "ok: bad --retry values refused"
echo "PASS"
