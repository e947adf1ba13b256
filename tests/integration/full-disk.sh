#!/bin/bash
# full-disk.sh: a file system that fills up in the middle of a copy.
# - nbdflow copy into a local file: one error line naming the file, the
#   offset, the length and ENOSPC, a non-zero exit, no report.
# - nbdflow serve with its export on that file system: each client (ours,
#   nbdcopy, qemu-img) is told ENOSPC and fails; the server logs the
#   export, keeps serving, and once there is room again a copy through
#   the same server lands whole.
# The small file system is a tmpfs mounted in a private mount namespace
# that the test makes for itself, so nothing outside it sees the mount.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need qemu-img qemu-utils
need unshare util-linux

if [ -z "${NBDFLOW_FULLDISK_NS:-}" ]; then
    unshare -m true 2>/dev/null ||
        skip "cannot make a private mount namespace (unshare -m needs root)"
    export NBDFLOW=$NBDFLOW NBDFLOW_FULLDISK_NS=1
    exec unshare -m --propagation private bash "$0" "$@"
fi

tmpdir_make
fs=$TMP/fs
mkdir "$fs"
mount -t tmpfs -o size=4M nbdflow-full "$fs" ||
    skip "cannot mount a tmpfs in the private namespace"
on_exit "umount -l '$fs'"

make_random "$TMP/src.img" 8

# 1. A local destination file that runs out of room.
rc=0
"$NBDFLOW" copy --json "$TMP/src.img" "$fs/out.img" >"$TMP/out" 2>"$TMP/err" ||
    rc=$?
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
grep -q "export \"$fs/export.img\": WRITE offset [0-9]* length [0-9]*: No space left on device" \
    "$SERVER_LOG" || fail "ENOSPC not logged with the export: $(cat "$SERVER_LOG")"
! grep -qi "error:" "$SERVER_LOG" ||
    fail "a full disk is a client's failure, not the server's: $(cat "$SERVER_LOG")"

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
