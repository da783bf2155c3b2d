#!/usr/bin/env python3
"""Plot `insitu bench tpch --json` output: per query, time read out to the
client vs pushed down (against the number of servers, as in the seed's
SkyhookDM figures), and DuckDB on the same rows.

usage: plot_tpch.py out.png tpch.json
"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    out, report = sys.argv[1], json.load(open(sys.argv[2]))
    names = ["qb", "qd", "qf", "q1", "q6"]
    runs = report["runs"]
    fig, axes = plt.subplots(1, len(names), figsize=(14, 3.8), sharey=False)
    for ax, name in zip(axes, names):
        servers = [r["servers"] for r in runs]
        client = [r["queries"][name]["client_ms"] for r in runs]
        push = [r["queries"][name]["pushdown_ms"] for r in runs]
        ax.plot(servers, client, "o-", label="read out, query on client")
        ax.plot(servers, push, "s-", label="pushed down (insitu sql)")
        duck = report["queries"][name].get("duckdb_ms")
        if duck is not None:
            ax.axhline(duck, color="gray", ls="--", lw=1, label="DuckDB, same rows")
        ax.set_title(f"{name} ({report['queries'][name]['rows']} rows)")
        ax.set_xlabel("servers")
        ax.set_xticks(servers)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("ms (best of runs, log scale)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"TPC-H lineitem, SF {report['sf']}, {report['cores']}-core machine")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
