"""Report tables of bench/lib/vhd.sh's section vhd. Standard library
only; used by report.py."""
import statistics

MIB = 1 << 20
GIB = 1 << 30
GOAL_VS_QEMU = 1.5      # nbdflow copy over qemu-img convert, MiB/s
GOAL_VS_STOCK = 10.0    # nbdflow copy over the stock sparse_dd pattern
GOAL_READ = 1.2         # VHD read time over the raw read time, at most
GOAL_RSS_MIB = 32.0     # peak RSS of nbdflow copy disk.vhd nbd://, below

WRITE_ARMS = [
    ("nbdflow-copy", "`nbdflow copy disk.vhd URI`"),
    ("qemu-img", "`qemu-img convert -W -f vpc -O raw -n disk.vhd URI`"),
    ("stock-pattern", "`nbdflow copy --nagle --max-requests 1 "
     "--split-writes --connections 1 --allocated --request-size 2M "
     "disk.vhd URI`"),
]
READ_ARMS = [
    ("nbdflow-vhd", "`nbdflow serve disk.vhd`"),
    ("nbdflow-raw", "`nbdflow serve disk.raw`"),
]


def _f(x, d=None):
    if x is None:
        return "-"
    if d is None:
        d = 0 if abs(x) >= 100 else (1 if abs(x) >= 10 else 2)
    return "%.*f" % (d, x)


def _num(r, key):
    try:
        return float(r["extra"].get(key))
    except (TypeError, ValueError):
        return None


def _med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def _rng(v, d=None):
    v = [x for x in v if x is not None]
    if not v:
        return "-"
    return "%s (%s-%s)" % (_f(statistics.median(v), d), _f(min(v), d),
                           _f(max(v), d))


def _mibs(r):
    return float(r["bytes"]) / MIB / float(r["seconds"])


def _secs(r):
    return float(r["seconds"])


def _ccpu(r):
    if r["user_s"] == "" and r["sys_s"] == "":
        return None
    return float(r["user_s"] or 0) + float(r["sys_s"] or 0)


def _gib(r):
    return float(r["bytes"]) / GIB


def _arm(rows, wl, key, col):
    return [r for r in rows if r["workload"] == wl and r[col] == key]


def _ok(rows):
    return [r for r in rows if r["status"] == "ok"]


def _per_run(a, b, fn):
    """fn(a in run i) / fn(b in run i) over the runs both have."""
    bb = {r["run"]: fn(r) for r in _ok(b)}
    return [fn(r) / bb[r["run"]] for r in _ok(a)
            if bb.get(r["run"])]


def _ratio_row(out, name, a, b, fn, goal, higher):
    """A row: median of fn over a / over b, the per-run range, and whether
    it meets goal (none: "-")."""
    ma, mb = _med([fn(r) for r in _ok(a)]), _med([fn(r) for r in _ok(b)])
    g = "-" if goal is None else (
        ("at least %.1fx" if higher else "at most %.1fx") % goal)
    if not ma or not mb:
        out.append("| %s | - | - | %s | - |" % (name, g))
        return
    ratio = ma / mb
    pr = _per_run(a, b, fn)
    met = "-" if goal is None else (
        "yes" if (ratio >= goal if higher else ratio <= goal) else "**no**")
    out.append("| %s | %.2fx | %s | %s | %s |" % (
        name, ratio, "%.2f-%.2f" % (min(pr), max(pr)) if pr else "-", g,
        met))


WRITE_HEAD = ("| client | MiB/s median (min-max) | seconds median "
              "(min-max) | client CPU s | client CPU s/GiB | server CPU s "
              "| server CPU s/GiB | peak RSS MiB |")


def write_row(cmd, a, ccpu=_ccpu):
    """One row under WRITE_HEAD for the rows a of one arm; ccpu gives a
    row's client CPU seconds."""
    ok = _ok(a)
    nf = len(a) - len(ok)
    cell = _rng([_mibs(r) for r in ok]) if ok else "failed"
    if nf:
        cell += " +%d failed" % nf
    return "| %s | %s | %s | %s | %s | %s | %s | %s |" % (
        cmd, cell, _rng([_secs(r) for r in ok], 3),
        _f(_med([ccpu(r) for r in ok]), 2),
        _f(_med([ccpu(r) / _gib(r) for r in ok
                 if ccpu(r) is not None]), 3),
        _f(_med([_num(r, "srv_cpu_s") for r in ok]), 2),
        _f(_med([_num(r, "srv_cpu_s") / _gib(r) for r in ok
                 if _num(r, "srv_cpu_s") is not None]), 3),
        _f(_med([int(r["rss_kb"]) / 1024.0 for r in ok
                 if r["rss_kb"]]), 1))


def section_vhd(out, rows, meta):
    rows = [r for r in rows if r["section"] == "vhd" and r["run"] > 0]
    if not rows:
        return
    m = dict(meta)
    out.append("## VHD images (section vhd)")
    out.append("")
    out.append("Workload: %s. On the bench's tmpfs, over TCP loopback; "
               "one interleaved table (each run goes once through the "
               "three writes and the two reads). MiB/s are of the virtual "
               "size, CPU seconds per GiB are per GiB of virtual size; the "
               "client's CPU and peak RSS come from `/usr/bin/time -f '%%M "
               "%%U %%S'` (%%M is `time -v`'s \"Maximum resident set "
               "size\"), the server's CPU from its `/proc/PID/stat` before "
               "and after the copy." % m.get("vhd", "?"))
    out.append("")
    out.append("### The VHD into `nbdflow serve` of a raw file")
    out.append("")
    out.append("The destination is reset before every copy (data ranges "
               "of the expected content rewritten with zeros, the rest "
               "punched) and compared byte for byte with `qemu-img convert "
               "-f vpc -O raw` of the VHD after the server stopped. The "
               "stock pattern is sparse_dd's (vhd-tool without "
               "`--prezeroed`): one 2 MiB write in flight on one "
               "connection, Nagle on, each write's header and payload in "
               "two writes, holes written as zeros, so it sends the whole "
               "virtual size.")
    out.append("")
    out.append(WRITE_HEAD)
    out.append("|---|---|---|---|---|---|---|---|")
    w = {}
    for key, cmd in WRITE_ARMS:
        a = _arm(rows, "write", key, "client")
        w[key] = a
        if a:
            out.append(write_row(cmd, a))
    out.append("")
    out.append("| ratio (MiB/s, medians) | ratio | per-run range | goal "
               "| met |")
    out.append("|---|---|---|---|---|")
    _ratio_row(out, "nbdflow copy / qemu-img convert", w["nbdflow-copy"],
               w["qemu-img"], _mibs, GOAL_VS_QEMU, True)
    _ratio_row(out, "nbdflow copy / stock pattern", w["nbdflow-copy"],
               w["stock-pattern"], _mibs, GOAL_VS_STOCK, True)
    out.append("")
    out.append("### Serving the VHD: `nbdcopy URI null:`")
    out.append("")
    out.append("nbdcopy (default options) reads the export into `null:`; "
               "after each timed read an xxh128 of the export "
               "(`nbdflow sum`, untimed) is compared with that of the raw "
               "conversion. `disk.raw` is `qemu-img convert -f vpc -O raw` "
               "of the VHD (sparse: the same blocks hold data).")
    out.append("")
    out.append("| server | MiB/s median (min-max) | seconds median "
               "(min-max) | nbdcopy CPU s | server CPU s | server CPU "
               "s/GiB |")
    out.append("|---|---|---|---|---|---|")
    rd = {}
    for key, cmd in READ_ARMS:
        a = _arm(rows, "read", key, "server")
        rd[key] = a
        if not a:
            continue
        ok = _ok(a)
        nf = len(a) - len(ok)
        cell = _rng([_mibs(r) for r in ok]) if ok else "failed"
        if nf:
            cell += " +%d failed" % nf
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            cmd, cell, _rng([_secs(r) for r in ok], 3),
            _f(_med([_ccpu(r) for r in ok]), 2),
            _f(_med([_num(r, "srv_cpu_s") for r in ok]), 2),
            _f(_med([_num(r, "srv_cpu_s") / _gib(r) for r in ok
                     if _num(r, "srv_cpu_s") is not None]), 3)))
    out.append("")
    out.append("| ratio (seconds, medians) | ratio | per-run range | goal "
               "| met |")
    out.append("|---|---|---|---|---|")
    _ratio_row(out, "VHD read time / raw read time", rd["nbdflow-vhd"],
               rd["nbdflow-raw"], _secs, GOAL_READ, False)
    out.append("")
    out.append("### Peak RSS of `nbdflow copy disk.vhd URI`")
    out.append("")
    ok = _ok(w["nbdflow-copy"])
    rss = [int(r["rss_kb"]) / 1024.0 for r in ok if r["rss_kb"]]
    out.append("| runs | peak RSS MiB median (min-max) | goal | met (every "
               "run) |")
    out.append("|---|---|---|---|")
    out.append("| %d | %s | below %.0f MiB | %s |" % (
        len(rss), _rng(rss, 1), GOAL_RSS_MIB,
        "-" if not rss else ("yes" if max(rss) < GOAL_RSS_MIB
                             else "**no**")))
    out.append("")
