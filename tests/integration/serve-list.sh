#!/bin/bash
# nbdinfo --list names every export; a file export without NAME= is named
# by its path as given; the first export is also the default one; and
# nbdflow info --list shows each export as nbdinfo --list does.
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

# nbdflow info --list shows what nbdinfo --list shows: every export with
# its size, flags and a URI that opens it (the path of the last export
# needs percent-encoding).
"$NBDFLOW" info --list --json "$URI" >"$TMP/ours.json" ||
    fail "nbdflow info --list"
python3 - "$TMP/ours.json" "$TMP/list.json" <<'PY' || fail "info --list differs from nbdinfo --list"
import json, sys
ours, theirs = (json.load(open(p)) for p in sys.argv[1:3])
def key(doc):
    return {e["export-name"]: {k: v for k, v in e.items()
                               if k in ("uri", "export-size", "export-size-str")
                               or k.startswith(("is_", "can_"))}
            for e in doc["exports"]}
a, b = key(ours), key(theirs)
assert a == b, (a, b)
print("same %d exports as nbdinfo --list" % len(a))
PY
python3 -c 'import json, sys
for e in json.load(open(sys.argv[1]))["exports"]:
    print(e["uri"], e["export-size"])' "$TMP/ours.json" >"$TMP/uris"
while read -r uri size; do
    [ "$(nbdinfo --size "$uri")" = "$size" ] || fail "$uri does not open its export"
done <"$TMP/uris"
"$NBDFLOW" info --list "$URI" >"$TMP/ours.txt" || fail "info --list (text)"
[ "$(grep -c '^export=' "$TMP/ours.txt")" = 5 ] ||
    fail "info --list: not 5 exports: $(cat "$TMP/ours.txt")"
serve_stop
echo "PASS: --list names every export"
