"""PNG charts of a bench result (Debian's python3-matplotlib, no display needed): written by
`bench.py run --charts DIR` next to the table, from the raw result alone (the JSON of --json).

  ratios.png   each figure's ratio against its target (a row of the table whose target is a
               bound such as ">= 0.9"), green when met, red when not
  backlog.png  the backlog-scaling curve of section e2e_peer: msg/s and whole-box CPU per
               message against the number of messages queued (when that section ran)
  latency.png  the latency distributions measured (min, p50, mean, p99, max of each)
"""

import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The table's columns (lib/table.py ROW): figure 36, pg_eventbox 20, baseline 26, ratio 7, target.
RATIO = slice(85, 92)
TARGET = slice(93, None)
BOUND = re.compile(r"^(>=|<=|>|<)\s*([0-9.]+)")


def ratio_rows(rows):
    """(figure, ratio, op, bound) of the table rows with a numeric ratio and a bound target."""
    out = []
    for row in rows:
        if len(row) <= TARGET.start:
            continue
        m = BOUND.match(row[TARGET].strip())
        try:
            ratio = float(row[RATIO].strip())
        except ValueError:
            continue
        if m:
            out.append((row[:36].strip(), ratio, m.group(1), float(m.group(2))))
    return out


def met(ratio, op, bound):
    return {">=": ratio >= bound, "<=": ratio <= bound, ">": ratio > bound,
            "<": ratio < bound}[op]


def latency_sets(res, prefix=""):
    """(name, stats) of every latency summary (dicts with p50, p99, min, max, mean) in res."""
    out = []
    for k, v in res.items():
        if isinstance(v, dict):
            if {"p50", "p99", "min", "max", "mean"} <= set(v):
                out.append((prefix + k, v))
            elif not prefix:
                out.extend(latency_sets(v, k + "."))
    return out


def chart_ratios(rows, path):
    rs = ratio_rows(rows)
    if not rs:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rs) + 1.2))
    ys = range(len(rs))
    ax.barh(ys, [r[1] for r in rs], color=["#3a923a" if met(*r[1:]) else "#c0392b" for r in rs])
    for y, (_, ratio, op, bound) in zip(ys, rs):
        ax.plot([bound, bound], [y - 0.4, y + 0.4], color="black", linewidth=2)
        ax.annotate("%.2f (%s %g)" % (ratio, op, bound), (max(ratio, bound), y),
                    xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r[0] for r in rs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (log scale); black bar: target")
    ax.set_title("pg_eventbox bench: ratios against their targets")
    # Log scale: targets range from 0.5 to 50.
    ax.set_xscale("log")
    ax.set_xlim(min(max(min(r[1], r[3]), 1e-3) for r in rs) / 2,
                max(max(r[1], r[3]) for r in rs) * 6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def chart_backlog(res, path):
    bl = (res.get("e2e_peer") or {}).get("backlog") or []
    if not bl:
        return None
    ns = [x["n"] for x in bl]
    rates = [x.get("steady_rate") or x["rate"] for x in bl]
    cpu = [x["cpu"]["box_s"] / x["n"] * 1e6 for x in bl]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(ns, rates, "o-", color="#1f77b4", label="msg/s")
    ax.set_xscale("log")
    ax.set_xlabel("messages queued before the subscription is enabled")
    ax.set_ylabel("msg/s", color="#1f77b4")
    ax.set_ylim(0, max(rates) * 1.2)
    ax2 = ax.twinx()
    ax2.plot(ns, cpu, "s--", color="#d62728", label="CPU us/msg")
    ax2.set_ylabel("whole-box CPU per message (us)", color="#d62728")
    ax2.set_ylim(0, max(cpu) * 1.2)
    ax.set_title("e2e throughput and CPU per message against backlog size")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def chart_latency(res, path):
    sets = latency_sets(res)
    if not sets:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(sets) + 1.5))
    for y, (name, s) in enumerate(sets):
        ax.plot([s["min"], s["max"]], [y, y], color="#888888", linewidth=1)
        ax.plot([s["p50"], s["p99"]], [y, y], color="#1f77b4", linewidth=6, solid_capstyle="butt")
        ax.plot([s["mean"]], [y], "k|", markersize=14)
        ax.annotate("p50 %.1f  p99 %.1f  max %.1f ms" % (s["p50"], s["p99"], s["max"]),
                    (s["max"], y), xytext=(4, 0), textcoords="offset points", va="center",
                    fontsize=8)
    ax.set_yticks(range(len(sets)))
    ax.set_yticklabels([n for n, _ in sets], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ms (log); grey: min..max, blue: p50..p99, |: mean")
    ax.set_title("pg_eventbox bench: latency distributions")
    right = max(s["max"] for _, s in sets)
    ax.set_xlim(min(max(s["min"], 0.01) for _, s in sets) / 2, right * 8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_charts(res, outdir):
    """Writes the charts res has data for into outdir; returns their paths."""
    os.makedirs(outdir, exist_ok=True)
    made = [chart_ratios(res.get("rows") or [], os.path.join(outdir, "ratios.png")),
            chart_backlog(res, os.path.join(outdir, "backlog.png")),
            chart_latency(res, os.path.join(outdir, "latency.png"))]
    return [p for p in made if p]
