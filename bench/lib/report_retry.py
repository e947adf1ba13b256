"""Report table of bench/lib/retry.sh's section retry. Standard library
only; used by report.py."""
import statistics

from report_util import MIB, med, med_range, mibs, num

GOAL = 1.2  # a killed copy's time over an undisturbed one's, at most


def section_retry(out, rows, meta):
    rows = [r for r in rows if r["section"] == "retry" and r["run"] > 0]
    if not rows:
        return
    m = dict(meta)
    out.append("## Retry: the server killed and restarted mid-copy")
    out.append("")
    out.append("%s. Time is the copy's wall clock, the restart included." %
               m.get("retry", "?"))
    out.append("")
    miss = [r for r in rows if r["status"] == "missing"]
    if miss:
        out.append("Not run: %s." % miss[0]["note"])
        out.append("")
        return
    out.append("| arm | seconds median (min-max) | MiB/s median | "
               "reconnects | bytes sent twice (MiB) | failed |")
    out.append("|---|---|---|---|---|---|")
    ok = {}
    for arm in ("undisturbed", "killed"):
        a = [r for r in rows if r["client"] == arm]
        good = [r for r in a if r["status"] == "ok"]
        ok[arm] = {r["run"]: float(r["seconds"]) for r in good}
        secs = [float(r["seconds"]) for r in good]
        rates = [mibs(r) for r in good]
        out.append("| %s | %s | %s | %s | %s | %d |" % (
            arm, med_range(secs, 2), med(rates),
            med_range([num(r, "reconnects") for r in good], 0),
            med_range([(num(r, "resent") or 0) / MIB for r in good], 1),
            len(a) - len(good)))
    out.append("")
    per_run = [ok["killed"][k] / ok["undisturbed"][k]
               for k in ok["killed"] if k in ok["undisturbed"]]
    if per_run:
        ratio = statistics.median(per_run)
        out.append("Killed over undisturbed, per run: median %.2fx "
                   "(%.2f-%.2f); goal at most %.1fx: %s." % (
                       ratio, min(per_run), max(per_run), GOAL,
                       "met" if ratio <= GOAL else "**not met**"))
        out.append("")
    for r in rows:
        if r["status"] not in ("ok", "missing"):
            out.append("- run %s, %s: %s" % (r["run"], r["client"],
                                             r["note"]))
    out.append("")
