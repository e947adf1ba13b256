#!/bin/bash
# info-nbdinfo.sh: "nbdflow info --json" agrees with "nbdinfo --json" on
# size (also as export-size-str) and flags for nbdkit and qemu-nbd, and
# --list on a server without a default export; --map matches the holes
# (over NBD and for the same file read locally).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need nbdinfo libnbd-bin
need qemu-nbd qemu-utils
tmpdir_make
nbdkit -f -U "$TMP/k.sock" memory 5M >>"$TMP/s.log" 2>&1 &
SERVER_PIDS+=($!)
nbdkit -f -U "$TMP/o.sock" memory 1000000 >>"$TMP/s.log" 2>&1 &
SERVER_PIDS+=($!)
make_sparse "$TMP/q.img" 8 "2:1"
qemu-nbd -f raw -t -r -k "$TMP/q.sock" "$TMP/q.img" >>"$TMP/s.log" 2>&1 &
SERVER_PIDS+=($!)
# No default export, and qemu-nbd's default of one client at a time.
qemu-nbd -f raw -t -r -x qx -k "$TMP/x.sock" "$TMP/q.img" >>"$TMP/s.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/k.sock"
wait_for test -S "$TMP/x.sock"
wait_for test -S "$TMP/q.sock"
wait_for test -S "$TMP/o.sock"

for s in k q o; do
    uri="nbd+unix:///?socket=$TMP/$s.sock"
    "$NBDFLOW" info --json "$uri" >"$TMP/ours.json" || fail "info failed"
    nbdinfo --json "$uri" >"$TMP/theirs.json" || fail "nbdinfo failed"
    python3 - "$TMP/ours.json" "$TMP/theirs.json" <<'PY' || fail "$s: disagree"
import json, sys
a = json.load(open(sys.argv[1]))["exports"][0]
b = json.load(open(sys.argv[2]))["exports"][0]
keys = ["export-size", "export-size-str"]
keys += [k for k in b if k.startswith(("is_", "can_"))]
bad = [(k, a.get(k), b[k]) for k in keys if a.get(k) != b[k]]
assert not bad, bad
assert len(keys) > 8
PY
    note "ok: $s: size and flags agree with nbdinfo"
    # The text form's size line too (o's size is no whole unit).
    theirs=$(nbdinfo "$uri" | grep "export-size:")
    [ "$("$NBDFLOW" info "$uri" | grep "export-size:")" = "$theirs" ] ||
        fail "$s: export-size line differs from nbdinfo's: $theirs"
done
# A local file's size is written the same way.
[ "$("$NBDFLOW" info "$TMP/q.img" | grep "export-size:")" = \
  "$(nbdinfo "nbd+unix:///?socket=$TMP/q.sock" | grep "export-size:")" ] ||
    fail "a file's export-size line differs from the export's"
# --list asks for the list on a connection of its own, ended with
# NBD_OPT_ABORT before the export's own connection opens: it works without
# a default export, and does not wait on a server of one client at a time.
uri="nbd+unix:///?socket=$TMP/x.sock"
timeout 20 "$NBDFLOW" info --list --json "$uri" >"$TMP/ours.json" ||
    fail "info --list on a server without a default export failed"
nbdinfo --list --json "$uri" >"$TMP/theirs.json" || fail "nbdinfo --list failed"
python3 - "$TMP/ours.json" "$TMP/theirs.json" <<'PY' || fail "--list: disagree"
import json, sys
a = json.load(open(sys.argv[1]))
b = json.load(open(sys.argv[2]))
assert a["export-names"] == ["qx"], a
ea = [(e["export-name"], e["export-size"]) for e in a["exports"]]
eb = [(e["export-name"], e["export-size"]) for e in b["exports"]]
assert ea == eb == [("qx", 8 << 20)], (ea, eb)
PY
note "ok: --list without a default export agrees with nbdinfo"
"$NBDFLOW" info --map "nbd+unix:///?socket=$TMP/q.sock" >"$TMP/map"
grep -Eq '^ *2097152 +1048576 +0 +data$' "$TMP/map" ||
    fail "map lacks the data extent: $(cat "$TMP/map")"
grep -Eq '^ *3145728 +5242880 +3 +hole,zero$' "$TMP/map" ||
    fail "map lacks the trailing hole: $(cat "$TMP/map")"
"$NBDFLOW" info --map "$TMP/q.img" | diff - "$TMP/map" >&2 ||
    fail "file map differs from the NBD map"
"$NBDFLOW" info --map --json "$TMP/q.img" | python3 -c '
import json, sys; m = json.load(sys.stdin)
assert sum(e["length"] for e in m) == 8 << 20' || fail "JSON map wrong"
echo "PASS"
