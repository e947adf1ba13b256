#!/bin/bash
# vhd-rw-crash.sh: a VHD export killed with SIGKILL in the middle of a
# stream of writes, at a random moment, round after round on the same
# image (a dynamic disk, then a differencing child): each time the file
# passes "info --check" and reads as a VHD by nbdflow and the reader model
# (vhdgen.py), every write acknowledged before a FLUSH (or with FUA) that
# completed reads back unless a later write to the same place may have
# replaced it, and nothing else changed; the write in flight at the kill
# may be found in part, sector by sector, as on a disk. Three connections
# write interleaved 4 KiB runs of the same blocks, allocating as they go,
# with zeroes and trims mixed in.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

size=$((8 << 20))
mkdir "$TMP/p"
gen make "$TMP/p/base.vhd" --type dynamic --size $size --block-size 512K \
    --data "block:1 sect:100-300" --expect "$TMP/p/base.raw"
gen make "$TMP/dyn.vhd" --type dynamic --size $size --block-size 64K \
    --data "sect:0-7" --expect "$TMP/dyn.raw"
gen make "$TMP/child.vhd" --type diff --parent "$TMP/p/base.vhd" \
    --block-size 128K --data "sect:9" --expect "$TMP/child.raw"
rounds=${VHD_CRASH_ROUNDS:-3}

# writer SOCK BASE STATE SEED STARTED: the writers, until the server dies;
# STARTED is made after the first 20 writes; what each run may hold goes
# to STATE (JSON) when the connections are gone.
writer () {
    py - "$LIB_DIR" "$@" <<'PY'
import json, random, sys, threading
sys.path.insert(0, sys.argv[1])
import nbdmini
sock, base_path, state_path, seed = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
started = sys.argv[6]
size = len(open(base_path, "rb").read())
run, nconn = 4096, 3
# per run: the contents it may hold, oldest first; "durable" is how many
# of the first may no longer be there (all but the last acknowledged
# before a completed FLUSH, or with FUA); None: as in the base.
hist = {}
lock = threading.Lock()
def content(i, tag):
    return bytes([tag & 0xFF or 1, (tag >> 8) & 0xFF, i & 0xFF, k_of(i)]) * (run // 4)
def k_of(i):
    return i % nconn
def worker(k):
    rnd = random.Random(seed * 10 + k)
    mine = list(range(k, size // run, nconn))
    acked = []   # (run, index in hist) since the last completed flush
    tag = 0
    try:
        c = nbdmini.Conn(sock)
        while True:
            i = rnd.choice(mine)
            tag += 1
            kind = rnd.random()
            with lock:
                h = hist.setdefault(i, {"vals": [None], "durable": 0})
                if kind < 0.8:
                    h["vals"].append(content(i, tag).hex())
                else:
                    h["vals"].append("zero")
                idx = len(h["vals"]) - 1
            fua = rnd.random() < 0.1
            if kind < 0.8:
                c.write(i * run, content(i, tag), fua=fua)
            elif kind < 0.9:
                c.zero(i * run, run, fua=fua)
            else:
                # a trim is a zeroing only on a dynamic disk: a zero here
                c.zero(i * run, run, no_hole=True, fua=fua)
            with lock:
                if fua:
                    h["durable"] = max(h["durable"], idx)
                acked.append((i, idx))
            if tag == 20 and k == 0:
                open(started, "w").close()
            if rnd.random() < 0.08:
                c.flush()
                with lock:
                    for j, x in acked:
                        hist[j]["durable"] = max(hist[j]["durable"], x)
                acked = []
    except (ConnectionError, OSError, nbdmini.NBDError):
        pass
ts = [threading.Thread(target=worker, args=(k,)) for k in range(nconn)]
for t in ts:
    t.start()
for t in ts:
    t.join()
json.dump(hist, open(state_path, "w"))
PY
}

# verify WHAT RAW BASE STATE: RAW (the image read after the kill) holds,
# in every run, one of the contents it may hold, and elsewhere BASE.
verify () {
    py - "$@" <<'PY'
import json, sys
what, raw, base, state = sys.argv[1:5]
got = open(raw, "rb").read()
base = open(base, "rb").read()
hist = json.load(open(state))
run = 4096
touched = set()
writes = durable = torn = 0
for i, h in hist.items():
    i = int(i)
    touched.add(i)
    now = got[i * run:(i + 1) * run]
    ok = []
    for v in h["vals"][h["durable"]:]:
        ok.append(base[i * run:(i + 1) * run] if v is None else
                  bytes(run) if v == "zero" else bytes.fromhex(v))
    writes += len(h["vals"]) - 1
    durable += h["durable"] > 0
    # The write in flight when the server died may be there in part:
    # the kernel ends a killed process's write between two pages, and a
    # block's data lies 512 bytes off the page grid. Each sector then
    # holds the last write's bytes or the ones before.
    if now not in ok and len(ok) >= 2 and all(
            now[s:s + 512] in (ok[-1][s:s + 512], ok[-2][s:s + 512])
            for s in range(0, run, 512)):
        torn += 1
    elif now not in ok:
        sys.exit("%s: run %d (offset %d) holds none of the %d contents it "
                 "may (the last %d writes of %d)" % (what, i, i * run, len(ok),
                 len(ok), len(h["vals"]) - 1))
for i in range(len(got) // run):
    if i not in touched and got[i * run:(i + 1) * run] != base[i * run:(i + 1) * run]:
        sys.exit("%s: run %d changed, and nothing wrote it" % (what, i))
print("%s: %d writes, %d runs with a flushed write, %d torn by the kill, "
      "all as they may be" % (what, writes, durable, torn))
PY
}

# Each round starts from the image as made, so that every round kills the
# server while it allocates blocks; the last goes on from the one before,
# over the lost space a kill can leave.
for img in dyn child; do
    vhd=$TMP/$img.work.vhd
    for r in $(seq 1 "$rounds"); do
        if [ "$r" -lt "$rounds" ]; then
            cp "$TMP/$img.vhd" "$vhd"
            cp "$TMP/$img.raw" "$TMP/base.raw"
        fi
        sock=$TMP/$img.$r.sock
        rm -f "$TMP/started"
        serve_start --unix "$sock" "vhd:$vhd"
        writer "$sock" "$TMP/base.raw" "$TMP/state.json" "$r" "$TMP/started" &
        wpid=$!
        wait_for test -e "$TMP/started"
        # 0 to 390 ms into the stream
        sleep "0.$((RANDOM % 4))$((RANDOM % 10))"
        kill -KILL "$SERVER_PID"
        wait "$SERVER_PID" 2>/dev/null || true
        forget_pid "$SERVER_PID"
        wait "$wpid" || fail "$img round $r: the writer failed"
        ok "$img round $r: info --check" info --check "vhd:$vhd"
        grep -q 'result: clean' "$TMP/out" ||
            fail "$img round $r: not clean after SIGKILL: $(cat "$TMP/out")"
        ok "$img round $r: copy out" copy "vhd:$vhd" "$TMP/after.raw"
        verify "$img round $r" "$TMP/after.raw" "$TMP/base.raw" \
            "$TMP/state.json" >&2 || fail "$img round $r: see above"
        gen read "$vhd" "$TMP/after.model" >/dev/null
        same "$TMP/after.model" "$TMP/after.raw"
        cp "$TMP/after.raw" "$TMP/base.raw"
    done
done
[ "$(gen read "$TMP/p/base.vhd" "$TMP/p.now" >/dev/null; sha "$TMP/p.now")" = \
  "$(sha "$TMP/p/base.raw")" ] || fail "the parent changed"
echo "PASS"
