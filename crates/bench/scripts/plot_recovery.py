#!/usr/bin/env python3
"""Plot `insitu bench recovery --json` outputs: detection and recovery time
against the data size of the killed server.

usage: plot_recovery.py out.png recovery-256.json recovery-512.json ...
"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    out = sys.argv[1]
    runs = sorted((json.load(open(p)) for p in sys.argv[2:]), key=lambda r: r["mb"])
    mb = [r["mb"] for r in runs]
    detect = [r["detect_ms"] / 1e3 for r in runs]
    recover = [r["recover_ms"] / 1e3 for r in runs]
    total = [d + r for d, r in zip(detect, recover)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(mb, total, "o-", label="kill -> every tablet served again")
    ax.plot(mb, recover, "s--", label="declared dead -> served again (fetch, replay, re-replicate)")
    ax.plot(mb, detect, "^:", label="kill -> declared dead (detection)")
    # The target: 1 GB in 2 s, i.e. 2 s per 1024 MB, as a line.
    ax.plot([0, max(mb)], [0, 2.0 * max(mb) / 1024], color="gray", lw=0.8, label="target: 2 s per GB")
    servers = runs[0]["servers"]
    ax.set_xlabel("MB on the killed server")
    ax.set_ylabel("seconds")
    ax.set_title(f"insitu crash recovery, {servers} servers (1 shard each), this 2-core machine")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
