//! What the write-only `bench kv` variants share (`--vs redis-aof`,
//! `kv_durable.rs`; `--vs snapshots`, `kv_stamped.rs`): their sizes and
//! timings, a scratch directory, the CPU plan, and a case with its
//! progress line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::kv::{KvBenchArgs, Store, cpu_plan, measure_case};
use crate::kv_report::{Row, case_name, find, ratio};
use crate::loadgen::{CaseSpec, Mix};

/// One write-only run's settings.
pub(crate) struct WriteRun {
    pub keys: u64,
    pub measure: Duration,
    pub warmup: Duration,
    /// Where the stores run (None: not pinned) and how that was decided.
    pub store_cpu: Option<usize>,
    pub pinning: String,
    /// A fresh scratch directory for the stores' files.
    pub root: PathBuf,
    /// Each store's memory: room for the objects several times over.
    pub memory_mb: u64,
}

impl WriteRun {
    /// `args`' sizes (5,000 keys with `--quick`, else 200,000) and a fresh
    /// directory named after `tag` and this process.
    pub fn new(args: &KvBenchArgs, tag: &str) -> anyhow::Result<WriteRun> {
        let keys = args
            .keys
            .unwrap_or(if args.quick { 5_000 } else { 200_000 });
        anyhow::ensure!(keys >= 100, "--keys must be at least 100");
        let measure =
            Duration::from_secs_f64(args.seconds.unwrap_or(if args.quick { 0.3 } else { 2.0 }));
        let warmup = Duration::from_millis(if args.quick { 100 } else { 500 });
        let (store_cpu, pinning) = cpu_plan(args.pin);
        let root = std::env::temp_dir().join(format!("insitu-bench-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot create {}", root.display()))?;
        Ok(WriteRun {
            keys,
            measure,
            warmup,
            store_cpu,
            pinning,
            root,
            memory_mb: ((keys * 1000) >> 20).max(256),
        })
    }

    /// The `i`th write case: `conns` connections, `depth` requests in flight each.
    pub fn spec(&self, seed: u64, i: usize, (conns, depth): (usize, usize)) -> CaseSpec {
        CaseSpec {
            mix: Mix::Write,
            conns,
            depth,
            warmup: self.warmup,
            measure: self.measure,
            keys: self.keys,
            seed: seed ^ i as u64,
        }
    }
}

/// One case, with a progress line on stderr (`note`: appended to it).
pub(crate) async fn measure_logged(
    store: &Store,
    spec: &CaseSpec,
    note: impl FnOnce() -> String,
) -> anyhow::Result<Row> {
    let row = measure_case(store, spec).await?;
    eprintln!(
        "  {:<18} {:<22} {:>10.0} ops/s  p99 {:>8.1} us{}",
        row.store,
        row.case,
        row.ops_per_sec,
        row.p99_us,
        note()
    );
    Ok(row)
}

/// The rows (medians) under `title`, then the ratios, on stdout.
pub(crate) fn print_rows(
    title: &str,
    rows: &[Row],
    ratios: &serde_json::Map<String, serde_json::Value>,
) {
    println!("\n{title}:");
    for r in rows {
        println!(
            "  {:<18} {:<20} {:>10.0} ops/s  p50 {:>7.1} us  p99 {:>8.1} us",
            r.store,
            case_name(r.mix, r.conns, r.depth, r.store),
            r.ops_per_sec,
            r.p50_us,
            r.p99_us
        );
    }
    println!("\nratios:");
    for (k, v) in ratios {
        println!("  {k:<56} {v}");
    }
}

/// A current-thread runtime and the `LocalSet` the load generator spawns
/// its connections on.
pub(crate) fn local_runtime() -> anyhow::Result<(tokio::runtime::Runtime, tokio::task::LocalSet)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok((runtime, tokio::task::LocalSet::new()))
}

/// The ratio of one write case's figure (`f` of its row) between two stores
/// of `rows` (JSON null where either row is missing or the divisor is 0).
pub(crate) fn write_ratio(
    rows: &[Row],
    (ours, theirs): (&str, &str),
    (conns, depth): (usize, usize),
    f: fn(&Row) -> f64,
) -> serde_json::Value {
    let get = |store: &str| find(rows, store, Mix::Write, conns, depth).map(f);
    ratio(get(ours), get(theirs))
}
