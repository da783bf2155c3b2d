"""insitu: a distributed in-memory key-value store that computes where the data lives.

Connect to a cluster started with ``insitu up``::

    import insitu
    c = insitu.connect("127.0.0.1:7070")
    t = c.create_table("users", tablets=8)
    t.put("alice", b"...")
    t.get("alice")

Keys and values are ``bytes`` (``str`` is accepted and encoded as UTF-8).
Every call blocks with the GIL released; a ``Client`` may be shared by threads.
Typed tables (``create_table(name, schema=..., key=...)``) take Arrow data
(``t.insert_arrow(pyarrow_table)``) and answer SQL as a ``pyarrow.Table``
(``c.sql("SELECT ...")``); those calls need pyarrow.
Errors are subclasses of :class:`insitu.Error`. ``insitu.aio`` has the same
calls for asyncio (``await aio.connect(...)``), transactions and snapshots
included.
"""

from ._insitu import (
    AuthenticationError,
    BadRequest,
    Client,
    Conflict,
    ConnectionError,
    DataLost,
    Error,
    NotFound,
    OutOfMemory,
    Scan,
    Snapshot,
    SqlError,
    Table,
    TableExists,
    Timeout,
    TooLarge,
    TrainedModel,
    Transaction,
    Unavailable,
    UnknownTable,
    MAX_SNAPSHOT_RETRIES,
    __version__,
    connect,
)

# The server status name (e.g. "UnknownTable") of an error the client raised;
# None on errors that came from no server reply (and on ones raised by hand).
Error.status = None

__all__ = [
    "AuthenticationError",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionError",
    "DataLost",
    "Error",
    "MAX_SNAPSHOT_RETRIES",
    "NotFound",
    "OutOfMemory",
    "Scan",
    "Snapshot",
    "SqlError",
    "Table",
    "TableExists",
    "Timeout",
    "TooLarge",
    "TrainedModel",
    "Transaction",
    "Unavailable",
    "UnknownTable",
    "__version__",
    "connect",
]
