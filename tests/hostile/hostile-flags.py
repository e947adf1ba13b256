#!/usr/bin/env python3
"""Unknown command flags, flags not valid for the command, and unknown
command types: NBD_EINVAL (the spec's SHOULD), no disconnect, nothing
written."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403


def main(server):
    for structured in (False, True):
        mode = "structured" if structured else "simple"
        c = Conn(server)
        c.open_export(structured=structured, meta=structured)
        base = os.urandom(4096)
        err, _ = c.do(CMD_WRITE, 0, 4096, payload=base)
        expect_err(err, 0, "%s: WRITE" % mode)
        # Unknown flag bits, on every command that takes no payload.
        for flag in (1 << 6, 1 << 7, 1 << 15, 0xFFC0):
            for cmd in (CMD_READ, CMD_FLUSH, CMD_TRIM, CMD_WRITE_ZEROES,
                        CMD_CACHE):
                off, length = (0, 0) if cmd == CMD_FLUSH else (0, 4096)
                err, _ = c.do(cmd, off, length, flags=flag)
                expect_err(err, EINVAL, "%s: command %d with unknown flag "
                           "0x%04x" % (mode, cmd, flag))
            err, _ = c.do(CMD_WRITE, 0, 512, flags=flag,
                          payload=os.urandom(512))
            expect_err(err, EINVAL, "%s: WRITE with unknown flag 0x%04x"
                       % (mode, flag))
        # Known flags on commands they do not apply to.
        wrong = [
            (CMD_READ, CMD_FLAG_NO_HOLE), (CMD_READ, CMD_FLAG_REQ_ONE),
            (CMD_READ, CMD_FLAG_FAST_ZERO), (CMD_TRIM, CMD_FLAG_DF),
            (CMD_WRITE_ZEROES, CMD_FLAG_DF),
            (CMD_WRITE_ZEROES, CMD_FLAG_REQ_ONE),
        ]
        for cmd, flag in wrong:
            err, _ = c.do(cmd, 0, 4096, flags=flag)
            expect_err(err, EINVAL, "%s: command %d with flag 0x%x not "
                       "valid for it" % (mode, cmd, flag))
        err, _ = c.do(CMD_WRITE, 0, 512, flags=CMD_FLAG_NO_HOLE,
                      payload=os.urandom(512))
        expect_err(err, EINVAL, "%s: WRITE with NO_HOLE" % mode)
        # Unknown command types (no payload is sent: only WRITE has one).
        for cmd in (8, 9, 12, 0x100, 0x7FFF, 0xFFFF):
            err, _ = c.do(cmd, 0, 4096)
            expect_err(err, EINVAL, "%s: unknown command type %d" % (mode,
                                                                      cmd))
        err, data = c.do(CMD_READ, 0, 4096)
        expect_err(err, 0, "%s: READ after the refused commands" % mode)
        expect(data == base, "%s: refused WRITEs changed nothing" % mode)
        # FUA is advertised and valid on WRITE, and tolerated on READ.
        if c.tflags & TF_SEND_FUA:
            err, _ = c.do(CMD_WRITE, 0, 512, flags=CMD_FLAG_FUA,
                          payload=base[:512])
            expect_err(err, 0, "%s: WRITE with FUA" % mode)
        # PAYLOAD_LEN only exists with extended headers; in compact mode
        # it is just a flag the command does not take: EINVAL, and the
        # server must not wait for a payload that never comes.
        for cmd in (CMD_READ, CMD_TRIM, CMD_BLOCK_STATUS):
            err, _ = c.do(cmd, 0, 4096, flags=CMD_FLAG_PAYLOAD_LEN)
            expect_err(err, EINVAL, "%s: command %d with PAYLOAD_LEN "
                       "without extended headers" % (mode, cmd))
        err, data = c.do(CMD_READ, 0, 4096)
        expect(err == 0 and data == base, "%s: stream in sync after "
               "PAYLOAD_LEN" % mode)
        c.request(CMD_DISC)
        c.close()
    still_serving(server, what="unknown flags and commands")


run(main)
