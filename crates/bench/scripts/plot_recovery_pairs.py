#!/usr/bin/env python3
"""Plot alternated `insitu bench recovery --json` runs of two or more builds:
per run, the time from detection to every tablet readable (`recover_ms`) and
writable (`writable_ms`; a build without it served both at once).

usage: plot_recovery_pairs.py out.png LABEL=run1.json,run2.json,... LABEL=...
"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    out = sys.argv[1]
    builds = []
    for arg in sys.argv[2:]:
        label, paths = arg.split("=", 1)
        runs = [json.load(open(p)) for p in paths.split(",")]
        builds.append((label, runs))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, runs) in enumerate(builds):
        xs = [i + (j - (len(runs) - 1) / 2) * 0.08 for j in range(len(runs))]
        readable = [r["recover_ms"] / 1e3 for r in runs]
        writable = [r.get("writable_ms", r["recover_ms"]) / 1e3 for r in runs]
        ax.scatter(xs, readable, marker="o", color="C0", label="readable" if i == 0 else None)
        ax.scatter(xs, writable, marker="x", color="C3", label="writable" if i == 0 else None)
    ax.axhline(2.0, color="gray", lw=0.8, label="target: 2 s per GB (with detection)")
    ax.set_xticks(range(len(builds)), [label for label, _ in builds])
    ax.set_ylabel("seconds from detection, 1 GB")
    ax.set_ylim(bottom=0)
    ax.set_title("insitu crash recovery, 3 servers, alternated runs")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
