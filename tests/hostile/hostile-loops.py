#!/usr/bin/env python3
"""--loops 3: connections are spread over three event-loop threads, the
emptiest first, and everything that used to be one loop's still holds
across them: clients on different loops pipeline at the same time and see
each other's writes; --max-connections counts all loops; a client that
stalls in the handshake on a loop other than the first is dropped by that
loop's timer; SIGTERM drains every loop and the server exits 0."""
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

BLOCK = 65536
DEPTH = 32


def loop_of(server, client_id):
    """The event loop the server's log says client_id went to."""
    lines = server.logged_about(client_id, pattern=r"connected \(event loop")
    if not lines:
        raise Failure("no 'connected' line for %s" % client_id)
    return int(re.search(r"event loop (\d+)", lines[-1]).group(1))


def main(server):
    if server.peer:
        print("SKIP: checks our own server's event loops")
        sys.exit(77)

    conns = []
    for _ in range(3):
        c = Conn(server)
        cid = c.client_id()
        c.open_export(structured=False)
        conns.append((c, cid))
    loops = sorted(loop_of(server, cid) for _, cid in conns)
    expect(loops == [0, 1, 2], "three clients on three loops (got %s)"
           % loops)
    log("ok: three clients went to loops 0, 1 and 2")

    # Every client pipelines DEPTH WRITEs into its own third of the
    # export, all three bursts sent before any reply is read.
    data = {}
    for k, (c, _) in enumerate(conns):
        blocks = [os.urandom(BLOCK) for _ in range(DEPTH)]
        data[k] = blocks
        base = k * DEPTH * BLOCK
        c.send(b"".join(request_bytes(CMD_WRITE, base + i * BLOCK, BLOCK,
                                      cookie=i + 1) + blocks[i]
                        for i in range(DEPTH)))
    for k, (c, _) in enumerate(conns):
        errs = [c.reply()[0] for _ in range(DEPTH)]
        expect(errs == [0] * DEPTH, "%d pipelined WRITEs of client %d "
               "succeeded" % (DEPTH, k))
        err, _ = c.do(CMD_FLUSH)
        expect_err(err, 0, "FLUSH on client %d" % k)
    # Each client reads back what the next one wrote (multi-conn).
    for k, (c, _) in enumerate(conns):
        j = (k + 1) % 3
        base = j * DEPTH * BLOCK
        bad = [i for i in range(0, DEPTH, 7)
               if c.do(CMD_READ, base + i * BLOCK, BLOCK) != (0, data[j][i])]
        expect(not bad, "client %d reads client %d's blocks (wrong: %s)"
               % (k, j, bad))
    log("ok: writes on each loop are read back whole on another")

    # --max-connections 3 is the server's total, not a loop's.
    expect_refused(server, "a fourth connection (--max-connections 3 over "
                   "three loops)")

    # A slot frees on loop 1: the next client goes there, stalls in the
    # handshake, and loop 1's timer drops it (--handshake-timeout 2).
    (c1, cid1) = [x for x in conns if loop_of(server, x[1]) == 1][0]
    c1.request(CMD_DISC)
    expect(c1.wait_closed(10), "client on loop 1 closed after DISC")
    c1.close()
    conns = [x for x in conns if x[1] != cid1]
    time.sleep(0.3)
    slow = Conn(server)
    sid = slow.client_id()
    slow.greeting()
    expect(loop_of(server, sid) == 1, "the new client went to the emptiest "
           "loop, 1 (got %d)" % loop_of(server, sid))
    t0 = time.monotonic()
    expect(slow.wait_closed(10), "stalled handshake on loop 1 dropped")
    waited = time.monotonic() - t0
    expect(waited < 6, "dropped within the timeout and a sweep (%.1f s)"
           % waited)
    check_logged(server, sid, "handshake timeout", pattern="handshake")
    slow.close()

    # SIGTERM: both remaining clients (loops 0 and 2) are idle between
    # requests: each loop closes its own, then the server exits 0.
    server.proc.send_signal(signal.SIGTERM)
    for c, cid in conns:
        expect(c.wait_closed(10), "client %s closed at shutdown" % cid)
        c.close()
    expect_exit_zero(server, "SIGTERM")
    log("ok: SIGTERM drained every loop; exit 0")


run(main, exports=("memory:8M",),
    extra=("--loops", "3", "--max-connections", "3",
           "--handshake-timeout", "2", "--verbose"))
