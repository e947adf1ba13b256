#!/usr/bin/env python3
"""After NBD_OPT_ABORT the server acknowledges and closes (the spec's
soft disconnect). Over TLS the acknowledgement can stay in the session's
send buffer when the socket is full, and the close must still follow
once it is out: a client with a small receive window sends INFO options
one at a time without reading the replies until the server's send queue
stops growing, ten more, then ABORT, and then reads everything: it must
see the connection end (the handshake time limit is off, so nothing
else would end it). Then the server still serves a fresh TLS client."""
import os
import shutil
import socket
import ssl
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403


def server_send_queue(server, cport):
    """Bytes queued in the server's socket to this client (/proc)."""
    with open("/proc/net/tcp") as f:
        for line in f.read().splitlines()[1:]:
            x = line.split()
            if (x[1].endswith(":%04X" % server.port) and
                    x[2].endswith(":%04X" % cport)):
                return int(x[4].split(":")[0], 16)
    return -1


def main_with(ca):
    def main(server):
        if server.peer:
            print("SKIP: checks our own server's close after ABORT")
            sys.exit(77)
        c = Conn(server)
        # A small receive window (set before connect), so that the
        # server's socket fills while its TLS buffer still has room.
        c.sock.close()
        c.sock = socket.socket()
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.sock.settimeout(IO_TIMEOUT)
        c.sock.connect(("127.0.0.1", server.port))
        cport = c.sock.getsockname()[1]
        c.greeting()
        c.starttls(ca)
        # INFO replies of ~4 KiB, unread, until the server's socket is
        # full (its send queue stops growing), then ABORT.
        info = opt_bytes(OPT_INFO, info_data(b"", [INFO_DESCRIPTION]))
        last, stable, sent = -1, 0, 0
        while stable < 5 and sent < 20000:
            c.send(info)
            sent += 1
            time.sleep(0.003)
            q = server_send_queue(server, cport)
            stable = stable + 1 if q == last else 0
            last = q
        expect(stable >= 5, "the server's socket filled (queue %d)" % last)
        # More, then ABORT once the server had time to take them all in:
        # it answers ABORT with its socket full.
        for _ in range(10):
            c.send(info)
        sent += 10
        time.sleep(0.3)
        c.send(opt_bytes(OPT_ABORT))
        time.sleep(1)
        got = 0
        c.sock.settimeout(10)
        while True:
            try:
                chunk = c.sock.recv(1 << 20)
            except (ConnectionResetError, ssl.SSLError):
                break
            except socket.timeout:
                raise Failure("the connection was not closed after ABORT "
                              "(%d bytes of replies read)" % got)
            if not chunk:
                break
            got += len(chunk)
        expect(got > sent * 4000, "every INFO reply arrived before "
               "the close (%d bytes)" % got)
        c.close()
        log("ok: closed after ABORT, %d bytes of replies first" % got)
        d = Conn(server)
        d.open_export(b"", tls_ca=ca)
        d.do(CMD_WRITE, 0, 4096, payload=b"\x5a" * 4096)
        err, data = d.do(CMD_READ, 0, 4096)
        expect(err == 0 and data == b"\x5a" * 4096, "a fresh TLS client "
               "is served")
        d.close()
    return main


tmp = tempfile.mkdtemp(prefix="nbdflow-abort.")
try:
    PKI = make_pki(tmp)
    run(main_with(os.path.join(PKI, "ca-cert.pem")), exports=("memory:1M",),
        extra=("--tls=require", "--tls-certs", PKI, "--handshake-timeout",
               "0", "-D", "d" * 4000))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
