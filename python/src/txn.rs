//! `insitu.Transaction`: several keys, on any servers, changed together or
//! not at all (the Rust client's `Transaction`, driven on the blocking
//! client's runtime, GIL released).

use std::time::{Duration, Instant};

use insitu_client::{BlockingClient, ClientError};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::convert::{as_bytes, collect, key_slices};
use crate::errors::{Conflict, Unavailable, to_py};
use crate::table::Table;

/// A transaction (`Client.transaction()`, or the argument of the function
/// `Client.run_transaction` runs).
///
/// Reads (`get`, `get_many`) return what the cluster holds, or the
/// transaction's own write; their versions are checked at `commit`. Writes
/// (`put`, `insert`, `delete`) wait in the transaction until `commit`, which
/// applies all of them at one instant or raises `Conflict` (nothing applied:
/// a key read changed, or another transaction held one) — run it again.
///
/// As a context manager it commits when the block ends normally and
/// discards everything when the block raises.
#[pyclass(module = "insitu")]
pub struct Transaction {
    /// Whose runtime drives the transaction's requests (`block_on`), and
    /// which knows the tables' schemas. Why not `BlockingTransaction`: it
    /// has no `write_row`, which typed rows need.
    client: BlockingClient,
    /// None once committed or discarded.
    inner: Option<insitu_client::Transaction>,
}

impl Transaction {
    pub fn new(client: &BlockingClient) -> Transaction {
        Transaction {
            client: client.clone(),
            inner: Some(client.async_client().begin()),
        }
    }

    /// The client and the transaction, if it has not ended.
    fn open(&mut self) -> PyResult<(&BlockingClient, &mut insitu_client::Transaction)> {
        let tx = self.inner.as_mut().ok_or_else(|| {
            PyRuntimeError::new_err("the transaction has already ended (committed or discarded)")
        })?;
        Ok((&self.client, tx))
    }

    /// Commit, the error left as the client's (for the retry decision).
    fn commit_raw(&mut self, py: Python<'_>) -> PyResult<Result<(), ClientError>> {
        let tx = self.inner.take().ok_or_else(|| {
            PyRuntimeError::new_err("the transaction has already ended (committed or discarded)")
        })?;
        let client = &self.client;
        Ok(py.detach(|| client.block_on(tx.commit())))
    }
}

#[pymethods]
impl Transaction {
    /// The value of `key` in `table` as this transaction sees it (None if absent).
    fn get<'py>(
        &mut self,
        py: Python<'py>,
        table: PyRef<'py, Table>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let k = as_bytes(key, "key")?;
        let id = table.id;
        let (client, tx) = self.open()?;
        let v = py
            .detach(|| client.block_on(tx.read(id, k)))
            .map_err(|e| to_py(py, e))?;
        Ok(v.map(|v| PyBytes::new(py, &v)))
    }

    /// The values of `keys` in `table` (a list, None where absent), read at once.
    fn get_many<'py>(
        &mut self,
        py: Python<'py>,
        table: PyRef<'py, Table>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let objs = collect(keys)?;
        let slices = key_slices(&objs)?;
        let id = table.id;
        let (client, tx) = self.open()?;
        let found = py
            .detach(|| client.block_on(tx.read_many(id, &slices)))
            .map_err(|e| to_py(py, e))?;
        PyList::new(
            py,
            found.into_iter().map(|v| v.map(|v| PyBytes::new(py, &v))),
        )
    }

    /// Write `value` under `key` of `table` when the transaction commits;
    /// `ttl` (seconds) or `expires_at` (Unix seconds) give it a deadline, as
    /// `Table.put` does.
    #[pyo3(signature = (table, key, value, *, ttl = None, expires_at = None))]
    fn put(
        &mut self,
        table: PyRef<'_, Table>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        ttl: Option<f64>,
        expires_at: Option<f64>,
    ) -> PyResult<()> {
        let (k, v) = (as_bytes(key, "key")?, as_bytes(value, "value")?);
        let deadline_ms = crate::expiry::deadline_ms(ttl, expires_at)?;
        let id = table.id;
        self.open()?.1.write_expiring(id, k, v, deadline_ms);
        Ok(())
    }

    /// Write `row` (a dict of column name -> value) to typed table `table`
    /// when the transaction commits; the row's key columns make its key, so
    /// it replaces a row with the same key. Values convert as for
    /// `Table.insert_arrow`; a missing nullable column is NULL. Refused
    /// before anything is queued: an untyped table, an unknown or missing
    /// NOT NULL column, a value that does not fit its column.
    fn insert(
        &mut self,
        py: Python<'_>,
        table: PyRef<'_, Table>,
        row: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = table.id;
        let (client, tx) = self.open()?;
        // From the client's cached map (fetched when the table was opened).
        let schema = py
            .detach(|| client.block_on(client.async_client().schema(id)))
            .map_err(|e| to_py(py, e))?
            .ok_or_else(|| {
                crate::rows::bad_request(
                    py,
                    format!(
                        "table {:?} is untyped (created without a schema): insert needs a \
                         typed table; use put for bytes",
                        table.name
                    ),
                )
            })?;
        let values = crate::rows::row_values(py, &schema, row)?;
        tx.write_row(id, &schema, &values).map_err(|e| to_py(py, e))
    }

    /// Remove `key` of `table` when the transaction commits.
    fn delete(&mut self, table: PyRef<'_, Table>, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let k = as_bytes(key, "key")?;
        let id = table.id;
        self.open()?.1.remove(id, k);
        Ok(())
    }

    /// Apply every write at one instant, or raise `Conflict` (nothing applied).
    fn commit(&mut self, py: Python<'_>) -> PyResult<()> {
        self.commit_raw(py)?.map_err(|e| to_py(py, e))
    }

    /// Drop the transaction's writes; nothing was applied.
    fn discard(&mut self) {
        self.inner = None;
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (exc_type, _exc = None, _tb = None))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some_and(|t| !t.is_none()) || self.inner.is_none() {
            self.inner = None;
            return Ok(false); // the block's exception, if any, goes on
        }
        self.commit(py)?;
        Ok(false)
    }
}

/// `Client.run_transaction(body)`: call `body(tx)` in a new transaction and
/// commit; on `Conflict` (or `Unavailable`: a tablet moving) run it again
/// after a randomised back-off, until the client's timeout. Returns what
/// `body` returned.
pub fn run(
    py: Python<'_>,
    client: &BlockingClient,
    timeout: Duration,
    body: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_micros(200);
    loop {
        let tx = Bound::new(py, Transaction::new(client))?;
        let retry_err = match body.call1((tx.clone(),)) {
            Ok(value) => {
                let committed = tx.borrow_mut().commit_raw(py);
                match committed {
                    // The body committed or discarded it itself.
                    Err(_) => return Ok(value.unbind()),
                    Ok(Ok(())) => return Ok(value.unbind()),
                    Ok(Err(e)) if insitu_client::txn::is_retryable(&e) => to_py(py, e),
                    Ok(Err(e)) => return Err(to_py(py, e)),
                }
            }
            Err(e) if e.is_instance_of::<Conflict>(py) || e.is_instance_of::<Unavailable>(py) => e,
            Err(e) => return Err(e),
        };
        if Instant::now() >= deadline {
            return Err(retry_err);
        }
        let sleep = backoff.mul_f64(0.5 + fastrand::f64());
        py.detach(|| {
            std::thread::sleep(sleep.min(deadline.saturating_duration_since(Instant::now())))
        });
        backoff = (backoff * 2).min(Duration::from_millis(50));
        py.check_signals()?;
    }
}
