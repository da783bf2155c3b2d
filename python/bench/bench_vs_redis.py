#!/usr/bin/env python3
"""From Python, one core: insitu's client against redis-py on Redis.

Measures, for each store in turn (same machine, same run; the store's
process pinned to one core and this Python process to another when the
machine has two or more):
  - single `put` / `set` and `get` ops/s (one call at a time);
  - `get_many(100)` / `mget` of 100 keys, in keys/s;
and, for insitu only, `aggregate("sum")` over N objects on the servers
against fetching the same objects into NumPy (`scan`) and summing there.

Needs the `insitu` package (pip install ./python), `redis` (pip install
redis) and a `redis-server` binary; the insitu binary is
target/release/insitu (or --insitu-bin / $INSITU_BIN). Without Redis the
insitu half still runs and the Redis half says SKIPPED.

    python3 python/bench/bench_vs_redis.py --ops 20000 --agg-objects 1000000

(`--replicas 0` runs insitu in memory only, like the Redis it starts,
which runs without persistence.)
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import insitu

REPO = Path(__file__).resolve().parents[2]
VALUE = b"v" * 100  # the value size of every point op


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cmd: list[str], core: int | None) -> list[str]:
    """cmd pinned to `core` with taskset, when there is one to pin to."""
    if core is None or shutil.which("taskset") is None:
        return cmd
    return ["taskset", "-c", str(core)] + cmd


def start_insitu(binary: str, core: int | None, workdir: str, replicas: int | None):
    """`insitu up` on a free port: its process, its address and the client
    token it wrote (authentication is on by default)."""
    port = free_port()
    data = os.path.join(workdir, "insitu")
    proc = subprocess.Popen(
        pinned([binary, "up", "--servers", "1", "--shards", "1", "--port", str(port),
                "--dir", data, "--memory-mb", "2048"]
               + ([] if replicas is None else ["--replicas", str(replicas)]), core),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    up = threading.Event()

    def reader():
        for line in proc.stdout:
            if "insitu is up" in line:
                up.set()

    threading.Thread(target=reader, daemon=True).start()
    if not up.wait(60):
        proc.kill()
        sys.exit("insitu up did not come up within 60 s")
    with open(os.path.join(data, "auth-token")) as f:
        token = f.read().strip()
    return proc, f"127.0.0.1:{port}", token


def start_redis(core: int | None, workdir: str):
    port = free_port()
    proc = subprocess.Popen(
        pinned(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", workdir], core),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_insitu(addr: str, token: str, ops: int, many: int) -> dict:
    c = insitu.connect(addr, auth_token=token)
    t = c.create_table("bench", tablets=1)
    keys = [b"key:%08d" % i for i in range(ops)]
    for k in keys[:1000]:  # warm-up: connections, tablet map
        t.put(k, VALUE)
    put_s = timed(lambda: [t.put(k, VALUE) for k in keys])
    get_s = timed(lambda: [t.get(k) for k in keys])
    batches = [keys[(i * 100) % (ops - 100):][:100] for i in range(many)]
    many_s = timed(lambda: [t.get_many(b) for b in batches])
    assert t.get(keys[-1]) == VALUE
    return {"put_ops_s": rate(ops, put_s), "get_ops_s": rate(ops, get_s),
            "get_many_100_keys_s": rate(100 * many, many_s)}


def bench_redis(port: int, ops: int, many: int) -> dict:
    import redis  # imported here: the insitu half runs without it

    r = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(100):  # wait for the server (bounded)
        try:
            r.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    keys = [b"key:%08d" % i for i in range(ops)]
    for k in keys[:1000]:
        r.set(k, VALUE)
    put_s = timed(lambda: [r.set(k, VALUE) for k in keys])
    get_s = timed(lambda: [r.get(k) for k in keys])
    batches = [keys[(i * 100) % (ops - 100):][:100] for i in range(many)]
    many_s = timed(lambda: [r.mget(b) for b in batches])
    assert r.get(keys[-1]) == VALUE
    return {"put_ops_s": rate(ops, put_s), "get_ops_s": rate(ops, get_s),
            "get_many_100_keys_s": rate(100 * many, many_s)}


def bench_aggregate(addr: str, token: str, n: int) -> dict:
    c = insitu.connect(addr, timeout=120.0, auth_token=token)
    t = c.create_table("agg", tablets=4)
    values = np.arange(n, dtype="<i8")
    chunk = 50_000
    for lo in range(0, n, chunk):
        t.put_many((b"a:%09d" % i, values[i].tobytes()) for i in range(lo, min(n, lo + chunk)))
    expected = int(values.sum())
    start = time.perf_counter()
    server_sum = t.aggregate("sum", "i64@0")
    server_s = time.perf_counter() - start
    start = time.perf_counter()
    fetched = np.frombuffer(b"".join(v for _, v in t.scan()), dtype="<i8")
    numpy_sum = int(fetched.sum())
    fetch_s = time.perf_counter() - start
    assert server_sum == expected == numpy_sum, (server_sum, expected, numpy_sum)
    return {"objects": n, "aggregate_ms": server_s * 1e3, "fetch_and_numpy_sum_ms": fetch_s * 1e3,
            "speedup": fetch_s / server_s if server_s > 0 else float("inf")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=20_000, help="single puts, then gets (>= 1100)")
    p.add_argument("--many", type=int, default=2_000, help="get_many(100) / mget calls")
    p.add_argument("--agg-objects", type=int, default=1_000_000, help="objects aggregated")
    p.add_argument("--insitu-bin", default=os.environ.get("INSITU_BIN",
                                                          str(REPO / "target/release/insitu")))
    p.add_argument("--replicas", type=int, default=None,
                   help="insitu up --replicas (default: its own, a durable copy on its disk; "
                        "0: in memory only, like the Redis here, which runs without "
                        "persistence)")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args()
    if a.ops < 1100:
        p.error("--ops must be at least 1100")

    cores = sorted(os.sched_getaffinity(0))
    store_core = cores[-1] if len(cores) > 1 else None
    if len(cores) > 1:
        os.sched_setaffinity(0, {cores[0]})  # this client on one core, the store on another

    results: dict = {"ops": a.ops, "many": a.many, "insitu_replicas": a.replicas}
    with tempfile.TemporaryDirectory(prefix="insitu-pybench-") as work:
        proc, addr, token = start_insitu(a.insitu_bin, store_core, work, a.replicas)
        try:
            results["insitu"] = bench_insitu(addr, token, a.ops, a.many)
            results["aggregate"] = bench_aggregate(addr, token, a.agg_objects)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        if shutil.which("redis-server") is None:
            print("Redis half SKIPPED: no redis-server")
        else:
            try:
                import redis  # noqa: F401
            except ImportError:
                print("Redis half SKIPPED: pip install redis")
            else:
                rproc, port = start_redis(store_core, work)
                try:
                    results["redis"] = bench_redis(port, a.ops, a.many)
                finally:
                    rproc.terminate()
                    rproc.wait(30)

    print(f"{'':24}{'insitu':>14}{'redis-py':>14}{'ratio':>8}")
    for metric in ("put_ops_s", "get_ops_s", "get_many_100_keys_s"):
        mine = results["insitu"][metric]
        theirs = results.get("redis", {}).get(metric)
        ratio = f"{mine / theirs:8.2f}" if theirs else f"{'-':>8}"
        theirs_s = f"{theirs:14,.0f}" if theirs else f"{'-':>14}"
        print(f"{metric:24}{mine:14,.0f}{theirs_s}{ratio}")
    ag = results["aggregate"]
    print(f"aggregate sum over {ag['objects']:,} objects: {ag['aggregate_ms']:.1f} ms on the servers, "
          f"{ag['fetch_and_numpy_sum_ms']:.1f} ms fetched into NumPy (x{ag['speedup']:.1f})")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
