#!/bin/bash
# copy-verify.sh: --verify passes on a good copy and fails, naming the
# first differing range, when the destination silently loses writes (an
# nbdkit eval plugin that acknowledges writes and reads back zeroes past
# 3 MiB).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
tmpdir_make
make_random "$TMP/src.img" 12

nbdkit -f -U "$TMP/good.sock" memory 12M >>"$TMP/kit.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/good.sock"
check "verified copy" "$NBDFLOW" copy --verify --json "$TMP/src.img" \
    "nbd+unix:///?socket=$TMP/good.sock" >"$TMP/report"
grep -q '"verified": true' "$TMP/report" || fail "report lacks verified"
check "verified copy to a file" "$NBDFLOW" copy --verify \
    "nbd+unix:///?socket=$TMP/good.sock" "$TMP/back.img"
same "$TMP/src.img" "$TMP/back.img"

# A liar: the first 3 MiB are kept in a file, the rest is dropped.
truncate -s 3M "$TMP/kept"
nbdkit -f -U "$TMP/bad.sock" eval \
    get_size='echo 12582912' \
    can_write='exit 0' can_flush='exit 0' flush='exit 0' \
    pread='if [ $4 -lt 3145728 ]; then dd if='"$TMP"'/kept bs=$3 count=1 skip=$4 iflag=skip_bytes status=none; else head -c $3 /dev/zero; fi' \
    pwrite='if [ $4 -lt 3145728 ]; then dd of='"$TMP"'/kept bs=$3 count=1 seek=$4 iflag=fullblock oflag=seek_bytes conv=notrunc status=none; else cat >/dev/null; fi' \
    >>"$TMP/kit.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/bad.sock"
rc=0
"$NBDFLOW" copy --verify --json --request-size 1M "$TMP/src.img" \
    "nbd+unix:///?socket=$TMP/bad.sock" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -ne 0 ] || fail "verify accepted a destination that lost writes"
grep -q "differs from .* in bytes 0 to 4194304" "$TMP/err" ||
    fail "mismatch message does not name the first range: $(cat "$TMP/err")"
[ ! -s "$TMP/out" ] || fail "a report was printed after a failed verify"
note "ok: $(cat "$TMP/err")"

# An empty source copies nothing, so nothing can differ: the 4 MiB of the
# destination past its end are not compared with it.
: >"$TMP/empty.img"
"$NBDFLOW" copy --verify --json "$TMP/empty.img" \
    "nbd+unix:///?socket=$TMP/bad.sock" >"$TMP/out" 2>"$TMP/err" ||
    fail "--verify of an empty source: $(cat "$TMP/err")"
grep -q '"verified": true' "$TMP/out" || fail "empty source: $(cat "$TMP/out")"
note "ok: --verify of an empty source"

# DST is read back as the destination it was: a file named like a
# generated source ("zero:8M") is that file, not zeroes.
make_random "$TMP/r.img" 8
(cd "$TMP" && "$NBDFLOW" copy --verify r.img zero:8M) 2>"$TMP/err" ||
    fail "--verify into a file named zero:8M: $(cat "$TMP/err")"
same "$TMP/r.img" "$TMP/zero:8M"

# A DST that cannot be read back is refused before it is opened (a FIFO
# would wait for its reader) or anything is sent.
mkfifo "$TMP/fifo"
for dst in /dev/null "$TMP/fifo" "https://127.0.0.1:9/upload"; do
    rc=0
    timeout 20 "$NBDFLOW" copy --verify "$TMP/r.img" "$dst" 2>"$TMP/err" || rc=$?
    [ "$rc" = 2 ] && grep -q "cannot be read back" "$TMP/err" ||
        fail "--verify into $dst: status $rc: $(cat "$TMP/err")"
done
note "ok: --verify into /dev/null, a FIFO or an https upload is refused"
# ... while a new image read back through its format is verified.
check "--verify into a new VHD" "$NBDFLOW" copy --verify --dst-format vhd \
    "$TMP/r.img" "$TMP/r.vhd"
check "--verify into a new qcow2" "$NBDFLOW" copy --verify --dst-format qcow2 \
    "$TMP/r.img" "$TMP/r.qcow2"
echo "PASS"
