//! `insitu bench aggregate`: the seed's aggregation experiment (000) —
//! summing one integer per object with five strategies — reproduced.
//!
//! Setup (the seed's): for `objects = N` and selectivity `s`, one server (one
//! shard) holds `N / s` objects in all; the aggregated table holds `N` of
//! them, another table the rest. Object `i` of the aggregated table has the
//! 8-byte little-endian key `i` (`insitu_protocol::plan::int_key`) and a
//! 4-byte value, the i32 `i % 1_000_003`; the sum is checked against the
//! known total for every strategy. Strategies:
//! - `client`: one `read` RPC per object, in sequence, summed on the client
//!   (measured on at most `--client-cap` objects and extrapolated: see `sampled`);
//! - `client-batched`: `multi_read` of 1000 keys at a time, summed on the client;
//! - `hashtable-lookup`: the server looks up keys 0..N in its hash index;
//! - `hashtable-foreach`: the server iterates its hash index;
//! - `log-traversal`: the server walks the tablet's log segments.
//!
//! Also DuckDB's `SUM` over the same N integers (a Python subprocess), and
//! the p50/p99 latency of point reads on the same shard while a scan runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use insitu_protocol::plan::{Field, Source, int_key};
use serde_json::json;

use crate::pushdown_cluster::{LocalCluster, parse_list, python};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Objects in the aggregated table (comma-separated list).
    #[arg(long, default_value = "10000,100000,1000000")]
    pub objects: String,
    /// Fraction of the server's objects that the aggregated table holds (list).
    #[arg(long, default_value = "1,0.1,0.005")]
    pub selectivity: String,
    /// Skip combinations whose server would hold more objects than this.
    #[arg(long, default_value_t = 20_000_000)]
    pub max_total: u64,
    /// The `client` strategy reads at most this many objects (then extrapolates).
    #[arg(long, default_value_t = 100_000)]
    pub client_cap: u64,
    /// Repetitions of each server-side strategy (the best counts).
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Shards (cores) of the one server; the aggregated table gets one tablet per shard.
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// Skip the DuckDB reference.
    #[arg(long)]
    pub no_duckdb: bool,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub const STRATEGIES: [&str; 5] = [
    "client",
    "client-batched",
    "hashtable-lookup",
    "hashtable-foreach",
    "log-traversal",
];

fn value_of(i: u64) -> i32 {
    (i % 1_000_003) as i32
}

fn expected_sum(n: u64) -> i128 {
    (0..n).map(|i| value_of(i) as i128).sum()
}

struct Row {
    objects: u64,
    selectivity: f64,
    strategy: &'static str,
    ms: f64,
    sampled: Option<u64>,
    /// Server-side strategies: the servers' own scan time.
    server_ms: Option<f64>,
}

fn duckdb_ms(n: u64) -> Option<f64> {
    let script = r#"
import sys, time, duckdb
n = int(sys.argv[1])
con = duckdb.connect()
con.execute(f"CREATE TABLE t AS SELECT (i % 1000003)::INTEGER AS v FROM range({n}) r(i)")
best = None
for _ in range(5):
    t = time.perf_counter()
    s = con.execute("SELECT SUM(v) FROM t").fetchone()[0]
    d = time.perf_counter() - t
    best = d if best is None else min(best, d)
print(f"{best * 1e3} {s}")
"#;
    let out = python("duckdb", script, &[n.to_string()])?;
    let mut parts = out.split_whitespace();
    let ms: f64 = parts.next()?.parse().ok()?;
    let sum: i128 = parts.next()?.parse().ok()?;
    if sum != expected_sum(n) {
        eprintln!("note: DuckDB's sum {sum} differs from the expected one");
    }
    Some(ms)
}

/// Latency of point reads (own connection) on the shard while log scans run.
pub struct ReadLatency {
    pub idle_p50_us: f64,
    pub idle_p99_us: f64,
    pub scan_p50_us: f64,
    pub scan_p99_us: f64,
    pub scan_max_us: f64,
    pub reads_during_scans: usize,
    pub scans: usize,
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn read_latency(
    c: &LocalCluster,
    table: u64,
    n: u64,
    strategy: Source,
) -> anyhow::Result<ReadLatency> {
    c.rt.block_on(async {
        // A second client: its own connection, so reads do not queue behind
        // the scan request on the scanning connection.
        let reader = insitu_client::Client::connect(&c.addr).await?;
        let mut idle = Vec::new();
        for i in 0..2000u64 {
            let t = Instant::now();
            reader.read(table, int_key(i * 7919 % n)).await?;
            idle.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let scanner = c.client.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let scans = tokio::spawn(async move {
            let mut k = 0usize;
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                scanner
                    .aggregate_with(table, Field::I32(0), &Default::default(), strategy.clone())
                    .await?;
                k += 1;
            }
            anyhow::Ok(k)
        });
        let mut during = Vec::new();
        let started = Instant::now();
        let mut i = 0u64;
        while started.elapsed() < Duration::from_millis(1500) {
            let t = Instant::now();
            reader.read(table, int_key(i * 7919 % n)).await?;
            during.push(t.elapsed().as_secs_f64() * 1e6);
            i += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let scans = scans.await??;
        let max = during.iter().cloned().fold(0.0, f64::max);
        Ok(ReadLatency {
            idle_p50_us: percentile(&mut idle, 0.5),
            idle_p99_us: percentile(&mut idle, 0.99),
            scan_p50_us: percentile(&mut during, 0.5),
            scan_p99_us: percentile(&mut during, 0.99),
            scan_max_us: max,
            reads_during_scans: during.len(),
            scans,
        })
    })
}

fn one_setup(
    args: &Args,
    n: u64,
    s: f64,
    rows: &mut Vec<Row>,
) -> anyhow::Result<Vec<(&'static str, ReadLatency)>> {
    let total = (n as f64 / s).round() as u64;
    let filler = total.saturating_sub(n);
    // ~44 bytes per entry + index; generous budget.
    let memory_mb = ((total * 120) >> 20) as usize + 256;
    let shards = args.shards.max(1);
    let c = LocalCluster::start(1, shards, memory_mb * shards)?;
    let table = c.create_table("agg", shards as u32)?;
    let other = c.create_table("other", shards as u32)?;
    let load = c.load(table, n, |i, k, v| {
        k.extend_from_slice(&int_key(i));
        v.extend_from_slice(&value_of(i).to_le_bytes());
    })?;
    let load_other = c.load(other, filler, |i, k, v| {
        k.extend_from_slice(&int_key(i));
        v.extend_from_slice(&(i as i32).to_le_bytes());
    })?;
    eprintln!(
        "  loaded {n} + {filler} objects in {:.1} s",
        (load + load_other).as_secs_f64()
    );
    let want = expected_sum(n);
    let check = |strategy: &str, got: i128| -> anyhow::Result<()> {
        anyhow::ensure!(got == want, "{strategy}: sum {got}, expected {want}");
        Ok(())
    };
    for strategy in STRATEGIES {
        let mut server_ms = None;
        let (ms, sampled) = match strategy {
            "client" => {
                let m = n.min(args.client_cap);
                let t = Instant::now();
                let sum = c.rt.block_on(async {
                    let mut sum = 0i128;
                    for i in 0..m {
                        let (v, _) = c
                            .client
                            .read(table, int_key(i))
                            .await?
                            .expect("object exists");
                        sum += i32::from_le_bytes(v[..4].try_into()?) as i128;
                    }
                    anyhow::Ok(sum)
                })?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                check(
                    strategy,
                    sum + if m < n {
                        (m..n).map(|i| value_of(i) as i128).sum::<i128>()
                    } else {
                        0
                    },
                )?;
                (ms * n as f64 / m as f64, (m < n).then_some(m))
            }
            "client-batched" => {
                let t = Instant::now();
                let sum = c.rt.block_on(async {
                    let mut sum = 0i128;
                    let mut i = 0u64;
                    while i < n {
                        let end = (i + 1000).min(n);
                        let keys: Vec<[u8; 8]> = (i..end).map(int_key).collect();
                        for r in c.client.multi_read(table, &keys).await? {
                            let (v, _) = r?.expect("object exists");
                            sum += i32::from_le_bytes(v[..4].try_into()?) as i128;
                        }
                        i = end;
                    }
                    anyhow::Ok(sum)
                })?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                check(strategy, sum)?;
                (ms, None)
            }
            _ => {
                let source = match strategy {
                    "hashtable-lookup" => Source::IntKeys { from: 0, to: n },
                    "hashtable-foreach" => Source::Index,
                    _ => Source::Log,
                };
                let mut best = f64::MAX;
                let mut best_server = f64::MAX;
                for _ in 0..args.repeats.max(1) {
                    let t = Instant::now();
                    let (agg, out) = c.rt.block_on(c.client.aggregate_with(
                        table,
                        Field::I32(0),
                        &Default::default(),
                        source.clone(),
                    ))?;
                    best = best.min(t.elapsed().as_secs_f64() * 1e3);
                    best_server = best_server.min(out.max_server_time.as_secs_f64() * 1e3);
                    check(strategy, agg.sum_int)?;
                    anyhow::ensure!(agg.count == n, "{strategy}: count {} not {n}", agg.count);
                }
                server_ms = Some(best_server);
                (best, None)
            }
        };
        eprintln!(
            "  {strategy:<18} {ms:>10.2} ms {:>12.0} objects/ms",
            n as f64 / ms
        );
        rows.push(Row {
            objects: n,
            selectivity: s,
            strategy,
            ms,
            sampled,
            server_ms,
        });
    }
    let mut latency = Vec::new();
    if n >= 100_000 {
        for (name, source) in [
            ("log-traversal", Source::Log),
            ("hashtable-foreach", Source::Index),
        ] {
            latency.push((name, read_latency(&c, table, n, source)?));
        }
    }
    c.shutdown();
    Ok(latency)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let objects: Vec<u64> = parse_list(&args.objects, "object count")?;
    let sels: Vec<f64> = parse_list(&args.selectivity, "selectivity")?;
    anyhow::ensure!(
        sels.iter().all(|s| *s > 0.0 && *s <= 1.0),
        "selectivities must be in (0, 1]"
    );
    anyhow::ensure!(
        objects.iter().all(|n| *n > 0),
        "object counts must be positive"
    );
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut latencies = Vec::new();
    for &s in &sels {
        for &n in &objects {
            let total = (n as f64 / s).round() as u64;
            if total > args.max_total {
                eprintln!(
                    "skipping {n} objects at selectivity {s}: {total} objects in all exceed --max-total {}",
                    args.max_total
                );
                skipped.push(json!({"objects": n, "selectivity": s, "total_objects": total}));
                continue;
            }
            eprintln!("{n} objects at selectivity {s} ({total} on the server)");
            for (name, l) in one_setup(args, n, s, &mut rows)? {
                latencies.push((n, s, name, l));
            }
        }
    }
    let duck: Vec<(u64, f64)> = if args.no_duckdb {
        Vec::new()
    } else {
        objects
            .iter()
            .filter_map(|&n| duckdb_ms(n).map(|ms| (n, ms)))
            .collect()
    };

    // Tables in the seed's shape: ms per strategy, per selectivity.
    for &s in &sels {
        println!(
            "\nselectivity {}% — ms per aggregation (objects/ms)",
            s * 100.0
        );
        print!("{:>10}", "objects");
        for st in STRATEGIES {
            print!(" {st:>24}");
        }
        println!(" {:>20}", "duckdb SUM");
        for &n in &objects {
            let of = |st: &str| {
                rows.iter()
                    .find(|r| r.objects == n && r.selectivity == s && r.strategy == st)
            };
            if of("log-traversal").is_none() {
                continue;
            }
            print!("{n:>10}");
            for st in STRATEGIES {
                let r = of(st).expect("measured");
                let cell = format!(
                    "{:.2} ({:.0}){}",
                    r.ms,
                    n as f64 / r.ms,
                    if r.sampled.is_some() { "*" } else { "" }
                );
                print!(" {cell:>24}");
            }
            match duck.iter().find(|d| d.0 == n) {
                Some((_, ms)) => println!(" {:>20}", format!("{ms:.2} ({:.0})", n as f64 / ms)),
                None => println!(" {:>20}", "-"),
            }
        }
    }
    println!(
        "\n* client: measured on the first {} objects and extrapolated",
        args.client_cap
    );
    for &n in &objects {
        let of = |st: &str| {
            rows.iter()
                .find(|r| r.objects == n && r.selectivity == 1.0 && r.strategy == st)
        };
        if let (Some(c), Some(l)) = (of("client"), of("log-traversal")) {
            println!(
                "{n} objects, 100%: log-traversal is {:.0}x client",
                c.ms / l.ms
            );
        }
    }
    for (n, s, name, l) in &latencies {
        println!(
            "point reads on the scanned shard ({n} objects, selectivity {s}), own connection: idle p50 {:.0} us p99 {:.0} us; during {} {name} scans p50 {:.0} us p99 {:.0} us max {:.0} us ({} reads)",
            l.idle_p50_us,
            l.idle_p99_us,
            l.scans,
            l.scan_p50_us,
            l.scan_p99_us,
            l.scan_max_us,
            l.reads_during_scans
        );
    }
    crate::json_report::write_if_asked(args.json.as_deref(), || {
        let rows_json: Vec<_> = rows
            .iter()
            .map(|r| {
                let mut v = json!({
                    "objects": r.objects,
                    "selectivity": r.selectivity,
                    "strategy": r.strategy,
                    "ms": r.ms,
                    "objects_per_ms": r.objects as f64 / r.ms,
                });
                if let Some(m) = r.sampled {
                    v["sampled"] = json!(m);
                }
                if let Some(m) = r.server_ms {
                    v["server_ms"] = json!(m);
                }
                v
            })
            .collect();
        let duck_json: Vec<_> = duck
            .iter()
            .map(|(n, ms)| json!({"objects": n, "ms": ms, "objects_per_ms": *n as f64 / ms}))
            .collect();
        let lat_json: Vec<_> = latencies
            .iter()
            .map(|(n, s, name, l)| {
                json!({"objects": n, "selectivity": s, "scan_strategy": name,
                "idle_p50_us": l.idle_p50_us, "idle_p99_us": l.idle_p99_us,
                "during_scan_p50_us": l.scan_p50_us, "during_scan_p99_us": l.scan_p99_us,
                "during_scan_max_us": l.scan_max_us, "reads": l.reads_during_scans, "scans": l.scans})
            })
            .collect();
        json!({"rows": rows_json, "duckdb": duck_json, "skipped": skipped,
                "read_latency_during_scan": lat_json,
                "client_cap": args.client_cap})
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke_tiny_sizes() {
        let v = crate::pushdown_cluster::smoke_json("agg", |path| {
            run(&Args {
                objects: "300".into(),
                selectivity: "1,0.5".into(),
                max_total: 1000,
                client_cap: 100,
                repeats: 1,
                shards: 1,
                no_duckdb: true,
                json: Some(path),
            })
        })
        .unwrap();
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2 * STRATEGIES.len());
        for st in STRATEGIES {
            assert!(
                rows.iter()
                    .any(|r| r["strategy"] == st && r["objects_per_ms"].as_f64().unwrap() > 0.0)
            );
        }
    }
}
