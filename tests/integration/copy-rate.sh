#!/bin/bash
# copy-rate.sh: --rate LIMIT caps the data sent, over all connections. A
# 24 MiB copy into our server at --rate 8M takes no less than the limit
# allows (one request's worth may go ahead; a slow machine only makes it
# slower, so only that bound is asserted), lands whole (read back and
# compared), and the JSON report and progress lines carry the limit. A
# file-to-file copy is paced the same. Bad values are usage errors.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
tmpdir_make

make_random "$TMP/src.img" 24
serve_tcp mem=memory:24M

# paced JSON RATE: the report's seconds are at least (bytes - one
# request) / RATE, and it names RATE as its limit.
paced () {
    python3 - "$1" "$2" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
rate = int(sys.argv[2])
least = (r["bytes_copied"] - r["request_size"]) / rate
assert r["rate_limit"] == rate, "rate_limit %s, not %d" % (r["rate_limit"], rate)
assert r["seconds"] >= 0.95 * least, \
    "%.3f s for %d bytes at --rate %d: under the %.3f s the limit allows" % (
        r["seconds"], r["bytes_copied"], rate, least)
print("%.3f s for %d bytes (%.2f MiB/s) at a limit of %.2f MiB/s; at least %.3f s" % (
    r["seconds"], r["bytes_copied"], r["mib_per_s"], rate / 1048576, least))
EOF
}

check "copy into the server at --rate 8M" \
    "$NBDFLOW" copy --json --progress=json --rate 8M "$TMP/src.img" "$URI/mem" \
    >"$TMP/r.json" 2>"$TMP/progress"
out=$(paced "$TMP/r.json" $((8 << 20)) 2>&1) || fail "not paced: $out"
note "$out"
grep -q '"rate_limit": 8388608' "$TMP/progress" ||
    fail "the progress lines lack the limit: $(head -n 2 "$TMP/progress")"
"$NBDFLOW" copy "$URI/mem" "$TMP/back.img"
same "$TMP/src.img" "$TMP/back.img"
serve_stop

check "file to file at --rate 16M" \
    "$NBDFLOW" copy --json --rate 16M "$TMP/src.img" "$TMP/out.img" \
    >"$TMP/f.json"
out=$(paced "$TMP/f.json" $((16 << 20)) 2>&1) || fail "not paced: $out"
note "$out"
same "$TMP/src.img" "$TMP/out.img"

for bad in 0 1 -5 8X ""; do
    rc=0
    "$NBDFLOW" copy --rate "$bad" "$TMP/src.img" null: 2>"$TMP/err" || rc=$?
    [ "$rc" = 2 ] && grep -q -- "--rate" "$TMP/err" ||
        fail "--rate '$bad': status $rc: $(cat "$TMP/err")"
done
echo "PASS: --rate paces the copy, which lands whole"
