#!/bin/bash
# copy-sendfile.sh: file -> NBD copies on the plain transport send WRITE
# payloads straight from the source file (sendfile). Checks, byte for
# byte: odd sizes and partial last pieces, small requests batched deep,
# several connections, sparse sources whose holes must overwrite old data
# with zeroes, TCP (our server, --zero-copy) and Unix (nbdkit); that
# --verify, --no-zero-copy and a default copy of a small source over TCP
# to this host take the buffer path, and a larger one times both paths
# and keeps the faster, then one connection against all (or, with too
# little data, reports both paths); and
# that a source which shrinks in
# the middle of a copy fails it with one line and a non-zero exit.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need python3
tmpdir_make

# path_of JSON: the report's data_path.
path_of () {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["data_path"])' "$1"
}
# copy_expect PATH NAME ARGS...: the copy succeeds on the named data path,
# within 120 s (these copies take well under a second: a stall means a
# peer stopped reading, and must fail rather than hang the suite).
copy_expect () {
    local want=$1 name=$2 rc=0; shift 2
    timeout 120 "$NBDFLOW" copy --json "$@" >"$TMP/report.json" || rc=$?
    [ "$rc" -ne 124 ] || fail "$name: copy stalled for 120 s (the server stopped reading)"
    [ "$rc" -eq 0 ] || fail "$name: copy failed (exit $rc)"
    [ "$(path_of "$TMP/report.json")" = "$want" ] ||
        fail "$name: data path $(path_of "$TMP/report.json"), expected $want"
    note "ok: $name ($want)"
}
# read_back URI FILE: the export's first bytes, as many as FILE holds,
# must equal FILE.
read_back () {
    rm -f "$TMP/back.img"
    "$NBDFLOW" copy "$1" "$TMP/back.img" || fail "read back of $1 failed"
    truncate -s "$(stat -c %s "$2")" "$TMP/back.img"
    same "$2" "$TMP/back.img"
}

# Odd sizes: the last piece is partial and not a multiple of anything.
kit "$TMP/mem.sock" memory 64M
mem=$(uri "$TMP/mem.sock")
for size in 513 $(( (1 << 20) + 1 )) $(( 5 * (1 << 20) + 4097 )); do
    head -c "$size" /dev/urandom >"$TMP/odd.img"
    copy_expect sendfile "$size bytes -> nbdkit" --request-size 1M \
        "$TMP/odd.img" "$mem"
    read_back "$mem" "$TMP/odd.img"
done

# Small requests, a deep window and several connections: many headers
# and payloads interleave in each socket's queue.
make_random "$TMP/src.img" 24
copy_expect sendfile "64K requests, 4 connections" --request-size 64K \
    --inflight 16M --connections 4 "$TMP/src.img" "$mem"
read_back "$mem" "$TMP/src.img"
copy_expect sendfile "4K requests" --request-size 4K --inflight 1M \
    "$TMP/src.img" "$mem"
read_back "$mem" "$TMP/src.img"

# A sparse source over old random data: holes become zeroes, data lands.
make_sparse "$TMP/sparse.img" 24 "0:1 5:3 23:1"
copy_expect sendfile "sparse source" "$TMP/sparse.img" "$mem"
read_back "$mem" "$TMP/sparse.img"

# The copying path is still there, and still right.
copy_expect buffer "--no-zero-copy" --no-zero-copy "$TMP/src.img" "$mem"
read_back "$mem" "$TMP/src.img"
copy_expect buffer "--verify reads through buffers" --verify \
    "$TMP/sparse.img" "$mem"

# The source shrinks under a slow copy: the payload a header promised is
# gone, so the connection and the copy must fail, loudly, once.
make_random "$TMP/shrink.img" 16
kit "$TMP/slow.sock" --filter=log --filter=delay memory 16M wdelay=100ms \
    logfile="$TMP/slow.log"
rc=0
"$NBDFLOW" copy --json --request-size 256K --inflight 512K \
    "$TMP/shrink.img" "$(uri "$TMP/slow.sock")" >"$TMP/out" 2>"$TMP/err" &
copy_pid=$!
wait_for grep -q " Write id=" "$TMP/slow.log"
truncate -s 1M "$TMP/shrink.img"
wait "$copy_pid" || rc=$?
check_copy_failed "shrinking source" "$rc" "source file ended"

# Our server over TCP. Its payload pipes must hold a payload however the
# sender's kernel cut it into pages: page-cache pages from sendfile take
# one pipe slot each, plus the partial ones around the header.
if "$NBDFLOW" serve --help >/dev/null 2>&1; then
    truncate -s 24M "$TMP/exp.img"
    serve_tcp "$TMP/exp.img"
    # Over TCP to this host the default is the buffer path (it measured
    # faster there); --zero-copy asks for sendfile.
    copy_expect buffer "-> nbdflow serve over TCP to this host" \
        "$TMP/src.img" "$URI"
    same "$TMP/src.img" "$TMP/exp.img"
    truncate -s 0 "$TMP/exp.img"; truncate -s 24M "$TMP/exp.img"
    copy_expect sendfile "-> nbdflow serve over TCP, 2 connections, --zero-copy" \
        --zero-copy --connections 2 "$TMP/src.img" "$URI"
    same "$TMP/src.img" "$TMP/exp.img"
    copy_expect sendfile "sparse -> nbdflow serve over TCP, --zero-copy" \
        --zero-copy "$TMP/sparse.img" "$URI"
    same "$TMP/sparse.img" "$TMP/exp.img"
    copy_expect buffer "--zero-copy then --no-zero-copy: the last wins" \
        --zero-copy --no-zero-copy "$TMP/src.img" "$URI"
    same "$TMP/src.img" "$TMP/exp.img"
    truncate -s 0 "$TMP/exp.img"; truncate -s 24M "$TMP/exp.img"
    copy_expect sendfile "--no-zero-copy then --zero-copy: the last wins" \
        --no-zero-copy --zero-copy "$TMP/src.img" "$URI"
    same "$TMP/src.img" "$TMP/exp.img"

    # A source of 256 MiB or more over TCP to this host times both paths
    # (eight turns of 8 MiB of data after a warm-up of one, sixteen when
    # the eight put the paths within 10% of each other) and keeps
    # sendfile only when it took under 90% of the buffers' time. Then,
    # with several connections of its own choosing (one meanwhile), it
    # times one against all the same way, and takes all only when they
    # took under 90% of the time. The source holds data enough for both.
    make_sparse "$TMP/big.img" 512 "0:300 500:8"
    truncate -s 512M "$TMP/bigexp.img"
    serve_tcp "$TMP/bigexp.img"
    probe_check () { # NAME: the report's probe, all turns timed
        python3 - "$TMP/report.json" "$1" <<'PY' || fail "$(cat "$TMP/report.json")"
import json, sys
r = json.load(open(sys.argv[1]))
p = r["data_path_probe"]
assert p and p["of"] in (8, 16) and p["turns"] == p["of"], p
assert p["turn_bytes"] == 8 << 20, p
s, b = p["sendfile_ms"], p["buffer_ms"]
assert s > 0 and b > 0, p
# Eight turns decide only outside the band; inside it, sixteen do.
if p["of"] == 8:
    assert not (0.9 * b + 0.2 < s < 1.1 * b - 0.2), p
want = "sendfile" if s < 0.9 * b else "buffer"
# The figures are rounded to 0.1 ms: at the boundary either is right.
if abs(s - 0.9 * b) > 0.2:
    assert r["data_path"] == want, (r["data_path"], p)
c = r["connection_probe"]
assert c and c["of"] in (8, 16) and c["turns"] == c["of"], c
assert c["turn_bytes"] == p["turn_bytes"], c
a, o = c["all_ms"], c["one_ms"]
assert a > 0 and o > 0, c
if c["of"] == 8:
    assert not (0.9 * o + 0.2 < a < 1.1 * o - 0.2), c
if abs(a - 0.9 * o) > 0.2:
    assert c["chose"] == ("all" if a < 0.9 * o else "one"), c
assert r["connections"]["destination"] > 1, r["connections"]
print(sys.argv[2] + ": chose " + r["data_path"] + ": sendfile %.1f ms, buffers %.1f ms" % (s, b)
      + "; " + c["chose"] + ": one %.1f ms, all %.1f ms" % (o, a))
PY
    }
    rc=0
    timeout 120 "$NBDFLOW" copy --json "$TMP/big.img" "$URI" >"$TMP/report.json" || rc=$?
    [ "$rc" = 0 ] || fail "probed copy: exit $rc"
    note "ok: $(probe_check "probed copy")"
    same "$TMP/big.img" "$TMP/bigexp.img"
    # The choice is the copy's alone: asked for, or paced, no probe.
    for args in "--zero-copy sendfile" "--no-zero-copy buffer" "--rate 8G buffer"; do
        read -r -a a <<<"${args% *}"
        truncate -s 0 "$TMP/bigexp.img"; truncate -s 512M "$TMP/bigexp.img"
        copy_expect "${args##* }" "256 MiB ${args% *}" "${a[@]}" "$TMP/big.img" "$URI"
        python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); assert r["data_path_probe"] is None and r["connection_probe"] is None' \
            "$TMP/report.json" || fail "${args% *}: a probe ran: $(cat "$TMP/report.json")"
        same "$TMP/big.img" "$TMP/bigexp.img"
    done
    # A count given (-C) is the user's: the data path is timed, the
    # connections are not.
    truncate -s 0 "$TMP/bigexp.img"; truncate -s 512M "$TMP/bigexp.img"
    rc=0
    timeout 120 "$NBDFLOW" copy --json -C 2 "$TMP/big.img" "$URI" >"$TMP/report.json" || rc=$?
    [ "$rc" = 0 ] || fail "-C 2: exit $rc"
    python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); assert r["data_path_probe"]["turns"] > 0 and r["connection_probe"] is None and r["connections"]["destination"] == 2, r' \
        "$TMP/report.json" || fail "-C 2: $(cat "$TMP/report.json")"
    same "$TMP/big.img" "$TMP/bigexp.img"
    note "ok: -C 2: no connection stage"
    # Too little data to finish: the report says both paths were taken.
    make_sparse "$TMP/thin.img" 256 "0:20 255:1"
    truncate -s 0 "$TMP/bigexp.img"; truncate -s 256M "$TMP/bigexp.img"
    copy_expect mixed "probe cut short" "$TMP/thin.img" "$URI"
    # It ended inside the data path stage, on every connection: no
    # connection stage is reported.
    python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); p = r["data_path_probe"]; assert 0 < p["turns"] < p["of"] and r["connection_probe"] is None, r' \
        "$TMP/report.json" || fail "cut short: $(cat "$TMP/report.json")"
    same "$TMP/thin.img" "$TMP/bigexp.img"
else
    note "nbdflow serve not built: TCP part not run"
fi
echo "PASS"
