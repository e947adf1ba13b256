#!/bin/bash
# serve-splice.sh: WRITE payloads into a file export skip user space:
# socket -> pipes -> file with splice(2). A pipe of an unprivileged
# process holds at most fs.pipe-max-size (1 MiB by default) and a payload
# wants twice its size in pipe slots, so qemu-img's 2 MiB requests span
# several pipes. Traces the server: at least 3/4 of the bytes qemu-img
# writes must reach the file by splice. Payloads too large for the pipes
# (nbdcopy at 32 MiB requests) are copied instead. Every copy verified
# byte for byte.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_strace
need qemu-img qemu-utils
need nbdcopy libnbd-bin
tmpdir_make

MIB=48
make_random "$TMP/src.img" $MIB
make_random "$TMP/src2.img" $MIB
truncate -s "${MIB}M" "$TMP/target.img"
serve_tcp "$TMP/target.img"
pid=$SERVER_PID

# traced CMD...: runs CMD with the server traced for splice calls into the
# export's file; sets SPLICED to the bytes they moved.
traced () {
    local fd
    fd=$(find "/proc/$pid/fd" -lname "$TMP/target.img" -printf '%f\n' |
        head -1)
    [ -n "$fd" ] || fail "the server holds no fd of the export file"
    rm -f "$TMP"/trace.*
    # one file per thread (-ff): no call is split across lines
    strace -ff -qq -e trace=splice -o "$TMP/trace" -p "$pid" &
    local st=$!
    wait_for all_traced "$pid"
    "$@" || { kill "$st"; fail "copy failed: $*"; }
    kill -INT "$st"
    wait "$st" || true
    SPLICED=$(awk -v fd="$fd" '
        $0 ~ "splice\\([0-9]+, NULL, " fd ", " && / = [0-9]+$/ { s += $NF }
        END { print s + 0 }' "$TMP"/trace.*)
}

traced qemu-img convert -n -W -f raw -O raw "$TMP/src.img" "$URI"
same "$TMP/src.img" "$TMP/target.img"
total=$((MIB << 20))
[ "$SPLICED" -ge $((total * 3 / 4)) ] ||
    fail "qemu-img (2 MiB requests): only $SPLICED of $total bytes spliced"
note "ok: qemu-img: $SPLICED of $total bytes reached the file by splice"

traced nbdcopy --request-size=33554432 "$TMP/src2.img" "$URI"
same "$TMP/src2.img" "$TMP/target.img"
note "ok: nbdcopy with 32 MiB requests landed ($SPLICED bytes spliced)"
echo "PASS: spliced payloads across pipes, oversized ones copied, all verified"
