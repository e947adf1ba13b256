# bench/lib/rate.sh: the section rate of bench/run (issue 36's bandwidth
# cap; not in the default BENCH_SECTIONS: run it as BENCH_SECTIONS=rate
# bench/run, as root). Sourced by bench/run after retry.sh, whose
# nbdkit_link_ready, random_image and retry_server_start it uses (nbdkit's file plugin in namespace B); uses
# link_check, link_up, link_down, record, meta, note_cmd, say, bytes,
# server_stop, RAW, W, NBDFLOW, LIB and the knobs below.
#
# Over the link emulator at BENCH_RATE_RTT, `nbdflow copy --rate
# BENCH_RATE_LIMIT` of a random image into a file behind nbdkit, one arm,
# each run checked by an xxh128 of the destination. The figures: the rate
# over the whole copy, and over the 10 s that follow its first 2 s (from
# the --progress=json lines, one a second), each against the limit (goal:
# within 5%).

: "${BENCH_RATE_SIZE:=1G}"     # the image: 16 s at the default limit
: "${BENCH_RATE_LIMIT:=64M}"   # copy --rate
: "${BENCH_RATE_RTT:=10}"      # emulated round trip, ms

rate_copy() {
  local run=$1 size=$RATE_BYTES
  local log=$RAW/logs/rate-$run.log prog=$W/run/rate-progress.log
  local tf=$W/run/time.out rc t0 t1 secs status=ok note="" extra="" rss="" usr="" sys="" got
  rm -f "$RETRY_DST" "$tf" "$prog"
  truncate -s "$size" "$RETRY_DST"
  if ! retry_server_start "$RETRY_DST"; then
    [ "$run" = 0 ] || record rate "$BENCH_RATE_RTT" limited nbdkit link "$run" fail "" "$size" "" "" "" "" "$SRV_ERR"
    return
  fi
  set -- "$NBDFLOW" copy --json --progress=json --rate "$BENCH_RATE_LIMIT" \
    "$RATE_IMG" "nbd://$LINK_SRV:$LINK_PORT/"
  note_cmd "client rate" "$@"
  t0=$(date +%s%N)
  ip netns exec "$LINK_NS_A" /usr/bin/time -f '%M %U %S' -o "$tf" \
    timeout -k 5 "$BENCH_TIMEOUT" "$@" >"$log" 2>"$prog"
  rc=$?
  t1=$(date +%s%N)
  secs=$(python3 -c "print('%.4f' % (($t1 - $t0) / 1e9))")
  [ -s "$tf" ] && read -r rss usr sys < <(tail -1 "$tf")
  server_stop
  cp "$prog" "$RAW/logs/rate-$run.progress.log"
  if [ "$rc" != 0 ]; then
    status=fail note="exit $rc: $(grep -v '^{' "$prog" | tail -1 | cut -c1-160)"
  else
    got=$("$NBDFLOW" sum --algo xxh128 "$RETRY_DST" | cut -d' ' -f1)
    [ "$got" = "$RATE_SUM" ] || status=fail note="checksum mismatch"
  fi
  [ "$run" = 0 ] && return
  extra=$(python3 - "$log" "$prog" <<'PY'
import json, sys
rep = None
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("{") and '"bytes_total"' in line:
        rep = json.loads(line)
pts = []
for line in open(sys.argv[2], errors="replace"):
    if line.startswith("{") and '"done"' in line:
        p = json.loads(line)
        pts.append((p["seconds"], p["done"]))
# The 10 s after the first 2: the progress points nearest 2 s and 12 s.
win = ""
a = [p for p in pts if p[0] >= 2.0]
b = [p for p in pts if p[0] >= 12.0]
if a and b and b[0][0] > a[0][0]:
    win = "%.1f" % ((b[0][1] - a[0][1]) / (b[0][0] - a[0][0]))
if rep:
    print("copy_rate=%.1f;win_rate=%s;limit=%s;conns=%s" % (
        rep["bytes_copied"] / rep["seconds"], win, rep.get("rate_limit"),
        rep.get("connections", {}).get("destination")))
PY
)
  record rate "$BENCH_RATE_RTT" limited nbdkit link "$run" "$status" "$secs" \
    "$size" "$rss" "$usr" "$sys" "$extra" "$note"
  say "rate run $run: $status ${secs}s${note:+ ($note)}"
}

section_rate() {
  local run
  nbdkit_link_ready rate || return
  RATE_IMG=$W/rate-src.img
  RETRY_DST=$W/rate-dst.img
  RATE_BYTES=$(bytes "$BENCH_RATE_SIZE")
  RATE_SUM=$(random_image "$RATE_IMG" "$RATE_BYTES" rate) || exit 1
  meta rate "$BENCH_RATE_SIZE random image into nbdkit's file plugin over the emulated link at $BENCH_RATE_RTT ms and $BENCH_RATE; nbdflow copy --rate $BENCH_RATE_LIMIT ($(bytes "$BENCH_RATE_LIMIT") bytes/s)"
  if ! link_up "$BENCH_RATE_RTT"; then
    record rate "$BENCH_RATE_RTT" - - link 0 fail "" "" "" "" "" "" "$LINK_ERR"
    return
  fi
  for run in $(seq 0 "$BENCH_RUNS"); do
    [ "$run" = 0 ] && [ "$BENCH_WARMUP" != 1 ] && continue
    rate_copy "$run"
  done
  link_down
  rm -f "$RATE_IMG" "$RETRY_DST"
}
