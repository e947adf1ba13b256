#!/bin/bash
# vhd-write.sh: "copy --dst-format vhd" to a file and to a pipe writes a
# VHD that qemu-img reads as vpc with the source's size and bytes, that
# nbdflow and the test's own reader model (vhdgen.py) read back identical,
# and that allocates only the 2 MiB blocks holding data (holes and all-zero
# data stay unallocated); sizes no multiple of the block size, generated
# sources and a flattened differencing chain too. A source over 2040 GiB
# is refused, naming the limit, before anything is written.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need qemu-img qemu-utils
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

# data_blocks RAW: bytes of the 2 MiB blocks of RAW holding a non-zero byte.
data_blocks () {
    py - "$1" <<'PY'
import sys
bs, n = 2 << 20, 0
with open(sys.argv[1], "rb") as f:
    while True:
        b = f.read(bs)
        if not b:
            break
        n += bs if b.count(0) != len(b) else 0
print(n)
PY
}

# written WHAT VHD RAW: VHD (written by nbdflow) holds RAW's bytes, as
# qemu-img, nbdflow and the reader model see it, and allocates only the
# blocks of RAW that hold data.
written () {
    local what=$1 vhd=$2 raw=$3 size alloc
    size=$(stat -c %s "$raw")
    alloc=$(data_blocks "$raw")
    qemu-img info --output=json "$vhd" >"$TMP/qinfo.json" ||
        fail "$what: qemu-img info refuses it"
    py - "$TMP/qinfo.json" "$size" <<'PY' || fail "$what: qemu-img info: $(cat "$TMP/qinfo.json")"
import json, sys
i = json.load(open(sys.argv[1]))
assert i["format"] == "vpc", i["format"]
assert i["virtual-size"] == int(sys.argv[2]), i["virtual-size"]
PY
    qemu-img compare -q -f raw -F vpc "$raw" "$vhd" ||
        fail "$what: qemu-img compare -f raw -F vpc says they differ"
    note "ok: $what: qemu-img reads vpc, $size bytes, identical"
    gen read "$vhd" "$TMP/model.raw"
    same "$TMP/model.raw" "$raw"
    [ "$(model_info "$vhd" allocated)" = "$alloc" ] ||
        fail "$what: the file allocates $(model_info "$vhd" allocated) bytes of blocks, want $alloc"
    ok "$what: read back" copy "$vhd" "$TMP/back.raw"
    same "$TMP/back.raw" "$raw"
    ok "$what: info --json" info --json "$vhd"
    check_json "$what" dynamic "$size" 2097152 "$alloc" 0
}

# 24 MiB: data in MiB 0, 5-6, 20 and three sectors in MiB 17; MiB 10-13
# written with zeroes (data extents that hold nothing).
make_sparse "$TMP/src.raw" 24 "0:1 5:2 20:1"
dd if=/dev/zero of="$TMP/src.raw" bs=1M seek=10 count=4 conv=notrunc status=none
dd if=/dev/urandom of="$TMP/src.raw" bs=512 seek=34821 count=3 conv=notrunc \
    status=none
[ "$(data_blocks "$TMP/src.raw")" = $((10 << 20)) ] || fail "source layout"

ok "file -> vhd file" copy "$TMP/src.raw" "$TMP/out.vhd" --dst-format vhd
written "to a file" "$TMP/out.vhd" "$TMP/src.raw"

rc=0
timeout 20 "$NBDFLOW" copy "$TMP/src.raw" - --dst-format vhd 2>"$TMP/err" |
    cat >"$TMP/pipe.vhd" || rc=$?
[ "$rc" = 0 ] || fail "file -> vhd on a pipe: $(cat "$TMP/err")"
written "to a pipe" "$TMP/pipe.vhd" "$TMP/src.raw"
ok "to stdout, a file" copy "$TMP/src.raw" - --dst-format vhd
mv "$TMP/out" "$TMP/stdout.vhd"
written "to stdout as a file" "$TMP/stdout.vhd" "$TMP/src.raw"

# 5 MiB + 3 sectors: the last block is partial and holds data at its end.
truncate -s 5243392 "$TMP/odd.raw"
dd if=/dev/urandom of="$TMP/odd.raw" bs=512 seek=2048 count=8 conv=notrunc status=none
dd if=/dev/urandom of="$TMP/odd.raw" bs=512 seek=10239 count=3 conv=notrunc status=none
ok "odd size" copy "$TMP/odd.raw" "$TMP/odd.vhd" --dst-format vhd
written "odd size" "$TMP/odd.vhd" "$TMP/odd.raw"
rc=0
timeout 20 "$NBDFLOW" copy "$TMP/odd.raw" - --dst-format vhd 2>"$TMP/err" |
    cat >"$TMP/oddpipe.vhd" || rc=$?
[ "$rc" = 0 ] || fail "odd size to a pipe: $(cat "$TMP/err")"
written "odd size to a pipe" "$TMP/oddpipe.vhd" "$TMP/odd.raw"

# Generated sources.
for gensrc in pattern:6M random:4M:7 sparse:16M:4M:64K; do
    f=$TMP/${gensrc//:/-}
    ok "$gensrc -> raw" copy "$gensrc" "$f.raw"
    ok "$gensrc -> vhd" copy "$gensrc" "$f.vhd" --dst-format vhd
    written "$gensrc" "$f.vhd" "$f.raw"
done

# A differencing chain, flattened into one dynamic VHD.
mkdir "$TMP/ch"
gen make "$TMP/ch/base.vhd" --type dynamic --size 10M --block-size 512K \
    --garbage --data "block:0,9 sect:3000-3100 empty:15"
gen make "$TMP/ch/kid.vhd" --type diff --parent "$TMP/ch/base.vhd" \
    --block-size 4K --garbage --data "sect:0-3,3050,19000 block:2000" \
    --expect "$TMP/ch/kid.raw"
ok "chain -> vhd" copy --src-format vhd "$TMP/ch/kid.vhd" "$TMP/flat.vhd" \
    --dst-format vhd
written "flattened chain" "$TMP/flat.vhd" "$TMP/ch/kid.raw"
ok "vhd -> vhd" copy "$TMP/flat.vhd" "$TMP/flat2.vhd" --dst-format vhd
written "vhd -> vhd" "$TMP/flat2.vhd" "$TMP/ch/kid.raw"

# Beyond 2040 GiB: refused before a byte is written.
for big in 3T 2041G; do
    refused "zero:$big -> vhd file" copy "zero:$big" "$TMP/big.vhd" --dst-format vhd
    err_says '2040 ?GiB'
    [ ! -s "$TMP/big.vhd" ] || fail "zero:$big: $(stat -c %s "$TMP/big.vhd") bytes written"
    rm -f "$TMP/big.vhd"
    refused "zero:$big -> vhd on stdout" copy "zero:$big" - --dst-format vhd
    err_says '2040 ?GiB'
    [ ! -s "$TMP/out" ] || fail "zero:$big: $(stat -c %s "$TMP/out") bytes written to stdout"
done
echo "PASS"
