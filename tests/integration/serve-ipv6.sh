#!/bin/bash
# Listening on [::1]: info and a verified copy over IPv6 loopback.
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need nbdinfo libnbd-bin
have_ipv6_loopback || skip "cannot bind ::1 on this machine (IPv6 disabled?)"
tmpdir_make

make_random "$TMP/src.img" 8
port=$(free_port ::1) || fail "no free IPv6 port"
serve_start --listen "[::1]:$port" memory:8M
uri="nbd://[::1]:$port"
[ "$(nbdinfo --size "$uri")" = $((8 << 20)) ] || fail "nbdinfo over IPv6"
nbdcopy "$TMP/src.img" "$uri" || fail "nbdcopy in over IPv6"
nbdcopy "$uri" "$TMP/out.img" || fail "nbdcopy out over IPv6"
same "$TMP/src.img" "$TMP/out.img"
# Not on IPv4 as well: --listen names one address.
check_fails "no IPv4 listener on 127.0.0.1:$port" \
    nbdinfo --size "nbd://127.0.0.1:$port"
serve_stop
echo "PASS: IPv6 loopback"
