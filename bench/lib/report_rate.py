"""Report table of bench/lib/rate.sh's section rate. Standard library
only; used by report.py."""
from report_util import MIB, num

GOAL = 0.05  # the rate over 10 s within this share of the limit


def section_rate(out, rows, meta):
    rows = [r for r in rows if r["section"] == "rate" and r["run"] > 0]
    if not rows:
        return
    m = dict(meta)
    out.append("## Rate: copy --rate over the emulated link")
    out.append("")
    out.append("%s. The window is the 10 s after the copy's first 2 s, "
               "from its --progress=json lines." % m.get("rate", "?"))
    out.append("")
    miss = [r for r in rows if r["status"] == "missing"]
    if miss:
        out.append("Not run: %s." % miss[0]["note"])
        out.append("")
        return
    out.append("| run | whole copy MiB/s | 10 s window MiB/s | limit MiB/s | "
               "window off the limit | connections |")
    out.append("|---|---|---|---|---|---|")
    devs = []
    for r in sorted(rows, key=lambda r: r["run"]):
        if r["status"] != "ok":
            out.append("| %s | failed: %s | | | | |" % (r["run"], r["note"]))
            continue
        cr, wr, lim = (num(r, "copy_rate"), num(r, "win_rate"),
                       num(r, "limit"))
        dev = (wr / lim - 1) if wr and lim else None
        if dev is not None:
            devs.append(dev)
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            r["run"], "%.1f" % (cr / MIB) if cr else "-",
            "%.1f" % (wr / MIB) if wr else "-",
            "%.1f" % (lim / MIB) if lim else "-",
            "%+.1f%%" % (100 * dev) if dev is not None else "-",
            r["extra"].get("conns", "-")))
    out.append("")
    if devs:
        worst = max(devs, key=abs)
        out.append("Worst window off the limit: %+.1f%%; goal within %.0f%%: "
                   "%s." % (100 * worst, 100 * GOAL,
                            "met" if abs(worst) <= GOAL else "**not met**"))
        out.append("")
