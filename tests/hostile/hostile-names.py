#!/usr/bin/env python3
"""Names longer than 4096 bytes (the spec's MUST limit) in INFO, GO,
EXPORT_NAME and the meta-context options: an error reply (or, for
EXPORT_NAME, which cannot be answered with an error, a close), a log line,
and no effect on the server. Unknown names with control bytes are logged
escaped and capped, so a client cannot forge log lines."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403


def main(server):
    for n in (4097, 8192, 65536, 1 << 20):
        name = b"n" * n
        c = Conn(server)
        c.greeting()
        try:
            t = c.go(name, option=OPT_INFO)
            expect(t & REP_FLAG_ERROR, "INFO with a %d-byte name gets an "
                   "error reply (%s)" % (n, repname(t)))
            # The connection goes on: a good INFO still works.
            expect_rep(c.go(b"", option=OPT_INFO), REP_ACK,
                       "INFO of the default export after the long name")
            t = c.go(name)
            expect(t & REP_FLAG_ERROR, "GO with a %d-byte name gets an "
                   "error reply (%s)" % (n, repname(t)))
            expect_rep(c.structured_reply(), REP_ACK, "STRUCTURED_REPLY")
            for option in (OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT):
                t, _ = c.option(option, meta_data(name, ["base:allocation"]))
                expect(t & REP_FLAG_ERROR, "option %d with a %d-byte export "
                       "name gets an error reply (%s)"
                       % (option, n, repname(t)))
                t, _ = c.option(option, meta_data(b"", [b"base:" + name]))
                expect(t & REP_FLAG_ERROR or t == REP_ACK,
                       "option %d with a %d-byte query: error or empty "
                       "answer (%s)" % (option, n, repname(t)))
            expect_rep(c.go(b""), REP_ACK, "GO of the default export after "
                       "the long names")
            err, _ = c.do(CMD_READ, 0, 512)
            expect_err(err, 0, "READ after the long names")
        except Closed:
            # Closing on an over-long string is allowed (the peer broke a
            # MUST); it must then be logged.
            log("note: server closed on a %d-byte name" % n)
        cid = c.client_id()
        c.close()
        check_logged(server, cid, "a %d-byte name" % n)
        still_serving(server, what="a %d-byte name" % n)

        # EXPORT_NAME cannot be refused with a reply: the server closes.
        c = Conn(server)
        c.greeting()
        c.send(opt_bytes(OPT_EXPORT_NAME, name))
        expect(c.wait_closed(10), "server closes on EXPORT_NAME with a "
               "%d-byte name" % n)
        check_logged(server, c.client_id(), "EXPORT_NAME of %d bytes" % n)
        c.close()
        still_serving(server, what="EXPORT_NAME of %d bytes" % n)

    # The limit itself: a 4096-byte name is legal; here it names no export.
    if server.peer:
        return  # nbdkit's memory plugin serves any name
    c = Conn(server)
    c.greeting()
    expect_rep(c.go(b"x" * 4096, option=OPT_INFO), REP_ERR_UNKNOWN,
               "INFO of an unknown 4096-byte name")
    expect_rep(c.go(b"no-such-export"), REP_ERR_UNKNOWN,
               "GO of an unknown name")
    expect_rep(c.go(b""), REP_ACK, "GO after ERR_UNKNOWN")
    c.close()
    log_forgery(server)


FORGED = b"nbdflow: error: forged line"


def log_forgery(server):
    """Unknown names with a newline, a terminal escape and a long tail, in
    GO, SET_META_CONTEXT and EXPORT_NAME: each is logged on one line, its
    bytes escaped and its length capped."""
    name = b"evil\n" + FORGED + b"\x1b[31m\r\x00" + b"z" * 3000
    c = Conn(server)
    c.greeting()
    expect_rep(c.go(name), REP_ERR_UNKNOWN, "GO of a name with a newline")
    expect_rep(c.structured_reply(), REP_ACK, "STRUCTURED_REPLY")
    t, _ = c.option(OPT_SET_META_CONTEXT, meta_data(name, ["base:allocation"]))
    expect_rep(t, REP_ERR_UNKNOWN, "SET_META_CONTEXT of a name with a newline")
    cid = c.client_id()
    c.close()
    c = Conn(server)
    c.greeting()
    c.send(opt_bytes(OPT_EXPORT_NAME, name))
    expect(c.wait_closed(10), "server closes on EXPORT_NAME of an unknown "
           "name")
    cid2 = c.client_id()
    c.close()
    for who in (cid, cid2):
        lines = server.logged_about(who, pattern=r"evil\\x0a")
        expect(lines, "the newline is logged as \\x0a for %s" % who)
        for l in lines:
            expect(len(l) < 700, "logged line capped (%d chars)" % len(l))
            expect("\\x1b[31m\\x0d\\x00zz" in l,
                   "escape, CR and NUL logged escaped")
    text = server.log_text()
    expect(not any(l.startswith(FORGED.decode())
                   for l in text.splitlines()), "no forged log line")
    expect("\x1b" not in text and "\r" not in text and "\x00" not in text,
           "no raw control byte in the log")


run(main)
