"""The asyncio interface (insitu.aio) against a real cluster."""

import asyncio
import struct

import pytest

import insitu
from insitu import aio


def test_aio_calls(cluster):
    async def main():
        c = await aio.connect(cluster.addr, auth_token=cluster.token)
        t = await c.create_table("py_aio", tablets=2)
        try:
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
            assert "py_aio" in await c.tables()
            assert (await c.table("py_aio")).name == "py_aio"
            w = await c.train_logreg(t, dims=1)
            assert w.shape == (1,)
            with pytest.raises(insitu.UnknownTable):
                await c.table("no_such_table")
        finally:
            await c.drop_table("py_aio")

    asyncio.run(main())
