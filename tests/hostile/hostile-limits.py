#!/usr/bin/env python3
"""--max-connections refuses the connection beyond the limit (and says so
in the log) but not once a slot is free again; --max-inflight 2 holds a
client that pipelines 64 requests to two at a time, and every reply still
arrives, with the right data, without deadlock."""
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403


def main(server):
    held = [Conn(server), Conn(server)]
    for c in held:
        c.greeting()
    expect_refused(server, "a third connection (--max-connections 2)")
    held.pop().close()
    time.sleep(0.3)

    c = Conn(server)
    c.open_export()
    blocks = [os.urandom(4096) for _ in range(64)]
    # 64 WRITEs in one burst, then 64 READs: far beyond --max-inflight 2.
    c.send(b"".join(request_bytes(CMD_WRITE, 4096 * i, 4096, cookie=i + 1)
                    + blocks[i] for i in range(64)))
    seen = set()
    for _ in range(64):
        err, _ = c.reply()
        expect(err == 0, "pipelined WRITE succeeded")
    c.send(b"".join(request_bytes(CMD_READ, 4096 * i, 4096, cookie=1000 + i)
                    for i in range(64)))
    for _ in range(64):
        magic, flags, rtype, ck, length = struct.unpack(
            ">IHHQI", c.recv_exact(20))
        expect(magic == STRUCTURED_REPLY_MAGIC, "structured READ reply")
        payload = c.recv_exact(length)
        i = ck - 1000
        expect(0 <= i < 64 and ck not in seen, "cookie %d expected once" % ck)
        seen.add(ck)
        expect(rtype == REPLY_TYPE_OFFSET_DATA and flags & REPLY_FLAG_DONE,
               "one data chunk per READ")
        expect(payload[8:] == blocks[i], "READ %d returns what was written"
               % i)
    log("ok: 64 pipelined WRITEs and READs through --max-inflight 2")
    c.request(CMD_DISC)
    c.close()
    held[0].close()


run(main, exports=("memory:1M",),
    extra=("--max-connections", "2", "--max-inflight", "2"))
