#!/bin/bash
# vhd-rw.sh: "nbdflow serve" of a VHD read-write, as tapdisk receives a
# disk. nbdcopy (dense and sparse, holes zeroed) and qemu-img write into a
# dynamic VHD export; a client of the test's own (nbdmini.py) sends what
# stock clients do not: writes, zeroes and trims of any alignment, checked
# against a model of the disk. Afterwards qemu-img (-f vpc), nbdflow and the
# reader model (vhdgen.py) read the file back identical, and "info --check"
# finds it clean. The export advertises 512-byte minimum blocks and
# trim; zeroing an unallocated block allocates nothing. A differencing child
# written over its parent reads back as expected, leaves the parent as it
# was, and allocates a block for one sector without copying the parent's
# others. A fixed VHD is written as raw bytes before its footer.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdinfo libnbd-bin
need nbdcopy libnbd-bin
need qemu-img qemu-utils
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

size=$((8 << 20))
# readback WHAT VHD WANT [qemu]: every reader sees WANT in VHD, and it is
# clean; with "qemu", qemu-img too (it reads blocks without their bitmaps,
# so only images with nothing under their clear bits).
readback () {
    local what=$1 vhd=$2 want=$3
    ok "$what: info --check" info --check "vhd:$vhd"
    grep -q 'result: clean' "$TMP/out" || fail "$what: check: $(cat "$TMP/out")"
    ok "$what: copy out" copy "vhd:$vhd" "$TMP/rb.nbdflow"
    same "$TMP/rb.nbdflow" "$want"
    gen read "$vhd" "$TMP/rb.model" >/dev/null
    same "$TMP/rb.model" "$want"
    if [ "${4:-}" = qemu ]; then
        qemu-img convert -f vpc -O raw "$vhd" "$TMP/rb.qemu" ||
            fail "$what: qemu-img convert -f vpc"
        same "$TMP/rb.qemu" "$want"
    fi
}

# ops SOCK MODEL SEED N: N random writes, zeroes (with and without
# NO_HOLE), trims and flushes of any offset and length through nbdmini,
# each applied to MODEL (the disk's expected bytes, rewritten in place); a
# trim's range reads back as whatever the server says (then zeroes on a
# dynamic disk: checked when DYN is set). Reads the whole disk at the end
# and compares.
ops () {
    py - "$LIB_DIR" "$@" <<'PY' || fail "random writes through nbdmini: see above"
import random, sys
sys.path.insert(0, sys.argv[1])
import nbdmini
sock, model_path, seed, nops = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
dyn = len(sys.argv) > 6
c = nbdmini.Conn(sock)
model = bytearray(open(model_path, "rb").read())
assert c.size == len(model), (c.size, len(model))
rnd = random.Random(seed)
for i in range(nops):
    off = rnd.randrange(c.size)
    # mostly small and unaligned, now and then over several blocks
    n = rnd.randrange(1, 3000) if rnd.random() < 0.7 else rnd.randrange(1, 3 << 19)
    n = min(n, c.size - off)
    if rnd.random() < 0.3:  # aligned too
        off -= off % 512
        n = max(512, n - n % 512)
        n = min(n, c.size - off)
    k = rnd.random()
    if k < 0.55:
        d = rnd.randbytes(min(n, 4096)) * (n // 4096 + 1)
        c.write(off, d[:n], fua=rnd.random() < 0.1)
        model[off:off + n] = d[:n]
    elif k < 0.8:
        c.zero(off, n, no_hole=rnd.random() < 0.3)
        model[off:off + n] = bytes(n)
    else:
        c.trim(off, n)
        got = c.read(off, n)
        if dyn:  # whole sectors of an allocated block read as zeroes
            a, b = (off + 511) // 512 * 512, (off + n) // 512 * 512
            if a < b:
                assert got[a - off:b - off] == bytes(b - a), ("trim", off, n)
        model[off:off + n] = got
    if rnd.random() < 0.05:
        c.flush()
c.flush()
got = c.read(0, c.size)
if got != bytes(model):
    i = next(i for i in range(len(got)) if got[i] != model[i])
    sys.exit("the export differs from the model at byte %d" % i)
open(model_path, "wb").write(model)
c.close()
print("%d operations, read back as the model" % nops)
PY
}

# ---- A dynamic VHD: nbdcopy and qemu-img write into it ----------------------
gen make "$TMP/dyn.vhd" --type dynamic --size $size \
    --data "block:1 sect:7-9,300,8500-8600 empty:3" --expect "$TMP/dyn.raw"
sock=$TMP/dyn.sock
u=$(uri "$sock")
serve_start --unix "$sock" "$TMP/dyn.vhd"
nbdinfo --json "$u" >"$TMP/info.json" || fail "nbdinfo"
py - "$TMP/info.json" <<'PY' || fail "nbdinfo: $(cat "$TMP/info.json")"
import json, sys
e = json.load(open(sys.argv[1]))["exports"][0]
assert e["is_read_only"] is False, e
assert e["can_trim"] and e["can_zero"] and e["can_flush"] and e["can_fua"], e
assert e["block_size_minimum"] == 512, e
PY
note "ok: read-write, trim, minimum block 512"
# Sparse: data here and there, the rest holes that nbdcopy zeroes.
make_sparse "$TMP/sparse.raw" 8 "0:1 3:2 7:1"
nbdcopy "$TMP/sparse.raw" "$u" || fail "nbdcopy into the export"
nbdcopy "$u" "$TMP/back.raw" || fail "nbdcopy out of the export"
same "$TMP/back.raw" "$TMP/sparse.raw"
# Dense, through qemu-img, unaligned lengths at the end included.
make_random "$TMP/dense.raw" 8
qemu-img convert -n -f raw -O raw "$TMP/dense.raw" "$u" ||
    fail "qemu-img convert into the export"
qemu-img convert -f raw -O raw "$u" "$TMP/back2.raw" || fail "qemu-img out"
same "$TMP/back2.raw" "$TMP/dense.raw"
serve_stop
readback "dense" "$TMP/dyn.vhd" "$TMP/dense.raw" qemu

# ---- Any alignment, zeroes and trims: a fresh dynamic disk, 512 KiB blocks --
gen make "$TMP/odd.vhd" --type dynamic --size $size --block-size 512K \
    --data "block:2 sect:5000-5003" --expect "$TMP/odd.raw"
serve_start --unix "$sock" "$TMP/odd.vhd"
ops "$sock" "$TMP/odd.raw" 7 300 dyn
serve_stop
readback "random writes" "$TMP/odd.vhd" "$TMP/odd.raw" qemu

# Garbage under clear bits: a partial sector written into it reads the
# rest of the sector as zeroes, never the garbage.
gen make "$TMP/garb.vhd" --type dynamic --size $size --garbage \
    --data "sect:0-3,4100-4200 empty:3" --expect "$TMP/garb.raw"
serve_start --unix "$sock" "$TMP/garb.vhd"
ops "$sock" "$TMP/garb.raw" 11 200 dyn
serve_stop
readback "garbage under clear bits" "$TMP/garb.vhd" "$TMP/garb.raw"

# Zeroing and trimming unallocated blocks allocates nothing; zeroing
# with NO_HOLE provisions the range (the spec's MUST): its block is
# allocated, and the range reads as zeroes, as data.
gen make "$TMP/empty.vhd" --type dynamic --size $size --data "block:0" \
    --expect "$TMP/empty.raw"
ok "info before" info "$TMP/empty.vhd"
before=$(field allocated)
serve_start --unix "$sock" "$TMP/empty.vhd"
zeroes () {
    py - "$LIB_DIR" "$sock" "$1" <<'PY' || fail "zeroes into unallocated blocks"
import sys
sys.path.insert(0, sys.argv[1])
import nbdmini
c = nbdmini.Conn(sys.argv[2])
if sys.argv[3] == "hole":
    c.zero(2 << 20, 3 << 20)
    c.trim(6 << 20, 2 << 20)
else:
    c.zero(5 << 20, 1 << 20, no_hole=True)
c.flush()
c.close()
PY
}
zeroes hole
ok "info after" info "$TMP/empty.vhd"
[ "$(field allocated)" = "$before" ] ||
    fail "zeroes allocated blocks: $before bytes before, $(field allocated) after"
note "ok: zeroes and trims of unallocated blocks allocate nothing"
zeroes no-hole
serve_stop
ok "info after NO_HOLE" info "$TMP/empty.vhd"
[ "$(field allocated)" = "$((before + (2 << 20)))" ] ||
    fail "NO_HOLE zeroes: $before bytes allocated before, $(field allocated) after (want one 2 MiB block more)"
ok "map after NO_HOLE" info --map "$TMP/empty.vhd"
grep -Eq "^ *5242880 +1048576 +0 +data" "$TMP/out" ||
    fail "NO_HOLE range not data in the map: $(cat "$TMP/out")"
readback "NO_HOLE zeroes" "$TMP/empty.vhd" "$TMP/empty.raw" qemu

# ---- A differencing child over its parent -----------------------------------
mkdir "$TMP/p" "$TMP/c"
gen make "$TMP/p/base.vhd" --type dynamic --size $size --block-size 1M \
    --garbage --data "block:1,5 sect:7-9,300,8500-8600 empty:3" \
    --expect "$TMP/p/base.raw"
gen make "$TMP/c/child.vhd" --type diff --parent "$TMP/p/base.vhd" \
    --block-size 512K --garbage --data "sect:9-12,5000 block:2" \
    --expect "$TMP/c/child.raw"
base_sum=$(sha "$TMP/p/base.vhd")
serve_start --unix "$sock" "vhd:$TMP/c/child.vhd"
# One aligned sector into an unallocated block of the child (block 20, at
# 6 MiB): only its bit is set; the rest still reads the parent.
py - "$LIB_DIR" "$sock" "$TMP/c/child.raw" <<'PY' || fail "one sector into the child"
import sys
sys.path.insert(0, sys.argv[1])
import nbdmini
c = nbdmini.Conn(sys.argv[2])
d = bytes(range(256)) * 2
c.write(6 << 20, d)
m = bytearray(open(sys.argv[3], "rb").read())
m[6 << 20:(6 << 20) + 512] = d
open(sys.argv[3], "wb").write(m)
c.close()
PY
ops "$sock" "$TMP/c/child.raw" 3 200
nbdcopy "$TMP/sparse.raw" "$(uri "$sock")" || fail "nbdcopy into the child"
cp "$TMP/sparse.raw" "$TMP/c/child.raw"
serve_stop
[ "$(sha "$TMP/p/base.vhd")" = "$base_sum" ] || fail "the parent changed"
note "ok: the parent is untouched"
readback "differencing child" "$TMP/c/child.vhd" "$TMP/c/child.raw"

gen make "$TMP/c/one.vhd" --type diff --parent "$TMP/p/base.vhd" \
    --block-size 512K --data "sect:9"
serve_start --unix "$sock" "vhd:$TMP/c/one.vhd"
py - "$LIB_DIR" "$sock" <<'PY' || fail "one sector into the child"
import sys
sys.path.insert(0, sys.argv[1])
import nbdmini
c = nbdmini.Conn(sys.argv[2])
c.write(6 << 20, b"\x5a" * 512)
c.write((6 << 20) + 4096 + 100, b"\xa5" * 10)  # a partial sector
c.flush()
c.close()
# A client that asked for the block sizes agreed to them (§Size
# constraints): a partial sector is refused with EINVAL, and nothing is
# written (the map below has no fourth sector); a whole one goes.
c = nbdmini.Conn(sys.argv[2], agree_sizes=True)
if c.min_block != 512:
    sys.exit("minimum block size %d, not 512" % c.min_block)
try:
    c.write((6 << 20) + 8192 + 100, b"\xa5" * 10)
    sys.exit("an unaligned WRITE from a client that agreed to 512 succeeded")
except nbdmini.NBDError as e:
    if e.errno != 22:
        sys.exit("unaligned WRITE: NBD error %d, not EINVAL" % e.errno)
c.write(6 << 20, b"\x5a" * 512)
c.close()
PY
serve_stop
gen map "$TMP/c/one.vhd" >"$TMP/one.map"
# The child's own data: sector 9 (as made), and the two sectors written.
printf '%s\n' "4608 512 0" "6291456 512 0" "6295552 512 0" >"$TMP/one.want"
awk '$3 == 0 { print $1, $2, $3 }' "$TMP/one.map" >"$TMP/one.got"
diff -u "$TMP/one.want" "$TMP/one.got" >&2 ||
    fail "the child holds more than the sectors written (map: $(cat "$TMP/one.map"))"
note "ok: a new block of the child holds only the sectors written"

# ---- A fixed VHD: raw bytes before the footer -------------------------------
gen make "$TMP/fixed.vhd" --type fixed --size $size --data "block:0"
serve_start --unix "$sock" "vhd:$TMP/fixed.vhd"
nbdcopy "$TMP/sparse.raw" "$(uri "$sock")" || fail "nbdcopy into a fixed VHD"
serve_stop
readback "fixed" "$TMP/fixed.vhd" "$TMP/sparse.raw" qemu
echo "PASS"
