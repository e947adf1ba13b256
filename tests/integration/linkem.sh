#!/bin/bash
# linkem.sh: the user-space link emulator (bench/linkem) between two
# network namespaces of its own: set to 10 ms RTT, ping must see 10 ms
# (median within 10%), a 4 MiB TCP transfer must arrive intact and must
# have crossed the emulator, 100% loss must cut the link, and namespaces
# without the nbdflow- prefix must be refused. Needs root, /dev/net/tun,
# iproute2, iputils-ping and python3; skips otherwise.
. "$(dirname "$0")/lib.sh"

linkem_prereqs
need python3

# Our own namespaces, named after this test's PID so that a benchmark
# running at the same time keeps its own.
NS_A=nbdflow-ta$$
NS_B=nbdflow-tb$$
NET=10.199.7
tmpdir_make
on_exit "'$DOWN' --ns-a $NS_A --ns-b $NS_B >/dev/null 2>&1"

check_fails "a namespace without the nbdflow- prefix is refused" \
    "$UP" --ns-a test-a --ns-b "$NS_B" --net $NET
check_fails "a public address range is refused" \
    "$UP" --ns-a "$NS_A" --ns-b "$NS_B" --net 8.8.8
"$LINKEM" --ns-a other --ns-b "$NS_B" --quiet 2>"$TMP/refuse.err" &&
    fail "the emulator accepted a namespace without the nbdflow- prefix"
grep -q 'refusing' "$TMP/refuse.err" ||
    fail "the emulator failed without refusing: $(cat "$TMP/refuse.err")"
note "ok: the emulator refuses a foreign namespace"

# median: of the numbers on stdin.
median () {
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

up () {
    "$UP" --ns-a "$NS_A" --ns-b "$NS_B" --net $NET --start "$LINKEM" \
        --log "$TMP/linkem.log" "$@" >"$TMP/up.out" 2>"$TMP/up.err" ||
        { cat "$TMP/up.err" >&2; fail "netns-up.sh failed: $*"; }
}
down () {
    "$DOWN" --ns-a "$NS_A" --ns-b "$NS_B" || fail "netns-down.sh failed"
}

# --- 10 ms RTT, 1 Gbit/s -------------------------------------------------
up --rtt-ms 10 -- --rate 1gbit
note "$(cat "$TMP/up.err")"
rtt=$(ip netns exec "$NS_A" ping -n -c 50 -i 0.02 -W 2 $NET.2 |
    sed -n 's/.* time=\([0-9.]*\) ms.*/\1/p' | median)
[ -n "$rtt" ] || fail "no ping replies across the emulated link"
awk -v r="$rtt" 'BEGIN { exit !(r >= 9 && r <= 11) }' ||
    fail "ping median $rtt ms, expected 10 ms +-10%"
note "ok: ping median $rtt ms for a 10 ms setting"

# A 4 MiB TCP transfer B <- A, compared byte for byte.
make_random "$TMP/src" 4
port=5399
ip netns exec "$NS_B" timeout 20 python3 - "$NET.2" $port "$TMP/dst" <<'PY' &
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
c, _ = s.accept()
with open(sys.argv[3], "wb") as f:
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        f.write(b)
PY
srv=$!
sent=0
for ((i = 0; i < 50; i++)); do
    if ip netns exec "$NS_A" timeout 20 python3 - "$NET.2" $port "$TMP/src" <<'PY' 2>/dev/null
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
with open(sys.argv[3], "rb") as f:
    c.sendall(f.read())
c.shutdown(socket.SHUT_WR)
c.recv(1)
c.close()
PY
    then sent=1; break; fi
    sleep 0.1
done
wait "$srv" || fail "receiver in $NS_B failed"
[ "$sent" = 1 ] || fail "could not send 4 MiB across the emulated link"
same "$TMP/src" "$TMP/dst"

down # the emulator prints its counters as it stops
grep a-\>b "$TMP/linkem.log" | tail -n 1 >&2
bytes=$(sed -n 's/.*exit a->b: .* out [0-9]* pkts \([0-9]*\) B.*/\1/p' "$TMP/linkem.log" | tail -n 1)
[ -n "$bytes" ] || fail "no counters from the emulator in its log"
[ "$bytes" -ge $((4 * 1024 * 1024)) ] ||
    fail "only $bytes bytes crossed the emulator a->b; the transfer took another path"
note "ok: $bytes bytes crossed the emulator"

# --- 100% loss cuts the link --------------------------------------------------
up -- --loss 100
check_fails "no ping reply through a link with 100% loss" \
    ip netns exec "$NS_A" ping -n -q -c 3 -i 0.1 -W 1 $NET.2
down
grep -q 'lost [1-9]' "$TMP/linkem.log" || fail "the emulator counted no lost packets"
ip netns list | grep -q "$NS_A" && fail "namespace $NS_A still exists after netns-down.sh"
echo "PASS: 10 ms RTT ($rtt ms), 4 MiB intact over the emulator, loss and refusals work"
