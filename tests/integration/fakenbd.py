#!/usr/bin/env python3
"""fakenbd.py SOCKET MODE SIZE: a small NBD server on a Unix socket
(read-only but in zerocap mode) that misbehaves on purpose, for testing
what nbdflow's client accepts. It serves SIZE bytes of a fixed pattern (byte i is
(i * 7 + i // 4096) mod 256), speaks fixed newstyle with GO, structured
replies and base:allocation, and exits after 60 s without a connection.

Modes (what READ replies and the handshake do):
  good        every READ answered by one data chunk
  reverse     data chunks of 4 KiB, last piece first (allowed by the spec)
  scatter     data chunks of 4 KiB, odd pieces first, then even ones
  overlap     the first half of each READ sent twice, the second half never
  badexport   NBD_INFO_EXPORT of 13 bytes instead of 12
  badblock    NBD_INFO_BLOCK_SIZE of 15 bytes instead of 14
  shortstatus BLOCK_STATUS describes at most 1001 bytes (all data)
  laterstatus BLOCK_STATUS at offset 0 describes 1001 bytes (data); any
              later one fails with EIO
  twostatus   BLOCK_STATUS answered by two chunks for the same context
  otherctx    BLOCK_STATUS answered only by a chunk for context 2, which
              was never selected: none for base:allocation (context 1)
  pastend     BLOCK_STATUS answered by the request's length, then two
              more extents of 4 KiB: the first two already cover it
  nostatus    BLOCK_STATUS never answered (the connection stays open)
  evilerror   READ fails with EIO and a message holding a newline and a
              terminal escape
  evilnames   NBD_INFO_NAME, NBD_INFO_DESCRIPTION and a LIST name that
              hold newlines, terminal escapes, a C1 control (UTF-8),
              bytes that are not UTF-8 and a real UTF-8 letter
  nulname     NBD_INFO_NAME and the LIST name hold a NUL byte, which
              the spec forbids in a string
  longlist    LIST answered with a name of 5000 bytes (a string MUST be
              at most 4096)
  manylist    LIST answered with 4097 names of 4096 bytes (16 MiB in all)
  stray       READ answered by a data chunk whose cookie is the request's
              with bits 48-55 flipped: a reply to no request in flight
  extmagic    READ answered by a 16-byte header with the extended reply
              magic (DONE, NONE), though extended headers were not asked
  extgood     agrees to extended headers and then follows them: 32-byte
              requests, extended reply chunks, BLOCK_STATUS_EXT (a reading
              client's whole session, from a second implementation)
  extsimple   agrees to extended headers, then answers READ with a
              16-byte simple reply (EIO), and nothing more
  extoffset   agrees to extended headers; READ replies carry the request's
              offset plus one in their header
  extstatus32 agrees to extended headers, then answers BLOCK_STATUS with
              a compact NBD_REPLY_TYPE_BLOCK_STATUS chunk
  extnogo     agrees to extended headers, then answers GO with ERR_UNSUP;
              an EXPORT_NAME after that (which the client MUST NOT send
              once extended headers are agreed) is logged on stdout as
              "export_name" and answered as an old server would
  metaerr     SET_META_CONTEXT replies base:allocation, then fails with
              ERR_TOO_BIG (no context is set then); BLOCK_STATUS gets
              EINVAL, as from a server without a context
  erroffend   READ fails with an ERROR_OFFSET chunk whose offset is the
              request's end, just outside it
  errmsglen   READ fails with an error chunk of an unknown type whose
              message length runs past the chunk
  noflags     transmission flags READ_ONLY, SEND_FLUSH and SEND_FUA
              without NBD_FLAG_HAS_FLAGS, which "MUST always be 1"
  gounknown   GO answered with ERR_UNKNOWN ("no such export")
  earlywrite  writable; each WRITE is refused with ENOSPC before its
              payload is read (the payload is read and dropped after)
  shutdown    every option but ABORT answered with ERR_SHUTDOWN
  zerocap     writable, starting as bytes 0xAA (not the pattern): WRITE
              stores, WRITE_ZEROES longer than the maximum block size
              gets EOVERFLOW (the spec allows it), shorter ones zero; each
              WRITE_ZEROES is logged on stdout as "zero LENGTH ok|refused"

In every mode an NBD_OPT_ABORT is logged on stdout as "abort" before its
ACK. The environment variables FAKE_MIN and FAKE_MAX set the minimum and
maximum block sizes advertised (default 1 and 32 MiB); requests that
break the minimum get EINVAL. FAKE_CLOSE_AFTER=N (zerocap mode) closes a
connection right after answering its Nth WRITE, FAKE_ZERO_DELAY_MS=N
waits N ms before answering each WRITE_ZEROES. FAKE_ACCEPT_ONCE=1
advertises multi-conn, accepts one connection and no other: its
listener's queue is kept full, so later connects wait.
"""
import os
import struct
import sys
import threading
import time

from unixserve import accept_loop, listen, recv_exact  # beside this file

PATH, MODE, SIZE = sys.argv[1], sys.argv[2], int(sys.argv[3])
PIECE = 4096
MIN = int(os.environ.get("FAKE_MIN", "1"))
MAX = int(os.environ.get("FAKE_MAX", str(1 << 25)))
CLOSE_AFTER = int(os.environ.get("FAKE_CLOSE_AFTER", "0"))
ZERO_DELAY = float(os.environ.get("FAKE_ZERO_DELAY_MS", "0")) / 1000
ACCEPT_ONCE = os.environ.get("FAKE_ACCEPT_ONCE") == "1"

OPT_MAGIC = 0x3e889045565a9
REPLY_STRUCT = 0x668e33ef
REPLY_SIMPLE = 0x67446698
TFLAGS = 1 | 2 | 4 | 8  # HAS_FLAGS READ_ONLY SEND_FLUSH SEND_FUA
if MODE in ("zerocap", "earlywrite"):
    TFLAGS = 1 | 4 | 8 | 64  # writable, SEND_WRITE_ZEROES
if MODE == "noflags":
    TFLAGS = 2 | 4 | 8
if ACCEPT_ONCE:
    TFLAGS |= 256  # CAN_MULTI_CONN
EXT = MODE in ("extgood", "extsimple", "extoffset", "extstatus32", "extnogo")
DISK = (bytearray(b"\xaa") * SIZE if MODE in ("zerocap", "earlywrite")
        else None)
LOCK = threading.Lock()
EVIL_NAME = b"name\x1b[2J\nforged: \"name"
EVIL_DESC = b"desc\x1b]0;title\x07 \xc2\x9b31m\\ \xff\xc3 caf\xc3\xa9"
EVIL_LIST = b"list\x1b[31m\r\nforged: list"
NUL_NAME = b"shown\x00hidden"


def pattern(off, n):
    if DISK is not None:
        return bytes(DISK[off:off + n])
    return bytes(((i * 7 + i // 4096) & 0xFF) for i in range(off, off + n))


def opt_reply(s, opt, typ, data=b""):
    s.sendall(struct.pack(">QIII", OPT_MAGIC, opt, typ, len(data)) + data)


def chunk(s, flags, typ, cookie, data):
    s.sendall(struct.pack(">IHHQI", REPLY_STRUCT, flags, typ, cookie,
                          len(data)) + data)


def data_chunk(s, cookie, off, data, done=False):
    chunk(s, 1 if done else 0, 1, cookie, struct.pack(">Q", off) + data)


def answer_read(s, cookie, off, n):
    if MODE == "evilerror":
        msg = b"disk on fire\n\x1b[2Jforged: all is well"
        chunk(s, 1, 0x8001, cookie, struct.pack(">IH", 5, len(msg)) + msg)
        return
    if MODE == "extmagic":
        s.sendall(struct.pack(">IHHQ", 0x6E8A278C, 1, 0, cookie))
        return
    if MODE == "stray":
        data_chunk(s, cookie ^ (0x5A << 48), off, pattern(off, n), True)
        return
    if MODE == "erroffend":
        msg = b"bad sector"
        chunk(s, 1, 0x8002, cookie,
              struct.pack(">IH", 5, len(msg)) + msg + struct.pack(">Q", off + n))
        return
    if MODE == "errmsglen":
        chunk(s, 1, 0x8005, cookie, struct.pack(">IH", 5, 100) + b"short")
        return
    pieces = [(o, min(PIECE, off + n - o)) for o in range(off, off + n, PIECE)]
    if MODE == "reverse":
        pieces.reverse()
    elif MODE == "scatter":
        pieces = pieces[1::2] + pieces[0::2]
    elif MODE == "overlap" and n >= 2:
        half = n // 2
        data_chunk(s, cookie, off, pattern(off, half))
        pieces = [(off, half)]  # again, and the second half never
    else:
        pieces = [(off, n)]
    for o, k in pieces:
        data_chunk(s, cookie, o, pattern(o, k))
    chunk(s, 1, 0, cookie, b"")  # NBD_REPLY_TYPE_NONE with DONE


def xchunk(s, flags, typ, cookie, off, data):
    """One extended reply chunk: its header carries the request's offset."""
    s.sendall(struct.pack(">IHHQQQ", 0x6E8A278C, flags, typ, cookie, off,
                          len(data)) + data)


def serve_ext(s):
    """Transmission with extended headers: READ and BLOCK_STATUS, the
    modes' faults, everything else EINVAL."""
    while True:
        magic, flags, typ, cookie, off, n = struct.unpack(
            ">IHHQQQ", recv_exact(s, 32))
        if magic != 0x21E41C71 or typ == 2:  # not extended, or DISC
            return
        if off % MIN or n % MIN or off + n > SIZE:
            xchunk(s, 1, 0x8001, cookie, off, struct.pack(">IH", 22, 0))
        elif typ == 0 and MODE == "extsimple":
            s.sendall(struct.pack(">IIQ", REPLY_SIMPLE, 5, cookie))
        elif typ == 0:  # READ: one data chunk, then NONE with DONE
            hoff = off + 1 if MODE == "extoffset" else off
            xchunk(s, 0, 1, cookie, hoff,
                   struct.pack(">Q", off) + pattern(off, n))
            xchunk(s, 1, 0, cookie, hoff, b"")
        elif typ == 7 and MODE == "extstatus32":
            xchunk(s, 1, 5, cookie, off, struct.pack(">III", 1, n, 0))
        elif typ == 7:  # BLOCK_STATUS_EXT: all data, one descriptor
            xchunk(s, 1, 6, cookie, off, struct.pack(">IIQQ", 1, 1, n, 0))
        else:
            xchunk(s, 1, 0x8001, cookie, off, struct.pack(">IH", 22, 0))


def handshake(s):
    """Returns True when extended headers were agreed."""
    ext = False
    s.sendall(struct.pack(">QQH", 0x4e42444d41474943, 0x49484156454F5054, 1))
    recv_exact(s, 4)  # client flags
    while True:
        _, opt, n = struct.unpack(">QII", recv_exact(s, 16))
        recv_exact(s, n)
        if opt == 2:  # ABORT
            print("abort", flush=True)
            opt_reply(s, opt, 1)
            raise EOFError
        if MODE == "shutdown":
            opt_reply(s, opt, (1 << 31) + 7, b"going down")  # ERR_SHUTDOWN
        elif opt == 7 and MODE == "extnogo":
            opt_reply(s, opt, (1 << 31) + 1)  # ERR_UNSUP
        elif opt == 1 and MODE == "extnogo":  # EXPORT_NAME
            print("export_name", flush=True)
            s.sendall(struct.pack(">QH", SIZE, TFLAGS) + bytes(124))
            return ext
        elif opt == 7 and MODE == "gounknown":
            opt_reply(s, opt, (1 << 31) + 6, b"no such export")  # UNKNOWN
        elif opt == 11 and EXT:  # EXTENDED_HEADERS
            opt_reply(s, opt, 1)
            ext = True
        elif opt == 8:  # STRUCTURED_REPLY
            opt_reply(s, opt, 1)
        elif opt == 10:  # SET_META_CONTEXT
            opt_reply(s, opt, 4, struct.pack(">I", 1) + b"base:allocation")
            opt_reply(s, opt, (1 << 31) + 9 if MODE == "metaerr" else 1)
        elif opt in (6, 7):  # INFO, GO
            info = struct.pack(">HQH", 0, SIZE, TFLAGS)
            opt_reply(s, opt, 3, info + (b"x" if MODE == "badexport" else b""))
            if MODE == "evilnames":
                opt_reply(s, opt, 3, struct.pack(">H", 1) + EVIL_NAME)
                opt_reply(s, opt, 3, struct.pack(">H", 2) + EVIL_DESC)
            if MODE == "nulname":
                opt_reply(s, opt, 3, struct.pack(">H", 1) + NUL_NAME)
            block = struct.pack(">HIII", 3, MIN, max(MIN, 4096), MAX)
            opt_reply(s, opt, 3, block + (b"x" if MODE == "badblock" else b""))
            opt_reply(s, opt, 1)
            if opt == 7:
                return ext
        elif opt == 3 and MODE in ("longlist", "manylist"):  # LIST
            # One name longer than a string may be, or 4097 of the
            # longest, 16 MiB and more in all.
            n, ln = (1, 5000) if MODE == "longlist" else (4097, 4096)
            for i in range(n):
                name = (b"%05d" % i) + b"x" * (ln - 5)
                opt_reply(s, opt, 2, struct.pack(">I", len(name)) + name)
            opt_reply(s, opt, 1)
        elif opt == 3 and MODE in ("evilnames", "nulname"):  # LIST
            name = EVIL_LIST if MODE == "evilnames" else NUL_NAME
            opt_reply(s, opt, 2, struct.pack(">I", len(name)) + name)
            opt_reply(s, opt, 1)
        else:
            opt_reply(s, opt, (1 << 31) + 1)  # ERR_UNSUP


def serve(s):
    writes = 0
    try:
        if handshake(s):
            serve_ext(s)
            return
        while True:
            _, flags, typ, cookie, off, n = struct.unpack(
                ">IHHQQI", recv_exact(s, 28))
            if typ == 2:  # DISC
                return
            payload = b""
            if typ == 1 and MODE == "earlywrite":
                s.sendall(struct.pack(">IIQ", REPLY_SIMPLE, 28, cookie))
                recv_exact(s, n)
                continue
            if typ == 1 and DISK is not None:  # WRITE: its payload first
                payload = recv_exact(s, n)
            if off % MIN or n % MIN or off + n > SIZE:
                s.sendall(struct.pack(">IIQ", REPLY_SIMPLE, 22, cookie))
            elif typ == 0:
                answer_read(s, cookie, off, n)
            elif typ == 7 and MODE == "nostatus":
                continue  # never answered
            elif typ == 7 and MODE == "laterstatus" and off > 0:
                s.sendall(struct.pack(">IIQ", REPLY_SIMPLE, 5, cookie))
            elif typ == 7 and MODE == "metaerr":
                s.sendall(struct.pack(">IIQ", REPLY_SIMPLE, 22, cookie))
            elif typ == 7 and MODE == "otherctx":
                chunk(s, 1, 5, cookie, struct.pack(">III", 2, n, 0))
            elif typ == 7 and MODE == "pastend":
                chunk(s, 1, 5, cookie, struct.pack(">IIIIIII", 1, n, 0,
                                                   4096, 3, 4096, 0))
            elif typ == 7:  # BLOCK_STATUS: all data
                short = MODE in ("shortstatus", "laterstatus")
                k = min(n, 1001) if short else n
                if MODE == "twostatus":
                    chunk(s, 0, 5, cookie, struct.pack(">III", 1, k, 0))
                chunk(s, 1, 5, cookie, struct.pack(">III", 1, k, 0))
            elif typ == 3:  # FLUSH
                s.sendall(struct.pack(">IIQ", REPLY_SIMPLE, 0, cookie))
            elif typ == 1 and DISK is not None:  # WRITE
                with LOCK:
                    DISK[off:off + n] = payload
                s.sendall(struct.pack(">IIQ", REPLY_SIMPLE, 0, cookie))
                writes += 1
                if writes == CLOSE_AFTER:
                    return
            elif typ == 6 and DISK is not None:  # WRITE_ZEROES
                ok = n <= MAX
                time.sleep(ZERO_DELAY)
                if ok:
                    with LOCK:
                        DISK[off:off + n] = bytes(n)
                print("zero %d %s" % (n, "ok" if ok else "refused"),
                      flush=True)
                s.sendall(struct.pack(">IIQ", REPLY_SIMPLE, 0 if ok else 75,
                                      cookie))
            else:
                s.sendall(struct.pack(">IIQ", REPLY_SIMPLE, 22, cookie))
    except (EOFError, OSError):
        pass
    finally:
        s.close()


def accept_once(ls):
    from fullqueue import fill  # beside this file
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
    keep = fill(ls)  # the queue stays full: later connects wait
    time.sleep(60)
    del keep


def main():
    ls = listen(PATH)
    if ACCEPT_ONCE:
        ls.listen(0)
        accept_once(ls)
        return
    accept_loop(ls, serve)


main()
