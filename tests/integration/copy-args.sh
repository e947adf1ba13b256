#!/bin/bash
# Bad arguments to copy, info and sum fail with one line that names what
# is wrong, and where: a count out of range (usage error, exit 2), a
# malformed NBD URI (a usage error too) that names the URI (a copy has
# two), a mistyped URI (never taken for a file name), a directory where an
# image was expected, a missing or extra name, a JSON report that would
# follow the image on stdout, output to a full disk, Chunked frames with
# --verify or --no-flush (the destination untouched).
. "$(dirname "$0")/lib.sh"
tmpdir_make
make_random "$TMP/src.img" 1

# refused WANT_RC WANT ARGS...: "nbdflow ARGS" exits WANT_RC with one line
# on stderr that contains WANT (a fixed string).
refused () {
    local want_rc=$1 want=$2 rc=0
    shift 2
    timeout 60 "$NBDFLOW" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = "$want_rc" ] || fail "$*: exit $rc, not $want_rc: $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$*: not one line: $(cat "$TMP/err")"
    grep -qF -- "$want" "$TMP/err" || fail "$*: $(cat "$TMP/err")"
    note "ok: $*: $(cat "$TMP/err")"
}

refused 2 "--connections: 1 to 64, not 'abc'" \
    copy --connections abc "$TMP/src.img" null:
refused 2 "--max-requests: 1 to 65536, not '0'" \
    copy --max-requests 0 "$TMP/src.img" null:
# A count is digits alone: 1K is a size, and a sign or a space a slip.
refused 2 "--max-requests: 1 to 65536, not '1K'" \
    copy --max-requests 1K "$TMP/src.img" null:
refused 2 "--connections: 1 to 64, not ' 3'" \
    copy --connections ' 3' "$TMP/src.img" null:
refused 2 "--connections: 1 to 64, not '+3'" sum --connections +3 "$TMP/src.img"
refused 2 "--threads: 0 to 1024, not '4K'" copy -T 4K "$TMP/src.img" null:
refused 2 "--retry: N[,DELAY]" copy --retry ' 3' "$TMP/src.img" null:
refused 2 "--retry: N[,DELAY]" copy --retry '3, 1' "$TMP/src.img" null:
refused 2 "--checkpoint-interval: whole seconds" \
    copy --checkpoint "$TMP/ck" --checkpoint-interval 1K "$TMP/src.img" "$TMP/o.img"
refused 2 '--threads: "+4" is not a number from 1 to 256' \
    serve --threads +4 "$TMP/src.img"
refused 2 '--loops: "9" is not a number from 1 to 8' \
    serve --loops 9 "$TMP/src.img"
refused 2 '--max-connections: "2K" is not a number' \
    serve --max-connections 2K "$TMP/src.img"
refused 2 "--inflight: at most 16G, not '8E'" \
    copy --inflight 8E "$TMP/src.img" null:
refused 2 "error: 'sparse:1M:64K:0': need 0 < DATA <= PERIOD" \
    copy sparse:1M:64K:0 null:
refused 2 "error: nbd://127.0.0.1:99999/: port out of range: '99999'" \
    copy "$TMP/src.img" nbd://127.0.0.1:99999/
refused 2 "error: nbd://127.0.0.1/?frob=1: unknown query parameter 'frob'" \
    copy nbd://127.0.0.1/?frob=1 "$TMP/out.img"
refused 2 "error: nbd+unix:///x: a Unix socket URI needs ?socket=PATH" \
    info nbd+unix:///x
refused 1 "error: size of $TMP: Is a directory" sum "$TMP"
refused 1 "error: size of $TMP: Is a directory" copy "$TMP" null:
# A mistyped URI is an error, never a local file of that name (created
# as a destination, or "No such file" as a source).
cd "$TMP" || fail "cd $TMP"
refused 2 "error: nbd:mem: 'nbd:' must be followed by '//'" \
    copy "$TMP/src.img" nbd:mem
refused 2 "error: nbd+unix:mem: 'nbd+unix:' must be followed by '//'" \
    copy "$TMP/src.img" nbd+unix:mem
refused 2 "error: nbd+tcp://h/x: unknown scheme 'nbd+tcp'" \
    copy nbd+tcp://h/x "$TMP/out.img"
refused 2 "error: http://h/x: unknown scheme 'http'" info http://h/x
refused 2 "error: NBD://h:x/: bad port 'x'" info NBD://h:x/
refused 2 "error: nbds:/h/x: 'nbds:' must be followed by '//'" sum nbds:/h/x
for f in nbd:mem nbd+unix:mem out.img; do
    [ ! -e "$TMP/$f" ] || fail "a refused copy created $f"
done
# A colon alone does not make a URI: this is a file name.
cp "$TMP/src.img" "$TMP/backup:1.img"
"$NBDFLOW" copy "$TMP/backup:1.img" "$TMP/b.img" ||
    fail "copy of backup:1.img failed"
cmp "$TMP/src.img" "$TMP/b.img" || fail "backup:1.img: copy differs"
cd - >/dev/null || fail "cd back"

# The JSON report holds any file name as a valid JSON string.
cp "$TMP/src.img" "$TMP/we\"ird\\name"
"$NBDFLOW" copy --json "$TMP/we\"ird\\name" null: >"$TMP/r.json" ||
    fail "copy --json of a name with a quote"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["source"].endswith("we\"ird\\name"), d["source"]' \
    "$TMP/r.json" || fail "JSON report of an odd name: $(cat "$TMP/r.json")"
note "ok: --json escapes the names"

# The image on stdout is not followed by a JSON report.
refused 2 "--json writes its report to stdout" \
    copy --json "$TMP/src.img" -
refused 2 "nbdflow copy: error: no DESTINATION given after '$TMP/src.img'" \
    copy "$TMP/src.img"
refused 2 "nbdflow copy: error: no SOURCE or DESTINATION given" copy
refused 2 "('c' is extra)" copy a b c
refused 2 "--allocated writes every zero range and --destination-is-zero" \
    copy --allocated --destination-is-zero "$TMP/src.img" "$TMP/o.img"
refused 2 "--progress: expected nothing or =json, not 'jsn'" \
    sum --progress=jsn "$TMP/src.img"
refused 2 "nbdflow info: error: no TARGET given" info
refused 2 "nbdflow sum: error: one SRC only" sum a b
refused 2 "nbdflow serve: error: no export given" serve
refused 2 "--list and --map do not go together" info --list --map nbd://h/
# An unknown option: getopt's line, then where the help is (not all of it).
rc=0
"$NBDFLOW" copy --frob a b >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] && [ "$(wc -l <"$TMP/err")" = 2 ] &&
    grep -q "unrecognized option '--frob'" "$TMP/err" &&
    grep -qx "Try 'nbdflow copy --help'." "$TMP/err" ||
    fail "copy --frob: exit $rc: $(cat "$TMP/err")"
# nbdcopy's spellings: -C N, -p, --target-is-zero.
rm -f "$TMP/alias.img"
"$NBDFLOW" copy -C 2 -p --target-is-zero "$TMP/src.img" "$TMP/alias.img" \
    2>"$TMP/err" || fail "copy with nbdcopy's option names: $(cat "$TMP/err")"
cmp "$TMP/src.img" "$TMP/alias.img" || fail "copy with -C -p: differs"
grep -q "^copy: 100.0%" "$TMP/err" || fail "-p printed no progress"

# --verify and --no-flush with Chunked frames are refused before the
# destination is opened: an existing file keeps its bytes, and a raw
# Chunked receiver is never connected to.
cp "$TMP/src.img" "$TMP/keep.img"
refused 2 "a Chunked stream cannot be read back to verify" \
    copy --dst-protocol chunked --verify "$TMP/alias.img" "$TMP/keep.img"
refused 2 "--no-flush would leave the Chunked stream without its end marker" \
    copy --dst-protocol chunked --no-flush "$TMP/alias.img" "$TMP/keep.img"
cmp "$TMP/src.img" "$TMP/keep.img" || fail "a refused Chunked copy changed DST"
refused 2 "--no-flush would leave the Chunked stream without its end marker" \
    copy --no-flush "$TMP/src.img" "chunked+unix://$TMP/none.sock"

# TLS options of an https DESTINATION are refused elsewhere, rather than
# silently unused (an nbds:// URI takes its own parameters).
refused 2 "--tls-priority applies to an https:// DESTINATION" \
    copy --tls-priority NORMAL "$TMP/src.img" "nbds://127.0.0.1:1/"
refused 2 "--tls-verify-peer applies to an https:// DESTINATION" \
    copy --tls-verify-peer false "$TMP/src.img" "$TMP/tv.img"
[ ! -e "$TMP/tv.img" ] || fail "a refused copy created its destination"

# A format prefix names a local file: before a URI it is refused with
# what to write instead, not opened as a path that is not there.
refused 2 "a format prefix names a local file, not a URI" \
    copy "qcow2:nbd://127.0.0.1:1/x" "$TMP/px.img"
refused 2 "a format prefix names a local file, not a URI" \
    info "vhd:nbd://127.0.0.1:1/x"
refused 2 "a format prefix names a local file, not a URI" \
    info --check "vhd:nbd://127.0.0.1:1/x"
refused 2 "a format prefix names a local file, not a URI" \
    sum "qcow2:nbd+unix:///x?socket=$TMP/none.sock"

# What the command line alone shows to be wrong with a name is a usage
# error (exit 2), said before anything is opened or created.
cd "$TMP" || fail "cd $TMP"
refused 2 "bad generated source 'zero:10Q'" copy zero:10Q null:
refused 2 "bad generated source 'zero:10Q'" sum zero:10Q
refused 2 "--base: bad generated source 'zero:10Q'" \
    copy --base zero:10Q pattern:1M "$TMP/bq.img"
refused 2 "bad generated source 'zero:1M:'" copy zero:1M: null:
refused 2 "bad generated source 'sparse:64M::4M'" copy sparse:64M::4M null:
refused 2 "(PERIOD 524288, DATA 1048576: 1M unless given)" \
    copy sparse:1G:512K null:
refused 2 "SOURCE is an empty name" copy "" null:
refused 2 "vhd: names no file after its format" sum vhd:
refused 2 "TARGET 'qcow2:' names no file" info qcow2:
refused 2 "null: is a destination only" copy null: null:
refused 2 "null:1G: null: takes no size here (./null:1G names a file" \
    copy pattern:1M null:1G
refused 2 "memory: is an export of serve" copy pattern:1M memory:1G
refused 2 "names the format vhd, and the format option qcow2: give one" \
    copy --src-format qcow2 vhd:x.vhd null:
refused 2 "names the format vhd, and -f qcow2 another" info -f qcow2 vhd:x.vhd
refused 2 "a generated source is raw" copy --src-format vhd zero:1M null:
refused 2 "null: discards: it takes no --dst-format" \
    copy --dst-format vhd pattern:1M null:
refused 2 "an NBD export is written raw" \
    copy --dst-format vhd pattern:1M nbd://127.0.0.1:1/
refused 2 "an image is read from a file, not a pipe" copy vhd:- null:
refused 2 "a Chunked stream is a destination only" \
    copy chunked+tcp://127.0.0.1:1 null:
refused 2 "bad port '99999' (a number from 1 to 65535)" \
    copy pattern:1M chunked+tcp://127.0.0.1:99999
refused 2 "http://127.0.0.1:99999/x: bad port" \
    copy pattern:1M http://127.0.0.1:99999/x
refused 2 "--list asks a server for its exports" info --list "$TMP/src.img"
refused 2 "--checkpoint-interval sets how often --checkpoint FILE is written" \
    copy --checkpoint-interval 5 pattern:1M null:
# A data buffer that cannot be allocated, with none in flight that would
# come back, fails the copy with one line (it waited at 0 bytes for ever).
if [ "$NBDFLOW" != "${NBDFLOW_REAL:-$NBDFLOW}" ] ||
   ldd "$NBDFLOW" 2>/dev/null | grep -q libasan; then
    note "skip: ulimit -v under valgrind or a sanitizer, which reserve address space of their own"
else
    rc=0
    (ulimit -v 80000; exec timeout 20 "$NBDFLOW" copy --request-size 32M \
        random:64M:1 null:) >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = 1 ] || fail "no memory for a buffer: exit $rc: $(cat "$TMP/err")"
    grep -q "read from random:64M:1 failed at offset 0 length 33554432: Cannot allocate memory" \
        "$TMP/err" || fail "no memory for a buffer: $(cat "$TMP/err")"
    note "ok: no memory for a buffer: $(cat "$TMP/err")"
fi
# A file whose name starts like a format prefix: the error says how to
# name it; a name of thousands of bytes leaves room for the reason.
cp "$TMP/src.img" "$TMP/vhd:x"
refused 1 "(the prefix was taken as the format; ./vhd:x names the file)" \
    sum vhd:x
long=$(head -c 5000 /dev/zero | tr '\0' a)
refused 1 "aaaa: File name too long" sum "$TMP/$long"
refused 1 "aaaa: File name too long" copy pattern:1M "$TMP/$long"
for f in bq.img null:1G memory:1G; do
    [ ! -e "$TMP/$f" ] || fail "a refused copy created $f"
done
# A format prefix before '-' is still the pipe, never a file named '-'.
"$NBDFLOW" copy "$TMP/src.img" raw:- >"$TMP/rawpipe.img" ||
    fail "copy to raw:- failed"
[ ! -e "$TMP/-" ] || fail "copy to raw:- made a file named '-'"
cmp "$TMP/src.img" "$TMP/rawpipe.img" || fail "copy to raw:- differs"
"$NBDFLOW" copy raw:- "$TMP/rawin.img" <"$TMP/src.img" ||
    fail "copy from raw:- failed"
cmp "$TMP/src.img" "$TMP/rawin.img" || fail "copy from raw:- differs"
refused 2 "where DESTINATION 'vhd:-' writes the image" \
    copy --json "$TMP/src.img" vhd:-
cd - >/dev/null || fail "cd back"

# Output that cannot be written (a full disk) fails, with one line.
for args in "--version" "copy --help" "sum $TMP/src.img" \
            "copy --json $TMP/src.img null:" "info --json $TMP/src.img"; do
    rc=0
    # shellcheck disable=SC2086 # ARGS holds several words on purpose
    "$NBDFLOW" $args >/dev/full 2>"$TMP/err" || rc=$?
    [ "$rc" = 1 ] || fail "$args >/dev/full: exit $rc"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$args: $(cat "$TMP/err")"
    grep -q "No space left on device" "$TMP/err" ||
        fail "$args >/dev/full: $(cat "$TMP/err")"
done
echo "PASS"
