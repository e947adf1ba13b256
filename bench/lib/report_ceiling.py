"""Report tables of bench/lib/ceiling.sh's section ceiling. Standard
library only; used by report.py."""
import statistics

from report_util import GIB, med, med_range, mibs, num

GOAL_TCP = 0.80  # our pair's MiB/s over the ceiling's, over TCP, at least
ARMS = (("ceiling", "ceiling", "ceiling (bench/ceiling.c)"),
        ("nbdflow-copy", "nbdflow", "pair: nbdflow copy -> nbdflow serve"))


def cpu_split(r):
    """CPU seconds of one run: (total, sender's, receiver's). The ceiling
    is one process (total from /usr/bin/time, the split from its thread
    clocks); the pair is the client (sender) and the server (receiver)."""
    own = float(r["user_s"] or 0) + float(r["sys_s"] or 0)
    if r["client"] == "ceiling":
        return own, num(r, "sender_cpu_s"), num(r, "receiver_cpu_s")
    srv = num(r, "srv_cpu_s")
    return (own + srv if srv is not None else None), own, srv


def per_gib(r, i):
    v = cpu_split(r)[i]
    return None if v is None else v / (float(r["bytes"]) / GIB)


def section_ceiling(out, rows, meta):
    rows = [r for r in rows if r["section"] == "ceiling" and
            (r["run"] > 0 or r["status"] == "missing")]
    if not rows:
        return
    m = dict(meta)
    cpus = int(m.get("nproc", "1") or 1)
    out.append("## Ceiling (issue 36): our pair against the bare data path")
    out.append("")
    out.append("%s. Two arms interleaved run by run, over TCP loopback and "
               "a Unix socket: `nbdflow-ceiling` (bench/ceiling.c), one "
               "process that sends the image with sendfile(2) in 2 MiB "
               "pieces, each after a corked 28-byte header, at most 8 "
               "unacknowledged, and receives each with splice(2) through a "
               "pipe into the destination before a 16-byte reply, its "
               "sockets set as nbdflow sets its own; and our pair, "
               "`nbdflow serve DST` with `nbdflow copy SRC URI`, both with "
               "their defaults. Both arms' copies are verified byte for "
               "byte. Time: wall clock from exec to exit of the ceiling "
               "and of the copy (the server is started before, untimed)."
               % m.get("ceiling", "?"))
    out.append("")
    miss = [r for r in rows if r["status"] == "missing"]
    for r in miss:
        out.append("Not run: %s -> %s: %s." % (r["client"], r["server"],
                                               r["note"]))
    if miss:
        out.append("")
    out.append("CPU: user+sys seconds per GiB copied, medians: total "
               "(sender + receiver). For the ceiling the total comes from "
               "/usr/bin/time, the split from its threads' CPU clocks; for "
               "the pair the sender is the copy (/usr/bin/time), the "
               "receiver the server (/proc/PID/stat). On loopback the "
               "kernel receives a segment in its sender's context, so "
               "part of the receiving counts as the sender's. CPUs busy: "
               "the total over the wall time of the %d CPUs." % cpus)
    out.append("")
    out.append("| transport | arm | MiB/s median (min-max) | seconds median "
               "| CPU s/GiB | CPUs busy | failed |")
    out.append("|---|---|---|---|---|---|---|")
    ok = {}
    for tr in ("tcp", "unix"):
        for cl, srv, label in ARMS:
            a = [r for r in rows if r["transport"] == tr and
                 r["client"] == cl and r["server"] == srv and
                 r["status"] in ("ok", "fail")]
            if not a:
                continue
            good = [r for r in a if r["status"] == "ok"]
            ok[(tr, cl)] = {r["run"]: mibs(r) for r in good}
            secs = med([float(r["seconds"]) for r in good], "%.3f")
            cpu = "%s (%s + %s)" % tuple(
                med([per_gib(r, i) for r in good], "%.2f") for i in range(3))
            busy = med([100 * cpu_split(r)[0] / (float(r["seconds"]) * cpus)
                        for r in good if cpu_split(r)[0] is not None],
                       "%.0f%%")
            out.append("| %s | %s | %s | %s | %s | %s | %d |" % (
                tr, label, med_range([mibs(r) for r in good], 0), secs, cpu,
                busy, len(a) - len(good)))
    out.append("")
    out.append("Our pair as a percentage of the ceiling: the pair's median "
               "MiB/s over the ceiling's, and the range of the per-run "
               "figures (the pair in run i over the ceiling in run i, "
               "copies seconds apart). Goal: %.0f%% on TCP; Unix is "
               "reported without one." % (100 * GOAL_TCP))
    out.append("")
    out.append("| transport | pair MiB/s | ceiling MiB/s | pair / ceiling | "
               "per-run range | goal |")
    out.append("|---|---|---|---|---|---|")
    for tr in ("tcp", "unix"):
        pair, ceil = ok.get((tr, "nbdflow-copy")), ok.get((tr, "ceiling"))
        if not pair or not ceil:
            continue
        pm, cm = (statistics.median(pair.values()),
                  statistics.median(ceil.values()))
        per_run = [pair[k] / ceil[k] for k in pair if k in ceil]
        goal = "-"
        if tr == "tcp":
            goal = "%.0f%%: %s" % (100 * GOAL_TCP, "met" if pm / cm >=
                                   GOAL_TCP else "**not met**")
        out.append("| %s | %.0f | %.0f | %.0f%% | %s | %s |" % (
            tr, pm, cm, 100 * pm / cm,
            "%.0f-%.0f%%" % (100 * min(per_run), 100 * max(per_run))
            if per_run else "-", goal))
    out.append("")
