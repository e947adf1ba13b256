#!/bin/bash
# vhd-chain.sh: differencing chains of depth 3 made by vhdgen.py, each
# parent found through one kind of locator only (W2ru, W2ku, MacX relative,
# MacX absolute; and all of them behind one that names a missing file),
# relative ones resolved against the child's directory, not the working
# directory; partial bitmaps with garbage under the clear bits; block sizes
# of 512 bytes, 4 KiB, 512 KiB, 1 MiB and 2 MiB in one chain; a fixed base;
# the dynamic header at 1536; a 511-byte footer; a tdbatmap whose bits are
# wrong. copy, sum, info and info --map read what the model expects. A
# probed differencing disk opens no parent and says how to allow it; raw:
# reads the file as it is.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tmpdir_make
. "$(dirname "$0")/vhd.inc"
[ -x "$NBDFLOW" ] || fail "NBDFLOW=$NBDFLOW is not an executable"

mkdir -p "$TMP/a" "$TMP/b" "$TMP/c" "$TMP/d" "$TMP/e" "$TMP/f" "$TMP/g" \
    "$TMP/h" "$TMP/w/x/y"
# From here a relative locator ("../a/base.vhd") names nothing.
cd "$TMP/w/x/y"

# ---- Chain 1: W2ru, then MacX relative -------------------------------------
gen make "$TMP/a/base.vhd" --type dynamic --size 6M --block-size 512K \
    --header-offset 1536 --bat-gap 2 --garbage \
    --data "block:0,3,7 sect:100-140,2000-2001,11000 empty:5" \
    --expect "$TMP/a/base.raw"
gen make "$TMP/b/mid.vhd" --type diff --parent "$TMP/a/base.vhd" \
    --block-size 4K --locators w2ru --garbage \
    --data "sect:0-3,130,2001-2002,5000-5100 block:300-310 empty:700" \
    --expect "$TMP/b/mid.raw"
gen make "$TMP/c/top.vhd" --type diff --parent "$TMP/b/mid.vhd" \
    --locators macx --batmap --old-footer --garbage \
    --data "sect:1,4000-4103,9000 block:2" --expect "$TMP/c/top.raw"
size=$((6 << 20))

# The dynamic base is probed.
ok "base: copy" copy "$TMP/a/base.vhd" "$TMP/base.out"
same "$TMP/base.out" "$TMP/a/base.raw"
ok "base: sum" sum --algo sha256 "$TMP/a/base.vhd"
[ "$(cut -d' ' -f1 "$TMP/out")" = "$(sha "$TMP/a/base.raw")" ] ||
    fail "base: sum $(cat "$TMP/out")"
ok "base: info" info "$TMP/a/base.vhd"
check_info "base" dynamic "$size" 524288 "$(model_info "$TMP/a/base.vhd" allocated)"
check_map "base" "$TMP/a/base.vhd" "$TMP/a/base.vhd"

# map_covers WHAT VHD: info --map (in $TMP/out) covers the disk in order and
# shows as data every sector the chain holds data for (the model's --chain
# map); sectors no image holds may be either.
map_covers () {
    gen map --chain "$2" >"$TMP/chain.map"
    py - "$TMP/out" "$TMP/chain.map" <<'PY' || fail "$1: info --map: $(head -c 2000 "$TMP/out")"
import sys
def runs(p):
    return [tuple(int(x) for x in l.split()[:3]) for l in open(p) if l.strip()]
got, want = runs(sys.argv[1]), runs(sys.argv[2])
end = 0
for off, n, t in got:
    assert off == end, ("gap or overlap", off, end)
    end = off + n
size = want[-1][0] + want[-1][1]
assert end == size, ("ends at", end, size)
for off, n, t in want:
    if t != 0:
        continue
    for goff, gn, gt in got:
        if goff < off + n and off < goff + gn:
            assert gt == 0, ("data at", max(off, goff), "shown as type", gt)
PY
    note "ok: $1: info --map shows the chain's data"
}

for img in mid top; do
    case $img in
        mid) v=$TMP/b/mid.vhd ;;
        top) v=$TMP/c/top.vhd ;;
    esac
    raw=${v%.vhd}.raw
    ok "$img: copy --src-format vhd" copy --src-format vhd "$v" "$TMP/$img.out"
    same "$TMP/$img.out" "$raw"
    ok "$img: copy vhd:" copy "vhd:$v" "$TMP/$img.out2"
    same "$TMP/$img.out2" "$raw"
    ok "$img: sum -f vhd" sum -f vhd --algo sha256 "$v"
    [ "$(cut -d' ' -f1 "$TMP/out")" = "$(sha "$raw")" ] ||
        fail "$img: sum -f vhd $(cat "$TMP/out")"
    ok "$img: sum --format vhd" sum --format vhd --algo sha256 "$v"
    [ "$(cut -d' ' -f1 "$TMP/out")" = "$(sha "$raw")" ] ||
        fail "$img: sum --format vhd $(cat "$TMP/out")"
    alloc=$(model_info "$v" allocated)
    block=$(model_info "$v" block-size)
    ok "$img: info -f vhd" info -f vhd "$v"
    if [ "$img" = mid ]; then
        check_info "$img" differencing "$size" "$block" "$alloc" "$TMP/a/base.vhd"
    else
        check_info "$img" differencing "$size" "$block" "$alloc" \
            "$TMP/b/mid.vhd" "$TMP/a/base.vhd"
    fi
    ok "$img: info --json vhd:" info --json "vhd:$v"
    check_json "$img" differencing "$size" "$block" "$alloc" \
        "$(model_info "$v" parents)"
    ok "$img: info --map" info --map -f vhd "$v"
    map_covers "$img" "$v"
done
# The child named relative to the working directory.
cd "$TMP/c"
ok "top.vhd from its own directory" copy --src-format vhd top.vhd "$TMP/rel.out"
same "$TMP/rel.out" "$TMP/c/top.raw"
# A W2ru parent beside its child (".\\base.vhd") is shown as the path that
# was opened, without a "./" from the locator: from the child's own
# directory ./base.vhd, from its parent directory s/base.vhd.
mkdir -p "$TMP/s"
gen make "$TMP/s/base.vhd" --type dynamic --size 2M --data "block:0"
gen make "$TMP/s/kid.vhd" --type diff --parent "$TMP/s/base.vhd" \
    --locators w2ru --data "sect:3"
cd "$TMP/s"
ok "kid.vhd from its own directory: info" info -f vhd kid.vhd
[ "$(field parent)" = ./base.vhd ] ||
    fail "parent shown as '$(field parent)', want ./base.vhd"
cd "$TMP"
ok "s/kid.vhd: info" info -f vhd s/kid.vhd
[ "$(field parent)" = s/base.vhd ] ||
    fail "parent shown as '$(field parent)', want s/base.vhd"
note "ok: a W2ru parent beside its child is shown without ./ from the locator"
# Writing a file that the source's chain reads would destroy the source.
cp "$TMP/s/base.vhd" "$TMP/s/base.keep"
rc=0
"$NBDFLOW" copy --src-format vhd "$TMP/s/kid.vhd" "$TMP/s/base.vhd" \
    2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -q "a file that SOURCE's image reads" "$TMP/err" ||
    fail "a copy onto the source's parent: status $rc: $(cat "$TMP/err")"
cmp -s "$TMP/s/base.vhd" "$TMP/s/base.keep" || fail "the parent was written"
note "ok: a copy onto the source's parent is refused"
cd "$TMP/w/x/y"

# ---- Chain 2: fixed base, W2ku, then MacX absolute; 1 MiB and 512-byte
# blocks; a size that is no multiple of any block size ---------------------
gen make "$TMP/d/fbase.vhd" --type fixed --size 5243392 \
    --data "block:1 sect:5-20,10240" --expect "$TMP/d/fbase.raw"
gen make "$TMP/e/m2.vhd" --type diff --parent "$TMP/d/fbase.vhd" \
    --block-size 1M --locators w2ku --garbage \
    --data "sect:0-7,2100,10240 block:4" --expect "$TMP/e/m2.raw"
gen make "$TMP/f/t2.vhd" --type diff --parent "$TMP/e/m2.vhd" \
    --block-size 512 --locators macx-abs --garbage \
    --data "sect:3,4,2100,10239-10240 empty:9" --expect "$TMP/f/t2.raw"
ok "fixed base: copy vhd:" copy "vhd:$TMP/d/fbase.vhd" "$TMP/fbase.out"
same "$TMP/fbase.out" "$TMP/d/fbase.raw"
ok "fixed base: info" info -f vhd "$TMP/d/fbase.vhd"
check_info "fixed base" fixed 5243392 - 5243392
ok "t2: copy" copy --src-format vhd "$TMP/f/t2.vhd" "$TMP/t2.out"
same "$TMP/t2.out" "$TMP/f/t2.raw"
ok "t2: sum" sum --algo sha256 "vhd:$TMP/f/t2.vhd"
[ "$(cut -d' ' -f1 "$TMP/out")" = "$(sha "$TMP/f/t2.raw")" ] ||
    fail "t2: sum $(cat "$TMP/out")"
ok "t2: info" info -f vhd "$TMP/f/t2.vhd"
check_info "t2" differencing 5243392 512 "$(model_info "$TMP/f/t2.vhd" allocated)" \
    "$TMP/e/m2.vhd" "$TMP/d/fbase.vhd"
ok "m2: copy" copy --src-format vhd "$TMP/e/m2.vhd" "$TMP/m2.out"
same "$TMP/m2.out" "$TMP/e/m2.raw"

# ---- Chain 3: every locator kind behind one naming a missing file ------------
gen make "$TMP/g/base3.vhd" --type dynamic --size 4M --data "block:1 sect:7"
gen make "$TMP/h/kid3.vhd" --type diff --parent "$TMP/g/base3.vhd" \
    --locators missing,w2ru,w2ku,macx,macx-abs --data "sect:8-9,4096" \
    --expect "$TMP/h/kid3.raw"
ok "kid3: copy (first locator names no file)" copy --src-format vhd \
    "$TMP/h/kid3.vhd" "$TMP/kid3.out"
same "$TMP/kid3.out" "$TMP/h/kid3.raw"

# ---- A dynamic disk with 4 KiB blocks, every oddity at once -----------------
gen make "$TMP/odd.vhd" --type dynamic --size 3M --block-size 4K \
    --header-offset 1536 --bat-gap 1 --bat-entries 1000 --batmap --old-footer \
    --garbage --data "block:0,5,700-710 sect:100-140,2000-2001,6000-6143 empty:9" \
    --expect "$TMP/odd.raw"
ok "odd: copy" copy "$TMP/odd.vhd" "$TMP/odd.out"
same "$TMP/odd.out" "$TMP/odd.raw"
ok "odd: info" info "$TMP/odd.vhd"
check_info "odd" dynamic $((3 << 20)) 4096 "$(model_info "$TMP/odd.vhd" allocated)"
check_map "odd" "$TMP/odd.vhd" "$TMP/odd.vhd"

# ---- Probing never opens a parent ------------------------------------------------
v=$TMP/c/top.vhd
refused "probed diff: copy" copy "$v" "$TMP/probe.out"
err_names mid.vhd
err_says '--src-format vhd'
refused "probed diff: copy --src-format auto" copy --src-format auto "$v" \
    "$TMP/probe.out"
err_names mid.vhd
err_says '--src-format vhd'
refused "probed diff: info" info "$v"
err_names mid.vhd
err_says '-f vhd|vhd:'
refused "probed diff: info -f auto" info -f auto --json "$v"
err_names mid.vhd
err_says '-f vhd|vhd:'
refused "probed diff: sum" sum "$v"
err_names mid.vhd
err_says '-f vhd|vhd:'
if can_strace; then
    rc=0
    traced -e trace=open,openat,openat2 -o "$TMP/trace" \
        "$NBDFLOW" copy "$v" "$TMP/probe.out" 2>/dev/null || rc=$?
    [ "$rc" != 0 ] || fail "probed diff copy succeeded under strace"
    grep -q 'top\.vhd' "$TMP/trace" || fail "strace saw no open of top.vhd"
    ! grep -E 'mid\.vhd|base\.vhd' "$TMP/trace" >&2 ||
        fail "a probed differencing disk opened a parent (above)"
    note "ok: no parent opened while probing (strace)"
else
    note "strace not usable here: parent opens while probing not traced"
fi

# ---- raw: and --src-format raw read the file itself --------------------------
ok "raw:" copy "raw:$v" "$TMP/raw.out"
same "$TMP/raw.out" "$v"
ok "--src-format raw" copy --src-format raw "$v" "$TMP/raw.out2"
same "$TMP/raw.out2" "$v"
ok "sum raw:" sum --algo sha256 "raw:$v"
[ "$(cut -d' ' -f1 "$TMP/out")" = "$(sha "$v")" ] || fail "sum raw: $(cat "$TMP/out")"
ok "sum -f raw" sum -f raw --algo sha256 "$v"
[ "$(cut -d' ' -f1 "$TMP/out")" = "$(sha "$v")" ] || fail "sum -f raw: $(cat "$TMP/out")"
ok "info raw:" info "raw:$v"
got=$(field export-size)
[ "${got%% *}" = "$(stat -c %s "$v")" ] || fail "info raw: export-size $got"

# A raw file named as VHD is refused, naming it.
make_random "$TMP/plain.img" 1
refused "raw file as vhd" copy --src-format vhd "$TMP/plain.img" "$TMP/x.out"
err_names "$TMP/plain.img"
echo "PASS"
