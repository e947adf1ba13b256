"""rawnbd: a deliberately naive NBD client over raw sockets, for bad-input
tests. It can send any bytes, well-formed or not, and reads replies without
trusting them. No NBD library is used on purpose: the point is to send what
real clients never would.

Also holds the harness every hostile test shares: starting the server under
test, checking it is still alive and still serving, and finding the log line
it wrote about a given client.

Test scripts exit 0 (pass), 1 (fail) or 77 (skip); the last printed line is
the reason tests/run shows.
"""

import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time

# ---- Protocol constants (values from the NBD protocol spec) ----

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REP_MAGIC = 0x0003E889045565A9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
STRUCTURED_REPLY_MAGIC = 0x668E33EF

FLAG_FIXED_NEWSTYLE = 1
FLAG_NO_ZEROES = 2
FLAG_C_FIXED_NEWSTYLE = 1
FLAG_C_NO_ZEROES = 2

OPT_EXPORT_NAME = 1
OPT_ABORT = 2
OPT_LIST = 3
OPT_PEEK_EXPORT = 4
OPT_STARTTLS = 5
OPT_INFO = 6
OPT_GO = 7
OPT_STRUCTURED_REPLY = 8
OPT_LIST_META_CONTEXT = 9
OPT_SET_META_CONTEXT = 10
OPT_EXTENDED_HEADERS = 11

REP_ACK = 1
REP_SERVER = 2
REP_INFO = 3
REP_META_CONTEXT = 4
REP_FLAG_ERROR = 1 << 31
REP_ERR_UNSUP = REP_FLAG_ERROR | 1
REP_ERR_POLICY = REP_FLAG_ERROR | 2
REP_ERR_INVALID = REP_FLAG_ERROR | 3
REP_ERR_PLATFORM = REP_FLAG_ERROR | 4
REP_ERR_TLS_REQD = REP_FLAG_ERROR | 5
REP_ERR_UNKNOWN = REP_FLAG_ERROR | 6
REP_ERR_SHUTDOWN = REP_FLAG_ERROR | 7
REP_ERR_BLOCK_SIZE_REQD = REP_FLAG_ERROR | 8
REP_ERR_TOO_BIG = REP_FLAG_ERROR | 9

REP_NAMES = {
    REP_ACK: "ACK", REP_SERVER: "SERVER", REP_INFO: "INFO",
    REP_META_CONTEXT: "META_CONTEXT", REP_ERR_UNSUP: "ERR_UNSUP",
    REP_ERR_POLICY: "ERR_POLICY", REP_ERR_INVALID: "ERR_INVALID",
    REP_ERR_PLATFORM: "ERR_PLATFORM", REP_ERR_TLS_REQD: "ERR_TLS_REQD",
    REP_ERR_UNKNOWN: "ERR_UNKNOWN", REP_ERR_SHUTDOWN: "ERR_SHUTDOWN",
    REP_ERR_BLOCK_SIZE_REQD: "ERR_BLOCK_SIZE_REQD",
    REP_ERR_TOO_BIG: "ERR_TOO_BIG",
}

INFO_EXPORT = 0
INFO_NAME = 1
INFO_DESCRIPTION = 2
INFO_BLOCK_SIZE = 3

TF_HAS_FLAGS = 1 << 0
TF_READ_ONLY = 1 << 1
TF_SEND_FLUSH = 1 << 2
TF_SEND_FUA = 1 << 3
TF_SEND_TRIM = 1 << 5
TF_SEND_WRITE_ZEROES = 1 << 6
TF_SEND_DF = 1 << 7
TF_CAN_MULTI_CONN = 1 << 8
TF_SEND_CACHE = 1 << 10
TF_SEND_FAST_ZERO = 1 << 11

CMD_READ = 0
CMD_WRITE = 1
CMD_DISC = 2
CMD_FLUSH = 3
CMD_TRIM = 4
CMD_CACHE = 5
CMD_WRITE_ZEROES = 6
CMD_BLOCK_STATUS = 7

CMD_FLAG_FUA = 1 << 0
CMD_FLAG_NO_HOLE = 1 << 1
CMD_FLAG_DF = 1 << 2
CMD_FLAG_REQ_ONE = 1 << 3
CMD_FLAG_FAST_ZERO = 1 << 4
CMD_FLAG_PAYLOAD_LEN = 1 << 5

REPLY_FLAG_DONE = 1
REPLY_TYPE_NONE = 0
REPLY_TYPE_OFFSET_DATA = 1
REPLY_TYPE_OFFSET_HOLE = 2
REPLY_TYPE_BLOCK_STATUS = 5
REPLY_TYPE_ERROR = 0x8001
REPLY_TYPE_ERROR_OFFSET = 0x8002

EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN = (
    1, 5, 12, 22, 28, 75, 95, 108)
ERRNAMES = {0: "OK", 1: "EPERM", 5: "EIO", 12: "ENOMEM", 22: "EINVAL",
            28: "ENOSPC", 75: "EOVERFLOW", 95: "ENOTSUP", 108: "ESHUTDOWN"}

# Per-recv time limit: generous (the machine is shared and noisy), but
# bounded so that a server that hangs fails the test instead of hanging it.
IO_TIMEOUT = float(os.environ.get("HOSTILE_IO_TIMEOUT", "20"))


def repname(t):
    return REP_NAMES.get(t, "0x%08x" % t)


def errname(e):
    return ERRNAMES.get(e, str(e))


class Closed(Exception):
    """The server closed the connection (EOF or reset)."""


class Failure(Exception):
    """An assertion about the server's behaviour failed."""


def expect(cond, what):
    if not cond:
        raise Failure(what)
    log("ok: " + what)


def log(msg):
    print(msg, flush=True)


# ---- Encoders (independent of src/proto: written from the spec) ----

def opt_bytes(option, data=b"", length=None):
    """An option header and its data; length overrides the header's length
    field so that it can disagree with the data actually sent."""
    if length is None:
        length = len(data)
    return struct.pack(">QII", IHAVEOPT, option, length) + data


def info_data(name, infos=()):
    name = name.encode() if isinstance(name, str) else name
    return (struct.pack(">I", len(name)) + name +
            struct.pack(">H", len(infos)) +
            b"".join(struct.pack(">H", i) for i in infos))


def meta_data(name, queries):
    name = name.encode() if isinstance(name, str) else name
    out = struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries))
    for q in queries:
        q = q.encode() if isinstance(q, str) else q
        out += struct.pack(">I", len(q)) + q
    return out


def request_bytes(cmd, offset=0, length=0, flags=0, cookie=1,
                  magic=REQUEST_MAGIC):
    return struct.pack(">IHHQQI", magic, flags, cmd, cookie,
                       offset & 0xFFFFFFFFFFFFFFFF, length & 0xFFFFFFFF)


def full_handshake_bytes(name=b"", structured=True, meta=True):
    """Everything a well-behaved fixed-newstyle client sends up to and
    including GO, in order (as one stream, for the disconnect-at-every-byte
    test)."""
    out = struct.pack(">I", FLAG_C_FIXED_NEWSTYLE)
    if structured:
        out += opt_bytes(OPT_STRUCTURED_REPLY)
        if meta:
            out += opt_bytes(OPT_SET_META_CONTEXT,
                             meta_data(name, ["base:allocation"]))
    out += opt_bytes(OPT_GO, info_data(name, [INFO_BLOCK_SIZE, INFO_NAME]))
    return out


# ---- Connection ----

class Conn:
    """One raw connection. Methods raise Closed when the server closes."""

    def __init__(self, server, timeout=None):
        self.server = server
        self.sock = server.connect(timeout or IO_TIMEOUT)
        self.local = self.sock.getsockname()
        self.structured = False
        self.tflags = None
        self.size = None

    def client_id(self):
        """host:port of this client as the server sees it."""
        if isinstance(self.local, tuple):
            return "%s:%d" % (self.local[0], self.local[1])
        return None

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Closed("send: %s" % e)

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            except ConnectionResetError:
                raise Closed("reset after %d of %d bytes" % (len(buf), n))
            except socket.timeout:
                raise Failure("no answer from the server within %.0f s "
                              "(waiting for %d bytes, got %d)"
                              % (self.sock.gettimeout(), n, len(buf)))
            if not chunk:
                raise Closed("EOF after %d of %d bytes" % (len(buf), n))
            buf += chunk
        return bytes(buf)

    def wait_closed(self, timeout=10.0):
        """True when the server closes the connection within timeout s;
        data the server sends meanwhile is read and dropped."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return True
            except socket.timeout:
                return False
            except OSError:
                return True
            if not chunk:
                return True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    # -- handshake --

    def greeting(self, cflags=FLAG_C_FIXED_NEWSTYLE):
        g = self.recv_exact(18)
        magic, opt, hflags = struct.unpack(">QQH", g)
        if magic != NBDMAGIC or opt != IHAVEOPT:
            raise Failure("bad greeting %r" % g)
        self.hflags = hflags
        if cflags is not None:
            self.send(struct.pack(">I", cflags))
        return hflags

    def opt_reply(self):
        """One option reply: (option, type, data)."""
        h = self.recv_exact(20)
        magic, option, rtype, length = struct.unpack(">QIII", h)
        if magic != REP_MAGIC:
            raise Failure("bad option reply magic 0x%x" % magic)
        if length > 64 << 20:
            raise Failure("option reply length %d is absurd" % length)
        return option, rtype, self.recv_exact(length)

    def option(self, option, data=b"", length=None):
        """Sends an option and reads every reply up to the final one.
        Returns (final type, [(type, data) of all replies])."""
        self.send(opt_bytes(option, data, length))
        replies = []
        while True:
            o, t, d = self.opt_reply()
            if o != option:
                raise Failure("reply for option %d answers option %d"
                              % (option, o))
            replies.append((t, d))
            if t in (REP_ACK,) or t & REP_FLAG_ERROR:
                return t, replies

    def structured_reply(self):
        t, _ = self.option(OPT_STRUCTURED_REPLY)
        if t == REP_ACK:
            self.structured = True
        return t

    def go(self, name=b"", infos=(INFO_BLOCK_SIZE,), option=OPT_GO):
        """GO (or INFO); returns the final reply type and fills size,
        tflags and block sizes from the NBD_INFO replies."""
        t, replies = self.option(option, info_data(name, infos))
        for rt, d in replies:
            if rt != REP_INFO:
                continue
            itype = struct.unpack(">H", d[:2])[0]
            if itype == INFO_EXPORT:
                if len(d) != 12:
                    raise Failure("NBD_INFO_EXPORT of length %d" % len(d))
                self.size, self.tflags = struct.unpack(">QH", d[2:])
            elif itype == INFO_BLOCK_SIZE:
                if len(d) != 14:
                    raise Failure("NBD_INFO_BLOCK_SIZE of length %d" % len(d))
                self.block = struct.unpack(">III", d[2:])
        return t

    def export_name(self, name=b""):
        """EXPORT_NAME; returns (size, tflags) or raises Closed."""
        name = name.encode() if isinstance(name, str) else name
        self.send(opt_bytes(OPT_EXPORT_NAME, name))
        d = self.recv_exact(10)
        self.size, self.tflags = struct.unpack(">QH", d)
        if not self.hflags & FLAG_NO_ZEROES:
            self.recv_exact(124)
        return self.size, self.tflags

    # -- transmission --

    def request(self, cmd, offset=0, length=0, flags=0, cookie=1,
                payload=b""):
        self.send(request_bytes(cmd, offset, length, flags, cookie) + payload)

    def reply(self, cookie=None, read_len=0):
        """Reads one whole reply. Returns (error, data) where data is the
        READ payload reassembled (holes as zeroes) or block-status chunks;
        reply_form tells whether it came as a simple or structured reply,
        reply_cookie which cookie it answered (cookie None takes any).
        read_len: bytes of data a successful simple READ reply carries."""
        magic = struct.unpack(">I", self.recv_exact(4))[0]
        self.reply_form = ("simple" if magic == SIMPLE_REPLY_MAGIC
                           else "structured")
        if magic == SIMPLE_REPLY_MAGIC:
            err, ck = struct.unpack(">IQ", self.recv_exact(12))
            self.reply_cookie = ck
            if cookie is not None and ck != cookie:
                raise Failure("reply cookie %d, expected %d" % (ck, cookie))
            data = b""
            if err == 0 and read_len:
                data = self.recv_exact(read_len)
            return err, data
        if magic != STRUCTURED_REPLY_MAGIC:
            raise Failure("unknown reply magic 0x%08x" % magic)
        err = 0
        pieces = {}
        chunks = []
        while True:
            flags, rtype, ck, length = struct.unpack(">HHQI",
                                                     self.recv_exact(16))
            self.reply_cookie = ck
            if cookie is not None and ck != cookie:
                raise Failure("chunk cookie %d, expected %d" % (ck, cookie))
            payload = self.recv_exact(length)
            chunks.append((rtype, payload))
            if rtype == REPLY_TYPE_OFFSET_DATA:
                off = struct.unpack(">Q", payload[:8])[0]
                pieces[off] = payload[8:]
            elif rtype == REPLY_TYPE_OFFSET_HOLE:
                off, n = struct.unpack(">QI", payload)
                pieces[off] = bytes(n)
            elif rtype & 0x8000:
                if length < 6:
                    raise Failure("error chunk of %d bytes" % length)
                err = struct.unpack(">I", payload[:4])[0]
                if err == 0:
                    raise Failure("error chunk with error 0")
            if flags & REPLY_FLAG_DONE:
                break
            magic = struct.unpack(">I", self.recv_exact(4))[0]
            if magic != STRUCTURED_REPLY_MAGIC:
                raise Failure("chunk magic 0x%08x mid-reply" % magic)
        data = b"".join(pieces[k] for k in sorted(pieces))
        self.chunks = chunks
        return err, data

    def do(self, cmd, offset=0, length=0, flags=0, cookie=None, payload=b""):
        """One request, one reply: returns (error, data)."""
        if cookie is None:
            cookie = int.from_bytes(os.urandom(8), "big")
        self.request(cmd, offset, length, flags, cookie, payload)
        return self.reply(cookie, length if cmd == CMD_READ else 0)

    def starttls(self, cafile):
        """STARTTLS, then the TLS handshake (X.509, the server's name
        checked as localhost); everything after runs inside TLS."""
        t, _ = self.option(OPT_STARTTLS)
        expect_rep(t, REP_ACK, "STARTTLS")
        ctx = ssl.create_default_context(cafile=cafile)
        self.sock = ctx.wrap_socket(self.sock, server_hostname="localhost")

    def open_export(self, name=b"", structured=True, meta=False,
                    tls_ca=None):
        """Greeting, STARTTLS when tls_ca (a CA certificate file) is given,
        optional STRUCTURED_REPLY and SET_META_CONTEXT, GO."""
        self.greeting()
        if tls_ca:
            self.starttls(tls_ca)
        if structured:
            expect_rep(self.structured_reply(), REP_ACK, "STRUCTURED_REPLY")
        if meta:
            t, _ = self.option(OPT_SET_META_CONTEXT,
                               meta_data(name, ["base:allocation"]))
            expect_rep(t, REP_ACK, "SET_META_CONTEXT base:allocation")
        expect_rep(self.go(name), REP_ACK, "GO %r" % (name,))
        return self


def expect_rep(got, want, what):
    if got != want:
        raise Failure("%s: reply %s, expected %s"
                      % (what, repname(got), repname(want)))


def expect_err(got, want, what):
    wants = want if isinstance(want, (tuple, list)) else (want,)
    if got not in wants:
        raise Failure("%s: error %s, expected %s" % (
            what, errname(got), " or ".join(errname(w) for w in wants)))
    log("ok: %s -> %s" % (what, errname(got)))


# ---- Server under test ----

def make_pki(directory):
    """X.509 files for a TLS server and its clients in directory/pki (the
    layout of tests/integration/tls-pki.inc, which makes them); returns
    that path. Exits 77 (skip) when certtool is missing."""
    integ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                         "..", "integration")
    r = subprocess.run(
        ["bash", "-c", '. "$0/lib.sh" && . "$0/tls-pki.inc" && '
         'pki_ca "$1/ca" "hostile tests CA" && pki_dir "$1/ca" "$1/pki"',
         integ, directory], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    if r.returncode == 77:
        print(r.stdout.strip().splitlines()[-1])
        sys.exit(77)
    if r.returncode != 0:
        raise Failure("making certificates: %s" % r.stdout.strip())
    return os.path.join(directory, "pki")


def free_port(host="127.0.0.1"):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


class UnixServer:
    """A server someone else started, on a Unix socket: Conn(UnixServer(path))
    for shell tests that drive a few raw requests."""

    def __init__(self, path):
        self.path = path

    def connect(self, timeout=IO_TIMEOUT):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        s.connect(self.path)
        return s


class Server:
    """nbdflow serve on a free loopback port, stderr captured to a file.

    With HOSTILE_PEER=nbdkit the same tests run against nbdkit's memory
    plugin instead (to check the client itself against a reference server;
    server-specific checks such as log lines are then skipped)."""

    def __init__(self, exports, extra=()):
        self.tmp = tempfile.mkdtemp(prefix="nbdflow-hostile.")
        self.logpath = os.path.join(self.tmp, "serve.log")
        self.pidfile = os.path.join(self.tmp, "serve.pid")
        self.peer = os.environ.get("HOSTILE_PEER", "")
        self.proc = None
        for _ in range(3):
            self.port = free_port()
            if self.peer == "nbdkit":
                argv = ["nbdkit", "-f", "-p", str(self.port),
                        "-i", "127.0.0.1", "-P", self.pidfile, "memory",
                        exports[0].split(":", 1)[1].split("=")[-1]]
            else:
                binary = os.environ.get("NBDFLOW")
                if not binary:
                    here = os.path.dirname(os.path.abspath(__file__))
                    binary = os.path.join(here, "..", "..", "..", "build",
                                          "nbdflow")
                if not os.access(binary, os.X_OK):
                    raise Failure("NBDFLOW=%s is not an executable" % binary)
                argv = ([binary, "serve", "--listen",
                         "127.0.0.1:%d" % self.port, "--pidfile",
                         self.pidfile] + list(extra) + list(exports))
            self.argv = argv
            self.logf = open(self.logpath, "ab")
            self.proc = subprocess.Popen(argv, stdout=self.logf,
                                         stderr=self.logf,
                                         stdin=subprocess.DEVNULL)
            if self._wait_ready():
                log("server %d ready: %s" % (self.proc.pid, " ".join(argv)))
                return
            if "in use" not in self.log_text():
                break
        raise Failure("server did not start: %s\n%s"
                      % (" ".join(self.argv), self.log_text()))

    def _wait_ready(self):
        for _ in range(200):
            try:
                if os.path.getsize(self.pidfile) > 0:
                    return True
            except OSError:
                pass
            if self.proc.poll() is not None:
                return False
            time.sleep(0.1)
        raise Failure("server not ready after 20 s")

    def connect(self, timeout=IO_TIMEOUT):
        s = socket.create_connection(("127.0.0.1", self.port),
                                     timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def alive(self):
        return self.proc.poll() is None

    def log_text(self):
        try:
            with open(self.logpath, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def vm_size_kib(self):
        """The server's virtual size (VmSize, KiB): a 4 GiB allocation
        shows here even when its pages are never touched."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1])
        return 0

    def logged_about(self, client_id, timeout=5.0, pattern=None):
        """Lines of the server log naming client_id (host:port), waiting
        up to timeout s for one to appear."""
        if self.peer:
            return ["(peer server: log not checked)"]
        host, port = client_id.rsplit(":", 1)
        rx = re.compile(r"(^|[^0-9])(%s|\[%s\]):%s($|[^0-9])"
                        % (re.escape(host), re.escape(host), port))
        deadline = time.monotonic() + timeout
        while True:
            lines = [l for l in self.log_text().splitlines() if rx.search(l)]
            if pattern:
                lines = [l for l in lines if re.search(pattern, l, re.I)]
            if lines or time.monotonic() > deadline:
                return lines
            time.sleep(0.1)

    def stop(self):
        """SIGTERM; returns the exit status (None if it had to be killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode

    def cleanup(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        try:
            self.logf.close()
        except Exception:
            pass
        for f in os.listdir(self.tmp):
            os.unlink(os.path.join(self.tmp, f))
        os.rmdir(self.tmp)


def still_serving(server, name=b"", what=""):
    """Asserts the server is alive and a fresh well-behaved client can do a
    full handshake, WRITE 4 KiB, READ it back and disconnect cleanly."""
    if not server.alive():
        raise Failure("server died%s (exit status %s)"
                      % (" after " + what if what else "",
                         server.proc.returncode))
    c = Conn(server)
    try:
        c.open_export(name, structured=True)
        pattern = os.urandom(4096)
        if not c.tflags & TF_READ_ONLY and c.size >= 8192:
            err, _ = c.do(CMD_WRITE, 4096, 4096, payload=pattern)
            expect_err(err, 0, "fresh client WRITE")
            err, data = c.do(CMD_READ, 4096, 4096)
            expect_err(err, 0, "fresh client READ")
            if data != pattern:
                raise Failure("fresh client read back other bytes")
        else:
            err, data = c.do(CMD_READ, 0, 512)
            expect_err(err, 0, "fresh client READ")
        c.request(CMD_DISC)
    finally:
        c.close()
    log("ok: server alive and serving%s" % (" after " + what if what else ""))


def check_logged(server, client_id, what, pattern=None):
    lines = server.logged_about(client_id, pattern=pattern)
    if not lines:
        raise Failure("server logged no line naming client %s (%s)%s"
                      % (client_id, what,
                         " matching /%s/" % pattern if pattern else ""))
    log("ok: logged for %s: %s" % (what, lines[-1].strip()))


def expect_refused(server, what):
    """A new connection is closed without a greeting (--max-connections),
    and the server logs a line naming it."""
    extra = Conn(server)
    cid = extra.client_id()
    try:
        extra.greeting()
        raise Failure("%s was served" % what)
    except Closed:
        log("ok: %s refused" % what)
    finally:
        extra.close()
    check_logged(server, cid, "refused connection", pattern="max-connections")


def expect_exit_zero(server, after):
    """The server exits within 10 s, with status 0."""
    try:
        server.proc.wait(10)
    except subprocess.TimeoutExpired:
        raise Failure("server still running 10 s after %s" % after)
    expect(server.proc.returncode == 0, "exit status 0 (got %s)"
           % server.proc.returncode)


def run(main, exports=("memory:1M",), extra=()):
    """Runs main(server) with a fresh server; turns Failure into exit 1 and
    prints the server log on failure."""
    server = None
    rc = 1
    try:
        server = Server(list(exports), extra)
        main(server)
        status = server.stop()
        if status is None:
            raise Failure("server ignored SIGTERM for 10 s")
        if status != 0:
            raise Failure("server exited with status %d after SIGTERM"
                          % status)
        rc = 0
    except Failure as e:
        log("--- server log:")
        if server is not None:
            log(server.log_text()[-8000:])
        log("FAIL: %s" % e)
    except Closed as e:
        log("--- server log:")
        if server is not None:
            log(server.log_text()[-8000:])
        log("FAIL: unexpected disconnect: %s" % e)
    finally:
        if server is not None:
            server.cleanup()
    sys.exit(rc)
