#!/bin/bash
# copy-old-servers.sh: the client sends one option at a time, each after
# the final reply to the one before (the spec's MUST NOT; seen with
# strace: STRUCTURED_REPLY, SET_META_CONTEXT, GO as separate writes), and
# reaches every older kind of server the spec describes: one that refuses
# structured replies (no SET_META_CONTEXT then; the copy reads everything
# as data), a newstyle server without the fixed flag (EXPORT_NAME), and an
# oldstyle one. Every copy checked.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need_strace
tmpdir_make

# A source with a hole: without block status it must come back all the same.
make_sparse "$TMP/src.img" 16 "0:3 9:2"

# info_field URI FIELD: one field of nbdflow info --json.
info_field () {
    "$NBDFLOW" info --json "$1" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

roundtrip () {  # NAME URI
    local name=$1 u=$2
    check "$name: file -> nbd" "$NBDFLOW" copy "$TMP/src.img" "$u"
    rm -f "$TMP/back.img"
    check "$name: nbd -> file" "$NBDFLOW" copy "$u" "$TMP/back.img"
    same "$TMP/src.img" "$TMP/back.img"
}

# 1. A current server: the flags, then each option in a write of its own.
kit "$TMP/a.sock" memory 16M
check "traced copy" strace -f -qq -e trace=sendmsg,sendto -s 0 \
    -o "$TMP/hs.st" "$NBDFLOW" copy --connections 1 "nbd+unix:///?socket=$TMP/a.sock" \
    "$TMP/back.img"
# The client's first writes: the flags (4 bytes), EXTENDED_HEADERS (16),
# STRUCTURED_REPLY (16; only when the nbdkit refused extended headers, as
# Debian 12's does), SET_META_CONTEXT base:allocation for ""
# (16 + 4 + 4 + 4 + 15) and GO for "" asking 3 infos (16 + 4 + 2 + 6),
# each on its own.
python3 - "$TMP/hs.st" <<'PY' || fail "options were not sent one by one: $(head -5 "$TMP/hs.st")"
import re, sys
lens = [int(m.group(1)) for l in open(sys.argv[1])
        if re.search(r"\b(sendmsg|sendto)\(", l)
        for m in [re.search(r"= (\d+)$", l.strip())] if m]
assert (lens[:5] == [4, 16, 16, 43, 28] or
        lens[:4] == [4, 16, 43, 28]), lens[:6]
PY
note "ok: flags, then EXTENDED_HEADERS, STRUCTURED_REPLY, SET_META_CONTEXT and GO one by one"
roundtrip "current nbdkit" "$(uri "$TMP/a.sock")"
[ "$(info_field "$(uri "$TMP/a.sock")" structured)" = True ] ||
    fail "structured replies not negotiated with a current nbdkit"

# 2. Structured replies refused (nbdkit --no-sr).
kit "$TMP/b.sock" --no-sr memory 16M
roundtrip "no structured replies" "$(uri "$TMP/b.sock")"
[ "$(info_field "$(uri "$TMP/b.sock")" structured)" = False ] ||
    fail "structured replies claimed against nbdkit --no-sr"
[ "$(info_field "$(uri "$TMP/b.sock")" protocol)" = newstyle-fixed ] ||
    fail "GO did not complete against nbdkit --no-sr"

# 3. Newstyle without the fixed flag: EXPORT_NAME only.
kit "$TMP/c.sock" --mask-handshake=0 memory 16M
roundtrip "non-fixed newstyle" "$(uri "$TMP/c.sock")"
[ "$(info_field "$(uri "$TMP/c.sock")" protocol)" = newstyle ] ||
    fail "expected plain newstyle against --mask-handshake=0"

# 4. Oldstyle. nbdkit 1.32 advertises WRITE_ZEROES and FLUSH there but
# answers both EINVAL (nbdcopy fails the same way), so the holes go as
# data and no flush is sent.
kit "$TMP/d.sock" --oldstyle memory 16M
check "oldstyle: file -> nbd" "$NBDFLOW" copy --allocated --no-flush "$TMP/src.img" \
    "$(uri "$TMP/d.sock")"
rm -f "$TMP/back.img"
check "oldstyle: nbd -> file" "$NBDFLOW" copy "$(uri "$TMP/d.sock")" "$TMP/back.img"
same "$TMP/src.img" "$TMP/back.img"
[ "$(info_field "$(uri "$TMP/d.sock")" protocol)" = oldstyle ] ||
    fail "expected oldstyle"

echo "PASS: options one at a time; no-SR, non-fixed and oldstyle servers copied and verified"
