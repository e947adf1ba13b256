#!/bin/bash
# serve-long-requests.sh: READs and WRITEs of 42 MiB, over the 32 MiB
# maximum block size, from clients that never agreed to block sizes
# (EXPORT_NAME, or GO without NBD_INFO_BLOCK_SIZE), as nbd-server's own
# test client sends them: §Size constraints says a server SHOULD accept
# them. longreq.py (beside this file) sends them raw, first to
# nbd-server, the reference (when installed), then to our server, which
# serves them in pieces (its peak memory grows by less than one such
# request) while a client that did agree is still refused, in clear and
# inside TLS; the export is compared with what was written, byte for
# byte. A long WRITE with FUA is flushed whole before its reply.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
tmpdir_make
LONGREQ=$(dirname "$0")/longreq.py
# Under AddressSanitizer freed memory sits in a quarantine (256 MiB by
# default) and stays resident, which the peak-memory check would take
# for buffers: let our server release it at once (other builds ignore it).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0"
port_open () { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The written range of DISK equals DATA.
written () {
    cmp -i "$((1 << 20)):0" -n "$((42 << 20))" "$1" "$2" >&2 ||
        fail "$1 differs from the 42 MiB written"
    note "ok: $(basename "$1") holds the 42 MiB written"
}

if command -v nbd-server >/dev/null 2>&1; then
    truncate -s 64M "$TMP/ref.img"
    nport=$(free_port)
    cat >"$TMP/nbd-server.conf" <<CONF
[generic]
    listenaddr = 127.0.0.1
    port = $nport
    allowlist = true
[disk]
    exportname = $TMP/ref.img
CONF
    # nbd-server forks into the background; its pid file says whom to stop.
    nbd-server -C "$TMP/nbd-server.conf" -p "$TMP/nbd-server.pid" \
        >>"$TMP/ref.log" 2>&1
    wait_for test -s "$TMP/nbd-server.pid"
    SERVER_PIDS+=("$(cat "$TMP/nbd-server.pid")")
    wait_for port_open "$nport"
    check "nbd-server serves the long requests (the reference)" \
        python3 "$LONGREQ" 127.0.0.1 "$nport" disk "$TMP/ref.data"
    written "$TMP/ref.img" "$TMP/ref.data"
else
    note "nbd-server not installed (Debian package: nbd-server): the" \
         "reference run is skipped"
fi

truncate -s 64M "$TMP/disk.img"
serve_tcp "disk=$TMP/disk.img"
check "nbdflow serve serves the long requests in pieces" \
    python3 "$LONGREQ" 127.0.0.1 "$PORT" disk "$TMP/our.data" \
    --ours "$SERVER_PID"
written "$TMP/disk.img" "$TMP/our.data"
grep -q "payload of 44040192 bytes exceeds the maximum 33554432 the client agreed to" \
    "$SERVER_LOG" || fail "the refused 42 MiB WRITE is not logged"
server_alive || fail "server died"

# FUA on a long WRITE: the reply may go out only once every piece is on
# stable storage, not just the last one (the earlier pieces are written
# without FUA): a flush of the file must follow the last write.
if can_strace; then
    strace -f -qq -e trace=pwrite64,pwritev,pwritev2,fdatasync,fsync,splice \
        -o "$TMP/fua.trace" -p "$SERVER_PID" 2>/dev/null &
    st=$!
    wait_for all_traced "$SERVER_PID"
    check "a 42 MiB WRITE with FUA, in pieces" python3 - "$PORT" \
        "$LIB_DIR/../hostile/lib" "$TMP/fua.data" <<'PY'
import os
import socket
import sys
sys.path.insert(0, sys.argv[2])
import rawnbd as r


class Tcp:
    def connect(self, timeout):
        return socket.create_connection(("127.0.0.1", int(sys.argv[1])),
                                        timeout)


c = r.Conn(Tcp())
c.greeting()
r.expect_rep(c.structured_reply(), r.REP_ACK, "STRUCTURED_REPLY")
c.go(b"disk", infos=())  # no block sizes agreed
data = os.urandom(42 << 20)
err, _ = c.do(r.CMD_WRITE, 1 << 20, len(data), r.CMD_FLAG_FUA, payload=data)
r.expect_err(err, 0, "42 MiB WRITE with FUA")
open(sys.argv[3], "wb").write(data)
c.request(r.CMD_DISC)
PY
    kill "$st"; wait "$st" 2>/dev/null || true
    written "$TMP/disk.img" "$TMP/fua.data"
    last=$(grep -E 'pwrite|splice|fdatasync|fsync' "$TMP/fua.trace" |
           grep -v 'resumed>' | tail -n 1)
    case $last in
        *fdatasync\(*|*fsync\(*) note "ok: the FUA WRITE ends with a flush: $last" ;;
        *) fail "the last call of the FUA WRITE is not a flush: $last" ;;
    esac
else
    note "strace cannot trace here: the FUA check of a long WRITE is skipped"
fi
serve_stop

# The same inside TLS, where a piece leaves as records the transport may
# hold back until the socket takes them.
if command -v certtool >/dev/null 2>&1 && command -v psktool >/dev/null 2>&1
then
    . "$(dirname "$0")/tls-pki.inc"
    pki_ca "$TMP/ca" "long requests CA"
    pki_dir "$TMP/ca" "$TMP/pki"
    truncate -s 64M "$TMP/tls.img"
    serve_tcp --tls=on --tls-certs "$TMP/pki" "disk=$TMP/tls.img"
    check "nbdflow serve serves the long requests in pieces, inside TLS" \
        python3 "$LONGREQ" 127.0.0.1 "$PORT" disk "$TMP/tls.data" \
        --ours "$SERVER_PID" --tls "$TMP/pki/ca-cert.pem"
    written "$TMP/tls.img" "$TMP/tls.data"
    serve_stop
else
    note "certtool or psktool not installed (Debian package: gnutls-bin):" \
         "the TLS run is skipped"
fi
echo "PASS"
