#!/usr/bin/env bash
# The demo: generate an image with data and holes, serve it with
# `nbdflow serve`, copy it through the server, verify the copy and print
# what happened. Usage: scripts/demo.sh [path/to/nbdflow]
set -euo pipefail

NBDFLOW=${1:-build/nbdflow}
SIZE_MIB=${DEMO_SIZE_MIB:-512}
work=$(mktemp -d "${TMPDIR:-/tmp}/nbdflow-demo.XXXXXX")
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '%s\n' "$*"; }

# An image of SIZE_MIB MiB: random data in every other 16 MiB stripe of
# the first half, holes elsewhere.
src=$work/source.img
truncate -s "${SIZE_MIB}M" "$src"
for ((mib = 0; mib < SIZE_MIB / 2; mib += 32)); do
  dd if=/dev/urandom of="$src" bs=1M count=16 seek=$mib conv=notrunc status=none
done
say "== source: $SIZE_MIB MiB image, $(du -m "$src" | cut -f1) MiB allocated"

sock=$work/nbd.sock
"$NBDFLOW" serve --unix "$sock" --read-only --pidfile "$work/pid" \
  demo="$src" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 100); do [ -f "$work/pid" ] && break; sleep 0.05; done
[ -f "$work/pid" ] || { cat "$work/server.log"; say "server did not start"; exit 1; }
uri="nbd+unix:///demo?socket=$sock"
say "== serving it: $NBDFLOW serve --unix $sock --read-only demo=$src"

dst=$work/copy.img
if "$NBDFLOW" copy --help >/dev/null 2>&1; then
  say "== copying with: nbdflow copy --verify --json $uri $dst"
  "$NBDFLOW" copy --verify --json "$uri" "$dst" >"$work/report.json"
  python3 - "$work/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
mib = lambda n: n / 1048576
print(f"report: {mib(r['bytes_total']):.0f} MiB image: "
      f"{mib(r['bytes_copied']):.0f} MiB of data copied, "
      f"{mib(r['bytes_zeroed']):.0f} MiB zeroed, "
      f"{mib(r['bytes_skipped']):.0f} MiB of holes skipped")
print(f"report: {r['seconds']:.2f} s, {r['mib_per_s']:.0f} MiB/s, "
      f"{r['requests']} requests, {r['connections']['source']} source "
      f"connection(s), up to {r['peak_depth']} requests in flight, "
      f"verified by read-back: {'yes' if r['verified'] else 'no'}")
print("report (JSON): " + json.dumps(r))
PY
  say "== checksum of the export, read over NBD: nbdflow sum --algo sha256"
  "$NBDFLOW" sum --algo sha256 "$uri"
else
  say "== nbdflow copy is not built yet; copying with nbdcopy"
  start=$(date +%s.%N)
  nbdcopy "$uri" "$dst"
  end=$(date +%s.%N)
  python3 -c "import sys; s=float(sys.argv[2])-float(sys.argv[1]); \
print(f'copied {int(sys.argv[3])} MiB in {s:.2f} s ({int(sys.argv[3])/s:.0f} MiB/s)')" \
    "$start" "$end" "$SIZE_MIB"
fi

src_sum=$(sha256sum <"$src" | cut -d' ' -f1)
dst_sum=$(sha256sum <"$dst" | cut -d' ' -f1)
say "== verify"
say "source sha256 $src_sum"
say "copy   sha256 $dst_sum"
say "copy allocated: $(du -m "$dst" | cut -f1) MiB of $SIZE_MIB MiB"
if [ "$src_sum" != "$dst_sum" ]; then
  say "FAILED: the copy differs from the source"
  exit 1
fi
say "OK: the copy is identical to the source"
