//! `insitu bench tpch`: the seed's SkyhookDM queries (003) and TPC-H Q1/Q6
//! on `lineitem`, three ways, in the same run:
//!
//! - **client**: what users do today: read every row out of the store (one
//!   `select *`, Arrow batches), then run the query on the client (DataFusion
//!   over the fetched batches). `client_ms` = the fetch + the local query.
//! - **pushdown**: `insitu sql`'s path: the servers filter, project and
//!   aggregate; the client gets the answer.
//! - **DuckDB**: the same rows loaded into an in-memory DuckDB (a Python
//!   subprocess), the same SQL; a static columnar copy on every core, the
//!   peer a user copies data into to analyse it.
//!
//! Qb is the seed's range filter `l_extendedprice > 71000` (~7 % of rows
//! at SF 0.01 and above; none at SF 0.001, where parts are cheap), Qd a point lookup by
//! the primary key's columns written as a filter, twice: as a filtered scan,
//! then through a secondary index on `l_orderkey` (`qd_index_ms`), Qf a
//! regex over `l_comment`. Each figure is the best of `--repeats`.
//!
//! The server counts of `--servers` run one shard (one core) per server,
//! for the scaling figures. DuckDB uses every core, so the DuckDB ratios
//! (`q1_vs_duckdb`, `q6_vs_duckdb`) come from one more cluster: one server
//! with one shard per core (`insitu up`'s default layout), pushdown only;
//! the one-core ratios are reported beside them (`..._one_core`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use arrow_array::RecordBatch;
use insitu_protocol::schema::{ColumnType, Schema};
use serde_json::{Value, json};

use crate::pushdown_cluster::{LocalCluster, parse_list, python, write_json};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// TPC-H scale factor (1 = 6M lineitem rows).
    #[arg(long, default_value_t = 0.1)]
    pub sf: f64,
    /// Server counts (comma-separated); each gets a fresh cluster.
    #[arg(long, default_value = "1,2")]
    pub servers: String,
    /// Runs per query; the best is reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Skip the DuckDB reference.
    #[arg(long)]
    pub no_duckdb: bool,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The queries: (name in the report, SQL).
fn queries() -> Vec<(&'static str, &'static str)> {
    vec![
        ("qb", "select * from lineitem where l_extendedprice > 71000"),
        (
            "qd",
            "select * from lineitem where l_orderkey = 5 and l_linenumber = 3",
        ),
        ("qf", "select * from lineitem where l_comment ~ 'uriously'"),
        ("q1", insitu_tpch::query(1).unwrap_or_default()),
        ("q6", insitu_tpch::query(6).unwrap_or_default()),
    ]
}

fn rows_of(batches: &[RecordBatch]) -> u64 {
    batches.iter().map(|b| b.num_rows() as u64).sum()
}

/// Best wall time of `repeats` runs of `sql` on `ctx`, and the rows it returned.
fn best_ms(
    rt: &tokio::runtime::Runtime,
    ctx: &insitu_sql::datafusion::prelude::SessionContext,
    sql: &str,
    repeats: u32,
) -> anyhow::Result<(f64, u64)> {
    let mut best = (f64::MAX, 0);
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        let batches = rt.block_on(insitu_sql::run_sql(ctx, sql))?;
        best.0 = f64::min(best.0, t.elapsed().as_secs_f64() * 1e3);
        best.1 = rows_of(&batches);
    }
    Ok(best)
}

/// One core's sequential memory read speed, bytes per second: the best of
/// three sums over 256 MiB. The machine's limit for a scan: a server reads
/// every byte of its tablets' logs once.
fn memory_read_bytes_per_s() -> f64 {
    let words: Vec<u64> = vec![1; 32 << 20];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let sum = words.iter().fold(0u64, |a, &x| a.wrapping_add(x));
        std::hint::black_box(sum);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (words.len() * 8) as f64 / best
}

/// One cluster of `servers` servers of `shards` shards each: load, then
/// every query pushed down and, when `full`, also client-side and through
/// an index, with the memory figures. `read_bytes_per_s`: one core's
/// memory read speed, for the scan bound.
fn run_servers(
    args: &Args,
    (servers, shards): (usize, usize),
    full: bool,
    read_bytes_per_s: f64,
) -> anyhow::Result<Value> {
    let expected = insitu_tpch::row_count("lineitem", args.sf);
    // ~200 bytes of log per row (row format, key, entry header) and room to clean.
    let memory_mb = ((expected * 400 / servers as u64) >> 20) as usize + 256;
    let c = LocalCluster::start(servers, shards, memory_mb)?;
    let bar = indicatif::ProgressBar::new(expected);
    bar.set_message(format!("loading lineitem on {servers} server(s)"));
    let progress = {
        let bar = bar.clone();
        Arc::new(move |n: u64| bar.inc(n))
    };
    let opts = insitu_tpch::load::LoadOptions {
        sf: args.sf,
        tablets: 2 * (servers * shards) as u32,
        batch: 2000,
        parallel: 4,
    };
    let t = Instant::now();
    let (_, n) =
        c.rt.block_on(insitu_tpch::load::load_table(
            &c.client, "lineitem", opts, progress,
        ))
        .map_err(anyhow::Error::msg)?;
    bar.finish_and_clear();
    let load_s = t.elapsed().as_secs_f64();
    eprintln!(
        "  {servers} server(s) of {shards} shard(s): loaded {n} lineitem rows in {load_s:.1} s"
    );

    let ctx =
        c.rt.block_on(insitu_sql::cluster::cluster_context(&c.client))?;
    if !full {
        let mut per_query = serde_json::Map::new();
        for (name, sql) in queries() {
            let (push_ms, push_rows) = best_ms(&c.rt, &ctx, sql, args.repeats)?;
            println!(
                "{:>8} {name:>4} {:>12} {push_ms:>12.1} {:>10} {push_rows:>10}",
                format!("1x{shards}"),
                "",
                ""
            );
            per_query.insert(
                name.into(),
                json!({"pushdown_ms": push_ms, "rows": push_rows}),
            );
        }
        c.shutdown();
        return Ok(json!({
            "servers": servers, "shards_per_server": shards, "rows": n, "load_s": load_s,
            "queries": per_query,
        }));
    }
    // Client side: every row out, then the query locally.
    let mut fetch_ms = f64::MAX;
    let mut fetched = Vec::new();
    for _ in 0..args.repeats.max(1) {
        let t = Instant::now();
        fetched =
            c.rt.block_on(insitu_sql::run_sql(&ctx, "select * from lineitem"))?;
        fetch_ms = fetch_ms.min(t.elapsed().as_secs_f64() * 1e3);
    }
    anyhow::ensure!(
        rows_of(&fetched) == n,
        "fetched {} rows of {n}",
        rows_of(&fetched)
    );
    // The bytes the columns' values take (buffers as sliced, not the
    // builders' spare capacity): what the same rows cost as Arrow.
    let mut arrow_bytes = 0usize;
    for b in &fetched {
        for c in b.columns() {
            arrow_bytes += c.to_data().get_slice_memory_size()?;
        }
    }
    let local = c.rt.block_on(async {
        let local = insitu_sql::local_context();
        let schema = insitu_tpch::schema("lineitem").context("lineitem schema")?;
        let table = insitu_sql::datafusion::datasource::MemTable::try_new(
            insitu_sql::arrow_schema(&schema),
            vec![std::mem::take(&mut fetched)],
        )?;
        local.register_table("lineitem", Arc::new(table))?;
        anyhow::Ok(local)
    })?;

    let mut per_query = serde_json::Map::new();
    for (name, sql) in queries() {
        let (push_ms, push_rows) = best_ms(&c.rt, &ctx, sql, args.repeats)?;
        let (local_ms, local_rows) = best_ms(&c.rt, &local, sql, args.repeats)?;
        anyhow::ensure!(
            push_rows == local_rows,
            "{name}: pushdown returned {push_rows} rows, the client-side run {local_rows}"
        );
        let client_ms = fetch_ms + local_ms;
        println!(
            "{servers:>8} {name:>4} {client_ms:>12.1} {push_ms:>12.1} {:>10.1} {push_rows:>10}",
            client_ms / push_ms
        );
        per_query.insert(
            name.into(),
            json!({"client_ms": client_ms, "pushdown_ms": push_ms, "rows": push_rows,
                   "selectivity": push_rows as f64 / n as f64,
                   "client_local_query_ms": local_ms}),
        );
    }
    // Qd again through a secondary index on l_orderkey: declared, built on
    // every tablet by its first probe (timed apart), then the same SQL.
    let qd_sql = queries()
        .into_iter()
        .find(|(n, _)| *n == "qd")
        .map(|(_, sql)| sql)
        .context("qd is a query")?;
    let t = Instant::now();
    c.rt.block_on(c.client.set_index("lineitem", "l_orderkey", true))?;
    // A context lists a table's indexes when it is made: a new one.
    let ctx =
        c.rt.block_on(insitu_sql::cluster::cluster_context(&c.client))?;
    best_ms(&c.rt, &ctx, qd_sql, 1)?;
    let index_build_ms = t.elapsed().as_secs_f64() * 1e3;
    let plan =
        c.rt.block_on(insitu_sql::run_sql(&ctx, &format!("explain {qd_sql}")))?;
    // The plan's text is in the batches' string columns.
    let explained = format!("{plan:?}");
    anyhow::ensure!(
        explained.contains("index=[l_orderkey = 5]"),
        "qd does not use the index on l_orderkey:\n{explained}"
    );
    let (qd_index_ms, qd_index_rows) = best_ms(&c.rt, &ctx, qd_sql, args.repeats.max(5))?;
    anyhow::ensure!(
        Some(qd_index_rows) == per_query["qd"]["rows"].as_u64(),
        "qd through the index returned {qd_index_rows} rows"
    );
    println!(
        "{servers:>8} {:>4} {:>12} {qd_index_ms:>12.2} {:>10} {qd_index_rows:>10}   (index built in {index_build_ms:.0} ms)",
        "qd+i", "", ""
    );
    per_query.insert(
        "qd_index".into(),
        json!({"pushdown_ms": qd_index_ms, "rows": qd_index_rows,
               "index_build_ms": index_build_ms}),
    );
    // What the rows cost in memory: the servers' log bytes against Arrow.
    let (mut live, mut segments) = (0u64, 0u64);
    let server_list = c.rt.block_on(c.client.list_servers())?;
    for s in &server_list {
        for addr in &s.shard_addrs {
            let st = c.rt.block_on(c.client.shard_stats(addr))?;
            live += st.live_bytes;
            segments += st.segment_bytes;
        }
    }
    c.shutdown();
    // The fastest a full scan can be: every live log byte read once, the
    // servers in parallel on as many cores as there are.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let scan_bound_ms = live as f64 / servers.min(cores) as f64 / read_bytes_per_s * 1e3;
    Ok(json!({
        "servers": servers, "shards_per_server": shards, "rows": n, "load_s": load_s,
        "fetch_all_ms": fetch_ms,
        "scan_bound_ms": scan_bound_ms,
        "queries": per_query,
        "memory": {
            "insitu_live_bytes_per_row": live as f64 / n as f64,
            "insitu_segment_bytes_per_row": segments as f64 / n as f64,
            "arrow_bytes_per_row": arrow_bytes as f64 / n as f64,
        },
    }))
}

/// DuckDB's type for a column.
fn duckdb_type(ty: ColumnType) -> String {
    match ty {
        ColumnType::Int32 => "INTEGER".into(),
        ColumnType::Int64 => "BIGINT".into(),
        ColumnType::Float64 => "DOUBLE".into(),
        ColumnType::Decimal { precision, scale } => format!("DECIMAL({precision},{scale})"),
        ColumnType::Date32 => "DATE".into(),
        ColumnType::Utf8 => "VARCHAR".into(),
        ColumnType::Bool => "BOOLEAN".into(),
    }
}

/// Write `lineitem` at `sf` as CSV (header, text quoted) for DuckDB.
fn write_lineitem_csv(path: &Path, schema: &Schema, sf: f64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?,
    );
    let names: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
    writeln!(out, "{}", names.join(","))?;
    for row in insitu_tpch::rows("lineitem", sf, 0, 1).map_err(|e| anyhow::anyhow!("{e}"))? {
        let cells: Vec<String> = row
            .iter()
            .zip(&schema.columns)
            .map(|(v, c)| {
                let text = insitu_tpch::generate::render(v);
                if c.ty == ColumnType::Utf8 {
                    format!("\"{}\"", text.replace('"', "\"\""))
                } else {
                    text
                }
            })
            .collect();
        writeln!(out, "{}", cells.join(","))?;
    }
    out.flush()?;
    Ok(())
}

const DUCKDB_SCRIPT: &str = r#"
import json, sys, time, duckdb
path, ddl, repeats, queries = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
con = duckdb.connect()
con.execute("set enable_progress_bar = false")  # stdout carries the report
con.execute(f"create table lineitem ({ddl})")
con.execute(f"copy lineitem from '{path}' (header true)")
def fetch(r):
    # Results as Arrow, like insitu's (the method's name differs by version).
    for m in ("to_arrow_table", "fetch_arrow_table", "arrow"):
        if hasattr(r, m):
            try:
                return getattr(r, m)().num_rows
            except ImportError:  # no pyarrow
                break
    return len(r.fetchall())
out = {}
for name, sql in queries:
    best, rows = float("inf"), 0
    for _ in range(repeats):
        t = time.perf_counter()
        rows = fetch(con.execute(sql))
        best = min(best, (time.perf_counter() - t) * 1e3)
    out[name] = {"ms": best, "rows": rows}
print(json.dumps(out))
"#;

/// DuckDB's best time and rows per query, or None if DuckDB is unavailable.
fn duckdb(args: &Args) -> anyhow::Result<Option<Value>> {
    let schema = insitu_tpch::schema("lineitem").context("lineitem schema")?;
    let path = std::env::temp_dir().join(format!("insitu-tpch-{}.csv", std::process::id()));
    write_lineitem_csv(&path, &schema, args.sf)?;
    let ddl: Vec<String> = schema
        .columns
        .iter()
        .map(|c| format!("{} {} NOT NULL", c.name, duckdb_type(c.ty)))
        .collect();
    // pyarrow first, so DuckDB's results come back as Arrow (as ours do).
    let _ = python("pyarrow", "pass", &[]);
    let out = python(
        "duckdb",
        DUCKDB_SCRIPT,
        &[
            path.display().to_string(),
            ddl.join(", "),
            args.repeats.max(1).to_string(),
            serde_json::to_string(&queries())?,
        ],
    );
    let _ = std::fs::remove_file(&path);
    Ok(match out {
        // The report is the last line (anything DuckDB printed comes before).
        Some(text) => Some(
            serde_json::from_str(text.lines().last().unwrap_or_default())
                .context("DuckDB's report")?,
        ),
        None => None,
    })
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let servers: Vec<usize> = parse_list(&args.servers, "server count")?;
    anyhow::ensure!(
        servers.iter().all(|&s| (1..=64).contains(&s)) && !servers.is_empty(),
        "server counts must be in 1..=64"
    );
    anyhow::ensure!(
        args.sf > 0.0 && args.sf <= 100.0,
        "--sf must be in (0, 100]"
    );
    println!(
        "{:>8} {:>4} {:>12} {:>12} {:>10} {:>10}",
        "servers", "q", "client ms", "pushdown ms", "speed-up", "rows"
    );
    let read_bytes_per_s = memory_read_bytes_per_s();
    eprintln!(
        "  memory read speed (one core): {:.1} GB/s",
        read_bytes_per_s / 1e9
    );
    let mut runs = Vec::new();
    for &k in &servers {
        runs.push(run_servers(args, (k, 1), true, read_bytes_per_s)?);
    }
    // DuckDB runs on every core; so does one server of `insitu up`'s
    // default layout (one shard per core). The DuckDB ratios compare those;
    // the runs above give one shard (one core) per server.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let all_cores = match runs.iter().find(|r| r["servers"] == 1) {
        Some(one) if cores == 1 => one.clone(),
        _ => run_servers(args, (1, cores), false, read_bytes_per_s)?,
    };
    let duck = if args.no_duckdb { None } else { duckdb(args)? };
    let first = &runs[0]["queries"];
    let ratio = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => json!(a / b),
        _ => Value::Null,
    };
    let mut queries_out = serde_json::Map::new();
    for (name, _) in queries() {
        let duck_ms = duck.as_ref().map_or(Value::Null, |d| d[name]["ms"].clone());
        if let Some(d) = &duck {
            let (ours, theirs) = (&first[name]["rows"], &d[name]["rows"]);
            anyhow::ensure!(
                ours == theirs,
                "{name}: insitu returned {ours} rows, DuckDB {theirs}"
            );
            println!(
                "{:>8} {name:>4} duckdb {:>10.1} ms",
                "",
                duck_ms.as_f64().unwrap_or(f64::NAN)
            );
        }
        let (ours, all) = (&first[name]["rows"], &all_cores["queries"][name]["rows"]);
        anyhow::ensure!(
            ours == all,
            "{name}: {ours} rows on one shard per server, {all} on one server of {cores} shards"
        );
        let mut q = first[name].clone();
        q["duckdb_ms"] = duck_ms;
        queries_out.insert(name.into(), q);
    }
    let speedup_1_to_2 = match (
        runs.iter().find(|r| r["servers"] == 1),
        runs.iter().find(|r| r["servers"] == 2),
    ) {
        (Some(one), Some(two)) => queries()
            .iter()
            .map(|(name, _)| {
                (
                    name.to_string(),
                    ratio(
                        &one["queries"][*name]["pushdown_ms"],
                        &two["queries"][*name]["pushdown_ms"],
                    ),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
        _ => Value::Null,
    };
    let report = json!({
        "sf": args.sf,
        "cores": cores,
        "summary_servers": runs[0]["servers"],
        "queries": queries_out,
        "qb_pushdown_vs_client": ratio(&first["qb"]["client_ms"], &first["qb"]["pushdown_ms"]),
        "qf_pushdown_vs_client": ratio(&first["qf"]["client_ms"], &first["qf"]["pushdown_ms"]),
        "q1_vs_duckdb": ratio(&all_cores["queries"]["q1"]["pushdown_ms"], &queries_out["q1"]["duckdb_ms"]),
        "q6_vs_duckdb": ratio(&all_cores["queries"]["q6"]["pushdown_ms"], &queries_out["q6"]["duckdb_ms"]),
        "q1_vs_duckdb_one_core": ratio(&first["q1"]["pushdown_ms"], &queries_out["q1"]["duckdb_ms"]),
        "q6_vs_duckdb_one_core": ratio(&first["q6"]["pushdown_ms"], &queries_out["q6"]["duckdb_ms"]),
        "all_cores_run": all_cores,
        "qd_index_ms": first["qd_index"]["pushdown_ms"],
        "memory_read_gb_per_s": read_bytes_per_s / 1e9,
        "scan_bound_ms": runs[0]["scan_bound_ms"],
        "q1_vs_scan_bound": ratio(&first["q1"]["pushdown_ms"], &runs[0]["scan_bound_ms"]),
        "q6_vs_scan_bound": ratio(&first["q6"]["pushdown_ms"], &runs[0]["scan_bound_ms"]),
        "pushdown_speedup_1_to_2_servers": speedup_1_to_2,
        "runs": runs,
    });
    println!(
        "summary ({} server(s)): qb pushdown vs client {}, qf {}, q1 vs DuckDB {} ({} on one core), \
         q6 vs DuckDB {} ({} on one core), q1 and q6 vs the scan bound ({} ms) {} and {}",
        report["summary_servers"],
        report["qb_pushdown_vs_client"],
        report["qf_pushdown_vs_client"],
        report["q1_vs_duckdb"],
        report["q1_vs_duckdb_one_core"],
        report["q6_vs_duckdb"],
        report["q6_vs_duckdb_one_core"],
        report["scan_bound_ms"],
        report["q1_vs_scan_bound"],
        report["q6_vs_scan_bound"]
    );
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke_tiny_sizes() {
        let v = crate::pushdown_cluster::smoke_json("tpch", |path| {
            run(&Args {
                sf: 0.001,
                servers: "1,2".into(),
                repeats: 1,
                no_duckdb: true,
                json: Some(path),
            })
        })
        .unwrap();
        for key in [
            "qb_pushdown_vs_client",
            "qf_pushdown_vs_client",
            "q1_vs_duckdb",
            "q6_vs_duckdb",
            "q1_vs_duckdb_one_core",
            "q6_vs_duckdb_one_core",
            "qd_index_ms",
            "pushdown_speedup_1_to_2_servers",
            "memory_read_gb_per_s",
            "scan_bound_ms",
            "q1_vs_scan_bound",
            "q6_vs_scan_bound",
        ] {
            assert!(v.get(key).is_some(), "{key} missing");
        }
        assert!(v["qb_pushdown_vs_client"].as_f64().unwrap() > 0.0);
        // Q1 at any scale has its four (returnflag, linestatus) groups.
        assert_eq!(v["queries"]["q1"]["rows"], 4);
        assert_eq!(v["queries"]["qd"]["rows"], 1);
        assert!(v["qd_index_ms"].as_f64().unwrap() > 0.0);
        // The bound is a positive time.
        assert!(v["scan_bound_ms"].as_f64().unwrap() > 0.0);
        assert!(v["q6_vs_scan_bound"].as_f64().unwrap() > 0.0);
        assert_eq!(v["runs"].as_array().unwrap().len(), 2);
        // The all-cores run answers the same.
        let all = &v["all_cores_run"]["queries"];
        assert_eq!(all["q1"]["rows"], 4);
        assert_eq!(all["qb"]["rows"], v["queries"]["qb"]["rows"]);
    }
}
