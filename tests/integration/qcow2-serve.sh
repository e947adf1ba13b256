#!/bin/bash
# qcow2-serve.sh: "nbdflow serve" of qcow2 images on a Unix socket. A
# backing chain named qcow2:PATH (and NAME=qcow2:PATH): nbdinfo sees its
# virtual size and, in --map, data exactly where qemu-img map sees data
# and holes (hole,zero) everywhere else; nbdcopy and qemu-img convert read
# it back as qemu-img reads the image. A probed image with a backing file
# is refused at start, one line naming the backing file. A standalone
# qcow2 served as raw:PATH (the file's bytes) is read through NBD with
# --src-format qcow2 (copy, also into a qcow2), sum -f qcow2 and info -f
# qcow2 as the image; untold, the export's bytes are copied as they are.
# A large hole maps in one reply (qemu-img map, nbdinfo --map).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdinfo libnbd-bin
need nbdcopy libnbd-bin
tmpdir_make
. "$(dirname "$0")/qcow2.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

K=1024 M=$((1 << 20))
size=$((8 * M))

# nbd_map_is WHAT URI QCOW2: nbdinfo --map of URI covers the disk, shows
# data (type 0) exactly where qemu-img map of QCOW2 shows data, and
# hole,zero (type 3) everywhere else.
nbd_map_is () {
    local what=$1 u=$2 img=$3
    nbdinfo --map --json "$u" >"$TMP/nbdmap.json" || fail "$what: nbdinfo --map"
    qemu-img map -f qcow2 --output=json "$img" >"$TMP/qmap.json" ||
        fail "$what: qemu-img map"
    py - "$TMP/nbdmap.json" "$TMP/qmap.json" <<'PY' >&2 ||
import json, sys
got = json.load(open(sys.argv[1]))
q = json.load(open(sys.argv[2]))
size = q[-1]["start"] + q[-1]["length"]
def runs(items):
    out = []
    for s, n, data in items:
        if n == 0:
            continue
        if out and out[-1][2] == data and out[-1][0] + out[-1][1] == s:
            out[-1][1] += n
        else:
            out.append([s, n, data])
    return out
end = 0
for e in got:
    if e["offset"] != end:
        sys.exit("nbdinfo --map: a gap or overlap at %d: %s" % (end, e))
    end += e["length"]
    if e["type"] not in (0, 3):
        sys.exit("nbdinfo --map: type %d (%s) at %d: want data (0) or a "
                 "zero hole (3)" % (e["type"], e.get("description"), e["offset"]))
if end != size:
    sys.exit("nbdinfo --map covers %d bytes of %d" % (end, size))
mine = runs((e["offset"], e["length"], e["type"] == 0) for e in got)
want = runs((e["start"], e["length"], e["data"]) for e in q)
if mine != want:
    sys.exit("nbdinfo --map differs from qemu-img map:\n  nbd:  %s\n  qemu: %s"
             % (mine, want))
print("%d runs, %d of them holes" % (len(mine), sum(1 for r in mine if not r[2])))
PY
        fail "$what: nbdinfo --map does not show data and holes where qemu-img map does (above)"
    note "ok: $what: nbdinfo --map shows data and holes where qemu-img map does"
}

# 8 MiB: random data in MiB 0, 3 and 6, holes between.
make_sparse "$TMP/src.raw" 8 "0:1 3:1 6:1"

# ---- A chain: a/base.qcow2 <- b/mid.qcow2 (v2) <- c/top.qcow2 ---------------
mkdir "$TMP/a" "$TMP/b" "$TMP/c"
qemu-img convert -f raw -O qcow2 -c "$TMP/src.raw" "$TMP/a/base.qcow2"
qemu-img create -q -f qcow2 -o compat=0.10,cluster_size=4k -b ../a/base.qcow2 -F qcow2 \
    "$TMP/b/mid.qcow2" 8M
qio "$TMP/b/mid.qcow2" "write -P 0x21 $((M + 512 * K)) $((M))" \
    "write -P 0x22 $((5 * M)) $((8 * K))"
qemu-img create -q -f qcow2 -b ../b/mid.qcow2 -F qcow2 "$TMP/c/top.qcow2" 8M
qio "$TMP/c/top.qcow2" "write -P 0x31 $((100 * K)) $((4 * K))" \
    "write -z $((3 * M)) $((256 * K))" "write -z -u $((6 * M + 64 * K)) $((64 * K))" \
    "write -c -P 0x32 $((7 * M)) $((64 * K))"
qref "$TMP/c/top.qcow2" "$TMP/top.raw"
qref "$TMP/b/mid.qcow2" "$TMP/mid.raw"

# Probed, it is refused at start.
serve_launch --unix "$TMP/probe.sock" "$TMP/c/top.qcow2" && rc=0 || rc=$?
[ "$rc" = 1 ] || fail "a probed qcow2 with a backing file was served (serve_launch: $rc)"
if [ "$SERVER_RC" = 0 ] || [ "$SERVER_RC" -ge 128 ]; then
    fail "probed qcow2 with a backing file: server exit status $SERVER_RC"
fi
[ "$(grep -c . "$SERVER_LOG")" = 1 ] ||
    fail "probed qcow2 with a backing file: want one line, got: $(cat "$SERVER_LOG")"
if ! grep -q '^nbdflow' "$SERVER_LOG" || ! grep -qF mid.qcow2 "$SERVER_LOG" ||
    ! grep -qE -- '-f qcow2|qcow2:' "$SERVER_LOG"; then
    fail "probed qcow2 with a backing file: $(cat "$SERVER_LOG")"
fi
note "ok: probed qcow2 with a backing file refused: $(cat "$SERVER_LOG")"
: >"$SERVER_LOG"

sock=$TMP/chain.sock
serve_start --unix "$sock" "qcow2:$TMP/c/top.qcow2" "mid=qcow2:$TMP/b/mid.qcow2" \
    "plain=$TMP/a/base.qcow2"
u=$(uri "$sock")
[ "$(nbdinfo --size "$u")" = "$size" ] || fail "chain: nbdinfo --size $(nbdinfo --size "$u")"
nbd_map_is "chain" "$u" "$TMP/c/top.qcow2"
nbdcopy "$u" "$TMP/top.nbdcopy" || fail "nbdcopy of the chain"
same_bytes "chain: nbdcopy" "$TMP/top.nbdcopy" "$TMP/top.raw"
qemu-img convert -f raw -O raw "$u" "$TMP/top.qemu" || fail "qemu-img convert of the chain"
same_bytes "chain: qemu-img convert -f raw nbd+unix" "$TMP/top.qemu" "$TMP/top.raw"
ok "chain: nbdflow copy of the export" copy "$u" "$TMP/top.copy"
same_bytes "chain: nbdflow copy" "$TMP/top.copy" "$TMP/top.raw"
mu="nbd+unix:///mid?socket=$sock"
nbd_map_is "mid=qcow2:PATH" "$mu" "$TMP/b/mid.qcow2"
nbdcopy "$mu" "$TMP/mid.nbdcopy" || fail "nbdcopy of mid"
same_bytes "mid: nbdcopy" "$TMP/mid.nbdcopy" "$TMP/mid.raw"
pu="nbd+unix:///plain?socket=$sock"
nbd_map_is "a probed qcow2 (compressed)" "$pu" "$TMP/a/base.qcow2"
qemu-img convert -f raw -O raw "$pu" "$TMP/plain.qemu" || fail "qemu-img convert of plain"
same_bytes "plain: qemu-img convert" "$TMP/plain.qemu" "$TMP/src.raw"
serve_stop

# ---- A qcow2 held raw by an NBD export: --src-format qcow2 reads it ----------
img=$TMP/standalone.qcow2
qemu-img convert -f raw -O qcow2 "$TMP/src.raw" "$img"
qio "$img" "write -z $((3 * M + 128 * K)) $((128 * K))" "write -z -u $((6 * M)) $((64 * K))" \
    "write -c -P 0x41 $((5 * M)) $((64 * K))" "write -P 0x42 $((8 * M - 4 * K)) $((4 * K))"
qref "$img" "$TMP/standalone.raw"
sha256 "$TMP/standalone.raw"
want=$SHA
sock=$TMP/raw.sock
serve_start --unix "$sock" "raw:$img" "top=raw:$TMP/c/top.qcow2"
u=$(uri "$sock")
[ "$(nbdinfo --size "$u")" = "$(stat -c %s "$img")" ] ||
    fail "raw:PATH: export size $(nbdinfo --size "$u")"
ok "untold: the export's bytes" copy "$u" "$TMP/untold.out"
same_bytes "untold" "$TMP/untold.out" "$img"
ok "copy --src-format qcow2 of the export" copy --src-format qcow2 "$u" "$TMP/nbd.out"
same_bytes "copy --src-format qcow2 of NBD" "$TMP/nbd.out" "$TMP/standalone.raw"
ok "sum -f qcow2 of the export" sum -f qcow2 --algo sha256 "$u"
read -r got _ <"$TMP/out"
[ "$got" = "$want" ] || fail "sum -f qcow2 of the export: $(cat "$TMP/out"), want $want"
ok "info -f qcow2 of the export" info -f qcow2 "$u"
[ "$(field format)" = qcow2 ] || fail "info -f qcow2: format '$(field format)'"
[ "$(field disk-type)" = "version 3" ] || fail "info -f qcow2: disk-type '$(field disk-type)'"
[ "$(field export-size | cut -d' ' -f1)" = "$size" ] ||
    fail "info -f qcow2: export-size '$(field export-size)', want $size"
[ "$(field block-size)" = 65536 ] || fail "info -f qcow2: block-size '$(field block-size)'"
head -n 1 "$TMP/out" | grep -q "^export: " ||
    fail "info -f qcow2 of an export calls it: $(head -n 1 "$TMP/out")"
ok "info --json -f qcow2 of the export" info --json -f qcow2 "$u"
grep -q '"protocol": "nbd"' "$TMP/out" ||
    fail "info --json -f qcow2 of an export: $(head -n 3 "$TMP/out")"
note "ok: info -f qcow2 of the export: qcow2, version 3, $size bytes"
ok "copy --src-format qcow2 of the export into a qcow2" copy --src-format qcow2 "$u" \
    "$TMP/nbd.qcow2" --dst-format qcow2
qemu-img compare -q -f raw -F qcow2 "$TMP/standalone.raw" "$TMP/nbd.qcow2" ||
    fail "NBD -> qcow2: qemu-img compare says it differs"
qemu-img check -q -f qcow2 "$TMP/nbd.qcow2" || fail "NBD -> qcow2: qemu-img check"
note "ok: NBD (a qcow2) -> qcow2: identical, clean"
# A qcow2 with a backing file held by an export: no backing file is
# opened through NBD, so it is refused, naming the backing file.
refused "an export holding a qcow2 with a backing file" copy --src-format qcow2 \
    "nbd+unix:///top?socket=$sock" "$TMP/nbdtop.out"
err_names mid.qcow2
serve_stop

# Block status of a large hole: one reply for all of it, whatever the
# cluster size. Each reply used to stop after as many clusters as it may
# hold runs (one with REQ_ONE, which qemu always sets): qemu-img map of
# this empty 1 GiB image of 512-byte clusters took 205 s.
qemu-img create -q -f qcow2 -o cluster_size=512 "$TMP/e512.qcow2" 1G
serve_start --unix "$sock" "qcow2:$TMP/e512.qcow2"
timeout 20 qemu-img map -f raw --output=json "nbd+unix:///?socket=$sock" \
    >"$TMP/qmap" || fail "qemu-img map of an empty 1 GiB qcow2: exit $? (20 s)"
grep -q '"start": 0, "length": 1073741824,.*"data": false' "$TMP/qmap" ||
    fail "qemu-img map of an empty 1 GiB qcow2: $(head -c 300 "$TMP/qmap")"
timeout 20 nbdinfo --map "nbd+unix:///?socket=$sock" >"$TMP/nmap" ||
    fail "nbdinfo --map of an empty 1 GiB qcow2: exit $?"
[ "$(wc -l <"$TMP/nmap")" = 1 ] && grep -q '^ *0 *1073741824 *3 *hole,zero' "$TMP/nmap" ||
    fail "nbdinfo --map of an empty 1 GiB qcow2: $(head -3 "$TMP/nmap")"
note "ok: an empty 1 GiB qcow2 of 512-byte clusters maps as one hole"
serve_stop
echo "PASS"
