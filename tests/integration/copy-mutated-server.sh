#!/bin/bash
# copy-mutated-server.sh: nbdflow copy, sum and info against a server that
# damages one message of its stream (mutnbd.py, beside this file), for a
# fixed list of seeds. Whatever the server sends, each command must either
# exit non-zero with exactly one line saying "error" on stderr, or exit 0
# with output that is exactly right: the copy byte for byte the bytes the
# server described (the pattern, cut to the size it announced), the sum
# their SHA-256, info that size. Never a crash, a sanitizer report, a hang
# (each run is bounded by timeout(1); --timeout 3 is copy's own bound on a
# server that stops answering), a raw control character on stderr or in
# info's output, a success after the server failed a READ, or a failure
# the client found itself (a protocol error, a lost connection) reported
# as a bare errno without what it found.
#
# Every run starts a new connection whose damage depends on its seed
# alone, so a failure reproduces by itself: the message printed names the
# seed, what the server did to which message, and the client's stderr.
# MUTNBD_SEEDS="7 12" runs only those seeds. Seeds run in 4 lanes at
# once, each with its own server, since runs that wait out --timeout
# leave the cores idle.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
need python3
need sha256sum coreutils
need timeout coreutils
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"
tmpdir_make
MUT=$(dirname "$0")/mutnbd.py
SIZE=$((1 << 20 | 1000)) # several requests, a hole, and a short tail
SEEDS=${MUTNBD_SEEDS:-$(seq 1 450)}
LANES=4

python3 "$MUT" --pattern "$TMP/want.img" "$SIZE" || fail "no pattern"
[ "$(stat -c %s "$TMP/want.img")" = "$SIZE" ] || fail "pattern size"

# has_cntrl FILE: FILE holds a control character other than tab/newline.
has_cntrl () { LC_ALL=C tr -d '\t\n' <"$1" | LC_ALL=C grep -q '[[:cntrl:]]'; }

# check_run SEED CMD RC DIR: judges one run whose server wrote DIR/srv,
# whose client wrote DIR/out and DIR/err; prints a reason and returns 1
# when the client broke its promise.
check_run () {
    local seed=$1 cmd=$2 rc=$3 d=$4 size sum
    grep -q '^plan' "$d/srv" ||
        { echo "the client never reached the server"; return 1; }
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "hang: no exit within 30 s"; return 1
    fi
    [ "$rc" -lt 128 ] || { echo "killed by signal $((rc - 128))"; return 1; }
    if grep -Eq 'Sanitizer|runtime error:' "$d/err"; then
        echo "sanitizer report"; return 1
    fi
    has_cntrl "$d/err" && { echo "raw control character on stderr"; return 1; }
    if [ "$rc" -ne 0 ]; then
        [ "$(grep -c error "$d/err")" -eq 1 ] ||
            { echo "exit $rc without exactly one error line"; return 1; }
        [ ! -s "$d/out" ] || { echo "exit $rc, but printed output"; return 1; }
        # These errnos are the client's own findings, never a server's
        # error code: the line must say what was found.
        local bare='length [0-9]+: (Protocol error|Broken pipe|Connection '
        bare+='reset by peer|Cannot send after transport endpoint shutdown)$'
        ! grep -Eq "$bare" "$d/err" ||
            { echo "exit $rc, but the error does not say why"; return 1; }
        return 0
    fi
    grep -q error "$d/err" && { echo "exit 0 with an error line"; return 1; }
    grep -q '^fault sent' "$d/srv" &&
        { echo "exit 0 although the server failed a READ"; return 1; }
    read -r size sum < <(sed -n 's/^size \([0-9]*\) sha256 \(.*\)/\1 \2/p' \
        "$d/srv" | tail -n 1)
    [ -n "${size:-}" ] ||
        { echo "exit 0, but the server announced no size"; return 1; }
    # info reads nothing; copy and sum cannot succeed past the real end,
    # where every request is refused
    [ "$sum" != none ] || [ "$cmd" = info ] ||
        { echo "exit 0 for a size $size past the real end"; return 1; }
    case $cmd in
        copy)
            [ "$(stat -c %s "$d/out.img" 2>/dev/null)" = "$size" ] ||
                { echo "exit 0, output not $size bytes"; return 1; }
            cmp -s -n "$size" "$d/out.img" "$TMP/want.img" ||
                { echo "exit 0, output differs from the pattern"; return 1; }
            ;;
        sum)
            [ "$(cut -d' ' -f1 "$d/out")" = "$sum" ] ||
                { echo "exit 0, wrong sum $(cat "$d/out")"; return 1; }
            ;;
        info)
            has_cntrl "$d/out" &&
                { echo "raw control character in info"; return 1; }
            grep -Eq "export-size: $size( |$)" "$d/out" ||
                { echo "exit 0, info does not say size $size"; return 1; }
            ;;
    esac
    return 0
}

# run_one SEED CMD DIR: one client run against the lane's server (socket
# DIR/s.sock), judged; on failure appends a report to DIR/fail.
run_one () {
    local seed=$1 cmd=$2 d=$3 sock=$3/s.sock rc i why
    rm -f "$d/out.img" "$d/out" "$d/err" "$sock.out"
    echo "$seed" >"$sock.seed"
    local u="nbd+unix:///?socket=$sock"
    rc=0
    case $cmd in
        copy) timeout -k 5 30 "$NBDFLOW" copy --connections 1 \
                  --request-size 64K --timeout 3 "$u" "$d/out.img" \
                  >"$d/out" 2>"$d/err" || rc=$? ;;
        sum) timeout -k 5 30 "$NBDFLOW" sum --algo sha256 --connections 1 \
                 --timeout 3 "$u" >"$d/out" 2>"$d/err" || rc=$? ;;
        info) timeout -k 5 30 "$NBDFLOW" info "$u" \
                  >"$d/out" 2>"$d/err" || rc=$? ;;
    esac
    # The client is gone, so the server sees the end of its connection.
    for ((i = 0; i < 500; i++)); do
        grep -qs '^end' "$sock.out" && break
        sleep 0.01
    done
    cp "$sock.out" "$d/srv" 2>/dev/null || : >"$d/srv"
    if why=$(check_run "$seed" "$cmd" "$rc" "$d"); then
        why=
        [ "$rc" = 0 ] || why=" => $(grep -m1 error "$d/err")"
        echo "seed $seed $cmd: exit $rc; $(grep '^mutation' "$d/srv")$why" \
            >>"$d/log"
        return 0
    fi
    {
        echo "seed $seed $cmd: $why"
        echo "  server: $(grep -v '^size' "$d/srv" | tr '\n' ';')"
        echo "  client exit $rc, stderr:"
        sed 's/^/    /' "$d/err" | cat -v | head -n 20
    } >>"$d/fail"
    # a connection that never ended leaves the lane's server stuck
    [ ! -e "$sock.out" ] || grep -q '^end' "$d/srv"
}

# lane N: the seeds whose position in SEEDS is N modulo LANES.
lane () {
    local n=$1 d=$TMP/lane$1 k=0 seed cmd
    mkdir -p "$d"
    : >"$d/log"
    python3 "$MUT" --many "$d/s.sock" "$SIZE" 2>"$d/srv.err" &
    local spid=$!
    for ((k = 0; k < 1000; k++)); do
        [ -S "$d/s.sock" ] && break
        sleep 0.01
    done
    k=0
    for seed in $SEEDS; do
        if [ $((k++ % LANES)) = "$n" ]; then
            run_one "$seed" copy "$d" || break
            # info ends with the handshake: run it where the damage is there
            if grep -Eq '^plan seed=[0-9]+ target=[0-8] ' "$d/srv" ||
                [ "$seed" = 1 ]; then
                run_one "$seed" info "$d" || break
            fi
            run_one "$seed" sum "$d" || break
        fi
    done
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    if [ -s "$d/srv.err" ]; then
        { echo "lane $n: server failed:"; cat "$d/srv.err"; } >>"$d/fail"
    fi
}

start=$(date +%s)
pids=()
for ((n = 0; n < LANES; n++)); do
    lane "$n" &
    pids+=($!)
    SERVER_PIDS+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
cat "$TMP"/lane*/log >"$TMP/all.log"
sort -n -k2 "$TMP/all.log" >&2
note "$(wc -l <"$TMP/all.log") runs in $(($(date +%s) - start)) s"
note "$(grep -c ': exit 0;' "$TMP/all.log") exited 0," \
    "$(grep -c 'mutation none' "$TMP/all.log") met no mutation"
for k in flip set truncate drop dup close; do
    note "  $k: $(grep -c " $k" "$TMP/all.log") runs"
done
if cat "$TMP"/lane*/fail 2>/dev/null | grep -q .; then
    cat "$TMP"/lane*/fail
    fail "$(cat "$TMP"/lane*/fail | grep -c '^seed') runs broke the" \
        "promise (reproduce one: MUTNBD_SEEDS=N)"
fi
runs=$(grep -c '^seed' "$TMP/all.log")
[ "$runs" -ge $((2 * $(echo $SEEDS | wc -w))) ] ||
    fail "$runs runs judged, expected at least 2 per seed"
echo "PASS"
