#!/bin/bash
# qcow2-qemu.sh: qcow2 images qemu-img and qemu-io make, read through
# nbdflow exactly as qemu-img reads them: version 2 and 3, clusters of
# 512 B, 64 KiB and 2 MiB, deflate and zstd compressed clusters, zero
# clusters (kept allocated and unmapped), extended L2 with sub-cluster
# writes and zeroes, dirty images (lazy refcounts and qemu-io aborted; the
# bit patched in), and backing chains: a qcow2 and a raw backing file with
# and without the backing format, shorter backing files, depth-3 chains of
# relative names where each level overrides part of the one below. For
# each: copy (file, pipe), sum --algo sha256 (the sha256sum of qemu-img
# convert -O raw), info and info --json (version, cluster size,
# allocated, parents) and info --map (data exactly where qemu-img map
# says data); a probed image with a backing file is refused naming it.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
. "$(dirname "$0")/qcow2.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

K=1024 M=$((1 << 20))

# image WHAT IMG VERSION CLUSTER [PARENT...]: nbdflow reads and describes
# IMG as qemu-img does; with PARENTs (its backing files, nearest first) the
# format is named, and the probed image is refused.
image () {
    local what=$1 img=$2 ver=$3 cs=$4
    shift 4
    qref "$img" "$TMP/ref.raw"
    if [ $# -gt 0 ]; then
        reads "$what" "$img" "$TMP/ref.raw" named
    else
        reads "$what" "$img" "$TMP/ref.raw" probed
    fi
    describes "$what" "$img" "$ver" "$cs" "$@"
}

# 8 MiB: random data (MiB 0, 5-6), compressible text (MiB 1), a hole
# (MiB 2-3) but for 4 KiB of random data at an odd place, zeroes written
# as data (MiB 4) and three random sectors at the very end.
make_sparse "$TMP/src.raw" 8 "0:1 5:2"
py - "$TMP/src.raw" <<'PY'
import sys
text = b"".join(b"nbdflow reads qcow2, line %08d\n" % i for i in range(40000))
with open(sys.argv[1], "r+b") as f:
    f.seek(1 << 20)
    f.write(text[:1 << 20])
PY
dd if=/dev/urandom of="$TMP/src.raw" bs=4k seek=$((3 * 256 + 3)) count=1 \
    conv=notrunc status=none
dd if=/dev/zero of="$TMP/src.raw" bs=1M seek=4 count=1 conv=notrunc status=none
dd if=/dev/urandom of="$TMP/src.raw" bs=512 seek=$((8 * 2048 - 3)) count=3 \
    conv=notrunc status=none

# ---- Single images -----------------------------------------------------------
qemu-img create -q -f qcow2 "$TMP/empty.qcow2" 8M
image "empty" "$TMP/empty.qcow2" 3 65536
all_zero "$TMP/r.out" $((8 * M))

# converted NAME VERSION CLUSTER OPTIONS...: src.raw converted by
# qemu-img with OPTIONS, read and described by nbdflow as qemu-img does.
converted () {
    local name=$1 ver=$2 cs=$3 img=$TMP/$1.qcow2
    shift 3
    qemu-img convert -f raw -O qcow2 "$@" "$TMP/src.raw" "$img" ||
        fail "$name: qemu-img convert -O qcow2 $*"
    image "$name" "$img" "$ver" "$cs"
}
converted v3-64k 3 65536 -o compat=1.1
# qemu reads src.raw back; so does auto, and sum of qcow2:PATH agrees.
same_bytes "v3-64k: qemu's reading" "$TMP/ref.raw" "$TMP/src.raw"
ok "v3-64k: copy --src-format auto" copy --src-format auto "$TMP/v3-64k.qcow2" "$TMP/r.out"
same_bytes "v3-64k: auto" "$TMP/r.out" "$TMP/src.raw"
ok "v3-64k: sum qcow2:PATH" sum --algo sha256 "qcow2:$TMP/v3-64k.qcow2"
sha256 "$TMP/src.raw"
[ "$(cat "$TMP/out")" = "$SHA  qcow2:$TMP/v3-64k.qcow2" ] ||
    fail "v3-64k: sum qcow2:PATH prints '$(cat "$TMP/out")', want $SHA  qcow2:PATH"
converted v2-512 2 512 -o compat=0.10,cluster_size=512
converted v3-2m 3 2097152 -o cluster_size=2M
converted deflate-v2 2 65536 -c -o compat=0.10
converted deflate-512 3 512 -c -o cluster_size=512
converted zstd-2m 3 2097152 -c -o compression_type=zstd,cluster_size=2M
converted extl2-zstd 3 65536 -c -o extended_l2=on,compression_type=zstd

# ---- Zero clusters -----------------------------------------------------------
# On allocated data: "write -z" keeps the cluster allocated with the zero
# flag, "-u" unmaps it; on a hole it marks zero clusters; within a cluster
# it writes zeroes. Version 2 has no zero flag: qemu deallocates there.
for ver in 3 2; do
    compat=1.1
    [ "$ver" = 3 ] || compat=0.10
    img=$TMP/zero-v$ver.qcow2
    qemu-img convert -f raw -O qcow2 -o compat=$compat "$TMP/src.raw" "$img"
    qio "$img" "write -z 0 $((128 * K))" "write -z -u $((5 * M)) $((256 * K))" \
        "write -z $((2 * M)) $((512 * K))" "write -z $((6 * M + 4 * K)) $((4 * K))" \
        "write -z -u $((6 * M + 512 * K)) $((1536 * K))" \
        "write -z $((M + 64 * K)) $((64 * K))" "write -c -P 0x5a $((7 * M)) $((64 * K))"
    image "zero clusters v$ver" "$img" "$ver" 65536
done
# zstd compressed clusters written into an image by qemu-io.
qemu-img create -q -f qcow2 -o compression_type=zstd,cluster_size=32k "$TMP/zc.qcow2" 4M
qio "$TMP/zc.qcow2" "write -c -P 0x11 0 $((64 * K))" "write -c -P 0x22 $((M)) $((32 * K))" \
    "write -P 0x33 $((2 * M)) $((32 * K))" "write -z $((3 * M)) $((32 * K))"
image "qemu-io compressed zstd" "$TMP/zc.qcow2" 3 32768

# ---- Dirty images: read anyway ---------------------------------------------
qemu-img create -q -f qcow2 -o lazy_refcounts=on "$TMP/dirty.qcow2" 4M
rc=0
qemu-io -f qcow2 -c "write -P 0x71 $((64 * K)) $((192 * K))" -c "write -z 0 $((64 * K))" \
    -c abort "$TMP/dirty.qcow2" >"$TMP/qio.out" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "qemu-io abort did not abort"
[ $(($(qpatch "$TMP/dirty.qcow2" get64 72) & 1)) = 1 ] ||
    fail "qemu-io killed mid-write left no dirty bit (lazy refcounts)"
image "dirty (qemu-io aborted)" "$TMP/dirty.qcow2" 3 65536
cp "$TMP/v3-64k.qcow2" "$TMP/dirty2.qcow2"
qpatch "$TMP/dirty2.qcow2" or64 72 1
reads "dirty (bit patched)" "$TMP/dirty2.qcow2" "$TMP/src.raw" probed

# ---- A qcow2 backing file ----------------------------------------------------
# base.qcow2 holds src.raw; top.qcow2 (12 MiB, the backing name absolute)
# overrides part of it, zeroes some of its data, and has data past its end.
mkdir "$TMP/q"
qemu-img convert -f raw -O qcow2 "$TMP/src.raw" "$TMP/q/base.qcow2"
qemu-img create -q -f qcow2 -b "$TMP/q/base.qcow2" -F qcow2 "$TMP/q/top.qcow2" 12M
qio "$TMP/q/top.qcow2" "write -P 0x51 $((512 * K)) $((M))" \
    "write -z $((5 * M)) $((64 * K))" "write -z -u $((5 * M + 128 * K)) $((64 * K))" \
    "write -c -P 0x52 $((3 * M)) $((64 * K))" "write -P 0x53 $((10 * M)) $((4 * K))" \
    "write -P 0x54 $((100 * K)) $((1 * K))" "write -z $((8 * M - 64 * K)) $((128 * K))"
image "qcow2 backing" "$TMP/q/top.qcow2" 3 65536 "$TMP/q/base.qcow2"
probed_refused "qcow2 backing" "$TMP/q/top.qcow2" "$TMP/q/base.qcow2"
# The backing format extension gone: the backing file is probed (qcow2).
cp "$TMP/q/top.qcow2" "$TMP/q/nofmt.qcow2"
qpatch "$TMP/q/nofmt.qcow2" drop-backing-format
image "qcow2 backing, no backing format" "$TMP/q/nofmt.qcow2" 3 65536 "$TMP/q/base.qcow2"

# A qcow2 backing file of 3 MiB under an 8 MiB image (a relative name).
qemu-img create -q -f qcow2 -o cluster_size=4k "$TMP/q/short.qcow2" 3M
qio "$TMP/q/short.qcow2" "write -P 0x55 0 $((3 * M))"
qemu-img create -q -f qcow2 -b short.qcow2 -F qcow2 "$TMP/q/over.qcow2" 8M
qio "$TMP/q/over.qcow2" "write -P 0x56 $((2 * M + 32 * K)) $((2 * M))"
image "shorter qcow2 backing" "$TMP/q/over.qcow2" 3 65536 "$TMP/q/short.qcow2"

# ---- A raw backing file ------------------------------------------------------
mkdir "$TMP/r"
cp --sparse=always "$TMP/src.raw" "$TMP/r/base.raw"
qemu-img create -q -f qcow2 -b base.raw -F raw "$TMP/r/top.qcow2" 8M
qio "$TMP/r/top.qcow2" "write -P 0x61 $((512 * K)) $((M))" \
    "write -z $((5 * M)) $((64 * K))" "write -z -u $((6 * M)) $((256 * K))" \
    "write -P 0x62 $((2 * M + 1 * K)) $((1 * K))" "write -c -P 0x63 $((7 * M)) $((64 * K))"
image "raw backing" "$TMP/r/top.qcow2" 3 65536 "$TMP/r/base.raw"
refused "raw backing: probed copy" copy "$TMP/r/top.qcow2" "$TMP/r.out"
err_names base.raw
err_says 'src-format qcow2|-f qcow2|qcow2:' 
cp "$TMP/r/top.qcow2" "$TMP/r/nofmt.qcow2"
qpatch "$TMP/r/nofmt.qcow2" drop-backing-format
image "raw backing, no backing format" "$TMP/r/nofmt.qcow2" 3 65536 "$TMP/r/base.raw"
refused "raw backing, no backing format: probed copy" copy "$TMP/r/nofmt.qcow2" "$TMP/r.out"
err_names base.raw
# A raw backing file of an odd size (3 MiB + 1000 bytes): zeroes after it.
head -c $((3 * M + 1000)) /dev/urandom >"$TMP/r/odd.raw"
qemu-img create -q -f qcow2 -b odd.raw -F raw "$TMP/r/overodd.qcow2" 6M
qio "$TMP/r/overodd.qcow2" "write -P 0x64 $((4 * M)) $((64 * K))"
image "odd-sized raw backing" "$TMP/r/overodd.qcow2" 3 65536 "$TMP/r/odd.raw"

# ---- Extended L2: sub-clusters (2 KiB of a 64 KiB cluster) -------------------
# Over a backing file: unallocated sub-clusters of an allocated cluster
# read from the backing file; zero sub-clusters (of an allocated cluster
# or of one without a host cluster) read as zeroes, hiding its data.
qemu-img create -q -f qcow2 -o extended_l2=on -b "$TMP/q/base.qcow2" -F qcow2 \
    "$TMP/q/sub.qcow2" 8M
qio "$TMP/q/sub.qcow2" "write -P 0x47 $((4 * K)) $((4 * K))" \
    "write -z $((5 * M + 8 * K)) $((4 * K))" \
    "write -P 0x48 $((5 * M + 128 * K)) $((2 * K))" "write -z $((5 * M + 130 * K)) $((2 * K))" \
    "write -z $((6 * M)) $((64 * K))"
image "extended L2 over a backing file" "$TMP/q/sub.qcow2" 3 65536 "$TMP/q/base.qcow2"
# Alone: data, zeroes kept allocated and unmapped, in parts of clusters
# and in whole ones, a compressed cluster, the last sub-cluster.
qemu-img create -q -f qcow2 -o extended_l2=on "$TMP/sub.qcow2" 8M
qio "$TMP/sub.qcow2" "write -P 0x41 $((4 * K)) $((4 * K))" \
    "write -P 0x42 $((70 * K)) $((2 * K))" \
    "write -P 0x43 $((128 * K)) $((64 * K))" "write -z $((132 * K)) $((4 * K))" \
    "write -z -u $((160 * K)) $((2 * K))" \
    "write -P 0x44 $((M)) $((M))" "write -z $((M + 64 * K)) $((64 * K))" \
    "write -z -u $((M + 512 * K)) $((32 * K))" \
    "write -z $((3 * M + 6 * K)) $((2 * K))" \
    "write -c -P 0x45 $((4 * M)) $((64 * K))" \
    "write -P 0x46 $((8 * M - 2 * K)) $((2 * K))"
image "extended L2 sub-clusters" "$TMP/sub.qcow2" 3 65536

# ---- Depth-3 chains, relative names, each level over part of the one below --
# a/base.qcow2 (v3, 512 B clusters) <- b/mid.qcow2 (v2, 2 MiB clusters)
# <- c/top.qcow2 (v3, extended L2, 4 KiB writes); read from another
# directory than the images'.
mkdir "$TMP/a" "$TMP/b" "$TMP/c"
qemu-img convert -f raw -O qcow2 -o cluster_size=512 "$TMP/src.raw" "$TMP/a/base.qcow2"
qemu-img create -q -f qcow2 -o compat=0.10,cluster_size=2M -b ../a/base.qcow2 -F qcow2 \
    "$TMP/b/mid.qcow2" 8M
qio "$TMP/b/mid.qcow2" "write -P 0x71 $((M + 512 * K)) $((512 * K))" \
    "write -z $((6 * M)) $((2 * M))" "write -P 0x72 $((3 * M)) $((4 * K))"
qemu-img create -q -f qcow2 -o extended_l2=on -b ../b/mid.qcow2 -F qcow2 \
    "$TMP/c/top.qcow2" 8M
qio "$TMP/c/top.qcow2" "write -P 0x73 $((M + 508 * K)) $((8 * K))" \
    "write -z $((5 * M)) $((64 * K))" "write -z -u 0 $((64 * K))" \
    "write -z $((M + 2 * K)) $((4 * K))" "write -P 0x74 $((6 * M + 130 * K)) $((2 * K))" \
    "write -c -P 0x75 $((7 * M)) $((64 * K))"
image "depth 3" "$TMP/c/top.qcow2" 3 65536 "$TMP/b/mid.qcow2" "$TMP/a/base.qcow2"
probed_refused "depth 3" "$TMP/c/top.qcow2" ../b/mid.qcow2

# a/base.raw <- b/rmid.qcow2 (raw named) <- c/rtop.qcow2 (no backing
# format: mid is probed, a qcow2; a probed image never opens a backing
# file of its own, so the chain is refused until the format is recorded).
cp --sparse=always "$TMP/src.raw" "$TMP/a/base.raw"
qemu-img create -q -f qcow2 -o cluster_size=16k -b ../a/base.raw -F raw "$TMP/b/rmid.qcow2" 8M
qio "$TMP/b/rmid.qcow2" "write -P 0x81 $((M)) $((2 * M))" "write -z $((5 * M + 16 * K)) $((32 * K))"
qemu-img create -q -f qcow2 -b ../b/rmid.qcow2 -F qcow2 "$TMP/c/rtop.qcow2" 8M
qpatch "$TMP/c/rtop.qcow2" drop-backing-format
qio "$TMP/c/rtop.qcow2" "write -P 0x82 $((2 * M)) $((64 * K))" \
    "write -z $((M)) $((64 * K))" "write -P 0x83 $((4 * M + 64 * K)) $((64 * K))"
refused "depth 3 over raw: a probed middle" copy --src-format qcow2 \
    "$TMP/c/rtop.qcow2" "$TMP/r.out"
err_names rmid.qcow2
err_says 'probed'
err_says 'base\.raw'
qemu-img rebase -u -b ../b/rmid.qcow2 -F qcow2 "$TMP/c/rtop.qcow2"
image "depth 3 over raw" "$TMP/c/rtop.qcow2" 3 65536 "$TMP/b/rmid.qcow2" "$TMP/a/base.raw"
refused "depth 3 over raw: probed copy" copy "$TMP/c/rtop.qcow2" "$TMP/r.out"
err_names ../b/rmid.qcow2
echo "PASS"
