//! `insitu bench txn`: multi-key transactions against PostgreSQL.
//!
//! Checkout: each transaction reads 10 random items' stock (drawn with
//! replacement from `--items`, or from the first `--hot-items` in the hot
//! variant), decrements each once and writes an order row; closed loop,
//! 4/16/64 client connections, on insitu (in-process cluster, `--servers`
//! servers of one shard) and on PostgreSQL (REPEATABLE READ, pgbench with
//! prepared statements, `txn_pg.rs`), same machine, same run. A
//! transaction's latency includes its retries after conflicts.
//!
//! Bank: `--accounts` accounts, concurrent transfers and concurrent audits
//! (a read-only transaction at a snapshot summing every balance); every audit
//! must see the initial total: `bank_invariant_violations` counts those that
//! did not, plus a final total that differs; every attempt is recorded and
//! the history checker's count is `anomalies` (`txn_bank.rs`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use insitu_client::txn::is_retryable;
use insitu_client::{Client, ClientConfig};
use serde_json::{Value, json};

use crate::pushdown_cluster::{LocalCluster, parse_list, write_json};
use crate::txn_pg::{Postgres, checkout_script, load_checkout};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The peer to compare with: `postgres` (installed with apt-get if missing) or `none`.
    #[arg(long, default_value = "postgres")]
    pub vs: String,
    /// Items in the checkout workload.
    #[arg(long, default_value_t = 10_000)]
    pub items: u64,
    /// Items the hot-spot variant draws from.
    #[arg(long, default_value_t = 100)]
    pub hot_items: u64,
    /// Client connections (comma-separated), one closed-loop client each.
    #[arg(long, default_value = "4,16,64")]
    pub clients: String,
    /// Seconds per case (PostgreSQL's are whole seconds, at least 1).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Storage servers of the insitu cluster (one shard each).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Replicas of every segment on the insitu side (R; 0 = in memory only,
    /// to measure what replication costs).
    #[arg(long, default_value_t = 2)]
    pub replicas: u32,
    /// Accounts in the bank workload.
    #[arg(long, default_value_t = 100)]
    pub accounts: u64,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Initial stock of every item: never runs out within a run.
const STOCK: i64 = 1_000_000_000;
/// Items per checkout.
const ITEMS_PER_ORDER: usize = 10;

/// One system's figures for one case.
#[derive(Debug)]
struct Figures {
    commits: u64,
    /// Tries that aborted (conflicts on insitu, serialization failures and
    /// deadlocks on PostgreSQL) and were run again.
    aborts: u64,
    seconds: f64,
    latency_us: Histogram<u64>,
}

impl Figures {
    fn json(&self) -> Value {
        let tries = self.commits + self.aborts;
        json!({
            "txn_per_s": self.commits as f64 / self.seconds,
            "abort_rate": if tries == 0 { 0.0 } else { self.aborts as f64 / tries as f64 },
            "p50_ms": self.latency_us.value_at_quantile(0.5) as f64 / 1000.0,
            "p99_ms": self.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
            "commits": self.commits,
            "aborts": self.aborts,
        })
    }
    fn tps(&self) -> f64 {
        self.commits as f64 / self.seconds
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

fn item_key(i: u64) -> Vec<u8> {
    format!("item{i:08}").into_bytes()
}

/// Run checkouts from `clients` connections for `seconds`, items drawn from `0..range`.
async fn checkout_insitu(
    addr: &str,
    items: u64,
    orders: u64,
    range: u64,
    clients: usize,
    seconds: f64,
) -> anyhow::Result<Figures> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = Client::connect_with(
            addr,
            ClientConfig {
                op_timeout: Duration::from_secs(30),
                ..ClientConfig::default()
            },
        )
        .await?;
        tasks.push(tokio::task::spawn_local(async move {
            let mut rng = insitu_testkit::rng(c as u64 + 1);
            let mut f = Figures {
                commits: 0,
                aborts: 0,
                seconds,
                latency_us: histogram(),
            };
            let mut order = 0u64;
            while Instant::now() < deadline {
                let mut ids: Vec<u64> = (0..ITEMS_PER_ORDER).map(|_| rng.u64(0..range)).collect();
                ids.sort_unstable();
                ids.dedup();
                let keys: Vec<Vec<u8>> = ids.iter().map(|&i| item_key(i)).collect();
                order += 1;
                let order_key = format!("order-{c}-{order}");
                let order_value: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
                let started = Instant::now();
                loop {
                    let mut tx = client.begin();
                    let stock = tx.read_many(items, &keys).await?;
                    for (key, s) in keys.iter().zip(stock) {
                        let s = s.context("an item is missing")?;
                        let n = i64::from_le_bytes(s[..8].try_into().context("stock is 8 bytes")?);
                        tx.write(items, key, (n - 1).to_le_bytes());
                    }
                    tx.write(orders, &order_key, &order_value);
                    match tx.commit().await {
                        Ok(()) => break,
                        Err(e) if is_retryable(&e) => f.aborts += 1,
                        Err(e) => return Err(e.into()),
                    }
                }
                f.latency_us
                    .record(started.elapsed().as_micros().max(1) as u64)
                    .ok();
                f.commits += 1;
            }
            anyhow::Ok(f)
        }));
    }
    let mut total = Figures {
        commits: 0,
        aborts: 0,
        seconds,
        latency_us: histogram(),
    };
    for t in tasks {
        let f = t.await??;
        total.commits += f.commits;
        total.aborts += f.aborts;
        total.latency_us.add(&f.latency_us)?;
    }
    Ok(total)
}

/// The checkout on PostgreSQL, items `1..=range`.
fn checkout_pg(pg: &Postgres, range: u64, clients: usize, seconds: f64) -> anyhow::Result<Figures> {
    let run = pg.pgbench(
        "checkout",
        &checkout_script(),
        clients,
        seconds,
        &[("items", range.to_string())],
    )?;
    anyhow::ensure!(
        run.failed == 0,
        "pgbench: {} transactions failed even after retries",
        run.failed
    );
    let mut latency_us = histogram();
    for us in &run.latencies_us {
        latency_us.record((*us).max(1))?;
    }
    Ok(Figures {
        commits: run.commits,
        aborts: run.retries,
        seconds: run.commits as f64 / run.tps.max(f64::MIN_POSITIVE),
        latency_us,
    })
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let clients: Vec<usize> = parse_list(&args.clients, "client count")?;
    anyhow::ensure!(
        clients.iter().all(|&c| (1..=150).contains(&c)),
        "client counts must be in 1..=150 (PostgreSQL runs with max_connections 200)"
    );
    anyhow::ensure!(
        args.items >= 1 && args.hot_items >= 1,
        "--items and --hot-items must be positive"
    );
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(
        (1..=16).contains(&args.servers),
        "--servers must be 1 to 16"
    );
    anyhow::ensure!(args.accounts >= 2, "--accounts must be at least 2");
    let with_pg = match args.vs.as_str() {
        "postgres" => true,
        "none" => false,
        other => anyhow::bail!("--vs must be postgres or none, not {other:?}"),
    };
    let pg = if with_pg {
        let pg = Postgres::start()?;
        load_checkout(&pg, args.items, STOCK)?;
        println!(
            "PostgreSQL: {} (REPEATABLE READ, synchronous_commit off)",
            pg.version
        );
        Some(pg)
    } else {
        None
    };
    let memory_mb = 512;
    let c = LocalCluster::start_with(args.servers, 1, memory_mb, args.replicas)?;
    let tablets = (args.servers * 4) as u32;
    let items = c.create_table("items", tablets)?;
    let orders = c.create_table("orders", tablets)?;
    let accounts = c.create_table("accounts", tablets)?;
    c.load(items, args.items, |i, k, v| {
        k.extend_from_slice(&item_key(i));
        v.extend_from_slice(&STOCK.to_le_bytes());
    })?;

    println!(
        "{:>9} {:>8} | {:>11} {:>7} {:>8} {:>8} | {:>11} {:>7} {:>8} {:>8} | {:>6}",
        "workload",
        "clients",
        "insitu tx/s",
        "aborts",
        "p50 ms",
        "p99 ms",
        "pg tx/s",
        "aborts",
        "p50 ms",
        "p99 ms",
        "ratio"
    );
    let mut runs = Vec::new();
    let mut uniform_ratios = Vec::new();
    let local = tokio::task::LocalSet::new();
    for (workload, range) in [
        ("checkout", args.items),
        ("hot", args.hot_items.min(args.items)),
    ] {
        for &n in &clients {
            let ours = local.block_on(
                &c.rt,
                checkout_insitu(&c.addr, items, orders, range, n, args.seconds),
            )?;
            let theirs = match &pg {
                Some(pg) => Some(checkout_pg(pg, range, n, args.seconds)?),
                None => None,
            };
            let ratio = theirs
                .as_ref()
                .map(|t| ours.tps() / t.tps().max(f64::MIN_POSITIVE));
            if workload == "checkout"
                && let Some(r) = ratio
            {
                uniform_ratios.push(r);
            }
            let show = |f: Option<&Figures>| match f {
                Some(f) => {
                    let j = f.json();
                    format!(
                        "{:>11.0} {:>7.3} {:>8.2} {:>8.2}",
                        j["txn_per_s"].as_f64().unwrap_or(0.0),
                        j["abort_rate"].as_f64().unwrap_or(0.0),
                        j["p50_ms"].as_f64().unwrap_or(0.0),
                        j["p99_ms"].as_f64().unwrap_or(0.0)
                    )
                }
                None => format!("{:>11} {:>7} {:>8} {:>8}", "-", "-", "-", "-"),
            };
            println!(
                "{workload:>9} {n:>8} | {} | {} | {:>6}",
                show(Some(&ours)),
                show(theirs.as_ref()),
                ratio.map_or("-".to_string(), |r| format!("{r:.2}"))
            );
            runs.push(json!({
                "workload": workload,
                "items": range,
                "clients": n,
                "insitu": ours.json(),
                "postgres": theirs.as_ref().map(Figures::json),
                "tps_vs_postgres": ratio,
            }));
        }
    }
    let movers = 4;
    let bank = local.block_on(
        &c.rt,
        crate::txn_bank::run(&c.addr, accounts, args.accounts, movers, args.seconds),
    )?;
    let v = &bank.verdict;
    println!(
        "bank: {} accounts, {movers} transferring clients and 2 auditors for {} s: {} transfers, {} read-only transactions at a snapshot, \
         {} sums at a snapshot ({:.2} ms each), {} invariant violations; {} attempts checked: {} anomalies \
         (G0 {}, G1a {}, G1c {}, lost updates {}, G-single {}, G2 {})",
        args.accounts,
        args.seconds,
        bank.transfers,
        bank.audits,
        bank.snapshot_audits,
        bank.snapshot_audit_mean_ms,
        bank.violations + bank.snapshot_violations,
        bank.recorded,
        v.serializability_anomalies(),
        v.g0.len(),
        v.g1a.len(),
        v.g1c.len(),
        v.lost_updates.len(),
        v.g_single.len(),
        v.g2.len()
    );
    c.shutdown();
    drop(pg);

    let lowest = uniform_ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let report = json!({
        "workload": "checkout: read 10 items' stock (with replacement), decrement each once, write an order row",
        "items": args.items,
        "hot_items": args.hot_items,
        "seconds_per_case": args.seconds,
        "insitu_servers": args.servers,
        "insitu_replicas": args.replicas,
        "machine_cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "postgres": pg_settings(with_pg),
        "runs": runs,
        // The lowest over the uniform checkout's client counts (target >= 10).
        "checkout_tps_vs_postgres": if uniform_ratios.is_empty() { Value::Null } else { json!(lowest) },
        "bank": {
            "accounts": args.accounts,
            "transferring_clients": movers,
            "transfers": bank.transfers,
            "audits": bank.audits,
            "snapshot_audits": bank.snapshot_audits,
            "snapshot_audit_mean_ms": bank.snapshot_audit_mean_ms,
            "recorded_attempts": bank.recorded,
        },
        // Committed audits and sums at a snapshot that were not the total.
        "bank_invariant_violations": bank.violations + bank.snapshot_violations,
        // The history checker's verdict on every recorded bank attempt:
        // serializability anomalies (target 0), and by class.
        "anomalies": v.serializability_anomalies(),
        "anomalies_by_class": {
            "g0": v.g0.len(), "g1a": v.g1a.len(), "g1c": v.g1c.len(),
            "lost_update": v.lost_updates.len(), "g_single": v.g_single.len(), "g2_write_skew": v.g2.len(),
        },
    });
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(())
}

fn pg_settings(with_pg: bool) -> Value {
    if !with_pg {
        return Value::Null;
    }
    json!({
        "isolation": "repeatable read",
        "synchronous_commit": "off",
        "client": "pgbench -M prepared --max-tries=1000",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pushdown_cluster::smoke_json;

    #[test]
    fn smoke_tiny_sizes() {
        // PostgreSQL too where it is installed (the benchmark installs it
        // otherwise, which a test does not).
        let vs = if crate::txn_pg::find_bin().is_some() {
            "postgres"
        } else {
            "none"
        };
        let report = smoke_json("txn", |json| {
            run(&Args {
                vs: vs.into(),
                items: 200,
                hot_items: 20,
                clients: "2".into(),
                seconds: 0.3,
                servers: 2,
                replicas: 2,
                accounts: 10,
                json: Some(json),
            })
        })
        .unwrap();
        assert_eq!(report["bank_invariant_violations"], 0);
        assert_eq!(report["anomalies"], 0);
        assert!(report["bank"]["recorded_attempts"].as_u64().unwrap() > 0);
        assert!(report["bank"]["audits"].as_u64().unwrap() > 0);
        assert!(report["bank"]["snapshot_audits"].as_u64().unwrap() > 0);
        let runs = report["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2);
        for r in runs {
            assert!(r["insitu"]["txn_per_s"].as_f64().unwrap() > 0.0, "{r}");
            if vs == "postgres" {
                assert!(r["postgres"]["txn_per_s"].as_f64().unwrap() > 0.0, "{r}");
                assert!(r["tps_vs_postgres"].as_f64().unwrap() > 0.0);
            }
        }
    }
}
