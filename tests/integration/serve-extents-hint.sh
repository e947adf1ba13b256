#!/bin/bash
# A dense file read in many requests costs the server one SEEK_HOLE, not
# one per request: on tmpfs each SEEK_HOLE walks every page up to the next
# hole, so asking per READ or BLOCK_STATUS made reading 2 GiB take minutes.
# The kept answer must never hide a hole the server made itself: TRIM,
# zeroing and a write into a hole show up in the next map.
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need nbdinfo libnbd-bin
need qemu-io qemu-utils
need strace strace
tmpdir_make

MIB=$((1 << 20))
make_random "$TMP/dense.img" 64
# The file system must keep holes, or the second half means nothing.
python3 - "$TMP" <<'PY' || skip "the file system of TMPDIR does not keep holes"
import os, sys
p = os.path.join(sys.argv[1], "probe")
with open(p, "wb") as f:
    f.truncate(1 << 20)
fd = os.open(p, os.O_RDONLY)
ok = os.lseek(fd, 0, os.SEEK_HOLE) == 0
os.close(fd)
os.unlink(p)
sys.exit(0 if ok else 1)
PY

serve_tcp "$TMP/dense.img"

# Count the server's lseek calls while nbdcopy reads 256 requests of 256K
# (with block status and structured replies, so every READ asks where the
# holes are).
strace -f -qq -p "$SERVER_PID" -e trace=lseek -o "$TMP/lseek.log" &
tracer=$!
for ((i = 0; i < 50; i++)); do
    all_traced "$SERVER_PID" && break
    sleep 0.1
done
all_traced "$SERVER_PID" ||
    fail "strace did not attach to every thread of the server"
check "read the dense export" nbdcopy --request-size=262144 --requests=16 \
    "$URI" "$TMP/out.img"
kill -INT "$tracer"
wait "$tracer"
same "$TMP/dense.img" "$TMP/out.img"
holes=$(grep -c SEEK_HOLE "$TMP/lseek.log")
note "SEEK_HOLE calls for 256 READs: $holes"
[ "$holes" -ge 1 ] || fail "no SEEK_HOLE seen: the count means nothing"
[ "$holes" -le 8 ] ||
    fail "$holes SEEK_HOLE calls for 256 READs of a dense file (at most 8)"

# map_types: "offset:length:type" of every extent, MiB units.
map_types () {
    nbdinfo --map --json "$URI" | python3 -c '
import json, sys
print(" ".join("%d:%d:%d" % (e["offset"] >> 20, e["length"] >> 20,
                             e["type"] & 1) for e in json.load(sys.stdin)))'
}

got=$(map_types)
[ "$got" = "0:64:0" ] || fail "dense map: $got (want 0:64:0)"
note "ok: map before: $got"

# TRIM [16M, 17M) and zero [32M, 33M) (a punched hole may answer it): the
# hole must show although the whole file was known as data a moment ago.
check "discard" qemu-io -f raw -c "discard 16M 1M" "$URI"
got=$(map_types)
[ "$got" = "0:16:0 16:1:1 17:47:0" ] ||
    fail "map after TRIM of [16M, 17M): $got"
note "ok: map after TRIM: $got"
check "write zeroes" qemu-io -f raw -c "write -z -u 32M 1M" "$URI"
got=$(map_types)
[ "$got" = "0:16:0 16:1:1 17:15:0 32:1:1 33:31:0" ] ||
    fail "map after zeroing [32M, 33M) with trim allowed: $got"
note "ok: map after zeroing: $got"

# A write into the first hole makes it data again.
check "write" qemu-io -f raw -c "write -P 0xab 16M 1M" "$URI"
got=$(map_types)
[ "$got" = "0:32:0 32:1:1 33:31:0" ] || fail "map after refilling: $got"
note "ok: map after a write into the hole: $got"

# And the bytes: zeroes where zeroed, 0xab where written, the rest kept.
check "read back" nbdcopy "$URI" "$TMP/after.img"
python3 - "$TMP/dense.img" "$TMP/after.img" <<'PY' || fail "content after TRIM/zero/write"
import sys
a = open(sys.argv[1], "rb").read()
b = bytearray(open(sys.argv[2], "rb").read())
M = 1 << 20
want = bytearray(a)
want[16 * M:17 * M] = b"\xab" * M
want[32 * M:33 * M] = bytes(M)
sys.exit(0 if b == want else 1)
PY
serve_stop
echo "PASS: one SEEK_HOLE for a dense read; holes made later are seen"
