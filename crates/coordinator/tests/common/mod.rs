//! Test support: a coordinator on a temporary directory, fake storage shards
//! that record the control requests they get, and RPC helpers.
#![allow(dead_code)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use insitu_client::rpc::{Reply, RpcConn};
use insitu_coordinator::{CoordinatorConfig, CoordinatorHandle};
use insitu_protocol::{
    FrameCodec, Request, Response, ServerInfo, Status, TableInfo, TabletState, decode_request,
    encode_error, encode_response,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

/// A control request as a fake shard saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ctl {
    Take {
        table: u64,
        start: u64,
        end: u64,
        version: u64,
        state: TabletState,
    },
    Drop {
        table: u64,
        start: u64,
    },
    Migrate {
        table: u64,
        start: u64,
        dest: String,
    },
    Activate {
        table: u64,
        start: u64,
        version: u64,
    },
}

impl Ctl {
    pub fn kind(&self) -> &'static str {
        match self {
            Ctl::Take { .. } => "Take",
            Ctl::Drop { .. } => "Drop",
            Ctl::Migrate { .. } => "Migrate",
            Ctl::Activate { .. } => "Activate",
        }
    }
}

/// Every control request received by any fake shard, in arrival order: (shard address, request).
pub type Log = Arc<Mutex<Vec<(String, Ctl)>>>;

pub struct FakeShard {
    pub addr: String,
    /// Request kinds ("Take", "Drop", "Migrate", "Activate") this shard refuses.
    pub fail: Arc<Mutex<HashSet<&'static str>>>,
    /// Request kinds this shard logs and never answers (a stuck or paused process).
    pub hang: Arc<Mutex<HashSet<&'static str>>>,
    /// Request kinds on which this shard closes the connection without a reply (a dead process).
    pub close: Arc<Mutex<HashSet<&'static str>>>,
    /// Set: the shard answers nothing any more, pings included (a hung or
    /// crashed process, as the failure detector sees it).
    pub silent: Arc<AtomicBool>,
    /// Server ids of the `ServerDown` notices this shard got, in order.
    pub downs: Arc<Mutex<Vec<u64>>>,
    /// How many pings this shard answered.
    pub pings: Arc<AtomicU64>,
    /// Cancelled: the process is gone (killed). The listener closes, so a
    /// connect is refused, and every open connection closes.
    pub gone: CancellationToken,
}

/// A fake storage shard: answers control requests with Done (or an injected
/// error) and records them in `log`.
pub async fn fake_shard(log: Log) -> FakeShard {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fake shard");
    let addr = listener.local_addr().expect("local addr").to_string();
    let fail: Arc<Mutex<HashSet<&'static str>>> = Arc::default();
    let hang: Arc<Mutex<HashSet<&'static str>>> = Arc::default();
    let close: Arc<Mutex<HashSet<&'static str>>> = Arc::default();
    let silent: Arc<AtomicBool> = Arc::default();
    let downs: Arc<Mutex<Vec<u64>>> = Arc::default();
    let pings: Arc<AtomicU64> = Arc::default();
    let (addr2, fail2, hang2, close2) = (addr.clone(), fail.clone(), hang.clone(), close.clone());
    let (silent2, downs2, pings2) = (silent.clone(), downs.clone(), pings.clone());
    let gone = CancellationToken::new();
    let gone2 = gone.clone();
    tokio::spawn(async move {
        // Returning drops the listener: connects are refused from then on.
        while let Some(Ok((stream, _))) = gone2.run_until_cancelled(listener.accept()).await {
            let (log, addr, fail) = (log.clone(), addr2.clone(), fail2.clone());
            let (hang, close) = (hang2.clone(), close2.clone());
            let (silent, downs, pings) = (silent2.clone(), downs2.clone(), pings2.clone());
            let gone = gone2.clone();
            // Cancelling drops the connection's future, closing its socket.
            tokio::spawn(gone.run_until_cancelled_owned(async move {
                let (read_half, mut write_half) = stream.into_split();
                let mut frames = FramedRead::new(read_half, FrameCodec::default());
                while let Some(Ok(frame)) = frames.next().await {
                    let id = frame.header.request_id;
                    let mut out = BytesMut::new();
                    if silent.load(Ordering::SeqCst) {
                        continue;
                    }
                    let request = decode_request(&frame.body);
                    if matches!(request, Ok(Request::Ping)) {
                        pings.fetch_add(1, Ordering::SeqCst);
                        encode_response(&mut out, id, Status::Ok, &Response::Pong).unwrap();
                        if write_half.write_all(&out).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    // A fake shard holds no data: a recovery onto it
                    // recovers an empty tablet (held Receiving until the
                    // coordinator activates it).
                    if let Ok(Request::RecoverTablet {
                        table,
                        start_hash,
                        end_hash,
                        map_version,
                        ..
                    }) = request
                    {
                        log.lock().unwrap().push((
                            addr.clone(),
                            Ctl::Take {
                                table,
                                start: start_hash,
                                end: end_hash,
                                version: map_version,
                                state: TabletState::Receiving,
                            },
                        ));
                        // "Take" failures cover recoveries too (both place a tablet here).
                        if fail.lock().unwrap().contains("Take") {
                            encode_error(
                                &mut out,
                                id,
                                Status::Internal,
                                "fake shard: recovery refused",
                            );
                        } else {
                            let reply = Response::Recovered {
                                objects: 0,
                                segments: 0,
                                bytes: 0,
                            };
                            encode_response(&mut out, id, Status::Ok, &reply).unwrap();
                        }
                        if write_half.write_all(&out).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    if let Ok(Request::ServerDown { server_id }) = request {
                        downs.lock().unwrap().push(server_id);
                        encode_response(&mut out, id, Status::Ok, &Response::Done).unwrap();
                        if write_half.write_all(&out).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    let ctl = match request {
                        Ok(Request::TakeTablet {
                            table,
                            start_hash,
                            end_hash,
                            map_version,
                            state,
                            ..
                        }) => Some(Ctl::Take {
                            table,
                            start: start_hash,
                            end: end_hash,
                            version: map_version,
                            state,
                        }),
                        Ok(Request::DropTablet {
                            table, start_hash, ..
                        }) => Some(Ctl::Drop {
                            table,
                            start: start_hash,
                        }),
                        Ok(Request::MigrateTablet {
                            table,
                            start_hash,
                            dest_addr,
                            ..
                        }) => Some(Ctl::Migrate {
                            table,
                            start: start_hash,
                            dest: dest_addr,
                        }),
                        Ok(Request::ActivateTablet {
                            table,
                            start_hash,
                            map_version,
                        }) => Some(Ctl::Activate {
                            table,
                            start: start_hash,
                            version: map_version,
                        }),
                        _ => None,
                    };
                    match ctl {
                        None => encode_error(
                            &mut out,
                            id,
                            Status::BadRequest,
                            "fake shard: unexpected request",
                        ),
                        Some(ctl) => {
                            let kind = ctl.kind();
                            let refuse = fail.lock().unwrap().contains(kind);
                            log.lock().unwrap().push((addr.clone(), ctl));
                            if hang.lock().unwrap().contains(kind) {
                                std::future::pending::<()>().await;
                            }
                            if close.lock().unwrap().contains(kind) {
                                break;
                            }
                            if refuse {
                                encode_error(
                                    &mut out,
                                    id,
                                    Status::Internal,
                                    "fake shard: injected failure",
                                );
                            } else {
                                encode_response(&mut out, id, Status::Ok, &Response::Done).unwrap();
                            }
                        }
                    }
                    if write_half.write_all(&out).await.is_err() {
                        break;
                    }
                }
            }));
        }
    });
    FakeShard {
        addr,
        fail,
        hang,
        close,
        silent,
        downs,
        pings,
        gone,
    }
}

/// A fake server: `shards` fake shards.
pub async fn fake_server(log: &Log, shards: usize) -> Vec<FakeShard> {
    let mut v = Vec::new();
    for _ in 0..shards {
        v.push(fake_shard(log.clone()).await);
    }
    v
}

pub fn addrs(server: &[FakeShard]) -> Vec<String> {
    server.iter().map(|s| s.addr.clone()).collect()
}

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

pub fn take_log(log: &Log) -> Vec<(String, Ctl)> {
    std::mem::take(&mut *log.lock().unwrap())
}

/// Wait (at most 10 s) until `log` holds an entry that `pred` accepts.
pub async fn wait_for_log(log: &Log, what: &str, pred: impl Fn(&(String, Ctl)) -> bool) {
    let seen = insitu_testkit::poll_until(2000, || log.lock().unwrap().iter().any(&pred)).await;
    assert!(seen, "never saw {what}: {:?}", log.lock().unwrap());
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

/// The TakeTablet a shard gets for tablet `index` of `table`, at `version` in `state`.
pub fn take_of(table: &TableInfo, index: usize, version: u64, state: TabletState) -> Ctl {
    let tablet = &table.tablets[index];
    Ctl::Take {
        table: table.id,
        start: tablet.start_hash,
        end: tablet.end_hash,
        version,
        state,
    }
}

/// The first two steps of moving tablet `index` of `table` from `src` to
/// `dest`: TakeTablet Receiving on the destination, then MigrateTablet on the source.
pub fn move_start_log(
    table: &TableInfo,
    index: usize,
    src: &str,
    dest: &str,
) -> Vec<(String, Ctl)> {
    let take = take_of(table, index, table.map_version, TabletState::Receiving);
    let migrate = Ctl::Migrate {
        table: table.id,
        start: table.tablets[index].start_hash,
        dest: dest.to_string(),
    };
    vec![(dest.to_string(), take), (src.to_string(), migrate)]
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
