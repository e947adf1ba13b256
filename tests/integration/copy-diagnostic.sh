#!/bin/bash
# copy-diagnostic.sh: the diagnostic options of nbdflow copy really change
# what goes on the wire, seen from the system calls (strace) and the
# client's own report, and every copy still lands byte for byte:
#   --nagle          no TCP_NODELAY is set on the NBD socket;
#   --split-writes   each WRITE header is a 28-byte send of its own, its
#                    payload another one (buffer path) or a sendfile after
#                    a header sent without MSG_MORE (sendfile path);
#   --max-requests 1 peak_depth 1, and a reply is read between any two
#                    request headers;
# and the stock shape (all three) against a server that delays its ACKs
# (nbdkit) stalls, which --json counts and --progress warns about.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need_strace
tmpdir_make

make_random "$TMP/src.img" 4
SIZE=$((4 << 20))

# kit_start: nbdkit's file plugin on a fresh zeroed destination over TCP;
# sets KURI and KPID.
KN=0
kit_start () {
    local port i
    KN=$((KN + 1))
    rm -f "$TMP/dst.img"
    truncate -s "$SIZE" "$TMP/dst.img"
    port=$(free_port) || fail "no free port"
    nbdkit -f -i 127.0.0.1 -p "$port" file "$TMP/dst.img" \
        >>"$TMP/kit.$KN.log" 2>&1 &
    KPID=$!
    SERVER_PIDS+=("$KPID")
    for i in $(seq 100); do
        nbdinfo --size "nbd://127.0.0.1:$port" >/dev/null 2>&1 && break
        sleep 0.1
    done
    KURI=nbd://127.0.0.1:$port
}
# Stops it, and forgets it: the exit cleanup must not trip over a pid
# that is gone.
kit_stop () {
    local p keep=()
    kill "$KPID" 2>/dev/null
    wait "$KPID" 2>/dev/null || true
    for p in "${SERVER_PIDS[@]}"; do [ "$p" = "$KPID" ] || keep+=("$p"); done
    SERVER_PIDS=("${keep[@]}")
}

# traced NAME SRC COPY-OPTIONS...: one traced copy into a fresh nbdkit;
# JSON report in $TMP/NAME.json, trace in $TMP/NAME.st, and the copy must
# land byte for byte.
traced () {
    local name=$1 src=$2; shift 2
    kit_start
    check "copy $name" strace -qq -o "$TMP/$name.st" \
        -e trace=setsockopt,sendmsg,sendto,write,writev,sendfile,recvmsg,recvfrom,read \
        "$NBDFLOW" copy --json --connections 1 "$@" "$src" "$KURI" \
        >"$TMP/$name.json"
    kit_stop
    if [ "$src" = "$TMP/src.img" ]; then
        same "$TMP/src.img" "$TMP/dst.img"
    else
        "$NBDFLOW" copy "$src" "$TMP/want.img" || fail "cannot expand $src"
        same "$TMP/want.img" "$TMP/dst.img"
    fi
}

# The analysis: counts, in the trace of the main thread (which runs the
# event loop and so every socket call), what the test asserts below, as
# KEY=VALUE lines. Only WRITE request headers count as headers.
analyse () {
    python3 - "$TMP/$1.st" "$TMP/$1.json" <<'PY'
import json, re, sys
trace, report = sys.argv[1], json.load(open(sys.argv[2]))
# NBD request magic 0x25609513, flags 0, type 1 (WRITE), as strace shows it
magic = '"%`\\225\\23\\0\\0\\0\\1'
nodelay = hdr_alone = hdr_more = hdr_with_payload = payload_alone = 0
sendfiles = headers = 0
events = []                       # 'H' request header out, 'R' reply in
for line in open(trace):
    if "TCP_NODELAY" in line:
        nodelay += 1
    m = re.search(r'\b(sendmsg|recvmsg|recvfrom|read|sendfile)\((\d+), (.*)\) = (-?\d+)', line)
    if not m:
        continue
    call, body, ret = m.group(1), m.group(3), int(m.group(4))
    if call == "sendfile" and ret > 0:
        sendfiles += 1
    elif call == "sendmsg" and ret > 0:
        lens = [int(x) for x in re.findall(r'iov_len=(\d+)', body)]
        nh = body.count(magic)
        if nh:
            headers += nh
            events.append("H")
            if lens == [28]:
                hdr_alone += 1
                if "MSG_MORE" in body:
                    hdr_more += 1
            elif len(lens) > 1:
                hdr_with_payload += 1
        elif lens and lens[0] > 28 and len(lens) == 1:
            payload_alone += 1
    elif call in ("recvmsg", "recvfrom", "read") and ret > 0 and "gDf\\230" in body:
        events.append("R")        # simple reply magic 0x67446698
    elif call in ("recvmsg", "recvfrom") and ret > 0:
        events.append("R")
seq = "".join(events)
print("nodelay=%d" % nodelay)
print("headers=%d" % headers)
print("hdr_alone=%d" % hdr_alone)
print("hdr_more=%d" % hdr_more)
print("hdr_with_payload=%d" % hdr_with_payload)
print("payload_alone=%d" % payload_alone)
print("sendfiles=%d" % sendfiles)
print("back_to_back=%d" % seq.count("HH"))
print("peak_depth=%d" % report["peak_depth"])
print("requests=%d" % report["requests"])
print("stall_pct=%.1f" % report.get("tcp", {}).get("stall_pct", -1))
PY
}

# val NAME KEY: one figure of analyse's output for trace NAME.
val () { sed -n "s/^$2=//p" "$TMP/$1.an"; }

run () {
    local name=$1; shift
    traced "$name" "$@"
    analyse "$name" >"$TMP/$name.an" || fail "cannot analyse $name"
    note "$name: $(tr '\n' ' ' <"$TMP/$name.an")"
}

GEN=random:$SIZE:7   # a generated source takes the buffer path
run plain "$GEN" --request-size 64K
run nagle "$GEN" --request-size 64K --nagle
run split "$GEN" --request-size 64K --split-writes
run depth1 "$GEN" --request-size 64K --max-requests 1
# Over TCP to this host a file source takes the buffer path unless
# --zero-copy asks for sendfile.
run filesplit "$TMP/src.img" --request-size 64K --split-writes --zero-copy
run filedefault "$TMP/src.img" --request-size 64K --zero-copy

WRITES=$((SIZE / 65536))
# Nagle.
[ "$(val plain nodelay)" -ge 1 ] || fail "default copy set no TCP_NODELAY"
[ "$(val nagle nodelay)" = 0 ] || fail "--nagle still set TCP_NODELAY"
note "ok: --nagle leaves TCP_NODELAY off"
# Split writes, buffer path.
[ "$(val plain hdr_alone)" = 0 ] || fail "default copy sent a header alone"
[ "$(val plain hdr_with_payload)" -ge 1 ] || fail "default copy never batched a header with its payload"
[ "$(val split hdr_alone)" -ge "$WRITES" ] ||
    fail "--split-writes: $(val split hdr_alone) lone headers for $WRITES writes"
[ "$(val split hdr_with_payload)" = 0 ] || fail "--split-writes batched a header with data"
[ "$(val split payload_alone)" -ge "$WRITES" ] || fail "--split-writes: payloads not sent on their own"
note "ok: --split-writes sends header and payload separately (buffer path)"
# Split writes, sendfile path: the header goes without MSG_MORE.
[ "$(val filedefault sendfiles)" -ge 1 ] || fail "--zero-copy did not take the sendfile path"
[ "$(val filedefault hdr_more)" -ge "$WRITES" ] || fail "default sendfile headers lack MSG_MORE"
[ "$(val filesplit hdr_alone)" -ge "$WRITES" ] || fail "--split-writes (sendfile): headers not alone"
[ "$(val filesplit hdr_more)" = 0 ] || fail "--split-writes (sendfile): a header still had MSG_MORE"
note "ok: --split-writes drops MSG_MORE on the sendfile path"
# One request in flight.
[ "$(val plain peak_depth)" -gt 1 ] || fail "default copy never had two requests in flight"
[ "$(val depth1 peak_depth)" = 1 ] || fail "--max-requests 1: peak_depth $(val depth1 peak_depth)"
[ "$(val depth1 back_to_back)" = 0 ] ||
    fail "--max-requests 1: two request headers left with no reply read in between"
[ "$(val plain back_to_back)" -ge 1 ] || fail "default copy never sent two headers in a row"
note "ok: --max-requests 1 waits for every reply"

# The stock shape against nbdkit, which delays its ACKs: 512-byte writes
# wait ~40 ms each for the ACK of their header. The copy takes a few
# seconds; --json counts the stalls and --progress warns.
kit_start
check "stock-shaped copy" "$NBDFLOW" copy --json --progress=json \
    --connections 1 --request-size 512 --nagle --split-writes \
    --max-requests 1 "random:64K:3" "$KURI" \
    >"$TMP/stock.json" 2>"$TMP/stock.progress"
kit_stop
"$NBDFLOW" copy random:64K:3 "$TMP/want64.img" || fail "cannot expand"
head -c 65536 "$TMP/dst.img" >"$TMP/dst64.img"
same "$TMP/want64.img" "$TMP/dst64.img"
python3 - "$TMP/stock.json" "$TMP/stock.progress" <<'PY' ||
import json, sys
r = json.load(open(sys.argv[1]))
assert r["tcp"]["stall_pct"] > 20, "stall_pct %s" % r["tcp"]["stall_pct"]
assert r["diagnostic"] == {"nagle": True, "split_writes": True,
                           "max_requests": 1}, r["diagnostic"]
warn = [json.loads(l) for l in open(sys.argv[2])
        if l.startswith("{") and "warning" in l]
assert len(warn) == 1, "expected one warning line, got %d" % len(warn)
assert warn[0]["warning"] == "tcp_stalls" and warn[0]["stall_pct"] > 5, warn
PY
    fail "stock shape: no stalls counted or no warning: $(cat "$TMP/stock.json" "$TMP/stock.progress")"
note "ok: the stock shape stalls against nbdkit and --progress warns"

# The same copy without the diagnostic options stalls far less and warns
# not at all (it is also much faster, but tests do not time).
kit_start
check "plain small-request copy" "$NBDFLOW" copy --json --progress=json \
    --connections 1 --request-size 512 "random:64K:3" "$KURI" \
    >"$TMP/fast.json" 2>"$TMP/fast.progress"
kit_stop
head -c 65536 "$TMP/dst.img" >"$TMP/dst64.img"
same "$TMP/want64.img" "$TMP/dst64.img"
if grep -q '"warning"' "$TMP/fast.progress"; then
    fail "a plain copy warned about stalls: $(cat "$TMP/fast.progress")"
fi
note "ok: no warning without the diagnostic options"
echo "PASS: diagnostic options change the wire; copies verified"
