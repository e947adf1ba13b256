#!/bin/bash
# serve-flood.sh: a server under a bounded flood of clients that never
# finish the handshake (flood.py beside this file: idle ones, and slow
# ones that drip a byte every half second) keeps serving: a copy run
# during the flood completes and verifies, its rate is printed beside
# the same copy's without the flood, and every flooding connection is
# closed within the handshake timeout (plus slack). Then the count
# bound: with --max-connections, connections beyond it are closed at
# once, and once the flood's slots time out a copy gets in again.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
tmpdir_make
FLOOD=$(dirname "$0")/flood.py
HS=3 # --handshake-timeout in seconds

make_random "$TMP/src.img" 128
serve_tcp -r --handshake-timeout "$HS" "disk=$TMP/src.img"

# rate OUT.json: the copy's MiB/s from its --json report.
rate () {
    python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["mib_per_s"])' "$1"
}

"$NBDFLOW" copy --json "$URI/disk" "$TMP/calm.img" >"$TMP/calm.json" ||
    fail "copy without the flood"
same "$TMP/src.img" "$TMP/calm.img"

python3 "$FLOOD" 127.0.0.1 "$PORT" 200 20 "$((HS + 2))" >"$TMP/flood.out" &
flood_pid=$!
sleep 0.5 # the flood's connections are open before the copy starts
"$NBDFLOW" copy --json "$URI/disk" "$TMP/flooded.img" >"$TMP/flooded.json" ||
    fail "copy during a flood of 220 unfinished handshakes"
same "$TMP/src.img" "$TMP/flooded.img"
wait "$flood_pid" || { cat "$TMP/flood.out" >&2; fail "a flooding connection outlived the handshake timeout of $HS s"; }
cat "$TMP/flood.out" >&2
server_alive || fail "the server died under the flood"
note "copy of 128 MiB: $(rate "$TMP/calm.json") MiB/s alone," \
     "$(rate "$TMP/flooded.json") MiB/s during the flood"
serve_stop

# The count bound: 60 unfinished handshakes against 40 slots.
serve_tcp -r --handshake-timeout "$HS" --max-connections 40 "disk=$TMP/src.img"
check "every flooding connection is closed, the 20 beyond the limit at once" \
    python3 "$FLOOD" 127.0.0.1 "$PORT" 60 0 "$((HS + 2))"
grep -q 'refused: 40 connections already' "$SERVER_LOG" ||
    fail "no refusal at the connection limit in the server's log"
rm -f "$TMP/flooded.img"
"$NBDFLOW" copy "$URI/disk" "$TMP/flooded.img" ||
    fail "copy after the flood's slots were freed"
same "$TMP/src.img" "$TMP/flooded.img"
serve_stop
echo "PASS: the server kept serving under a flood of unfinished handshakes"
