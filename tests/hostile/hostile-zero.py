#!/usr/bin/env python3
"""Zero-length requests: clients SHOULD NOT send them, servers SHOULD NOT
disconnect. Each gets a reply (success or an error) with its cookie, and
the connection keeps working. Also zero-length at the very end and past
the end of the export."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

SIZE = 1 << 20


def main(server):
    for structured in (False, True):
        mode = "structured" if structured else "simple"
        c = Conn(server)
        c.open_export(structured=structured, meta=structured)
        data0 = os.urandom(4096)
        err, _ = c.do(CMD_WRITE, 0, 4096, payload=data0)
        expect_err(err, 0, "%s: WRITE 4 KiB" % mode)
        cmds = [CMD_READ, CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES, CMD_CACHE]
        if structured:
            cmds.append(CMD_BLOCK_STATUS)
        for off in (0, 4096, SIZE):
            for cmd in cmds:
                err, data = c.do(cmd, off, 0)
                ok_errs = (0, EINVAL, ENOSPC) if cmd in (
                    CMD_WRITE, CMD_WRITE_ZEROES) else (0, EINVAL)
                expect(err in ok_errs,
                       "%s: zero-length command %d at %d answered (%s)"
                       % (mode, cmd, off, errname(err)))
                expect(data == b"", "no data for a zero-length READ")
        for cmd in (CMD_READ, CMD_WRITE):
            err, _ = c.do(cmd, SIZE + 4096, 0)
            expect(err in (0, EINVAL, ENOSPC),
                   "%s: zero-length command %d past the end answered (%s)"
                   % (mode, cmd, errname(err)))
        # Zero-length requests must not have touched anything.
        err, data = c.do(CMD_READ, 0, 4096)
        expect_err(err, 0, "%s: READ after the zero-length requests" % mode)
        expect(data == data0, "%s: data unchanged" % mode)
        # Several zero-length requests in flight at once.
        for i in range(16):
            c.request(CMD_READ, 512 * i, 0, cookie=1000 + i)
        for _ in range(16):
            err, data = c.reply(read_len=0)
            expect(data == b"", "%s: pipelined zero-length READ answered "
                   "without data (%s)" % (mode, errname(err)))
        err, data = c.do(CMD_READ, 0, 4096)
        expect(err == 0 and data == data0, "%s: READ after the pipelined "
               "zero-length READs" % mode)
        c.request(CMD_DISC)
        c.close()
    still_serving(server, what="zero-length requests")


run(main)
