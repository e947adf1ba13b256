#!/usr/bin/env python3
"""One client's queue of slow requests must not hold up another client's
request behind all of it: connections take turns for the worker threads.
Client A pipelines 24 WRITE_ZEROES of 64 MiB with NO_HOLE into a memory
export (each zeroes and allocates its range, tens of milliseconds); once
the first is answered (all 24 are queued then: the loop reads and queues
them in one go), client B reads 4 KiB of another export. With two
workers, B's READ must be answered before most of A's zeroings: with one
queue for all, it waited behind every one of them (21 or more)."""
import os
import select
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

COUNT = 24
SPAN = 64 << 20


def main(server):
    if server.peer:
        print("SKIP: checks our own server's worker threads")
        sys.exit(77)
    a = Conn(server)
    a.open_export(b"big", structured=False)
    b = Conn(server)
    b.open_export(b"small", structured=False)
    marker = os.urandom(4096)
    expect_err(b.do(CMD_WRITE, 0, 4096, payload=marker)[0], 0, "B's WRITE")

    a.send(b"".join(request_bytes(CMD_WRITE_ZEROES, (i % 4) * SPAN, SPAN,
                                  flags=CMD_FLAG_NO_HOLE, cookie=i + 1)
                    for i in range(COUNT)))
    expect_err(a.reply()[0], 0, "A's first WRITE_ZEROES")
    b.request(CMD_READ, 0, 4096, cookie=99)

    before = 1  # A's replies in before B's
    a_done = 1
    b_done = False
    while not b_done or a_done < COUNT:
        ready, _, _ = select.select([a.sock, b.sock], [], [], 60)
        if not ready:
            raise Failure("no reply for 60 s (A: %d of %d, B: %s)"
                          % (a_done, COUNT, b_done))
        if a.sock in ready and a_done < COUNT:
            expect_err(a.reply()[0], 0, "A's WRITE_ZEROES")
            a_done += 1
            if not b_done:
                before += 1
        if b.sock in ready and not b_done:
            err, data = b.reply(99, read_len=4096)
            expect_err(err, 0, "B's READ")
            expect(data == marker, "B reads its own data")
            b_done = True
    log("B's READ was answered after %d of A's %d zeroings" % (before, COUNT))
    expect(before <= 8, "B's READ waited for %d of A's zeroings (at most 8: "
           "the two running, and turns taken)" % before)


run(main, exports=("big=memory:256M", "small=memory:1M"),
    extra=("--threads", "2", "--max-inflight", "64"))
