#!/usr/bin/env python3
"""Plot `insitu bench aggregate --json` output: objects/ms per strategy against
selectivity (log scales), ours beside the seed's (000) figures.

usage: plot_aggregate.py aggregate.json out.png [--objects N] [--extra other.json LABEL]
(--extra overlays the log-traversal line of another run, e.g. with --shards 2)
"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

STRATEGIES = ["client", "client-batched", "hashtable-lookup", "hashtable-foreach", "log-traversal"]
# The seed's "Scalability with increasing selectivity" table (objects/ms).
SEED = {
    "client": {1.0: 206, 0.1: 203, 0.005: 203},
    "hashtable-lookup": {1.0: 5036, 0.1: 4030, 0.005: 3650},
    "hashtable-foreach": {1.0: 16012, 0.1: 1322, 0.005: 63},
    "log-traversal": {1.0: 70323, 0.1: 6825, 0.005: 345},
}

def main():
    data = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    rows = data["rows"]
    objects = max(r["objects"] for r in rows)
    if "--objects" in sys.argv:
        objects = int(sys.argv[sys.argv.index("--objects") + 1])
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colors = dict(zip(STRATEGIES, ["tab:gray", "tab:purple", "tab:blue", "tab:orange", "tab:green"]))
    for st in STRATEGIES:
        pts = sorted((r["selectivity"], r["objects_per_ms"]) for r in rows
                     if r["strategy"] == st and r["objects"] == objects)
        if pts:
            ax.plot([p[0] * 100 for p in pts], [p[1] for p in pts], "o-", color=colors[st],
                    label=f"insitu {st}")
        if st in SEED:
            s = sorted(SEED[st].items())
            ax.plot([p[0] * 100 for p in s], [p[1] for p in s], "x--", color=colors[st], alpha=0.5,
                    label=f"seed {st}")
    if "--extra" in sys.argv:
        i = sys.argv.index("--extra")
        extra, label = json.load(open(sys.argv[i + 1])), sys.argv[i + 2]
        for n in sorted({r["objects"] for r in extra["rows"]}):
            pts = sorted((r["selectivity"], r["objects_per_ms"]) for r in extra["rows"]
                         if r["strategy"] == "log-traversal" and r["objects"] == n)
            ax.plot([p[0] * 100 for p in pts], [p[1] for p in pts], "s-", color="darkgreen",
                    label=f"insitu log-traversal, {label}, {n:,} objects")
    for d in data.get("duckdb", []):
        if d["objects"] == objects:
            ax.axhline(d["objects_per_ms"], color="k", linestyle=":", label="DuckDB SUM (no selectivity)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("selectivity (% of the server's objects in the aggregated table)")
    ax.set_ylabel("objects aggregated per ms")
    ax.set_title(f"Aggregating {objects:,} integers: insitu vs the seed (dashed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)

if __name__ == "__main__":
    main()
