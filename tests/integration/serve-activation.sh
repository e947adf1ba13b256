#!/bin/bash
# Socket activation: the server takes a listening socket passed as fd 3
# with LISTEN_FDS/LISTEN_PID, as a service manager would, serves on it, and
# a copy through it is verified. A --listen given as well is ignored, with
# a warning.
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need python3 python3
tmpdir_make

sock=$TMP/activated.sock
make_random "$TMP/src.img" 8
truncate -s 8M "$TMP/target.img"
# The launcher binds the socket, then execs the server with it as fd 3 and
# LISTEN_PID set to the server's own pid (the pid survives exec).
python3 - "$sock" "$NBDFLOW" "$TMP/target.img" "$TMP/serve.log" <<'PY' &
import os, socket, sys
path, binary, image, logpath = sys.argv[1:5]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(16)
os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
log = os.open(logpath, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.dup2(log, 2)
os.execve(binary, [binary, "serve", "--listen", "127.0.0.1:1", image], env)
PY
pid=$!
on_exit "kill $pid 2>/dev/null; wait $pid 2>/dev/null"
for _ in $(seq 100); do
    grep -q "passed by the service manager" "$TMP/serve.log" 2>/dev/null && break
    sleep 0.05
done
grep -q "passed by the service manager" "$TMP/serve.log" ||
    fail "server did not report the activated socket: $(cat "$TMP/serve.log")"
check "copy through the activated socket" \
    nbdcopy "$TMP/src.img" "nbd+unix:///?socket=$sock"
same "$TMP/src.img" "$TMP/target.img"
grep -q "listening on 127.0.0.1" "$TMP/serve.log" &&
    fail "server also opened a TCP listener"
grep -q "ignoring --listen 127.0.0.1:1: listening on the socket(s) passed" \
    "$TMP/serve.log" || fail "--listen was dropped without a word"
echo "PASS: socket activation"
