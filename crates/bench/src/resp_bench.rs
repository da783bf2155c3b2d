//! `insitu bench resp`: `redis-benchmark` (Redis's own load generator, from
//! Debian's redis-tools) with the same arguments against `redis-server` and
//! against insitu's RESP port, one core per store, in the same run.
//!
//! Each store runs pinned to one CPU (`taskset`), `redis-benchmark` on the
//! other; insitu is a coordinator and one server with one shard, in memory
//! only (`--replicas 0`) and without tokens, as Redis runs here (`--save ''
//! --appendonly no`, no password). For each `-P` (pipeline depth), in
//! `--rounds` rounds alternating the stores (the figures are medians), the
//! tests `-t set,get,incr,mset` run on both; reported per test are requests/s and
//! p50/p99 (ms) of each store and insitu's ratio. `resp_get_vs_redis` and
//! `resp_set_vs_redis` are the lower ratio over the `-P` settings.
//!
//! Then `redis-benchmark --cluster` with the same arguments against a Redis
//! Cluster of two nodes and insitu with two servers (`resp_cluster.rs`;
//! `--no-cluster` skips it): `cluster` in the JSON, and
//! `resp_cluster_get_vs_redis` / `resp_cluster_set_vs_redis`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::kv::{cpu_plan, start_insitu_pair};
use crate::kv_procs::{apt_install, start_redis};
use crate::pushdown_cluster::{parse_list, write_json};
use insitu_testkit::on_path;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Total requests per test (`redis-benchmark -n`).
    #[arg(long, default_value_t = 2_000_000)]
    pub requests: u64,
    /// Keyspace (`-r`): keys are key:000000000000 .. of this many.
    #[arg(long, default_value_t = 1_000_000)]
    pub keyspace: u64,
    /// Parallel connections (`-c`).
    #[arg(long, default_value_t = 50)]
    pub clients: u32,
    /// Pipeline depths to run (`-P`), comma-separated.
    #[arg(long, default_value = "1,16")]
    pub pipelines: String,
    /// Tests (`-t`).
    #[arg(long, default_value = "set,get,incr,mset")]
    pub tests: String,
    /// Rounds per pipeline depth, alternating the stores (Redis, insitu,
    /// Redis, ...); the figures are medians over the rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Small and fast (20,000 requests, keyspace 10,000, one round): a smoke test.
    #[arg(long)]
    pub quick: bool,
    /// Do not pin the stores and redis-benchmark to separate CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// Skip the `redis-benchmark --cluster` runs (two Redis Cluster nodes
    /// against two insitu servers).
    #[arg(long)]
    pub no_cluster: bool,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw requests/s per test and store as an SVG here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// One test's figures from redis-benchmark's CSV.
#[derive(Clone, Debug)]
pub(crate) struct Figures {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    apt_install("redis-tools", || on_path("redis-benchmark"))?;
    let pipelines: Vec<u32> = parse_list(&args.pipelines, "pipeline depth")?;
    anyhow::ensure!(
        pipelines.iter().all(|&p| p >= 1),
        "pipeline depths must be at least 1"
    );
    let (requests, keyspace) = if args.quick {
        (20_000, 10_000)
    } else {
        (args.requests, args.keyspace)
    };
    let (store_cpu, pinning) = cpu_plan(!args.no_pin);
    let dir = tempfile::tempdir()?;

    let redis_dir = dir.path().join("redis");
    std::fs::create_dir_all(&redis_dir)?;
    let redis = start_redis(store_cpu, &redis_dir, None, None)?;
    let resp_port = insitu_testkit::free_port()?;
    let role_flags: Vec<String> = vec!["--no-auth".into()];
    let mut coordinator_flags = role_flags.clone();
    coordinator_flags.extend(["--replicas".to_string(), "0".to_string()]);
    let mut server_flags = role_flags.clone();
    server_flags.extend(["--resp-port".to_string(), resp_port.to_string()]);
    let memory_mb = ((keyspace * 400) >> 20).max(512);
    let (_coordinator, _server, _) = start_insitu_pair(
        store_cpu,
        dir.path(),
        memory_mb,
        &coordinator_flags,
        &server_flags,
    )?;
    println!(
        "bench resp: redis-benchmark -n {requests} -r {keyspace} -c {} -t {}; {pinning}",
        args.clients, args.tests
    );

    let mut runs = Vec::new();
    let mut worst: std::collections::BTreeMap<String, f64> = Default::default();
    println!(
        "{:>3} {:>6} {:>14} {:>14} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "P",
        "test",
        "redis req/s",
        "insitu req/s",
        "ratio",
        "redis p50",
        "ins p50",
        "redis p99",
        "ins p99"
    );
    for &p in &pipelines {
        let base = [
            "-n".to_string(),
            requests.to_string(),
            "-r".into(),
            keyspace.to_string(),
            "-c".into(),
            args.clients.to_string(),
            "-t".into(),
            args.tests.clone(),
            "-P".into(),
            p.to_string(),
        ];
        let rounds = if args.quick { 1 } else { args.rounds.max(1) };
        let (mut theirs_all, mut ours_all) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            theirs_all.push(redis_benchmark(redis.plain.port(), &base)?);
            ours_all.push(redis_benchmark(resp_port, &base)?);
        }
        runs.push(compare("", p, &theirs_all, &ours_all, &mut worst)?);
    }
    let pick = |t: &str| worst.get(t).copied().filter(|r| r.is_finite());
    let rounds = if args.quick { 1 } else { args.rounds.max(1) };
    let cluster = if args.no_cluster {
        Value::String("not measured: --no-cluster".into())
    } else {
        drop(redis);
        crate::resp_cluster::run(
            &crate::resp_cluster::ClusterLoad {
                requests,
                keyspace,
                clients: args.clients,
                tests: &args.tests,
                pipelines: &pipelines,
                rounds,
            },
            dir.path(),
        )?
    };
    let cluster_ratio = |t: &str| cluster.get(t).cloned().unwrap_or(Value::Null);
    let report = json!({
        "rounds": if args.quick { 1 } else { args.rounds.max(1) },
        "command": format!("redis-benchmark -n {requests} -r {keyspace} -c {} -t {} -P {}", args.clients, args.tests, args.pipelines),
        "pinning": pinning,
        "insitu": "1 server, 1 shard, --replicas 0, no auth",
        "redis": "redis-server --save '' --appendonly no",
        "runs": runs,
        "resp_get_vs_redis": pick("get"),
        "resp_set_vs_redis": pick("set"),
        "resp_cluster_get_vs_redis": cluster_ratio("get_vs_redis"),
        "resp_cluster_set_vs_redis": cluster_ratio("set_vs_redis"),
        "cluster": cluster,
    });
    println!(
        "resp_get_vs_redis {:.2}, resp_set_vs_redis {:.2} (lower over -P {})",
        pick("get").unwrap_or(f64::NAN),
        pick("set").unwrap_or(f64::NAN),
        args.pipelines
    );
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, crate::resp_plot::svg(&report))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// One pipeline depth's rounds of both stores: per test the medians, a
/// printed row (`label` first) and insitu's ratio, the lowest ratio per test
/// kept in `worst`; the run's JSON.
pub(crate) fn compare(
    label: &str,
    p: u32,
    theirs_all: &[Vec<(String, Figures)>],
    ours_all: &[Vec<(String, Figures)>],
    worst: &mut std::collections::BTreeMap<String, f64>,
) -> anyhow::Result<Value> {
    let (theirs, ours) = (medians(theirs_all), medians(ours_all));
    let mut tests = serde_json::Map::new();
    for (test, r) in &theirs {
        let Some(i) = ours.iter().find(|(t, _)| t == test).map(|(_, f)| f) else {
            bail!("redis-benchmark reported {test} for Redis but not for insitu");
        };
        let ratio = i.rps / r.rps;
        let key = test.to_lowercase();
        let slot = worst.entry(key.clone()).or_insert(f64::INFINITY);
        *slot = slot.min(ratio);
        println!(
            "{label}{p:>3} {key:>6} {:>14.0} {:>14.0} {ratio:>7.2} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            r.rps, i.rps, r.p50_ms, i.p50_ms, r.p99_ms, i.p99_ms
        );
        tests.insert(
            key,
            json!({
                "redis": {"requests_per_s": r.rps, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms},
                "insitu": {"requests_per_s": i.rps, "p50_ms": i.p50_ms, "p99_ms": i.p99_ms},
                "insitu_vs_redis": ratio,
            }),
        );
    }
    Ok(json!({"pipeline": p, "tests": Value::Object(tests)}))
}

/// Per test, the median of each figure over the rounds (each figure on its
/// own: the median p99 need not come from the median round).
pub(crate) fn medians(rounds: &[Vec<(String, Figures)>]) -> Vec<(String, Figures)> {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|(test, _)| {
            let all: Vec<&Figures> = rounds
                .iter()
                .filter_map(|r| r.iter().find(|(t, _)| t == test).map(|(_, f)| f))
                .collect();
            let figures = Figures {
                rps: median(all.iter().map(|f| f.rps).collect()),
                p50_ms: median(all.iter().map(|f| f.p50_ms).collect()),
                p99_ms: median(all.iter().map(|f| f.p99_ms).collect()),
            };
            (test.clone(), figures)
        })
        .collect()
}

/// Run redis-benchmark against 127.0.0.1:`port` with `args` and `--csv`;
/// per test (as it names them, e.g. "SET", "MSET (10 keys)") the figures.
pub(crate) fn redis_benchmark(
    port: u16,
    args: &[String],
) -> anyhow::Result<Vec<(String, Figures)>> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--csv"])
        .args(args)
        .output()
        .context("cannot run redis-benchmark")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "redis-benchmark against port {port} failed ({}): {}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rows = parse_csv(&text);
    if rows.is_empty() {
        bail!(
            "redis-benchmark against port {port} printed no results: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(rows)
}

/// redis-benchmark 7's CSV: a header line, then
/// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms".
fn parse_csv(text: &str) -> Vec<(String, Figures)> {
    let mut rows = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line
            .split(',')
            .map(|c| c.trim().trim_matches('"'))
            .collect();
        if cells.len() < 7 || cells[0] == "test" {
            continue;
        }
        let num = |i: usize| cells[i].parse::<f64>().ok();
        if let (Some(rps), Some(p50), Some(p99)) = (num(1), num(4), num(6)) {
            // "MSET (10 keys)" -> "MSET".
            let name = cells[0]
                .split_whitespace()
                .next()
                .unwrap_or(cells[0])
                .to_string();
            rows.push((
                name,
                Figures {
                    rps,
                    p50_ms: p50,
                    p99_ms: p99,
                },
            ));
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    #[test]
    fn medians_per_figure() {
        let f = |rps, p99| super::Figures {
            rps,
            p50_ms: 1.0,
            p99_ms: p99,
        };
        let rounds = vec![
            vec![("GET".to_string(), f(10.0, 5.0))],
            vec![("GET".to_string(), f(30.0, 1.0))],
            vec![("GET".to_string(), f(20.0, 9.0))],
        ];
        let m = super::medians(&rounds);
        assert_eq!(m[0].1.rps, 20.0);
        assert_eq!(m[0].1.p99_ms, 5.0);
    }

    #[test]
    fn reads_redis_benchmark_csv() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"SET\",\"100000.00\",\"0.3\",\"0.1\",\"0.287\",\"0.4\",\"0.551\",\"2.0\"\n\"MSET (10 keys)\",\"50000.00\",\"0.9\",\"0.1\",\"0.8\",\"1.0\",\"1.5\",\"3.0\"\n";
        let rows = super::parse_csv(text);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].0, "SET");
        assert_eq!(rows[1].0, "MSET");
        assert_eq!(rows[0].1.rps, 100000.0);
        assert_eq!(rows[0].1.p99_ms, 0.551);
    }
}
