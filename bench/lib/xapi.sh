# bench/lib/xapi.sh: the section xapi of bench/run (issue 33; not in the
# default BENCH_SECTIONS: run it as BENCH_SECTIONS=xapi bench/run; its
# link tables need root). Sourced by bench/run after link.sh; uses
# link_check, link_up, link_down, copy_json_extra, record, meta, note_cmd,
# say, bytes, free_port, proc_cpu, server_stop, SRV_PID, SRV_PIDS, RAW, W,
# NBDFLOW, LIB and the knobs below.
#
# One random image is copied into `nbdflow serve` of a file on the bench's
# tmpfs, the server listening for NBD, HTTP (--http) and raw Chunked
# (--chunked-listen) at once, by four arms of `nbdflow copy`:
#   nbd:           nbd://HOST:PORT/                (our NBD pair)
#   http-nbd:      http://HOST:HPORT/nbd/          (a PUT answered with
#                  Transfer-encoding: nbd, then the same NBD client)
#   chunked:       chunked+tcp://HOST:CPORT        (xapi's frames)
#   chunked-stock: the same with the stock sender's shape: --nagle
#                  --split-writes --max-requests 1 --connections 1
#                  (header and payload in two writes, one frame at a time)
# over TCP loopback (BENCH_XAPI_SIZE) and over the link emulator at each
# of BENCH_XAPI_RTTS ms (BENCH_XAPI_LINK_SIZE; root only). Every copy is
# verified byte for byte; a Chunked copy ends when the socket has taken
# the end marker, and is verified once the server has logged the stream
# flushed. The arms run interleaved, BENCH_RUNS times.

: "${BENCH_XAPI_SIZE:=2G}"        # the loopback image
: "${BENCH_XAPI_LINK_SIZE:=2G}"   # the image over the link emulator (at most BENCH_XAPI_SIZE)
: "${BENCH_XAPI_RTTS:=10 50}"     # emulated round trips, ms
XAPI_ARMS="nbd http-nbd chunked chunked-stock"
XAPI_LINK_ARMS="nbd chunked chunked-stock"

xapi_cap() {
  echo $((2 * $(bytes "$BENCH_XAPI_SIZE")))
}

# xapi_server_start HOST DST [NS]: nbdflow serve of DST on HOST with the
# three listeners (in namespace NS when given); sets SRV_PID, XAPI_PORTS.
xapi_server_start() {
  local host=$1 dst=$2 ns=${3:-} p h c i
  local -a pre=()
  [ -n "$ns" ] && pre=(ip netns exec "$ns")
  if [ -n "$ns" ]; then p=$LINK_PORT h=$((LINK_PORT + 1)) c=$((LINK_PORT + 2))
  else p=$(free_port) h=$(free_port) c=$(free_port); fi
  SRV_LOG=$RAW/logs/server-xapi.log
  local -a cmd=("$NBDFLOW" serve --listen "$host:$p" --http "$host:$h"
                --chunked-listen "$host:$c" "$dst")
  note_cmd "server xapi" "${cmd[@]}"
  "${pre[@]}" "${cmd[@]}" >>"$SRV_LOG" 2>&1 &
  SRV_PID=$!
  SRV_PIDS+=("$SRV_PID")
  XAPI_PORTS="$p $h $c"
  for i in $(seq 100); do
    kill -0 "$SRV_PID" 2>/dev/null || { SRV_ERR="serve exited at start-up"; return 1; }
    [ -n "$("${pre[@]}" ss -Hltn "sport = :$c" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  SRV_ERR="serve did not listen within 10 s"
  server_stop
  return 1
}

# xapi_arm_cmd ARM SRC HOST: CLI_CMD for one arm.
xapi_arm_cmd() {
  local p h c
  read -r p h c <<<"$XAPI_PORTS"
  case $1 in
    nbd) CLI_CMD=("$NBDFLOW" copy --json "$2" "nbd://$3:$p/") ;;
    http-nbd) CLI_CMD=("$NBDFLOW" copy --json "$2" "http://$3:$h/nbd/") ;;
    chunked) CLI_CMD=("$NBDFLOW" copy --json "$2" "chunked+tcp://$3:$c") ;;
    chunked-stock)
      CLI_CMD=("$NBDFLOW" copy --json --nagle --split-writes --max-requests 1
               --connections 1 "$2" "chunked+tcp://$3:$c") ;;
  esac
}

# xapi_copy WORKLOAD ARM RUN SRC DST [NS HOST]: one timed, verified copy.
xapi_copy() {
  local wl=$1 arm=$2 run=$3 src=$4 dst=$5 ns=${6:-} host=${7:-127.0.0.1}
  local log=$RAW/logs/xapi-$wl-$arm-$run.log tf=$W/run/time.out
  local size rc t0 t1 secs status=ok note="" rss="" usr="" sys="" extra=""
  local cpu0 cpu1 i n0 tr=tcp
  local -a pre=()
  [ -n "$ns" ] && { pre=(ip netns exec "$LINK_NS_A"); tr=link; }
  size=$(stat -c %s "$src")
  python3 "$LIB/images.py" reset "$dst" "$size" ||
    { record xapi "$wl" "$arm" nbdflow "$tr" "$run" fail "" "$size" "" "" "" "" "reset failed"; return; }
  if ! xapi_server_start "$host" "$dst" "$ns"; then
    [ "$run" = 0 ] || record xapi "$wl" "$arm" nbdflow "$tr" "$run" fail "" "$size" "" "" "" "" "$SRV_ERR"
    return
  fi
  n0=$(grep -c 'chunked into.*flushed' "$SRV_LOG")
  xapi_arm_cmd "$arm" "$src" "$host"
  note_cmd "client xapi $arm" "${CLI_CMD[@]}"
  rm -f "$tf"
  cpu0=$(proc_cpu "$SRV_PID")
  t0=$(date +%s%N)
  "${pre[@]}" /usr/bin/time -f '%M %U %S' -o "$tf" \
    timeout -k 5 "$BENCH_TIMEOUT" "${CLI_CMD[@]}" >"$log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  case $arm in chunked*)
    # The copy ends when the socket took the end marker; the server
    # writes what it still holds, then logs the stream flushed.
    for i in $(seq 600); do
      [ "$(grep -c 'chunked into.*flushed' "$SRV_LOG")" -gt "$n0" ] && break
      sleep 0.05
    done ;;
  esac
  cpu1=$(proc_cpu "$SRV_PID")
  [ -n "$cpu0" ] && [ -n "$cpu1" ] &&
    extra="srv_cpu_s=$(python3 -c "print('%.2f' % ($cpu1 - $cpu0))")"
  server_stop
  secs=$(python3 -c "print('%.4f' % (($t1 - $t0) / 1e9))")
  [ -s "$tf" ] && read -r rss usr sys < <(tail -1 "$tf")
  if [ "$rc" != 0 ]; then
    status=fail note="exit $rc: $(grep -v '^Command exited' "$log" | tail -1 | tr '\t' ' ' | cut -c1-160)"
  elif ! python3 "$LIB/images.py" verify "$src" "$dst" >>"$log" 2>&1; then
    status=fail note="verification failed: $(tail -1 "$log" | tr '\t' ' ' | cut -c1-160)"
  fi
  [ "$run" = 0 ] && return
  local j
  j=$(copy_json_extra "$log")
  extra="$extra${j:+;$j}${ns:+;rtt_meas=${LINK_RTT_MEASURED:-}}"
  record xapi "$wl" "$arm" nbdflow "$tr" "$run" "$status" "$secs" "$size" \
    "$rss" "$usr" "$sys" "$extra" "$note"
  say "xapi $wl run $run: $arm: $status ${secs}s${note:+ ($note)}"
}

section_xapi() {
  local src=$W/xapi-src.img dst=$W/xapi-dst.img run arm rtt
  say "xapi: a $BENCH_XAPI_SIZE random image, arms $XAPI_ARMS"
  python3 "$LIB/images.py" random "$src" "$(bytes "$BENCH_XAPI_SIZE")" ||
    { record xapi loopback - nbdflow tcp 0 fail "" "" "" "" "" "" "images.py random failed"; return; }
  meta xapi "random $BENCH_XAPI_SIZE image into nbdflow serve of a file on the bench tmpfs (one server with NBD, --http and --chunked-listen), TCP loopback; over the link emulator a $BENCH_XAPI_LINK_SIZE image at $BENCH_XAPI_RTTS ms"
  [ "$BENCH_WARMUP" = 1 ] && for arm in $XAPI_ARMS; do
    xapi_copy loopback "$arm" 0 "$src" "$dst"; done
  for run in $(seq "$BENCH_RUNS"); do
    for arm in $XAPI_ARMS; do xapi_copy loopback "$arm" "$run" "$src" "$dst"; done
  done
  rm -f "$src" "$dst"
  if ! link_check; then
    say "xapi: link tables skipped: $LINK_ERR"
    meta "xapi link" "skipped: $LINK_ERR"
    return
  fi
  python3 "$LIB/images.py" random "$src" "$(bytes "$BENCH_XAPI_LINK_SIZE")" || return
  for rtt in $BENCH_XAPI_RTTS; do
    link_up "$rtt" || { say "xapi: $LINK_ERR"; continue; }
    for run in $(seq "$BENCH_RUNS"); do
      for arm in $XAPI_LINK_ARMS; do
        xapi_copy "rtt$rtt" "$arm" "$run" "$src" "$dst" "$LINK_NS_B" "$LINK_SRV"
      done
    done
    link_down
  done
  rm -f "$src" "$dst"
}
