#!/usr/bin/env python3
"""A client that sends requests faster than the server can answer them
must not take its event loop from the other clients on it. With one loop,
one client floods zero-length WRITEs (answered on the loop itself, no
worker involved, nothing logged) without pause, while it reads its
replies. Meanwhile a second client connects, negotiates, writes and reads
4 KiB, and disconnects: it must be served while the flood goes on, not
after (within SERVED_WITHIN seconds, where an idle server takes
milliseconds). Then SIGTERM, still during the flood: the server must stop within
its grace period and exit 0."""
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


class Flood:
    """Sends BURST bytes of zero-length WRITEs at a time, as fast as the
    socket takes them, and reads every reply on a second thread."""

    def __init__(self, conn):
        self.conn = conn
        self.stop = threading.Event()
        self.sent = 0
        self.replied = 0
        self.error = None
        one = request_bytes(CMD_WRITE, 0, 0, cookie=7)
        self.burst = one * (BURST // len(one))
        self.per_burst = BURST // len(one)
        self.tx = threading.Thread(target=self.send_loop, daemon=True)
        self.rx = threading.Thread(target=self.recv_loop, daemon=True)

    def start(self):
        self.t0 = time.monotonic()
        self.tx.start()
        self.rx.start()

    def send_loop(self):
        try:
            while (not self.stop.is_set() and
                   time.monotonic() - self.t0 < FLOOD_SECONDS):
                self.conn.sock.sendall(self.burst)
                self.sent += self.per_burst
        except OSError as e:
            if not self.stop.is_set():
                self.error = "send: %s" % e

    def recv_loop(self):
        # Simple replies to zero-length WRITEs: 16 bytes each.
        pending = b""
        try:
            while True:
                chunk = self.conn.sock.recv(1 << 20)
                if not chunk:
                    return
                pending += chunk
                n = len(pending) // 16
                for i in range(0, n * 16, 16):
                    magic, err = struct.unpack(">II", pending[i:i + 8])
                    if magic != SIMPLE_REPLY_MAGIC or err != 0:
                        self.error = ("reply %d: magic 0x%08x error %d"
                                      % (self.replied, magic, err))
                        return
                    self.replied += 1
                pending = pending[n * 16:]
        except OSError as e:
            if not self.stop.is_set():
                self.error = "recv: %s" % e

    def flooding(self):
        """True while requests are still going out: the sender thread is
        alive and the server has not answered all it was sent."""
        return self.tx.is_alive() and self.replied < self.sent


def main(server):
    if server.peer:
        print("SKIP: checks our own server's event loop")
        sys.exit(77)

    a = Conn(server)
    a.open_export(structured=False)
    a.sock.settimeout(None)
    flood = Flood(a)
    flood.start()
    # Until the server is answering, and behind.
    deadline = time.monotonic() + 10
    while flood.replied < 4 * flood.per_burst and time.monotonic() < deadline:
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
    expect(flood.error is None, "flood without error (%s)" % flood.error)
    log("ok: a second client on the same loop was served in %.2f s while "
        "the first flooded it (%d requests answered so far)"
        % (took, flood.replied))

    # SIGTERM reaches a loop that a client keeps busy.
    server.proc.send_signal(signal.SIGTERM)
    expect_exit_zero(server, "SIGTERM during the flood")
    expect(flood.tx.is_alive() or flood.sent > flood.replied,
           "the server stopped while the flood was still on")
    flood.stop.set()
    a.close()
    log("ok: SIGTERM during the flood; exit 0")


run(main, exports=("memory:1M",), extra=("--loops", "1"))
