#!/usr/bin/env python3
"""Option lengths up to 4 GiB, and option data that disagrees with the
option: the server never allocates what the header announces, answers the
spec's error (or closes), and keeps serving other clients meanwhile."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

GIB_KIB = 1 << 20


def main(server):
    # A client already in transmission must be unaffected by all of this.
    bystander = Conn(server)
    bystander.open_export()
    marker = os.urandom(4096)
    err, _ = bystander.do(CMD_WRITE, 0, 4096, payload=marker)
    expect_err(err, 0, "bystander WRITE")

    base_vm = server.vm_size_kib()

    # Announce 0xffffffff bytes (and 0x80000000) then hang up at once.
    for option in (OPT_LIST, OPT_GO, OPT_INFO, 0xDEAD, OPT_EXPORT_NAME,
                   OPT_SET_META_CONTEXT):
        for length in (0xFFFFFFFF, 0x80000000):
            c = Conn(server)
            c.greeting()
            c.send(opt_bytes(option, b"", length))
            cid = c.client_id()
            c.close()
            check_logged(server, cid, "option %d announcing %d bytes, then "
                         "close" % (option, length))
            still_serving(server, what="option %d of length 0x%x"
                          % (option, length))

    # Announce 4 GiB and really send 4 MiB: the server must not buffer it
    # all, and must not have reserved 4 GiB of address space.
    for option in (OPT_GO, 0xDEAD, OPT_SET_META_CONTEXT, OPT_EXPORT_NAME):
        c = Conn(server)
        c.greeting()
        c.send(opt_bytes(option, b"", 0xFFFFFFFF))
        sent = 0
        closed = False
        try:
            chunk = bytes(256 << 10)
            c.sock.settimeout(10)
            while sent < (4 << 20):
                c.sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        except OSError:
            # Send timed out: the server stopped reading. Fine, as long
            # as it is not holding memory for it.
            pass
        time.sleep(0.5)
        grown = server.vm_size_kib() - base_vm
        expect(grown < GIB_KIB,
               "VmSize grew %d KiB (< 1 GiB) with option %d announcing "
               "4 GiB, %d bytes sent%s" % (grown, option, sent,
                                           " (closed by server)" if closed
                                           else ""))
        cid = c.client_id()
        if not closed:
            # Either an error reply already, or still reading: both fine.
            c.sock.settimeout(1)
        c.close()
        check_logged(server, cid, "option %d with 4 GiB announced" % option)
        still_serving(server, what="4 MiB into a 4 GiB option")

    err, data = bystander.do(CMD_READ, 0, 4096)
    expect_err(err, 0, "bystander READ after the oversized options")
    expect(data == marker, "bystander reads back its own data")

    # Unknown option with a small payload: ERR_UNSUP, and the server MUST
    # keep parsing options (so GO works on the same connection).
    c = Conn(server)
    c.greeting()
    t, _ = c.option(0xDEAD, os.urandom(1000))
    expect_rep(t, REP_ERR_UNSUP, "unknown option 0xdead with 1000 bytes")
    t, _ = c.option(0xFFFFFFFF)
    expect_rep(t, REP_ERR_UNSUP, "unknown option 0xffffffff")
    t, _ = c.option(OPT_PEEK_EXPORT)
    expect_rep(t, REP_ERR_UNSUP, "withdrawn option PEEK_EXPORT")
    # Options that take no data get ERR_INVALID when given some.
    for option in (OPT_LIST, OPT_STRUCTURED_REPLY, OPT_STARTTLS):
        t, _ = c.option(option, b"junk")
        expect_rep(t, REP_ERR_INVALID, "option %d with 4 bytes of data"
                   % option)
    # The same with more data than the server keeps (64 KiB): it drops
    # the data as it comes, then answers as the option requires; only
    # the options that carry data are refused for its size.
    big = os.urandom(70000)
    for option, want in ((0xDEAD, REP_ERR_UNSUP),
                         (OPT_PEEK_EXPORT, REP_ERR_UNSUP),
                         (OPT_LIST, REP_ERR_INVALID),
                         (OPT_STRUCTURED_REPLY, REP_ERR_INVALID),
                         (OPT_EXTENDED_HEADERS, REP_ERR_INVALID),
                         (OPT_STARTTLS, REP_ERR_INVALID),
                         (OPT_INFO, REP_ERR_TOO_BIG),
                         (OPT_GO, REP_ERR_TOO_BIG),
                         (OPT_LIST_META_CONTEXT, REP_ERR_TOO_BIG),
                         (OPT_SET_META_CONTEXT, REP_ERR_TOO_BIG)):
        t, _ = c.option(option, big)
        expect_rep(t, want, "option %d with %d bytes of data"
                   % (option, len(big)))
    # INFO/GO/META data whose inner lengths overrun the option length.
    bad = [
        b"\xff\xff\xff\xff\x00\x00",          # name length 2^32-1
        b"\x00\x00\x00\x05abc\x00\x00",       # name length past the end
        b"\x00\x00\x00\x00\x00\x05\x00\x03",  # 5 info requests, 1 present
        b"\x00\x00\x00\x00\x00",              # too short for the count
        b"\x00\x00\x00\x00\x00\x00\x00",      # odd trailing byte
    ]
    for data in bad:
        t, _ = c.option(OPT_INFO, data)
        expect_rep(t, REP_ERR_INVALID, "INFO with malformed data %r" % data)
    expect_rep(c.structured_reply(), REP_ACK, "STRUCTURED_REPLY")
    meta_bad = [
        b"\xff\xff\xff\xff",                                # truncated
        b"\x00\x00\x00\x00\xff\xff\xff\xff",                # 2^32-1 queries
        b"\x00\x00\x00\x00\x00\x00\x00\x01\xff\xff\xff\xff",  # huge query
        b"\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x10base:",
        b"\x00\x00\x00\x0dbase:allo\x00\x00\x00\x00",       # name overrun
    ]
    for option in (OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT):
        for data in meta_bad:
            t, _ = c.option(option, data)
            expect_rep(t, REP_ERR_INVALID, "option %d with malformed data %r"
                       % (option, data))
    expect_rep(c.go(), REP_ACK, "GO after all the refused options")
    err, _ = c.do(CMD_READ, 0, 512)
    expect_err(err, 0, "READ after all the refused options")
    c.request(CMD_DISC)
    c.close()

    bystander.request(CMD_DISC)
    bystander.close()


run(main)
