#!/usr/bin/env python3
"""A client that sends requests faster than the server can answer them
must not take its event loop from the other clients on it, and a loop
that moves on must come back for what it left. With one event loop:

1. A burst of 1170 zero-length WRITEs in one send, then silence: they
   fill the server's 16 KiB input buffer twice, and the connection's turn
   (4 MiB, a request counting 4 KiB) ends with about 150 of them still in
   that buffer and none in the socket. No event will come for those; every
   one must be answered all the same.
2. One client floods zero-length WRITEs (answered on the loop itself, no
   worker involved, nothing logged) without pause, reading its replies on
   a second thread. Meanwhile a second client connects, negotiates,
   writes and reads 4 KiB, and disconnects: it must be served while the
   flood goes on, within SERVED_WITHIN seconds (an idle server takes
   milliseconds), not after the flood; and the flood must still be
   answered after that.
3. SIGTERM, still during the flood: the loop must see it (the flood's
   later requests get ESHUTDOWN, and nothing else goes wrong) and the
   server must stop within its grace period and exit 0."""
import os
import signal
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

FLOOD_SECONDS = 30  # the flood's own bound; the checks take far less
BURST = 1 << 20     # bytes of requests per send
SERVED_WITHIN = 5   # seconds: a liveness bound, not a speed figure
REQ = len(request_bytes(CMD_WRITE))  # 28: a request without payload
REPLY = 16                           # a simple reply


def replies_ok(data, allowed=(0,)):
    """Checks simple replies; returns (count, count by error, problem)."""
    by_err = {}
    for i in range(0, len(data) - len(data) % REPLY, REPLY):
        magic, err = struct.unpack(">II", data[i:i + 8])
        if magic != SIMPLE_REPLY_MAGIC or err not in allowed:
            return i // REPLY, by_err, ("reply %d: magic 0x%08x error %s"
                                        % (i // REPLY, magic, errname(err)))
        by_err[err] = by_err.get(err, 0) + 1
    return len(data) // REPLY, by_err, None


class Flood:
    """Sends zero-length WRITEs as fast as the socket takes them, and reads
    every reply on a second thread. sent counts whole requests sent."""

    def __init__(self, conn):
        self.conn = conn
        self.stop = threading.Event()
        self.sigterm = threading.Event()  # from now on ESHUTDOWN is fine
        self.sent_bytes = 0
        self.replied = 0
        self.by_err = {}
        self.error = None
        self.burst = request_bytes(CMD_WRITE, 0, 0, cookie=7) * (BURST // REQ)
        self.tx = threading.Thread(target=self.send_loop, daemon=True)
        self.rx = threading.Thread(target=self.recv_loop, daemon=True)

    @property
    def sent(self):
        return self.sent_bytes // REQ

    def start(self):
        self.t0 = time.monotonic()
        self.tx.start()
        self.rx.start()

    def send_loop(self):
        view = memoryview(self.burst)
        try:
            while (not self.stop.is_set() and
                   time.monotonic() - self.t0 < FLOOD_SECONDS):
                off = 0
                while off < len(view) and not self.stop.is_set():
                    n = self.conn.sock.send(view[off:])
                    off += n
                    self.sent_bytes += n
        except OSError as e:
            if not self.stop.is_set() and not self.sigterm.is_set():
                self.error = "send: %s" % e

    def recv_loop(self):
        pending = b""
        try:
            while True:
                chunk = self.conn.sock.recv(1 << 20)
                if not chunk:
                    return
                pending += chunk
                allowed = (0, ESHUTDOWN) if self.sigterm.is_set() else (0,)
                n, by_err, problem = replies_ok(pending, allowed)
                self.replied += n
                for k, v in by_err.items():
                    self.by_err[k] = self.by_err.get(k, 0) + v
                if problem:
                    self.error = problem
                    return
                pending = pending[n * REPLY:]
        except OSError as e:
            if not self.stop.is_set() and not self.sigterm.is_set():
                self.error = "recv: %s" % e

    def flooding(self):
        """True while requests are still going out: the sender thread is
        alive and the server has not answered all it was sent."""
        return self.tx.is_alive() and self.replied < self.sent


def burst_then_silence(server):
    count = 1170  # 32,760 bytes: two reads of the 16 KiB input buffer
    c = Conn(server)
    c.open_export(structured=False)
    c.send(request_bytes(CMD_WRITE, 0, 0, cookie=3) * count)
    c.sock.settimeout(SERVED_WITHIN)
    data = b""
    try:
        while len(data) < count * REPLY:
            chunk = c.sock.recv(count * REPLY - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    n, _, problem = replies_ok(data)
    expect(problem is None, "burst replies well formed (%s)" % problem)
    expect(n == count, "all %d requests of a burst answered within %d s, "
           "with nothing more arriving (got %d)" % (count, SERVED_WITHIN, n))
    c.request(CMD_DISC)
    c.close()
    log("ok: a burst of %d requests, more than one turn, answered whole"
        % count)


def main(server):
    if server.peer:
        print("SKIP: checks our own server's event loop")
        sys.exit(77)

    burst_then_silence(server)

    a = Conn(server)
    a.open_export(structured=False)
    a.sock.settimeout(None)
    flood = Flood(a)
    flood.start()
    # Until the server is answering, and behind.
    deadline = time.monotonic() + 10
    while flood.replied < 100000 and time.monotonic() < deadline:
        time.sleep(0.05)
    expect(flood.error is None, "flood without error (%s)" % flood.error)
    expect(flood.flooding(), "the flood is on (%d sent, %d answered)"
           % (flood.sent, flood.replied))

    t0 = time.monotonic()
    b = Conn(server, timeout=FLOOD_SECONDS)
    b.open_export(structured=True)
    data = os.urandom(4096)
    err, _ = b.do(CMD_WRITE, 8192, 4096, payload=data)
    expect_err(err, 0, "second client's WRITE")
    err, got = b.do(CMD_READ, 8192, 4096)
    expect_err(err, 0, "second client's READ")
    expect(got == data, "second client reads back what it wrote")
    b.request(CMD_DISC)
    b.close()
    took = time.monotonic() - t0
    expect(flood.flooding() and took < SERVED_WITHIN,
           "the second client was served during the flood, within %d s "
           "(took %.1f s; flood %d sent, %d answered)"
           % (SERVED_WITHIN, took, flood.sent, flood.replied))
    log("ok: a second client on the same loop was served in %.2f s while "
        "the first flooded it (%d requests answered so far)"
        % (took, flood.replied))
    before = flood.replied
    time.sleep(0.5)
    expect(flood.replied > before and flood.error is None,
           "the flood is still answered afterwards (%d, then %d; %s)"
           % (before, flood.replied, flood.error))

    # SIGTERM reaches a loop that a client keeps busy.
    flood.sigterm.set()
    server.proc.send_signal(signal.SIGTERM)
    expect_exit_zero(server, "SIGTERM during the flood")
    flood.stop.set()
    flood.rx.join(10)
    expect(flood.error is None, "flood without error after SIGTERM (%s)"
           % flood.error)
    expect(flood.by_err.get(ESHUTDOWN, 0) > 0,
           "the loop read the flood after SIGTERM: its later requests got "
           "ESHUTDOWN (replies by error: %s)" % flood.by_err)
    a.close()
    log("ok: SIGTERM during the flood: %d requests got ESHUTDOWN; exit 0"
        % flood.by_err[ESHUTDOWN])


run(main, exports=("memory:1M",), extra=("--loops", "1"))
