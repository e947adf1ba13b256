#!/bin/bash
# copy-serve.sh: copy to and from our own server (nbdflow serve), file and
# memory exports, TCP and Unix socket, NBD -> NBD between two of them,
# with --verify and sum agreeing with sha256sum. A source connection asks
# for extended headers (our server grants them), a destination for
# nothing beyond the export; info reports what was negotiated.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
"$NBDFLOW" serve --help >/dev/null 2>&1 || skip "nbdflow serve not built"
tmpdir_make
make_sparse "$TMP/src.img" 48 "0:8 20:1 47:1"
truncate -s 48M "$TMP/exp.img"

serve_tcp "disk=$TMP/exp.img" "mem=memory:48M"
tcp=$URI
check "file -> serve (file export), verified" \
    "$NBDFLOW" copy --verify "$TMP/src.img" "$tcp/disk"
same "$TMP/src.img" "$TMP/exp.img"
check "serve file -> serve memory" "$NBDFLOW" copy "$tcp/disk" "$tcp/mem"
rm -f "$TMP/back.img"
check "serve memory -> file" "$NBDFLOW" copy "$tcp/mem" "$TMP/back.img"
same "$TMP/src.img" "$TMP/back.img"
[ "$("$NBDFLOW" sum --algo sha256 "$tcp/mem" | cut -d' ' -f1)" = \
  "$(sha "$TMP/src.img")" ] || fail "sum over serve differs from sha256sum"

serve_start --verbose --unix "$TMP/s.sock" "memory:48M"
uri="nbd+unix:///?socket=$TMP/s.sock"
check "file -> serve over a Unix socket, 3 connections" \
    "$NBDFLOW" copy --connections 3 "$TMP/src.img" "$uri"
n_simple=$(grep -c 'transmission, simple replies' "$SERVER_LOG" || true)
[ "$n_simple" -ge 3 ] ||
    fail "a destination negotiated more than it needs: $(cat "$SERVER_LOG")"
rm -f "$TMP/back.img"
check "serve unix -> file" "$NBDFLOW" copy "$uri" "$TMP/back.img"
same "$TMP/src.img" "$TMP/back.img"
grep -q 'transmission, extended replies' "$SERVER_LOG" ||
    fail "the source did not use extended headers: $(cat "$SERVER_LOG")"
! grep -q 'transmission, structured replies' "$SERVER_LOG" ||
    fail "a source connection fell back to structured replies"
"$NBDFLOW" info --json "$uri" >"$TMP/info.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1]));
assert d["extended"] is True and d["structured"] is True, d' \
    "$TMP/info.json" || fail "info: $(cat "$TMP/info.json")"
note "ok: extended headers from a source, none for a destination"
echo "PASS"
