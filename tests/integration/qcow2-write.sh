#!/bin/bash
# qcow2-write.sh: "copy --dst-format qcow2" (and a qcow2:PATH destination)
# to a file and to a pipe writes a version 3 qcow2 of 64 KiB clusters
# that "qemu-img check" finds clean, that "qemu-img compare" finds
# identical to the source, that nbdflow reads back identical, and whose
# allocated clusters (qemu-img map; nbdflow info, info --json, info --map)
# are exactly the 64 KiB clusters of the source holding a non-zero byte:
# holes and all-zero data stay unallocated. A size that is no multiple of
# 512 (written rounded up to a whole sector, as the VHD writer does, so
# that qemu reads every byte), generated sources, a VHD source, a
# flattened backing chain, and the round trip qcow2 -> VHD -> qcow2. A
# file cut short keeps the corrupt bit its header starts with.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
. "$(dirname "$0")/qcow2.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

K=1024 M=$((1 << 20))

# written WHAT QCOW2 RAW [PIPE]: QCOW2 (written by nbdflow) holds RAW's
# bytes (RAW's size a multiple of 512) as qemu-img and nbdflow read it,
# is clean, and allocates only RAW's clusters that hold data. With PIPE
# "pipe" (it was written to a pipe) the file holds nothing else: at most
# 1 MiB of header and tables besides its data clusters.
written () {
    local what=$1 img=$2 raw=$3 hdr size
    hdr=$(od -An -v -t x1 -j 0 -N 24 "$img" | tr -d ' \n')
    [ "${hdr:0:16}" = 514649fb00000003 ] ||
        fail "$what: the header does not start QFI\\xfb, version 3: $hdr"
    [ "${hdr:40:8}" = 00000010 ] ||
        fail "$what: cluster_bits ${hdr:40:8}, want 16 (64 KiB)"
    hdr=$(od -An -v -t x1 -j 72 -N 8 "$img" | tr -d ' \n')
    [ "$hdr" = 0000000000000000 ] ||
        fail "$what: incompatible features $hdr, want none"
    qemu-img check -f qcow2 "$img" >"$TMP/check.out" 2>&1 ||
        fail "$what: qemu-img check exits $?: $(cat "$TMP/check.out")"
    note "ok: $what: qemu-img check: $(head -n 1 "$TMP/check.out")"
    qemu-img compare -q -f raw -F qcow2 "$raw" "$img" ||
        fail "$what: qemu-img compare -f raw -F qcow2 says they differ"
    note "ok: $what: qemu-img compare: identical"
    WANT_ALLOC=$raw describes "$what" "$img" 3 65536
    reads "$what" "$img" "$raw" probed
    if [ "${4:-}" = pipe ]; then
        size=$(stat -c %s "$img")
        [ "$size" -le $((ALLOC + M)) ] ||
            fail "$what: $size bytes for $ALLOC bytes of data clusters"
    fi
}

# to_pipe WHAT FILE ARGS...: "nbdflow copy ARGS" with its stdout a pipe,
# the stream saved in FILE.
to_pipe () {
    local what=$1 file=$2 rc=0
    shift 2
    timeout 20 "$NBDFLOW" copy "$@" 2>"$TMP/err" | cat >"$file" || rc=$?
    [ "$rc" = 0 ] || fail "$what: exit $rc: $(cat "$TMP/err") (nbdflow copy $*)"
    note "ok: $what"
}

# 24 MiB: data in MiB 0, 5-6 and 20, three sectors in MiB 17, 4 KiB at
# an odd place in MiB 22; MiB 10-13 written with zeroes (data extents
# that hold nothing), and 64 KiB of zeroes written inside MiB 5.
make_sparse "$TMP/src.raw" 24 "0:1 5:2 20:1"
dd if=/dev/zero of="$TMP/src.raw" bs=1M seek=10 count=4 conv=notrunc status=none
dd if=/dev/zero of="$TMP/src.raw" bs=64k seek=$((5 * 16 + 3)) count=1 conv=notrunc \
    status=none
dd if=/dev/urandom of="$TMP/src.raw" bs=512 seek=34821 count=3 conv=notrunc \
    status=none
dd if=/dev/urandom of="$TMP/src.raw" bs=4k seek=$((22 * 256 + 17)) count=1 \
    conv=notrunc status=none

ok "raw -> qcow2 file" copy "$TMP/src.raw" "$TMP/out.qcow2" --dst-format qcow2
written "to a file" "$TMP/out.qcow2" "$TMP/src.raw"
# 16 + 31 + 16 clusters of the MiB, 1 for the sectors, 1 for the 4 KiB.
[ "$ALLOC" = $((65 * 64 * K)) ] ||
    fail "the source's data clusters: $ALLOC bytes, want $((65 * 64 * K))"
to_pipe "raw -> qcow2 on a pipe" "$TMP/pipe.qcow2" "$TMP/src.raw" - --dst-format qcow2
written "to a pipe" "$TMP/pipe.qcow2" "$TMP/src.raw" pipe
cmp "$TMP/pipe.qcow2" "$TMP/out.qcow2" >&2 ||
    note "(the pipe's stream and the file differ in their bytes; both checked)"
ok "raw -> qcow2:PATH" copy "$TMP/src.raw" "qcow2:$TMP/named.qcow2"
written "to qcow2:PATH" "$TMP/named.qcow2" "$TMP/src.raw"
OUT=$TMP/stdout.qcow2 ok "raw -> qcow2 on stdout, a file" copy "$TMP/src.raw" - --dst-format qcow2
written "to stdout, a file" "$TMP/stdout.qcow2" "$TMP/src.raw"

# ---- An odd size: 5 MiB + 1613 bytes, data in the last bytes -----------------
odd=$((5 * M + 1613))
truncate -s "$odd" "$TMP/odd.raw"
dd if=/dev/urandom of="$TMP/odd.raw" bs=512 seek=2048 count=8 conv=notrunc status=none
dd if=/dev/urandom of="$TMP/odd.raw" bs=1 seek=$((odd - 700)) count=700 conv=notrunc \
    status=none
cp "$TMP/odd.raw" "$TMP/odd.padded"
truncate -s $(((odd + 511) / 512 * 512)) "$TMP/odd.padded"
ok "odd size -> qcow2" copy "$TMP/odd.raw" "$TMP/odd.qcow2" --dst-format qcow2
written "odd size" "$TMP/odd.qcow2" "$TMP/odd.padded"
to_pipe "odd size -> qcow2 on a pipe" "$TMP/oddpipe.qcow2" "$TMP/odd.raw" - --dst-format qcow2
written "odd size to a pipe" "$TMP/oddpipe.qcow2" "$TMP/odd.padded" pipe

# ---- Generated sources -------------------------------------------------------
for gensrc in pattern:6M sparse:16M:4M:64K; do
    f=$TMP/${gensrc//:/-}
    ok "$gensrc -> raw" copy "$gensrc" "$f.raw"
    ok "$gensrc -> qcow2" copy "$gensrc" "$f.qcow2" --dst-format qcow2
    written "$gensrc" "$f.qcow2" "$f.raw"
    to_pipe "$gensrc -> qcow2 on a pipe" "$f.pipe.qcow2" "$gensrc" - --dst-format qcow2
    written "$gensrc to a pipe" "$f.pipe.qcow2" "$f.raw" pipe
done

# ---- Other formats in, qcow2 out; qcow2 in, VHD out ---------------------------
qemu-img convert -f raw -O vpc -o subformat=dynamic,force_size=on "$TMP/src.raw" \
    "$TMP/src.vhd"
ok "vhd -> qcow2" copy "$TMP/src.vhd" "$TMP/fromvhd.qcow2" --dst-format qcow2
written "vhd -> qcow2" "$TMP/fromvhd.qcow2" "$TMP/src.raw"
ok "qcow2 -> vhd" copy "$TMP/out.qcow2" "$TMP/round.vhd" --dst-format vhd
qemu-img compare -q -f raw -F vpc "$TMP/src.raw" "$TMP/round.vhd" ||
    fail "qcow2 -> vhd: qemu-img compare -f raw -F vpc says they differ"
ok "vhd -> raw" copy "$TMP/round.vhd" "$TMP/round.raw"
same_bytes "qcow2 -> vhd -> raw" "$TMP/round.raw" "$TMP/src.raw"
ok "vhd -> qcow2 again" copy "$TMP/round.vhd" "$TMP/round.qcow2" --dst-format qcow2
written "qcow2 -> vhd -> qcow2" "$TMP/round.qcow2" "$TMP/src.raw"
ok "qcow2 -> qcow2" copy "$TMP/round.qcow2" "$TMP/again.qcow2" --dst-format qcow2
written "qcow2 -> qcow2" "$TMP/again.qcow2" "$TMP/src.raw"

# A qemu-made chain (compressed and zero clusters over a backing file),
# flattened into one qcow2.
mkdir "$TMP/ch"
qemu-img convert -f raw -O qcow2 -c "$TMP/src.raw" "$TMP/ch/base.qcow2"
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$TMP/ch/top.qcow2" 24M
qio "$TMP/ch/top.qcow2" "write -P 0x61 $((M / 2)) $((M))" "write -z $((5 * M)) $((M))" \
    "write -c -P 0x62 $((8 * M)) $((64 * K))" "write -z -u $((20 * M)) $((64 * K))"
qref "$TMP/ch/top.qcow2" "$TMP/ch/top.raw"
ok "chain -> qcow2" copy --src-format qcow2 "$TMP/ch/top.qcow2" "$TMP/flat.qcow2" \
    --dst-format qcow2
written "flattened chain" "$TMP/flat.qcow2" "$TMP/ch/top.raw"
# Cut short (the file size limit stops it at 8 MiB of 24): the header
# keeps the corrupt bit it was written with, so that qemu will not open
# the image read-write and nbdflow says why the image is short.
make_random "$TMP/dense.raw" 24
rc=0
(ulimit -f 8192; exec "$NBDFLOW" copy "$TMP/dense.raw" "$TMP/cut.qcow2" \
    --dst-format qcow2) 2>"$TMP/err" || rc=$?
[ "$rc" != 0 ] || fail "a copy cut at 8 MiB exited 0"
hdr=$(od -An -v -t x1 -j 72 -N 8 "$TMP/cut.qcow2" | tr -d ' \n')
[ "$hdr" = 0000000000000002 ] ||
    fail "cut short: incompatible features $hdr, want the corrupt bit"
if qemu-io -f qcow2 -c "write 0 4k" "$TMP/cut.qcow2" >"$TMP/qio" 2>&1; then
    fail "qemu-io opened the cut image read-write"
fi
grep -q "corrupt" "$TMP/qio" || fail "qemu-io: $(cat "$TMP/qio")"
ok "cut short: info" info "$TMP/cut.qcow2"
grep -q "disk-type: version 3, marked corrupt" "$TMP/out" ||
    fail "info of the cut image: $(cat "$TMP/out")"
# Reading it: a warning when it opens (on a device, nothing else would
# say so), then one error where the data ends.
run copy "$TMP/cut.qcow2" "$TMP/cut.raw"
[ "$RC" != 0 ] && [ "$RC" -lt 128 ] || fail "cut short: copy out: exit $RC"
[ "$(grep -c . "$TMP/err")" = 2 ] &&
    head -n 1 "$TMP/err" | grep -q "warning: .*marked corrupt" &&
    tail -n 1 "$TMP/err" | grep -q "error: .*past the end of the .*marked corrupt: its writer may have been" ||
    fail "cut short: copy out: $(cat "$TMP/err")"
note "ok: cut short: copy out: $(cat "$TMP/err")"
echo "PASS"
