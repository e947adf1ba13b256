#!/bin/bash
# copy-existing.sh: copying into a file that already has content. It is
# written over in place: the source's data lands in the file's own
# blocks, the source's holes become holes (nothing of the old content
# survives), and the file takes the source's size, whether it was larger
# or smaller. A new or empty file starts as a hole; from a pipe (size
# unknown) the file starts empty. A file copied onto itself stays as it
# was. Every copy is compared with its source and its holes read from the
# file's map (SEEK_DATA/SEEK_HOLE).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
tmpdir_make

# 8 MiB: 1 MiB of data every 3 MiB (0-1, 3-4, 6-7 MiB), holes between.
make_sparse "$TMP/src.img" 8 "0:1 3:1 6:1"

# map FILE: "data START END" / "hole START END" lines from SEEK_DATA.
map () {
    python3 - "$1" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
off = 0
while off < size:
    try:
        d = os.lseek(fd, off, os.SEEK_DATA)
    except OSError:
        d = size
    if d > off:
        print("hole", off, d)
    if d >= size:
        break
    h = os.lseek(fd, d, os.SEEK_HOLE)
    print("data", d, h)
    off = h
PY
}

# check_holes FILE: the source's holes (1-3, 4-6, 7-8 MiB) are holes in
# FILE, and its data ranges are data.
check_holes () {
    map "$1" >"$TMP/map"
    python3 - "$TMP/map" <<'PY' || fail "$1: holes not kept: $(cat "$TMP/map")"
import sys
M = 1 << 20
ranges = [l.split() for l in open(sys.argv[1])]
def kind(pos):
    for k, a, b in ranges:
        if int(a) <= pos < int(b):
            return k
    return "none"
for lo, hi in ((1, 3), (4, 6), (7, 8)):
    for p in range(lo * M, hi * M, 64 << 10):
        assert kind(p) == "hole", "offset %d is %s" % (p, kind(p))
for lo in (0, 3, 6):
    assert kind(lo * M) == "data" and kind(lo * M + M - 1) == "data", lo
PY
}

# prior FILE MIB: a fully allocated file of MIB MiB of other data.
prior () {
    head -c $(($2 << 20)) /dev/urandom >"$1"
}

# 1. Larger, fully allocated, full of other data: cut to 8 MiB (one
#    ftruncate to that size, never to 0, which would drop its blocks),
#    the holes punched, the data where it belongs.
need_strace
prior "$TMP/big.img" 12
check "copy into a larger file with content" \
    strace -f -qq -e trace=ftruncate,fallocate -o "$TMP/big.trace" \
    "$NBDFLOW" copy "$TMP/src.img" "$TMP/big.img"
same "$TMP/src.img" "$TMP/big.img"
check_holes "$TMP/big.img"
! grep -q "ftruncate([0-9]*, 0)" "$TMP/big.trace" ||
    fail "the file with content was emptied first: $(cat "$TMP/big.trace")"
grep -q "ftruncate([0-9]*, 8388608)" "$TMP/big.trace" ||
    fail "not cut to the source's size: $(cat "$TMP/big.trace")"
grep -q "fallocate(.*PUNCH_HOLE" "$TMP/big.trace" ||
    fail "no hole punched: $(cat "$TMP/big.trace")"

# 2. Smaller, with content: extended to 8 MiB.
prior "$TMP/small.img" 2
check "copy into a smaller file with content" \
    "$NBDFLOW" copy "$TMP/src.img" "$TMP/small.img"
same "$TMP/src.img" "$TMP/small.img"
check_holes "$TMP/small.img"

# 3. The same size, pre-allocated and zero-filled (fallocate): the data
#    lands in those blocks, the rest becomes holes.
fallocate -l $((8 << 20)) "$TMP/alloc.img" 2>/dev/null ||
    head -c $((8 << 20)) /dev/zero >"$TMP/alloc.img"
check "copy into a pre-allocated file" \
    "$NBDFLOW" copy "$TMP/src.img" "$TMP/alloc.img"
same "$TMP/src.img" "$TMP/alloc.img"
check_holes "$TMP/alloc.img"

# 4. Empty and new files start as a hole.
: >"$TMP/empty.img"
check "copy into an empty file" "$NBDFLOW" copy "$TMP/src.img" "$TMP/empty.img"
same "$TMP/src.img" "$TMP/empty.img"
check_holes "$TMP/empty.img"
check "copy into a new file" "$NBDFLOW" copy "$TMP/src.img" "$TMP/new.img"
same "$TMP/src.img" "$TMP/new.img"
check_holes "$TMP/new.img"

# 5. From a pipe the size is unknown: a file with content starts empty
#    and ends at the pipe's length.
prior "$TMP/piped.img" 12
"$NBDFLOW" copy - "$TMP/piped.img" <"$TMP/src.img" ||
    fail "copy from a pipe into a file with content"
same "$TMP/src.img" "$TMP/piped.img"
# 6. A file copied onto itself (the same path, or a hard link to it) is
#    left as it was: nothing empties it before it is read.
cp "$TMP/src.img" "$TMP/self.img"
ln "$TMP/self.img" "$TMP/self-link.img"
check "copy a file onto itself" \
    "$NBDFLOW" copy "$TMP/self.img" "$TMP/self.img"
same "$TMP/src.img" "$TMP/self.img"
check "copy a file onto a hard link of itself" \
    "$NBDFLOW" copy "$TMP/self.img" "$TMP/self-link.img"
same "$TMP/src.img" "$TMP/self.img"
echo "PASS"
