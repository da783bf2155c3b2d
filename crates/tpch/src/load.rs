//! Loading a generated TPC-H table into a running cluster: one typed table,
//! generator slices written in parallel batches. Shared by `insitu tpch
//! load` and `insitu bench tpch`.

use std::sync::Arc;

use insitu_client::Client;

/// How to load (the CLI's flags).
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Scale factor.
    pub sf: f64,
    /// Tablets of the new table (more spread it over more shards).
    pub tablets: u32,
    /// Rows per write batch (one multi-write per batch and server).
    pub batch: usize,
    /// Generator slices loaded at once. Why several: generating a row costs
    /// about as much as writing it, so one slice leaves the servers idle.
    pub parallel: u32,
}

/// Create table `name` with its TPC-H schema and write its rows at `opts.sf`;
/// `progress(n)` is called after every batch of `n` rows. Returns the table's
/// id and the rows written. Must run inside a tokio runtime (it spawns one
/// task per slice).
pub async fn load_table(
    client: &Client,
    name: &'static str,
    opts: LoadOptions,
    progress: Arc<dyn Fn(u64) + Send + Sync>,
) -> Result<(u64, u64), String> {
    let schema = crate::schema(name).ok_or_else(|| format!("{name} is not a TPC-H table"))?;
    let info = client
        .create_table_with(name, opts.tablets, Some(schema))
        .await
        .map_err(|e| format!("creating table {name}: {e}"))?;
    // Small tables in one slice: nation and region ignore the slicing.
    let parts = if crate::row_count(name, opts.sf) < 10_000 {
        1
    } else {
        opts.parallel.max(1)
    };
    let mut tasks = Vec::new();
    for part in 0..parts {
        let (client, progress, table, batch) =
            (client.clone(), progress.clone(), info.id, opts.batch.max(1));
        let sf = opts.sf;
        tasks.push(tokio::spawn(async move {
            let mut rows = crate::rows(name, sf, part, parts).map_err(|e| e.to_string())?;
            let mut written = 0u64;
            loop {
                let chunk: Vec<_> = rows.by_ref().take(batch).collect();
                if chunk.is_empty() {
                    return Ok::<u64, String>(written);
                }
                let results = client
                    .put_rows(table, &chunk)
                    .await
                    .map_err(|e| format!("writing {name}: {e}"))?;
                for r in results {
                    r.map_err(|e| format!("writing {name}: {e}"))?;
                }
                written += chunk.len() as u64;
                progress(chunk.len() as u64);
            }
        }));
    }
    let mut total = 0u64;
    for t in tasks {
        total += t
            .await
            .map_err(|e| format!("a loader task of {name} failed: {e}"))??;
    }
    Ok((info.id, total))
}
