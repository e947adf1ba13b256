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
    local t
    traced_writes "$pid" "$TMP/target.img" splice "$@"
    SPLICED=0
    for t in "${!WROTE[@]}"; do SPLICED=$((SPLICED + WROTE[$t])); done
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
