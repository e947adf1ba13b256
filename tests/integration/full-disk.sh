#!/bin/bash
# full-disk.sh: a file system that fills up in the middle of a copy.
# (qemu-nbd's export on it too: our copy fails with ENOSPC named.)
# - nbdflow copy into a local file: refused before the file is made when
#   the source's allocated bytes exceed the room; with --no-space-check,
#   one error line naming the file, the offset, the length and ENOSPC, a
#   non-zero exit, no report. A VHD whose blocks would not fit (whole
#   2 MiB blocks for a few bytes of data each) is refused the same way.
# - nbdflow serve with its export on that file system: each client (ours,
#   nbdcopy, qemu-img) is told ENOSPC and fails; the server logs the
#   client and the export (at most 16 lines a connection), keeps
#   serving, and once there is room again a copy through the same server
#   lands whole.
# The small file system is a tmpfs mounted in a private mount namespace
# that the test makes for itself, so nothing outside it sees the mount.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need qemu-img qemu-utils
need qemu-nbd qemu-utils
private_tmpfs 4 "$@"
fs=$TMP/fs

make_random "$TMP/src.img" 8

# 0. A VHD holds a whole 2 MiB block for each one with a byte of data:
# one byte in each of 4 blocks is 16 KiB allocated, 8 MiB of image, more
# than the 4 MiB file system. Refused once the scan has counted them,
# before the file is made.
truncate -s 8M "$TMP/dots.img"
for i in 0 1 2 3; do
    printf x | dd of="$TMP/dots.img" bs=1 seek=$((i * 2097152)) conv=notrunc status=none
done
rc=0
"$NBDFLOW" copy "$TMP/dots.img" "$fs/dots.vhd" --dst-format vhd 2>"$TMP/err" ||
    rc=$?
[ "$rc" = 1 ] && [ ! -e "$fs/dots.vhd" ] &&
    grep -q "dots.vhd: its file system has room for [0-9]* bytes, and the vhd image needs at least 8388608 (4 blocks of 2097152 bytes hold data)" "$TMP/err" ||
    fail "a VHD that cannot fit: status $rc, $(cat "$TMP/err")"
note "ok: refused: $(cat "$TMP/err")"

# 1. A local destination file that cannot fit: refused before it is made,
# naming the room and the source's allocated bytes; with
# --no-space-check the copy runs into ENOSPC and says so.
rc=0
"$NBDFLOW" copy --json "$TMP/src.img" "$fs/out.img" >"$TMP/out" 2>"$TMP/err" ||
    rc=$?
[ "$rc" = 1 ] && [ ! -s "$TMP/out" ] && [ ! -e "$fs/out.img" ] &&
    [ "$(wc -l <"$TMP/err")" = 1 ] &&
    grep -q "out.img: its file system has room for [0-9]* bytes, and .*src.img has 8388608 bytes allocated" "$TMP/err" ||
    fail "a copy that cannot fit: status $rc, $(cat "$TMP/err")"
note "ok: refused: $(cat "$TMP/err")"
rc=0
"$NBDFLOW" copy --json --no-space-check "$TMP/src.img" "$fs/out.img" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
check_copy_failed "copy into a full file system" "$rc" "No space left on device"
grep -q "$fs/out.img" "$TMP/err" ||
    fail "the error does not name the destination file: $(cat "$TMP/err")"
rm -f "$fs/out.img"

# 2. Our server's export on the full file system.
truncate -s 8M "$fs/export.img"
sock=$TMP/nbd.sock
serve_start --unix "$sock" "$fs/export.img"

rc=0
"$NBDFLOW" copy --json "$TMP/src.img" "$(uri "$sock")" >"$TMP/out" \
    2>"$TMP/err" || rc=$?
check_copy_failed "nbdflow copy into a server whose disk is full" "$rc" \
    "No space left on device"
grep -q "socket=$sock" "$TMP/err" ||
    fail "the error does not name the server's URI: $(cat "$TMP/err")"

rc=0
nbdcopy "$TMP/src.img" "$(uri "$sock")" 2>"$TMP/err" || rc=$?
[ "$rc" != 0 ] || fail "nbdcopy into a full disk exited 0"
grep -q "No space left on device" "$TMP/err" ||
    fail "nbdcopy was not told ENOSPC: $(cat "$TMP/err")"
note "ok: nbdcopy: $(head -n1 "$TMP/err")"

rc=0
qemu-img convert -n -f raw -O raw "$TMP/src.img" "$(uri "$sock")" \
    2>"$TMP/err" || rc=$?
[ "$rc" != 0 ] || fail "qemu-img into a full disk exited 0"
grep -q "No space left on device" "$TMP/err" ||
    fail "qemu-img was not told ENOSPC: $(cat "$TMP/err")"
note "ok: qemu-img: $(head -n1 "$TMP/err")"

server_alive || fail "the server died on a full disk"
grep -q "unix client (fd [0-9]*): export \"$fs/export.img\": WRITE offset [0-9]* length [0-9]*: No space left on device" \
    "$SERVER_LOG" ||
    fail "ENOSPC not logged with client and export: $(cat "$SERVER_LOG")"

# A client that keeps writing to the full disk (a guest, say) gets ENOSPC
# every time, but the log takes at most 16 lines from it and says so.
python3 - "$sock" "$LIB_DIR/../hostile/lib" >"$TMP/flood.out" 2>&1 <<'EOF' ||
import sys
sys.path.insert(0, sys.argv[2])
import rawnbd as r

c = r.Conn(r.UnixServer(sys.argv[1])).open_export()
for i in range(40):
    err, _ = c.do(r.CMD_WRITE, 4 << 20, 65536, payload=bytes([i + 1]) * 65536)
    r.expect_err(err, r.ENOSPC, "WRITE %d to the full disk" % i)
c.request(r.CMD_DISC)
print("40 writes refused with ENOSPC")
EOF
    fail "raw client on the full disk: $(cat "$TMP/flood.out")"
note "ok: $(tail -n1 "$TMP/flood.out")"
for ((i = 0; i < 50; i++)); do
    grep -q "further problems on this connection are not logged" \
        "$SERVER_LOG" && break
    sleep 0.1
done
grep -q "further problems on this connection are not logged" "$SERVER_LOG" ||
    fail "40 failed writes on one connection, no cap: $(cat "$SERVER_LOG")"
n=$(grep -c "WRITE offset 4194304 length 65536: No space" "$SERVER_LOG") || true
[ "$n" = 16 ] || fail "$n lines for the 40 refused writes, want 16"
note "ok: 40 refused writes, 16 lines and a note that the rest are not"
! grep -qi "error:" "$SERVER_LOG" ||
    fail "a full disk is a client's failure, not the server's: $(cat "$SERVER_LOG")"

# 3. qemu-nbd with its export on the same full file system: our copy is
# told ENOSPC too, and says so in one line.
truncate -s 8M "$fs/qemu.img"
qemu-nbd -f raw -t -k "$TMP/qemu.sock" "$fs/qemu.img" >"$TMP/qemu.log" 2>&1 &
qemu_pid=$!
SERVER_PIDS+=("$qemu_pid")
wait_for test -S "$TMP/qemu.sock"
rc=0
"$NBDFLOW" copy --json "$TMP/src.img" "$(uri "$TMP/qemu.sock")" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
check_copy_failed "nbdflow copy into qemu-nbd whose disk is full" "$rc" \
    "No space left on device"
kill -TERM "$qemu_pid"
wait "$qemu_pid" 2>/dev/null || true
forget_pid "$qemu_pid"
rm -f "$fs/qemu.img"

# Room again: the same server takes a whole copy, each client in turn.
mount -o remount,size=16M "$fs" || fail "cannot grow the tmpfs"
check "nbdflow copy once there is room" \
    "$NBDFLOW" copy --verify "$TMP/src.img" "$(uri "$sock")"
same "$TMP/src.img" "$fs/export.img"
make_random "$TMP/src2.img" 8
check "nbdcopy once there is room" nbdcopy "$TMP/src2.img" "$(uri "$sock")"
same "$TMP/src2.img" "$fs/export.img"
serve_stop
echo "PASS: full disk"
