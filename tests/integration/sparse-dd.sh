#!/bin/bash
# sparse-dd.sh: nbdflow sparse_dd takes xapi's sparse_dd command line: the
# -machine progress frames parsed back by the reference (xapiref.py), to a
# file:// path, to our serve over NBD (-dest-proto nbd -nbd-export), over
# an http:// URL that -encryption-mode never made of an https:// one, as
# Chunked with -prezeroed; exit status 5 when the NBD server answers a
# write with an error (nbdkit's error filter), 1 for a -size below the
# source's (a larger one is the destination's, and copies), 2 for
# usage errors; -size in OCaml's Int64 forms (0x...); -base sends only
# the blocks that differ from the base; the configuration file's keys over
# the options; -nice and -ionice_class set every thread's priorities.
# Every copy verified.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
REF=$(dirname "$0")/xapiref.py
make_sparse "$TMP/src.img" 16 "0:2 9:1 15:1"
size=$(stat -c %s "$TMP/src.img")

"$NBDFLOW" sparse_dd -machine -src "$TMP/src.img" -dest "file://$TMP/out.img" \
    -size "$size" >"$TMP/progress" || fail "sparse_dd to a file:// path failed"
same "$TMP/src.img" "$TMP/out.img"
pcts=$(python3 "$REF" progress <"$TMP/progress") ||
    fail "progress frames: $pcts"
[ "${pcts##* }" = 100 ] || fail "progress did not end at 100: $pcts"
note "ok: progress frames: $pcts"

truncate -s "$size" "$TMP/exp.img"
HPORT=$(free_port)
serve_tcp --http "127.0.0.1:$HPORT" "disk=$TMP/exp.img"
"$NBDFLOW" sparse_dd -machine -src "$TMP/src.img" -dest "$URI" \
    -size "$size" -dest-proto nbd -nbd-export disk -good-ciphersuites \
    ECDHE-RSA-AES256-GCM-SHA384 -ssl-legacy >"$TMP/progress" ||
    fail "sparse_dd -dest-proto nbd -nbd-export disk failed"
same "$TMP/src.img" "$TMP/exp.img"
truncate -s 0 "$TMP/exp.img"
truncate -s "$size" "$TMP/exp.img"
check "sparse_dd -encryption-mode never, -prezeroed, Chunked over http" \
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" \
    -dest "https://127.0.0.1:$HPORT/import_raw_vdi?vdi=disk&format=raw" \
    -size "$size" -prezeroed -dest-proto chunked -encryption-mode never
wait_for grep -q 'chunked into "disk".*flushed' "$SERVER_LOG"
same "$TMP/src.img" "$TMP/exp.img"
serve_stop

# -base: the destination holds BASE; only the 1 MiB blocks that differ
# travel (one turned to zeroes, one rewritten), counted by the reference
# receiver.
make_random "$TMP/base.img" 8
cp "$TMP/base.img" "$TMP/new.img"
dd if=/dev/zero of="$TMP/new.img" bs=1M seek=2 count=1 conv=notrunc status=none
dd if=/dev/urandom of="$TMP/new.img" bs=4096 seek=1500 count=1 conv=notrunc status=none
cp "$TMP/base.img" "$TMP/held.img"
RPORT=$(free_port)
python3 "$REF" recv-chunked "$RPORT" "$TMP/held.img" "$TMP/ready" >"$TMP/ref.out" 2>&1 &
rpid=$!
wait_for test -s "$TMP/ready"
check "sparse_dd -base over Chunked" \
    "$NBDFLOW" sparse_dd -src "$TMP/new.img" -base "$TMP/base.img" \
    -dest "chunked+tcp://127.0.0.1:$RPORT" -size $((8 << 20)) -dest-proto chunked
wait "$rpid" || fail "reference receiver: $(cat "$TMP/ref.out")"
same "$TMP/new.img" "$TMP/held.img"
grep -q " $((2 << 20)) bytes\$" "$TMP/ref.out" ||
    fail "-base sent other than the two changed blocks: $(cat "$TMP/ref.out")"
note "ok: -base sent 2 MiB of 8"

# -base by the VHD chain: BASE is the parent in SRC's chain, so the 2 MiB
# blocks the child allocates (0, by a few sectors, and 2) are the
# difference, found from its BAT: BASE is not compared.
GEN=$(dirname "$0")/vhdgen.py
python3 "$GEN" make "$TMP/p.vhd" --type dynamic --size 16M --data all --seed 3
python3 "$GEN" make "$TMP/c.vhd" --type diff --parent "$TMP/p.vhd" \
    --data "block:2 sect:100-140" --seed 4
python3 "$GEN" read "$TMP/c.vhd" "$TMP/c.raw"
python3 "$GEN" read "$TMP/p.vhd" "$TMP/pheld.img"
cmp -s "$TMP/c.raw" "$TMP/pheld.img" && fail "the child reads as its parent"
RPORT=$(free_port)
rm -f "$TMP/ready"
python3 "$REF" recv-chunked "$RPORT" "$TMP/pheld.img" "$TMP/ready" >"$TMP/ref.out" 2>&1 &
rpid=$!
wait_for test -s "$TMP/ready"
check "sparse_dd -base, the base a parent in the source's VHD chain" \
    "$NBDFLOW" sparse_dd -src "vhd:$TMP/c.vhd" -base "$TMP/p.vhd" \
    -dest "chunked+tcp://127.0.0.1:$RPORT" -size $((16 << 20)) \
    -dest-proto chunked 2>"$TMP/err"
wait "$rpid" || fail "reference receiver: $(cat "$TMP/ref.out")"
same "$TMP/c.raw" "$TMP/pheld.img"
grep -q "4194304 bytes differ (by the image chain" "$TMP/err" ||
    fail "the difference was not taken from the chain: $(cat "$TMP/err")"
grep -q " $((4 << 20)) bytes\$" "$TMP/ref.out" ||
    fail "-base by the chain sent other than blocks 0 and 2: $(cat "$TMP/ref.out")"
note "ok: -base by the VHD chain sent 4 MiB of 16"

rc=0
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/x.img" -size 4096 \
    2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -qF "more than the 4096 DESTINATION holds (--dst-size, sparse_dd's -size)" "$TMP/err" ||
    fail "a -size below the source's: status $rc: $(cat "$TMP/err")"
[ ! -e "$TMP/x.img" ] || fail "a -size below the source's: DEST was made"
# -size is the destination's size (xapi passes the remote VDI's, which
# may be larger than the source, as xapi's sparse_dd allows): a file DEST
# has that size, the source's bytes first, and what lay beyond them in a
# file already that size stays.
big=$((size + (4 << 20)))
check "a -size above the source's" "$NBDFLOW" sparse_dd -src "$TMP/src.img" \
    -dest "$TMP/big.img" -size "$big"
[ "$(stat -c %s "$TMP/big.img")" = "$big" ] ||
    fail "DEST is $(stat -c %s "$TMP/big.img") bytes, not -size $big"
cmp -n "$size" "$TMP/src.img" "$TMP/big.img" || fail "DEST's first $size bytes differ"
cmp -i "$size:0" -n $((4 << 20)) "$TMP/big.img" /dev/zero || fail "DEST's tail is not zeroes"
head -c "$big" /dev/urandom >"$TMP/big.img"
tail -c $((4 << 20)) "$TMP/big.img" >"$TMP/tail.want"
check "a -size above the source's, into a file of that size" \
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/big.img" -size "$big"
cmp -n "$size" "$TMP/src.img" "$TMP/big.img" || fail "DEST's first $size bytes differ"
tail -c $((4 << 20)) "$TMP/big.img" | cmp - "$TMP/tail.want" ||
    fail "the bytes beyond the source were not left as they were"
note "ok: -size $big: DEST is that size, the source first, the rest kept"
rm -f "$TMP/big.img"
# From standard input the size shows only at the end: input beyond -size
# is a failure, not a copy of its first bytes.
rc=0
head -c $((size + 4096)) /dev/urandom | "$NBDFLOW" copy --dst-size "$size" - "$TMP/pipe.img" \
    2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -q "standard input is longer than" "$TMP/err" ||
    fail "input beyond --dst-size: status $rc: $(cat "$TMP/err")"
head -c "$size" "$TMP/src.img" | "$NBDFLOW" copy --dst-size "$big" - "$TMP/pipe.img" ||
    fail "a pipe into --dst-size above its length"
cmp -n "$size" "$TMP/src.img" "$TMP/pipe.img" && [ "$(stat -c %s "$TMP/pipe.img")" = "$big" ] ||
    fail "a pipe into --dst-size $big: $(stat -c %s "$TMP/pipe.img") bytes"
note "ok: --dst-size from a pipe: longer input fails, shorter fills the start"
rc=0
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -size 1 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] || fail "no -dest: status $rc: $(cat "$TMP/err")"
rc=0
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/x.img" -size 1 \
    -frobnicate 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] || fail "unknown option: status $rc: $(cat "$TMP/err")"

# A wrong -size with -base is refused before the two are compared.
rc=0
"$NBDFLOW" sparse_dd -src "$TMP/new.img" -base "$TMP/base.img" \
    -dest "$TMP/x.img" -size 4096 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -qF "more than the 4096 DESTINATION holds" "$TMP/err" ||
    fail "a wrong -size with -base: status $rc: $(cat "$TMP/err")"
grep -q "bytes differ" "$TMP/err" &&
    fail "SRC and BASE were compared before -size was checked"
# A BASE of another size: status 1 and one line. A source of many
# extents has its first extents lookup still running on a worker when the
# refusal comes; its endpoint used to be freed under it, which the
# sanitizer run saw in about one try in five, so it is tried 8 times.
make_striped "$TMP/big.img" 256 65536
cp "$TMP/base.img" "$TMP/x.img" # a DST that can hold BASE
for i in 1 2 3 4 5 6 7 8; do
    rc=0
    "$NBDFLOW" sparse_dd -src "$TMP/big.img" -base "$TMP/base.img" \
        -dest "$TMP/x.img" -size 256M 2>"$TMP/err" || rc=$?
    [ "$rc" = 1 ] && grep -qF "the base's size differs from the source's" "$TMP/err" ||
        fail "a BASE of another size: status $rc: $(cat "$TMP/err")"
done
note "ok: a BASE of another size: $(cat "$TMP/err")"

# file:///PATH is the path as it is (escapes decoded, any case, localhost
# allowed), never one of copy's prefixes; other forms are usage errors.
mkdir -p "$TMP/d"
check "sparse_dd -dest FILE://localhost/.../null:%20x" \
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" \
    -dest "FILE://localhost$TMP/d/null:%20x" -size "$size"
same "$TMP/src.img" "$TMP/d/null: x"
for d in "file://-" "file://elsewhere$TMP/d/y" "file://d/y" "file://$TMP/%zz" \
    "file://$TMP/d/q?x=1" "file://$TMP/d/f#g" "file:y" "File:$TMP/d/y"; do
    rc=0
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$d" -size "$size" \
        2>"$TMP/err" || rc=$?
    [ "$rc" = 2 ] || fail "-dest $d: status $rc: $(cat "$TMP/err")"
done
[ ! -e "file:y" ] && [ ! -e "$TMP/d/y" ] || fail "a refused -dest made a file"
rc=0
"$NBDFLOW" sparse_dd -machine -src "$TMP/src.img" -dest - -size "$size" \
    >"$TMP/o" 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && [ ! -s "$TMP/o" ] ||
    fail "-machine -dest -: status $rc, $(stat -c %s "$TMP/o") bytes on stdout"
rc=0
"$NBDFLOW" sparse_dd -machine -src "$TMP/src.img" -dest file:///dev/stdout \
    -size "$size" >"$TMP/o" 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && [ ! -s "$TMP/o" ] ||
    fail "-machine -dest file:///dev/stdout: status $rc: $(cat "$TMP/err")"
note "ok: file:// forms and -machine -dest - checked"

# An option given twice is refused, not the last one taken; a bad -size
# is quoted.
rc=0
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -src zero:1M -dest "$TMP/tw.img" \
    -size "$size" 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "-src given twice" "$TMP/err" ||
    fail "-src twice: status $rc: $(cat "$TMP/err")"
[ ! -e "$TMP/tw.img" ] || fail "-src twice: wrote the destination"
rc=0
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/tw.img" -size 1.5M \
    2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "-size: a number of bytes, not '1.5M'" "$TMP/err" ||
    fail "-size 1.5M: status $rc: $(cat "$TMP/err")"
note "ok: twice and a bad -size refused"
# -size as xapi's sparse_dd reads it, OCaml's Int64.of_string: 0x, 0o, 0b
# and 0u forms, '_' after a digit. A negative one (0xffffffffffffffff is
# -1 there) or one past 2^63 - 1 is refused, nothing made.
for s in 0x1000000 0X100_0000 0o100000000 0b1_0000_0000_0000_0000_0000_0000 \
    0u16777216 +16_777_216; do
    rm -f "$TMP/hx.img"
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/hx.img" -size "$s" \
        2>"$TMP/err" || fail "-size $s: $(cat "$TMP/err")"
    [ "$(stat -c %s "$TMP/hx.img")" = "$size" ] ||
        fail "-size $s: DEST is $(stat -c %s "$TMP/hx.img") bytes, not $size"
done
same "$TMP/src.img" "$TMP/hx.img"
rm -f "$TMP/hx.img"
for s in -4096 0xffffffffffffffff -0x1 0x8000000000000000 \
    9223372036854775808 0x1_0000_0000_0000_0000 0b -9223372036854775809 \
    -0x1_0000_0000_0000_0000; do
    case $s in
        0b) want="-size: a number of bytes, not '0b'" ;;
        9*|0x1_*) want="-size '$s' is more than 2^63 - 1 bytes" ;;
        -9*|-0x1_*) want="-size '$s' is negative, and out of Int64's range" ;;
        *) want="-size '$s' is negative" ;;
    esac
    rc=0
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/hx.img" -size "$s" \
        2>"$TMP/err" || rc=$?
    [ "$rc" = 2 ] && grep -qF -- "$want" "$TMP/err" ||
        fail "-size $s: status $rc: $(cat "$TMP/err")"
    [ ! -e "$TMP/hx.img" ] || fail "-size $s: DEST was made"
done
grep -qF "(-1 as xapi's sparse_dd reads it)" <(
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/hx.img" \
        -size 0xffffffffffffffff 2>&1) || fail "-size 0xff..ff: not said to be -1"
note "ok: -size in OCaml's forms taken, negative and too large ones refused"

# -progress: the percentage on stderr, though it is not a terminal.
check "sparse_dd -progress" "$NBDFLOW" sparse_dd -progress -src "$TMP/src.img" \
    -dest "$TMP/p.img" -size "$size" 2>"$TMP/err"
same "$TMP/src.img" "$TMP/p.img"
grep -q "100%" "$TMP/err" || fail "-progress showed no 100%: $(cat "$TMP/err")"
# -machine progress that cannot be written says why (it said EIO).
rc=0
{ "$NBDFLOW" sparse_dd -machine -src random:8M -dest "$TMP/pm.img" -size 8M \
    2>"$TMP/err" || echo $? >"$TMP/rc"; } >/dev/full
[ "$(cat "$TMP/rc" 2>/dev/null)" = 1 ] || fail "-machine to /dev/full: not status 1"
grep -q "writing progress to stdout: No space left on device" "$TMP/err" ||
    fail "-machine to /dev/full: $(cat "$TMP/err")"
# -machine after a failure: as in xapi's sparse_dd, the frames stop
# without the end header, the error on stderr (status 5 below keeps it).
# The source, a pipe, holds its bytes back until a frame is out: the
# stream that stops must be one that had progress, not an empty one.
rc=0
rm -f "$TMP/fprogress"
{ wait_for test -s "$TMP/fprogress" >&2; head -c 8M /dev/urandom; } |
    "$NBDFLOW" sparse_dd -machine -src - -dest /dev/full -size 8M \
    >"$TMP/fprogress" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -q "^nbdflow sparse_dd: error: write to /dev/full" "$TMP/err" ||
    fail "-machine into /dev/full: status $rc: $(cat "$TMP/err")"
if python3 "$REF" progress <"$TMP/fprogress" >"$TMP/ref.pcts" 2>"$TMP/ref.out"; then
    fail "-machine into /dev/full: the failed copy's frames end with the end header"
fi
grep -q "progress stream without its end header" "$TMP/ref.out" ||
    fail "-machine into /dev/full: $(cat "$TMP/ref.out")"
grep -Eq '^[0-9]' "$TMP/ref.pcts" ||
    fail "-machine into /dev/full: no Progress frame before the stream stopped"
note "ok: -machine: a failed copy's progress ends without the end header"
# A failure ends the percentage's line before its own: the error starts a
# line of its own.
rc=0
"$NBDFLOW" sparse_dd -progress -src random:8M -dest /dev/full -size 8M \
    2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] || fail "-progress into /dev/full: status $rc"
grep -q "^nbdflow sparse_dd: error: write to /dev/full" "$TMP/err" ||
    fail "-progress: the error does not start a line: $(od -c "$TMP/err" | head -3)"

# -nbd-export into an NBD URI that names no export picks the export, a
# name of 300 bytes and more passed whole; a URI naming another export is
# a usage error.
long=$(printf 'e%.0s' $(seq 310))
truncate -s "$size" "$TMP/ea.img" "$TMP/eb.img"
serve_tcp "a=$TMP/ea.img" "$long=$TMP/eb.img"
check "sparse_dd -nbd-export (310 bytes) into an NBD URI" \
    "$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$URI" \
    -nbd-export "$long" -size "$size"
same "$TMP/src.img" "$TMP/eb.img"
[ "$(stat -c %b "$TMP/ea.img")" = 0 ] || fail "export a was written"
# ... and --verify reads back the same export (it once read the first).
truncate -s 0 "$TMP/eb.img"
truncate -s "$size" "$TMP/eb.img"
check "copy --verify --nbd-export into an NBD URI" \
    "$NBDFLOW" copy --verify --nbd-export "$long" "$TMP/src.img" "$URI"
same "$TMP/src.img" "$TMP/eb.img"
rc=0
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$URI/a" -nbd-export "$long" \
    -size "$size" 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && grep -q 'names export "a" and --nbd-export' "$TMP/err" ||
    fail "two export names: status $rc: $(cat "$TMP/err")"
serve_stop

# xapi's sparse_dd configuration ($NBDFLOW_SPARSE_DD_CONF in place of
# /etc/sparse_dd.conf; lib.sh sets it empty, for none), read after the
# command line: each key over its option, then the files of FILE.d (or of
# the directory its config-dir names) in name order, over the file's;
# comments, blanks and quotes as xapi's service library reads them.
conf=$TMP/sdd.conf
mkdir -p "$conf.d" "$TMP/frags"
cat >"$conf" <<'EOF'
# as a host would write it
  size = 0x200_0000   # over -size
nice = "45"
frobnicate = 1
unbuffered = true
experimental-reads-bypass-tapdisk = false
experimental-writes-bypass-tapdisk = true
machine=true
EOF
printf 'nice = 40\n' >"$conf.d/10-first"
# A binary file left in FILE.d (an editor's swap file): its lines with
# a NUL byte are skipped, said in one line, and the copy goes on.
printf 'b0\0\377\nsize = 0b\0\n' >"$conf.d/15-swap"
printf "nice = '50'\n" >"$conf.d/20-last"
rm -f "$TMP/cf.img"
NBDFLOW_SPARSE_DD_CONF=$conf "$NBDFLOW" sparse_dd -src "$TMP/src.img" \
    -dest "$TMP/cf.img" -size "$size" -nice 3 >"$TMP/progress" 2>"$TMP/err" ||
    fail "sparse_dd with a configuration: $(cat "$TMP/err")"
[ "$(stat -c %s "$TMP/cf.img")" = $((0x2000000)) ] ||
    fail "the configuration's size = 0x200_0000 was not taken over -size: $(stat -c %s "$TMP/cf.img") bytes"
cmp -n "$size" "$TMP/src.img" "$TMP/cf.img" || fail "DEST's first $size bytes differ"
grep -qF "$conf.d/20-last:1: nice 50 is out of range (-20 to 19): using 19" "$TMP/err" &&
    ! grep -Eq "nice (40|45) " "$TMP/err" ||
    fail "nice: not FILE.d's last over the file's over -nice: $(cat "$TMP/err")"
[ "$(grep -c "15-swap" "$TMP/err")" = 1 ] &&
    grep -qF "$conf.d/15-swap:1: a NUL byte: line skipped (and 1 more such line)" "$TMP/err" ||
    fail "lines with a NUL byte not said: $(cat "$TMP/err")"
grep -qF "$conf:5: unbuffered = true is not honoured" "$TMP/err" &&
    grep -qF "$conf:7: experimental-writes-bypass-tapdisk = true is not honoured" "$TMP/err" ||
    fail "keys nbdflow does not honour were not said: $(cat "$TMP/err")"
! grep -Eq "frobnicate|reads-bypass" "$TMP/err" ||
    fail "an unknown key or one set to false was said: $(cat "$TMP/err")"
pcts=$(python3 "$REF" progress <"$TMP/progress") && [ "${pcts##* }" = 100 ] ||
    fail "machine=true gave no progress frames: $pcts"
note "ok: the configuration's keys over the command line's options"
# config-dir names the directory read after the file; machine = false
# clears -machine.
printf 'machine = false\nconfig-dir = %s\n' "$TMP/frags" >"$conf"
printf 'ionice_class = 9\n' >"$TMP/frags/a"
NBDFLOW_SPARSE_DD_CONF=$conf "$NBDFLOW" sparse_dd -machine -src "$TMP/src.img" \
    -dest "$TMP/cf.img" -size "$size" >"$TMP/progress" 2>"$TMP/err" ||
    fail "sparse_dd with config-dir: $(cat "$TMP/err")"
[ ! -s "$TMP/progress" ] || fail "machine = false did not clear -machine"
grep -qF "$TMP/frags/a:1: ignoring ionice_class 9: the classes are 0 to 3" "$TMP/err" &&
    ! grep -q "nice 50" "$TMP/err" ||
    fail "config-dir: not the directory it names that was read: $(cat "$TMP/err")"
# A value xapi's sparse_dd could not take fails the copy (status 1)
# before anything is written, saying where; a missing file is none.
rm -rf "$conf.d"
for line in "unbuffered = yes" "prezeroed = 1" "size = -0x1" "size = 1.5M" \
    "encryption-mode = sometimes"; do
    printf '# first\n%s\n' "$line" >"$conf"
    rc=0
    NBDFLOW_SPARSE_DD_CONF=$conf "$NBDFLOW" sparse_dd -src "$TMP/src.img" \
        -dest "$TMP/bad.img" -size "$size" 2>"$TMP/err" || rc=$?
    [ "$rc" = 1 ] && grep -qF "$conf:2: ${line%% *}" "$TMP/err" ||
        fail "'$line' in the configuration: status $rc: $(cat "$TMP/err")"
    [ ! -e "$TMP/bad.img" ] || fail "'$line' in the configuration: DEST was made"
done
rc=0
NBDFLOW_SPARSE_DD_CONF=$TMP "$NBDFLOW" sparse_dd -src "$TMP/src.img" \
    -dest "$TMP/bad.img" -size "$size" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -qF "configuration $TMP: Is a directory" "$TMP/err" ||
    fail "a directory as the configuration: status $rc: $(cat "$TMP/err")"
rm -f "$TMP/cf.img"
check "sparse_dd without its configuration file" env \
    NBDFLOW_SPARSE_DD_CONF="$TMP/none.conf" "$NBDFLOW" sparse_dd \
    -src "$TMP/src.img" -dest "$TMP/cf.img" -size "$size"
same "$TMP/src.img" "$TMP/cf.img"
# An empty FILE and an empty FILE.d are none either (nothing to sort).
: >"$conf"
mkdir "$conf.d"
rm -f "$TMP/cf.img"
check "sparse_dd with an empty FILE and FILE.d" env \
    NBDFLOW_SPARSE_DD_CONF="$conf" "$NBDFLOW" sparse_dd \
    -src "$TMP/src.img" -dest "$TMP/cf.img" -size "$size"
same "$TMP/src.img" "$TMP/cf.img"
note "ok: the configuration's bad values, a directory, no file, empty ones"
# xapi's sparse_dd takes -config and -config-dir (its service library's
# options); here they are unknown: NBDFLOW_SPARSE_DD_CONF names the file.
for o in -config -config-dir; do
    rc=0
    "$NBDFLOW" sparse_dd "$o" "$conf" -src "$TMP/src.img" -dest "$TMP/bad.img" \
        -size "$size" 2>"$TMP/err" || rc=$?
    [ "$rc" = 2 ] && grep -qF "unknown option '$o'" "$TMP/err" ||
        fail "$o: status $rc: $(cat "$TMP/err")"
done

need nbdkit
# As xapi's sparse_dd: a value that is no number is ignored, said, and
# the copy goes on; an -unbuffered that is no boolean is a usage error.
rm -f "$TMP/pr.img"
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/pr.img" -size "$size" \
    -nice x -ionice_class 9 -ionice_class_data 99999999999 2>"$TMP/err" ||
    fail "-nice x: $(cat "$TMP/err")"
grep -q "ignoring -nice 'x'" "$TMP/err" && grep -q "ignoring -ionice_class 9" "$TMP/err" &&
    ! grep -q "ionice_class_data" "$TMP/err" ||
    fail "bad -nice/-ionice_class not said: $(cat "$TMP/err")"
same "$TMP/src.img" "$TMP/pr.img"
# OCaml's int is 63 bits: 2^62 is no number there, 2^62 - 1 is clipped,
# and -0x4000000000000000 is its min_int (clipped to -20).
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/pr.img" -size "$size" \
    -nice 4611686018427387904 -ionice_class 0b1_0 -ionice_class_data \
    4611686018427387903 2>"$TMP/err" || fail "63-bit values: $(cat "$TMP/err")"
grep -q "ignoring -nice '4611686018427387904': not a number" "$TMP/err" &&
    grep -q "ionice_class_data 4611686018427387903 is out of range (0 to 7): using 7" "$TMP/err" ||
    fail "63-bit values: $(cat "$TMP/err")"
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/pr.img" -size "$size" \
    -nice -0x4000000000000000 2>"$TMP/err" || fail "min_int: $(cat "$TMP/err")"
grep -q "nice -0x4000000000000000 is out of range (-20 to 19): using -20" "$TMP/err" ||
    fail "-nice -0x4000000000000000: $(cat "$TMP/err")"
rc=0
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/pr.img" -size "$size" \
    -unbuffered yes 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] || fail "-unbuffered yes: status $rc"
rc=0
"$NBDFLOW" sparse_dd -src "$TMP/src.img" -dest "$TMP/pr.img" -size "$size" \
    -experimental-writes-bypass-tapdisk 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && grep -q "not supported" "$TMP/err" ||
    fail "-experimental-writes-bypass-tapdisk: status $rc: $(cat "$TMP/err")"
note "ok: bad priorities ignored and said; -unbuffered yes and tapdisk bypass refused"
# An error reply while -base compares: status 5, as in the copy.
kit "$TMP/bad.sock" --filter=error memory $((8 << 20)) error-pread=EIO \
    error-pread-rate=1
rc=0
"$NBDFLOW" sparse_dd -src "$(uri "$TMP/bad.sock")" -base "$TMP/base.img" \
    -dest "$TMP/x.img" -size $((8 << 20)) 2>"$TMP/err" || rc=$?
[ "$rc" = 5 ] || fail "an NBD error reply with -base: status $rc, not 5: $(cat "$TMP/err")"
note "ok: status 5 with -base: $(head -n1 "$TMP/err")"
kit "$TMP/kit.sock" --filter=error memory "$size" error-pwrite=EIO \
    error-pwrite-rate=1
rc=0
"$NBDFLOW" sparse_dd -machine -src "$TMP/src.img" -dest "$(uri "$TMP/kit.sock")" \
    -size "$size" >"$TMP/progress" 2>"$TMP/err" || rc=$?
[ "$rc" = 5 ] || fail "an NBD error reply: status $rc, not 5: $(cat "$TMP/err")"
grep -q "Input/output error" "$TMP/err" || fail "no errno named: $(cat "$TMP/err")"
# Status 5 closes the progress with the end header: xapi reads the exit
# status only after it (its frame reader fails at a stream without one).
python3 "$REF" progress <"$TMP/progress" >/dev/null ||
    fail "the progress stream of a copy ending with status 5 is not closed"
note "ok: status 5 on an NBD error: $(head -n1 "$TMP/err")"

if ! command -v ionice >/dev/null; then
    note "-nice and -ionice_class not checked: ionice is not installed (Debian package: util-linux)"
else
    # -nice and -ionice_class reach every thread of the copy: read from /proc
    # while a slow source (nbdkit's delay filter) holds the copy open. 19:
    # lowering a nice value takes a privilege the suite may lack.
    if [ "$(awk '{print $19}' /proc/self/stat)" = 19 ]; then
        note "-nice not checked: the suite runs at nice 19 already"
        want_nice=any
    else
        want_nice=19
    fi
    rm -f "$TMP/pr.img"
    kit "$TMP/slow.sock" --filter=delay file "$TMP/src.img" rdelay=1
    "$NBDFLOW" sparse_dd -src "$(uri "$TMP/slow.sock")" -dest "$TMP/pr.img" \
        -size "$size" -nice 19 -ionice_class 2 -ionice_class_data 6 \
        -unbuffered true 2>"$TMP/err" &
    sdd=$!
    SERVER_PIDS+=("$sdd") # killed by the cleanup should a check fail
    wait_for sh -c "[ \$(ls /proc/$sdd/task | wc -l) -ge 3 ]"
    tasks=0
    for t in /proc/$sdd/task/*; do
        st=$(cat "$t/stat" 2>/dev/null) || continue # ended meanwhile
        nice=$(echo "${st##*) }" | awk '{print $17}')
        io=$(ionice -p "${t##*/}" 2>/dev/null) || continue
        { [ "$want_nice" = any ] || [ "$nice" = "$want_nice" ]; } &&
            [ "$io" = "best-effort: prio 6" ] ||
            fail "thread ${t##*/} ($(cat "$t/comm")): nice $nice, I/O '$io'"
        tasks=$((tasks + 1))
    done
    [ "$tasks" -ge 2 ] || fail "only $tasks threads seen"
    wait "$sdd" || fail "sparse_dd -nice -ionice_class: $(cat "$TMP/err")"
    forget_pid "$sdd"
    same "$TMP/src.img" "$TMP/pr.img"
    note "ok: -nice 19 -ionice_class 2 -ionice_class_data 6 on $tasks threads"
fi
