//! `insitu sql`: SQL over the cluster's typed tables (DataFusion on the
//! client, filters, projections, limits and aggregates pushed to the servers),
//! as the rows are or at one snapshot of every table (`--snapshot`, `--at`;
//! a query by default when a typed table has several tablets, in the shell
//! each statement its own).

use std::io::Write;

use anyhow::{Context, bail};
use insitu_client::{Client, ClientError, MAX_SNAPSHOT_RETRIES, Status};
use insitu_sql::cluster::{FirstError, Listing};
use insitu_sql::datafusion::arrow::array::RecordBatch;
use insitu_sql::datafusion::arrow::datatypes::SchemaRef;
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
    /// (and without --snapshot/--at), a statement that is a query (SELECT, WITH, VALUES), in
    /// the shell too, reads one fresh snapshot of its own when a typed table has more than one
    /// tablet, as `count` and `agg` do; UPDATE, DELETE and EXPLAIN read the rows as they are.
    #[arg(long, conflicts_with_all = ["snapshot", "at"])]
    pub no_snapshot: bool,
    /// Read every table as of TS, a timestamp `--snapshot` printed. Refused if the oracle has
    /// not handed it out yet, or if the servers no longer keep versions that old (they keep
    /// them while snapshots are read, for a bounded time).
    #[arg(long, value_name = "TS")]
    pub at: Option<u64>,
}

/// Which instant a statement reads.
#[derive(Clone, Copy)]
enum ReadAt {
    /// This timestamp (0: the rows as they are). A refusal as too old is
    /// reported, not retried: the user chose the instant (`--at`, or the
    /// shell's one `--snapshot` for all its statements).
    Fixed(u64),
    /// A fresh timestamp, printed (`--snapshot` for one statement); one
    /// refused as too old is replaced and printed again.
    Fresh(u64),
    /// One fresh snapshot for a query while a typed table has several
    /// tablets, else the rows as they are (the default); replaced silently.
    ByDefault,
}

pub fn run(a: SqlArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let format: Format = a.format.parse().map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let client = rt.block_on(crate::data::connect(cluster))?;
    let ts = rt.block_on(first_timestamp(&client, a.snapshot, a.at))?;
    let read = match (a.snapshot, ts) {
        _ if a.no_snapshot || a.at.is_some() => ReadAt::Fixed(ts),
        (true, ts) if a.sql.is_some() => ReadAt::Fresh(ts),
        (true, ts) => ReadAt::Fixed(ts),
        (false, _) => ReadAt::ByDefault,
    };
    let Some(sql) = a.sql else {
        // The shell lists and describes the tables of this context; each
        // statement reads as `read` says, through a context of its own.
        let listing = rt
            .block_on(Listing::fetch(&client))
            .context("listing the cluster's tables")?;
        let (ctx, _) = rt.block_on(context_at(&client, &listing, ts))?;
        let mut run = |sql: &str| statement(&rt, &client, sql, read).map_err(|e| format!("{e:#}"));
        return insitu_sql::shell::run_shell(&ctx, format, rt.handle(), &mut run)
            .map_err(anyhow::Error::msg);
    };
    let (schema, batches) = statement(&rt, &client, &sql, read)?;
    let mut out = std::io::stdout().lock();
    write_batches(&schema, &batches, format, &mut out).map_err(anyhow::Error::msg)?;
    out.flush()?;
    Ok(())
}

/// Run one statement at the instant `read` says: its result schema and
/// batches. Called from outside the runtime (`rt` runs it).
fn statement(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    sql: &str,
    read: ReadAt,
) -> anyhow::Result<(SchemaRef, Vec<RecordBatch>)> {
    // One listing serves the choice below and every try's session.
    let listing = rt
        .block_on(Listing::fetch(client))
        .context("listing the cluster's tables")?;
    // A snapshot this statement chose itself (none was asked for).
    let by_default = matches!(read, ReadAt::ByDefault) && listing.snapshot_by_default(sql);
    let mut ts = match read {
        ReadAt::Fixed(ts) | ReadAt::Fresh(ts) => ts,
        ReadAt::ByDefault if by_default => rt.block_on(client.timestamp())?,
        ReadAt::ByDefault => 0,
    };
    let mut retries = 0;
    loop {
        let (ctx, errors) = rt.block_on(context_at(client, &listing, ts))?;
        let e = match rt.block_on(insitu_sql::query(&ctx, sql)) {
            Ok(answer) => return Ok(answer),
            Err(e) => e,
        };
        let first = errors.take();
        let status = first.as_ref().and_then(|c| c.status());
        if by_default && status == Some(Status::BadRequest) {
            // A server refused a scan at the snapshot (an answer of too
            // many rows to hold at one): say how to read without.
            bail!(
                "{e}\n(this query read one snapshot, the default on tables of several tablets; \
                 run it again with --no-snapshot to read the rows as they are)"
            );
        }
        if status != Some(Status::SnapshotTooOld) {
            return Err(e.into());
        }
        if let ReadAt::Fixed(ts) = read {
            bail!(
                "{e}\nthe servers no longer keep the versions of timestamp {ts}: take a new one \
                 with `insitu sql --snapshot`"
            );
        }
        // A fresh timestamp is above the servers' floor: run again.
        retries += 1;
        if retries > MAX_SNAPSHOT_RETRIES {
            return Err(e.into());
        }
        ts = rt.block_on(client.timestamp())?;
        if let ReadAt::Fresh(_) = read {
            eprintln!("snapshot at timestamp {ts}");
        }
    }
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

/// A SQL session over every typed table `listing` holds, as of `ts`, and
/// where its scans keep their first client error (so a refused snapshot is
/// recognised).
async fn context_at(
    client: &Client,
    listing: &Listing,
    ts: u64,
) -> anyhow::Result<(insitu_sql::datafusion::prelude::SessionContext, FirstError)> {
    let errors = FirstError::default();
    let tables = listing.tables_at(client, ts, &errors);
    Ok((insitu_sql::context(tables).await?, errors))
}
