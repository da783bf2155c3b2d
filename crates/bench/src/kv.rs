//! `insitu bench kv --vs redis`: point operations side by side with Redis.
//!
//! Set-up (all on loopback, 127.0.0.1 only):
//! - a Redis server (`--save '' --appendonly no`, one event-loop thread) and
//!   an insitu cluster of one coordinator and ONE server with ONE shard, each
//!   a child process (`insitu coordinator`, `insitu server --shards 1`, both
//!   re-executing this binary);
//! - on a machine with >= 2 usable CPUs the stores are pinned with `taskset`
//!   to the first CPU and this process (the load generator) to the second, so
//!   each store gets exactly one core and never competes with its client;
//! - both are driven by the same load generator (`loadgen`): same
//!   connections, same closed loop, same pipelining; only the encoding of a
//!   request differs (RESP vs `insitu_protocol`).
//!
//! Both stores are loaded with the same keys (MSET / multiWrite batches),
//! memory per object is measured right after the load, then every case runs
//! against Redis and insitu back to back (alternating which goes first), so
//! machine noise hits both alike. Each case runs for a fixed time and stops.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};

use crate::loadgen::{self, CaseResult, CaseSpec, InsituWire, Mix, RedisWire};
use crate::resp;
use insitu_testkit::{Proc, on_path};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Versus {
    Redis,
    /// insitu alone (used when Redis is unavailable, e.g. the CI smoke test).
    Nothing,
}

#[derive(Clone, Debug)]
pub struct KvBenchArgs {
    pub versus: Versus,
    pub json: Option<PathBuf>,
    /// Also draw the latency percentiles as an SVG here.
    pub plot: Option<PathBuf>,
    /// Small and fast: for a CI smoke test.
    pub quick: bool,
    /// Override the number of keys loaded.
    pub keys: Option<u64>,
    /// Override the measured seconds per case.
    pub seconds: Option<f64>,
    /// Pin stores and load generator to separate CPUs (when there are two).
    pub pin: bool,
    /// Run only the cases whose name contains one of these (e.g. "write c16").
    pub only: Vec<String>,
    /// Rounds over every case; each figure is the median over the rounds.
    pub rounds: usize,
}

impl Default for KvBenchArgs {
    fn default() -> Self {
        KvBenchArgs {
            versus: Versus::Redis,
            json: None,
            plot: None,
            quick: false,
            keys: None,
            seconds: None,
            pin: true,
            only: Vec::new(),
            rounds: 1,
        }
    }
}

/// Percentiles stored per case (and drawn in the plot).
const CURVE: [f64; 9] = [50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99];

// ---- child processes ---------------------------------------------------------

fn tracing_note(msg: &str) {
    eprintln!("bench kv: {msg}");
}

/// `program args`, prefixed by `taskset -c CPU` when pinning.
fn command(cpu: Option<usize>, program: &Path, args: &[String]) -> Command {
    match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(program).args(args);
            c
        }
        None => {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
    }
}

/// Start an insitu role and wait for the stdout line that starts with `ready`.
fn start_insitu(
    name: &'static str,
    cpu: Option<usize>,
    args: &[String],
    ready: &str,
) -> anyhow::Result<(Proc, String)> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let mut cmd = command(cpu, &exe, args);
    cmd.env("INSITU_LOG", "warn");
    let ready = ready.to_string();
    Proc::spawn(cmd, &format!("insitu {name}"), move |l| {
        l.starts_with(&ready)
    })
}

/// CPUs this process may run on (from /proc/self/status).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(list) = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
    else {
        return Vec::new();
    };
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let mut ends = part.split('-').map(|x| x.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => cpus.push(a),
            (Some(Ok(a)), Some(Ok(b))) => cpus.extend(a..=b),
            _ => {}
        }
    }
    cpus
}

/// Pin every thread of this process to `cpu`.
fn pin_self(cpu: usize) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args([
            "-a",
            "-p",
            "-c",
            &cpu.to_string(),
            &std::process::id().to_string(),
        ])
        .stdout(Stdio::null())
        .status()
        .context("cannot run taskset")?;
    anyhow::ensure!(status.success(), "taskset failed: {status}");
    Ok(())
}

/// Nanoseconds of CPU every thread of `pid` has used (from schedstat).
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Resident set size of `pid`, bytes.
fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| anyhow!("no VmRSS for pid {pid}"))?;
    Ok(kb * 1024)
}

// ---- Redis --------------------------------------------------------------------

fn ensure_redis_installed() -> anyhow::Result<()> {
    if on_path("redis-server") {
        return Ok(());
    }
    tracing_note("redis-server not found; installing it with apt-get");
    let ok = Command::new("sh")
        .args([
            "-c",
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server",
        ])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok || !on_path("redis-server") {
        bail!("redis-server is not installed and apt-get could not install it");
    }
    Ok(())
}

/// One blocking RESP call (set-up and INFO only, never in a timed case).
fn redis_call(addr: SocketAddr, args: &[&[u8]]) -> anyhow::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut out: Vec<u8> = Vec::new();
    resp::command(&mut out, args);
    s.write_all(&out)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some((reply, _)) = resp::parse(&buf)? {
            return Ok(match reply {
                resp::Reply::Bulk(b) | resp::Reply::Simple(b) => b.to_vec(),
                other => format!("{other:?}").into_bytes(),
            });
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            bail!("redis closed the connection");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn redis_info_field(addr: SocketAddr, section: &str, field: &str) -> anyhow::Result<String> {
    let info = redis_call(addr, &[b"INFO", section.as_bytes()])?;
    let info = String::from_utf8_lossy(&info);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| anyhow!("redis INFO {section} has no {field}"))
}

fn start_redis(cpu: Option<usize>, dir: &Path) -> anyhow::Result<(Proc, SocketAddr)> {
    ensure_redis_installed()?;
    let port = insitu_testkit::free_port()?;
    let args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
        "--dir",
        &dir.display().to_string(),
        "--logfile",
        "redis.log",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let child = command(cpu, Path::new("redis-server"), &args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start redis-server")?;
    let proc = Proc {
        child,
        name: "redis-server".to_string(),
    };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match redis_call(addr, &[b"PING"]) {
            Ok(r) if r == b"PONG" => return Ok((proc, addr)),
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => bail!("redis-server did not answer PING: {other:?}"),
        }
    }
}

// ---- the run --------------------------------------------------------------------

struct Store {
    name: &'static str,
    pid: u32,
    addr: SocketAddr,
    table: u64,
}

#[derive(Clone, Debug)]
struct Row {
    case: String,
    store: &'static str,
    mix: Mix,
    conns: usize,
    depth: usize,
    ops_per_sec: f64,
    objects_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    server_cpu_util: f64,
    server_cpu_us_per_op: f64,
    /// CPU the load generator (this process) used, as a fraction of one core.
    client_cpu_util: f64,
    curve: Vec<(f64, f64)>,
    /// Per-round ops/s and p99 (us) behind the medians.
    ops_rounds: Vec<f64>,
    p99_rounds: Vec<f64>,
}

impl Row {
    fn json(&self) -> Value {
        json!({
            "case": self.case,
            "store": self.store,
            "op": mix_name(self.mix),
            "conns": self.conns,
            "depth": self.depth,
            "keys_per_op": self.mix.objects_per_op(),
            "ops_per_sec": round(self.ops_per_sec, 1),
            "objects_per_sec": round(self.objects_per_sec, 1),
            "p50_us": round(self.p50_us, 2),
            "p99_us": round(self.p99_us, 2),
            "p999_us": round(self.p999_us, 2),
            "server_cpu_util": round(self.server_cpu_util, 3),
            "server_cpu_us_per_op": round(self.server_cpu_us_per_op, 3),
            "client_cpu_util": round(self.client_cpu_util, 3),
            "latency_percentiles_us": self.curve.iter().map(|(q, us)| json!([q, round(*us, 2)])).collect::<Vec<_>>(),
            "ops_per_sec_rounds": self.ops_rounds.iter().map(|x| round(*x, 0)).collect::<Vec<_>>(),
            "p99_us_rounds": self.p99_rounds.iter().map(|x| round(*x, 1)).collect::<Vec<_>>(),
        })
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

fn mix_name(mix: Mix) -> String {
    match mix {
        Mix::Read => "read".into(),
        Mix::Write => "write".into(),
        Mix::Mixed { write_pct } => format!("mix{}/{}", 100 - write_pct, write_pct),
        Mix::MultiRead(n) => format!("multiread{n}"),
    }
}

fn case_name(mix: Mix, conns: usize, depth: usize, store: &str) -> String {
    let op = match (mix, store) {
        (Mix::MultiRead(n), "redis") => format!("mget{n}"),
        (m, _) => mix_name(m),
    };
    format!("{op} c{conns} d{depth}")
}

async fn run_one(store: &Store, spec: &CaseSpec) -> anyhow::Result<CaseResult> {
    if store.name == "redis" {
        loadgen::run_case(store.addr, RedisWire::default, spec).await
    } else {
        let table = store.table;
        loadgen::run_case(store.addr, move || InsituWire::new(table), spec).await
    }
}

async fn measure_case(store: &Store, spec: &CaseSpec) -> anyhow::Result<Row> {
    let cpu0 = cpu_ns(store.pid);
    let client0 = cpu_ns(std::process::id());
    let t0 = Instant::now();
    let r = run_one(store, spec)
        .await
        .with_context(|| format!("{} {:?}", store.name, spec.mix))?;
    let wall = t0.elapsed().as_secs_f64();
    let util = (cpu_ns(store.pid) - cpu0) as f64 / 1e9 / wall;
    let client_util = (cpu_ns(std::process::id()) - client0) as f64 / 1e9 / wall;
    let ops = r.ops_per_sec();
    Ok(Row {
        case: case_name(spec.mix, spec.conns, spec.depth, store.name),
        store: store.name,
        mix: spec.mix,
        conns: spec.conns,
        depth: spec.depth,
        ops_per_sec: ops,
        objects_per_sec: r.objects_per_sec(),
        p50_us: r.latency_us(50.0),
        p99_us: r.latency_us(99.0),
        p999_us: r.latency_us(99.9),
        server_cpu_util: util,
        server_cpu_us_per_op: if ops > 0.0 { util / ops * 1e6 } else { 0.0 },
        client_cpu_util: client_util,
        curve: CURVE.iter().map(|&q| (q, r.latency_us(q))).collect(),
        ops_rounds: vec![ops],
        p99_rounds: vec![r.latency_us(99.0)],
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// One row per (store, case): every figure the median over its rounds.
fn median_rows(raw: &[Row]) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    for r in raw {
        if out.iter().any(|o| o.store == r.store && o.case == r.case) {
            continue;
        }
        let same: Vec<&Row> = raw
            .iter()
            .filter(|o| o.store == r.store && o.case == r.case)
            .collect();
        let m = |f: fn(&Row) -> f64| median(same.iter().map(|x| f(x)).collect());
        out.push(Row {
            ops_per_sec: m(|x| x.ops_per_sec),
            objects_per_sec: m(|x| x.objects_per_sec),
            p50_us: m(|x| x.p50_us),
            p99_us: m(|x| x.p99_us),
            p999_us: m(|x| x.p999_us),
            server_cpu_util: m(|x| x.server_cpu_util),
            server_cpu_us_per_op: m(|x| x.server_cpu_us_per_op),
            client_cpu_util: m(|x| x.client_cpu_util),
            curve: (0..r.curve.len())
                .map(|i| {
                    (
                        r.curve[i].0,
                        median(same.iter().map(|x| x.curve[i].1).collect()),
                    )
                })
                .collect(),
            ops_rounds: same.iter().map(|x| x.ops_per_sec).collect(),
            p99_rounds: same.iter().map(|x| x.p99_us).collect(),
            ..r.clone()
        });
    }
    out
}

fn find<'a>(rows: &'a [Row], store: &str, mix: Mix, conns: usize, depth: usize) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.store == store && r.mix == mix && r.conns == conns && r.depth == depth)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => json!(round(a / b, 3)),
        _ => Value::Null,
    }
}

pub fn run(args: &KvBenchArgs) -> anyhow::Result<Value> {
    let keys = args
        .keys
        .unwrap_or(if args.quick { 10_000 } else { 1_000_000 });
    anyhow::ensure!(keys >= 100, "--keys must be at least 100");
    let measure =
        Duration::from_secs_f64(args.seconds.unwrap_or(if args.quick { 0.3 } else { 2.0 }));
    let warmup = if args.quick {
        Duration::from_millis(100)
    } else {
        Duration::from_millis(500)
    };

    // CPU plan: stores on one CPU, this load generator on another.
    let cpus = allowed_cpus();
    let (mut store_cpu, mut client_cpu) = if args.pin && cpus.len() >= 2 && on_path("taskset") {
        (Some(cpus[0]), Some(cpus[1]))
    } else {
        (None, None)
    };
    if let Some(cpu) = client_cpu
        && let Err(e) = pin_self(cpu)
    {
        tracing_note(&format!(
            "cannot pin the load generator ({e:#}); running unpinned"
        ));
        (store_cpu, client_cpu) = (None, None);
    }
    let pinning = match (store_cpu, client_cpu) {
        (Some(s), Some(c)) => {
            format!("stores on CPU {s} (taskset -c {s}), load generator on CPU {c}")
        }
        _ => "not pinned".to_string(),
    };

    let dir = std::env::temp_dir().join(format!(
        "insitu-bench-kv-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    struct RemoveDir(PathBuf);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = RemoveDir(dir.clone());

    // The insitu cluster: coordinator + one server with one shard.
    let (coordinator, line) = start_insitu(
        "coordinator",
        store_cpu,
        &[
            "coordinator".into(),
            "--port".into(),
            "0".into(),
            "--dir".into(),
            dir.join("coordinator").display().to_string(),
        ],
        "insitu coordinator at ",
    )?;
    let coord_addr = line
        .trim_start_matches("insitu coordinator at ")
        .split([',', ' '])
        .next()
        .unwrap_or_default()
        .to_string();
    // Room for the objects several times over (writes append; the cleaner reclaims).
    let memory_mb = ((keys * 1000) >> 20).max(256);
    let (server, _) = start_insitu(
        "server",
        store_cpu,
        &[
            "server".into(),
            "--coordinator".into(),
            coord_addr.clone(),
            "--port".into(),
            "0".into(),
            "--dir".into(),
            dir.join("server").display().to_string(),
            "--shards".into(),
            "1".into(),
            "--memory-mb".into(),
            memory_mb.to_string(),
        ],
        "insitu server ",
    )?;

    let redis = match args.versus {
        Versus::Redis => {
            let redis_dir = dir.join("redis");
            std::fs::create_dir_all(&redis_dir)?;
            Some(start_redis(store_cpu, &redis_dir)?)
        }
        Versus::Nothing => None,
    };

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let report = local.block_on(&runtime, async {
        // The table: one tablet, on the one shard.
        let client = insitu_client::Client::connect(&coord_addr).await?;
        let info = client.create_table("kv", 1).await?;
        drop(client);
        let shard_addr: SocketAddr = info.tablets[0]
            .addr
            .parse()
            .with_context(|| format!("bad shard address {}", info.tablets[0].addr))?;
        let insitu = Store {
            name: "insitu",
            pid: server.pid(),
            addr: shard_addr,
            table: info.id,
        };
        let redis_store = redis.as_ref().map(|(p, addr)| Store {
            name: "redis",
            pid: p.pid(),
            addr: *addr,
            table: 0,
        });
        let redis_version = match &redis_store {
            Some(r) => Some(redis_info_field(r.addr, "server", "redis_version")?),
            None => None,
        };

        // ---- load + memory per object ----
        let mut load = serde_json::Map::new();
        let mut memory = serde_json::Map::new();
        const BATCH: u64 = 1000;
        const LOAD_CONNS: usize = 4;
        if let Some(r) = &redis_store {
            let before = redis_info_field(r.addr, "memory", "used_memory")?.parse::<f64>()?;
            let rss_before = rss_bytes(r.pid)? as f64;
            let took = loadgen::load(r.addr, RedisWire::default, keys, BATCH, LOAD_CONNS).await?;
            let after = redis_info_field(r.addr, "memory", "used_memory")?.parse::<f64>()?;
            let rss_after = rss_bytes(r.pid)? as f64;
            anyhow::ensure!(
                redis_info_field(r.addr, "keyspace", "db0")?.starts_with(&format!("keys={keys},")),
                "redis does not hold {keys} keys after the load"
            );
            load.insert("redis".into(), json!({"seconds": round(took.as_secs_f64(), 3), "objects_per_sec": round(keys as f64 / took.as_secs_f64(), 0)}));
            memory.insert("redis_used_memory_per_object".into(), json!(round((after - before) / keys as f64, 1)));
            memory.insert("redis_rss_per_object".into(), json!(round((rss_after - rss_before) / keys as f64, 1)));
        }
        {
            let before = rss_bytes(insitu.pid)? as f64;
            let table = insitu.table;
            let took = loadgen::load(insitu.addr, move || InsituWire::new(table), keys, BATCH, LOAD_CONNS).await?;
            let after = rss_bytes(insitu.pid)? as f64;
            load.insert("insitu".into(), json!({"seconds": round(took.as_secs_f64(), 3), "objects_per_sec": round(keys as f64 / took.as_secs_f64(), 0)}));
            memory.insert("insitu_rss_per_object".into(), json!(round((after - before) / keys as f64, 1)));
        }
        let mem_ratio = ratio(
            memory.get("insitu_rss_per_object").and_then(Value::as_f64),
            memory.get("redis_used_memory_per_object").and_then(Value::as_f64),
        );
        memory.insert("insitu_vs_redis".into(), mem_ratio.clone());

        // ---- timed cases ----
        let mut specs = Vec::new();
        let mut push = |mix: Mix, conns: usize, depth: usize| {
            specs.push(CaseSpec {
                mix,
                conns,
                depth,
                warmup,
                measure,
                keys,
                seed: 0x5EED ^ (specs.len() as u64),
            })
        };
        for mix in [Mix::Read] {
            for conns in [1, 16, 64] {
                for depth in [1, 16] {
                    push(mix, conns, depth);
                }
            }
        }
        // One connection: the latency of a single batch; 16: throughput against single reads.
        for conns in [1, 16] {
            push(Mix::MultiRead(10), conns, 1);
            push(Mix::MultiRead(100), conns, 1);
        }
        for mix in [Mix::Mixed { write_pct: 5 }, Mix::Write] {
            for conns in [1, 16, 64] {
                for depth in [1, 16] {
                    push(mix, conns, depth);
                }
            }
        }
        specs.retain(|s| {
            args.only.is_empty()
                || args.only.iter().any(|o| {
                    case_name(s.mix, s.conns, s.depth, "insitu").contains(o.as_str())
                        || case_name(s.mix, s.conns, s.depth, "redis").contains(o.as_str())
                })
        });
        // Rounds outermost, so slow drifts in machine load spread over every case.
        let mut raw: Vec<Row> = Vec::new();
        for round in 0..args.rounds.max(1) {
            if args.rounds > 1 {
                eprintln!("round {} of {}", round + 1, args.rounds);
            }
            for (i, spec) in specs.iter().enumerate() {
                let mut order: Vec<&Store> = redis_store.iter().chain([&insitu]).collect();
                if (i + round) % 2 == 1 {
                    order.reverse();
                }
                for store in order {
                    let row = measure_case(store, spec).await?;
                    eprintln!(
                        "  {:<8} {:<20} {:>12.0} ops/s  p99 {:>8.1} us",
                        row.store, row.case, row.ops_per_sec, row.p99_us
                    );
                    raw.push(row);
                }
            }
        }
        let rows = median_rows(&raw);

        // ---- ratios ----
        let get = |store: &str, mix: Mix, conns: usize, depth: usize, f: fn(&Row) -> f64| {
            find(&rows, store, mix, conns, depth).map(f)
        };
        let ops = |r: &Row| r.ops_per_sec;
        let objs = |r: &Row| r.objects_per_sec;
        let p99 = |r: &Row| r.p99_us;
        let mut ratios = serde_json::Map::new();
        let mut put = |k: &str, v: Value| {
            ratios.insert(k.to_string(), v);
        };
        put("read_throughput_vs_redis", ratio(get("insitu", Mix::Read, 16, 1, ops), get("redis", Mix::Read, 16, 1, ops)));
        put("write_throughput_vs_redis", ratio(get("insitu", Mix::Write, 16, 1, ops), get("redis", Mix::Write, 16, 1, ops)));
        put("read_p99_vs_redis", ratio(get("insitu", Mix::Read, 16, 1, p99), get("redis", Mix::Read, 16, 1, p99)));
        put("multiread_100_vs_single", ratio(get("insitu", Mix::MultiRead(100), 16, 1, objs), get("insitu", Mix::Read, 16, 1, objs)));
        put("multiread_100_vs_mget_100", ratio(get("insitu", Mix::MultiRead(100), 16, 1, objs), get("redis", Mix::MultiRead(100), 16, 1, objs)));
        put("memory_per_object_vs_redis", mem_ratio);
        // The rest of the grid, for the targets at 64 connections and the picture.
        put("read_throughput_vs_redis_c64", ratio(get("insitu", Mix::Read, 64, 1, ops), get("redis", Mix::Read, 64, 1, ops)));
        put("write_throughput_vs_redis_c64", ratio(get("insitu", Mix::Write, 64, 1, ops), get("redis", Mix::Write, 64, 1, ops)));
        put("read_p99_vs_redis_c64", ratio(get("insitu", Mix::Read, 64, 1, p99), get("redis", Mix::Read, 64, 1, p99)));
        put("write_p99_vs_redis", ratio(get("insitu", Mix::Write, 16, 1, p99), get("redis", Mix::Write, 16, 1, p99)));
        put("write_p99_vs_redis_c64", ratio(get("insitu", Mix::Write, 64, 1, p99), get("redis", Mix::Write, 64, 1, p99)));
        put("mix_throughput_vs_redis", ratio(get("insitu", Mix::Mixed { write_pct: 5 }, 16, 1, ops), get("redis", Mix::Mixed { write_pct: 5 }, 16, 1, ops)));
        // Server CPU per operation (schedstat of every store thread): what each
        // request costs the store itself, independent of the load generator.
        let cpu = |r: &Row| r.server_cpu_us_per_op;
        put("read_server_cpu_per_op_vs_redis", ratio(get("insitu", Mix::Read, 16, 1, cpu), get("redis", Mix::Read, 16, 1, cpu)));
        put("write_server_cpu_per_op_vs_redis", ratio(get("insitu", Mix::Write, 16, 1, cpu), get("redis", Mix::Write, 16, 1, cpu)));
        put("read_server_cpu_per_op_vs_redis_c64", ratio(get("insitu", Mix::Read, 64, 1, cpu), get("redis", Mix::Read, 64, 1, cpu)));
        put("write_server_cpu_per_op_vs_redis_c64", ratio(get("insitu", Mix::Write, 64, 1, cpu), get("redis", Mix::Write, 64, 1, cpu)));
        put("read_d16_server_cpu_per_op_vs_redis", ratio(get("insitu", Mix::Read, 16, 16, cpu), get("redis", Mix::Read, 16, 16, cpu)));
        put("write_d16_server_cpu_per_op_vs_redis", ratio(get("insitu", Mix::Write, 16, 16, cpu), get("redis", Mix::Write, 16, 16, cpu)));
        put("multiread_10_vs_single", ratio(get("insitu", Mix::MultiRead(10), 16, 1, objs), get("insitu", Mix::Read, 16, 1, objs)));
        put("multiread_10_vs_mget_10", ratio(get("insitu", Mix::MultiRead(10), 16, 1, objs), get("redis", Mix::MultiRead(10), 16, 1, objs)));
        for conns in [1, 16, 64] {
            for depth in [1, 16] {
                for (mix, name) in [(Mix::Read, "read"), (Mix::Write, "write"), (Mix::Mixed { write_pct: 5 }, "mix")] {
                    let key = format!("grid_{name}_c{conns}_d{depth}");
                    put(&format!("{key}_throughput_vs_redis"), ratio(get("insitu", mix, conns, depth, ops), get("redis", mix, conns, depth, ops)));
                    put(&format!("{key}_p99_vs_redis"), ratio(get("insitu", mix, conns, depth, p99), get("redis", mix, conns, depth, p99)));
                }
            }
        }

        print_table(&rows, &memory, &load, store_cpu.is_some(), keys, measure);
        println!("\nratios:");
        for k in [
            "read_throughput_vs_redis",
            "write_throughput_vs_redis",
            "read_p99_vs_redis",
            "read_throughput_vs_redis_c64",
            "write_throughput_vs_redis_c64",
            "read_p99_vs_redis_c64",
            "multiread_100_vs_single",
            "multiread_100_vs_mget_100",
            "memory_per_object_vs_redis",
            "read_server_cpu_per_op_vs_redis",
            "write_server_cpu_per_op_vs_redis",
        ] {
            println!("  {:<32} {}", k, ratios.get(k).cloned().unwrap_or(Value::Null));
        }

        anyhow::Ok(json!({
            "bench": "kv",
            "config": {
                "keys": keys,
                "key_bytes": loadgen::KEY_BYTES,
                "value_bytes": loadgen::VALUE_BYTES,
                "measure_seconds": measure.as_secs_f64(),
                "rounds": args.rounds.max(1),
                "figures": "per case, the median over the rounds; ratios are of those medians",
                "warmup_seconds": warmup.as_secs_f64(),
                "quick": args.quick,
                "versus": match args.versus { Versus::Redis => "redis", Versus::Nothing => "none" },
                "redis_version": redis_version,
                "pinning": pinning,
                "insitu": "1 server, 1 shard, 1 tablet",
                "access": "uniform random keys; closed loop; depth = requests per batch per connection",
            },
            "load": load,
            "memory": memory,
            "cases": rows.iter().map(Row::json).collect::<Vec<_>>(),
            "ratios": ratios,
        }))
    })?;
    drop(redis);
    drop(server);
    drop(coordinator);

    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, crate::kv_plot::svg(&report))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(report)
}

fn print_table(
    rows: &[Row],
    memory: &serde_json::Map<String, Value>,
    load: &serde_json::Map<String, Value>,
    pinned: bool,
    keys: u64,
    measure: Duration,
) {
    println!(
        "\ninsitu vs Redis, point operations: {keys} keys of {} B / values of {} B, {:.1} s per case{}",
        loadgen::KEY_BYTES,
        loadgen::VALUE_BYTES,
        measure.as_secs_f64(),
        if pinned {
            ", stores pinned to one CPU, load generator to another"
        } else {
            ""
        }
    );
    println!(
        "{:<20} {:<7} {:>11} {:>11} {:>8} {:>8} {:>9} {:>7} {:>9} {:>7}",
        "case",
        "store",
        "ops/s",
        "objects/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "cpu %",
        "cpu us/op",
        "gen %"
    );
    for (i, r) in rows.iter().enumerate() {
        let vs = (r.store == "insitu")
            .then(|| find(rows, "redis", r.mix, r.conns, r.depth))
            .flatten()
            .map(|redis| {
                format!(
                    "  x{:.2} ops, x{:.2} p99",
                    r.objects_per_sec / redis.objects_per_sec,
                    r.p99_us / redis.p99_us
                )
            })
            .unwrap_or_default();
        println!(
            "{:<20} {:<7} {:>11.0} {:>11.0} {:>8.1} {:>8.1} {:>9.1} {:>7.0} {:>9.2} {:>7.0}{}",
            r.case,
            r.store,
            r.ops_per_sec,
            r.objects_per_sec,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.server_cpu_util * 100.0,
            r.server_cpu_us_per_op,
            r.client_cpu_util * 100.0,
            vs
        );
        if i + 1 < rows.len() && rows[i + 1].mix != r.mix {
            println!();
        }
    }
    println!(
        "(cpu %: the store's CPU use, all its threads; cpu us/op: that per operation; gen %: the load generator's)"
    );
    println!("\nload (batches of 1000): {}", Value::Object(load.clone()));
    println!("memory per object: {}", Value::Object(memory.clone()));
}
