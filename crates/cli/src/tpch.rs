//! `insitu tpch load`: create the 8 TPC-H tables as typed tables and fill
//! them with the benchmark's generated data (dbgen-identical, `insitu-tpch`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use insitu_client::Client;

use crate::ClusterArg;

#[derive(clap::Subcommand)]
pub enum TpchCmd {
    /// Create the TPC-H tables (part, supplier, partsupp, customer, orders, lineitem, nation,
    /// region) and load them at scale factor --sf (SF 1: 6M lineitem rows, ~1 GB).
    Load {
        /// Scale factor (0.01 = 60k lineitem rows; 1 = 6M).
        #[arg(long, default_value_t = 0.1)]
        sf: f64,
        /// Tablets per table (more spread a table over more shards).
        #[arg(long, default_value_t = 4)]
        tablets: u32,
        /// Drop TPC-H tables that already exist instead of refusing.
        #[arg(long)]
        replace: bool,
        /// Rows per write batch.
        #[arg(long, default_value_t = 2000)]
        batch: usize,
        /// Generator slices loaded in parallel per table.
        #[arg(long, default_value_t = 4)]
        parallel: u32,
    },
}

pub fn run(cmd: TpchCmd, cluster: &ClusterArg) -> anyhow::Result<()> {
    let TpchCmd::Load {
        sf,
        tablets,
        replace,
        batch,
        parallel,
    } = cmd;
    anyhow::ensure!(sf > 0.0 && sf <= 1000.0, "--sf must be in (0, 1000]");
    anyhow::ensure!(
        (1..=100_000).contains(&batch),
        "--batch must be between 1 and 100000"
    );
    anyhow::ensure!((1..=64).contains(&parallel), "--parallel must be 1 to 64");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(async {
        let client = crate::data::connect(cluster).await?;
        load(&client, sf, tablets, replace, batch, parallel).await
    })
}

async fn load(
    client: &Client,
    sf: f64,
    tablets: u32,
    replace: bool,
    batch: usize,
    parallel: u32,
) -> anyhow::Result<()> {
    let existing: Vec<String> = client
        .list_tables()
        .await?
        .into_iter()
        .map(|t| t.name)
        .filter(|n| insitu_tpch::TABLES.contains(&n.as_str()))
        .collect();
    if !existing.is_empty() && !replace {
        bail!(
            "TPC-H tables already exist ({}): add --replace to drop and reload them",
            existing.join(", ")
        );
    }
    for name in &existing {
        client.drop_table(name).await?;
    }
    let total: u64 = insitu_tpch::TABLES
        .iter()
        .map(|t| insitu_tpch::row_count(t, sf))
        .sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} rows {msg} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    let loaded = Arc::new(AtomicU64::new(0));
    let opts = insitu_tpch::load::LoadOptions {
        sf,
        tablets,
        batch,
        parallel,
    };
    let progress = {
        let (bar, loaded) = (bar.clone(), loaded.clone());
        Arc::new(move |n: u64| {
            bar.inc(n);
            loaded.fetch_add(n, Ordering::Relaxed);
        })
    };
    for name in insitu_tpch::TABLES {
        bar.set_message(name.to_string());
        insitu_tpch::load::load_table(client, name, opts, progress.clone())
            .await
            .map_err(anyhow::Error::msg)?;
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let n = loaded.load(Ordering::Relaxed);
    crate::outln!(
        "loaded TPC-H SF {sf}: {n} rows in 8 tables in {secs:.1} s ({:.0} rows/s); try `insitu sql \"select count(*) from lineitem\"`",
        n as f64 / secs.max(1e-9)
    )?;
    Ok(())
}
