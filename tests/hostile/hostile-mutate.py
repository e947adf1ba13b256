#!/usr/bin/env python3
"""Seeded mutation of whole client sessions: for each seed, a well-formed
client script (client flags, options, requests) is built, one to three
mutations are applied to it (bit flips, extreme values in magics, option
numbers, lengths, name lengths, flags, types, cookies, offsets; duplicated,
dropped, swapped or garbage messages; a cut at a random byte; 1-byte
writes), and the result is sent to the server.

A model of the protocol walks the bytes actually sent, in step with the
bytes the server sent back, and judges each answer by the spec: option
replies echo their option, in order, and end with an ACK or an error;
unknown options get ERR_UNSUP; GO gives NBD_INFO_EXPORT before its ACK;
every request the server could read in full gets exactly one reply, of
the negotiated form, with a cookie that was sent; READ chunks stay in the
request's range; requests the mutation left intact succeed. A request the
model cannot see complete gets no reply, and once the script is sent the
client half-closes, after which the server must close.

After each seed: the server is alive, logged nothing from a sanitizer,
wrote a bounded number of lines about the client, and a fresh client can
still write and read back. The server may drop a client early instead of
answering, but then a log line names that client. A bystander on a second
export, connected all along, finds its data intact at the end, also as read
by nbdcopy; --max-connections is small so that a leaked connection slot
shows up as a refused connection.

HOSTILE_MUTATE_SEEDS=N (default 1000) sets how many seeds run, from
HOSTILE_MUTATE_FIRST (default 0);
HOSTILE_MUTATE_SEED=S runs seed S alone (to reproduce a failure).
"""
import hashlib
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

OPT_EXTENDED_HEADERS = 11
EXT_REQUEST_MAGIC = 0x21E41C71
EXT_REPLY_MAGIC = 0x6E8A278C
REPLY_TYPE_BLOCK_STATUS_EXT = 6
REP_ERR_EXT_HEADER_REQD = REP_FLAG_ERROR | 10
# Options this server implements; any other must get ERR_UNSUP.
KNOWN_OPTIONS = {OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS,
                 OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY,
                 OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT,
                 OPT_EXTENDED_HEADERS}
NBD_ERRORS = {EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP,
              ESHUTDOWN}

SCRATCH_SIZE = 4 << 20   # mutants use [MUTANT_BASE, SCRATCH_SIZE)
MUTANT_BASE = 1 << 20
KEEP_SIZE = 1 << 20      # the bystander's export, never named by mutants
BIG_SIZE = 1 << 40       # null: 64-bit offsets, reads of zeroes
EXPORTS = {b"": SCRATCH_SIZE, b"scratch": SCRATCH_SIZE, b"keep": KEEP_SIZE,
           b"big": BIG_SIZE}
MAX_CONNECTIONS = 4
LOG_LINES_MAX = 24       # per client: the server caps its own at 16 + 1
EXTREMES = (0, 1, 2, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 63,
            (1 << 64) - 1, 32 << 20, (32 << 20) + 1)
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer",
                   "UndefinedBehaviorSanitizer", "runtime error:")

WAIT = IO_TIMEOUT          # for an answer the model says is due
OPTION_DROP_MAX = 1 << 20  # option data the server reads at most
UNSIZED_MAX = 1 << 30      # READ/WRITE from a client that did not agree
                           # to block sizes (EXPORT_NAME, or GO without
                           # NBD_INFO_BLOCK_SIZE)


# ---- the client script: messages made of named fields ----

class Msg:
    """One client message: fields are [name, value, width] with an int
    value and a byte width, or [name, bytes, None]."""

    def __init__(self, label, fields):
        self.label = label
        self.fields = fields

    def encode(self):
        out = b""
        for _, v, w in self.fields:
            if w is None:
                out += v
            else:
                out += (v & ((1 << (8 * w)) - 1)).to_bytes(w, "big")
        return out

    def copy(self):
        return Msg(self.label, [list(f) for f in self.fields])


def opt_msg(label, option, data_fields=()):
    length = sum(len(v) if w is None else w for _, v, w in data_fields)
    return Msg(label, [["opt magic", IHAVEOPT, 8], ["option", option, 4],
                       ["opt length", length, 4]] +
               [list(f) for f in data_fields])


def info_fields(name, infos):
    f = [["name length", len(name), 4], ["name", name, None],
         ["info count", len(infos), 2]]
    f += [["info %d" % i, t, 2] for i, t in enumerate(infos)]
    return f


def meta_fields(name, queries):
    f = [["name length", len(name), 4], ["name", name, None],
         ["query count", len(queries), 4]]
    for i, q in enumerate(queries):
        f += [["query %d length" % i, len(q), 4], ["query %d" % i, q, None]]
    return f


def req_msg(label, ext, cmd, offset, length, flags, cookie, payload=b""):
    return Msg(label, [
        ["req magic", EXT_REQUEST_MAGIC if ext else REQUEST_MAGIC, 4],
        ["req flags", flags, 2], ["type", cmd, 2], ["cookie", cookie, 8],
        ["offset", offset, 8], ["length", length, 8 if ext else 4],
        ["payload", payload, None]])


def build_script(rng):
    """A well-formed session for the scratch export, as a list of Msg."""
    msgs = []
    cflags = FLAG_C_FIXED_NEWSTYLE | (FLAG_C_NO_ZEROES
                                      if rng.random() < 0.7 else 0)
    msgs.append(Msg("client flags", [["client flags", cflags, 4]]))
    name = rng.choice([b"", b"scratch", b"scratch", b"big"])
    ext = rng.random() < 0.3
    structured = ext or rng.random() < 0.75
    if rng.random() < 0.3:
        msgs.append(opt_msg("LIST", OPT_LIST))
    if ext:
        msgs.append(opt_msg("EXTENDED_HEADERS", OPT_EXTENDED_HEADERS))
    elif structured:
        msgs.append(opt_msg("STRUCTURED_REPLY", OPT_STRUCTURED_REPLY))
    meta = structured and rng.random() < 0.7
    if structured and rng.random() < 0.3:
        msgs.append(opt_msg("LIST_META_CONTEXT", OPT_LIST_META_CONTEXT,
                            meta_fields(name, [b"base:"])))
    if meta:
        msgs.append(opt_msg("SET_META_CONTEXT", OPT_SET_META_CONTEXT,
                            meta_fields(name, [b"base:allocation"])))
    if rng.random() < 0.3:
        msgs.append(opt_msg("INFO", OPT_INFO,
                            info_fields(name, [INFO_NAME, INFO_BLOCK_SIZE])))
    if not structured and rng.random() < 0.3:
        msgs.append(Msg("EXPORT_NAME",
                        [["opt magic", IHAVEOPT, 8],
                         ["option", OPT_EXPORT_NAME, 4],
                         ["opt length", len(name), 4],
                         ["name", name, None]]))
    else:
        infos = rng.sample([INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
                           rng.randint(0, 3))
        msgs.append(opt_msg("GO", OPT_GO, info_fields(name, infos)))

    size = EXPORTS[name]
    for i in range(rng.randint(2, 7)):
        cookie = rng.getrandbits(64)  # far apart: a flipped bit stays unique
        base = MUTANT_BASE if size == SCRATCH_SIZE else size - (16 << 20)
        off = base + 512 * rng.randrange(0, (size - base) // 512 - 256)
        length = rng.choice([512, 4096, 512 * rng.randint(1, 128)])
        fua = CMD_FLAG_FUA if rng.random() < 0.2 else 0
        cmd = rng.choice(["WRITE", "WRITE", "READ", "READ", "FLUSH", "TRIM",
                          "WRITE_ZEROES", "CACHE"] +
                         (["BLOCK_STATUS"] * 2 if meta else []))
        if cmd == "WRITE":
            flags = fua | (CMD_FLAG_PAYLOAD_LEN if ext else 0)
            m = req_msg(cmd, ext, CMD_WRITE, off, length, flags, cookie,
                        rng.randbytes(length))
        elif cmd == "READ":
            m = req_msg(cmd, ext, CMD_READ, off, length, 0, cookie)
        elif cmd == "FLUSH":
            m = req_msg(cmd, ext, CMD_FLUSH, 0, 0, 0, cookie)
        elif cmd == "TRIM":
            m = req_msg(cmd, ext, CMD_TRIM, off, length, fua, cookie)
        elif cmd == "WRITE_ZEROES":
            flags = fua | (CMD_FLAG_NO_HOLE if rng.random() < 0.5 else 0)
            m = req_msg(cmd, ext, CMD_WRITE_ZEROES, off, length, flags,
                        cookie)
        elif cmd == "CACHE":
            m = req_msg(cmd, ext, CMD_CACHE, off, length, 0, cookie)
        else:
            flags = CMD_FLAG_REQ_ONE if rng.random() < 0.3 else 0
            m = req_msg(cmd, ext, CMD_BLOCK_STATUS, off, length, flags,
                        cookie)
        msgs.append(m)
    if rng.random() < 0.85:
        msgs.append(req_msg("DISC", ext, CMD_DISC, 0, 0, 0, 0))
    return msgs


# ---- mutations ----

LENGTH_FIELDS = ("opt length", "length", "name length", "info count",
                 "query count", "query 0 length")


def pick_field(rng, msgs, want):
    """A random (message index, field) whose name passes want."""
    cands = [(i, f) for i, m in enumerate(msgs) for f in m.fields
             if want(f)]
    return rng.choice(cands) if cands else (None, None)


def mutate(rng, msgs):
    """Applies one to three mutations in place; returns (descriptions,
    cut, split): cut is a byte count to stop after (or None), split how
    the bytes are written."""
    what = []
    cut = None
    n = rng.choices([1, 2, 3], [7, 2, 1])[0]
    for _ in range(n):
        kind = rng.choices(
            ["flip", "extreme", "skew", "dup", "drop", "swap", "garbage",
             "cut", "flood"], [5, 5, 4, 1, 1, 1, 1, 2, 1])[0]
        if kind == "flip":
            i, f = pick_field(rng, msgs, lambda f: f[1] != b"")
            if f[2] is None:
                b = bytearray(f[1])
                bit = rng.randrange(8 * len(b))
                b[bit // 8] ^= 0x80 >> (bit % 8)
                f[1] = bytes(b)
                what.append("%s: flip bit %d of %s" % (msgs[i].label, bit,
                                                        f[0]))
            else:
                bit = rng.randrange(8 * f[2])
                f[1] ^= 1 << bit
                what.append("%s: flip bit %d of %s -> 0x%x"
                            % (msgs[i].label, bit, f[0], f[1]))
        elif kind == "extreme":
            i, f = pick_field(rng, msgs, lambda f: f[2] is not None)
            f[1] = rng.choice(EXTREMES) & ((1 << (8 * f[2])) - 1)
            what.append("%s: %s = 0x%x" % (msgs[i].label, f[0], f[1]))
        elif kind == "skew":
            i, f = pick_field(rng, msgs, lambda f: f[0] in LENGTH_FIELDS)
            if f is None:
                continue
            d = rng.choice([-1, 1, -2, 2, -7, 8, -512, 512, 4096, 65536])
            f[1] = max(0, f[1] + d)
            what.append("%s: %s %+d -> %d" % (msgs[i].label, f[0], d, f[1]))
        elif kind in ("dup", "drop") and len(msgs) > 1:
            i = rng.randrange(1, len(msgs))
            if kind == "dup":
                msgs.insert(i, msgs[i].copy())
            else:
                del msgs[i]
            what.append("%s message %d" % (kind, i))
        elif kind == "swap" and len(msgs) > 2:
            i = rng.randrange(1, len(msgs) - 1)
            msgs[i], msgs[i + 1] = msgs[i + 1], msgs[i]
            what.append("swap messages %d and %d" % (i, i + 1))
        elif kind == "garbage":
            i = rng.randrange(1, len(msgs) + 1)
            g = rng.randbytes(rng.randint(1, 40))
            msgs.insert(i, Msg("garbage", [["garbage", g, None]]))
            what.append("%d garbage bytes before message %d" % (len(g), i))
        elif kind == "flood":
            reqs = [i for i, m in enumerate(msgs)
                    if m.fields[0][0] == "req magic" and m.label != "DISC"]
            if not reqs:
                continue
            i = rng.choice(reqs)
            k = rng.randint(16, 80)
            copies = [msgs[i].copy() for _ in range(k)]
            for m in copies:
                m.fields[3][1] = rng.getrandbits(64)  # a cookie of its own
            msgs[i + 1:i + 1] = copies
            what.append("%s message %d sent %d more times"
                        % (msgs[i].label, i, k))
        elif kind == "cut":
            total = sum(len(m.encode()) for m in msgs)
            cut = rng.randrange(0, total)
            what.append("cut after byte %d of %d" % (cut, total))
    split = rng.choices(["whole", "bytes", "random"], [6, 1, 2])[0]
    return what, cut, split


# ---- the model: what the server may and must answer ----

class Cur:
    def __init__(self, data):
        self.d = data
        self.p = 0

    def left(self):
        return len(self.d) - self.p

    def take(self, n):
        b = self.d[self.p:self.p + n]
        self.p += n
        return b


class Verdict:
    """kind: "more" (an answer is due), "close" (the server must close
    now), "idle" (the server waits for client bytes). log: a line naming
    the client is due if the server closes here."""

    def __init__(self, kind, why, log=False):
        self.kind = kind
        self.why = why
        self.log = log

    def __repr__(self):
        return "%s (%s)" % (self.kind, self.why)


def check(cond, what):
    if not cond:
        raise Failure(what)


def analyze(sent, recv, clean):
    """Walks the bytes sent and the bytes received. clean: the encodings
    of the script's requests before mutation."""
    s, r = Cur(sent), Cur(recv)
    if r.left() < 18:
        return Verdict("more", "the greeting", log=True)
    magic, opt, hflags = struct.unpack(">QQH", r.take(18))
    check(magic == NBDMAGIC and opt == IHAVEOPT, "greeting magics")
    check(hflags & FLAG_FIXED_NEWSTYLE, "server is fixed newstyle")
    if s.left() < 4:
        return idle(r, "client flags", True)
    cflags = struct.unpack(">I", s.take(4))[0]
    if cflags & ~(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES):
        return closing(r, "unknown client flags 0x%x" % cflags, True)
    st = {"structured": False, "extended": False, "meta": False,
          "size": None, "tflags": 0, "maxpay": 32 << 20}
    while True:
        if s.left() < 16:
            return idle(r, "option header", True)
        magic, option, length = struct.unpack(">QII", s.take(16))
        if magic != IHAVEOPT:
            return closing(r, "bad option magic 0x%x" % magic, True)
        if not cflags & FLAG_C_FIXED_NEWSTYLE and option != OPT_EXPORT_NAME:
            return closing(r, "option %d without fixed newstyle" % option,
                           True)
        if length > OPTION_DROP_MAX:
            # Answered at once, never read: ERR_TOO_BIG and a close, or
            # the close alone for EXPORT_NAME.
            if option != OPT_EXPORT_NAME:
                v = option_replies(r, option, st)
                if isinstance(v, Verdict):
                    return v
                check(v[0] == REP_ERR_TOO_BIG, "option %d announcing %d "
                      "bytes answered with %s, not ERR_TOO_BIG"
                      % (option, length, repname(v[0])))
            return closing(r, "option %d announcing %d bytes"
                           % (option, length), True)
        if s.left() < length:
            return idle(r, "data of option %d (%d bytes)" % (option, length),
                        True)
        data = s.take(length)
        if option == OPT_EXPORT_NAME:
            if data not in EXPORTS:
                return closing(r, "EXPORT_NAME of an unknown export", True)
            n = 10 if cflags & FLAG_C_NO_ZEROES else 134
            if r.left() < n:
                return Verdict("more", "EXPORT_NAME reply", log=True)
            st["size"], st["tflags"] = struct.unpack(">QH", r.take(10))
            r.take(n - 10)
            check(st["size"] == EXPORTS[data], "EXPORT_NAME size")
            st["maxpay"] = UNSIZED_MAX
            break
        v = option_replies(r, option, st)
        if isinstance(v, Verdict):
            return v
        final, infos, contexts = v
        if option not in KNOWN_OPTIONS:
            check(final == REP_ERR_UNSUP, "unknown option %d answered with "
                  "%s, not ERR_UNSUP" % (option, repname(final)))
        if option == OPT_ABORT:
            check(final == REP_ACK, "ABORT answered with %s" % repname(final))
            return closing(r, "ABORT", False)
        if option == OPT_STARTTLS:
            check(final != REP_ACK, "STARTTLS ACKed without TLS")
        if option == OPT_SET_META_CONTEXT:
            st["meta"] = final == REP_ACK and contexts > 0
        if final != REP_ACK:
            continue
        if option == OPT_STRUCTURED_REPLY:
            st["structured"] = True
        elif option == OPT_EXTENDED_HEADERS:
            st["structured"] = st["extended"] = True
        elif option in (OPT_INFO, OPT_GO):
            check(INFO_EXPORT in infos, "%s ACKed without NBD_INFO_EXPORT"
                  % ("GO" if option == OPT_GO else "INFO"))
            if option == OPT_GO:
                if not go_asks_sizes(data):
                    st["maxpay"] = UNSIZED_MAX
                break
    return transmission(s, r, st, clean)


def go_asks_sizes(data):
    """Whether GO's data asks for NBD_INFO_BLOCK_SIZE, which binds the
    client to the limits (§Size constraints)."""
    if len(data) < 6:
        return False
    nl = struct.unpack(">I", data[:4])[0]
    if 4 + nl + 2 > len(data):
        return False
    n = struct.unpack(">H", data[4 + nl:6 + nl])[0]
    reqs = data[6 + nl:6 + nl + 2 * n]
    return any(struct.unpack(">H", reqs[i:i + 2])[0] == INFO_BLOCK_SIZE
               for i in range(0, len(reqs) - 1, 2))


def idle(r, what, handshake):
    check(r.left() == 0, "%d bytes from the server beyond every answer "
          "due (server waits for %s)" % (r.left(), what))
    return Verdict("idle", "server waits for " + what, log=handshake)


def closing(r, why, log):
    check(r.left() == 0, "%d bytes from the server after it should have "
          "closed (%s)" % (r.left(), why))
    return Verdict("close", why, log=log)


def option_replies(r, option, st):
    """Reads the replies to one option: (final type, info types seen,
    meta contexts seen), or a Verdict when they are not all in."""
    infos, contexts = set(), 0
    while True:
        if r.left() < 20:
            return Verdict("more", "reply to option %d" % option, log=True)
        magic, o, t, length = struct.unpack(">QIII", r.take(20))
        check(magic == REP_MAGIC, "option reply magic 0x%x" % magic)
        check(o == option, "reply to option %d names option %d"
              % (option, o))
        check(length <= 1 << 20, "option reply of %d bytes" % length)
        if r.left() < length:
            return Verdict("more", "reply data to option %d" % option,
                           log=True)
        d = r.take(length)
        if t == REP_ACK or t & REP_FLAG_ERROR:
            check(t != REP_ACK or length == 0, "ACK with data")
            return t, infos, contexts
        if t == REP_SERVER:
            check(option == OPT_LIST, "REP_SERVER to option %d" % option)
            check(length >= 4 and struct.unpack(">I", d[:4])[0] <= length - 4,
                  "REP_SERVER name length")
        elif t == REP_INFO:
            check(option in (OPT_INFO, OPT_GO), "REP_INFO to option %d"
                  % option)
            check(length >= 2, "REP_INFO of %d bytes" % length)
            it = struct.unpack(">H", d[:2])[0]
            infos.add(it)
            if it == INFO_EXPORT:
                check(length == 12, "NBD_INFO_EXPORT of %d bytes" % length)
                st["size"], st["tflags"] = struct.unpack(">QH", d[2:])
                check(st["size"] in EXPORTS.values(),
                      "export size %d" % st["size"])
            elif it == INFO_BLOCK_SIZE:
                check(length == 14, "NBD_INFO_BLOCK_SIZE of %d bytes"
                      % length)
                st["maxpay"] = struct.unpack(">III", d[2:])[2]
        elif t == REP_META_CONTEXT:
            check(option in (OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT),
                  "REP_META_CONTEXT to option %d" % option)
            check(length > 4, "REP_META_CONTEXT of %d bytes" % length)
            contexts += 1
        else:
            raise Failure("reply type %s to option %d" % (repname(t),
                                                           option))


class Req:
    def __init__(self, cookie, cmd, flags, offset, length, clean):
        self.cookie = cookie
        self.cmd = cmd
        self.flags = flags
        self.offset = offset
        self.length = length
        self.clean = clean
        self.done = False
        self.got = []      # (offset, length) of READ chunks
        self.error = 0


def transmission(s, r, st, clean):
    ext = st["extended"]
    hlen = 32 if ext else 28
    pending = []
    end = None
    while end is None:
        if s.left() < hlen:
            end = ("idle", "request header", False)
            break
        hdr = s.take(hlen)
        if ext:
            magic, flags, cmd, cookie, off, length = struct.unpack(
                ">IHHQQQ", hdr)
        else:
            magic, flags, cmd, cookie, off, length = struct.unpack(
                ">IHHQQI", hdr)
        if magic != (EXT_REQUEST_MAGIC if ext else REQUEST_MAGIC):
            end = ("close", "bad request magic 0x%x" % magic, True)
            break
        if cmd == CMD_DISC:
            end = ("close", "DISC", False)
            break
        has = (flags & CMD_FLAG_PAYLOAD_LEN) if ext else cmd == CMD_WRITE
        pay = length if has else 0
        if pay > st["maxpay"]:
            end = ("close", "payload of %d bytes" % pay, True)
            break
        if s.left() < pay:
            end = ("idle", "payload of %d bytes" % pay, True)
            break
        body = s.take(pay)
        pending.append(Req(cookie, cmd, flags, off, length,
                           hdr + body in clean))
    v = replies(r, pending, st)
    if v is not None and end[0] == "close" and end[2]:
        # A stream it cannot follow lets the server hang up at once;
        # replies in flight may be lost, even halfway.
        return Verdict("close", end[1] + "; replies in flight may be lost",
                       log=True)
    if v is not None:
        return v
    if end[0] == "idle":
        return idle(r, end[1], end[2])
    return closing(r, end[1], end[2])


class Ambiguous(Exception):
    """Requests in flight share a cookie but differ: no reply can be told
    apart from the other."""


def find_req(pending, cookie):
    cands = [q for q in pending if q.cookie == cookie and not q.done]
    if not cands:
        raise Failure("reply for cookie %d, which no request awaiting a "
                      "reply carries" % cookie)
    q = cands[0]
    for o in cands[1:]:
        if (o.cmd, o.length, o.offset) != (q.cmd, q.length, q.offset):
            raise Ambiguous("cookie %d on different requests in flight"
                            % cookie)
        q.clean = q.clean and o.clean
    return q


def must_succeed(q, st):
    """A request the mutation left intact, on the export it was meant
    for, that the spec lets only succeed."""
    return (q.clean and q.cmd != CMD_BLOCK_STATUS and
            st["size"] in (SCRATCH_SIZE, BIG_SIZE) and
            not st["tflags"] & TF_READ_ONLY)


def replies(r, pending, st):
    """Consumes every complete reply; a Verdict if some are not in."""
    ext, structured = st["extended"], st["structured"]
    while True:
        if r.left() < 4:
            break
        start = r.p
        magic = struct.unpack(">I", r.d[r.p:r.p + 4])[0]
        if magic == SIMPLE_REPLY_MAGIC:
            check(not ext, "simple reply after extended headers")
            if r.left() < 16:
                break
            _, err, cookie = struct.unpack(">IIQ", r.take(16))
            q = find_req(pending, cookie)
            check(not q.got, "simple reply in the middle of a structured "
                  "one (cookie %d)" % cookie)
            check(not (structured and q.cmd == CMD_READ),
                  "simple reply to READ after structured replies")
            check(err == 0 or err in NBD_ERRORS, "error %d is not one of "
                  "the spec's" % err)
            if err == 0 and q.cmd == CMD_READ:
                if r.left() < q.length:
                    r.p = start
                    break
                r.take(q.length)
            check(err == 0 or not must_succeed(q, st),
                  "intact %s failed with %s" % (q.cmd, errname(err)))
            check(not (err == 0 and q.cmd == CMD_BLOCK_STATUS),
                  "BLOCK_STATUS success without descriptors")
            q.done = True
            continue
        check(magic == (EXT_REPLY_MAGIC if ext else STRUCTURED_REPLY_MAGIC),
              "reply magic 0x%08x (structured %s, extended %s)"
              % (magic, structured, ext))
        check(structured, "structured chunk without STRUCTURED_REPLY")
        if ext:
            if r.left() < 32:
                break
            _, flags, t, cookie, roff, length = struct.unpack(
                ">IHHQQQ", r.take(32))
        else:
            if r.left() < 20:
                break
            _, flags, t, cookie, length = struct.unpack(">IHHQI",
                                                         r.take(20))
        check(length <= st["maxpay"] + 4096, "chunk of %d bytes" % length)
        if r.left() < length:
            r.p = start
            break
        d = r.take(length)
        q = find_req(pending, cookie)
        if ext:
            check(roff == q.offset, "extended chunk offset %d, request "
                  "offset %d" % (roff, q.offset))
        chunk(q, flags, t, d, ext, st["size"])
        if flags & REPLY_FLAG_DONE:
            q.done = True
            if q.error == 0 and q.cmd == CMD_READ:
                check(sum(n for _, n in q.got) == q.length,
                      "READ chunks cover %d of %d bytes"
                      % (sum(n for _, n in q.got), q.length))
            check(q.error == 0 or not must_succeed(q, st),
                  "intact %s failed with %s" % (q.cmd, errname(q.error)))
    todo = [q for q in pending if not q.done]
    if todo:
        return Verdict("more", "replies to %d requests (first: cookie %d, "
                       "command %d)" % (len(todo), todo[0].cookie,
                                        todo[0].cmd), log=True)
    return None


def chunk(q, flags, t, d, ext, size):
    """Checks one structured chunk of q's reply."""
    check(not flags & ~REPLY_FLAG_DONE, "chunk flags 0x%x" % flags)
    if t == REPLY_TYPE_NONE:
        check(not d and flags & REPLY_FLAG_DONE and not q.got,
              "NONE chunk with data, alone or without DONE")
        check(q.cmd != CMD_READ or q.length == 0 or q.error,
              "READ of %d bytes answered by NONE" % q.length)
        return
    if t & 0x8000:
        check(t in (REPLY_TYPE_ERROR, REPLY_TYPE_ERROR_OFFSET),
              "error chunk type 0x%x" % t)
        check(len(d) >= 6, "error chunk of %d bytes" % len(d))
        err, ml = struct.unpack(">IH", d[:6])
        check(err in NBD_ERRORS, "error chunk with error %d" % err)
        extra = 8 if t == REPLY_TYPE_ERROR_OFFSET else 0
        check(len(d) == 6 + ml + extra, "error chunk message length")
        q.error = err
        return
    if t in (REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_OFFSET_HOLE):
        check(q.cmd == CMD_READ, "data chunk to command %d" % q.cmd)
        if t == REPLY_TYPE_OFFSET_DATA:
            check(len(d) > 8, "OFFSET_DATA of %d bytes" % len(d))
            off, n = struct.unpack(">Q", d[:8])[0], len(d) - 8
        else:
            check(len(d) == 12, "OFFSET_HOLE of %d bytes" % len(d))
            off, n = struct.unpack(">QI", d)
            check(n > 0, "OFFSET_HOLE of length 0")
        check(q.offset <= off and off + n <= q.offset + q.length,
              "READ chunk %d+%d outside the request %d+%d"
              % (off, n, q.offset, q.length))
        for o2, n2 in q.got:
            check(off + n <= o2 or o2 + n2 <= off, "READ chunks overlap")
        q.got.append((off, n))
        return
    want = REPLY_TYPE_BLOCK_STATUS_EXT if ext else REPLY_TYPE_BLOCK_STATUS
    check(t == want and q.cmd == CMD_BLOCK_STATUS,
          "chunk type %d to command %d" % (t, q.cmd))
    per = 16 if ext else 8
    head = 8 if ext else 4
    check(len(d) >= head + per and (len(d) - head) % per == 0,
          "BLOCK_STATUS payload of %d bytes" % len(d))
    n = (len(d) - head) // per
    if ext:
        check(struct.unpack(">I", d[4:8])[0] == n, "descriptor count")
    total = 0
    for i in range(n):
        if ext:
            ln, fl = struct.unpack(">QQ", d[head + 16 * i:head + 16 * i + 16])
        else:
            ln, fl = struct.unpack(">II", d[head + 8 * i:head + 8 * i + 8])
        check(ln > 0, "descriptor of length 0")
        check(fl & ~3 == 0, "base:allocation flags 0x%x" % fl)
        total += ln
    if q.flags & CMD_FLAG_REQ_ONE:
        check(n == 1 and total <= q.length, "REQ_ONE answered with %d "
              "descriptors over %d bytes" % (n, total))
    check(q.offset + total <= size, "descriptors past the end")
    q.got.append((q.offset, 0))


# ---- one seed ----

class Reader(threading.Thread):
    """Collects what the server sends until EOF or a reset."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock = sock
        self.data = bytearray()
        self.eof = False
        self.cv = threading.Condition()

    def run(self):
        while True:
            try:
                b = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                b = b""
            with self.cv:
                if b:
                    self.data += b
                else:
                    self.eof = True
                self.cv.notify_all()
            if not b:
                return

    def snapshot(self):
        with self.cv:
            return bytes(self.data), self.eof

    def wait_change(self, size, timeout):
        """Waits until more than size bytes or EOF; False on timeout."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while len(self.data) <= size and not self.eof:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(left)
        return True


def send_stream(sock, data, split, rng):
    """Sends data in the chosen pieces; returns the bytes handed over
    before the server stopped taking them."""
    if split == "whole":
        pieces = [data]
    elif split == "bytes":
        head = data[:4096]
        pieces = [head[i:i + 1] for i in range(len(head))] + [data[4096:]]
    else:
        pieces, i = [], 0
        while i < len(data):
            n = rng.randint(1, 3000)
            pieces.append(data[i:i + n])
            i += n
    done = 0
    for p in pieces:
        view = memoryview(p)
        while view:
            # send, not sendall: when the server closes midway, the bytes
            # the kernel took before are part of what it may have read,
            # and the model must judge its answers against them.
            try:
                n = sock.send(view)
            except (BrokenPipeError, ConnectionResetError):
                return data[:done]
            except socket.timeout:
                raise Failure("server stopped reading: %d of %d bytes sent"
                              % (done, len(data)))
            done += n
            view = view[n:]
    return data[:done]


def run_seed(server, seed):
    rng = random.Random(seed)
    msgs = build_script(rng)
    clean = {m.encode() for m in msgs if m.fields[0][0] == "req magic"}
    if seed % 50 == 0:
        what, cut, split = ["none (control)"], None, "whole"
    else:
        what, cut, split = mutate(rng, msgs)
    stream = b"".join(m.encode() for m in msgs)
    if cut is not None:
        stream = stream[:cut]
    labels = " ".join(m.label for m in msgs)
    info = "seed %d: script [%s]; mutation: %s; %d bytes sent %s" % (
        seed, labels, "; ".join(what), len(stream), split)

    logpos = len(server.log_text())
    sock = server.connect(WAIT)
    cid = "%s:%d" % sock.getsockname()[:2]
    reader = Reader(sock)
    reader.start()
    try:
        sent = send_stream(sock, stream, split, rng)
        shut = False
        early = None
        while True:
            recv, eof = reader.snapshot()
            try:
                v = analyze(sent, recv, clean)
            except Ambiguous as e:
                # Replies cannot be checked: only a clean end is.
                v = Verdict("loose", str(e))
            if v.kind == "more":
                if eof:
                    early = v
                    break
                if not reader.wait_change(len(recv), WAIT):
                    raise Failure("no answer within %.0f s: waiting for %s"
                                  % (WAIT, v.why))
            elif v.kind == "close":
                if eof:
                    break
                if not reader.wait_change(len(recv), WAIT):
                    raise Failure("server did not close within %.0f s "
                                  "after %s" % (WAIT, v.why))
            else:
                if eof:
                    if not shut and v.kind == "idle":
                        early = v
                    break
                if not shut:
                    try:
                        sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    shut = True
                    continue
                if not reader.wait_change(len(recv), WAIT):
                    raise Failure("server did not close within %.0f s of "
                                  "the client's EOF (%s)" % (WAIT, v.why))
        reader.join(WAIT)
        if not server.alive():
            raise Failure("server died (exit status %s)"
                          % server.proc.returncode)
        log_checks(server, cid, logpos, v, early, shut)
    except Failure as e:
        raise Failure("%s\n  %s" % (e, info))
    finally:
        sock.close()
    return v, early is not None, info


def log_checks(server, cid, logpos, v, early, shut):
    text = server.log_text()[logpos:]
    for m in SANITIZER_MARKS:
        check(m not in text, "sanitizer report in the server log: %s"
              % text[text.find(m) - 200:][:2000])
    if early is not None and not shut:
        # Dropped before it was done: the promise is a log line.
        check(server.logged_about(cid, timeout=3), "server closed the "
              "connection while %s, and logged no line naming %s"
              % (early.why, cid))
    elif v.log and (v.kind == "close" or shut):
        check(server.logged_about(cid, timeout=3), "server logged no line "
              "naming %s (%s)" % (cid, v.why))
    lines = server.logged_about(cid, timeout=0)
    check(len(lines) <= LOG_LINES_MAX, "%d log lines about one client"
          % len(lines))
    for line in lines:
        check(len(line) <= 1024, "log line of %d characters" % len(line))
        # A blank where the problem should be named (a client's own
        # strings are quoted, so cut them out first).
        bare = re.sub(r'"[^"]*("|$)', '""', line)
        check("  " not in bare.split(": ", 2)[-1] and not
              bare.rstrip().endswith(":"), "log line names nothing: %r"
              % line)


# ---- the run ----

def nbdcopy_sum(server, name):
    """sha256 of an export as read by nbdcopy, or None without it."""
    if shutil.which("nbdcopy") is None:
        return None
    d = tempfile.mkdtemp(prefix="nbdflow-mutate.")
    try:
        out = os.path.join(d, "copy")
        subprocess.run(["nbdcopy", "nbd://127.0.0.1:%d/%s"
                        % (server.port, name), out], check=True,
                       timeout=60, stdin=subprocess.DEVNULL)
        with open(out, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    finally:
        shutil.rmtree(d)


def fresh_client(server):
    """Quietly what still_serving does: a full handshake, a WRITE read
    back, DISC."""
    if not server.alive():
        raise Failure("server died (exit status %s)" % server.proc.returncode)
    c = Conn(server)
    try:
        c.greeting()
        check(c.structured_reply() == REP_ACK, "STRUCTURED_REPLY")
        check(c.go(b"scratch") == REP_ACK, "GO")
        pattern = os.urandom(4096)
        err, _ = c.do(CMD_WRITE, 4096, 4096, payload=pattern)
        check(err == 0, "fresh client WRITE: %s" % errname(err))
        err, data = c.do(CMD_READ, 4096, 4096)
        check(err == 0 and data == pattern, "fresh client reads back")
        c.request(CMD_DISC)
    finally:
        c.close()


def main(server):
    keep = random.Random(-1).randbytes(KEEP_SIZE)
    bystander = Conn(server)
    bystander.open_export(b"keep")
    expect(bystander.size == KEEP_SIZE, "bystander sees the keep export")
    for off in range(0, KEEP_SIZE, 256 << 10):
        err, _ = bystander.do(CMD_WRITE, off, 256 << 10,
                              payload=keep[off:off + (256 << 10)])
        expect_err(err, 0, "bystander WRITE at %d" % off)

    one = os.environ.get("HOSTILE_MUTATE_SEED")
    first = int(os.environ.get("HOSTILE_MUTATE_FIRST", "0"))
    seeds = ([int(one)] if one else
             range(first, first +
                   int(os.environ.get("HOSTILE_MUTATE_SEEDS", "1000"))))
    kinds = {}
    early = 0
    t0 = time.monotonic()
    ran = 0
    for seed in seeds:
        v, dropped, info = run_seed(server, seed)
        if one:
            log("%s\n  -> %s%s" % (info, v, ", dropped early" if dropped
                                     else ""))
        kinds[v.kind] = kinds.get(v.kind, 0) + 1
        if dropped and os.environ.get("HOSTILE_MUTATE_VERBOSE"):
            log("dropped early: %s\n  %s" % (v, info))
        early += dropped
        try:
            fresh_client(server)
        except (Failure, Closed) as e:
            raise Failure("after seed %d: %s (rerun with "
                          "HOSTILE_MUTATE_SEED=%d)" % (seed, e, seed))
        ran += 1
        if time.monotonic() - t0 > 240:
            log("note: stopped after %d seeds (240 s)" % ran)
            break
    log("%d seeds in %.1f s; final state: %s; %d dropped early with a "
        "log line" % (ran, time.monotonic() - t0, kinds, early))

    # Every slot came back: with the bystander, MAX_CONNECTIONS - 1 more
    # clients are all admitted at once. The last seed's client has left,
    # but its slot is freed when its loop reads the close, which may come
    # after these connect: a refusal is retried for up to 5 s (a leaked
    # slot stays refused).
    for tries in range(50):
        others = []
        try:
            for _ in range(MAX_CONNECTIONS - 1):
                others.append(Conn(server))
                others[-1].open_export(b"scratch")
            break
        except (Failure, Closed) as e:
            for c in others:
                c.close()
            if tries == 49:
                raise Failure("after 5 s, %d connections beside the "
                              "bystander are still refused a slot: %s"
                              % (MAX_CONNECTIONS - 1, e))
            time.sleep(0.1)
    expect(True, "%d connections admitted beside the bystander"
           % len(others))
    for c in others:
        c.request(CMD_DISC)
        c.close()

    got = bytearray()
    for off in range(0, KEEP_SIZE, 256 << 10):
        err, data = bystander.do(CMD_READ, off, 256 << 10)
        expect_err(err, 0, "bystander READ at %d" % off)
        got += data
    expect(bytes(got) == keep, "bystander's export unchanged")
    bystander.request(CMD_DISC)
    bystander.close()
    want = hashlib.sha256(keep).hexdigest()
    for tries in range(50):  # the bystander's slot is freed on the loop
        try:
            digest = nbdcopy_sum(server, "keep")
            break
        except subprocess.CalledProcessError as e:
            if tries == 49:
                raise Failure("nbdcopy failed: %s" % e)
            time.sleep(0.1)
    if digest is None:
        log("note: nbdcopy not installed; keep export checked by raw "
            "READ only")
    else:
        expect(digest == want, "nbdcopy reads the keep export intact")
    text = server.log_text()
    for m in SANITIZER_MARKS:
        expect(m not in text, "no %s in the server log" % m)


if __name__ == "__main__":
    run(main, exports=("scratch=memory:%d" % SCRATCH_SIZE,
                       "keep=memory:%d" % KEEP_SIZE,
                       "big=null:%d" % BIG_SIZE),
        extra=("--max-connections", str(MAX_CONNECTIONS)))
