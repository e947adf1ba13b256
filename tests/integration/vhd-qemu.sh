#!/bin/bash
# vhd-qemu.sh: VHD images qemu-img makes (dynamic and fixed, with and
# without force_size) read through nbdflow exactly as qemu-img reads them:
# copy (file and pipe), sum, info (text and JSON) and info --map; a dynamic
# image is probed, a fixed one named with --src-format vhd, -f vhd or vhd:.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need qemu-img qemu-utils
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

# 24 MiB: random data in MiB 0, 5-6 and 20, a few sectors at an odd place,
# an all-zero data extent (MiB 10-13) that qemu-img leaves unallocated.
make_sparse "$TMP/src.raw" 24 "0:1 5:2 20:1"
dd if=/dev/zero of="$TMP/src.raw" bs=1M seek=10 count=4 conv=notrunc status=none
dd if=/dev/urandom of="$TMP/src.raw" bs=512 seek=34821 count=3 conv=notrunc \
    status=none

# An empty image first: all hole.
qemu-img create -q -f vpc -o subformat=dynamic,force_size=on "$TMP/empty.vhd" 8M
ok "empty: copy" copy "$TMP/empty.vhd" "$TMP/empty.out"
all_zero "$TMP/empty.out" $((8 << 20))
ok "empty: info" info "$TMP/empty.vhd"
check_info "empty" dynamic $((8 << 20)) 2097152 0
check_map "empty" "$TMP/empty.vhd" "$TMP/empty.vhd"

for variant in dynamic dynamic,force_size=on fixed fixed,force_size=on; do
    name=${variant//[,=]/-}
    v=$TMP/$name.vhd
    qemu-img convert -f raw -O vpc -o "subformat=$variant" "$TMP/src.raw" "$v" ||
        fail "$name: qemu-img convert to vpc"
    # qemu's reading of the image is the reference: a size rounded up to
    # the CHS geometry without force_size, zeroes in the tail.
    qemu-img convert -f vpc -O raw "$v" "$TMP/$name.ref" ||
        fail "$name: qemu-img convert from vpc"
    size=$(stat -c %s "$TMP/$name.ref")
    want=$(sha "$TMP/$name.ref")
    alloc=$(model_info "$v" allocated)
    case $variant in
        dynamic*)
            type=dynamic block=2097152
            fmt=()
            sumfmt=()
            ;;
        fixed*)
            type=fixed block=-
            fmt=(--src-format vhd)
            sumfmt=(-f vhd)
            [ "$alloc" = "$size" ] || fail "$name: model says $alloc allocated"
            ;;
    esac
    ok "$name: copy" copy "${fmt[@]}" "$v" "$TMP/$name.out"
    same "$TMP/$name.out" "$TMP/$name.ref"
    ok "$name: copy vhd:PATH" copy "vhd:$v" "$TMP/$name.out2"
    same "$TMP/$name.out2" "$TMP/$name.ref"
    rc=0
    timeout 20 "$NBDFLOW" copy "${fmt[@]}" "$v" - 2>"$TMP/err" | cat >"$TMP/$name.pipe" ||
        rc=$?
    [ "$rc" = 0 ] || fail "$name: copy to a pipe: $(cat "$TMP/err")"
    same "$TMP/$name.pipe" "$TMP/$name.ref"
    ok "$name: sum" sum "${sumfmt[@]}" --algo sha256 "$v"
    [ "$(cut -d' ' -f1 "$TMP/out")" = "$want" ] ||
        fail "$name: sum $(cat "$TMP/out"), want $want"
    ok "$name: sum vhd:PATH" sum --algo sha256 "vhd:$v"
    [ "$(cut -d' ' -f1 "$TMP/out")" = "$want" ] ||
        fail "$name: sum of vhd:PATH $(cat "$TMP/out"), want $want"
    [ "$(sed 's/^[^ ]*  //' "$TMP/out")" = "vhd:$v" ] ||
        fail "$name: sum prints '$(cat "$TMP/out")', want DIGEST  vhd:$v"
    ok "$name: info" info "${sumfmt[@]}" "$v"
    check_info "$name" "$type" "$size" "$block" "$alloc"
    ok "$name: info --json" info "${sumfmt[@]}" --json "$v"
    check_json "$name" "$type" "$size" "$block" "$alloc" 0
    if [ "$type" = dynamic ]; then
        # qemu-made blocks have every bitmap bit set: the model's map and
        # qemu's agree on where data is before nbdflow's is compared.
        qemu-img map -f vpc --output=json "$v" >"$TMP/qmap.json"
        gen map "$v" | py -c '
import json, sys
q = json.load(open(sys.argv[1]))
data = [(e["start"], e["length"]) for e in q if e["data"]]
merged = []
for s, n in data:
    if merged and merged[-1][0] + merged[-1][1] == s:
        merged[-1][1] += n
    else:
        merged.append([s, n])
mine = [[int(f[0]), int(f[1])] for f in (l.split() for l in sys.stdin)
        if f[2] == "0"]
assert mine == merged, (mine, merged)' "$TMP/qmap.json" ||
            fail "$name: the model's map and qemu-img map disagree"
        check_map "$name" "$v" "$v"
    fi
done
echo "PASS"
