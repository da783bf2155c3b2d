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
        async with c.transaction() as tx:          # committed when the block ends
            n = await tx.get(t, "counter")
            tx.put(t, "counter", b"...")
        await c.run_transaction(body)              # async body(tx), retried on Conflict
        await c.read_only(audit)                   # async audit(snapshot), retried when too old

Errors are the same exceptions as the blocking client's.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import (Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Optional,
                    TypeVar, Union)

import numpy as np
import numpy.typing as npt

from . import _insitu

BytesLike = Union[bytes, str]
T = TypeVar("T")


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

    async def create_table(self, name: str, tablets: int = 4, *, schema: Any = None,
                           key: Union[str, list[str], None] = None) -> AsyncTable:
        return AsyncTable(await asyncio.to_thread(self.sync.create_table, name, tablets,
                                                  schema=schema, key=key))

    async def sql(self, query: str, *, snapshot: Optional[bool] = None) -> Any:
        """``insitu.Client.sql``, awaited: the result as a ``pyarrow.Table``."""
        return await asyncio.to_thread(self.sync.sql, query, snapshot=snapshot)

    async def tables(self) -> list[str]:
        return await asyncio.to_thread(self.sync.tables)

    async def drop_table(self, name: str) -> None:
        await asyncio.to_thread(self.sync.drop_table, name)

    async def ack_loss(self, name: str) -> int:
        return await asyncio.to_thread(self.sync.ack_loss, name)

    async def accept_loss(self, name: str) -> int:
        return await asyncio.to_thread(self.sync.accept_loss, name)

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

    def transaction(self) -> AsyncTransaction:
        """A new transaction (``insitu.Client.transaction``). ``async with
        c.transaction() as tx:`` commits when the block ends (raising
        ``Conflict`` if it conflicted: nothing is applied) and discards it
        when the block raises."""
        return AsyncTransaction(self.sync.transaction())

    async def run_transaction(self, body: Callable[[AsyncTransaction], Awaitable[T]]) -> T:
        """Await ``body(tx)`` in a new transaction and commit it; on
        ``Conflict`` (or ``Unavailable``: a tablet moving) run it again after
        a randomised back-off, until the client's timeout. Returns what
        ``body`` returned (as ``insitu.Client.run_transaction``)."""
        deadline = time.monotonic() + self.sync.timeout
        backoff = 0.0002
        while True:
            tx = self.transaction()
            try:
                value = await body(tx)
                if not tx.ended:
                    await tx.commit()
                return value
            except (_insitu.Conflict, _insitu.Unavailable):
                tx.discard()
                if time.monotonic() >= deadline:
                    raise
            except BaseException:
                tx.discard()
                raise
            # Randomised so that transactions that conflicted do not meet again.
            sleep = backoff * (0.5 + random.random())
            await asyncio.sleep(min(sleep, max(0.0, deadline - time.monotonic())))
            backoff = min(backoff * 2, 0.05)

    async def snapshot(self, ts: Optional[int] = None) -> AsyncSnapshot:
        """A snapshot at a fresh timestamp, or at ``ts`` (``insitu.Client.snapshot``)."""
        return AsyncSnapshot(await asyncio.to_thread(self.sync.snapshot, ts))

    async def read_only(self, body: Callable[[AsyncSnapshot], Awaitable[T]]) -> T:
        """Await ``body(snapshot)`` on a fresh snapshot (a read-only
        transaction: it never conflicts); when a server refuses the snapshot
        as too old, run ``body`` again on a new one (up to
        ``insitu.MAX_SNAPSHOT_RETRIES`` more times). Returns what ``body``
        returned (as ``insitu.Client.read_only``)."""
        tries = 0
        while True:
            tries += 1
            try:
                return await body(await self.snapshot())
            except _insitu.Unavailable as e:
                if getattr(e, "status", None) != "SnapshotTooOld" or \
                        tries > _insitu.MAX_SNAPSHOT_RETRIES:
                    raise


def _sync_table(table: Union[AsyncTable, _insitu.Table]) -> _insitu.Table:
    return table.sync if isinstance(table, AsyncTable) else table


class _AsyncKeyReads:
    """The key reads a transaction and a snapshot share, awaited on
    ``self.sync`` (the blocking object doing the work)."""

    sync: Union[_insitu.Transaction, _insitu.Snapshot]

    async def get(self, table: Union[AsyncTable, _insitu.Table], key: BytesLike) -> Optional[bytes]:
        return await asyncio.to_thread(self.sync.get, _sync_table(table), key)

    async def get_many(self, table: Union[AsyncTable, _insitu.Table],
                       keys: Iterable[BytesLike]) -> list[Optional[bytes]]:
        return await asyncio.to_thread(self.sync.get_many, _sync_table(table), list(keys))


class AsyncTransaction(_AsyncKeyReads):
    """``insitu.Transaction`` with its reads and its commit awaitable. ``put``,
    ``insert`` and ``delete`` only record the write (nothing is sent before the commit),
    so they are plain calls. One operation at a time: await each read
    before the next call."""

    def __init__(self, tx: _insitu.Transaction):
        #: The blocking transaction doing the work.
        self.sync = tx
        #: Committed or discarded: nothing more can be done with it.
        self.ended = False

    def put(self, table: Union[AsyncTable, _insitu.Table], key: BytesLike,
            value: BytesLike, *, ttl: Optional[float] = None,
            expires_at: Optional[float] = None) -> None:
        self.sync.put(_sync_table(table), key, value, ttl=ttl, expires_at=expires_at)

    def insert(self, table: Union[AsyncTable, _insitu.Table], row: dict[str, Any]) -> None:
        """``insitu.Transaction.insert``: a typed row, written at the commit."""
        self.sync.insert(_sync_table(table), row)

    def delete(self, table: Union[AsyncTable, _insitu.Table], key: BytesLike) -> None:
        self.sync.delete(_sync_table(table), key)

    async def commit(self) -> None:
        """Apply every write at one instant, or raise ``Conflict``."""
        self.ended = True
        await asyncio.to_thread(self.sync.commit)

    def discard(self) -> None:
        """Drop the writes; nothing was applied."""
        if not self.ended:
            self.ended = True
            self.sync.discard()

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, exc_type: object, exc: object = None, tb: object = None) -> bool:
        if exc_type is None:
            if not self.ended:
                await self.commit()
        else:
            self.discard()
        return False


class AsyncSnapshot(_AsyncKeyReads):
    """``insitu.Snapshot`` with every read awaitable: the whole store as of one instant."""

    def __init__(self, snapshot: _insitu.Snapshot):
        #: The blocking snapshot doing the work.
        self.sync = snapshot

    @property
    def ts(self) -> int:
        return self.sync.ts

    async def sql(self, query: str) -> Any:
        """``insitu.Snapshot.sql``, awaited: the result as a ``pyarrow.Table``."""
        return await asyncio.to_thread(self.sync.sql, query)

    async def count(self, table: Union[AsyncTable, _insitu.Table], where: Optional[str] = None,
                    **key_range: BytesLike) -> int:
        return await asyncio.to_thread(self.sync.count, _sync_table(table), where, **key_range)

    async def aggregate(self, table: Union[AsyncTable, _insitu.Table], op: str, field_spec: str,
                        where: Optional[str] = None,
                        **key_range: BytesLike) -> Union[int, float, None]:
        return await asyncio.to_thread(self.sync.aggregate, _sync_table(table), op, field_spec,
                                       where, **key_range)


class AsyncTable:
    """``insitu.Table`` with every call awaitable."""

    def __init__(self, table: _insitu.Table):
        #: The blocking table doing the work.
        self.sync = table

    @property
    def name(self) -> str:
        return self.sync.name

    async def put(self, key: BytesLike, value: BytesLike, *, ttl: Optional[float] = None,
                  expires_at: Optional[float] = None) -> int:
        return await asyncio.to_thread(self.sync.put, key, value, ttl=ttl, expires_at=expires_at)

    async def expires_at(self, key: BytesLike) -> Optional[float]:
        return await asyncio.to_thread(self.sync.expires_at, key)

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

    async def delete_where(self, where: Optional[str] = None, **kwargs: object) -> int:
        return await asyncio.to_thread(self.sync.delete_where, where, **kwargs)

    async def schema(self) -> Any:
        """``insitu.Table.schema``, awaited (a ``pyarrow.Schema``, or None
        for an untyped table)."""
        return await asyncio.to_thread(lambda: self.sync.schema)

    async def insert_arrow(self, data: Any, *, batch_rows: int = 10_000) -> int:
        """``insitu.Table.insert_arrow``, awaited."""
        return await asyncio.to_thread(self.sync.insert_arrow, data, batch_rows=batch_rows)
