#!/bin/bash
# nbdcopy and qemu-img convert, into and out of every export kind (file,
# memory, null), every copy verified byte for byte.
. "$(dirname "$0")/lib.sh"
need nbdcopy libnbd-bin
need qemu-img qemu-utils
tmpdir_make

MIB=24
BYTES=$((MIB << 20))
make_random "$TMP/src1.img" $MIB
make_sparse "$TMP/src2.img" $MIB "0:1 3:2 10:5 23:1"
truncate -s "${MIB}M" "$TMP/target.img"

serve_tcp file="$TMP/target.img" mem="memory:${MIB}M" nul="null:${MIB}M"

# into TOOL SRC EXPORT: copy a local file into an export.
into () {
    case $1 in
        nbdcopy) nbdcopy "$2" "$URI/$3" ;;
        qemu-img) qemu-img convert -n -f raw -O raw "$2" "$URI/$3" ;;
    esac || fail "$1: copy of $(basename "$2") into export $3 failed"
    note "ok: $1 copied $(basename "$2") into $3"
}

# out TOOL EXPORT DST: copy an export to a new local file.
out () {
    rm -f "$3"
    case $1 in
        nbdcopy) nbdcopy "$URI/$2" "$3" ;;
        qemu-img) qemu-img convert -f raw -O raw "$URI/$2" "$3" ;;
    esac || fail "$1: copy of export $2 out failed"
    note "ok: $1 copied $2 out"
}

for tool in nbdcopy qemu-img; do
    for src in src1 src2; do
        # File export: the file on disk and a copy back out both match.
        into $tool "$TMP/$src.img" file
        same "$TMP/$src.img" "$TMP/target.img"
        for reader in nbdcopy qemu-img; do
            out $reader file "$TMP/out.img"
            same "$TMP/$src.img" "$TMP/out.img"
        done
        # Memory export: what goes in comes out.
        into $tool "$TMP/$src.img" mem
        for reader in nbdcopy qemu-img; do
            out $reader mem "$TMP/out.img"
            same "$TMP/$src.img" "$TMP/out.img"
        done
        # Null export: writes succeed and vanish; reads give zeroes.
        into $tool "$TMP/$src.img" nul
        for reader in nbdcopy qemu-img; do
            out $reader nul "$TMP/out.img"
            all_zero "$TMP/out.img" $BYTES
        done
    done
done

# Export to export through the server: file -> mem with nbdcopy, checked
# by checksum.
into nbdcopy "$TMP/src1.img" file
nbdcopy "$URI/file" "$URI/mem" || fail "nbdcopy export to export"
out nbdcopy mem "$TMP/out.img"
[ "$(sha "$TMP/out.img")" = "$(sha "$TMP/src1.img")" ] ||
    fail "export-to-export copy differs"
note "ok: export-to-export copy matches by sha256"

server_alive || fail "server died during the copies"
serve_stop
echo "PASS: nbdcopy and qemu-img into and out of file, memory and null"
