# bench/lib/vhd.sh: the section vhd of bench/run (not in the default
# BENCH_SECTIONS; run it as BENCH_SECTIONS=vhd bench/run). Sourced by
# bench/run after its shell functions; uses record, meta, note_cmd, say,
# die, bytes, server_start/server_stop/server_cpu_settle, proc_cpu, SRV_*,
# MISSING, RAW, W, NBDFLOW, LIB and the knobs below.
#
# One interleaved table, each run going once through every arm:
#   write: a dynamic VHD (made by qemu-img from a sparse raw image) copied
#          into `nbdflow serve` of a raw file over TCP loopback by
#          nbdflow copy (no flags), qemu-img convert -W, and nbdflow copy
#          with the stock sparse_dd pattern (one 2 MiB write in flight,
#          Nagle on, header and payload in two writes, one connection,
#          holes written as zeros);
#   read:  nbdcopy reads `nbdflow serve disk.vhd` and `nbdflow serve
#          disk.raw` (the raw conversion of the same VHD) into null:.
# Every write is compared byte for byte with qemu-img's raw conversion of
# the VHD; every read is checked by an xxh128 of the served export, taken
# after the timed read, against that of the raw conversion.

: "${BENCH_VHD_SIZE:=8G}"       # virtual size of the VHD
: "${BENCH_VHD_PCT:=20}"        # % of its 2 MiB blocks holding data
: "${BENCH_VHD_SEED:=1}"        # seed choosing those blocks
VHD_BLOCK=$((2 << 20))          # qemu's dynamic VHD block size

# vhd_cap: bytes of tmpfs the section needs at most: the VHD, the raw
# conversion and, while it is made, the generated raw image (each holding
# the data), plus the destination, which the stock arm fills to the full
# virtual size (it writes holes as zeros, and the server stores them).
vhd_cap() {
  local vsize data
  vsize=$(bytes "$BENCH_VHD_SIZE") || return 1
  data=$((vsize / 100 * (${BENCH_VHD_PCT%.*} + 1) + VHD_BLOCK))
  echo $((vsize + 3 * data))
}

# vhd_make: $VHD_IMG (dynamic VHD, qemu-img, force_size) and $VHD_RAW
# (qemu-img's sparse raw conversion of it, the expected content); checks
# that qemu-img made what was asked for. Sets VHD_SUM (xxh128 of the raw
# conversion) and VHD_DATA (bytes of data).
vhd_make() {
  local gen=$W/vhd-gen.raw info fmt vs creator
  VHD_IMG=$W/disk.vhd VHD_RAW=$W/disk.raw VHD_DST=$W/vhd-dst.raw
  say "making a $BENCH_VHD_SIZE dynamic VHD, $BENCH_VHD_PCT% of its 2 MiB blocks random data (seed $BENCH_VHD_SEED)"
  python3 "$LIB/images.py" chosen "$gen" "$VHD_B" "$VHD_BLOCK" \
    "$BENCH_VHD_PCT" "$BENCH_VHD_SEED" >"$RAW/logs/vhd-make.log" ||
    { VHD_ERR="images.py chosen failed"; return 1; }
  # force_size: the footer's current size is the virtual size, exactly,
  # with creator "qem2"; without it qemu rounds the size to its CHS
  # geometry (creator "qemu").
  note_cmd "vhd image" qemu-img convert -f raw -O vpc \
    -o subformat=dynamic,force_size=on "$gen" "$VHD_IMG"
  qemu-img convert -f raw -O vpc -o subformat=dynamic,force_size=on \
    "$gen" "$VHD_IMG" >>"$RAW/logs/vhd-make.log" 2>&1 ||
    { VHD_ERR="qemu-img convert -O vpc failed (see logs/vhd-make.log)"; return 1; }
  info=$(qemu-img info --output=json "$VHD_IMG") ||
    { VHD_ERR="qemu-img info failed"; return 1; }
  echo "$info" >>"$RAW/logs/vhd-make.log"
  fmt=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["format"])' <<<"$info")
  vs=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])' <<<"$info")
  creator=$(tail -c 512 "$VHD_IMG" | dd bs=1 skip=28 count=4 2>/dev/null)
  [ "$fmt" = vpc ] || { VHD_ERR="qemu-img info: format $fmt, not vpc"; return 1; }
  [ "$vs" = "$VHD_B" ] ||
    { VHD_ERR="qemu-img info: virtual size $vs, not $VHD_B"; return 1; }
  [ "$creator" = qem2 ] ||
    { VHD_ERR="footer creator '$creator', not qem2 (force_size)"; return 1; }
  img_expected vhd vpc "$VHD_IMG" "$VHD_RAW" "$gen" || { VHD_ERR=$IMG_ERR; return 1; }
  rm -f "$gen"
  VHD_NBLK=$(img_blocks "$RAW/logs/vhd-make.log")
  VHD_DATA=$((VHD_NBLK * VHD_BLOCK))
  VHD_SUM=$("$NBDFLOW" sum --algo xxh128 "$VHD_RAW" | cut -d' ' -f1)
  [ -n "$VHD_SUM" ] || { VHD_ERR="nbdflow sum of the raw conversion failed"; return 1; }
  meta vhd "dynamic VHD (qemu-img convert -O vpc -o subformat=dynamic,force_size=on: creator qem2), virtual size $BENCH_VHD_SIZE ($VHD_B bytes), $VHD_NBLK of $((VHD_B / VHD_BLOCK)) blocks of 2 MiB hold random data ($BENCH_VHD_PCT%, drawn with seed $BENCH_VHD_SEED; $VHD_DATA bytes), VHD file $(stat -c %s "$VHD_IMG") bytes; raw conversion $(du -B1 "$VHD_RAW" | cut -f1) bytes allocated"
  return 0
}

# img_expected SEC FMT IMG RAW GEN: RAW, the expected content, by qemu's
# own reader of IMG (sparse), checked against GEN, the raw image IMG was
# made from. Shared with bench/lib/qcow2.sh; sets IMG_ERR on failure.
img_expected() {
  note_cmd "$1 expected raw" qemu-img convert -f "$2" -O raw "$3" "$4"
  qemu-img convert -f "$2" -O raw "$3" "$4" >>"$RAW/logs/$1-make.log" 2>&1 ||
    { IMG_ERR="qemu-img convert -f $2 -O raw failed"; return 1; }
  python3 "$LIB/images.py" verify "$5" "$4" >>"$RAW/logs/$1-make.log" 2>&1 ||
    { IMG_ERR="qemu-img's raw conversion of $(basename "$3") differs from the generated image"; return 1; }
}

# img_blocks LOG: how many blocks hold data, from images.py chosen's line
# in LOG.
img_blocks() {
  sed -n 's/^\([0-9]*\) of [0-9]* blocks.*/\1/p' "$1" | head -1
}

# img_prereq SEC WHAT: records why the section cannot run (no qemu-img to
# make its image, no nbdflow serve, no image formats in nbdflow copy) and
# returns 1; 0 when it can.
img_prereq() {
  if [ -n "${MISSING[qemu-img]:-}" ]; then
    record "$1" - - - tcp 0 missing "" "" "" "" "" "" "${MISSING[qemu-img]}: no way to make the $2"
    return 1
  fi
  if [ -n "${MISSING[nbdflow]:-}" ]; then
    record "$1" - - nbdflow tcp 0 missing "" "" "" "" "" "" "${MISSING[nbdflow]}"
    return 1
  fi
  if ! "$NBDFLOW" copy --help 2>&1 | grep -q -- --src-format; then
    record "$1" - nbdflow-copy - tcp 0 missing "" "" "" "" "" "" \
      "not available: 'nbdflow copy --help' names no --src-format (no $2 in this build)"
    return 1
  fi
}

# vhd_arm_cmd ARM URI: sets CLI_CMD for one arm.
vhd_arm_cmd() {
  case $1 in
    nbdflow-copy) CLI_CMD=("$NBDFLOW" copy "$VHD_IMG" "$2") ;;
    qemu-img) CLI_CMD=(qemu-img convert -W -f vpc -O raw -n "$VHD_IMG" "$2") ;;
    # The stock sparse_dd pattern (vhd-tool without --prezeroed): one 2 MiB
    # write in flight on one connection, Nagle on, each write's header and
    # payload in two writes, holes written as zeros.
    stock-pattern) CLI_CMD=("$NBDFLOW" copy --nagle --max-requests 1 --split-writes
                            --connections 1 --allocated --request-size 2M
                            "$VHD_IMG" "$2") ;;
    nbdcopy) CLI_CMD=(nbdcopy "$2" null:) ;;
  esac
}

# img_copy SEC WL ARM SRV RUN SERVED EXPECT SUM: one timed copy, shared by
# the sections vhd and qcow2 (bench/lib/qcow2.sh). SERVED empty: a write:
# reset $IMG_DST like EXPECT, serve it, ARM copies into it, verify it byte
# for byte against EXPECT after the server stopped. SERVED a file: a read:
# serve SERVED, ARM reads it, then an untimed xxh128 of the export is
# compared with SUM. ${SEC}_arm_cmd ARM URI WL sets CLI_CMD; it may start a
# server of the source untimed and set SRC_PID: that server's CPU over the
# copy is recorded as src_cpu_s and it is stopped after the copy. The
# client's wall time, peak RSS and CPU (/usr/bin/time), and the server's
# CPU over the copy (/proc) are recorded. RUN 0 is a warm-up.
img_copy() {
  local sec=$1 wl=$2 arm=$3 srv=$4 run=$5 served=$6 expect=$7 sum=$8
  local log=$RAW/logs/$sec-$wl-$arm-$srv-$run.log tf=$W/run/time.out
  local status=ok note="" secs="" rss="" usr="" sys="" rc t0 t1
  local cpu0 cpu1 scpu0="" scpu1="" extra="" got
  if [ -z "$served" ]; then
    served=$IMG_DST
    python3 "$LIB/images.py" reset "$IMG_DST" "$IMG_B" "$expect" ||
      { record "$sec" "$wl" "$arm" "$srv" tcp "$run" fail "" "$IMG_B" "" "" "" "" "destination reset failed"; return; }
  fi
  if ! server_start nbdflow tcp "$served"; then
    [ "$run" = 0 ] || record "$sec" "$wl" "$arm" "$srv" tcp "$run" fail "" "$IMG_B" "" "" "" "" "$SRV_ERR"
    return
  fi
  SRC_PID="" SRC_ERR=""
  if ! "${sec}_arm_cmd" "$arm" "$SRV_URI/" "$wl"; then
    server_stop
    [ "$run" = 0 ] || record "$sec" "$wl" "$arm" "$srv" tcp "$run" fail "" "$IMG_B" "" "" "" "" "$SRC_ERR"
    return
  fi
  note_cmd "$sec $wl: client $arm" "${CLI_CMD[@]}"
  rm -f "$tf"
  server_cpu_settle
  cpu0=$(proc_cpu "$SRV_PID")
  [ -n "$SRC_PID" ] && scpu0=$(proc_cpu "$SRC_PID")
  t0=$(date +%s%N)
  /usr/bin/time -f '%M %U %S' -o "$tf" \
    timeout -k 5 "$BENCH_TIMEOUT" "${CLI_CMD[@]}" >"$log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  cpu1=$(proc_cpu "$SRV_PID")
  [ -n "$SRC_PID" ] && scpu1=$(proc_cpu "$SRC_PID")
  [ -n "$cpu0" ] && [ -n "$cpu1" ] &&
    extra="srv_cpu_s=$(python3 -c "print('%.2f' % ($cpu1 - $cpu0))")"
  [ -n "$scpu0" ] && [ -n "$scpu1" ] &&
    extra="$extra;src_cpu_s=$(python3 -c "print('%.2f' % ($scpu1 - $scpu0))")"
  secs=$(python3 -c "print('%.4f' % (($t1 - $t0) / 1e9))")
  [ -s "$tf" ] && read -r rss usr sys < <(tail -1 "$tf")
  if [ "$rc" != 0 ]; then
    status=fail
    if [ "$rc" = 124 ]; then note="killed after ${BENCH_TIMEOUT} s"
    else note="exit $rc: $(grep -v '^Command exited' "$log" | tail -1 | tr '\t' ' ' | cut -c1-160)"; fi
  elif [ "$served" != "$IMG_DST" ]; then
    # The served content, read after the timed copy while the server runs.
    got=$("$NBDFLOW" sum --algo xxh128 "$SRV_URI/" 2>>"$log" | cut -d' ' -f1)
    [ "$got" = "$sum" ] ||
      status=fail note="verification failed: export xxh128 ${got:-none} != $sum"
  fi
  server_stop
  [ -n "$SRC_PID" ] && { kill "$SRC_PID" 2>/dev/null; wait "$SRC_PID" 2>/dev/null; }
  if [ "$status" = ok ] && [ "$served" = "$IMG_DST" ] &&
     ! python3 "$LIB/images.py" verify "$expect" "$IMG_DST" >>"$log" 2>&1; then
    status=fail note="verification failed: $(tail -1 "$log" | tr '\t' ' ' | cut -c1-160)"
  fi
  [ "$run" = 0 ] && return
  extra="${extra:+$extra;}data_bytes=$IMG_DATA"
  record "$sec" "$wl" "$arm" "$srv" tcp "$run" "$status" "$secs" "$IMG_B" \
    "$rss" "$usr" "$sys" "$extra" "$note"
  say "$sec $wl run $run: $arm -> $srv: $status ${secs}s${note:+ ($note)}"
}

# img_table SEC SPEC...: one interleaved table; each SPEC is "WL ARM SRV
# NEEDS" (NEEDS: comma-separated MISSING keys the arm needs). Arms whose
# tools are missing are recorded so; then one unrecorded copy of each
# workload (BENCH_WARMUP) and BENCH_RUNS runs, each going once through
# every arm, by ${SEC}_copy WL ARM SRV RUN.
img_table() {
  local sec=$1 spec run need seen="" miss
  local -a arms=()
  shift
  for spec in "$@"; do
    set -- $spec
    miss=""
    for need in ${4//,/ }; do miss=${miss:-${MISSING[$need]:-}}; done
    if [ -n "$miss" ]; then
      record "$sec" "$1" "$2" "$3" tcp 0 missing "" "" "" "" "" "" "$miss"
    else
      arms+=("$1 $2 $3")
    fi
  done
  if [ "$BENCH_WARMUP" = 1 ]; then
    for spec in "${arms[@]}"; do
      set -- $spec
      case " $seen " in *" $1 "*) continue ;; esac
      seen="$seen $1"
      "${sec}_copy" "$1" "$2" "$3" 0
    done
  fi
  for run in $(seq "$BENCH_RUNS"); do
    for spec in "${arms[@]}"; do
      set -- $spec
      "${sec}_copy" "$1" "$2" "$3" "$run"
    done
  done
}

# vhd_copy WORKLOAD ARM SERVER RUN: write: ARM copies the VHD into the
# destination; read: nbdcopy reads SERVER's file (nbdflow-vhd: the VHD,
# nbdflow-raw: the raw conversion) into null:.
vhd_copy() {
  local served=""
  if [ "$1" = read ]; then
    if [ "$3" = nbdflow-vhd ]; then served=$VHD_IMG; else served=$VHD_RAW; fi
  fi
  img_copy vhd "$1" "$2" "$3" "$4" "$served" "$VHD_RAW" "$VHD_SUM"
}

section_vhd() {
  VHD_B=$(bytes "$BENCH_VHD_SIZE") || die "bad BENCH_VHD_SIZE"
  [ $((VHD_B % VHD_BLOCK)) = 0 ] || die "BENCH_VHD_SIZE must be a multiple of 2 MiB"
  img_prereq vhd VHD || return
  if ! vhd_make; then
    record vhd - - - tcp 0 fail "" "" "" "" "" "" "$VHD_ERR"
    rm -f "$W"/vhd-gen.raw "$W"/disk.vhd "$W"/disk.raw
    return
  fi
  IMG_B=$VHD_B IMG_DST=$VHD_DST IMG_DATA=$VHD_DATA
  img_table vhd "write nbdflow-copy nbdflow nbdflow-copy" \
    "write qemu-img nbdflow qemu-img" \
    "write stock-pattern nbdflow nbdflow-copy" \
    "read nbdcopy nbdflow-vhd nbdcopy" "read nbdcopy nbdflow-raw nbdcopy"
  rm -f "$VHD_IMG" "$VHD_RAW" "$VHD_DST"
}
