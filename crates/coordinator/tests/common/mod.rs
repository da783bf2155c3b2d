//! Test support: a coordinator on a temporary directory and RPC helpers;
//! fake storage shards that record the control requests they get are in
//! `fake_shard.rs`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use insitu_client::rpc::{Reply, RpcConn};
use insitu_coordinator::{CoordinatorConfig, CoordinatorHandle};
use insitu_protocol::{Request, Response, ServerInfo, Status, TableInfo};
use tokio::net::TcpListener;

mod fake_shard;
pub use fake_shard::*;

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "insitu-coord-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub async fn start_coordinator(dir: &TempDir) -> CoordinatorHandle {
    start_coordinator_with(CoordinatorConfig::new(dir.0.clone())).await
}

pub async fn start_coordinator_with(config: CoordinatorConfig) -> CoordinatorHandle {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind coordinator");
    insitu_coordinator::start(config, listener)
        .await
        .expect("start coordinator")
}

/// Start a coordinator on `dir` listening on `addr` again (a restart its
/// clients find at the address they know). The port was just released:
/// binding is retried for a little while.
pub async fn start_coordinator_on(dir: &TempDir, addr: std::net::SocketAddr) -> CoordinatorHandle {
    let mut tries = 0;
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => break listener,
            Err(e) if tries < 100 => {
                tries += 1;
                eprintln!("rebinding {addr}: {e}; trying again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot bind {addr} again: {e}"),
        }
    };
    insitu_coordinator::start(CoordinatorConfig::new(dir.0.clone()), listener)
        .await
        .expect("start coordinator")
}

pub async fn connect(handle: &CoordinatorHandle) -> RpcConn {
    RpcConn::connect(&handle.addr().to_string())
        .await
        .expect("connect to coordinator")
}

pub async fn call(conn: &RpcConn, request: Request<'_>) -> Reply {
    conn.call_timeout(&request, Duration::from_secs(20))
        .await
        .expect("coordinator replies")
}

pub fn expect_ok(reply: &Reply) -> Response<'_> {
    assert_eq!(
        reply.status,
        Status::Ok,
        "unexpected error reply: {}",
        reply.error_message()
    );
    reply.decode().expect("decodable reply")
}

/// Assert an error reply with `status`; returns its message.
pub fn expect_err(reply: &Reply, status: Status) -> String {
    assert_eq!(
        reply.status,
        status,
        "expected {status:?}, got {:?} ({})",
        reply.status,
        reply.error_message()
    );
    let message = reply.error_message();
    assert!(!message.is_empty(), "error replies carry a message");
    message
}

/// Poll OpenTable (at most 10 s) until the table has a map again (its
/// tablets were recovered or re-homed after a death).
pub async fn open_when_ready(conn: &RpcConn, name: &str) -> TableInfo {
    for _ in 0..1000 {
        let reply = call(conn, Request::OpenTable { name: name.into() }).await;
        if reply.status != Status::Retry {
            return table_of(&reply);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("table {name:?} still has tablets without a live server");
}

/// Poll ListServers (at most 10 s) until `pred` accepts the list.
pub async fn servers_when(
    conn: &RpcConn,
    what: &str,
    pred: impl Fn(&[ServerInfo]) -> bool,
) -> Vec<ServerInfo> {
    let mut last = Vec::new();
    for _ in 0..1000 {
        last = list_servers(conn).await;
        if pred(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("servers never became {what}: {last:?}");
}

/// Ids of the servers in `servers`, in the listed order.
pub fn server_ids(servers: &[ServerInfo]) -> Vec<u64> {
    servers.iter().map(|s| s.id).collect()
}

pub async fn enlist(conn: &RpcConn, shard_addrs: Vec<String>) -> u64 {
    enlist_as(conn, shard_addrs, "", false).await
}

/// Enlist with an identity (and the operator's `replace`).
pub async fn enlist_as(
    conn: &RpcConn,
    shard_addrs: Vec<String>,
    identity: &str,
    replace: bool,
) -> u64 {
    let request = Request::Enlist {
        shard_addrs,
        identity: identity.into(),
        replace,
        backup_addr: String::new(),
    };
    match expect_ok(&call(conn, request).await) {
        Response::Enlisted { server_id, .. } => server_id,
        other => panic!("expected Enlisted, got {other:?}"),
    }
}

pub async fn create(conn: &RpcConn, name: &str, tablets: u32) -> TableInfo {
    table_of(&try_create(conn, name, tablets).await)
}

pub async fn open(conn: &RpcConn, name: &str) -> TableInfo {
    table_of(&call(conn, Request::OpenTable { name: name.into() }).await)
}

pub fn table_of(reply: &Reply) -> TableInfo {
    match expect_ok(reply) {
        Response::Table(info) => info,
        other => panic!("expected Table, got {other:?}"),
    }
}

pub async fn list_tables(conn: &RpcConn) -> Vec<TableInfo> {
    match expect_ok(&call(conn, Request::ListTables).await) {
        Response::Tables(tables) => tables,
        other => panic!("expected Tables, got {other:?}"),
    }
}

pub async fn list_servers(conn: &RpcConn) -> Vec<ServerInfo> {
    match expect_ok(&call(conn, Request::ListServers).await) {
        Response::Servers(servers) => servers,
        other => panic!("expected Servers, got {other:?}"),
    }
}

/// The tablets cover 0..=u64::MAX, in order, without gaps or overlaps.
pub fn assert_covers_hash_space(info: &TableInfo) {
    assert!(!info.tablets.is_empty());
    assert_eq!(info.tablets[0].start_hash, 0);
    assert_eq!(info.tablets.last().unwrap().end_hash, u64::MAX);
    for w in info.tablets.windows(2) {
        assert!(w[0].start_hash <= w[0].end_hash);
        assert_eq!(
            w[0].end_hash + 1,
            w[1].start_hash,
            "gap or overlap between tablets"
        );
    }
}

/// Send CreateTable and return the raw reply (for tests that expect a refusal).
pub async fn try_create(conn: &RpcConn, name: impl Into<String>, tablets: u32) -> Reply {
    let request = Request::CreateTable {
        name: name.into(),
        tablets,
        schema: None,
        by_slot: false,
    };
    call(conn, request).await
}

/// Send DropTable and return the raw reply (checked by the caller).
pub async fn try_drop(conn: &RpcConn, name: &str) -> Reply {
    call(conn, Request::DropTable { name: name.into() }).await
}

/// Send MoveTablet and return the raw reply.
pub async fn try_move(conn: &RpcConn, table: &str, tablet_index: u32, server_id: u64) -> Reply {
    let request = Request::MoveTablet {
        table: table.into(),
        tablet_index,
        server_id,
    };
    call(conn, request).await
}

/// Move a tablet and expect the new map.
pub async fn move_tablet(
    conn: &RpcConn,
    table: &str,
    tablet_index: u32,
    server_id: u64,
) -> TableInfo {
    table_of(&try_move(conn, table, tablet_index, server_id).await)
}

/// Stop the coordinator and start it again on the same directory; returns the new handle and connection.
pub async fn restart(
    dir: &TempDir,
    coord: CoordinatorHandle,
    conn: RpcConn,
) -> (CoordinatorHandle, RpcConn) {
    drop(conn);
    coord.shutdown().await;
    let coord = start_coordinator(dir).await;
    let conn = connect(&coord).await;
    (coord, conn)
}

/// A coordinator with two fake servers enlisted in order: (metadata
/// directory, coordinator, a connection to it, the shards' control log,
/// server 1's shards, server 2's shards, server 1's id, server 2's id).
pub type TwoServers = (
    TempDir,
    CoordinatorHandle,
    RpcConn,
    Log,
    Vec<FakeShard>,
    Vec<FakeShard>,
    u64,
    u64,
);

/// Start a coordinator on a new directory named after `name` and enlist two
/// fake servers of `shards1` and `shards2` shards.
pub async fn two_servers(name: &str, shards1: usize, shards2: usize) -> TwoServers {
    let dir = TempDir::new(name);
    let coord = start_coordinator(&dir).await;
    let c = connect(&coord).await;
    let log = Log::default();
    let s1 = fake_server(&log, shards1).await;
    let s2 = fake_server(&log, shards2).await;
    let id1 = enlist(&c, addrs(&s1)).await;
    let id2 = enlist(&c, addrs(&s2)).await;
    (dir, coord, c, log, s1, s2, id1, id2)
}

/// A coordinator on a new directory named after `name`, a connection to it,
/// and an empty control log for the fake shards a test starts.
pub async fn coordinator_and_log(name: &str) -> (TempDir, CoordinatorHandle, RpcConn, Log) {
    let dir = TempDir::new(name);
    let coord = start_coordinator(&dir).await;
    let c = connect(&coord).await;
    (dir, coord, c, Log::default())
}

/// A coordinator started with `config`, and a connection to it.
pub async fn start_connected(config: CoordinatorConfig) -> (CoordinatorHandle, RpcConn) {
    let coord = start_coordinator_with(config).await;
    let c = connect(&coord).await;
    (coord, c)
}

/// Start a coordinator on `dir` that forgets every stored server (as `insitu up` does).
pub async fn start_forgetting(dir: &TempDir) -> CoordinatorHandle {
    let mut config = CoordinatorConfig::new(dir.0.clone());
    config.forget_servers = true;
    start_coordinator_with(config).await
}
