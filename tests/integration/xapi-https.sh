#!/bin/bash
# xapi-https.sh: uploads over HTTPS (TLS around the whole connection, as
# xapi's port 443 is): copy to https://localhost of our serve --http
# --tls-certs, checked against the test CA (--tls-certificates); refused
# against a CA that did not sign the server, and without a CA (the
# system's store does not know it) unless --tls-verify-peer false; NBD
# inside HTTPS (PUT /nbd/NAME answered with Transfer-encoding: nbd, then
# the NBD handshake inside the same TLS session), on two connections,
# into a server that requires TLS of NBD clients; sparse_dd's
# -good-ciphersuites mapped to a GnuTLS priority (the cipher negotiated
# is the one named; CBC suites alone a usage error), with the CA from
# NBDFLOW_TLS_CERTIFICATES and http made https by -encryption-mode
# always; sparse_dd without -verify-dest checking nothing, with it the
# chain against -cert-bundle-path and not the name; copy --tls-priority
# applied (CBC only meets no cipher of the
# server) and a bad one named; the cipher it leaves named by copy --json
# (ChaCha20 in TLS 1.2 for a Chunked body, AES-256-GCM in TLS 1.3 for NBD
# inside HTTPS, with x509 or x509-verified as the server's certificate
# was checked or not) and by the server (-v for the HTTPS session,
# --stats for each NBD connection in it); 40 uploads in a row, none
# failed by a reset at the close. Every copy verified.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls-pki.inc"
tmpdir_make
pki_ca "$TMP/ca" "nbdflow test CA"
pki_ca "$TMP/ca2" "another CA"
pki_dir "$TMP/ca" "$TMP/pki"
pki_dir "$TMP/ca2" "$TMP/foreign"
make_random "$TMP/src.img" 6
truncate -s 6M "$TMP/exp.img"
HPORT=$(free_port)
serve_tcp -v --stats --tls=require --tls-certs "$TMP/pki" \
    --http "127.0.0.1:$HPORT" "disk=$TMP/exp.img"
url="https://localhost:$HPORT/import_raw_vdi?vdi=disk&format=raw"
check "copy -> https, checked against the CA" \
    "$NBDFLOW" copy --tls-certificates "$TMP/pki" "$TMP/src.img" "$url"
wait_for grep -q 'chunked into "disk".*flushed' "$SERVER_LOG"
same "$TMP/src.img" "$TMP/exp.img"

rc=0
"$NBDFLOW" copy --tls-certificates "$TMP/foreign" "$TMP/src.img" "$url" \
    2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] || fail "a server the CA did not sign: status $rc"
grep -qi "certificate" "$TMP/err" || fail "no word of the certificate: $(cat "$TMP/err")"
note "ok: refused: $(cat "$TMP/err")"
rc=0
"$NBDFLOW" copy "$TMP/src.img" "$url" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] || fail "without a CA: status $rc"

truncate -s 0 "$TMP/exp.img"
truncate -s 6M "$TMP/exp.img"
check "copy -> https with --tls-verify-peer false" \
    "$NBDFLOW" copy --tls-verify-peer false "$TMP/src.img" \
    "https://127.0.0.1:$HPORT/import_raw_vdi?vdi=disk&format=raw"
flushed2 () { [ "$(grep -c 'chunked into "disk".*flushed' "$SERVER_LOG")" = 2 ]; }
wait_for flushed2
same "$TMP/src.img" "$TMP/exp.img"

# sparse_dd's -good-ciphersuites, mapped to a GnuTLS priority (the server
# offers every AEAD cipher: the one negotiated is the client's choice).
truncate -s 0 "$TMP/exp.img"
truncate -s 6M "$TMP/exp.img"
check "sparse_dd -good-ciphersuites ECDHE-RSA-AES256-GCM-SHA384 over https" \
    env NBDFLOW_TLS_CERTIFICATES="$TMP/pki" \
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" -size 6291456 \
    -dest "http://localhost:$HPORT/import_raw_vdi?vdi=disk&format=raw" \
    -dest-proto chunked -good-ciphersuites ECDHE-RSA-AES256-GCM-SHA384 \
    -encryption-mode always
flushed3 () { [ "$(grep -c 'chunked into "disk".*flushed' "$SERVER_LOG")" = 3 ]; }
wait_for flushed3
same "$TMP/src.img" "$TMP/exp.img"
[ "$(grep 'https: TLS established' "$SERVER_LOG" | tail -n 1 | grep -c "AES-256-GCM")" = 1 ] ||
    fail "the session did not use AES-256-GCM: $(grep 'TLS established' "$SERVER_LOG" | tail -n 1)"
rc=0
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -size 6291456 \
    -dest "https://127.0.0.1:$HPORT/import_raw_vdi?vdi=disk&format=raw" \
    -good-ciphersuites AES256-SHA:DES-CBC3-SHA 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && grep -q "no suite nbdflow offers" "$TMP/err" ||
    fail "-good-ciphersuites of CBC suites only: status $rc: $(cat "$TMP/err")"
# copy --tls-priority is applied: CBC only meets no cipher of the server.
rc=0
"$NBDFLOW" copy --tls-verify-peer false --tls-priority \
    "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-CBC" "$TMP/src.img" \
    "https://127.0.0.1:$HPORT/import_raw_vdi?vdi=disk&format=raw" \
    2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -qi "TLS\|handshake" "$TMP/err" ||
    fail "a CBC-only priority: status $rc: $(cat "$TMP/err")"
note "ok: refused: $(cat "$TMP/err")"
rc=0
"$NBDFLOW" copy --tls-verify-peer false --tls-priority "NOT-A-PRIORITY" \
    "$TMP/src.img" "https://127.0.0.1:$HPORT/import_raw_vdi?vdi=disk" \
    2>"$TMP/err" || rc=$?
[ "$rc" != 0 ] && grep -q 'NOT-A-PRIORITY' "$TMP/err" ||
    fail "a bad priority string: status $rc: $(cat "$TMP/err")"

# tls_of JSON: the destination's "tls" in the copy --json report in file
# JSON: "VERSION CIPHER AUTH UNIFORM", or null.
tls_of () {
    python3 - "$1" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["tls"]["destination"]
print("null" if t is None else
      "%s %s %s %s" % (t["version"], t["cipher"], t["auth"], t["uniform"]))
PY
}
# The report names the cipher --tls-priority leaves, not ours: ChaCha20,
# which our priority puts after both AES-GCM, in TLS 1.2.
truncate -s 0 "$TMP/exp.img"
truncate -s 6M "$TMP/exp.img"
"$NBDFLOW" copy --json --tls-verify-peer false --tls-priority \
    "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+CHACHA20-POLY1305" \
    "$TMP/src.img" "https://127.0.0.1:$HPORT/import_raw_vdi?vdi=disk&format=raw" \
    >"$TMP/chacha.json" || fail "copy -> https with ChaCha20 alone"
flushed4 () { [ "$(grep -c 'chunked into "disk".*flushed' "$SERVER_LOG")" = 4 ]; }
wait_for flushed4
same "$TMP/src.img" "$TMP/exp.img"
got=$(tls_of "$TMP/chacha.json")
[ "$got" = "TLS1.2 CHACHA20-POLY1305 x509 True" ] ||
    fail "a ChaCha20-only Chunked upload reported '$got': $(cat "$TMP/chacha.json")"
grep 'https: TLS established' "$SERVER_LOG" | tail -n 1 |
    grep -qF "TLS1.2 CHACHA20-POLY1305, x509" ||
    fail "the server saw: $(grep 'TLS established' "$SERVER_LOG" | tail -n 1)"
note "ok: copy --json and the server name $got"

# sparse_dd as xapi runs it: without -verify-dest the certificate is not
# checked (pool hosts are self-signed and named by address); with it, the
# chain is, against -cert-bundle-path, and not the name (127.0.0.1 is not
# in the certificate); -sni is accepted. Ciphers given for a local DEST
# are unused, not refused.
for args in "" "-verify-dest -cert-bundle-path $TMP/pki/ca-cert.pem -sni xenhost1"; do
    truncate -s 0 "$TMP/exp.img"
    truncate -s 6M "$TMP/exp.img"
    # shellcheck disable=SC2086
    check "sparse_dd https by address, ${args:-no -verify-dest}" \
        env -u NBDFLOW_TLS_CERTIFICATES "$NBDFLOW" sparse_dd $args \
        -src "$TMP/src.img" -size 6291456 -dest "https://127.0.0.1:$HPORT/nbd/disk"
    same "$TMP/src.img" "$TMP/exp.img"
done
truncate -s 0 "$TMP/exp.img"
truncate -s 6M "$TMP/exp.img"
rc=0
"$NBDFLOW" sparse_dd -verify-dest -cert-bundle-path "$TMP/foreign/ca-cert.pem" \
    -src "$TMP/src.img" -size 6291456 -dest "https://127.0.0.1:$HPORT/nbd/disk" \
    2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -qi "certificate" "$TMP/err" ||
    fail "-verify-dest with a CA that did not sign: status $rc: $(cat "$TMP/err")"
all_zero "$TMP/exp.img" 6291456
check "sparse_dd -good-ciphersuites of CBC suites into a file" \
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" -size 6291456 \
    -dest "$TMP/local.img" -good-ciphersuites AES256-SHA:DES-CBC3-SHA
same "$TMP/src.img" "$TMP/local.img"

# copy --tls-ca-file takes the place of the directory's CA: the foreign
# directory alone would refuse this server.
truncate -s 0 "$TMP/exp.img"
truncate -s 6M "$TMP/exp.img"
# --tls-server-name is the name checked: 127.0.0.1 is not in the
# certificate, localhost is.
check "copy --tls-ca-file over a foreign --tls-certificates" \
    "$NBDFLOW" copy --tls-certificates "$TMP/foreign" \
    --tls-ca-file "$TMP/pki/ca-cert.pem" --tls-server-name localhost \
    "$TMP/src.img" "https://127.0.0.1:$HPORT/nbd/disk"
same "$TMP/src.img" "$TMP/exp.img"

make_random "$TMP/src2.img" 6
tls0=$(grep -c ': tls: ' "$SERVER_LOG" || true)
"$NBDFLOW" copy --json -C 2 --tls-certificates "$TMP/pki" --tls-priority \
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-256-GCM" \
    "$TMP/src2.img" "https://localhost:$HPORT/nbd/disk" >"$TMP/nbd.json" ||
    fail "copy -> https, NBD inside the HTTPS session, 2 connections"
note "ok: copy -> https, NBD inside the HTTPS session, 2 connections"
serve_stop
same "$TMP/src2.img" "$TMP/exp.img"
got=$(tls_of "$TMP/nbd.json")
[ "$got" = "TLS1.3 AES-256-GCM x509-verified True" ] ||
    fail "NBD inside HTTPS with AES-256-GCM alone reported '$got': $(cat "$TMP/nbd.json")"
# Each NBD connection, adopted with its HTTPS session, in --stats.
[ "$(($(grep -c ': tls: ' "$SERVER_LOG") - tls0))" = 2 ] &&
    [ "$(grep -c ': tls: TLS1.3 AES-256-GCM, x509$' "$SERVER_LOG")" = 2 ] ||
    fail "the server's --stats: $(grep ': tls: ' "$SERVER_LOG")"
note "ok: copy --json and the server's --stats name $got"

# A stored upload is closed in order: the sender's close_notify after
# the end marker is read, not left to turn our close into a reset (the
# sender then failed a copy the server had stored: 3 in 100 before).
truncate -s 0 "$TMP/exp.img"
truncate -s 6M "$TMP/exp.img"
serve_tcp --tls=require --tls-certs "$TMP/pki" --http "127.0.0.1:$HPORT" \
    disk="$TMP/exp.img"
bad=0
for i in $(seq 40); do
    "$NBDFLOW" copy --tls-verify-peer false "$TMP/src.img" \
        "https://127.0.0.1:$HPORT/import_raw_vdi?vdi=disk&format=raw" \
        2>>"$TMP/loop.err" || bad=$((bad + 1))
done
[ "$bad" = 0 ] || fail "$bad of 40 stored uploads failed: $(sort -u "$TMP/loop.err")"
serve_stop
same "$TMP/src.img" "$TMP/exp.img"
note "ok: 40 uploads in a row, each closed in order"
note "ok: https uploads"
