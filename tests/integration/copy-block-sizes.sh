#!/bin/bash
# copy-block-sizes.sh: the client keeps to the block sizes a server
# advertises (§Size constraints). Offsets and lengths are multiples of
# the minimum, also when the source describes its extents in pieces that
# are not (the server may describe less than was asked); pieces are
# multiples of the preferred size where possible; and an export whose
# size is not a multiple of its minimum cannot be copied (its last bytes
# cannot be addressed), which must fail up front, loudly; a source that
# ends inside a destination's minimum block has that block
# read-modified-written. Destinations run
# nbdkit's blocksize-policy filter, which fails any request that breaks
# the limits, and every copy is compared with its source.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
need nbdkit
nbdkit --dump-plugin memory >/dev/null 2>&1 || skip "nbdkit memory plugin missing"
nbdkit --filter=blocksize-policy null --run true >/dev/null 2>&1 ||
    skip "nbdkit blocksize-policy filter missing (nbdkit >= 1.30)"
tmpdir_make
FAKE=$(dirname "$0")/fakenbd.py

# strict SOCK MIN PREF MAX [EXTRA...]: nbdkit memory (4 MiB) that refuses
# requests breaking MIN/MAX, logging every request to SOCK.log.
strict () {
    local sock=$1 min=$2 pref=$3 max=$4
    shift 4
    nbdkit -f -U "$sock" --filter=log --filter=blocksize-policy memory 4M \
        blocksize-minimum="$min" blocksize-preferred="$pref" \
        blocksize-maximum="$max" blocksize-error-policy=error \
        logfile="$sock.log" "$@" >>"$TMP/kit.log" 2>&1 &
    SERVER_PIDS+=($!)
    wait_for test -S "$sock"
}

# 1. A source whose block status describes 1001 bytes at a time, into a
#    destination that refuses anything not a multiple of 512.
python3 "$FAKE" "$TMP/short.sock" shortstatus $((4 << 20)) \
    >>"$TMP/fake.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/short.sock"
strict "$TMP/d1.sock" 512 4096 $((1 << 20))
check "copy with unaligned source extents into a 512-byte-minimum export" \
    "$NBDFLOW" copy "nbd+unix:///?socket=$TMP/short.sock" \
    "nbd+unix:///?socket=$TMP/d1.sock"
"$NBDFLOW" copy "nbd+unix:///?socket=$TMP/short.sock" "$TMP/want.img" ||
    fail "reading the source to a file failed"
"$NBDFLOW" copy "nbd+unix:///?socket=$TMP/d1.sock" "$TMP/got.img" ||
    fail "reading the destination back failed"
same "$TMP/want.img" "$TMP/got.img"

# 2. Data and holes every 4 KiB, into an export that prefers 64 KiB: every
#    write, zero and trim is a multiple of 64 KiB at a multiple of 64 KiB.
make_striped "$TMP/sp.img" 4 12288
strict "$TMP/d2.sock" 4096 65536 65536
check "copy a finely sparse image into a 64 KiB-preferring export" \
    "$NBDFLOW" copy "$TMP/sp.img" "nbd+unix:///?socket=$TMP/d2.sock"
python3 - "$TMP/d2.sock.log" <<'PY' || fail "a request was not 64 KiB-aligned"
import re, sys
n = 0
for line in open(sys.argv[1]):
    m = re.search(r" (Write|Zero|Trim) id=\d+ offset=(0x[0-9a-f]+) "
                  r"count=(0x[0-9a-f]+)", line)
    if m:
        off, cnt = int(m.group(2), 16), int(m.group(3), 16)
        assert off % 65536 == 0 and cnt % 65536 == 0, line
        n += 1
assert n > 0, "no write in the log"
print("%d requests, all multiples of 64 KiB" % n)
PY
"$NBDFLOW" copy "nbd+unix:///?socket=$TMP/d2.sock" "$TMP/back.img" ||
    fail "reading the 64 KiB export back failed"
same "$TMP/sp.img" "$TMP/back.img"

# 3. An export of 4 MiB + 1000 bytes with a 512-byte minimum: its last
#    488 bytes (1000 mod 512) are out of reach, so copy and sum fail and
#    say so.
FAKE_MIN=512 python3 "$FAKE" "$TMP/odd.sock" good $((4 << 20 | 1000)) \
    >>"$TMP/fake.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/odd.sock"
for cmd in copy sum; do
    rc=0
    if [ $cmd = copy ]; then
        "$NBDFLOW" copy "nbd+unix:///?socket=$TMP/odd.sock" "$TMP/odd.img" \
            2>"$TMP/err" || rc=$?
    else
        "$NBDFLOW" sum "nbd+unix:///?socket=$TMP/odd.sock" 2>"$TMP/err" ||
            rc=$?
    fi
    [ "$rc" -ne 0 ] || fail "$cmd of an export with an unaligned size exited 0"
    grep -q "not a multiple of its minimum block size 512: its last 488 bytes" \
        "$TMP/err" || fail "$cmd: $(cat "$TMP/err")"
    note "ok: $cmd refuses: $(cat "$TMP/err")"
done
# 4. A maximum block size of 0 breaks the rules (it must be at least the
#    minimum): it is taken as not given, not as a reason to send requests
#    of one byte.
FAKE_MAX=0 python3 "$FAKE" "$TMP/max0.sock" good $((4 << 20)) \
    >>"$TMP/fake.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/max0.sock"
"$NBDFLOW" copy --json "nbd+unix:///?socket=$TMP/max0.sock" "$TMP/m0.img" \
    >"$TMP/m0.json" || fail "copy from a server with maximum block size 0"
python3 - "$TMP/m0.json" <<'PY' || fail "tiny requests: $(cat "$TMP/m0.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["request_size"] >= 4096 and r["requests"] < 100, r
PY
cmp -n $((4 << 20)) "$TMP/m0.img" "$TMP/want.img" ||
    fail "copy from the maximum-0 server differs"

# 5. Sources that end inside a minimum block of a larger destination
#    (512-byte minimum): the last block is read from the destination and
#    written whole, so the bytes past the source's end keep what the
#    destination held. The destination starts full of other data; a
#    513-byte source, a 600000-byte one (copied as one large opening
#    piece), and a sparse one whose last extent (a hole) ends 100 bytes
#    into a block, each with and without --verify and with and without
#    zero copy. (The server fails any request that breaks the
#    minimum, so a copy that ends with a short write fails.)
strict "$TMP/d5.sock" 512 4096 $((32 << 20))
head -c $((4 << 20)) /dev/urandom >"$TMP/prior.img"
head -c 513 /dev/urandom >"$TMP/s513.img"
head -c 600000 /dev/urandom >"$TMP/s600k.img" # one opening piece
python3 - "$TMP/tail.img" <<'PY'
import os, sys
with open(sys.argv[1], "wb") as f:
    f.write(os.urandom(1 << 20))
    f.truncate((2 << 20) + 100)   # ends in a hole, 100 bytes into a block
PY
for src in s513 s600k tail; do
    for opts in "" "--verify" "--verify --no-zero-copy"; do
        "$NBDFLOW" copy "$TMP/prior.img" "nbd+unix:///?socket=$TMP/d5.sock" ||
            fail "filling the destination failed"
        # shellcheck disable=SC2086
        "$NBDFLOW" copy $opts "$TMP/$src.img" \
            "nbd+unix:///?socket=$TMP/d5.sock" 2>"$TMP/err" ||
            fail "$src $opts: copy into a 512-minimum export: $(cat "$TMP/err")"
        "$NBDFLOW" copy "nbd+unix:///?socket=$TMP/d5.sock" "$TMP/d5.img" ||
            fail "reading the 512-minimum export back failed"
        python3 - "$TMP/$src.img" "$TMP/prior.img" "$TMP/d5.img" <<'PY' ||
import sys
src, prior, got = (open(p, "rb").read() for p in sys.argv[1:4])
n = len(src)
assert got[:n] == src, "the copied bytes differ"
assert got[n:] == prior[n:], "bytes past the source's end were changed"
PY
            fail "$src $opts: wrong content after the copy"
        note "ok: $src ${opts:-(default)}: last block read-modify-written"
    done
done

# 6. A source that describes its first KiB as 1024 extents of a byte or
#    two fills the extent table with pieces below the alignment, so its
#    last piece starts inside a block of the 512-minimum destination; the
#    source holds back its first read, so that the last piece is ready
#    first. The copy cannot keep to the minimum: it fails with one line
#    (and never lays the destination's block over a buffer too small for
#    it, which ASan would report).
cat >"$TMP/tiny.sh" <<'SH'
#!/bin/bash
size=525313
case "$1" in
    get_size) echo $size ;;
    thread_model) echo parallel ;;
    can_extents|can_multi_conn) exit 0 ;;
    open) echo x ;;
    pread)
        [ "$4" -ne 0 ] || sleep 2
        head -c "$3" /dev/zero | tr '\0' 'x' ;;
    extents)
        off=$4 end=$(($4 + $3))
        if [ "$off" -ge 1025 ]; then
            echo "$off $3 0"
            exit 0
        fi
        for ((i = off; i < 1023 && i < end; i++)); do
            echo "$i 1 $(( (i % 2) * 3 ))"
        done
        [ "$end" -le 1023 ] || echo "1023 2 3"
        [ "$end" -le 1025 ] || echo "1025 $((end - 1025)) 0" ;;
    *) exit 2 ;;
esac
SH
chmod +x "$TMP/tiny.sh"
kit "$TMP/tiny.sock" sh "$TMP/tiny.sh"
rc=0
timeout 60 "$NBDFLOW" copy "nbd+unix:///?socket=$TMP/tiny.sock" \
    "nbd+unix:///?socket=$TMP/d5.sock" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" != 124 ] || fail "tiny extents: the copy hung"
check_copy_failed "tiny extents into a 512-minimum export" "$rc" \
    "minimum block size 512\|block boundary"

# 7. A request size below the minimum block size and not a multiple of
#    it: requests are rounded up to the minimum, and the copy succeeds.
head -c $((1 << 20)) /dev/urandom >"$TMP/s1m.img"
"$NBDFLOW" copy --json --request-size 1000 "$TMP/s1m.img" \
    "nbd+unix:///?socket=$TMP/d5.sock" >"$TMP/r1000.json" ||
    fail "copy with --request-size 1000 into a 512-minimum export"
python3 - "$TMP/r1000.json" <<'PY' || fail "request size: $(cat "$TMP/r1000.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["request_size"] == 1024, r
PY
"$NBDFLOW" copy "nbd+unix:///?socket=$TMP/d5.sock" "$TMP/d5.img" ||
    fail "reading the 512-minimum export back failed"
cmp -n $((1 << 20)) "$TMP/s1m.img" "$TMP/d5.img" ||
    fail "copy with --request-size 1000 differs"

# 4b. Sizes the spec forbids (§Size constraints: the minimum "MUST be a
#     power of 2" up to 64 KiB, the maximum at least the minimum)
#     refuse the export, with the sizes named, before anything is copied;
#     before, they were quietly replaced, and requests broke them.
for bad in "3000 33554432 minimum block size of 3000" \
           "131072 33554432 minimum block size of 131072" \
           "0 33554432 minimum block size of 0" \
           "4096 512 maximum block size of 512, under its minimum of 4096"; do
    set -- $bad
    min=$1 max=$2
    shift 2
    FAKE_MIN=$min FAKE_MAX=$max python3 "$FAKE" "$TMP/bad$min-$max.sock" good \
        $((4 << 20)) >>"$TMP/fake.log" 2>&1 &
    SERVER_PIDS+=($!)
    wait_for test -S "$TMP/bad$min-$max.sock"
    rm -f "$TMP/bad.img"
    for cmd in copy info; do
        rc=0
        if [ $cmd = copy ]; then
            "$NBDFLOW" copy "nbd+unix:///?socket=$TMP/bad$min-$max.sock" \
                "$TMP/bad.img" 2>"$TMP/err" || rc=$?
        else
            "$NBDFLOW" info "nbd+unix:///?socket=$TMP/bad$min-$max.sock" \
                >/dev/null 2>"$TMP/err" || rc=$?
        fi
        [ "$rc" -ne 0 ] || fail "$cmd from a server with minimum $min, maximum $max succeeded"
        grep -q "$*" "$TMP/err" ||
            fail "$cmd with minimum $min, maximum $max: not the sizes named: $(cat "$TMP/err")"
        [ "$(wc -l <"$TMP/err")" -eq 1 ] ||
            fail "$cmd with minimum $min, maximum $max: not one line: $(cat "$TMP/err")"
    done
    [ ! -s "$TMP/bad.img" ] || fail "minimum $min, maximum $max: bytes were copied"
    note "ok: minimum $min, maximum $max refused: $(cat "$TMP/err")"
done

# 8. A maximum that is not a multiple of the minimum is still a maximum
#    (§Size constraints asks only that it be at least the preferred
#    size): no request may exceed it, the opening 4 MiB WRITE included.
strict "$TMP/d8.sock" 512 4096 1000000
head -c $((4 << 20)) /dev/urandom >"$TMP/s4m.img"
check "copy into an export whose maximum is 1000000 bytes" \
    "$NBDFLOW" copy "$TMP/s4m.img" "nbd+unix:///?socket=$TMP/d8.sock"
check "copy out of it" \
    "$NBDFLOW" copy "nbd+unix:///?socket=$TMP/d8.sock" "$TMP/d8.img"
same "$TMP/s4m.img" "$TMP/d8.img"
"$NBDFLOW" info --json "nbd+unix:///?socket=$TMP/d8.sock" >"$TMP/d8.json"
# info shows what the server sent, as nbdinfo does; requests keep to the
# largest multiple of the minimum under it (checked by the filter above).
grep -q '"block_size_maximum": 1000000' "$TMP/d8.json" ||
    fail "info does not show the maximum the server sent: $(cat "$TMP/d8.json")"
echo "PASS"
