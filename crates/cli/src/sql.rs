//! `insitu sql`: SQL over the cluster's typed tables (DataFusion on the
//! client, filters, projections, limits and aggregates pushed to the servers),
//! as the rows are or at one snapshot of every table (`--snapshot`, `--at`;
//! a one-statement query by default when a typed table has several tablets).

use std::io::Write;

use anyhow::{Context, bail};
use insitu_client::{Client, ClientError, MAX_SNAPSHOT_RETRIES, Status};
use insitu_sql::cluster::{FirstError, cluster_tables_at, snapshot_by_default};
use insitu_sql::format::{Format, write_batches};

use crate::ClusterArg;

#[derive(clap::Args)]
pub struct SqlArgs {
    /// The statement to run (e.g. "select count(*) from lineitem"; EXPLAIN; or UPDATE t SET
    /// c = value, c2 = c2 + number WHERE ..., run in the servers); without it, an interactive
    /// shell (history in ~/.insitu_sql_history; \d lists tables, \q quits).
    pub sql: Option<String>,
    /// How to print results: table, csv, json (one object per line) or arrow (IPC stream bytes).
    #[arg(long, default_value = "table")]
    pub format: String,
    /// Read every table at one instant: a fresh timestamp from the cluster's oracle, printed to
    /// standard error for `--at`. Each transaction committed before it is seen whole, later
    /// ones not at all, while writes go on. In the shell every statement reads that instant.
    #[arg(long, conflicts_with = "at")]
    pub snapshot: bool,
    /// Read each table as it is when its tablets are scanned, with no timestamp. Without this
    /// (and without --snapshot/--at), a one-statement query (SELECT, WITH, VALUES) reads one
    /// fresh snapshot when a typed table has more than one tablet, as `count` and `agg` do;
    /// UPDATE, DELETE, EXPLAIN and the shell read the rows as they are.
    #[arg(long, conflicts_with_all = ["snapshot", "at"])]
    pub no_snapshot: bool,
    /// Read every table as of TS, a timestamp `--snapshot` printed. Refused if the oracle has
    /// not handed it out yet, or if the servers no longer keep versions that old (they keep
    /// them while snapshots are read, for a bounded time).
    #[arg(long, value_name = "TS")]
    pub at: Option<u64>,
}

pub fn run(a: SqlArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let format: Format = a.format.parse().map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let client = rt.block_on(crate::data::connect(cluster))?;
    let Some(sql) = a.sql else {
        let ts = rt.block_on(first_timestamp(&client, a.snapshot, a.at))?;
        let (ctx, _) = rt.block_on(context_at(&client, ts))?;
        return insitu_sql::shell::run_shell(&ctx, format, rt.handle()).map_err(anyhow::Error::msg);
    };
    let mut ts = rt.block_on(first_timestamp(&client, a.snapshot, a.at))?;
    // A snapshot this command chose itself (none was asked for or refused).
    let by_default =
        ts == 0 && !a.no_snapshot && rt.block_on(snapshot_by_default(&client, &sql))?;
    if by_default {
        ts = rt.block_on(client.timestamp())?;
    }
    let mut retries = 0;
    let (schema, batches) = loop {
        let (ctx, errors) = rt.block_on(context_at(&client, ts))?;
        match rt.block_on(insitu_sql::query(&ctx, &sql)) {
            Ok(answer) => break answer,
            Err(e) => {
                let first = errors.take();
                let too_old = first
                    .as_ref()
                    .is_some_and(|c| c.status() == Some(Status::SnapshotTooOld));
                let refused = first
                    .as_ref()
                    .is_some_and(|c| c.status() == Some(Status::BadRequest));
                if by_default && refused {
                    // A server refused a scan at the snapshot (an answer of
                    // too many rows to hold at one): say how to read without.
                    bail!(
                        "{e}\n(this query read one snapshot, the default on tables of several \
                         tablets; run it again with --no-snapshot to read the rows as they are)"
                    );
                }
                if !too_old {
                    return Err(e.into());
                }
                if a.at.is_some() {
                    bail!(
                        "{e}\nthe servers no longer keep the versions of timestamp {ts}: take \
                         a new one with `insitu sql --snapshot`"
                    );
                }
                // A fresh timestamp is above the servers' floor: run again.
                retries += 1;
                if retries > MAX_SNAPSHOT_RETRIES {
                    return Err(e.into());
                }
                ts = rt.block_on(client.timestamp())?;
                if a.snapshot {
                    eprintln!("snapshot at timestamp {ts}");
                }
            }
        }
    };
    let mut out = std::io::stdout().lock();
    write_batches(&schema, &batches, format, &mut out).map_err(anyhow::Error::msg)?;
    out.flush()?;
    Ok(())
}

/// The timestamp to read at (0: the rows as they are), checked; a fresh
/// one is printed.
async fn first_timestamp(
    client: &Client,
    snapshot: bool,
    at: Option<u64>,
) -> Result<u64, ClientError> {
    if let Some(ts) = at {
        client.snapshot_at(ts).await?;
        return Ok(ts);
    }
    if !snapshot {
        return Ok(0);
    }
    let ts = client.timestamp().await?;
    eprintln!("snapshot at timestamp {ts}");
    Ok(ts)
}

/// A SQL session over every typed table as of `ts`, and where its scans
/// keep their first client error (so a refused snapshot is recognised).
async fn context_at(
    client: &Client,
    ts: u64,
) -> anyhow::Result<(insitu_sql::datafusion::prelude::SessionContext, FirstError)> {
    let errors = FirstError::default();
    let tables = cluster_tables_at(client, ts, &errors)
        .await
        .context("listing the cluster's tables")?;
    Ok((insitu_sql::context(tables).await?, errors))
}
