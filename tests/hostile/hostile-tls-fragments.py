#!/usr/bin/env python3
"""A TLS handshake message may come in several records (RFC 8446 5.1),
and a client may send them in one write. The server reads them all from
the socket at once, where epoll sees nothing more; it must go on with
what it holds instead of waiting until the handshake time limit.

For ClientHellos cut into 2 records, and into records of 1 byte each (a
few hundred, all in one write): the handshake completes within
ANSWERED_WITHIN seconds (the server's limit is set far above it), then a
GO and a WRITE and READ inside TLS work. Afterwards the server still
serves a fresh TLS client."""
import os
import shutil
import socket
import ssl
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

ANSWERED_WITHIN = 10  # seconds: a liveness bound, not a speed figure
HANDSHAKE_LIMIT = 60  # the server's --handshake-timeout


class BioSock:
    """A socket look-alike over an ssl.SSLObject, for Conn."""

    def __init__(self, raw, tls, inc, out):
        self.raw, self.tls, self.inc, self.out = raw, tls, inc, out

    def _flush(self):
        data = self.out.read()
        if data:
            self.raw.sendall(data)

    def sendall(self, data):
        self.tls.write(data)
        self._flush()

    def recv(self, n):
        while True:
            try:
                return self.tls.read(n)
            except ssl.SSLWantReadError:
                self._flush()
                chunk = self.raw.recv(65536)
                if not chunk:
                    return b""
                self.inc.write(chunk)

    def settimeout(self, t):
        self.raw.settimeout(t)

    def gettimeout(self):
        return self.raw.gettimeout()

    def getsockname(self):
        return self.raw.getsockname()

    def close(self):
        self.raw.close()


def split_records(flight, piece):
    """The handshake records of flight cut into records of at most piece
    bytes of body each."""
    out = b""
    while flight:
        typ, ver, n = flight[0], flight[1:3], struct.unpack(">H", flight[3:5])[0]
        body, flight = flight[5:5 + n], flight[5 + n:]
        expect(typ == 22, "a handshake record first (got type %d)" % typ)
        for i in range(0, len(body), piece):
            part = body[i:i + piece]
            out += bytes([typ]) + ver + struct.pack(">H", len(part)) + part
    return out


def fragmented(server, ca, piece):
    c = Conn(server)
    c.greeting()
    t, _ = c.option(OPT_STARTTLS)
    expect_rep(t, REP_ACK, "STARTTLS")
    ctx = ssl.create_default_context(cafile=ca)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(inc, out, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = out.read()
    wire = split_records(hello, piece)
    nrec = len(wire) - len(hello) + 5
    c.sock.sendall(wire)  # every record in one write
    c.sock.settimeout(ANSWERED_WITHIN)
    start = time.monotonic()
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            data = out.read()
            if data:
                c.sock.sendall(data)
            try:
                chunk = c.sock.recv(65536)
            except socket.timeout:
                raise Failure("ClientHello in records of %d bytes: no answer "
                              "within %d s" % (piece, ANSWERED_WITHIN))
            if not chunk:
                raise Failure("ClientHello in records of %d bytes: the server "
                              "closed the connection" % piece)
            inc.write(chunk)
    log("ok: ClientHello of %d bytes in %d records of at most %d bytes: "
        "handshake done in %.2f s (%s)" % (len(hello) - 5, nrec // 5, piece,
                                           time.monotonic() - start,
                                           tls.version()))
    c.sock = BioSock(c.sock, tls, inc, out)
    c.sock._flush()
    expect_rep(c.go(b""), REP_ACK, "GO inside TLS")
    data = os.urandom(4096)
    err, _ = c.do(CMD_WRITE, 8192, len(data), payload=data)
    expect(err == 0, "WRITE inside TLS (error %d)" % err)
    err, back = c.do(CMD_READ, 8192, len(data))
    expect(err == 0 and back == data, "READ back inside TLS")
    log("ok: GO, WRITE and READ inside TLS")
    c.close()


def main():
    tmp = tempfile.mkdtemp(prefix="nbdflow-tlsfrag.")
    try:
        pki = make_pki(tmp)
        ca = os.path.join(pki, "ca-cert.pem")

        def body(server):
            fragmented(server, ca, 1 << 14)  # whole: the control
            fragmented(server, ca, 256)      # 2 or 3 records
            fragmented(server, ca, 1)        # hundreds of 1-byte records
            c = Conn(server)
            c.open_export(b"", tls_ca=ca)
            err, _ = c.do(CMD_READ, 0, 512)
            expect(err == 0, "a fresh TLS client after them")
            c.close()
            log("ok: still serving")
        run(body, exports=("memory:1M",),
            extra=("--tls=require", "--tls-certs", pki,
                   "--handshake-timeout", str(HANDSHAKE_LIMIT)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
