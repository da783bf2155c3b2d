//! The cluster part of `insitu bench resp`: `redis-benchmark --cluster`
//! with the same arguments against a Redis Cluster of two nodes and against
//! insitu with two servers, in the same run.
//!
//! Redis: two `redis-server --cluster-enabled yes` (in memory only), half
//! the slots each, joined by `CLUSTER MEET` (no replicas). insitu: a
//! coordinator and two servers of one shard each, `--replicas 0`, no
//! tokens, each with its RESP port; its Redis table is made on the first
//! command, one tablet per server, placed by hash slot. redis-benchmark
//! learns each cluster's nodes (`CLUSTER NODES`) and sends every key to its
//! node. Nothing is pinned (the bench unpins itself first, so the processes
//! it starts inherit no pinning): two nodes and the load generator share the
//! machine's cores the same way for both stores.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::kv::{start_coordinator, start_server};
use crate::kv_procs::{redis_call, start_redis_with};
use crate::resp_bench::{compare, redis_benchmark};

/// Requests, keyspace, connections and tests of one `--cluster` run.
pub(crate) struct ClusterLoad<'a> {
    pub requests: u64,
    pub keyspace: u64,
    pub clients: u32,
    pub tests: &'a str,
    pub pipelines: &'a [u32],
    pub rounds: usize,
}

/// Run both clusters; the JSON of `"cluster"` in the report.
pub(crate) fn run(load: &ClusterLoad<'_>, dir: &Path) -> anyhow::Result<Value> {
    // The single-store runs pinned this process to the load generator's CPU;
    // the nodes started below would inherit it.
    crate::kv_procs::unpin_self()?;
    let redis_dirs = [dir.join("redis-c1"), dir.join("redis-c2")];
    let mut redis_nodes = Vec::new();
    // (client port, cluster bus port) of each Redis node.
    let mut redis_ports = Vec::new();
    for d in &redis_dirs {
        std::fs::create_dir_all(d)?;
        // The cluster bus port is named, not left at Redis's port + 10,000:
        // that one may be out of range, another test's server's or an
        // outgoing connection's (seen: a node that never answered PING).
        let bus = insitu_testkit::free_port()?;
        let flags: Vec<String> = [
            "--cluster-enabled".to_string(),
            "yes".into(),
            "--cluster-port".into(),
            bus.to_string(),
            "--cluster-config-file".into(),
            d.join("nodes.conf").display().to_string(),
        ]
        .to_vec();
        let node = start_redis_with(None, d, None, None, &flags)?;
        redis_ports.push((node.plain.port(), bus));
        redis_nodes.push(node);
    }
    create_redis_cluster(&redis_ports)?;

    let (_coordinator, coord_addr) = start_coordinator(
        None,
        &dir.join("insitu-coordinator"),
        &["--no-auth".into(), "--replicas".into(), "0".into()],
    )?;
    let memory_mb = ((load.keyspace * 400) >> 20).max(512);
    let mut servers = Vec::new();
    let mut insitu_ports = Vec::new();
    for i in 0..2 {
        let port = insitu_testkit::free_port()?;
        let server = start_server(
            None,
            &coord_addr,
            &dir.join(format!("insitu-server-{i}")),
            memory_mb,
            &["--no-auth".into(), "--resp-port".into(), port.to_string()],
        )?;
        servers.push(server);
        insitu_ports.push(port);
    }
    // The Redis table is made by the first command, with both servers up.
    let nodes = redis_call(
        ([127, 0, 0, 1], insitu_ports[0]).into(),
        &[b"CLUSTER", b"NODES"],
    )
    .map_err(|e| anyhow::anyhow!("insitu CLUSTER NODES: {e}"))?;
    let described = String::from_utf8_lossy(&nodes).lines().count();
    if described != 2 {
        bail!(
            "insitu describes {described} nodes, not 2: {}",
            String::from_utf8_lossy(&nodes)
        );
    }

    let mut runs = Vec::new();
    let mut worst: std::collections::BTreeMap<String, f64> = Default::default();
    for &p in load.pipelines {
        let base = [
            "--cluster".to_string(),
            "-n".into(),
            load.requests.to_string(),
            "-r".into(),
            load.keyspace.to_string(),
            "-c".into(),
            load.clients.to_string(),
            "-t".into(),
            load.tests.to_string(),
            "-P".into(),
            p.to_string(),
        ];
        let (mut theirs_all, mut ours_all) = (Vec::new(), Vec::new());
        for _ in 0..load.rounds.max(1) {
            theirs_all.push(redis_benchmark(redis_ports[0].0, &base)?);
            ours_all.push(redis_benchmark(insitu_ports[0], &base)?);
        }
        runs.push(compare("cluster ", p, &theirs_all, &ours_all, &mut worst)?);
    }
    let pick = |t: &str| worst.get(t).copied().filter(|r| r.is_finite());
    drop(servers);
    drop(redis_nodes);
    Ok(json!({
        "redis": "2 redis-server --cluster-enabled yes, half the slots each, no replicas",
        "insitu": "coordinator + 2 servers of 1 shard, --replicas 0, no auth, Redis table placed by slot",
        "runs": runs,
        "get_vs_redis": pick("get"),
        "set_vs_redis": pick("set"),
    }))
}

/// Make `nodes` (client port, cluster bus port) one Redis Cluster: an
/// equal run of the slots each (`CLUSTER ADDSLOTSRANGE`), then `CLUSTER
/// MEET` naming the bus port, and wait until every node says the cluster is
/// up and knows them all. (`redis-cli --cluster create` wants three masters
/// at least.)
fn create_redis_cluster(nodes: &[(u16, u16)]) -> anyhow::Result<()> {
    let addr = |p: u16| std::net::SocketAddr::from(([127, 0, 0, 1], p));
    let ports: Vec<u16> = nodes.iter().map(|&(p, _)| p).collect();
    let per = 16384 / ports.len();
    for (i, &p) in ports.iter().enumerate() {
        let first = (i * per).to_string();
        let last = if i + 1 == ports.len() {
            16383
        } else {
            (i + 1) * per - 1
        }
        .to_string();
        redis_call(
            addr(p),
            &[
                b"CLUSTER",
                b"ADDSLOTSRANGE",
                first.as_bytes(),
                last.as_bytes(),
            ],
        )
        .with_context(|| format!("CLUSTER ADDSLOTSRANGE on port {p}"))?;
    }
    for &(p, bus) in &nodes[1..] {
        redis_call(
            addr(ports[0]),
            &[
                b"CLUSTER",
                b"MEET",
                b"127.0.0.1",
                p.to_string().as_bytes(),
                bus.to_string().as_bytes(),
            ],
        )
        .with_context(|| format!("CLUSTER MEET of port {p} (bus {bus})"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let known = format!("cluster_known_nodes:{}", ports.len());
    for &p in &ports {
        loop {
            let info = redis_call(addr(p), &[b"CLUSTER", b"INFO"]);
            if matches!(&info, Ok(text) if {
                let text = String::from_utf8_lossy(text);
                text.contains("cluster_state:ok") && text.contains(&known)
            }) {
                break;
            }
            if Instant::now() > deadline {
                bail!("the Redis cluster node on port {p} is not up after 30 s: {info:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}
