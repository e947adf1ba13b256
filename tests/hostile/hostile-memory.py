#!/usr/bin/env python3
"""Memory a client can make the server hold: 32 READs of 32 MiB in flight
on each of two connections, replies left unread, would pin 2 GiB without
a per-connection budget, and kept for good if the buffers stayed on the
free list. The server's resident size (VmRSS) must stay far below that,
both while the replies wait and once the connections are idle, and every
reply must still be right. A flood of 32 MiB WRITEs with a concurrent
reader checks that reading resumes after the budget paused it."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

MAX = 32 << 20
DEPTH = 32
SIZE = DEPTH * MAX  # 1 GiB, sparse
# Far below the 2 GiB an unbounded server reaches here; far above what a
# bounded one needs (two connections x 64 MiB budget, plus the program).
PEAK_LIMIT_KIB = 640 << 10
# Idle, the server keeps only buffers of at most 4 MiB (about 4 MiB
# resident here); buffers kept after the replies would be the 64 MiB a
# connection's budget allows, so 48 MiB tells the two apart.
IDLE_LIMIT_KIB = 48 << 10


def vm_rss_kib(server):
    with open("/proc/%d/status" % server.proc.pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise Failure("no VmRSS for the server")


def marker(i):
    return (b"block %04d " % i) * 16


def make_image(path):
    """A sparse 1 GiB file with a marker at the start of each 32 MiB."""
    with open(path, "wb") as f:
        f.truncate(SIZE)
        for i in range(DEPTH):
            f.seek(i * MAX)
            f.write(marker(i))


def read_flood(server):
    conns = []
    for _ in range(2):
        c = Conn(server)
        c.open_export(structured=False)
        expect(c.size == SIZE, "export size %d" % c.size)
        for i in range(DEPTH):
            c.request(CMD_READ, i * MAX, MAX, cookie=1000 + i)
        conns.append(c)
    # The server fills what it may and stops; watch it settle.
    peak = 0
    for _ in range(30):
        time.sleep(0.2)
        peak = max(peak, vm_rss_kib(server))
    log("VmRSS with 2 x %d READs of 32 MiB unanswered: %d MiB"
        % (DEPTH, peak >> 10))
    expect(peak < PEAK_LIMIT_KIB, "resident size while replies wait "
           "(%d MiB) below %d MiB" % (peak >> 10, PEAK_LIMIT_KIB >> 10))
    zeroes = bytes(MAX)
    for c in conns:
        left = set(range(DEPTH))
        for _ in range(DEPTH):  # replies may come in any order
            err, data = c.reply(None, MAX)
            i = c.reply_cookie - 1000
            if i not in left:
                raise Failure("reply for cookie %d, not an open READ"
                              % c.reply_cookie)
            left.discard(i)
            if err or len(data) != MAX:
                raise Failure("READ %d: error %s, %d bytes"
                              % (i, errname(err), len(data)))
            m = marker(i)
            if data[:len(m)] != m or data[len(m):] != zeroes[len(m):]:
                raise Failure("READ %d returned other bytes" % i)
        log("ok: %d READs of 32 MiB answered, contents right" % DEPTH)
    idle = 0
    for _ in range(10):
        time.sleep(0.2)
        idle = vm_rss_kib(server)
    log("VmRSS with both connections idle: %d MiB" % (idle >> 10))
    expect(idle < IDLE_LIMIT_KIB, "resident size when idle (%d MiB) below "
           "%d MiB" % (idle >> 10, IDLE_LIMIT_KIB >> 10))
    for c in conns:
        c.request(CMD_DISC)
        c.close()


def write_flood(server):
    c = Conn(server)
    c.open_export(structured=True)
    payload = bytearray(os.urandom(MAX))
    failure = []

    def sender():
        try:
            for i in range(DEPTH):
                payload[:8] = struct.pack(">Q", i)
                c.request(CMD_WRITE, i * MAX, MAX, cookie=2000 + i,
                          payload=bytes(payload))
        except Exception as e:  # reported by the main thread
            failure.append(e)

    t = threading.Thread(target=sender)
    t.start()
    try:
        left = set(range(DEPTH))
        for _ in range(DEPTH):
            err, _ = c.reply()
            i = c.reply_cookie - 2000
            expect(i in left, "reply to an open WRITE (%d)" % i)
            left.discard(i)
            expect_err(err, 0, "WRITE %d of 32 MiB" % i)
    finally:
        t.join(60)
    if failure:
        raise Failure("sending the WRITEs failed: %s" % failure[0])
    expect(vm_rss_kib(server) < PEAK_LIMIT_KIB,
           "resident size after the WRITE flood below %d MiB"
           % (PEAK_LIMIT_KIB >> 10))
    for i in (0, DEPTH // 2, DEPTH - 1):
        err, data = c.do(CMD_READ, i * MAX + 4096, 4096)
        expect(err == 0 and data == payload[4096:8192],
               "WRITE %d landed" % i)
        err, data = c.do(CMD_READ, i * MAX, 8)
        expect(err == 0 and data == struct.pack(">Q", i),
               "WRITE %d is the one at its offset" % i)
    c.request(CMD_DISC)
    c.close()


def main(server):
    read_flood(server)
    write_flood(server)
    still_serving(server, what="memory floods")


if os.environ.get("HOSTILE_PEER"):
    print("SKIP: checks the resident size of our own server")
    sys.exit(77)
# Under AddressSanitizer freed memory sits in a quarantine (256 MiB by
# default) and stays resident: let such a server release it at once
# (other builds ignore the variable).
os.environ["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") +
                              ":quarantine_size_mb=0").lstrip(":")
tmp = tempfile.mkdtemp(prefix="nbdflow-hostile-mem.")
image = os.path.join(tmp, "disk.img")
try:
    make_image(image)
    run(main, exports=(image,))
finally:
    if os.path.exists(image):
        os.unlink(image)
    os.rmdir(tmp)
