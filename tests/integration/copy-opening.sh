#!/bin/bash
# copy-opening.sh: with the request size left automatic, the first READ
# or WRITE to an NBD server is one large opening request (4 MiB), after
# which the copy goes on at 512 KiB. qemu-nbd mallocs each request's
# buffer; until glibc has freed one buffer that large, it maps or trims
# the memory under every payload again, and the server faults in each
# page of each request. Checks, against a fresh qemu-nbd for every copy:
# the JSON report names the opening request (and none when
# --request-size is given); writing with it, the server takes at most a
# quarter of the page faults it takes without (counted from /proc, not
# timed), also when the image starts with a short extent and a hole, and
# when it starts with allocated zeroes (the zero piece is not the
# opening; the next data is); reads open the same way. Every copy is
# compared byte for byte with its source.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need qemu-nbd qemu-utils
need python3
tmpdir_make

MIB=256
make_random "$TMP/src.img" "$MIB"
truncate -s "${MIB}M" "$TMP/dst.img"

# qnbd FILE: a fresh qemu-nbd for FILE on its own socket; pid in QPID.
N=0
qnbd () {
    N=$((N + 1))
    QSOCK=$TMP/q$N.sock
    qemu-nbd -f raw --cache=writeback -t -e 8 -k "$QSOCK" "$1" \
        >>"$TMP/qemu-nbd.log" 2>&1 &
    QPID=$!
    SERVER_PIDS+=("$QPID")
    wait_for test -S "$QSOCK"
}
qstop () {
    kill "$QPID" || fail "qemu-nbd died during the copy (see qemu-nbd.log)"
    wait "$QPID" 2>/dev/null || true
    forget_pid "$QPID"
}
# faults PID: the process's minor page faults so far.
faults () { awk '{print $10}' "/proc/$1/stat"; }
# field JSON KEY: a top-level number of the report.
field () {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# counted NAME SRC DST ARGS...: one copy against a fresh qemu-nbd serving
# FILE (SRC or DST is the word SERVER); sets FAULTS and OPENING.
counted () {
    local name=$1 src=$2 dst=$3 file before after; shift 3
    if [ "$src" = SERVER ]; then file=$TMP/src.img; else file=$TMP/dst.img; fi
    qnbd "$file"
    [ "$src" = SERVER ] && src=$(uri "$QSOCK")
    [ "$dst" = SERVER ] && dst=$(uri "$QSOCK")
    before=$(faults "$QPID")
    timeout 120 "$NBDFLOW" copy --json "$@" "$src" "$dst" \
        >"$TMP/report.json" || fail "$name: copy failed"
    after=$(faults "$QPID")
    qstop
    FAULTS=$((after - before))
    OPENING=$(field "$TMP/report.json" opening_request)
    note "$name: opening request $OPENING, server page faults $FAULTS"
}

# fewer NAME: the last copy took at most a quarter of the faults of the
# baseline. Without a baseline worth comparing (a qemu-nbd that keeps its
# buffers) the comparison is noted, and the test skips at its end.
pages=$((MIB * 256))
NOCOMPARE=""
fewer () {
    if [ "$without" -lt $((pages / 2)) ]; then
        NOCOMPARE="this qemu-nbd faulted only $without pages for $pages written without an opening request: nothing to reduce"
        note "$1: not compared ($NOCOMPARE)"
        return
    fi
    [ "$FAULTS" -le $((without / 4)) ] ||
        fail "$1: $FAULTS server page faults with the opening request, $without without (want at most a quarter)"
    note "ok: $1, $FAULTS page faults instead of $without"
}
# expect_opening NAME BYTES
expect_opening () {
    [ "$OPENING" = "$2" ] ||
        fail "$1: opening request $OPENING, expected $2"
}

# Writing (file -> NBD, sendfile path): the baseline, then the opening.
counted "write, --request-size 512K" "$TMP/src.img" SERVER --request-size 512K
same "$TMP/src.img" "$TMP/dst.img"
expect_opening "--request-size 512K" 0
without=$FAULTS
truncate -s 0 "$TMP/dst.img"; truncate -s "${MIB}M" "$TMP/dst.img"
counted "write, automatic" "$TMP/src.img" SERVER
same "$TMP/src.img" "$TMP/dst.img"
expect_opening "write, automatic" $((4 << 20))
fewer "write, automatic"

# Reading (buffer path): the opening READ, and the bytes. (How many
# faults it saves depends on how fast the reads are consumed, so they
# are not compared.)
counted "read to a file, automatic" SERVER "$TMP/back.img"
same "$TMP/src.img" "$TMP/back.img"
expect_opening "read, automatic" $((4 << 20))
rm -f "$TMP/back.img"

# A 4 KiB extent, a hole to 1 MiB, then data: the opening is the piece
# from 1 MiB to the 4 MiB grid line.
cp "$TMP/src.img" "$TMP/src2.img"
fallocate -p -o 4096 -l $(((1 << 20) - 4096)) "$TMP/src2.img" ||
    fail "cannot punch a hole into $TMP/src2.img"
holes=$(python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print(os.lseek(fd, 4096, os.SEEK_DATA))' "$TMP/src2.img")
if [ "$holes" = $((1 << 20)) ]; then
    counted "write, short first extent" "$TMP/src2.img" SERVER
    same "$TMP/src2.img" "$TMP/dst.img"
    expect_opening "short first extent" $((3 << 20))
    fewer "write, short first extent"
else
    note "the temporary directory's file system reports no hole (SEEK_DATA gave $holes): short first extent not checked"
fi
rm -f "$TMP/src2.img"

# Allocated zeroes first, buffer path: the first 4 MiB read back as
# zeroes and go out as a ZERO request; the opening is the next 4 MiB.
cp "$TMP/src.img" "$TMP/src3.img"
dd if=/dev/zero of="$TMP/src3.img" bs=1M count=4 conv=notrunc status=none ||
    fail "cannot write zeroes into $TMP/src3.img"
counted "write, zeroes first, --no-zero-copy" "$TMP/src3.img" SERVER --no-zero-copy
same "$TMP/src3.img" "$TMP/dst.img"
[ "$(field "$TMP/report.json" data_path)" = buffer ] ||
    fail "--no-zero-copy did not take the buffer path"
expect_opening "zeroes first" $((4 << 20))
fewer "write, zeroes first, --no-zero-copy"

[ -z "$NOCOMPARE" ] || skip "$NOCOMPARE (every copy matched its source)"
