"""Snapshots from Python against a real cluster: reads, counts and
aggregates as of one instant while transactions change the data, the same
instant read again by its timestamp, `read_only` retrying a refused
snapshot (and giving up after its limit), and a bank whose every read-only
audit sums to the total under concurrent transfers."""

import struct
import threading

import pytest

import insitu
from conftest import assert_runner_passes_through


def i64(n: int) -> bytes:
    return struct.pack("<q", n)


def as_i64(v) -> int:
    return 0 if v is None else struct.unpack("<q", v)[0]


def started(client, table):
    """A snapshot every server of `table` accepts: a server refuses the
    first snapshot read after a quiet time (only then does it start keeping
    old versions), so count the whole table (every tablet) at one through
    `read_only`, which retries on a fresh one."""

    def body(snap):
        snap.count(table)
        return snap

    return client.read_only(body)


def test_a_snapshot_reads_as_of_its_timestamp(client, table):
    with client.transaction() as tx:
        tx.put(table, "a", i64(100))
        tx.put(table, "b", i64(0))
        tx.put(table, "c", i64(7))
    snap = started(client, table)
    assert snap.ts > 0
    assert repr(snap) == f"insitu.Snapshot(ts={snap.ts})"

    # After the snapshot: a transfer, a removal, a creation.
    with client.transaction() as tx:
        tx.put(table, "a", i64(70))
        tx.put(table, "b", i64(30))
        tx.delete(table, "c")
        tx.put(table, "d", i64(5))

    assert as_i64(snap.get(table, "a")) == 100
    assert snap.get_many(table, ["a", "b", "c", "d"]) == [i64(100), i64(0), i64(7), None]
    assert snap.count(table) == 3
    assert snap.aggregate(table, "sum", "i64@0") == 107
    assert snap.count(table, "i64@0 > 50") == 1

    # The same instant again, by its timestamp.
    again = client.snapshot(snap.ts)
    assert again.ts == snap.ts
    assert again.get_many(table, ["a", "c", "d"]) == [i64(100), i64(7), None]

    # A timestamp the cluster has not handed out yet is refused: a
    # transaction could still commit below it.
    with pytest.raises(insitu.BadRequest, match="in the future"):
        client.snapshot(snap.ts + 3_600_000_000_000)

    # The table now, and a fresh snapshot, see the transaction.
    assert table.count() == 3 and table.get("c") is None
    now = client.read_only(lambda s: (s.get_many(table, ["a", "b", "c", "d"]), s.ts))
    assert now[0] == [i64(70), i64(30), None, i64(5)]
    assert now[1] > snap.ts


def test_read_only_retries_a_refused_snapshot_then_gives_up(client, table):
    table.put("k", "v")
    started(client, table)
    calls = []

    def always_too_old(snap):
        calls.append(snap.ts)
        # A timestamp older than the cluster's first snapshot: always refused.
        return client.snapshot(1).get(table, "k")

    with pytest.raises(insitu.Unavailable) as e:
        client.read_only(always_too_old)
    assert e.value.status == "SnapshotTooOld"
    assert len(calls) == 11, "the first try and 10 retries"
    assert calls == sorted(calls) and len(set(calls)) == 11, "each try on a fresh snapshot"


def test_read_only_passes_other_errors_and_values_through(client, table):
    assert_runner_passes_through(client.read_only, table, lambda s: s.get(table, 5))
    with pytest.raises(ValueError):
        client.snapshot(0)
    with pytest.raises(ValueError):
        client.read_only(lambda s: s.aggregate(table, "median", "i64@0"))


def test_every_read_only_audit_sums_to_the_total_under_transfers(client, table):
    accounts = [f"acct{i}" for i in range(20)]
    with client.transaction() as tx:
        for a in accounts:
            tx.put(table, a, i64(100))
    total = 100 * len(accounts)
    stop = threading.Event()
    transfers = [0]

    def transfer(tx, src, dst):
        s, d = as_i64(tx.get(table, src)), as_i64(tx.get(table, dst))
        tx.put(table, src, i64(s - 1))
        tx.put(table, dst, i64(d + 1))

    def transferrer(seed):
        i = seed
        while not stop.is_set():
            src, dst = accounts[i % 20], accounts[(i * 7 + 3) % 20]
            if src != dst:
                client.run_transaction(lambda tx: transfer(tx, src, dst))
                transfers[0] += 1
            i += 1

    threads = [threading.Thread(target=transferrer, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    sums = []
    try:
        while len(sums) < 30 or transfers[0] < 30:
            values = client.read_only(lambda s: s.get_many(table, accounts))
            sums.append(sum(as_i64(v) for v in values))
            assert len(sums) < 10_000, "the transfers never got going"
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert all(s == total for s in sums), f"audits off the total {total}: {set(sums)}"
    assert table.aggregate("sum", "i64@0") == total
