"""Small helpers the section reports share. Standard library only."""
import statistics

MIB = 1 << 20
GIB = 1 << 30


def num(r, key):
    """A row's extra field as a float, or None."""
    try:
        return float(r["extra"].get(key))
    except (TypeError, ValueError):
        return None


def mibs(r):
    """MiB/s of a row: its bytes over its seconds."""
    return float(r["bytes"]) / MIB / float(r["seconds"])


def med(v, fmt="%.1f"):
    """The median of the values that are not None, formatted; or "-"."""
    v = [x for x in v if x is not None]
    return fmt % statistics.median(v) if v else "-"


def med_range(v, d):
    """"median (min-max)" with d decimals of the values not None; or "-"."""
    v = [x for x in v if x is not None]
    if not v:
        return "-"
    return "%.*f (%.*f-%.*f)" % (d, statistics.median(v), d, min(v), d,
                                 max(v))
