#!/bin/bash
# A second export by name: distinct content from the default export, and
# an unknown name refused.
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need qemu-img qemu-utils
tmpdir_make

make_random "$TMP/one.img" 4
make_random "$TMP/two.img" 6
serve_tcp "$TMP/one.img" two="$TMP/two.img"

nbdcopy "$URI" "$TMP/out0.img" || fail "read the default export"
same "$TMP/one.img" "$TMP/out0.img"
nbdcopy "$URI/two" "$TMP/out2.img" || fail "read export two"
same "$TMP/two.img" "$TMP/out2.img"
qemu-img convert -f raw -O raw "$URI/two" "$TMP/q2.img" || fail "qemu-img read two"
same "$TMP/two.img" "$TMP/q2.img"
# The default export is also reachable under its own name (its path).
qemu-img convert -f raw -O raw "nbd://127.0.0.1:$PORT/$TMP/one.img" "$TMP/q1.img" ||
    fail "qemu-img read of the first export by its path name"
same "$TMP/one.img" "$TMP/q1.img"
# Writing to one export leaves the other alone.
make_random "$TMP/new.img" 6
nbdcopy "$TMP/new.img" "$URI/two" || fail "write export two"
same "$TMP/new.img" "$TMP/two.img"
nbdcopy "$URI" "$TMP/out0b.img" || fail "read the default export again"
same "$TMP/one.img" "$TMP/out0b.img"
check_fails "an unknown export name is refused" \
    nbdcopy "$URI/three" "$TMP/none.img"
serve_stop
echo "PASS: named exports"
