"""Type stubs of the native module ``insitu._insitu`` (re-exported by ``insitu``)."""

import os
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, TypeVar, Union

import numpy as np
import numpy.typing as npt

__version__: str
#: How many more times ``read_only`` runs its body on a refused snapshot.
MAX_SNAPSHOT_RETRIES: int

#: A key or a value: bytes as is, str encoded as UTF-8.
BytesLike = Union[bytes, str]

T = TypeVar("T")

def connect(
    addr: str = "127.0.0.1:7070",
    timeout: float = 10.0,
    auth_token: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
) -> Client:
    """Connect to the coordinator at ``addr`` ("host:port").

    ``auth_token`` is the cluster's client token (``insitu up`` writes it to
    ``insitu-data/auth-token``); by default the ``INSITU_AUTH_TOKEN``
    environment variable, else the file ``INSITU_AUTH_TOKEN_FILE`` names, or none. A wrong or missing token raises
    ``AuthenticationError``.

    ``tls_ca`` is a PEM file of the CA that signs the cluster's certificates
    (``insitu up --tls`` writes ``insitu-data/tls/ca.pem``): the connection
    uses TLS and verifies every server against it. By default the file
    ``INSITU_TLS_CA`` names, else plain TCP. A server whose certificate the
    CA did not sign raises ``ConnectionError``.

    Every operation then fails within ``timeout`` seconds, retries included
    (raising ``Timeout`` or ``ConnectionError``) instead of waiting longer.
    Raises ``ConnectionError`` if the coordinator cannot be reached, and
    ``ValueError`` for a timeout not in (0, 86400].
    """

class Client:
    """A connection to an insitu cluster (see ``connect``).

    Every call blocks until it completes, with the GIL released, so other
    Python threads run meanwhile; one client may be shared by threads.
    """

    @property
    def timeout(self) -> float:
        """Seconds every operation may take, retries included (``connect``'s
        ``timeout``)."""
    def create_table(self, name: str, tablets: int = 4, *, schema: Any = None,
                     key: Union[str, list[str], None] = None) -> Table:
        """Create a table split into ``tablets`` hash ranges spread over the servers.

        Untyped (values are bytes) unless ``schema`` is given: then a typed
        table (for ``insert_arrow`` and ``sql``). ``schema`` is the text
        ``insitu table create --schema`` takes (``"id int64, name utf8
        null"``; columns are NOT NULL unless marked ``null``) or a
        ``pyarrow.Schema``; ``key`` names the primary key's columns
        (``"id"``, ``"a,b"`` or a list).

        Raises ``TableExists`` if the name is taken, ``BadRequest`` for a bad
        name or tablet count, ``ValueError``/``TypeError`` for a bad schema.
        """
    def sql(self, query: str, *, snapshot: Optional[bool] = None) -> Any:
        """Run a SQL query over the cluster's typed tables; the result as a
        ``pyarrow.Table``. Filters, projections, limits and aggregates run
        on the servers where they can; joins and the rest in this process.
        Raises ``SqlError`` for SQL that does not parse or plan. Needs pyarrow.

        ``snapshot``: None (the default) reads every table at one fresh
        snapshot when the statement is a query and a typed table has several
        tablets, as ``count`` does; True always; False reads the rows as they
        are (an UPDATE or DELETE always does)."""
    def tables(self) -> list[str]:
        """The names of the tables."""
    def drop_table(self, name: str) -> None:
        """Drop a table and free its memory on every server (``UnknownTable`` if absent)."""
    def ack_loss(self, name: str) -> int:
        """Acknowledge that table ``name`` lost objects with a server that held
        them in memory only (R = 0): reads of its missing keys stop raising
        ``DataLost``. Returns how many tablets had been marked lost."""
    def accept_loss(self, name: str) -> int:
        """Give up what no backup holds of table ``name``'s tablets that wait
        for a recovery the servers refuse (their replicas were on disks that
        are gone for good). They recover from what the backups hold; reads of
        missing keys raise ``DataLost`` until ``ack_loss``. Returns how many
        tablets were given up now (0: none was waiting)."""
    def table(self, name: str) -> Table:
        """Open an existing table (``UnknownTable`` if there is none)."""
    def train_logreg(
        self,
        table: Union[str, Table],
        dims: int,
        iterations: int = 10,
        rate: float = 0.5,
        *,
        offset: int = 0,
        label_offset: Optional[int] = None,
    ) -> npt.NDArray[np.float32]:
        """Train a logistic regression by batch gradient descent, every gradient
        computed on the servers; returns the weights (float32, shape ``(dims,)``).

        Each object of ``table`` is one point: ``dims`` little-endian float32
        at byte ``offset``, then a label byte (0 or 1) at ``label_offset``
        (default: right after the vector). Each of ``iterations`` steps is
        ``w -= rate * grad / n``, ``b -= rate * bias_grad / n``, from zero.
        """
    def train_logreg_model(
        self,
        table: Union[str, Table],
        dims: int,
        iterations: int = 10,
        rate: float = 0.5,
        *,
        offset: int = 0,
        label_offset: Optional[int] = None,
    ) -> TrainedModel:
        """``train_logreg``, returning the weights, the bias and the loss history."""
    def transaction(self) -> Transaction:
        """A new transaction. ``with c.transaction() as tx:`` commits when the
        block ends (raising ``Conflict`` if it conflicted: nothing is applied)
        and discards it when the block raises."""
    def run_transaction(self, body: Callable[[Transaction], T]) -> T:
        """Call ``body(tx)`` in a new transaction and commit it; on a conflict
        run it again (randomised back-off) until the client's timeout.
        Returns what ``body`` returned."""
    def snapshot(self, ts: Optional[int] = None) -> Snapshot:
        """A snapshot: reads, counts and aggregates through it see the whole
        store as of one instant (``ts``: the timestamp of an earlier snapshot,
        to read that instant again; default a fresh one). A ``ts`` the
        cluster has not handed out yet raises ``BadRequest``. A server may
        refuse it as too old (``Unavailable``, status ``"SnapshotTooOld"``);
        ``read_only`` retries that."""
    def read_only(self, body: Callable[[Snapshot], T]) -> T:
        """Call ``body(snapshot)`` on a fresh snapshot (a read-only
        transaction: it never conflicts); when a server refuses the snapshot
        as too old, run ``body`` again on a new one (up to 10 times).
        Returns what ``body`` returned."""

class Snapshot:
    """A read-only view of the whole store at one instant.

    Every read sees each transaction committed before the snapshot whole and
    none committed after, whatever writes go on meanwhile; nothing is locked
    or validated, so it never raises ``Conflict``. Writes that are not
    transactions are seen as they are when each server answers."""

    @property
    def ts(self) -> int:
        """The timestamp the snapshot reads at."""
    def sql(self, query: str) -> Any:
        """``Client.sql`` as of the snapshot: every table the query names is
        read as it was at this instant (a ``pyarrow.Table``). Refused
        (``BadRequest``) when the answer is more than one tablet may hold in
        pages: aggregate, or select fewer rows or columns. Needs pyarrow."""
    def get(self, table: Table, key: BytesLike) -> Optional[bytes]:
        """The value of ``key`` as of the snapshot (None if absent then)."""
    def get_many(self, table: Table, keys: Iterable[BytesLike]) -> list[Optional[bytes]]:
        """The values of ``keys`` as of the snapshot (None where absent)."""
    def count(self, table: Table, where: Optional[str] = None, *,
              from_key: Optional[BytesLike] = None,
              to_key: Optional[BytesLike] = None) -> int:
        """How many objects match ``where`` as of the snapshot."""
    def aggregate(self, table: Table, op: str, field_spec: str,
                  where: Optional[str] = None, *,
                  from_key: Optional[BytesLike] = None,
                  to_key: Optional[BytesLike] = None) -> Union[int, float, None]:
        """``Table.aggregate`` as of the snapshot."""

class Transaction:
    """Several keys, on any servers, changed together or not at all.

    Reads return the stored value (or the transaction's own write) and their
    versions are checked at ``commit``; writes wait until ``commit``, which
    applies all of them at one instant or raises ``Conflict`` (nothing
    applied: run it again). Serializable."""

    def get(self, table: Table, key: BytesLike) -> Optional[bytes]:
        """The value of ``key`` as this transaction sees it (None if absent)."""
    def get_many(self, table: Table, keys: Iterable[BytesLike]) -> list[Optional[bytes]]:
        """The values of ``keys`` (None where absent), read at once."""
    def put(self, table: Table, key: BytesLike, value: BytesLike, *,
            ttl: Optional[float] = None, expires_at: Optional[float] = None) -> None:
        """Write ``value`` under ``key`` when the transaction commits (with a deadline:
        ``ttl`` seconds from the call, or ``expires_at`` Unix seconds)."""
    def insert(self, table: Table, row: dict[str, Any]) -> None:
        """Write ``row`` to typed table ``table`` when the transaction commits.

        ``row`` is a dict of column name -> value: ``int``, ``float``,
        ``decimal.Decimal``, ``str``, ``bool``, ``datetime.date`` or ``None``
        (NULL), converted as ``Table.insert_arrow`` converts them (a ``str``
        ``"YYYY-MM-DD"`` fits a date column, an ``int`` a decimal or float
        one). A nullable column left out is NULL. The row's key columns make
        its key, so it replaces a row with the same key. Needs no pyarrow.

        Raises ``BadRequest`` naming the column for a column the table lacks,
        a NOT NULL column left out, or a value that does not fit its column,
        and for an untyped table; ``TypeError`` for a value of a Python type
        no column holds. Nothing is queued then."""
    def delete(self, table: Table, key: BytesLike) -> None:
        """Remove ``key`` when the transaction commits."""
    def commit(self) -> None:
        """Apply every write at one instant, or raise ``Conflict``."""
    def discard(self) -> None:
        """Drop the writes; nothing was applied."""
    def __enter__(self) -> Transaction: ...
    def __exit__(self, exc_type: object, exc: object = None, tb: object = None) -> bool: ...

class TrainedModel:
    """A logistic-regression model trained on the servers."""

    @property
    def weights(self) -> npt.NDArray[np.float32]:
        """One weight per dimension."""
    @property
    def bias(self) -> float:
        """The bias (intercept)."""
    @property
    def losses(self) -> npt.NDArray[np.float64]:
        """The mean log-loss before each step."""

class Table:
    """One table of the cluster. Keys and values are bytes; str is encoded as UTF-8."""

    @property
    def name(self) -> str:
        """The table's name."""
    @property
    def id(self) -> int:
        """The table's id in the cluster."""
    @property
    def schema(self) -> Any:
        """A typed table's columns as a ``pyarrow.Schema`` (None: untyped). Needs pyarrow."""
    def insert_arrow(self, data: Any, *, batch_rows: int = 10_000) -> int:
        """Write Arrow data (a pyarrow Table, RecordBatch or RecordBatchReader,
        a pandas DataFrame, a dict of columns, or an iterable of RecordBatches)
        as rows of this typed table; returns the number of rows written.
        Columns are matched by name; a row replaces the row with its primary
        key. Sent ``batch_rows`` rows at a time: on an error, earlier steps
        stay written. Needs pyarrow."""
    def put(self, key: BytesLike, value: BytesLike, *, ttl: Optional[float] = None,
            expires_at: Optional[float] = None) -> int:
        """Store ``value`` under ``key`` (replacing any value); returns the new version.

        ``ttl`` (seconds from now) or ``expires_at`` (Unix seconds) give the object a
        deadline: from then on every read, count and query leaves it out, and the server
        removes it."""
    def expires_at(self, key: BytesLike) -> Optional[float]:
        """The deadline of ``key`` in Unix seconds; None if it has none or does not exist."""
    def get(self, key: BytesLike) -> Optional[bytes]:
        """The value of ``key``, or None if there is no such object."""
    def delete(self, key: BytesLike) -> bool:
        """Remove ``key``; returns whether it existed."""
    def get_many(self, keys: Iterable[BytesLike]) -> list[Optional[bytes]]:
        """The values of ``keys``, in order, None where absent (one round of
        parallel requests per server, not one per key)."""
    def put_many(
        self,
        items: Union[Mapping[BytesLike, BytesLike], Iterable[tuple[BytesLike, BytesLike]]],
    ) -> int:
        """Store many objects (a mapping or (key, value) pairs); returns how many
        were written. On an error, some objects may have been written."""
    def scan(self, *, batched: bool = False) -> Scan:
        """Iterate over every object as ``(key, value)``, fetched in batches of
        about 1 MiB; with ``batched=True``, yield each batch as a list.
        Objects written or removed during the walk may or may not be seen."""
    def count(
        self,
        where: Optional[str] = None,
        *,
        from_key: Optional[BytesLike] = None,
        to_key: Optional[BytesLike] = None,
    ) -> int:
        """How many objects match ``where`` (all when None), counted on the servers.

        ``where`` compares fields ``TYPE@BYTE_OFFSET`` of the value (i32, i64,
        f64 or u8, little-endian) with ``= != < <= > >=`` or ``between A and B``,
        joined by ``and``, ``or``, ``not`` and parentheses, e.g.
        ``"i64@0 > 5 and not u8@8 = 0"``. ``from_key``/``to_key`` keep keys
        ``>= from_key`` and ``< to_key`` (bytewise). A bad expression raises
        ``ValueError`` naming the column.
        """
    def aggregate(
        self,
        op: str,
        field_spec: str,
        where: Optional[str] = None,
        *,
        from_key: Optional[BytesLike] = None,
        to_key: Optional[BytesLike] = None,
    ) -> Union[int, float, None]:
        """``op`` ("sum", "min", "max", "avg" or "count") of the field
        ``field_spec`` (e.g. ``"i64@0"``) over the objects matching ``where``,
        computed on the servers. ``sum`` of an integer field is an exact int;
        ``avg``, ``min`` and ``max`` are None over no objects. A matching object
        too short to hold the field makes the servers refuse (``BadRequest``)."""
    def update(
        self,
        field_spec: str,
        *,
        add: Union[int, float, None] = None,
        set: Union[int, float, None] = None,
        where: Optional[str] = None,
        from_key: Optional[BytesLike] = None,
        to_key: Optional[BytesLike] = None,
    ) -> int:
        """Add ``add`` to, or set to ``set``, the field ``field_spec`` of every
        object matching ``where``, on the servers; returns how many objects were
        updated. A number the field cannot hold raises ``ValueError`` before
        anything is sent."""
    def delete_where(
        self,
        where: Optional[str] = None,
        *,
        from_key: Optional[BytesLike] = None,
        to_key: Optional[BytesLike] = None,
        all: bool = False,
    ) -> int:
        """Remove every object matching ``where`` (and the key range) on the
        servers, each tablet's objects all or none; returns how many were
        removed. Without ``where`` or a key range, ``all=True`` is required
        (else ``ValueError``): a forgotten filter never empties a table. Typed
        tables: ``Client.sql("DELETE FROM t WHERE ...")``."""

class Scan(Iterator[object]):
    """The iterator ``Table.scan`` returns: ``(key, value)`` tuples, or lists of
    them with ``batched=True``."""

    def __iter__(self) -> Scan: ...
    def __next__(self) -> object: ...

class Error(Exception):
    """Base class of every error the insitu client raises."""

    #: The server status name (e.g. "UnknownTable"), or None.
    status: Optional[str]

class NotFound(Error):
    """An object that the operation's condition required does not exist."""

class UnknownTable(Error):
    """No table of that name (or it was dropped since it was opened)."""

class Conflict(Error):
    """A conditional operation was refused: the object exists, or has another version."""

class TableExists(Conflict):
    """create_table of a name that is already taken."""

class Timeout(Error):
    """No reply, or no success after retries, within the client's timeout."""

class ConnectionError(Error):
    """A connection could not be opened or closed before the reply arrived."""

class Unavailable(Error):
    """The cluster cannot serve the request right now; retrying later may succeed."""

class DataLost(Error):
    """No object under the key, but one may have existed: its tablet lost its
    objects with a server that held them in memory only (R = 0)."""

class OutOfMemory(Error):
    """A server has no room for the data (memory budget or replica disk)."""

class TooLarge(Error):
    """A key, a value or a request exceeds the protocol's limits."""

class BadRequest(Error):
    """The server refused the request as invalid (empty key, not a number, bad plan)."""

class SqlError(BadRequest):
    """SQL that does not parse, or names an unknown table or column, or mixes types."""

class AuthenticationError(Error):
    """The cluster refused the token (none, or not the cluster's), or the token may not send that request."""
