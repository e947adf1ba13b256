#!/bin/bash
# xapi-bad.sh: bad input on xapi's transports. Into our receivers (serve
# --http and --chunked-listen): a frame beyond the export, a length of
# 2^31, a truncated header, a truncated frame, a missing end marker,
# garbage instead of HTTP, a head over the limit, a Transfer-Encoding
# header, unknown paths and exports: each gets one clear log line (and an
# HTTP status where the head allowed one), nothing outside the frames is
# written, and the server goes on serving. From our sender: a 404, a 500,
# an early close, an answer whose head never ends and a raw Chunked
# receiver that resets: a clear error and a non-zero exit, in bounded
# time. Out of fds, the Chunked listener rests
# and logs it once.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
REF=$(dirname "$0")/xapiref.py
make_random "$TMP/src.img" 4
truncate -s 4M "$TMP/exp.img"
HPORT=$(free_port)
CPORT=$(free_port)
serve_tcp --http "127.0.0.1:$HPORT" --chunked-listen "127.0.0.1:$CPORT" \
    "disk=$TMP/exp.img"

# expect_log PATTERN: the server logs it within 10 s.
expect_log () { wait_for grep -q -- "$1" "$SERVER_LOG"; note "ok: logged: $1"; }
still_zero () { all_zero "$TMP/exp.img" $((4 << 20)); }

python3 "$REF" send-chunked 127.0.0.1 "$CPORT" "$TMP/src.img" --bad beyond || true
expect_log "frame 0 at offset 4194304, length 512: beyond the export's end"
python3 "$REF" send-chunked 127.0.0.1 "$CPORT" "$TMP/src.img" --bad huge || true
expect_log "length 2147483648: a length of 2^31 or more"
python3 "$REF" send-chunked 127.0.0.1 "$CPORT" "$TMP/src.img" --bad trunc-header || true
expect_log "ended without its end marker after 0 frames"
still_zero
python3 "$REF" send-chunked 127.0.0.1 "$CPORT" "$TMP/src.img" --bad trunc-data || true
expect_log "frame 0: the sender closed the connection 1000 bytes into the 4096 at offset 0"
still_zero
python3 "$REF" send-chunked 127.0.0.1 "$CPORT" "$TMP/src.img" --bad no-end || true
expect_log "without its end marker after 2 frames (4194304 bytes): incomplete, not flushed"

# answer WHAT EXPECTED: the receiver's status line for a bad head.
answer () {
    local got
    got=$(timeout 20 python3 "$REF" send-raw 127.0.0.1 "$HPORT" "$1") ||
        fail "send-raw $1 failed or hung"
    case $got in "$2"*) note "ok: $1 -> $got" ;; *) fail "$1: got '$got', wanted '$2'" ;; esac
}
answer garbage "(closed)"
expect_log "the first byte is not HTTP"
answer big-head "HTTP/1.1 431"
answer te "HTTP/1.1 400"
expect_log "a Transfer-Encoding header"
answer "path:/elsewhere" "HTTP/1.1 404"
answer "path:/import_raw_vdi?vdi=nosuch&format=raw" "HTTP/1.1 404"
answer "path:/import_raw_vdi?vdi=disk&format=vhd" "HTTP/1.1 400"
answer "path:/nbd/nosuch" "HTTP/1.1 404"
answer "path:/nbd/d%00zz" "HTTP/1.1 400"
expect_log "a bad escape (%XX, or %00) in the path"
answer "path:/import_raw_vdi?vdi=d%00zz" "HTTP/1.1 400"
expect_log "vdi= has a bad escape (%XX, or %00) or is over 255 bytes"
# The server still serves, and a good stream lands whole.
check "a good stream after all that" \
    "$NBDFLOW" copy "$TMP/src.img" "http://127.0.0.1:$HPORT/import_raw_vdi?vdi=disk&format=raw"
wait_for grep -q 'chunked into "disk": 4194304 bytes.*flushed' "$SERVER_LOG"
same "$TMP/src.img" "$TMP/exp.img"
serve_stop

# Our sender against bad answers.
for mode in 404 500 close endless; do
    RPORT=$(free_port)
    rm -f "$TMP/ready"
    truncate -s 4M "$TMP/r.img"
    python3 "$REF" http-recv "$RPORT" "$TMP/r.img" "$TMP/ready" "$mode" \
        >"$TMP/ref.out" 2>&1 &
    rpid=$!
    wait_for test -s "$TMP/ready"
    rc=0
    timeout 30 "$NBDFLOW" copy --timeout 10 "$TMP/src.img" \
        "http://127.0.0.1:$RPORT/import_raw_vdi?vdi=x&format=raw" \
        2>"$TMP/err" || rc=$?
    wait "$rpid" || true
    [ "$rc" = 1 ] || fail "answer '$mode': exit status $rc: $(cat "$TMP/err")"
    case $mode in
        404) want="refused the PUT: 'HTTP/1.1 404 Not Found'" ;;
        500) want="refused the PUT: 'HTTP/1.1 500 Internal Server Error'" ;;
        close) want="closed the connection without answering the PUT" ;;
        endless) want="no end of head within 16384 bytes" ;;
    esac
    grep -q -- "$want" "$TMP/err" || fail "answer '$mode': $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "answer '$mode': more than one line: $(cat "$TMP/err")"
    note "ok: answer '$mode': $(cat "$TMP/err")"
done

# Out of fds (ulimit -n 64): the Chunked listener rests instead of
# spinning on accept (it logged hundreds of thousands of lines a second),
# says so once, and takes uploads again once the fds are free.
truncate -s 0 "$TMP/exp.img"
truncate -s 4M "$TMP/exp.img"
CPORT=$(free_port)
printf '#!/bin/bash\nulimit -n 64\nexec "%s" "$@"\n' "$NBDFLOW" >"$TMP/lowfd"
chmod +x "$TMP/lowfd"
NBDFLOW=$TMP/lowfd serve_tcp --chunked-listen "127.0.0.1:$CPORT" \
    "disk=$TMP/exp.img"
check "60 idle connections to a server of 64 fds" python3 - "$CPORT" <<'PY'
import socket, sys, time
ss = [socket.create_connection(("127.0.0.1", int(sys.argv[1])))
      for _ in range(60)]
time.sleep(2)
for s in ss:
    s.close()
PY
n=$(grep -c "Too many open files" "$SERVER_LOG" || true)
[ "$n" -ge 1 ] && [ "$n" -le 2 ] ||
    fail "out of fds: $n lines about it, want 1: $(grep -m 3 'Too many' "$SERVER_LOG")"
sleep 1.2 # the listener rests a second
check "copy once the fds are free" \
    "$NBDFLOW" copy "$TMP/src.img" "chunked+tcp://127.0.0.1:$CPORT"
wait_for grep -q 'chunked into "disk": 4194304 bytes.*flushed' "$SERVER_LOG"
same "$TMP/src.img" "$TMP/exp.img"
serve_stop

# A receiver that stops at a bad frame resets the connection, and that
# is all a raw Chunked sender hears: our copy into an export 3 MiB too
# small must fail, never report success.
truncate -s 1M "$TMP/small.img"
CPORT=$(free_port)
serve_tcp --chunked-listen "127.0.0.1:$CPORT" "disk=$TMP/small.img"
rc=0
timeout 60 "$NBDFLOW" copy "$TMP/src.img" "chunked+tcp://127.0.0.1:$CPORT" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] ||
    fail "copy into a receiver that reset it: exit $rc: $(cat "$TMP/err")"
[ "$(grep -c 'error' "$TMP/err")" -eq 1 ] ||
    fail "copy into a receiver that reset it: $(cat "$TMP/err")"
[ ! -s "$TMP/out" ] || fail "a report was printed for a failed copy"
expect_log "beyond the export's end"
note "ok: reset by the receiver: $(cat "$TMP/err")"
serve_stop

# SIGTERM closes the http listener with the NBD one: while the server
# drains (an NBD client holds it in its handshake), no new upload and no
# NBD-over-HTTP connection is taken; a /nbd whose head was still coming
# gets 503. An upload under way when the signal came is cut at the
# deadline, and the server still exits 0 (its session thread used to end
# after the xapi state was freed: a crash).
HPORT=$(free_port)
serve_tcp --http "127.0.0.1:$HPORT" "disk=$TMP/exp.img"
check "http at SIGTERM" python3 - "$PORT" "$HPORT" "$SERVER_PID" <<'PY'
import os, signal, socket, sys, time
nbd, http, pid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
held = socket.create_connection(("127.0.0.1", nbd))  # a handshake, unfinished
held.recv(18)
up = socket.create_connection(("127.0.0.1", http))  # an upload under way
up.sendall(b"PUT /import_raw_vdi?vdi=disk&format=raw HTTP/1.1\r\n"
           b"Content-Length: 4194304\r\n\r\n" + b"\1" * 4096)
late = socket.create_connection(("127.0.0.1", http))  # a head not done
late.sendall(b"PUT /nbd/disk HTTP/1.1\r\n")
time.sleep(0.3)
os.kill(pid, signal.SIGTERM)
refused = False
for _ in range(40):  # the signal is handled within the grace, loaded or not
    try:
        s = socket.create_connection(("127.0.0.1", http), 1)
        s.close()
        time.sleep(0.1)
    except ConnectionRefusedError:
        refused = True
        break
if not refused:
    sys.exit("the http listener still took connections after SIGTERM")
late.sendall(b"\r\n")
late.settimeout(5)
ans = late.recv(200)
if not ans.startswith(b"HTTP/1.1 503"):
    sys.exit("a /nbd head finished after SIGTERM: %r" % ans)
try:  # trickle the upload until the server cuts it
    for _ in range(100):
        up.sendall(b"\1" * 512)
        time.sleep(0.1)
except OSError:
    pass
PY
wait "$SERVER_PID" || fail "server exit status $? after SIGTERM with an upload under way"
forget_pid "$SERVER_PID"
note "ok: bad input on xapi's transports"
