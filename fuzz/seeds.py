#!/usr/bin/env python3
"""seeds.py OUTDIR: writes a seed corpus for each harness into
OUTDIR/<harness>/, built from the spec's layouts, so that fuzzing starts
from messages that decode."""
import os
import struct
import sys

IHAVEOPT = 0x49484156454F5054
REP_MAGIC = 0x3E889045565A9
REQ, XREQ = 0x25609513, 0x21E41C71
SIMPLE, STRUCT, XREPLY = 0x67446698, 0x668E33EF, 0x6E8A278C


def be(fmt, *v):
    return struct.pack(">" + fmt, *v)


def info_req(name, reqs):
    return be("I", len(name)) + name + be("H", len(reqs)) + b"".join(
        be("H", r) for r in reqs)


def meta_req(name, queries):
    return (be("I", len(name)) + name + be("I", len(queries)) +
            b"".join(be("I", len(q)) + q for q in queries))


# Client flags (FIXED_NEWSTYLE | NO_ZEROES), then options, for fuzz-server.
FLAGS = be("I", 3)
OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS, OPT_INFO, OPT_GO = (
    1, 2, 3, 5, 6, 7)
OPT_STRUCTURED, OPT_LIST_META, OPT_SET_META, OPT_EXTENDED = 8, 9, 10, 11
READ, WRITE, DISC, FLUSH, TRIM, CACHE, ZEROES, STATUS = 0, 1, 2, 3, 4, 5, 6, 7


def opt(o, data=b""):
    return be("QII", IHAVEOPT, o, len(data)) + data


def req(cmd, off, length, flags=0, cookie=1, payload=b"", ext=False):
    if ext:
        return be("IHHQQQ", XREQ, flags, cmd, cookie, off, length) + payload
    return be("IHHQQI", REQ, flags, cmd, cookie, off, length) + payload


def session(name=b"", ext=False, structured=True, meta=True):
    s = FLAGS
    if ext:
        s += opt(OPT_EXTENDED)
    elif structured:
        s += opt(OPT_STRUCTURED)
    if meta and (ext or structured):
        s += opt(OPT_SET_META, meta_req(name, [b"base:allocation"]))
    s += opt(OPT_GO, info_req(name, [3]))
    r = lambda *a, **k: req(*a, ext=ext, **k)
    s += r(WRITE, 4096, 512, payload=bytes(range(256)) * 2, cookie=1)
    s += r(READ, 0, 8192, cookie=2, flags=1 if structured else 0)
    s += r(STATUS, 0, 1 << 20, cookie=3)
    s += r(TRIM, 65536, 65536, cookie=4)
    s += r(ZEROES, 131072, 4096, cookie=5, flags=2)
    s += r(CACHE, 0, 4096, cookie=6)
    s += r(FLUSH, 0, 0, cookie=7, flags=1)
    s += r(DISC, 0, 0, cookie=8)
    return s


# What a server sends, from its greeting on, for fuzz-client; the first
# byte chooses the client's options (see fuzz-client.c).
REP_ACK, REP_SERVER, REP_INFO, REP_META = 1, 2, 3, 4
EXPORT_SIZE = 4096


def greeting():
    return b"NBDMAGIC" + b"IHAVEOPT" + be("H", 3)


def rep(o, t, data=b""):
    return be("QIII", REP_MAGIC, o, t, len(data)) + data


def go_replies():
    return (rep(OPT_GO, REP_INFO, be("HQH", 0, EXPORT_SIZE, 0x1 | 0x4 | 0x80)) +
            rep(OPT_GO, REP_INFO, be("HIII", 3, 1, 4096, 1 << 20)) +
            rep(OPT_GO, REP_INFO, be("H", 1) + b"disk") +
            rep(OPT_GO, REP_ACK))


def chunk(ext, flags, t, cookie, off, payload):
    if ext:
        return be("IHHQQQ", XREPLY, flags, t, cookie, off, len(payload)) + payload
    return be("IHHQI", STRUCT, flags, t, cookie, len(payload)) + payload


def server_stream(sel):
    ext, structured, alloc, listing = (sel & 1, sel & 2 or sel & 1, sel & 4,
                                       sel & 8)
    s = bytes([sel]) + greeting()
    if listing:
        s += rep(OPT_LIST, REP_SERVER, be("I", 4) + b"disk" + b"a disk")
        s += rep(OPT_LIST, REP_ACK)
    if ext:
        s += rep(OPT_EXTENDED, REP_ACK)
    elif structured:
        s += rep(OPT_STRUCTURED, REP_ACK)
    if structured and alloc:
        s += rep(OPT_SET_META, REP_META, be("I", 1) + b"base:allocation")
        s += rep(OPT_SET_META, REP_ACK)
    s += go_replies()
    data = bytes(range(256)) * (EXPORT_SIZE // 256)
    read_cookie, status_cookie = 1 << 32, 2 << 32 | 1
    if structured:
        s += chunk(ext, 0, 2, read_cookie, 0, be("QI", 0, 1024))
        s += chunk(ext, 1, 1, read_cookie, 0, be("Q", 1024) + data[1024:])
    else:
        s += be("IIQ", SIMPLE, 0, read_cookie) + data
    if structured and alloc:
        if ext:
            bs = be("IIQQQQ", 1, 2, 1024, 3, EXPORT_SIZE - 1024, 0)
        else:
            bs = be("IIIII", 1, 1024, 3, EXPORT_SIZE - 1024, 0)
        s += chunk(ext, 1, 6 if ext else 5, status_cookie, 0, bs)
    return s


SEEDS = {
    "fuzz-client": [server_stream(sel) for sel in (0, 2, 6, 7, 14, 15)] + [
        bytes([6]) + greeting() + rep(OPT_STRUCTURED, REP_ACK) +
        rep(OPT_SET_META, REP_ACK) + rep(OPT_GO, 0x80000001, be("H", 0)),
    ],
    "fuzz-server": [
        session(),
        session(b"null"),
        session(b"file"),
        session(b"file", ext=True),
        session(b"", structured=False, meta=False),
        FLAGS + opt(OPT_LIST) + opt(OPT_LIST_META,
                                    meta_req(b"file", [b"base:"])) +
        opt(OPT_INFO, info_req(b"null", [0, 1, 2, 3])) + opt(OPT_STARTTLS) +
        opt(OPT_ABORT),
        FLAGS + opt(OPT_EXPORT_NAME, b"file") +
        be("IHHQQI", REQ, 0, READ, 9, 0, 512),
    ],
    "fuzz-option": [
        info_req(b"", []),
        info_req(b"disk", [0, 1, 2, 3]),
        meta_req(b"", [b"base:allocation"]),
        meta_req(b"disk", [b"base:", b"qemu:dirty-bitmap:x"]),
    ],
    "fuzz-header": [
        be("QII", IHAVEOPT, 7, 10) + bytes(16),
        be("QIII", REP_MAGIC, 7, 3, 12) + bytes(12),
        be("IHHQQI", REQ, 1, 1, 5, 4096, 65536) + bytes(4),
        be("IHHQQQ", XREQ, 0, 7, 5, 1 << 40, 1 << 33),
        be("IIQ", SIMPLE, 0, 5) + bytes(16),
        be("IHHQI", STRUCT, 1, 5, 5, 16) + bytes(12),
        be("IHHQQQ", XREPLY, 1, 6, 5, 4096, 24),
    ],
    "fuzz-payload": [
        be("HQH", 0, 1 << 30, 0x0d),
        be("HIII", 3, 512, 4096, 32 << 20),
        be("H", 1) + b"disk",
        be("I", 4) + b"disk" + b"a description",
        be("I", 1) + b"base:allocation",
        be("IH", 5, 4) + b"full",
        be("IH", 22, 2) + b"io" + be("Q", 4096),
        be("QI", 4096, 512),
        be("IIIII", 1, 4096, 3, 8192, 0),
        be("IIQQ", 1, 1, 1 << 33, 1),
    ],
    "fuzz-uri": [
        b"nbd://localhost/disk",
        b"nbd://[::1]:10810/a%20b",
        b"nbds://user@example.com/?tls-type=psk&tls-psk-file=keys.psk",
        b"nbd+unix:///disk?socket=/run/nbd.sock",
        b"nbds+unix://?socket=%2Ftmp%2Fs&tls-verify-peer=0",
        b"nbds://h:1/?tls-certificates=pki&tls-hostname=h",
    ],
    "fuzz-size": [b"0", b"512", b"10G", b"1.5M", b"64KiB", b"16E", b"1536K"],
}


def main():
    out = sys.argv[1]
    for name, seeds in SEEDS.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        for i, s in enumerate(seeds):
            with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
                f.write(s)


if __name__ == "__main__":
    main()
