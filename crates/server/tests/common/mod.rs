//! What the server's integration tests share: a coordinator and one storage
//! server started in this process on loopback.

// Each test binary uses a part of this module.
#![allow(dead_code)]

pub mod resp;
pub mod snap;
pub mod txn;
pub mod typed;

use insitu_client::{Reply, RpcConn, TableInfo};
use insitu_coordinator::{CoordinatorConfig, CoordinatorHandle};
use insitu_keyhash::key_hash;
use insitu_server::{ServerConfig, ServerHandle};

/// Send the servers' logs to the test's output, filtered by `RUST_LOG`
/// (nothing without it): the first call in a test binary installs it.
pub fn trace_to_test_output() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A coordinator and one server; dropped in field order, the data
/// directory last.
pub struct Node {
    pub coordinator: CoordinatorHandle,
    pub server: ServerHandle,
    pub dir: tempfile::TempDir,
}

impl Node {
    /// The coordinator's address, for clients.
    pub fn addr(&self) -> String {
        self.coordinator.addr().to_string()
    }

    /// The address of shard `i` of the server.
    pub fn shard(&self, i: usize) -> String {
        self.server.shard_addrs[i].to_string()
    }

    /// Start a second one-shard server in this cluster (its data under
    /// `name` in the node's directory); the caller shuts it down.
    pub async fn second_server(&self, name: &str) -> ServerHandle {
        let mut config = ServerConfig::new(self.addr(), self.dir.path().join(name));
        config.shards = 1;
        insitu_server::start(config).await.unwrap()
    }
}

/// The settings of these tests' coordinators (metadata in `dir`): the
/// defaults, with a failure timeout of 5 s. Why: no test here is about
/// failure detection, and their servers share the test's process on a loaded
/// CI machine; a backup thread kept off the CPU for the default 500 ms would
/// be declared dead, failing a move or a read for a death no test meant.
pub fn coordinator_config(dir: &std::path::Path) -> CoordinatorConfig {
    let mut config = CoordinatorConfig::new(dir.to_path_buf());
    config.failure_timeout = std::time::Duration::from_secs(5);
    config
}

/// A new temporary directory and a coordinator on loopback keeping its
/// metadata in the directory's `c` folder (a server's data can go in `s`).
pub async fn start_coordinator() -> (tempfile::TempDir, CoordinatorHandle) {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = coordinator_config(&dir.path().join("c"));
    let coordinator = insitu_coordinator::start(config, listener).await.unwrap();
    (dir, coordinator)
}

/// Start a coordinator and a one-shard server (data under one temporary
/// directory), the server's configuration changed by `tweak` first.
pub async fn start(tweak: impl FnOnce(&mut ServerConfig)) -> Node {
    let (dir, coordinator) = start_coordinator().await;
    let mut config = ServerConfig::new(coordinator.addr().to_string(), dir.path().join("s"));
    config.shards = 1;
    tweak(&mut config);
    let server = insitu_server::start(config).await.unwrap();
    Node {
        coordinator,
        server,
        dir,
    }
}

/// A plain `Write` of `key` sent straight to a shard (no routing, no
/// retry): the reply as it came, refusals included.
pub async fn raw_write(conn: &RpcConn, table: u64, key: &str, value: &[u8]) -> Reply {
    use insitu_protocol::{RejectRules, Request, blob};
    conn.call(&Request::Write {
        table,
        key: blob(key.as_bytes()),
        value: blob(value),
        rules: RejectRules::default(),
        expires_at_ms: 0,
    })
    .await
    .unwrap()
}

/// The index in `info.tablets` of the tablet holding `key`.
pub fn tablet_of(info: &TableInfo, key: &str) -> usize {
    let h = key_hash(info.id, key.as_bytes());
    info.tablets
        .iter()
        .position(|t| t.start_hash <= h && h <= t.end_hash)
        .expect("the tablets cover the hash space")
}

/// The first key `{prefix}{i}` held by tablet `index` of `info`.
pub fn key_in(info: &TableInfo, index: usize, prefix: &str) -> String {
    (0..100_000)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| tablet_of(info, k) == index)
        .expect("some key hashes into every tablet")
}

/// The sum of one figure (`field` of each `TabletStat`) over `table`'s
/// tablets on the shard at `addr`: objects held, expiring objects, side
/// records, as a test waits for a sweep.
pub async fn tablet_sum(
    client: &insitu_client::Client,
    addr: &str,
    table: u64,
    field: impl Fn(&insitu_protocol::TabletStat) -> u64,
) -> u64 {
    let stats = client.shard_stats(addr).await.unwrap();
    stats
        .tablets
        .iter()
        .filter(|t| t.table == table)
        .map(field)
        .sum()
}
