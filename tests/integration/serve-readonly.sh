#!/bin/bash
# --read-only: nbdcopy and qemu-img writes fail, the file is unchanged,
# reads still work.
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need qemu-img qemu-utils
tmpdir_make

make_random "$TMP/disk.img" 4
make_random "$TMP/other.img" 4
before=$(sha "$TMP/disk.img")
serve_tcp --read-only "$TMP/disk.img" mem=memory:4M

check_fails "nbdcopy into a read-only file export" \
    nbdcopy "$TMP/other.img" "$URI"
check_fails "qemu-img convert into a read-only file export" \
    qemu-img convert -n -f raw -O raw "$TMP/other.img" "$URI"
check_fails "nbdcopy into a read-only memory export" \
    nbdcopy "$TMP/other.img" "$URI/mem"
[ "$(sha "$TMP/disk.img")" = "$before" ] || fail "read-only file was modified"
note "ok: file unchanged"

nbdcopy "$URI" "$TMP/out.img" || fail "read from a read-only export"
same "$TMP/disk.img" "$TMP/out.img"
rm -f "$TMP/out.img"
nbdcopy "$URI/mem" "$TMP/out.img" || fail "read of read-only memory"
all_zero "$TMP/out.img" $((4 << 20))
server_alive || fail "server died"
serve_stop
echo "PASS: writes refused on read-only exports"
