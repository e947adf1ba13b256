#!/usr/bin/env python3
"""A disconnect at every byte of the handshake, and in the middle of a
WRITE payload, and while replies are still being sent: the server stays up,
logs the client, and serves everyone else."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403


def main(server):
    bystander = Conn(server)
    bystander.open_export()
    marker = os.urandom(4096)
    err, _ = bystander.do(CMD_WRITE, 8192, 4096, payload=marker)
    expect_err(err, 0, "bystander WRITE")

    # Every prefix of a full, valid client handshake (flags, STRUCTURED_
    # REPLY, SET_META_CONTEXT, GO), then a close. The server's replies are
    # not read: the close may come at any point of its sending too.
    stream = full_handshake_bytes(b"")
    unlogged = []
    for k in range(len(stream) + 1):
        c = Conn(server)
        if k:
            c.send(stream[:k])
        cid = c.client_id()
        c.close()
        if not server.alive():
            raise Failure("server died after a close at handshake byte %d "
                          "(exit status %s)" % (k, server.proc.returncode))
        if k < len(stream) and not server.logged_about(cid, timeout=2):
            unlogged.append(k)
    log("%d handshake prefixes sent, %d closes not logged: %s"
        % (len(stream) + 1, len(unlogged), unlogged[:20]))
    still_serving(server, what="closes at every handshake byte")

    # Also the same with the server's replies read up to the close, so the
    # close lands while the server waits for the next option.
    for k in range(4, len(stream)):
        c = Conn(server)
        c.greeting(cflags=None)
        c.send(stream[:k])
        time.sleep(0.002)
        c.close()
    expect(server.alive(), "server alive after closes after the greeting")

    # In the middle of a WRITE payload, at several points.
    for cut in (0, 1, 511, 512, 65535):
        c = Conn(server)
        c.open_export()
        c.request(CMD_WRITE, 0, 65536, cookie=3,
                  payload=os.urandom(65536)[:cut])
        cid = c.client_id()
        c.close()
        check_logged(server, cid, "close after %d of 65536 payload bytes"
                     % cut)
        still_serving(server, what="a close mid-payload at byte %d" % cut)
        # Mid request header, too.
        c = Conn(server)
        c.open_export()
        c.send(request_bytes(CMD_READ, 0, 512)[:cut % 28 or 13])
        cid = c.client_id()
        c.close()
        check_logged(server, cid, "close mid request header")

    # Close while a lot of replies are in flight: 32 READs of 1 MiB sent,
    # none read. The server must notice the broken pipe without dying.
    for structured in (False, True):
        c = Conn(server)
        c.open_export(structured=structured)
        for i in range(32):
            c.request(CMD_READ, 0, 1 << 20, cookie=i)
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                          struct.pack("ii", 1, 0))  # RST on close
        c.close()
        still_serving(server, what="a reset with 32 MiB of replies pending "
                      "(structured=%s)" % structured)

    err, data = bystander.do(CMD_READ, 8192, 4096)
    expect(err == 0 and data == marker, "bystander unaffected by all that")
    bystander.close()
    # Checked last so that a logging gap does not hide a crash above.
    expect(not unlogged, "every close inside the handshake is logged "
           "(unlogged prefixes: %s)" % unlogged)


run(main, exports=("memory:64M",))
