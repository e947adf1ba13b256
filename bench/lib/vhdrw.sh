# bench/lib/vhdrw.sh: the section vhdrw of bench/run (issue 37; not in the
# default BENCH_SECTIONS: run it as BENCH_SECTIONS=vhdrw bench/run).
# Sourced by bench/run; uses record, meta, note_cmd, say, bytes,
# free_port, proc_cpu, server_stop, SRV_PID, SRV_PIDS, MISSING, RAW, W,
# NBDFLOW, LIB and the knobs below.
#
# Receiving into a VHD, as tapdisk does on the host a disk migrates to:
# nbdcopy writes a raw image over TCP loopback into a server of an empty
# dynamic VHD (qemu-img create -f vpc, 2 MiB blocks), which allocates its
# blocks as the writes arrive. Two workloads (dense: random data
# everywhere; sparse: BENCH_VHDRW_PCT% of the 2 MiB blocks random, the
# rest holes, which nbdcopy zeroes), two servers, interleaved:
#   nbdflow:  nbdflow serve DST.vhd
#   qemu-nbd: qemu-nbd -f vpc --cache=writeback --aio=threads -t -e 8
#             DST.vhd (qemu's cache mode by default; tmpfs either way)
# Each copy starts from a fresh copy of the empty VHD; the server's CPU
# over the copy comes from its /proc/PID/stat; after the server stopped,
# `qemu-img compare -f vpc -F raw` checks the VHD against the source, and
# `nbdflow info --check` checks nbdflow's.

: "${BENCH_VHDRW_SIZE:=2G}"   # virtual size of the VHD and the images
: "${BENCH_VHDRW_PCT:=20}"    # sparse workload: % of 2 MiB blocks of data
VHDRW_SERVERS="nbdflow qemu-nbd"

vhdrw_cap() {
  local s
  s=$(bytes "$BENCH_VHDRW_SIZE") || return 1
  # dense source, sparse source (less), the destination VHD, the empty one
  echo $((3 * s + (64 << 20)))
}

# vhdrw_server_start NAME VHD: the server of VHD on a free loopback port;
# sets SRV_PID and SRV_URI, ready once it answered a handshake.
vhdrw_server_start() {
  local name=$1 vhd=$2 port i
  local -a cmd
  port=$(free_port) || { SRV_ERR="no free port"; return 1; }
  SRV_URI="nbd://127.0.0.1:$port/" SRV_LOG=$RAW/logs/server-vhdrw-$name.log
  case $name in
    nbdflow) cmd=("$NBDFLOW" serve --listen "127.0.0.1:$port" "$vhd") ;;
    qemu-nbd) cmd=(qemu-nbd -f vpc --cache=writeback --aio=threads -t -e 8
                   -b 127.0.0.1 -p "$port" "$vhd") ;;
  esac
  note_cmd "server vhdrw $name" "${cmd[@]}"
  "${cmd[@]}" >>"$SRV_LOG" 2>&1 &
  SRV_PID=$!
  SRV_PIDS+=("$SRV_PID")
  for i in $(seq 100); do
    kill -0 "$SRV_PID" 2>/dev/null || { SRV_ERR="$name exited at start-up"; return 1; }
    nbdinfo --size "$SRV_URI" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  SRV_ERR="$name did not answer within 10 s"
  server_stop
  return 1
}

# vhdrw_copy WORKLOAD SERVER RUN SRC: one timed, verified copy.
vhdrw_copy() {
  local wl=$1 srv=$2 run=$3 src=$4 dst=$W/vhdrw-dst.vhd
  local log=$RAW/logs/vhdrw-$wl-$srv-$run.log tf=$W/run/time.out
  local size rc t0 t1 secs status=ok note="" rss="" usr="" sys="" extra=""
  local cpu0 cpu1 alloc
  size=$(stat -c %s "$src")
  cp "$VHDRW_EMPTY" "$dst" ||
    { record vhdrw "$wl" nbdcopy "$srv" tcp "$run" fail "" "$size" "" "" "" "" "cannot copy the empty VHD"; return; }
  if ! vhdrw_server_start "$srv" "$dst"; then
    [ "$run" = 0 ] || record vhdrw "$wl" nbdcopy "$srv" tcp "$run" fail "" "$size" "" "" "" "" "$SRV_ERR"
    return
  fi
  CLI_CMD=(nbdcopy "$src" "$SRV_URI")
  note_cmd "client vhdrw" "${CLI_CMD[@]}"
  rm -f "$tf"
  cpu0=$(proc_cpu "$SRV_PID")
  t0=$(date +%s%N)
  /usr/bin/time -f '%M %U %S' -o "$tf" \
    timeout -k 5 "$BENCH_TIMEOUT" "${CLI_CMD[@]}" >"$log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  cpu1=$(proc_cpu "$SRV_PID")
  [ -n "$cpu0" ] && [ -n "$cpu1" ] &&
    extra="srv_cpu_s=$(python3 -c "print('%.2f' % ($cpu1 - $cpu0))")"
  server_stop
  secs=$(python3 -c "print('%.4f' % (($t1 - $t0) / 1e9))")
  [ -s "$tf" ] && read -r rss usr sys < <(tail -1 "$tf")
  if [ "$rc" != 0 ]; then
    status=fail note="exit $rc: $(grep -v '^Command exited' "$log" | tail -1 | tr '\t' ' ' | cut -c1-160)"
  elif ! qemu-img compare -f vpc -F raw "$dst" "$src" >>"$log" 2>&1; then
    status=fail note="verification failed: qemu-img compare: $(tail -1 "$log" | cut -c1-120)"
  elif [ "$srv" = nbdflow ] &&
       ! "$NBDFLOW" info --check "$dst" >>"$log" 2>&1; then
    status=fail note="nbdflow info --check: $(grep error "$log" | head -1 | cut -c1-120)"
  fi
  alloc=$(stat -c %s "$dst")
  rm -f "$dst"
  [ "$run" = 0 ] && return
  extra="$extra;vhd_bytes=$alloc"
  record vhdrw "$wl" nbdcopy "$srv" tcp "$run" "$status" "$secs" "$size" \
    "$rss" "$usr" "$sys" "$extra" "$note"
  say "vhdrw $wl run $run: nbdcopy -> $srv: $status ${secs}s${note:+ ($note)}"
}

section_vhdrw() {
  local dense=$W/vhdrw-dense.raw sparse=$W/vhdrw-sparse.raw b run srv wl
  if [ -n "${MISSING[qemu-img]:-}${MISSING[qemu-nbd]:-}${MISSING[nbdcopy]:-}" ]; then
    record vhdrw - nbdcopy - tcp 0 missing "" "" "" "" "" "" \
      "${MISSING[qemu-img]:-}${MISSING[qemu-nbd]:-}${MISSING[nbdcopy]:-}"
    return
  fi
  b=$(bytes "$BENCH_VHDRW_SIZE") || die "bad BENCH_VHDRW_SIZE"
  VHDRW_EMPTY=$W/vhdrw-empty.vhd
  say "vhdrw: an empty $BENCH_VHDRW_SIZE dynamic VHD written by nbdcopy; dense, and $BENCH_VHDRW_PCT% of its blocks"
  note_cmd "vhdrw empty VHD" qemu-img create -f vpc -o subformat=dynamic,force_size=on "$VHDRW_EMPTY" "$b"
  qemu-img create -f vpc -o subformat=dynamic,force_size=on "$VHDRW_EMPTY" "$b" \
    >"$RAW/logs/vhdrw-make.log" 2>&1 &&
    python3 "$LIB/images.py" random "$dense" "$b" >>"$RAW/logs/vhdrw-make.log" 2>&1 &&
    python3 "$LIB/images.py" chosen "$sparse" "$b" $((2 << 20)) \
      "$BENCH_VHDRW_PCT" 1 >>"$RAW/logs/vhdrw-make.log" 2>&1 ||
    { record vhdrw - nbdcopy - tcp 0 fail "" "" "" "" "" "" "making the images failed (logs/vhdrw-make.log)"; return; }
  meta vhdrw "nbdcopy of a raw image ($BENCH_VHDRW_SIZE: dense random, and sparse with $BENCH_VHDRW_PCT% of its 2 MiB blocks random, holes zeroed by nbdcopy) over TCP loopback into a server of an empty dynamic VHD (qemu-img create -f vpc -o subformat=dynamic,force_size=on, 2 MiB blocks) on the bench tmpfs: nbdflow serve, and qemu-nbd -f vpc"
  if [ "$BENCH_WARMUP" = 1 ]; then
    for srv in $VHDRW_SERVERS; do vhdrw_copy dense "$srv" 0 "$dense"; done
  fi
  for run in $(seq "$BENCH_RUNS"); do
    for wl in dense sparse; do
      for srv in $VHDRW_SERVERS; do
        if [ "$wl" = dense ]; then vhdrw_copy dense "$srv" "$run" "$dense"
        else vhdrw_copy sparse "$srv" "$run" "$sparse"; fi
      done
    done
  done
  rm -f "$dense" "$sparse" "$VHDRW_EMPTY"
}
