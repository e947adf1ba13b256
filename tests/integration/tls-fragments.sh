#!/bin/bash
# Our client against a TLS server that shapes its records as TLS allows
# (tlsfake.py): a ServerHello cut into two records, and TLS 1.3 session
# tickets arriving in the same read as the GO reply. Both reach the client
# in one read, where poll sees nothing more; the client must go on with
# what it holds. Each copy finishes (the handshake limit, --timeout 10,
# is the bound: a stall fails it) and equals the served pattern.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls-pki.inc"
tmpdir_make
pki_ca "$TMP/ca" "nbdflow test CA"
pki_dir "$TMP/ca" "$TMP/pki"
size=$((3 << 20))
make_fake_pattern "$TMP/want.img" "$size"
for mode in splithello tickets; do
    sock="$TMP/$mode.sock"
    python3 "$(dirname "$0")/tlsfake.py" "$sock" "$TMP/pki" "$mode" "$size" \
        >"$TMP/$mode.log" 2>&1 &
    SERVER_PIDS+=($!)
    wait_for test -S "$sock"
    uri="nbds+unix:///?socket=$sock&tls-certificates=$TMP/pki"
    rm -f "$TMP/out.img"
    timeout 60 "$NBDFLOW" copy --timeout 10 "$uri" "$TMP/out.img" \
        2>"$TMP/err" || fail "$mode: copy failed: $(cat "$TMP/err")"
    same "$TMP/want.img" "$TMP/out.img"
    out=$(timeout 60 "$NBDFLOW" info --timeout 10 "$uri" 2>&1) ||
        fail "$mode: info failed: $out"
    grep -q 'with TLS' <<<"$out" || fail "$mode: info: $out"
    note "ok: $mode: copy and info over TLS"
done
grep -q 'holding [1-9][0-9]* bytes of tickets' "$TMP/tickets.log" ||
    fail "the fake server held no tickets back: $(cat "$TMP/tickets.log")"
echo "PASS: records split or bunched as TLS allows do not stall the client"
