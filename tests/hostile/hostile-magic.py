#!/usr/bin/env python3
"""Unknown magic and unknown client flags: the server closes the connection
(the spec leaves it nothing else), logs the client, and keeps serving."""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403


def must_close(server, c, what):
    expect(c.wait_closed(10), "server closes the connection on " + what)
    check_logged(server, c.client_id(), what)
    c.close()
    still_serving(server, what=what)


def main(server):
    # Client flags with bits the server never offered: MUST close.
    for flags in (0x80000001, 0x00000004 | FLAG_C_FIXED_NEWSTYLE,
                  0xFFFFFFFF):
        c = Conn(server)
        c.greeting(cflags=flags)
        # An option after the bad flags must not be answered.
        c.send(opt_bytes(OPT_LIST))
        must_close(server, c, "client flags 0x%08x" % flags)

    # A wrong IHAVEOPT magic in an option header.
    for magic in (IHAVEOPT ^ 1, 0, NBDMAGIC, REQUEST_MAGIC):
        c = Conn(server)
        c.greeting()
        c.send(struct.pack(">QII", magic, OPT_LIST, 0))
        must_close(server, c, "option magic 0x%016x" % magic)
        check_logged(server, c.client_id(), "the bad magic's value",
                     pattern="bad option magic 0x%016x" % magic)

    # The same after a good option: the state machine must not remember.
    c = Conn(server)
    c.greeting()
    t, _ = c.option(OPT_LIST)
    expect_rep(t, REP_ACK, "LIST")
    c.send(struct.pack(">QII", IHAVEOPT >> 8, OPT_GO, 6) + bytes(6))
    must_close(server, c, "wrong option magic after a good option")

    # Garbage instead of anything: an HTTP request.
    c = Conn(server)
    c.greeting(cflags=None)
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    must_close(server, c, "an HTTP request instead of client flags")

    # A wrong request magic in transmission, compact mode and structured.
    for structured in (False, True):
        c = Conn(server)
        c.open_export(structured=structured)
        err, _ = c.do(CMD_READ, 0, 512)
        expect_err(err, 0, "READ before the bad magic")
        c.send(request_bytes(CMD_READ, 0, 512, magic=REQUEST_MAGIC ^ 0x100))
        must_close(server, c, "request magic 0x%08x (structured=%s)"
                   % (REQUEST_MAGIC ^ 0x100, structured))

    # An option header in transmission (GO, then more options).
    c = Conn(server)
    c.open_export()
    # 30 bytes: at least one whole request header's worth.
    c.send(opt_bytes(OPT_INFO, info_data(b"exportXX")))
    must_close(server, c, "an INFO option after GO")


run(main)
