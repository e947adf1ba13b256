#!/bin/bash
# copy-bad-server.sh: what the client does with a server that breaks the
# protocol (fakenbd.py, beside this file). Read chunks may come in any
# order, but they must not overlap: one that repeats a range would leave
# part of the buffer unfilled while the byte count still adds up, and the
# copy would succeed with wrong data. Block status must come as one chunk
# per context. A wrong-length NBD_INFO_EXPORT or NBD_INFO_BLOCK_SIZE must
# fail the handshake, not leave the size at 0. A server's error message,
# export names and description are shown escaped. Allowed orders are checked too, and every successful
# copy is compared with the pattern the server serves. Extended reply
# headers that were never negotiated, an ERROR_OFFSET past the request
# and an error message longer than its chunk are protocol errors; a
# SET_META_CONTEXT that failed after naming a context leaves none.
# Extended headers work with a server that follows them, and a server
# that breaks them is refused. A listed name holding a NUL byte is
# refused; a shown one is left out. Transmission flags without
# NBD_FLAG_HAS_FLAGS are ignored, with a warning. A WRITE refused before
# its payload was sent fails with the server's reason in the line.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
tmpdir_make
SIZE=$((3 << 20 | 1000)) # several requests, and a short tail
FAKE=$(dirname "$0")/fakenbd.py

make_fake_pattern "$TMP/want.img" "$SIZE"

# fake MODE: starts fakenbd.py in MODE on $TMP/MODE.sock; sets URI.
fake () {
    python3 "$FAKE" "$TMP/$1.sock" "$1" "$SIZE" >>"$TMP/fake.log" 2>&1 &
    SERVER_PIDS+=($!)
    wait_for test -S "$TMP/$1.sock"
    URI="nbd+unix:///?socket=$TMP/$1.sock"
}

for mode in good reverse scatter; do
    fake "$mode"
    rm -f "$TMP/out.img"
    check "copy from a server answering in $mode order" \
        "$NBDFLOW" copy --request-size 256K "$URI" "$TMP/out.img"
    same "$TMP/want.img" "$TMP/out.img"
done

fake overlap
rm -f "$TMP/out.img"
rc=0
"$NBDFLOW" copy "$URI" "$TMP/out.img" >"$TMP/out" 2>"$TMP/err" || rc=$?
check_copy_failed "overlapping read chunks" "$rc" "overlap"
rc=0
"$NBDFLOW" sum "$URI" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -ne 0 ] || fail "sum over overlapping read chunks exited 0"
grep -q "overlap" "$TMP/err" || fail "sum: $(cat "$TMP/err")"

fake twostatus
rc=0
"$NBDFLOW" copy "$URI" "$TMP/out.img" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -ne 0 ] || fail "two status chunks for one context: exited 0"
grep -q "two block status chunks for one context" "$TMP/err" ||
    fail "two status chunks: $(cat "$TMP/err")"
note "ok: two status chunks: $(cat "$TMP/err")"

# Framing the client must refuse: an extended reply header where none
# was negotiated (read as a compact one, its length would be taken from
# bytes that never came), an ERROR_OFFSET just past the request, an
# error chunk whose message runs past its end, and a reply whose cookie
# names no request (the line says which cookie).
for mode in extmagic:"extended reply without extended headers" \
    erroffend:"error offset outside the request" \
    errmsglen:"error chunk message longer than the chunk" \
    stray:"a reply for cookie 0x5a[0-9a-f]*, which names no request in flight"; do
    fake "${mode%%:*}"
    rc=0
    "$NBDFLOW" copy "$URI" "$TMP/out.img" >"$TMP/out" 2>"$TMP/err" || rc=$?
    check_copy_failed "${mode%%:*}" "$rc" "${mode#*:}"
done

# A WRITE refused before its payload was read (ENOSPC, then the payload
# dropped): the line says the server's reason, not only that the reply
# came early. Requests of 32 MiB cannot be wholly in the socket's buffer
# when the refusal arrives.
python3 "$FAKE" "$TMP/early.sock" earlywrite $((64 << 20)) >>"$TMP/fake.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/early.sock"
head -c $((64 << 20)) /dev/urandom >"$TMP/w64m.img"
rc=0
"$NBDFLOW" copy --request-size 32M "$TMP/w64m.img" \
    "nbd+unix:///?socket=$TMP/early.sock" >"$TMP/out" 2>"$TMP/err" || rc=$?
check_copy_failed "earlywrite" "$rc" "No space left on device"
rm -f "$TMP/w64m.img"

# Extended headers from a second implementation: a server that agrees to
# them and follows them serves a whole copy and map; one that then sends
# a compact reply (found at once from its magic, not after waiting for 32
# header bytes that never come), a reply header whose offset is not the
# request's, or a compact status chunk is refused.
fake extgood
rm -f "$TMP/out.img"
check "copy from a server with extended headers" \
    "$NBDFLOW" copy --request-size 256K "$URI" "$TMP/out.img"
same "$TMP/want.img" "$TMP/out.img"
"$NBDFLOW" info --json "$URI" >"$TMP/info.json"
grep -q '"extended": true' "$TMP/info.json" ||
    fail "extended headers not negotiated: $(cat "$TMP/info.json")"
"$NBDFLOW" info --map "$URI" >"$TMP/map"
[ "$(cat "$TMP/map")" = "$(printf '%12u %12u %4u  data' 0 "$SIZE" 0)" ] ||
    fail "map over extended headers: $(cat "$TMP/map")"
note "ok: copy and map over extended headers"
for mode in extsimple:"compact reply after extended headers" \
    extoffset:"reply offset 1 for a request at 0" \
    extstatus32:"bad block status chunk"; do
    fake "${mode%%:*}"
    rc=0
    timeout 30 "$NBDFLOW" copy --timeout 20 "$URI" "$TMP/out.img" \
        >"$TMP/out" 2>"$TMP/err" || rc=$?
    check_copy_failed "${mode%%:*}" "$rc" "${mode#*:}"
done

# GO refused after extended headers were agreed: the client may not fall
# back to EXPORT_NAME then (the extended-headers text: MUST NOT).
fake extnogo
rc=0
timeout 30 "$NBDFLOW" info "$URI" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] ||
    fail "GO refused after extended headers: info exit $rc: $(cat "$TMP/err")"
grep -q "refused GO: ERR_UNSUP" "$TMP/err" ||
    fail "GO refused after extended headers: $(cat "$TMP/err")"
! grep -q export_name "$TMP/fake.log" ||
    fail "EXPORT_NAME sent after extended headers were agreed"
note "ok: no EXPORT_NAME after extended headers: $(cat "$TMP/err")"

# SET_META_CONTEXT that replied a context and then failed has set none
# (the spec: it replaces the contexts "including when this command
# fails"): no BLOCK_STATUS may be sent, all is data, the copy succeeds.
fake metaerr
rm -f "$TMP/out.img"
check "copy from a server whose SET_META_CONTEXT failed" \
    "$NBDFLOW" copy "$URI" "$TMP/out.img"
same "$TMP/want.img" "$TMP/out.img"
"$NBDFLOW" info "$URI" >"$TMP/out" || fail "info of the metaerr server"
! grep -q "base:allocation" "$TMP/out" ||
    fail "info shows a context the server failed to set: $(cat "$TMP/out")"

# A server's error message is shown, but escaped: it cannot add a line of
# its own or reach the terminal.
fake evilerror
rc=0
"$NBDFLOW" copy "$URI" "$TMP/out.img" >"$TMP/out" 2>"$TMP/err" || rc=$?
check_copy_failed "read error with a hostile message" "$rc" "disk on fire"
grep -q 'disk on fire\\x0a\\x1b\[2Jforged' "$TMP/err" ||
    fail "the server's message was not escaped: $(cat -v "$TMP/err")"
! grep -q "$(printf '\033')" "$TMP/err" || fail "an escape reached stderr"

# Not a misbehaviour: a server may refuse WRITE_ZEROES longer than its
# maximum payload with EOVERFLOW or EINVAL (spec, "Block size
# constraints"). The copy must zero in pieces of that size instead of
# failing. Two holes of 1.4 MiB against a 1 MiB maximum; the destination
# starts as 0xAA, so a range left unzeroed cannot compare equal.
python3 - "$TMP/holes.img" "$SIZE" <<'PY'
import os, sys
path, size = sys.argv[1], int(sys.argv[2])
with open(path, "wb") as f:
    f.truncate(size)
    for off, n in ((0, 65536), (1536 << 10, 65536), (3 << 20, size - (3 << 20))):
        f.seek(off)
        f.write(os.urandom(n))
PY
FAKE_MAX=1048576 python3 "$FAKE" "$TMP/zc.sock" zerocap "$SIZE" \
    >"$TMP/zc.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/zc.sock"
URI="nbd+unix:///?socket=$TMP/zc.sock"
check "copy into a server that refuses long zeroing" \
    "$NBDFLOW" copy "$TMP/holes.img" "$URI"
rm -f "$TMP/out.img"
check "read back" "$NBDFLOW" copy "$URI" "$TMP/out.img"
same "$TMP/holes.img" "$TMP/out.img"
grep -q "refused" "$TMP/zc.log" || fail "no long zeroing was tried: $(cat "$TMP/zc.log")"
! awk '$3 == "ok" && $2 > 1048576 { bad = 1 } END { exit !bad }' \
    "$TMP/zc.log" || fail "zeroing over the maximum: $(cat "$TMP/zc.log")"
note "ok: long zeroing refused, then done in pieces: $(tr '\n' ' ' <"$TMP/zc.log")"

# Pieces answered are replies: a zeroing of 8 MiB in 128 pieces of 64 KiB,
# each answered after 20 ms (2.5 s in all), must not trip --timeout 1.
truncate -s 8M "$TMP/hole8.img"
printf 'x' | dd of="$TMP/hole8.img" bs=1 seek=$((8 << 20)) conv=notrunc \
    status=none
FAKE_MAX=65536 FAKE_ZERO_DELAY_MS=20 python3 "$FAKE" "$TMP/zs.sock" \
    zerocap $((8 << 20 | 1)) >"$TMP/zs.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/zs.sock"
URI="nbd+unix:///?socket=$TMP/zs.sock"
check "slow zeroing in pieces within --timeout 1" \
    timeout 60 "$NBDFLOW" copy --timeout 1 "$TMP/hole8.img" "$URI"
rm -f "$TMP/out.img"
check "read back" "$NBDFLOW" copy "$URI" "$TMP/out.img"
same "$TMP/hole8.img" "$TMP/out.img"
[ "$(grep -c "ok$" "$TMP/zs.log")" -ge 128 ] ||
    fail "expected 128 pieces or more: $(tr '\n' ' ' <"$TMP/zs.log")"

# info --map: a protocol error names what was wrong (the connection's
# reason), and a block status that never comes ends at --timeout.
URI="nbd+unix:///?socket=$TMP/twostatus.sock" # still serving
rc=0
"$NBDFLOW" info --map "$URI" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -ne 0 ] || fail "info --map with two status chunks: exited 0"
grep -q "block status at offset 0: .*two block status chunks" "$TMP/err" ||
    fail "info --map with two status chunks: $(cat "$TMP/err")"
# A reply without our context's status, and extents past the request:
# "exactly one status chunk" per context, and only the last extent may
# reach past the end. Both fail the map and the copy, naming the fault.
for mode in otherctx:"no status for base:allocation" \
    pastend:"block status extents run past the request"; do
    fake "${mode%%:*}"
    for cmd in "info --map" copy; do
        rc=0
        # shellcheck disable=SC2086
        "$NBDFLOW" $cmd "$URI" $([ "$cmd" = copy ] && echo "$TMP/out.img") \
            >"$TMP/out" 2>"$TMP/err" || rc=$?
        [ "$rc" -ne 0 ] || fail "${mode%%:*}: $cmd exited 0: $(cat "$TMP/out")"
        grep -qF "${mode#*:}" "$TMP/err" ||
            fail "${mode%%:*}: $cmd: $(cat "$TMP/err")"
        [ "$(wc -l <"$TMP/err")" = 1 ] ||
            fail "${mode%%:*}: $cmd: not one line: $(cat "$TMP/err")"
        note "ok: ${mode%%:*}: $cmd: $(cat "$TMP/err")"
    done
done
fake nostatus
rc=0
timeout 30 "$NBDFLOW" info --map --timeout 1 "$URI" >"$TMP/out" \
    2>"$TMP/err" || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] ||
    fail "info --map with no block status reply: exit $rc"
grep -q "block status at offset 0: Connection timed out" "$TMP/err" ||
    fail "info --map with no block status reply: $(cat "$TMP/err")"
note "ok: info --map: $(cat "$TMP/err")"

# A server that closes the connection once the data is written: the
# flush cannot be sent (or its reply never comes), and the copy fails
# saying why, not with a bare errno.
head -c 1048576 "$TMP/want.img" >"$TMP/one.img"
FAKE_CLOSE_AFTER=1 python3 "$FAKE" "$TMP/cl.sock" zerocap "$SIZE" \
    >>"$TMP/fake.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/cl.sock"
rc=0
"$NBDFLOW" copy --connections 1 "$TMP/one.img" \
    "nbd+unix:///?socket=$TMP/cl.sock" >"$TMP/out" 2>"$TMP/err" || rc=$?
# (A FLUSH already in the server's socket when it closes turns the close
# into a reset: the kernel's word for the same event.)
check_copy_failed "server gone before the flush" "$rc" \
    "closed the connection\|Connection reset by peer"

# A server's names and description reach info's output escaped: no
# terminal control, no forged line; --json stays valid UTF-8 JSON with the
# strings intact where they are text.
fake evilnames
check "info --list from a server with hostile names" \
    "$NBDFLOW" info --list "$URI"
"$NBDFLOW" info --list "$URI" >"$TMP/info.txt"
python3 - "$TMP/info.txt" <<'PY' || fail "info: $(cat -v "$TMP/info.txt")"
import sys
out = open(sys.argv[1], "rb").read()
bad = [b for b in out if (b < 0x20 and b not in (9, 10)) or b == 0x7f]
assert not bad, "control bytes %r" % bad
assert b"\xc2\x9b" not in out and b"\xff" not in out, "C1 or non-UTF-8"
assert not any(l.startswith(b"forged") for l in out.split(b"\n")), "forged"
assert b"\\x1b[2J\\x0aforged: \\x22name" in out, "name not shown escaped"
assert b"caf\xc3\xa9" in out, "UTF-8 text was mangled"
PY
"$NBDFLOW" info --json --list "$URI" >"$TMP/info.json"
python3 - "$TMP/info.json" <<'PY' || fail "info --json: $(cat -v "$TMP/info.json")"
import json, sys
d = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))
e = d["exports"][0]
assert e["export-name"] == "name\x1b[2J\nforged: \"name", e["export-name"]
assert e["description"] == "desc\x1b]0;title\x07 \x9b31m\\ \ufffd\ufffd caf\u00e9", e["description"]
assert d["export-names"] == ["list\x1b[31m\r\nforged: list"], d["export-names"]
PY
note "ok: hostile names shown escaped, JSON valid"

# A map cut short by an error is not printed at all: exit 1, one line
# naming the offset, and nothing on stdout that could pass for a whole
# map (or, with --json, for valid JSON).
fake laterstatus
for args in "" "--json"; do
    rc=0
    "$NBDFLOW" info --map $args "$URI" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" -ne 0 ] || fail "info --map $args with a failing status: exited 0"
    grep -q "block status at offset 1001: " "$TMP/err" ||
        fail "info --map $args: $(cat "$TMP/err")"
    [ ! -s "$TMP/out" ] || fail "info --map $args printed $(cat "$TMP/out")"
    note "ok: info --map${args:+ $args} cut short: $(cat "$TMP/err")"
done

# A string the server sends "MUST NOT contain NUL characters". Cut at the
# NUL, a listed name would be another export's: info --list fails. An
# NBD_INFO_NAME is only shown: info leaves it out and says so, and a copy
# goes on.
fake nulname
rc=0
"$NBDFLOW" info --list "$URI" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -ne 0 ] || fail "info --list with a NUL in a listed name: exited 0"
grep -q "a LIST reply's export name holds a NUL byte" "$TMP/err" ||
    fail "info --list with a NUL in a name: $(cat "$TMP/err")"
[ ! -s "$TMP/out" ] || fail "info --list printed $(cat "$TMP/out")"
note "ok: info --list with a NUL in a listed name: $(cat "$TMP/err")"
check "info with a NUL in NBD_INFO_NAME" \
    "$NBDFLOW" info "$URI" >"$TMP/out" 2>"$TMP/err"
grep -q "NBD_INFO_NAME holds a NUL byte, which the spec forbids: not shown" \
    "$TMP/err" || fail "info with a NUL in NBD_INFO_NAME: $(cat "$TMP/err")"
grep -q '^export="":' "$TMP/out" || fail "info showed a name: $(cat "$TMP/out")"
! grep -q "shown" "$TMP/out" || fail "info printed the cut name"
note "ok: info with a NUL in NBD_INFO_NAME: $(cat "$TMP/err")"
rm -f "$TMP/out.img"
check "copy from a server whose NBD_INFO_NAME holds a NUL" \
    "$NBDFLOW" copy "$URI" "$TMP/out.img"
same "$TMP/want.img" "$TMP/out.img"

# Transmission flags without NBD_FLAG_HAS_FLAGS ("MUST always be 1")
# promise nothing: info says so and shows none of them (this server's
# READ_ONLY, SEND_FLUSH and SEND_FUA), and a copy from it still works.
fake noflags
check "info with flags lacking NBD_FLAG_HAS_FLAGS" \
    "$NBDFLOW" info "$URI" >"$TMP/out" 2>"$TMP/err"
grep -q "transmission flags 0x000e lack NBD_FLAG_HAS_FLAGS" "$TMP/err" ||
    fail "info with flags lacking HAS_FLAGS: $(cat "$TMP/err")"
grep -q "transmission_flags: 0x0000" "$TMP/out" &&
    grep -q "is_read_only: false" "$TMP/out" &&
    grep -q "can_flush: false" "$TMP/out" ||
    fail "info used flags lacking HAS_FLAGS: $(cat "$TMP/out")"
note "ok: info with flags lacking HAS_FLAGS: $(cat "$TMP/err")"
rm -f "$TMP/out.img"
check "copy from a server whose flags lack NBD_FLAG_HAS_FLAGS" \
    "$NBDFLOW" copy "$URI" "$TMP/out.img" 2>"$TMP/err"
grep -q "lack NBD_FLAG_HAS_FLAGS" "$TMP/err" ||
    fail "copy with flags lacking HAS_FLAGS did not warn: $(cat "$TMP/err")"
same "$TMP/want.img" "$TMP/out.img"

# info_and_copy_fail MODE PATTERN: info and copy of $URI both fail, with
# stderr matching the extended regex PATTERN.
info_and_copy_fail () {
    local mode=$1 want=$2 cmd rc
    for cmd in info copy; do
        rc=0
        if [ $cmd = info ]; then
            "$NBDFLOW" info "$URI" >"$TMP/out" 2>"$TMP/err" || rc=$?
        else
            "$NBDFLOW" copy "$URI" "$TMP/out.img" >"$TMP/out" 2>"$TMP/err" ||
                rc=$?
        fi
        [ "$rc" -ne 0 ] || fail "$cmd with $mode: exited 0"
        grep -Eq "$want" "$TMP/err" || fail "$cmd with $mode: $(cat "$TMP/err")"
        note "ok: $cmd with $mode: $(cat "$TMP/err")"
    done
}

# A client that gives up during option haggling ends it with
# NBD_OPT_ABORT (§Termination of the session), and at once when the server
# is shutting down (ERR_SHUTDOWN): fakenbd logs each ABORT it gets.
for mode in gounknown shutdown; do
    python3 "$FAKE" "$TMP/$mode.sock" "$mode" "$SIZE" >"$TMP/$mode.log" 2>&1 &
    SERVER_PIDS+=($!)
    wait_for test -S "$TMP/$mode.sock"
    URI="nbd+unix:///?socket=$TMP/$mode.sock"
    want="no such export"
    [ $mode = gounknown ] || want="ERR_SHUTDOWN: going down"
    info_and_copy_fail "$mode" "$want"
    # --list aborts its listing connection too; one more ABORT.
    "$NBDFLOW" info --list "$URI" >"$TMP/out" 2>"$TMP/err" &&
        fail "info --list with $mode: exited 0"
    wait_for grep -qx "abort" "$TMP/$mode.log"
    n=$(grep -cx abort "$TMP/$mode.log") || true
    want_n=3
    [ $mode = gounknown ] && want_n=4
    [ "$n" = $want_n ] ||
        fail "$mode: $n NBD_OPT_ABORT seen, not $want_n: $(cat "$TMP/$mode.log")"
done

for mode in badexport badblock; do
    fake "$mode"
    info_and_copy_fail "$mode" "NBD_INFO_.* of 1[35] bytes"
done
echo "PASS"
