#!/bin/bash
# copy-retry-errors.sh: --retry-errors (with --retry) sends a request the
# server failed with EIO, ENOMEM or ENOSPC again, each up to N times:
# nbdkit's error filter failing a share of the writes, then of the
# reads, and the copy completes and verifies, with a warning per retried
# request (the first 16, then one line saying the rest are not logged)
# and the resent bytes counted. Errors that persist still fail
# the copy with one line that says how often the request went; an error
# the option does not cover (EINVAL) fails at once; without --retry the
# option is a usage error.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need python3
tmpdir_make

make_random "$TMP/src.img" 16
json () { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }

# Writes: 25% fail with EIO. 512 requests of 32 KiB: some fail, surely.
kit "$TMP/w.sock" --filter=error memory 16M error=EIO error-pwrite-rate=25%
check "a copy whose writes fail now and then completes with --retry-errors" \
    "$NBDFLOW" copy --json --request-size 32K --retry 20,0.01 --retry-errors \
    "$TMP/src.img" "$(uri "$TMP/w.sock")" >"$TMP/w.json" 2>"$TMP/w.err"
grep -q 'write at offset [0-9]* length 32768 failed: .*sending it again' \
    "$TMP/w.err" || { cat "$TMP/w.err" >&2; fail "no warning for a resent write"; }
resent=$(json "$TMP/w.json" bytes_resent)
[ "$resent" -gt 0 ] || fail "bytes_resent is $resent after resent writes"
warned=$(grep -c 'sending it again' "$TMP/w.err" || true)
note "writes sent again: $warned warned of, $resent bytes"
# About 128 of the 512 writes fail: 16 warnings, then one line.
[ "$warned" = 16 ] || fail "$warned warnings of resent requests, not 16"
[ "$(grep -c 'more requests failed and are sent again; not logged one by one' \
    "$TMP/w.err")" = 1 ] || fail "no single line saying the rest are not logged"
"$NBDFLOW" copy "$(uri "$TMP/w.sock")" "$TMP/w.img"
same "$TMP/src.img" "$TMP/w.img"

# Reads: 25% fail with ENOMEM; the pattern plugin's content without the
# filter is the reference.
kit "$TMP/ref.sock" pattern 16M
"$NBDFLOW" copy "$(uri "$TMP/ref.sock")" "$TMP/ref.img"
kit "$TMP/r.sock" --filter=error pattern 16M error=ENOMEM error-pread-rate=25%
check "a copy whose reads fail now and then completes with --retry-errors" \
    "$NBDFLOW" copy --request-size 32K --retry 20,0.01 --retry-errors \
    "$(uri "$TMP/r.sock")" "$TMP/r.img" 2>"$TMP/r.err"
grep -q 'read at offset [0-9]* length 32768 failed: .*sending it again' \
    "$TMP/r.err" || { cat "$TMP/r.err" >&2; fail "no warning for a resent read"; }
same "$TMP/ref.img" "$TMP/r.img"

# ENOSPC on every write: each request goes 3 times, then the copy fails.
# Two requests, so that their warnings stay under the limit.
head -c 1M "$TMP/src.img" >"$TMP/small.img"
kit "$TMP/full.sock" --filter=error memory 16M error=ENOSPC error-pwrite-rate=100%
rc=0
"$NBDFLOW" copy --retry 2,0.01 --retry-errors "$TMP/small.img" \
    "$(uri "$TMP/full.sock")" >"$TMP/out" 2>"$TMP/all" || rc=$?
grep -q 'sending it again in .* (try 2 of 2' "$TMP/all" ||
    fail "no warning for the second try: $(cat "$TMP/all")"
grep -v 'sending it again' "$TMP/all" >"$TMP/err" || true
check_copy_failed "ENOSPC that persists" "$rc" "No space left on device"
grep -q 'No space left on device: sent 3 times (--retry-errors)' "$TMP/err" ||
    fail "the failure does not say how often the request was sent again"

# EINVAL is not the storage's trouble: no retry.
kit "$TMP/inval.sock" --filter=error memory 16M error=EINVAL error-pwrite-rate=100%
rc=0
"$NBDFLOW" copy --retry 5,0.01 --retry-errors "$TMP/src.img" \
    "$(uri "$TMP/inval.sock")" >"$TMP/out" 2>"$TMP/err" || rc=$?
check_copy_failed "EINVAL" "$rc" "Invalid argument"
! grep -q 'sending it again' "$TMP/err" || fail "EINVAL was sent again"

rc=0
"$NBDFLOW" copy --retry-errors "$TMP/src.img" null: 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] || fail "--retry-errors without --retry exits $rc, not 2"
grep -q 'give --retry too' "$TMP/err" || fail "no reason for the usage error"
echo "PASS: --retry-errors resends what the server failed, and only that"
