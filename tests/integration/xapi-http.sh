#!/bin/bash
# xapi-http.sh: uploads the way xapi takes them. copy to an http:// URL of
# our serve --http (a Chunked body into /import_raw_vdi, and NBD after the
# Transfer-encoding: nbd answer of /nbd/NAME); the reference sender
# (xapiref.py, written apart from our code) into our receiver, with a
# Chunked and a raw body; copy into the reference's HTTP endpoint (checking
# the request's headers) and through the reference relaying to qemu-nbd.
# Every copy verified.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
# flushed_is N: the server has logged N complete Chunked streams.
flushed_is () { [ "$(grep -c 'chunked into "disk".*flushed' "$SERVER_LOG")" = "$1" ]; }
REF=$(dirname "$0")/xapiref.py
make_sparse "$TMP/src.img" 16 "0:2 7:1 15:1"
size=$(stat -c %s "$TMP/src.img")
reset () { truncate -s 0 "$1"; truncate -s "$size" "$1"; }

reset "$TMP/exp.img"
HPORT=$(free_port)
truncate -s $((size - (1 << 20))) "$TMP/small.img"
serve_tcp --http "127.0.0.1:$HPORT" "disk=$TMP/exp.img" "small=$TMP/small.img"
base=http://127.0.0.1:$HPORT
check "copy -> serve --http /import_raw_vdi (Chunked body)" \
    "$NBDFLOW" copy "$TMP/src.img" "$base/import_raw_vdi?vdi=disk&format=raw"
# Chunked has no reply, but the copy waits for the receiver's close after
# the end marker, which our server gives after its flush.
grep -q 'chunked into "disk".*flushed' "$SERVER_LOG" ||
    fail "the copy ended before the receiver flushed: $(cat "$SERVER_LOG")"
same "$TMP/src.img" "$TMP/exp.img"

# A receiver that stops early (its disk is 1 MiB short) resets the
# connection. The socket buffers took every frame, so only that reset
# tells the sender: the copy fails, and sparse_dd never says 100.
rc=0
"$NBDFLOW" sparse_dd -machine -src "$TMP/src.img" \
    -dest "$base/import_raw_vdi?vdi=small&format=raw" -size "$size" \
    >"$TMP/prog" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] || fail "a stream the receiver stopped: exit $rc: $(cat "$TMP/err")"
grep -Eq 'reset the connection|closed the connection|Connection reset by peer' "$TMP/err" ||
    fail "the error does not say that the receiver gave up: $(cat "$TMP/err")"
! grep -aq 'Progress: 100' "$TMP/prog" ||
    fail "sparse_dd reported 100 for a stream the receiver did not store"
wait_for grep -q 'chunked into "small".*beyond the export' "$SERVER_LOG"
note "ok: a receiver that stopped early fails the copy: $(tail -n 1 "$TMP/err")"

# A raw body from a client that sends "Expect: 100-continue" (curl -T
# does): "100 Continue", then the answer once the body is stored: 200,
# or 500 when it was cut short. Before, the early 200 ended curl's
# upload with nothing stored and success on its side.
reset "$TMP/exp.img"
expect_put () {
    python3 - "$HPORT" "$TMP/src.img" "$1" <<'PY'
import socket, sys
d = open(sys.argv[2], "rb").read()
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"PUT /import_raw_vdi?vdi=disk HTTP/1.1\r\nHost: x\r\n"
          b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(d))
s.settimeout(20)
def head():
    h = b""
    while b"\r\n\r\n" not in h:
        k = s.recv(1)
        if not k:
            sys.exit("EOF before an answer (had %r)" % h)
        h += k
    return h.split(b"\r\n")[0].decode()
first = head()
if first != "HTTP/1.1 100 Continue":
    sys.exit("first answer %r, want 100 Continue" % first)
if sys.argv[3] == "whole":
    s.sendall(d)
else:
    s.sendall(d[:len(d) // 2])
    s.shutdown(socket.SHUT_WR)
print(head())
PY
}
[ "$(expect_put whole)" = "HTTP/1.1 200 OK" ] ||
    fail "Expect: 100-continue, whole body: $(expect_put whole 2>&1)"
same "$TMP/src.img" "$TMP/exp.img"
got=$(expect_put half) || fail "Expect: 100-continue, half a body: $got"
[ "$got" = "HTTP/1.1 500 Internal Server Error" ] ||
    fail "Expect: 100-continue, half a body: answered '$got', want 500"
note "ok: Expect: 100-continue: 100, then 200 (whole) or 500 (cut short)"

reset "$TMP/exp.img"
check "copy -> serve --http /nbd/disk (NBD after the upgrade)" \
    "$NBDFLOW" copy --dst-protocol nbd --nbd-export disk "$TMP/src.img" \
    "$base/nbd/disk"
same "$TMP/src.img" "$TMP/exp.img"

# /nbd/NAME without --nbd-export: the empty name means NAME there, not
# the server's first export.
truncate -s 0 "$TMP/small.img"
truncate -s $((size - (1 << 20))) "$TMP/small.img"
head -c $((size - (1 << 20))) "$TMP/src.img" >"$TMP/src-small.img"
check "copy -> serve --http /nbd/small, no --nbd-export" \
    "$NBDFLOW" copy --dst-protocol nbd "$TMP/src-small.img" "$base/nbd/small"
same "$TMP/src-small.img" "$TMP/small.img"

reset "$TMP/exp.img"
check "reference sender -> serve --http (Chunked body)" \
    python3 "$REF" send-chunked 127.0.0.1 "$HPORT" "$TMP/src.img" \
    --put "/import_raw_vdi?vdi=disk&format=raw"
wait_for flushed_is 2
same "$TMP/src.img" "$TMP/exp.img"

reset "$TMP/exp.img"
ans=$(python3 "$REF" send-raw 127.0.0.1 "$HPORT" "raw-body:$TMP/src.img")
case $ans in "HTTP/1.1 200"*) ;; *) fail "raw body refused: $ans" ;; esac
wait_for grep -q 'raw body into "disk".*flushed' "$SERVER_LOG"
same "$TMP/src.img" "$TMP/exp.img"
serve_stop

# Into the reference endpoint: the request is xapi's, the body Chunked.
RPORT=$(free_port)
reset "$TMP/r.img"
python3 "$REF" http-recv "$RPORT" "$TMP/r.img" "$TMP/ready" >"$TMP/ref.out" 2>&1 &
rpid=$!
wait_for test -s "$TMP/ready"
check "copy -> reference HTTP endpoint, with a user in the URL" \
    "$NBDFLOW" copy "$TMP/src.img" \
    "http://root:sec%20ret@127.0.0.1:$RPORT/import_raw_vdi?vdi=x&format=raw&session_id=OpaqueRef:1"
wait "$rpid" || fail "reference endpoint: $(cat "$TMP/ref.out")"
same "$TMP/src.img" "$TMP/r.img"
grep -q '^request: PUT /import_raw_vdi?vdi=x&format=raw&session_id=OpaqueRef:1$' "$TMP/ref.out" ||
    fail "wrong request line: $(cat "$TMP/ref.out")"
grep -q '^header: cookie: chunked=true$' "$TMP/ref.out" ||
    fail "no chunked cookie: $(cat "$TMP/ref.out")"
grep -q '^header: connection: close$' "$TMP/ref.out" ||
    fail "no Connection: close (the close ends the upload): $(cat "$TMP/ref.out")"
auth=$(printf 'root:sec ret' | base64)
grep -q "^header: authorization: Basic $auth\$" "$TMP/ref.out" ||
    fail "no Basic authorization from the URL: $(cat "$TMP/ref.out")"

# fake_recv PORT MODE [OUT]: an HTTP receiver of one Chunked upload, as
# no real one should be. continue: "100 Continue" before its "200",
# then it stores the frames into OUT (which the sender must wait past);
# early: it closes its side at once, takes 1 MiB, then resets.
fake_recv () {
    rm -f "$TMP/fready"
    python3 - "$1" "$2" "${3:-/dev/null}" "$TMP/fready" <<'PY' &
import socket, struct, sys, time
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(1)
open(sys.argv[4], "w").write("ready")
c, _ = l.accept()
h = b""
while b"\r\n\r\n" not in h:
    k = c.recv(1)
    if not k:
        sys.exit("EOF in the request head")
    h += k
if sys.argv[2] == "continue":
    c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    time.sleep(0.2)
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    out = open(sys.argv[3], "r+b")
    def take(n):
        b = b""
        while len(b) < n:
            k = c.recv(n - len(b))
            if not k:
                sys.exit("EOF in the stream")
            b += k
        return b
    while True:
        off, n = struct.unpack("<QI", take(12))
        if n == 0:
            break
        out.seek(off)
        out.write(take(n))
    out.close()
    c.close()
else:
    c.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
    c.shutdown(socket.SHUT_WR)
    got = 0
    while got < 1 << 20:
        b = c.recv(65536)
        if not b:
            break
        got += len(b)
    time.sleep(1)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
PY
    FPID=$!
    wait_for test -s "$TMP/fready"
}

# An interim "100 Continue" before the answer is skipped, as HTTP says.
FPORT=$(free_port)
reset "$TMP/f.img"
fake_recv "$FPORT" continue "$TMP/f.img"
check "copy -> a receiver that says 100 Continue first" \
    "$NBDFLOW" copy --dst-protocol chunked "$TMP/src.img" \
    "http://127.0.0.1:$FPORT/import_raw_vdi?vdi=x"
wait "$FPID" || fail "the receiver after 100 Continue failed"
same "$TMP/src.img" "$TMP/f.img"

# A receiver that closes its side before the end of the stream, takes
# part of it and resets later: its early close is no "stored" (the copy
# used to exit 0 with half of the data lost). The error line names the
# URL without its password.
# 2 MiB, so that all of it fits in the sockets' buffers: a copy that
# trusted the early close would have nothing to fail on.
FPORT=$(free_port)
make_random "$TMP/two.img" 2
fake_recv "$FPORT" early
rc=0
"$NBDFLOW" copy --dst-protocol chunked "$TMP/two.img" \
    "http://root:hush@127.0.0.1:$FPORT/import_raw_vdi?vdi=x" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
wait "$FPID" || true
[ "$rc" != 0 ] || fail "a receiver that closed early: the copy exited 0"
grep -q "closed its side before the end of the stream\|reset\|closed the connection" \
    "$TMP/err" || fail "a receiver that closed early: $(cat "$TMP/err")"
! grep -q hush "$TMP/err" || fail "the error shows the password: $(cat "$TMP/err")"
grep -q 'root:\*\*\*@' "$TMP/err" ||
    fail "the error does not name the URL with its password hidden: $(cat "$TMP/err")"
note "ok: a receiver that closed early: $(cat "$TMP/err")"

# Through the reference relaying to qemu-nbd after Transfer-encoding: nbd.
if command -v qemu-nbd >/dev/null; then
    reset "$TMP/q.img"
    QPORT=$(free_port)
    qemu-nbd -f raw -t -b 127.0.0.1 -p "$QPORT" "$TMP/q.img" &
    SERVER_PIDS+=($!)
    wait_for python3 -c "import socket; socket.create_connection(('127.0.0.1', $QPORT)).close()"
    RPORT=$(free_port)
    rm -f "$TMP/ready"
    python3 "$REF" http-recv "$RPORT" "$TMP/q.img" "$TMP/ready" \
        "relay:127.0.0.1:$QPORT" >"$TMP/ref.out" 2>&1 &
    rpid=$!
    wait_for test -s "$TMP/ready"
    check "copy -> reference HTTP endpoint relaying to qemu-nbd" \
        "$NBDFLOW" copy --connections 1 "$TMP/src.img" \
        "http://127.0.0.1:$RPORT/nbdproxy/import/vm/sr/vdi/dp"
    wait "$rpid" || fail "reference relay: $(cat "$TMP/ref.out")"
    same "$TMP/src.img" "$TMP/q.img"
else
    note "skipped the qemu-nbd relay: qemu-nbd is not installed"
fi
note "ok: xapi uploads over HTTP, verified"
