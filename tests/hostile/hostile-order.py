#!/usr/bin/env python3
"""Options out of order or repeated, and commands the negotiation did not
allow."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403


def structured_conn(server):
    """A connection in option haggling with structured replies agreed."""
    c = Conn(server)
    c.greeting()
    expect_rep(c.structured_reply(), REP_ACK, "STRUCTURED_REPLY")
    return c


def meta_unknown_export(server):
    # SET_META_CONTEXT naming an unknown export: error or empty answer,
    # and then BLOCK_STATUS on the export opened by GO is refused.
    # (nbdkit's memory plugin serves every name: not checked there.)
    c = structured_conn(server)
    t, replies = c.option(OPT_SET_META_CONTEXT,
                          meta_data(b"nope", ["base:allocation"]))
    expect(t & REP_FLAG_ERROR or
           not any(rt == REP_META_CONTEXT for rt, _ in replies),
           "SET_META_CONTEXT on an unknown export selects nothing (%s)"
           % repname(t))
    expect_rep(c.go(b""), REP_ACK, "GO")
    err, _ = c.do(CMD_BLOCK_STATUS, 0, 4096)
    expect_err(err, EINVAL, "BLOCK_STATUS when contexts were set for "
               "another export")
    c.close()


def meta_set_fails(server):
    # A SET_META_CONTEXT that fails still replaces the earlier selection
    # (§NBD_OPT_SET_META_CONTEXT: "including when this command fails"),
    # here refused for its size: BLOCK_STATUS after GO gets EINVAL.
    c = structured_conn(server)
    t, _ = c.option(OPT_SET_META_CONTEXT,
                    meta_data(b"", ["base:allocation"]))
    expect_rep(t, REP_ACK, "first SET_META_CONTEXT")
    queries = ["base:allocation"] + ["x:" + "y" * 1000] * 70
    t, _ = c.option(OPT_SET_META_CONTEXT, meta_data(b"", queries))
    expect_rep(t, REP_ERR_TOO_BIG, "SET_META_CONTEXT of 70 KB")
    expect_rep(c.go(b""), REP_ACK, "GO")
    err, _ = c.do(CMD_BLOCK_STATUS, 0, 4096)
    expect_err(err, EINVAL, "BLOCK_STATUS after a failed SET_META_CONTEXT")
    err, _ = c.do(CMD_READ, 0, 512)
    expect_err(err, 0, "READ after the refused BLOCK_STATUS")
    c.close()


def main(server):
    # SET_META_CONTEXT before STRUCTURED_REPLY: ERR_INVALID (the spec's
    # SHOULD; for LIST it is a MAY), and the connection goes on.
    c = Conn(server)
    c.greeting()
    t, _ = c.option(OPT_SET_META_CONTEXT, meta_data(b"", ["base:allocation"]))
    expect_rep(t, REP_ERR_INVALID, "SET_META_CONTEXT before STRUCTURED_REPLY")
    t, _ = c.option(OPT_LIST_META_CONTEXT,
                    meta_data(b"", ["base:allocation"]))
    expect(t in (REP_ERR_INVALID, REP_ACK),
           "LIST_META_CONTEXT before STRUCTURED_REPLY: ERR_INVALID or ACK "
           "(%s)" % repname(t))
    # STRUCTURED_REPLY twice: the second may be refused (ERR_INVALID) or
    # accepted again; structured replies must stay on either way.
    expect_rep(c.structured_reply(), REP_ACK, "first STRUCTURED_REPLY")
    t = c.structured_reply()
    expect(t in (REP_ACK, REP_ERR_INVALID),
           "second STRUCTURED_REPLY: ACK or ERR_INVALID (%s)" % repname(t))
    t, replies = c.option(OPT_SET_META_CONTEXT,
                          meta_data(b"", ["base:allocation"]))
    expect_rep(t, REP_ACK, "SET_META_CONTEXT after STRUCTURED_REPLY")
    expect(any(rt == REP_META_CONTEXT and d[4:] == b"base:allocation"
               for rt, d in replies), "base:allocation selected")
    # SET_META_CONTEXT for another export than the one GO opens: the
    # contexts do not apply, so BLOCK_STATUS must be refused.
    # (Here they match, so BLOCK_STATUS works.)
    # INFO then GO with the same parameters: same answers.
    expect_rep(c.go(b"", option=OPT_INFO), REP_ACK, "INFO")
    info = (c.size, c.tflags, getattr(c, "block", None))
    expect_rep(c.go(b""), REP_ACK, "GO")
    expect((c.size, c.tflags, getattr(c, "block", None)) == info,
           "INFO and GO agree (%r)" % (info,))
    err, _ = c.do(CMD_BLOCK_STATUS, 0, 4096)
    expect_err(err, 0, "BLOCK_STATUS after SET_META_CONTEXT")
    expect(any(t == REPLY_TYPE_BLOCK_STATUS for t, _ in c.chunks),
           "BLOCK_STATUS reply carries a BLOCK_STATUS chunk")
    # Structured replies are in force: a READ comes back in chunks.
    c.request(CMD_READ, 0, 512, cookie=7)
    magic = struct.unpack(">I", c.recv_exact(4))[0]
    expect(magic == STRUCTURED_REPLY_MAGIC,
           "READ reply is structured after STRUCTURED_REPLY twice")
    c.close()
    still_serving(server, what="options out of order")

    # BLOCK_STATUS without any SET_META_CONTEXT: EINVAL, no disconnect.
    c = Conn(server)
    c.open_export(structured=True, meta=False)
    err, _ = c.do(CMD_BLOCK_STATUS, 0, 4096)
    expect_err(err, EINVAL, "BLOCK_STATUS without a meta context")
    err, _ = c.do(CMD_READ, 0, 512)
    expect_err(err, 0, "READ after the refused BLOCK_STATUS")
    c.close()

    if not server.peer:
        meta_unknown_export(server)
        meta_set_fails(server)


    # STARTTLS without TLS support: ERR_UNSUP or ERR_POLICY, and on.
    c = Conn(server)
    c.greeting()
    t, _ = c.option(OPT_STARTTLS)
    expect(t in (REP_ERR_UNSUP, REP_ERR_POLICY),
           "STARTTLS refused with ERR_UNSUP or ERR_POLICY (%s)" % repname(t))
    # ABORT: ACK (or a close), and nothing after it.
    c.send(opt_bytes(OPT_ABORT))
    try:
        o, t, _ = c.opt_reply()
        expect(o == OPT_ABORT and t == REP_ACK, "ABORT answered with ACK")
    except Closed:
        log("note: server closed on ABORT without an ACK (allowed)")
    expect(c.wait_closed(10), "server closes after ABORT")
    c.close()

    # ABORT with more data than any option may carry: the ACK is still a
    # MUST (the data is ignored), then the server closes.
    c = Conn(server)
    c.greeting()
    c.send(opt_bytes(OPT_ABORT, bytes(70000)))
    o, t, _ = c.opt_reply()
    expect(o == OPT_ABORT and t == REP_ACK,
           "ABORT with 70000 bytes of data answered with ACK (%s)"
           % repname(t))
    expect(c.wait_closed(10), "server closes after ABORT with data")
    c.close()

    # DF without structured replies: the flag is not advertised -> EINVAL.
    c = Conn(server)
    c.open_export(structured=False)
    expect(not c.tflags & TF_SEND_DF,
           "SEND_DF not advertised without structured replies")
    err, _ = c.do(CMD_READ, 0, 512, flags=CMD_FLAG_DF)
    expect_err(err, EINVAL, "READ with DF without structured replies")
    err, _ = c.do(CMD_BLOCK_STATUS, 0, 512)
    expect_err(err, EINVAL, "BLOCK_STATUS with simple replies")
    err, data = c.do(CMD_READ, 0, 512)
    expect_err(err, 0, "READ after refused commands")
    c.close()

    # EXPORT_NAME after options: works, and honours NO_ZEROES only when
    # both sides set it.
    for cflags in (FLAG_C_FIXED_NEWSTYLE,
                   FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES):
        c = Conn(server)
        hflags = c.greeting(cflags=cflags)
        expect(hflags & FLAG_FIXED_NEWSTYLE, "FIXED_NEWSTYLE offered")
        if not hflags & FLAG_NO_ZEROES:
            c.hflags = 0
        elif not cflags & FLAG_C_NO_ZEROES:
            c.hflags = 0
        t, _ = c.option(OPT_LIST)
        expect_rep(t, REP_ACK, "LIST")
        size, _ = c.export_name(b"")
        expect(size == 1 << 20, "EXPORT_NAME size %d" % size)
        err, _ = c.do(CMD_READ, 0, 512)
        expect_err(err, 0, "READ after EXPORT_NAME (cflags 0x%x)" % cflags)
        c.close()


run(main)
