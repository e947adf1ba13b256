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
