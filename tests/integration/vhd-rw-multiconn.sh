#!/bin/bash
# vhd-rw-multiconn.sh: several connections writing into the same new
# blocks of a VHD export at once. Four clients (nbdmini.py, one thread and
# connection each) write interleaved 4 KiB runs of the same blocks, in
# random order, many into blocks that none has allocated yet; then
# nbdcopy writes over four connections. Every block is allocated once:
# "info --check" finds no overlap and no lost space (a block allocated
# twice would leave one of them lost), the file is exactly as large as its
# allocated blocks need, and every reader sees what was written.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need qemu-img qemu-utils
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

size=$((8 << 20))
# checked WHAT VHD WANT: clean, no lost space, the size its blocks need,
# and every reader reads WANT.
checked () {
    local what=$1 vhd=$2 want=$3 blocks bs end
    ok "$what: info --check" info --check "vhd:$vhd"
    grep -q 'result: clean' "$TMP/out" || fail "$what: $(cat "$TMP/out")"
    grep -q 'lost-bytes: 0$' "$TMP/out" ||
        fail "$what: lost space (a block allocated twice?): $(cat "$TMP/out")"
    gen info "$vhd" >"$TMP/gi.json"
    py - "$vhd" "$TMP/gi.json" <<'PY' || fail "$what: file size"
import json, os, struct, sys
b = open(sys.argv[1], "rb").read()
hoff = struct.unpack(">Q", b[16:24])[0]
table, _, entries, bs = struct.unpack(">QIII", b[hoff + 16:hoff + 36])
bat = struct.unpack(">%dI" % entries, b[table:table + 4 * entries])
used = sorted(x for x in bat if x != 0xFFFFFFFF)
assert len(set(used)) == len(used), "two entries point at one block"
bm = ((bs // 512 + 7) // 8 + 511) // 512 * 512
end = max([x * 512 + bm + bs for x in used] + [table + (4 * entries + 511) // 512 * 512])
assert os.path.getsize(sys.argv[1]) == end + 512, (os.path.getsize(sys.argv[1]), end)
print("%d blocks" % len(used))
PY
    ok "$what: copy out" copy "vhd:$vhd" "$TMP/out.raw"
    same "$TMP/out.raw" "$want"
    gen read "$vhd" "$TMP/out.model" >/dev/null
    same "$TMP/out.model" "$want"
    qemu-img convert -f vpc -O raw "$vhd" "$TMP/out.qemu" ||
        fail "$what: qemu-img convert"
    same "$TMP/out.qemu" "$want"
}

for bsz in 64K 1M; do
    gen make "$TMP/m$bsz.vhd" --type dynamic --size $size --block-size $bsz \
        --data "sect:0-7" --expect "$TMP/m$bsz.raw"
    sock=$TMP/m$bsz.sock
    serve_start --unix "$sock" "$TMP/m$bsz.vhd"
    py - "$LIB_DIR" "$sock" "$TMP/m$bsz.raw" <<'PY' || fail "$bsz: concurrent writers"
import random, sys, threading
sys.path.insert(0, sys.argv[1])
import nbdmini
sock, model_path = sys.argv[2], sys.argv[3]
model = bytearray(open(model_path, "rb").read())
size, run, nconn = len(model), 4096, 4
errors = []
# Run i of the disk belongs to connection i % 4: neighbours in every block
# are written by different connections at about the same moment.
def writer(k):
    try:
        c = nbdmini.Conn(sock)
        rnd = random.Random(k)
        mine = list(range(k, size // run, nconn))
        rnd.shuffle(mine)
        for i in mine[: len(mine) * 3 // 4]:
            d = bytes([(i * 7 + k) & 0xFF or 1]) * run
            c.write(i * run, d)
            model[i * run:(i + 1) * run] = d
        c.flush()
        c.close()
    except Exception as e:
        errors.append("connection %d: %r" % (k, e))
ts = [threading.Thread(target=writer, args=(k,)) for k in range(nconn)]
for t in ts:
    t.start()
for t in ts:
    t.join()
if errors:
    sys.exit("; ".join(errors))
c = nbdmini.Conn(sock)
got = c.read(0, size)
c.close()
if got != bytes(model):
    i = next(i for i in range(size) if got[i] != model[i])
    sys.exit("the export differs from what was written at byte %d" % i)
open(model_path, "wb").write(model)
print("4 connections wrote the same blocks")
PY
    serve_stop
    checked "$bsz blocks, 4 writers" "$TMP/m$bsz.vhd" "$TMP/m$bsz.raw"
done

# nbdcopy over four connections into an empty disk.
gen make "$TMP/n.vhd" --type dynamic --size $size --block-size 256K
make_random "$TMP/n.raw" 8
serve_start --unix "$TMP/n.sock" "$TMP/n.vhd"
nbdcopy --connections=4 --request-size=65536 "$TMP/n.raw" "$(uri "$TMP/n.sock")" ||
    fail "nbdcopy --connections=4"
serve_stop
checked "nbdcopy, 4 connections" "$TMP/n.vhd" "$TMP/n.raw"
echo "PASS"
