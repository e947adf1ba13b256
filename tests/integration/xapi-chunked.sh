#!/bin/bash
# xapi-chunked.sh: xapi's Chunked framing, both ways and against a
# reference written apart from our code (xapiref.py): our sender into the
# reference receiver, the reference sender into our receiver
# (serve --chunked-listen), ours into ours, frames into a file and '-'
# decoded by the reference; zero ranges sent as data unless
# --target-is-zero; every copy verified.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
# flushed_is N: the server has logged N complete Chunked streams.
flushed_is () { [ "$(grep -c 'chunked into "disk".*flushed' "$SERVER_LOG")" = "$1" ]; }
REF=$(dirname "$0")/xapiref.py
make_sparse "$TMP/src.img" 24 "0:3 10:1 23:1"
# An odd tail: the last frame is shorter than 512 bytes.
head -c 12345 /dev/urandom >>"$TMP/src.img"
size=$(stat -c %s "$TMP/src.img")

# ref_recv OUT: the reference receiver on a free port; sets RPORT, RPID.
ref_recv () {
    RPORT=$(free_port)
    rm -f "$TMP/ready"
    truncate -s 0 "$1"
    truncate -s "$size" "$1"
    python3 "$REF" recv-chunked "$RPORT" "$1" "$TMP/ready" >"$TMP/ref.out" 2>&1 &
    RPID=$!
    wait_for test -s "$TMP/ready"
}

ref_recv "$TMP/a.img"
check "copy -> reference receiver (chunked+tcp)" \
    "$NBDFLOW" copy "$TMP/src.img" "chunked+tcp://127.0.0.1:$RPORT"
wait "$RPID" || fail "reference receiver: $(cat "$TMP/ref.out")"
same "$TMP/src.img" "$TMP/a.img"
# Without --target-is-zero the zeroes are sent too: every byte arrives.
grep -q " $size bytes$" "$TMP/ref.out" ||
    fail "zeroes were not sent as data: $(cat "$TMP/ref.out")"

# With --target-is-zero only the data goes: 5 MiB and the tail.
ref_recv "$TMP/b.img"
check "copy --target-is-zero -> reference receiver" \
    "$NBDFLOW" copy --target-is-zero "$TMP/src.img" \
    "chunked+tcp://127.0.0.1:$RPORT"
wait "$RPID" || fail "reference receiver: $(cat "$TMP/ref.out")"
same "$TMP/src.img" "$TMP/b.img"
sent=$(awk '{print $4}' "$TMP/ref.out")
[ "$sent" -lt $((8 << 20)) ] ||
    fail "--target-is-zero still sent $sent bytes"

# Frames into a file and to stdout, decoded by the reference.
check "copy --dst-protocol chunked into a file" \
    "$NBDFLOW" copy --dst-protocol chunked "$TMP/src.img" "$TMP/frames"
truncate -s "$size" "$TMP/c.img"
check "reference decodes the file" python3 "$REF" decode "$TMP/frames" "$TMP/c.img"
same "$TMP/src.img" "$TMP/c.img"
"$NBDFLOW" copy --dst-protocol chunked "$TMP/src.img" - >"$TMP/frames2" ||
    fail "copy --dst-protocol chunked to '-' failed"
truncate -s "$size" "$TMP/d.img"
check "reference decodes stdout's frames" \
    python3 "$REF" decode "$TMP/frames2" "$TMP/d.img"
same "$TMP/src.img" "$TMP/d.img"

# The reference sender into our receiver, and ours into ours.
truncate -s "$size" "$TMP/exp.img"
CPORT=$(free_port)
serve_tcp --chunked-listen "127.0.0.1:$CPORT" "disk=$TMP/exp.img"
check "reference sender -> serve --chunked-listen" \
    python3 "$REF" send-chunked 127.0.0.1 "$CPORT" "$TMP/src.img"
wait_for grep -q 'chunked into "disk".*flushed' "$SERVER_LOG"
same "$TMP/src.img" "$TMP/exp.img"
truncate -s 0 "$TMP/exp.img"
truncate -s "$size" "$TMP/exp.img"
check "copy -> serve --chunked-listen" \
    "$NBDFLOW" copy "$TMP/src.img" "chunked+tcp://127.0.0.1:$CPORT"
wait_for flushed_is 2
same "$TMP/src.img" "$TMP/exp.img"

# A frame that arrives in small segments: each takes a slot of the pipe
# it is spliced into, which fills long before its bytes do. The receiver
# used to spin on the full pipe, never to finish or stop.
truncate -s 0 "$TMP/exp.img"
truncate -s "$size" "$TMP/exp.img"
check "a 2 MiB frame in 1448-byte segments -> serve --chunked-listen" \
    timeout 60 python3 - "$CPORT" "$TMP/src.img" <<'PY'
import socket, struct, sys, time
d = open(sys.argv[2], "rb").read(2 << 20)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.sendall(struct.pack("<QI", 0, len(d)))
for i in range(0, len(d), 1448):
    s.sendall(d[i:i + 1448])
    if i % (64 * 1448) == 0:
        time.sleep(0.001)
s.sendall(bytes(12))
s.shutdown(socket.SHUT_WR)
s.settimeout(30)
if s.recv(1) != b"":
    sys.exit("the receiver said something instead of closing")
PY
wait_for flushed_is 3
cmp -n $((2 << 20)) "$TMP/src.img" "$TMP/exp.img" ||
    fail "the frame sent in small segments differs"
# The same segments, then the sender closes in the middle of the frame:
# the full pipe hid the EOF from splice, and the session spun on it.
check "256 small segments of a frame, then a close" python3 - "$CPORT" <<'PY'
import socket, struct, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.sendall(struct.pack("<QI", 0, 1 << 20))
for _ in range(256):
    s.send(b"x" * 100)
    time.sleep(0.001)
time.sleep(0.5)
s.close()
PY
wait_for grep -q "the sender closed the connection 25600 bytes into the 1048576" \
    "$SERVER_LOG"
t0=$(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat")
sleep 1
t1=$(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat")
[ $((t1 - t0)) -lt $(($(getconf CLK_TCK) / 4)) ] ||
    fail "the server spins after a sender closed mid-frame ($((t1 - t0)) ticks in 1 s)"
note "ok: a sender that closed mid-frame: logged, the server idle"

# Never a lone 12-byte header write (Nagle and delayed ACKs would stall
# it): traced, with --split-writes (the stock sender's shape) as the
# proof that the check sees one when it happens.
if can_strace; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    # normal: over TCP to a loopback address, the buffer path;
    # zerocopy: --zero-copy, payloads by sendfile after a corked header.
    for mode in normal zerocopy split; do
        extra=()
        [ "$mode" = split ] && extra=(--split-writes)
        [ "$mode" = zerocopy ] && extra=(--zero-copy)
        strace -f -qq -e trace=write,writev,sendmsg,sendto,sendfile -o "$TMP/st.$mode" \
            "$NBDFLOW" copy "${extra[@]}" "$TMP/src.img" \
            "chunked+tcp://127.0.0.1:$CPORT" ||
            fail "traced copy ($mode) failed"
    done
    wait_for flushed_is 6
    same "$TMP/src.img" "$TMP/exp.img"
    grep -q '^[0-9]* *sendfile(' "$TMP/st.zerocopy" ||
        fail "--zero-copy: the trace shows no sendfile"
    ! grep -q '^[0-9]* *sendfile(' "$TMP/st.normal" ||
        fail "the default copy over loopback TCP used sendfile"
    # The end marker is a header with nothing to follow, and a header
    # sent with MSG_MORE waits in the kernel for the payload that
    # sendfile appends (they leave as one): neither is counted.
    for mode in normal zerocopy; do
        lone=$(grep -E '(write|writev|sendmsg|sendto)\(.*\) = 12$' "$TMP/st.$mode" |
               grep -vF 'MSG_MORE' |
               grep -cvF '"\0\0\0\0\0\0\0\0\0\0\0\0"' || true)
        [ "$lone" = 0 ] || fail "$mode: $lone lone 12-byte writes: $(grep -E '= 12$' "$TMP/st.$mode" | head -3)"
    done
    split=$(grep -E '(write|writev|sendmsg|sendto)\(.*\) = 12$' "$TMP/st.split" |
            grep -cvF '"\0\0\0\0\0\0\0\0\0\0\0\0"' || true)
    [ "$split" -gt 0 ] || fail "the trace shows no 12-byte write even with --split-writes"
    note "ok: no lone 12-byte write (--split-writes: $split)"
else
    note "skipped the write trace: strace cannot trace here"
fi
serve_stop
note "ok: chunked both ways, verified"
