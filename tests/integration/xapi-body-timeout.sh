#!/bin/bash
# xapi-body-timeout.sh: serve --body-timeout bounds a body's silence, not
# its length. With a 1 s bound, a Chunked upload that trickles 16 KiB
# every 50 ms for longer than that is stored whole, and one that stops
# sending mid-frame is ended by the server within the bound (while the
# sender still holds the connection open), with a log line that says
# where. Both on the splice path (a file export) and off it (a memory
# export, read through a buffer).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
REF=$(dirname "$0")/xapiref.py
make_random "$TMP/src.img" 1
head -c 524288 "$TMP/src.img" >"$TMP/half.img"
cp "$TMP/half.img" "$TMP/want.img"
truncate -s 4M "$TMP/want.img"
truncate -s 4M "$TMP/exp.img"
HPORT=$(free_port)
serve_tcp --body-timeout 1 --http "127.0.0.1:$HPORT" \
    "disk=$TMP/exp.img" "mem=memory:4M"

for name in disk mem; do
    # 512 KiB at 16 KiB per 50 ms: about 1.6 s, longer than the bound.
    start=$(date +%s%N)
    check "slow upload into $name" python3 "$REF" send-chunked 127.0.0.1 \
        "$HPORT" "$TMP/half.img" --put "/import_raw_vdi?vdi=$name" --slow
    took=$((($(date +%s%N) - start) / 1000000))
    [ "$took" -gt 1200 ] || fail "the slow upload took only $took ms"
    wait_for grep -q "chunked into \"$name\".*flushed" "$SERVER_LOG"
    "$NBDFLOW" copy "$URI/$name" "$TMP/back-$name.img" ||
        fail "reading $name back failed"
    same "$TMP/want.img" "$TMP/back-$name.img"
    note "ok: $took ms of trickle into $name, stored whole"

    python3 "$REF" send-chunked 127.0.0.1 "$HPORT" "$TMP/src.img" \
        --put "/import_raw_vdi?vdi=$name" --bad stall >"$TMP/stall.out" 2>&1 &
    spid=$!
    wait_for grep -q "\"$name\".*nothing came for --body-timeout 1000 bytes into the 4096 at offset 0" "$SERVER_LOG"
    kill -0 "$spid" 2>/dev/null ||
        fail "the stalled sender ended before the server gave up: $(cat "$TMP/stall.out")"
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    note "ok: a stalled upload into $name was ended by --body-timeout"
done
grep "body-timeout" "$SERVER_LOG" >&2
serve_stop
note "ok: --body-timeout bounds silence, not length"
