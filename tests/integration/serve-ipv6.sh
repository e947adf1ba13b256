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

# A link-local address needs its zone: nbd://[fe80::1%25lo]/ (RFC 6874,
# "%25" is the '%'). In a network namespace of the test's own, where lo
# gets fe80::1; copy in and out through that URI and compare.
if command -v ip >/dev/null && unshare -n true 2>/dev/null; then
    NBDFLOW=$NBDFLOW TMP=$TMP unshare -n bash -c '
        set -e
        ip link set lo up
        ip addr add fe80::1/64 dev lo nodad
        "$NBDFLOW" serve --listen "[fe80::1%lo]:10809" memory:8M \
            2>"$TMP/zone.log" &
        pid=$!
        trap "kill $pid 2>/dev/null; wait $pid 2>/dev/null" EXIT
        for i in $(seq 100); do
            grep -q listening "$TMP/zone.log" && break
            sleep 0.05
        done
        "$NBDFLOW" copy "$TMP/src.img" "nbd://[fe80::1%25lo]/"
        rm -f "$TMP/zone.img"
        "$NBDFLOW" copy "nbd://[fe80::1%25lo]/" "$TMP/zone.img"
    ' || fail "copy through nbd://[fe80::1%25lo]/: $(cat "$TMP/zone.log")"
    same "$TMP/src.img" "$TMP/zone.img"
    note "ok: link-local address with a zone"
else
    note "zone check skipped: no ip(8) or no network namespaces here"
fi
echo "PASS: IPv6 loopback"
