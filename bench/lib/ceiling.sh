# bench/lib/ceiling.sh: the section ceiling of bench/run (issue 36; not in
# the default BENCH_SECTIONS: run it as BENCH_SECTIONS=ceiling bench/run).
# Sourced by bench/run; uses make_dense, run_copy, record, meta, note_cmd,
# say, MISSING, CEILING, DENSE, RAW, W, LIB and BENCH_SIZE, BENCH_RUNS,
# BENCH_WARMUP, BENCH_TIMEOUT.
#
# How far our pair is from what this machine allows: the dense image
# (BENCH_SIZE), both ends on the bench's tmpfs, copied over TCP loopback
# and over a Unix socket by two arms interleaved run by run:
#   ceiling: nbdflow-ceiling (bench/ceiling.c), the bare data path:
#            sendfile from the source into the socket in 2 MiB pieces, 8 in
#            flight, splice from the socket through a pipe into the
#            destination, one process, sockets set as nbdflow sets its own;
#   pair:    nbdflow serve of the destination and nbdflow copy SRC URI,
#            both with their defaults (run_copy, as in the dense table).
# Every copy is compared byte for byte with the image. The figure is the
# pair's MiB/s as a percentage of the ceiling's (goal on TCP: 80%).

# ceiling_run TRANSPORT RUN SRC DST: one timed run of the ceiling program,
# shaped like run_copy: reset DST, time the program (wall clock from exec
# to exit; peak RSS and CPU from /usr/bin/time), verify DST against SRC.
# Its own key=value line goes into the row's extra field. RUN 0 is a
# warm-up and is not recorded.
ceiling_run() {
  local tr=$1 run=$2 src=$3 dst=$4
  local size status=ok note="" secs="" rss="" usr="" sys="" extra="" rc t0 t1 out
  local tf=$W/run/time.out log=$RAW/logs/ceiling-ceiling-$tr-$run.log
  size=$(stat -c %s "$src")
  if ! python3 "$LIB/images.py" reset "$dst" "$size"; then
    [ "$run" = 0 ] ||
      record ceiling dense ceiling ceiling "$tr" "$run" fail "" "$size" "" "" "" "" "destination reset failed"
    return
  fi
  local -a cmd=("$CEILING" "--$tr" "$src" "$dst")
  note_cmd "ceiling $tr" "${cmd[@]}"
  rm -f "$tf"
  t0=$(date +%s%N)
  out=$(/usr/bin/time -f '%M %U %S' -o "$tf" \
    timeout -k 5 "$BENCH_TIMEOUT" "${cmd[@]}" 2>"$log")
  rc=$?
  t1=$(date +%s%N)
  echo "$out" >>"$log"
  secs=$(python3 -c "print('%.4f' % (($t1 - $t0) / 1e9))")
  [ -s "$tf" ] && read -r rss usr sys < <(tail -1 "$tf")
  if [ "$rc" != 0 ] || [ -z "$out" ]; then
    status=fail
    if [ "$rc" = 124 ]; then note="killed after ${BENCH_TIMEOUT} s"
    else note="exit $rc: $(grep -v '^Command exited' "$log" | tail -1 | tr '\t' ' ' | cut -c1-160)"; fi
  elif ! python3 "$LIB/images.py" verify "$src" "$dst" >>"$log" 2>&1; then
    status=fail note="verification failed: $(tail -1 "$log" | tr '\t' ' ' | cut -c1-160)"
  fi
  [ "$run" = 0 ] && return
  extra=$(tr ' ' ';' <<<"$out")
  record ceiling dense ceiling ceiling "$tr" "$run" "$status" "$secs" "$size" \
    "$rss" "$usr" "$sys" "$extra" "$note"
  say "ceiling run $run: ceiling/$tr: $status ${secs}s${note:+ ($note)}"
}

section_ceiling() {
  local run tr dst=$W/dst-ceiling.img
  local ceiling_ok=1 pair_ok=1
  if [ -n "${MISSING[ceiling]:-}" ]; then
    ceiling_ok=0
    record ceiling dense ceiling ceiling - 0 missing "" "" "" "" "" "" "${MISSING[ceiling]}"
  fi
  local m
  for m in nbdflow nbdflow-copy; do
    if [ -n "${MISSING[$m]:-}" ]; then
      pair_ok=0
      record ceiling dense nbdflow-copy nbdflow - 0 missing "" "" "" "" "" "" "${MISSING[$m]}"
      break
    fi
  done
  [ "$ceiling_ok" = 1 ] || [ "$pair_ok" = 1 ] || return 0
  make_dense
  meta ceiling "$BENCH_SIZE dense random image ($SIZE_B bytes), both ends on tmpfs; fs.pipe-max-size $(cat /proc/sys/fs/pipe-max-size 2>/dev/null)"
  for run in $(seq 0 "$BENCH_RUNS"); do
    [ "$run" = 0 ] && [ "$BENCH_WARMUP" != 1 ] && continue
    for tr in tcp unix; do
      [ "$ceiling_ok" = 1 ] && ceiling_run "$tr" "$run" "$DENSE" "$dst"
      [ "$pair_ok" = 1 ] &&
        run_copy ceiling dense nbdflow-copy nbdflow "$tr" "$run" "$DENSE" "$dst" ""
    done
  done
  rm -f "$DENSE" "$dst"
}
