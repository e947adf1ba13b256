#!/usr/bin/env python3
"""flood.py: a bounded flood of clients that never finish the handshake.

Usage: flood.py HOST PORT IDLE SLOW LIMIT_S

Opens IDLE connections that read the greeting and then say nothing, and
SLOW connections that send the client flags and an option header one
byte every half second (a handshake that never ends), all at once. The
server must close every one of them within LIMIT_S seconds of its
connect (its handshake timeout, plus slack). Prints one line per kind:
how many were closed by the server and the longest time one stayed
open; exits 1 if any outlived LIMIT_S, 0 otherwise. A connection the
server refused at once (a connection limit) counts as closed.
"""
import selectors
import socket
import struct
import sys
import time

NBDMAGIC = 0x4e42444d41474943
IHAVEOPT = 0x49484156454F5054
NBD_OPT_GO = 7


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    n_idle, n_slow, limit = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    # What a slow client drips: the client flags (fixed newstyle, no
    # zeroes), then a GO option header announcing 64 bytes that never come.
    drip = struct.pack(">I", 3) + struct.pack(">QII", IHAVEOPT, NBD_OPT_GO, 64)
    sel = selectors.DefaultSelector()
    conns = {}  # sock -> [kind, t_connect, t_closed, bytes dripped]
    for i in range(n_idle + n_slow):
        s = socket.create_connection((host, port), timeout=5)
        s.setblocking(False)
        kind = "idle" if i < n_idle else "slow"
        conns[s] = [kind, time.monotonic(), None, 0]
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + limit + 5
    next_drip = time.monotonic()
    while any(c[2] is None for c in conns.values()) and time.monotonic() < deadline:
        now = time.monotonic()
        if now >= next_drip:
            next_drip = now + 0.5
            for s, c in conns.items():
                if c[0] == "slow" and c[2] is None and c[3] < len(drip):
                    try:
                        s.send(drip[c[3]:c[3] + 1])
                        c[3] += 1
                    except OSError:
                        pass  # closed: the read below sees it
        for key, _ in sel.select(timeout=0.1):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            except BlockingIOError:
                continue
            if not data:
                conns[s][2] = time.monotonic()
                sel.unregister(s)
    bad = 0
    for kind in ("idle", "slow"):
        mine = [c for c in conns.values() if c[0] == kind]
        if not mine:
            continue
        closed = [c for c in mine if c[2] is not None]
        longest = max((c[2] - c[1] for c in closed), default=0.0)
        late = [c for c in closed if c[2] - c[1] > limit]
        print(f"{kind}: {len(closed)} of {len(mine)} closed by the server, "
              f"the longest after {longest:.1f} s (limit {limit:.0f} s)")
        bad += len(mine) - len(closed) + len(late)
    for s in conns:
        s.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
