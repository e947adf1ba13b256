#!/bin/bash
# copy-impossible-size.sh: sizes the client must refuse at the handshake,
# before a byte is read or written. A server (fakenbd.py) advertising an
# export of 2^64-1 or 2^63 bytes, more than any file or device can hold
# (off_t stops at 2^63-1): copy (into a file and into null:), info and sum
# each end at once with one line naming the URI and the size, and no
# destination file is made (a copy once wrote gigabytes before it was
# stopped). An export whose size is not a multiple of its minimum block
# size (its last bytes are out of reach) is refused by info too (copy and
# sum: copy-block-sizes.sh). A LIST whose names are too long, or too
# many, is refused. A destination smaller than the source, an
# NBD export and (where a loop device can be attached) a block device, is
# refused before anything is written to it.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
tmpdir_make
FAKE=$(dirname "$0")/fakenbd.py

# refused WHAT PATTERN CMD...: CMD fails within 5 s, with one line on
# stderr that holds PATTERN.
refused () {
    local what=$1 pattern=$2 rc=0 t0 t1
    shift 2
    t0=$(date +%s%N)
    "$@" >"$TMP/out" 2>"$TMP/err" </dev/null || rc=$?
    t1=$(date +%s%N)
    [ "$rc" -ne 0 ] || fail "$what: exited 0"
    [ $(((t1 - t0) / 1000000)) -lt 5000 ] ||
        fail "$what: took $(((t1 - t0) / 1000000)) ms"
    [ "$(wc -l <"$TMP/err")" -eq 1 ] ||
        fail "$what: not one line: $(cat "$TMP/err")"
    grep -qF -- "$pattern" "$TMP/err" || fail "$what: $(cat "$TMP/err")"
    note "ok: $what: $(cat "$TMP/err")"
}

n=0
for size in 18446744073709551615 9223372036854775808; do
    n=$((n + 1))
    python3 "$FAKE" "$TMP/big$n.sock" good "$size" >>"$TMP/fake.log" 2>&1 &
    SERVER_PIDS+=($!)
    wait_for test -S "$TMP/big$n.sock"
    src=$(uri "$TMP/big$n.sock")
    want="$src: the server advertises an export size of $size bytes"
    refused "copy of a $size-byte export into a file" "$want" \
        "$NBDFLOW" copy "$src" "$TMP/out$n.img"
    [ ! -e "$TMP/out$n.img" ] || fail "the destination file was made"
    refused "copy of a $size-byte export into null:" "$want" \
        "$NBDFLOW" copy "$src" null:
    refused "info of a $size-byte export" "$want" "$NBDFLOW" info "$src"
    refused "sum of a $size-byte export" "$want" "$NBDFLOW" sum "$src"
done

FAKE_MIN=512 python3 "$FAKE" "$TMP/odd.sock" good $((1 << 20 | 1000)) \
    >>"$TMP/fake.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/odd.sock"
refused "info of an export whose size is not a multiple of 512" \
    "export size 1049576 is not a multiple of its minimum block size 512: its last 488 bytes" \
    "$NBDFLOW" info "$(uri "$TMP/odd.sock")"

# LIST replies that would make the client keep what no list needs: a
# name longer than a string may be, or 16 MiB of names.
for mode in longlist manylist; do
    python3 "$FAKE" "$TMP/$mode.sock" "$mode" 4096 >>"$TMP/fake.log" 2>&1 &
    SERVER_PIDS+=($!)
    wait_for test -S "$TMP/$mode.sock"
done
refused "info --list of a 5000-byte name" \
    "LIST name of 5000 bytes, longer than a string may be (4096)" \
    "$NBDFLOW" info --list "$(uri "$TMP/longlist.sock")"
refused "info --list of 4097 names of 4096 bytes" \
    "LIST names beyond 16777216 bytes in all" \
    "$NBDFLOW" info --list "$(uri "$TMP/manylist.sock")"

# A destination smaller than the source.
make_random "$TMP/src.img" 2
serve_tcp memory:1M
refused "copy of 2 MiB into a 1 MiB NBD export" \
    "$URI (1048576 bytes) is smaller than $TMP/src.img (2097152 bytes)" \
    "$NBDFLOW" copy "$TMP/src.img" "$URI"
"$NBDFLOW" copy "$URI" "$TMP/back.img" || fail "reading the export back"
all_zero "$TMP/back.img" $((1 << 20))
serve_stop

truncate -s 1M "$TMP/dev.img"
if command -v losetup >/dev/null 2>&1 &&
    LOOP=$(losetup -f --show "$TMP/dev.img" 2>"$TMP/losetup.err"); then
    on_exit "losetup -d '$LOOP'"
    refused "copy of 2 MiB into a 1 MiB block device" \
        "$LOOP (1048576 bytes) is smaller than $TMP/src.img (2097152 bytes)" \
        "$NBDFLOW" copy "$TMP/src.img" "$LOOP"
    all_zero "$TMP/dev.img" $((1 << 20))
else
    note "no loop device (${LOOP:-$(cat "$TMP/losetup.err" 2>/dev/null)}):" \
         "the block device case is skipped"
fi
echo "PASS"
