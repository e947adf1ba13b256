#!/bin/bash
# copy-window-link.sh: over an emulated 1 Gbit/s, 50 ms link (bench/linkem,
# namespaces of its own), the adaptive window of nbdflow copy is about
# 2 x bandwidth x RTT, not that plus the 8-request floor: the sum overfills
# a router queue of one BDP and loses segments. Asserts the final window
# (JSON window_bytes) lies between the floor and 2 x the link's BDP plus
# 15%, and that the copy lands (xxh128 of the export read back inside the
# server's namespace). No timing is asserted. Needs root; skips otherwise.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

linkem_prereqs
need nbdkit

tmpdir_make
linkem_link w 10.199.6 50 1gbit

ip netns exec "$NS_B" nbdkit -f -i $NET.2 -p 10809 memory 256M \
    >"$TMP/kit.log" 2>&1 &
for i in $(seq 100); do
    [ -n "$(ip netns exec "$NS_B" ss -Hltn 'sport = :10809')" ] && break
    sleep 0.1
done
check "copy 256 MiB over the 50 ms link" ip netns exec "$NS_A" \
    "$NBDFLOW" copy --json random:256M:5 "nbd://$NET.2:10809/" \
    >"$TMP/copy.json"
want=$("$NBDFLOW" sum --algo xxh128 random:256M:5 | cut -d' ' -f1)
got=$(ip netns exec "$NS_B" "$NBDFLOW" sum --algo xxh128 \
    "nbd://$NET.2:10809/" | cut -d' ' -f1)
[ -n "$want" ] && [ "$want" = "$got" ] ||
    fail "the export's xxh128 $got differs from the source's $want"
note "ok: the copy landed (xxh128 $got)"

python3 - "$TMP/copy.json" <<'PY' || fail "window out of bounds: $(cat "$TMP/copy.json")"
import json, sys
r = json.load(open(sys.argv[1]))
w, rs = r["window_bytes"], r["request_size"]
bdp = 1e9 / 8 * 0.050
floor = 8 * rs
print("window %d bytes, floor %d, 2 x BDP %d" % (w, floor, 2 * bdp))
assert w >= floor, "window below the floor"
assert w <= max(floor, 2 * bdp * 1.15), "window above 2 x BDP (+15%)"
PY
note "ok: the adaptive window stays near 2 x BDP"
echo "PASS: adaptive window on a 50 ms link, copy verified"
