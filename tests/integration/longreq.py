#!/usr/bin/env python3
"""longreq.py HOST PORT EXPORT DATAFILE [--ours PID] [--tls CAFILE]:
READs and WRITEs
longer than the 32 MiB maximum block size, from clients that never
agreed to block sizes (§Size constraints: a server SHOULD then accept
requests up to the export's size), as nbd-server's own test client sends
them.

A raw-socket client (no NBD library), written from the spec:
  1. EXPORT_NAME, simple replies: a 42 MiB WRITE of random bytes at
     1 MiB (saved to DATAFILE for the caller to compare with the export),
     then a 42 MiB READ of the same range pipelined with two 4 KiB READs
     and a FLUSH: every reply whole, in a stream that stays in step, the
     data equal.
With --ours (nbdflow serve, pid PID), also:
  2. GO without NBD_INFO_BLOCK_SIZE, structured replies: the 42 MiB READ
     without DF (data chunks that cover it exactly) and with DF (one
     chunk, or EOVERFLOW before any content, which the spec allows and
     nbdflow answers); a 42 MiB WRITE past the end gets ENOSPC, its payload dropped
     and the stream in step.
  3. GO with NBD_INFO_BLOCK_SIZE: the same client MUST keep to 32 MiB; a
     42 MiB READ gets EOVERFLOW (structured) or EINVAL (simple), and a
     42 MiB WRITE ends the connection.
  4. The server's peak resident memory grew by less than 32 MiB: the
     long requests were served in pieces, not with a buffer of 42 MiB.
With --tls, every connection runs inside TLS (STARTTLS first, X.509,
the server's name checked as localhost).
Exits 0 when all holds, 1 with "FAIL: ..." as its last line otherwise."""
import os
import socket
import ssl
import struct
import sys

MIB = 1 << 20
LONG = 42 * MIB
OFF = 1 * MIB

NBDMAGIC = 0x4e42444d41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3e889045565a9
REQ_MAGIC = 0x25609513
SIMPLE = 0x67446698
STRUCT = 0x668e33ef
OPT_EXPORT_NAME, OPT_STARTTLS, OPT_GO, OPT_STRUCTURED = 1, 5, 7, 8
TLS_CA = None  # --tls CAFILE
REP_ACK, REP_INFO = 1, 3
INFO_EXPORT, INFO_BLOCK_SIZE = 0, 3
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH = 0, 1, 2, 3
FLAG_DF = 4
EINVAL, ENOSPC, EOVERFLOW = 22, 28, 75


class Fail(Exception):
    pass


def ok(cond, what):
    if not cond:
        raise Fail(what)
    print("ok: " + what, flush=True)


def recv_exact(s, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = s.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("server closed after %d of %d bytes" % (got, n))
        got += k
    return bytes(buf)


def connect(host, port):
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    magic, ihave, hflags = struct.unpack(">QQH", recv_exact(s, 18))
    if magic != NBDMAGIC or ihave != IHAVEOPT:
        raise Fail("not a newstyle server")
    s.sendall(struct.pack(">I", 1 | (hflags & 2)))  # FIXED_NEWSTYLE, NO_ZEROES
    if TLS_CA:
        typ, _ = option(s, OPT_STARTTLS)
        if typ != REP_ACK:
            raise Fail("STARTTLS refused: 0x%x" % typ)
        ctx = ssl.create_default_context(cafile=TLS_CA)
        s = ctx.wrap_socket(s, server_hostname="localhost")
    return s, bool(hflags & 2)


def option(s, opt, data=b""):
    s.sendall(struct.pack(">QII", IHAVEOPT, opt, len(data)) + data)
    replies = []
    while True:
        magic, o, typ, ln = struct.unpack(">QIII", recv_exact(s, 20))
        if magic != REPLY_MAGIC or o != opt:
            raise Fail("bad option reply")
        replies.append((typ, recv_exact(s, ln)))
        if typ != REP_INFO:
            return typ, replies


def export_name(s, name, no_zeroes):
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_EXPORT_NAME, len(name)) +
              name)
    size, _ = struct.unpack(">QH", recv_exact(s, 10))
    if not no_zeroes:
        recv_exact(s, 124)
    return size


def go(s, name, infos):
    data = (struct.pack(">I", len(name)) + name +
            struct.pack(">H", len(infos)) +
            b"".join(struct.pack(">H", i) for i in infos))
    typ, replies = option(s, OPT_GO, data)
    ok(typ == REP_ACK, "GO acknowledged (infos %s)" % list(infos))
    for t, d in replies:
        if t == REP_INFO and struct.unpack(">H", d[:2])[0] == INFO_EXPORT:
            return struct.unpack(">Q", d[2:10])[0]
    raise Fail("no NBD_INFO_EXPORT")


def request(s, cmd, cookie, off, length, flags=0, payload=b""):
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, cookie, off,
                          length) + payload)


def simple_reply(s, lengths):
    """One simple reply; lengths maps cookie -> READ length."""
    magic, err, cookie = struct.unpack(">IIQ", recv_exact(s, 16))
    if magic != SIMPLE:
        raise Fail("simple reply magic 0x%08x: the stream is out of step"
                   % magic)
    data = b""
    if err == 0 and lengths.get(cookie):
        data = recv_exact(s, lengths[cookie])
    return cookie, err, data


def structured_read(s, cookie, off, length):
    """The chunks answering one READ: (error, data, number of chunks)."""
    buf = bytearray(length)
    covered = []
    err = 0
    n = 0
    while True:
        magic, flags, typ, ck, ln = struct.unpack(">IHHQI",
                                                 recv_exact(s, 20))
        if magic != STRUCT or ck != cookie:
            raise Fail("chunk magic 0x%08x cookie %d: out of step"
                       % (magic, ck))
        body = recv_exact(s, ln)
        n += 1
        if typ == 1:  # OFFSET_DATA
            o = struct.unpack(">Q", body[:8])[0] - off
            buf[o:o + ln - 8] = body[8:]
            covered.append((o, ln - 8))
        elif typ == 2:  # OFFSET_HOLE
            o, hl = struct.unpack(">QI", body[:12])
            covered.append((o - off, hl))
        elif typ & 0x8000:
            err = struct.unpack(">I", body[:4])[0]
        if flags & 1:
            break
    if err == 0:
        covered.sort()
        pos = 0
        for o, ln in covered:
            if o != pos:
                raise Fail("chunks leave a gap or overlap at %d" % pos)
            pos += ln
        if pos != length:
            raise Fail("chunks cover %d of %d bytes" % (pos, length))
    return err, bytes(buf), n


def vm_hwm_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def old_client(host, port, name, data):
    s, nz = connect(host, port)
    size = export_name(s, name, nz)
    ok(size >= OFF + LONG, "EXPORT_NAME: export of %d bytes" % size)
    request(s, CMD_WRITE, 1, OFF, LONG, payload=data)
    cookie, err, _ = simple_reply(s, {})
    ok(cookie == 1 and err == 0, "42 MiB WRITE after EXPORT_NAME: error %d"
       % err)
    # The long READ with more requests right behind it: their replies
    # must not land inside its data.
    request(s, CMD_READ, 2, OFF, LONG)
    request(s, CMD_READ, 3, OFF + LONG - 4096, 4096)
    request(s, CMD_FLUSH, 4, 0, 0)
    request(s, CMD_READ, 5, OFF, 4096)
    lengths = {2: LONG, 3: 4096, 5: 4096}
    got = {}
    for _ in range(4):
        cookie, err, d = simple_reply(s, lengths)
        got[cookie] = (err, d)
    ok(sorted(got) == [2, 3, 4, 5], "four replies, cookies %s"
       % sorted(got))
    ok(all(e == 0 for e, _ in got.values()), "no errors: %s"
       % {c: e for c, (e, _) in got.items()})
    ok(got[2][1] == data, "42 MiB READ after EXPORT_NAME returns the data "
       "written")
    ok(got[3][1] == data[-4096:] and got[5][1] == data[:4096],
       "the 4 KiB READs behind it return their data")
    request(s, CMD_DISC, 6, 0, 0)
    s.close()


def unsized_go_client(host, port, name, data):
    s, _ = connect(host, port)
    typ, _ = option(s, OPT_STRUCTURED)
    ok(typ == REP_ACK, "STRUCTURED_REPLY")
    size = go(s, name, ())
    for flags, what in ((0, "without DF"), (FLAG_DF, "with DF")):
        request(s, CMD_READ, 10 + flags, OFF, LONG, flags)
        err, d, n = structured_read(s, 10 + flags, OFF, LONG)
        if flags:
            # §NBD_CMD_READ: a DF read that would need fragments may be
            # refused with EOVERFLOW (no content), or sent as one chunk.
            ok((err == 0 and d == data and n == 1) or err == EOVERFLOW,
               "GO without block sizes: structured 42 MiB READ with DF: "
               "one chunk of the data, or EOVERFLOW (got error %d, %d "
               "chunks)" % (err, n))
            continue
        ok(err == 0 and d == data, "GO without block sizes: structured "
           "42 MiB READ %s returns the data (%d chunks)" % (what, n))
    # Past the end: refused, the payload dropped, the stream in step.
    request(s, CMD_WRITE, 20, size - 4096, LONG, payload=data)
    magic, err, cookie = struct.unpack(">IIQ", recv_exact(s, 16))
    ok(magic == SIMPLE and cookie == 20 and err == ENOSPC,
       "42 MiB WRITE past the end: ENOSPC (got %d)" % err)
    request(s, CMD_READ, 21, OFF, 4096)
    err, d, _ = structured_read(s, 21, OFF, 4096)
    ok(err == 0 and d == data[:4096], "the stream is in step after it")
    request(s, CMD_DISC, 22, 0, 0)
    s.close()


def sized_client(host, port, name, data):
    for structured in (True, False):
        s, _ = connect(host, port)
        if structured:
            option(s, OPT_STRUCTURED)
        go(s, name, (INFO_BLOCK_SIZE,))
        request(s, CMD_READ, 30, OFF, LONG)
        if structured:
            err, _, _ = structured_read(s, 30, OFF, LONG)
            want = EOVERFLOW
        else:
            _, err, _ = simple_reply(s, {30: LONG})
            want = EINVAL
        ok(err == want, "a client that asked for block sizes: 42 MiB READ "
           "refused with %d (got %d)" % (want, err))
        request(s, CMD_WRITE, 31, OFF, LONG)
        try:
            s.sendall(data)
            s.settimeout(10)
            closed = s.recv(1) == b""
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
            closed = True  # inside TLS: a close without close_notify
        ok(closed, "a client that asked for block sizes: 42 MiB WRITE ends "
           "the connection")
        s.close()


def main():
    global TLS_CA
    host, port, name, datafile = sys.argv[1:5]
    opts = dict(zip(sys.argv[5::2], sys.argv[6::2]))
    ours = "--ours" in opts
    pid = int(opts["--ours"]) if ours else 0
    TLS_CA = opts.get("--tls")
    name = name.encode()
    data = os.urandom(LONG)
    with open(datafile, "wb") as f:
        f.write(data)
    base = vm_hwm_kib(pid) if ours else 0
    try:
        old_client(host, port, name, data)
        if ours:
            unsized_go_client(host, port, name, data)
            sized_client(host, port, name, data)
            grown = vm_hwm_kib(pid) - base
            if os.environ.get("NBDFLOW_WRAPPER"):
                # valgrind's shadow memory is in the same figure
                print("skip: server's peak memory under a wrapper (%d KiB)"
                      % grown)
            else:
                ok(grown < 32 << 10, "server's peak memory grew %d KiB "
                   "(< 32 MiB)" % grown)
    except (Fail, EOFError, OSError, struct.error, ssl.SSLError) as e:
        print("FAIL: %s" % e)
        sys.exit(1)


main()
