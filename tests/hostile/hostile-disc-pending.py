#!/usr/bin/env python3
"""DISC while 32 MiB of READ replies (16, below --max-inflight, so that
reading is not paused) wait unread, then the client closes
its sending side: the server must not spin on the client's EOF (its CPU
stays near idle while the client does not read), every reply still
arrives whole once the client reads, and then the server closes. A second
client does the same and then resets instead: the server drops it and
goes on serving. A third client sends no DISC, only its EOF after the
READs: as after DISC, every reply arrives whole, then the server
closes."""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

REQ = 2 << 20  # one request's size
DEPTH = 16


def cpu_ticks(pid):
    """utime + stime of the whole process, in clock ticks."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def fill(c):
    """Writes a pattern to the first DEPTH requests' worth; returns it."""
    data = os.urandom(DEPTH * REQ)
    for i in range(DEPTH):
        err, _ = c.do(CMD_WRITE, i * REQ, REQ,
                      payload=data[i * REQ:(i + 1) * REQ])
        if err:
            raise Failure("WRITE %d failed: %s" % (i, errname(err)))
    return data


def backlog(c, disc=True):
    """DEPTH READs, replies unread; once they are answered (and wait in
    the server for room in the socket), a DISC (unless not disc), and the
    sending side is shut."""
    c.send(b"".join(request_bytes(CMD_READ, i * REQ, REQ, cookie=i + 1)
                    for i in range(DEPTH)))
    time.sleep(0.5)
    if disc:
        c.send(request_bytes(CMD_DISC))
    c.sock.shutdown(socket.SHUT_WR)


def drain(c, data, after):
    """Reads the DEPTH replies, checks them against data, and that the
    server closes then."""
    seen = set()
    for _ in range(DEPTH):
        err, got = c.reply(None, REQ)
        i = c.reply_cookie - 1
        if err or not 0 <= i < DEPTH or i in seen:
            raise Failure("READ reply for cookie %d: error %s, or not one "
                          "of ours, or twice" % (i + 1, errname(err)))
        seen.add(i)
        if got != data[i * REQ:(i + 1) * REQ]:
            raise Failure("READ %d after %s returned other bytes" %
                          (i, after))
    expect(len(seen) == DEPTH, "all %d replies after %s, whole" %
           (DEPTH, after))
    expect(c.wait_closed(10), "server closes once the replies are out "
           "(after %s)" % after)
    c.close()


def main(server):
    if server.peer:
        print("SKIP: checks our own server's loop")
        sys.exit(77)
    c = Conn(server)
    c.open_export(structured=False)
    data = fill(c)
    backlog(c)
    time.sleep(0.5)  # the replies that fit are out; the rest wait
    tick = os.sysconf("SC_CLK_TCK")
    t0 = cpu_ticks(server.proc.pid)
    time.sleep(1.0)
    used = cpu_ticks(server.proc.pid) - t0
    # A loop spinning on the EOF burns a whole core: ~tick per second.
    expect(used < tick // 4, "server idle while the client reads nothing "
           "(%d of %d ticks in 1 s)" % (used, tick))
    drain(c, data, "DISC")

    # The same backlog, then a reset (SO_LINGER 0): the server must drop
    # the connection, not spin on the error, and go on serving.
    r = Conn(server)
    r.open_export(structured=False)
    backlog(r)
    time.sleep(0.5)
    r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                      struct.pack("ii", 1, 0))
    r.close()
    time.sleep(0.5)
    t0 = cpu_ticks(server.proc.pid)
    time.sleep(1.0)
    used = cpu_ticks(server.proc.pid) - t0
    expect(used < tick // 4, "server idle after the reset (%d of %d ticks "
           "in 1 s)" % (used, tick))
    still_serving(server, what="a reset with replies pending after DISC")

    # No DISC: the client's EOF after its last request ends the
    # connection the same way, its replies first.
    e = Conn(server)
    e.open_export(structured=False)
    data = fill(e)  # still_serving wrote some
    backlog(e, disc=False)
    drain(e, data, "the client's EOF")


run(main, exports=("memory:%dM" % (DEPTH * REQ >> 20),))
