"""unixserve.py: what the test's fake servers (fakenbd.py, tlsfake.py)
share: the accept loop, where every connection on the Unix socket at PATH
is handed to serve(sock) on a thread of its own and the loop ends after
IDLE seconds without a new connection; and reading exactly N bytes."""
import socket
import threading


def listen(path):
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path)
    return ls


def accept_loop(ls, serve, idle=60):
    ls.listen(8)
    ls.settimeout(idle)
    while True:
        try:
            c, _ = ls.accept()
        except socket.timeout:
            return
        c.settimeout(idle)
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def recv_exact(s, n):
    """n bytes from socket s; EOFError when the peer closes first."""
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b
