# bench/lib/retry.sh: the section retry of bench/run (issue 34; not in the
# default BENCH_SECTIONS: run it as BENCH_SECTIONS=retry bench/run, as
# root). Sourced by bench/run after link.sh; uses link_check, link_up,
# link_down, record, meta, note_cmd, say, bytes, server_stop, SRV_PID,
# SRV_PIDS, RAW, W, NBDFLOW, LIB and the knobs below.
#
# Over the link emulator at BENCH_RETRY_RTT, one random image is copied
# by `nbdflow copy --retry` into nbdkit's file plugin (a file on the
# bench's tmpfs, so that what the server acknowledged survives it), two
# arms interleaved:
#   undisturbed: the copy alone;
#   killed:      once the copy has done BENCH_RETRY_KILL_PCT % of the
#                image, the server is killed (SIGKILL) and started again
#                at once on the same file; the copy reconnects.
# The figure is the time of a killed copy over the undisturbed one of the
# same run (goal: under 1.2x). Every copy is checked by an xxh128 of the
# destination file against the image's.

: "${BENCH_RETRY_SIZE:=2G}"      # the image
: "${BENCH_RETRY_RTT:=10}"       # emulated round trip, ms
: "${BENCH_RETRY_KILL_PCT:=50}"  # share of the image done at the kill
BENCH_RETRY_OPTS="--retry 10,0.2"

# retry_server_start FILE: nbdkit's file plugin on FILE in namespace B,
# listening when it returns (SRV_PID); 1 with SRV_ERR when it did not.
retry_server_start() {
  local i
  SRV_LOG=$RAW/logs/server-retry.log
  local -a cmd=(nbdkit -f --exit-with-parent -i "$LINK_SRV" -p "$LINK_PORT"
                file "$1")
  note_cmd "server retry" "${cmd[@]}"
  ip netns exec "$LINK_NS_B" "${cmd[@]}" >>"$SRV_LOG" 2>&1 &
  SRV_PID=$!
  SRV_PIDS+=("$SRV_PID")
  for i in $(seq 200); do
    kill -0 "$SRV_PID" 2>/dev/null || { SRV_ERR="nbdkit exited at start-up"; return 1; }
    [ -n "$(ip netns exec "$LINK_NS_B" ss -Hltn "sport = :$LINK_PORT" 2>/dev/null)" ] && return 0
    sleep 0.05
  done
  SRV_ERR="nbdkit did not listen within 10 s"
  server_stop
  return 1
}

# retry_kill_at LOG BYTES PID: waits until the copy's --progress=json
# lines in LOG report BYTES done (or the copy PID ended), then kills the
# server and starts it again on the same file. Sets KILL_NOTE.
retry_kill_at() {
  local log=$1 at=$2 pid=$3 done_b
  while kill -0 "$pid" 2>/dev/null; do
    done_b=$(grep -o '"done": [0-9]*' "$log" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
    [ -n "$done_b" ] && [ "$done_b" -ge "$at" ] && break
    sleep 0.02
  done
  kill -0 "$pid" 2>/dev/null || { KILL_NOTE="copy ended before the kill"; return 1; }
  kill -KILL "$SRV_PID"
  wait "$SRV_PID" 2>/dev/null
  SRV_PID=""
  retry_server_start "$RETRY_DST" || { KILL_NOTE="restart: $SRV_ERR"; return 1; }
  return 0
}

# retry_copy ARM RUN: one timed copy of the image into a fresh
# destination file.
retry_copy() {
  local arm=$1 run=$2 size=$RETRY_BYTES
  local log=$RAW/logs/retry-$arm-$run.log prog=$W/run/retry-progress.log
  local tf=$W/run/time.out rc t0 t1 secs status=ok note="" extra="" rss="" usr="" sys="" got pid
  rm -f "$RETRY_DST" "$tf" "$prog"
  truncate -s "$size" "$RETRY_DST"
  if ! retry_server_start "$RETRY_DST"; then
    [ "$run" = 0 ] || record retry "$BENCH_RETRY_RTT" "$arm" nbdkit link "$run" fail "" "$size" "" "" "" "" "$SRV_ERR"
    return
  fi
  # shellcheck disable=SC2086
  set -- "$NBDFLOW" copy --json --progress=json $BENCH_RETRY_OPTS \
    "$RETRY_IMG" "nbd://$LINK_SRV:$LINK_PORT/"
  note_cmd "client retry" "$@"
  t0=$(date +%s%N)
  ip netns exec "$LINK_NS_A" /usr/bin/time -f '%M %U %S' -o "$tf" \
    timeout -k 5 "$BENCH_TIMEOUT" "$@" >"$log" 2>"$prog" &
  pid=$!
  KILL_NOTE=""
  if [ "$arm" = killed ]; then
    retry_kill_at "$prog" $((size / 100 * BENCH_RETRY_KILL_PCT)) "$pid" || true
  fi
  wait "$pid"
  rc=$?
  t1=$(date +%s%N)
  secs=$(python3 -c "print('%.4f' % (($t1 - $t0) / 1e9))")
  [ -s "$tf" ] && read -r rss usr sys < <(tail -1 "$tf")
  server_stop
  cp "$prog" "$RAW/logs/retry-$arm-$run.progress.log"
  if [ "$rc" != 0 ]; then
    status=fail note="exit $rc: $(grep -v '^{' "$prog" | tail -1 | tr '\t' ' ' | cut -c1-160)"
  elif [ -n "$KILL_NOTE" ]; then
    status=fail note=$KILL_NOTE
  else
    got=$("$NBDFLOW" sum --algo xxh128 "$RETRY_DST" | cut -d' ' -f1)
    [ "$got" = "$RETRY_SUM" ] || status=fail note="checksum mismatch"
  fi
  [ "$run" = 0 ] && return
  extra=$(python3 - "$log" <<'PY'
import json, sys
rep = None
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("{") and '"bytes_total"' in line:
        rep = json.loads(line)
if rep:
    print("reconnects=%s;resent=%s;conns=%s" % (
        rep.get("reconnects"), rep.get("bytes_resent"),
        rep.get("connections", {}).get("destination")))
PY
)
  extra="${extra:+$extra;}rtt_meas=${LINK_RTT_MEASURED:-}"
  record retry "$BENCH_RETRY_RTT" "$arm" nbdkit link "$run" "$status" "$secs" \
    "$size" "$rss" "$usr" "$sys" "$extra" "$note"
  say "retry run $run: $arm: $status ${secs}s${note:+ ($note)}"
}

# nbdkit_link_ready SECTION: true when the link emulator and nbdkit are
# there; otherwise SECTION is recorded as missing, saying why.
nbdkit_link_ready() {
  if ! link_check; then
    record "$1" - - - link 0 missing "" "" "" "" "" "" "$LINK_ERR"
    return 1
  fi
  if ! command -v nbdkit >/dev/null; then
    record "$1" - - nbdkit link 0 missing "" "" "" "" "" "" "nbdkit not installed"
    return 1
  fi
}

# random_image PATH BYTES SECTION: writes a random image and prints its
# xxh128, which every destination is checked against.
random_image() {
  python3 "$LIB/images.py" random "$1" "$2" || die "$3 image failed"
  "$NBDFLOW" sum --algo xxh128 "$1" | cut -d' ' -f1
}

section_retry() {
  local run arm
  nbdkit_link_ready retry || return
  RETRY_IMG=$W/retry-src.img
  RETRY_DST=$W/retry-dst.img
  RETRY_BYTES=$(bytes "$BENCH_RETRY_SIZE")
  RETRY_SUM=$(random_image "$RETRY_IMG" "$RETRY_BYTES" retry) || exit 1
  meta retry "$BENCH_RETRY_SIZE random image into nbdkit's file plugin over the emulated link at $BENCH_RETRY_RTT ms and $BENCH_RATE; killed arm: SIGKILL at $BENCH_RETRY_KILL_PCT% done and restarted at once; nbdflow copy $BENCH_RETRY_OPTS"
  if ! link_up "$BENCH_RETRY_RTT"; then
    record retry "$BENCH_RETRY_RTT" - - link 0 fail "" "" "" "" "" "" "$LINK_ERR"
    return
  fi
  for run in $(seq 0 "$BENCH_RUNS"); do
    [ "$run" = 0 ] && [ "$BENCH_WARMUP" != 1 ] && continue
    for arm in undisturbed killed; do
      [ "$run" = 0 ] && [ "$arm" != undisturbed ] && continue
      retry_copy "$arm" "$run"
    done
  done
  link_down
  rm -f "$RETRY_IMG" "$RETRY_DST"
}
