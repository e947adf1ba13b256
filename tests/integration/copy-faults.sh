#!/bin/bash
# copy-faults.sh: a failed request must stop the copy with one clear line
# (endpoint, offset, length, errno) and a non-zero exit, never success.
# nbdkit's error filter (EIO, ENOSPC), the full plugin, a delay filter
# (slow but correct), and a server killed in the middle of a copy.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
tmpdir_make


make_random "$TMP/src.img" 16

# expect_failure NAME ERRNO-TEXT CMD...: non-zero exit, exactly one error
# line, naming the errno text and an offset and a length.
expect_failure () {
    local name=$1 text=$2; shift 2
    local rc=0
    "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    check_copy_failed "$name" "$rc" "$text"
}

kit "$TMP/eio.sock" --filter=error memory 16M error=EIO error-pwrite-rate=100%
expect_failure "EIO on write" "Input/output error" \
    "$NBDFLOW" copy --json "$TMP/src.img" "$(uri "$TMP/eio.sock")"

kit "$TMP/enospc.sock" --filter=error memory 16M error=ENOSPC \
    error-pwrite-rate=20%
expect_failure "ENOSPC on some writes" "No space left on device" \
    "$NBDFLOW" copy --json --request-size 256K "$TMP/src.img" \
    "$(uri "$TMP/enospc.sock")"

kit "$TMP/rd.sock" --filter=error pattern 16M error=EIO error-pread-rate=30%
expect_failure "EIO on read" "Input/output error" \
    "$NBDFLOW" copy --json --request-size 128K "$(uri "$TMP/rd.sock")" \
    "$TMP/dst.img"

# Every errno, both directions, rates from rare to always: never a
# success, always the errno and an offset. 512 requests of 32 KiB make a
# copy that meets no error at 5% unlikely (0.95^512 < 1e-11).
for errno_name in EIO ENOSPC; do
    case $errno_name in
        EIO) text="Input/output error" ;;
        ENOSPC) text="No space left on device" ;;
    esac
    for rate in 5% 25% 100%; do
        sock=$TMP/w-$errno_name-${rate%\%}.sock
        kit "$sock" --filter=error memory 16M error=$errno_name \
            error-pwrite-rate=$rate
        expect_failure "$errno_name on $rate of writes" "$text" \
            "$NBDFLOW" copy --json --request-size 32K "$TMP/src.img" \
            "$(uri "$sock")"
        sock=$TMP/r-$errno_name-${rate%\%}.sock
        kit "$sock" --filter=error pattern 16M error=$errno_name \
            error-pread-rate=$rate
        rm -f "$TMP/dst.img"
        expect_failure "$errno_name on $rate of reads" "$text" \
            "$NBDFLOW" copy --json --request-size 32K "$(uri "$sock")" \
            "$TMP/dst.img"
    done
done

kit "$TMP/full.sock" full 16M
expect_failure "full device" "No space left on device" \
    "$NBDFLOW" copy --json "$TMP/src.img" "$(uri "$TMP/full.sock")"

# A delay filter slows every request; the copy must still be exact.
kit "$TMP/slow.sock" --filter=delay memory 16M wdelay=20ms rdelay=5ms
check "copy through the delay filter" \
    "$NBDFLOW" copy --verify --request-size 1M "$TMP/src.img" \
    "$(uri "$TMP/slow.sock")"
rm -f "$TMP/back.img"
check "read back through the delay filter" \
    "$NBDFLOW" copy "$(uri "$TMP/slow.sock")" "$TMP/back.img"
same "$TMP/src.img" "$TMP/back.img"

# A source file cut short during the copy: what is gone must fail the
# copy, not arrive as zeroes. 3072 extents of data fill the first 96 MiB
# (more than the copy looks ahead), a hole the rest; the file shrinks to
# 200 MiB long before the copy reaches 96 MiB (at least 1,000 writes of
# 20 ms, 4 at a time: 5 s), so its look at the hole finds the file
# shorter. The first write to arrive shows the copy has taken the size.
python3 - "$TMP/shrink.img" <<'PY'
import os, sys
with open(sys.argv[1], "wb") as f:
    f.truncate(256 << 20)
    for i in range(3072):
        f.seek(i * 32768)
        f.write(os.urandom(4096))
PY
kit "$TMP/shrink.sock" --filter=log --filter=delay memory 256M wdelay=20ms \
    logfile="$TMP/shrink.log"
"$NBDFLOW" copy --max-requests 4 --destination-is-zero --json \
    "$TMP/shrink.img" "$(uri "$TMP/shrink.sock")" >"$TMP/out" 2>"$TMP/err" &
copy_pid=$!
wait_for grep -q " Write id=" "$TMP/shrink.log"
truncate -s 200M "$TMP/shrink.img"
rc=0
wait "$copy_pid" || rc=$?
check_copy_failed "source shrank" "$rc" "shorter than the 268435456 bytes"

# Kill the server in the middle of a slow copy.
kit "$TMP/kill.sock" --filter=log --filter=delay memory 16M wdelay=100ms \
    logfile="$TMP/kill.log"
"$NBDFLOW" copy --request-size 256K --inflight 1M --json "$TMP/src.img" \
    "$(uri "$TMP/kill.sock")" >"$TMP/out" 2>"$TMP/err" &
copy_pid=$!
wait_for grep -q " Write id=" "$TMP/kill.log" # mid-copy, however slow
kill -KILL "$KIT_PID"
wait "$KIT_PID" 2>/dev/null || true
forget_pid "$KIT_PID"
rc=0
wait "$copy_pid" || rc=$?
check_copy_failed "server killed" "$rc" ""
echo "PASS"
