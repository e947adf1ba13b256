#!/bin/bash
# The spec's TLS rules (§TLS support, §NBD_OPT_STARTTLS), checked with a raw
# client that can send what real clients never would:
# - FORCEDTLS (--tls=require): before TLS every option but STARTTLS and
#   ABORT gets ERR_TLS_REQD, over-long and unknown ones included;
#   EXPORT_NAME closes the connection; ABORT is acknowledged.
# - after STARTTLS: never ERR_TLS_REQD; a second STARTTLS gets ERR_INVALID;
#   structured replies, extended headers and meta contexts negotiated in
#   clear are forgotten; plaintext sent behind STARTTLS closes the
#   connection.
# - NOTLS (--tls=off): STARTTLS gets ERR_POLICY, nothing gets ERR_TLS_REQD.
# - SELECTIVETLS with no TLS-only export (--tls=on): clear clients are
#   served and never see ERR_TLS_REQD.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls-pki.inc"

python3 -c 'import ssl' 2>/dev/null || skip "python3 has no ssl module"
tmpdir_make
pki_ca "$TMP/ca" "nbdflow test CA"
pki_dir "$TMP/ca" "$TMP/pki"
export NBDFLOW

python3 - "$REPO_DIR/tests/hostile/lib" "$TMP/pki" <<'PY'
import os
import socket
import ssl
import struct
import sys

sys.path.insert(0, sys.argv[1])
from rawnbd import *  # noqa: E402,F403

PKI = sys.argv[2]
OPT_EXTENDED_HEADERS = 11
REP_ERR_TLS_REQD = REP_FLAG_ERROR | 5


def tls_wrap(c):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(os.path.join(PKI, "ca-cert.pem"))
    c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
    c.sock.settimeout(IO_TIMEOUT)
    log("ok: TLS up: %s %s" % (c.sock.version(), c.sock.cipher()[0]))


def starttls(c):
    t, _ = c.option(OPT_STARTTLS)
    expect_rep(t, REP_ACK, "STARTTLS")
    tls_wrap(c)


def never_tls_reqd(c, what):
    """Options that must not get ERR_TLS_REQD in this state."""
    t, replies = c.option(OPT_LIST)
    expect(t == REP_ACK and any(rt == REP_SERVER for rt, _ in replies),
           "%s: LIST answered with the export (%s)" % (what, repname(t)))
    t, _ = c.option(99)
    expect_rep(t, REP_ERR_UNSUP, "%s: unknown option 99" % what)


def forced(server):
    # Every option but STARTTLS and ABORT: ERR_TLS_REQD.
    c = Conn(server)
    c.greeting()
    for opt, data in [(OPT_LIST, b""),
                      (OPT_INFO, info_data(b"", [INFO_BLOCK_SIZE])),
                      (OPT_GO, info_data(b"", [INFO_BLOCK_SIZE])),
                      (OPT_STRUCTURED_REPLY, b""),
                      (OPT_EXTENDED_HEADERS, b""),
                      (OPT_LIST_META_CONTEXT, meta_data(b"", ["base:"])),
                      (OPT_SET_META_CONTEXT,
                       meta_data(b"", ["base:allocation"])),
                      (99, b"x" * 10),
                      (OPT_INFO, b"\0" * (100 << 10))]:
        t, _ = c.option(opt, data)
        expect_rep(t, REP_ERR_TLS_REQD,
                   "before TLS, option %d (%d bytes)" % (opt, len(data)))
    t, _ = c.option(OPT_STARTTLS, b"junk")
    expect_rep(t, REP_ERR_INVALID, "STARTTLS with data")
    starttls(c)
    never_tls_reqd(c, "after STARTTLS")
    t, _ = c.option(OPT_STARTTLS)
    expect_rep(t, REP_ERR_INVALID, "second STARTTLS")
    expect_rep(c.go(b""), REP_ACK, "GO inside TLS")
    data = os.urandom(8192)
    err, _ = c.do(CMD_WRITE, 0, len(data), payload=data)
    expect_err(err, 0, "WRITE inside TLS")
    err, back = c.do(CMD_READ, 0, len(data))
    expect_err(err, 0, "READ inside TLS")
    expect(back == data, "READ returned what WRITE wrote")
    c.request(CMD_DISC)
    c.close()

    # EXPORT_NAME before TLS cannot be refused: the connection ends.
    c = Conn(server)
    c.greeting()
    c.send(opt_bytes(OPT_EXPORT_NAME, b""))
    expect(c.wait_closed(), "EXPORT_NAME before TLS closes the connection")
    check_logged(server, c.client_id(), "EXPORT_NAME before TLS",
                 "TLS is required")
    c.close()

    # A client without fixed newstyle never gets TLS, so nothing at all.
    c = Conn(server)
    c.greeting(cflags=0)
    c.send(opt_bytes(OPT_EXPORT_NAME, b""))
    expect(c.wait_closed(), "unfixed newstyle EXPORT_NAME closes")
    c.close()

    # ABORT is served in clear.
    c = Conn(server)
    c.greeting()
    t, _ = c.option(OPT_ABORT)
    expect_rep(t, REP_ACK, "ABORT before TLS")
    expect(c.wait_closed(), "connection closed after ABORT")
    c.close()

    # Plaintext sent behind STARTTLS (before our ACK) never reaches TLS or
    # the option parser: an injected command must not run.
    c = Conn(server)
    c.greeting()
    c.send(opt_bytes(OPT_STARTTLS) + opt_bytes(OPT_LIST))
    o, t, _ = c.opt_reply()
    expect(c.wait_closed(), "plaintext behind STARTTLS closes the connection")
    check_logged(server, c.client_id(), "plaintext behind STARTTLS",
                 "in clear behind STARTTLS")
    c.close()
    tls_serving(server)


def tls_serving(server):
    c = Conn(server)
    c.greeting()
    starttls(c)
    expect_rep(c.go(b""), REP_ACK, "GO")
    err, _ = c.do(CMD_READ, 0, 4096)
    expect_err(err, 0, "READ from a fresh TLS client")
    c.request(CMD_DISC)
    c.close()
    expect(server.alive(), "server alive")


def selective(server):
    # State negotiated in clear is gone after STARTTLS.
    c = Conn(server)
    c.greeting()
    never_tls_reqd(c, "--tls=on, in clear")
    t, _ = c.option(OPT_EXTENDED_HEADERS)
    expect_rep(t, REP_ACK, "EXTENDED_HEADERS in clear")
    t, _ = c.option(OPT_SET_META_CONTEXT, meta_data(b"", ["base:allocation"]))
    expect_rep(t, REP_ACK, "SET_META_CONTEXT in clear")
    starttls(c)
    never_tls_reqd(c, "--tls=on, after STARTTLS")
    t, _ = c.option(OPT_SET_META_CONTEXT, meta_data(b"", ["base:allocation"]))
    expect_rep(t, REP_ERR_INVALID,
               "SET_META_CONTEXT after STARTTLS without STRUCTURED_REPLY "
               "(structured replies and extended headers forgotten)")
    expect_rep(c.go(b""), REP_ACK, "GO")
    # Compact 28-byte requests and simple replies: extended headers and
    # structured replies are off.
    c.request(CMD_READ, 0, 512, cookie=7)
    magic = struct.unpack(">I", c.recv_exact(4))[0]
    expect(magic == SIMPLE_REPLY_MAGIC,
           "READ after STARTTLS gets a simple reply (0x%08x)" % magic)
    err, ck = struct.unpack(">IQ", c.recv_exact(12))
    expect(err == 0 and ck == 7, "simple reply ok")
    c.recv_exact(512)
    c.request(CMD_DISC)
    c.close()

    # Meta contexts selected in clear are forgotten too.
    c = Conn(server)
    c.greeting()
    expect_rep(c.structured_reply(), REP_ACK, "STRUCTURED_REPLY in clear")
    t, _ = c.option(OPT_SET_META_CONTEXT, meta_data(b"", ["base:allocation"]))
    expect_rep(t, REP_ACK, "SET_META_CONTEXT in clear")
    starttls(c)
    expect_rep(c.structured_reply(), REP_ACK,
               "STRUCTURED_REPLY again after STARTTLS (not 'already on')")
    expect_rep(c.go(b""), REP_ACK, "GO")
    err, _ = c.do(CMD_BLOCK_STATUS, 0, 4096)
    expect_err(err, EINVAL, "BLOCK_STATUS without a context chosen in TLS")
    c.request(CMD_DISC)
    c.close()

    # A clear client is served whole.
    still_serving(server, what="--tls=on clear client")


def notls(server):
    c = Conn(server)
    c.greeting()
    t, _ = c.option(OPT_STARTTLS)
    expect_rep(t, REP_ERR_POLICY, "STARTTLS with --tls=off")
    never_tls_reqd(c, "--tls=off")
    expect_rep(c.go(b""), REP_ACK, "GO with --tls=off")
    c.request(CMD_DISC)
    c.close()


def one(fn, extra):
    server = Server(["memory:1M"], extra)
    try:
        fn(server)
        status = server.stop()
        if status != 0:
            raise Failure("server exit status %s after SIGTERM" % status)
    except (Failure, Closed) as e:
        log("--- server log:")
        log(server.log_text()[-6000:])
        log("FAIL: %s: %s" % (fn.__name__, e))
        sys.exit(1)
    finally:
        server.cleanup()


one(forced, ["--tls=require", "--tls-certs", PKI])
one(selective, ["--tls=on", "--tls-certs", PKI])
one(notls, [])
log("PASS: TLS rules of the spec (FORCEDTLS, SELECTIVETLS, NOTLS)")
PY
