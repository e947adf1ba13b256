#!/bin/bash
# vhd-serve.sh: "nbdflow serve" of VHD images on a Unix socket. A probed
# dynamic VHD: nbdinfo sees its virtual size and, in --map, its holes
# (unallocated blocks) and data (set sectors); nbdcopy and qemu-img read it
# as the model expects. A differencing chain served as vhd:PATH (and as
# NAME=vhd:PATH) reads back as expected; probed, it is refused at start
# with one line naming the parent and how to allow it. A fixed VHD as
# vhd:PATH serves its virtual disk; raw:PATH serves the file's bytes, which
# copy and sum of the NBD URI read as raw (an NBD URI is never probed). A
# bad checksum stops the start unless --ignore-checksums.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdinfo libnbd-bin
need nbdcopy libnbd-bin
need qemu-img qemu-utils
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

mkdir "$TMP/a" "$TMP/b" "$TMP/c"
gen make "$TMP/a/dyn.vhd" --type dynamic --size 12M --garbage \
    --data "block:1 sect:7-9,300,8500-8600 empty:3" --expect "$TMP/a/dyn.raw"
gen make "$TMP/b/mid.vhd" --type diff --parent "$TMP/a/dyn.vhd" \
    --block-size 512K --locators w2ru --garbage \
    --data "sect:9-12,5000 block:12" --expect "$TMP/b/mid.raw"
gen make "$TMP/c/top.vhd" --type diff --parent "$TMP/b/mid.vhd" \
    --block-size 4K --locators macx --garbage --batmap \
    --data "sect:0,300-301,16000 block:1000" --expect "$TMP/c/top.raw"
gen make "$TMP/fixed.vhd" --type fixed --size 3M --data "block:0 sect:5000" \
    --expect "$TMP/fixed.raw"
size=$((12 << 20))

# ---- A dynamic VHD, probed: blocks 4 and 5 unallocated, 3 all clear ----------
sock=$TMP/dyn.sock
u=$(uri "$sock")
serve_start --unix "$sock" "$TMP/a/dyn.vhd"
[ "$(nbdinfo --size "$u")" = "$size" ] || fail "nbdinfo --size: $(nbdinfo --size "$u")"
nbdinfo --map --json "$u" >"$TMP/map.json" || fail "nbdinfo --map"
gen map "$TMP/a/dyn.vhd" >"$TMP/model.map"
# Every set sector must show as data (neither hole nor zero); every block
# the BAT leaves unallocated must show as a zero hole (3); the clear
# sectors of allocated blocks may be either.
if ! py - "$TMP/map.json" "$TMP/model.map" "$TMP/a/dyn.vhd" <<'PY'
import json, struct, sys
got = json.load(open(sys.argv[1]))
model = [tuple(int(x) for x in l.split()[:3]) for l in open(sys.argv[2])]
b = open(sys.argv[3], "rb").read()
hoff = struct.unpack(">Q", b[16:24])[0]
table, _, entries, bs = struct.unpack(">QIII", b[hoff + 16:hoff + 36])
bat = struct.unpack(">%dI" % entries, b[table:table + 4 * entries])
end = 0
for e in got:
    assert e["offset"] == end, ("gap", e, end)
    end += e["length"]
assert end == 12 << 20, end
def types(off, n):
    return {e["type"] for e in got
            if e["offset"] < off + n and off < e["offset"] + e["length"]}
for off, n, t in model:
    if t == 0:
        assert types(off, n) == {0}, ("data shown as", off, n, types(off, n))
unalloc = [i for i, x in enumerate(bat) if x == 0xFFFFFFFF]
assert unalloc, bat
for i in unalloc:
    assert types(i * bs, bs) == {3}, ("unallocated block", i, types(i * bs, bs))
print("%d extents" % len(got))
PY
then
    fail "nbdinfo --map does not show the holes and data: $(cat "$TMP/map.json")"
fi
note "ok: nbdinfo --map shows the holes and the data"
nbdcopy "$u" "$TMP/dyn.nbdcopy" || fail "nbdcopy out"
same "$TMP/dyn.nbdcopy" "$TMP/a/dyn.raw"
qemu-img convert -f raw -O raw "$u" "$TMP/dyn.qemu" || fail "qemu-img convert out"
same "$TMP/dyn.qemu" "$TMP/a/dyn.raw"
serve_stop

# ---- A differencing chain: refused probed, served as vhd: -------------------
serve_launch --unix "$TMP/probe.sock" "$TMP/c/top.vhd" && rc=0 || rc=$?
[ "$rc" = 1 ] || fail "a probed differencing disk was served (serve_launch: $rc)"
if [ "$SERVER_RC" = 0 ] || [ "$SERVER_RC" -ge 128 ]; then
    fail "probed differencing disk: server exit status $SERVER_RC"
fi
[ "$(grep -c . "$SERVER_LOG")" = 1 ] ||
    fail "probed differencing disk: want one line, got: $(cat "$SERVER_LOG")"
if ! grep -q '^nbdflow' "$SERVER_LOG" || ! grep -qF mid.vhd "$SERVER_LOG" ||
    ! grep -qE -- '-f vhd|vhd:' "$SERVER_LOG"; then
    fail "probed differencing disk: $(cat "$SERVER_LOG")"
fi
note "ok: probed differencing disk refused: $(cat "$SERVER_LOG")"
: >"$SERVER_LOG"

sock=$TMP/chain.sock
serve_start --unix "$sock" "vhd:$TMP/c/top.vhd" "mid=vhd:$TMP/b/mid.vhd" \
    "fixed=vhd:$TMP/fixed.vhd" "file=raw:$TMP/a/dyn.vhd"
u=$(uri "$sock")
[ "$(nbdinfo --size "$u")" = "$size" ] || fail "chain: nbdinfo --size"
nbdcopy "$u" "$TMP/top.nbdcopy" || fail "nbdcopy out of the chain"
same "$TMP/top.nbdcopy" "$TMP/c/top.raw"
qemu-img convert -f raw -O raw "$u" "$TMP/top.qemu" || fail "qemu-img convert of the chain"
same "$TMP/top.qemu" "$TMP/c/top.raw"
nbdcopy "nbd+unix:///mid?socket=$sock" "$TMP/mid.nbdcopy" || fail "nbdcopy mid"
same "$TMP/mid.nbdcopy" "$TMP/b/mid.raw"
[ "$(nbdinfo --size "nbd+unix:///fixed?socket=$sock")" = $((3 << 20)) ] ||
    fail "fixed: nbdinfo --size"
nbdcopy "nbd+unix:///fixed?socket=$sock" "$TMP/fixed.nbdcopy" || fail "nbdcopy fixed"
same "$TMP/fixed.nbdcopy" "$TMP/fixed.raw"
# raw: serves the file's own bytes; an NBD URI is not probed.
fu="nbd+unix:///file?socket=$sock"
[ "$(nbdinfo --size "$fu")" = "$(stat -c %s "$TMP/a/dyn.vhd")" ] ||
    fail "raw: export size $(nbdinfo --size "$fu")"
ok "copy of an NBD export holding a VHD" copy "$fu" "$TMP/file.out"
same "$TMP/file.out" "$TMP/a/dyn.vhd"
ok "sum of an NBD export holding a VHD" sum --algo sha256 "$fu"
[ "$(cut -d' ' -f1 "$TMP/out")" = "$(sha "$TMP/a/dyn.vhd")" ] ||
    fail "sum of an NBD export holding a VHD: $(cat "$TMP/out")"
serve_stop

# ---- Checksums ----------------------------------------------------------------
gen corrupt "$TMP/a/dyn.vhd" "$TMP/badsum.vhd" --kind header-checksum
serve_launch --unix "$TMP/bad.sock" "$TMP/badsum.vhd" && rc=0 || rc=$?
[ "$rc" = 1 ] || fail "an image with a bad checksum was served (serve_launch: $rc)"
if ! grep -qi checksum "$SERVER_LOG" ||
    ! grep -qF "$TMP/badsum.vhd" "$SERVER_LOG"; then
    fail "bad checksum: $(cat "$SERVER_LOG")"
fi
note "ok: bad checksum refused: $(cat "$SERVER_LOG")"
: >"$SERVER_LOG"
serve_start --unix "$TMP/ign.sock" --ignore-checksums "$TMP/badsum.vhd"
nbdcopy "$(uri "$TMP/ign.sock")" "$TMP/ign.nbdcopy" || fail "nbdcopy --ignore-checksums"
same "$TMP/ign.nbdcopy" "$TMP/a/dyn.raw"
serve_stop
echo "PASS"
