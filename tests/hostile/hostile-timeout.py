#!/usr/bin/env python3
"""The handshake time limit (--handshake-timeout 1): silent and slow
clients are dropped and logged; a client in transmission is not. No timing
precision is asserted, only 'disconnected within 10 s'."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "lib"))
from rawnbd import *  # noqa: E402,F401,F403


def main(server):
    # One client finishes its handshake first and then idles in
    # transmission well past the limit: it must keep its connection.
    idle = Conn(server)
    idle.open_export()

    # Connects and sends nothing at all.
    silent = Conn(server)
    # Reads the greeting, sends its flags, then nothing.
    flags_only = Conn(server)
    flags_only.greeting()
    # Sends half an option header, then nothing.
    half = Conn(server)
    half.greeting()
    half.send(opt_bytes(OPT_LIST)[:8])
    # Keeps negotiating, one harmless option every 0.3 s: the limit is on
    # the whole handshake, so it must be dropped too.
    chatty = Conn(server)
    chatty.greeting()

    start = time.monotonic()
    chatty_dropped = False
    while time.monotonic() - start < 10 and not chatty_dropped:
        try:
            t, _ = chatty.option(OPT_LIST)
        except (Closed, Failure):
            chatty_dropped = True
            break
        time.sleep(0.3)
    for c, what in ((silent, "a silent client"),
                    (flags_only, "a client that sent only its flags"),
                    (half, "a client stuck mid option header")):
        left = max(0.5, 10 - (time.monotonic() - start))
        expect(c.wait_closed(left), "%s is disconnected within 10 s" % what)
        check_logged(server, c.client_id(), what)
        c.close()
    expect(chatty_dropped, "a client negotiating for 10 s is disconnected")
    check_logged(server, chatty.client_id(), "a client negotiating forever")
    chatty.close()

    # The client that finished its handshake is still served.
    err, _ = idle.do(CMD_READ, 0, 512)
    expect_err(err, 0, "client in transmission outlives the handshake limit")
    idle.close()
    still_serving(server, what="handshake timeouts")


run(main, extra=("--handshake-timeout", "1"))
