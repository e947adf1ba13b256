#!/bin/bash
# TLS interop: nbdinfo, nbdcopy and qemu-img talk to `nbdflow serve` over
# TLS, with X.509 certificates and with pre-shared keys, over TCP and a
# Unix socket. Every copy is compared byte for byte, and each one writes
# different random data, so a copy that did nothing cannot pass.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls-pki.inc"

need nbdinfo libnbd-bin
need nbdcopy libnbd-bin
need qemu-img qemu-utils

tmpdir_make
pki_ca "$TMP/ca" "nbdflow test CA"
pki_dir "$TMP/ca" "$TMP/pki"
mkdir -p "$TMP/psk"
psk_make "$TMP/psk/keys.psk" alice # qemu reads DIR/keys.psk
MIB=24
for i in 1 2 3 4 5 6; do make_random "$TMP/src$i.img" "$MIB"; done
truncate -s "${MIB}M" "$TMP/dst.img"

serve_tcp --tls=require --tls-certs "$TMP/pki" --tls-psk "$TMP/psk/keys.psk" \
    "$TMP/dst.img"
X509="nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/pki"
PSK="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$TMP/psk/keys.psk"

# nbdinfo: the handshake is TLS and the export is seen whole.
out=$(nbdinfo "$X509" 2>&1) || fail "nbdinfo over X.509: $out"
grep -q "with TLS" <<<"$out" || fail "nbdinfo over X.509 did not report TLS: $out"
grep -q "export-size: $((MIB << 20))" <<<"$out" || fail "nbdinfo: wrong size: $out"
note "ok: nbdinfo over X.509"
out=$(nbdinfo "$PSK" 2>&1) || fail "nbdinfo over PSK: $out"
grep -q "with TLS" <<<"$out" || fail "nbdinfo over PSK did not report TLS: $out"
note "ok: nbdinfo over PSK"

# nbdcopy both ways, both credential kinds.
check "nbdcopy upload over X.509" nbdcopy "$TMP/src1.img" "$X509"
same "$TMP/src1.img" "$TMP/dst.img"
check "nbdcopy download over X.509" nbdcopy "$X509" "$TMP/back.img"
same "$TMP/src1.img" "$TMP/back.img"
check "nbdcopy upload over PSK" nbdcopy "$TMP/src2.img" "$PSK"
same "$TMP/src2.img" "$TMP/dst.img"
rm -f "$TMP/back.img"
check "nbdcopy download over PSK" nbdcopy "$PSK" "$TMP/back.img"
same "$TMP/src2.img" "$TMP/back.img"

# qemu-img with qemu's TLS credential objects.
check "qemu-img convert over X.509" qemu-img convert -n -f raw "$TMP/src3.img" \
    --object "tls-creds-x509,id=tls0,endpoint=client,dir=$TMP/pki" \
    --target-image-opts "driver=nbd,host=127.0.0.1,port=$PORT,tls-creds=tls0"
same "$TMP/src3.img" "$TMP/dst.img"
check "qemu-img convert over PSK" qemu-img convert -n -f raw "$TMP/src4.img" \
    --object "tls-creds-psk,id=tls0,endpoint=client,dir=$TMP/psk,username=alice" \
    --target-image-opts "driver=nbd,host=127.0.0.1,port=$PORT,tls-creds=tls0"
same "$TMP/src4.img" "$TMP/dst.img"
rm -f "$TMP/back.img"
check "qemu-img convert from the server over PSK" qemu-img convert -O raw \
    --object "tls-creds-psk,id=tls0,endpoint=client,dir=$TMP/psk,username=alice" \
    --image-opts "driver=nbd,host=127.0.0.1,port=$PORT,tls-creds=tls0" \
    "$TMP/back.img"
same "$TMP/src4.img" "$TMP/back.img"
serve_stop

# --tls=on: TLS offered, plaintext still served; over a Unix socket.
sock=$TMP/nbd.sock
serve_start --unix "$sock" --tls=on --tls-psk "$TMP/psk/keys.psk" "$TMP/dst.img"
out=$(nbdinfo "nbd+unix:///?socket=$sock" 2>&1) || fail "plain nbdinfo with --tls=on: $out"
grep -q "without TLS" <<<"$out" || fail "plain client got TLS?: $out"
note "ok: --tls=on still serves plaintext"
check "nbdcopy over nbds+unix with PSK" nbdcopy "$TMP/src5.img" \
    "nbds+unix://alice@/?socket=$sock&tls-psk-file=$TMP/psk/keys.psk"
same "$TMP/src5.img" "$TMP/dst.img"
check "plain nbdcopy with --tls=on" nbdcopy "$TMP/src6.img" \
    "nbd+unix:///?socket=$sock"
same "$TMP/src6.img" "$TMP/dst.img"
serve_stop
# Backpressure: one request in flight per connection, so reading stops and
# resumes all the time while GnuTLS may hold decrypted bytes.
serve_tcp --tls=require --tls-psk "$TMP/psk/keys.psk" --max-inflight 1 \
    --threads 2 "$TMP/dst.img"
PSK="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$TMP/psk/keys.psk"
check "nbdcopy upload, --max-inflight 1" nbdcopy --request-size=65536 \
    "$TMP/src1.img" "$PSK"
same "$TMP/src1.img" "$TMP/dst.img"
rm -f "$TMP/back.img"
check "nbdcopy download, --max-inflight 1" nbdcopy "$PSK" "$TMP/back.img"
same "$TMP/src1.img" "$TMP/back.img"
serve_stop
echo "PASS: nbdinfo, nbdcopy and qemu-img over TLS (X.509, PSK, TCP, Unix)"
