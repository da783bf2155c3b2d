#!/usr/bin/env python3
"""Plot `insitu bench txn --json` output: committed transactions per second
and p99 latency against client connections, insitu and PostgreSQL, for the
uniform and the hot-spot checkout.

usage: plot_txn.py out.png txn.json
"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    out, report = sys.argv[1], json.load(open(sys.argv[2]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for workload, style in (("checkout", "-"), ("hot", "--")):
        runs = [r for r in report["runs"] if r["workload"] == workload]
        clients = [r["clients"] for r in runs]
        label = f"{workload} ({runs[0]['items']} items)" if runs else workload
        for system, marker in (("insitu", "o"), ("postgres", "s")):
            if any(r[system] is None for r in runs):
                continue
            tps = [r[system]["txn_per_s"] for r in runs]
            p99 = [r[system]["p99_ms"] for r in runs]
            axes[0].plot(clients, tps, marker + style, label=f"{system}, {label}")
            axes[1].plot(clients, p99, marker + style, label=f"{system}, {label}")
    axes[0].set_ylabel("committed transactions / s")
    axes[1].set_ylabel("p99 latency, ms (retries included)")
    for ax in axes:
        ax.set_xlabel("client connections")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"checkout: read 10 items, decrement, write an order; {report['insitu_servers']} insitu servers, "
        f"PostgreSQL REPEATABLE READ; {report['machine_cpus']}-core machine"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
