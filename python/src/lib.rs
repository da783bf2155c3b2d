//! The `insitu` Python package's native module (`insitu._insitu`): the Rust
//! client (`insitu-client`) exposed to Python. Every network call runs with
//! the GIL released; errors become the exceptions of `errors`.

mod arrow;
mod client;
mod convert;
mod errors;
mod expiry;
mod rows;
mod snapshot;
mod table;
mod txn;

use pyo3::prelude::*;

#[pymodule]
fn _insitu(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // How many more times `read_only` runs its body on a refused snapshot
    // (also `insitu.aio`'s).
    m.add("MAX_SNAPSHOT_RETRIES", insitu_client::MAX_SNAPSHOT_RETRIES)?;
    m.add_function(wrap_pyfunction!(client::connect, m)?)?;
    m.add_class::<client::Client>()?;
    m.add_class::<client::TrainedModel>()?;
    m.add_class::<table::Table>()?;
    m.add_class::<table::Scan>()?;
    m.add_class::<txn::Transaction>()?;
    m.add_class::<snapshot::Snapshot>()?;
    errors::register(m)?;
    Ok(())
}
