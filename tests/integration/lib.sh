# lib.sh: shared helpers for the integration tests. Source it first:
#
#   . "$(dirname "$0")/lib.sh"
#
# Contract of a test script: exit 0 pass, 1 fail, 77 skip; the last line
# it prints is the reason shown by tests/run for a skip or failure.
#
# Environment: NBDFLOW is the binary under test (tests/run sets it); when
# unset, build/nbdflow of this checkout is used.

set -u

LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$LIB_DIR/../.." && pwd)
: "${NBDFLOW:=$REPO_DIR/build/nbdflow}"
# sparse_dd reads no /etc/sparse_dd.conf of the machine running the tests
# (set but empty: no configuration); a test that wants one names it.
export NBDFLOW_SPARSE_DD_CONF=
TEST_NAME=$(basename "$0")

# ---- Reporting ------------------------------------------------------------

# Prints its arguments prefixed with the test name, on stderr.
note () { echo "$TEST_NAME: $*" >&2; }

# Ends the test as failed; the message is the last line printed.
fail () {
    echo "FAIL: $*"
    exit 1
}

# Ends the test as skipped with a reason (exit 77).
skip () {
    echo "SKIP: $*"
    exit 77
}

# need CMD [PACKAGE]: skip loudly unless CMD is installed.
need () {
    local cmd=$1 pkg=${2:-$1}
    command -v "$cmd" >/dev/null 2>&1 ||
        skip "$cmd not installed (Debian package: $pkg)"
}

# check DESCRIPTION CMD...: runs CMD and fails the test if it fails.
check () {
    local what=$1; shift
    if ! "$@"; then
        fail "$what (command: $*)"
    fi
    note "ok: $what"
}

# check_fails DESCRIPTION CMD...: the command must fail (exit != 0).
check_fails () {
    local what=$1; shift
    if "$@"; then
        fail "$what: expected a failure but it succeeded (command: $*)"
    fi
    note "ok: $what"
}

# ---- Temporary files and cleanup -------------------------------------------

CLEANUP_CMDS=()
SERVER_PIDS=()

# Registers a shell command to run at exit (last registered runs first).
on_exit () { CLEANUP_CMDS+=("$1"); }

lib_cleanup () {
    local rc=$? i pid
    for pid in "${SERVER_PIDS[@]}"; do
        [ -n "$pid" ] && { kill -KILL "$pid" 2>/dev/null || true; }
    done
    for ((i = ${#CLEANUP_CMDS[@]} - 1; i >= 0; i--)); do
        eval "${CLEANUP_CMDS[$i]}" || true
    done
    exit "$rc"
}
trap lib_cleanup EXIT
trap 'exit 1' INT TERM

# Makes TMP, a private temporary directory removed at exit. The tests
# write its paths into NBD URIs (nbd+unix:///?socket=PATH) and shell
# commands unescaped, so a TMPDIR with any other byte than these (a
# space, a quote, '%', '&', '+'...) is passed over for /tmp, with a line.
tmpdir_make () {
    local base=${TMPDIR:-/tmp}
    if [[ ! $base =~ ^[A-Za-z0-9/._-]+$ ]]; then
        note "TMPDIR '$base' has bytes the tests' URIs would need" \
             "escaped; using /tmp"
        base=/tmp
    fi
    TMP=$(mktemp -d "$base/nbdflow-test.XXXXXX") ||
        fail "mktemp failed"
    on_exit "rm -rf '$TMP'"
}

# ---- Images ------------------------------------------------------------------

# make_random FILE MIB: FILE of MIB MiB of random bytes.
make_random () {
    dd if=/dev/urandom of="$1" bs=1M count="$2" status=none ||
        fail "cannot write $1"
}

# make_sparse FILE MIB LAYOUT: FILE of MIB MiB, a hole except for the
# random-data extents listed in LAYOUT as "START_MIB:LEN_MIB ...".
make_sparse () {
    local file=$1 mib=$2 ext start len
    rm -f "$file"
    truncate -s "${mib}M" "$file" || fail "cannot create $file"
    for ext in $3; do
        start=${ext%%:*}
        len=${ext##*:}
        dd if=/dev/urandom of="$file" bs=1M seek="$start" count="$len" \
            conv=notrunc status=none || fail "cannot write $file"
    done
}

# make_striped FILE MIB PERIOD: FILE of MIB MiB holding 4 KiB of random
# data at the start of every PERIOD bytes, a hole in between.
make_striped () {
    python3 - "$@" <<'PY' || fail "cannot write $1"
import os, sys
path, size, period = sys.argv[1], int(sys.argv[2]) << 20, int(sys.argv[3])
with open(path, "wb") as f:
    f.truncate(size)
    for off in range(0, size, period):
        f.seek(off)
        f.write(os.urandom(4096))
PY
}

# make_fake_pattern FILE SIZE: FILE holds the SIZE bytes fakenbd.py
# serves (byte i is (i * 7 + i // 4096) mod 256).
make_fake_pattern () {
    python3 - "$1" "$2" <<'PY' || fail "cannot write $1"
import sys
path, size = sys.argv[1], int(sys.argv[2])
with open(path, "wb") as f:
    for off in range(0, size, 1 << 20):
        n = min(1 << 20, size - off)
        f.write(bytes(((i * 7 + i // 4096) & 0xFF)
                      for i in range(off, off + n)))
PY
}

# same A B: byte-for-byte comparison; fails the test on a difference.
same () {
    cmp "$1" "$2" >&2 || fail "$1 and $2 differ"
    note "ok: $(basename "$1") == $(basename "$2")"
}

# all_zero FILE BYTES: FILE holds exactly BYTES zero bytes.
all_zero () {
    local size
    size=$(stat -c %s "$1") || fail "no $1"
    [ "$size" = "$2" ] || fail "$1 is $size bytes, expected $2"
    cmp -n "$2" "$1" /dev/zero >&2 || fail "$1 is not all zeroes"
    note "ok: $(basename "$1") is $2 zero bytes"
}

sha () { sha256sum "$1" | cut -d' ' -f1; }

# ---- A small file system of the test's own -------------------------------

# private_tmpfs MIB "$@": re-runs the calling test (once) in a private mount
# namespace, where it makes TMP and mounts a tmpfs of MIB MiB at $TMP/fs
# that nothing outside sees; unmounted at exit. Skips, saying why, where
# either is not allowed.
private_tmpfs () {
    local mib=$1; shift
    if [ -z "${NBDFLOW_PRIVATE_NS:-}" ]; then
        need unshare util-linux
        unshare -m true 2>/dev/null ||
            skip "cannot make a private mount namespace (unshare -m needs root)"
        export NBDFLOW NBDFLOW_PRIVATE_NS=1
        exec unshare -m --propagation private bash "$0" "$@"
    fi
    tmpdir_make
    mkdir "$TMP/fs"
    mount -t tmpfs -o "size=${mib}M" nbdflow-test "$TMP/fs" ||
        skip "cannot mount a tmpfs in the private namespace"
    on_exit "umount -l '$TMP/fs'"
}

# ---- Network -------------------------------------------------------------------

# Prints a TCP port that was free on HOST (default 127.0.0.1) a moment ago.
free_port () {
    python3 - "${1:-127.0.0.1}" <<'PY'
import socket, sys
host = sys.argv[1]
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.bind((host, 0))
print(s.getsockname()[1])
s.close()
PY
}

# True when this machine can bind a TCP socket on ::1.
have_ipv6_loopback () {
    python3 -c '
import socket
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.bind(("::1", 0))
' 2>/dev/null
}

# ---- Server ----------------------------------------------------------------------

SERVER_N=0

# serve_launch ARGS...: starts "$NBDFLOW serve ARGS --pidfile F" in the
# background and waits (at most ~20 s) until the pidfile is written. Sets
# SERVER_PID and SERVER_LOG (its stderr and stdout). Returns 0 when ready,
# 1 when the server exited first (SERVER_RC holds its status), 2 on timeout.
serve_launch () {
    [ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"
    [ -n "${TMP:-}" ] || tmpdir_make
    SERVER_N=$((SERVER_N + 1))
    local pidfile=$TMP/serve.$SERVER_N.pid i
    SERVER_LOG=$TMP/serve.$SERVER_N.log
    "$NBDFLOW" serve "$@" --pidfile "$pidfile" >"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    SERVER_PIDS+=("$SERVER_PID")
    on_exit "[ -s '$SERVER_LOG' ] && { echo '--- server log $SERVER_LOG:' >&2; tail -n 50 '$SERVER_LOG' >&2; }"
    for ((i = 0; i < 200; i++)); do
        if [ -s "$pidfile" ]; then
            note "server $SERVER_PID ready: serve $*"
            return 0
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID"
            SERVER_RC=$?
            return 1
        fi
        sleep 0.1
    done
    return 2
}

# serve_start ARGS...: serve_launch, failing the test unless it is ready.
serve_start () {
    serve_launch "$@"
    case $? in
        0) return 0 ;;
        1) fail "server exited with status $SERVER_RC before becoming ready: serve $*" ;;
        *) fail "server not ready after 20 s: serve $*" ;;
    esac
}

# serve_tcp ARGS...: serve_start on a free loopback port; sets PORT and
# URI (nbd://127.0.0.1:PORT; append /NAME for a named export). Retries when
# another process took the port in between.
serve_tcp () {
    local try rc
    for try in 1 2 3; do
        PORT=$(free_port) || fail "no free port"
        # Not a port the arguments name (--http HOST:PORT picked by
        # free_port too, and not bound yet).
        while [[ " $* " == *":$PORT "* ]]; do
            PORT=$(free_port) || fail "no free port"
        done
        URI=nbd://127.0.0.1:$PORT
        serve_launch --listen "127.0.0.1:$PORT" "$@"
        rc=$?
        [ "$rc" = 0 ] && return 0
        [ "$rc" = 2 ] && fail "server not ready after 20 s: serve --listen 127.0.0.1:$PORT $*"
        grep -qi "in use" "$SERVER_LOG" || break
    done
    fail "server exited with status $SERVER_RC before becoming ready: serve --listen 127.0.0.1:$PORT $*"
}

# True while the last started server (or pid $1) runs.
server_alive () { kill -0 "${1:-$SERVER_PID}" 2>/dev/null; }

# serve_stop [PID]: SIGTERM, wait at most 10 s, then fail if it had to be
# killed or exited with a signal or non-zero status.
serve_stop () {
    local pid=${1:-$SERVER_PID} i rc
    server_alive "$pid" || {
        wait "$pid" 2>/dev/null
        fail "server $pid already dead before stop (status $?)"
    }
    kill -TERM "$pid"
    for ((i = 0; i < 100; i++)); do
        server_alive "$pid" || break
        sleep 0.1
    done
    if server_alive "$pid"; then
        kill -KILL "$pid"
        fail "server $pid ignored SIGTERM for 10 s"
    fi
    wait "$pid"
    rc=$?
    [ "$rc" = 0 ] || fail "server $pid exited with status $rc after SIGTERM"
    note "ok: server $pid stopped cleanly"
}

# TEST_SLOW=N (tests/valgrind sets 10): every bound a test puts on a
# command with timeout(1) stretches N times. Those bounds catch hangs, and
# a process under valgrind runs 20 to 50 times slower; nothing a test
# asserts about time uses timeout(1).
if [ "${TEST_SLOW:-1}" != 1 ]; then
    timeout () {
        local a=()
        while [ $# -gt 1 ] && [ "${1#-}" != "$1" ]; do
            case $1 in -k | -s) a+=("$1" "$2"); shift 2 ;; *) a+=("$1"); shift ;; esac
        done
        case $1 in
            *[!0-9]*) ;; # a fraction or a unit: left as it is
            *) set -- $(($1 * TEST_SLOW)) "${@:2}" ;;
        esac
        command timeout "${a[@]}" "$@"
    }
fi

# ---- Peer servers started by the tests themselves --------------------------

# wait_for CMD...: polls CMD for up to TEST_WAIT seconds (10; tests/valgrind
# sets more); fails the test if it never succeeds.
wait_for () {
    local i
    for i in $(seq $((${TEST_WAIT:-10} * 10))); do
        "$@" 2>/dev/null && return 0
        sleep 0.1
    done
    fail "still not true after ${TEST_WAIT:-10} s: $*"
}

# A test that acts on a running copy waits for the state it needs rather
# than for a guessed time, so that a slow process (under valgrind, or on a
# loaded machine) is acted on at the same point of its work.

# has_open PID FILE: PID holds FILE open (a copy has looked at its source).
has_open () {
    local f want
    want=$(readlink -f "$2")
    for f in /proc/"$1"/fd/*; do
        [ "$(readlink "$f" 2>/dev/null)" = "$want" ] && return 0
    done
    return 1
}

# in_pipe_read PID: one of PID's threads sleeps in a read(2) of its
# standard input from a pipe (syscall 0, first argument 0). The fd is
# checked too: under valgrind, the tool's own threads wait in pipe reads
# before the program has even set its signal handlers.
in_pipe_read () {
    local t
    for t in /proc/"$1"/task/*; do
        grep -Eqs 'pipe_read|pipe_wait' "$t/wchan" &&
            grep -qs '^0 0x0 ' "$t/syscall" && return 0
    done
    return 1
}

# kit SOCK ARGS...: nbdkit on a Unix socket, ready when it returns; its pid
# is in KIT_PID and joins SERVER_PIDS for the cleanup.
kit () {
    local sock=$1; shift
    nbdkit -f -U "$sock" "$@" >>"$TMP/kit.log" 2>&1 &
    SERVER_PIDS+=($!)
    KIT_PID=$!
    wait_for test -S "$sock"
}

# uri SOCK: the NBD URI of the default export on a Unix socket.
uri () { echo "nbd+unix:///?socket=$1"; }

# forget_pid PID: a server the test killed itself leaves SERVER_PIDS, so
# that the cleanup does not fail on it under set -e.
forget_pid () {
    local p keep=()
    for p in "${SERVER_PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    SERVER_PIDS=("${keep[@]}")
}

# need_strace: strace installed and allowed to trace here, or a loud skip.
# LeakSanitizer cannot run under ptrace, so in a sanitizer build the traced
# runs check memory errors only (every other test still checks leaks).
need_strace () {
    need strace
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    can_strace || skip "strace cannot trace here (ptrace not permitted)"
}

# can_strace: strace is installed and may trace here; for a test that
# checks something under strace only where it can, and says so otherwise.
can_strace () {
    command -v strace >/dev/null 2>&1 &&
        strace -f -qq -o /dev/null true 2>/dev/null
}

# traced ARGS...: strace -f -qq ARGS..., with LeakSanitizer off for the
# traced program only (it cannot run under ptrace).
traced () {
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        strace -f -qq "$@"
}

# all_traced PID: every thread of PID has a tracer. strace -p attaches
# one thread after another, so a trace is complete only once this holds.
all_traced () {
    ! grep -q '^TracerPid:[[:space:]]*0$' /proc/"$1"/task/*/status
}

# traced_writes PID FILE SYSCALLS CMD...: runs CMD while strace follows
# every thread of PID for SYSCALLS (a comma list of pwrite64, pwritev2,
# splice and sendfile); sets WROTE[TID] to the bytes that thread's calls
# put into FILE (or, for sendfile, sent from it), for each thread that
# made any of them.
traced_writes () {
    local pid=$1 file fd syscalls=$3 st f
    file=$(readlink -f "$2")
    shift 3
    fd=$(find "/proc/$pid/fd" -lname "$file" -printf '%f\n' | head -1)
    [ -n "$fd" ] || fail "the server holds no fd of $file"
    rm -f "$TMP"/trace.*
    # one file per thread (-ff): no call is split across lines
    strace -ff -qq -e trace="$syscalls" -o "$TMP/trace" -p "$pid" &
    st=$!
    wait_for all_traced "$pid"
    "$@" || { kill "$st"; fail "failed: $*"; }
    kill -INT "$st"
    wait "$st" || true
    declare -gA WROTE=()
    for f in "$TMP"/trace.*; do
        [ -e "$f" ] || continue
        WROTE[${f##*.}]=$(awk -v fd="$fd" '
            ($0 ~ "^splice\\([0-9]+, NULL, " fd ", " ||
             $0 ~ "^sendfile\\([0-9]+, " fd ", " ||
             $0 ~ "^pwrite(64|v2)\\(" fd ", ") && / = [0-9]+$/ { s += $NF }
            END { print s + 0 }' "$f")
    done
}

# ---- The link emulator ------------------------------------------------------

# linkem_prereqs: sets LINKEM, UP and DOWN (the emulator and its netns
# scripts) and skips loudly unless root, /dev/net/tun, iproute2, ping and a
# built emulator are all there.
linkem_prereqs () {
    LINKEM=${LINKEM:-$(dirname "${NBDFLOW_REAL:-$NBDFLOW}")/bench/nbdflow-linkem}
    UP=$REPO_DIR/bench/linkem/netns-up.sh
    DOWN=$REPO_DIR/bench/linkem/netns-down.sh
    [ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
    [ -c /dev/net/tun ] || skip "no /dev/net/tun"
    need ip iproute2
    need ping iputils-ping
    [ -x "$LINKEM" ] || skip "emulator not built: $LINKEM"
}

# linkem_link TAG NET RTT_MS RATE: two namespaces nbdflow-TAGa/TAGb
# (NS_A, NS_B; NET.1 and NET.2) joined by the emulator at RTT_MS and
# RATE, removed again at exit. Needs tmpdir_make first.
linkem_link () {
    NS_A=nbdflow-${1}a$$
    NS_B=nbdflow-${1}b$$
    NET=$2
    on_exit "'$DOWN' --ns-a $NS_A --ns-b $NS_B >/dev/null 2>&1"
    "$UP" --ns-a "$NS_A" --ns-b "$NS_B" --net "$NET" --start "$LINKEM" \
        --rtt-ms "$3" -- --rate "$4" >"$TMP/up.log" 2>&1 ||
        fail "netns-up.sh failed: $(tail -3 "$TMP/up.log")"
}

# ---- Failed copies -----------------------------------------------------------

# check_copy_failed NAME RC TEXT: a copy that exited RC with its stdout in
# $TMP/out and stderr in $TMP/err must have failed cleanly: non-zero exit,
# exactly one error line naming an offset, a length and TEXT (a regular
# expression, may be empty), and no report printed.
check_copy_failed () {
    local name=$1 rc=$2 text=$3
    [ "$rc" -ne 0 ] || fail "$name: exited 0"
    [ "$(grep -c 'error' "$TMP/err")" -eq 1 ] ||
        fail "$name: expected one error line, got: $(cat "$TMP/err")"
    grep -q "offset [0-9]* length [0-9]*${text:+: .*$text}" "$TMP/err" ||
        fail "$name: message lacks offset/length/'$text': $(cat "$TMP/err")"
    [ ! -s "$TMP/out" ] || fail "$name: printed a report on failure"
    note "ok: $name: $(cat "$TMP/err")"
}
