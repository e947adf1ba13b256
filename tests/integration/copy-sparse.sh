#!/bin/bash
# copy-sparse.sh: sparse images stay sparse (file -> file, NBD -> file,
# file -> NBD backed by a file), zero ranges are zeroed or skipped, the
# copies are exact, and --allocated writes every byte.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need qemu-nbd qemu-utils
tmpdir_make
alloc_kib () { du -k "$1" | cut -f1; }

# 256 MiB holding 3 MiB of data in three places, plus an all-zero data
# extent that zero detection must catch.
make_sparse "$TMP/src.img" 256 "0:1 100:1 255:1"
dd if=/dev/zero of="$TMP/src.img" bs=1M seek=50 count=4 conv=notrunc \
    status=none

check "file -> file" "$NBDFLOW" copy --json "$TMP/src.img" "$TMP/dst.img" \
    >"$TMP/report.json"
same "$TMP/src.img" "$TMP/dst.img"
a=$(alloc_kib "$TMP/dst.img")
[ "$a" -le 4096 ] || fail "file -> file: destination allocates $a KiB"
note "ok: file destination allocates $a KiB of 262144"
python3 - "$TMP/report.json" <<'PY' || fail "report figures wrong"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bytes_total"] == 256 << 20, r
assert r["bytes_copied"] == 3 << 20, r
assert r["bytes_zeroed"] + r["bytes_skipped"] == 253 << 20, r
PY

# NBD source with base:allocation -> file.
qemu-nbd -f raw -t -k "$TMP/q.sock" "$TMP/src.img" >>"$TMP/q.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/q.sock"
rm -f "$TMP/dst2.img"
check "nbd -> file" "$NBDFLOW" copy "nbd+unix:///?socket=$TMP/q.sock" \
    "$TMP/dst2.img"
same "$TMP/src.img" "$TMP/dst2.img"
a=$(alloc_kib "$TMP/dst2.img")
[ "$a" -le 4096 ] || fail "nbd -> file: destination allocates $a KiB"

# file -> NBD whose backing file starts full of data: zeroes must land.
make_random "$TMP/nbd.img" 256
qemu-nbd -f raw -t -k "$TMP/w.sock" "$TMP/nbd.img" >>"$TMP/q.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/w.sock"
check "file -> nbd over old data" "$NBDFLOW" copy "$TMP/src.img" \
    "nbd+unix:///?socket=$TMP/w.sock"
same "$TMP/src.img" "$TMP/nbd.img"
a=$(alloc_kib "$TMP/nbd.img")
[ "$a" -le 8192 ] || fail "file -> nbd: server's file allocates $a KiB"
note "ok: server-side file allocates $a KiB"

# --allocated writes everything.
check "--allocated" "$NBDFLOW" copy --allocated "$TMP/src.img" \
    "$TMP/full.img"
same "$TMP/src.img" "$TMP/full.img"
a=$(alloc_kib "$TMP/full.img")
[ "$a" -ge 260000 ] || fail "--allocated left holes ($a KiB allocated)"

# A generated sparse source: 64 MiB, 1 MiB of data every 16 MiB.
check "sparse generator" "$NBDFLOW" copy sparse:64M:16M:1M "$TMP/gen.img"
[ "$(alloc_kib "$TMP/gen.img")" -le 5000 ] || fail "generated copy not sparse"
[ "$("$NBDFLOW" sum sparse:64M:16M:1M | cut -d' ' -f1)" = \
  "$("$NBDFLOW" sum "$TMP/gen.img" | cut -d' ' -f1)" ] ||
    fail "sparse generator copy differs"
echo "PASS"
