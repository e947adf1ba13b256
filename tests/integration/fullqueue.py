#!/usr/bin/env python3
"""fullqueue.py UNIX_PATH PORT_FILE: listeners that never accept, with
their queues full, so that a connect to them waits: one on the Unix
socket UNIX_PATH and one on a free TCP port of 127.0.0.1, which is
written to PORT_FILE once both are ready. Exits after 300 s.
fill() is also used by fakenbd.py."""
import os
import socket
import sys
import time


def fill(listener):
    """Connects to listener (backlog 0) until its queue is full; returns
    the sockets, which must stay open."""
    socks = []
    for _ in range(4):
        c = socket.socket(listener.family, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            c.connect(listener.getsockname())
        except OSError:
            pass
        socks.append(c)
    return socks


def main():
    keep = []
    for fam, addr in ((socket.AF_UNIX, sys.argv[1]),
                      (socket.AF_INET, ("127.0.0.1", 0))):
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.bind(addr)
        s.listen(0)
        keep += [s] + fill(s)
    port = s.getsockname()[1]  # the TCP listener's
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    time.sleep(300)


if __name__ == "__main__":
    main()
