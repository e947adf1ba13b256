#!/bin/bash
# copy-timeout.sh: a server that stops answering must not hang copy or
# sum. With --timeout T, an NBD endpoint that answers none of its requests
# in flight for T seconds fails the run with one line naming it, the
# oldest request's offset and length, and ETIMEDOUT; a slow server that
# keeps answering is no failure. Every command runs under timeout(1), so a
# hang fails the test instead of blocking it. The same --timeout bounds
# connecting to a server that never accepts, and extra connects stuck in
# a full queue do not hold up a copy that is done.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need timeout coreutils
tmpdir_make

make_random "$TMP/src.img" 16

# expect_timeout NAME ENDPOINT: the command that wrote $TMP/out, $TMP/err
# and exited $rc stopped on the watchdog, naming ENDPOINT.
expect_timeout () {
    local name=$1 ep=$2
    [ "$rc" != 124 ] || fail "$name: still running after 60 s (hung)"
    ! grep -q Sanitizer "$TMP/err" ||
        fail "$name: sanitizer report: $(cat "$TMP/err")"
    check_copy_failed "$name" "$rc" "timed out"
    grep -qF "$ep: no reply for" "$TMP/err" ||
        fail "$name: the error does not name $ep: $(cat "$TMP/err")"
}

# kit_stop: kills the last nbdkit (it may have died of the abandoned
# connections already) and drops it from the cleanup list.
kit_stop () {
    kill -KILL "$KIT_PID" 2>/dev/null || true
    wait "$KIT_PID" 2>/dev/null || true
    forget_pid "$KIT_PID"
}

# (a) Our own server, stopped (SIGSTOP) in the middle of a copy. A slow
# source keeps the copy going; once writes have completed at the server,
# it is stopped and its requests in flight get no reply.
kit "$TMP/slowsrc.sock" --filter=delay pattern 64M rdelay=200ms
serve_tcp memory:64M
stopped_pid=$SERVER_PID
timeout 60 "$NBDFLOW" copy --timeout 2 --progress=json --request-size 256K \
    --inflight 1M "$(uri "$TMP/slowsrc.sock")" "$URI/" \
    >"$TMP/out" 2>"$TMP/err" &
copy_pid=$!
for ((i = 0; i < 200; i++)); do
    grep -q '"done": [1-9]' "$TMP/err" && break
    kill -0 "$copy_pid" 2>/dev/null || break
    sleep 0.1
done
grep -q '"done": [1-9]' "$TMP/err" ||
    fail "server stop: the copy never made progress: $(cat "$TMP/err")"
kill -STOP "$stopped_pid"
on_exit "kill -CONT $stopped_pid 2>/dev/null"
rc=0
wait "$copy_pid" || rc=$?
kill -CONT "$stopped_pid"
expect_timeout "server stopped mid-copy" "$URI/"
serve_stop "$stopped_pid"
forget_pid "$stopped_pid"
kit_stop

# (b) nbdkit delaying every write longer than the timeout.
kit "$TMP/stuck.sock" --filter=delay memory 16M delay-write=20
rc=0
timeout 60 "$NBDFLOW" copy --timeout 2 "$TMP/src.img" \
    "$(uri "$TMP/stuck.sock")" >"$TMP/out" 2>"$TMP/err" || rc=$?
expect_timeout "writes slower than the timeout" "$(uri "$TMP/stuck.sock")"
kit_stop

# sum reads through the same engine: reads slower than its timeout.
kit "$TMP/stuckrd.sock" --filter=delay pattern 16M delay-read=20
rc=0
timeout 60 "$NBDFLOW" sum --timeout 2 "$(uri "$TMP/stuckrd.sock")" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
expect_timeout "sum: reads slower than the timeout" \
    "$(uri "$TMP/stuckrd.sock")"
kit_stop

# (c) Slow but answering: 100 ms per write, one request at a time, so
# the whole copy (64 writes) takes longer than the timeout while no
# single request comes near it. It must complete, exactly.
kit "$TMP/slow.sock" --filter=delay memory 16M delay-write=100ms
check "slow but progressing server" \
    timeout 60 "$NBDFLOW" copy --timeout 3 --request-size 256K \
    --max-requests 1 "$TMP/src.img" "$(uri "$TMP/slow.sock")"
check "read back from the slow server" \
    timeout 60 "$NBDFLOW" copy "$(uri "$TMP/slow.sock")" "$TMP/back.img"
same "$TMP/src.img" "$TMP/back.img"

# (d) A server that never accepts: its listener's queue is full, so a
# connect waits (for ever on a Unix socket; for the kernel's SYN retries,
# about two minutes, over TCP). copy, sum and info give up after their
# --timeout with one line naming the socket.
python3 "$(dirname "$0")/fullqueue.py" "$TMP/full.sock" "$TMP/full.port" &
full_pid=$!
on_exit "kill $full_pid 2>/dev/null"
for ((i = 0; i < 100; i++)); do [ -s "$TMP/full.port" ] && break; sleep 0.1; done
[ -s "$TMP/full.port" ] || fail "the listener that never accepts did not start"
for target in "$(uri "$TMP/full.sock")" "nbd://127.0.0.1:$(cat "$TMP/full.port")/"; do
    for args in "copy --timeout 2 $target null:" "sum --timeout 2 $target" \
        "info --timeout 2 $target"; do
        rc=0
        # shellcheck disable=SC2086 # word splitting wanted
        timeout 60 "$NBDFLOW" $args >"$TMP/out" 2>"$TMP/err" || rc=$?
        [ "$rc" != 124 ] || fail "$args: still connecting after 60 s (hung)"
        [ "$rc" = 1 ] || fail "$args: exit $rc, not 1: $(cat "$TMP/err")"
        [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
            grep -qF "$target: connect to " "$TMP/err" &&
            grep -q "Connection timed out" "$TMP/err" ||
            fail "$args: $(cat "$TMP/err")"
    done
done
note "ok: a server that never accepts fails copy, sum and info after --timeout"
kill "$full_pid"

# A multi-conn server that accepts one connection and no other: the copy
# runs on the one, and its extra connects, stuck in the full queue, are
# cut short when it ends (a connect to a Unix socket is not woken by a
# shutdown; it looks for one every 10 ms). No --timeout, so the connect
# limit is the full 30 s: the copy must end well before that.
FAKE_ACCEPT_ONCE=1 python3 "$(dirname "$0")/fakenbd.py" "$TMP/once.sock" \
    good $((8 << 20)) >>"$TMP/fake.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/once.sock"
make_fake_pattern "$TMP/want.img" $((8 << 20))
rc=0
timeout 20 "$NBDFLOW" copy --timeout 0 "$(uri "$TMP/once.sock")" \
    "$TMP/once.img" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" != 124 ] ||
    fail "a copy whose extra connects wait in a full queue ran 20 s"
[ "$rc" = 0 ] || fail "copy from the server that accepts once: $(cat "$TMP/err")"
same "$TMP/want.img" "$TMP/once.img"
note "ok: extra connects stuck in a full queue do not hold the copy"

# (e) A --timeout that is not whole seconds in range is a usage error
# (exit 2) with one line, for each command that takes it.
for args in "copy --timeout x $TMP/src.img null:" \
    "sum --timeout -1 $TMP/src.img" "info --map --timeout 1000001 $TMP/src.img"; do
    rc=0
    # shellcheck disable=SC2086 # word splitting wanted
    "$NBDFLOW" $args >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" -eq 2 ] || fail "$args: exit $rc, not 2"
    [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
        grep -q "error: --timeout: whole seconds" "$TMP/err" ||
        fail "$args: $(cat "$TMP/err")"
done
note "ok: bad --timeout values refused"

# A process that could not listen (stopped here; busy hashing a long hole
# or starved of CPU elsewhere) left its replies unread in the socket: that
# time is not the server's silence, and --timeout 2 must not fire after 4 s
# stopped with reads in flight. The digest is checked against the pattern's.
kit "$TMP/paused.sock" --filter=log --filter=delay pattern 32M \
    delay-read=500ms logfile="$TMP/paused.log"
"$NBDFLOW" sum --algo sha256 --timeout 2 "$(uri "$TMP/paused.sock")" \
    >"$TMP/out" 2>"$TMP/err" &
pid=$!
wait_for grep -q " Read id=" "$TMP/paused.log"
kill -STOP "$pid"
sleep 4
kill -CONT "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || fail "stopped 4 s with --timeout 2: exit $rc: $(cat "$TMP/err")"
want=$(python3 -c 'import hashlib, struct
h = hashlib.sha256()
for o in range(0, 32 << 20, 1 << 20):
    h.update(b"".join(struct.pack(">Q", o + i) for i in range(0, 1 << 20, 8)))
print(h.hexdigest())')
[ "$(cut -d' ' -f1 "$TMP/out")" = "$want" ] ||
    fail "sum after a stop: $(cat "$TMP/out") != $want"
kit_stop
note "ok: 4 s stopped with reads in flight is no timeout"

# A server that zeroes by writing, slowly (about 85 MiB/s here): a
# 384 MiB hole in one request (4.5 s) would outlast --timeout 2 while the
# server works on; the copy zeroes in 64 MiB pieces (0.75 s each) and
# lands whole.
make_sparse "$TMP/hole.img" 392 "0:8"
dd if=/dev/urandom of="$TMP/zdst.img" bs=1M count=392 status=none
kit "$TMP/zero.sock" --filter=nozero --filter=rate file "$TMP/zdst.img" \
    zeromode=emulate rate=512M
rc=0
timeout 60 "$NBDFLOW" copy --timeout 2 "$TMP/hole.img" \
    "$(uri "$TMP/zero.sock")" 2>"$TMP/err" || rc=$?
[ "$rc" = 0 ] || fail "a slow zeroing server: exit $rc: $(cat "$TMP/err")"
kit_stop
same "$TMP/hole.img" "$TMP/zdst.img"
note "ok: a 384 MiB hole into a slowly zeroing server, --timeout 2"
echo "PASS"
