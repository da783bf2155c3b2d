"""asyncio interface: the calls of ``insitu.Client`` and ``insitu.Table``, awaited.

Each call runs the blocking client in a worker thread (``asyncio.to_thread``);
the calls release the GIL, so concurrent awaits overlap on the network::

    import asyncio
    from insitu import aio

    async def main():
        c = await aio.connect("127.0.0.1:7070")
        t = await c.create_table("users")
        await asyncio.gather(*(t.put(f"k{i}", b"v") for i in range(100)))
        async for key, value in t.scan():
            ...

Errors are the same exceptions as the blocking client's.
"""

from __future__ import annotations

import asyncio
import os
from typing import AsyncIterator, Iterable, Mapping, Optional, Union

import numpy as np
import numpy.typing as npt

from . import _insitu

BytesLike = Union[bytes, str]


async def connect(
    addr: str = "127.0.0.1:7070",
    timeout: float = 10.0,
    auth_token: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
) -> AsyncClient:
    """``insitu.connect``, awaited."""
    return AsyncClient(
        await asyncio.to_thread(_insitu.connect, addr, timeout, auth_token, tls_ca)
    )


class AsyncClient:
    """``insitu.Client`` with every call awaitable."""

    def __init__(self, client: _insitu.Client):
        #: The blocking client doing the work.
        self.sync = client

    async def create_table(self, name: str, tablets: int = 4) -> AsyncTable:
        return AsyncTable(await asyncio.to_thread(self.sync.create_table, name, tablets))

    async def tables(self) -> list[str]:
        return await asyncio.to_thread(self.sync.tables)

    async def drop_table(self, name: str) -> None:
        await asyncio.to_thread(self.sync.drop_table, name)

    async def table(self, name: str) -> AsyncTable:
        return AsyncTable(await asyncio.to_thread(self.sync.table, name))

    async def train_logreg(self, table: Union[str, AsyncTable], dims: int, iterations: int = 10,
                           rate: float = 0.5, **layout: int) -> npt.NDArray[np.float32]:
        target = table.sync if isinstance(table, AsyncTable) else table
        return await asyncio.to_thread(self.sync.train_logreg, target, dims, iterations, rate,
                                       **layout)

    async def train_logreg_model(self, table: Union[str, AsyncTable], dims: int,
                                 iterations: int = 10, rate: float = 0.5,
                                 **layout: int) -> _insitu.TrainedModel:
        target = table.sync if isinstance(table, AsyncTable) else table
        return await asyncio.to_thread(self.sync.train_logreg_model, target, dims, iterations,
                                       rate, **layout)


class AsyncTable:
    """``insitu.Table`` with every call awaitable."""

    def __init__(self, table: _insitu.Table):
        #: The blocking table doing the work.
        self.sync = table

    @property
    def name(self) -> str:
        return self.sync.name

    async def put(self, key: BytesLike, value: BytesLike) -> int:
        return await asyncio.to_thread(self.sync.put, key, value)

    async def get(self, key: BytesLike) -> Optional[bytes]:
        return await asyncio.to_thread(self.sync.get, key)

    async def delete(self, key: BytesLike) -> bool:
        return await asyncio.to_thread(self.sync.delete, key)

    async def get_many(self, keys: Iterable[BytesLike]) -> list[Optional[bytes]]:
        return await asyncio.to_thread(self.sync.get_many, list(keys))

    async def put_many(self, items: Union[Mapping[BytesLike, BytesLike],
                                          Iterable[tuple[BytesLike, BytesLike]]]) -> int:
        if not isinstance(items, Mapping):
            items = list(items)  # consumed here, not in the worker thread
        return await asyncio.to_thread(self.sync.put_many, items)

    async def scan(self) -> AsyncIterator[tuple[bytes, bytes]]:
        """Every object as (key, value), one batch fetched per await."""
        batches = await asyncio.to_thread(self.sync.scan, batched=True)
        while True:
            batch = await asyncio.to_thread(next, batches, None)
            if batch is None:
                return
            for item in batch:
                yield item

    async def count(self, where: Optional[str] = None, **key_range: BytesLike) -> int:
        return await asyncio.to_thread(self.sync.count, where, **key_range)

    async def aggregate(self, op: str, field_spec: str, where: Optional[str] = None,
                        **key_range: BytesLike) -> Union[int, float, None]:
        return await asyncio.to_thread(self.sync.aggregate, op, field_spec, where, **key_range)

    async def update(self, field_spec: str, **kwargs: object) -> int:
        return await asyncio.to_thread(self.sync.update, field_spec, **kwargs)
