//! `insitu sql`: SQL over the cluster's typed tables (DataFusion on the
//! client, filters, projections, limits and aggregates pushed to the servers).

use std::io::Write;

use anyhow::Context;
use insitu_sql::format::{Format, write_batches};

use crate::ClusterArg;

#[derive(clap::Args)]
pub struct SqlArgs {
    /// The statement to run (e.g. "select count(*) from lineitem"); without it, an interactive
    /// shell (history in ~/.insitu_sql_history; \d lists tables, \q quits).
    pub sql: Option<String>,
    /// How to print results: table, csv, json (one object per line) or arrow (IPC stream bytes).
    #[arg(long, default_value = "table")]
    pub format: String,
}

pub fn run(a: SqlArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let format: Format = a.format.parse().map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let ctx = rt.block_on(async {
        let client = crate::data::connect(cluster).await?;
        insitu_sql::cluster::cluster_context(&client)
            .await
            .map_err(anyhow::Error::from)
    })?;
    match a.sql {
        Some(sql) => {
            let (schema, batches) = rt.block_on(insitu_sql::query(&ctx, &sql))?;
            let mut out = std::io::stdout().lock();
            write_batches(&schema, &batches, format, &mut out).map_err(anyhow::Error::msg)?;
            out.flush()?;
            Ok(())
        }
        None => insitu_sql::shell::run_shell(&ctx, format, rt.handle()).map_err(anyhow::Error::msg),
    }
}
