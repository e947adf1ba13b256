#!/usr/bin/env python3
"""Turns one bench/run's raw rows into REPORT.md. Standard library only.

  report.py RAWDIR [RAWDIR...] REPORT

Several RAWDIRs (e.g. one run of the loopback sections and one of the
link sections) are combined: rows are concatenated, and machine entries
that differ are listed side by side, separated by " / ". Each RAWDIR holds
results.tsv (one row per measurement, see bench/run's
record()), meta.tsv (key, value) and commands.tsv (key, command)."""
import os
import statistics
import sys

import report_ceiling
import report_link
import report_qcow2
import report_retry
import report_rate
import report_vhd
import report_xapi
import report_vhdrw

COLS = ["section", "workload", "client", "server", "transport", "run",
        "status", "seconds", "bytes", "rss_kb", "user_s", "sys_s", "extra",
        "note"]
MIB = 1 << 20
OURS_SERVER = "nbdflow"
OURS_CLIENT = "nbdflow-copy"
NULL_SERVER = "nbdflow-null"
NULL_SERVERS = (NULL_SERVER, "nbdkit-null")  # store nothing
BASE_SERVER = "nbdflow-base"
TARGET_SERVER = 1.3
TARGET_CLIENT = 1.3
TARGET_SPARSE = 1.2
TARGET_STOCK = 100.0


def load(rawdir):
    rows = []
    with open(os.path.join(rawdir, "results.tsv")) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            parts += [""] * (len(COLS) - len(parts))
            r = dict(zip(COLS, parts))
            r["run"] = int(r["run"] or 0)
            r["extra"] = dict(kv.split("=", 1) for kv in r["extra"].split(";")
                              if "=" in kv)
            rows.append(r)
    meta = []
    with open(os.path.join(rawdir, "meta.tsv")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("\t")
            meta.append((k, v))
    cmds = []
    path = os.path.join(rawdir, "commands.tsv")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                k, _, v = line.rstrip("\n").partition("\t")
                cmds.append((k, v))
    return rows, meta, cmds


def mibs(r):
    return int(r["bytes"]) / MIB / float(r["seconds"])


def fmt(x, digits=None):
    if x is None:
        return "-"
    if digits is None:
        digits = 0 if abs(x) >= 100 else (1 if abs(x) >= 10 else 2)
    return "%.*f" % (digits, x)


def fmt_ratio(x):
    return "-" if x is None else "%.2fx" % x


class Arm:
    """The rows of one arm, and its statistics over successful runs."""

    def __init__(self, rows):
        self.rows = rows
        self.ok = [r for r in rows if r["status"] == "ok"]
        self.failed = [r for r in rows if r["status"] == "fail"]
        self.missing = [r for r in rows if r["status"] in ("missing", "todo")]

    def values(self, fn):
        return [fn(r) for r in self.ok]

    def median(self, fn):
        v = self.values(fn)
        return statistics.median(v) if v else None

    def by_run(self, fn):
        return {r["run"]: fn(r) for r in self.ok}

    def state(self):
        if self.missing:
            return self.missing[0]["note"]
        return None


def group(rows, section, workload=None):
    arms = {}
    for r in rows:
        if r["section"] != section:
            continue
        if workload is not None and r["workload"] != workload:
            continue
        key = (r["client"], r["server"], r["transport"])
        arms.setdefault(key, []).append(r)
    return {k: Arm(v) for k, v in arms.items()}


def cell_speed(arm):
    """'median (min-max)' MiB/s, or the reason there is none."""
    if arm is None:
        return "-"
    if arm.state():
        return "n/a"
    v = arm.values(mibs)
    if not v:
        return "failed (%d)" % len(arm.failed)
    s = "%s (%s-%s)" % (fmt(statistics.median(v)), fmt(min(v)), fmt(max(v)))
    if arm.failed:
        s += " +%d failed" % len(arm.failed)
    return s


def best_peer_ratio(ours, peers, fn):
    """Ratio of our median to the best peer median, the best peer's name,
    and the range of per-run ratios (ours in run i against the best peer
    in run i)."""
    if ours is None or not ours.ok:
        return None, None, None
    meds = {name: a.median(fn) for name, a in peers.items() if a and a.ok}
    if not meds:
        return None, None, None
    best = max(meds, key=meds.get)
    ratio = ours.median(fn) / meds[best]
    per_run = []
    ours_runs = ours.by_run(fn)
    for run, v in ours_runs.items():
        others = [a.by_run(fn).get(run) for a in peers.values() if a]
        others = [o for o in others if o]
        if others:
            per_run.append(v / max(others))
    rng = (min(per_run), max(per_run)) if per_run else None
    return ratio, best, rng


def verdict(ratio, target, higher_is_better=True):
    if ratio is None:
        return "-"
    ok = ratio >= target if higher_is_better else ratio <= target
    return "yes" if ok else "no"


def section_servers(out, rows, meta):
    if "servers" not in dict(meta).get("sections", "").split():
        return
    arms = {k: a for k, a in group(rows, "dense").items()
            if k[0] in ("nbdcopy", "qemu-img")}
    if not arms:
        return
    clients = sorted({k[0] for k in arms})
    servers = [s for s in ("nbdflow", "qemu-nbd", "nbdkit", "nbd-server")
               if any(k[1] == s for k in arms)]
    transports = [t for t in ("tcp", "unix") if any(k[2] == t for k in arms)]
    out.append("## Servers (issue 2): stock clients write the dense image")
    out.append("")
    out.append("MiB/s, median (min-max) of the successful runs; each run "
               "starts a fresh server.")
    out.append("")
    out.append("| client | transport | " + " | ".join(servers) + " |")
    out.append("|---|---|" + "---|" * len(servers))
    for c in clients:
        for t in transports:
            cells = [cell_speed(arms.get((c, s, t))) for s in servers]
            out.append("| %s | %s | %s |" % (c, t, " | ".join(cells)))
    out.append("")
    out.append("Ratio: nbdflow serve against the best other server for the "
               "same client and transport (target %.1fx). Per-run range: "
               "nbdflow in run i against the best other server in run i."
               % TARGET_SERVER)
    out.append("")
    out.append("| client | transport | nbdflow | best other | ratio | "
               "per-run range | meets %.1fx |" % TARGET_SERVER)
    out.append("|---|---|---|---|---|---|---|")
    server_ratio_rows(out, arms, clients, transports, servers, OURS_SERVER,
                      True)
    out.append("")
    servers_null_reference(out, arms, clients, transports, servers)
    servers_cpu(out, arms, clients, transports, servers, meta)
    servers_baseline(out, arms, clients, transports, meta)


def servers_null_reference(out, arms, clients, transports, servers):
    """The same clients into servers that store nothing (`nbdflow serve
    null:` and nbdkit's null plugin) against the best server that stores
    the data: how much of a gap is the write into the file, and how fast
    each client goes on this machine with no storage behind the socket."""
    subjects = [n for n in NULL_SERVERS if any(k[1] == n for k in arms)]
    if not subjects:
        return
    out.append("Storage-free references: the same clients into servers "
               "that store nothing (so their copies are not verified): "
               "`nbdflow serve null:SIZE` and `nbdkit null`, against the "
               "best other server that stores the data. The first tells "
               "how much of a cell's gap is our write into the file. "
               "Together they show what a client reaches on this machine "
               "with no storage behind the socket: a server that stores "
               "the data does more work than either, so where both stay "
               "under %.1fx of the best storing server, a storing server "
               "would need protocol handling cheaper than theirs to reach "
               "the target." % TARGET_SERVER)
    out.append("")
    out.append("| client | transport | storage-free server | MiB/s | "
               "best other | ratio | per-run range |")
    out.append("|---|---|---|---|---|---|---|")
    for c in clients:
        for t in transports:
            for n in subjects:
                row = []
                server_ratio_rows(row, arms, [c], [t], servers, n, False)
                for line in row:
                    cells = line.strip("| ").split(" | ")
                    out.append("| %s |" % " | ".join(
                        (cells[:2] + [n] + cells[2:])[:7]))
    out.append("")


def servers_cpu(out, arms, clients, transports, servers, meta):
    """Where each copy's CPU time went: the client's and the server's, and
    how busy that kept the machine's CPUs over the copy's wall time."""
    subjects = servers + [n for n in NULL_SERVERS
                          if any(k[1] == n for k in arms)]
    srv = lambda r: float(r["extra"]["srv_cpu_s"])
    cli = lambda r: float(r["user_s"] or 0) + float(r["sys_s"] or 0)
    if not any("srv_cpu_s" in r["extra"] for a in arms.values()
               for r in a.rows):
        return
    cpus = int(dict(meta).get("nproc", "1"))
    out.append("CPU seconds per copy, medians: the client's + the "
               "server's (user+sys, from /usr/bin/time and from the "
               "server's /proc/PID/stat with the children it reaped), and "
               "in brackets how busy the two kept the machine's %d CPUs "
               "over the copy's wall time. On loopback the kernel receives "
               "a segment in its sender's context, so the receiving of the "
               "client's data counts as the client's." % cpus)
    out.append("")
    out.append("| client | transport | " + " | ".join(subjects) + " |")
    out.append("|---|---|" + "---|" * len(subjects))
    for c in clients:
        for t in transports:
            cells = []
            for s in subjects:
                a = arms.get((c, s, t))
                rows = [r for r in a.rows if r["status"] == "ok" and
                        "srv_cpu_s" in r["extra"]] if a else []
                if not rows:
                    cells.append("-")
                    continue
                cl = statistics.median(cli(r) for r in rows)
                sv = statistics.median(srv(r) for r in rows)
                busy = statistics.median(
                    (cli(r) + srv(r)) / (float(r["seconds"]) * cpus)
                    for r in rows)
                cells.append("%.2f + %.2f (%.0f%%)" % (cl, sv, 100 * busy))
            out.append("| %s | %s | %s |" % (c, t, " | ".join(cells)))
    out.append("")


def servers_baseline(out, arms, clients, transports, meta):
    """nbdflow serve against the same server built from BENCH_BASELINE,
    run by run: the two ran seconds apart in every run, so the median of
    the per-run ratios is the steadier figure on a noisy machine."""
    if not any(k[1] == BASE_SERVER for k in arms):
        return
    base = dict(meta).get("baseline", "another revision")
    out.append("Against a baseline build: the same clients into `nbdflow "
               "serve` built from %s, in the same runs. Paired: the median "
               "of the per-run ratios (this build in run i against the "
               "baseline in run i), and their range." % base)
    out.append("")
    out.append("| client | transport | nbdflow | baseline | ratio of "
               "medians | paired ratio | per-run range |")
    out.append("|---|---|---|---|---|---|---|")
    for c in clients:
        for t in transports:
            ours = arms.get((c, OURS_SERVER, t))
            old = arms.get((c, BASE_SERVER, t))
            if not ours or not old or not ours.ok or not old.ok:
                continue
            a, b = ours.by_run(mibs), old.by_run(mibs)
            per_run = [a[r] / b[r] for r in a if r in b]
            out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                c, t, fmt(ours.median(mibs)), fmt(old.median(mibs)),
                fmt_ratio(ours.median(mibs) / old.median(mibs)),
                fmt_ratio(statistics.median(per_run)) if per_run else "-",
                "%.2f-%.2f" % (min(per_run), max(per_run))
                if per_run else "-"))
    out.append("")


def server_ratio_rows(out, arms, clients, transports, servers, subject,
                      with_verdict):
    """One row per client and transport: SUBJECT's median against the best
    server other than ours, with the per-run range and, if asked, the
    verdict against the target. A reference subject without figures is
    left out."""
    for c in clients:
        for t in transports:
            arm = arms.get((c, subject, t))
            peers = {s: arms.get((c, s, t)) for s in servers
                     if s != OURS_SERVER}
            ratio, best, rng = best_peer_ratio(arm, peers, mibs)
            if not with_verdict and (arm is None or not arm.ok):
                continue
            if arm is not None and arm.state():
                out.append("| %s | %s | n/a | - | - | - | - |" % (c, t))
                continue
            cells = [c, t, fmt(arm.median(mibs)) if arm else "-",
                     "%s %s" % (best or "-",
                                fmt(peers[best].median(mibs)) if best else ""),
                     fmt_ratio(ratio), "%.2f-%.2f" % rng if rng else "-"]
            if with_verdict:
                cells.append(verdict(ratio, TARGET_SERVER))
            out.append("| %s |" % " | ".join(cells))


def clients_table(out, arms, workload, size_note, target=TARGET_CLIENT):
    servers = [s for s in ("nbdflow", "qemu-nbd", "nbdkit", "nbd-server")
               if any(k[1] == s for k in arms)]
    clients = [c for c in ("nbdflow-copy", "nbdcopy", "qemu-img")
               if any(k[0] == c for k in arms)]
    transports = [t for t in ("tcp", "unix") if any(k[2] == t for k in arms)]
    out.append("### Workload: %s (%s)" % (workload, size_note))
    out.append("")
    out.append("| server | transport | client | MiB/s median (min-max) | "
               "seconds median | peak RSS MiB | CPU s (user+sys) |")
    out.append("|---|---|---|---|---|---|---|")
    for s in servers:
        for t in transports:
            for c in clients:
                a = arms.get((c, s, t))
                if a is None:
                    continue
                secs = a.median(lambda r: float(r["seconds"]))
                rss = a.median(lambda r: int(r["rss_kb"]) / 1024.0
                               if r["rss_kb"] else 0)
                cpu = a.median(lambda r: float(r["user_s"] or 0) +
                               float(r["sys_s"] or 0))
                reason = a.state()
                out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                    s, t, c,
                    "n/a (see below)" if reason else cell_speed(a),
                    fmt(secs, 3), fmt(rss, 0), fmt(cpu, 2)))
    out.append("")
    out.append("Ratio: nbdflow copy against the best peer client into the "
               "same server and transport%s." % (
                   " (target %.1fx)" % target if target else ""))
    out.append("")
    out.append("| server | transport | nbdflow copy | best peer | ratio | "
               "per-run range |" + (" meets %.1fx |" % target if target
                                    else ""))
    out.append("|---|---|---|---|---|---|" + ("---|" if target else ""))
    for s in servers:
        for t in transports:
            ours = arms.get((OURS_CLIENT, s, t))
            peers = {c: arms.get((c, s, t)) for c in clients
                     if c != OURS_CLIENT}
            if ours is None or ours.state():
                out.append("| %s | %s | n/a | - | - | - |%s" % (
                    s, t, " - |" if target else ""))
                continue
            ratio, best, rng = best_peer_ratio(ours, peers, mibs)
            out.append("| %s | %s | %s | %s %s | %s | %s |%s" % (
                s, t, fmt(ours.median(mibs)), best or "-",
                fmt(peers[best].median(mibs)) if best else "",
                fmt_ratio(ratio), "%.2f-%.2f" % rng if rng else "-",
                " %s |" % verdict(ratio, target) if target else ""))
    out.append("")


def section_clients(out, rows, meta):
    m = dict(meta)
    if "clients" not in m.get("sections", "").split():
        return
    out.append("## Clients (issue 3): each client writes into the same "
               "server")
    out.append("")
    notes = {"dense": m.get("size", ""),
             "sparse": m.get("sparse", ""),
             "sparse-data": "the sparse image's data extents back to back"}
    for wl in ("dense", "sparse", "sparse-data"):
        arms = group(rows, "dense" if wl == "dense" else "clients", wl)
        if arms:
            clients_table(out, arms, wl, notes[wl])
    sp, sd = group(rows, "clients", "sparse"), group(rows, "clients",
                                                     "sparse-data")
    if sp and sd:
        out.append("### Sparse copy against a dense copy of its data")
        out.append("")
        out.append("Median seconds of the sparse copy divided by the median "
                   "seconds of copying only its data densely (target: "
                   "nbdflow copy within %.1fx). The two workloads share one "
                   "interleaved table: in every run each client's sparse "
                   "copy into a server is followed at once by its data-only "
                   "copy into the same server, and the per-run range divides "
                   "the one by the other." % TARGET_SPARSE)
        out.append("")
        out.append("| client | server | transport | sparse s | data-only s | "
                   "ratio | per-run range | within %.1fx |" % TARGET_SPARSE)
        out.append("|---|---|---|---|---|---|---|---|")
        secs = lambda r: float(r["seconds"])
        for key in sorted(sp):
            a, b = sp[key], sd.get(key)
            if b is None or a.state() or b.state() or not a.ok or not b.ok:
                continue
            ratio = a.median(secs) / b.median(secs)
            pair = b.by_run(secs)
            per_run = [v / pair[run] for run, v in a.by_run(secs).items()
                       if pair.get(run)]
            rng = ("%s-%s" % (fmt(min(per_run), 2), fmt(max(per_run), 2))
                   if per_run else "-")
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                key[0], key[1], key[2], fmt(a.median(secs), 3),
                fmt(b.median(secs), 3), fmt_ratio(ratio), rng,
                verdict(ratio, TARGET_SPARSE, higher_is_better=False)))
        out.append("")


def section_reads(out, rows, meta):
    m = dict(meta)
    if "reads" not in m.get("sections", "").split():
        return
    arms = group(rows, "reads", "read")
    if not arms:
        return
    out.append("## Reads: each client copies an image out of each server")
    out.append("")
    out.append("No issue sets a target here: exports and backups read out of "
               "a server, and a server that is fast to write into can still "
               "be slow to read from. The client writes a local file on the "
               "same tmpfs, which the reset left allocated. nbdcopy "
               "truncates that file first, so that it reads as zeroes, and "
               "allocates its pages again during the copy; nbdflow copy "
               "(since d4e08cc) and qemu-img (`-n`) write into it in place.")
    out.append("")
    clients_table(out, arms, "read", m.get("read_size", ""), target=None)
    clients = [c for c in ("nbdflow-copy", "nbdcopy", "qemu-img")
               if any(k[0] == c for k in arms)]
    servers = [s for s in ("nbdflow", "qemu-nbd", "nbdkit", "nbd-server")
               if any(k[1] == s for k in arms)]
    transports = [t for t in ("tcp", "unix") if any(k[2] == t for k in arms)]
    out.append("Ratio: nbdflow serve against the best other server for the "
               "same client and transport. Per-run range: nbdflow in run i "
               "against the best other server in run i.")
    out.append("")
    out.append("| client | transport | nbdflow | best other | ratio | "
               "per-run range |")
    out.append("|---|---|---|---|---|---|")
    server_ratio_rows(out, arms, clients, transports, servers, OURS_SERVER,
                      False)
    out.append("")


def section_stock(out, rows, meta):
    arms = {}
    for r in rows:
        if r["section"] == "stock":
            arms.setdefault((r["workload"], r["server"]), []).append(r)
    if not arms:
        return
    arms = {k: Arm(v) for k, v in arms.items()}
    rps = lambda r: float(r["extra"].get("req_per_s", 0))
    out.append("## Stock sparse_dd-shaped client (issue 2)")
    out.append("")
    out.append("`nbdflow-stockclient`: Nagle on, request header and payload "
               "in two write() calls, one request in flight, over TCP "
               "loopback; each run bounded by %s. A stall is a request "
               "slower than 10 ms." % dict(meta).get("stock", ""))
    out.append("")
    out.append("| request size | server | req/s median (min-max) | "
               "latency p50 ms | latency max ms | stalled requests "
               "(median) |")
    out.append("|---|---|---|---|---|---|")
    sizes = []
    for (size, srv) in arms:
        if size not in sizes and size != "-":
            sizes.append(size)
    order = ("nbdflow", "qemu-nbd", "nbdkit", "nbd-server")
    for size in sizes:
        for srv in order:
            a = arms.get((size, srv))
            if a is None:
                continue
            if a.state():
                out.append("| %s | %s | n/a: %s | - | - | - |"
                           % (size, srv, a.state()))
                continue
            v = a.values(rps)
            if not v:
                out.append("| %s | %s | failed: %s | - | - | - |"
                           % (size, srv, a.failed[0]["note"]
                              if a.failed else ""))
                continue
            p50 = a.median(lambda r: float(r["extra"].get("lat_p50_ms", 0)))
            mx = max(a.values(lambda r: float(r["extra"].get("lat_max_ms",
                                                             0))))
            st = a.median(lambda r: float(r["extra"].get(
                "stalls_over_10ms", 0)))
            out.append("| %s | %s | %s (%s-%s) | %s | %s | %s |" % (
                size, srv, fmt(statistics.median(v), 1), fmt(min(v), 1),
                fmt(max(v), 1), fmt(p50, 3), fmt(mx, 2), fmt(st, 0)))
    out.append("")
    out.append("Ratio: nbdflow serve's median req/s over each other "
               "server's (target at 512 B: at least %.0fx, and no stalls)."
               % TARGET_STOCK)
    out.append("")
    peers = [s for s in order if s != OURS_SERVER]
    out.append("| request size | " + " | ".join("vs " + p for p in peers) +
               " |")
    out.append("|---|" + "---|" * len(peers))
    for size in sizes:
        ours = arms.get((size, OURS_SERVER))
        cells = []
        for p in peers:
            a = arms.get((size, p))
            if (ours is None or a is None or ours.state() or a.state() or
                    not ours.ok or not a.ok):
                cells.append("-")
            else:
                cells.append(fmt_ratio(ours.median(rps) / a.median(rps)))
        out.append("| %s | %s |" % (size, " | ".join(cells)))
    out.append("")


def section_notes(out, rows):
    missing = [r for r in rows if r["status"] in ("missing", "todo")]
    failed = [r for r in rows if r["status"] == "fail"]
    if not missing and not failed:
        return
    out.append("## Arms not measured, and failures")
    out.append("")
    seen = set()
    for r in missing:
        key = (r["section"], r["client"], r["server"], r["note"])
        if key in seen:
            continue
        seen.add(key)
        who = " -> ".join(x for x in (r["client"], r["server"]) if x != "-")
        out.append("- %s: %s%s" % (r["section"], (who + ": ") if who else "",
                                   r["note"]))
    for r in failed:
        out.append("- FAILED %s/%s run %d: %s -> %s over %s: %s" % (
            r["section"], r["workload"], r["run"], r["client"], r["server"],
            r["transport"], r["note"]))
    out.append("")


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    report = argv[-1]
    rows, meta, cmds = [], [], []
    for rawdir in argv[1:-1]:
        r, m1, c = load(rawdir)
        rows += r
        cmds += [kv for kv in c if kv not in cmds]
        for k, v in m1:
            old = [i for i, (k0, _) in enumerate(meta) if k0 == k]
            if not old:
                meta.append((k, v))
            elif v not in meta[old[0]][1].split(" / "):
                meta[old[0]] = (k, meta[old[0]][1] + " / " + v)
    m = dict(meta)
    out = ["# nbdflow benchmark report", ""]
    out.append("Written by `bench/run` on %s, commit `%s`, in %s s. "
               "Sections: %s. Runs per arm: %s." % (
                   m.get("started", "?"), m.get("git", "?"),
                   m.get("duration_s", "?"), m.get("sections", "?"),
                   m.get("runs", "?")))
    out.append("")
    try:
        load_start = float(m.get("loadavg_start", "0").split()[0])
        load_end = float(m.get("loadavg_end", "0").split()[0])
        cpus = int(m.get("nproc", "1"))
    except ValueError:
        load_start, load_end, cpus = 0.0, 0.0, 1
    if max(load_start, load_end) > 0.5 * cpus:
        out.append("**Warning: the machine was busy** (load average %.2f "
                   "at the start, %.2f at the end, on %d CPUs). Other work "
                   "shares the CPUs with the arms, so ranges are wide; "
                   "compare within a run and prefer the per-run ratios."
                   % (load_start, load_end, cpus))
        out.append("")
    out.append("## Method")
    out.append("")
    out.append("- Arms are interleaved: every run goes once through every "
               "arm of its table before the next run starts (A B C A B C). "
               "Medians and ranges are over the successful runs.%s" % (
                   " One unrecorded warm-up copy of each workload precedes"
                   " each table."
                   if m.get("warmup") == "1" else ""))
    out.append("- Time is the client's wall clock from exec to exit; the "
               "server is started before and stopped after, untimed; it "
               "counts as started once it has answered one NBD handshake "
               "(`nbdinfo --size`), because a fresh nbd-server takes "
               "0.2-1.7 s over its first connection only. "
               "MiB/s = image size (virtual size for the sparse image) / "
               "time, MiB = 2^20 bytes. Peak RSS and CPU come from "
               "`/usr/bin/time -f '%M %U %S'`.")
    out.append("- Every copy is verified byte for byte against its source "
               "(holes compared as zeros) after the server has stopped; a "
               "copy that fails or mismatches is listed below and left out "
               "of the statistics. The exceptions are the servers "
               "section's reference arms into `null:` and `nbdkit null`, "
               "which store nothing.")
    out.append("- Storage: source and destination are files on %s, so RAM "
               "backs both ends." % m.get("tmpfs", "tmpfs"))
    out.append("- Destination state: %s" % m.get("state", ""))
    secs = m.get("sections", "").split()
    if set(secs) & {"servers", "clients", "reads"}:
        out.append("- Workloads: dense image %s; sparse image %s." % (
            m.get("size", "?"), m.get("sparse", "?")))
    if "vhd" in secs:
        out.append("- Section vhd: workload and checks in its section "
                   "below (its reads are checked by a digest of the "
                   "export, not byte for byte).")
    if "qcow2" in secs:
        out.append("- Section qcow2: workload and checks in its section "
                   "below.")
    if "ceiling" in secs:
        out.append("- Section ceiling: the dense image %s; its two arms "
                   "in its section below." % m.get("size", "?"))
    out.append("")
    section_servers(out, rows, meta)
    section_clients(out, rows, meta)
    section_reads(out, rows, meta)
    section_stock(out, rows, meta)
    report_link.section_matrix(out, rows, meta)
    report_link.section_rtt(out, rows, meta, os.path.join(
        os.path.dirname(os.path.abspath(report)), "rtt.svg"))
    report_link.section_tls(out, rows, meta)
    report_vhd.section_vhd(out, rows, meta)
    report_qcow2.section_qcow2(out, rows, meta)
    report_retry.section_retry(out, rows, meta)
    report_rate.section_rate(out, rows, meta)
    report_xapi.section_xapi(out, rows, meta)
    report_vhdrw.section_vhdrw(out, rows, meta)
    report_ceiling.section_ceiling(out, rows, meta)
    section_notes(out, rows)
    out.append("## Machine")
    out.append("")
    out.append("| item | value |")
    out.append("|---|---|")
    for k, v in meta:
        if k in ("state", "sections", "runs", "started", "git"):
            continue
        out.append("| %s | %s |" % (k, v.replace("|", "\\|")))
    out.append("")
    if cmds:
        out.append("## Commands")
        out.append("")
        out.append("`<tmp>` is the per-run tmpfs directory; ports are "
                   "picked free at run time.")
        out.append("")
        for k, v in cmds:
            out.append("- %s: `%s`" % (k, v))
        out.append("")
    with open(report, "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv)
