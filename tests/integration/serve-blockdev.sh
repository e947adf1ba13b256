#!/bin/bash
# serve-blockdev.sh: block devices (loop devices the test attaches itself)
# as our server's export and as a local copy destination.
# - Copies of a sparse image into a device full of other data (nbdflow
#   copy, nbdcopy, qemu-img, and nbdflow copy without a server) land
#   whole: the holes read as zeroes. A copy back out matches too.
# - A qcow2 written onto the device is flushed, reads back, and keeps its
#   corrupt bit when cut short; a VHD is refused there.
# - A device takes discard and zeroing on whole logical blocks only, but
#   the server advertises a minimum block size of 1: WRITE_ZEROES and TRIM
#   of unaligned ranges succeed, and the bytes beside them keep their
#   value.
# - FAST_ZERO: a device without a zeroing command (a loop device over a
#   tmpfs file) must answer ENOTSUP, not let the kernel write zeroes for
#   it, and leave the data as it was; a device with one (over a file
#   elsewhere, where the kernel offers it) zeroes fast. What the kernel
#   offers is read from sysfs. With NO_HOLE it is always ENOTSUP.
# The tmpfs lives in a private mount namespace that the test makes.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need nbdinfo libnbd-bin
need qemu-img qemu-utils
need losetup mount
need python3
private_tmpfs 40 "$@"

# attach FILE: LOOP becomes a loop device over FILE, detached at exit.
attach () {
    LOOP=$(losetup -f --show "$1" 2>"$TMP/losetup.err") ||
        skip "cannot attach a loop device: $(cat "$TMP/losetup.err")"
    on_exit "losetup -d '$LOOP'"
}

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

# An image written onto a device: a qcow2 (as onto a logical volume) is
# flushed, verified through our reader and identical for qemu; cut short,
# it keeps its corrupt bit, and reading it says so. A VHD, whose footer
# must end the file, is refused with the device untouched.
fill
check "nbdflow copy --verify of a qcow2 onto a block device" \
    "$NBDFLOW" copy --verify "$TMP/sparse.img" "$dev" --dst-format qcow2
check "qemu-img compare of the qcow2 on the device" \
    qemu-img compare -q -f raw -F qcow2 "$TMP/sparse.img" "$dev"
if can_strace; then
    # LeakSanitizer cannot run under ptrace.
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        strace -f -qq -e trace=fdatasync,fsync -o "$TMP/st.q" "$NBDFLOW" copy \
        "$TMP/sparse.img" "$dev" --dst-format qcow2 ||
        fail "traced qcow2 copy onto the device"
    grep -q "fdatasync(" "$TMP/st.q" ||
        fail "a qcow2 written onto a device was never flushed"
fi
before=$(sha "$dev")
rc=0
"$NBDFLOW" copy "$TMP/sparse.img" "$dev" --dst-format vhd 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -q "a VHD is written to a file" "$TMP/err" ||
    fail "a VHD onto a block device: exit $rc: $(cat "$TMP/err")"
[ "$(sha "$dev")" = "$before" ] || fail "a refused VHD changed the device"
fill
"$NBDFLOW" copy --rate 4M "$TMP/sparse.img" "$dev" --dst-format qcow2 \
    2>/dev/null &
cpid=$!
sleep 1
kill -KILL "$cpid"
wait "$cpid" 2>/dev/null || true
qemu-img info "$dev" | grep -q "corrupt: true" ||
    fail "a qcow2 cut short on a device is not marked corrupt: $(qemu-img info "$dev")"
"$NBDFLOW" copy "qcow2:$dev" "$TMP/cut.img" 2>"$TMP/err" || true
grep -q "marked corrupt" "$TMP/err" ||
    fail "reading a qcow2 marked corrupt says nothing: $(cat "$TMP/err")"
note "ok: images onto a block device"

serve_start --unix "$TMP/nbd.sock" "$dev"
grep -q "export \"$dev\": block device, $((32 << 20)) bytes" "$SERVER_LOG" ||
    fail "the start-up log does not call $dev a block device: $(cat "$SERVER_LOG")"
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

# probe SOCK DEV: raw requests against the export of DEV.
probe () {
    python3 - "$1" "$LIB_DIR/../hostile/lib" "$2" <<'EOF'
import os, sys
sys.path.insert(0, sys.argv[2])
import rawnbd as r

SPAN = 65536
c = r.Conn(r.UnixServer(sys.argv[1])).open_export(structured=False)
ff = b"\xff" * SPAN

def write_ff():
    r.expect_err(c.do(r.CMD_WRITE, 0, SPAN, payload=ff)[0], 0, "WRITE")

def read():
    err, data = c.do(r.CMD_READ, 0, SPAN)
    r.expect_err(err, 0, "READ")
    return data

def zeroed(data, start, end, what):
    r.expect(data[start:end] == bytes(end - start),
             "%s: bytes %d-%d read as zeroes" % (what, start, end - 1))
    r.expect(data[:start] == ff[:start] and data[end:] == ff[end:],
             "%s: the bytes beside them are kept" % what)

# Not whole pages, not even one: the zeroes are written.
write_ff()
r.expect_err(c.do(r.CMD_WRITE_ZEROES, 100, 1000)[0], 0,
             "WRITE_ZEROES of bytes 100-1099")
zeroed(read(), 100, 1100, "WRITE_ZEROES inside one page")
# Partial pages at both edges around whole ones.
write_ff()
r.expect_err(c.do(r.CMD_WRITE_ZEROES, 1500, 20000)[0], 0,
             "WRITE_ZEROES of bytes 1500-21499")
zeroed(read(), 1500, 21500, "WRITE_ZEROES over edges and pages")
# TRIM leaves what it is not asked to touch alone.
write_ff()
r.expect_err(c.do(r.CMD_TRIM, 100, 20000)[0], 0, "TRIM of bytes 100-20099")
d = read()
r.expect(d[:100] == ff[:100] and d[20100:] == ff[20100:],
         "TRIM keeps the bytes beside it")

# Read only now: loop devices drop their zeroing command the first time
# the backing file refuses it, which the zeroing above has asked for.
q = "/sys/block/%s/queue/write_zeroes_max_bytes" % os.path.basename(
    sys.argv[3])
can = int(open(q).read()) > 0 if os.path.exists(q) else False
r.log("%s: %s" % (q, "a zeroing command" if can else "no zeroing command"))
for flags, want, what in (
        (r.CMD_FLAG_FAST_ZERO, can, "FAST_ZERO"),
        (r.CMD_FLAG_FAST_ZERO | r.CMD_FLAG_NO_HOLE, False,
         "FAST_ZERO with NO_HOLE")):
    write_ff()
    err, _ = c.do(r.CMD_WRITE_ZEROES, 1000, 20000, flags)
    d = read()
    if want:
        r.expect_err(err, 0, what + " on a device that can")
        zeroed(d, 1000, 21000, what)
    else:
        r.expect_err(err, r.ENOTSUP, what + " on a device that cannot")
        r.expect(d == ff, what + " refused: the data is unchanged")
c.request(r.CMD_DISC)
EOF
}

# Over tmpfs: no zeroing command on this kernel once asked, so FAST_ZERO
# is refused and must leave the data as it was.
probe "$TMP/nbd.sock" "$dev" || fail "probe of $dev (over tmpfs)"
server_alive || fail "the server died"
serve_stop

# Over a file outside the tmpfs: where the kernel gives the loop device a
# zeroing command, FAST_ZERO that may unmap succeeds.
truncate -s 32M "$TMP/backing2.img"
attach "$TMP/backing2.img"
dev2=$LOOP
serve_start --unix "$TMP/nbd2.sock" "$dev2"
probe "$TMP/nbd2.sock" "$dev2" || fail "probe of $dev2"
serve_stop
echo "PASS: block devices"
