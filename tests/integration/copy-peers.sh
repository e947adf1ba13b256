#!/bin/bash
# copy-peers.sh: file -> NBD, NBD -> file and NBD -> NBD against qemu-nbd,
# nbdkit (memory and file plugins) and nbd-server, over Unix sockets and
# TCP; every copy checked byte for byte.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need qemu-nbd qemu-utils
need nbdkit
need nbd-server
tmpdir_make

# wait_for CMD...: polls CMD for at most 10 s.
bg () { "$@" >>"$TMP/peers.log" 2>&1 & SERVER_PIDS+=($!); }
port_open () { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

make_random "$TMP/src.img" 24
# Odd tail, hole in the middle.
dd if=/dev/urandom of="$TMP/src.img" bs=4096 count=3 seek=9000 status=none
truncate -s 40M "$TMP/src.img"
size=$(stat -c %s "$TMP/src.img")

roundtrip () {  # NAME URI
    local name=$1 uri=$2
    check "$name: file -> nbd" "$NBDFLOW" copy "$TMP/src.img" "$uri"
    rm -f "$TMP/back.img"
    check "$name: nbd -> file" "$NBDFLOW" copy "$uri" "$TMP/back.img"
    truncate -s "$size" "$TMP/back.img"
    same "$TMP/src.img" "$TMP/back.img"
}

# qemu-nbd over a Unix socket and over TCP.
truncate -s "$size" "$TMP/q.img"
bg qemu-nbd -f raw -t -k "$TMP/q.sock" "$TMP/q.img"
wait_for test -S "$TMP/q.sock"
roundtrip qemu-nbd-unix "nbd+unix:///?socket=$TMP/q.sock"
qport=$(free_port)
truncate -s "$size" "$TMP/q2.img"
bg qemu-nbd -f raw -t -e 4 -b 127.0.0.1 -p "$qport" "$TMP/q2.img"
wait_for port_open "$qport"
roundtrip qemu-nbd-tcp "nbd://127.0.0.1:$qport/"

# nbdkit memory (multi-conn) and file plugins.
bg nbdkit -f -U "$TMP/m.sock" memory "$size"
wait_for test -S "$TMP/m.sock"
roundtrip nbdkit-memory "nbd+unix:///?socket=$TMP/m.sock"
truncate -s "$size" "$TMP/k.img"
kport=$(free_port)
bg nbdkit -f -i 127.0.0.1 -p "$kport" file "$TMP/k.img"
wait_for port_open "$kport"
roundtrip nbdkit-file-tcp "nbd://127.0.0.1:$kport/"
same "$TMP/src.img" "$TMP/k.img"

# nbd-server (named export over TCP).
truncate -s "$size" "$TMP/n.img"
nport=$(free_port)
cat >"$TMP/nbd-server.conf" <<CONF
[generic]
    listenaddr = 127.0.0.1
    port = $nport
    allowlist = true
[disk]
    exportname = $TMP/n.img
CONF
# nbd-server forks into the background; its pid file says whom to stop.
nbd-server -C "$TMP/nbd-server.conf" -p "$TMP/nbd-server.pid" \
    >>"$TMP/peers.log" 2>&1
wait_for test -s "$TMP/nbd-server.pid"
SERVER_PIDS+=("$(cat "$TMP/nbd-server.pid")")
wait_for port_open "$nport"
roundtrip nbd-server "nbd://127.0.0.1:$nport/disk"
same "$TMP/src.img" "$TMP/n.img"

# NBD -> NBD across servers, with more connections than the default.
"$NBDFLOW" copy "$TMP/src.img" "nbd://127.0.0.1:$qport/" >/dev/null
check "qemu-nbd -> nbd-server" \
    "$NBDFLOW" copy --connections 2 "nbd://127.0.0.1:$qport/" \
    "nbd://127.0.0.1:$nport/disk"
check "nbd-server -> nbdkit memory, small requests" \
    "$NBDFLOW" copy --request-size 64K --inflight 1M \
    "nbd://127.0.0.1:$nport/disk" "nbd+unix:///?socket=$TMP/m.sock"
rm -f "$TMP/back.img"
"$NBDFLOW" copy "nbd+unix:///?socket=$TMP/m.sock" "$TMP/back.img"
same "$TMP/src.img" "$TMP/back.img"
same "$TMP/src.img" "$TMP/n.img"
echo "PASS"
