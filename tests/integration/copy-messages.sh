#!/bin/bash
# What copy and info say when something other than a good NBD server is
# at the other end, and what every command says for its errors:
# - a host name that does not resolve: "cannot resolve HOST: REASON"
#   (copy, info, and serve --listen), not an errno of a connect;
# - a peer that answers in another protocol (an HTTP status line, an SSH
#   banner): named at once, long before the time limit; a peer that says
#   nothing: "no NBD greeting within N s", and that it may not be NBD;
# - a server that closes the connection mid-copy: says so, after how many
#   bytes, and names --retry, instead of an errno's text;
# - /dev/null as a destination discards (as null: does), a FIFO or a
#   character device is written as a stream, and /dev/zero as a source
#   is refused, saying what to use;
# - every error line starts "nbdflow COMMAND: ", usage errors exit 2, and
#   each command's --help states its exit statuses.
. "$(dirname "$0")/lib.sh"
tmpdir_make
make_random "$TMP/src.img" 4

# refused WANT_RC WANT ARGS...: "nbdflow ARGS" exits WANT_RC with one line
# on stderr, starting "nbdflow CMD: error: " (CMD: the first of ARGS),
# that contains WANT (a fixed string).
refused () {
    local want_rc=$1 want=$2 rc=0
    shift 2
    timeout 60 "$NBDFLOW" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = "$want_rc" ] || fail "$*: exit $rc, not $want_rc: $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$*: not one line: $(cat "$TMP/err")"
    grep -q "^nbdflow $1: error: " "$TMP/err" ||
        fail "$*: no 'nbdflow $1: error: ' prefix: $(cat "$TMP/err")"
    grep -qF -- "$want" "$TMP/err" || fail "$*: $(cat "$TMP/err")"
    note "ok: $*: $(cat "$TMP/err")"
}

# ---- names that do not resolve (.invalid never does: RFC 6761) ----
refused 1 "nbd://nosuch.invalid/: cannot resolve nosuch.invalid: " \
    copy "$TMP/src.img" nbd://nosuch.invalid/
refused 1 "nbd://nosuch.invalid:10809/x: cannot resolve nosuch.invalid: " \
    info nbd://nosuch.invalid:10809/x
refused 1 "cannot resolve nosuch.invalid: " \
    serve --listen nosuch.invalid:10809 null:1M
grep -Eq "No route|Cannot assign" "$TMP/err" &&
    fail "the resolver's reason is replaced by an errno: $(cat "$TMP/err")"

# ---- peers that are not NBD servers ----
# peer.py PORTFILE BANNER: a TCP listener on a free port (written to
# PORTFILE) that sends BANNER (may be empty: a silent peer) to each
# client and keeps the connection open for 30 s.
peer () {
    python3 - "$@" <<'PY' &
import socket, sys, threading, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
banner = sys.argv[2].encode().decode("unicode_escape").encode("latin-1")
def serve(c):
    c.sendall(banner)
    time.sleep(30)
    c.close()
s.settimeout(60)
while True:
    try:
        c, _ = s.accept()
    except OSError:
        break
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
    SERVER_PIDS+=($!)
    wait_for test -s "$1"
}
peer "$TMP/http.port" 'HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n'
peer "$TMP/ssh.port" 'SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n'
peer "$TMP/quiet.port" ''

# fast WANT ARGS...: refused (exit 1) with WANT within 5 s, although
# the time limit (--timeout, at most 30 s for a handshake) is far off.
fast () {
    local t0=$SECONDS
    refused 1 "$@"
    [ $((SECONDS - t0)) -lt 5 ] || fail "$2 took $((SECONDS - t0)) s"
}
H=127.0.0.1
fast "the peer is an HTTP server, not an NBD server (it sent \"HTTP/1.1 400" \
    info "nbd://$H:$(cat "$TMP/http.port")/"
fast "the peer is an HTTP server, not an NBD server" \
    copy "nbd://$H:$(cat "$TMP/http.port")/" null:
fast "the peer is an SSH server, not an NBD server (it sent \"SSH-2.0-" \
    info --timeout 30 "nbd://$H:$(cat "$TMP/ssh.port")/"
t0=$SECONDS
refused 1 "handshake: no NBD greeting within 2 s: the peer may not be an NBD server" \
    info --timeout 2 "nbd://$H:$(cat "$TMP/quiet.port")/"
[ $((SECONDS - t0)) -lt 10 ] || fail "a silent peer held info for $((SECONDS - t0)) s"
refused 1 "no NBD greeting within 2 s" \
    copy --timeout 2 "$TMP/src.img" "nbd://$H:$(cat "$TMP/quiet.port")/"

# ---- a server that goes away mid-copy ----
# fakenbd.py closes the connection after answering its 4th WRITE; one
# request at a time, of 256 KiB, so exactly 1 MiB has landed.
FAKE_CLOSE_AFTER=4 python3 "$(dirname "$0")/fakenbd.py" "$TMP/gone.sock" \
    zerocap $((4 << 20)) >>"$TMP/fake.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/gone.sock"
refused 1 "the server closed the connection" \
    copy --connections 1 --max-requests 1 --request-size 256K \
    "$TMP/src.img" "nbd+unix:///?socket=$TMP/gone.sock"
grep -qF "after 1048576 of 4194304 bytes" "$TMP/err" ||
    fail "no byte count: $(cat "$TMP/err")"
grep -qF -- "--retry" "$TMP/err" || fail "--retry not named: $(cat "$TMP/err")"
grep -q "Cannot send after transport endpoint shutdown" "$TMP/err" &&
    fail "ESHUTDOWN's text: $(cat "$TMP/err")"
[ "$(grep -o "closed the connection" "$TMP/err" | wc -l)" = 1 ] ||
    fail "the line says it twice: $(cat "$TMP/err")"

# ---- devices and pipes as endpoints ----
check "copy into /dev/null" "$NBDFLOW" copy "$TMP/src.img" /dev/null
[ -c /dev/null ] || fail "/dev/null is no longer a device"
n=$("$NBDFLOW" copy "$TMP/src.img" /dev/stdout | wc -c)
[ "$n" = $((4 << 20)) ] || fail "copy to /dev/stdout (a pipe) gave $n bytes"
mkfifo "$TMP/fifo"
cat "$TMP/fifo" >"$TMP/from-fifo" &
check "copy into a named pipe" "$NBDFLOW" copy "$TMP/src.img" "$TMP/fifo"
wait $!
same "$TMP/src.img" "$TMP/from-fifo"
cd "$TMP" || fail "cd $TMP"
refused 1 "/dev/zero is a character device: it has no size to copy (for zeroes or random bytes use zero:SIZE or random:SIZE)" \
    copy /dev/zero out.img
[ ! -e "$TMP/out.img" ] || fail "a refused copy created its destination"
refused 1 "is a named pipe: it has no size to copy" copy "$TMP/fifo" out.img
# A file copied onto itself (by another name too): refused, not truncated.
cp "$TMP/src.img" "$TMP/self.img"
ln -sf "$TMP/self.img" "$TMP/self-link.img"
refused 1 "DESTINATION $TMP/self-link.img is SOURCE itself" \
    copy "$TMP/self.img" "$TMP/self-link.img" --dst-format vhd
same "$TMP/src.img" "$TMP/self.img"
# A name with a newline stays one line: control bytes show as \xNN.
refused 1 'open '"$TMP"'/no\x0asuch: No such file or directory' \
    info "$TMP/no"$'\n'"such"
# NBD's strings are UTF-8: an export name that is not is never sent.
refused 2 "export name 'a%FFb' is not UTF-8 text, as NBD requires" \
    info "nbd://127.0.0.1:9/a%FFb"
refused 2 "--nbd-export: the name is not UTF-8 text of at most 4096 bytes" \
    copy --nbd-export $'a\xffb' zero:1M http://127.0.0.1:9/x
# ... and so does info's own output about such a file.
nl_name="$TMP/a"$'\n'"b.img"
truncate -s 1M "$nl_name"
"$NBDFLOW" info "$nl_name" >"$TMP/info.out" 2>"$TMP/err" ||
    fail "info of a name with a newline: $(cat "$TMP/err")"
grep -qxF "file: $TMP/a\x0ab.img" "$TMP/info.out" ||
    fail "info's file line is not one escaped line: $(cat "$TMP/info.out")"
note "ok: info shows a name with a newline as \\x0a"
# info must not wait in open(2) for a writer to come (it used to hang).
refused 1 "fifo is a named pipe: it has no size to show" info "$TMP/fifo"
refused 1 "fifo is a named pipe: it has no size to show" info --map --json "$TMP/fifo"
refused 1 "fifo is a named pipe: it has no size to show" info "raw:$TMP/fifo"
cd - >/dev/null || fail "cd back"
grep -q "Illegal seek" "$TMP/err" && fail "errno text: $(cat "$TMP/err")"

# ---- one prefix, usage errors exit 2, exit statuses in --help ----
refused 2 "bad --listen address \"127.0.0.1:99999\": the port must be a number" \
    serve --listen 127.0.0.1:99999 null:1M
refused 2 "bad --listen address \"127.0.0.1:\": want HOST:PORT" \
    serve --listen 127.0.0.1: null:1M
refused 2 "--threads: \"0\" is not a number from 1 to 256" \
    serve --threads 0 null:1M
refused 2 "--tls=on needs --tls-certs DIR or --tls-psk FILE" \
    serve --tls=on null:1M
printf 'alice:00112233445566778899aabbccddeeff\n' >"$TMP/keys.psk"
refused 2 "--chunked-listen takes plain Chunked streams, which --tls=require would not cover" \
    serve --tls=require --tls-psk "$TMP/keys.psk" --chunked-listen 127.0.0.1:9 null:1M
refused 2 "no TARGET given (see 'nbdflow info --help')" info
for cmd in copy info sum serve; do
    rc=0
    "$NBDFLOW" "$cmd" --no-such-option >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = 2 ] || fail "$cmd --no-such-option: exit $rc"
    grep -q "^nbdflow $cmd: unrecognized option '--no-such-option'" "$TMP/err" ||
        fail "$cmd --no-such-option: $(cat "$TMP/err")"
    "$NBDFLOW" "$cmd" --help >"$TMP/help" || fail "$cmd --help failed"
    grep -q "^Exit status: 0 " "$TMP/help" ||
        fail "$cmd --help states no exit status"
    grep -q "2 for a usage error" "$TMP/help" ||
        fail "$cmd --help does not give a usage error's status"
done
note "ok: every command's --help states its exit statuses"
echo "PASS"
