# bench/lib/link.sh: the sections matrix, rtt and tls of bench/run (issue
# 5). Sourced by bench/run after its shell functions; uses record, note_cmd, say,
# server_stop, SRV_PID/SRV_PIDS, RAW, W, NBDFLOW, LIB and the knobs below.
#
# matrix and rtt run over the link emulator (bench/linkem): the client in
# namespace LINK_NS_A, the server in LINK_NS_B, nothing else. They need
# root; without it their arms are recorded as missing.

: "${BENCH_RTTS:=0.2 2 10 50}"          # emulated round trips, ms
: "${BENCH_RATE:=1gbit}"                # emulated link rate
: "${BENCH_MATRIX_SIZE:=256M}"          # matrix image (virtual size)
: "${BENCH_MATRIX_SLOW_SIZE:=64M}"      # one-in-flight arms at slow RTTs
: "${BENCH_MATRIX_SLOW_RTT:=10}"        # from this RTT (ms) on
: "${BENCH_RTT_SIZE:=2G}"               # rtt section image
: "${BENCH_TLS_SIZE:=2G}"               # tls section image

LINK_NS_A=nbdflow-bench-a
LINK_NS_B=nbdflow-bench-b
LINK_NET=10.199.9
LINK_SRV=$LINK_NET.2
LINK_PORT=10809
LINK_UP=0
LINK_RATE_MIBS=119.2 # 1 Gbit/s in MiB/s; recomputed from BENCH_RATE

# ---- The link --------------------------------------------------------------

link_check() {
  LINK_ERR=""
  [ "$(id -u)" = 0 ] || { LINK_ERR="needs root (network namespaces)"; return 1; }
  LINKEM=$(dirname "$NBDFLOW")/bench/nbdflow-linkem
  [ -x "$LINKEM" ] || { LINK_ERR="no $LINKEM (build it)"; return 1; }
  command -v ip >/dev/null || { LINK_ERR="ip not installed (iproute2)"; return 1; }
  command -v ping >/dev/null || { LINK_ERR="ping not installed (iputils-ping)"; return 1; }
  LINK_RATE_MIBS=$(python3 - "$BENCH_RATE" <<'PY'
import re, sys
m = re.fullmatch(r"([0-9.]+)(gbit|mbit|kbit|gbps|mbps)", sys.argv[1].lower())
v, u = float(m.group(1)), m.group(2)
bits = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "gbps": 8e9, "mbps": 8e6}[u] * v
print("%.3f" % (bits / 8 / 2**20))
PY
) || { LINK_ERR="bad BENCH_RATE $BENCH_RATE"; return 1; }
  meta "link rate" "$BENCH_RATE"
  meta "link MiB/s" "$LINK_RATE_MIBS"
  return 0
}

# link_up RTT: both namespaces and the emulator at RTT ms and BENCH_RATE;
# sets LINK_RTT_MEASURED (ping average, ms).
link_up() {
  local rtt=$1
  link_down
  if ! "$HERE/linkem/netns-up.sh" --ns-a "$LINK_NS_A" --ns-b "$LINK_NS_B" \
       --net "$LINK_NET" --start "$LINKEM" --log "$RAW/logs/linkem-$rtt.log" \
       --rtt-ms "$rtt" -- --rate "$BENCH_RATE" \
       >"$RAW/logs/linkem-up-$rtt.log" 2>&1; then
    LINK_ERR="netns-up.sh failed at $rtt ms (see logs/linkem-up-$rtt.log)"
    link_down
    return 1
  fi
  LINK_UP=1
  note_cmd "link" "bench/linkem/netns-up.sh --ns-a $LINK_NS_A --ns-b $LINK_NS_B --net $LINK_NET --start nbdflow-linkem --rtt-ms RTT -- --rate $BENCH_RATE"
  LINK_RTT_MEASURED=$(ip netns exec "$LINK_NS_A" ping -q -n -c 100 -i 0.01 \
    "$LINK_SRV" 2>/dev/null | sed -n 's|^rtt.* = [0-9.]*/\([0-9.]*\)/.*|\1|p')
  meta "link rtt $rtt ms" "ping average ${LINK_RTT_MEASURED:-?} ms"
  say "link up: $rtt ms requested, ${LINK_RTT_MEASURED:-?} ms measured, $BENCH_RATE"
  return 0
}

link_down() {
  [ "$(id -u)" = 0 ] || return 0
  "$HERE/linkem/netns-down.sh" --ns-a "$LINK_NS_A" --ns-b "$LINK_NS_B" \
    >/dev/null 2>&1
  LINK_UP=0
}

# ns_server_start NAME SIZE: a memory export of SIZE in namespace B
# (nbdkit's memory plugin, or nbdflow serve memory:SIZE); sets SRV_PID,
# SRV_URI.
ns_server_start() {
  local name=$1 size=$2 i
  local -a cmd
  SRV_LOG=$RAW/logs/server-$name-link.log
  case $name in
    nbdkit) cmd=(nbdkit -f --exit-with-parent -i "$LINK_SRV" -p "$LINK_PORT"
                 memory "$size") ;;
    nbdflow) cmd=("$NBDFLOW" serve --stats --listen "$LINK_SRV:$LINK_PORT"
                  "memory:$size") ;;
  esac
  note_cmd "server $name link" "${cmd[@]}"
  ip netns exec "$LINK_NS_B" "${cmd[@]}" >>"$SRV_LOG" 2>&1 &
  SRV_PID=$!
  SRV_PIDS+=("$SRV_PID")
  SRV_URI="nbd://$LINK_SRV:$LINK_PORT/"
  for i in $(seq 100); do
    kill -0 "$SRV_PID" 2>/dev/null || { SRV_ERR="$name exited at start-up"; return 1; }
    [ -n "$(ip netns exec "$LINK_NS_B" ss -Hltn "sport = :$LINK_PORT" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  SRV_ERR="$name did not listen within 10 s"
  server_stop
  return 1
}

# ns_server_sum: xxh128 of the export, read inside namespace B (loopback
# speed, off the emulated link).
ns_server_sum() {
  ip netns exec "$LINK_NS_B" "$NBDFLOW" sum --algo xxh128 "$SRV_URI" 2>/dev/null |
    cut -d' ' -f1
}

# copy_json_extra LOG: the --json report's figures as k=v;k=v.
# copy_json_tls LOG: the TLS it names for its destination, as
# VERSION/CIPHER/AUTH (with /mixed when its connections differed).
# Both print nothing when LOG holds no report (or, for the TLS, no TLS).
copy_json_extra() { copy_json_read extra "$1"; }
copy_json_tls() { copy_json_read tls "$1"; }

# copy_json_read WHAT LOG: the last --json report in LOG, read for WHAT.
copy_json_read() {
  python3 - "$1" "$2" <<'PY'
import json, sys
rep = None
for line in open(sys.argv[2], errors="replace"):
    line = line.strip()
    if line.startswith("{") and '"bytes_total"' in line:
        rep = json.loads(line)
if rep is None:
    sys.exit(0)
if sys.argv[1] == "tls":
    t = (rep.get("tls") or {}).get("destination")
    if t:
        print("/".join([t["version"], t["cipher"], t["auth"]] +
                       ([] if t["uniform"] else ["mixed"])))
    sys.exit(0)
t = rep.get("tcp") or {}
kv = {"copied": rep.get("bytes_copied"), "depth": rep.get("peak_depth"),
      "conns": rep.get("connections", {}).get("destination"),
      "window": rep.get("window_bytes"), "path": rep.get("data_path"),
      "stall_pct": t.get("stall_pct"), "bps": t.get("bytes_per_seg"),
      "mss": t.get("mss"), "sndbuf_pct": t.get("sndbuf_limited_pct"),
      "rwnd_pct": t.get("rwnd_limited_pct"), "min_rtt_us": t.get("rtt_min_us"),
      "inflight_max": t.get("inflight_bytes_max")}
print(";".join("%s=%s" % (k, v) for k, v in kv.items() if v is not None))
PY
}

# link_copy SECTION WORKLOAD ARM SERVER RUN SRC SUM EXPSIZE CMD...: one
# timed copy over the link into a fresh memory export, verified by
# checksum read back inside namespace B. RUN 0 is a warm-up.
link_copy() {
  local sec=$1 wl=$2 arm=$3 srv=$4 run=$5 src=$6 want=$7 expsize=$8
  shift 8
  local log=$RAW/logs/$sec-$wl-$arm-$srv-$run.log tf=$W/run/time.out
  local rc t0 t1 secs status=ok note="" rss="" usr="" sys="" got extra="" bytes
  bytes=$(stat -c %s "$src")
  if ! ns_server_start "$srv" "$expsize"; then
    [ "$run" = 0 ] || record "$sec" "$wl" "$arm" "$srv" link "$run" fail "" "$bytes" "" "" "" "" "$SRV_ERR"
    return
  fi
  note_cmd "client $sec $arm" "$@"
  rm -f "$tf"
  t0=$(date +%s%N)
  ip netns exec "$LINK_NS_A" /usr/bin/time -f '%M %U %S' -o "$tf" \
    timeout -k 5 "$BENCH_TIMEOUT" "$@" >"$log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  secs=$(python3 -c "print('%.4f' % (($t1 - $t0) / 1e9))")
  [ -s "$tf" ] && read -r rss usr sys < <(tail -1 "$tf")
  if [ "$rc" != 0 ]; then
    status=fail note="exit $rc: $(tail -1 "$log" | tr '\t' ' ' | cut -c1-160)"
  else
    got=$(ns_server_sum)
    if [ "$got" != "$want" ]; then
      status=fail note="checksum mismatch (${got:-no sum} != $want)"
    fi
  fi
  server_stop
  [ "$run" = 0 ] && return
  case $1 in "$NBDFLOW") extra=$(copy_json_extra "$log") ;; esac
  extra="${extra:+$extra;}rtt_meas=${LINK_RTT_MEASURED:-}"
  record "$sec" "$wl" "$arm" "$srv" link "$run" "$status" "$secs" "$bytes" \
    "$rss" "$usr" "$sys" "$extra" "$note"
  say "$sec $wl run $run: $arm -> $srv: $status ${secs}s${note:+ ($note)}"
}

# ---- matrix: the thread's four arms ----------------------------------------
# Image: every 4 MiB, one 2 MiB data block and, 1 MiB later, one 4 KiB
# data block, holes elsewhere: a stream of 2 MiB writes with a small write
# after each, the pattern whose small writes meet Nagle and the peer's
# delayed ACK. Into fresh memory exports (they read as zeroes, like the
# pre-zeroed destination of sparse_dd), so holes need no request.

matrix_arm_opts() {
  local common=(--json --connections 1 --split-writes --destination-is-zero)
  case $1 in
    stock) MOPTS=("${common[@]}" --nagle --max-requests 1) ;;
    nodelay) MOPTS=("${common[@]}" --max-requests 1) ;;
    pipelined) MOPTS=("${common[@]}" --nagle --max-requests 8) ;;
    both) MOPTS=("${common[@]}" --max-requests 8) ;;
  esac
}

section_matrix() {
  local rtt run arm srv img want slow
  local arms="stock nodelay pipelined both" servers="nbdkit nbdflow"
  if ! link_check; then
    record matrix - - - link 0 missing "" "" "" "" "" "" "$LINK_ERR"
    return
  fi
  if ! command -v nbdkit >/dev/null; then
    MISSING_NBDKIT="nbdkit not installed"; servers="nbdflow"
    record matrix - - nbdkit link 0 missing "" "" "" "" "" "" "$MISSING_NBDKIT"
  fi
  local big=$W/matrix.img small=$W/matrix-slow.img
  python3 "$LIB/images.py" blocks "$big" "$(bytes "$BENCH_MATRIX_SIZE")" || die "matrix image failed"
  python3 "$LIB/images.py" blocks "$small" "$(bytes "$BENCH_MATRIX_SLOW_SIZE")" || die "matrix image failed"
  local want_big want_small
  want_big=$("$NBDFLOW" sum --algo xxh128 "$big" | cut -d' ' -f1)
  want_small=$("$NBDFLOW" sum --algo xxh128 "$small" | cut -d' ' -f1)
  meta matrix "image: every 4 MiB one 2 MiB and one 4 KiB random block, holes between; $BENCH_MATRIX_SIZE per arm, $BENCH_MATRIX_SLOW_SIZE for one-in-flight arms at >= $BENCH_MATRIX_SLOW_RTT ms"
  for rtt in $BENCH_RTTS; do
    if ! link_up "$rtt"; then
      record matrix "$rtt" - - link 0 fail "" "" "" "" "" "" "$LINK_ERR"
      continue
    fi
    if [ "$BENCH_WARMUP" = 1 ]; then
      matrix_arm_opts both
      link_copy matrix "$rtt" both nbdflow 0 "$big" "$want_big" \
        "$BENCH_MATRIX_SIZE" "$NBDFLOW" copy "${MOPTS[@]}" "$big" "$SRV_URI_LINK"
    fi
    for run in $(seq "$BENCH_RUNS"); do
      for srv in $servers; do
        for arm in $arms; do
          matrix_arm_opts "$arm"
          img=$big want=$want_big
          slow=$(python3 -c "print(int(float('$rtt') >= float('$BENCH_MATRIX_SLOW_RTT')))")
          case $arm in stock|nodelay)
            [ "$slow" = 1 ] && img=$small want=$want_small ;;
          esac
          link_copy matrix "$rtt" "$arm" "$srv" "$run" "$img" "$want" \
            "$(stat -c %s "$img")" "$NBDFLOW" copy "${MOPTS[@]}" "$img" \
            "nbd://$LINK_SRV:$LINK_PORT/"
        done
      done
    done
  done
  link_down
  rm -f "$big" "$small"
}
SRV_URI_LINK="nbd://$LINK_SRV:$LINK_PORT/"

# ---- rtt: the three clients over the emulated link -------------------------

section_rtt() {
  local rtt run cl img=$W/rtt.img want size
  local -a clients=(nbdflow-copy nbdcopy qemu-img) avail=()
  if ! link_check; then
    record rtt - - - link 0 missing "" "" "" "" "" "" "$LINK_ERR"
    return
  fi
  if ! command -v nbdkit >/dev/null; then
    record rtt - - nbdkit link 0 missing "" "" "" "" "" "" "nbdkit not installed"
    return
  fi
  for cl in "${clients[@]}"; do
    if [ -n "${MISSING[$cl]:-}" ]; then
      record rtt - "$cl" nbdkit link 0 missing "" "" "" "" "" "" "${MISSING[$cl]}"
    else
      avail+=("$cl")
    fi
  done
  size=$(bytes "$BENCH_RTT_SIZE")
  python3 "$LIB/images.py" random "$img" "$size" || die "rtt image failed"
  want=$("$NBDFLOW" sum --algo xxh128 "$img" | cut -d' ' -f1)
  meta rtt "$BENCH_RTT_SIZE random image into nbdkit memory over the emulated link at $BENCH_RATE ($LINK_RATE_MIBS MiB/s)"
  for rtt in $BENCH_RTTS; do
    if ! link_up "$rtt"; then
      record rtt "$rtt" - - link 0 fail "" "" "" "" "" "" "$LINK_ERR"
      continue
    fi
    for run in $(seq 0 "$BENCH_RUNS"); do
      [ "$run" = 0 ] && [ "$BENCH_WARMUP" != 1 ] && continue
      for cl in "${avail[@]}"; do
        [ "$run" = 0 ] && [ "$cl" != nbdflow-copy ] && continue
        case $cl in
          nbdflow-copy) set -- "$NBDFLOW" copy --json "$img" "$SRV_URI_LINK" ;;
          nbdcopy) set -- nbdcopy "$img" "$SRV_URI_LINK" ;;
          qemu-img) set -- qemu-img convert -n -W -f raw -O raw "$img" "$SRV_URI_LINK" ;;
        esac
        link_copy rtt "$rtt" "$cl" nbdkit "$run" "$img" "$want" "$size" "$@"
      done
    done
  done
  link_down
  rm -f "$img"
}

# ---- tls: TLS pairs on loopback --------------------------------------------

# tls_pki DIR: X.509 (CA, server, client) in DIR/pki and a PSK file
# DIR/keys.psk for user "bench", with the functions of the TLS tests.
tls_pki() {
  local dir=$1
  TLS_ERR=""
  fail() { TLS_ERR="$*"; return 1; }
  need() { command -v "$1" >/dev/null || { TLS_ERR="$1 not installed (${2:-$1})"; return 1; }; }
  . "$ROOT/tests/integration/tls-pki.inc" || return 1
  [ -z "$TLS_ERR" ] || return 1
  pki_ca "$dir/ca" "nbdflow bench CA" && pki_dir "$dir/ca" "$dir/pki" || return 1
  mkdir -p "$dir/psk" && psk_make "$dir/psk/keys.psk" bench || return 1
  unset -f fail need
  [ -s "$dir/pki/server-cert.pem" ] && [ -s "$dir/psk/keys.psk" ]
}

# proc_cpu PID: user+system CPU seconds of a live process.
proc_cpu() {
  awk -v t="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / t }' \
    "/proc/$1/stat" 2>/dev/null
}

# tls_server_start NAME AUTH FILE: NAME nbdflow|qemu-nbd|nbdkit, AUTH
# x509|psk|plain|plain-buffers (the last two: no TLS), on a free loopback
# port; sets SRV_PID, TLS_URI.
tls_server_start() {
  local name=$1 auth=$2 file=$3 port i
  local -a cmd
  local pki=$W/tls/pki psk=$W/tls/psk/keys.psk
  port=$(free_port) || { SRV_ERR="no free port"; return 1; }
  SRV_LOG=$RAW/logs/server-$name-$auth.log
  TLS_PORT=$port TLS_EXPORT=""
  case $name in
    nbd-server)
      # X.509 only (nbd-server has no PSK), and it wants a client
      # certificate signed by cacertfile. It forks into the background.
      [ "$auth" = x509 ] || { SRV_ERR="nbd-server has no TLS-PSK"; return 1; }
      local cfg=$W/run/nbd-server-tls.conf pidf=$W/run/nbd-server-tls.pid
      rm -f "$pidf"
      printf '%s\n' "[generic]" "    allowlist = false" \
        "    listenaddr = 127.0.0.1" "    port = $port" "    force_tls = true" \
        "    certfile = $pki/server-cert.pem" "    keyfile = $pki/server-key.pem" \
        "    cacertfile = $pki/ca-cert.pem" "[bench]" "    exportname = $file" \
        "    flush = true" "    fua = true" >"$cfg"
      note_cmd "nbd-server tls config" "$(sed 's/^ *//' "$cfg" | tr '\n' ' ')"
      note_cmd "server nbd-server $auth" nbd-server -C "$cfg" -p "$pidf"
      TLS_EXPORT=bench
      TLS_URI="nbds://127.0.0.1:$port/bench?tls-certificates=$pki"
      SRV_URI=$TLS_URI # server_launch's readiness handshake uses it
      SRV_DAEMON=1
      server_launch nbd-server tcp "$port" "" "$pidf" \
        nbd-server -C "$cfg" -p "$pidf"
      local rc=$?
      SRV_DAEMON=0
      return $rc ;;
  esac
  case $name in
    nbdflow)
      cmd=("$NBDFLOW" serve --listen "127.0.0.1:$port")
      case $auth in
        x509) cmd+=(--tls=require --tls-certs "$pki") ;;
        psk) cmd+=(--tls=require --tls-psk "$psk") ;;
      esac
      cmd+=("$file") ;;
    qemu-nbd)
      cmd=(qemu-nbd -f raw --cache=writeback --aio=threads --discard=unmap -t -e 8
           -b 127.0.0.1 -p "$port")
      case $auth in
        x509) cmd+=(--object "tls-creds-x509,id=tls0,endpoint=server,dir=$pki" --tls-creds tls0) ;;
        psk) cmd+=(--object "tls-creds-psk,id=tls0,endpoint=server,dir=$W/tls/psk" --tls-creds tls0) ;;
      esac
      cmd+=("$file") ;;
    nbdkit)
      cmd=(nbdkit -f --exit-with-parent -i 127.0.0.1 -p "$port")
      case $auth in
        x509) cmd+=(--tls=require "--tls-certificates=$pki") ;;
        psk) cmd+=(--tls=require "--tls-psk=$psk") ;;
      esac
      cmd+=(file "$file") ;;
  esac
  note_cmd "server $name $auth" "${cmd[@]}"
  "${cmd[@]}" >>"$SRV_LOG" 2>&1 &
  SRV_PID=$!
  SRV_PIDS+=("$SRV_PID")
  case $auth in
    x509) TLS_URI="nbds://127.0.0.1:$port/?tls-certificates=$pki" ;;
    psk) TLS_URI="nbds://bench@127.0.0.1:$port/?tls-psk-file=$psk" ;;
    plain*) TLS_URI="nbd://127.0.0.1:$port/" ;;
  esac
  for i in $(seq 100); do
    kill -0 "$SRV_PID" 2>/dev/null || { SRV_ERR="$name exited at start-up"; return 1; }
    [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  SRV_ERR="$name did not listen within 10 s"
  server_stop
  return 1
}

# tls_copy CLIENT SERVER AUTH RUN SRC DST: one timed copy, verified by
# comparing DST with SRC after the server stopped. Records client and
# server CPU seconds (extra: srv_cpu) and, for nbdflow copy, the TLS its
# --json names (extra: tls, VERSION/CIPHER/AUTH).
tls_copy() {
  local cl=$1 srv=$2 auth=$3 run=$4 src=$5 dst=$6
  local log=$RAW/logs/tls-$cl-$srv-$auth-$run.log tf=$W/run/time.out
  local rc t0 t1 secs status=ok note="" rss="" usr="" sys="" scpu size tls
  local -a cmd
  size=$(stat -c %s "$src")
  python3 "$LIB/images.py" reset "$dst" "$size" ||
    { record tls "$auth" "$cl" "$srv" tcp "$run" fail "" "$size" "" "" "" "" "destination reset failed"; return; }
  if ! tls_server_start "$srv" "$auth" "$dst"; then
    [ "$run" = 0 ] || record tls "$auth" "$cl" "$srv" tcp "$run" fail "" "$size" "" "" "" "" "$SRV_ERR"
    return
  fi
  case $cl in
    nbdflow-copy)
      # The plaintext reference is the default copy, as a user runs it
      # (the data path probe picks sendfile or buffers: the report says
      # which); plain-buffers forces the buffer path TLS always takes,
      # so that its ratio shows what encryption alone costs.
      cmd=("$NBDFLOW" copy --json "$src" "$TLS_URI")
      [ "$auth" = plain-buffers ] && cmd=("$NBDFLOW" copy --json --no-zero-copy "$src" "$TLS_URI") ;;
    nbdcopy) cmd=(nbdcopy "$src" "$TLS_URI") ;;
    qemu-img)
      local obj
      case $auth in
        x509) obj="tls-creds-x509,id=tls0,endpoint=client,dir=$W/tls/pki" ;;
        *) obj="tls-creds-psk,id=tls0,endpoint=client,dir=$W/tls/psk,username=bench" ;;
      esac
      cmd=(qemu-img convert -n -W -f raw "$src" --object "$obj"
           --target-image-opts "driver=nbd,host=127.0.0.1,port=$TLS_PORT,export=$TLS_EXPORT,tls-creds=tls0") ;;
  esac
  note_cmd "client $cl $auth" "${cmd[@]}"
  rm -f "$tf"
  t0=$(date +%s%N)
  /usr/bin/time -f '%M %U %S' -o "$tf" timeout -k 5 "$BENCH_TIMEOUT" "${cmd[@]}" >"$log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  scpu=$(proc_cpu "$SRV_PID")
  server_stop
  secs=$(python3 -c "print('%.4f' % (($t1 - $t0) / 1e9))")
  [ -s "$tf" ] && read -r rss usr sys < <(tail -1 "$tf")
  if [ "$rc" != 0 ]; then
    status=fail note="exit $rc: $(grep -v '^Command exited' "$log" | tail -1 | tr '\t' ' ' | cut -c1-160)"
  elif ! python3 "$LIB/images.py" verify "$src" "$dst" >>"$log" 2>&1; then
    status=fail note="verification failed"
  fi
  [ "$run" = 0 ] && return
  local path=""
  if [ "$cl" = nbdflow-copy ]; then
    tls=$(copy_json_tls "$log")
    path=$(copy_json_extra "$log" | tr ';' '\n' | sed -n 's/^path=//p')
  fi
  record tls "$auth" "$cl" "$srv" tcp "$run" "$status" "$secs" "$size" \
    "$rss" "$usr" "$sys" "srv_cpu=$scpu${tls:+;tls=$tls}${path:+;path=$path}" "$note"
  say "tls $auth run $run: $cl -> $srv: $status ${secs}s${note:+ ($note)}"
}

section_tls() {
  local src=$W/tls.img dst=$W/tls-dst.img run pair auth
  local -a pairs=("nbdflow-copy nbdflow" "nbdcopy qemu-nbd" "nbdcopy nbdkit"
                  "nbdcopy nbdflow" "nbdflow-copy nbdkit" "nbdflow-copy qemu-nbd"
                  "qemu-img nbdflow" "qemu-img qemu-nbd" "qemu-img nbdkit"
                  "nbdflow-copy nbd-server" "nbdcopy nbd-server"
                  "qemu-img nbd-server")
  local -a avail=()
  mkdir -p "$W/tls"
  if ! tls_pki "$W/tls"; then
    record tls - - - tcp 0 missing "" "" "" "" "" "" "TLS credentials: ${TLS_ERR:-certtool/psktool failed}"
    return
  fi
  for pair in "${pairs[@]}"; do
    set -- $pair
    if [ -n "${MISSING[$1]:-}" ] || [ -n "${MISSING[$2]:-}" ]; then
      record tls - "$1" "$2" tcp 0 missing "" "" "" "" "" "" "${MISSING[$1]:-${MISSING[$2]}}"
    else
      avail+=("$pair")
    fi
  done
  python3 "$LIB/images.py" random "$src" "$(bytes "$BENCH_TLS_SIZE")" || die "tls image failed"
  meta tls "$BENCH_TLS_SIZE random image, TCP loopback, file exports on tmpfs; X.509 and PSK (nbd-server: X.509 only, with a client certificate, which it requires; it forks per connection, so its server CPU misses the children it has not reaped); plus nbdflow's plaintext pair, as a user runs it and on the buffer path"
  [ "$BENCH_WARMUP" = 1 ] && tls_copy nbdflow-copy nbdflow psk 0 "$src" "$dst"
  for run in $(seq "$BENCH_RUNS"); do
    tls_copy nbdflow-copy nbdflow plain "$run" "$src" "$dst"
    tls_copy nbdflow-copy nbdflow plain-buffers "$run" "$src" "$dst"
    for auth in psk x509; do
      for pair in "${avail[@]}"; do
        set -- $pair
        [ "$2" = nbd-server ] && [ "$auth" = psk ] && continue # no PSK there
        tls_copy "$1" "$2" "$auth" "$run" "$src" "$dst"
      done
    done
  done
  rm -rf "$src" "$dst" "$W/tls"
}
