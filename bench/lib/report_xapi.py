"""Report tables of bench/lib/xapi.sh's section xapi. Standard library
only; used by report.py."""
import statistics

from report_util import GIB, med, mibs, num

GOAL_CHUNKED = 0.90     # Chunked over our NBD pair, MiB/s, at least
GOAL_UPGRADE = 0.95     # HTTP-upgraded NBD over plain nbd://, at least
GOAL_LINK = 0.90        # share of the emulated link at 50 ms, at least

ARMS = {
    "nbd": "`nbdflow copy IMG nbd://HOST:PORT/`",
    "http-nbd": "`nbdflow copy IMG http://HOST:HPORT/nbd/` (PUT, then NBD)",
    "chunked": "`nbdflow copy IMG chunked+tcp://HOST:CPORT`",
    "chunked-stock": "the same with `--nagle --split-writes "
                     "--max-requests 1 --connections 1` (the stock sender)",
}


def _cpu(r, key):
    if key == "client":
        try:
            return float(r["user_s"]) + float(r["sys_s"])
        except (TypeError, ValueError):
            return None
    return num(r, "srv_cpu_s")


def _table(out, rows, wl, arms):
    out.append("| arm | MiB/s median (min-max) | client CPU s/GiB | "
               "server CPU s/GiB | stall % | failed |")
    out.append("|---|---|---|---|---|---|")
    by = {}
    for arm in arms:
        a = [r for r in rows if r["workload"] == wl and r["client"] == arm]
        if not a:
            continue
        good = [r for r in a if r["status"] == "ok"]
        by[arm] = {r["run"]: mibs(r) for r in good}
        m = [mibs(r) for r in good]
        gib = [float(r["bytes"]) / GIB for r in good]
        cc = [(_cpu(r, "client") or 0) / g for r, g in zip(good, gib)]
        sc = [_cpu(r, "server") / g if _cpu(r, "server") is not None
              else None for r, g in zip(good, gib)]
        out.append("| %s | %s | %s | %s | %s | %d |" % (
            ARMS.get(arm, arm),
            ("%.0f (%.0f-%.0f)" % (statistics.median(m), min(m), max(m)))
            if m else "-",
            med(cc, "%.2f"), med(sc, "%.2f"),
            med([num(r, "stall_pct") for r in good], "%.1f"),
            len(a) - len(good)))
    out.append("")
    return by


def _ratio(out, by, a, b, goal, what):
    if a not in by or b not in by:
        return
    per = [by[a][k] / by[b][k] for k in by[a] if k in by[b]]
    if not per:
        return
    ratio = statistics.median(by[a].values()) / statistics.median(
        by[b].values())
    out.append("| %s | %.2fx | %.2f-%.2f | %s | %s |" % (
        what, ratio, min(per), max(per),
        "%.2fx" % goal if goal else "-",
        ("yes" if ratio >= goal else "**no**") if goal else "-"))


def section_xapi(out, rows, meta):
    rows = [r for r in rows if r["section"] == "xapi" and r["run"] > 0]
    if not rows:
        return
    m = dict(meta)
    out.append("## xapi transports (section xapi)")
    out.append("")
    out.append("Workload: %s. Arms interleaved; every copy verified byte "
               "for byte. A Chunked copy is timed to the end marker taken "
               "by the socket (there is no reply); the server's CPU is "
               "counted to the stream's flush. Client and server share "
               "the machine's cores: CPU seconds per GiB beside MiB/s." %
               m.get("xapi", "?"))
    out.append("")
    out.append("### TCP loopback")
    out.append("")
    by = _table(out, rows, "loopback", list(ARMS))
    out.append("| ratio (medians) | ratio | per-run range | goal | met |")
    out.append("|---|---|---|---|---|")
    _ratio(out, by, "chunked", "nbd", GOAL_CHUNKED,
           "Chunked over our NBD pair")
    _ratio(out, by, "http-nbd", "nbd", GOAL_UPGRADE,
           "HTTP-upgraded NBD over plain nbd://")
    _ratio(out, by, "chunked", "chunked-stock", 1.0,
           "Chunked: ours over the stock sender's shape")
    out.append("")
    link_wls = sorted({r["workload"] for r in rows
                       if r["workload"].startswith("rtt")},
                      key=lambda w: float(w[3:]))
    rate = float(m.get("link MiB/s", "0") or 0)
    for wl in link_wls:
        out.append("### Link emulator, %s ms RTT, %s" % (
            wl[3:], m.get("link rate", "?")))
        out.append("")
        by = _table(out, rows, wl, ["nbd", "chunked", "chunked-stock"])
        out.append("| ratio (medians) | ratio | per-run range | goal | met |")
        out.append("|---|---|---|---|---|")
        # No reply paces a Chunked stream: on a link the stock shape
        # keeps the pipe as full as ours, so this ratio is shown, with
        # no goal.
        _ratio(out, by, "chunked", "chunked-stock", None,
               "Chunked: ours over the stock sender's shape")
        if rate and "nbd" in by and by["nbd"]:
            out.append("| NBD: share of the link (%.1f MiB/s) | %.0f%% | - "
                       "| - | - |" % (rate, 100 * statistics.median(
                           by["nbd"].values()) / rate))
        if rate and "chunked" in by and by["chunked"]:
            share = statistics.median(by["chunked"].values()) / rate
            goal = GOAL_LINK if wl == "rtt50" else None
            out.append("| Chunked: share of the link (%.1f MiB/s) | %.0f%% "
                       "| - | %s | %s |" % (
                           rate, 100 * share,
                           "%.0f%%" % (100 * goal) if goal else "-",
                           ("yes" if share >= goal else "**no**")
                           if goal else "-"))
        out.append("")
    if not link_wls and m.get("xapi link"):
        out.append("Link tables: %s." % m["xapi link"])
        out.append("")
