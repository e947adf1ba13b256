#!/usr/bin/env python3
"""mutnbd.py SOCKET SEED SIZE: an NBD server on a Unix socket that damages
exactly one message of what it sends, chosen by SEED, for testing that the
client either fails cleanly or copies exactly the right bytes.
mutnbd.py --pattern FILE SIZE: writes the SIZE bytes it serves to FILE.

mutnbd.py --many SOCKET SIZE: the same for one connection after another,
each with the seed in the file SOCKET.seed when it is accepted, and its
lines (below) in SOCKET.out, ended by a line "end".

It serves one connection, then exits (or after 35 s without one). The
export is read-only and holds a fixed pattern with zero pages inside the
data (READ answers them with OFFSET_HOLE chunks, or as data) and a zero
region that BLOCK_STATUS reports as a hole. It speaks fixed newstyle:
STRUCTURED_REPLY, SET_META_CONTEXT base:allocation, INFO/GO with
NBD_INFO_EXPORT, _NAME, _DESCRIPTION and _BLOCK_SIZE, EXPORT_NAME (for
a client that saw no fixed-newstyle flag); READ answered by 1 to 6
chunks in a random order, BLOCK_STATUS, FLUSH. Its own state always
follows what the client actually asked; only the bytes of the one
damaged message differ.

Messages are numbered as sent: the greeting is 0, every option reply is
one, and so is every reply or chunk in transmission. The seed picks one
by number (0-8 are the handshake of a client asking for structured
replies and base:allocation), or the first BLOCK_STATUS chunk, or the
error chunk of a fault: with some
seeds the first READ fails with EIO and a message holding a newline and
a terminal escape, so that error chunks are damaged too. What is done to
the message:
  flip      one bit of one field flipped
  set       one field set to an extreme value (0, 1, all ones, the top
            bit, the original +-1, or another valid magic/type/option)
  truncate  only its first bytes sent, then the connection closed
  drop      not sent
  dup       sent twice
  close     the connection closed instead
and after it the server either goes on answering (continue) or closes
(close). A field is a magic, a flag word, a type, an option, a cookie, a
length, an offset, an error code or message length, an info type, the
export size, transmission flags, a block size, a meta context id, an
extent length or flags. The data bytes of a READ reply are never touched:
NBD has no checksums, so different data would be a valid stream.

Damage that yields a valid stream with another meaning is either left
out or written down as the expected result:
  - the export size: the size announced is printed (below), and a copy
    that succeeds must be exactly the pattern cut to that size (reads
    past the real end are refused);
  - extent flags may lose NBD_STATE_ZERO or gain HOLE or unknown bits,
    never gain ZERO (a client may then skip reading data); extent
    lengths change only to 0, or for the last extent of a reply, where a
    shorter or longer one still describes the same bytes;
  - a maximum block size of 1 is not used (valid, but a copy of 1-byte
    requests is merely slow);
  - moving a data or hole chunk's offset cannot describe other bytes:
    the chunks of a reply tile it exactly, so a moved one overlaps
    another or leaves a gap.

After a damaged handshake message that stalls both sides (a longer
length, a dropped reply) the server closes once the client has been
silent for 2 s: the client's own handshake deadline is 30 s, more than
this test can wait per case. In transmission nothing of the kind: a
stalled client must end on its own --timeout.

On stdout, one line each, flushed as it happens:
  plan seed=S target=T policy=P fault=F
  mutation msg=N KIND: OP ...       (or "mutation none: ...")
  size N sha256 HEX                 (the size the client was told, and
                                     the digest of what it must then read;
                                     HEX is "none" past the real size)
  fault sent                        (the first READ was failed)
"""
import hashlib
import os
import random
import socket
import struct
import sys

OPT_MAGIC = 0x3e889045565a9
REPLY_SIMPLE = 0x67446698
REPLY_STRUCT = 0x668e33ef
REPLY_EXT = 0x6e8a278c
NBDMAGIC = 0x4e42444d41474943
IHAVEOPT = 0x49484156454F5054
TFLAGS = 1 | 2 | 4 | 8  # HAS_FLAGS READ_ONLY SEND_FLUSH SEND_FUA
BLOCK_MIN, BLOCK_PREF, BLOCK_MAX = 1, 4096, 1 << 25
CTX_ID = 1
FAULT_MSG = b"disk on fire\n\x1b[2Jforged: all is well"
HS_MESSAGES = 9  # greeting, SR ack, meta context, meta ack, 4 infos, ack


def make_pattern(size):
    """Byte i is (i * 7 + i // 4096) mod 256, except zero 4 KiB pages
    (page % 7 == 5) and a zero region at the middle (zero_region)."""
    # (j * 7 + c) mod 256 is base[j + c * 183 mod 256]: 183 * 7 = 1 mod 256
    base = bytes((j * 7) & 0xFF for j in range(4096 + 256))
    out = bytearray()
    zlo, zhi = zero_region(size)
    for page in range((size + 4095) // 4096):
        off = page * 4096
        if page % 7 == 5 or zlo <= off < zhi:
            out += bytes(4096)
        else:
            k = ((page * 4096 * 7 + page) * 183) & 0xFF
            out += base[k:k + 4096]
    return bytes(out[:size])


def zero_region(size):
    """[lo, hi): the region BLOCK_STATUS reports as a hole (64 KiB
    aligned, 128 KiB long), or an empty one for small exports."""
    lo = (size // 2) & ~0xFFFF
    hi = min(lo + (128 << 10), size & ~0xFFF)
    return (lo, hi) if hi > lo else (0, 0)


class Closed(Exception):
    pass


class Field:
    """A mutable field of a message: name, byte offset, width in bytes,
    and an optional predicate ok(old, new) for allowed values."""

    def __init__(self, name, off, width, ok=None, alt=()):
        self.name, self.off, self.width, self.ok = name, off, width, ok
        self.alt = alt  # other valid values worth trying (magics, types)


def hdr_fields_opt():
    return [Field("opt-magic", 0, 8, alt=(NBDMAGIC, IHAVEOPT)),
            Field("option", 8, 4, alt=(1, 2, 6, 7, 8, 10)),
            Field("reply-type", 12, 4,
                  alt=(1, 2, 3, 4, (1 << 31) + 1, (1 << 31) + 6)),
            Field("reply-length", 16, 4)]


def hdr_fields_chunk():
    return [Field("chunk-magic", 0, 4, alt=(REPLY_SIMPLE, REPLY_EXT)),
            Field("chunk-flags", 4, 2),
            Field("chunk-type", 6, 2, alt=(0, 1, 2, 5, 6, 0x8001, 0x8002)),
            Field("cookie", 8, 8),
            Field("chunk-length", 16, 4)]


def hdr_fields_simple():
    return [Field("simple-magic", 0, 4, alt=(REPLY_STRUCT, REPLY_EXT)),
            Field("simple-error", 4, 4, alt=(5, 22)),
            Field("cookie", 8, 8)]


class Conn:
    def __init__(self, sock, seed, size, pat):
        self.s = sock
        self.seed = seed
        self.size = size
        self.pat = pat
        self.rng = random.Random(seed)
        self.split = random.Random(seed * 7919 + 17)  # chunk layout only
        self.nmsg = 0
        self.done = False  # the one mutation happened
        self.in_hs = True
        self.structured = False
        self.no_zeroes = False
        self.ctx = False
        self.reads = 0
        r = self.rng
        self.fault = r.random() < 0.12
        x = r.random()
        if self.fault and r.random() < 0.6:
            self.target = "fault"
        elif x < 0.4:
            self.target = r.randrange(HS_MESSAGES)
        elif x < 0.55:
            self.target = "status"
        elif x < 0.85:
            self.target = HS_MESSAGES + r.randrange(12)
        else:
            self.target = HS_MESSAGES + 12 + r.randrange(30)
        self.policy = "close" if r.random() < 0.3 else "continue"
        say("plan seed=%d target=%s policy=%s fault=%s"
            % (seed, self.target, self.policy, "yes" if self.fault else "no"))

    # ---- sending with the one mutation --------------------------------

    def recv_exact(self, n):
        b = b""
        while len(b) < n:
            try:
                c = self.s.recv(n - len(b))
            except socket.timeout:
                raise Closed("client silent")
            if not c:
                raise Closed("client closed")
            b += c
        return b

    def emit(self, kind, buf, fields, special=None):
        """Sends one message, or what the seed makes of it."""
        idx = self.nmsg
        self.nmsg += 1
        hit = not self.done and (self.target == idx or
                                 self.target == special)
        if not hit:
            self.s.sendall(buf)
            return buf
        self.done = True
        out, close = self.mutate(idx, kind, bytearray(buf), fields)
        for b in out:
            self.s.sendall(b)
        if close or self.policy == "close":
            raise Closed("closed after the mutation")
        if self.in_hs:
            self.s.settimeout(2)  # see "After a damaged handshake message"
        return out[0] if out else b""

    def mutate(self, idx, kind, buf, fields):
        r = self.rng
        op = r.choices(["flip", "set", "truncate", "drop", "dup", "close"],
                       [30, 35, 10, 8, 8, 5])[0]
        what = "msg=%d %s: " % (idx, kind)
        if op == "truncate" and len(buf) > 1:
            k = r.randrange(1, len(buf))
            say("mutation %struncate to %d of %d bytes, close"
                % (what, k, len(buf)))
            return [bytes(buf[:k])], True
        if op == "drop":
            say("mutation %sdrop (%s)" % (what, self.policy))
            return [], False
        if op == "dup":
            say("mutation %sdup (%s)" % (what, self.policy))
            return [bytes(buf), bytes(buf)], False
        if op == "close" or op == "truncate":
            say("mutation %sclose instead" % what)
            return [], True
        for _ in range(20):  # a field and a value the rules allow
            f = r.choice(fields)
            bits = f.width * 8
            old = int.from_bytes(buf[f.off:f.off + f.width], "big")
            if op == "flip":
                new = old ^ (1 << r.randrange(bits))
            else:
                top = (1 << bits) - 1
                cands = [0, 1, top, 1 << (bits - 1), (old + 1) & top,
                         (old - 1) & top]
                if bits == 64:
                    cands += [(1 << 63) - 1, 1 << 32]
                cands += [a for a in f.alt if a <= top]
                new = r.choice(cands)
            if new == old or (f.ok and not f.ok(old, new)):
                continue
            buf[f.off:f.off + f.width] = new.to_bytes(f.width, "big")
            say("mutation %s%s %s 0x%x -> 0x%x (%s)"
                % (what, op, f.name, old, new, self.policy))
            return [bytes(buf)], False
        say("mutation %sdup (no allowed value; %s)" % (what, self.policy))
        return [bytes(buf), bytes(buf)], False

    # ---- handshake ----------------------------------------------------

    def opt_reply(self, kind, opt, typ, data=b"", fields=()):
        buf = struct.pack(">QIII", OPT_MAGIC, opt, typ, len(data)) + data
        fl = hdr_fields_opt() + [Field(f.name, f.off + 20, f.width, f.ok,
                                       f.alt) for f in fields]
        return self.emit(kind, buf, fl)

    def send_info(self, opt):
        info = struct.pack(">HQH", 0, self.size, TFLAGS)
        sent = self.opt_reply("INFO_EXPORT", opt, 3, info, [
            Field("info-type", 0, 2, alt=(1, 2, 3)),
            Field("export-size", 2, 8),
            Field("tflags", 10, 2)])
        if len(sent) >= 32:
            self.note_size(struct.unpack(">Q", sent[22:30])[0])
        for typ, text, kind in ((1, b"", "INFO_NAME"),
                                (2, b"mutated stream", "INFO_DESCRIPTION")):
            self.opt_reply(kind, opt, 3, struct.pack(">H", typ) + text,
                           [Field("info-type", 0, 2, alt=(0, 3))])
        bs = struct.pack(">HIII", 3, BLOCK_MIN, BLOCK_PREF, BLOCK_MAX)
        self.opt_reply("INFO_BLOCK_SIZE", opt, 3, bs, [
            Field("info-type", 0, 2, alt=(0, 1, 2)),
            Field("block-min", 2, 4),
            Field("block-pref", 6, 4),
            Field("block-max", 10, 4, ok=lambda o, n: n != 1)])
        self.opt_reply("ACK", opt, 1)

    def note_size(self, n):
        h = hashlib.sha256(self.pat[:n]).hexdigest() if n <= self.size \
            else "none"
        say("size %d sha256 %s" % (n, h))

    def meta_reply(self, opt, data):
        # NBD_OPT_SET_META_CONTEXT: export name, then queries.
        try:
            nlen = struct.unpack(">I", data[:4])[0]
            nq = struct.unpack(">I", data[4 + nlen:8 + nlen])[0]
            p, names = 8 + nlen, []
            for _ in range(nq):
                ql = struct.unpack(">I", data[p:p + 4])[0]
                names.append(data[p + 4:p + 4 + ql])
                p += 4 + ql
        except struct.error:
            names = []
        if b"base:allocation" in names:
            self.ctx = True
            self.opt_reply("META_CONTEXT", opt, 4,
                           struct.pack(">I", CTX_ID) + b"base:allocation",
                           [Field("context-id", 0, 4)])
        self.opt_reply("ACK", opt, 1)

    def handshake(self):
        g = struct.pack(">QQH", NBDMAGIC, IHAVEOPT, 3)  # FIXED, NO_ZEROES
        self.emit("greeting", g, [Field("magic", 0, 8),
                                  Field("ihaveopt", 8, 8,
                                        alt=(0x00420281861253,)),
                                  Field("handshake-flags", 16, 2)])
        cflags = struct.unpack(">I", self.recv_exact(4))[0]
        self.no_zeroes = bool(cflags & 2)
        for _ in range(100):
            _, opt, n = struct.unpack(">QII", self.recv_exact(16))
            if n > 65536:
                raise Closed("option too long")
            data = self.recv_exact(n)
            if opt == 1:  # EXPORT_NAME: no reply header, straight in
                buf = struct.pack(">QH", self.size, TFLAGS)
                if not self.no_zeroes:
                    buf += bytes(124)
                sent = self.emit("EXPORT_NAME reply", buf, [
                    Field("export-size", 0, 8), Field("tflags", 8, 2)])
                if len(sent) >= 8:
                    self.note_size(struct.unpack(">Q", sent[:8])[0])
                return
            if opt == 8:  # STRUCTURED_REPLY
                self.structured = True
                self.opt_reply("ACK", opt, 1)
            elif opt == 10:
                self.meta_reply(opt, data)
            elif opt in (6, 7):  # INFO, GO
                self.send_info(opt)
                if opt == 7:
                    return
            elif opt == 2:  # ABORT
                self.opt_reply("ACK", opt, 1)
                raise Closed("abort")
            else:
                self.opt_reply("ERR_UNSUP", opt, (1 << 31) + 1)
        raise Closed("too many options")

    # ---- transmission -------------------------------------------------

    def chunk(self, kind, flags, typ, cookie, payload, pfields=(),
              special=None):
        buf = struct.pack(">IHHQI", REPLY_STRUCT, flags, typ, cookie,
                          len(payload)) + payload
        fl = hdr_fields_chunk() + [Field(f.name, f.off + 20, f.width, f.ok,
                                         f.alt) for f in pfields]
        self.emit(kind, buf, fl, special)

    def simple(self, kind, cookie, error, data=b""):
        buf = struct.pack(">IIQ", REPLY_SIMPLE, error, cookie) + data
        self.emit(kind, buf, hdr_fields_simple())

    def fail_req(self, cookie, err, msg):
        if not self.structured:
            self.simple("simple error", cookie, err)
            return
        self.chunk("ERROR", 1, 0x8001, cookie,
                   struct.pack(">IH", err, len(msg)) + msg,
                   [Field("error", 0, 4, alt=(0, 5)),
                    Field("message-length", 4, 2)])

    def read_pieces(self, off, n):
        """The chunks of one READ: (offset, length, hole?) covering
        [off, off+n) exactly, in the order they will be sent."""
        r = self.split
        runs = []  # (lo, hi, zero)
        p = off
        while p < off + n:
            q = min((p // 4096 + 1) * 4096, off + n)
            z = not any(self.pat[p:q])
            if runs and runs[-1][2] == z:
                runs[-1][1] = q
            else:
                runs.append([p, q, z])
            p = q
        pieces = []
        for lo, hi, z in runs:
            if z and r.random() < 0.7:
                pieces.append((lo, hi - lo, True))
                continue
            cut = lo + ((hi - lo) // 2 & ~0xFFF)
            if hi - lo > 8192 and r.random() < 0.5 and lo < cut < hi:
                pieces += [(lo, cut - lo, False), (cut, hi - cut, False)]
            else:
                pieces.append((lo, hi - lo, False))
        while len(pieces) > 6:  # merge neighbours as data
            a, b = pieces[0], pieces[1]
            pieces[:2] = [(a[0], a[1] + b[1], False)]
        if r.random() < 0.3:
            r.shuffle(pieces)
        return pieces

    def answer_read(self, cookie, off, n):
        self.reads += 1
        if not self.structured:
            self.simple("simple READ reply", cookie, 0,
                        self.pat[off:off + n])
            return
        if self.fault and self.reads == 1:
            say("fault sent")
            if n > 4096:
                self.chunk("OFFSET_DATA", 0, 1, cookie,
                           struct.pack(">Q", off) + self.pat[off:off + 4096],
                           [Field("data-offset", 0, 8)])
            typ = 0x8002 if self.split.random() < 0.5 else 0x8001
            payload = struct.pack(">IH", 5, len(FAULT_MSG)) + FAULT_MSG
            fields = [Field("error", 0, 4, alt=(0, 22)),
                      Field("message-length", 4, 2)]
            if typ == 0x8002:
                payload += struct.pack(">Q", off)
                fields.append(Field("error-offset", 6 + len(FAULT_MSG), 8))
            self.chunk("ERROR_OFFSET" if typ == 0x8002 else "ERROR", 1, typ,
                       cookie, payload, fields, special="fault")
            return
        pieces = self.read_pieces(off, n)
        none_last = self.split.random() < 0.5
        for i, (o, k, hole) in enumerate(pieces):
            last = i == len(pieces) - 1 and not none_last
            if hole:
                self.chunk("OFFSET_HOLE", 1 if last else 0, 2, cookie,
                           struct.pack(">QI", o, k),
                           [Field("hole-offset", 0, 8),
                            Field("hole-length", 8, 4)])
            else:
                self.chunk("OFFSET_DATA", 1 if last else 0, 1, cookie,
                           struct.pack(">Q", o) + self.pat[o:o + k],
                           [Field("data-offset", 0, 8)])
        if none_last:
            self.chunk("NONE", 1, 0, cookie, b"")

    def extents(self, off, n, req_one):
        """base:allocation of [off, off+n): data in 256 KiB pieces, the
        zero region as HOLE|ZERO."""
        zlo, zhi = zero_region(self.size)
        cuts = sorted(set([off, off + n] +
                          [c for c in range(0, self.size, 256 << 10)
                           if off < c < off + n] +
                          [c for c in (zlo, zhi) if off < c < off + n]))
        out = []
        for a, b in zip(cuts, cuts[1:]):
            out.append((b - a, 3 if zlo <= a < zhi else 0))
        return out[:1] if req_one else out

    def answer_status(self, cookie, off, n, flags):
        ext = self.extents(off, n, flags & 8)
        payload = struct.pack(">I", CTX_ID)
        fields = [Field("status-context", 0, 4, alt=(0, 2))]
        for i, (ln, fl) in enumerate(ext):
            p = 4 + 8 * i
            payload += struct.pack(">II", ln, fl)
            if i == len(ext) - 1:
                fields.append(Field("last-extent-length", p, 4,
                                    ok=lambda o, n: True))
            else:
                fields.append(Field("extent-length", p, 4,
                                    ok=lambda o, n: n == 0))
            # may lose ZERO or gain other bits, never gain ZERO
            fields.append(Field("extent-flags", p + 4, 4,
                                ok=lambda o, n: not (n & 2) or (o & 2)))
        none_last = self.split.random() < 0.3
        self.chunk("BLOCK_STATUS", 0 if none_last else 1, 5, cookie, payload,
                   fields, special="status")
        if none_last:
            self.chunk("NONE", 1, 0, cookie, b"")

    def transmission(self):
        self.in_hs = False
        for _ in range(1 << 20):
            flags, typ, cookie, off, n = struct.unpack(
                ">HHQQI", self.recv_exact(28)[4:])
            if typ == 2:  # DISC
                raise Closed("disconnect")
            if typ == 3:  # FLUSH
                self.simple("FLUSH reply", cookie, 0)
            elif typ not in (0, 7):
                self.fail_req(cookie, 22, b"not supported here")
            elif n == 0 or off + n > self.size:
                self.fail_req(cookie, 22, b"beyond the end of the export")
            elif typ == 0:
                self.answer_read(cookie, off, n)
            elif not self.ctx or not self.structured:
                self.fail_req(cookie, 22, b"no meta context")
            else:
                self.answer_status(cookie, off, n, flags)

    def run(self):
        try:
            self.handshake()
            self.transmission()
        except (Closed, OSError, struct.error):
            pass
        finally:
            if not self.done:
                say("mutation none: target %s not reached in %d messages"
                    % (self.target, self.nmsg))
            self.s.close()


OUT = sys.stdout


def say(line):
    print(line, file=OUT, flush=True)


def main():
    global OUT
    if sys.argv[1] == "--pattern":
        with open(sys.argv[2], "wb") as f:
            f.write(make_pattern(int(sys.argv[3])))
        return
    many = sys.argv[1] == "--many"
    if many:
        path, seed, size = sys.argv[2], None, int(sys.argv[3])
    else:
        path, seed, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pat = make_pattern(size)
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path + ".new")
    ls.listen(1)
    os.rename(path + ".new", path)  # appears only once it accepts
    ls.settimeout(35)
    while True:
        try:
            c, _ = ls.accept()
        except socket.timeout:
            return
        c.settimeout(40)
        if not many:
            ls.close()
            Conn(c, seed, size, pat).run()
            return
        with open(path + ".seed") as f:
            seed = int(f.read())
        with open(path + ".out", "w") as OUT:
            Conn(c, seed, size, pat).run()
            say("end")


main()
