#!/usr/bin/env python3
"""Requests past the end of the export and wrapping past 2^64: NBD_EINVAL
for READ, TRIM, CACHE and BLOCK_STATUS, NBD_ENOSPC for WRITE and
WRITE_ZEROES, no disconnect, no data touched; with simple and with
structured replies (where BLOCK_STATUS errors come as error chunks)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

SIZE = 1 << 20
TOP = 1 << 64


def cases():
    """(description, offset, length) of ranges that do not fit."""
    return [
        ("at the end", SIZE, 512),
        ("straddling the end", SIZE - 512, 1024),
        ("one byte past the end", SIZE - 4096, 4097),
        ("far past the end", 1 << 40, 4096),
        ("offset 2^63", 1 << 63, 512),
        ("wrapping past 2^64", TOP - 512, 1024),
        ("offset 2^64-1, length 1", TOP - 1, 1),
        ("offset 2^64-1, length 2^32-1", TOP - 1, 0xFFFFFFFF),
    ]


def main(server):
    for structured in (False, True):
        mode = "structured" if structured else "simple"
        c = Conn(server)
        c.open_export(structured=structured, meta=structured)
        expect(c.size == SIZE, "export size %d" % c.size)
        # Known content at the end of the export, to see nothing changes.
        tail = os.urandom(4096)
        err, _ = c.do(CMD_WRITE, SIZE - 4096, 4096, payload=tail)
        expect_err(err, 0, "%s: WRITE of the last 4 KiB" % mode)
        for what, off, length in cases():
            what = "%s: %s (offset %d, length %d)" % (mode, what, off,
                                                      length)
            err, _ = c.do(CMD_READ, off, length)
            expect_err(err, EINVAL, "READ " + what)
            if length <= 1 << 20:
                err, _ = c.do(CMD_WRITE, off, length,
                              payload=os.urandom(length))
                expect_err(err, ENOSPC, "WRITE " + what)
            if c.tflags & TF_SEND_WRITE_ZEROES:
                err, _ = c.do(CMD_WRITE_ZEROES, off, length)
                expect_err(err, ENOSPC, "WRITE_ZEROES " + what)
            if c.tflags & TF_SEND_TRIM:
                err, _ = c.do(CMD_TRIM, off, length)
                expect_err(err, EINVAL, "TRIM " + what)
            if c.tflags & TF_SEND_CACHE:
                err, _ = c.do(CMD_CACHE, off, length)
                expect_err(err, EINVAL, "CACHE " + what)
            if structured:
                err, _ = c.do(CMD_BLOCK_STATUS, off, length)
                expect_err(err, EINVAL, "BLOCK_STATUS " + what)
                # Its reply MUST be structured, errors included.
                expect(c.reply_form == "structured",
                       "BLOCK_STATUS error as an error chunk (%s reply)"
                       % c.reply_form)
        # Still connected, and the data at the end is intact.
        err, data = c.do(CMD_READ, SIZE - 4096, 4096)
        expect_err(err, 0, "%s: READ of the last 4 KiB after all that" % mode)
        expect(data == tail, "%s: the last 4 KiB are unchanged" % mode)
        # The exact end is fine: the range [SIZE-512, SIZE) is in.
        err, _ = c.do(CMD_READ, SIZE - 512, 512)
        expect_err(err, 0, "%s: READ ending exactly at the end" % mode)
        c.request(CMD_DISC)
        c.close()
    still_serving(server, what="out-of-range requests")


run(main)
