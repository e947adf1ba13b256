"""unixserve.py: the accept loop of the test's fake servers (fakenbd.py,
tlsfake.py): every connection on the Unix socket at PATH is handed to
serve(sock) on a thread of its own; the loop ends after IDLE seconds
without a new connection."""
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
