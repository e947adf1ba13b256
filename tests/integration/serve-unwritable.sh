#!/bin/bash
# serve of a file the user may read but not write, without -r: served
# read-only with one warning saying why (as for a file on a read-only
# mount, and as nbdkit does), not refused with "Permission denied". Reads
# work, writes are refused, the file is unchanged. A file the user may
# not even read is still refused, naming the file and the reason.
# As root (who may write anything) the server runs as nobody.
. "$(dirname "$0")/lib.sh"
need nbdinfo libnbd-bin
tmpdir_make
chmod 755 "$TMP"
make_random "$TMP/disk.img" 1
chmod 644 "$TMP/disk.img"
before=$(sha "$TMP/disk.img")
mkdir -m 1777 "$TMP/run"

as_user=()
if [ "$(id -u)" = 0 ]; then
    need setpriv util-linux
    as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
    "${as_user[@]}" test -r "$TMP/disk.img" ||
        skip "nobody cannot reach $TMP (a private /tmp?)"
    "${as_user[@]}" test -x "$NBDFLOW" ||
        skip "nobody cannot run $NBDFLOW"
else
    chmod 444 "$TMP/disk.img"
fi

# start ARGS...: the server as the user above, on a free port; waits for
# its pidfile. Sets PID, PORT and LOG.
start () {
    PORT=$(free_port) || fail "no free port"
    LOG=$TMP/run/serve.log
    rm -f "$TMP/run/pid" "$LOG"
    "${as_user[@]}" "$NBDFLOW" serve --listen "127.0.0.1:$PORT" \
        --pidfile "$TMP/run/pid" "$@" >"$LOG" 2>&1 &
    PID=$!
    SERVER_PIDS+=("$PID")
    for ((i = 0; i < 200; i++)); do
        [ -s "$TMP/run/pid" ] && return 0
        kill -0 "$PID" 2>/dev/null || return 1
        sleep 0.1
    done
    fail "server not ready: $(cat "$LOG")"
}

start "$TMP/disk.img" || fail "the server refused a readable file: $(cat "$LOG")"
grep -qF "warning: export \"$TMP/disk.img\": $TMP/disk.img cannot be opened for writing (Permission denied); serving it read-only" \
    "$LOG" || fail "no warning: $(cat "$LOG")"
[ "$(grep -c . "$LOG")" -gt 0 ] && ! grep -q "error" "$LOG" ||
    fail "an error logged: $(cat "$LOG")"
nbdinfo --json "nbd://127.0.0.1:$PORT/" >"$TMP/info.json" ||
    fail "nbdinfo failed"
grep -q '"is_read_only": true' "$TMP/info.json" ||
    fail "not read-only: $(cat "$TMP/info.json")"
"$NBDFLOW" copy "nbd://127.0.0.1:$PORT/" "$TMP/back.img" ||
    fail "reading the export failed"
same "$TMP/disk.img" "$TMP/back.img"
make_random "$TMP/other.img" 1
check_fails "a write into the read-only export" \
    "$NBDFLOW" copy "$TMP/other.img" "nbd://127.0.0.1:$PORT/"
[ "$(sha "$TMP/disk.img")" = "$before" ] || fail "the file was modified"
kill -TERM "$PID"
wait "$PID" || fail "server exit status $? after SIGTERM"
forget_pid "$PID"

# -r says it already: no warning then.
start -r "$TMP/disk.img" || fail "serve -r failed: $(cat "$LOG")"
grep -q warning "$LOG" && fail "a warning with -r: $(cat "$LOG")"
kill -TERM "$PID"
wait "$PID" || true
forget_pid "$PID"

# Not readable either: refused, as before.
chmod 600 "$TMP/disk.img"
[ "$(id -u)" = 0 ] || chmod 000 "$TMP/disk.img"
rc=0
start "$TMP/disk.img" || rc=1
[ "$rc" = 1 ] || fail "a file it cannot read was served"
wait "$PID" && fail "exit status 0 for a file it cannot read"
grep -qF "cannot open $TMP/disk.img: Permission denied" "$LOG" ||
    fail "unreadable: $(cat "$LOG")"
forget_pid "$PID"
echo "PASS"
