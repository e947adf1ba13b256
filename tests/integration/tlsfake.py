#!/usr/bin/env python3
"""tlsfake.py SOCKET PKI MODE SIZE: an NBD server on a Unix socket that
speaks TLS 1.3 (Python's ssl, PKI/server-cert.pem and server-key.pem)
after STARTTLS, and shapes its records in ways the spec's TLS allows but
a client must be ready for. Read-only, SIZE bytes of a pattern (byte i is
(i * 7 + i // 4096) mod 256, as fakenbd.py serves), simple replies only;
it answers GO, ABORT, READ, FLUSH and DISC, refuses every other option
with ERR_UNSUP, and exits after 60 s without a connection.

Modes:
  splithello  the ServerHello is cut into two handshake records, sent in
              one write with the rest of the server's first flight
  tickets     the TLS 1.3 session tickets sent after the handshake are
              held back and go out in the same write as the first option
              reply (records keep their order: TLS numbers them)
"""
import ssl
import struct
import sys

from unixserve import accept_loop, listen, recv_exact  # beside this file

PATH, PKI, MODE, SIZE = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
OPT_MAGIC = 0x3e889045565a9
REPLY_SIMPLE = 0x67446698


def pattern(off, n):
    return bytes(((i * 7 + i // 4096) & 0xFF) for i in range(off, off + n))


def split_first_record(flight):
    """flight with its first record (a handshake one) cut in two."""
    n = struct.unpack(">H", flight[3:5])[0]
    head, body, rest = flight[:3], flight[5:5 + n], flight[5 + n:]
    h = len(body) // 2
    return (head + struct.pack(">H", h) + body[:h] +
            head + struct.pack(">H", len(body) - h) + body[h:] + rest)


class Tls:
    def __init__(self, s):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_cert_chain(PKI + "/server-cert.pem", PKI + "/server-key.pem")
        self.s = s
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.t = ctx.wrap_bio(self.inc, self.out, server_side=True)
        first = True
        while True:
            try:
                self.t.do_handshake()
                break
            except ssl.SSLWantReadError:
                data = self.out.read()
                if data and first and MODE == "splithello":
                    data = split_first_record(data)
                if data:
                    first = False
                    s.sendall(data)
                self.feed()
        # What the handshake left behind are the session tickets.
        self.held = self.out.read() if MODE == "tickets" else b""
        if self.held:
            print("holding %d bytes of tickets" % len(self.held), flush=True)
        self.push()

    def feed(self):
        chunk = self.s.recv(65536)
        if not chunk:
            raise EOFError
        self.inc.write(chunk)

    def push(self):
        data = self.out.read()
        if data:
            self.s.sendall(data)

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            try:
                buf += self.t.read(n - len(buf))
            except ssl.SSLWantReadError:
                self.feed()
        return buf

    def send(self, data):
        """data in TLS, behind any tickets still held, in one write."""
        self.t.write(data)
        held, self.held = self.held, b""
        self.s.sendall(held + self.out.read())


def rep(opt, typ, data=b""):
    return struct.pack(">QIII", OPT_MAGIC, opt, typ, len(data)) + data


def serve(s):
    try:
        s.sendall(struct.pack(">QQH", 0x4e42444d41474943, 0x49484156454F5054,
                              1))
        recv_exact(s, 4)
        _, opt, n = struct.unpack(">QII", recv_exact(s, 16))
        recv_exact(s, n)
        if opt != 5:  # STARTTLS first, or nothing
            s.sendall(rep(opt, (1 << 31) + 5))  # ERR_TLS_REQD
            return
        s.sendall(rep(opt, 1))
        t = Tls(s)
        while True:
            _, opt, n = struct.unpack(">QII", t.recv_exact(16))
            t.recv_exact(n)
            if opt == 2:  # ABORT
                t.send(rep(opt, 1))
                return
            if opt == 7:  # GO
                info = struct.pack(">HQH", 0, SIZE, 1 | 2 | 4)
                t.send(rep(opt, 3, info) + rep(opt, 1))
                break
            t.send(rep(opt, (1 << 31) + 1))  # ERR_UNSUP
        while True:
            _, flags, typ, cookie, off, n = struct.unpack(
                ">IHHQQI", t.recv_exact(28))
            if typ == 2:  # DISC
                return
            if typ == 0 and off + n <= SIZE:
                t.send(struct.pack(">IIQ", REPLY_SIMPLE, 0, cookie) +
                       pattern(off, n))
            elif typ == 3:  # FLUSH
                t.send(struct.pack(">IIQ", REPLY_SIMPLE, 0, cookie))
            else:
                t.send(struct.pack(">IIQ", REPLY_SIMPLE, 22, cookie))
    except (EOFError, OSError, ssl.SSLError):
        pass
    finally:
        s.close()


def main():
    accept_loop(listen(PATH), serve)


main()
