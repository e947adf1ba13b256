#!/bin/bash
# Copies over several connections at once (nbdcopy --connections=4) into
# and out of file and memory exports, with CAN_MULTI_CONN advertised.
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need nbdinfo libnbd-bin
tmpdir_make

make_random "$TMP/src.img" 64
truncate -s 64M "$TMP/target.img"
serve_tcp --max-inflight 16 file="$TMP/target.img" mem=memory:64M

[ "$(nbdinfo --can multi-conn "$URI/mem"; echo $?)" = 0 ] ||
    fail "CAN_MULTI_CONN not advertised on the memory export"
[ "$(nbdinfo --can multi-conn "$URI/file"; echo $?)" = 0 ] ||
    fail "CAN_MULTI_CONN not advertised on the file export"

for exp in file mem; do
    nbdcopy --connections=4 --requests=16 --request-size=262144 \
        "$TMP/src.img" "$URI/$exp" || fail "4-connection copy into $exp"
    rm -f "$TMP/out.img"
    nbdcopy --connections=4 --requests=16 "$URI/$exp" "$TMP/out.img" ||
        fail "4-connection copy out of $exp"
    same "$TMP/src.img" "$TMP/out.img"
done
same "$TMP/src.img" "$TMP/target.img"

# Two copies running at the same time into two exports.
make_random "$TMP/src2.img" 64
nbdcopy --connections=4 "$TMP/src2.img" "$URI/mem" & p1=$!
nbdcopy --connections=4 "$TMP/src2.img" "$URI/file" & p2=$!
wait $p1 || fail "concurrent copy into mem"
wait $p2 || fail "concurrent copy into file"
same "$TMP/src2.img" "$TMP/target.img"
rm -f "$TMP/out.img"
nbdcopy --connections=4 "$URI/mem" "$TMP/out.img" || fail "copy out of mem"
same "$TMP/src2.img" "$TMP/out.img"
serve_stop
echo "PASS: multi-connection copies verified"
