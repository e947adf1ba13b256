#!/bin/bash
# serve-zero-noalloc.sh: WRITE_ZEROES into a file on a file system that
# punches holes but cannot preallocate (ext4 made without extents, as an
# ext3 file system is; mounted from a loop device in a private mount
# namespace the test makes).
# - NO_HOLE without FAST_ZERO succeeds (§WRITE_ZEROES: a server that
#   offers WRITE_ZEROES must take NO_HOLE, and without FAST_ZERO it must
#   not answer ENOTSUP), reads back as zeroes, keeps the bytes beside
#   the range, and leaves the range allocated.
# - NO_HOLE with FAST_ZERO is refused with ENOTSUP and, as the spec asks
#   of that refusal, leaves the data as it was.
# - Without NO_HOLE, with or without FAST_ZERO, the range is punched.
# Each case starts from 64 KiB of 0xff.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
need losetup mount
need mkfs.ext4 e2fsprogs
private_tmpfs 40 "$@"

truncate -s 16M "$TMP/fs/ext.img"
mkfs.ext4 -q -F -b 4096 -O ^extent,^flex_bg,^huge_file,^64bit,^metadata_csum \
    "$TMP/fs/ext.img" >"$TMP/mkfs.out" 2>&1 ||
    fail "mkfs.ext4 without extents: $(cat "$TMP/mkfs.out")"
mkdir "$TMP/mnt"
mount -o loop "$TMP/fs/ext.img" "$TMP/mnt" 2>"$TMP/mount.err" ||
    skip "cannot mount a loop device here: $(cat "$TMP/mount.err")"
on_exit "umount -l '$TMP/mnt'"
disk=$TMP/mnt/disk.img
truncate -s 4M "$disk"

# The file system must be the kind this test is about, or it proves nothing.
fallocate -n -l 4096 "$disk" 2>/dev/null &&
    fail "this file system preallocates: the test needs one that cannot"
fallocate -p -o 0 -l 4096 "$disk" ||
    fail "this file system does not punch holes: the test needs one that does"
note "ok: the file system punches holes and cannot preallocate"

serve_start --unix "$TMP/nbd.sock" "$disk"
python3 - "$TMP/nbd.sock" "$LIB_DIR/../hostile/lib" "$disk" <<'EOF' ||
import os, sys
sys.path.insert(0, sys.argv[2])
import rawnbd as r

SPAN, START, END = 65536, 1000, 45000
path = sys.argv[3]
c = r.Conn(r.UnixServer(sys.argv[1])).open_export(structured=False)
ff = b"\xff" * SPAN

def allocated(start, end):
    """Whether the whole blocks inside [start, end) hold no hole."""
    a, b = -(-start // 4096) * 4096, end // 4096 * 4096
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, a, os.SEEK_HOLE) >= b
    finally:
        os.close(fd)

for flags, ok, kept_alloc, what in (
        (r.CMD_FLAG_NO_HOLE, True, True, "NO_HOLE"),
        (r.CMD_FLAG_NO_HOLE | r.CMD_FLAG_FAST_ZERO, False, True,
         "NO_HOLE with FAST_ZERO"),
        (0, True, False, "no flags"),
        (r.CMD_FLAG_FAST_ZERO, True, False, "FAST_ZERO")):
    r.expect_err(c.do(r.CMD_WRITE, 0, SPAN, payload=ff)[0], 0, "WRITE")
    err, _ = c.do(r.CMD_WRITE_ZEROES, START, END - START, flags)
    err2, d = c.do(r.CMD_READ, 0, SPAN)
    r.expect_err(err2, 0, "READ after " + what)
    if ok:
        r.expect_err(err, 0, "WRITE_ZEROES, " + what)
        r.expect(d[START:END] == bytes(END - START),
                 what + ": the range reads as zeroes")
        r.expect(d[:START] == ff[:START] and d[END:] == ff[END:],
                 what + ": the bytes beside it are kept")
    else:
        r.expect_err(err, r.ENOTSUP, "WRITE_ZEROES, " + what)
        r.expect(d == ff, what + " refused: the data is unchanged")
    r.expect(allocated(START, END) == kept_alloc,
             "%s: the range is %s" % (what, "allocated" if kept_alloc
                                      else "a hole"))
    r.log("ok: WRITE_ZEROES, %s" % what)
c.request(r.CMD_DISC)
EOF
    fail "WRITE_ZEROES on a file system that cannot preallocate"
server_alive || fail "the server died"
! grep -q "WRITE_ZEROES" "$SERVER_LOG" ||
    fail "the server logged an error for a zeroing: $(grep WRITE_ZEROES "$SERVER_LOG")"
serve_stop
echo "PASS: zeroing on a file system that cannot preallocate"
