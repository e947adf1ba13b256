#!/bin/bash
# Serving on a Unix socket: info, copies in and out, verified; a live
# server's socket is never taken over, a stale one is.
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need nbdinfo libnbd-bin
need qemu-img qemu-utils
tmpdir_make

sock=$TMP/nbd.sock
make_random "$TMP/src.img" 16
truncate -s 16M "$TMP/target.img"
serve_start --unix "$sock" "$TMP/target.img" mem=memory:16M
[ -S "$sock" ] || fail "no socket at $sock"

[ "$(nbdinfo --size "nbd+unix:///?socket=$sock")" = $((16 << 20)) ] ||
    fail "nbdinfo size over the Unix socket"
nbdcopy "$TMP/src.img" "nbd+unix:///?socket=$sock" || fail "nbdcopy in"
same "$TMP/src.img" "$TMP/target.img"

# The server's end of a Unix connection gets a 2 MiB send buffer (the
# kernel reports twice the size asked for), or, where net.core.wmem_max
# is lower, as much as that allows and a warning that names the limit.
need ss iproute2
python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
time.sleep(3)' "$sock" &
holder=$!
wmax=$(cat /proc/sys/net/core/wmem_max)
want=$((2 << 20)); [ "$wmax" -ge "$want" ] || want=$wmax
tb=
for ((i = 0; i < 50; i++)); do
    tb=$(ss -xmpn 2>/dev/null | grep -A1 "pid=$SERVER_PID," |
         grep -o 'tb[0-9]*' | head -n1 | tr -d tb) || true
    [ -z "$tb" ] || break
    sleep 0.05
done
wait "$holder"
[ -n "$tb" ] || fail "no Unix connection of the server's in ss -xmp"
[ "$tb" -ge $((2 * want)) ] ||
    fail "server-side send buffer $tb bytes (kernel figure), want $((2 * want))"
if [ "$wmax" -lt $((2 << 20)) ]; then
    grep -q "send buffer clipped to $wmax bytes" "$SERVER_LOG" ||
        fail "clipped send buffer not logged: $(cat "$SERVER_LOG")"
else
    ! grep -q "clipped" "$SERVER_LOG" || fail "a clip was logged needlessly"
fi
note "ok: server send buffer $tb (kernel figure), wmem_max $wmax"
same "$TMP/src.img" "$TMP/target.img"
nbdcopy --connections=4 "$TMP/src.img" "nbd+unix:///mem?socket=$sock" ||
    fail "nbdcopy into mem"
nbdcopy "nbd+unix:///mem?socket=$sock" "$TMP/out.img" || fail "nbdcopy out"
same "$TMP/src.img" "$TMP/out.img"
make_random "$TMP/src2.img" 16
qemu-img convert -n -f raw -O raw "$TMP/src2.img" \
    "nbd+unix:///?socket=$sock" || fail "qemu-img in"
same "$TMP/src2.img" "$TMP/target.img"
rm -f "$TMP/out.img"
qemu-img convert -f raw -O raw "nbd+unix:///?socket=$sock" "$TMP/out.img" ||
    fail "qemu-img out"
same "$TMP/src2.img" "$TMP/out.img"
serve_stop

# A pid file that cannot be written fails the start after the listeners
# and loops exist: one line naming the file, a non-zero exit (not the
# timeout's), and the socket it had bound removed again.
rc=0
timeout 20 "$NBDFLOW" serve --unix "$TMP/late.sock" \
    --pidfile "$TMP/no-such-dir/serve.pid" memory:1M 2>"$TMP/late.err" || rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] ||
    fail "an unwritable pid file: exit status $rc (want a failure, not a hang)"
grep -q "cannot write pid file $TMP/no-such-dir/serve.pid: No such file" \
    "$TMP/late.err" || fail "unwritable pid file not named: $(cat "$TMP/late.err")"
[ ! -e "$TMP/late.sock" ] || fail "the socket was left behind after a failed start"

# The socket path is taken over only from a server that is gone: a live
# server keeps its socket (the second start fails with one line), a file
# that is not a socket is never deleted, a stale socket is replaced.
serve_start --unix "$TMP/one.sock" memory:1M
for target in "$TMP/one.sock" "$TMP/plain.txt"; do
    echo "keep me" >"$TMP/plain.txt"
    rc=0
    timeout 20 "$NBDFLOW" serve --unix "$target" memory:2M \
        2>"$TMP/two.err" || rc=$?
    [ "$rc" = 1 ] || fail "second serve on $target: exit $rc"
    want="Address already in use"
    [ "$target" = "$TMP/one.sock" ] || want="File exists"
    grep -q "cannot listen on unix socket $target: $want" "$TMP/two.err" ||
        fail "second serve on $target: $(cat "$TMP/two.err")"
    [ "$(wc -l <"$TMP/two.err")" = 1 ] || fail "$(cat "$TMP/two.err")"
done
[ "$(cat "$TMP/plain.txt")" = "keep me" ] || fail "a plain file was replaced"
[ "$(nbdinfo --size "nbd+unix:///?socket=$TMP/one.sock")" = $((1 << 20)) ] ||
    fail "the first server lost its socket to the second"
serve_stop
# A live server whose accept queue is full is still live: refused at
# once, not waited for.
python3 "$(dirname "$0")/fullqueue.py" "$TMP/full.sock" "$TMP/full.port" \
    >>"$TMP/fullqueue.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -s "$TMP/full.port"
rc=0
timeout -k 5 20 "$NBDFLOW" serve --unix "$TMP/full.sock" memory:1M \
    2>"$TMP/two.err" || rc=$?
[ "$rc" = 1 ] && grep -q "Address already in use" "$TMP/two.err" ||
    fail "serve on a busy server's socket: exit $rc: $(cat "$TMP/two.err")"
# A server removes its socket at exit only while it is still its own: a
# successor that took the path over keeps it.
serve_start --unix "$TMP/succ.sock" memory:1M
first=$SERVER_PID
rm "$TMP/succ.sock"
serve_start --unix "$TMP/succ.sock" memory:2M
serve_stop "$first"
[ "$(nbdinfo --size "nbd+unix:///?socket=$TMP/succ.sock")" = $((2 << 20)) ] ||
    fail "a stopping server removed its successor's socket"
serve_stop
python3 -c 'import socket, sys
socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$TMP/stale.sock"
[ -S "$TMP/stale.sock" ] || fail "no stale socket to test with"
serve_start --unix "$TMP/stale.sock" memory:1M
[ "$(nbdinfo --size "nbd+unix:///?socket=$TMP/stale.sock")" = $((1 << 20)) ] ||
    fail "serving on a stale socket's path"
serve_stop

# SIGHUP and SIGQUIT stop it as SIGTERM does: exit 0, its socket and its
# pidfile removed (by their default actions they stayed behind). Started
# with the signals' default actions: a shell's background job ignores
# SIGQUIT.
for sig in HUP QUIT; do
    python3 - "$NBDFLOW" "$TMP/$sig.sock" "$TMP/$sig.pid" "$sig" <<'PY' ||
import os, signal, subprocess, sys, time
nbdflow, sock, pidf, sig = sys.argv[1:]
p = subprocess.Popen([nbdflow, "serve", "--unix", sock, "--pidfile", pidf,
                      "memory:1M"], stderr=subprocess.DEVNULL,
                     restore_signals=True,
                     preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                         for s in (signal.SIGINT,
                                                   signal.SIGQUIT)])
for _ in range(200):
    if os.path.exists(pidf):
        break
    time.sleep(0.05)
p.send_signal(getattr(signal, "SIG" + sig))
rc = p.wait(timeout=20)
left = [f for f in (sock, pidf) if os.path.exists(f)]
if rc != 0 or left:
    sys.exit("SIG%s: exit %d, left behind: %s" % (sig, rc, left))
PY
        fail "SIG$sig did not stop the server cleanly"
    note "ok: SIG$sig stops the server, socket and pidfile removed"
done
echo "PASS: Unix socket"
