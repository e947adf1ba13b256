#!/bin/bash
# copy-pipe.sh: '-' copies sequentially from stdin and to stdout, null:
# discards, and generated sources are reproducible.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need nbdkit
tmpdir_make
make_sparse "$TMP/src.img" 20 "0:3 10:1 19:1"
nbdkit -f -U "$TMP/m.sock" memory 20M >>"$TMP/kit.log" 2>&1 &
SERVER_PIDS+=($!)
wait_for test -S "$TMP/m.sock"
uri="nbd+unix:///?socket=$TMP/m.sock"

check "stdin -> nbd" "$NBDFLOW" copy --request-size 1M - "$uri" <"$TMP/src.img"
"$NBDFLOW" copy "$uri" - >"$TMP/out.img" || fail "nbd -> stdout failed"
same "$TMP/src.img" "$TMP/out.img"
cat "$TMP/src.img" | "$NBDFLOW" copy - "$TMP/file.img" ||
    fail "stdin -> file failed"
same "$TMP/src.img" "$TMP/file.img"
"$NBDFLOW" copy --json "$uri" null: >"$TMP/r.json" || fail "-> null: failed"
grep -q '"bytes_total": 20971520' "$TMP/r.json" || fail "null: report wrong"

# Standard input longer than the destination: the copy fills the export
# and then fails, naming the destination, instead of dropping the rest.
head -c 21M /dev/urandom >"$TMP/long.img"
rc=0
"$NBDFLOW" copy - "$uri" <"$TMP/long.img" 2>"$TMP/err" || rc=$?
[ "$rc" -ne 0 ] || fail "stdin longer than the export: exited 0"
grep -q "standard input is longer than .*20971520 bytes" "$TMP/err" ||
    fail "stdin longer than the export: $(cat "$TMP/err")"
cmp -n 20971520 "$TMP/long.img" <("$NBDFLOW" copy "$uri" -) ||
    fail "stdin longer than the export: the first 20 MiB did not land"
note "ok: stdin longer than the export fails: $(cat "$TMP/err")"

# Standard input into a new file, which grows with the copy: zero pieces
# between data pieces (a zero piece once cut off data another worker had
# just written past it), and zeroes at the end (once left out of the
# size). Small requests make many pieces race.
python3 - "$TMP/alt.img" <<'PY'
import os, sys
with open(sys.argv[1], "wb") as f:
    for _ in range(64):
        f.write(bytes(64 << 10))
        f.write(os.urandom(64 << 10))
    f.write(b"abc" + bytes(10000))
PY
for rs in 4K 64K 512K; do
    rm -f "$TMP/grow.img"
    "$NBDFLOW" copy --request-size "$rs" - "$TMP/grow.img" <"$TMP/alt.img" ||
        fail "stdin -> new file, requests of $rs"
    same "$TMP/alt.img" "$TMP/grow.img"
done
# --destination-is-zero cannot skip what a stream or a growing file needs.
"$NBDFLOW" copy --destination-is-zero "$TMP/src.img" - >"$TMP/dz.img" ||
    fail "--destination-is-zero to stdout"
same "$TMP/src.img" "$TMP/dz.img"
rm -f "$TMP/dz2.img"
"$NBDFLOW" copy --destination-is-zero - "$TMP/dz2.img" <"$TMP/src.img" ||
    fail "--destination-is-zero from stdin"
same "$TMP/src.img" "$TMP/dz2.img"

check "random source -> nbd" "$NBDFLOW" copy random:20M:7 "$uri"
[ "$("$NBDFLOW" sum "$uri")" != "" ] || fail "sum failed"
[ "$("$NBDFLOW" sum random:20M:7 | cut -d' ' -f1)" = \
  "$("$NBDFLOW" sum "$uri" | cut -d' ' -f1)" ] ||
    fail "random generator copy differs"
"$NBDFLOW" copy pattern:1M - >"$TMP/pat" || fail "pattern -> stdout failed"
od -An -tx1 -j 8 -N 8 "$TMP/pat" | tr -d ' \n' | grep -qx 0000000000000008 ||
    fail "pattern word 1 is not its offset"
# Pipes another process left non-blocking (O_NONBLOCK belongs to the
# shared open file): a full stdout or an empty stdin is waited for, not
# an EAGAIN that fails the copy after the first 64 KiB.
check "copy through non-blocking pipes" python3 - "$NBDFLOW" "$TMP/src.img" \
    "$TMP/nb.img" <<'PY'
import fcntl, hashlib, os, subprocess, sys, time
nbdflow, src, dst = sys.argv[1:4]
data = open(src, "rb").read()
r, w = os.pipe()
fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
p = subprocess.Popen([nbdflow, "copy", src, "-"], stdout=w)
os.close(w)
time.sleep(0.3)  # let the pipe fill first
out = b""
while True:
    b = os.read(r, 1 << 20)
    if not b:
        break
    out += b
if p.wait() != 0 or out != data:
    sys.exit("stdout: exit %d, %d of %d bytes" % (p.returncode, len(out), len(data)))
r, w = os.pipe()
fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_NONBLOCK)
p = subprocess.Popen([nbdflow, "copy", "-", dst], stdin=r)
os.close(r)
for i in range(0, len(data), 1 << 16):
    os.write(w, data[i:i + (1 << 16)])
    time.sleep(0.001)
os.close(w)
if p.wait() != 0:
    sys.exit("stdin: exit %d" % p.returncode)
PY
same "$TMP/src.img" "$TMP/nb.img"

# An image stream whose reader goes away: one line, its errno once.
for f in vhd qcow2; do
    { "$NBDFLOW" copy --dst-format $f pattern:4M - 2>"$TMP/err.$f" ||
        echo $? >"$TMP/rc.$f"; } | head -c 100 >/dev/null
    [ -s "$TMP/rc.$f" ] || fail "$f into a closed pipe exited 0"
    [ "$(wc -l <"$TMP/err.$f")" = 1 ] || fail "$f: $(cat "$TMP/err.$f")"
    [ "$(grep -o 'Broken pipe' "$TMP/err.$f" | wc -l)" = 1 ] ||
        fail "$f: the errno not once: $(cat "$TMP/err.$f")"
    note "ok: $f into a closed pipe: $(cat "$TMP/err.$f")"
done
note "ok: pipes, null: and generators"
echo "PASS"
