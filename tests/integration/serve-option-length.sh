#!/bin/bash
# serve-option-length.sh: an option whose header announces far more data
# than any option needs (4 GiB - 1, 2 GiB, 2 MiB: past the 1 MiB the
# server reads at most) is answered at once, with NBD_REP_ERR_TOO_BIG and
# a close (EXPORT_NAME, which has no error reply, with the close alone),
# as nbdkit does, instead of being read to its end while the client waits
# for the handshake timeout (30 s here). A length under the bound (70000
# bytes, sent) is still read, answered, and haggling goes on. Meanwhile a
# client in transmission is served, and afterwards a fresh one.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need python3
need psktool
tmpdir_make
serve_tcp --handshake-timeout 30 memory:1M
PYTHONPATH=$(dirname "$0") python3 - 127.0.0.1 "$PORT" <<'PY' || fail "the raw client's checks failed (above)"
import socket, struct, sys, time
from unixserve import recv_exact  # beside this test
HOST, PORT = sys.argv[1], int(sys.argv[2])
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3e889045565a9
ERR_TOO_BIG, ERR_UNSUP, ACK = 0x80000009, 0x80000001, 1
OPT_EXPORT_NAME, OPT_LIST, OPT_GO, OPT_SET_META = 1, 3, 7, 10

def fail(msg):
    print("FAIL: %s" % msg)
    sys.exit(1)

def hello():
    s = socket.create_connection((HOST, PORT), timeout=20)
    recv_exact(s, 18)
    s.sendall(struct.pack(">I", 1 | 2))  # FIXED_NEWSTYLE | NO_ZEROES
    return s

def reply(s):
    magic, opt, typ, ln = struct.unpack(">QIII", recv_exact(s, 20))
    if magic != REPLY_MAGIC:
        fail("bad option reply magic")
    return opt, typ, recv_exact(s, ln)

def closed_by_server(s):
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True

# A client in transmission all along: GO, then a READ after the rest.
by = hello()
name = b""
by.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, 6) +
           struct.pack(">IH", 0, 0))
while reply(by)[1] != ACK:
    pass

for opt in (OPT_GO, OPT_LIST, OPT_SET_META, 0xDEAD):
    for length in (0xFFFFFFFF, 0x80000000, 2 << 20):
        s = hello()
        t0 = time.monotonic()
        s.sendall(struct.pack(">QII", IHAVEOPT, opt, length))
        o, typ, msg = reply(s)
        took = time.monotonic() - t0
        if o != opt or typ != ERR_TOO_BIG:
            fail("option %d announcing %d bytes: reply 0x%x" % (opt, length, typ))
        if not closed_by_server(s):
            fail("option %d announcing %d bytes: still open after the reply"
                 % (opt, length))
        took = time.monotonic() - t0
        if took > 3:
            fail("option %d announcing %d bytes: answered after %.1f s"
                 % (opt, length, took))
        print("ok: option %d announcing %d bytes: ERR_TOO_BIG (%s) and a "
              "close within %.2f s" % (opt, length, msg.decode(), took))
        s.close()

# ABORT's ACK is a MUST whatever data it announces (§NBD_OPT_ABORT: the
# server "SHOULD ignore any data"), even past what the server reads.
s = hello()
s.sendall(struct.pack(">QII", IHAVEOPT, 2, 2 << 20))
o, typ, _ = reply(s)
if o != 2 or typ != ACK:
    fail("ABORT announcing 2 MiB: reply 0x%x, not ACK" % typ)
if not closed_by_server(s):
    fail("ABORT announcing 2 MiB: still open after the ACK")
print("ok: ABORT announcing 2 MiB: ACK and a close")
s.close()

# EXPORT_NAME cannot be refused with a reply: closed at once.
s = hello()
t0 = time.monotonic()
s.sendall(struct.pack(">QII", IHAVEOPT, OPT_EXPORT_NAME, 0xFFFFFFFF))
if not closed_by_server(s) or time.monotonic() - t0 > 3:
    fail("EXPORT_NAME announcing 4 GiB: not closed at once")
print("ok: EXPORT_NAME announcing 4 GiB: closed within %.2f s"
      % (time.monotonic() - t0))

# Sending data with the header, as a real client would: the reply, or a
# reset, within the same bound.
s = hello()
t0 = time.monotonic()
try:
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, 0xFFFFFFFF) +
              bytes(256 << 10))
    reply(s)
except (EOFError, ConnectionResetError, BrokenPipeError):
    pass
if time.monotonic() - t0 > 3:
    fail("GO announcing 4 GiB with data behind: not answered within 3 s")
print("ok: GO announcing 4 GiB with 256 KiB behind it: ended within %.2f s"
      % (time.monotonic() - t0))
s.close()

# Under the bound: read, answered, and haggling goes on.
s = hello()
s.sendall(struct.pack(">QII", IHAVEOPT, 0xDEAD, 70000) + bytes(70000))
o, typ, _ = reply(s)
if typ != ERR_UNSUP:
    fail("unknown option with 70000 bytes: reply 0x%x" % typ)
s.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, 6) + struct.pack(">IH", 0, 0))
while True:
    o, typ, _ = reply(s)
    if typ == ACK:
        break
    if typ & 0x80000000:
        fail("GO after an option of 70000 bytes refused: 0x%x" % typ)
print("ok: 70000 bytes of an unknown option: ERR_UNSUP, then GO works")
s.close()

# The bystander still reads.
by.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, 7, 0, 4096))
magic, err, cookie = struct.unpack(">IIQ", recv_exact(by, 16))
if magic != 0x67446698 or err != 0 or cookie != 7:
    fail("bystander's READ: error %d" % err)
recv_exact(by, 4096)
print("ok: the client in transmission is served throughout")
PY
grep -q "option data of 4294967295 bytes is beyond the 1048576 bytes any option may have" \
    "$SERVER_LOG" || fail "the refusal is not logged"
check "a fresh client is served" "$NBDFLOW" info "$URI" >/dev/null
serve_stop

# With TLS required, any option but STARTTLS and ABORT in clear gets
# NBD_REP_ERR_TLS_REQD (§FORCEDTLS mode: a MUST), whatever its length:
# past the bound too, where the close follows as before.
. "$(dirname "$0")/tls-pki.inc"
psk_make "$TMP/keys.psk" alice
serve_tcp --tls=require --tls-psk "$TMP/keys.psk" memory:1M
PYTHONPATH=$(dirname "$0") python3 - 127.0.0.1 "$PORT" <<'PY' || fail "the raw client's TLS checks failed (above)"
import socket, struct, sys
from unixserve import recv_exact  # beside this test
HOST, PORT = sys.argv[1], int(sys.argv[2])
IHAVEOPT, REPLY_MAGIC = 0x49484156454F5054, 0x3e889045565a9
ERR_TLS_REQD, ACK = 0x80000005, 1

for opt, length, want in ((7, 2 << 20, ERR_TLS_REQD), (0xDEAD, 2 << 20, ERR_TLS_REQD),
                          (7, 70000, ERR_TLS_REQD), (2, 2 << 20, ACK)):
    s = socket.create_connection((HOST, PORT), timeout=20)
    recv_exact(s, 18)
    s.sendall(struct.pack(">I", 1 | 2) + struct.pack(">QII", IHAVEOPT, opt, length))
    if length <= 70000:
        s.sendall(bytes(length))
    magic, o, typ, ln = struct.unpack(">QIII", recv_exact(s, 20))
    recv_exact(s, ln)
    if magic != REPLY_MAGIC or o != opt or typ != want:
        print("FAIL: option %d announcing %d bytes in clear: reply 0x%x, "
              "not 0x%x" % (opt, length, typ, want))
        sys.exit(1)
    print("ok: option %d announcing %d bytes in clear: 0x%x" % (opt, length, typ))
    s.close()
PY
serve_stop
echo "PASS"
