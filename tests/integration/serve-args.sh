#!/bin/bash
# Bad serve arguments fail the start with one line that names the
# argument and a non-zero exit: ports out of range or not numbers, memory
# that cannot be reserved, a description too long, an IPv6 address with a
# port but no brackets; exit 2 for what the command line alone shows (the
# --http and --chunked-listen addresses too, an empty host or socket
# path, a bad size, a name twice or not UTF-8). Port 0 takes a free
# port, and the log names the port actually bound (a client connects to
# it).
. "$(dirname "$0")/lib.sh"
need nbdinfo libnbd-bin
tmpdir_make

# refuse WANT ARGS...: "serve ARGS" exits non-zero (not by the timeout)
# with one line on stderr matching the extended regex WANT.
refuse () {
    local want=$1 rc=0; shift
    timeout 20 "$NBDFLOW" serve "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 124 ] ||
        fail "serve $*: exit status $rc (want a failure)"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "serve $*: $(cat "$TMP/err")"
    grep -qE "$want" "$TMP/err" || fail "serve $*: $(cat "$TMP/err")"
    note "ok: serve $*: $(cat "$TMP/err")"
}

for port in 99999 65536 http -5; do
    refuse "bad --listen address \"127.0.0.1:$port\": the port must be a number from 0 to 65535" \
        --listen "127.0.0.1:$port" null:1M
done
refuse 'bad --listen address "127.0.0.1:": want HOST:PORT' \
    --listen 127.0.0.1: null:1M
refuse 'cannot resolve ::1:20004: .*\(an IPv6 address with a port is written \[ADDRESS\]:PORT\)$' \
    --listen ::1:20004 null:1M
refuse 'export "memory:100T": cannot reserve 100T of memory: ' memory:100T
refuse "export \"x/y=memory:2M\": no such file \(a '/' before '=' makes the whole argument a path" \
    --listen 127.0.0.1:0 x/y=memory:2M
refuse '^nbdflow serve: error: --description: longer than 4096 bytes$' \
    --description "$(head -c 4097 /dev/zero | tr '\0' d)" null:1M

# usage WANT ARGS...: as refuse, and the exit status is 2 (a usage error:
# the command line alone shows it, before any export is opened).
usage () {
    local want=$1 rc=0; shift
    timeout 20 "$NBDFLOW" serve "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = 2 ] || fail "serve $*: exit status $rc, not 2: $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "serve $*: $(cat "$TMP/err")"
    grep -qE "$want" "$TMP/err" || fail "serve $*: $(cat "$TMP/err")"
    note "ok: serve $*: $(cat "$TMP/err")"
}
for opt in --http --chunked-listen; do
    usage "bad $opt address \"127.0.0.1:99999\": the port must be a number" \
        --listen 127.0.0.1:0 "$opt" 127.0.0.1:99999 null:1M
    usage "bad $opt address \"127.0.0.1\": want HOST:PORT" \
        --listen 127.0.0.1:0 "$opt" 127.0.0.1 null:1M
done
# No host is never every interface: that is written out.
usage 'bad --listen address ":0": no host \(127.0.0.1 for this machine alone; 0.0.0.0 or \[::\] for every interface\)' \
    --listen :0 null:1M
usage 'bad --listen address "": no host' --listen "" null:1M
usage '^nbdflow serve: error: --unix: an empty path$' --unix "" null:1M
usage 'export "memory:10Q": bad size "10Q"' --listen 127.0.0.1:0 memory:10Q
usage 'export "null:1.5G": bad size "1.5G"' --listen 127.0.0.1:0 null:1.5G
usage 'export name "a" given twice' --listen 127.0.0.1:0 a=null:1M a=null:2M
usage 'export "n\\xff": the name is not UTF-8 text' \
    --listen 127.0.0.1:0 "$(printf 'n\xff')=null:1M"
usage 'export "vhd:": vhd: names no file after its format' \
    --listen 127.0.0.1:0 vhd:

# Started with stderr closed, the server's first open would take fd 2,
# and its log lines would land in the export.
truncate -s 1M "$TMP/closed.img"
"$NBDFLOW" serve --listen 127.0.0.1:0 --pidfile "$TMP/closed.pid" \
    "$TMP/closed.img" </dev/null >/dev/null 2>&- &
cpid=$!
SERVER_PIDS+=("$cpid")
wait_for test -s "$TMP/closed.pid"
cport=$(ss -Hltnp 2>/dev/null | sed -n "s/.*127\.0\.0\.1:\([0-9]*\) .*pid=$cpid,.*/\1/p" | head -1)
[ -n "$cport" ] || fail "no port for the server started with closed fds"
[ "$(nbdinfo --size "nbd://127.0.0.1:$cport")" = $((1 << 20)) ] ||
    fail "the server started with closed fds does not serve"
kill "$cpid"; wait "$cpid" || fail "the server started with closed fds: exit $?"
forget_pid "$cpid"
all_zero "$TMP/closed.img" $((1 << 20))

# Port 0: the kernel picks a port; the log says which, and it serves.
serve_start --listen 127.0.0.1:0 null:1M
port=$(sed -n 's/^nbdflow serve: listening on 127\.0\.0\.1:\([0-9]*\)$/\1/p' \
       "$SERVER_LOG")
[ -n "$port" ] && [ "$port" -gt 0 ] ||
    fail "no bound port in the log: $(cat "$SERVER_LOG")"
[ "$(nbdinfo --size "nbd://127.0.0.1:$port")" = $((1 << 20)) ] ||
    fail "nothing serves on the logged port $port"
serve_stop
echo "PASS: serve arguments"
