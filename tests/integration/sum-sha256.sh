#!/bin/bash
# sum-sha256.sh: "nbdflow sum --algo sha256" equals sha256sum of the raw
# image for files, sparse files, NBD exports and pipes; the default digest
# agrees between a file and the same image over NBD and changes with it;
# odd file names are escaped as sha256sum escapes them.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need qemu-nbd qemu-utils
tmpdir_make
digest () { "$NBDFLOW" sum "$@" | cut -d' ' -f1; }

make_sparse "$TMP/img" 64 "0:2 30:1 63:1"
# qemu-nbd rounds sizes up to 512 bytes: keep the odd tail sector-sized.
truncate -s $(( 64 * 1048576 + 1536 )) "$TMP/img"
want=$(sha "$TMP/img")
[ "$(digest --algo sha256 "$TMP/img")" = "$want" ] ||
    fail "sum of a file differs from sha256sum"
[ "$(digest --algo sha256 - <"$TMP/img")" = "$want" ] ||
    fail "sum of a pipe differs from sha256sum"
[ "$(digest --algo md5 "$TMP/img")" = "$(md5sum "$TMP/img" | cut -d' ' -f1)" ] ||
    fail "md5 differs from md5sum"
qemu-nbd -f raw -t -r -k "$TMP/q.sock" "$TMP/img" >>"$TMP/q.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/q.sock"
uri="nbd+unix:///?socket=$TMP/q.sock"
[ "$(digest --algo sha256 "$uri")" = "$want" ] ||
    fail "sum over NBD differs from sha256sum"
[ "$(digest "$uri")" = "$(digest "$TMP/img")" ] ||
    fail "default digest differs between file and NBD"
if command -v xxh128sum >/dev/null; then
    [ "$(digest "$TMP/img")" = "$(xxh128sum "$TMP/img" | cut -d' ' -f1)" ] ||
        fail "xxh128 differs from xxh128sum"
fi
before=$(digest "$TMP/img")
printf 'x' | dd of="$TMP/img" bs=1 seek=40000000 conv=notrunc status=none
[ "$(digest "$TMP/img")" != "$before" ] || fail "digest blind to a change"
note "ok: sums agree"
# A name with a backslash, a newline or a carriage return is escaped as
# sha256sum escapes it, so that "sha256sum -c" reads the line back.
for name in 'back\slash' $'new\nline' $'carriage\rreturn' 'plain name'; do
    f=$TMP/$name
    head -c 4096 "$TMP/img" >"$f"
    got=$("$NBDFLOW" sum --algo sha256 "$f")
    [ "$got" = "$(sha256sum "$f")" ] ||
        fail "sum of '$name' prints '$got', sha256sum '$(sha256sum "$f")'"
    printf '%s\n' "$got" | sha256sum -c --quiet ||
        fail "sha256sum -c cannot read sum's line for '$name'"
done
note "ok: names escaped as sha256sum escapes them"
echo "PASS"
