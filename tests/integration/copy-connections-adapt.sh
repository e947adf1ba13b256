#!/bin/bash
# copy-connections-adapt.sh: with the automatic connection count, nbdflow
# copy adds NBD connections while it runs when the window (2 x bandwidth x
# RTT) needs more than the ones it has can carry, each being bounded by
# TCP's largest send buffer. Over an emulated 1 Gbit/s, 20 ms link
# (bench/linkem, namespaces of its own) whose namespaces cap TCP buffers
# at 128 KiB send / 256 KiB receive, four connections hold 512 KiB: any
# rate above ~13 MB/s wants more, so the count must grow past 4 (to at
# most 16), in both directions; --connections 4 must stay at 4. A server
# that advertises multi-conn but caps its connections (qemu-nbd -e 4)
# leaves the added ones hanging: the copy must still end, quietly. Every
# copy is verified by xxh128. No timing is asserted. Needs root; skips
# otherwise.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

linkem_prereqs
need nbdkit
need qemu-nbd qemu-utils
need python3
need sysctl procps

tmpdir_make
linkem_link c 10.199.5 20 1gbit
for ns in "$NS_A" "$NS_B"; do
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_wmem="4096 16384 131072" \
        net.ipv4.tcp_rmem="4096 65536 262144" ||
        skip "cannot set TCP buffer limits in a namespace (kernel too old?)"
done

# listening PORT: true once a server listens on PORT in namespace B.
listening () {
    [ -n "$(ip netns exec "$NS_B" ss -Hltn "sport = :$1")" ]
}
ip netns exec "$NS_B" nbdkit -f -i $NET.2 -p 10809 memory 128M \
    >"$TMP/kit.log" 2>&1 &
wait_for listening 10809
want=$("$NBDFLOW" sum --algo xxh128 random:128M:7 | cut -d' ' -f1)

# conns FILE SIDE: the connection count the JSON report gives for SIDE.
conns () {
    python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["connections"][sys.argv[2]])' "$1" "$2"
}
# landed NAME XXH: the export, read back inside the server's namespace,
# hashes to XXH.
landed () {
    local got
    got=$(ip netns exec "$NS_B" "$NBDFLOW" sum --algo xxh128 \
        "nbd://$NET.2:10809/" | cut -d' ' -f1)
    [ -n "$2" ] && [ "$2" = "$got" ] ||
        fail "$1: the export's xxh128 $got differs from the source's $2"
}

check "copy 128 MiB, automatic count" ip netns exec "$NS_A" \
    "$NBDFLOW" copy --json random:128M:7 "nbd://$NET.2:10809/" \
    >"$TMP/auto.json"
landed "automatic count" "$want"
n=$(conns "$TMP/auto.json" destination)
[ "$n" -gt 4 ] && [ "$n" -le 16 ] ||
    fail "automatic count: $n destination connections, expected 5..16"
note "ok: writing, the count grew to $n connections; the copy landed"

check "copy back to a file, automatic count" ip netns exec "$NS_A" \
    "$NBDFLOW" copy --json "nbd://$NET.2:10809/" "$TMP/back.img" \
    >"$TMP/back.json"
got=$("$NBDFLOW" sum --algo xxh128 "$TMP/back.img" | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "read back: xxh128 $got, source $want"
n=$(conns "$TMP/back.json" source)
[ "$n" -gt 4 ] && [ "$n" -le 16 ] ||
    fail "reading: $n source connections, expected 5..16"
note "ok: reading, the count grew to $n connections; the file matches"
rm -f "$TMP/back.img"

# Another source, so that this copy cannot pass on the last one's bytes.
want8=$("$NBDFLOW" sum --algo xxh128 random:128M:8 | cut -d' ' -f1)
check "copy 128 MiB, --connections 4" ip netns exec "$NS_A" \
    "$NBDFLOW" copy --json --connections 4 random:128M:8 \
    "nbd://$NET.2:10809/" >"$TMP/four.json"
landed "--connections 4" "$want8"
n=$(conns "$TMP/four.json" destination)
[ "$n" -eq 4 ] || fail "--connections 4 used $n connections"
note "ok: --connections 4 stays at 4; the copy landed"

truncate -s 128M "$TMP/capped.img"
ip netns exec "$NS_B" qemu-nbd -f raw -t -e 4 -b $NET.2 -p 10810 \
    "$TMP/capped.img" >"$TMP/qemu-nbd.log" 2>&1 &
wait_for listening 10810
ip netns exec "$NS_A" "$NBDFLOW" copy --json random:128M:7 \
    "nbd://$NET.2:10810/" >"$TMP/capped.json" 2>"$TMP/capped.err" ||
    fail "copy into qemu-nbd -e 4 failed: $(cat "$TMP/capped.err")"
got=$("$NBDFLOW" sum --algo xxh128 "$TMP/capped.img" | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "qemu-nbd -e 4: xxh128 $got, source $want"
n=$(conns "$TMP/capped.json" destination)
[ "$n" -le 4 ] || fail "qemu-nbd -e 4: $n connections joined"
[ ! -s "$TMP/capped.err" ] ||
    fail "qemu-nbd -e 4: the copy printed: $(cat "$TMP/capped.err")"
note "ok: qemu-nbd -e 4: $n connections, nothing printed, the file matches"
echo "PASS: the connection count follows the window; every copy verified"
