#!/bin/bash
# vhd-check.sh: "nbdflow info --check" of VHD images. A clean image (a
# chain's child, a fixed disk, one with a batmap and locators) exits 0
# saying "clean"; space that nothing points at is a note, still clean.
# Errors exit 1 and name what is wrong: a BAT entry past the end of the
# file, two BAT entries pointing at one block, a block over the BAT, a
# footer copy that differs from the footer, bad checksums. A raw file has
# nothing to check; --check goes with no other mode.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

# clean WHAT ARGS...: info --check ARGS exits 0 and says clean.
clean () {
    local what=$1; shift
    ok "$what" info --check "$@"
    grep -q 'result: clean' "$TMP/out" || fail "$what: $(cat "$TMP/out")"
}

# dirty WHAT REGEX ARGS...: info --check ARGS exits 1, its report says
# REGEX (extended, case-insensitive) on an error line.
dirty () {
    local what=$1 re=$2; shift 2
    run info --check "$@"
    [ "$RC" = 1 ] || fail "$what: exit $RC, want 1: $(cat "$TMP/out" "$TMP/err")"
    grep -qE 'result: [0-9]+ errors?' "$TMP/out" || fail "$what: $(cat "$TMP/out")"
    grep -iE "error: .*($re)" "$TMP/out" >/dev/null ||
        fail "$what: no error line says /$re/: $(cat "$TMP/out")"
    note "ok: $what: $(grep -i 'error:' "$TMP/out" | head -2 | tr '\n' ' ')"
}

mkdir "$TMP/p"
gen make "$TMP/p/base.vhd" --type dynamic --size 8M --block-size 512K \
    --data "block:1,3 sect:7-9 empty:5" --batmap right
gen make "$TMP/child.vhd" --type diff --parent "$TMP/p/base.vhd" \
    --locators w2ru,w2ku,macx --data "sect:9-12,5000 block:2"
gen make "$TMP/fixed.vhd" --type fixed --size 3M --data "block:0"
clean "a dynamic disk with a batmap" "$TMP/p/base.vhd"
grep -q 'lost-bytes: 0$' "$TMP/out" || fail "lost space in a made image: $(cat "$TMP/out")"
clean "a differencing child" "vhd:$TMP/child.vhd"
grep -q 'lost-bytes: 0$' "$TMP/out" || fail "lost space in a child: $(cat "$TMP/out")"
clean "a fixed disk" "vhd:$TMP/fixed.vhd"

# Lost space: 64 KiB of nothing before the footer.
py - "$TMP/p/base.vhd" "$TMP/lost.vhd" <<'PY'
import sys
b = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(b[:-512] + bytes(65536) + b[-512:])
PY
clean "lost space" "$TMP/lost.vhd"
grep -q 'lost-bytes: 65536$' "$TMP/out" || fail "lost space: $(cat "$TMP/out")"
grep -qi 'note: .*lost' "$TMP/out" || fail "lost space: no note: $(cat "$TMP/out")"
note "ok: lost space is a note"

# BAT surgery: entry A := entry B, or := the BAT's own sector.
bat () {
    py - "$@" <<'PY'
import struct, sys
src, dst, i, what = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
b = bytearray(open(src, "rb").read())
hoff = struct.unpack(">Q", b[16:24])[0]
table = struct.unpack(">Q", b[hoff + 16:hoff + 24])[0]
if what == "bat":
    v = table // 512
else:
    v = struct.unpack(">I", b[table + 4 * int(what):table + 4 * int(what) + 4])[0]
struct.pack_into(">I", b, table + 4 * i, v)
open(dst, "wb").write(b)
PY
}
bat "$TMP/p/base.vhd" "$TMP/twice.vhd" 0 1
dirty "two BAT entries, one block" "overlaps" "$TMP/twice.vhd"
bat "$TMP/p/base.vhd" "$TMP/overbat.vhd" 0 bat
dirty "a block over the BAT" "overlaps" "$TMP/overbat.vhd"
gen corrupt "$TMP/p/base.vhd" "$TMP/past.vhd" --kind bat-past-end
dirty "a BAT entry past the end" "BAT entry [0-9]+ points" "$TMP/past.vhd"
gen corrupt "$TMP/p/base.vhd" "$TMP/copy.vhd" --kind footer-copy-mismatch
dirty "the footer copy differs" "footer copy" "$TMP/copy.vhd"
gen corrupt "$TMP/p/base.vhd" "$TMP/fsum.vhd" --kind footer-checksum
dirty "footer checksum" "checksum" "$TMP/fsum.vhd"
# Only the footer at the end damaged, in its checksum: the copy at 0
# differs from it there, and the check names the byte.
cp "$TMP/p/base.vhd" "$TMP/esum.vhd"
sz=$(stat -c %s "$TMP/esum.vhd")
b=$(od -An -tu1 -j $((sz - 512 + 67)) -N1 "$TMP/esum.vhd" | tr -d ' ')
printf "\\$(printf %03o $(((b + 1) % 256)))" |
    dd of="$TMP/esum.vhd" bs=1 seek=$((sz - 512 + 67)) conv=notrunc status=none
dirty "end footer checksum" "differs from the footer at the end: byte 67 of 512 \(the checksum\)" \
    "$TMP/esum.vhd"
gen corrupt "$TMP/p/base.vhd" "$TMP/hsum.vhd" --kind header-checksum
dirty "header checksum" "checksum" "$TMP/hsum.vhd"

# Nothing to check, and modes that do not go together.
head -c 1M /dev/zero >"$TMP/raw.img"
refused "a raw file" info --check "$TMP/raw.img"
err_says "raw"
run info --check --map "$TMP/p/base.vhd"
[ "$RC" = 2 ] || fail "--check --map: exit $RC"
note "ok: --check --map is a usage error"
echo "PASS"
