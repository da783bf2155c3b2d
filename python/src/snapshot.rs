//! `insitu.Snapshot`: reads of any keys, counts and aggregates of any
//! tables as of one timestamp (the Rust client's `Snapshot`, blocking, GIL
//! released), and `Client.read_only`, which retries a refused snapshot.

use insitu_client::{AtSnapshot, BlockingClient, BlockingSnapshot, MAX_SNAPSHOT_RETRIES};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::convert::{AggField, AggregateArgs, selection};
use crate::errors::{Unavailable, to_py};
use crate::table::{Table, call_with_key, call_with_keys};

/// A read-only view of the whole store at one instant (`Client.snapshot()`,
/// or the argument of the function `Client.read_only` runs).
///
/// Every read through it sees each transaction committed before the
/// snapshot was taken whole and none committed after, whatever writes go
/// on meanwhile; nothing is locked or validated, so it never raises
/// `Conflict`. A server may refuse a snapshot whose old versions it does not
/// keep: the first snapshot read after a quiet time always is, and one
/// older than a tablet's move. That raises `Unavailable` with status
/// `"SnapshotTooOld"`; `Client.read_only` then runs its function again at a
/// fresh snapshot. Writes that are not transactions are seen as they are
/// when each server answers.
#[pyclass(frozen, module = "insitu")]
pub struct Snapshot {
    /// The Rust snapshot (its client and timestamp).
    inner: BlockingSnapshot,
    /// The client it was taken from: `sql` runs a session on it.
    client: BlockingClient,
}

impl Snapshot {
    pub fn new(inner: BlockingSnapshot, client: BlockingClient) -> Snapshot {
        Snapshot { inner, client }
    }
}

#[pymethods]
impl Snapshot {
    /// The timestamp the snapshot reads at (from the cluster's oracle).
    #[getter]
    fn ts(&self) -> u64 {
        self.inner.ts()
    }

    /// `Client.sql` as of the snapshot: every typed table the query names
    /// is read as it was at this one instant (a `pyarrow.Table`). An answer
    /// that needs more than the pages one tablet may hold is refused
    /// (`BadRequest`): aggregate, or select fewer rows or columns.
    fn sql(&self, py: Python<'_>, query: &str) -> PyResult<Py<PyAny>> {
        crate::arrow::sql(py, &self.client, query, AtSnapshot::At(self.inner.ts()))
    }

    /// The value of `key` in `table` as of the snapshot (None if absent then).
    fn get<'py>(
        &self,
        py: Python<'py>,
        table: PyRef<'py, Table>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let id = table.id;
        let v = call_with_key(py, key, |k| self.inner.read(id, k))?;
        Ok(v.map(|v| PyBytes::new(py, &v)))
    }

    /// The values of `keys` in `table` as of the snapshot (a list, None
    /// where absent), read in parallel from every server that holds them.
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        table: PyRef<'py, Table>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let id = table.id;
        let items = call_with_keys(py, keys, |slices| self.inner.multi_read(id, slices))?;
        crate::table::values_list(py, items)
    }

    /// How many objects of `table` match `where` (all when None) as of the
    /// snapshot, counted on the servers.
    #[pyo3(signature = (table, r#where = None, *, from_key = None, to_key = None))]
    fn count(
        &self,
        py: Python<'_>,
        table: PyRef<'_, Table>,
        r#where: Option<&str>,
        from_key: Option<&Bound<'_, PyAny>>,
        to_key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let sel = selection(r#where, from_key, to_key)?;
        let id = table.id;
        py.detach(|| self.inner.count(id, &sel))
            .map_err(|e| to_py(py, e))
    }

    /// `Table.aggregate` as of the snapshot: `op` ("sum", "min", "max",
    /// "avg" or "count") of `field_spec` (e.g. "i64@0") over the objects
    /// matching `where`.
    #[pyo3(signature = (table, op, field_spec, r#where = None, *, from_key = None, to_key = None))]
    #[allow(clippy::too_many_arguments)]
    fn aggregate<'py>(
        &self,
        py: Python<'py>,
        table: PyRef<'py, Table>,
        op: &str,
        field_spec: &str,
        r#where: Option<&str>,
        from_key: Option<&Bound<'py, PyAny>>,
        to_key: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = table.id;
        AggregateArgs::parse(op, field_spec, r#where, from_key, to_key)?.run(py, |f, sel| match f {
            AggField::Raw(f) => self.inner.aggregate(id, *f, sel),
            AggField::Json(p) => self.inner.aggregate_json(id, p.clone(), sel),
        })
    }

    fn __repr__(&self) -> String {
        format!("insitu.Snapshot(ts={})", self.inner.ts())
    }
}

/// Whether `e` is a server's refusal of a snapshot it keeps no versions for.
fn too_old(py: Python<'_>, e: &PyErr) -> bool {
    e.is_instance_of::<Unavailable>(py)
        && e.value(py)
            .getattr("status")
            .and_then(|s| s.extract::<Option<String>>())
            .is_ok_and(|s| s.as_deref() == Some("SnapshotTooOld"))
}

/// `Client.read_only(body)`: call `body(snapshot)` on a fresh snapshot; when
/// a server refuses it as too old, run `body` again on a new one (at most
/// `MAX_SNAPSHOT_RETRIES` more times). Returns what `body` returned.
pub fn run(
    py: Python<'_>,
    client: &BlockingClient,
    body: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let mut tries = 0;
    loop {
        tries += 1;
        let snap = py.detach(|| client.snapshot()).map_err(|e| to_py(py, e))?;
        let snap = Bound::new(py, Snapshot::new(snap, client.clone()))?;
        match body.call1((snap,)) {
            Ok(value) => return Ok(value.unbind()),
            Err(e) if too_old(py, &e) && tries <= MAX_SNAPSHOT_RETRIES => {
                py.check_signals()?;
            }
            Err(e) => return Err(e),
        }
    }
}
