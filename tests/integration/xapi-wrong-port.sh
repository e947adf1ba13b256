#!/bin/bash
# xapi-wrong-port.sh: an upload aimed at the wrong kind of port fails at
# once, with one line that says which kind it reached:
# - http:// at our HTTPS listener gets a plain-text 400 saying to use
#   https:// (the server peeks before starting TLS), logged;
# - https:// at our plain HTTP listener: the server drops the ClientHello
#   at once with a line in its log, and the client says that no TLS came,
#   instead of both waiting out the handshake timeout (60 s here);
# - http:// and https:// at an NBD port name its NBD greeting (and the
#   server's log names the HTTP client and the TLS handshake);
# - https:// at a peer that answers in plain HTTP, and http:// at one that
#   answers with a TLS alert (fake peers), say so.
# Nothing is written to the export by any of these.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls-pki.inc"
tmpdir_make
pki_ca "$TMP/ca" "nbdflow test CA"
pki_dir "$TMP/ca" "$TMP/pki"
make_random "$TMP/src.img" 1
truncate -s 1M "$TMP/exp.img"

# expect_fast NAME TEXT CMD...: CMD fails with status 1 within 8 s, with
# one error line matching TEXT.
expect_fast () {
    local name=$1 text=$2 rc=0; shift 2
    timeout 8 "$@" 2>"$TMP/err" >/dev/null || rc=$?
    [ "$rc" = 1 ] || fail "$name: status $rc (124: it waited): $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$name: not one line: $(cat "$TMP/err")"
    grep -q -- "$text" "$TMP/err" || fail "$name: no '$text': $(cat "$TMP/err")"
    note "ok: $name: $(cat "$TMP/err")"
}

HS=$(free_port)
serve_tcp --handshake-timeout 60 --tls=on --tls-certs "$TMP/pki" \
    --http "127.0.0.1:$HS" "disk=$TMP/exp.img"
expect_fast "http:// at the HTTPS port" "400 Bad Request.*plain HTTP request at an HTTPS port: use https://" \
    "$NBDFLOW" copy "$TMP/src.img" "http://127.0.0.1:$HS/import_raw_vdi?vdi=disk"
expect_fast "sparse_dd http:// at the HTTPS port" "use https://" \
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" -size 1048576 \
    -dest "http://127.0.0.1:$HS/nbd/disk"
grep -q "plain HTTP request at an HTTPS port" "$SERVER_LOG" ||
    fail "the server logged no plain request"
# The same listener still takes HTTPS.
check "https:// still served" "$NBDFLOW" copy --tls-verify-peer false \
    "$TMP/src.img" "https://127.0.0.1:$HS/nbd/disk"
same "$TMP/src.img" "$TMP/exp.img"
serve_stop
truncate -s 0 "$TMP/exp.img"
truncate -s 1M "$TMP/exp.img"

HP=$(free_port)
serve_tcp --handshake-timeout 60 --http "127.0.0.1:$HP" "disk=$TMP/exp.img"
NP=$PORT
expect_fast "https:// at the plain HTTP port" "without a byte of TLS: is that port TLS at all" \
    "$NBDFLOW" copy --tls-verify-peer false "$TMP/src.img" \
    "https://127.0.0.1:$HP/import_raw_vdi?vdi=disk"
grep -q "a TLS handshake at a plain HTTP port" "$SERVER_LOG" ||
    fail "the server logged no TLS handshake"
expect_fast "http:// at the NBD port" "an NBD greeting, not an HTTP answer" \
    "$NBDFLOW" copy "$TMP/src.img" "http://127.0.0.1:$NP/import_raw_vdi?vdi=disk"
expect_fast "https:// at the NBD port" "an NBD greeting, not TLS" \
    "$NBDFLOW" copy --tls-verify-peer false "$TMP/src.img" \
    "https://127.0.0.1:$NP/nbd/disk"
grep -q "an HTTP client at the NBD port" "$SERVER_LOG" ||
    fail "the server did not name the HTTP client at its NBD port"
grep -q "a TLS handshake: NBD starts TLS inside" "$SERVER_LOG" ||
    fail "the server did not name the TLS handshake at its NBD port"
all_zero "$TMP/exp.img" 1048576
serve_stop

# fake PORTFILE BYTES: a peer that answers the first thing it reads
# with BYTES (a Python bytes literal), then closes.
fake () {
    python3 - "$1" "$2" <<'PY' &
import socket, sys, ast
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
s.settimeout(20)
c, _ = s.accept()
c.recv(4096)
c.sendall(ast.literal_eval(sys.argv[2]))
c.close()
PY
    FAKE_PID=$!
    on_exit "kill $FAKE_PID 2>/dev/null || true"
    wait_for test -s "$1"
    FAKE_PORT=$(cat "$1")
}
fake "$TMP/p1" "b'HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n'"
expect_fast "https:// at a plain HTTP peer" "answered in plain HTTP, not TLS" \
    "$NBDFLOW" copy --tls-verify-peer false "$TMP/src.img" \
    "https://127.0.0.1:$FAKE_PORT/nbd/disk"
fake "$TMP/p2" "b'\x15\x03\x03\x00\x02\x02\x0a'"
expect_fast "http:// at a peer that answers in TLS" "answered in TLS, not plain HTTP: that port wants https://" \
    "$NBDFLOW" copy "$TMP/src.img" "http://127.0.0.1:$FAKE_PORT/nbd/disk"
note "passed"
