#!/usr/bin/env python3
"""nagle_peer.py PORTFILE SIZE CONNECTIONS: an NBD server with Nagle on that
refuses every option but NBD_OPT_GO, writing each refusal as a server
that does so in two writes does (nbd-server: the 20-byte reply header,
then the error text). The text then waits in the server's kernel until
the client acknowledges the header; a client that leaves that to its
delayed ACK (40 ms at least on Linux) waits as long for every refusal.

It listens on 127.0.0.1 (port chosen by the kernel, written to PORTFILE),
serves CONNECTIONS connections one after another, each until the client
disconnects (NBD_CMD_DISC or end of stream), and answers GO with an
export of SIZE bytes (no data is ever read). For every refusal it times
the gap from sending the header to receiving the client's next option,
and prints them in milliseconds, one line: "gaps_ms G1 G2 ...".
Exits 1 with "FAIL: ..." on a protocol error."""
import os
import socket
import struct
import sys
import time

NBDMAGIC = 0x4e42444d41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3e889045565a9
REQ_MAGIC = 0x25609513
OPT_GO = 7
REP_ACK, REP_INFO = 1, 3
REP_ERR_UNSUP = (1 << 31) | 1
INFO_EXPORT = 0
CMD_DISC = 2
FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES = 1, 2
TEXT = b"The given option is unknown to this server implementation"


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def serve_one(s, size, gaps):
    s.sendall(struct.pack(">QQH", NBDMAGIC, IHAVEOPT,
                          FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES))
    flags = recv_exact(s, 4)
    if flags is None:
        fail("client closed before its flags")
    sent_at = None
    while True:
        hdr = recv_exact(s, 16)
        if hdr is None:
            fail("client closed during option haggling")
        if sent_at is not None:
            gaps.append((time.monotonic() - sent_at) * 1000.0)
            sent_at = None
        magic, opt, length = struct.unpack(">QII", hdr)
        if magic != IHAVEOPT or length > 65536:
            fail("bad option header")
        if length and recv_exact(s, length) is None:
            fail("client closed inside an option")
        if opt == OPT_GO:
            info = struct.pack(">HQH", INFO_EXPORT, size, 1)  # HAS_FLAGS
            s.sendall(struct.pack(">QIII", REPLY_MAGIC, opt, REP_INFO,
                                  len(info)) + info +
                      struct.pack(">QIII", REPLY_MAGIC, opt, REP_ACK, 0))
            break
        # Two writes, as nbd-server does: with Nagle on, the second is
        # held until the first is acknowledged.
        sent_at = time.monotonic()
        s.send(struct.pack(">QIII", REPLY_MAGIC, opt, REP_ERR_UNSUP,
                           len(TEXT)))
        s.send(TEXT)
    # Transmission: only NBD_CMD_DISC is expected (info reads nothing).
    while True:
        req = recv_exact(s, 28)
        if req is None:
            return
        magic, _flags, typ = struct.unpack(">IHH", req[:8])
        if magic != REQ_MAGIC:
            fail("bad request magic")
        if typ == CMD_DISC:
            return
        fail("unexpected request type %d" % typ)


def main():
    portfile, size, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(4)
    with open(portfile + ".tmp", "w") as f:
        f.write("%d\n" % ls.getsockname()[1])
    os.rename(portfile + ".tmp", portfile)
    ls.settimeout(30)
    gaps = []
    for _ in range(conns):
        s, _addr = ls.accept()
        s.settimeout(30)
        # Nagle stays on: no TCP_NODELAY, as in the server this stands for.
        serve_one(s, size, gaps)
        s.close()
    print("gaps_ms " + " ".join("%.1f" % g for g in gaps))


if __name__ == "__main__":
    main()
