#!/usr/bin/env python3
"""Out of file descriptors: a flood of connections against a server whose
fd limit is 32 (set with prlimit after it started, soft and hard, so it
cannot raise it). accept(2) fails with EMFILE while the listener stays
readable; the server must log it once per pause, not spin (its CPU time
over 3 s of flood stays far below what a spinning loop burns), keep
serving the clients it has, and accept again once fds are free."""
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(server):
    if server.peer:
        log("SKIP: needs our server's fd limit and log")
        sys.exit(77)
    if shutil.which("prlimit") is None:
        log("SKIP: prlimit not installed (Debian package: util-linux)")
        sys.exit(77)
    served = Conn(server)
    served.open_export()
    subprocess.run(["prlimit", "--pid", str(server.proc.pid),
                    "--nofile=32:32"], check=True)
    flood = []
    for _ in range(64):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", server.port))
        flood.append(s)
    t0 = cpu_seconds(server.proc.pid)
    time.sleep(3)
    spent = cpu_seconds(server.proc.pid) - t0
    expect(server.alive(), "the server survives running out of fds")
    expect(spent < 1.0, "no busy loop while out of fds (%.2f CPU s in 3 s)"
           % spent)
    lines = [l for l in server.log_text().splitlines()
             if "pausing new connections" in l]
    expect(len(lines) == 1,
           "the pause is logged once, not repeated (%d lines)" % len(lines))
    # The client accepted before the flood is still served.
    err, _ = served.do(CMD_READ, 0, 512)
    expect_err(err, 0, "a client connected before the flood")
    served.request(CMD_DISC)
    served.close()
    for s in flood:
        s.close()
    # Accepting resumes once fds are free again (the closed flood drains).
    deadline = time.monotonic() + 15
    while True:
        try:
            still_serving(server, what="running out of fds")
            break
        except (Closed, Failure, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    expect("accepting connections again" in server.log_text(),
           "the resume is logged")


run(main)
