"""Report tables of bench/lib/link.sh's sections (matrix, rtt, tls) and the
SVG plot of throughput against RTT. Standard library only; used by
report.py."""
import math
import os
import statistics

MIB = 1 << 20
GIB = 1 << 30
THREAD = {"stock": 1.00, "nodelay": 4.26, "pipelined": 7.41, "both": 7.39}
ARMS = ["stock", "nodelay", "pipelined", "both"]
ARM_NAMES = {"stock": "stock", "nodelay": "NODELAY only",
             "pipelined": "pipelined only", "both": "both"}
TOOLS = ["nbdflow-copy", "nbdcopy", "qemu-img"]
TARGET_LINK_PCT = 90.0


def _f(x, d=1):
    return "-" if x is None else "%.*f" % (d, x)


def _num(r, key):
    try:
        return float(r["extra"].get(key))
    except (TypeError, ValueError):
        return None


def _med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def _rate(r):
    """MiB/s of the bytes the client wrote as data (the JSON's copied
    bytes when known, else the image size)."""
    b = _num(r, "copied")
    if b is None:
        b = float(r["bytes"])
    return b / MIB / float(r["seconds"])


def _rtt_key(w):
    try:
        return float(w)
    except ValueError:
        return float("inf")


def _cell(rows, fn):
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        failed = [r for r in rows if r["status"] == "fail"]
        return None, ("failed (%d)" % len(failed)) if failed else "-"
    v = [fn(r) for r in ok]
    s = "%s (%s-%s)" % (_f(statistics.median(v)), _f(min(v)), _f(max(v)))
    nf = len(rows) - len(ok)
    if nf:
        s += " +%d failed" % nf
    return statistics.median(v), s


def _measured(rows):
    v = _med([_num(r, "rtt_meas") for r in rows])
    return "" if v is None else " (%s)" % _f(v, 3 if v < 1 else 2)


def section_matrix(out, rows, meta):
    rows = [r for r in rows if r["section"] == "matrix" and r["run"] > 0]
    if not rows:
        return
    m = dict(meta)
    out.append("## The four-arm matrix over an emulated link (issue 5)")
    out.append("")
    out.append("nbdflow copy with its diagnostic options reproduces the "
               "arms of the published sparse_dd study: stock = `--nagle "
               "--split-writes --max-requests 1`, NODELAY only = "
               "`--split-writes --max-requests 1`, pipelined only = "
               "`--nagle --split-writes --max-requests 8`, both = "
               "`--split-writes --max-requests 8`; all with `--connections "
               "1 --destination-is-zero --json`. Client and server in two "
               "network namespaces joined by bench/linkem at %s. Workload: "
               "%s. Into nbdkit's memory plugin (which, like the study's "
               "server, delays its ACKs) and into `nbdflow serve "
               "memory:SIZE` (which re-arms TCP_QUICKACK). MiB/s counts the "
               "data written; every copy verified by an xxh128 of the "
               "export read inside the server's namespace. Stall %% and "
               "bytes per data segment come from the client's TCP_INFO "
               "samples (`--json`), medians over runs." % (
                   m.get("link rate", "1gbit"), m.get("matrix", "?")))
    out.append("")
    rtts = sorted({r["workload"] for r in rows}, key=_rtt_key)
    for srv in ("nbdkit", "nbdflow"):
        srows = [r for r in rows if r["server"] == srv]
        if not srows:
            continue
        out.append("### into %s" % ("nbdkit memory" if srv == "nbdkit"
                                    else "nbdflow serve (memory)"))
        out.append("")
        out.append("| RTT ms (ping) | arm | MiB/s median (range) | vs stock "
                   "| study's ratio (0.2 ms, 10G) | stall % | B/seg (MSS) "
                   "| peak depth |")
        out.append("|---|---|---|---|---|---|---|---|")
        for rtt in rtts:
            rr = [r for r in srows if r["workload"] == rtt]
            stock, _ = _cell([r for r in rr if r["client"] == "stock"], _rate)
            for arm in ARMS:
                ar = [r for r in rr if r["client"] == arm]
                if not ar:
                    continue
                med, cell = _cell(ar, _rate)
                ok = [r for r in ar if r["status"] == "ok"]
                ratio = "-" if med is None or not stock else \
                    "%.2fx" % (med / stock)
                st = _med([_num(r, "stall_pct") for r in ok])
                bps = _med([_num(r, "bps") for r in ok])
                mss = _med([_num(r, "mss") for r in ok])
                dep = _med([_num(r, "depth") for r in ok])
                out.append("| %s%s | %s | %s | %s | %.2fx | %s | %s (%s) | %s |"
                           % (rtt, _measured(rr), ARM_NAMES[arm], cell, ratio,
                              THREAD[arm], _f(st, 1), _f(bps, 0), _f(mss, 0),
                              _f(dep, 0)))
        out.append("")


def section_rtt(out, rows, meta, svg_path=None):
    rows = [r for r in rows if r["section"] == "rtt" and r["run"] > 0]
    if not rows:
        return
    m = dict(meta)
    link = float(m.get("link MiB/s", "119.209"))
    out.append("## Throughput against RTT (issue 5)")
    out.append("")
    out.append("%s. Clients with their default options: `nbdflow copy "
               "SRC URI`, `nbdcopy SRC URI`, `qemu-img convert -n -W -f raw "
               "-O raw SRC URI`. %% of link = MiB/s of the image over the "
               "link rate (%.1f MiB/s; TCP payload can reach ~99.4%% of it "
               "at MTU 9000). Target: nbdflow copy >= %.0f%% at 10 and 50 "
               "ms with no tuning flags and default kernel settings "
               "(tcp_wmem max %s)." % (m.get("rtt", "?"), link,
                                         TARGET_LINK_PCT,
                                         m.get("tcp_wmem", "?").split()[-1]
                                         if m.get("tcp_wmem") else "?"))
    out.append("")
    out.append("| RTT ms (ping) | client | MiB/s median (range) | % of link "
               "| stall % | B/seg | conns | window MiB | target |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    rtts = sorted({r["workload"] for r in rows}, key=_rtt_key)
    series = {t: [] for t in TOOLS}
    for rtt in rtts:
        rr = [r for r in rows if r["workload"] == rtt]
        for tool in TOOLS:
            ar = [r for r in rr if r["client"] == tool]
            if not ar:
                continue
            med, cell = _cell(ar, lambda r: float(r["bytes"]) / MIB /
                              float(r["seconds"]))
            ok = [r for r in ar if r["status"] == "ok"]
            pct = None if med is None else 100.0 * med / link
            if med is not None and rtt != "-":
                series[tool].append((float(rtt), med))
            tgt = "-"
            if tool == "nbdflow-copy" and _rtt_key(rtt) >= 10 and pct:
                tgt = "yes" if pct >= TARGET_LINK_PCT else "**no**"
            win = _med([_num(r, "window") for r in ok])
            out.append("| %s%s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                rtt, _measured(rr), tool, cell, _f(pct, 0) + "%" if pct
                else "-", _f(_med([_num(r, "stall_pct") for r in ok]), 1),
                _f(_med([_num(r, "bps") for r in ok]), 0),
                _f(_med([_num(r, "conns") for r in ok]), 0),
                _f(win / MIB if win else None, 0), tgt))
    out.append("")
    if svg_path:
        write_svg(svg_path, series, link)
        out.append("![MiB/s against RTT](%s)" % os.path.basename(svg_path))
        out.append("")


def write_svg(path, series, link):
    """Throughput (MiB/s) against RTT (log scale), one line per tool."""
    w, h, left, right, top, bottom = 640, 400, 60, 150, 30, 50
    pw, ph = w - left - right, h - top - bottom
    xs = [x for s in series.values() for x, _ in s] or [0.2, 50]
    lo, hi = math.log10(min(xs)), math.log10(max(xs))
    if hi - lo < 1e-9:
        hi = lo + 1
    ymax = max([link * 1.05] + [y for s in series.values() for _, y in s])

    def px(x):
        return left + pw * (math.log10(x) - lo) / (hi - lo)

    def py(y):
        return top + ph * (1 - y / ymax)

    colours = {"nbdflow-copy": "#d62728", "nbdcopy": "#1f77b4",
               "qemu-img": "#2ca02c"}
    e = []
    e.append('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
             'font-family="sans-serif" font-size="12">' % (w, h))
    e.append('<rect width="100%" height="100%" fill="white"/>')
    e.append('<text x="%d" y="18" font-size="14">Copy into nbdkit memory '
             'over an emulated 1 Gbit/s link</text>' % left)
    e.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (
        left, top + ph, left + pw, top + ph))
    e.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (
        left, top, left, top + ph))
    step = 20 if ymax <= 160 else 50
    y = 0
    while y <= ymax:
        e.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                 % (left, py(y), left + pw, py(y)))
        e.append('<text x="%d" y="%.1f" text-anchor="end">%d</text>'
                 % (left - 5, py(y) + 4, y))
        y += step
    e.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#888" '
             'stroke-dasharray="4 3"/>' % (left, py(link), left + pw,
                                           py(link)))
    e.append('<text x="%d" y="%.1f" fill="#666">link rate</text>'
             % (left + pw + 5, py(link) + 4))
    for x in sorted(set(xs)):
        e.append('<text x="%.1f" y="%d" text-anchor="middle">%g</text>'
                 % (px(x), top + ph + 16, x))
    e.append('<text x="%d" y="%d" text-anchor="middle">RTT, ms (log '
             'scale)</text>' % (left + pw / 2, h - 10))
    e.append('<text x="15" y="%d" transform="rotate(-90 15 %d)" '
             'text-anchor="middle">MiB/s (median)</text>' % (
                 top + ph / 2, top + ph / 2))
    ly = top + 30
    for tool in TOOLS:
        pts = sorted(series.get(tool, []))
        if not pts:
            continue
        c = colours[tool]
        e.append('<polyline fill="none" stroke="%s" stroke-width="2" '
                 'points="%s"/>' % (c, " ".join("%.1f,%.1f" % (px(x), py(y))
                                                for x, y in pts)))
        for x, y in pts:
            e.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>'
                     % (px(x), py(y), c))
        e.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" '
                 'stroke-width="2"/>' % (left + pw + 5, ly, left + pw + 25,
                                         ly, c))
        e.append('<text x="%d" y="%d">%s</text>' % (left + pw + 30, ly + 4,
                                                    tool))
        ly += 18
    e.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(e) + "\n")


def section_tls(out, rows, meta):
    rows = [r for r in rows if r["section"] == "tls" and r["run"] > 0]
    if not rows:
        return
    m = dict(meta)
    out.append("## TLS (issue 5)")
    out.append("")
    out.append("%s. Servers: `nbdflow serve --tls=require` (--tls-certs / "
               "--tls-psk), `qemu-nbd` with a tls-creds-x509 or "
               "tls-creds-psk object, `nbdkit --tls=require`. Every copy "
               "compared byte for byte. CPU s/GiB: user+system seconds of "
               "the client (/usr/bin/time) and of the server process "
               "(/proc, read just before it is stopped), per GiB copied, "
               "medians. The plaintext reference runs `nbdflow copy` with no "
               "flags, as a user would, and over TCP to this host its data "
               "path probe picks `sendfile` or buffers (the negotiated "
               "column names the path each run took); plain-buffers adds "
               "`--no-zero-copy`, the buffer path TLS always takes, so the "
               "last column is what encryption alone costs. "
               "Negotiated: version/cipher/auth as `nbdflow copy --json` "
               "names them (other clients do not say)."
               % m.get("tls", "?"))
    out.append("")
    out.append("| auth | client -> server | MiB/s median (range) | client "
               "CPU s/GiB | server CPU s/GiB | negotiated |")
    out.append("|---|---|---|---|---|---|")
    pairs = []
    for r in rows:
        k = (r["workload"], r["client"], r["server"])
        if k not in pairs and r["workload"] != "-":
            pairs.append(k)
    order = {"plain": 0, "plain-buffers": 1, "psk": 2, "x509": 3}
    pairs.sort(key=lambda k: order.get(k[0], 9))
    meds = {}
    for k in pairs:
        ar = [r for r in rows if (r["workload"], r["client"],
                                  r["server"]) == k]
        med, cell = _cell(ar, lambda r: float(r["bytes"]) / MIB /
                          float(r["seconds"]))
        ok = [r for r in ar if r["status"] == "ok"]
        ccpu = _med([(float(r["user_s"] or 0) + float(r["sys_s"] or 0)) /
                     (float(r["bytes"]) / GIB) for r in ok])
        scpu = _med([_num(r, "srv_cpu") / (float(r["bytes"]) / GIB)
                     for r in ok if _num(r, "srv_cpu") is not None])
        meds[k] = med
        tls = sorted({r["extra"]["tls"] for r in ok if "tls" in r["extra"]})
        if k[0].startswith("plain"):
            paths = [r["extra"]["path"] for r in ok if "path" in r["extra"]]
            tls = ["path: " + ", ".join(
                "%s x%d" % (p, paths.count(p)) for p in sorted(set(paths)))
                ] if paths else []
        out.append("| %s | %s -> %s | %s | %s | %s | %s |" % (
            k[0], k[1], k[2], cell, _f(ccpu, 2), _f(scpu, 2),
            ", ".join(tls) or "-"))
    out.append("")
    out.append("| auth | ours (nbdflow copy -> nbdflow serve) | best peer "
               "pair | ours / best peer | ours / our plaintext | ours / our "
               "plaintext on buffers |")
    out.append("|---|---|---|---|---|---|")
    plain = meds.get(("plain", "nbdflow-copy", "nbdflow"))
    plainb = meds.get(("plain-buffers", "nbdflow-copy", "nbdflow"))
    for auth in ("psk", "x509"):
        ours = meds.get((auth, "nbdflow-copy", "nbdflow"))
        peers = {k: v for k, v in meds.items() if k[0] == auth and v and
                 "nbdflow-copy" != k[1] and "nbdflow" != k[2]}
        if not peers:
            continue
        best = max(peers, key=peers.get)
        out.append("| %s | %s | %s -> %s (%s) | %s | %s | %s |" % (
            auth, _f(ours), best[1], best[2], _f(peers[best]),
            "%.2fx" % (ours / peers[best]) if ours else "-",
            "%.2fx" % (ours / plain) if ours and plain else "-",
            "%.2fx" % (ours / plainb) if ours and plainb else "-"))
    out.append("")
