#!/usr/bin/env python3
"""Extended headers (the 64-bit extension): EXTENDED_HEADERS is ACKed,
STRUCTURED_REPLY afterwards gets ERR_EXT_HEADER_REQD, requests are 32-byte
extended requests, every reply is a 32-byte extended chunk echoing the
request's offset, WRITE carries PAYLOAD_LEN, BLOCK_STATUS answers with
BLOCK_STATUS_EXT; a payload on a command that takes none is consumed and
refused, a WRITE without PAYLOAD_LEN carries no payload and is refused, and
a 64-bit length past the end is refused without a disconnect."""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

REP_ERR_EXT_HEADER_REQD = REP_FLAG_ERROR | 10
EXT_REQUEST_MAGIC = 0x21E41C71
EXT_REPLY_MAGIC = 0x6E8A278C
REPLY_TYPE_BLOCK_STATUS_EXT = 6
SIZE = 1 << 20


def ext_request(c, cmd, offset, length, flags=0, cookie=1, payload=b""):
    c.send(struct.pack(">IHHQQQ", EXT_REQUEST_MAGIC, flags, cmd, cookie,
                       offset, length) + payload)


def ext_replies(c, wanted):
    """Reads whole extended replies for every cookie in wanted (cookie ->
    request offset), in whatever order the server sends them, chunks of
    different replies interleaved or not: {cookie: (error, data, types)}."""
    state = {ck: [0, {}, []] for ck in wanted}
    left = set(wanted)
    while left:
        magic, flags, rtype, ck, off, length = struct.unpack(
            ">IHHQQQ", c.recv_exact(32))
        expect(magic == EXT_REPLY_MAGIC,
               "extended reply magic (got 0x%08x)" % magic)
        expect(ck in left, "cookie echoed (%d, wanted one of %s)"
               % (ck, sorted(left)))
        expect(off == wanted[ck], "request offset echoed (%d, wanted %d)"
               % (off, wanted[ck]))
        expect(length < 64 << 20, "sane chunk length %d" % length)
        payload = c.recv_exact(length)
        st = state[ck]
        st[2].append(rtype)
        if rtype == REPLY_TYPE_OFFSET_DATA:
            st[1][struct.unpack(">Q", payload[:8])[0]] = payload[8:]
        elif rtype == REPLY_TYPE_OFFSET_HOLE:
            o, n = struct.unpack(">QI", payload)
            st[1][o] = bytes(n)
        elif rtype == REPLY_TYPE_BLOCK_STATUS_EXT:
            ctx, n = struct.unpack(">II", payload[:8])
            expect(len(payload) == 8 + 16 * n and n >= 1,
                   "BLOCK_STATUS_EXT holds %d descriptors" % n)
            st[1][0] = payload[8:]
        elif rtype & 0x8000:
            st[0] = struct.unpack(">I", payload[:4])[0]
        if flags & REPLY_FLAG_DONE:
            left.discard(ck)
    return {ck: (st[0], b"".join(st[1][k] for k in sorted(st[1])), st[2])
            for ck, st in state.items()}


def ext_reply(c, cookie, offset):
    """Reads one whole extended reply: (error, data, chunk types)."""
    return ext_replies(c, {cookie: offset})[cookie]


def main(server):
    c = Conn(server)
    c.greeting()
    t, _ = c.option(OPT_EXTENDED_HEADERS)
    expect_rep(t, REP_ACK, "EXTENDED_HEADERS")
    t, _ = c.option(OPT_STRUCTURED_REPLY)
    expect_rep(t, REP_ERR_EXT_HEADER_REQD, "STRUCTURED_REPLY after "
               "EXTENDED_HEADERS")
    t, _ = c.option(OPT_SET_META_CONTEXT, meta_data(b"", ["base:allocation"]))
    expect_rep(t, REP_ACK, "SET_META_CONTEXT with extended headers")
    expect_rep(c.go(b""), REP_ACK, "GO")

    data = os.urandom(65536)
    ext_request(c, CMD_WRITE, 4096, len(data), CMD_FLAG_PAYLOAD_LEN, 7, data)
    err, _, types = ext_reply(c, 7, 4096)
    expect_err(err, 0, "extended WRITE with PAYLOAD_LEN")
    expect(types == [REPLY_TYPE_NONE], "success is one NONE chunk")

    ext_request(c, CMD_READ, 0, 4096 + len(data), cookie=8)
    err, got, types = ext_reply(c, 8, 0)
    expect_err(err, 0, "extended READ")
    expect(got == bytes(4096) + data, "READ returns the hole and the data")
    log("ok: READ chunks %s" % types)

    ext_request(c, CMD_BLOCK_STATUS, 0, SIZE, cookie=9)
    err, desc, types = ext_reply(c, 9, 0)
    expect_err(err, 0, "extended BLOCK_STATUS")
    expect(types == [REPLY_TYPE_BLOCK_STATUS_EXT],
           "BLOCK_STATUS answered with BLOCK_STATUS_EXT (%s)" % types)
    total = 0
    for i in range(0, len(desc), 16):
        length, flags = struct.unpack(">QQ", desc[i:i + 16])
        expect(length > 0 and flags >> 32 == 0, "descriptor sane")
        total += length
    expect(total == SIZE, "descriptors cover the export (%d)" % total)

    # A payload on a command that takes none: consumed, EINVAL, in step.
    ext_request(c, CMD_TRIM, 0, 512, CMD_FLAG_PAYLOAD_LEN, 10, bytes(512))
    err, _, _ = ext_reply(c, 10, 0)
    expect_err(err, EINVAL, "TRIM with a payload")
    # A 64-bit length past the end.
    ext_request(c, CMD_READ, 0, 1 << 40, cookie=11)
    err, _, _ = ext_reply(c, 11, 0)
    expect_err(err, EINVAL, "READ of 2^40 bytes")
    ext_request(c, CMD_WRITE_ZEROES, SIZE - 512, 1 << 33, cookie=12)
    err, _, _ = ext_reply(c, 12, SIZE - 512)
    expect_err(err, ENOSPC, "WRITE_ZEROES past the end with a 64-bit length")
    ext_request(c, CMD_READ, 4096, 512, cookie=13)
    err, got, _ = ext_reply(c, 13, 4096)
    expect(err == 0 and got == data[:512], "stream in step afterwards")

    # A WRITE without PAYLOAD_LEN: with extended headers the flag alone
    # frames the request, so no payload follows. The 32 bytes after it
    # are the next request (a READ), not data to write.
    ext_request(c, CMD_WRITE, 0, 32, cookie=14)
    ext_request(c, CMD_READ, 0, 32, cookie=15)
    ext_request(c, CMD_READ, 4096, 32, cookie=16)
    # The three may be answered in any order.
    got = ext_replies(c, {14: 0, 15: 0, 16: 4096})
    expect_err(got[14][0], EINVAL, "WRITE without PAYLOAD_LEN")
    expect(got[15][0] == 0 and got[15][1] == bytes(32),
           "the request after it is served and the export is unchanged")
    expect(got[16][0] == 0 and got[16][1] == data[:32],
           "stream in step after it")
    check_logged(server, c.client_id(), "WRITE without PAYLOAD_LEN",
                 "PAYLOAD_LEN")
    ext_request(c, CMD_DISC, 0, 0)
    c.close()
    still_serving(server, what="extended headers")


run(main)
