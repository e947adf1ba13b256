#!/bin/bash
# copy-connect-parallel.sh: with several connections, the first one is
# made alone (it tells whether the server allows more), the others in
# parallel, each from its own thread (seen with strace -f), while the copy
# already runs on the first; the copy lands byte for byte; and a refused
# extra connection costs one warning naming the endpoint, never the copy
# or a hang: the copy goes on over the connections it has.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need_strace
tmpdir_make

"$NBDFLOW" copy random:8M:11 "$TMP/want.img" || fail "cannot expand the source"

# nbdkit's memory plugin advertises multi-conn: 4 connections by default.
PORT=$(free_port) || fail "no free port"
nbdkit -f -i 127.0.0.1 -p "$PORT" memory 8M >>"$TMP/kit.log" 2>&1 &
KPID=$!
SERVER_PIDS+=("$KPID")
for i in $(seq 100); do
    nbdinfo --size "nbd://127.0.0.1:$PORT" >/dev/null 2>&1 && break
    sleep 0.1
done
check "copy over 4 connections" strace -f -qq -e trace=connect \
    -o "$TMP/connect.st" "$NBDFLOW" copy --json random:8M:11 \
    "nbd://127.0.0.1:$PORT/" >"$TMP/copy.json"
check "read the export back" "$NBDFLOW" copy "nbd://127.0.0.1:$PORT/" \
    "$TMP/back.img"
same "$TMP/want.img" "$TMP/back.img"
python3 - "$TMP/connect.st" "$PORT" "$TMP/copy.json" <<'PY' ||
import json, re, sys
port = "htons(%s)" % sys.argv[2]
tids = [int(l.split()[0]) for l in open(sys.argv[1])
        if "connect(" in l and port in l]
rep = json.load(open(sys.argv[3]))
# a short copy may end before every later handshake has: 1 to 4 counted
assert 1 <= rep["connections"]["destination"] <= 4, rep["connections"]
assert len(tids) == 4, "expected 4 connects, saw %d" % len(tids)
first, rest = tids[0], tids[1:]
assert first not in rest, "a later connection ran on the first's thread"
assert len(set(rest)) == 3, "later connections shared threads: %s" % rest
# TCP diagnostics for each connection that joined, which together carried
# the whole image (8 MiB of payload plus headers).
each = rep["tcp_per_connection"]
assert len(each) == rep["connections"]["destination"], (len(each), rep["connections"])
assert all(c["samples"] >= 1 and c["mss"] > 0 for c in each), each
assert sum(c["bytes_sent"] for c in each) >= 8 << 20, [c["bytes_sent"] for c in each]
PY
    fail "connections were not made in parallel: $(cat "$TMP/connect.st")"
note "ok: connections 2-4 were made in parallel, each on its own thread"

# A server that takes two connections: the copy asks for four, warns once
# for each refused one, naming the endpoint, and lands over the two.
serve_tcp --max-connections 2 memory:8M
rc=0
timeout 60 "$NBDFLOW" copy --json random:8M:11 "$URI/" >"$TMP/two.json" \
    2>"$TMP/err" || rc=$?
[ "$rc" = 0 ] || fail "copy failed when connections 3 and 4 were refused (exit $rc): $(cat "$TMP/err")"
[ "$(grep -c "warning: nbd://127.0.0.1:$PORT/: connection [234] of 4 failed" "$TMP/err")" = 2 ] ||
    fail "expected one warning per refused connection, naming the endpoint: $(cat "$TMP/err")"
python3 -c 'import json,sys; c = json.load(open(sys.argv[1]))["connections"]; assert 1 <= c["destination"] <= 2, c' \
    "$TMP/two.json" || fail "report counts refused connections: $(cat "$TMP/two.json")"
check "read back over 2" "$NBDFLOW" copy --connections 2 "$URI/" "$TMP/back1.img"
same "$TMP/want.img" "$TMP/back1.img"
note "ok: refused extra connections cost a warning each: $(tail -1 "$TMP/err")"
# Two connections fit, and that copy lands.
check "copy over 2 connections" "$NBDFLOW" copy --connections 2 \
    random:8M:11 "$URI/"
check "read back" "$NBDFLOW" copy --connections 2 "$URI/" "$TMP/back2.img"
same "$TMP/want.img" "$TMP/back2.img"
serve_stop

# A server that serves one client at a time (qemu-nbd's default): the
# second connection's handshake never gets its greeting while the first
# connection is open. The copy runs on the first, and at the end the
# stuck handshake is abandoned at once (not after its 30 s limit, which
# the guard below would catch as a hang).
if command -v qemu-nbd >/dev/null; then
    qemu-nbd -f raw -k "$TMP/q.sock" --persistent "$TMP/want.img" \
        >>"$TMP/q.log" 2>&1 &
    QPID=$!
    SERVER_PIDS+=("$QPID")
    wait_for test -S "$TMP/q.sock"
    rc=0
    timeout 20 "$NBDFLOW" copy --connections 2 "$(uri "$TMP/q.sock")" \
        "$TMP/back3.img" 2>"$TMP/err3" || rc=$?
    [ "$rc" = 0 ] || fail "copy from a one-client server: exit $rc (124: hung on the second handshake): $(cat "$TMP/err3")"
    same "$TMP/want.img" "$TMP/back3.img"
    kill "$QPID" 2>/dev/null || true
    wait "$QPID" 2>/dev/null || true
    forget_pid "$QPID"
    note "ok: a handshake the server never answers is abandoned when the copy ends"
else
    note "qemu-nbd not installed (qemu-utils): one-client server case not run"
fi
# The exit cleanup kills what is left in SERVER_PIDS and, under set -e,
# must not meet a pid that is gone: forget the stopped server, stop nbdkit.
kill "$KPID" 2>/dev/null || true
wait "$KPID" 2>/dev/null || true
SERVER_PIDS=()
echo "PASS: parallel connections, verified; refused extra ones are dropped with a warning"
