"""The asyncio interface (insitu.aio) against a real cluster."""

import asyncio
import struct

import pytest

import insitu
from insitu import aio


def run_on_table(cluster, name, body, **create):
    """Run `await body(client, table)` on a fresh event loop, with an aio
    client of `cluster` and a new table `name` (`create`: `create_table`'s
    keyword arguments), dropped afterwards whatever `body` does."""

    async def main():
        c = await aio.connect(cluster.addr, auth_token=cluster.token)
        t = await c.create_table(name, **create)
        try:
            await body(c, t)
        finally:
            await c.drop_table(name)

    asyncio.run(main())


def test_aio_calls(cluster):
    async def body(c, t):
        await asyncio.gather(*(t.put(f"k{i}", struct.pack("<q", i)) for i in range(100)))
        assert await t.get("k7") == struct.pack("<q", 7)
        assert await t.get("nope") is None
        assert await t.delete("k99") is True
        m = struct.pack("<q", -1)
        assert await t.put_many((f"m{i}", m) for i in range(10)) == 10
        assert await t.get_many(["k1", "m1", "nope"]) == [struct.pack("<q", 1), m, None]
        seen = {k async for k, _ in t.scan()}
        assert len(seen) == 99 + 10
        assert await t.count("i64@0 >= 50") == 49
        assert await t.aggregate("sum", "i64@0", from_key="k", to_key="l") == sum(range(99))
        assert await t.update("i64@0", add=1, where="i64@0 between 0 and 9") == 10
        assert await t.delete_where("i64@0 < 0") == 10  # the m* objects
        assert await t.count() == 99
        assert "py_aio" in await c.tables()
        assert (await c.table("py_aio")).name == "py_aio"
        w = await c.train_logreg(t, dims=1)
        assert w.shape == (1,)
        with pytest.raises(insitu.UnknownTable):
            await c.table("no_such_table")

    run_on_table(cluster, "py_aio", body, tablets=2)


def i64(n: int) -> bytes:
    return struct.pack("<q", n)


def as_i64(v) -> int:
    return 0 if v is None else struct.unpack("<q", v)[0]


def test_aio_transactions_commit_discard_and_retry(cluster):
    async def body(c, t):
        async with c.transaction() as tx:
            assert await tx.get(t, "a") is None
            tx.put(t, "a", i64(10))
            tx.put(t, "b", i64(0))
        assert await t.get_many(["a", "b"]) == [i64(10), i64(0)]

        # A block that raises applies nothing.
        with pytest.raises(RuntimeError, match="changed my mind"):
            async with c.transaction() as tx:
                tx.put(t, "a", i64(-1))
                tx.delete(t, "b")
                raise RuntimeError("changed my mind")
        assert await t.get_many(["a", "b"]) == [i64(10), i64(0)]

        # Two transactions that read and write the same key: the second
        # to commit conflicts and applies nothing.
        first, second = c.transaction(), c.transaction()
        for tx in (first, second):
            tx.put(t, "a", i64(as_i64(await tx.get(t, "a")) + 1))
        await first.commit()
        with pytest.raises(insitu.Conflict):
            await second.commit()
        assert as_i64(await t.get("a")) == 11

        # Concurrent increments of one key, each retried on conflict
        # until it commits: none is lost.
        async def increment(tx):
            n = as_i64(await tx.get(t, "counter"))
            tx.put(t, "counter", i64(n + 1))
            return n

        seen = await asyncio.gather(*(c.run_transaction(increment) for _ in range(20)))
        assert as_i64(await t.get("counter")) == 20
        assert sorted(seen) == list(range(20)), "each saw the one before it"

        # A body that fails otherwise is not retried, and applies nothing.
        async def broken(tx):
            tx.put(t, "counter", i64(0))
            raise KeyError("boom")

        with pytest.raises(KeyError):
            await c.run_transaction(broken)
        assert as_i64(await t.get("counter")) == 20

    run_on_table(cluster, "py_aio_txn", body, tablets=4)


def test_aio_snapshots_and_read_only(cluster):
    async def body(c, t):
        await t.put_many({"a": i64(1), "b": i64(2)})

        async def everything(snap):
            return snap.ts, await snap.count(t), await snap.get_many(t, ["a", "b"])

        # read_only retries until the servers keep versions for it.
        ts, n, values = await c.read_only(everything)
        assert (n, values) == (2, [i64(1), i64(2)])
        async with c.transaction() as tx:
            tx.put(t, "a", i64(100))
            tx.delete(t, "b")
        then = await c.snapshot(ts)
        assert then.ts == ts
        assert await then.get(t, "a") == i64(1)
        assert await then.get_many(t, ["a", "b"]) == [i64(1), i64(2)]
        assert await then.aggregate(t, "sum", "i64@0") == 3
        assert await then.count(t, "i64@0 > 1") == 1
        now = await c.read_only(lambda s: s.get_many(t, ["a", "b"]))
        assert now == [i64(100), None]
        with pytest.raises(insitu.BadRequest, match="in the future"):
            await c.snapshot(ts + 3_600_000_000_000)

        # A refusal as too old runs the body again on a fresh snapshot,
        # at most MAX_SNAPSHOT_RETRIES more times; other errors pass.
        tries = []

        async def always_too_old(snap):
            tries.append(snap.ts)
            return await (await c.snapshot(1)).get(t, "a")

        with pytest.raises(insitu.Unavailable) as e:
            await c.read_only(always_too_old)
        assert e.value.status == "SnapshotTooOld"
        assert len(tries) == insitu.MAX_SNAPSHOT_RETRIES + 1
        assert len(set(tries)) == len(tries), "each try on a fresh snapshot"

    run_on_table(cluster, "py_aio_snap", body, tablets=4)


def test_aio_transaction_inserts_typed_rows(cluster):
    async def body(c, t):
        async with c.transaction() as tx:
            tx.insert(t, {"id": 1, "name": "ann"})
            tx.insert(t, {"id": 2, "name": "bo"})
        got = await c.sql("SELECT id, name FROM py_aio_rows ORDER BY id")
        assert got.to_pylist() == [{"id": 1, "name": "ann"}, {"id": 2, "name": "bo"}]
        tx = c.transaction()
        with pytest.raises(insitu.BadRequest, match="nick"):
            tx.insert(t, {"id": 3, "name": "cy", "nick": "c"})
        tx.discard()

    run_on_table(cluster, "py_aio_rows", body, tablets=2, schema="id int64, name utf8", key="id")
