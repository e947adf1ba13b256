#!/bin/bash
# copy-progress.sh: --progress=json counts completed bytes only. It never
# decreases, never exceeds the total, ends at exactly 100%, and when the
# server dies mid-copy its last figure is no more than the bytes that had
# actually landed in the server's file. --progress without a terminal
# writes plain lines.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
tmpdir_make
make_random "$TMP/src.img" 32

# A complete, slowed-down copy.
truncate -s 32M "$TMP/dst.img"
nbdkit -f -U "$TMP/a.sock" --filter=delay file "$TMP/dst.img" wdelay=80ms \
    >>"$TMP/kit.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/a.sock"
check "copy with JSON progress" "$NBDFLOW" copy --progress=json \
    --request-size 256K --inflight 1M "$TMP/src.img" \
    "nbd+unix:///?socket=$TMP/a.sock" 2>"$TMP/progress"
same "$TMP/src.img" "$TMP/dst.img"
python3 - "$TMP/progress" <<'PY' || fail "progress lines wrong: $(cat "$TMP/progress")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(lines) >= 2, "expected several lines"
done = [l["done"] for l in lines]
assert done == sorted(done), "progress went backwards"
assert all(0 <= d <= l["total"] for d, l in zip(done, lines)), "beyond total"
assert lines[-1]["done"] == lines[-1]["total"] == 32 << 20, lines[-1]
assert lines[-1]["percent"] == 100.0, lines[-1]
assert all(l["percent"] < 100.0 for l in lines[:-1]), "100% before the end"
PY
note "ok: progress monotonic, ends at exactly 100%"

# --progress without a terminal: plain lines (no carriage returns, no
# bar), the last one at 100%.
"$NBDFLOW" copy --progress "$TMP/src.img" \
    "nbd+unix:///?socket=$TMP/a.sock" 2>"$TMP/plain" ||
    fail "copy with --progress into a log: $(cat "$TMP/plain")"
same "$TMP/src.img" "$TMP/dst.img"
! grep -q $'\r' "$TMP/plain" || fail "--progress wrote a bar into a log"
grep -Eq '^copy: +100\.0% 32\.0 MiB / 32\.0 MiB ' <<<"$(tail -n 1 "$TMP/plain")" ||
    fail "--progress into a log: $(cat "$TMP/plain")"
note "ok: --progress into a log: $(tail -n 1 "$TMP/plain")"

# Kill the server mid-copy; compare the last progress figure with what
# landed (the destination starts as zeroes, the source is random).
truncate -s 32M "$TMP/dst2.img"
nbdkit -f -U "$TMP/b.sock" --filter=delay file "$TMP/dst2.img" \
    wdelay=100ms >>"$TMP/kit.log" 2>&1 &
SERVER_PIDS+=($!)
kpid=$!
wait_for test -S "$TMP/b.sock"
"$NBDFLOW" copy --progress=json --request-size 128K --inflight 1M \
    "$TMP/src.img" "nbd+unix:///?socket=$TMP/b.sock" 2>"$TMP/progress2" &
cpid=$!
wait_for grep -q '"done": [1-9]' "$TMP/progress2"
kill -KILL "$kpid"
wait "$kpid" 2>/dev/null || true
forget_pid "$kpid"
rc=0
wait "$cpid" || rc=$?
[ "$rc" -ne 0 ] || fail "copy succeeded although its server was killed"
python3 - "$TMP/progress2" "$TMP/src.img" "$TMP/dst2.img" <<'PY' ||
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert lines, "no progress printed"
src, dst = open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read()
B = 128 << 10
landed = sum(B for i in range(0, len(src), B) if src[i:i+B] == dst[i:i+B])
last = lines[-1]["done"]
assert last <= landed, (last, landed)
assert last < len(src), "claimed completion"
print("last progress", last, "landed", landed)
PY
    fail "progress ran ahead of landed bytes: $(cat "$TMP/progress2")"
note "ok: progress never ahead of landed bytes"
echo "PASS"
