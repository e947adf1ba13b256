#!/bin/bash
# vhd-rw-race.sh: a WRITE of whole sectors into a full block of a VHD
# served read-write, racing a TRIM of the same sectors on another
# connection, leaves the file meaning one thing to every reader: the
# export, a fresh server and qemu-img (which ignores the sector bitmaps)
# read the same bytes, whichever of the two the file ended with. The
# TRIM's punch is held 300 ms (strace delays fallocate's return) and the
# WRITE comes 50 ms into it, so the write lands between the punch and the
# clearing of the bits, where a write that took the block for full once
# left its data under clear bits.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need qemu-img qemu-utils
need_strace
tmpdir_make
img=$TMP/race.vhd
sock=$TMP/race.sock
qemu-img create -q -f vpc -o subformat=dynamic "$img" 64M

strace -f -qq -o /dev/null -e trace=fallocate \
    -e inject=fallocate:delay_exit=300000 \
    "$NBDFLOW" serve --loops 4 --unix "$sock" "vhd:$img" 2>"$TMP/serve.log" &
spid=$!
SERVER_PIDS+=("$spid")
wait_for test -S "$sock"
python3 - "$sock" "$(dirname "$0")" >"$TMP/got" <<'PY' || fail "client failed"
import os, sys, threading, time
sys.path.insert(0, sys.argv[2])
import nbdmini
blk, at, n = 2 << 20, 3 * (2 << 20) + 8192, 4096
a, b, c = (nbdmini.Conn(sys.argv[1]) for _ in range(3))
a.write(3 * blk, os.urandom(blk))  # block 3 full: every bit set
data = os.urandom(n)
t = threading.Thread(target=b.trim, args=(at, n))
t.start()
time.sleep(0.05)
a.write(at, data)
t.join()
got = c.read(at, n)
sys.stdout.write(("data" if got == data else "zeroes" if got == bytes(n)
                  else "other") + "\n")
for x in (a, b, c):
    x.close()
PY
kill "$(pgrep -P "$spid" | head -n 1)"
wait "$spid" 2>/dev/null || true
forget_pid "$spid"
export_saw=$(cat "$TMP/got")
[ "$export_saw" = data ] || [ "$export_saw" = zeroes ] ||
    fail "the export read neither the write nor zeroes"
at=$((3 * (2 << 20) + 8192))
qemu-img convert -f vpc -O raw "$img" "$TMP/qemu.raw"
"$NBDFLOW" copy "vhd:$img" "$TMP/ours.raw"
cmp "$TMP/qemu.raw" "$TMP/ours.raw" >&2 ||
    fail "qemu-img and nbdflow read the image differently (the export read $export_saw)"
want=$TMP/want
if [ "$export_saw" = zeroes ]; then head -c 4096 /dev/zero >"$want"
else cmp -s <(dd if="$TMP/ours.raw" bs=4096 skip=$((at / 4096)) count=1 2>/dev/null) \
        <(head -c 4096 /dev/zero) && fail "the export read the write, the file zeroes"
     dd if="$TMP/ours.raw" bs=4096 skip=$((at / 4096)) count=1 of="$want" 2>/dev/null
fi
cmp <(dd if="$TMP/qemu.raw" bs=4096 skip=$((at / 4096)) count=1 2>/dev/null) "$want" >&2 ||
    fail "the file does not hold what the export read ($export_saw)"
note "ok: the export, nbdflow and qemu-img all read $export_saw"
echo "PASS"
