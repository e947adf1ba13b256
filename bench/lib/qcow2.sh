# bench/lib/qcow2.sh: the section qcow2 of bench/run (not in the default
# BENCH_SECTIONS; run it as BENCH_SECTIONS=qcow2 bench/run). Sourced by
# bench/run after bench/lib/vhd.sh, whose img_prereq, img_expected,
# img_blocks, img_copy and img_table it shares; uses the same helpers of bench/run.
#
# One interleaved table, each run going once through every arm, every copy
# into `nbdflow serve` of a raw file over TCP loopback and compared byte for
# byte with qemu-img's raw conversion of its image:
#   plain:   a qcow2 (64 KiB clusters) of the vhd section's seeded sparse
#            raw image (BENCH_VHD_PCT % of its 2 MiB blocks random data,
#            seed BENCH_VHD_SEED), copied by nbdflow copy, qemu-img
#            convert -W, and nbdcopy reading it through qemu-nbd;
#   deflate: `qemu-img convert -c` of the same blocks filled with
#            compressible data (random 4-bit values: qemu stores a cluster
#            of random data uncompressed), by nbdflow copy and qemu-img.

: "${BENCH_QCOW2_SIZE:=8G}"     # virtual size of the qcow2 images

# qcow2_cap: bytes of tmpfs the section needs at most: the two images, their
# raw conversions, the destination and, while an image is made, the
# generated raw image (each at most the data).
qcow2_cap() {
  local vsize data
  vsize=$(bytes "$BENCH_QCOW2_SIZE") || return 1
  data=$((vsize / 100 * (${BENCH_VHD_PCT%.*} + 1) + VHD_BLOCK))
  echo $((6 * data))
}

# qcow2_image FILL OPTS IMG RAW: a qcow2 of a generated raw image (chosen
# blocks, FILL), made by `qemu-img convert OPTS`, and RAW, its expected
# content. Sets IMG_ERR on failure.
qcow2_image() {
  local gen=$W/qcow2-gen.raw log=$RAW/logs/qcow2-make.log
  python3 "$LIB/images.py" chosen "$gen" "$QC_B" "$VHD_BLOCK" \
    "$BENCH_VHD_PCT" "$BENCH_VHD_SEED" "$1" >>"$log" ||
    { IMG_ERR="images.py chosen failed"; return 1; }
  # shellcheck disable=SC2086 # OPTS is a list of options
  note_cmd "qcow2 image ($1)" qemu-img convert -f raw -O qcow2 $2 "$gen" "$3"
  # shellcheck disable=SC2086
  qemu-img convert -f raw -O qcow2 $2 "$gen" "$3" >>"$log" 2>&1 ||
    { IMG_ERR="qemu-img convert -O qcow2 failed (see logs/qcow2-make.log)"; return 1; }
  img_expected qcow2 qcow2 "$3" "$4" "$gen" || return 1
  rm -f "$gen"
}

# qcow2_make: $QC_IMG (plain), $QC_ZIMG (deflate-compressed clusters) and
# their raw conversions $QC_RAW and $QC_ZRAW; checks the compressed image
# does hold compressed clusters (qemu-img check). Sets QC_DATA.
qcow2_make() {
  local nblk ncomp log=$RAW/logs/qcow2-make.log
  QC_IMG=$W/disk.qcow2 QC_RAW=$W/qcow2.raw QC_DST=$W/qcow2-dst.raw
  QC_ZIMG=$W/deflate.qcow2 QC_ZRAW=$W/deflate.raw
  say "making a $BENCH_QCOW2_SIZE qcow2, $BENCH_VHD_PCT% of its 2 MiB blocks random data (seed $BENCH_VHD_SEED), and its compressed twin"
  qcow2_image random "-o cluster_size=64k" "$QC_IMG" "$QC_RAW" || return 1
  qcow2_image nibbles "-c -o cluster_size=64k,compression_type=zlib" \
    "$QC_ZIMG" "$QC_ZRAW" || return 1
  qemu-img check --output=json "$QC_ZIMG" >>"$log" 2>&1
  ncomp=$(qemu-img check --output=json "$QC_ZIMG" 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("compressed-clusters", 0))')
  [ "${ncomp:-0}" -gt 0 ] ||
    { IMG_ERR="qemu-img convert -c made no compressed cluster"; return 1; }
  nblk=$(img_blocks "$log")
  QC_DATA=$((nblk * VHD_BLOCK))
  meta qcow2 "qcow2 v3, 64 KiB clusters (qemu-img convert -f raw -O qcow2 -o cluster_size=64k), virtual size $BENCH_QCOW2_SIZE ($QC_B bytes), $nblk of $((QC_B / VHD_BLOCK)) blocks of 2 MiB hold random data ($BENCH_VHD_PCT%, drawn with seed $BENCH_VHD_SEED; $QC_DATA bytes), file $(stat -c %s "$QC_IMG") bytes"
  meta qcow2_deflate "the same blocks filled with random 4-bit values (one a byte), qemu-img convert -c -o cluster_size=64k,compression_type=zlib: $ncomp compressed clusters of 64 KiB, file $(stat -c %s "$QC_ZIMG") bytes"
}

# qcow2_arm_cmd ARM URI WL: sets CLI_CMD for one arm; nbdcopy-qemu-nbd
# first starts (untimed) qemu-nbd serving the image read-only on a Unix
# socket, sets SRC_PID to it, and returns 1 with SRC_ERR if it fails.
qcow2_arm_cmd() {
  local img=$QC_IMG sock=$W/run/qcow2-src.sock
  local keep_pid=$SRV_PID keep_uri=$SRV_URI keep_log=$SRV_LOG
  [ "$3" = deflate ] && img=$QC_ZIMG
  case $1 in
    nbdflow-copy) CLI_CMD=("$NBDFLOW" copy "$img" "$2") ;;
    qemu-img) CLI_CMD=(qemu-img convert -W -f qcow2 -O raw -n "$img" "$2") ;;
    nbdcopy-qemu-nbd)
      # -t: the readiness handshake of server_launch is a first client.
      local -a cmd=(qemu-nbd -r -t -f qcow2 -k "$sock" "$img")
      note_cmd "qcow2 source server" "${cmd[@]}"
      rm -f "$sock"
      SRV_URI="nbd+unix:///?socket=$sock" SRV_LOG=$RAW/logs/server-qemu-nbd-qcow2.log
      SRV_DAEMON=0
      server_launch qemu-nbd-src unix "" "$sock" "" "${cmd[@]}" && SRC_PID=$SRV_PID
      SRC_ERR=$SRV_ERR
      SRV_PID=$keep_pid SRV_URI=$keep_uri SRV_LOG=$keep_log
      [ -n "$SRC_PID" ] || return 1
      CLI_CMD=(nbdcopy "nbd+unix:///?socket=$sock" "$2") ;;
  esac
}

qcow2_copy() {
  local expect=$QC_RAW
  [ "$1" = deflate ] && expect=$QC_ZRAW
  img_copy qcow2 "$1" "$2" "$3" "$4" "" "$expect" ""
}

section_qcow2() {
  QC_B=$(bytes "$BENCH_QCOW2_SIZE") || die "bad BENCH_QCOW2_SIZE"
  [ $((QC_B % VHD_BLOCK)) = 0 ] || die "BENCH_QCOW2_SIZE must be a multiple of 2 MiB"
  img_prereq qcow2 qcow2 || return
  if ! qcow2_make; then
    record qcow2 - - - tcp 0 fail "" "" "" "" "" "" "$IMG_ERR"
    rm -f "$W"/qcow2-gen.raw "$W"/*.qcow2 "$W"/qcow2.raw "$W"/deflate.raw
    return
  fi
  IMG_B=$QC_B IMG_DST=$QC_DST IMG_DATA=$QC_DATA
  img_table qcow2 "plain nbdflow-copy nbdflow nbdflow-copy" \
    "plain qemu-img nbdflow qemu-img" \
    "plain nbdcopy-qemu-nbd nbdflow nbdcopy,qemu-nbd" \
    "deflate nbdflow-copy nbdflow nbdflow-copy" \
    "deflate qemu-img nbdflow qemu-img"
  rm -f "$QC_IMG" "$QC_RAW" "$QC_ZIMG" "$QC_ZRAW" "$QC_DST"
}
