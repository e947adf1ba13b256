#!/bin/bash
# Bad TLS clients and bad certificates: each one fails with an error on the
# client side, costs the server exactly one log line, and the server keeps
# serving good clients. Cases: wrong PSK, unknown PSK user, wrong CA,
# expired and self-signed server certificates, missing, foreign and expired
# client certificates with --tls-verify-peer, a plaintext client against
# --tls=require, garbage where the TLS handshake or a TLS record should
# be, and a client hanging up on a server of PSK alone.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls-pki.inc"

need nbdinfo libnbd-bin
python3 -c 'import ssl' 2>/dev/null || skip "python3 has no ssl module"

tmpdir_make
pki_ca "$TMP/ca" "nbdflow test CA"
pki_ca "$TMP/ca2" "some other CA"
pki_dir "$TMP/ca" "$TMP/good"
pki_dir "$TMP/ca2" "$TMP/foreign"           # everything from another CA
pki_dir "$TMP/ca" "$TMP/expired" expired expired
pki_dir "$TMP/ca" "$TMP/self" self self
mkdir -p "$TMP/caonly" && cp "$TMP/good/ca-cert.pem" "$TMP/caonly/"
# A client that trusts the good CA but holds a foreign client pair.
mkdir -p "$TMP/foreigncli"
cp "$TMP/good/ca-cert.pem" "$TMP/foreigncli/"
cp "$TMP/foreign/client-cert.pem" "$TMP/foreign/client-key.pem" "$TMP/foreigncli/"
# ...and one with an expired client pair.
mkdir -p "$TMP/expiredcli"
cp "$TMP/good/ca-cert.pem" "$TMP/expiredcli/"
cp "$TMP/expired/client-cert.pem" "$TMP/expired/client-key.pem" "$TMP/expiredcli/"
psk_make "$TMP/keys.psk" alice
psk_make "$TMP/wrong.psk" alice # same user, another key
psk_make "$TMP/bob.psk" bob
truncate -s 4M "$TMP/disk.img"

# bad_client DESCRIPTION PATTERN CMD...: CMD must fail; the server (the
# one whose log is $SERVER_LOG) must log exactly one line about it,
# matching PATTERN, and stay up.
bad_client () {
    local what=$1 pattern=$2 before after i new
    shift 2
    before=$(wc -l <"$SERVER_LOG")
    if timeout 30 "$@" >"$TMP/client.out" 2>&1; then
        fail "$what: the client succeeded (command: $*)"
    fi
    for ((i = 0; i < 50; i++)); do
        after=$(wc -l <"$SERVER_LOG")
        [ "$after" -gt "$before" ] && break
        sleep 0.1
    done
    sleep 0.3 # a second line, if any, would come now
    new=$(tail -n +"$((before + 1))" "$SERVER_LOG")
    [ -n "$new" ] || fail "$what: the server logged nothing"
    [ "$(wc -l <<<"$new")" = 1 ] || fail "$what: more than one log line: $new"
    grep -Eqi "$pattern" <<<"$new" || fail "$what: log line does not match /$pattern/: $new"
    server_alive || fail "$what: the server died"
    note "ok: $what: client failed ($(tail -n 1 "$TMP/client.out")); server: $new"
}

# good_client URI: a full nbdinfo over TLS works.
good_client () {
    nbdinfo "$1" >"$TMP/good.out" 2>&1 || fail "good client failed after bad ones: $(cat "$TMP/good.out")"
    grep -q "with TLS" "$TMP/good.out" || fail "good client without TLS"
    note "ok: a good client is still served"
}

# ---- PSK and X.509 without client certificates ----
serve_tcp --tls=require --tls-certs "$TMP/good" --tls-psk "$TMP/keys.psk" "$TMP/disk.img"
H=127.0.0.1:$PORT
bad_client "wrong PSK" "TLS handshake failed" \
    nbdinfo "nbds://alice@$H/?tls-psk-file=$TMP/wrong.psk"
bad_client "unknown PSK user" "TLS handshake failed" \
    nbdinfo "nbds://bob@$H/?tls-psk-file=$TMP/bob.psk"
bad_client "server certificate from a CA the client does not trust" \
    "TLS handshake failed" nbdinfo "nbds://$H/?tls-certificates=$TMP/foreign"
bad_client "plaintext client against --tls=require" "TLS is required" \
    nbdinfo "nbd://$H/"
good_client "nbds://alice@$H/?tls-psk-file=$TMP/keys.psk"

# Garbage from a raw client: where the handshake should be, after a
# record header promising more than comes, and inside an established
# session (a record that fails authentication).
for kind in junk header record; do
    before=$(wc -l <"$SERVER_LOG")
    python3 - "$REPO_DIR/tests/hostile/lib" "$PORT" "$TMP/good" "$kind" <<'PY' || fail "raw TLS garbage client ($kind) failed"
import os, socket, ssl, struct, sys
sys.path.insert(0, sys.argv[1])
from rawnbd import *  # noqa
port, pki, kind = int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection(("127.0.0.1", port), timeout=10)
g = s.recv(18, socket.MSG_WAITALL)
assert g[:8] == b"NBDMAGIC", g
s.sendall(struct.pack(">I", 1) + opt_bytes(OPT_STARTTLS))
r = s.recv(20, socket.MSG_WAITALL)
assert struct.unpack(">QIII", r)[2] == REP_ACK, r
if kind == "junk":
    s.sendall(os.urandom(300))
elif kind == "header":
    s.sendall(b"\x16\x03\x01\x40\x00" + os.urandom(100))
    s.shutdown(socket.SHUT_WR)
else:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(os.path.join(pki, "ca-cert.pem"))
    t = ctx.wrap_socket(s, server_hostname="localhost")
    # A well-framed application-data record whose tag cannot verify.
    os.write(t.fileno(), b"\x17\x03\x03\x00\x40" + os.urandom(64))
    s = t
s.settimeout(10)
try:
    while s.recv(4096):
        pass
except (OSError, ssl.SSLError):
    pass
print("server closed the connection")
PY
    for ((i = 0; i < 50; i++)); do
        [ "$(wc -l <"$SERVER_LOG")" -gt "$before" ] && break
        sleep 0.1
    done
    sleep 0.3
    new=$(tail -n +"$((before + 1))" "$SERVER_LOG")
    [ "$(wc -l <<<"$new")" = 1 ] && [ -n "$new" ] ||
        fail "TLS garbage ($kind): expected one log line, got: $new"
    server_alive || fail "server died on TLS garbage ($kind)"
    note "ok: TLS garbage ($kind): $new"
done
good_client "nbds://$H/?tls-certificates=$TMP/good"
serve_stop

# ---- PSK alone: a client that hangs up in the TLS handshake is not
# asked about a certificate the server never showed ----
serve_tcp --tls=require --tls-psk "$TMP/keys.psk" "$TMP/disk.img"
before=$(wc -l <"$SERVER_LOG")
python3 - "$REPO_DIR/tests/hostile/lib" "$PORT" <<'PY' || fail "raw hang-up client failed"
import socket, struct, sys
sys.path.insert(0, sys.argv[1])
from rawnbd import *  # noqa
s = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=10)
assert s.recv(18, socket.MSG_WAITALL)[:8] == b"NBDMAGIC"
s.sendall(struct.pack(">I", 1) + opt_bytes(OPT_STARTTLS))
r = s.recv(20, socket.MSG_WAITALL)
assert struct.unpack(">QIII", r)[2] == REP_ACK, r
s.close()  # no ClientHello at all
PY
log_grew () { [ "$(wc -l <"$SERVER_LOG")" -gt "$before" ]; } # counted at each try
wait_for log_grew
sleep 0.3
new=$(tail -n +"$((before + 1))" "$SERVER_LOG")
[ "$(wc -l <<<"$new")" = 1 ] && grep -q "hung up" <<<"$new" &&
    ! grep -q "certificate" <<<"$new" ||
    fail "PSK server, client hung up: $new"
note "ok: PSK server, client hung up: $new"
good_client "nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$TMP/keys.psk"
serve_stop

# ---- bad server certificates: the client refuses them ----
serve_tcp --tls=require --tls-certs "$TMP/expired" "$TMP/disk.img"
bad_client "expired server certificate" "TLS handshake failed" \
    nbdinfo "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/good"
serve_stop
serve_tcp --tls=require --tls-certs "$TMP/self" "$TMP/disk.img"
bad_client "self-signed server certificate" "TLS handshake failed" \
    nbdinfo "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/good"
serve_stop

# ---- --tls-verify-peer: client certificates are checked ----
serve_tcp --tls=require --tls-certs "$TMP/good" --tls-verify-peer "$TMP/disk.img"
H=127.0.0.1:$PORT
bad_client "no client certificate with --tls-verify-peer" \
    "TLS handshake failed" nbdinfo "nbds://$H/?tls-certificates=$TMP/caonly"
bad_client "client certificate from another CA" "TLS handshake failed" \
    nbdinfo "nbds://$H/?tls-certificates=$TMP/foreigncli"
bad_client "expired client certificate" "TLS handshake failed" \
    nbdinfo "nbds://$H/?tls-certificates=$TMP/expiredcli"
good_client "nbds://$H/?tls-certificates=$TMP/good"
serve_stop

# With --tls=on a client may stay in plaintext, certificate or not: the
# start-up log says so instead of claiming certificates are required.
serve_tcp --tls=on --tls-certs "$TMP/good" --tls-verify-peer "$TMP/disk.img"
grep -q 'warning: --tls-verify-peer with --tls=on: a client that stays in plaintext needs no certificate' \
    "$SERVER_LOG" || fail "no warning for --tls=on --tls-verify-peer: $(cat "$SERVER_LOG")"
nbdinfo --size "nbd://127.0.0.1:$PORT/" >/dev/null ||
    fail "--tls=on --tls-verify-peer: a plaintext client was not served"
bad_client "no client certificate with --tls=on --tls-verify-peer" \
    "TLS handshake failed" nbdinfo "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/caonly"
serve_stop
note "ok: --tls=on --tls-verify-peer: warned; plaintext served, TLS without a certificate refused"

# ---- start-up errors are clear ----
for args in "--tls=require" "--tls=on" "--tls-certs $TMP/good" \
            "--tls=require --tls-psk $TMP/nope.psk" \
            "--tls=require --tls-certs $TMP/caonly" \
            "--tls=require --tls-psk $TMP/disk.img" \
            "--tls=sometimes --tls-certs $TMP/good"; do
    # shellcheck disable=SC2086
    if "$NBDFLOW" serve --listen 127.0.0.1:1 $args "$TMP/disk.img" >"$TMP/start.out" 2>&1; then
        fail "serve $args started"
    fi
    grep -Eqi "tls|psk|pem|key" "$TMP/start.out" ||
        fail "serve $args: unclear error: $(cat "$TMP/start.out")"
    note "ok: serve $args refused: $(tail -n 1 "$TMP/start.out")"
done

# ---- PSK files GnuTLS would choke on are refused at the start, naming
# the line: DOS line ends (GnuTLS takes the CR into the key, and every
# handshake failed), a key shorter than GnuTLS clients take, a line too
# long to read whole (once reported as the line after it).
key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf 'alice:%s\r\n' "$key" >"$TMP/crlf.psk"
printf 'alice:0a0b0c\n' >"$TMP/short.psk"
printf 'alice:%s\n' "$(printf '%05000d' 0)" >"$TMP/long.psk"
for f in crlf:"line 1 ends in a carriage return" \
         short:"line 1: a key of 3 bytes; at least 4 are needed" \
         long:"line 1: longer than 4094 bytes"; do
    rc=0
    timeout 20 "$NBDFLOW" serve --listen 127.0.0.1:1 --tls=require \
        --tls-psk "$TMP/${f%%:*}.psk" "$TMP/disk.img" >"$TMP/start.out" 2>&1 ||
        rc=$?
    [ "$rc" != 0 ] && grep -qF "${f#*:}" "$TMP/start.out" ||
        fail "PSK file ${f%%:*}: exit $rc, $(cat "$TMP/start.out")"
    [ "$(wc -l <"$TMP/start.out")" = 1 ] ||
        fail "PSK file ${f%%:*}: not one line: $(cat "$TMP/start.out")"
    note "ok: $(cat "$TMP/start.out")"
done
# A certificate without its key names the file that is missing (GnuTLS
# itself says only "Error while reading file"), on both ends.
mkdir -p "$TMP/nokey"
cp "$TMP/good/"*.pem "$TMP/nokey/"
rm "$TMP/nokey/server-key.pem" "$TMP/nokey/client-key.pem"
rc=0
timeout 20 "$NBDFLOW" serve --listen 127.0.0.1:1 --tls=require \
    --tls-certs "$TMP/nokey" "$TMP/disk.img" >"$TMP/start.out" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -qF "cannot read $TMP/nokey/server-key.pem: No such file or directory" \
    "$TMP/start.out" || fail "server key missing: exit $rc, $(cat "$TMP/start.out")"
serve_tcp --tls=require --tls-certs "$TMP/good" "$TMP/disk.img"
rc=0
"$NBDFLOW" info "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/nokey" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" != 0 ] && grep -qF "cannot read $TMP/nokey/client-key.pem: No such file or directory" \
    "$TMP/err" || fail "client key missing: exit $rc, $(cat "$TMP/err")"
serve_stop
note "ok: a missing key is named on both ends"

# A client's unknown PSK user is named with its control bytes escaped:
# the name comes from the URI.
serve_tcp --tls=require --tls-psk "$TMP/keys.psk" "$TMP/disk.img"
rc=0
"$NBDFLOW" info "nbds://%1b%5b31mevil%0aX@127.0.0.1:$PORT/?tls-psk-file=$TMP/keys.psk" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" != 0 ] && grep -qF 'no key for user "\x1b[31mevil\x0aX"' "$TMP/err" ||
    fail "unknown PSK user with control bytes: exit $rc, $(cat -v "$TMP/err")"
[ "$(wc -l <"$TMP/err")" = 1 ] || fail "not one line: $(cat -v "$TMP/err")"
serve_stop
note "ok: the unknown user is shown escaped"
echo "PASS: every bad TLS client failed, cost one log line, and the server kept serving"
