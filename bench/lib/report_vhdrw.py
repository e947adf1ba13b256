"""Report tables of bench/lib/vhdrw.sh's section vhdrw. Standard library
only; used by report.py."""
import statistics

from report_util import GIB, MIB, med, mibs, num

GOAL = 1.5   # nbdflow serve over qemu-nbd -f vpc, MiB/s, at least

SERVERS = {
    "nbdflow": "`nbdflow serve DST.vhd`",
    "qemu-nbd": "`qemu-nbd -f vpc --cache=writeback --aio=threads -t -e 8 "
                "DST.vhd`",
}
WORKLOADS = {"dense": "dense", "sparse": "sparse"}


def _table(out, rows, wl):
    out.append("| server | MiB/s median (min-max) | server CPU s/GiB | "
               "nbdcopy CPU s/GiB | VHD file MiB | failed |")
    out.append("|---|---|---|---|---|---|")
    by = {}
    for srv, name in SERVERS.items():
        a = [r for r in rows if r["workload"] == wl and r["server"] == srv]
        if not a:
            continue
        good = [r for r in a if r["status"] == "ok"]
        by[srv] = {r["run"]: mibs(r) for r in good}
        m = [mibs(r) for r in good]
        gib = [float(r["bytes"]) / GIB for r in good]
        sc = [(num(r, "srv_cpu_s") / g) if num(r, "srv_cpu_s") is not None
              else None for r, g in zip(good, gib)]
        cc = []
        for r, g in zip(good, gib):
            try:
                cc.append((float(r["user_s"]) + float(r["sys_s"])) / g)
            except (TypeError, ValueError):
                cc.append(None)
        vb = [(num(r, "vhd_bytes") or 0) / MIB for r in good]
        out.append("| %s | %s | %s | %s | %s | %d |" % (
            name,
            ("%.0f (%.0f-%.0f)" % (statistics.median(m), min(m), max(m)))
            if m else "-",
            med(sc, "%.2f"), med(cc, "%.2f"), med(vb, "%.0f"),
            len(a) - len(good)))
    out.append("")
    return by


def _ratio(out, by, what):
    if "nbdflow" not in by or "qemu-nbd" not in by or \
            not by["nbdflow"] or not by["qemu-nbd"]:
        return
    a, b = by["nbdflow"], by["qemu-nbd"]
    per = [a[k] / b[k] for k in a if k in b]
    ratio = statistics.median(a.values()) / statistics.median(b.values())
    out.append("| %s | %.2fx | %s | %.1fx | %s |" % (
        what, ratio, ("%.2f-%.2f" % (min(per), max(per))) if per else "-",
        GOAL, "yes" if ratio >= GOAL else "**no**"))


def section_vhdrw(out, rows, meta):
    rows = [r for r in rows if r["section"] == "vhdrw" and r["run"] > 0]
    if not rows:
        return
    m = dict(meta)
    out.append("## Receiving into a VHD (section vhdrw)")
    out.append("")
    out.append("Workload: %s. Servers interleaved (dense and sparse, each "
               "server in turn, every run); each copy starts from a fresh "
               "copy of the empty VHD and is verified after the server "
               "stopped by `qemu-img compare -f vpc -F raw` against the "
               "source (and nbdflow's VHD by `nbdflow info --check`). "
               "Server CPU from its `/proc/PID/stat` over the copy, per GiB "
               "of the image; the VHD file's size shows what each server "
               "allocated (qemu-nbd writes nbdcopy's zeroes as data)." %
               m.get("vhdrw", "?"))
    out.append("")
    ratios = []
    for wl, title in WORKLOADS.items():
        out.append("### %s" % title.capitalize())
        out.append("")
        ratios.append((wl, _table(out, rows, wl)))
    out.append("| ratio (medians) | ratio | per-run range | goal | met |")
    out.append("|---|---|---|---|---|")
    for wl, by in ratios:
        _ratio(out, by, "%s: nbdflow serve / qemu-nbd -f vpc (MiB/s)" % wl)
    out.append("")
