//! `insitu.Table`: point operations, multi-operations, scans and the
//! operations computed on the servers (count, aggregate, update).

use std::collections::VecDeque;

use bytes::Bytes;
use insitu_client::{BlockingClient, BlockingTableCursor, ClientError, Found, PerItem};
use insitu_protocol::plan::UpdateAction;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::convert::{
    AggField, AggregateArgs, as_bytes, collect, collect_pairs, field, key_slices, number, selection,
};
use crate::errors::to_py;

/// One table of the cluster (`Client.table`, `Client.create_table`).
///
/// Keys and values are `bytes`; `str` is accepted and encoded as UTF-8.
#[pyclass(frozen, module = "insitu")]
pub struct Table {
    /// The connection (shared with the client that opened the table).
    client: BlockingClient,
    /// The table's id: requests name tables by id, not by name.
    pub(crate) id: u64,
    /// The table's name, for `name` and `repr` (and errors elsewhere).
    pub(crate) name: String,
}

impl Table {
    pub fn new(client: BlockingClient, id: u64, name: String) -> Table {
        Table { client, id, name }
    }
}

/// The first failed item of a multi-operation, or every item's result.
pub(crate) fn all_ok<T>(py: Python<'_>, items: Vec<Result<T, ClientError>>) -> PyResult<Vec<T>> {
    items
        .into_iter()
        .map(|r| r.map_err(|e| to_py(py, e)))
        .collect()
}

/// A multi-read's values as a list (None where absent), or its first failed
/// item raised: shared so `Table.get_many` and `Snapshot.get_many` agree.
pub(crate) fn values_list<'py>(
    py: Python<'py>,
    items: PerItem<Found>,
) -> PyResult<Bound<'py, PyList>> {
    let found = all_ok(py, items)?;
    PyList::new(
        py,
        found
            .into_iter()
            .map(|f| f.map(|(v, _)| PyBytes::new(py, &v))),
    )
}

/// `call` on the bytes of `key` (bytes or str) with the GIL released, its
/// error raised: the start of every single-key call of `Table` and `Snapshot`.
pub(crate) fn call_with_key<T: Send>(
    py: Python<'_>,
    key: &Bound<'_, PyAny>,
    call: impl Send + FnOnce(&[u8]) -> Result<T, ClientError>,
) -> PyResult<T> {
    let k = as_bytes(key, "key")?;
    py.detach(|| call(k)).map_err(|e| to_py(py, e))
}

/// `call_with_key` for the keys of `keys` (any iterable), as `get_many`s take them.
pub(crate) fn call_with_keys<T: Send>(
    py: Python<'_>,
    keys: &Bound<'_, PyAny>,
    call: impl Send + FnOnce(&[&[u8]]) -> Result<T, ClientError>,
) -> PyResult<T> {
    let objs = collect(keys)?;
    let slices = key_slices(&objs)?;
    py.detach(|| call(&slices)).map_err(|e| to_py(py, e))
}

#[pymethods]
impl Table {
    /// The table's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The table's id in the cluster.
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// The columns of a typed table as a `pyarrow.Schema` (None for an
    /// untyped table, whose values are opaque bytes). Needs pyarrow.
    #[getter]
    fn schema(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        crate::arrow::schema(py, &self.client, self.id)
    }

    /// Write Arrow data as rows of this typed table; returns the number of
    /// rows written. `data`: a pyarrow Table, RecordBatch or
    /// RecordBatchReader, a pandas DataFrame, a dict of columns, or an
    /// iterable of RecordBatches. Columns are matched by name (a column the
    /// table lacks is refused; a missing nullable one is NULL); values must
    /// fit their column's type. A row replaces any row with its primary key.
    /// Sent `batch_rows` rows at a time, each step in parallel across the
    /// servers: on an error, earlier steps stay written. Needs pyarrow.
    #[pyo3(signature = (data, *, batch_rows = crate::arrow::DEFAULT_BATCH_ROWS))]
    fn insert_arrow(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        batch_rows: usize,
    ) -> PyResult<u64> {
        crate::arrow::insert_arrow(py, &self.client, self.id, &self.name, data, batch_rows)
    }

    /// Store `value` under `key` (replacing any value); returns the new version.
    /// `ttl` (seconds from now) or `expires_at` (Unix seconds) give the
    /// object a deadline: from then on it is absent to every read and query.
    #[pyo3(signature = (key, value, *, ttl = None, expires_at = None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        ttl: Option<f64>,
        expires_at: Option<f64>,
    ) -> PyResult<u64> {
        let k = as_bytes(key, "key")?;
        let v = as_bytes(value, "value")?;
        let deadline_ms = crate::expiry::deadline_ms(ttl, expires_at)?;
        py.detach(|| {
            self.client
                .write_expiring(self.id, k, v, deadline_ms, Default::default())
        })
        .map_err(|e| to_py(py, e))
    }

    /// The deadline of `key` as Unix seconds, or None if it has none or does
    /// not exist.
    fn expires_at(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
        let found = call_with_key(py, key, |k| self.client.read_expiring(self.id, k))?;
        Ok(found
            .map(|(_, _, ms)| ms)
            .filter(|&ms| ms != 0)
            .map(|ms| ms as f64 / 1000.0))
    }

    /// The value of `key`, or None if there is no such object.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let found = call_with_key(py, key, |k| self.client.read(self.id, k))?;
        Ok(found.map(|(v, _)| PyBytes::new(py, &v)))
    }

    /// Remove `key`; returns whether it existed.
    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let removed = call_with_key(py, key, |k| self.client.remove(self.id, k))?;
        Ok(removed.is_some())
    }

    /// The values of `keys` (any iterable), in order, None where absent.
    /// Requests are grouped per server and sent in parallel.
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let found = call_with_keys(py, keys, |slices| self.client.multi_read(self.id, slices))?;
        values_list(py, found)
    }

    /// Store many objects: a mapping, or an iterable of (key, value) pairs.
    /// Returns how many were written. Requests are grouped per server and
    /// sent in parallel; on an error, some objects may have been written.
    fn put_many(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<usize> {
        let objs = collect_pairs(items)?;
        let pairs = objs
            .iter()
            .map(|(k, v)| Ok((as_bytes(k, "key")?, as_bytes(v, "value")?)))
            .collect::<PyResult<Vec<(&[u8], &[u8])>>>()?;
        let written = py
            .detach(|| self.client.multi_write(self.id, &pairs))
            .map_err(|e| to_py(py, e))?;
        Ok(all_ok(py, written)?.len())
    }

    /// Iterate over every object as (key, value), fetched in batches (of
    /// about 1 MiB); with `batched=True`, yield each batch as a list.
    /// Objects written or removed during the walk may or may not be seen.
    #[pyo3(signature = (*, batched = false))]
    fn scan(&self, py: Python<'_>, batched: bool) -> PyResult<Scan> {
        let cursor = py
            .detach(|| self.client.cursor(self.id))
            .map_err(|e| to_py(py, e))?;
        Ok(Scan {
            cursor: Some(cursor),
            buffered: VecDeque::new(),
            batched,
        })
    }

    /// How many objects match `where` (all when None), counted on the servers.
    #[pyo3(signature = (r#where = None, *, from_key = None, to_key = None))]
    fn count(
        &self,
        py: Python<'_>,
        r#where: Option<&str>,
        from_key: Option<&Bound<'_, PyAny>>,
        to_key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let sel = selection(r#where, from_key, to_key)?;
        py.detach(|| self.client.count(self.id, &sel))
            .map_err(|e| to_py(py, e))
    }

    /// `op` ("sum", "min", "max", "avg" or "count") of `field` (e.g.
    /// "i64@0") over the objects matching `where`, computed on the servers.
    #[pyo3(signature = (op, field_spec, r#where = None, *, from_key = None, to_key = None))]
    fn aggregate<'py>(
        &self,
        py: Python<'py>,
        op: &str,
        field_spec: &str,
        r#where: Option<&str>,
        from_key: Option<&Bound<'py, PyAny>>,
        to_key: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        AggregateArgs::parse(op, field_spec, r#where, from_key, to_key)?.run(py, |f, sel| match f {
            AggField::Raw(f) => self.client.aggregate(self.id, *f, sel),
            AggField::Json(p) => self.client.aggregate_json(self.id, p.clone(), sel),
        })
    }

    /// Add `add` to, or `set` to `set`, `field` of every object matching
    /// `where`, on the servers; returns how many objects were updated.
    #[pyo3(signature = (field_spec, *, add = None, set = None, r#where = None, from_key = None, to_key = None))]
    #[allow(clippy::too_many_arguments)]
    fn update(
        &self,
        py: Python<'_>,
        field_spec: &str,
        add: Option<&Bound<'_, PyAny>>,
        set: Option<&Bound<'_, PyAny>>,
        r#where: Option<&str>,
        from_key: Option<&Bound<'_, PyAny>>,
        to_key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let f = field(field_spec)?;
        let action = match (add, set) {
            (Some(x), None) => UpdateAction::Add(number(x, "add")?),
            (None, Some(x)) => UpdateAction::Set(number(x, "set")?),
            _ => return Err(PyValueError::new_err("give exactly one of add= or set=")),
        };
        // The check the client and the servers run again: refused here, the
        // update never leaves the process.
        insitu_compute::check_action(f, action)
            .map_err(|e| PyValueError::new_err(format!("bad update: {e}")))?;
        let sel = selection(r#where, from_key, to_key)?;
        py.detach(|| self.client.update(self.id, f, action, &sel))
            .map_err(|e| to_py(py, e))
    }

    /// Remove every object matching `where` (and the key range), on the
    /// servers, each tablet's all or none; returns how many were removed.
    /// With no `where` and no key range, `all=True` must say so.
    #[pyo3(signature = (r#where = None, *, from_key = None, to_key = None, all = false))]
    fn delete_where(
        &self,
        py: Python<'_>,
        r#where: Option<&str>,
        from_key: Option<&Bound<'_, PyAny>>,
        to_key: Option<&Bound<'_, PyAny>>,
        all: bool,
    ) -> PyResult<u64> {
        if r#where.is_none() && from_key.is_none() && to_key.is_none() && !all {
            return Err(PyValueError::new_err(
                "this would remove every object of the table: give where= (or from_key=/to_key=), or all=True to mean it",
            ));
        }
        let sel = selection(r#where, from_key, to_key)?;
        py.detach(|| self.client.remove_where(self.id, &sel))
            .map_err(|e| to_py(py, e))
    }

    fn __repr__(&self) -> String {
        format!("insitu.Table({:?}, id={})", self.name, self.id)
    }
}

/// The iterator `Table.scan` returns.
#[pyclass(module = "insitu")]
pub struct Scan {
    /// The walk over the table; None once it is exhausted.
    cursor: Option<BlockingTableCursor>,
    /// Objects of the last batch not yielded yet (when not `batched`).
    buffered: VecDeque<(Bytes, Bytes)>,
    /// Yield whole batches (lists) instead of single objects.
    batched: bool,
}

fn pair<'py>(py: Python<'py>, k: &[u8], v: &[u8]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, [PyBytes::new(py, k), PyBytes::new(py, v)])
}

impl Scan {
    /// The next non-empty batch, or None when the table is exhausted.
    fn fetch(&mut self, py: Python<'_>) -> PyResult<Option<Vec<(Bytes, Bytes)>>> {
        let Some(cursor) = self.cursor.as_mut() else {
            return Ok(None);
        };
        match py.detach(|| cursor.next_batch()) {
            Ok(Some(batch)) => Ok(Some(batch.into_iter().map(|(k, v, _)| (k, v)).collect())),
            Ok(None) => {
                self.cursor = None;
                Ok(None)
            }
            Err(e) => {
                // A failed walk is over: the cursor's position is unknown.
                self.cursor = None;
                Err(to_py(py, e))
            }
        }
    }
}

#[pymethods]
impl Scan {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.batched {
            return match self.fetch(py)? {
                None => Ok(None),
                Some(batch) => {
                    let items = batch
                        .iter()
                        .map(|(k, v)| pair(py, k, v))
                        .collect::<PyResult<Vec<_>>>()?;
                    Ok(Some(PyList::new(py, items)?.into_any()))
                }
            };
        }
        if self.buffered.is_empty() {
            match self.fetch(py)? {
                None => return Ok(None),
                Some(batch) => self.buffered.extend(batch),
            }
        }
        match self.buffered.pop_front() {
            Some((k, v)) => Ok(Some(pair(py, &k, &v)?.into_any())),
            None => Ok(None),
        }
    }
}
