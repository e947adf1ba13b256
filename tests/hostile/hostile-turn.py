#!/usr/bin/env python3
"""A loop reads one connection for a turn of at most 4 MiB (a message
counts 4 KiB), then comes back for the rest behind its other work. Over
TLS the rest may sit decrypted, or as records, inside the transport where
epoll cannot see it; with splice it stays in the socket while a payload
is half in pipes. Whatever a client sent in one go, then silence, must
all be answered. With one event loop:

1. TLS: 1170 zero-length WRITEs in one send (more than a turn), then
   nothing: every one answered within SERVED_WITHIN seconds.
2. TLS: 24 WRITEs of 512 KiB of random data in one send (12 MiB, three
   turns and more), then nothing: all answered, and read back equal.
3. Plain TCP into a file export: 12 WRITEs of 2 MiB in one send (24 MiB),
   payloads of the size the server splices socket -> pipes -> file
   (serve-splice.sh traces that): all answered, and the file equal."""
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

SERVED_WITHIN = 5  # seconds: a liveness bound, not a speed figure
MIB = 1 << 20


def answer_all(c, cookies, what, timeout):
    """Reads one simple reply per cookie, in any order, all within timeout
    seconds; each must be 0."""
    deadline = time.monotonic() + timeout
    left = set(cookies)
    while left:
        c.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            err, _ = c.reply()
        except Failure as e:
            raise Failure("%s: %d of %d answered, then: %s"
                          % (what, len(cookies) - len(left), len(cookies), e))
        if c.reply_cookie not in left:
            raise Failure("%s: reply for an unknown or repeated cookie %d"
                          % (what, c.reply_cookie))
        if err != 0:
            raise Failure("%s: cookie %d failed with %s"
                          % (what, c.reply_cookie, errname(err)))
        left.discard(c.reply_cookie)


def tls_burst(server, ca):
    count = 1170  # 32,760 bytes of requests: 4.6 MiB of turn
    c = Conn(server)
    c.open_export(b"mem", structured=False, tls_ca=ca)
    c.send(b"".join(request_bytes(CMD_WRITE, 0, 0, cookie=i + 1)
                    for i in range(count)))
    answer_all(c, range(1, count + 1), "TLS burst", SERVED_WITHIN)
    c.request(CMD_DISC)
    c.close()
    log("ok: over TLS, a burst of %d requests, more than one turn, "
        "answered whole" % count)


def payload_burst(server, name, tls_ca, count, size, check):
    c = Conn(server)
    c.open_export(name, structured=False, tls_ca=tls_ca)
    data = os.urandom(count * size)
    c.send(b"".join(request_bytes(CMD_WRITE, i * size, size, cookie=i + 1)
                    + data[i * size:(i + 1) * size] for i in range(count)))
    what = "%s WRITE burst" % ("TLS" if tls_ca else "plain")
    answer_all(c, range(1, count + 1), what, 60)
    expect_err(c.do(CMD_FLUSH)[0], 0, "FLUSH after the burst")
    check(c, data)
    c.request(CMD_DISC)
    c.close()
    log("ok: %s: %d x %d KiB in one send, all answered and stored"
        % (what, count, size >> 10))


def read_back(c, data):
    for off in range(0, len(data), 4 * MIB):
        n = min(4 * MIB, len(data) - off)
        err, got = c.do(CMD_READ, off, n)
        expect_err(err, 0, "READ back at %d" % off)
        expect(got == data[off:off + n], "READ back at %d equal" % off)


def main_with(disk):
    def main(server):
        if server.peer:
            print("SKIP: checks our own server's turns")
            sys.exit(77)
        ca = os.path.join(PKI, "ca-cert.pem")
        tls_burst(server, ca)
        payload_burst(server, b"mem", ca, 24, 512 << 10, read_back)

        def file_equal(c, data):
            with open(disk, "rb") as f:
                expect(f.read(len(data)) == data,
                       "the file export holds what was written")
        payload_burst(server, b"disk", None, 12, 2 * MIB, file_equal)
        expect(server.alive(), "server still running")
    return main


tmp = tempfile.mkdtemp(prefix="nbdflow-turn.")
try:
    PKI = make_pki(tmp)
    disk = os.path.join(tmp, "disk.img")
    with open(disk, "wb") as f:
        f.truncate(32 * MIB)
    run(main_with(disk), exports=("mem=memory:16M", "disk=" + disk),
        extra=("--loops", "1", "--tls=on", "--tls-certs", PKI))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
