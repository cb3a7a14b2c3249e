"""The pieces of the printed table and its notes: the row format, and the figures taken from a
section's runs."""

# figure, pg_eventbox, baseline, ratio, target
ROW = "%-36s %-20s %-26s %-7s %s"


def best(runs, key="rate"):
    """The run with the highest `key` (None counts as 0)."""
    return max(runs, key=lambda r: r[key] or 0)


def per_msg_us(runs, key):
    """The CPU seconds `key` of the runs' meters per message, in microseconds."""
    return sum(r["cpu"][key] for r in runs) / sum(r["n"] for r in runs) * 1e6


def per_msg_faults(runs, key):
    """The minor page faults `key` of the runs' meters (CpuMeter) per message."""
    return sum(r["cpu"].get(key, 0) for r in runs) / sum(r["n"] for r in runs)


def steady_rate(n, elapsed, first, first_count):
    """Messages per second after the first committed batch (or outgoing message) was seen at
    `first` seconds with `first_count` done: the consumer's start left out."""
    if first is None or elapsed <= first or first_count >= n:
        return None
    return (n - first_count) / (elapsed - first)


def mib(n_bytes):
    return n_bytes / 2 ** 20


def ok(cond, good="ok", bad="BELOW"):
    """The verdict after a target."""
    return good if cond else bad
