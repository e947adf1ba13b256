#!/bin/bash
# copy-odd-sizes.sh: images of 0, 513 and 1 GiB + 1 bytes, through NBD
# (nbdkit memory) and file destinations, checked by sha256.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
tmpdir_make

for size in 0 513 $(( (1 << 30) + 1 )); do
    rm -f "$TMP/src.img" "$TMP/back.img"
    truncate -s "$size" "$TMP/src.img"
    if [ "$size" -gt 0 ]; then
        # Data at the start and in the last, partial block.
        head -c $(( size < 4096 ? size : 4096 )) /dev/urandom |
            dd of="$TMP/src.img" conv=notrunc status=none
        if [ "$size" -gt 8192 ]; then
            head -c 4097 /dev/urandom |
                dd of="$TMP/src.img" bs=1 seek=$(( size - 4097 )) \
                   conv=notrunc status=none
            head -c 3M /dev/urandom |
                dd of="$TMP/src.img" bs=1M seek=700 conv=notrunc status=none
        fi
    fi
    check "$size bytes: file -> file" "$NBDFLOW" copy "$TMP/src.img" \
        "$TMP/back.img"
    [ "$(stat -c %s "$TMP/back.img")" -eq "$size" ] ||
        fail "$size bytes: file copy has the wrong size"
    same "$TMP/src.img" "$TMP/back.img"
    if [ "$size" -eq 0 ]; then
        continue # nbdkit cannot serve an empty memory disk
    fi
    sock="$TMP/m$size.sock"
    nbdkit -f -U "$sock" memory "$size" >>"$TMP/kit.log" 2>&1 &
    SERVER_PIDS+=($!)
    wait_for test -S "$sock"
    check "$size bytes: file -> nbd" "$NBDFLOW" copy "$TMP/src.img" \
        "nbd+unix:///?socket=$sock"
    rm -f "$TMP/back.img"
    check "$size bytes: nbd -> file" "$NBDFLOW" copy \
        "nbd+unix:///?socket=$sock" "$TMP/back.img"
    [ "$(sha "$TMP/src.img")" = "$(sha "$TMP/back.img")" ] ||
        fail "$size bytes: round trip differs"
    [ "$("$NBDFLOW" sum --algo sha256 "nbd+unix:///?socket=$sock" |
         cut -d' ' -f1)" = "$(sha "$TMP/src.img")" ] ||
        fail "$size bytes: sum over nbd differs from sha256sum"
    note "ok: $size bytes round trip"
done
echo "PASS"
