#!/bin/bash
# xapi-https.sh: uploads over HTTPS (TLS around the whole connection, as
# xapi's port 443 is): copy to https://localhost of our serve --http
# --tls-certs, checked against the test CA (--tls-certificates); refused
# against a CA that did not sign the server, and without a CA (the
# system's store does not know it) unless --tls-verify-peer false; NBD
# inside HTTPS is refused with a clear status. Every copy verified.
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
serve_tcp --tls=on --tls-certs "$TMP/pki" --http "127.0.0.1:$HPORT" \
    "disk=$TMP/exp.img"
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

rc=0
"$NBDFLOW" copy --tls-certificates "$TMP/pki" "$TMP/src.img" \
    "https://localhost:$HPORT/nbd/disk" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -q "501" "$TMP/err" ||
    fail "NBD inside HTTPS: status $rc: $(cat "$TMP/err")"
serve_stop
note "ok: https uploads"
