#!/usr/bin/env python3
"""Plot alternated `insitu bench recovery --json` runs of two or more builds.

Per run, by default: the time from detection to every tablet readable
(`recover_ms`) and writable (`writable_ms`; a build without it served both
at once). With `--pings`: the longest wait of a ping to a survivor's backup
port (`backup_ping_ms_max`, where the failure detector pings) and to its
shard (`probe_ping_ms_max`), against the failure timeout.

usage: plot_recovery_pairs.py [--pings] out.png LABEL=run1.json,run2.json,... LABEL=...
"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

FAILURE_TIMEOUT_MS = 500  # the coordinator's default

# Per mode: the two series (key, fallback key, scale, marker, colour, label),
# the reference line (value, label), the y label, log scale, the title.
TIMES = (
    [("recover_ms", "recover_ms", 1e-3, "o", "C0", "readable"),
     ("writable_ms", "recover_ms", 1e-3, "x", "C3", "writable")],
    (2.0, "target: 2 s per GB (with detection)"),
    "seconds from detection, 1 GB", False,
    "insitu crash recovery, 3 servers, alternated runs",
)
PINGS = (
    [("backup_ping_ms_max", "backup_ping_ms_max", 1, "o", "C3", "backup port"),
     ("probe_ping_ms_max", "probe_ping_ms_max", 1, "x", "C0", "shard")],
    (FAILURE_TIMEOUT_MS, "failure timeout (500 ms)"),
    "longest ping wait during the recovery (ms)", True,
    "pings to the survivors during a 1 GB recovery, alternated runs",
)


def main():
    args = sys.argv[1:]
    series, (ref, ref_label), ylabel, log, title = TIMES
    if args and args[0] == "--pings":
        series, (ref, ref_label), ylabel, log, title = PINGS
        args = args[1:]
    out = args[0]
    builds = []
    for arg in args[1:]:
        label, paths = arg.split("=", 1)
        builds.append((label, [json.load(open(p)) for p in paths.split(",")]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, runs) in enumerate(builds):
        xs = [i + (j - (len(runs) - 1) / 2) * 0.08 for j in range(len(runs))]
        for key, fallback, scale, marker, colour, name in series:
            ys = [r.get(key, r[fallback]) * scale for r in runs]
            ax.scatter(xs, ys, marker=marker, color=colour, label=name if i == 0 else None)
    ax.axhline(ref, color="gray", lw=0.8, label=ref_label)
    if log:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xticks(range(len(builds)), [label for label, _ in builds])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
