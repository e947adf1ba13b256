#!/bin/bash
# vhd-inplace.sh: "copy SRC DST.vhd --dst-format vhd" into an existing VHD
# writes it in place, through the format layer that serve writes with: the
# file keeps its UUID and disk type, data lands, the source's holes read
# as zeroes over the data that was there, and qemu-img (-f vpc), nbdflow
# and the reader model (vhdgen.py) read the source's bytes; "info --check"
# finds it clean. A differencing child (vhd:PATH) is written over its
# parent, which stays as it was; a fixed VHD stays fixed. A new file is
# still written as a stream, and an existing VHD smaller than the source
# is refused.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need qemu-img qemu-utils
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

size=$((8 << 20))
# inplace WHAT VHD WANT TYPE UUID [qemu]: VHD is still TYPE with UUID,
# clean, and reads WANT.
inplace () {
    local what=$1 vhd=$2 want=$3 type=$4 uuid=$5
    [ "$(model_info "$vhd" uuid)" = "$uuid" ] ||
        fail "$what: the UUID changed: the file was made anew, not written in place"
    [ "$(model_info "$vhd" disk-type)" = "$type" ] ||
        fail "$what: disk type $(model_info "$vhd" disk-type), want $type"
    ok "$what: info --check" info --check "vhd:$vhd"
    grep -q 'result: clean' "$TMP/out" || fail "$what: $(cat "$TMP/out")"
    ok "$what: copy out" copy "vhd:$vhd" "$TMP/out.raw"
    same "$TMP/out.raw" "$want"
    gen read "$vhd" "$TMP/out.model" >/dev/null
    same "$TMP/out.model" "$want"
    if [ "${6:-}" = qemu ]; then
        qemu-img convert -f vpc -O raw "$vhd" "$TMP/out.qemu" ||
            fail "$what: qemu-img convert -f vpc"
        same "$TMP/out.qemu" "$want"
    fi
    note "ok: $what: written in place"
}

make_sparse "$TMP/src.raw" 8 "1:2 6:1"

# A dynamic VHD full of data: the source's holes must become zeroes.
gen make "$TMP/dyn.vhd" --type dynamic --size $size --data "all"
uuid=$(model_info "$TMP/dyn.vhd" uuid)
ok "copy into an existing dynamic VHD" copy "$TMP/src.raw" "$TMP/dyn.vhd" \
    --dst-format vhd
inplace "dynamic" "$TMP/dyn.vhd" "$TMP/src.raw" dynamic "$uuid" qemu

# An empty one, 512 KiB blocks, and a source of odd lengths.
gen make "$TMP/empty.vhd" --type dynamic --size $size --block-size 512K
uuid=$(model_info "$TMP/empty.vhd" uuid)
make_random "$TMP/dense.raw" 8
ok "copy into an empty dynamic VHD" copy "$TMP/dense.raw" "vhd:$TMP/empty.vhd"
inplace "empty dynamic" "$TMP/empty.vhd" "$TMP/dense.raw" dynamic "$uuid" qemu

# A differencing child over its parent.
mkdir "$TMP/p"
gen make "$TMP/p/base.vhd" --type dynamic --size $size --garbage \
    --data "block:1 sect:7-9" --expect "$TMP/p/base.raw"
gen make "$TMP/child.vhd" --type diff --parent "$TMP/p/base.vhd" \
    --block-size 1M --garbage --data "sect:2000-2100"
uuid=$(model_info "$TMP/child.vhd" uuid)
base_sum=$(sha "$TMP/p/base.vhd")
ok "copy into a differencing child" copy "$TMP/src.raw" "$TMP/child.vhd" \
    --dst-format vhd
[ "$(sha "$TMP/p/base.vhd")" = "$base_sum" ] || fail "the parent changed"
inplace "differencing" "$TMP/child.vhd" "$TMP/src.raw" differencing "$uuid"

# A fixed VHD, named (a fixed disk is never probed).
gen make "$TMP/fixed.vhd" --type fixed --size $size --data "block:0"
uuid=$(model_info "$TMP/fixed.vhd" uuid)
ok "copy into a fixed VHD" copy "$TMP/src.raw" "vhd:$TMP/fixed.vhd"
[ "$(stat -c %s "$TMP/fixed.vhd")" = $((size + 512)) ] ||
    fail "the fixed VHD changed size: $(stat -c %s "$TMP/fixed.vhd")"
inplace "fixed" "$TMP/fixed.vhd" "$TMP/src.raw" fixed "$uuid" qemu

# A new file: a stream, as before.
ok "copy into a new VHD" copy "$TMP/src.raw" "$TMP/new.vhd" --dst-format vhd
gen read "$TMP/new.vhd" "$TMP/new.raw" >/dev/null
same "$TMP/new.raw" "$TMP/src.raw"

# An existing VHD smaller than the source.
gen make "$TMP/small.vhd" --type dynamic --size $((4 << 20))
small_sum=$(sha "$TMP/small.vhd")
refused "a smaller VHD" copy "$TMP/src.raw" "$TMP/small.vhd" --dst-format vhd
err_names small.vhd
[ "$(sha "$TMP/small.vhd")" = "$small_sum" ] || fail "the smaller VHD changed"

# One writer per VHD: a second (another export of the same file, or a
# copy into a VHD that serve writes) would allocate the same space.
refused "two exports of one VHD" serve --unix "$TMP/two.sock" \
    "a=$TMP/small.vhd" "b=$TMP/small.vhd"
err_names "another writer has this image open"
serve_tcp "a=$TMP/small.vhd"
refused "a copy into a VHD that serve writes" copy "$TMP/src.raw" \
    "$TMP/small.vhd" --dst-format vhd
err_names "another writer has this image open"
serve_stop
[ "$(sha "$TMP/small.vhd")" = "$small_sum" ] || fail "the served VHD changed"
note "ok: a second writer of one VHD is refused"
echo "PASS"
