#!/bin/bash
# serve-inmemory.sh: a file export on tmpfs, while no swap is active, only
# ever copies into memory when written, so the event loop runs its WRITEs
# of up to 1 MiB without FUA itself instead of waking a worker (over TCP,
# unless another thread is writing into the file at that moment). Larger
# WRITEs, FUA WRITEs, and every WRITE to a file on other storage go to
# the workers. Traces which threads write into each export's file (the
# first event loop runs on the main thread, the others are named
# nbdflow-loop, the workers nbdflow-io) and checks the start-up line that
# says so. Its READ replies leave from the file's pages by sendfile(2),
# counted in the same traces; reads from other storage, or while swap is
# on, or over TCP to this host (unless --zero-copy), do not. Every copy and every raw write is verified byte for byte.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_strace
need nbdcopy libnbd-bin
need qemu-img qemu-utils
private_tmpfs 160 "$@"
fs=$TMP/fs
[ "$(wc -l </proc/swaps)" -le 1 ] ||
    skip "swap is active: tmpfs pages may then wait for the swap device"

MIB=32
total=$((MIB << 20))
make_random "$TMP/src.img" $MIB
make_random "$TMP/src2.img" $MIB
make_random "$TMP/src3.img" $MIB
truncate -s "${MIB}M" "$fs/target.img"
sock=$TMP/nbd.sock
exports=("$fs/target.img")
disk_type=$(stat -f -c %T "$TMP")
case $disk_type in
    tmpfs|ramfs) on_disk=false ;;
    *) on_disk=true
       truncate -s "${MIB}M" "$TMP/disk.img"
       exports+=("disk=$TMP/disk.img") ;;
esac
serve_start --unix "$sock" "${exports[@]}"
pid=$SERVER_PID

grep -q "export \"$fs/target.img\": file, $total bytes, in memory (writes up to 1 MiB on the event loop)" \
    "$SERVER_LOG" || fail "no in-memory start-up line: $(cat "$SERVER_LOG")"
note "ok: the tmpfs export is announced as in memory"
if $on_disk; then
    grep -q "export \"disk\": file, $total bytes$" "$SERVER_LOG" ||
        fail "the $disk_type export is called in memory: $(cat "$SERVER_LOG")"
    note "ok: the $disk_type export is not"
fi

# traced FILE CMD...: runs CMD with the server's writes traced; sets
# LOOP and IO to the bytes that loop and worker threads wrote into FILE.
traced () {
    local file=$1 t comm
    shift
    traced_writes "$pid" "$file" pwrite64,pwritev2,splice "$@"
    LOOP=0 IO=0
    for t in "${!WROTE[@]}"; do
        comm=$(cat "/proc/$pid/task/$t/comm") ||
            fail "thread $t of the server is gone"
        [ "$t" = "$pid" ] && comm=nbdflow-loop # runs the first loop
        case $comm in
            nbdflow-loop) LOOP=$((LOOP + WROTE[$t])) ;;
            nbdflow-io) IO=$((IO + WROTE[$t])) ;;
            *) [ "${WROTE[$t]}" = 0 ] ||
                   fail "thread $t ($comm) wrote ${WROTE[$t]} bytes" ;;
        esac
    done
}

# all_by loops|workers WHAT SRC FILE CMD...: CMD copies SRC into FILE,
# traced; FILE must equal SRC, and every byte must have been written by
# the event loops, or by the workers.
all_by () {
    local who=$1 what=$2 src=$3 file=$4 by
    shift 4
    traced "$file" "$@"
    same "$src" "$file"
    case $who in
        loops) by=$LOOP; [ "$IO" = 0 ] ;;
        workers) by=$IO; [ "$LOOP" = 0 ] ;;
    esac && [ "$by" = "$total" ] ||
        fail "$what: loops wrote $LOOP, workers $IO of $total bytes"
    note "ok: $what: all $total bytes by the $who"
}

# nbdcopy: 256 KiB requests over several connections, spliced payloads.
all_by loops "nbdcopy, 256 KiB" "$TMP/src.img" "$fs/target.img" \
    nbdcopy "$TMP/src.img" "$(uri "$sock")"

# 32 KiB requests: payloads below the splice size, copied then written.
all_by loops "nbdcopy, 32 KiB" "$TMP/src2.img" "$fs/target.img" \
    nbdcopy --request-size=32768 "$TMP/src2.img" "$(uri "$sock")"

# Over TCP, a loop that finds the file busy (a worker is writing into it)
# hands its write to a worker instead of waiting. A second server, on TCP
# with two loops, serves the same file: connection A sends a 16 MiB FUA
# WRITE (a worker writes it), and as soon as it is sent, connection B (on
# the other loop) pipelines 256 WRITEs of 64 KiB, which alone would all
# be written by its loop. Four rounds, each read back; some of B's
# writes must have gone to the workers.
tcp_handoff () {
    python3 - "$PORT" "$LIB_DIR/../hostile/lib" <<'PY'
import os
import socket
import sys
sys.path.insert(0, sys.argv[2])
import rawnbd as r


class Tcp:
    def connect(self, timeout):
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])),
                                     timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s


a = r.Conn(Tcp()).open_export()
b = r.Conn(Tcp()).open_export()
BIG, K = 16 << 20, 64 << 10
for rnd in range(4):
    big, small = os.urandom(BIG), os.urandom(BIG)
    a.request(r.CMD_WRITE, 0, BIG, r.CMD_FLAG_FUA, 1, big)
    for i in range(BIG // K):
        b.request(r.CMD_WRITE, BIG + i * K, K, 0, 100 + i,
                  small[i * K:(i + 1) * K])
    r.expect_err(a.reply(1)[0], 0, "round %d: 16 MiB FUA WRITE" % rnd)
    for i in range(BIG // K):
        r.expect_err(b.reply()[0], 0, "round %d: 64 KiB WRITE" % rnd)
    err, got = a.do(r.CMD_READ, 0, BIG)
    r.expect(err == 0 and got == big, "round %d: A's 16 MiB read back" % rnd)
    err, got = b.do(r.CMD_READ, BIG, BIG)
    r.expect(err == 0 and got == small,
             "round %d: B's 256 writes read back" % rnd)
a.request(r.CMD_DISC)
b.request(r.CMD_DISC)
print("4 rounds: 16 MiB FUA on one connection, 256 x 64 KiB on another")
PY
}
unix_pid=$pid unix_log=$SERVER_LOG
serve_tcp --loops 2 "$fs/target.img"
pid=$SERVER_PID
traced "$fs/target.img" tcp_handoff
fua=$((4 << 24))
[ $((LOOP + IO)) = $((2 * fua)) ] && [ "$IO" -gt "$fua" ] ||
    fail "TCP, small writes while a worker writes: loops wrote $LOOP, workers $IO bytes (the FUA writes alone: $fua)"
note "ok: TCP: of 64 MiB of small writes made while a worker wrote, $((IO - fua)) bytes went to workers, $LOOP stayed on the loop"
serve_stop "$pid"
pid=$unix_pid SERVER_PID=$unix_pid SERVER_LOG=$unix_log

# qemu-img writes 2 MiB at a time: too large, the workers take them.
all_by workers "qemu-img, 2 MiB" "$TMP/src3.img" "$fs/target.img" \
    qemu-img convert -n -W -f raw -O raw "$TMP/src3.img" "$(uri "$sock")"

# FUA goes to a worker whatever the size; the same size without it does
# not. Pipelined, then read back.
raw_writes () {
    python3 - "$sock" "$LIB_DIR/../hostile/lib" "$1" <<'EOF'
import sys
sys.path.insert(0, sys.argv[2])
import rawnbd as r

name = sys.argv[3].encode()
c = r.Conn(r.UnixServer(sys.argv[1])).open_export(name)
K = 64 << 10
writes = {}
for i in range(16):
    for fua in (0, r.CMD_FLAG_FUA):
        off = (2 * i + (1 if fua else 0)) * K
        data = bytes([i + 1 + (100 if fua else 0)]) * K
        cookie = 1000 + 2 * i + (1 if fua else 0)
        c.request(r.CMD_WRITE, off, K, fua, cookie, data)
        writes[cookie] = (off, data)
for _ in writes:
    err, _ = c.reply()
    r.expect_err(err, 0, "WRITE")
for off, data in writes.values():
    err, got = c.do(r.CMD_READ, off, K)
    r.expect_err(err, 0, "READ at %d" % off)
    r.expect(got == data, "the bytes written at %d read back" % off)
c.request(r.CMD_DISC)
print("32 writes of 64 KiB, 16 with FUA, read back")
EOF
}
traced "$fs/target.img" raw_writes ""
[ "$LOOP" = $((16 << 16)) ] && [ "$IO" = $((16 << 16)) ] ||
    fail "64 KiB writes, half FUA: loops wrote $LOOP, workers $IO bytes"
note "ok: 64 KiB writes: the 16 without FUA by the loops, with FUA by workers"

# sent_out WHAT FILE CMD...: CMD reads FILE out of the server, traced;
# sets SENT to the bytes that left the server by sendfile(2) from FILE.
sent_out () {
    local what=$1 file=$2 t
    shift 2
    traced_writes "$pid" "$file" sendfile "$@"
    SENT=0
    for t in "${!WROTE[@]}"; do SENT=$((SENT + WROTE[$t])); done
    note "$what: $SENT bytes sent from the file's pages"
}

# READ replies from the file in memory leave from its pages, after their
# header: structured ones to qemu-img and nbdcopy. Every copy verified.
sent_out "qemu-img reads" "$fs/target.img" \
    qemu-img convert -f raw -O raw "$(uri "$sock")" "$TMP/out.img"
same "$fs/target.img" "$TMP/out.img"
[ "$SENT" = "$total" ] || fail "qemu-img read $total bytes, $SENT by sendfile"
rm -f "$TMP/out.img"
sent_out "nbdcopy reads" "$fs/target.img" \
    nbdcopy "$(uri "$sock")" "$TMP/out.img"
same "$fs/target.img" "$TMP/out.img"
[ "$SENT" = "$total" ] || fail "nbdcopy read $total bytes, $SENT by sendfile"
rm -f "$TMP/out.img"
note "ok: reads out of the tmpfs export left from the file's pages"
# The same file served read-only: in memory too.
unix_pid=$pid unix_log=$SERVER_LOG
serve_start --unix "$TMP/ro.sock" --read-only "$fs/target.img"
pid=$SERVER_PID
grep -q "export \"$fs/target.img\": file, $total bytes, read-only, in memory$" \
    "$SERVER_LOG" || fail "no read-only in-memory line: $(cat "$SERVER_LOG")"
sent_out "read-only, qemu-img reads" "$fs/target.img" \
    qemu-img convert -f raw -O raw "$(uri "$TMP/ro.sock")" "$TMP/out.img"
same "$fs/target.img" "$TMP/out.img"
[ "$SENT" = "$total" ] ||
    fail "read-only: qemu-img read $total bytes, $SENT by sendfile"
rm -f "$TMP/out.img"
serve_stop "$pid"
pid=$unix_pid SERVER_PID=$unix_pid SERVER_LOG=$unix_log
note "ok: the read-only tmpfs export is in memory, its reads from its pages"
# Over TCP to an address of this host the READ data leaves from buffers,
# measured faster there than the loop's sendfile; --zero-copy asks for
# sendfile anyway.
for zc in "" --zero-copy; do
    serve_tcp $zc --read-only "$fs/target.img"
    pid=$SERVER_PID
    sent_out "TCP loopback${zc:+ $zc}, qemu-img reads" "$fs/target.img" \
        qemu-img convert -f raw -O raw "$URI" "$TMP/out.img"
    same "$fs/target.img" "$TMP/out.img"
    rm -f "$TMP/out.img"
    want=0
    [ -n "$zc" ] && want=$total
    [ "$SENT" = "$want" ] ||
        fail "TCP loopback${zc:+ $zc}: qemu-img read $total bytes, $SENT by sendfile, expected $want"
    serve_stop "$pid"
done
pid=$unix_pid SERVER_PID=$unix_pid SERVER_LOG=$unix_log
note "ok: over TCP loopback reads went through buffers, with --zero-copy from the pages"
if $on_disk; then
    # Data to read (a file of holes would be answered without a READ).
    dd if="$TMP/src.img" of="$TMP/disk.img" bs=1M conv=notrunc status=none
    sent_out "qemu-img reads from $disk_type" "$TMP/disk.img" \
        qemu-img convert -f raw -O raw "nbd+unix:///disk?socket=$sock" "$TMP/out.img"
    same "$TMP/disk.img" "$TMP/out.img"
    [ "$SENT" = 0 ] || fail "$SENT bytes sent from a file on $disk_type"
    rm -f "$TMP/out.img"
    note "ok: reads from the $disk_type export went through buffers"
fi

# Swap switched on after start-up: tmpfs pages may then wait for the swap
# device, so the writes must leave the loops within a sweep or two, and
# come back when it is off. The server sees a swap area in a file mounted
# over /proc/swaps, in this test's private mount namespace alone.
printf 'Filename\tType\tSize\tUsed\tPriority\n/swapfile\tfile\t1048572\t0\t-2\n' \
    >"$TMP/swaps"
mount --bind "$TMP/swaps" /proc/swaps ||
    skip "cannot mount a file over /proc/swaps in the private namespace (the checks above passed)"
on_exit "umount /proc/swaps 2>/dev/null"
# log_waits TEXT: waits up to 5 s for TEXT in the server's log.
log_waits () {
    local i
    for i in $(seq 50); do
        grep -qF "$1" "$SERVER_LOG" && return 0
        sleep 0.1
    done
    fail "no \"$1\" in the server's log within 5 s: $(tail -3 "$SERVER_LOG")"
}
log_waits "export \"$fs/target.img\": swap is active now: its writes go to the workers"
sent_out "swap on, qemu-img reads" "$fs/target.img" \
    qemu-img convert -f raw -O raw "$(uri "$sock")" "$TMP/out.img"
same "$fs/target.img" "$TMP/out.img"
[ "$SENT" = 0 ] || fail "swap on: $SENT bytes sent from the file's pages"
rm -f "$TMP/out.img"
note "ok: swap on: reads went through buffers"
all_by workers "swap on, nbdcopy" "$TMP/src2.img" "$fs/target.img" \
    nbdcopy "$TMP/src2.img" "$(uri "$sock")"
# A /proc/swaps that cannot be read tells nothing, least of all that swap
# is gone: the writes stay with the workers. The mem file of a live
# process opens, but reading it from offset 0 fails.
sleep 600 &
holder=$!
on_exit "kill $holder 2>/dev/null"
mount --bind "/proc/$holder/mem" /proc/swaps ||
    fail "cannot mount a second file over /proc/swaps"
log_waits "cannot read /proc/swaps: Input/output error"
all_by workers "/proc/swaps unreadable, nbdcopy" "$TMP/src3.img" \
    "$fs/target.img" nbdcopy "$TMP/src3.img" "$(uri "$sock")"
! grep -qF "no swap is active now" "$SERVER_LOG" ||
    fail "an unreadable /proc/swaps was taken for no swap: $(tail -3 "$SERVER_LOG")"
umount /proc/swaps # the fake file with a swap area again
kill "$holder"
log_waits "/proc/swaps can be read again"
umount /proc/swaps
log_waits "export \"$fs/target.img\": no swap is active now: writes up to 1 MiB run on the event loop again"
all_by loops "swap off again, nbdcopy" "$TMP/src.img" "$fs/target.img" \
    nbdcopy "$TMP/src.img" "$(uri "$sock")"

if $on_disk; then
    all_by workers "a file on $disk_type" "$TMP/src.img" "$TMP/disk.img" \
        nbdcopy "$TMP/src.img" "nbd+unix:///disk?socket=$sock"
else
    note "the test's directory is on $disk_type: no other file system to compare"
fi
serve_stop
echo "PASS: small writes to memory-backed files run on the event loop"
