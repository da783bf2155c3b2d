//! `insitu sql`: SQL over the cluster's typed tables (DataFusion on the
//! client, filters, projections, limits and aggregates pushed to the servers),
//! as the rows are or at one snapshot of every table (`--snapshot`, `--at`;
//! a query by default when a typed table has several tablets, in the shell
//! each statement its own).

use std::io::Write;

use anyhow::{Context, bail};
use insitu_client::{AtSnapshot, Client, Status};
use insitu_sql::datafusion::arrow::array::RecordBatch;
use insitu_sql::datafusion::arrow::datatypes::SchemaRef;
use insitu_sql::format::{Format, write_batches};
use insitu_sql::statement::{Failure, StatementError};

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

pub fn run(a: SqlArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let format: Format = a.format.parse().map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let client = rt.block_on(crate::data::connect(cluster))?;
    // Which instant each statement reads: a fixed one is refused, not
    // replaced, when too old (the user chose it: `--at`, or the shell's one
    // `--snapshot` for all its statements); a fresh one (`--snapshot` for
    // one statement, or the default's choice) is replaced.
    let at = match (a.at, a.snapshot, a.sql.is_some()) {
        _ if a.no_snapshot => AtSnapshot::Off,
        (Some(ts), _, _) => {
            rt.block_on(client.snapshot_at(ts))?;
            AtSnapshot::At(ts)
        }
        (None, true, true) => AtSnapshot::On,
        (None, true, false) => {
            let ts = rt.block_on(client.timestamp())?;
            eprintln!("snapshot at timestamp {ts}");
            AtSnapshot::At(ts)
        }
        (None, false, _) => AtSnapshot::Auto,
    };
    let Some(sql) = a.sql else {
        // The shell lists and describes the tables of this context; each
        // statement reads as `at` says, through a context of its own.
        let ctx = rt.block_on(insitu_sql::cluster::cluster_context(&client))?;
        let mut run = |sql: &str| statement(&rt, &client, sql, at).map_err(|e| format!("{e:#}"));
        return insitu_sql::shell::run_shell(&ctx, format, rt.handle(), &mut run)
            .map_err(anyhow::Error::msg);
    };
    let (schema, batches) = statement(&rt, &client, &sql, at)?;
    let mut out = std::io::stdout().lock();
    write_batches(&schema, &batches, format, &mut out).map_err(anyhow::Error::msg)?;
    out.flush()?;
    Ok(())
}

/// Run one statement at the instant `at` says (`insitu_sql::statement`):
/// its result schema and batches; a fresh snapshot asked for is printed.
/// Called from outside the runtime (`rt` runs it).
fn statement(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    sql: &str,
    at: AtSnapshot,
) -> anyhow::Result<(SchemaRef, Vec<RecordBatch>)> {
    let announce = |ts: u64| {
        if matches!(at, AtSnapshot::On) && ts != 0 {
            eprintln!("snapshot at timestamp {ts}");
        }
    };
    match rt.block_on(insitu_sql::statement::run(client, sql, at)) {
        Ok(answer) => {
            announce(answer.snapshot_ts);
            Ok((answer.schema, answer.batches))
        }
        Err(e) => {
            announce(e.snapshot_ts);
            let status = e.status();
            let StatementError {
                failure,
                snapshot_ts,
                by_default,
            } = e;
            let error = match failure {
                Failure::Client(e) => return Err(anyhow::Error::new(e)),
                Failure::Sql { error, .. } => error,
            };
            if by_default && status == Some(Status::BadRequest) {
                // A server refused a scan at the snapshot (an answer of too
                // many rows to hold at one): say how to read without.
                bail!(
                    "{error}\n(this query read one snapshot, the default on tables of several \
                     tablets; run it again with --no-snapshot to read the rows as they are)"
                );
            }
            if matches!(at, AtSnapshot::At(_)) && status == Some(Status::SnapshotTooOld) {
                bail!(
                    "{error}\nthe servers no longer keep the versions of timestamp {snapshot_ts}: \
                     take a new one with `insitu sql --snapshot`"
                );
            }
            Err(error.into())
        }
    }
}
