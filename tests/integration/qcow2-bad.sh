#!/bin/bash
# qcow2-bad.sh: one damaged or unsupported qcow2 image per class, each
# refused by copy and sum (and, where the header or L1 table shows it, by
# info) within 20 s, with a status below 128, without a large allocation
# (max RSS under 64 MiB above a good image's) and with exactly one line on
# stderr that names the file and says what is wrong: a file cut in its
# data and in its header, an L1 or L2 entry past the end of the file, an
# L2 table or data cluster offset not aligned to a cluster, a damaged
# compressed cluster, an unknown incompatible feature bit, encryption (AES
# and LUKS), an external data file, a missing backing file, backing loops
# (an image its own backing file, A -> B -> A) and huge header fields
# (l1_size, cluster_bits, backing name length, header_length, size).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need /usr/bin/time time
tmpdir_make
. "$(dirname "$0")/qcow2.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

# run ARGS...: as qcow2.inc's, but measures the max RSS (KiB) in $RSS.
run () {
    RC=0
    timeout -k 5 20 /usr/bin/time -f '%M' -o "$TMP/rss" "$NBDFLOW" "$@" \
        >"$TMP/out" 2>"$TMP/err" || RC=$?
    local l=(0)
    [ ! -s "$TMP/rss" ] || mapfile -t l <"$TMP/rss"
    RSS=${l[-1]}
}

K=1024
make_random "$TMP/src.raw" 4
qemu-img convert -f raw -O qcow2 "$TMP/src.raw" "$TMP/good.qcow2"
ok "good image: copy" copy --src-format qcow2 "$TMP/good.qcow2" "$TMP/good.out"
same_bytes "good image" "$TMP/good.out" "$TMP/src.raw"
base_rss=$RSS
ok "good image: info" info -f qcow2 "$TMP/good.qcow2"
[ "$RSS" -le "$base_rss" ] || base_rss=$RSS
limit=$((base_rss + 64 * K))
note "a good image's max RSS: $base_rss KiB; the limit: $limit KiB"

# small WHAT: the last run stayed under the RSS limit.
small () {
    if [ "$RSS" -le 0 ] || [ "$RSS" -gt "$limit" ]; then
        fail "$1: max RSS $RSS KiB, over the limit of $limit KiB (nbdflow allocated what the header asked?)"
    fi
}

# bad_at WHAT FILE REGEX OPEN [NAME...]: copy --src-format qcow2 and sum
# of qcow2:FILE are refused, one line matching REGEX, naming FILE (or one
# of NAMEs). With OPEN "open" (the damage is in the header or the L1
# table, seen at open) info -f qcow2 is refused too; else info --map may
# succeed but must neither crash nor hang.
bad_at () {
    local what=$1 file=$2 re=$3 open=$4
    shift 4
    [ $# -gt 0 ] || set -- "$file"
    refused "$what: copy" copy --src-format qcow2 "$file" "$TMP/bad.out"
    small "$what: copy"
    err_names "$@"
    err_says "$re"
    refused "$what: sum" sum "qcow2:$file"
    small "$what: sum"
    err_names "$@"
    err_says "$re"
    if [ "$open" = open ]; then
        refused "$what: info" info -f qcow2 "$file"
        small "$what: info"
        err_names "$@"
        err_says "$re"
    else
        run info --map -f qcow2 "$file"
        [ "$RC" -lt 124 ] ||
            fail "$what: info --map: exit status $RC: $(head -c 800 "$TMP/err")"
        small "$what: info --map"
    fi
}

# ---- Cut short ---------------------------------------------------------------
size=$(stat -c %s "$TMP/good.qcow2")
head -c $((size / 2 + 1000)) "$TMP/good.qcow2" >"$TMP/cut-data.qcow2"
bad_at "cut in the data" "$TMP/cut-data.qcow2" 'truncated|past the end|beyond|end of' data
head -c 50 "$TMP/good.qcow2" >"$TMP/cut-header.qcow2"
bad_at "cut in the header" "$TMP/cut-header.qcow2" 'truncated|short|past the end|end of|only [0-9]+' open

# ---- Tables pointing outside the file or between clusters --------------------
l1=$(qpatch "$TMP/good.qcow2" get-l1 0)
l2=$(qpatch "$TMP/good.qcow2" get-l2 0 3)
if [ $((l1 & 0xffff)) != 0 ] || [ $((l2 & 0xffff)) != 0 ]; then
    fail "good.qcow2: odd L1/L2 entries $l1 $l2"
fi
cp "$TMP/good.qcow2" "$TMP/l1-out.qcow2"
qpatch "$TMP/l1-out.qcow2" l1 0 $((1 << 63 | 1 << 40))
bad_at "L1 entry past the end" "$TMP/l1-out.qcow2" 'past the end|beyond|outside' open
cp "$TMP/good.qcow2" "$TMP/l2-out.qcow2"
qpatch "$TMP/l2-out.qcow2" l2 0 3 $((1 << 63 | 1 << 40))
bad_at "L2 entry past the end" "$TMP/l2-out.qcow2" 'past the end|beyond|outside' data
cp "$TMP/good.qcow2" "$TMP/l1-odd.qcow2"
qpatch "$TMP/l1-odd.qcow2" l1 0 $((l1 + 512))
bad_at "unaligned L2 table" "$TMP/l1-odd.qcow2" 'multiple|align' open
cp "$TMP/good.qcow2" "$TMP/l2-odd.qcow2"
qpatch "$TMP/l2-odd.qcow2" l2 0 3 $((l2 + 512))
bad_at "unaligned data cluster" "$TMP/l2-odd.qcow2" 'multiple|align' data

# A copy to stdout meets the damage as a copy to a file does.
refused "L2 entry past the end: copy to stdout" copy "qcow2:$TMP/l2-out.qcow2" -
err_names "$TMP/l2-out.qcow2"
err_says 'past the end|beyond|outside'

# A compressed cluster whose deflate stream is garbage.
py - "$TMP/src.raw" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.write(b"compressible " * 10000)
PY
qemu-img convert -f raw -O qcow2 -c "$TMP/src.raw" "$TMP/comp.qcow2"
c0=$(qpatch "$TMP/comp.qcow2" get-l2 0 0)
[ $((c0 >> 62 & 1)) = 1 ] || fail "comp.qcow2: cluster 0 is not compressed"
py - "$TMP/comp.qcow2" $((c0 & ((1 << 54) - 1))) <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    f.write(b"\xff" * 64)
PY
bad_at "damaged compressed cluster" "$TMP/comp.qcow2" 'compress|deflate|inflate' data

# ---- Features refused by name ------------------------------------------------
cp "$TMP/good.qcow2" "$TMP/incompat.qcow2"
qpatch "$TMP/incompat.qcow2" or64 72 32
bad_at "incompatible feature bit 5" "$TMP/incompat.qcow2" 'incompatible' open
qemu-img create -q -f qcow2 --object secret,id=sec0,data=x \
    -o encrypt.format=luks,encrypt.key-secret=sec0 "$TMP/luks.qcow2" 4M ||
    luks_failed=1
# qemu-img times its key derivation with getrusage and gives up on a busy
# or coarse clock ("Unable to get accurate CPU usage"); the header then
# says LUKS (method 2) by a patch instead, which is what the reader sees.
if [ "${luks_failed:-0}" = 1 ]; then
    note "qemu-img could not make a LUKS image here: method 2 is patched in"
    cp "$TMP/good.qcow2" "$TMP/luks.qcow2"
    qpatch "$TMP/luks.qcow2" be32 32 2
fi
bad_at "LUKS encryption" "$TMP/luks.qcow2" 'encrypt' open
cp "$TMP/good.qcow2" "$TMP/aes.qcow2"
qpatch "$TMP/aes.qcow2" be32 32 1
bad_at "AES encryption" "$TMP/aes.qcow2" 'encrypt' open
qemu-img create -q -f qcow2 -o data_file="$TMP/data.raw" "$TMP/datafile.qcow2" 4M ||
    fail "qemu-img cannot make a qcow2 with a data file"
bad_at "external data file" "$TMP/datafile.qcow2" 'external data file' open

# ---- Backing files: missing, loops -------------------------------------------
mkdir "$TMP/p"
qemu-img create -q -f qcow2 "$TMP/p/base.qcow2" 4M
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$TMP/p/orphan.qcow2" 4M
rm "$TMP/p/base.qcow2"
bad_at "missing backing file" "$TMP/p/orphan.qcow2" 'backing' open "$TMP/p/base.qcow2"
err_says 'no such file|not found|missing|cannot open|looked for'
qemu-img create -q -f qcow2 "$TMP/p/base.qcow2" 4M
cp "$TMP/p/base.qcow2" "$TMP/p/self.qcow2"
qemu-img rebase -u -b self.qcow2 -F qcow2 "$TMP/p/self.qcow2"
bad_at "its own backing file" "$TMP/p/self.qcow2" 'loop' open
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$TMP/p/A.qcow2"
qemu-img create -q -f qcow2 -b A.qcow2 -F qcow2 "$TMP/p/B.qcow2"
qemu-img rebase -u -b B.qcow2 -F qcow2 "$TMP/p/A.qcow2"
bad_at "A -> B -> A" "$TMP/p/B.qcow2" 'loop' open A.qcow2 B.qcow2
# The same loop, the backing formats unnamed: A's format is probed, and a
# probed image never opens its backing file, so the loop is never reached.
qpatch "$TMP/p/A.qcow2" drop-backing-format
qpatch "$TMP/p/B.qcow2" drop-backing-format
bad_at "A -> B -> A, probed backing files" "$TMP/p/B.qcow2" 'loop|probed' open A.qcow2 B.qcow2

# ---- Huge header fields: refused before anything that size is allocated ----
# hdr NAME OP OFF VALUE REGEX [FILE]: good.qcow2 (or FILE) patched.
hdr () {
    cp "${6:-$TMP/good.qcow2}" "$TMP/$1.qcow2"
    qpatch "$TMP/$1.qcow2" "$2" "$3" "$4"
    bad_at "$1" "$TMP/$1.qcow2" "$5" open
}
hdr "l1_size 0xFFFFFFFF" be32 36 0xFFFFFFFF 'L1'
hdr "l1_size 0x400000" be32 36 0x400000 'L1'
hdr "cluster_bits 30" be32 20 30 'cluster'
hdr "cluster_bits 8" be32 20 8 'cluster'
hdr "header_length 0xFFFFFFFF" be32 100 0xFFFFFFFF 'header'
hdr "header_length 0xFFFFFFF8" be32 100 0xFFFFFFF8 'header'
hdr "size 2^62" be64 24 $((1 << 62)) 'L1|size'
hdr "backing name length 0xFFFFFFFF" be32 16 0xFFFFFFFF 'backing' "$TMP/p/A.qcow2"
hdr "backing name offset 2^40" be64 8 $((1 << 40)) 'backing' "$TMP/p/A.qcow2"
echo "PASS"
