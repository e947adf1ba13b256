#!/bin/bash
# verify.sh: checks that the link emulator delivers what it is set to.
#
#   verify.sh [LINKEM]      (LINKEM default: build/bench/nbdflow-linkem)
#
# For each RTT setting (RTTS, default "0.2 2 10 50" ms) at RATE (default
# 1gbit), it brings the namespaces up with netns-up.sh --rtt-ms, then:
#   - ping: 200 echoes 10 ms apart; the median RTT must be within 10% of
#     the setting;
#   - iperf3: one TCP stream for SECS seconds (default 6, after OMIT=2 s
#     of slow start that are not counted), and PAR streams (default 8)
#     the same way; the better of the two must reach 90% of
#     the rate. The single stream is shown too: at 50 ms one stream is
#     limited by its send buffer (net.ipv4.tcp_wmem max 4 MiB here, while
#     1 Gbit/s x 50 ms = 6.25 MB must be in flight), which is TCP's limit,
#     not the link's.
# iperf3 counts TCP payload while the rate limits IP packets, so its
# ceiling is 99.4% at MTU 9000 (8948 payload bytes per packet) and 96.5%
# at MTU 1500.
#
# Prints a table; exits 0 if every row passed, 1 if one failed, 77 when
# it cannot run here (not root, tools missing).
# Environment: MTU (default 9000), SPIN_US (default 100), RTTS, RATE,
# SECS, OMIT, PAR.
set -u

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
linkem=${1:-${LINKEM:-$repo/build/bench/nbdflow-linkem}}
rtts=${RTTS:-0.2 2 10 50}
rate=${RATE:-1gbit}
mtu=${MTU:-9000}
spin=${SPIN_US:-100}
secs=${SECS:-6}
omit=${OMIT:-2}
par=${PAR:-8}

[ "$(id -u)" = 0 ] || { echo "verify.sh: needs root (network namespaces)"; exit 77; }
for t in ip:iproute2 ping:iputils-ping iperf3:iperf3; do
    command -v "${t%%:*}" >/dev/null ||
        { echo "verify.sh: ${t%%:*} not installed (Debian package: ${t##*:})"; exit 77; }
done
[ -x "$linkem" ] || { echo "verify.sh: no emulator at $linkem (build it, or pass its path)"; exit 77; }

# Rate in Mbit/s, for the comparisons.
rate_mbit=$(awk -v r="$rate" 'BEGIN {
    v = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
    m = (u ~ /^g/) ? 1000 : (u ~ /^m/) ? 1 : (u ~ /^k/) ? 0.001 : 0.000001
    if (u ~ /bps$/) m *= 8
    print v * m }')

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nbdflow-linkem.XXXXXX") || exit 1
cleanup () {
    "$here/netns-down.sh" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# median: of the numbers on stdin.
median () {
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# iperf_mbit STREAMS: receiver-side Mbit/s of one iperf3 run A -> B.
iperf_mbit () {
    ip netns exec nbdflow-b iperf3 -s -1 -B 10.199.0.2 >/dev/null 2>&1 &
    local srv=$! i
    for ((i = 0; i < 50; i++)); do
        ip netns exec nbdflow-b ss -ltn 2>/dev/null | grep -q ':5201 ' && break
        sleep 0.1
    done
    ip netns exec nbdflow-a iperf3 -c 10.199.0.2 -t "$secs" -O "$omit" -P "$1" -f m -J \
        >"$tmp/iperf.json" 2>/dev/null
    wait "$srv" 2>/dev/null
    python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
print("%.0f" % (d["end"]["sum_received"]["bits_per_second"] / 1e6))' "$tmp/iperf.json" 2>/dev/null || echo 0
}

fail=0
rows=()
for rtt in $rtts; do
    "$here/netns-down.sh" >/dev/null 2>&1
    if ! "$here/netns-up.sh" --mtu "$mtu" --start "$linkem" --log "$tmp/linkem-$rtt.log" \
            --rtt-ms "$rtt" -- --rate "$rate" --spin-us "$spin" >/dev/null 2>"$tmp/up.err"; then
        cat "$tmp/up.err" >&2
        echo "verify.sh: netns-up.sh failed for RTT $rtt ms"
        exit 1
    fi
    added=$(sed -n 's/.*adding \([0-9.]*\) ms each way.*/\1/p' "$tmp/up.err")
    base=$(sed -n 's/.*without delay \([0-9.]*\) ms.*/\1/p' "$tmp/up.err")
    ping_med=$(ip netns exec nbdflow-a ping -n -c 200 -i 0.01 -W 2 10.199.0.2 2>/dev/null |
        sed -n 's/.* time=\([0-9.]*\) ms.*/\1/p' | median)
    one=$(iperf_mbit 1)
    many=$(iperf_mbit "$par")
    verdict=$(awk -v p="$ping_med" -v r="$rtt" -v a="$one" -v b="$many" -v rate="$rate_mbit" 'BEGIN {
        best = (a > b) ? a : b
        okp = (p != "nan" && p >= 0.9 * r && p <= 1.1 * r)
        okr = (best >= 0.9 * rate && best <= 1.1 * rate)
        printf "%+.1f%% %.1f%% %s", (p - r) / r * 100, best / rate * 100, (okp && okr) ? "pass" : "FAIL" }')
    set -- $verdict
    [ "$3" = pass ] || fail=1
    rows+=("$(printf '| %6s | %5s | %6s | %8s | %6s | %8s | %8s | %6s | %s |' \
        "$rtt" "$base" "$added" "$ping_med" "$1" "$one" "$many" "$2" "$3")")
    "$here/netns-down.sh" >/dev/null 2>&1
done

echo "Link emulator check: rate $rate, MTU $mtu, spin ${spin} us; ping = median of 200, iperf3 ${secs} s after ${omit} s"
echo
echo "| RTT ms | base ms | +delay ms each way | ping median ms | error | iperf3 1 stream Mbit/s | iperf3 -P $par Mbit/s | best/rate | verdict |"
echo "|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
exit $fail
