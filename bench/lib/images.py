#!/usr/bin/env python3
"""Image chores for bench/run: make the workloads, reset destinations to a
known state, and verify copies. Standard library only.

  images.py random PATH SIZE            incompressible data, SIZE bytes
  images.py sparse PATH SIZE DATA EXT   SIZE-byte file holding DATA bytes of
                                        random data in extents of EXT bytes,
                                        evenly spread, holes elsewhere
  images.py dense-of PATH SRC           the data extents of SRC, back to back
  images.py blocks PATH SIZE            matrix workload: per 4 MiB a 2 MiB and a
                                        4 KiB random block, holes between
  images.py chosen PATH SIZE BLOCK PCT SEED [FILL]
                                        vhd and qcow2 workload: PCT% of the
                                        BLOCK-sized blocks hold data, the
                                        blocks drawn with random.Random(SEED)
                                        (so spread over the disk, the same
                                        ones every run), holes elsewhere;
                                        FILL random (default) or nibbles:
                                        random 4-bit values, one a byte
                                        (deflate halves it; qcow2 -c stores
                                        random data uncompressed)
  images.py reset PATH SIZE [LIKE]      the destination state used by every
                                        arm (see state_text)
  images.py verify SRC DST              byte-for-byte comparison; holes read
                                        as zeros; exit 1 naming the first
                                        differing offset
  images.py state                       prints the destination-state text
  images.py bytes SIZE                  prints SIZE (e.g. 512M) in bytes
"""
import os
import sys

CHUNK = 8 << 20

STATE_TEXT = (
    "Before every run the destination file is reset while no server has it "
    "open: the ranges that the source holds data in are overwritten with "
    "zeros in place, and every other range is hole-punched (`fallocate -p`). "
    "Dense destinations are therefore a fully written file of the image's "
    "size; sparse destinations are a file of the full virtual size whose "
    "data ranges hold zeros and whose other ranges are holes. Every arm "
    "writes into allocated tmpfs pages that hold none of the source's bytes "
    "(a copy that writes nothing fails verification), and no arm pays page "
    "allocation that another arm does not. The data ranges are written, not "
    "punched and allocated again, because this machine is a virtual machine "
    "whose balloon device reports freed memory to its host: a page that was "
    "freed and allocated again may cost a host fault on its first write, "
    "and which arm met such pages was chance (in runs by hand, a 2 GiB copy "
    "took 1.0-8.7 s into punched and re-allocated pages, 1.3-1.4 s into "
    "rewritten ones).")

SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    unit = s[-1:] if s[-1:] in SUFFIX and not s[-1:].isdigit() else ""
    num = s[:-1] if unit else s
    return int(float(num) * SUFFIX[unit])


def data_extents(fd, size):
    """(offset, length) of every data range, from SEEK_DATA/SEEK_HOLE."""
    out = []
    off = 0
    while off < size:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
        except OSError:
            break
        if start >= size:
            break
        end = os.lseek(fd, start, os.SEEK_HOLE)
        out.append((start, min(end, size) - start))
        off = end
    return out


NIBBLES = bytes((i & 15) * 17 for i in range(256))


def write_random(fd, offset, length, table=None):
    done = 0
    while done < length:
        n = min(CHUNK, length - done)
        buf = os.urandom(n)
        os.pwrite(fd, buf.translate(table) if table else buf, offset + done)
        done += n


def cmd_random(path, size):
    size = parse_size(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    write_random(fd, 0, size)
    os.close(fd)


def sparse_layout(size, data, ext):
    count = max(1, data // ext)
    stride = size // count
    if stride < ext:
        sys.exit("images.py: data does not fit: %d extents of %d in %d"
                 % (count, ext, size))
    return [(i * stride, ext) for i in range(count)]


def cmd_sparse(path, size, data, ext):
    size, data, ext = parse_size(size), parse_size(data), parse_size(ext)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    for off, length in sparse_layout(size, data, ext):
        write_random(fd, off, length)
    os.close(fd)


def cmd_blocks(path, size):
    """The matrix workload: every 4 MiB, a 2 MiB random block at the start
    and a 4 KiB random block 1 MiB after it; holes elsewhere."""
    size = parse_size(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    for base in range(0, size, 4 << 20):
        write_random(fd, base, min(2 << 20, size - base))
        if base + (3 << 20) + 4096 <= size:
            write_random(fd, base + (3 << 20), 4096)
    os.close(fd)


def chosen_blocks(size, block, pct, seed):
    """Indices of the data blocks of the vhd workload: pct% of the
    block-sized blocks of size, drawn with a fixed seed, sorted."""
    import random
    count = size // block
    n = int(round(count * pct / 100.0))
    return sorted(random.Random(seed).sample(range(count), n))


def cmd_chosen(path, size, block, pct, seed, fill="random"):
    if fill not in ("random", "nibbles"):
        sys.exit("images.py: FILL is random or nibbles, not %s" % fill)
    table = NIBBLES if fill == "nibbles" else None
    size, block = parse_size(size), parse_size(block)
    pct, seed = float(pct), int(seed)
    if size % block:
        sys.exit("images.py: %d is not a multiple of the block %d"
                 % (size, block))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    blocks = chosen_blocks(size, block, pct, seed)
    for b in blocks:
        write_random(fd, b * block, block, table)
    os.close(fd)
    print("%d of %d blocks of %d bytes hold data" % (len(blocks),
                                                    size // block, block))


def cmd_dense_of(path, src):
    sfd = os.open(src, os.O_RDONLY)
    size = os.fstat(sfd).st_size
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    pos = 0
    for off, length in data_extents(sfd, size):
        done = 0
        while done < length:
            buf = os.pread(sfd, min(CHUNK, length - done), off + done)
            os.pwrite(fd, buf, pos)
            pos += len(buf)
            done += len(buf)
    os.close(fd)
    os.close(sfd)


def cmd_reset(path, size, like=None):
    size = parse_size(size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    if like:
        lfd = os.open(like, os.O_RDONLY)
        extents = data_extents(lfd, min(size, os.fstat(lfd).st_size))
        os.close(lfd)
    else:
        extents = [(0, size)] if size else []
    # Punch what lies between the data ranges (keeps the size).
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int,
                               ctypes.c_longlong, ctypes.c_longlong]
    falloc_punch = 0x02 | 0x01  # PUNCH_HOLE | KEEP_SIZE
    pos = 0
    for off, length in extents + [(size, 0)]:
        if off > pos and libc.fallocate(fd, falloc_punch, pos, off - pos) != 0:
            err = ctypes.get_errno()
            sys.exit("images.py: punch %s at %d: %s"
                     % (path, pos, os.strerror(err)))
        pos = off + length
    # Rewrite the data ranges in place: their pages stay the ones already
    # in use (see STATE_TEXT for why they are not punched and re-allocated).
    zeros = bytes(CHUNK)
    for off, length in extents:
        done = 0
        while done < length:
            n = min(CHUNK, length - done)
            done += os.pwrite(fd, zeros[:n] if n < CHUNK else zeros,
                              off + done)
    os.close(fd)


def cmd_verify(src, dst):
    sfd = os.open(src, os.O_RDONLY)
    dfd = os.open(dst, os.O_RDONLY)
    ssize = os.fstat(sfd).st_size
    dsize = os.fstat(dfd).st_size
    if dsize < ssize:
        sys.exit("verify: %s is %d bytes, source %d" % (dst, dsize, ssize))
    # Compare wherever either side has data; elsewhere both read as zeros.
    ranges = sorted(data_extents(sfd, ssize) + data_extents(dfd, ssize))
    merged = []
    for off, length in ranges:
        if merged and off <= merged[-1][0] + merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], off + length - last[0]))
        else:
            merged.append((off, length))
    checked = 0
    for off, length in merged:
        done = 0
        while done < length:
            n = min(CHUNK, length - done)
            a = os.pread(sfd, n, off + done)
            b = os.pread(dfd, n, off + done)
            if a != b:
                for i in range(min(len(a), len(b))):
                    if a[i] != b[i]:
                        break
                sys.exit("verify: %s differs from %s at offset %d"
                         % (dst, src, off + done + i))
            done += n
        checked += length
    os.close(sfd)
    os.close(dfd)
    print("verified %d bytes (%d compared)" % (ssize, checked))


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd, args = argv[1], argv[2:]
    table = {"random": (cmd_random, 2, 2), "sparse": (cmd_sparse, 4, 4),
             "dense-of": (cmd_dense_of, 2, 2), "blocks": (cmd_blocks, 2, 2),
             "chosen": (cmd_chosen, 5, 6), "reset": (cmd_reset, 2, 3),
             "verify": (cmd_verify, 2, 2),
             "state": (lambda: print(STATE_TEXT), 0, 0),
             "bytes": (lambda v: print(parse_size(v)), 1, 1)}
    if cmd not in table or not table[cmd][1] <= len(args) <= table[cmd][2]:
        sys.exit(__doc__)
    table[cmd][0](*args)


if __name__ == "__main__":
    main(sys.argv)
