#!/bin/bash
# serve-blockdev.sh: block devices (loop devices the test attaches itself)
# as our server's export and as a local copy destination.
# - Copies of a sparse image into a device full of other data (nbdflow
#   copy, nbdcopy, qemu-img, and nbdflow copy without a server) land
#   whole: the holes read as zeroes. A copy back out matches too.
# - A device takes discard and zeroing on whole logical blocks only, but
#   the server advertises a minimum block size of 1: WRITE_ZEROES and TRIM
#   of unaligned ranges succeed, and the bytes beside them keep their
#   value.
# - FAST_ZERO: a device without a zeroing command (a loop device over a
#   tmpfs file) must answer ENOTSUP, not let the kernel write zeroes for
#   it; a device with one (over a file elsewhere, where the kernel offers
#   it) zeroes fast. What the kernel offers is read from sysfs.
# The tmpfs lives in a private mount namespace that the test makes.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need nbdinfo libnbd-bin
need qemu-img qemu-utils
need losetup mount
need unshare util-linux

if [ -z "${NBDFLOW_BLOCKDEV_NS:-}" ]; then
    unshare -m true 2>/dev/null ||
        skip "cannot make a private mount namespace (unshare -m needs root)"
    export NBDFLOW=$NBDFLOW NBDFLOW_BLOCKDEV_NS=1
    exec unshare -m --propagation private bash "$0" "$@"
fi

tmpdir_make
mkdir "$TMP/fs"
mount -t tmpfs -o size=40M nbdflow-blk "$TMP/fs" ||
    skip "cannot mount a tmpfs in the private namespace"
on_exit "umount -l '$TMP/fs'"

# attach FILE: LOOP becomes a loop device over FILE, detached at exit.
attach () {
    LOOP=$(losetup -f --show "$1" 2>"$TMP/losetup.err") ||
        skip "cannot attach a loop device: $(cat "$TMP/losetup.err")"
    on_exit "losetup -d '$LOOP'"
}
# queue DEV NAME: a figure of the device's request queue (0 if absent).
queue () { cat "/sys/block/$(basename "$1")/queue/$2" 2>/dev/null || echo 0; }

truncate -s 32M "$TMP/fs/backing.img"
attach "$TMP/fs/backing.img"
dev=$LOOP
make_sparse "$TMP/sparse.img" 32 "1:3 10:1 20:5 31:1"
fill () { dd if=/dev/urandom of="$dev" bs=1M count=32 status=none; }

# A local copy into the device: its holes must be zeroed, not skipped.
fill
check "nbdflow copy into a block device" \
    "$NBDFLOW" copy "$TMP/sparse.img" "$dev"
same "$TMP/sparse.img" "$dev"
[ "$("$NBDFLOW" sum --algo sha256 "$dev" | cut -d' ' -f1)" = \
  "$(sha "$TMP/sparse.img")" ] || fail "sum of the device"

serve_start --unix "$TMP/nbd.sock" "$dev"
u=$(uri "$TMP/nbd.sock")
[ "$(nbdinfo --size "$u")" = $((32 << 20)) ] || fail "nbdinfo size"
fill
check "nbdflow copy into the served device" "$NBDFLOW" copy "$TMP/sparse.img" "$u"
same "$TMP/sparse.img" "$dev"
fill
check "nbdcopy into the served device" nbdcopy "$TMP/sparse.img" "$u"
same "$TMP/sparse.img" "$dev"
fill
check "qemu-img into the served device" \
    qemu-img convert -n -f raw -O raw "$TMP/sparse.img" "$u"
same "$TMP/sparse.img" "$dev"
check "nbdflow copy out of the served device" \
    "$NBDFLOW" copy "$u" "$TMP/out.img"
same "$TMP/sparse.img" "$TMP/out.img"

# probe SOCK FAST_OK FAST_NOHOLE_OK: raw requests; each FAST_* is "ok",
# "enotsup" or "any" (either, but an ok must read back as zeroes).
probe () {
    python3 - "$1" "$LIB_DIR/../hostile/lib" "$2" "$3" <<'EOF'
import socket, sys
sys.path.insert(0, sys.argv[2])
import rawnbd as r

class Unix:
    def connect(self, timeout):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        s.connect(sys.argv[1])
        return s

c = r.Conn(Unix()).open_export(structured=False)
ff = b"\xff" * 16384

def write_ff():
    r.expect_err(c.do(r.CMD_WRITE, 0, len(ff), payload=ff)[0], 0, "WRITE")

def read():
    err, data = c.do(r.CMD_READ, 0, len(ff))
    r.expect_err(err, 0, "READ")
    return data

write_ff()
r.expect_err(c.do(r.CMD_WRITE_ZEROES, 100, 1000)[0], 0,
             "WRITE_ZEROES of bytes 100-1099 (no whole block)")
r.expect_err(c.do(r.CMD_WRITE_ZEROES, 1500, 9000)[0], 0,
             "WRITE_ZEROES of bytes 1500-10499 (edges and whole blocks)")
d = read()
r.expect(d[:100] == ff[:100] and d[1100:1500] == ff[1100:1500]
         and d[10500:] == ff[10500:], "bytes beside the zeroed ranges kept")
r.expect(d[100:1100] == bytes(1000) and d[1500:10500] == bytes(9000),
         "unaligned zeroed ranges read as zeroes")
r.expect_err(c.do(r.CMD_TRIM, 100, 5000)[0], 0, "TRIM of an unaligned range")
write_ff()
for flags, want, what in (
        (r.CMD_FLAG_FAST_ZERO, sys.argv[3], "FAST_ZERO"),
        (r.CMD_FLAG_FAST_ZERO | r.CMD_FLAG_NO_HOLE, sys.argv[4],
         "FAST_ZERO with NO_HOLE")):
    err, _ = c.do(r.CMD_WRITE_ZEROES, 4096, 8192, flags)
    if want == "enotsup":
        r.expect_err(err, r.ENOTSUP, what + " on a device that cannot")
    elif want == "ok":
        r.expect_err(err, 0, what + " on a device that can")
    else:
        r.expect(err in (0, r.ENOTSUP), "%s: OK or ENOTSUP (%s)"
                 % (what, r.errname(err)))
    if err == 0:
        r.expect(read()[4096:12288] == bytes(8192), what + " reads as zeroes")
    r.log("ok: %s -> %s" % (what, r.errname(err) if err else "OK"))
c.request(r.CMD_DISC)
EOF
}

# Over tmpfs: no zeroing command, so both fast zeroes must be refused.
if [ "$(queue "$dev" write_zeroes_max_bytes)" = 0 ]; then
    probe "$TMP/nbd.sock" enotsup enotsup || fail "probe of $dev (over tmpfs)"
else
    note "$dev over tmpfs has a zeroing command on this kernel"
    probe "$TMP/nbd.sock" any any || fail "probe of $dev (over tmpfs)"
fi
server_alive || fail "the server died"
serve_stop

# Over a file outside the tmpfs: where the kernel gives the loop device a
# zeroing command, FAST_ZERO that may unmap must succeed.
truncate -s 32M "$TMP/backing2.img"
attach "$TMP/backing2.img"
dev2=$LOOP
serve_start --unix "$TMP/nbd2.sock" "$dev2"
if [ "$(queue "$dev2" write_zeroes_max_bytes)" != 0 ]; then
    probe "$TMP/nbd2.sock" ok any || fail "probe of $dev2"
else
    probe "$TMP/nbd2.sock" enotsup enotsup || fail "probe of $dev2"
fi
serve_stop
echo "PASS: block devices"
