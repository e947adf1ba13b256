#!/usr/bin/env python3
"""Payloads above the maximum block size (32 MiB): an error reply or a
clean disconnect, never a crash or a 4 GiB allocation, and nothing
written."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

MAX = 32 << 20
SIZE = 128 << 20


def send_some(c, n):
    """Sends up to n zero bytes; returns False if the server closed or
    stopped reading."""
    chunk = bytes(1 << 20)
    c.sock.settimeout(10)
    try:
        while n > 0:
            k = min(n, len(chunk))
            c.sock.sendall(chunk[:k])
            n -= k
    except (BrokenPipeError, ConnectionResetError, socket.timeout):
        return False
    except OSError:
        return False
    return True


def main(server):
    base_vm = server.vm_size_kib()
    c0 = Conn(server)
    c0.open_export()
    expect(c0.block[2] == MAX, "maximum block size advertised %d"
           % c0.block[2])
    marker = os.urandom(4096)
    err, _ = c0.do(CMD_WRITE, 0, 4096, payload=marker)
    expect_err(err, 0, "bystander WRITE")

    # WRITE one byte over the maximum, whole payload sent: error or close.
    for structured in (False, True):
        c = Conn(server)
        c.open_export(structured=structured)
        c.request(CMD_WRITE, 0, MAX + 1, cookie=5)
        sent_all = send_some(c, MAX + 1)
        try:
            err, _ = c.reply(5)
            expect(err in (EINVAL, EOVERFLOW, ENOMEM),
                   "WRITE of max+1 bytes refused (%s), structured=%s"
                   % (errname(err), structured))
            # If it answered, the stream must still be in sync.
            err, data = c.do(CMD_READ, 0, 4096)
            expect(err == 0 and data == marker,
                   "READ after the refused oversized WRITE")
        except Closed:
            log("ok: server closed on WRITE of max+1 bytes (sent all: %s)"
                % sent_all)
            check_logged(server, c.client_id(), "WRITE of max+1 bytes")
        c.close()
        still_serving(server, what="WRITE of max+1 bytes")

    # WRITE announcing 0xffffffff bytes, 8 MiB sent, then we wait for an
    # answer: error reply, close, or still reading. Then we hang up.
    for length in (0xFFFFFFFF, 64 << 20):
        c = Conn(server)
        c.open_export()
        c.request(CMD_WRITE, 0, length, cookie=6)
        sent = send_some(c, 8 << 20)
        time.sleep(0.5)
        grown = server.vm_size_kib() - base_vm
        expect(grown < (1 << 20), "VmSize grew %d KiB (< 1 GiB) with a WRITE"
               " of %d bytes announced (8 MiB sent: %s)"
               % (grown, length, sent))
        cid = c.client_id()
        closed = c.wait_closed(3)
        c.close()
        if closed:
            check_logged(server, cid, "WRITE of %d bytes" % length)
        still_serving(server, what="WRITE of %d bytes announced" % length)

    # READ above the maximum with simple replies (the client MUST NOT):
    # an error, a close, or the data; never a crash.
    c = Conn(server)
    c.open_export(structured=False)
    c.request(CMD_READ, 0, 64 << 20, cookie=7)
    try:
        err, data = c.reply(7, read_len=64 << 20)
        expect(err in (0, EINVAL, EOVERFLOW, ENOMEM),
               "READ of 64 MiB with simple replies: %s" % errname(err))
        if err == 0:
            expect(data[:4096] == marker, "64 MiB READ data is right")
    except Closed:
        log("ok: server closed on a 64 MiB simple READ")
    c.close()
    # With structured replies, with and without DF: EOVERFLOW, the error
    # such a client is told to retry smaller on (§NBD_CMD_READ).
    c = Conn(server)
    c.open_export(structured=True)
    for flags in (0, CMD_FLAG_DF):
        err, _ = c.do(CMD_READ, 0, MAX + 1, flags=flags)
        expect_err(err, EOVERFLOW, "structured READ of max+1 bytes, flags %d"
                   % flags)
    err, data = c.do(CMD_READ, 0, 4096)
    expect(err == 0 and data == marker, "READ after the refused large READs")
    c.close()
    # A client that agreed no block sizes may read more than 32 MiB: in
    # pieces, but with DF one content chunk would announce DONE before the
    # later pieces were read, so a failed piece could only cut the
    # connection. DF is refused up front (EOVERFLOW, before any content).
    c = Conn(server)
    c.greeting()
    expect_rep(c.structured_reply(), REP_ACK, "STRUCTURED_REPLY")
    expect_rep(c.go(b"", infos=()), REP_ACK, "GO without block sizes")
    err, _ = c.do(CMD_READ, 0, 64 << 20, flags=CMD_FLAG_DF)
    expect_err(err, EOVERFLOW, "unsized DF READ of 64 MiB")
    err, data = c.do(CMD_READ, 0, 64 << 20)
    expect(err == 0 and data[:4096] == marker,
           "unsized READ of 64 MiB without DF, in chunks")
    c.close()
    # Payload-free commands may exceed the maximum: no disconnect.
    c = Conn(server)
    c.open_export()
    for cmd in (CMD_WRITE_ZEROES, CMD_TRIM, CMD_CACHE):
        err, _ = c.do(cmd, 64 << 20, 64 << 20)
        expect(err in (0, EINVAL, EOVERFLOW),
               "command %d over 64 MiB answered (%s)" % (cmd, errname(err)))
    err, data = c.do(CMD_READ, 0, 4096)
    expect(err == 0 and data == marker, "READ after the big payload-free "
           "commands")
    c.close()

    err, data = c0.do(CMD_READ, 0, 4096)
    expect(err == 0 and data == marker, "bystander unaffected")
    c0.close()
    still_serving(server, what="oversized payloads")


run(main, exports=("memory:%d" % SIZE,))
