#!/usr/bin/env python3
"""WRITE payloads into a file export travel socket -> pipes -> file
(splice). A client that sends a 2 MiB payload 1 KiB at a time fills one
pipe slot per small segment, far more slots than the payload's size
says: the server must open further pipes and, past its limit, take the
payload back into a buffer and finish it by copying, keeping every byte
in order. Payloads of mixed sizes on one connection (600 KiB, then
2 MiB) must splice too. Every write is read back and compared; the
server's debug log must show the fallback happened."""
import os
import random
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

MIB = 1 << 20


def write_and_check(c, offset, data, piece=None, what=""):
    cookie = random.getrandbits(64)
    c.send(request_bytes(CMD_WRITE, offset, len(data), 0, cookie))
    if piece is None:
        c.send(data)
    else:
        for i in range(0, len(data), piece):
            c.send(data[i:i + piece])
            if (i // piece) % 16 == 15:
                time.sleep(0.001)  # let the server drain what came so far
    err, _ = c.reply(cookie)
    expect_err(err, 0, "WRITE %s" % what)
    err, back = c.do(CMD_READ, offset, len(data))
    expect_err(err, 0, "READ back %s" % what)
    expect(back == data, "%s reads back byte for byte" % what)


def main(server):
    if server.peer:
        log("SKIP: checks our server's debug log")
        sys.exit(77)
    c = Conn(server)
    c.open_export()
    write_and_check(c, 0, os.urandom(600 << 10), what="600 KiB at once")
    write_and_check(c, MIB, os.urandom(2 * MIB), what="2 MiB at once")
    # Each piece its own segment. On a busy machine the kernel may still
    # merge pieces that wait in the socket into fewer pipe slots (it did
    # in 5 tries of one full run, with a pause every 64 pieces), so the
    # trickle pauses every 16 and is tried up to 8 times, each write
    # checked, until one overflows the pipes.
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fell_back = []
    for attempt in range(1, 9):
        write_and_check(c, 4 * MIB, os.urandom(2 * MIB), piece=1024,
                        what="2 MiB in 1 KiB pieces (try %d)" % attempt)
        fell_back = [l for l in server.log_text().splitlines()
                     if "payload pipe full" in l]
        if fell_back:
            break
    c.request(CMD_DISC)
    c.close()
    expect(len(fell_back) > 0, "the trickled payload overflowed the pipes "
           "and fell back to a copy (%s)"
           % (fell_back[0].strip() if fell_back else "no such log line"))
    still_serving(server, what="trickled payloads")


tmp = tempfile.mkdtemp(prefix="nbdflow-trickle.")
image = os.path.join(tmp, "disk.img")
with open(image, "wb") as f:
    f.truncate(8 * MIB)
try:
    run(main, exports=(image,), extra=("-v",))
finally:
    os.unlink(image)
    os.rmdir(tmp)
