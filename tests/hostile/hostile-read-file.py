#!/usr/bin/env python3
"""READ replies from a file on tmpfs leave straight from the file's pages:
the header first, then the data by sendfile(2) (serve-inmemory.sh traces
that they do; this test checks what the client gets). Checked byte for
byte, and each structured reply's chunk against the request:
simple and structured replies, reads at odd offsets and at the export's
end, and 48 pipelined READs that overfill the socket, so that the loop
sends the rest of each. Then the file is cut short under the server: a
READ past its new end has already had its header sent when the file runs
dry, and must go on with zeroes for what the file lost, as a hole reads,
keeping the stream in step."""
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403

MIB = 1 << 20
SIZE = 8 * MIB


def read_checked(c, data, off, n, what):
    err, got = c.do(CMD_READ, off, n)
    expect_err(err, 0, "READ %s" % what)
    expect(got == data[off:off + n], "%s reads back the file's bytes" % what)
    if c.structured:
        # one data chunk (the file has no holes) at the offset asked
        expect(len(c.chunks) == 1 and c.chunks[0][0] == REPLY_TYPE_OFFSET_DATA
               and struct.unpack(">Q", c.chunks[0][1][:8])[0] == off
               and len(c.chunks[0][1]) == 8 + n,
               "%s comes as one OFFSET_DATA chunk at %d" % (what, off))


def main(server, path, data):
    if server.peer:
        log("SKIP: checks our server's log and its file export")
        sys.exit(77)
    for structured in (True, False):
        form = "structured" if structured else "simple"
        c = Conn(server)
        c.open_export(structured=structured)
        for off, n in ((0, MIB), (4095, 12345), (SIZE - 4096, 4096),
                       (3 * MIB + 1, 2 * MIB)):
            read_checked(c, data, off, n,
                         "%s, %d bytes at %d" % (form, n, off))
        c.request(CMD_DISC)
        c.close()
    log("ok: simple and structured READs match the file")

    # Pipelined: 48 replies of up to 1 MiB are more than the socket holds
    # while nothing reads them, so most leave later, from the loop.
    c = Conn(server)
    c.open_export(structured=True)
    want = {}
    for i in range(48):
        n = random.randint(1, MIB)
        off = random.randrange(0, SIZE - n)
        cookie = 1000 + i
        want[cookie] = (off, n)
        c.request(CMD_READ, off, n, cookie=cookie)
    for _ in range(len(want)):
        err, got = c.reply()
        off, n = want.pop(c.reply_cookie)
        expect_err(err, 0, "pipelined READ of %d bytes at %d" % (n, off))
        expect(got == data[off:off + n],
               "pipelined READ of %d bytes at %d matches" % (n, off))
    c.request(CMD_DISC)
    c.close()
    log("ok: 48 pipelined READs match the file")

    # The file shrinks under the server, which still serves 8 MiB. What
    # the file lost reads as zeroes, as a hole; the header announcing the
    # data is out before the file runs dry, so the zeroes are sent after
    # what is left. Simple replies, and structured ones with DF (a single
    # data chunk: without DF the map would call the lost range a hole).
    os.truncate(path, 2 * MIB)
    want = data[:2 * MIB] + bytes(SIZE - 2 * MIB)
    for structured in (True, False):
        form = "structured" if structured else "simple"
        c = Conn(server)
        c.open_export(structured=structured)
        for off, n in ((2 * MIB - 4096, 65536), (4 * MIB, 65536)):
            flags = CMD_FLAG_DF if structured else 0
            err, got = c.do(CMD_READ, off, n, flags=flags)
            expect_err(err, 0, "%s READ of %d bytes at %d, file cut at 2 MiB"
                       % (form, n, off))
            expect(got == want[off:off + n],
                   "what the file kept, then zeroes (%s, %d at %d)"
                   % (form, n, off))
        c.request(CMD_DISC)
        c.close()
    still_serving(server, what="a file cut short")

if __name__ == "__main__":
    shm = "/dev/shm"
    fstype = subprocess.run(["stat", "-f", "-c", "%T", shm],
                            capture_output=True, text=True).stdout.strip()
    if fstype not in ("tmpfs", "ramfs"):
        log("SKIP: %s is %s, not tmpfs: READs are read into buffers there"
            % (shm, fstype or "missing"))
        sys.exit(77)
    with open("/proc/swaps") as f:
        if len(f.readlines()) > 1:
            log("SKIP: swap is active: READ data is then read into buffers")
            sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="nbdflow-read.", dir=shm)
    try:
        path = os.path.join(tmp, "export.img")
        data = os.urandom(SIZE)
        with open(path, "wb") as f:
            f.write(data)
        run(lambda server: main(server, path, data), exports=(path,))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
