"""nbdmini.py: a small blocking NBD client for the tests, written from the
NBD protocol specification (fixed newstyle handshake, NBD_OPT_GO, simple
replies), independent of nbdflow's C code. It sends what stock clients
do not: writes, zeroes and trims of any alignment, whatever minimum block
size the server advertises, so that a test reaches the server's own
read-modify-write. Python 3 standard library only.

    import nbdmini
    c = nbdmini.Conn("/path/to.sock")      # default export
    c = nbdmini.Conn(path, agree_sizes=True)  # asks for the block sizes
    c.write(off, data, fua=False); c.read(off, n); c.flush()
    c.zero(off, n, no_hole=False); c.trim(off, n); c.close()
    c.size, c.flags, c.min_block, c.pref_block, c.max_block
"""

import socket
import struct

NBDMAGIC = b"NBDMAGIC"
IHAVEOPT = b"IHAVEOPT"
OPT_REPLY_MAGIC = 0x3E889045565A9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
OPT_GO = 7
REP_ACK = 1
REP_INFO = 3
INFO_EXPORT = 0
INFO_BLOCK_SIZE = 3
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM = 0, 1, 2, 3, 4
CMD_WRITE_ZEROES = 6
FLAG_FUA, FLAG_NO_HOLE = 1, 2


class NBDError(Exception):
    def __init__(self, what, errno_):
        super().__init__("%s: NBD error %d" % (what, errno_))
        self.errno = errno_


class Conn:
    def __init__(self, sock_path, name=b"", agree_sizes=False):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(sock_path)
        self.cookie = 0
        self.min_block, self.pref_block, self.max_block = 1, 4096, 32 << 20
        hello = self._recv(18)
        if hello[:16] != NBDMAGIC + IHAVEOPT:
            raise IOError("not a newstyle NBD server: %r" % hello[:16])
        self.s.sendall(struct.pack(">I", 1 | 2))  # FIXED_NEWSTYLE, NO_ZEROES
        # By default no information is requested: a client that does not
        # ask for the block sizes may send any alignment (the server still
        # says them). agree_sizes asks for them, and so commits to them.
        reqs = struct.pack(">HH", 1, INFO_BLOCK_SIZE) if agree_sizes \
            else struct.pack(">H", 0)
        data = struct.pack(">I", len(name)) + name + reqs
        self.s.sendall(IHAVEOPT + struct.pack(">II", OPT_GO, len(data)) + data)
        self.size = None
        while True:
            magic, opt, rtype, rlen = struct.unpack(">QIII", self._recv(20))
            body = self._recv(rlen)
            if magic != OPT_REPLY_MAGIC or opt != OPT_GO:
                raise IOError("bad option reply")
            if rtype & 0x80000000:
                raise IOError("NBD_OPT_GO refused: %d %r" % (rtype, body))
            if rtype == REP_ACK:
                break
            if rtype == REP_INFO:
                (itype,) = struct.unpack(">H", body[:2])
                if itype == INFO_EXPORT:
                    self.size, self.flags = struct.unpack(">QH", body[2:12])
                elif itype == INFO_BLOCK_SIZE:
                    (self.min_block, self.pref_block,
                     self.max_block) = struct.unpack(">III", body[2:14])
        if self.size is None:
            raise IOError("no export size")

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            got = self.s.recv(n - len(buf))
            if not got:
                raise ConnectionError("server closed the connection")
            buf += got
        return bytes(buf)

    def _cmd(self, what, ctype, off, length, flags=0, payload=b"", rlen=0):
        self.cookie += 1
        self.s.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, flags, ctype,
                                   self.cookie, off, length) + payload)
        magic, err, cookie = struct.unpack(">IIQ", self._recv(16))
        if magic != SIMPLE_REPLY_MAGIC or cookie != self.cookie:
            raise IOError("bad reply to %s" % what)
        if err:
            raise NBDError(what, err)
        return self._recv(rlen) if rlen else b""

    def read(self, off, n):
        return self._cmd("read", CMD_READ, off, n, rlen=n)

    def write(self, off, data, fua=False):
        self._cmd("write", CMD_WRITE, off, len(data), FLAG_FUA if fua else 0,
                  bytes(data))

    def flush(self):
        self._cmd("flush", CMD_FLUSH, 0, 0)

    def trim(self, off, n):
        self._cmd("trim", CMD_TRIM, off, n)

    def zero(self, off, n, no_hole=False, fua=False):
        self._cmd("zero", CMD_WRITE_ZEROES, off, n,
                  (FLAG_NO_HOLE if no_hole else 0) | (FLAG_FUA if fua else 0))

    def close(self):
        try:
            self.s.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_DISC,
                                       0, 0, 0))
        except OSError:
            pass
        self.s.close()
