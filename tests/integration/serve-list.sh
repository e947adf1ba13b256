#!/bin/bash
# nbdinfo --list names every export; a file export without NAME= is named
# by its path as given; the first export is also the default one.
. "$(dirname "$0")/lib.sh"
need nbdinfo libnbd-bin
tmpdir_make

make_random "$TMP/a.img" 1
make_random "$TMP/b.img" 2
cd "$TMP" || fail "cd"
serve_tcp a.img second=b.img memory:3M zeros=null:4M "$TMP/b.img"

nbdinfo --list --json "$URI" >"$TMP/list.json" || fail "nbdinfo --list"
python3 - "$TMP/list.json" "$TMP/b.img" <<'PY' || fail "export list is wrong"
import json, sys
doc = json.load(open(sys.argv[1]))
names = {e["export-name"]: e for e in doc["exports"]}
print("listed:", sorted(names))
want = {"a.img": 1, "second": 2, "memory:3M": 3, "zeros": 4, sys.argv[2]: 2}
bad = 0
for n, mib in want.items():
    if n not in names:
        print("NOT OK: %r not listed" % n); bad += 1
    elif names[n]["export-size"] != mib << 20:
        print("NOT OK: %r size %d, want %d" % (n, names[n]["export-size"], mib << 20)); bad += 1
    else:
        print("ok: %r listed, %d MiB" % (n, mib))
extra = set(names) - set(want) - {""}
if extra:
    print("NOT OK: unexpected exports listed: %r" % sorted(extra)); bad += 1
sys.exit(1 if bad else 0)
PY
# Each listed name really opens the export it names.
for n in a.img second zeros; do
    nbdinfo --size "$URI/$n" >"$TMP/size" || fail "nbdinfo --size of $n"
done
[ "$(nbdinfo --size "$URI")" = 1048576 ] || fail "default export is not the first"
[ "$(nbdinfo --size "$URI/second")" = 2097152 ] || fail "export second has the wrong size"
serve_stop
echo "PASS: --list names every export"
