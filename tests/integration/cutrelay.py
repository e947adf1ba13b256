#!/usr/bin/env python3
"""cutrelay.py: a TCP relay that can cut its connections without a FIN.

    cutrelay.py LISTEN_PORT TARGET [PORTFILE]

Listens on 127.0.0.1:LISTEN_PORT (0: any free port, written to PORTFILE)
and relays each connection to TARGET (a Unix socket path, or HOST:PORT).
On SIGUSR1 every connection open at that moment goes silent: nothing more
is relayed in either direction, and its sockets stay open (no FIN, no
reset), as when a network path dies. Connections made later are relayed
as usual. Used by copy-cut.sh.
"""
import os
import signal
import socket
import sys
import threading

cut_gen = 0          # connections of a generation below this are cut
gen = 0              # generation of connections accepted now
held = []            # sockets of cut connections, kept open on purpose
lock = threading.Lock()


def on_usr1(signum, frame):
    global cut_gen, gen
    with lock:
        gen += 1
        cut_gen = gen


def connect_target(target):
    if ":" in target and not target.startswith("/"):
        host, port = target.rsplit(":", 1)
        return socket.create_connection((host, int(port)))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(target)
    return s


def pump(src, dst, my_gen):
    while True:
        try:
            data = src.recv(1 << 16)
        except OSError:
            data = b""
        with lock:
            cut = my_gen < cut_gen
            if cut:
                held.extend([src, dst])
        if cut:
            return  # silent from now on: nothing read, nothing closed
        if not data:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        try:
            dst.sendall(data)
        except OSError:
            return


def main():
    port, target = int(sys.argv[1]), sys.argv[2]
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(64)
    signal.signal(signal.SIGUSR1, on_usr1)
    if len(sys.argv) > 3:
        tmp = sys.argv[3] + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % ls.getsockname()[1])
        os.rename(tmp, sys.argv[3])
    while True:
        try:
            c, _ = ls.accept()
        except InterruptedError:
            continue
        try:
            t = connect_target(target)
        except OSError:
            c.close()
            continue
        with lock:
            my_gen = gen
        for a, b in ((c, t), (t, c)):
            threading.Thread(target=pump, args=(a, b, my_gen),
                             daemon=True).start()


if __name__ == "__main__":
    main()
