#!/bin/bash
# vhd-bad.sh: one damaged image per class (vhdgen.py corrupt), each
# refused by copy, info and sum with a non-zero status, no hang, no crash
# and exactly one line that names the file and says what is wrong:
# checksum (footer, header; --ignore-checksums then copies the right
# bytes), truncated, a BAT entry past the end, a block size that is not a
# power of two, a missing parent (naming the path looked for), a parent
# whose UUID changed, chain loops (a disk its own parent, A -> B -> A), and
# a footer copy that disagrees with the footer, an unknown disk type, a
# fixed disk's footer that says it is dynamic, and a fixed disk whose
# data reaches into its footer. Blocks that overlap the header or each
# other are read but never written (copy into, serve writable: refused),
# and a file size limit is a one-line error.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

# bad WHAT FILE REGEX [NAME...]: copy, info and sum of FILE as VHD are
# refused with one line matching REGEX that names FILE (or one of NAMEs).
bad () {
    local what=$1 file=$2 re=$3
    shift 3
    [ $# -gt 0 ] || set -- "$file"
    refused "$what: copy" copy --src-format vhd "$file" "$TMP/bad.out"
    err_names "$@"
    err_says "$re"
    refused "$what: info" info -f vhd "$file"
    err_names "$@"
    err_says "$re"
    refused "$what: sum" sum "vhd:$file"
    err_names "$@"
    err_says "$re"
}

gen make "$TMP/good.vhd" --type dynamic --size 4M --block-size 512K \
    --data "block:0,3 sect:2000-2010" --garbage --expect "$TMP/good.raw"
gen make "$TMP/fixed.vhd" --type fixed --size 4M --data "block:1 sect:3" \
    --expect "$TMP/fixed.raw"

# Checksums: the content is intact, so --ignore-checksums reads it.
for kind in footer-checksum header-checksum; do
    gen corrupt "$TMP/good.vhd" "$TMP/$kind.vhd" --kind "$kind"
    bad "$kind" "$TMP/$kind.vhd" checksum
    refused "$kind: probed copy" copy "$TMP/$kind.vhd" "$TMP/bad.out"
    err_names "$TMP/$kind.vhd"
    err_says checksum
    ok "$kind: copy --ignore-checksums" copy --ignore-checksums \
        "$TMP/$kind.vhd" "$TMP/$kind.out"
    same "$TMP/$kind.out" "$TMP/good.raw"
done
gen corrupt "$TMP/fixed.vhd" "$TMP/fixed-checksum.vhd" --kind footer-checksum
bad "fixed footer checksum" "$TMP/fixed-checksum.vhd" checksum
ok "fixed footer checksum: --ignore-checksums" copy --ignore-checksums \
    --src-format vhd "$TMP/fixed-checksum.vhd" "$TMP/fixed.out"
same "$TMP/fixed.out" "$TMP/fixed.raw"

# The layout.
gen corrupt "$TMP/good.vhd" "$TMP/truncated.vhd" --kind truncated
bad truncated "$TMP/truncated.vhd" 'truncated|shorter'
gen corrupt "$TMP/good.vhd" "$TMP/bat.vhd" --kind bat-past-end
bad "BAT past the end" "$TMP/bat.vhd" 'BAT'
gen corrupt "$TMP/good.vhd" "$TMP/pow2.vhd" --kind block-size-not-pow2
bad "3 MiB blocks" "$TMP/pow2.vhd" 'power of two'
gen corrupt "$TMP/good.vhd" "$TMP/copy.vhd" --kind footer-copy-mismatch
bad "footer copy mismatch" "$TMP/copy.vhd" 'footer'
# A disk type none of 2, 3 and 4 is named (not taken for an old 511-byte
# footer with a bad cookie); a fixed disk's footer that says "dynamic"
# names the missing header, not an offset of 2^64 - 1.
gen corrupt "$TMP/good.vhd" "$TMP/type.vhd" --kind disk-type
bad "disk type 5" "$TMP/type.vhd" 'disk type 5 is none of'
gen corrupt "$TMP/fixed.vhd" "$TMP/fixdyn.vhd" --kind fixed-as-dynamic
bad "fixed footer typed dynamic" "$TMP/fixdyn.vhd" 'names no dynamic header'

# Parents. The locators of these children are W2ru and MacX (relative) and
# W2ku (absolute): every one names the parent's path.
mkdir "$TMP/p"
gen make "$TMP/p/base.vhd" --type dynamic --size 4M --data "block:1"
gen make "$TMP/p/kid.vhd" --type diff --parent "$TMP/p/base.vhd" \
    --data "sect:1-9"
rm "$TMP/p/base.vhd"
bad "missing parent" "$TMP/p/kid.vhd" 'parent' base.vhd

gen make "$TMP/p/base2.vhd" --type dynamic --size 4M --data "block:1"
gen make "$TMP/p/kid2.vhd" --type diff --parent "$TMP/p/base2.vhd" \
    --data "sect:1-9"
gen corrupt "$TMP/p/base2.vhd" "$TMP/p/base2.vhd" --kind parent-uuid
bad "parent UUID" "$TMP/p/kid2.vhd" 'UUID' kid2.vhd base2.vhd

gen make "$TMP/p/base3.vhd" --type dynamic --size 4M --data "block:1"
gen make "$TMP/p/kid3.vhd" --type diff --parent "$TMP/p/base3.vhd" \
    --data "sect:1-9"
gen corrupt "$TMP/p/kid3.vhd" "$TMP/p/self.vhd" --kind loop
bad "its own parent" "$TMP/p/self.vhd" 'loop'
gen make "$TMP/p/A.vhd" --type diff --parent "$TMP/p/base3.vhd" --data "sect:1"
gen make "$TMP/p/B.vhd" --type diff --parent "$TMP/p/A.vhd" --data "sect:2"
gen relink "$TMP/p/A.vhd" --parent "$TMP/p/B.vhd"
bad "A -> B -> A" "$TMP/p/B.vhd" 'loop' A.vhd B.vhd

# A fixed disk whose size reaches into its 512-byte footer: its last
# byte would be the footer's first. Refused to read, and as DST it is
# neither written into nor replaced by a new image.
gen make "$TMP/fx.vhd" --type fixed --size 1M
python3 - "$TMP/fx.vhd" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
f.seek(-512, 2)
ft = bytearray(f.read())
struct.pack_into(">Q", ft, 48, (1 << 20) + 1)
struct.pack_into(">I", ft, 64, 0)
struct.pack_into(">I", ft, 64, ~sum(ft) & 0xFFFFFFFF)
f.seek(-512, 2)
f.write(ft)
PY
bad "fixed disk into its footer" "$TMP/fx.vhd" 'do not fit'
fx_sum=$(sha "$TMP/fx.vhd")
refused "fixed disk into its footer: copy into it" copy "pattern:1048577" \
    "vhd:$TMP/fx.vhd"
err_says 'do not fit'
[ "$(sha "$TMP/fx.vhd")" = "$fx_sum" ] || fail "the damaged fixed disk was written"

# Blocks that overlap the dynamic header, or each other: read (info
# --check says what is wrong), but never written: a write would damage
# the image (a bitmap bit over the header) or show in another block.
gen make "$TMP/ov.vhd" --type dynamic --size 8M --block-size 512K \
    --data block:0,1
cp "$TMP/ov.vhd" "$TMP/ov2.vhd"
python3 - "$TMP/ov.vhd" "$TMP/ov2.vhd" <<'PY'
import sys
f = open(sys.argv[1], "r+b")      # block 1 at sector 1: the header
f.seek(1536 + 4)
f.write((1).to_bytes(4, "big"))
g = open(sys.argv[2], "r+b")      # block 1 where block 0 is
g.seek(1536)
g.write(g.read(4))
PY
for f in ov ov2; do
    s=$(sha "$TMP/$f.vhd")
    refused "$f: copy into it" copy pattern:8M "vhd:$TMP/$f.vhd"
    err_says 'overlaps (the dynamic header|another block).*can be read, not written'
    refused "$f: serve it writable" serve --unix "$TMP/$f.sock" "vhd:$TMP/$f.vhd"
    err_says 'overlaps'
    [ "$(sha "$TMP/$f.vhd")" = "$s" ] || fail "$f: the image was written"
done
serve_start --read-only --unix "$TMP/ovr.sock" "vhd:$TMP/ov.vhd"
serve_stop

# A file size limit (ulimit -f) is EFBIG, said in one line, not a death
# by SIGXFSZ (exit 153 without a word).
qemu-img create -q -f vpc "$TMP/lim.vhd" 64M 2>/dev/null ||
    gen make "$TMP/lim.vhd" --type dynamic --size 64M
rc=0
(ulimit -f 1024; exec "$NBDFLOW" copy pattern:64M "vhd:$TMP/lim.vhd") \
    2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] || fail "copy under ulimit -f: exit $rc: $(cat "$TMP/err")"
grep -q "File too large" "$TMP/err" ||
    fail "copy under ulimit -f: $(cat "$TMP/err")"
note "ok: copy under ulimit -f: $(cat "$TMP/err")"
ok "ulimit -f: the image is still whole" info --check "vhd:$TMP/lim.vhd"
echo "PASS"
