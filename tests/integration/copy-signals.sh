#!/bin/bash
# After a SIGINT or SIGTERM, copy and sum clean up, say how far they got,
# and then die by that signal (not an exit status that only looks like
# it): a shell running copies in a loop stops at a Ctrl-C, as it does for
# nbdcopy. A SIGINT while the final FLUSH is unanswered says what is true:
# every byte was written, the flush was not confirmed.
. "$(dirname "$0")/lib.sh"
need nbdkit
tmpdir_make

# Every read takes 30 s: the copy is stuck when the signal comes.
kit "$TMP/slow.sock" --filter=log --filter=delay pattern 64M delay-read=30 \
    logfile="$TMP/reads.log"
src=$(uri "$TMP/slow.sock")
reads_out () { grep -q " Read id=" "$TMP/reads.log" 2>/dev/null; }

# A process group of its own with SIGINT at its default, as a terminal
# gives a foreground job; the signal goes to the whole group, as Ctrl-C
# sends it. Prints the command's stdout, then "status N" for a normal
# exit or "signal NAME" for a death by a signal. READY is a shell
# condition that says the signal may come.
signalled () {
    local sig=$1 ready=$2; shift 2
    python3 - "$sig" "$ready" "$@" <<'PY'
import os, signal, subprocess, sys, time
sig = getattr(signal, "SIG" + sys.argv[1])
def default():
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
p = subprocess.Popen(sys.argv[3:], start_new_session=True, preexec_fn=default,
                     stdout=subprocess.PIPE)
for _ in range(200):
    if subprocess.call(["bash", "-c", sys.argv[2]]) == 0:
        break
    time.sleep(0.1)
else:
    sys.exit("never ready: " + sys.argv[2])
time.sleep(0.3)
os.killpg(p.pid, sig)
try:
    out, _ = p.communicate(timeout=15)
except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    sys.exit("still running 15 s after the signal")
sys.stdout.write(out.decode())
rc = p.returncode
print("signal " + signal.Signals(-rc).name if rc < 0 else "status %d" % rc)
PY
}

# expect WHAT WANT_LAST_LINE: the output of the last `signalled`, in
# $TMP/res, ends with WANT_LAST_LINE.
expect () {
    [ "$(tail -n 1 "$TMP/res")" = "$2" ] ||
        fail "$1: $(cat "$TMP/res"); stderr: $(cat "$TMP/err")"
    note "ok: $1: $2; $(tail -n 1 "$TMP/err")"
}

export NBDFLOW
signalled INT "grep -q ' Read id=' '$TMP/reads.log'" \
    "$NBDFLOW" copy "$src" "$TMP/out.img" >"$TMP/res" 2>"$TMP/err" ||
    fail "$(cat "$TMP/res")"
expect "copy from a stuck server, SIGINT" "signal SIGINT"
grep -qF "interrupted by SIGINT after 0 of $((64 << 20)) bytes: the destination is incomplete" \
    "$TMP/err" || fail "copy after SIGINT: $(cat "$TMP/err")"
[ "$(grep -c . "$TMP/err")" = 1 ] || fail "not one line: $(cat "$TMP/err")"

: >"$TMP/reads.log"
signalled TERM "grep -q ' Read id=' '$TMP/reads.log'" \
    "$NBDFLOW" sum "$src" >"$TMP/res" 2>"$TMP/err" || fail "$(cat "$TMP/res")"
expect "sum of a stuck server, SIGTERM" "signal SIGTERM"
grep -qF "interrupted by SIGTERM after 0 of" "$TMP/err" ||
    fail "sum after SIGTERM: $(cat "$TMP/err")"

# A shell loop of three copies: Ctrl-C in the first ends the loop (the
# shell itself dies by SIGINT), where an exit status of 130 would let it
# go on to the next copy.
: >"$TMP/reads.log"
signalled INT "grep -q ' Read id=' '$TMP/reads.log'" bash -c '
    for i in 1 2 3; do "$NBDFLOW" copy "$1" null:; echo "after copy $i"; done' \
    loop "$src" >"$TMP/res" 2>"$TMP/err" || fail "$(cat "$TMP/res")"
grep -q "after copy" "$TMP/res" &&
    fail "the loop went on after a Ctrl-C: $(cat "$TMP/res")"
expect "a shell loop of copies, SIGINT" "signal SIGINT"

# The final flush never answered: nbdkit's eval plugin, whose flush
# sleeps; the log filter shows when the flush has gone out.
kit "$TMP/flush.sock" --filter=log eval logfile="$TMP/flush.log" \
    get_size='echo 1048576' can_write='exit 0' can_flush='exit 0' \
    pwrite='cat >/dev/null' flush='exec sleep 60' \
    pread='head -c "$3" /dev/zero'
make_random "$TMP/one.img" 1
signalled INT "grep -q ' Flush id=' '$TMP/flush.log'" \
    "$NBDFLOW" copy "$TMP/one.img" "$(uri "$TMP/flush.sock")" \
    >"$TMP/res" 2>"$TMP/err" || fail "$(cat "$TMP/res")"
expect "SIGINT during the final flush" "signal SIGINT"
grep -qF "interrupted by SIGINT during the final flush of $(uri "$TMP/flush.sock"): all 1048576 bytes were written, but the flush was not confirmed" \
    "$TMP/err" || fail "SIGINT during the flush: $(cat "$TMP/err")"
grep -q "incomplete" "$TMP/err" && fail "said incomplete: $(cat "$TMP/err")"
echo "PASS"
