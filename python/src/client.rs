//! `insitu.Client`: tables and the logistic-regression trainer.

use std::time::Duration;

use insitu_client::{AtSnapshot, BlockingClient, ClientConfig, Token};
use insitu_protocol::plan::{MAX_DIMS, PointLayout};
use numpy::{PyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::table::Table;

/// A connection to an insitu cluster (see `insitu.connect`).
///
/// Every call blocks until it completes, with the GIL released, so other
/// Python threads run meanwhile; one client may be shared by threads.
#[pyclass(frozen, module = "insitu")]
pub struct Client {
    /// The Rust client, with its own single-threaded runtime.
    pub(crate) inner: BlockingClient,
    /// The coordinator address, for `repr`.
    addr: String,
    /// The per-operation time budget, for `repr` and `timeout`.
    timeout_s: f64,
}

/// Connect to the coordinator at `addr`; every operation then fails within
/// `timeout` seconds (retries included) instead of waiting longer.
/// `auth_token`: the cluster's client token; default: the
/// `INSITU_AUTH_TOKEN` environment variable, else the file
/// `INSITU_AUTH_TOKEN_FILE` names (none if neither is set).
/// `tls_ca`: a PEM file of the CA(s) that sign the cluster's certificates:
/// connect over TLS and verify the servers; default: the file
/// `INSITU_TLS_CA` names, else plain TCP.
#[pyfunction]
#[pyo3(signature = (addr = "127.0.0.1:7070", timeout = 10.0, auth_token = None, tls_ca = None))]
pub fn connect(
    py: Python<'_>,
    addr: &str,
    timeout: f64,
    auth_token: Option<&str>,
    tls_ca: Option<std::path::PathBuf>,
) -> PyResult<Client> {
    if !(timeout.is_finite() && timeout > 0.0 && timeout <= 86_400.0) {
        return Err(PyValueError::new_err(format!(
            "timeout must be a number of seconds in (0, 86400], not {timeout}"
        )));
    }
    let mut config = ClientConfig {
        op_timeout: Duration::from_secs_f64(timeout),
        ..ClientConfig::default()
    };
    config = match auth_token {
        Some(text) => {
            let token = Token::parse(text.as_bytes(), "auth_token")
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            config.auth_token = Some(token);
            config
        }
        None => config
            .with_env_token()
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
    };
    config = match tls_ca {
        Some(path) => {
            let tls = insitu_client::ClientTls::from_ca_file(&path)
                .map_err(|e| PyValueError::new_err(format!("tls_ca: {e}")))?;
            config.tls = Some(tls);
            config
        }
        None => config
            .with_env_tls()
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
    };
    let inner = py
        .detach(|| BlockingClient::connect_with(addr, config))
        .map_err(|e| to_py(py, e))?;
    Ok(Client {
        inner,
        addr: addr.to_string(),
        timeout_s: timeout,
    })
}

/// A trained logistic-regression model (`Client.train_logreg_model`).
#[pyclass(frozen, get_all, module = "insitu")]
pub struct TrainedModel {
    /// The weights, one float32 per dimension.
    weights: Py<PyArray1<f32>>,
    /// The bias (intercept).
    bias: f32,
    /// The mean log-loss before each step (float64).
    losses: Py<PyArray1<f64>>,
}

#[pymethods]
impl TrainedModel {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "TrainedModel(dims={}, bias={}, iterations={})",
            PyUntypedArrayMethods::len(self.weights.bind(py)),
            self.bias,
            PyUntypedArrayMethods::len(self.losses.bind(py))
        )
    }
}

#[pymethods]
impl Client {
    /// Seconds every operation may take, retries included (`connect`'s
    /// `timeout`); `insitu.aio`'s `run_transaction` retries within it too.
    #[getter]
    fn timeout(&self) -> f64 {
        self.timeout_s
    }

    /// Create a table split into `tablets` hash ranges spread over the
    /// servers. Untyped (values are bytes) unless `schema` is given: then a
    /// typed table (for `insert_arrow` and `sql`) whose `schema` is the text
    /// `insitu table create --schema` takes (`"id int64, name utf8 null"`)
    /// or a `pyarrow.Schema`, and whose primary key is the column(s) `key`
    /// names (`"id"`, `"a,b"` or a list).
    #[pyo3(signature = (name, tablets = 4, *, schema = None, key = None))]
    fn create_table(
        &self,
        py: Python<'_>,
        name: &str,
        tablets: u32,
        schema: Option<&Bound<'_, PyAny>>,
        key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Table> {
        let schema = match (schema, key) {
            (None, None) => None,
            (Some(schema), Some(key)) => Some(crate::arrow::schema_arg(py, schema, key)?),
            (Some(_), None) => {
                return Err(PyValueError::new_err(
                    "a typed table needs its primary key: create_table(..., schema=..., key=\"column\")",
                ));
            }
            (None, Some(_)) => {
                return Err(PyValueError::new_err(
                    "key= names columns of a schema: give schema= too",
                ));
            }
        };
        let info = py
            .detach(|| {
                self.inner.block_on(
                    self.inner
                        .async_client()
                        .create_table_with(name, tablets, schema),
                )
            })
            .map_err(|e| to_py(py, e))?;
        Ok(Table::new(self.inner.clone(), info.id, info.name))
    }

    /// Run a SQL query over the cluster's typed tables; the result as a
    /// `pyarrow.Table` (`.to_pandas()` gives a DataFrame). Filters,
    /// projections, limits and aggregates run on the servers where they
    /// can; joins and the rest run here (Apache DataFusion). Raises
    /// `SqlError` for SQL that does not parse or plan. Needs pyarrow.
    ///
    /// `snapshot`: None (the default) reads every table at one fresh
    /// snapshot when the statement is a query and a typed table has several
    /// tablets, as `count` does; True always; False reads the rows as they
    /// are (an UPDATE or DELETE always does).
    #[pyo3(signature = (query, *, snapshot=None))]
    fn sql(&self, py: Python<'_>, query: &str, snapshot: Option<bool>) -> PyResult<Py<PyAny>> {
        let at = match snapshot {
            None => AtSnapshot::Auto,
            Some(true) => AtSnapshot::On,
            Some(false) => AtSnapshot::Off,
        };
        crate::arrow::sql(py, &self.inner, query, at)
    }

    /// The names of the tables, in the coordinator's order.
    fn tables(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let infos = py
            .detach(|| self.inner.list_tables())
            .map_err(|e| to_py(py, e))?;
        Ok(infos.into_iter().map(|t| t.name).collect())
    }

    /// Drop a table and free its memory on every server.
    fn drop_table(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.detach(|| self.inner.drop_table(name))
            .map_err(|e| to_py(py, e))
    }

    /// Acknowledge that table `name` lost objects with a server that held
    /// them in memory only (R = 0): reads of its missing keys stop raising
    /// `DataLost` and return None. Returns how many tablets had been marked
    /// lost (0: none; acknowledging twice is harmless).
    fn ack_loss(&self, py: Python<'_>, name: &str) -> PyResult<u32> {
        py.detach(|| self.inner.ack_loss(name))
            .map_err(|e| to_py(py, e))
    }

    /// Give up what no backup holds of table `name`'s tablets that wait for
    /// a recovery the servers refuse (their replicas were on disks that are
    /// gone for good; `insitu table accept-loss`). They are recovered from
    /// what the backups hold and marked lost: reads of missing keys raise
    /// `DataLost` until `ack_loss`. Returns how many tablets were given up
    /// now (0: none was waiting).
    fn accept_loss(&self, py: Python<'_>, name: &str) -> PyResult<u32> {
        py.detach(|| self.inner.accept_loss(name))
            .map_err(|e| to_py(py, e))
    }

    /// Open an existing table (raises `UnknownTable` if there is none).
    fn table(&self, py: Python<'_>, name: &str) -> PyResult<Table> {
        let info = py
            .detach(|| self.inner.open_table(name))
            .map_err(|e| to_py(py, e))?;
        Ok(Table::new(self.inner.clone(), info.id, info.name))
    }

    /// Train a logistic regression by batch gradient descent, every gradient
    /// computed on the servers; returns the weights (float32 array).
    #[pyo3(signature = (table, dims, iterations = 10, rate = 0.5, *, offset = 0, label_offset = None))]
    #[allow(clippy::too_many_arguments)]
    fn train_logreg<'py>(
        &self,
        py: Python<'py>,
        table: &Bound<'py, PyAny>,
        dims: u32,
        iterations: u32,
        rate: f64,
        offset: u32,
        label_offset: Option<u32>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        // The full model's weights, so the argument checks and the training
        // live in one body (the bias and loss history it also builds are small).
        let m = self.train_logreg_model(py, table, dims, iterations, rate, offset, label_offset)?;
        Ok(m.weights.into_bound(py))
    }

    /// `train_logreg`, returning the weights, the bias and the loss history.
    #[pyo3(signature = (table, dims, iterations = 10, rate = 0.5, *, offset = 0, label_offset = None))]
    #[allow(clippy::too_many_arguments)]
    fn train_logreg_model(
        &self,
        py: Python<'_>,
        table: &Bound<'_, PyAny>,
        dims: u32,
        iterations: u32,
        rate: f64,
        offset: u32,
        label_offset: Option<u32>,
    ) -> PyResult<TrainedModel> {
        if !(1..=MAX_DIMS).contains(&dims) {
            return Err(PyValueError::new_err(format!(
                "dims must be in 1..={MAX_DIMS}, not {dims}"
            )));
        }
        if !(rate.is_finite() && rate > 0.0) {
            return Err(PyValueError::new_err(format!(
                "rate must be a positive number, not {rate}"
            )));
        }
        let vector_end = dims
            .checked_mul(4)
            .and_then(|b| b.checked_add(offset))
            .ok_or_else(|| PyValueError::new_err("offset + 4 * dims overflows"))?;
        let layout = PointLayout {
            offset,
            dims,
            label_offset: label_offset.unwrap_or(vector_end),
        };
        let id = match table.cast::<Table>() {
            Ok(t) => t.get().id,
            Err(_) => {
                let name: String = table.extract().map_err(|_| {
                    pyo3::exceptions::PyTypeError::new_err("table must be a name (str) or a Table")
                })?;
                py.detach(|| self.inner.table_id(&name))
                    .map_err(|e| to_py(py, e))?
            }
        };
        let m = py
            .detach(|| self.inner.train_logreg(id, layout, iterations, rate))
            .map_err(|e| to_py(py, e))?;
        Ok(TrainedModel {
            weights: PyArray1::from_vec(py, m.weights).unbind(),
            bias: m.bias,
            losses: PyArray1::from_vec(py, m.losses).unbind(),
        })
    }

    /// A new transaction: `with c.transaction() as tx: ...` commits when
    /// the block ends (raising `Conflict` if it conflicted; nothing is then
    /// applied) and discards it when the block raises.
    fn transaction(&self) -> crate::txn::Transaction {
        crate::txn::Transaction::new(&self.inner)
    }

    /// Call `body(tx)` in a new transaction and commit it; on a conflict run
    /// it again (randomised back-off) until the client's timeout. Returns
    /// what `body` returned. `body` must do nothing outside `tx` that cannot
    /// be repeated.
    fn run_transaction(&self, py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        crate::txn::run(
            py,
            &self.inner,
            Duration::from_secs_f64(self.timeout_s),
            body,
        )
    }

    /// A snapshot: reads, counts and aggregates through it see the whole
    /// store as of one instant (`ts`: a timestamp from an earlier snapshot,
    /// to read at the same instant again; default a fresh one). A `ts` the
    /// cluster has not handed out yet raises `BadRequest`. A server may
    /// refuse it as too old (`Unavailable`, status "SnapshotTooOld");
    /// `read_only` retries that for you.
    #[pyo3(signature = (ts = None))]
    fn snapshot(&self, py: Python<'_>, ts: Option<u64>) -> PyResult<crate::snapshot::Snapshot> {
        let snap = match ts {
            Some(0) => {
                return Err(PyValueError::new_err(
                    "ts must be a timestamp from the cluster (> 0)",
                ));
            }
            Some(ts) => py
                .detach(|| self.inner.snapshot_at(ts))
                .map_err(|e| to_py(py, e))?,
            None => py
                .detach(|| self.inner.snapshot())
                .map_err(|e| to_py(py, e))?,
        };
        Ok(crate::snapshot::Snapshot::new(snap, self.inner.clone()))
    }

    /// Call `body(snapshot)` on a fresh snapshot: a read-only transaction,
    /// which never conflicts. When a server refuses the snapshot as too
    /// old, run `body` again on a new one (up to 10 times). Returns what
    /// `body` returned; `body` must do nothing that cannot be repeated.
    fn read_only(&self, py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        crate::snapshot::run(py, &self.inner, body)
    }

    fn __repr__(&self) -> String {
        format!("insitu.Client({:?}, timeout={})", self.addr, self.timeout_s)
    }
}
