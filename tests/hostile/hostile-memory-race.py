#!/usr/bin/env python3
"""A memory export under a WRITE racing a TRIM of the same bytes, from two
connections (two event loops, two worker threads).

The spec leaves open which of the two wins, but not that the export stays
one disk afterwards: every way of reading it must then give the same bytes.
A READ with DF copies the memory as it is; a structured READ without DF
and BLOCK_STATUS go by the export's allocation map. If the trim clears a
chunk in the map after the write has filled it again, the first shows the
write's data and the other two a hole of zeroes, and the next partial write
to the chunk would bring the hidden data back.

Each round fills 8 MiB, then sends a TRIM of those 8 MiB on one connection
and, right behind it, a 64 KiB WRITE at offset 0 on the other, so the write
tends to land while the trim is still handing pages back to the kernel."""
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

SIZE = 16 << 20
SPAN = 8 << 20
PIECE = 64 << 10
ROUNDS = 60


def hole_at_zero(conn):
    """Whether BLOCK_STATUS calls the first PIECE bytes a hole."""
    err, _ = conn.do(CMD_BLOCK_STATUS, 0, PIECE)
    expect_err(err, 0, "BLOCK_STATUS at 0")
    for rtype, payload in conn.chunks:
        if rtype == REPLY_TYPE_BLOCK_STATUS:
            length, flags = struct.unpack(">II", payload[4:12])
            return bool(flags & 1) and length >= PIECE
    raise Failure("BLOCK_STATUS reply without a block-status chunk")


def main(server):
    a = Conn(server).open_export(meta=True)
    b = Conn(server).open_export(meta=True)
    fill = os.urandom(SPAN)
    outcomes = {"write last": 0, "trim last": 0}
    for i in range(ROUNDS):
        err, _ = a.do(CMD_WRITE, 0, SPAN, payload=fill)
        expect_err(err, 0, "round %d: WRITE of %d bytes" % (i, SPAN))
        piece = os.urandom(PIECE)
        # The write follows the trim by 0 to 600 us, so that over the
        # rounds some land before, during and after it.
        delay = (i % 13) * 50e-6
        a.request(CMD_TRIM, 0, SPAN, cookie=1)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < delay:
            pass
        b.request(CMD_WRITE, 0, PIECE, cookie=2, payload=piece)
        expect_err(a.reply(1)[0], 0, "round %d: TRIM" % i)
        expect_err(b.reply(2)[0], 0, "round %d: WRITE racing the TRIM" % i)

        err, raw = a.do(CMD_READ, 0, PIECE, flags=CMD_FLAG_DF)
        expect_err(err, 0, "round %d: READ with DF" % i)
        err, mapped = b.do(CMD_READ, 0, PIECE)
        expect_err(err, 0, "round %d: READ without DF" % i)
        hole = hole_at_zero(a)
        expect(raw in (piece, bytes(PIECE)),
               "round %d: the racing WRITE left neither its data nor "
               "zeroes" % i)
        expect(raw == mapped,
               "round %d: READ with DF gives %s, READ without DF gives %s: "
               "the allocation map lost the write"
               % (i, "the write's data" if raw == piece else "zeroes",
                  "the write's data" if mapped == piece else "zeroes"))
        expect(not (hole and raw != bytes(PIECE)),
               "round %d: BLOCK_STATUS reports a hole over the racing "
               "write's data" % i)
        outcomes["write last" if raw == piece else "trim last"] += 1
    log("outcomes over %d rounds: %s" % (ROUNDS, outcomes))
    a.close()
    b.close()
    still_serving(server, what="racing WRITEs and TRIMs")
    log("PASS: a WRITE racing a TRIM leaves one consistent disk")


if __name__ == "__main__":
    run(main, exports=("memory:%d" % SIZE,),
        extra=("--loops", "2", "--threads", "4"))
