#!/bin/bash
# copy-requests.sh: what the copy asks of the destination, read from
# nbdkit's request log. A FLUSH on every connection after the last write
# has been answered, and none with --no-flush; zero ranges go as
# WRITE_ZEROES with FAST_ZERO first, and as plain WRITE_ZEROES after a
# server refuses fast zeroing (ENOTSUP); with --destination-is-zero no
# zeroing or trimming at all. Every copy is read back and compared.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
need nbdkit
nbdkit --dump-plugin memory >/dev/null 2>&1 || skip "nbdkit memory plugin missing"
nbdkit --filter=nozero null --run true >/dev/null 2>&1 ||
    skip "nbdkit nozero filter missing"
tmpdir_make

# 8 MiB: 1 MiB of data every 3 MiB, holes between and at the end.
make_sparse "$TMP/src.img" 8 "0:1 3:1 6:1"

# logged NAME [FILTER-ARGS...]: nbdkit memory 8M behind the log filter
# (and the nozero filter, set by FILTER-ARGS), socket $TMP/NAME.sock,
# request log $TMP/NAME.log.
logged () {
    local name=$1; shift
    kit "$TMP/$name.sock" --filter=log --filter=nozero memory 8M \
        zeromode=plugin logfile="$TMP/$name.log" "$@"
}

# readback NAME: the destination's content equals the source's.
readback () {
    rm -f "$TMP/back.img"
    "$NBDFLOW" copy "$(uri "$TMP/$1.sock")" "$TMP/back.img" ||
        fail "$1: reading the destination back failed"
    same "$TMP/src.img" "$TMP/back.img"
}

# requests NAME: the log's requests as "Type id offset count fast" lines,
# then the answers as "ret Type id return" lines.
requests () {
    python3 - "$TMP/$1.log" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    m = re.search(r"connection=(\d+) (Write|Zero|Trim|Flush) id=(\d+)"
                  r"(?: offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+))?"
                  r"(?:.* fast=(\d))?", line)
    if m:
        print("req", m.group(2), m.group(1) + "." + m.group(3),
              int(m.group(4) or "0", 16), int(m.group(5) or "0", 16),
              m.group(6) or "-")
        continue
    m = re.search(r"connection=(\d+) \.\.\.(Write|Zero|Trim|Flush) "
                  r"id=(\d+) return=(-?\d+)(?: error=(\w+))?", line)
    if m:
        print("ret", m.group(2), m.group(1) + "." + m.group(3),
              m.group(4), m.group(5) or "-")
PY
}

# case_run NAME "COPY-OPTIONS" [FILTER-ARGS...]: a copy with COPY-OPTIONS into
# a fresh logged server, read back and compared; its requests in
# $TMP/NAME.req.
case_run () {
    local name=$1 opts=$2
    shift 2
    logged "$name" "$@"
    # shellcheck disable=SC2086
    "$NBDFLOW" copy $opts "$TMP/src.img" "$(uri "$TMP/$name.sock")" ||
        fail "$name: copy $opts into nbdkit memory failed"
    readback "$name"
    requests "$name" >"$TMP/$name.req"
}

# 1. Default: zeroes as fast WRITE_ZEROES, then one FLUSH per connection,
#    each sent after every write and zero was answered.
case_run plain ""
python3 - "$TMP/plain.req" <<'PY' || fail "default copy: $(cat "$TMP/plain.req")"
import sys
lines = [l.split() for l in open(sys.argv[1])]
flushes = [i for i, l in enumerate(lines) if l[:2] == ["req", "Flush"]]
last_ret = max(i for i, l in enumerate(lines)
               if l[0] == "ret" and l[1] in ("Write", "Zero"))
zeros = [l for l in lines if l[:2] == ["req", "Zero"]]
assert flushes, "no FLUSH"
assert min(flushes) > last_ret, "a FLUSH went out before a write's answer"
assert zeros and all(l[5] == "1" for l in zeros), "zeroing without FAST_ZERO"
assert not any(l[:2] == ["req", "Write"] and i > min(flushes)
               for i, l in enumerate(lines)), "a write after the FLUSH"
print("%d flush(es), %d fast zero(es)" % (len(flushes), len(zeros)))
PY

# 2. --no-flush: the same copy without any FLUSH.
case_run noflush --no-flush
! grep -q "^req Flush" "$TMP/noflush.req" || fail "--no-flush sent a FLUSH"
grep -q "^req Write" "$TMP/noflush.req" || fail "--no-flush: no write logged"

# 3. A server that advertises fast zeroing but refuses it (ENOTSUP): each
#    refused range is zeroed again without FAST_ZERO, and the copy
#    succeeds with the holes zero.
case_run slow "" fastzeromode=slow
python3 - "$TMP/slow.req" <<'PY' || fail "fast zero fallback: $(cat "$TMP/slow.req")"
import sys
lines = [l.split() for l in open(sys.argv[1])]
req = {l[2]: l for l in lines if l[0] == "req"}
ret = {l[2]: l for l in lines if l[0] == "ret"}
refused = [req[k] for k, r in ret.items()
           if r[1] == "Zero" and r[4] == "ENOTSUP"]
assert refused, "no fast zero was refused"
# Every byte of the image's holes was zeroed by a plain request that
# succeeded: 1-3, 4-6 and 7-8 MiB.
done = sorted((int(req[k][3]), int(req[k][3]) + int(req[k][4]))
              for k, r in ret.items()
              if r[1] == "Zero" and r[3] == "0" and req[k][5] == "0")
M = 1 << 20
for lo, hi in ((1 * M, 3 * M), (4 * M, 6 * M), (7 * M, 8 * M)):
    pos = lo
    for a, b in done:
        if a <= pos < b:
            pos = b
    assert pos >= hi, "hole %d-%d not zeroed after the refusal" % (lo, hi)
print("%d refused, %d plain zero(es)" % (len(refused), len(done)))
PY

# 4. --destination-is-zero: neither zeroing nor trimming.
case_run iszero --destination-is-zero
! grep -qE "^req (Zero|Trim)" "$TMP/iszero.req" ||
    fail "--destination-is-zero zeroed: $(grep -E '^req (Zero|Trim)' "$TMP/iszero.req")"
grep -q "^req Write" "$TMP/iszero.req" || fail "--destination-is-zero: no write"
echo "PASS"
