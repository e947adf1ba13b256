#!/bin/bash
# client-nagle-peer.sh: the client does not wait for its own delayed ACK
# during the handshake. A server with Nagle on that writes an option's
# refusal in two writes (nbd-server does: the reply header, then the text)
# holds the text until the header is acknowledged; a client that left that
# to its delayed ACK waited at least 40 ms per refusal (Linux's minimum
# delayed-ACK time), 84 ms per connection into nbd-server, which refuses
# extended headers and structured replies.
#
# nagle_peer.py (beside this file) is such a server. It refuses every
# option but GO and times, per refusal, the gap from its reply header to
# the client's next option. Three `nbdflow info` runs give six gaps; their
# median must be under 20 ms (with the delayed ACK it is 40 ms or more;
# without, a fraction of a millisecond). The size the client reports is
# the one the server sent.
. "$(dirname "$0")/lib.sh"
need python3
tmpdir_make

PEER=$(dirname "$0")/nagle_peer.py
size=12345678
runs=3
python3 "$PEER" "$TMP/port" "$size" "$runs" >"$TMP/peer.out" 2>&1 &
peer=$!
SERVER_PIDS+=("$peer")
wait_for test -s "$TMP/port"
port=$(cat "$TMP/port")

for i in $(seq "$runs"); do
    out=$("$NBDFLOW" info --json "nbd://127.0.0.1:$port/") ||
        fail "info against a server with Nagle on failed (run $i)"
    got=$(printf '%s' "$out" | python3 -c \
        'import json, sys; print(json.load(sys.stdin)["exports"][0]["export-size"])') ||
        fail "info --json gave no size: $out"
    [ "$got" = "$size" ] || fail "info reported size $got, the server sent $size"
done
wait "$peer" || fail "the Nagle peer failed: $(tail -1 "$TMP/peer.out")"

gaps=$(sed -n 's/^gaps_ms //p' "$TMP/peer.out")
[ -n "$gaps" ] || fail "the peer timed no refusal: $(cat "$TMP/peer.out")"
note "gaps from each refusal to the next option (ms): $gaps"
python3 - $gaps <<'PY' || fail "the client waited for its delayed ACK: gaps $gaps ms"
import statistics, sys
gaps = [float(g) for g in sys.argv[1:]]
if len(gaps) < 6:
    print("only %d refusals timed, expected 6" % len(gaps))
    sys.exit(1)
sys.exit(0 if statistics.median(gaps) < 20.0 else 1)
PY
note "ok: median gap under 20 ms over ${runs} handshakes"
echo "the client acknowledges a split option reply at once (gaps: $gaps ms)"
