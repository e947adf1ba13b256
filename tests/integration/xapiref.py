#!/usr/bin/env python3
"""xapiref.py: a reference of xapi's Chunked framing and upload HTTP,
written from the protocol's description alone, for the tests to check
nbdflow against. Nothing here shares code with nbdflow.

Frame: 12-byte little-endian header (u64 byte offset, u32 length), then
the data; the stream ends with an all-zero header. Upload: "PUT PATH
HTTP/1.1" with a "chunked" cookie, no Content-Length and no
Transfer-Encoding; the answer's head comes before any data; with
"Transfer-Encoding: nbd" in it the socket speaks NBD from then on.

Modes:
  recv-chunked PORT OUT READY      accept one connection, write its frames
                                   into OUT (which exists), exit 0 at the
                                   end marker, 1 otherwise
  http-recv PORT OUT READY [MODE]  accept one PUT; MODE: ok (200, then the
                                   frames into OUT), "404", "500", close
                                   (close at once), endless (a head that
                                   never ends), relay:HOST:PORT (answer
                                   Transfer-encoding: nbd and relay bytes
                                   to that NBD server)
  send-chunked HOST PORT IN [--put PATH] [--skip-zero] [--bad KIND]
               [--slow]            send IN as frames of at most 2 MiB;
                                   --put: the HTTP request first (the
                                   answer must be 2xx without nbd); KIND:
                                   beyond, huge, trunc-header, no-end,
                                   trunc-data, stall (1000 bytes of a
                                   frame, then 8 s of silence); --slow:
                                   16 KiB every 50 ms
  send-raw HOST PORT WHAT          send a bad HTTP head: garbage, big-head,
                                   te, raw-body:FILE, and print the answer
  decode IN OUT                    turn a frame stream file into OUT
  progress                         parse sparse_dd -machine frames on stdin,
                                   print the percentages (those read when
                                   it stops early too), exit 1 unless the
                                   stream ends with the end header
"""
import os
import socket
import struct
import sys
import threading
import time

FRAME_MAX = 2 << 20
HDR = struct.Struct("<QI")


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            return bytes(buf)
        buf += b
    return bytes(buf)


def read_frames(read, out_fd, size):
    """Reads frames with read(n) into out_fd. Returns (frames, bytes)."""
    frames = total = 0
    while True:
        h = read(12)
        if len(h) != 12:
            raise SystemExit("stream ended without the end marker "
                             "(%d of 12 header bytes)" % len(h))
        off, ln = HDR.unpack(h)
        if ln == 0:
            return frames, total
        if off + ln > size:
            raise SystemExit("frame at %d len %d is beyond %d" %
                             (off, ln, size))
        if off % 512 or (ln % 512 and off + ln != size):
            raise SystemExit("frame at %d len %d is not 512-aligned" %
                             (off, ln))
        if ln > FRAME_MAX:
            raise SystemExit("frame of %d bytes is over 2 MiB" % ln)
        data = read(ln)
        if len(data) != ln:
            raise SystemExit("frame at %d truncated" % off)
        os.pwrite(out_fd, data, off)
        frames += 1
        total += ln


def listen(port, ready):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", int(port)))
    ls.listen(4)
    with open(ready, "w") as f:
        f.write("ready\n")
    c, _ = ls.accept()
    ls.close()
    return c


def read_head(c):
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        b = c.recv(1)
        if not b:
            raise SystemExit("the request head ended early: %r" % head)
        head += b
        if len(head) > 65536:
            raise SystemExit("request head too long")
    return head.decode("latin-1")


def cmd_recv_chunked(port, out, ready):
    c = listen(port, ready)
    fd = os.open(out, os.O_WRONLY)
    frames, total = read_frames(lambda n: recv_exact(c, n), fd,
                                os.fstat(fd).st_size)
    os.fsync(fd)
    print("ok %d frames %d bytes" % (frames, total))


def relay(a, b):
    def pump(x, y):
        try:
            while True:
                d = x.recv(1 << 20)
                if not d:
                    break
                y.sendall(d)
        except OSError:
            pass
        for s in (y,):
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
    t = threading.Thread(target=pump, args=(b, a))
    t.start()
    pump(a, b)
    t.join()


def cmd_http_recv(port, out, ready, mode="ok"):
    c = listen(port, ready)
    if mode == "close":
        c.close()
        return
    head = read_head(c)
    lines = head.split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for l in lines[1:]:
        if l:
            k, v = l.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    print("request: %s %s" % (method, path))
    for k in sorted(headers):
        print("header: %s: %s" % (k, headers[k]))
    if method != "PUT":
        raise SystemExit("not a PUT: %s" % method)
    if "transfer-encoding" in headers or "content-length" in headers:
        raise SystemExit("the PUT carries a body framing header")
    if mode in ("404", "500"):
        reason = "Not Found" if mode == "404" else "Internal Server Error"
        c.sendall(("HTTP/1.1 %s %s\r\nContent-Length: 0\r\n\r\n" %
                   (mode, reason)).encode())
        c.close()
        return
    if mode == "endless":
        c.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(2000):
            try:
                c.sendall(b"X-Filler: 0123456789abcdef0123456789abcdef\r\n")
            except OSError:
                return
        c.close()
        return
    if mode.startswith("relay:"):
        _, host, nport = mode.split(":")
        n = socket.create_connection((host, int(nport)))
        c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-encoding: nbd\r\n\r\n")
        relay(c, n)
        print("relayed")
        return
    cookie = headers.get("cookie", "")
    if "chunked" not in path and "chunked" not in cookie:
        raise SystemExit("no chunked key in the query or the cookie")
    c.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    fd = os.open(out, os.O_WRONLY)
    frames, total = read_frames(lambda n: recv_exact(c, n), fd,
                                os.fstat(fd).st_size)
    os.fsync(fd)
    print("ok %d frames %d bytes" % (frames, total))


def send_slowly(s, data):
    for i in range(0, len(data), 16384):
        s.sendall(data[i:i + 16384])
        time.sleep(0.05)


def cmd_send_chunked(host, port, path, put=None, skip_zero=False, bad=None,
                     slow=False):
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if put:
        s.sendall(("PUT %s HTTP/1.1\r\nHost: %s\r\nCookie: chunked=true\r\n"
                   "\r\n" % (put, host)).encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            b = s.recv(1)
            if not b:
                raise SystemExit("no answer to the PUT: %r" % head)
            head += b
        status = head.split(b"\r\n")[0].decode()
        print("answer: %s" % status)
        if not status.split(" ")[1].startswith("2"):
            raise SystemExit("refused: %s" % status)
        if b"transfer-encoding: nbd" in head.lower():
            raise SystemExit("the answer wants NBD")
    size = os.path.getsize(path)
    if bad == "beyond":
        s.sendall(HDR.pack(size, 512) + b"\1" * 512 + HDR.pack(0, 0))
    elif bad == "huge":
        s.sendall(HDR.pack(0, 1 << 31) + b"\1" * 4096)
    elif bad == "trunc-header":
        s.sendall(HDR.pack(0, 512)[:6])
    elif bad == "trunc-data":
        s.sendall(HDR.pack(0, 4096) + b"\1" * 1000)
    elif bad == "stall":
        s.sendall(HDR.pack(0, 4096) + b"\1" * 1000)
        time.sleep(8)
    with open(path, "rb") as f:
        off = 0
        while bad in (None, "no-end") and off < size:
            data = f.read(FRAME_MAX)
            if not (skip_zero and data.count(0) == len(data)):
                if slow:
                    send_slowly(s, HDR.pack(off, len(data)) + data)
                else:
                    s.sendall(HDR.pack(off, len(data)) + data)
            off += len(data)
    if bad is None:
        s.sendall(HDR.pack(0, 0))
    try:
        s.shutdown(socket.SHUT_WR)
        rest = s.recv(4096)
    except OSError as e:  # the receiver gave up first (stall)
        rest = str(e).encode()
    s.close()
    if rest:
        print("after the stream: %r" % rest)


def cmd_send_raw(host, port, what):
    s = socket.create_connection((host, int(port)))
    try:
        send_raw(s, what)
    except OSError:
        pass  # the receiver may close before it has read everything
    ans = b""
    while True:
        try:
            b = s.recv(4096)
        except OSError:
            break
        if not b:
            break
        ans += b
    print(ans.split(b"\r\n")[0].decode("latin-1") if ans else "(closed)")


def send_raw(s, what):
    if what == "garbage":
        s.sendall(b"\x00\x01 this is not HTTP at all\r\n\r\n")
    elif what == "big-head":
        s.sendall(b"PUT /import_raw_vdi?vdi=disk HTTP/1.1\r\n")
        try:
            for _ in range(1000):
                s.sendall(b"X-Filler: 0123456789abcdef0123456789abcdef\r\n")
        except OSError:
            pass
    elif what == "te":
        s.sendall(b"PUT /import_raw_vdi?vdi=disk&chunked=1 HTTP/1.1\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
    elif what.startswith("raw-body:"):
        data = open(what[9:], "rb").read()
        s.sendall(b"PUT /import_raw_vdi?vdi=disk&format=raw HTTP/1.1\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data))
        s.sendall(data)
    elif what.startswith("path:"):
        s.sendall(("PUT %s HTTP/1.1\r\nCookie: chunked=true\r\n\r\n" %
                   what[5:]).encode())
    s.shutdown(socket.SHUT_WR)


def cmd_decode(inp, out):
    fd = os.open(out, os.O_WRONLY)
    with open(inp, "rb") as f:
        frames, total = read_frames(f.read, fd, os.fstat(fd).st_size)
        if f.read(1):
            raise SystemExit("bytes after the end marker")
    print("ok %d frames %d bytes" % (frames, total))


def cmd_progress():
    r = sys.stdin.buffer
    seen = []
    while True:
        h = r.read(12)
        if len(h) != 12:
            print(" ".join(str(p) for p in seen))
            raise SystemExit("progress stream without its end header")
        off, ln = HDR.unpack(h)
        if ln == 0:
            break
        text = r.read(ln).decode()
        if not text.startswith("Progress: "):
            raise SystemExit("not a progress frame: %r" % text)
        seen.append(int(text[10:]))
    if r.read(1):
        raise SystemExit("bytes after the end header")
    print(" ".join(str(p) for p in seen))


def main(a):
    if a[0] == "recv-chunked":
        cmd_recv_chunked(*a[1:4])
    elif a[0] == "http-recv":
        cmd_http_recv(*a[1:5])
    elif a[0] == "send-chunked":
        put = a[a.index("--put") + 1] if "--put" in a else None
        bad = a[a.index("--bad") + 1] if "--bad" in a else None
        cmd_send_chunked(a[1], a[2], a[3], put, "--skip-zero" in a, bad,
                         "--slow" in a)
    elif a[0] == "send-raw":
        cmd_send_raw(*a[1:4])
    elif a[0] == "decode":
        cmd_decode(a[1], a[2])
    elif a[0] == "progress":
        cmd_progress()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
