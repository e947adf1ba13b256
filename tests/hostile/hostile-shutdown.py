#!/usr/bin/env python3
"""SIGTERM with clients connected: the server stops accepting, answers
further options of a client still negotiating with ERR_SHUTDOWN (ABORT
still with ACK), lets the requests in flight finish and their replies go
out whole (later requests may get ESHUTDOWN), then closes and exits 0."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

MAX = 32 << 20
DEPTH = 8
SIZE = DEPTH * MAX


def refused(server):
    try:
        s = server.connect(2)
    except OSError:
        return True
    s.close()
    return False


def main(server):
    if server.peer:
        print("SKIP: checks our own server's shutdown")
        sys.exit(77)
    h = Conn(server)  # stays in the handshake
    h.greeting()
    expect_rep(h.structured_reply(), REP_ACK, "STRUCTURED_REPLY")

    c = Conn(server)
    c.open_export(structured=False)
    head = os.urandom(4096)
    err, _ = c.do(CMD_WRITE, 0, len(head), payload=head)
    expect_err(err, 0, "WRITE before the shutdown")
    # Replies left unread: they back up in the server while it stops.
    for i in range(DEPTH):
        c.request(CMD_READ, i * MAX, MAX, cookie=100 + i)
    time.sleep(1)

    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not refused(server):
        if time.monotonic() > deadline:
            raise Failure("still accepting 10 s after SIGTERM")
        time.sleep(0.05)
    log("ok: new connections refused after SIGTERM")

    # The negotiating client first: the grace period is 5 s.
    t, _ = h.option(OPT_LIST)
    expect_rep(t, REP_ERR_SHUTDOWN, "LIST while shutting down")
    h.send(opt_bytes(OPT_ABORT))
    o, t, _ = h.opt_reply()
    expect(o == OPT_ABORT and t == REP_ACK, "ABORT still ACKed")
    expect(h.wait_closed(10), "server closes after ABORT")
    h.close()

    done, shut = 0, 0
    for _ in range(DEPTH):
        err, data = c.reply(None, MAX)
        i = c.reply_cookie - 100
        expect(0 <= i < DEPTH, "reply to an open READ (%d)" % i)
        if err == ESHUTDOWN:
            shut += 1
            continue
        expect_err(err, 0, "READ %d in flight at SIGTERM" % i)
        want = head + bytes(MAX - len(head)) if i == 0 else bytes(MAX)
        expect(data == want, "READ %d whole and right" % i)
        done += 1
    expect(done >= 1, "%d READs finished, %d refused with ESHUTDOWN"
           % (done, shut))
    expect(c.wait_closed(10), "server closes the transmission client "
           "once its replies are out")
    c.close()

    expect_exit_zero(server, "its clients left")
    check_logged_text(server, "shutting down")
    late_request()


def wait_idle(pid):
    """Waits until the server's loop (its main thread) sleeps in
    epoll_wait, seen on three reads in a row (at most 5 s)."""
    path = "/proc/%d/task/%d/wchan" % (pid, pid)
    seen = 0
    deadline = time.monotonic() + 5
    while seen < 3 and time.monotonic() < deadline:
        try:
            with open(path) as f:
                seen = seen + 1 if "epoll_wait" in f.read() else 0
        except OSError:
            return
        time.sleep(0.02)


def late_request():
    """A request that reaches the server after SIGTERM, while its socket is
    not yet read, gets ESHUTDOWN, not a reset: the signal is made to come
    first by stopping the server (SIGSTOP) until both are there."""
    s = Server(["memory:1M"], ())
    try:
        c = Conn(s)
        c.open_export(structured=False)
        err, _ = c.do(CMD_READ, 0, 4096)
        expect_err(err, 0, "READ before the shutdown")
        # Stopped anywhere but in epoll_wait (still handling the READ),
        # the loop would read the next request on waking before it saw
        # the signal: a request that came first, as far as it can know.
        wait_idle(s.proc.pid)
        s.proc.send_signal(signal.SIGSTOP)
        try:
            s.proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            c.request(CMD_READ, 0, 4096, cookie=7)
            time.sleep(0.2)
        finally:
            s.proc.send_signal(signal.SIGCONT)
        err, _ = c.reply(7, 4096)
        expect_err(err, ESHUTDOWN, "READ sent after SIGTERM")
        expect(c.wait_closed(10), "closed after the ESHUTDOWN reply")
        c.close()
        s.proc.wait(10)
        expect(s.proc.returncode == 0, "exit status 0 (got %s)"
               % s.proc.returncode)
    finally:
        s.cleanup()


def check_logged_text(server, text):
    expect(text in server.log_text(), "log says %r" % text)


run(main, exports=("memory:%d" % SIZE,))
