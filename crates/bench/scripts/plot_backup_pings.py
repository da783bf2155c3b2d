#!/usr/bin/env python3
"""Plot alternated `insitu bench recovery --json` runs of two or more builds:
per run, the longest wait of a ping to a survivor's backup port
(`backup_ping_ms_max`, where the failure detector pings) and to its shard
(`probe_ping_ms_max`), against the failure timeout.

usage: plot_backup_pings.py out.png LABEL=run1.json,run2.json,... LABEL=...
"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

FAILURE_TIMEOUT_MS = 500  # the coordinator's default


def main():
    out = sys.argv[1]
    builds = []
    for arg in sys.argv[2:]:
        label, paths = arg.split("=", 1)
        builds.append((label, [json.load(open(p)) for p in paths.split(",")]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, runs) in enumerate(builds):
        xs = [i + (j - (len(runs) - 1) / 2) * 0.08 for j in range(len(runs))]
        backup = [r["backup_ping_ms_max"] for r in runs]
        shard = [r["probe_ping_ms_max"] for r in runs]
        ax.scatter(xs, backup, marker="o", color="C3", label="backup port" if i == 0 else None)
        ax.scatter(xs, shard, marker="x", color="C0", label="shard" if i == 0 else None)
    ax.axhline(FAILURE_TIMEOUT_MS, color="gray", lw=0.8, label="failure timeout (500 ms)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(builds)), [label for label, _ in builds])
    ax.set_ylabel("longest ping wait during the recovery (ms)")
    ax.set_title("pings to the survivors during a 1 GB recovery, alternated runs")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
