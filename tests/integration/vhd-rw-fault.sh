#!/bin/bash
# vhd-rw-fault.sh: a block allocation of a VHD export that fails after
# the footer has moved (its data's fdatasync returns EIO, injected by
# strace) must not leave its bytes where the next new block goes: a
# WRITE_ZEROES that allocates the next block reads back as zeroes, now
# and after a restart, and the file passes info --check (at worst with
# lost space).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_strace
tmpdir_make
. "$(dirname "$0")/vhd.inc"

# A differencing disk: its WRITE_ZEROES allocates (a clear bit would read
# the parent), so the second request needs a new block too.
gen make "$TMP/base.vhd" --type dynamic --size $((8 << 20)) \
    --block-size 2M --data "" --expect "$TMP/base.raw"
gen make "$TMP/kid.vhd" --type diff --parent "$TMP/base.vhd" \
    --block-size 2M --data "" --expect "$TMP/kid.raw"
sock=$TMP/s.sock

# client: WRITE 2 MiB of 0xab at 0 (fails), WRITE_ZEROES 4 KiB at 4 MiB,
# READ it back; prints "write=ERR zero=ERR read=HEX8" (first bytes).
client () {
    python3 - "$sock" "$HOSTILE_LIB" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from rawnbd import *
c = Conn(UnixServer(sys.argv[1]))
c.open_export()
werr, _ = c.do(CMD_WRITE, 0, 2 << 20, payload=b"\xab" * (2 << 20))
zerr, _ = c.do(CMD_WRITE_ZEROES, 4 << 20, 4096)
rerr, data = c.do(CMD_READ, 4 << 20, 4096)
print("write=%d zero=%d read=%d nonzero=%d" % (werr, zerr, rerr,
      sum(1 for b in data if b)))
c.close()
PY
}
HOSTILE_LIB=$(cd "$(dirname "$0")/../hostile/lib" && pwd)

# The first fdatasync moves the footer, the second makes the data durable:
# that one fails.
strace -f -qq -o /dev/null -e inject=fdatasync:error=EIO:when=2 \
    "$NBDFLOW" serve --threads 1 --unix "$sock" "vhd:$TMP/kid.vhd" \
    2>"$TMP/serve.log" &
spid=$!
SERVER_PIDS+=("$spid")
wait_for test -S "$sock"
out=$(client) || fail "client: $out"
# The server under strace (killing strace would leave it running).
kill "$(pgrep -P "$spid" | head -n 1)"
wait "$spid" 2>/dev/null || true
forget_pid "$spid"
case $out in
    "write=5 zero=0 read=0 nonzero=0") ;;
    *) fail "after a failed allocation: $out (want the write's EIO, then zeroes read back)" ;;
esac
note "ok: $out"

rm -f "$sock"
"$NBDFLOW" serve --unix "$sock" "vhd:$TMP/kid.vhd" 2>>"$TMP/serve.log" &
spid=$!
SERVER_PIDS+=("$spid")
wait_for test -S "$sock"
python3 - "$sock" "$HOSTILE_LIB" <<'PY' || fail "after a restart: the zeroed block does not read as zeroes"
import sys
sys.path.insert(0, sys.argv[2])
from rawnbd import *
c = Conn(UnixServer(sys.argv[1]))
c.open_export()
err, data = c.do(CMD_READ, 4 << 20, 4096)
sys.exit(0 if err == 0 and not any(data) else 1)
PY
kill "$spid"; wait "$spid" 2>/dev/null || true
forget_pid "$spid"
ok "info --check after the failed allocation" info --check -f vhd "$TMP/kid.vhd"
note "ok: $(grep -a 'lost-bytes' "$TMP/out")"
echo "PASS"
