#!/bin/bash
# What our client says when TLS is refused, in words a user can act on:
# a PSK that the server does not accept (another key, or a user the
# server does not know) is "the server rejected the PSK user name or
# key", not GnuTLS's "Illegal parameter"; a plaintext client against
# --tls=require is told that the server requires TLS and to use nbds://,
# not "send STARTTLS first". A good client still gets in.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls-pki.inc"
need psktool gnutls-bin
tmpdir_make
psk_make "$TMP/keys.psk" alice
psk_make "$TMP/wrong.psk" alice # same user, another key
psk_make "$TMP/carol.psk" carol # a user the server does not know
truncate -s 4M "$TMP/disk.img"
serve_tcp --tls=require --tls-psk "$TMP/keys.psk" "$TMP/disk.img"
H=127.0.0.1:$PORT

# refused WANT ARGS...: "nbdflow ARGS" exits 1 with one line containing
# WANT (a fixed string).
refused () {
    local want=$1 rc=0
    shift
    timeout 30 "$NBDFLOW" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = 1 ] || fail "$*: exit $rc: $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$*: not one line: $(cat "$TMP/err")"
    grep -qF -- "$want" "$TMP/err" || fail "$*: $(cat "$TMP/err")"
    note "ok: $*: $(cat "$TMP/err")"
}

refused "the server rejected the PSK user name or key" \
    info "nbds://alice@$H/?tls-psk-file=$TMP/wrong.psk"
refused "the server rejected the PSK user name or key" \
    copy "nbds://carol@$H/?tls-psk-file=$TMP/carol.psk" null:
refused "the server requires TLS: use an nbds:// URI" info "nbd://$H/"
grep -q "send STARTTLS first" "$TMP/err" ||
    fail "the server's own words are gone: $(cat "$TMP/err")"
refused "the server requires TLS: use an nbds:// URI" \
    copy "nbd://$H/" "$TMP/out.img"
refused "the server requires TLS: use an nbds:// URI" info --list "nbd://$H/"
"$NBDFLOW" info "nbds://alice@$H/?tls-psk-file=$TMP/keys.psk" >"$TMP/out" ||
    fail "the right key was refused"
server_alive || fail "the server died"
serve_stop
echo "PASS"
