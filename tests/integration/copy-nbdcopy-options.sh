#!/bin/bash
# nbdcopy's options that a command line moved from nbdcopy to
# "nbdflow copy" brings along, each doing what nbdcopy's manual says:
# --no-extents reads a source whose map lies (nbdkit's extentlist filter
# calls it all hole), -S 0 writes zero blocks inside data instead of
# leaving holes, --progress=FD writes "N/100" lines ending at 100,
# --synchronous keeps one request in flight on one connection, -R and
# --queue-size bound the requests and bytes in flight per connection,
# --flush and -T are taken. Every copy is compared with its source.
. "$(dirname "$0")/lib.sh"
need nbdkit
tmpdir_make

# A source whose map says "all hole" while it holds data: an extent list
# with no entries covers nothing, and nbdkit reports the rest as holes.
make_sparse "$TMP/src.img" 16 "0:4 9:3"
: >"$TMP/nothing.list"
kit "$TMP/lie.sock" --filter=extentlist file "$TMP/src.img" \
    extentlist="$TMP/nothing.list"
lie=$(uri "$TMP/lie.sock")
"$NBDFLOW" info --map "$lie" >"$TMP/map" || fail "info --map of $lie"
grep -q 'hole' "$TMP/map" && ! grep -q 'data' "$TMP/map" ||
    fail "nbdkit's extentlist filter did not lie as expected: $(cat "$TMP/map")"

# Trusting the map copies zeroes: the test sees the lie ...
"$NBDFLOW" copy "$lie" "$TMP/trusted.img" || fail "copy trusting the map"
cmp -s "$TMP/src.img" "$TMP/trusted.img" &&
    fail "a copy that trusts an all-hole map still got the data"
note "ok: the map's lie reaches a copy that trusts it"
# ... and --no-extents reads through it; the copy stays sparse where the
# data reads as zeroes (zero detection is still on).
"$NBDFLOW" copy --no-extents "$lie" "$TMP/read.img" ||
    fail "copy --no-extents failed"
same "$TMP/src.img" "$TMP/read.img"
used=$(du -k "$TMP/read.img" | cut -f1)
[ "$used" -le 7300 ] || fail "--no-extents copy uses $used KiB, not ~7 MiB"
note "ok: --no-extents copy is sparse ($used KiB)"
# The same from a file into an NBD server (where a file's data could go
# out with sendfile, which looks at no byte): the zeroes are still found
# and go as zeroing, not as 9 MiB of WRITEs.
kit "$TMP/mem.sock" memory 16M
"$NBDFLOW" copy --json --no-extents "$TMP/src.img" "$(uri "$TMP/mem.sock")" \
    >"$TMP/ne.json" || fail "copy --no-extents file -> nbd"
python3 - "$TMP/ne.json" <<'PY' || fail "--no-extents file -> nbd: $(cat "$TMP/ne.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["bytes_copied"] == 7 << 20, d["bytes_copied"]
assert d["bytes_zeroed"] + d["bytes_skipped"] == 9 << 20, d
assert d["data_path"] == "buffer", d["data_path"]
PY
"$NBDFLOW" copy "$(uri "$TMP/mem.sock")" "$TMP/ne-back.img" || fail "read back"
same "$TMP/src.img" "$TMP/ne-back.img"
# Nor does --no-extents look the file's extents up at all: no SEEK_DATA
# or SEEK_HOLE on it, where a plain copy asks (a control for the check).
if can_strace; then
    for f in plain --no-extents; do
        rm -f "$TMP/ne-$f.img"
        traced -e trace=lseek -o "$TMP/lseek-$f.log" \
            "$NBDFLOW" copy ${f#plain} "$TMP/src.img" "$TMP/ne-$f.img" ||
            fail "copy $f under strace"
        same "$TMP/src.img" "$TMP/ne-$f.img"
    done
    n_plain=$(grep -c 'SEEK_DATA\|SEEK_HOLE' "$TMP/lseek-plain.log" || true)
    n_ne=$(grep -c 'SEEK_DATA\|SEEK_HOLE' "$TMP/lseek---no-extents.log" || true)
    [ "$n_plain" -gt 0 ] && [ "$n_ne" = 0 ] ||
        fail "extent lookups: $n_plain in a plain copy, $n_ne with --no-extents"
    note "ok: --no-extents looks up no extents ($n_plain lookups without it)"
else
    note "skipped the extent-lookup count: strace cannot trace here"
fi

# -S 0: a data range holding zero blocks (written as data, so the file
# has no hole there) is copied into a new file as it is, not made sparse.
make_random "$TMP/dense.img" 4
dd if=/dev/zero bs=1M count=4 status=none >>"$TMP/dense.img"
dd if=/dev/urandom bs=1M count=4 status=none >>"$TMP/dense.img"
src_kib=$(du -k "$TMP/dense.img" | cut -f1)
"$NBDFLOW" copy "$TMP/dense.img" "$TMP/sparse-out.img" || fail "copy"
"$NBDFLOW" copy -S 0 "$TMP/dense.img" "$TMP/dense-out.img" ||
    fail "copy -S 0"
"$NBDFLOW" copy --sparse=4k "$TMP/dense.img" "$TMP/sparse4k-out.img" ||
    fail "copy --sparse=4k"
same "$TMP/dense.img" "$TMP/sparse-out.img"
same "$TMP/dense.img" "$TMP/dense-out.img"
same "$TMP/dense.img" "$TMP/sparse4k-out.img"
a=$(du -k "$TMP/sparse-out.img" | cut -f1)
b=$(du -k "$TMP/dense-out.img" | cut -f1)
c=$(du -k "$TMP/sparse4k-out.img" | cut -f1)
[ "$a" -le 8300 ] && [ "$c" -le 8300 ] ||
    fail "zero detection left the zero blocks allocated ($a, $c KiB)"
[ "$b" -ge "$src_kib" ] ||
    fail "-S 0 made holes: $b KiB of the source's $src_kib KiB"
note "ok: -S 0 writes $b KiB, detection $a KiB (source $src_kib KiB)"
# Through an NBD destination too, reading into buffers (a file sent with
# sendfile is never looked at): the 4 MiB of zeroes go as a zeroing
# request, and with -S 0 as a WRITE.
kit "$TMP/log.sock" --filter=log memory 12M logfile="$TMP/kit-req.log"
zeroed () {
    "$NBDFLOW" copy --no-zero-copy --json "$@" "$TMP/dense.img" \
        "$(uri "$TMP/log.sock")" >"$TMP/z.json" || fail "copy $* into nbdkit"
    "$NBDFLOW" copy "$(uri "$TMP/log.sock")" "$TMP/back.img" ||
        fail "read back"
    same "$TMP/dense.img" "$TMP/back.img"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes_zeroed"])' \
        "$TMP/z.json"
}
z=$(zeroed)
[ "$z" = 4194304 ] || fail "the zero range was not detected ($z bytes zeroed)"
n=$(grep -c 'connection=[0-9]* Zero ' "$TMP/kit-req.log")
[ "$n" -ge 1 ] || fail "no zeroing request reached nbdkit"
: >"$TMP/kit-req.log"
z=$(zeroed -S 0)
[ "$z" = 0 ] || fail "-S 0 still zeroed $z bytes"
! grep -q 'connection=[0-9]* Zero ' "$TMP/kit-req.log" ||
    fail "-S 0 still sent a zeroing request: $(grep ' Zero ' "$TMP/kit-req.log" | head -1)"
note "ok: into nbdkit, 4 MiB zeroed by default and none with -S 0"

# --progress=FD: "N/100" lines, never going back, the last one 100/100.
"$NBDFLOW" copy --progress=3 "$TMP/src.img" "$TMP/p.img" 3>"$TMP/progress" ||
    fail "copy --progress=3"
same "$TMP/src.img" "$TMP/p.img"
python3 - "$TMP/progress" <<'PY' || fail "progress lines: $(tr '\n' ' ' <"$TMP/progress")"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines, "no lines"
vals = []
for l in lines:
    m = re.fullmatch(r"(\d+)/100", l)
    assert m, "bad line %r" % l
    vals.append(int(m.group(1)))
assert vals == sorted(vals), vals
assert vals[-1] == 100 and vals.count(100) == 1, vals
PY
note "ok: --progress=3 wrote $(wc -l <"$TMP/progress") lines ending at 100/100"
# 100/100 means done: a copy that fails after its last byte (standard
# input longer than the destination) never writes it.
head -c 17M /dev/urandom >"$TMP/long.img"
kit "$TMP/small.sock" memory 16M
rc=0
"$NBDFLOW" copy --progress=3 - "$(uri "$TMP/small.sock")" <"$TMP/long.img" \
    3>"$TMP/progress" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -q 'standard input is longer' "$TMP/err" ||
    fail "stdin longer than the export: exit $rc, $(cat "$TMP/err")"
! grep -q '^100/100$' "$TMP/progress" ||
    fail "a failed copy wrote 100/100: $(tr '\n' ' ' <"$TMP/progress")"
note "ok: the failed copy's progress ends at $(tail -1 "$TMP/progress")"
rc=0
"$NBDFLOW" copy --progress=9 "$TMP/src.img" "$TMP/p2.img" 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && grep -q 'progress=9: no such open file descriptor' "$TMP/err" ||
    fail "--progress on a closed descriptor: exit $rc, $(cat "$TMP/err")"
[ ! -e "$TMP/p2.img" ] || fail "a refused copy created its destination"
rc=0
"$NBDFLOW" copy --progress=3 "$TMP/src.img" "$TMP/p2.img" 3<"$TMP/src.img" \
    2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && grep -q 'progress=3: not a descriptor to write to' "$TMP/err" ||
    fail "--progress on a read-only descriptor: exit $rc, $(cat "$TMP/err")"
note "ok: --progress=9 with no descriptor 9, and a read-only 3, are refused"

# --synchronous: one request in flight, one connection each side, into a
# server that would take four (nbdkit memory advertises multi-conn).
kit "$TMP/m.sock" memory 16M
"$NBDFLOW" copy --synchronous --json "$TMP/src.img" "$(uri "$TMP/m.sock")" \
    >"$TMP/sync.json" || fail "copy --synchronous"
python3 - "$TMP/sync.json" <<'PY' || fail "--synchronous report: $(cat "$TMP/sync.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["peak_depth"] == 1, d["peak_depth"]
assert d["connections"]["destination"] == 1, d["connections"]
PY
"$NBDFLOW" copy "$(uri "$TMP/m.sock")" "$TMP/m.img" || fail "read back"
same "$TMP/src.img" "$TMP/m.img"

# -R and --queue-size are nbdcopy's limits per connection. nbdcopy opens
# -C connections (default 4) on both sides, or 1 when either NBD side lacks
# multi-conn; the window they give is N times that, in all, and the copy
# keeps within it. -R 2 -C 2: 4 requests; --queue-size 512K -C 2 with 128K
# requests: 1 MiB; no -C into a multi-conn server: -R 3 allows 12; into or
# out of a server without multi-conn: 3; file to file: 2 for -R 2. -R keeps
# the opening request that --max-requests (a diagnostic) turns off.
# window_json NAME SRC DST ARGS...: copies SRC to DST with ARGS, leaving the
# JSON report in $TMP/NAME.json; then reads DST back and compares it with
# src.img.
window_json () {
    local name=$1 src=$2 dst=$3
    shift 3
    "$NBDFLOW" copy --json "$@" "$src" "$dst" >"$TMP/$name.json" ||
        fail "copy $* $src $dst"
    "$NBDFLOW" copy "$dst" "$TMP/$name.img" || fail "read back $dst"
    same "$TMP/src.img" "$TMP/$name.img"
}
kit "$TMP/single.sock" --filter=multi-conn memory 16M multi-conn-mode=disable
M=$(uri "$TMP/m.sock") S=$(uri "$TMP/single.sock")
window_json r2 "$TMP/src.img" "$M" -R 2 -C 2 --request-size 64K
window_json q512 "$TMP/src.img" "$M" --queue-size 512K -C 2 --request-size 128K
window_json r3 "$TMP/src.img" "$M" --requests=3 --request-size 64K
window_json rmax "$TMP/src.img" "$M" -R 8 --max-requests 5 -C 2 --request-size 64K
window_json single "$TMP/src.img" "$S" -R 3 --request-size 64K
window_json mixed "$M" "$S" -R 3 --request-size 64K
window_json files "$TMP/src.img" "$TMP/files-dst.img" -R 2 --request-size 64K
window_json plain "$TMP/src.img" "$M"
window_json r64 "$TMP/src.img" "$M" -R 64
python3 - "$TMP" <<'PY' || fail "-R/--queue-size windows: $(cat "$TMP"/{r2,q512,r3,rmax,single,mixed,files,plain,r64}.json)"
import json, sys
d = {n: json.load(open("%s/%s.json" % (sys.argv[1], n)))
     for n in ("r2", "q512", "r3", "rmax", "single", "mixed", "files",
               "plain", "r64")}
def limit(n, want):
    assert d[n]["request_limit"] == want, (n, d[n])
    assert 1 <= d[n]["peak_depth"] <= want, (n, d[n])
limit("r2", 4)
assert d["q512"]["window_bytes"] == 1 << 20, d["q512"]
assert d["q512"]["peak_inflight_bytes"] <= 1 << 20, d["q512"]
limit("r3", 12)
# our own total, when smaller, bounds nbdcopy's per-connection figure
assert d["rmax"]["request_limit"] == 16, d["rmax"]
assert d["rmax"]["diagnostic"]["max_requests"] == 5, d["rmax"]
assert d["rmax"]["peak_depth"] <= 5, d["rmax"]
limit("single", 3)
assert d["single"]["connections"]["destination"] == 1, d["single"]
limit("mixed", 3)
assert d["mixed"]["connections"]["destination"] == 1, d["mixed"]
limit("files", 2)
# -R is a tuning limit, not the diagnostic: the opening request stays
assert d["plain"]["opening_request"] > 0, d["plain"]
assert d["r64"]["opening_request"] == d["plain"]["opening_request"], d["r64"]
assert d["r64"]["diagnostic"]["max_requests"] == 0, d["r64"]
PY
note "ok: -R and --queue-size bound the window per connection"
for bad in "-R 0" "--requests=70000" "-R 1K" "--queue-size 0" "--queue-size 1x"; do
    rc=0
    # shellcheck disable=SC2086
    "$NBDFLOW" copy $bad "$TMP/src.img" "$TMP/bad.img" 2>"$TMP/err" || rc=$?
    [ "$rc" = 2 ] && [ "$(wc -l <"$TMP/err")" = 1 ] &&
        grep -q -- "--requests: 1 to 65536\|--queue-size: bad size" "$TMP/err" ||
        fail "$bad: exit $rc, $(cat "$TMP/err")"
    [ ! -e "$TMP/bad.img" ] || fail "$bad: a usage error created the destination"
done
note "ok: bad -R and --queue-size values are usage errors"

# --flush and -T are taken (flushing is the default; one event loop does
# the copying, whatever -T says).
"$NBDFLOW" copy --flush -T 4 --threads=2 "$TMP/src.img" "$TMP/f.img" ||
    fail "copy --flush -T 4"
same "$TMP/src.img" "$TMP/f.img"
rc=0
"$NBDFLOW" copy -T x "$TMP/src.img" "$TMP/f2.img" 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && grep -q "threads: 0 to 1024, not 'x'" "$TMP/err" ||
    fail "-T x: exit $rc, $(cat "$TMP/err")"
echo "PASS: nbdcopy's options behave as nbdcopy documents them"
