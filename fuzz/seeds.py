#!/usr/bin/env python3
"""seeds.py OUTDIR: writes a seed corpus for each harness into
OUTDIR/<harness>/, built from the spec's layouts, so that fuzzing starts
from messages that decode."""
import os
import struct
import sys

IHAVEOPT = 0x49484156454F5054
REP_MAGIC = 0x3E889045565A9
REQ, XREQ = 0x25609513, 0x21E41C71
SIMPLE, STRUCT, XREPLY = 0x67446698, 0x668E33EF, 0x6E8A278C


def be(fmt, *v):
    return struct.pack(">" + fmt, *v)


def info_req(name, reqs):
    return be("I", len(name)) + name + be("H", len(reqs)) + b"".join(
        be("H", r) for r in reqs)


def meta_req(name, queries):
    return (be("I", len(name)) + name + be("I", len(queries)) +
            b"".join(be("I", len(q)) + q for q in queries))


# Client flags (FIXED_NEWSTYLE | NO_ZEROES), then options, for fuzz-server.
FLAGS = be("I", 3)
OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS, OPT_INFO, OPT_GO = (
    1, 2, 3, 5, 6, 7)
OPT_STRUCTURED, OPT_LIST_META, OPT_SET_META, OPT_EXTENDED = 8, 9, 10, 11
READ, WRITE, DISC, FLUSH, TRIM, CACHE, ZEROES, STATUS = 0, 1, 2, 3, 4, 5, 6, 7


def opt(o, data=b""):
    return be("QII", IHAVEOPT, o, len(data)) + data


def req(cmd, off, length, flags=0, cookie=1, payload=b"", ext=False):
    if ext:
        return be("IHHQQQ", XREQ, flags, cmd, cookie, off, length) + payload
    return be("IHHQQI", REQ, flags, cmd, cookie, off, length) + payload


def session(name=b"", ext=False, structured=True, meta=True):
    s = FLAGS
    if ext:
        s += opt(OPT_EXTENDED)
    elif structured:
        s += opt(OPT_STRUCTURED)
    if meta and (ext or structured):
        s += opt(OPT_SET_META, meta_req(name, [b"base:allocation"]))
    s += opt(OPT_GO, info_req(name, [3]))
    r = lambda *a, **k: req(*a, ext=ext, **k)
    s += r(WRITE, 4096, 512, payload=bytes(range(256)) * 2, cookie=1)
    s += r(READ, 0, 8192, cookie=2, flags=1 if structured else 0)
    s += r(STATUS, 0, 1 << 20, cookie=3)
    s += r(TRIM, 65536, 65536, cookie=4)
    s += r(ZEROES, 131072, 4096, cookie=5, flags=2)
    s += r(CACHE, 0, 4096, cookie=6)
    s += r(FLUSH, 0, 0, cookie=7, flags=1)
    s += r(DISC, 0, 0, cookie=8)
    return s


# What a server sends, from its greeting on, for fuzz-client; the first
# byte chooses the client's options (see fuzz-client.c).
REP_ACK, REP_SERVER, REP_INFO, REP_META = 1, 2, 3, 4
EXPORT_SIZE = 4096


def greeting():
    return b"NBDMAGIC" + b"IHAVEOPT" + be("H", 3)


def rep(o, t, data=b""):
    return be("QIII", REP_MAGIC, o, t, len(data)) + data


def go_replies():
    return (rep(OPT_GO, REP_INFO, be("HQH", 0, EXPORT_SIZE, 0x1 | 0x4 | 0x80)) +
            rep(OPT_GO, REP_INFO, be("HIII", 3, 1, 4096, 1 << 20)) +
            rep(OPT_GO, REP_INFO, be("H", 1) + b"disk") +
            rep(OPT_GO, REP_ACK))


def chunk(ext, flags, t, cookie, off, payload):
    if ext:
        return be("IHHQQQ", XREPLY, flags, t, cookie, off, len(payload)) + payload
    return be("IHHQI", STRUCT, flags, t, cookie, len(payload)) + payload


def server_stream(sel):
    ext, structured, alloc, listing = (sel & 1, sel & 2 or sel & 1, sel & 4,
                                       sel & 8)
    s = bytes([sel]) + greeting()
    if listing:
        s += rep(OPT_LIST, REP_SERVER, be("I", 4) + b"disk" + b"a disk")
        s += rep(OPT_LIST, REP_ACK)
    if ext:
        s += rep(OPT_EXTENDED, REP_ACK)
    elif structured:
        s += rep(OPT_STRUCTURED, REP_ACK)
    if structured and alloc:
        s += rep(OPT_SET_META, REP_META, be("I", 1) + b"base:allocation")
        s += rep(OPT_SET_META, REP_ACK)
    s += go_replies()
    data = bytes(range(256)) * (EXPORT_SIZE // 256)
    read_cookie, status_cookie = 1 << 32, 2 << 32 | 1
    if structured:
        s += chunk(ext, 0, 2, read_cookie, 0, be("QI", 0, 1024))
        s += chunk(ext, 1, 1, read_cookie, 0, be("Q", 1024) + data[1024:])
    else:
        s += be("IIQ", SIMPLE, 0, read_cookie) + data
    if structured and alloc:
        if ext:
            bs = be("IIQQQQ", 1, 2, 1024, 3, EXPORT_SIZE - 1024, 0)
        else:
            bs = be("IIIII", 1, 1024, 3, EXPORT_SIZE - 1024, 0)
        s += chunk(ext, 1, 6 if ext else 5, status_cookie, 0, bs)
    return s


# VHD files for fuzz-vhd (Microsoft VHD spec 1.0, src/format/vhd_layout.h):
# a footer copy at 0, the dynamic header at 512, the BAT at 1536.
def vhd_csum(b, off):
    return ~sum(b[:off] + b[off + 4:]) & 0xFFFFFFFF


def vhd_footer(size, dtype, creator=b"qemu", chs=(1004, 12, 17),
               data_offset=512):
    f = bytearray(512)
    f[0:8] = b"conectix"
    f[8:48] = be("IIQI4sII", 2, 0x10000, data_offset, 0x32A5B8E3, creator,
                 0x50003, 0x5769326B) + be("Q", size)
    f[48:64] = be("QHBBI", size, chs[0], chs[1], chs[2], dtype)
    f[68:84] = bytes(range(0x10, 0x20))
    f[64:68] = be("I", vhd_csum(f, 64))
    return bytes(f)


def vhd_header(entries, block, table=1536, parent=b"", locs=()):
    h = bytearray(1024)
    h[0:8] = b"cxsparse"
    h[8:36] = be("QQIII", 2**64 - 1, table, 0x10000, entries, block)
    if parent:
        h[40:56] = bytes(range(0x10, 0x20))
        h[56:60] = be("I", 0x32A5B800)
        name = parent.decode().encode("utf-16-be")
        h[64:64 + len(name)] = name
    for i, (code, space, length, off) in enumerate(locs):
        h[576 + 24 * i:600 + 24 * i] = be("IIIIQ", code, space, length, 0, off)
    h[36:40] = be("I", vhd_csum(h, 36))
    return bytes(h)


def vhd_bat(entries, used=()):
    bat = bytearray(b"\xff" * ((4 * entries + 511) // 512 * 512))
    for i, sector in used:
        bat[4 * i:4 * i + 4] = be("I", sector)
    return bytes(bat)


W2RU, W2KU, MACX = 0x57327275, 0x57326B75, 0x4D616358


def pad512(b):
    return b + bytes(-len(b) % 512)


def vhd_seeds():
    mib = 1 << 20
    # qemu-img's 100M dynamic disk: footer, header, BAT of 51 entries.
    dyn = vhd_footer(104865792, 3)
    seeds = [dyn + vhd_header(51, 2 * mib) + vhd_bat(51) + dyn]
    # 512-byte blocks, two of them allocated at sectors 4 and 6: a
    # bitmap sector then a data sector each.
    small = vhd_footer(4096, 3, b"tap\0", (0, 4, 17))
    bitmap = b"\xa0" + bytes(511)
    seeds.append(small + vhd_header(8, 512) + vhd_bat(8, [(0, 4), (2, 6)]) +
                 bitmap + b"A" * 512 + b"\xff" * 512 + b"B" * 512 + small)
    # A differencing disk whose locators follow the BAT.
    w2ku = "C:\\dir\\base.vhd".encode("utf-16-le")
    w2ru = ".\\base.vhd".encode("utf-16-le") + bytes(4)
    macx = b"file://./base.vhd"
    diff = vhd_footer(2 * mib, 4, b"tap\0", (60, 4, 17))
    locs = [(W2KU, 1, len(w2ku), 2048), (W2RU, 512, len(w2ru), 2560),
            (MACX, 1, len(macx), 3072)]
    seeds.append(diff + vhd_header(1, 2 * mib, parent=b"base.vhd",
                                   locs=locs) + vhd_bat(1) + pad512(w2ku) +
                 pad512(w2ru) + pad512(macx) + diff)
    # A header alone (at 0) with its locator data after it: a BOM, a host
    # in the URL, a non-BMP name.
    w2ku = "\ufeff/abs/b\U0001d11e.vhd".encode("utf-16-be")
    macx = b"file://host/abs/base%20x.vhd"
    locs = [(W2KU, 1, len(w2ku), 1024), (MACX, 1, len(macx), 1024 + len(w2ku))]
    seeds.append(vhd_header(8, 4096, parent="b\U0001d11e.vhd".encode(),
                            locs=locs) + w2ku + macx)
    # A fixed disk's footer, then the file's size as the last 8 bytes.
    fixed = vhd_footer(100 * mib, 2, b"qem2", (65535, 16, 255), 2**64 - 1)
    seeds.append(fixed + be("Q", 100 * mib + 512))
    seeds.append(vhd_footer(mib, 2, b"vpc ", (31, 4, 17), 2**64 - 1)[:511])
    # Hostile: a fixed footer with a header after it; offsets near 2^64.
    seeds.append(fixed + vhd_header(51, 2 * mib))
    far = vhd_footer(mib, 3, b"tap\0", (31, 4, 17), 2**64 - 1024)
    seeds.append(far + vhd_header(1, 2 * mib, table=2**64 - 512) +
                 be("Q", 2**64 - 1))
    # Bitmaps and text.
    seeds.append(bytes(64) + b"\xff" * 64 + b"\xf0\x0f\xaa\x55\x80\x01" +
                 bytes(17) + b"\x7f" * 9)
    seeds.append(b"\xff\xfe" + ".\\parent.vhd".encode("utf-16-le") + bytes(6))
    seeds.append(b"file:///abs/dir/base%20x.vhd\0\0")
    return seeds


# qcow2 files for fuzz-qcow2 (qemu docs/interop/qcow2.rst,
# src/format/qcow2_layout.h): the header area as qemu-img writes it, then
# L2 entries, which the harness also reads as tables.
QCOW2_MAGIC = 0x514649FB
EXT_BACKING_FORMAT, EXT_FEATURE_TABLE = 0xE2792ACA, 0x6803F857
FEATURES = [(0, 0, b"dirty bit"), (0, 1, b"corrupt bit"),
            (0, 2, b"external data file"), (0, 3, b"compression type"),
            (0, 4, b"extended L2 entries"), (1, 0, b"lazy refcounts"),
            (2, 0, b"bitmaps"), (2, 1, b"raw external data")]


def qcow2_header(version=3, bits=16, size=64 << 20, l1=1, l1_off=0x30000,
                 rc_off=0x10000, backing=(0, 0), incompat=0, hlen=112,
                 compression=0):
    h = be("IIQIIQIIQQIIQ", QCOW2_MAGIC, version, backing[0], backing[1],
           bits, size, 0, l1, l1_off, rc_off, 1, 0, 0)
    if version == 2:
        return h
    h += be("QQQII", incompat, 0, 0, 4, hlen)
    if hlen > 104:
        h += bytes([compression]) + bytes(hlen - 105)
    return h


def qcow2_ext(t, data):
    return be("II", t, len(data)) + data + bytes(-len(data) % 8)


def qcow2_features(table=FEATURES):
    return qcow2_ext(EXT_FEATURE_TABLE, b"".join(
        bytes([t, bit]) + name.ljust(46, b"\0") for t, bit, name in table))


QCOW2_END = bytes(8)


def qcow2_l2(entries, extended=False):
    if extended:
        return b"".join(be("QQ", e, s) for e, s in entries)
    return b"".join(be("Q", e) for e in entries)


def qcow2_seeds():
    copied, compressed = 1 << 63, 1 << 62
    # Normal, zero, unallocated, preallocated zero, and the two compressed
    # clusters qemu-img convert -c wrote (64 KiB clusters: x = 54).
    l2 = qcow2_l2([copied | 0x50000, 1, 0, 0x70001, compressed | 0x50000,
                   compressed | 1 << 54 | 0x5004F, copied | 0x60000])
    # Extended L2: 2 of 32 subclusters, all zero, all data, mixed.
    l2x = qcow2_l2([(copied | 0x50000, 3), (0, 0xFFFFFFFF << 32),
                    (copied | 0x60000, 0xFFFFFFFF),
                    (copied | 0x70000, 0x30 << 32 | 1),
                    (compressed | 0x80000, 0)], extended=True)
    v3 = qcow2_header() + qcow2_features() + QCOW2_END
    seeds = [
        # compat=0.10, alone and with a backing file.
        qcow2_header(version=2) + QCOW2_END + l2,
        qcow2_header(version=2, backing=(96, 8)) +
        qcow2_ext(EXT_BACKING_FORMAT, b"qcow2") + QCOW2_END + b"v2.qcow2",
        # compat=1.1: feature table, then L2 entries.
        v3 + l2,
        qcow2_header(backing=(528, 8)) +
        qcow2_ext(EXT_BACKING_FORMAT, b"qcow2") + qcow2_features() +
        QCOW2_END + b"v3.qcow2" + l2,
        qcow2_header(backing=(528, 8)) +
        qcow2_ext(EXT_BACKING_FORMAT, b"raw") + qcow2_features() +
        QCOW2_END + b"base.raw",
        qcow2_header(incompat=0x10) + qcow2_features() + QCOW2_END + l2x,
        qcow2_header(incompat=0x8, compression=1) + qcow2_features() +
        QCOW2_END,
        # 512-byte and 2 MiB clusters; a 104-byte header.
        qcow2_header(bits=9, l1=2048, l1_off=1536, rc_off=512) + QCOW2_END +
        qcow2_l2([copied | 0x4800, 1, compressed | 1 << 61 | 0x4808]),
        qcow2_header(bits=21, l1_off=6 << 20, rc_off=2 << 20) +
        qcow2_features() + QCOW2_END,
        qcow2_header(hlen=104) + QCOW2_END + l2,
        # An unknown incompatible bit the feature table names.
        qcow2_header(incompat=1 << 5) +
        qcow2_features(FEATURES + [(0, 5, b"future feature")]) + QCOW2_END,
        # Tables alone.
        l2 + qcow2_l2([0x7FFFFFFFFFFFFFFF, copied | 0x50200, 0x3F << 56]),
        l2x,
    ]
    return seeds


SEEDS = {
    "fuzz-client": [server_stream(sel) for sel in (0, 2, 6, 7, 14, 15)] + [
        bytes([6]) + greeting() + rep(OPT_STRUCTURED, REP_ACK) +
        rep(OPT_SET_META, REP_ACK) + rep(OPT_GO, 0x80000001, be("H", 0)),
    ],
    "fuzz-server": [
        session(),
        session(b"null"),
        session(b"file"),
        session(b"file", ext=True),
        session(b"", structured=False, meta=False),
        FLAGS + opt(OPT_LIST) + opt(OPT_LIST_META,
                                    meta_req(b"file", [b"base:"])) +
        opt(OPT_INFO, info_req(b"null", [0, 1, 2, 3])) + opt(OPT_STARTTLS) +
        opt(OPT_ABORT),
        FLAGS + opt(OPT_EXPORT_NAME, b"file") +
        be("IHHQQI", REQ, 0, READ, 9, 0, 512),
    ],
    "fuzz-option": [
        info_req(b"", []),
        info_req(b"disk", [0, 1, 2, 3]),
        meta_req(b"", [b"base:allocation"]),
        meta_req(b"disk", [b"base:", b"qemu:dirty-bitmap:x"]),
    ],
    "fuzz-header": [
        be("QII", IHAVEOPT, 7, 10) + bytes(16),
        be("QIII", REP_MAGIC, 7, 3, 12) + bytes(12),
        be("IHHQQI", REQ, 1, 1, 5, 4096, 65536) + bytes(4),
        be("IHHQQQ", XREQ, 0, 7, 5, 1 << 40, 1 << 33),
        be("IIQ", SIMPLE, 0, 5) + bytes(16),
        be("IHHQI", STRUCT, 1, 5, 5, 16) + bytes(12),
        be("IHHQQQ", XREPLY, 1, 6, 5, 4096, 24),
    ],
    "fuzz-payload": [
        be("HQH", 0, 1 << 30, 0x0d),
        be("HIII", 3, 512, 4096, 32 << 20),
        be("H", 1) + b"disk",
        be("I", 4) + b"disk" + b"a description",
        be("I", 1) + b"base:allocation",
        be("IH", 5, 4) + b"full",
        be("IH", 22, 2) + b"io" + be("Q", 4096),
        be("QI", 4096, 512),
        be("IIIII", 1, 4096, 3, 8192, 0),
        be("IIQQ", 1, 1, 1 << 33, 1),
    ],
    "fuzz-uri": [
        b"nbd://localhost/disk",
        b"nbd://[::1]:10810/a%20b",
        b"nbds://user@example.com/?tls-type=psk&tls-psk-file=keys.psk",
        b"nbd+unix:///disk?socket=/run/nbd.sock",
        b"nbds+unix://?socket=%2Ftmp%2Fs&tls-verify-peer=0",
        b"nbds://h:1/?tls-certificates=pki&tls-hostname=h",
    ],
    "fuzz-http": [
        b"\0http://root:pw@host:8080/import_raw_vdi?vdi=a&format=raw",
        b"\0https://[::1]/nbdproxy/import/vm/sr/vdi/dp",
        b"\1HTTP/1.1 200 OK\r\nTransfer-encoding: nbd\r\n\r\n",
        b"\1HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        b"\2PUT /import_raw_vdi?vdi=x&format=raw HTTP/1.1\r\n"
        b"Cookie: chunked=true; session_id=OpaqueRef:1\r\n\r\n",
        b"\2PUT /nbd/disk HTTP/1.1\r\nContent-Length: 4096\r\n\r\n",
        b"\3vdi=a%20b&chunked&format=raw",
        b"\4" + struct.pack("<QI", 4096, 512) + be("Q", 1 << 20),
    ],
    "fuzz-size": [b"0", b"512", b"10G", b"1.5M", b"64KiB", b"16E", b"1536K"],
    "fuzz-keyval": [b"nice = 19", b"# unbuffered = true", b"a b = 'c'",
                    b"k = \"v\" # c", b"=x==y", b"dest = http://h/#f"],
    "fuzz-ocaml-int": [b"0", b"-42", b"1_000", b"0x7fffffffffffffff",
                       b"-0x4000000000000000", b"0u12", b"0b1_0", b"0o777"],
    "fuzz-vhd": vhd_seeds(),
    "fuzz-qcow2": qcow2_seeds(),
}


def main():
    out = sys.argv[1]
    for name, seeds in SEEDS.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        for i, s in enumerate(seeds):
            with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
                f.write(s)


if __name__ == "__main__":
    main()
