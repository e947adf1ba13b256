#!/bin/bash
# serve-stats.sh: "serve --stats" logs, for each TCP connection as it
# closes, what TCP did during it, counted from the connection's start:
# a copy of 8 MiB out of the server, over in a few milliseconds (less than
# the loop's 200 ms sampling tick), shows its data sent in full-sized
# segments on every one of its connections, not "no data sent".
. "$(dirname "$0")/lib.sh"
tmpdir_make

make_random "$TMP/src.img" 8
serve_tcp --stats "$TMP/src.img"
check "copy out of the server" "$NBDFLOW" copy -C 2 "$URI" "$TMP/out.img"
same "$TMP/src.img" "$TMP/out.img"
logged_two () { [ "$(grep -c ': tcp: samples' "$SERVER_LOG")" -ge 2 ]; }
wait_for logged_two
grep ': tcp: samples' "$SERVER_LOG" >"$TMP/lines"
while read -r line; do
    [[ $line = *"no data sent"* ]] &&
        fail "a connection that sent 4 MiB logged: $line"
    bps=$(sed -n 's/.* \([0-9][0-9]*\) B\/seg.*/\1/p' <<<"$line")
    [ -n "$bps" ] && [ "$bps" -ge 1000 ] ||
        fail "bytes per segment not those of bulk data: $line"
    note "ok: $line"
done <"$TMP/lines"
serve_stop
echo "PASS"
