#!/bin/bash
# netns-up.sh: creates the two network namespaces of the link emulator,
# each holding one TUN device with a private test address, and optionally
# starts nbdflow-linkem between them.
#
#   netns-up.sh [--ns-a NAME] [--ns-b NAME] [--dev NAME] [--mtu N]
#               [--net 10.199.0] [--start LINKEM [--log FILE] [--rtt-ms MS]
#               [-- LINKEM-ARGS...]]
#
# Namespace A gets NET.1, namespace B gets NET.2, point to point over the
# TUN devices; nothing is routed anywhere else, and the host's own
# interfaces are never touched. Names must start with "nbdflow-".
# With --start, the emulator runs in the background (it lives in namespace
# A, so netns-down.sh finds and stops it); its PID is printed on stdout
# once both TUN devices have carrier.
# --rtt-ms MS calibrates: it measures the round trip of the emulated path
# with no added delay (median of 200 pings; ~0.1 ms here, the cost of the
# TUN hops and wake-ups), then restarts the emulator adding the rest, half
# each way, so that ping sees MS; it re-measures and corrects up to twice
# while the median is off by more than 3%. Takes 2-6 s. Don't pass
# --delay-ms with it.
#
# The MTU defaults to 9000: at 1500 the emulator and the receiving TCP
# stack (which runs in the emulator's write calls) fill one core of this
# 2-core machine at about 1 Gbit/s; see README.md.
#
# Exit: 0 ready, 1 error (anything half made is removed again),
# 2 usage, 77 not root or no TUN/namespace support.
set -u

ns_a=nbdflow-a ns_b=nbdflow-b dev=nbdf0 mtu=9000 net=10.199.0
linkem= log=/dev/null rtt_ms=
usage () { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --ns-a) ns_a=${2:?}; shift 2 ;;
        --ns-b) ns_b=${2:?}; shift 2 ;;
        --dev) dev=${2:?}; shift 2 ;;
        --mtu) mtu=${2:?}; shift 2 ;;
        --net) net=${2:?}; shift 2 ;;
        --start) linkem=${2:?}; shift 2 ;;
        --log) log=${2:?}; shift 2 ;;
        --rtt-ms) rtt_ms=${2:?}; shift 2 ;;
        --) shift; break ;;
        -h|--help) usage ;;
        *) echo "netns-up.sh: unknown argument \"$1\"" >&2; usage ;;
    esac
done

if [ "$(id -u)" != 0 ]; then
    echo "netns-up.sh: needs root to create network namespaces and TUN devices" >&2
    exit 77
fi
if [ ! -c /dev/net/tun ]; then
    echo "netns-up.sh: no /dev/net/tun on this machine" >&2
    exit 77
fi
command -v ip >/dev/null || { echo "netns-up.sh: ip not installed (Debian package: iproute2)" >&2; exit 77; }

for ns in "$ns_a" "$ns_b"; do
    case $ns in
        nbdflow-?*) ;;
        *) echo "netns-up.sh: namespace \"$ns\" refused: names must start with nbdflow-" >&2; exit 2 ;;
    esac
    if ip netns list | grep -qw -- "^$ns"; then
        echo "netns-up.sh: namespace $ns already exists; run netns-down.sh first" >&2
        exit 1
    fi
done
[ "$ns_a" != "$ns_b" ] || { echo "netns-up.sh: --ns-a and --ns-b must differ" >&2; exit 2; }
# Only private test ranges: 10/8, 172.16/12, 192.168/16.
if ! echo "$net" | grep -Eq '^(10\.[0-9]{1,3}|172\.(1[6-9]|2[0-9]|3[01])|192\.168)\.[0-9]{1,3}$'; then
    echo "netns-up.sh: --net \"$net\" refused: give three octets of a private range, e.g. 10.199.0" >&2
    exit 2
fi
case $mtu in
    ''|*[!0-9]*) echo "netns-up.sh: bad --mtu \"$mtu\"" >&2; exit 2 ;;
esac

made=()
linkem_pid=
cleanup () {
    local ns
    [ -n "$linkem_pid" ] && kill -TERM "$linkem_pid" 2>/dev/null
    for ns in "${made[@]}"; do
        ip netns del "$ns" 2>/dev/null
    done
}
trap 'cleanup; exit 1' EXIT
trap 'exit 1' INT TERM

step () {
    "$@" || { echo "netns-up.sh: failed: $*" >&2; exit 1; }
}

i=0
for ns in "$ns_a" "$ns_b"; do
    i=$((i + 1))
    self=$net.$i
    peer=$net.$((3 - i))
    if ! ip netns add "$ns" 2>/dev/null; then
        echo "netns-up.sh: cannot create namespace $ns (no namespace support?)" >&2
        trap - EXIT; cleanup; exit 77
    fi
    made+=("$ns")
    step ip -n "$ns" link set lo up
    step ip -n "$ns" tuntap add dev "$dev" mode tun
    step ip -n "$ns" link set "$dev" mtu "$mtu" up
    step ip -n "$ns" addr add "$self" peer "$peer/32" dev "$dev"
    # No IPv6 on the test link: router solicitations would be extra packets
    # in every measurement.
    ip netns exec "$ns" sysctl -qw "net.ipv6.conf.$dev.disable_ipv6=1" 2>/dev/null
done

# start_linkem ARGS...: starts the emulator in the background and waits
# until it holds both TUN devices; sets linkem_pid.
start_linkem () {
    setsid "$linkem" --ns-a "$ns_a" --ns-b "$ns_b" --dev "$dev" "$@" \
        </dev/null >>"$log" 2>&1 &
    linkem_pid=$!
    # Both devices show LOWER_UP once the emulator holds them open.
    for ((t = 0; t < 100; t++)); do
        if ip -n "$ns_a" -o link show "$dev" | grep -q LOWER_UP &&
           ip -n "$ns_b" -o link show "$dev" | grep -q LOWER_UP; then
            return 0
        fi
        if ! kill -0 "$linkem_pid" 2>/dev/null; then
            linkem_pid=
            echo "netns-up.sh: nbdflow-linkem exited during start-up (log: $log)" >&2
            exit 1
        fi
        sleep 0.05
    done
    echo "netns-up.sh: nbdflow-linkem did not attach within 5 s" >&2
    exit 1
}

# stop_linkem: SIGTERM to our emulator, and wait for it (at most 3 s).
stop_linkem () {
    kill -TERM "$linkem_pid" 2>/dev/null
    for ((t = 0; t < 30; t++)); do
        kill -0 "$linkem_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$linkem_pid" 2>/dev/null
    wait "$linkem_pid" 2>/dev/null
    linkem_pid=
}

# base_rtt_ms: median ping RTT A -> B, in ms.
base_rtt_ms () {
    ip netns exec "$ns_a" ping -n -c 200 -i 0.01 -W 1 "$net.2" 2>/dev/null |
        sed -n 's/.* time=\([0-9.]*\) ms.*/\1/p' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

if [ -n "$linkem" ]; then
    [ -x "$linkem" ] || { echo "netns-up.sh: --start \"$linkem\" is not an executable (build it: ninja -C BUILD)" >&2; exit 1; }
    if [ -n "$rtt_ms" ]; then
        command -v ping >/dev/null || { echo "netns-up.sh: --rtt-ms needs ping (Debian package: iputils-ping)" >&2; exit 1; }
        start_linkem "$@" --delay-ms 0 --quiet
        base=$(base_rtt_ms)
        stop_linkem
        [ -n "$base" ] || { echo "netns-up.sh: calibration ping got no replies" >&2; exit 1; }
        delay=$(awk -v r="$rtt_ms" -v b="$base" 'BEGIN { d = (r - b) / 2; if (d < 0) d = 0; printf "%.4f", d }')
        # The path cost wanders by some 10 us between runs, which matters
        # at sub-millisecond settings: check, and correct up to twice.
        for ((round = 0; round < 2; round++)); do
            start_linkem "$@" --delay-ms "$delay" --quiet
            got=$(base_rtt_ms)
            stop_linkem
            next=$(awk -v r="$rtt_ms" -v g="${got:-0}" -v d="$delay" 'BEGIN {
                if (g == 0 || (g - r) / r < 0.03 && (r - g) / r < 0.03) exit
                d += (r - g) / 2; if (d < 0) d = 0; printf "%.4f", d }')
            [ -n "$next" ] || break
            delay=$next
        done
        echo "netns-up.sh: path RTT without delay $base ms; adding $delay ms each way for $rtt_ms ms" >&2
        start_linkem "$@" --delay-ms "$delay"
    else
        start_linkem "$@"
    fi
    echo "$linkem_pid"
fi
trap - EXIT INT TERM
exit 0
