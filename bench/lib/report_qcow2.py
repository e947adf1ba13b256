"""Report tables of bench/lib/qcow2.sh's section qcow2. Standard library
only; used by report.py. Shares report_vhd's helpers."""
from report_vhd import (WRITE_HEAD, _arm, _ccpu, _gib, _mibs, _num,
                        _ratio_row, _secs, write_row)

GOAL_VS_QEMU = 1.5      # nbdflow copy over qemu-img convert, MiB/s
GOAL_VS_NBDCOPY = 1.5   # nbdflow copy over nbdcopy through qemu-nbd

PLAIN_ARMS = [
    ("nbdflow-copy", "`nbdflow copy disk.qcow2 URI`"),
    ("qemu-img", "`qemu-img convert -W -f qcow2 -O raw -n disk.qcow2 URI`"),
    ("nbdcopy-qemu-nbd", "`nbdcopy nbd+unix:///?socket=SOCK URI` from "
     "`qemu-nbd -r -t -f qcow2 -k SOCK disk.qcow2` (CPU: nbdcopy + "
     "qemu-nbd)"),
]
DEFLATE_ARMS = [
    ("nbdflow-copy", "`nbdflow copy deflate.qcow2 URI`"),
    ("qemu-img", "`qemu-img convert -W -f qcow2 -O raw -n deflate.qcow2 "
     "URI`"),
]


def _ccpu_src(r):
    """Client CPU, plus that of the source's server (qemu-nbd) if any."""
    c, s = _ccpu(r), _num(r, "src_cpu_s")
    return None if c is None else c + (s or 0.0)


def _cpu_gib(r):
    c = _ccpu_src(r)
    return None if c is None else c / _gib(r)


def _table(out, rows, wl, arms):
    out.append(WRITE_HEAD)
    out.append("|---|---|---|---|---|---|---|---|")
    got = {}
    for key, cmd in arms:
        got[key] = _arm(rows, wl, key, "client")
        if got[key]:
            out.append(write_row(cmd, got[key], _ccpu_src))
    out.append("")
    out.append("| ratio (medians) | ratio | per-run range | goal | met |")
    out.append("|---|---|---|---|---|")
    return got


def section_qcow2(out, rows, meta):
    rows = [r for r in rows if r["section"] == "qcow2" and r["run"] > 0]
    if not rows:
        return
    m = dict(meta)
    out.append("## qcow2 images (section qcow2)")
    out.append("")
    out.append("Workload: %s. On the bench's tmpfs, into `nbdflow serve` "
               "of a raw file over TCP loopback; one interleaved table "
               "(each run goes once through the three plain and the two "
               "deflate copies). The destination is reset before every "
               "copy (data ranges of the expected content rewritten with "
               "zeros, the rest punched) and compared byte for byte with "
               "`qemu-img convert -f qcow2 -O raw` of the image after the "
               "server stopped. MiB/s are of the virtual size, CPU seconds "
               "per GiB are per GiB of virtual size; the client's CPU and "
               "peak RSS come from `/usr/bin/time -f '%%M %%U %%S'`, the "
               "server's CPU from its `/proc/PID/stat` before and after the "
               "copy. For nbdcopy the client CPU is nbdcopy's plus "
               "qemu-nbd's (from its `/proc/PID/stat`, the same way), "
               "since qemu-nbd does the qcow2 reading; peak RSS is "
               "nbdcopy's alone. qemu-nbd is started before the timed copy, "
               "like the servers, and answers one handshake first."
               % m.get("qcow2", "?"))
    out.append("")
    out.append("### The qcow2 into `nbdflow serve` of a raw file")
    out.append("")
    p = _table(out, rows, "plain", PLAIN_ARMS)
    _ratio_row(out, "nbdflow copy / qemu-img convert (MiB/s)",
               p["nbdflow-copy"], p["qemu-img"], _mibs, GOAL_VS_QEMU, True)
    _ratio_row(out, "nbdflow copy / nbdcopy through qemu-nbd (MiB/s)",
               p["nbdflow-copy"], p["nbdcopy-qemu-nbd"], _mibs,
               GOAL_VS_NBDCOPY, True)
    out.append("")
    out.append("### Deflate-compressed clusters")
    out.append("")
    out.append("Image: %s. Every cluster is inflated by the client." %
               m.get("qcow2_deflate", "?"))
    out.append("")
    d = _table(out, rows, "deflate", DEFLATE_ARMS)
    _ratio_row(out, "nbdflow copy / qemu-img convert (MiB/s)",
               d["nbdflow-copy"], d["qemu-img"], _mibs, None, True)
    _ratio_row(out, "nbdflow copy / qemu-img convert (client CPU s/GiB)",
               d["nbdflow-copy"], d["qemu-img"], _cpu_gib, None, True)
    _ratio_row(out, "nbdflow copy: deflate / plain (seconds)",
               d["nbdflow-copy"], p["nbdflow-copy"], _secs, None, True)
    out.append("")
