#!/bin/bash
# copy-checkpoint.sh: --checkpoint FILE across a copy killed with SIGKILL.
# - into nbdkit (slow writes), killed once the journal records progress;
#   the same command run again continues where the journal says, sends
#   only the rest (the report's bytes_resumed and bytes_copied show how
#   much was skipped), and --verify proves the whole destination;
# - the same with a slow NBD source and a local file as destination;
# - a journal that names a source modified since, another destination or
#   a destination of another size, or that is damaged, is refused, and a
#   refusal leaves a local destination untouched; so is a raw
#   destination cut since, and a VHD source whose parent changed;
# - a finished journal: running again copies nothing.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
need timeout coreutils
tmpdir_make

make_random "$TMP/src.img" 32
MiB=$((1 << 20))

# journal_done FILE: the offset the journal records (0 when none yet).
journal_done () {
    sed -n 's/^done \([0-9]*\)$/\1/p' "$1" 2>/dev/null || true
}

# run_and_kill JOURNAL ARGS...: starts the copy, SIGKILLs it once the
# journal records more than 0 bytes and less than all, and checks that it
# was still running then.
run_and_kill () {
    local j=$1 i d; shift
    "$NBDFLOW" copy --checkpoint "$j" --checkpoint-interval 1 \
        --request-size 256K --inflight 1M "$@" >"$TMP/out" 2>"$TMP/err" &
    local pid=$!
    for ((i = 0; i < 200; i++)); do
        d=$(journal_done "$j")
        [ -n "$d" ] && [ "$d" -gt 0 ] && break
        kill -0 "$pid" 2>/dev/null || fail "copy ended before a checkpoint: $(cat "$TMP/err")"
        sleep 0.05
    done
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null || true
    d=$(journal_done "$j")
    [ -n "$d" ] && [ "$d" -gt 0 ] && [ "$d" -lt $((32 * MiB)) ] ||
        fail "killed with the journal at '$d'"
    KILLED_AT=$d
    note "ok: copy killed with the journal at $d bytes"
}

# resume_ok NAME JOURNAL ARGS...: the same copy run again with --verify
# continues from the journal and lands whole.
resume_ok () {
    local name=$1 j=$2; shift 2
    rc=0
    timeout 60 "$NBDFLOW" copy --checkpoint "$j" --checkpoint-interval 1 \
        --request-size 256K --inflight 1M --verify --json "$@" \
        >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = 0 ] || fail "$name: exit $rc: $(cat "$TMP/err")"
    grep -q '"verified": true' "$TMP/out" || fail "$name: not verified"
    local resumed copied
    resumed=$(grep -o '"bytes_resumed": [0-9]*' "$TMP/out" | grep -o '[0-9]*$')
    copied=$(grep -o '"bytes_copied": [0-9]*' "$TMP/out" | grep -o '[0-9]*$')
    [ "$resumed" = "$KILLED_AT" ] ||
        fail "$name: resumed at $resumed, the journal said $KILLED_AT"
    [ "$copied" -le $((32 * MiB - resumed)) ] ||
        fail "$name: copied $copied bytes after skipping $resumed"
    grep -q "continuing at byte $resumed of $((32 * MiB))" "$TMP/err" ||
        fail "$name: no line says where it continues: $(cat "$TMP/err")"
    [ "$(journal_done "$j")" = $((32 * MiB)) ] ||
        fail "$name: the journal does not record the whole copy"
    note "ok: $name: skipped $resumed of $((32 * MiB)) bytes, sent $copied"
}

# refused NAME TEXT ARGS...: copy --checkpoint refuses with one line.
refused () {
    local name=$1 text=$2; shift 2
    rc=0
    "$NBDFLOW" copy "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = 1 ] || fail "$name: exit $rc: $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$name: $(cat "$TMP/err")"
    grep -q "$text" "$TMP/err" || fail "$name: $(cat "$TMP/err")"
    note "ok: $name: $(cat "$TMP/err")"
}

# 1. Into nbdkit.
truncate -s 32M "$TMP/dst.img"
dsock=$TMP/dst.sock
kit "$dsock" --filter=delay file "$TMP/dst.img" wdelay=100ms
duri=$(uri "$dsock")
run_and_kill "$TMP/j1" "$TMP/src.img" "$duri"
resume_ok "into nbdkit" "$TMP/j1" "$TMP/src.img" "$duri"
same "$TMP/src.img" "$TMP/dst.img"

# 2. Once finished, the same command copies nothing and still verifies.
KILLED_AT=$((32 * MiB))
resume_ok "a finished journal" "$TMP/j1" "$TMP/src.img" "$duri"

# 3. Refusals (the journal of 1, or a copy of it).
cp "$TMP/j1" "$TMP/j2"
refused "another destination" "records a copy with .* as destination.*another name" \
    --checkpoint "$TMP/j2" "$TMP/src.img" "$TMP/elsewhere.img"
[ ! -e "$TMP/elsewhere.img" ] ||
    fail "a refused journal still created the destination file"
sed -i 's/^done .*/done 4194304/' "$TMP/j2"
refused "a damaged journal" "damaged (checksum" \
    --checkpoint "$TMP/j2" "$TMP/src.img" "$duri"
echo "junk" >"$TMP/j2"
refused "not a journal" "not a checkpoint journal" \
    --checkpoint "$TMP/j2" "$TMP/src.img" "$duri"
kill -KILL "$KIT_PID"
wait "$KIT_PID" 2>/dev/null || true
forget_pid "$KIT_PID"
truncate -s 64M "$TMP/big.img"
rm -f "$dsock"
kit "$dsock" file "$TMP/big.img"
refused "a destination of another size" "as destination .*another size" \
    --checkpoint "$TMP/j1" "$TMP/src.img" "$duri"
touch -d "2001-01-01" "$TMP/src.img"
refused "a source modified since" "a file modified since" \
    --checkpoint "$TMP/j1" "$TMP/src.img" "$duri"

# 4. From a slow NBD source into a local file.
ssock=$TMP/src.sock
kit "$ssock" --filter=delay file "$TMP/src.img" rdelay=100ms
suri=$(uri "$ssock")
run_and_kill "$TMP/j4" "$suri" "$TMP/local.img"
resume_ok "into a local file" "$TMP/j4" "$suri" "$TMP/local.img"
same "$TMP/src.img" "$TMP/local.img"

# 5. A refusal leaves a local destination as it was: the journal is
# checked before the file is opened, which cuts it to the source's size.
make_random "$TMP/small.img" 8
refused "another source, local destination" "records a copy with .* as source.*another name" \
    --checkpoint "$TMP/j4" "$TMP/small.img" "$TMP/local.img"
echo "junk" >"$TMP/j6"
refused "not a journal, local destination" "not a checkpoint journal" \
    --checkpoint "$TMP/j6" "$TMP/small.img" "$TMP/local.img"
refused "a journal that cannot be created" "cannot create it in" \
    --checkpoint "$TMP/nodir/j" "$TMP/small.img" "$TMP/local.img"
echo precious >"$TMP/notes.txt"
refused "an image written as a stream" "is written as a stream" \
    --checkpoint "$TMP/j7" "$TMP/small.img" "$TMP/notes.txt" --dst-format vhd
[ "$(cat "$TMP/notes.txt")" = precious ] ||
    fail "a refused --checkpoint emptied the file it was to write an image into"
same "$TMP/src.img" "$TMP/local.img"
# A raw destination emptied or cut since (the same file): its open would
# grow it back to the source's size and hide that, so its size counts
# before the open.
truncate -s 10M "$TMP/local.img"
refused "a destination cut since" "as destination .*another size" \
    --checkpoint "$TMP/j4" "$suri" "$TMP/local.img"
[ "$(stat -c %s "$TMP/local.img")" = $((10 * MiB)) ] ||
    fail "a refused journal still resized the destination"

# 6. A differencing VHD: its parent is part of the source. One replaced
# or changed between runs makes the journal another copy's, even when the
# child file is the same: refused, not "continued" (here, a finished
# journal would copy nothing).
G=$(dirname "$0")/vhdgen.py
python3 "$G" make "$TMP/pp.vhd" --type dynamic --size 8M --data all --seed 1 \
    >/dev/null || fail "vhdgen parent"
python3 "$G" make "$TMP/cc.vhd" --type diff --parent "$TMP/pp.vhd" \
    --data "block:1" --seed 3 >/dev/null || fail "vhdgen child"
check "a checkpointed copy of a VHD chain" "$NBDFLOW" copy --checkpoint \
    "$TMP/j8" "vhd:$TMP/cc.vhd" "$TMP/cc.raw"
touch -d "2001-01-01" "$TMP/pp.vhd"
refused "a parent modified since" "a file modified since" \
    --checkpoint "$TMP/j8" "vhd:$TMP/cc.vhd" "$TMP/cc.raw"

# Usage errors.
for args in "--checkpoint $TMP/j5 $TMP/src.img -" \
            "--checkpoint $TMP/j5 --no-flush $TMP/src.img $TMP/x.img"; do
    rc=0
    # shellcheck disable=SC2086
    "$NBDFLOW" copy $args >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" = 2 ] || fail "copy $args: exit $rc: $(cat "$TMP/err")"
done
note "ok: --checkpoint with '-' or --no-flush is refused"

# A journal holds the size --dst-size gave a local DST: resumed without
# (or with another), the file keeps that size and the copy continues.
big=$(( $(stat -c %s "$TMP/small.img") + (4 << 20) ))
check "a checkpointed copy with --dst-size" "$NBDFLOW" copy --checkpoint \
    "$TMP/j9" --dst-size "$big" "$TMP/small.img" "$TMP/sized.img"
for extra in "" "--dst-size $((big + 4096))"; do
    # shellcheck disable=SC2086
    check "resumed ${extra:-without --dst-size}" "$NBDFLOW" copy $extra \
        --checkpoint "$TMP/j9" "$TMP/small.img" "$TMP/sized.img"
    [ "$(stat -c %s "$TMP/sized.img")" = "$big" ] ||
        fail "resumed ${extra:-without --dst-size}: DST is $(stat -c %s "$TMP/sized.img") bytes, not $big"
    cmp -n "$(stat -c %s "$TMP/small.img")" "$TMP/small.img" "$TMP/sized.img" ||
        fail "resumed ${extra:-without --dst-size}: DST differs"
done
note "ok: a resumed copy keeps the --dst-size its journal holds"
echo "PASS"
