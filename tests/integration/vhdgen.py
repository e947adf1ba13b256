#!/usr/bin/env python3
"""vhdgen.py: a VHD generator and reader model for nbdflow's tests.

Written from the Microsoft VHD specification 1.0 (hard disk footer, dynamic
disk header, block allocation table, sector bitmaps, parent locators) and
XenServer's tdbatmap, independently of nbdflow's C code, so that the tests
compare nbdflow against a second implementation rather than against itself.
Python 3 standard library only.

  vhdgen.py make OUT.vhd --type fixed|dynamic|diff [--size BYTES]
            [--block-size N] [--parent P.vhd] [--locators LIST]
            [--creator C] [--data SPEC] [--garbage] [--seed N]
            [--header-offset N] [--bat-gap SECTORS] [--bat-entries N]
            [--old-footer] [--batmap [wrong|right]] [--order shuffled|sequential]
            [--uuid HEX] [--expect OUT.raw]
  vhdgen.py read IN.vhd OUT.raw [--ignore-checksums]
  vhdgen.py map IN.vhd [--chain]
  vhdgen.py info IN.vhd
  vhdgen.py relink CHILD.vhd --parent P.vhd
  vhdgen.py corrupt IN.vhd OUT.vhd --kind KIND

make
  --type      fixed: the data, then the footer. dynamic: footer copy at 0,
              dynamic header, BAT, blocks (bitmap + data), footer.
              diff: a dynamic layout whose clear bits read the parent.
  --size      virtual size in bytes, a multiple of 512 (K, M, G, T suffixes
              allowed); for diff, defaults to the parent's size.
  --block-size  a power of two >= 512 (default 2M).
  --parent    the parent (diff): its footer UUID goes into the header, its
              file name (UTF-16BE) into the parent name, and one parent
              locator per --locators entry, in that order:
                w2ru      relative Windows path, UTF-16LE (".\\base.vhd")
                w2ku      absolute path, '/' turned into '\\', UTF-16LE
                macx      "file://./REL" relative URL, UTF-8
                macx-abs  "file:///ABS" URL, UTF-8
                missing   a W2ru locator naming a file that does not exist
                          (a reader must go on to the next locator)
              Relative paths are relative to the child's directory. Data
              space: W2ku's is written in bytes, the others' in sectors
              (both conventions occur in the wild); each holds 2 sectors
              at least, so that relink can rewrite it in place.
  --creator   the footer's creator application (default 'tap\\0'; '\\0' is
              a NUL). 'vpc ' and 'qemu' make qemu take the size from the CHS
              geometry: refused unless the size equals it.
  --data      what is written, items separated by ';' or spaces:
                block:0,3,7-9    whole blocks: every bitmap bit set, random data
                sect:100-140,2000  sectors (inclusive ranges) with their
                                 bitmap bits set; the other bits of their
                                 blocks stay clear
                empty:4          an allocated block with every bit clear
                zblock:5         an allocated block, every bit set, zeros
                all              every block, as block:
              A fixed disk takes block: and sect: (random data there,
              zeros elsewhere).
  --garbage   allocated blocks hold random bytes under their clear bits (and
              in the bitmap's padding): a reader must not show them.
  --header-offset  byte offset of the dynamic header (default 512); a gap
              of random bytes lies between the footer copy and it.
  --bat-gap   sectors of random bytes between the header and the BAT.
  --bat-entries  BAT length, if more than the size needs.
  --old-footer   the last footer is 511 bytes (Virtual PC before 2004).
  --batmap    a XenServer tdbatmap after the BAT; "wrong" (the default) sets
              every bit (claims every block fully allocated, which it is
              not), "right" sets the bits of blocks whose bitmap is full.
  --order     where allocated blocks lie in the file: shuffled (default)
              or in virtual order.
  --seed      the random data, garbage and order (default: from OUT's file
              name, so that images of a chain never hold the same bytes);
              UUIDs are always fresh (--uuid HEX to choose one).
  --expect    writes the bytes a correct reader returns (a diff disk: its
              set sectors over its parent's, read by this reader model).
  Every image made is read back by the reader model and compared with the
  generation model before vhdgen exits.

read/map/info: the reader model. read writes the virtual disk; map prints
  the allocation map as "nbdflow info --map" does (data: sectors whose bits
  are set in allocated blocks, or a fixed disk's whole size; the rest
  "hole,zero"; --chain: data in any image of the chain); info prints JSON
  (disk-type, size, block-size, allocated, parents, uuid).

relink: points a diff disk at another parent (UUID, name, locators rewritten
  in place, relative forms where the locator was relative).

corrupt KIND: footer-checksum, header-checksum (only the stored checksums
  are wrong: content intact), truncated (cut in the middle of the last
  block in the file, no footer at the end), bat-past-end (an entry points
  past the end of the file), block-size-not-pow2 (3 MiB, header checksum
  recomputed), parent-uuid (a new UUID in both footers of IN), loop (OUT's
  locators point at OUT itself, its parent UUID is its own),
  footer-copy-mismatch (the copy at 0 says another current size),
  disk-type (type 5, checksums right), fixed-as-dynamic (a fixed disk's
  footer says type 3).
"""

import argparse
import os
import random
import struct
import sys
import time
import uuid as uuidlib
import zlib

SECTOR = 512
VHD_EPOCH = 946684800  # 2000-01-01 00:00:00 UTC
UNUSED = 0xFFFFFFFF
MAX_SIZE = 2040 << 30
TYPES = {"fixed": 2, "dynamic": 3, "diff": 4}
TYPE_NAMES = {2: "fixed", 3: "dynamic", 4: "differencing"}
LOC_W2RU = 0x57327275
LOC_W2KU = 0x57326B75
LOC_MACX = 0x4D616358
LOC_MIN_SPACE = 2 * SECTOR


class VHDError(Exception):
    pass


def die(msg):
    print("vhdgen: error: %s" % msg, file=sys.stderr)
    sys.exit(1)


def align(n, a=SECTOR):
    return (n + a - 1) // a * a


def parse_size(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if s and s[-1].upper() in mult:
        return int(s[:-1]) * mult[s[-1].upper()]
    return int(s, 0)


def checksum(buf, off):
    """The spec's checksum: ones' complement of the byte sum, the 4 bytes
    at off counted as zero."""
    return ~(sum(buf) - sum(buf[off:off + 4])) & 0xFFFFFFFF


def geometry(size):
    """CHS geometry of the spec's appendix."""
    total = size // SECTOR
    if total > 65535 * 16 * 255:
        total = 65535 * 16 * 255
    if total >= 65535 * 16 * 63:
        spt, heads = 255, 16
        cth = total // spt
    else:
        spt = 17
        cth = total // spt
        heads = max((cth + 1023) // 1024, 4)
        if cth >= heads * 1024 or heads > 16:
            spt, heads = 31, 16
            cth = total // spt
        if cth >= heads * 1024:
            spt, heads = 63, 16
            cth = total // spt
    return cth // heads, heads, spt


def bitmap_len(block_size):
    return align((block_size // SECTOR + 7) // 8)


def creator_bytes(s):
    b = s.replace("\\0", "\0").encode("latin-1")
    if len(b) != 4:
        die("--creator must be 4 bytes (got %r)" % b)
    return b


# ---- Structures ---------------------------------------------------------------

def make_footer(dtype, data_offset, size, creator, uid, timestamp,
                saved_state=0):
    cyl, heads, spt = geometry(size)
    f = bytearray(512)
    f[0:8] = b"conectix"
    struct.pack_into(">IIQI4sI4sQQHBBI", f, 8,
                     2, 0x00010000, data_offset, timestamp, creator,
                     0x00010003, b"Wi2k", size, size, cyl, heads, spt, dtype)
    f[68:84] = uid
    f[84] = saved_state
    struct.pack_into(">I", f, 64, checksum(f, 64))
    return f


def parse_footer(b):
    if len(b) < 511 or b[0:8] != b"conectix":
        raise VHDError("no VHD footer (cookie %r)" % bytes(b[0:8]))
    b = bytes(b[:512]).ljust(512, b"\0")
    (features, version, data_offset, ts, creator, cver, cos, orig, cur,
     cyl, heads, spt, dtype) = struct.unpack_from(">IIQI4sI4sQQHBBI", b, 8)
    stored = struct.unpack_from(">I", b, 64)[0]
    return {
        "raw": b, "data_offset": data_offset, "timestamp": ts,
        "creator": creator, "size": cur, "chs": (cyl, heads, spt),
        "type": dtype, "checksum_ok": stored == checksum(b, 64),
        "uuid": b[68:84],
    }


def make_header(table_offset, entries, block_size, parent_uuid=bytes(16),
                parent_ts=0, parent_name="", locators=()):
    h = bytearray(1024)
    h[0:8] = b"cxsparse"
    struct.pack_into(">QQIII", h, 8, 0xFFFFFFFFFFFFFFFF, table_offset,
                     0x00010000, entries, block_size)
    h[40:56] = parent_uuid
    struct.pack_into(">I", h, 56, parent_ts)
    name = parent_name.encode("utf-16-be")[:512]
    h[64:64 + len(name)] = name
    for i, (code, space, length, off) in enumerate(locators):
        struct.pack_into(">IIIIQ", h, 576 + 24 * i, code, space, length, 0,
                         off)
    struct.pack_into(">I", h, 36, checksum(h, 36))
    return h


def parse_header(b):
    if b[0:8] != b"cxsparse":
        raise VHDError("no dynamic header (cookie %r)" % bytes(b[0:8]))
    _, table_offset, version, entries, block_size = struct.unpack_from(
        ">QQIII", b, 8)
    stored = struct.unpack_from(">I", b, 36)[0]
    locs = []
    for i in range(8):
        code, space, length, _, off = struct.unpack_from(">IIIIQ", b,
                                                         576 + 24 * i)
        locs.append((code, space, length, off))
    name = bytes(b[64:576]).decode("utf-16-be", "replace").split("\0")[0]
    return {
        "table_offset": table_offset, "entries": entries,
        "block_size": block_size, "checksum_ok": stored == checksum(b, 36),
        "parent_uuid": bytes(b[40:56]),
        "parent_ts": struct.unpack_from(">I", b, 56)[0],
        "parent_name": name, "locators": locs,
    }


def locator_space_bytes(space):
    """Data space as stored: sectors by the spec, bytes from some writers
    (values below 512 can only be sectors)."""
    return space * SECTOR if space < SECTOR else space


def locator_path(code, data, child_dir):
    """The path a locator names, or None for a kind we do not follow."""
    if code in (LOC_W2RU, LOC_W2KU):
        s = data.decode("utf-16-le", "replace").replace("\0", "")
        s = s.replace("\\", "/")
        if len(s) >= 2 and s[1] == ":":
            s = s[2:]  # a drive letter
        if code == LOC_W2KU:
            return os.path.normpath(s)
    elif code == LOC_MACX:
        s = data.decode("utf-8", "replace").replace("\0", "")
        if s.startswith("file://"):
            s = s[len("file://"):]
        if s.startswith("/"):
            return os.path.normpath(s)
    else:
        return None
    return os.path.normpath(s if s.startswith("/")
                            else os.path.join(child_dir, s))


# ---- The reader model -----------------------------------------------------------

class Reader:
    """A VHD as a correct reader sees it: opens the parent chain through the
    locators, checking UUIDs and loops."""

    def __init__(self, path, ignore_checksums=False, seen=None):
        self.path = path
        self.f = open(path, "rb")
        st = os.fstat(self.f.fileno())
        seen = dict(seen or {})
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise VHDError("%s: parent chain loop (back to %s)"
                           % (path, seen[key]))
        seen[key] = path
        fsize = st.st_size
        self.fsize = fsize
        flen = 511 if fsize % SECTOR == 511 else 512
        if fsize < flen:
            raise VHDError("%s: shorter than a footer" % path)
        try:
            foot = parse_footer(self.pread(fsize - flen, flen))
        except VHDError as e:
            raise VHDError("%s: %s at the end: truncated?" % (path, e))
        if not foot["checksum_ok"] and not ignore_checksums:
            raise VHDError("%s: footer checksum wrong" % path)
        self.footer = foot
        self.type = foot["type"]
        self.size = foot["size"]
        if foot["creator"] in (b"vpc ", b"qemu") and \
                foot["chs"] != (65535, 16, 255):
            c, h, s = foot["chs"]
            self.size = c * h * s * SECTOR
        if self.size % SECTOR or self.size > MAX_SIZE:
            raise VHDError("%s: bad size %d" % (path, self.size))
        self.parent = None
        self.parents = []
        if self.type == 2:
            if self.size + flen > fsize:
                raise VHDError("%s: fixed disk shorter than its size" % path)
            return
        if self.type not in (3, 4):
            raise VHDError("%s: disk type %d" % (path, self.type))
        copy = parse_footer(self.pread(0, 512))
        if copy["raw"][:511] != foot["raw"][:511]:
            raise VHDError("%s: footer copy at 0 differs from the footer"
                           % path)
        hdr_off = foot["data_offset"]
        if hdr_off + 1024 > fsize - flen:
            raise VHDError("%s: header past the end" % path)
        hdr = parse_header(self.pread(hdr_off, 1024))
        if not hdr["checksum_ok"] and not ignore_checksums:
            raise VHDError("%s: header checksum wrong" % path)
        self.hdr = hdr
        bs = hdr["block_size"]
        if bs < SECTOR or bs & (bs - 1):
            raise VHDError("%s: block size %d not a power of two" % (path, bs))
        self.block_size = bs
        self.bm_len = bitmap_len(bs)
        self.spb = bs // SECTOR
        need = (self.size + bs - 1) // bs
        if hdr["entries"] < need:
            raise VHDError("%s: BAT of %d entries, %d needed"
                           % (path, hdr["entries"], need))
        raw = self.pread(hdr["table_offset"], 4 * hdr["entries"])
        if len(raw) != 4 * hdr["entries"]:
            raise VHDError("%s: BAT past the end" % path)
        self.bat = list(struct.unpack(">%dI" % hdr["entries"], raw))[:need]
        for i, e in enumerate(self.bat):
            if e != UNUSED and e * SECTOR + self.bm_len + bs > fsize - flen:
                raise VHDError("%s: BAT entry %d (sector %d) past the end; "
                               "truncated?" % (path, i, e))
        self.bitmaps = {}
        if self.type == 4:
            self.open_parent(ignore_checksums, seen)

    def pread(self, off, n):
        self.f.seek(off)
        return self.f.read(n)

    def open_parent(self, ignore_checksums, seen):
        child_dir = os.path.dirname(os.path.abspath(self.path))
        tried = []
        for code, space, length, off in self.hdr["locators"]:
            p = locator_path(code, self.pread(off, length), child_dir)
            if p is None:
                continue
            tried.append(p)
            if os.path.exists(p):
                break
        else:
            raise VHDError("%s: parent not found (looked for %s)"
                           % (self.path, ", ".join(tried) or "nothing"))
        par = Reader(p, ignore_checksums, seen)
        if par.footer["uuid"] != self.hdr["parent_uuid"]:
            raise VHDError("%s: parent %s has UUID %s, want %s"
                           % (self.path, p, uuidlib.UUID(
                               bytes=par.footer["uuid"]),
                              uuidlib.UUID(bytes=self.hdr["parent_uuid"])))
        self.parent = par
        self.parents = [p] + par.parents

    def bitmap(self, b):
        if b not in self.bitmaps:
            self.bitmaps[b] = self.pread(self.bat[b] * SECTOR, self.bm_len)
        return self.bitmaps[b]

    def sector_set(self, s):
        b, i = divmod(s, self.spb)
        if self.bat[b] == UNUSED:
            return False
        return bool(self.bitmap(b)[i // 8] & (0x80 >> (i % 8)))

    def read_all(self):
        if self.type == 2:
            return bytearray(self.pread(0, self.size))
        if self.parent is not None:
            out = self.parent.read_all()[:self.size]
            out += bytes(self.size - len(out))
        else:
            out = bytearray(self.size)
        for b, e in enumerate(self.bat):
            if e == UNUSED:
                continue
            data = self.pread(e * SECTOR + self.bm_len, self.block_size)
            for i in range(self.spb):
                s = b * self.spb + i
                if s * SECTOR >= self.size:
                    break
                if self.sector_set(s):
                    out[s * SECTOR:(s + 1) * SECTOR] = \
                        data[i * SECTOR:(i + 1) * SECTOR]
        return out

    def data_sectors(self, chain):
        """The set of sectors the image (with chain, its ancestors too)
        holds data for; a fixed disk holds all."""
        n = self.size // SECTOR
        if self.type == 2:
            return set(range(n))
        got = set()
        for b, e in enumerate(self.bat):
            if e == UNUSED:
                continue
            for s in range(b * self.spb, min((b + 1) * self.spb, n)):
                if self.sector_set(s):
                    got.add(s)
        if chain and self.parent is not None:
            got |= {s for s in self.parent.data_sectors(True) if s < n}
        return got

    def map_runs(self, chain):
        data = self.data_sectors(chain)
        runs = []
        for s in range(self.size // SECTOR):
            t = 0 if s in data else 3
            if runs and runs[-1][2] == t:
                runs[-1][1] += SECTOR
            else:
                runs.append([s * SECTOR, SECTOR, t])
        return runs

    def allocated(self):
        if self.type == 2:
            return self.size
        return sum(1 for e in self.bat if e != UNUSED) * self.block_size


# ---- make ------------------------------------------------------------------------

def parse_list(s):
    out = []
    for part in s.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a, 0), int(b, 0) + 1))
        else:
            out.append(int(part, 0))
    return out


class Block:
    def __init__(self, spb, bm_len, block_size, rng, garbage):
        self.bits = bytearray(bm_len)
        if garbage:
            self.data = bytearray(rng.randbytes(block_size))
            for i in range((spb + 7) // 8, bm_len):
                self.bits[i] = 0x5A  # padding past the last sector's bit
            if spb % 8:
                # the unused low bits of the last byte of the sector bits
                self.bits[spb // 8] |= 0xFF >> (spb % 8)
        else:
            self.data = bytearray(block_size)
        self.spb = spb

    def set_all(self):
        for i in range(self.spb):
            self.bits[i // 8] |= 0x80 >> (i % 8)

    def is_set(self, i):
        return bool(self.bits[i // 8] & (0x80 >> (i % 8)))

    def full(self):
        return all(self.is_set(i) for i in range(self.spb))


def relpath_forms(target, child):
    """(relative POSIX path, absolute path) of target as seen from child's
    directory."""
    target = os.path.abspath(target)
    rel = os.path.relpath(target, os.path.dirname(os.path.abspath(child)))
    return rel, target


def locator_blob(kind, target, child):
    rel, absp = relpath_forms(target, child)
    winrel = rel.replace("/", "\\")
    if not winrel.startswith(".."):
        winrel = ".\\" + winrel
    if kind == "w2ru":
        return LOC_W2RU, winrel.encode("utf-16-le"), False
    if kind == "w2ku":
        return LOC_W2KU, absp.replace("/", "\\").encode("utf-16-le"), True
    if kind == "macx":
        return LOC_MACX, ("file://./" + rel).encode("utf-8"), False
    if kind == "macx-abs":
        return LOC_MACX, ("file://" + absp).encode("utf-8"), False
    if kind == "missing":
        return LOC_W2RU, ".\\no-such-parent.vhd".encode("utf-16-le"), False
    die("unknown locator kind %r (w2ru, w2ku, macx, macx-abs, missing)"
        % kind)


def cmd_make(a):
    if a.seed is None:
        # distinct images get distinct data unless told otherwise
        a.seed = zlib.crc32(os.path.basename(a.out).encode())
    rng = random.Random(a.seed)
    dtype = TYPES[a.type]
    creator = creator_bytes(a.creator)
    block_size = parse_size(a.block_size)
    if block_size < SECTOR or block_size & (block_size - 1):
        die("--block-size must be a power of two >= 512")
    parent = None
    if dtype == 4:
        if not a.parent:
            die("--type diff needs --parent")
        try:
            parent = Reader(a.parent)
        except (VHDError, OSError) as e:
            die("parent: %s" % e)
    elif a.parent:
        die("--parent is for --type diff")
    if a.size is not None:
        size = parse_size(a.size)
    elif parent is not None:
        size = parent.size
    else:
        die("--size is needed")
    if size <= 0 or size % SECTOR:
        die("--size must be a positive multiple of 512")
    if creator in (b"vpc ", b"qemu"):
        c, h, s = geometry(size)
        if c * h * s * SECTOR != size:
            die("creator %r takes the size from CHS geometry (%d bytes), "
                "not %d" % (creator, c * h * s * SECTOR, size))
    nsect = size // SECTOR
    spb = block_size // SECTOR
    need = (size + block_size - 1) // block_size
    entries = a.bat_entries or need
    if entries < need:
        die("--bat-entries below the %d the size needs" % need)
    bm_len = bitmap_len(block_size)
    uid = bytes.fromhex(a.uuid.replace("-", "")) if a.uuid \
        else uuidlib.uuid4().bytes
    ts = a.timestamp if a.timestamp is not None \
        else int(time.time()) - VHD_EPOCH

    # The generation model.
    blocks = {}

    def blk(b):
        if not 0 <= b < need:
            die("block %d outside the disk (%d blocks)" % (b, need))
        if b not in blocks:
            blocks[b] = Block(spb, bm_len, block_size, rng,
                              a.garbage and dtype != 2)
        return blocks[b]

    for item in a.data.replace(";", " ").split():
        kind, _, arg = item.partition(":")
        if kind == "all":
            idx, kind = range(need), "block"
        elif kind in ("block", "empty", "zblock"):
            idx = parse_list(arg)
        elif kind == "sect":
            for s in parse_list(arg):
                if not 0 <= s < nsect:
                    die("sector %d outside the disk (%d sectors)"
                        % (s, nsect))
                bk = blk(s // spb)
                i = s % spb
                bk.bits[i // 8] |= 0x80 >> (i % 8)
                bk.data[i * SECTOR:(i + 1) * SECTOR] = rng.randbytes(SECTOR)
            continue
        else:
            die("unknown --data item %r" % item)
        for b in idx:
            bk = blk(b)
            if kind == "block":
                bk.set_all()
                bk.data[:] = rng.randbytes(block_size)
            elif kind == "zblock":
                bk.set_all()
                bk.data[:] = bytes(block_size)
            # empty: allocated by blk(), no bit set by this item

    # Expected bytes.
    if parent is not None:
        expect = parent.read_all()[:size]
        expect += bytes(size - len(expect))
    else:
        expect = bytearray(size)
    for b, bk in blocks.items():
        full = bk.full()
        lo = b * block_size
        hi = min(lo + block_size, size)
        if full or dtype == 2:
            # a fixed disk: the whole block as generated (zeros where unset)
            expect[lo:hi] = bk.data[:hi - lo]
            continue
        for i in range(spb):
            s = b * spb + i
            if s >= nsect:
                break
            if bk.is_set(i):
                expect[s * SECTOR:(s + 1) * SECTOR] = \
                    bk.data[i * SECTOR:(i + 1) * SECTOR]

    flen = 511 if a.old_footer else 512
    with open(a.out, "wb") as f:
        if dtype == 2:
            if a.batmap or a.header_offset != 512 or a.bat_gap or \
                    a.bat_entries:
                die("dynamic-only options given for a fixed disk")
            f.truncate(size)
            for b, bk in blocks.items():
                f.seek(b * block_size)
                f.write(expect[b * block_size:
                               min((b + 1) * block_size, size)])
            f.seek(size)
            f.write(make_footer(2, 0xFFFFFFFFFFFFFFFF, size, creator, uid,
                                ts)[:flen])
        else:
            write_dynamic(f, a, rng, dtype, size, creator, uid, ts,
                          block_size, entries, bm_len, blocks, flen)
    if a.expect:
        with open(a.expect, "wb") as f:
            f.write(expect)
    # Self-check: the reader model agrees with the generation model.
    try:
        r = Reader(a.out)
        got = r.read_all()
    except VHDError as e:
        die("self-check: the image made does not read back: %s" % e)
    if got != expect:
        die("self-check: the reader model disagrees with the generator")


def write_dynamic(f, a, rng, dtype, size, creator, uid, ts, block_size,
                  entries, bm_len, blocks, flen):
    hdr_off = a.header_offset
    if hdr_off < 512:
        die("--header-offset must be >= 512")
    pos = align(hdr_off + 1024) + a.bat_gap * SECTOR
    table_off = pos
    pos += align(4 * entries)
    batmap_hdr = None
    if a.batmap:
        batmap_hdr = pos
        batmap_secs = max(1, align((entries + 7) // 8) // SECTOR)
        pos += SECTOR + batmap_secs * SECTOR
    locs = []
    loc_blobs = []
    pname = ""
    puuid = bytes(16)
    pts = 0
    if dtype == 4:
        pname = os.path.basename(a.parent)
        puuid = Reader(a.parent).footer["uuid"]
        pts = max(0, int(os.stat(a.parent).st_mtime) - VHD_EPOCH)
        kinds = [k for k in a.locators.split(",") if k]
        if len(kinds) > 8:
            die("at most 8 locators")
        for k in kinds:
            code, blob, in_bytes = locator_blob(k, a.parent, a.out)
            space = max(align(len(blob)), LOC_MIN_SPACE)
            stored = space if in_bytes else space // SECTOR
            locs.append((code, stored, len(blob), pos))
            loc_blobs.append((pos, blob))
            pos += space
    order = sorted(blocks)
    if a.order == "shuffled":
        rng.shuffle(order)
    bat = [UNUSED] * entries
    where = {}
    for b in order:
        bat[b] = pos // SECTOR
        where[b] = pos
        pos += bm_len + block_size
    end = pos
    footer = make_footer(dtype, hdr_off, size, creator, uid, ts)
    f.truncate(end + flen)
    f.seek(0)
    f.write(footer)
    if hdr_off > 512:
        f.write(rng.randbytes(hdr_off - 512))  # a gap: not a header
    f.seek(hdr_off)
    f.write(make_header(table_off, entries, block_size, puuid, pts, pname,
                        locs))
    if a.bat_gap:
        f.seek(table_off - a.bat_gap * SECTOR)
        f.write(rng.randbytes(a.bat_gap * SECTOR))
    f.seek(table_off)
    batb = struct.pack(">%dI" % entries, *bat)
    f.write(batb + b"\xff" * (align(len(batb)) - len(batb)))
    if batmap_hdr is not None:
        bm = bytearray(batmap_secs * SECTOR)
        for b in range(entries):
            # wrong: claims every block, allocated or not, full or not
            if a.batmap == "wrong" or (b in blocks and blocks[b].full()):
                bm[b // 8] |= 0x80 >> (b % 8)
        h = bytearray(SECTOR)
        h[0:8] = b"tdbatmap"
        struct.pack_into(">QIII", h, 8, batmap_hdr + SECTOR, batmap_secs,
                         0x00010002, ~sum(bm) & 0xFFFFFFFF)
        f.seek(batmap_hdr)
        f.write(h + bm)
    for off, blob in loc_blobs:
        f.seek(off)
        f.write(blob)
    for b, off in where.items():
        f.seek(off)
        f.write(blocks[b].bits)
        f.write(blocks[b].data)
    f.seek(end)
    f.write(footer[:flen])


# ---- corrupt, relink --------------------------------------------------------------

def load(path):
    with open(path, "rb") as f:
        return bytearray(f.read())


def footer_pos(buf):
    flen = 511 if len(buf) % SECTOR == 511 else 512
    return len(buf) - flen, flen


def put_footer(buf, off, flen, foot):
    foot = bytearray(foot)
    struct.pack_into(">I", foot, 64, 0)
    struct.pack_into(">I", foot, 64, checksum(foot, 64))
    buf[off:off + flen] = foot[:flen]


def relink(path, parent):
    buf = load(path)
    foff, flen = footer_pos(buf)
    foot = parse_footer(buf[foff:foff + flen])
    if foot["type"] != 4:
        die("%s is not a differencing disk" % path)
    hoff = foot["data_offset"]
    puuid = Reader(parent).footer["uuid"] if os.path.abspath(parent) != \
        os.path.abspath(path) else foot["uuid"]
    h = buf[hoff:hoff + 1024]
    h[40:56] = puuid
    struct.pack_into(">I", h, 56,
                     max(0, int(os.stat(parent).st_mtime) - VHD_EPOCH))
    h[64:576] = bytes(512)
    name = os.path.basename(parent).encode("utf-16-be")[:512]
    h[64:64 + len(name)] = name
    for i in range(8):
        o = 576 + 24 * i
        code, space, length, _, off = struct.unpack_from(">IIIIQ", h, o)
        if code == LOC_W2RU:
            kind = "w2ru"
        elif code == LOC_W2KU:
            kind = "w2ku"
        elif code == LOC_MACX:
            old = bytes(buf[off:off + length])
            kind = "macx-abs" if old.startswith(b"file:///") else "macx"
        else:
            continue
        _, blob, _ = locator_blob(kind, parent, path)
        room = locator_space_bytes(space)
        if len(blob) > room:
            die("relink: locator %d has %d bytes of room, needs %d"
                % (i, room, len(blob)))
        buf[off:off + room] = blob + bytes(room - len(blob))
        struct.pack_into(">I", h, o + 8, len(blob))
    struct.pack_into(">I", h, 36, 0)
    struct.pack_into(">I", h, 36, checksum(h, 36))
    buf[hoff:hoff + 1024] = h
    with open(path, "r+b") as f:
        f.write(buf)


def cmd_relink(a):
    relink(a.child, a.parent)


def cmd_corrupt(a):
    buf = load(a.input)
    foff, flen = footer_pos(buf)
    foot = parse_footer(buf[foff:foff + flen])
    dynamic = foot["type"] in (3, 4)
    k = a.kind
    hoff = foot["data_offset"]
    hdr = parse_header(buf[hoff:hoff + 1024]) if dynamic else None
    if k in ("header-checksum", "bat-past-end", "block-size-not-pow2",
             "footer-copy-mismatch", "loop") and not dynamic:
        die("--kind %s needs a dynamic or differencing disk" % k)
    if k == "footer-checksum":
        c = struct.unpack_from(">I", buf, foff + 64)[0] ^ 0x00000100
        struct.pack_into(">I", buf, foff + 64, c)
        if dynamic:
            struct.pack_into(">I", buf, 64, c)
    elif k == "header-checksum":
        c = struct.unpack_from(">I", buf, hoff + 36)[0] ^ 0x00000100
        struct.pack_into(">I", buf, hoff + 36, c)
    elif k == "truncated":
        if dynamic:
            bs = hdr["block_size"]
            bat = struct.unpack_from(">%dI" % hdr["entries"], buf,
                                     hdr["table_offset"])
            used = [e for e in bat if e != UNUSED]
            if not used:
                die("truncated: no allocated block to cut")
            cut = max(used) * SECTOR + bitmap_len(bs) + bs // 2
        else:
            cut = foot["size"] // 2
        del buf[align(cut):]
    elif k == "bat-past-end":
        bat_off = hdr["table_offset"]
        bat = struct.unpack_from(">%dI" % hdr["entries"], buf, bat_off)
        i = next((j for j, e in enumerate(bat) if e == UNUSED), 0)
        struct.pack_into(">I", buf, bat_off + 4 * i,
                         len(buf) // SECTOR + 4096)
    elif k == "block-size-not-pow2":
        h = buf[hoff:hoff + 1024]
        struct.pack_into(">I", h, 32, 3 << 20)
        struct.pack_into(">I", h, 36, 0)
        struct.pack_into(">I", h, 36, checksum(h, 36))
        buf[hoff:hoff + 1024] = h
    elif k == "parent-uuid":
        f = bytearray(foot["raw"])
        f[68:84] = uuidlib.uuid4().bytes
        put_footer(buf, foff, flen, f)
        if dynamic:
            put_footer(buf, 0, 512, f)
    elif k == "footer-copy-mismatch":
        f = bytearray(foot["raw"])
        struct.pack_into(">Q", f, 48, foot["size"] + hdr["block_size"])
        put_footer(buf, 0, 512, f)
    elif k in ("disk-type", "fixed-as-dynamic"):
        # A type none of 2, 3 and 4; or a fixed disk's footer (no header,
        # data offset all ones) that says it is dynamic. Checksums right.
        if k == "fixed-as-dynamic" and dynamic:
            die("--kind fixed-as-dynamic needs a fixed disk")
        f = bytearray(foot["raw"])
        struct.pack_into(">I", f, 60, 5 if k == "disk-type" else 3)
        put_footer(buf, foff, flen, f)
        if dynamic:
            put_footer(buf, 0, 512, f)
    elif k == "loop":
        if foot["type"] != 4:
            die("--kind loop needs a differencing disk")
    else:
        die("unknown --kind %r" % k)
    with open(a.output, "wb") as f:
        f.write(buf)
    if k == "loop":
        relink(a.output, a.output)


# ---- read, map, info --------------------------------------------------------------

def open_reader(path, ignore=False):
    try:
        return Reader(path, ignore)
    except VHDError as e:
        die(str(e))


def cmd_read(a):
    r = open_reader(a.input, a.ignore_checksums)
    with open(a.output, "wb") as f:
        f.write(r.read_all())


def cmd_map(a):
    r = open_reader(a.input)
    for off, length, t in r.map_runs(a.chain):
        print("%12d %12d %4d  %s" % (off, length, t,
                                     "data" if t == 0 else "hole,zero"))


def cmd_info(a):
    import json
    r = open_reader(a.input)
    print(json.dumps({
        "disk-type": TYPE_NAMES[r.type],
        "size": r.size,
        "block-size": getattr(r, "block_size", None),
        "allocated": r.allocated(),
        "parents": r.parents,
        "uuid": str(uuidlib.UUID(bytes=r.footer["uuid"])),
    }))


def main():
    p = argparse.ArgumentParser(
        prog="vhdgen.py", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("--type", choices=sorted(TYPES), required=True)
    m.add_argument("--size")
    m.add_argument("--block-size", default="2M")
    m.add_argument("--parent")
    m.add_argument("--locators", default="w2ru,w2ku,macx")
    m.add_argument("--creator", default="tap\\0")
    m.add_argument("--data", default="")
    m.add_argument("--garbage", action="store_true")
    m.add_argument("--seed", type=int)
    m.add_argument("--header-offset", type=int, default=512)
    m.add_argument("--bat-gap", type=int, default=0)
    m.add_argument("--bat-entries", type=int, default=0)
    m.add_argument("--old-footer", action="store_true")
    m.add_argument("--batmap", nargs="?", const="wrong",
                   choices=["wrong", "right"])
    m.add_argument("--order", choices=["shuffled", "sequential"],
                   default="shuffled")
    m.add_argument("--uuid")
    m.add_argument("--timestamp", type=int)
    m.add_argument("--expect")
    m.set_defaults(fn=cmd_make)
    r = sub.add_parser("read")
    r.add_argument("input")
    r.add_argument("output")
    r.add_argument("--ignore-checksums", action="store_true")
    r.set_defaults(fn=cmd_read)
    mp = sub.add_parser("map")
    mp.add_argument("input")
    mp.add_argument("--chain", action="store_true")
    mp.set_defaults(fn=cmd_map)
    i = sub.add_parser("info")
    i.add_argument("input")
    i.set_defaults(fn=cmd_info)
    rl = sub.add_parser("relink")
    rl.add_argument("child")
    rl.add_argument("--parent", required=True)
    rl.set_defaults(fn=cmd_relink)
    c = sub.add_parser("corrupt")
    c.add_argument("input")
    c.add_argument("output")
    c.add_argument("--kind", required=True)
    c.set_defaults(fn=cmd_corrupt)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
