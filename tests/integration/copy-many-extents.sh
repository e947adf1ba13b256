#!/bin/bash
# copy-many-extents.sh: servers that describe their data in many small
# extents.
# - A server may send up to 2^20 extents in one block status chunk (the
#   spec's SHOULD NOT starts past that), and nbdkit does: here 2^17 of
#   them (512 MiB of alternating 4 KiB data and holes from its sh
#   plugin, in its reply to the first request). info --map prints the
#   map nbdinfo prints.
# - More extents than the client keeps from one reply must not make it
#   ask for the same long range again and again (the server would send
#   the rest of its extents each time, n^2 in all): the lengths asked
#   for add up to at most 3 times the export, for info --map and for a
#   copy (from nbdkit's file plugin, 16384 extents), which must land
#   exactly.
# nbdkit's log filter records every request.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need nbdinfo libnbd-bin
need python3
tmpdir_make

# asked LOG SIZE WHAT: the Extents requests in LOG ask for at most 3 x SIZE.
asked () {
    python3 - "$1" "$2" "$3" <<'PY' || fail "$3: block status asked too much"
import re, sys
total = sum(int(m.group(1), 16) for m in re.finditer(
    r"Extents id=\d+ offset=0x[0-9a-f]+ count=(0x[0-9a-f]+)",
    open(sys.argv[1]).read()))
size = int(sys.argv[2])
print("%s: %d MiB of block status asked for, export %d MiB"
      % (sys.argv[3], total >> 20, size >> 20), file=sys.stderr)
assert size <= total <= 3 * size, total
PY
}

cat >"$TMP/frag.sh" <<'SH'
#!/bin/sh
case "$1" in
    get_size) echo $((512 << 20)) ;;
    pread) head -c "$3" /dev/zero ;;
    can_extents) exit 0 ;;
    extents) awk -v c="$3" -v o="$4" 'BEGIN {
        for (x = o - o % 4096; x < o + c; x += 4096)
            printf "%d 4096 %s\n", x, (x / 4096) % 2 ? "hole,zero" : "" }' ;;
    *) exit 2 ;;
esac
SH
chmod +x "$TMP/frag.sh"
kit "$TMP/frag.sock" --filter=log sh "$TMP/frag.sh" logfile="$TMP/frag.log"
"$NBDFLOW" info --map "$(uri "$TMP/frag.sock")" >"$TMP/fmap" ||
    fail "info --map of a server sending 2^17 extents in a chunk"
asked "$TMP/frag.log" $((512 << 20)) "info --map"
nbdinfo --map "$(uri "$TMP/frag.sock")" | awk '{print $1, $2, $3}' \
    >"$TMP/fmap.theirs"
awk '{print $1, $2, $3}' "$TMP/fmap" | diff -q - "$TMP/fmap.theirs" >&2 ||
    fail "the map of 2^17 extents differs from nbdinfo's"
[ "$(wc -l <"$TMP/fmap")" = 131072 ] ||
    fail "$(wc -l <"$TMP/fmap") extents, not 131072"
note "ok: 2^17 extents in one chunk, mapped as nbdinfo maps them"

# A 64 MiB file of 4 KiB data and 4 KiB holes, copied out of nbdkit.
make_striped "$TMP/frag.img" 64 8192
kit "$TMP/file.sock" --filter=log file "$TMP/frag.img" \
    logfile="$TMP/file.log"
check "copy of 16384 extents" \
    "$NBDFLOW" copy "$(uri "$TMP/file.sock")" "$TMP/out.img"
same "$TMP/frag.img" "$TMP/out.img"
asked "$TMP/file.log" $((64 << 20)) "copy"
echo "PASS"
