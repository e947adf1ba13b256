#!/bin/bash
# nbdinfo --map on a sparse file export reports holes and data where they
# were written; a memory export tracks its own allocation.
. "$(dirname "$0")/lib.sh"
need nbdinfo libnbd-bin
need nbdcopy libnbd-bin
tmpdir_make

layout="1:2 5:1 8:3 15:1"   # MiB start:length of data in a 16 MiB image
make_sparse "$TMP/sparse.img" 16 "$layout"
# The file system must really keep the holes, or the test means nothing.
python3 - "$TMP/sparse.img" <<'PY' || skip "the file system of TMPDIR does not keep holes"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
sys.exit(0 if os.lseek(fd, 0, os.SEEK_DATA) == 1 << 20 else 1)
PY

# check_map MAP_JSON HOLE_TYPES: every MiB in the layout reads as data
# (type 0), every other MiB has one of the hole types (a set, e.g. "3" or
# "2,3": 1 hole, 2 zero).
check_map () {
    python3 - "$1" "$layout" "$2" <<'PY'
import json, sys
ext = json.load(open(sys.argv[1]))
data = set()
for d in sys.argv[2].split():
    s, n = map(int, d.split(":"))
    data.update(range(s, s + n))
holes = {int(t) for t in sys.argv[3].split(",")}
mib = 1 << 20
end = 0
bad = 0
for e in ext:
    if e["offset"] != end:
        print("NOT OK: gap or overlap at %d" % e["offset"]); bad += 1
    end = e["offset"] + e["length"]
    for m in range(e["offset"] // mib, (end + mib - 1) // mib):
        want_data = m in data
        if want_data and e["type"] != 0:
            print("NOT OK: MiB %d written but type %d" % (m, e["type"])); bad += 1
        if not want_data and e["type"] not in holes:
            print("NOT OK: MiB %d is a hole but type %d" % (m, e["type"])); bad += 1
if end != 16 * mib:
    print("NOT OK: map ends at %d" % end); bad += 1
print("%d extents, %d problems" % (len(ext), bad))
sys.exit(1 if bad else 0)
PY
}

serve_tcp "$TMP/sparse.img" mem=memory:16M
nbdinfo --map --json "$URI" >"$TMP/file.map" || fail "nbdinfo --map"
cat "$TMP/file.map" >&2
check_map "$TMP/file.map" 3 || fail "file export map does not match the holes written"
note "ok: file export map matches"

# Copy the sparse image into the memory export, then map that.
nbdcopy "$TMP/sparse.img" "$URI/mem" || fail "nbdcopy into mem"
nbdinfo --map --json "$URI/mem" >"$TMP/mem.map" || fail "nbdinfo --map mem"
cat "$TMP/mem.map" >&2
check_map "$TMP/mem.map" 2,3 || fail "memory export map does not match"
note "ok: memory export map matches"
nbdcopy "$URI/mem" "$TMP/back.img" || fail "nbdcopy out of mem"
same "$TMP/sparse.img" "$TMP/back.img"

# A fresh memory export is all hole.
nbdinfo --map --json "$URI/mem" >/dev/null || fail "map"
serve_stop
serve_tcp memory:8M
nbdinfo --map --json "$URI" >"$TMP/empty.map" || fail "nbdinfo --map of a fresh memory export"
python3 -c '
import json, sys
ext = json.load(open(sys.argv[1]))
sys.exit(0 if all(e["type"] & 2 for e in ext) and sum(e["length"] for e in ext) == 8 << 20 else 1)
' "$TMP/empty.map" || fail "a fresh memory export is not reported as zero"
serve_stop
echo "PASS: --map matches the holes and data"
