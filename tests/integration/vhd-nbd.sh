#!/bin/bash
# vhd-nbd.sh: "an NBD URI is raw unless told", read as: told with
# --src-format vhd (copy) or -f vhd (sum, info), a VHD held by an NBD
# export (here the file's bytes served as raw:PATH) is read as its virtual
# disk; untold, the export's bytes are copied as they are. Kept apart from
# vhd-serve.sh because the contract can also be read as "NBD URIs are
# always raw", which would make this whole test moot rather than a bug.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdinfo libnbd-bin
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

gen make "$TMP/dyn.vhd" --type dynamic --size 6M --block-size 512K --garbage \
    --data "block:1,9 sect:7-9,3000" --expect "$TMP/dyn.raw"
gen make "$TMP/fixed.vhd" --type fixed --size 3M --data "block:0 sect:5000" \
    --expect "$TMP/fixed.raw"
sock=$TMP/nbd.sock
serve_start --unix "$sock" "raw:$TMP/dyn.vhd" "fixed=raw:$TMP/fixed.vhd"
u=$(uri "$sock")
fu="nbd+unix:///fixed?socket=$sock"
[ "$(nbdinfo --size "$u")" = "$(stat -c %s "$TMP/dyn.vhd")" ] ||
    fail "raw: export size $(nbdinfo --size "$u")"

ok "untold: raw" copy "$u" "$TMP/untold.out"
same "$TMP/untold.out" "$TMP/dyn.vhd"
ok "copy --src-format vhd" copy --src-format vhd "$u" "$TMP/dyn.out"
same "$TMP/dyn.out" "$TMP/dyn.raw"
ok "sum -f vhd" sum -f vhd --algo sha256 "$u"
[ "$(cut -d' ' -f1 "$TMP/out")" = "$(sha "$TMP/dyn.raw")" ] ||
    fail "sum -f vhd: $(cat "$TMP/out")"
ok "info -f vhd" info -f vhd "$u"
check_info "info -f vhd" dynamic $((6 << 20)) 524288 \
    "$(model_info "$TMP/dyn.vhd" allocated)"
ok "fixed: copy --src-format vhd" copy --src-format vhd "$fu" "$TMP/fixed.out"
same "$TMP/fixed.out" "$TMP/fixed.raw"
serve_stop
echo "PASS"
