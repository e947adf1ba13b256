#!/bin/bash
# image-edges.sh: edges of the format layer that an outside review found.
# - An image held by an NBD server that takes only whole 4 KiB blocks is
#   still read (the format's small reads go through a bounce buffer).
# - An empty disk written as a VHD or qcow2 reads back through our reader.
# - "null:NAME" given to info names a file of that name, not NAME.
# - A block device is never probed: only a named format reads one as an
#   image (checked where a loop device can be had).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need qemu-img qemu-utils
tmpdir_make

make_sparse "$TMP/src.raw" 8 "0:1 5:2"
qemu-img convert -q -f raw -O qcow2 "$TMP/src.raw" "$TMP/img.qcow2"
[ $(( $(stat -c %s "$TMP/img.qcow2") % 4096 )) = 0 ] ||
    fail "qemu-img wrote a qcow2 that is not whole 4 KiB blocks"
kit "$TMP/kit.sock" --filter=blocksize-policy file "$TMP/img.qcow2" \
    blocksize-minimum=4096 blocksize-preferred=4096 \
    blocksize-error-policy=error
u=$(uri "$TMP/kit.sock")
"$NBDFLOW" copy --src-format qcow2 "$u" "$TMP/out.raw" ||
    fail "copy of a qcow2 from a server of 4 KiB blocks failed"
same "$TMP/out.raw" "$TMP/src.raw"
"$NBDFLOW" info -f qcow2 "$u" >"$TMP/info" || fail "info -f qcow2 failed"
grep -q "format: qcow2" "$TMP/info" || fail "info: $(cat "$TMP/info")"
note "ok: an image read from a server of 4 KiB blocks"

: >"$TMP/empty.raw"
# With --no-flush too: the empty image was once made only by the final
# flush, so it was left a 0-byte file that nothing could open.
for f in vhd qcow2; do
  for nf in "" --no-flush; do
    rm -f "$TMP/empty.$f"
    "$NBDFLOW" copy $nf "$TMP/empty.raw" "$TMP/empty.$f" --dst-format $f ||
        fail "empty disk to $f $nf failed"
    "$NBDFLOW" info -f $f "$TMP/empty.$f" >"$TMP/info" ||
        fail "our reader refuses the empty $f we wrote ($nf)"
    grep -q "export-size: 0" "$TMP/info" || fail "empty $f: $(cat "$TMP/info")"
    [ "$(qemu-img info --output=json "$TMP/empty.$f" |
         sed -n 's/.*"virtual-size": \([0-9]*\).*/\1/p')" = 0 ] ||
        fail "qemu-img sees a non-empty $f ($nf)"
  done
done
note "ok: empty disks written and read back"

# --destination-is-zero into a new image: the image is written in order,
# so its zero pieces are written too (they were skipped, and the writer
# then refused the next piece as out of order).
for f in vhd qcow2; do
    q=$f; [ $f = vhd ] && q=vpc
    rm -f "$TMP/dz.$f"
    "$NBDFLOW" copy --destination-is-zero "$TMP/src.raw" "$TMP/dz.$f" \
        --dst-format $f 2>"$TMP/err" ||
        fail "--destination-is-zero into a new $f: $(cat "$TMP/err")"
    qemu-img compare -q -f raw -F $q "$TMP/src.raw" "$TMP/dz.$f" ||
        fail "--destination-is-zero into a new $f: not the source"
done
# --base says DST holds BASE: a new image holds nothing. Refused before
# the file is made.
rc=0
"$NBDFLOW" copy --base "$TMP/src.raw" "$TMP/src.raw" "$TMP/nb.vhd" \
    --dst-format vhd 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -q "cannot already hold BASE" "$TMP/err" &&
    [ ! -e "$TMP/nb.vhd" ] ||
    fail "--base into a new image: status $rc: $(cat "$TMP/err")"
# The same for a raw DST that holds nothing (a file that does not exist,
# an empty one, '-', a FIFO): the unchanged blocks would read as zeroes. One that
# holds BASE gets only the change.
cp "$TMP/src.raw" "$TMP/mod.raw"
printf 'XXXX' | dd of="$TMP/mod.raw" bs=1 seek=3000000 conv=notrunc status=none
: >"$TMP/empty.raw"
mkfifo "$TMP/fifo"
for dst in "$TMP/nb.raw" "$TMP/empty.raw" - "$TMP/fifo"; do
    rc=0
    timeout 30 "$NBDFLOW" copy --base "$TMP/src.raw" "$TMP/mod.raw" "$dst" \
        >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = 1 ] && grep -q "cannot already hold BASE" "$TMP/err" &&
        [ ! -s "$TMP/out" ] ||
        fail "--base into raw $dst: status $rc: $(cat "$TMP/err")"
done
[ ! -e "$TMP/nb.raw" ] && [ ! -s "$TMP/empty.raw" ] ||
    fail "a refused --base still wrote its destination"
cp "$TMP/src.raw" "$TMP/holds.raw"
check "--base into a raw file that holds BASE" \
    "$NBDFLOW" copy --base "$TMP/src.raw" "$TMP/mod.raw" "$TMP/holds.raw"
same "$TMP/mod.raw" "$TMP/holds.raw"
note "ok: --destination-is-zero and --base with a new image"

# "vhd:-" is stdout, as "-" is, not a file called "-".
(cd "$TMP" && "$NBDFLOW" copy src.raw vhd:- >"$TMP/piped.vhd") ||
    fail "copy to vhd:- failed"
[ ! -e "$TMP/-" ] || fail "vhd:- made a file called -"
qemu-img compare -q -f raw -F vpc "$TMP/src.raw" "$TMP/piped.vhd" ||
    fail "vhd:- is not the source"
note "ok: vhd:- writes to stdout"

echo data >"$TMP/foo"
rc=0
(cd "$TMP" && "$NBDFLOW" info null:foo) >"$TMP/info" 2>"$TMP/err" || rc=$?
[ "$rc" != 0 ] || fail "info null:foo read the file foo: $(cat "$TMP/info")"
grep -q "null:foo" "$TMP/err" || fail "info null:foo: $(cat "$TMP/err")"
note "ok: info null:foo looks for a file of that name"

if [ "$(id -u)" = 0 ] && command -v losetup >/dev/null &&
   dev=$(losetup --find --show "$TMP/img.qcow2" 2>/dev/null); then
    on_exit "losetup -d $dev"
    "$NBDFLOW" info --json "$dev" >"$TMP/info" || fail "info of $dev"
    grep -q '"format": "raw"' "$TMP/info" ||
        fail "a block device holding a qcow2 was probed: $(cat "$TMP/info")"
    "$NBDFLOW" copy "qcow2:$dev" "$TMP/dev.raw" ||
        fail "copy of qcow2:$dev failed"
    same "$TMP/dev.raw" "$TMP/src.raw"
    note "ok: a device is raw unless its format is named"
else
    note "no loop device here: the device case is not checked"
fi
echo "PASS"
