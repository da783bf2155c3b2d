//! The optional `--json` report of the one-cluster benchmarks (aggregate,
//! count, gradient): shared so each builds its report only when asked for
//! and writes it the same way.

use std::path::Path;

use crate::pushdown_cluster::write_json;

/// Write the report `build` makes to `path` (`--json`), if one was given;
/// `build` runs only then, so a run without `--json` builds no JSON.
pub(crate) fn write_if_asked(
    path: Option<&Path>,
    build: impl FnOnce() -> serde_json::Value,
) -> anyhow::Result<()> {
    match path {
        Some(path) => write_json(path, &build()),
        None => Ok(()),
    }
}
