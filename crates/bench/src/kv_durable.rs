//! `insitu bench kv --vs redis-aof`: writes with durability on, against Redis
//! with its append-only file, one store per core as in `bench kv`.
//!
//! Two pairings, each a fresh insitu (coordinator `--replicas 1`: the one
//! server's backup keeps the replica on its own disk) and a fresh Redis
//! (`appendonly yes`):
//! - insitu's default `--sync interval` (acknowledged in the backup's memory,
//!   on disk within 1 s) against `appendfsync everysec` (in the AOF buffer,
//!   fsynced about every second): the same promise;
//! - `--sync always` (the backup fsyncs before the acknowledgement, one fsync
//!   per round of writes) against `appendfsync always`.
//!
//! And insitu with `--replicas 0` (in memory only), for the cost of
//! durability against insitu itself.

use serde_json::{Value, json};

use crate::kv::{KvBenchArgs, Store, insitu_store, load_store, start_insitu_pair};
use crate::kv_procs::start_redis;
use crate::kv_report::{Row, median_rows, round};
use crate::kv_writes::{WriteRun, local_runtime, measure_logged, print_rows, write_ratio};

/// The write cases: 16 and 64 connections one request at a time, and 16
/// connections pipelining 16 (where group commit matters most).
const CASES: [(usize, usize); 3] = [(16, 1), (64, 1), (16, 16)];

/// (insitu `--sync`, Redis `appendfsync`, label).
const PAIRS: [(&str, &str, &str); 2] = [
    ("interval", "everysec", "interval"),
    ("always", "always", "always"),
];

pub fn run(args: &KvBenchArgs) -> anyhow::Result<Value> {
    let run = WriteRun::new(args, "kv-aof")?;
    let (runtime, local) = local_runtime()?;
    let spec = |i: usize, conns: usize, depth: usize| run.spec(0xA0F, i, (conns, depth));

    let mut raw: Vec<Row> = Vec::new();
    for round_i in 0..args.rounds.max(1) {
        for (pair_i, (sync, appendfsync, label)) in PAIRS.iter().enumerate() {
            let dir = run.root.join(format!("{label}-{round_i}"));
            std::fs::create_dir_all(&dir)?;
            let (coordinator, server, coord_addr) = start_insitu_pair(
                run.store_cpu,
                &dir,
                run.memory_mb,
                &["--replicas".into(), "1".into()],
                &["--sync".into(), sync.to_string()],
            )?;
            let redis_dir = dir.join("redis");
            std::fs::create_dir_all(&redis_dir)?;
            let started = start_redis(run.store_cpu, &redis_dir, Some(appendfsync), None)?;
            let (redis, redis_addr) = (started.proc, started.plain);
            let insitu_name: &'static str = if *label == "interval" {
                "insitu-interval"
            } else {
                "insitu-always"
            };
            let redis_name: &'static str = if *label == "interval" {
                "redis-everysec"
            } else {
                "redis-always"
            };
            local.block_on(&runtime, async {
                let insitu = insitu_store(insitu_name, &coord_addr, server.pid(), None).await?;
                let redis_store = Store {
                    name: redis_name,
                    pid: redis.pid(),
                    addr: redis_addr,
                    table: 0,
                    tls: None,
                };
                load_store(&insitu, run.keys).await?;
                load_store(&redis_store, run.keys).await?;
                for (i, &(conns, depth)) in CASES.iter().enumerate() {
                    let mut order = [&insitu, &redis_store];
                    if (i + pair_i + round_i) % 2 == 1 {
                        order.reverse();
                    }
                    for store in order {
                        raw.push(measure_logged(store, &spec(i, conns, depth), String::new).await?);
                    }
                }
                anyhow::Ok(())
            })?;
            drop((redis, server, coordinator));
        }
        // insitu in memory only: what durability costs insitu itself.
        let dir = run.root.join(format!("r0-{round_i}"));
        std::fs::create_dir_all(&dir)?;
        let (coordinator, server, coord_addr) = start_insitu_pair(
            run.store_cpu,
            &dir,
            run.memory_mb,
            &["--replicas".into(), "0".into()],
            &[],
        )?;
        local.block_on(&runtime, async {
            let insitu = insitu_store("insitu-r0", &coord_addr, server.pid(), None).await?;
            load_store(&insitu, run.keys).await?;
            for (i, &(conns, depth)) in CASES.iter().enumerate() {
                raw.push(measure_logged(&insitu, &spec(i, conns, depth), String::new).await?);
            }
            anyhow::Ok(())
        })?;
        drop((server, coordinator));
    }
    let _ = std::fs::remove_dir_all(&run.root);
    let rows = median_rows(&raw);

    let ops = |r: &Row| r.ops_per_sec;
    let p99 = |r: &Row| r.p99_us;
    let mut ratios = serde_json::Map::new();
    for (_, _, label) in PAIRS {
        let (ours, theirs) = match label {
            "interval" => ("insitu-interval", "redis-everysec"),
            _ => ("insitu-always", "redis-always"),
        };
        for &(conns, depth) in &CASES {
            let suffix = match (conns, depth) {
                (16, 1) => String::new(),
                (c, 1) => format!("_c{c}"),
                (c, d) => format!("_c{c}_d{d}"),
            };
            ratios.insert(
                format!("durable_write_throughput_vs_redis_aof_{label}{suffix}"),
                write_ratio(&rows, (ours, theirs), (conns, depth), ops),
            );
            ratios.insert(
                format!("durable_write_p99_vs_redis_aof_{label}{suffix}"),
                write_ratio(&rows, (ours, theirs), (conns, depth), p99),
            );
            ratios.insert(
                format!("durable_write_throughput_vs_insitu_r0_{label}{suffix}"),
                write_ratio(&rows, (ours, "insitu-r0"), (conns, depth), ops),
            );
        }
    }
    let title = format!("writes, durable (median of {} rounds)", args.rounds.max(1));
    print_rows(&title, &rows, &ratios);
    let report = json!({
        "bench": "kv-durable",
        "config": {
            "keys": run.keys,
            "measure_seconds": round(run.measure.as_secs_f64(), 3),
            "rounds": args.rounds.max(1),
            "pinning": run.pinning,
            "insitu": "1 server, 1 shard, 1 tablet, --replicas 1 (its own backup, on its disk)",
            "pairs": "insitu --sync interval vs appendfsync everysec; --sync always vs appendfsync always",
        },
        "cases": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "ratios": ratios,
    });
    if let Some(path) = &args.json {
        crate::pushdown_cluster::write_json(path, &report)?;
    }
    Ok(report)
}
