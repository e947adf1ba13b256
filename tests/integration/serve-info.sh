#!/bin/bash
# nbdinfo --json against each export kind: size, flags, block sizes; and
# the read-only flag with --read-only; nbdflow info failing on a full
# stdout, and writing its report directly when it has no spool directory.
. "$(dirname "$0")/lib.sh"
need nbdinfo libnbd-bin
need python3
tmpdir_make

make_random "$TMP/disk.img" 8

# check_json JSON_FILE EXPR...: each EXPR is a Python expression over e
# (the first export object) that must be true.
check_json () {
    local file=$1; shift
    python3 - "$file" "$@" <<'PY' || fail "nbdinfo JSON check failed ($file)"
import json, sys
doc = json.load(open(sys.argv[1]))
e = doc["exports"][0]
bad = 0
for expr in sys.argv[2:]:
    ok = eval(expr, {}, {"e": e, "doc": doc})
    print("%s: %s" % ("ok" if ok else "NOT OK", expr))
    bad += not ok
if bad:
    print("export object:", json.dumps(e, indent=1))
sys.exit(1 if bad else 0)
PY
}

serve_tcp "$TMP/disk.img" mem=memory:64M nul=null:1G

common=(
    'e["is_read_only"] is False'
    'e["can_flush"] and e["can_fua"] and e["can_trim"] and e["can_zero"]'
    'e["can_multi_conn"] is True'
    'e["block_size_minimum"] == 1'
    'e["block_size_preferred"] == 4096'
    'e["block_size_maximum"] == 32 * 1024 * 1024'
    'doc["protocol"] == "newstyle-fixed"'
    'doc["structured"] is True'
    '"base:allocation" in e.get("contexts", [])'
    '"description" not in e'
)

nbdinfo --json "$URI" >"$TMP/default.json" || fail "nbdinfo of the default export"
check_json "$TMP/default.json" 'e["export-size"] == 8 * 1024 * 1024' "${common[@]}"
nbdinfo --json "$URI/mem" >"$TMP/mem.json" || fail "nbdinfo of mem"
check_json "$TMP/mem.json" 'e["export-size"] == 64 * 1024 * 1024' "${common[@]}"
nbdinfo --json "$URI/nul" >"$TMP/nul.json" || fail "nbdinfo of nul"
check_json "$TMP/nul.json" 'e["export-size"] == 1024 ** 3' "${common[@]}"
check_fails "nbdinfo of an unknown export fails" \
    nbdinfo --json "$URI/no-such-export" >/dev/null
serve_stop
# The client asks INFO, then GO, then leaves: one line says why.
[ "$(grep -c 'no export "no-such-export"' "$SERVER_LOG")" = 1 ] ||
    fail "unknown export: not one line: $(cat "$SERVER_LOG")"
! grep -q "during the handshake" "$SERVER_LOG" ||
    fail "unknown export: a second line: $(cat "$SERVER_LOG")"
# nbdinfo ends each session with ABORT and leaves without reading the
# answer, as the spec allows: that is no warning.
[ "$(grep -c "warning" "$SERVER_LOG")" = 1 ] ||
    fail "warnings beside the refusal: $(cat "$SERVER_LOG")"

# Read-only, with a description (NBD_INFO_DESCRIPTION) for every export.
desc='Backup of vm-17, 2026 (ünïcode)'
serve_tcp --read-only --description "$desc" "$TMP/disk.img" mem=memory:1M
nbdinfo --json "$URI" >"$TMP/ro.json" || fail "nbdinfo, read-only"
check_json "$TMP/ro.json" 'e["is_read_only"] is True' \
    'e["export-size"] == 8 * 1024 * 1024' \
    "e.get('description') == '$desc'"
nbdinfo --json "$URI/mem" >"$TMP/ro-mem.json" || fail "nbdinfo mem, read-only"
check_json "$TMP/ro-mem.json" 'e["is_read_only"] is True' \
    'e["export-size"] == 1024 * 1024' "e.get('description') == '$desc'"
nbdinfo --list --json "$URI" >"$TMP/list.json" || fail "nbdinfo --list"
python3 - "$TMP/list.json" "$desc" <<'PY' || fail "descriptions in LIST"
import json, sys
doc = json.load(open(sys.argv[1]))
got = [e.get("description") for e in doc["exports"]]
assert got == [sys.argv[2]] * 2, got
PY

# A report that cannot be written is a failure, not a silent exit 0.
rc=0
"$NBDFLOW" info --map "$URI/mem" >/dev/full 2>"$TMP/err" || rc=$?
[ "$rc" -ne 0 ] || fail "info --map to a full stdout exited 0"
grep -q "writing the report: No space left on device" "$TMP/err" ||
    fail "info to a full stdout: $(cat "$TMP/err")"
note "ok: info to a full stdout: $(cat "$TMP/err")"
# The report is spooled in TMPDIR; without a usable one it is written as
# it comes, with a warning naming the directory. (Not under valgrind,
# which cannot start without a usable TMPDIR itself.)
if [ -n "${NBDFLOW_WRAPPER:-}" ]; then
    note "skip: info without a spool directory (TMPDIR) under a wrapper"
else
TMPDIR=$TMP/none "$NBDFLOW" info --map "$URI/mem" >"$TMP/out" 2>"$TMP/err" ||
    fail "info --map without a spool directory: $(cat "$TMP/err")"
grep -q "no spool file in $TMP/none" "$TMP/err" ||
    fail "info without a spool directory: $(cat "$TMP/err")"
[ "$(awk '{print $1, $2}' "$TMP/out")" = "0 1048576" ] ||
    fail "info --map without a spool directory printed: $(cat "$TMP/out")"
note "ok: info without a spool directory: $(cat "$TMP/err")"
fi
serve_stop
echo "PASS: nbdinfo --json sizes and flags"
