//! Arrow in and out: `Client.sql` (a query's result as a `pyarrow.Table`),
//! `Table.insert_arrow` (Arrow data written as rows of a typed table) and
//! `Table.schema`.
//!
//! Data crosses between pyarrow and Rust as Arrow IPC streams; the pyarrow
//! half lives in `insitu/_arrow.py`. Why IPC and not the C data interface:
//! the native module then links no pyarrow and works with any pyarrow
//! version, at the cost of one copy of a result into a Python `bytes`
//! (pyarrow then reads the stream in place, without copying it again).

use insitu_client::{AtSnapshot, BlockingClient, ClientError, Status};
use insitu_protocol::schema::{Column, Schema};
use insitu_rows::ColumnMap;
use insitu_sql::SqlError;
use insitu_sql::statement::Failure;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{self, to_py};

/// Rows `insert_arrow` sends per request group by default: large enough to
/// keep every server busy, small enough to bound the memory of one step.
pub const DEFAULT_BATCH_ROWS: usize = 10_000;
/// Most rows per step (`insert_arrow(batch_rows=)`): the client holds one
/// step's rows encoded in memory.
const MAX_BATCH_ROWS: usize = 1_000_000;

/// The pyarrow half (`insitu._arrow`); it raises a clear ImportError when
/// pyarrow is not installed.
fn helpers(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    py.import("insitu._arrow")
}

/// Run `query` over the cluster's typed tables, read as `at` says; its
/// result as a `pyarrow.Table`. `At(ts)` (`Snapshot.sql`) reads at `ts` and
/// raises `SnapshotTooOld` as `Unavailable` (`read_only` retries it); `On`
/// takes a fresh timestamp, replaced when a shard refuses it as too old (it
/// had kept no versions and begins keeping them), as `count` does; `Auto`
/// does so for a query when a typed table has several tablets, else reads
/// as `Off`: the rows as they are (`insitu_sql::statement::run`, as
/// `insitu sql` runs its statements).
pub fn sql(
    py: Python<'_>,
    client: &BlockingClient,
    query: &str,
    at: AtSnapshot,
) -> PyResult<Py<PyAny>> {
    // Import first: without pyarrow, fail before doing the work.
    let helpers = helpers(py)?;
    let ipc = py
        .detach(|| {
            client.block_on(async {
                let answer = insitu_sql::statement::run(client.async_client(), query, at)
                    .await
                    .map_err(|e| match e.failure {
                        Failure::Client(e) | Failure::Sql { scan: Some(e), .. } => {
                            QueryFailure::Client(e)
                        }
                        Failure::Sql { error, scan: None } => QueryFailure::Sql(error),
                    })?;
                insitu_rows::arrow::to_ipc(&answer.schema, &answer.batches)
                    .map_err(|e| QueryFailure::Sql(SqlError::Execution(e.to_string())))
            })
        })
        .map_err(|e| e.into_py(py))?;
    let bytes = PyBytes::new(py, &ipc);
    drop(ipc);
    Ok(helpers.call_method1("table_from_ipc", (bytes,))?.unbind())
}

/// Why `sql` failed: a client call (typed exceptions) or the query.
enum QueryFailure {
    Client(ClientError),
    Sql(SqlError),
}

impl QueryFailure {
    fn into_py(self, py: Python<'_>) -> PyErr {
        match self {
            QueryFailure::Client(e) => to_py(py, e),
            QueryFailure::Sql(e @ (SqlError::Syntax(_) | SqlError::Plan(_))) => {
                errors::SqlError::new_err(e.to_string())
            }
            QueryFailure::Sql(e @ SqlError::Execution(_)) => errors::Error::new_err(e.to_string()),
        }
    }
}

/// The schema of typed table `table` (None: an untyped table).
fn table_schema(client: &BlockingClient, table: u64) -> Result<Option<Schema>, ClientError> {
    client.block_on(client.async_client().schema(table))
}

/// `Table.schema`: a `pyarrow.Schema`, or None for an untyped table.
pub fn schema(py: Python<'_>, client: &BlockingClient, table: u64) -> PyResult<Option<Py<PyAny>>> {
    let helpers = helpers(py)?;
    let Some(schema) = py
        .detach(|| table_schema(client, table))
        .map_err(|e| to_py(py, e))?
    else {
        return Ok(None);
    };
    let arrow = insitu_rows::arrow::arrow_schema(&schema);
    let ipc = insitu_rows::arrow::to_ipc(&arrow, &[])
        .map_err(|e| errors::Error::new_err(e.to_string()))?;
    let bytes = PyBytes::new(py, &ipc);
    Ok(Some(
        helpers.call_method1("schema_from_ipc", (bytes,))?.unbind(),
    ))
}

/// `Table.insert_arrow`: write every row of `data` (anything `_arrow.batches`
/// takes) to typed table `table`, `batch_rows` rows per step; returns the
/// number of rows written. Columns are matched by name.
pub fn insert_arrow(
    py: Python<'_>,
    client: &BlockingClient,
    table: u64,
    name: &str,
    data: &Bound<'_, PyAny>,
    batch_rows: usize,
) -> PyResult<u64> {
    if !(1..=MAX_BATCH_ROWS).contains(&batch_rows) {
        return Err(PyValueError::new_err(format!(
            "batch_rows must be in 1..={MAX_BATCH_ROWS}, not {batch_rows}"
        )));
    }
    let helpers = helpers(py)?;
    let schema = py
        .detach(|| table_schema(client, table))
        .map_err(|e| to_py(py, e))?
        .ok_or_else(|| {
            errors::BadRequest::new_err(format!(
                "table {name:?} is untyped (created without a schema): insert_arrow needs a typed table; use put/put_many for bytes"
            ))
        })?;
    let mut written = 0u64;
    // One IPC stream per step: the input is never held twice in full.
    for step in helpers
        .call_method1("batches", (data, batch_rows))?
        .try_iter()?
    {
        let step = step?;
        let ipc = step.cast::<PyBytes>()?;
        let bytes = ipc.as_bytes();
        let first = written + 1;
        written += py
            .detach(|| write_step(client, table, &schema, bytes, first))
            .map_err(|e| to_py(py, e))?;
    }
    Ok(written)
}

/// Decode one IPC stream and write its rows, numbered from `first`.
fn write_step(
    client: &BlockingClient,
    table: u64,
    schema: &Schema,
    ipc: &[u8],
    first: u64,
) -> Result<u64, ClientError> {
    let bad = |msg: String| ClientError::Status(Status::BadRequest, msg);
    let batches = insitu_rows::arrow::from_ipc(ipc).map_err(|e| bad(e.to_string()))?;
    let mut n = 0u64;
    for batch in &batches {
        let rows = ColumnMap::of_batch(schema, batch)
            .and_then(|map| map.batch_rows(batch, first + n))
            .map_err(|e| bad(e.to_string()))?;
        let results = client.block_on(client.async_client().put_rows_numbered(
            table,
            &rows,
            first + n,
        ))?;
        for (r, i) in results.into_iter().zip(first + n..) {
            r.map_err(|e| match e {
                ClientError::Status(s, msg) => ClientError::Status(s, format!("row {i}: {msg}")),
                other => other,
            })?;
        }
        n += rows.len() as u64;
    }
    Ok(n)
}

/// The schema `create_table(schema=, key=)` describes: `schema` is the
/// text `insitu table create --schema` takes (`"id int64, name utf8 null"`)
/// or a `pyarrow.Schema` (a field is nullable as pyarrow says, key columns
/// never); `key` names the primary key's columns (`"a,b"` or a list).
pub fn schema_arg(
    py: Python<'_>,
    schema: &Bound<'_, PyAny>,
    key: &Bound<'_, PyAny>,
) -> PyResult<Schema> {
    let key: Vec<String> = match key.extract::<String>() {
        Ok(text) => text.split(',').map(|k| k.trim().to_string()).collect(),
        Err(_) => key.extract::<Vec<String>>().map_err(|_| {
            PyValueError::new_err("key must be a column name, \"a,b\" or a list of column names")
        })?,
    };
    let bad = |e: String| PyValueError::new_err(format!("schema: {e}"));
    if let Ok(text) = schema.extract::<String>() {
        return insitu_rows::text::parse_schema(&text, &key.join(",")).map_err(bad);
    }
    // (name, type text, nullable) per field, from pyarrow's types.
    let fields: Vec<(String, String, bool)> = helpers(py)?
        .call_method1("schema_columns", (schema,))?
        .extract()?;
    let columns = fields
        .into_iter()
        .map(|(name, ty, nullable)| {
            let ty = insitu_rows::text::parse_type(&ty)
                .map_err(|e| PyValueError::new_err(format!("column {name:?}: {e}")))?;
            let nullable = nullable && !key.contains(&name);
            Ok(Column { name, ty, nullable })
        })
        .collect::<PyResult<Vec<Column>>>()?;
    let key_refs: Vec<&str> = key.iter().map(String::as_str).collect();
    insitu_rows::text::schema_with_key(columns, &key_refs).map_err(bad)
}
