//! `insitu bench kv --vs snapshots`: what ordering plain writes by snapshots
//! costs them. While a shard keeps versions (a snapshot read arrived within
//! the last 30 s) every plain write locks its keys, takes a timestamp from
//! the oracle and keeps the value it replaces (the server's `stamped.rs`);
//! otherwise it is applied at once. This measures the same write cases on
//! two fresh insitu pairs in the same run, one read at a snapshot by a
//! reader task every `READ_EVERY` (so its shard stamps every write), one
//! never, and reports their ratios.
//!
//! Both pairs are as `bench kv` runs insitu: one server of one shard,
//! `--replicas 0`, no tokens, pinned like it; the coordinator (the oracle)
//! shares the store's CPU, as it does there.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use crate::kv::{KvBenchArgs, Store, insitu_store, load_store, start_insitu_pair};
use crate::kv_report::{Row, median_rows, round};
use crate::kv_writes::{WriteRun, local_runtime, measure_logged, print_rows, write_ratio};
use crate::loadgen::{ACCEPT_RETRY, CaseSpec, RETRY_ANSWERS};
use std::sync::atomic::Ordering::Relaxed;

/// The write cases: 16 and 64 connections one request at a time, and 16
/// connections pipelining 16 (the oracle's round trip is shared by the
/// writes waiting together, `Client::timestamp`).
const CASES: [(usize, usize); 3] = [(16, 1), (64, 1), (16, 16)];

/// How often the reader reads at a fresh snapshot: well within the 30 s a
/// shard keeps versions after a snapshot read, so it never stops stamping.
const READ_EVERY: Duration = Duration::from_millis(250);

/// The two stores' names.
const PLAIN: &str = "insitu";
const STAMPED: &str = "insitu-snapshots";

/// Read one key of `store`'s table at a fresh snapshot every `READ_EVERY`
/// until `stop`; counts the reads in `reads`. A failed read is reported and
/// ends the bench (a store that stopped answering snapshots would measure
/// unstamped writes under the stamped name).
async fn snapshot_reader(
    coord_addr: String,
    table: u64,
    stop: Rc<Cell<bool>>,
    reads: Rc<Cell<u64>>,
) -> anyhow::Result<()> {
    let client = insitu_client::Client::connect(&coord_addr).await?;
    while !stop.get() {
        // `read_only` takes a fresh snapshot when the shard answers that
        // one is older than it can read (its first read: the floor it
        // learns as it begins keeping is newer).
        client
            .read_only(|snap| async move { snap.read(table, b"0").await })
            .await
            .context("a read at a snapshot")?;
        reads.set(reads.get() + 1);
        tokio::time::sleep(READ_EVERY).await;
    }
    Ok(())
}

/// One case; also the `Retry` answers it got (counted in its ops: a
/// client resends them).
async fn measure_counted(store: &Store, spec: &CaseSpec) -> anyhow::Result<(Row, u64)> {
    let before = RETRY_ANSWERS.load(Relaxed);
    let retries = std::cell::Cell::new(0);
    let row = measure_logged(store, spec, || {
        retries.set(RETRY_ANSWERS.load(Relaxed) - before);
        format!("  {} Retry answers", retries.get())
    })
    .await?;
    Ok((row, retries.get()))
}

pub fn run(args: &KvBenchArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(!args.tls, "--vs snapshots runs without --tls");
    let run = WriteRun::new(args, "kv-snap")?;
    let (runtime, local) = local_runtime()?;
    let spec = |i: usize, conns: usize, depth: usize| run.spec(0x5AA9, i, (conns, depth));
    let coordinator_flags = ["--no-auth", "--replicas", "0"].map(String::from);
    let server_flags = ["--no-auth".to_string()];
    let mut raw: Vec<Row> = Vec::new();
    let mut snapshot_reads = 0u64;
    // Per case, over every round: the `Retry` answers counted in its ops.
    let mut retry_answers = std::collections::BTreeMap::new();
    ACCEPT_RETRY.store(true, Relaxed);
    for round_i in 0..args.rounds.max(1) {
        let dir = run.root.join(format!("round-{round_i}"));
        let (c1, s1, plain_addr) = start_insitu_pair(
            run.store_cpu,
            &dir.join("plain"),
            run.memory_mb,
            &coordinator_flags,
            &server_flags,
        )?;
        let (c2, s2, stamped_addr) = start_insitu_pair(
            run.store_cpu,
            &dir.join("stamped"),
            run.memory_mb,
            &coordinator_flags,
            &server_flags,
        )?;
        local.block_on(&runtime, async {
            let plain = insitu_store(PLAIN, &plain_addr, s1.pid(), None).await?;
            let stamped = insitu_store(STAMPED, &stamped_addr, s2.pid(), None).await?;
            load_store(&plain, run.keys).await?;
            load_store(&stamped, run.keys).await?;
            let stop = Rc::new(Cell::new(false));
            let reads = Rc::new(Cell::new(0u64));
            let reader = tokio::task::spawn_local(snapshot_reader(
                stamped_addr.clone(),
                stamped.table,
                stop.clone(),
                reads.clone(),
            ));
            // The first read makes the shard keep versions: wait for it.
            let started = tokio::time::Instant::now();
            while reads.get() == 0 && !reader.is_finished() {
                anyhow::ensure!(
                    started.elapsed() < Duration::from_secs(10),
                    "no snapshot read was answered within 10 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut measured = Ok(());
            for (i, &(conns, depth)) in CASES.iter().enumerate() {
                let mut order = [&plain, &stamped];
                if (i + round_i) % 2 == 1 {
                    order.reverse();
                }
                for store in order {
                    match measure_counted(store, &spec(i, conns, depth)).await {
                        Ok((row, retries)) => {
                            *retry_answers.entry(row.case.clone()).or_insert(0u64) += retries;
                            raw.push(row);
                        }
                        Err(e) => measured = Err(e),
                    }
                }
                if measured.is_err() || reader.is_finished() {
                    break;
                }
            }
            stop.set(true);
            reader.await.context("the snapshot reader")??;
            snapshot_reads += reads.get();
            measured
        })?;
        drop((s2, c2, s1, c1));
    }
    let _ = std::fs::remove_dir_all(&run.root);
    let rows = median_rows(&raw);
    let ops = |r: &Row| r.ops_per_sec;
    let p99 = |r: &Row| r.p99_us;
    let mut ratios = serde_json::Map::new();
    for &(conns, depth) in &CASES {
        let suffix = match (conns, depth) {
            (c, 1) => format!("_c{c}"),
            (c, d) => format!("_c{c}_d{d}"),
        };
        ratios.insert(
            format!("stamped_write_throughput_vs_unstamped{suffix}"),
            write_ratio(&rows, (STAMPED, PLAIN), (conns, depth), ops),
        );
        ratios.insert(
            format!("stamped_write_p99_vs_unstamped{suffix}"),
            write_ratio(&rows, (STAMPED, PLAIN), (conns, depth), p99),
        );
    }
    let title = format!(
        "writes with and without snapshot reads (median of {} rounds; {snapshot_reads} snapshot reads)",
        args.rounds.max(1)
    );
    print_rows(&title, &rows, &ratios);
    let report = json!({
        "bench": "kv-snapshots",
        "config": {
            "keys": run.keys,
            "measure_seconds": round(run.measure.as_secs_f64(), 3),
            "rounds": args.rounds.max(1),
            "pinning": run.pinning,
            "insitu": "two pairs of 1 server, 1 shard, 1 tablet, --replicas 0; one read at a snapshot every 250 ms",
            "snapshot_reads": snapshot_reads,
        },
        "retry_answers": retry_answers,
        "cases": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "ratios": ratios,
    });
    if let Some(path) = &args.json {
        crate::pushdown_cluster::write_json(path, &report)?;
    }
    Ok(report)
}
