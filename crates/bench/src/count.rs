//! `insitu bench count`: the seed's count experiment (002) — counting 1 KB
//! objects with a count sent to every tablet — on 1, 2, 4 servers.
//!
//! For each server count k: a fresh in-process cluster of k servers (one
//! shard each), one table of k tablets, N objects (8-byte integer keys,
//! `--value-bytes` values). The count runs by log traversal (no predicate, so
//! every entry header is visited) and is checked against N. Reported: total
//! ms (client-observed, best of `--repeats`), ns per object, ns per object
//! per server (total time x servers / objects), and the servers' own scan
//! time per object. Then the floor: a count of a one-object table on the
//! same loaded servers (RAMCloud's count scanned the whole hash table: a
//! fixed 350 ms floor; here a scan touches only the table's own tablets).

use std::path::PathBuf;
use std::time::Instant;

use insitu_client::Selection;
use insitu_protocol::plan::{Op, Partial, ScanPlan, int_key};
use serde_json::json;

use crate::pushdown_cluster::{LocalCluster, parse_list};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[arg(long, default_value_t = 1_000_000)]
    pub objects: u64,
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// Server counts (comma-separated).
    #[arg(long, default_value = "1,2,4")]
    pub servers: String,
    #[arg(long, default_value_t = 5)]
    pub repeats: u32,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let servers: Vec<usize> = parse_list(&args.servers, "server count")?;
    anyhow::ensure!(
        servers.iter().all(|&s| (1..=64).contains(&s)),
        "server counts must be in 1..=64"
    );
    anyhow::ensure!(args.objects > 0, "--objects must be positive");
    let n = args.objects;
    let mut rows = Vec::new();
    println!(
        "{:>8} {:>12} {:>12} {:>16} {:>18} {:>14}",
        "servers", "total ms", "ns/object", "ns/object/server", "server ns/object", "floor ms"
    );
    for &k in &servers {
        let per_server = n.div_ceil(k as u64);
        let memory_mb =
            ((per_server * (args.value_bytes as u64 + 120)) >> 20) as usize * 3 / 2 + 256;
        let c = LocalCluster::start(k, 1, memory_mb)?;
        let table = c.create_table("count", k as u32)?;
        let tiny = c.create_table("tiny", k as u32)?;
        let vb = args.value_bytes;
        let load = c.load(table, n, |i, key, v| {
            key.extend_from_slice(&int_key(i));
            v.resize(vb, (i % 251) as u8);
        })?;
        c.load(tiny, 1, |i, key, v| {
            key.extend_from_slice(&int_key(i));
            v.push(1);
        })?;
        eprintln!(
            "  {k} servers: loaded {n} objects in {:.1} s",
            load.as_secs_f64()
        );
        let plan = ScanPlan::new(Op::Count);
        let (mut best, mut best_server_ns_per_obj) = (f64::MAX, f64::MAX);
        for _ in 0..args.repeats.max(1) {
            let t = Instant::now();
            let out = c.rt.block_on(c.client.execute_plan(table, &plan))?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            anyhow::ensure!(
                out.partial == Partial::Count(n),
                "count {:?}, expected {n}",
                out.partial
            );
            best = best.min(ms);
            // The slowest tablet's own scan time over its share of objects.
            let server_ns = out.max_server_time.as_nanos() as f64 / (n as f64 / k as f64);
            best_server_ns_per_obj = best_server_ns_per_obj.min(server_ns);
        }
        let mut floor = f64::MAX;
        for _ in 0..args.repeats.max(1) {
            let t = Instant::now();
            let got = c.rt.block_on(c.client.count(tiny, &Selection::all()))?;
            anyhow::ensure!(got == 1, "tiny count {got}");
            floor = floor.min(t.elapsed().as_secs_f64() * 1e3);
        }
        c.shutdown();
        let ns_obj = best * 1e6 / n as f64;
        let row = json!({
            "servers": k, "objects": n, "value_bytes": vb,
            "total_ms": best, "ns_per_object": ns_obj,
            "ns_per_object_per_server": ns_obj * k as f64,
            "server_scan_ns_per_object": best_server_ns_per_obj,
            "floor_ms_one_object_table": floor,
        });
        println!(
            "{k:>8} {best:>12.2} {ns_obj:>12.2} {:>16.2} {best_server_ns_per_obj:>18.2} {floor:>14.3}",
            ns_obj * k as f64
        );
        rows.push(row);
    }
    println!("(the seed: 235 ns per 1 KB object, and a 350 ms floor for 32 M hash buckets)");
    crate::json_report::write_if_asked(
        args.json.as_deref(),
        || json!({"rows": rows, "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke_tiny_sizes() {
        let v = crate::pushdown_cluster::smoke_json("count", |path| {
            run(&Args {
                objects: 500,
                value_bytes: 64,
                servers: "1,2".into(),
                repeats: 1,
                json: Some(path),
            })
        })
        .unwrap();
        assert_eq!(v["rows"].as_array().unwrap().len(), 2);
    }
}
