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

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::kv_procs::{
    allowed_cpus, cpu_ns, pin_self, redis_info_field, rss_bytes, start_insitu, start_redis,
    tracing_note,
};
use crate::kv_report::{Row, case_name, median_rows, print_table, ratio, ratios, round};
use crate::loadgen::{self, CaseResult, CaseSpec, InsituWire, Mix, RedisWire};
use insitu_testkit::on_path;
use insitu_tls::ClientTls;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Versus {
    Redis,
    /// Writes with durability on against Redis with `appendonly yes`
    /// (`kv_durable.rs`).
    RedisAof,
    /// insitu's writes with and without snapshot reads going on: what
    /// ordering them by snapshots costs (`kv_stamped.rs`).
    Snapshots,
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
    /// Both stores serve TLS only; the load generator dials TLS.
    pub tls: bool,
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
            tls: false,
        }
    }
}

/// Percentiles stored per case (and drawn in the plot).
const CURVE: [f64; 9] = [50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99];

// ---- the run --------------------------------------------------------------------

pub(crate) struct Store {
    pub name: &'static str,
    /// The store's process, for its CPU time.
    pub pid: u32,
    /// Where requests go (the one shard, or Redis).
    pub addr: SocketAddr,
    /// insitu's table id (0 for Redis).
    pub table: u64,
    /// Dial `addr` over TLS with this trust (None: plain TCP).
    pub tls: Option<ClientTls>,
}

/// CPU plan: stores on one CPU, this load generator (pinned here) on another,
/// when there are two and `pin` is set. Returns the stores' CPU and a description.
pub(crate) fn cpu_plan(pin: bool) -> (Option<usize>, String) {
    let cpus = allowed_cpus();
    let (mut store_cpu, mut client_cpu) = if pin && cpus.len() >= 2 && on_path("taskset") {
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
    (store_cpu, pinning)
}

/// Start an insitu coordinator and one server with one shard (pinned to
/// `cpu`), with extra flags for each; returns both and the coordinator's address.
pub(crate) fn start_insitu_pair(
    cpu: Option<usize>,
    dir: &std::path::Path,
    memory_mb: u64,
    coordinator_flags: &[String],
    server_flags: &[String],
) -> anyhow::Result<(insitu_testkit::Proc, insitu_testkit::Proc, String)> {
    let (coordinator, coord_addr) =
        start_coordinator(cpu, &dir.join("coordinator"), coordinator_flags)?;
    let server = start_server(
        cpu,
        &coord_addr,
        &dir.join("server"),
        memory_mb,
        server_flags,
    )?;
    Ok((coordinator, server, coord_addr))
}

/// An `insitu server` of one shard enlisting with `coord_addr`, its data in
/// `dir`, with `flags`.
pub(crate) fn start_server(
    cpu: Option<usize>,
    coord_addr: &str,
    dir: &std::path::Path,
    memory_mb: u64,
    flags: &[String],
) -> anyhow::Result<insitu_testkit::Proc> {
    let mut args: Vec<String> = vec![
        "server".into(),
        "--coordinator".into(),
        coord_addr.to_string(),
        "--port".into(),
        "0".into(),
        "--dir".into(),
        dir.display().to_string(),
        "--shards".into(),
        "1".into(),
        "--memory-mb".into(),
        memory_mb.to_string(),
    ];
    args.extend_from_slice(flags);
    Ok(start_insitu("server", cpu, &args, "insitu server ")?.0)
}

/// An `insitu coordinator` on a free port with its metadata in `dir` and
/// `flags`; the process and its address.
pub(crate) fn start_coordinator(
    cpu: Option<usize>,
    dir: &std::path::Path,
    flags: &[String],
) -> anyhow::Result<(insitu_testkit::Proc, String)> {
    let mut args: Vec<String> = vec![
        "coordinator".into(),
        "--port".into(),
        "0".into(),
        "--dir".into(),
        dir.display().to_string(),
    ];
    args.extend_from_slice(flags);
    let (coordinator, line) = start_insitu("coordinator", cpu, &args, "insitu coordinator at ")?;
    let addr = line
        .trim_start_matches("insitu coordinator at ")
        .split([',', ' '])
        .next()
        .unwrap_or_default()
        .to_string();
    Ok((coordinator, addr))
}

/// Create the benchmark's table (one tablet, on the one shard) and name the store.
pub(crate) async fn insitu_store(
    name: &'static str,
    coord_addr: &str,
    pid: u32,
    tls: Option<ClientTls>,
) -> anyhow::Result<Store> {
    let config = insitu_client::ClientConfig {
        tls: tls.clone(),
        ..insitu_client::ClientConfig::default()
    }
    .with_env()?;
    let client = insitu_client::Client::connect_with(coord_addr, config).await?;
    let info = client.create_table("kv", 1).await?;
    let shard_addr: SocketAddr = info.tablets[0]
        .addr
        .parse()
        .with_context(|| format!("bad shard address {}", info.tablets[0].addr))?;
    Ok(Store {
        name,
        pid,
        addr: shard_addr,
        table: info.id,
        tls,
    })
}

/// Load keys `0..keys` into `store` (batches of 1000 over 4 connections:
/// MSET / multiWrite). Returns the time it took.
pub(crate) async fn load_store(store: &Store, keys: u64) -> anyhow::Result<Duration> {
    const BATCH: u64 = 1000;
    const CONNS: usize = 4;
    let tls = store.tls.as_ref();
    if store.name.starts_with("redis") {
        loadgen::load(store.addr, tls, RedisWire::default, keys, BATCH, CONNS).await
    } else {
        let table = store.table;
        let make = move || InsituWire::new(table);
        loadgen::load(store.addr, tls, make, keys, BATCH, CONNS).await
    }
}

async fn run_one(store: &Store, spec: &CaseSpec) -> anyhow::Result<CaseResult> {
    if store.name.starts_with("redis") {
        loadgen::run_case(store.addr, store.tls.as_ref(), RedisWire::default, spec).await
    } else {
        let table = store.table;
        let make = move || InsituWire::new(table);
        loadgen::run_case(store.addr, store.tls.as_ref(), make, spec).await
    }
}

/// insitu's longest point call since the last reading, which starts a new
/// window (`ShardStats { reset_longest_call: true }`); None for Redis.
async fn longest_call_us(store: &Store) -> anyhow::Result<Option<u64>> {
    if !store.name.starts_with("insitu") {
        return Ok(None);
    }
    let credentials = insitu_client::Credentials {
        token: None,
        tls: store.tls.clone(),
    };
    let conn = insitu_client::rpc::RpcConn::open(&store.addr.to_string(), &credentials)
        .await
        .context("connecting for ShardStats")?;
    let request = insitu_protocol::Request::ShardStats {
        reset_longest_call: true,
    };
    let reply = conn.call(&request).await.context("ShardStats")?;
    match reply.decode().context("decoding ShardStats")? {
        insitu_protocol::Response::ShardStats(s) => Ok(Some(s.longest_point_call_us)),
        other => anyhow::bail!("unexpected answer to ShardStats: {other:?}"),
    }
}

pub(crate) async fn measure_case(store: &Store, spec: &CaseSpec) -> anyhow::Result<Row> {
    longest_call_us(store).await?; // a new window for this case
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
    let server_longest_call_us = longest_call_us(store).await?;
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
        server_longest_call_us,
    })
}

pub fn run(args: &KvBenchArgs) -> anyhow::Result<Value> {
    match args.versus {
        Versus::RedisAof => return crate::kv_durable::run(args),
        Versus::Snapshots => return crate::kv_stamped::run(args),
        Versus::Redis | Versus::Nothing => {}
    }
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

    let (store_cpu, pinning) = cpu_plan(args.pin);

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

    // With --tls: one CA and certificate for both stores, so each pays
    // the same handshake and record costs (TLS 1.3, ECDSA P-256).
    let tls_files = if args.tls {
        let hosts = ["127.0.0.1".to_string(), "localhost".to_string()];
        Some(insitu_tls::generate::create(&dir.join("tls"), &hosts)?)
    } else {
        None
    };
    let client_tls = tls_files
        .as_ref()
        .map(|f| ClientTls::from_ca_file(&f.ca))
        .transpose()?;
    // In memory only (`--replicas 0`), as Redis runs here (`--save ''
    // --appendonly no`): durable writes against Redis's AOF are `--vs
    // redis-aof`. No tokens: Redis runs without a password (a token costs
    // one `Hello` per connection, nothing per request).
    let mut role_flags: Vec<String> = vec!["--no-auth".into()];
    role_flags.extend(match &tls_files {
        Some(f) => [
            "--tls-cert",
            &f.cert.display().to_string(),
            "--tls-key",
            &f.key.display().to_string(),
            "--tls-ca",
            &f.ca.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        None => Vec::new(),
    });
    let mut coordinator_flags = role_flags.clone();
    coordinator_flags.extend(["--replicas".to_string(), "0".to_string()]);

    // The insitu cluster: coordinator + one server with one shard.
    // Room for the objects several times over (writes append; the cleaner reclaims).
    let memory_mb = ((keys * 1000) >> 20).max(256);
    let (coordinator, server, coord_addr) =
        start_insitu_pair(store_cpu, &dir, memory_mb, &coordinator_flags, &role_flags)?;

    // Redis: (process, the plain port INFO goes to, the port measured).
    let redis = match args.versus {
        Versus::Redis => {
            let redis_dir = dir.join("redis");
            std::fs::create_dir_all(&redis_dir)?;
            let r = start_redis(store_cpu, &redis_dir, None, tls_files.as_ref())?;
            let measured = r.tls.unwrap_or(r.plain);
            Some((r.proc, r.plain, measured))
        }
        Versus::Nothing | Versus::RedisAof | Versus::Snapshots => None,
    };

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let report = local.block_on(&runtime, async {
        let insitu = insitu_store("insitu", &coord_addr, server.pid(), client_tls.clone()).await?;
        let redis_store = redis.as_ref().map(|(p, _, measured)| Store {
            name: "redis",
            pid: p.pid(),
            addr: *measured,
            table: 0,
            tls: client_tls.clone(),
        });
        // INFO goes to the plain port (not measured).
        let redis_control = redis.as_ref().map(|(_, plain, _)| *plain);
        let redis_version = match redis_control {
            Some(addr) => Some(redis_info_field(addr, "server", "redis_version")?),
            None => None,
        };

        // ---- load + memory per object ----
        let mut load = serde_json::Map::new();
        let mut memory = serde_json::Map::new();
        if let (Some(r), Some(control)) = (&redis_store, redis_control) {
            let before = redis_info_field(control, "memory", "used_memory")?.parse::<f64>()?;
            let rss_before = rss_bytes(r.pid)? as f64;
            let took = load_store(r, keys).await?;
            let after = redis_info_field(control, "memory", "used_memory")?.parse::<f64>()?;
            let rss_after = rss_bytes(r.pid)? as f64;
            anyhow::ensure!(
                redis_info_field(control, "keyspace", "db0")?.starts_with(&format!("keys={keys},")),
                "redis does not hold {keys} keys after the load"
            );
            load.insert("redis".into(), json!({"seconds": round(took.as_secs_f64(), 3), "objects_per_sec": round(keys as f64 / took.as_secs_f64(), 0)}));
            memory.insert("redis_used_memory_per_object".into(), json!(round((after - before) / keys as f64, 1)));
            memory.insert("redis_rss_per_object".into(), json!(round((rss_after - rss_before) / keys as f64, 1)));
        }
        {
            let before = rss_bytes(insitu.pid)? as f64;
            let took = load_store(&insitu, keys).await?;
            let after = rss_bytes(insitu.pid)? as f64;
            load.insert("insitu".into(), json!({"seconds": round(took.as_secs_f64(), 3), "objects_per_sec": round(keys as f64 / took.as_secs_f64(), 0)}));
            memory.insert("insitu_rss_per_object".into(), json!(round((after - before) / keys as f64, 1)));
        }
        let mem_ratio = ratio(
            memory.get("insitu_rss_per_object").and_then(Value::as_f64),
            memory.get("redis_used_memory_per_object").and_then(Value::as_f64),
        );
        memory.insert("insitu_vs_redis".into(), mem_ratio.clone());
        // What each store spends beyond the key and value themselves (headers,
        // index, allocator slack): the part a layout can change.
        let payload = (loadgen::KEY_BYTES + loadgen::VALUE_BYTES) as f64;
        let overhead = |k: &str| memory.get(k).and_then(Value::as_f64).map(|b| b - payload);
        let overhead_ratio = ratio(overhead("insitu_rss_per_object"), overhead("redis_used_memory_per_object"));
        memory.insert("overhead_vs_redis".into(), overhead_ratio.clone());

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

        let ratios = ratios(&rows, mem_ratio, overhead_ratio);

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
            "overhead_per_object_vs_redis",
            "read_server_cpu_per_op_vs_redis",
            "write_server_cpu_per_op_vs_redis",
            "write_p99_vs_redis_c16_d16",
            "write_p99_vs_redis_c64_d16",
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
                "versus": match args.versus { Versus::Redis => "redis", Versus::RedisAof => "redis-aof", Versus::Snapshots => "snapshots", Versus::Nothing => "none" },
                "redis_version": redis_version,
                "pinning": pinning,
                "tls": if args.tls { "both stores TLS only: one fresh CA, ECDSA P-256 certificate; insitu rustls (ring), Redis OpenSSL; handshakes before the clock starts" } else { "off" },
                "insitu": "1 server, 1 shard, 1 tablet, in memory only (--replicas 0, as Redis here: no RDB, no AOF)",
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
