#!/bin/bash
# Many small pipelined requests over TLS against a server that takes one
# request at a time (--max-inflight 1). The TLS transport reads the socket
# in large chunks and decrypts whole records, so while the server is paused
# several requests wait inside the transport where epoll cannot see them;
# if resuming ever relied on a socket event, these copies would hang. Each
# copy runs under a time limit and is verified byte for byte, in both
# directions, with PSK and X.509, with our client and with nbdcopy.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls-pki.inc"

need timeout coreutils
tmpdir_make
pki_ca "$TMP/ca" "nbdflow test CA"
pki_dir "$TMP/ca" "$TMP/pki"
mkdir -p "$TMP/psk"
psk_make "$TMP/psk/keys.psk" alice
MIB=4
LIMIT=120 # seconds: minutes of slack for a copy that takes about one

make_random "$TMP/src.img" "$MIB"
truncate -s "${MIB}M" "$TMP/dst.img"
serve_tcp --tls=require --tls-certs "$TMP/pki" --tls-psk "$TMP/psk/keys.psk" \
    --max-inflight 1 "$TMP/dst.img"

# small_copy URI SIZE: uploads src.img to URI in SIZE-byte
# requests over one connection, downloads it back the same way, and
# compares both ways. The export is scribbled over first so that a copy
# that silently did nothing cannot pass.
small_copy () {
    local uri=$1 size=$2
    dd if=/dev/urandom of="$TMP/dst.img" bs=1M count="$MIB" conv=notrunc \
        status=none || fail "cannot scribble over the export"
    check "upload in $size-byte requests ($uri)" timeout "$LIMIT" \
        "$NBDFLOW" copy --connections 1 --request-size "$size" \
        "$TMP/src.img" "$uri"
    same "$TMP/src.img" "$TMP/dst.img"
    rm -f "$TMP/back.img"
    check "download in $size-byte requests ($uri)" timeout "$LIMIT" \
        "$NBDFLOW" copy --connections 1 --request-size "$size" \
        "$uri" "$TMP/back.img"
    same "$TMP/src.img" "$TMP/back.img"
}

PSK_URI="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$TMP/psk/keys.psk"
X509_URI="nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/pki"
small_copy "$PSK_URI" 4096
small_copy "$PSK_URI" 512
small_copy "$X509_URI" 4096

# libnbd pipelines on its own terms: 64 requests of 4 KiB in flight.
if command -v nbdcopy >/dev/null 2>&1; then
    dd if=/dev/urandom of="$TMP/dst.img" bs=1M count="$MIB" conv=notrunc \
        status=none || fail "cannot scribble over the export"
    check "nbdcopy upload, 64 x 4 KiB in flight" timeout "$LIMIT" \
        nbdcopy --connections=1 --requests=64 --request-size=4096 \
        "$TMP/src.img" "$PSK_URI"
    same "$TMP/src.img" "$TMP/dst.img"
    rm -f "$TMP/back.img"
    check "nbdcopy download, 64 x 4 KiB in flight" timeout "$LIMIT" \
        nbdcopy --connections=1 --requests=64 --request-size=4096 \
        "$PSK_URI" "$TMP/back.img"
    same "$TMP/src.img" "$TMP/back.img"
else
    note "SKIPPED PART: nbdcopy not installed (Debian package: libnbd-bin)"
fi

server_alive || fail "the server died"
serve_stop
