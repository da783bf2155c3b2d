//! `insitu bench interference`: how much a long data operation delays point
//! reads on the same shard.
//!
//! An in-process cluster of two servers of one shard each; one table of one
//! tablet (so every operation and every read meets on one shard), N objects
//! (8-byte integer keys, 16-byte values with an i64 at offset 0). A reader
//! thread (its own runtime and client, one read in flight) reads random keys
//! the whole time; its latencies are recorded per phase: idle, then while
//! each of count, aggregate, update, enumerate (a table cursor) and a tablet
//! move (back and forth between the two servers) runs, each repeated for
//! `--seconds-per-op`. Reported: read p50/p99 per phase, in microseconds.
//! Target: p99 <= 5,000 us during any operation at 1M objects.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use insitu_client::{Client, Selection};
use insitu_protocol::Number;
use insitu_protocol::plan::{Field, UpdateAction, int_key};
use serde_json::json;

use crate::pushdown_cluster::{LocalCluster, write_json};

/// The operations measured, in order; `read_p99_us_during_<name>` in the JSON.
pub const OPS: [&str; 5] = ["count", "aggregate", "update", "enumerate", "move"];
/// The goal for the p99 of a read during any operation, at 1M objects.
const TARGET_P99_US: u64 = 5_000;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[arg(long, default_value_t = 1_000_000)]
    pub objects: u64,
    /// How long each phase (idle, and each operation, repeated) lasts.
    #[arg(long, default_value_t = 3.0)]
    pub seconds_per_op: f64,
    /// Replicas per segment (R; 0: in memory only, where no reply waits
    /// for a backup). Default: the coordinator's (2, or as many backups as
    /// there are).
    #[arg(long)]
    pub replicas: Option<u32>,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Phase index: 0 idle, 1 + i during `OPS[i]`, `BETWEEN` for nothing recorded.
const BETWEEN: usize = usize::MAX;

/// Reads random keys until `stop`, recording each latency under the phase it
/// started and ended in (reads spanning a phase change are dropped).
fn reader(
    addr: String,
    table: u64,
    n: u64,
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<Histogram<u64>>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut hists = (0..=OPS.len())
        .map(|_| Histogram::<u64>::new_with_bounds(1, 60_000_000, 3))
        .collect::<Result<Vec<_>, _>>()?;
    rt.block_on(async {
        let client = Client::connect(&addr).await?;
        let mut rng = insitu_testkit::rng(0x9E37_79B9_7F4A_7C15);
        while !stop.load(Ordering::Relaxed) {
            let key = int_key(rng.u64(0..n));
            let before = phase.load(Ordering::Acquire);
            let t = Instant::now();
            let found = client.read(table, key).await?;
            let us = t.elapsed().as_micros() as u64;
            let len = found.map(|(value, _)| value.len());
            anyhow::ensure!(len == Some(16), "read {len:?} bytes, expected 16");
            if before != BETWEEN && phase.load(Ordering::Acquire) == before {
                hists[before].saturating_record(us.max(1));
            }
        }
        anyhow::Ok(())
    })?;
    Ok(hists)
}

/// Run `op` once, as the phase's operation.
fn run_op(
    c: &LocalCluster,
    table: u64,
    name: &str,
    servers: &[u64],
    moves: &mut usize,
) -> anyhow::Result<()> {
    let client = &c.client;
    c.rt.block_on(async {
        match name {
            "count" => {
                client.count(table, &Selection::all()).await?;
            }
            "aggregate" => {
                client
                    .aggregate(table, Field::I64(0), &Selection::all())
                    .await?;
            }
            "update" => {
                client
                    .update(
                        table,
                        Field::I64(0),
                        UpdateAction::Add(Number::I64(1)),
                        &Selection::all(),
                    )
                    .await?;
            }
            "enumerate" => {
                let mut cursor = client.enumerate(table);
                while cursor.next_batch().await?.is_some() {}
            }
            "move" => {
                // Back and forth between the two servers.
                let dest = servers[(*moves + 1) % servers.len()];
                client.move_tablet("interference", 0, dest).await?;
                *moves += 1;
            }
            other => anyhow::bail!("unknown operation {other}"),
        }
        anyhow::Ok(())
    })
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.objects > 0, "--objects must be positive");
    anyhow::ensure!(
        args.seconds_per_op > 0.0 && args.seconds_per_op <= 600.0,
        "--seconds-per-op must be in (0, 600]"
    );
    let n = args.objects;
    let window = Duration::from_secs_f64(args.seconds_per_op);
    let memory_mb = ((n * 200) >> 20) as usize + 256;
    let replicas = args.replicas.unwrap_or_else(LocalCluster::default_replicas);
    let c = LocalCluster::start_with(2, 1, memory_mb, replicas)?;
    let table = c.create_table("interference", 1)?;
    let load = c.load(table, n, |i, key, v| {
        key.extend_from_slice(&int_key(i));
        v.extend_from_slice(&(i as i64).to_le_bytes());
        v.extend_from_slice(&[0u8; 8]);
    })?;
    eprintln!("loaded {n} objects in {:.1} s", load.as_secs_f64());
    // The server holding the tablet first, then the other one.
    let mut servers: Vec<u64> =
        c.rt.block_on(c.client.list_servers())?
            .iter()
            .map(|s| s.id)
            .collect();
    servers.sort_unstable();

    let phase = Arc::new(AtomicUsize::new(BETWEEN));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (addr, phase, stop) = (c.addr.clone(), phase.clone(), stop.clone());
        std::thread::spawn(move || reader(addr, table, n, phase, stop))
    };
    let mut runs = vec![0u64; OPS.len() + 1];
    let mut op_ms = vec![0f64; OPS.len() + 1];
    let mut moves = 0usize;
    let mut outcome = Ok(());
    for p in 0..=OPS.len() {
        phase.store(p, Ordering::Release);
        eprintln!("phase: {}", if p == 0 { "idle" } else { OPS[p - 1] });
        let started = Instant::now();
        if p == 0 {
            // On the cluster's runtime: the coordinator must keep answering.
            c.rt.block_on(async { tokio::time::sleep(window).await });
        } else {
            let name = OPS[p - 1];
            while runs[p] == 0 || started.elapsed() < window {
                let t = Instant::now();
                if let Err(e) = run_op(&c, table, name, &servers, &mut moves) {
                    outcome = Err(e.context(format!("during the {name} phase")));
                    break;
                }
                op_ms[p] += t.elapsed().as_secs_f64() * 1e3;
                runs[p] += 1;
            }
        }
        phase.store(BETWEEN, Ordering::Release);
        if outcome.is_err() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    // Keep the coordinator (on this runtime) answering until the reader is
    // done: its last read may need a fresh tablet map after a move.
    c.rt.block_on(async {
        while !reader.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let hists = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the reader thread panicked"))??;
    c.shutdown();
    outcome?;

    let mut out = serde_json::Map::new();
    out.insert("objects".into(), json!(n));
    out.insert("seconds_per_op".into(), json!(args.seconds_per_op));
    out.insert("target_read_p99_us".into(), json!(TARGET_P99_US));
    out.insert("replicas".into(), json!(replicas));
    println!(
        "{:>12} {:>10} {:>10} {:>10} {:>8} {:>12}",
        "phase", "reads", "p50 us", "p99 us", "op runs", "op mean ms"
    );
    for (p, h) in hists.iter().enumerate() {
        let name = if p == 0 { "idle" } else { OPS[p - 1] };
        let key = if p == 0 {
            "idle".to_string()
        } else {
            format!("during_{name}")
        };
        let (p50, p99) = (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
        out.insert(format!("read_p50_us_{key}"), json!(p50));
        out.insert(format!("read_p99_us_{key}"), json!(p99));
        out.insert(format!("read_max_us_{key}"), json!(h.max()));
        out.insert(format!("reads_{key}"), json!(h.len()));
        let mean_ms = if runs[p] > 0 {
            op_ms[p] / runs[p] as f64
        } else {
            0.0
        };
        if p > 0 {
            out.insert(format!("op_runs_{name}"), json!(runs[p]));
            out.insert(format!("op_mean_ms_{name}"), json!(mean_ms));
        }
        println!(
            "{name:>12} {:>10} {p50:>10} {p99:>10} {:>8} {mean_ms:>12.1}",
            h.len(),
            runs[p]
        );
    }
    out.insert(
        "cores".into(),
        json!(
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        ),
    );
    if let Some(path) = &args.json {
        write_json(path, &serde_json::Value::Object(out))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke_tiny_sizes() {
        let v = crate::pushdown_cluster::smoke_json("interference", |path| {
            run(&Args {
                objects: 2000,
                seconds_per_op: 0.1,
                replicas: None,
                json: Some(path),
            })
        })
        .unwrap();
        assert!(v["read_p99_us_idle"].as_u64().is_some());
        for op in OPS {
            assert!(
                v[format!("read_p99_us_during_{op}")].as_u64().is_some(),
                "{op}"
            );
            assert!(v[format!("op_runs_{op}")].as_u64().unwrap() >= 1, "{op}");
        }
    }
}
