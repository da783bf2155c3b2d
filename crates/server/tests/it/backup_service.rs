//! The backup service of a real server, spoken to over its own port: pings,
//! replica writes and reads, a restart with the same directory (replicas
//! still there, flushed at shutdown), a flipped byte on disk (read refused),
//! a malformed frame, and a replica store of another cluster (start fails).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::BytesMut;
use insitu_client::RpcConn;
use insitu_protocol::frame::{FrameKind, HEADER_BYTES, Header, check_header, put_header};
use insitu_protocol::{BackupOp, Request, Response, Status, blob};
use insitu_server::{REPLICA_DIR, ServerConfig, ServerHandle, SyncMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common;

/// A safety net for awaits that must end; not a performance assertion.
const SAFETY: Duration = Duration::from_secs(20);
const MASTER: u64 = 77;

async fn start_server(coordinator: &str, dir: &Path) -> anyhow::Result<ServerHandle> {
    let mut config = ServerConfig::new(coordinator, dir);
    config.shards = 1;
    // Interval mode with a long interval: what survives a restart below was
    // made durable by the flush at shutdown.
    config.sync = SyncMode::Interval;
    config.sync_interval = Duration::from_secs(3600);
    insitu_server::start(config).await
}

/// `call`, repeated while the service answers `Retry`: its replica store
/// opens once the server has enlisted, which can be a moment after `start`
/// returns (seen in CI right after a restart).
async fn call_when_open(
    conn: &RpcConn,
    request: &Request<'_>,
) -> (Status, Response<'static>, String) {
    let deadline = tokio::time::Instant::now() + SAFETY;
    loop {
        let reply = call(conn, request).await;
        if reply.0 != Status::Retry || tokio::time::Instant::now() > deadline {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn call(conn: &RpcConn, request: &Request<'_>) -> (Status, Response<'static>, String) {
    let reply = tokio::time::timeout(SAFETY, conn.call(request))
        .await
        .expect("the backup service answers")
        .unwrap();
    let message = reply.error_message();
    let body = match reply.decode().unwrap() {
        Response::Pong => Response::Pong,
        Response::Done => Response::Done,
        Response::Error { message } => Response::Error { message },
        Response::BackupReplicas { replicas, digests } => {
            Response::BackupReplicas { replicas, digests }
        }
        Response::BackupBytes { bytes, end } => {
            // Leak the few test bytes so the response outlives the reply.
            let bytes: &'static [u8] = Box::leak(bytes.to_vec().into_boxed_slice());
            Response::BackupBytes {
                bytes: blob(bytes),
                end,
            }
        }
        other => panic!("unexpected reply {other:?}"),
    };
    (reply.status, body, message)
}

fn write_request(cluster: u64, bytes: &[u8]) -> Request<'_> {
    write_segment(cluster, 1, bytes)
}

fn write_segment(cluster: u64, segment: u64, bytes: &[u8]) -> Request<'_> {
    append(cluster, segment, 0, bytes, true)
}

/// `bytes` at `offset` of segment `segment` of log 3 (closing it if `close`).
fn append(cluster: u64, segment: u64, offset: u64, bytes: &[u8], close: bool) -> Request<'_> {
    Request::BackupWrite {
        cluster,
        master: MASTER,
        ops: vec![BackupOp::Append {
            log: 3,
            table: 9,
            start_hash: 0,
            segment,
            offset,
            bytes: blob(bytes),
            close,
        }],
    }
}

fn read_request(cluster: u64) -> Request<'static> {
    Request::BackupRead {
        cluster,
        master: MASTER,
        log: 3,
        segment: 1,
        offset: 0,
        max_bytes: 1 << 20,
    }
}

fn replica_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join(REPLICA_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "replica"))
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn replicas_are_written_read_kept_across_a_restart_and_verified() {
    let (dir, coordinator) = common::start_coordinator().await;
    let caddr = coordinator.addr().to_string();
    let sdir = dir.path().join("s");
    let server = start_server(&caddr, &sdir).await.unwrap();
    let cluster = server.cluster_id;
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();

    let conn = RpcConn::connect(&server.backup_addr.to_string())
        .await
        .unwrap();
    assert!(matches!(
        call(&conn, &Request::Ping).await.1,
        Response::Pong
    ));
    let (status, _, _) = call_when_open(&conn, &write_request(cluster, &data)).await;
    assert_eq!(status, Status::Ok);
    match call(&conn, &read_request(cluster)).await {
        (Status::Ok, Response::BackupBytes { bytes, end }, _) => {
            assert_eq!(bytes.as_ref(), &data[..]);
            assert!(end);
        }
        other => panic!("{other:?}"),
    }
    // Another cluster's write and a data request are refused with reasons.
    let (status, _, message) = call(&conn, &write_request(cluster ^ 1, &data)).await;
    assert_eq!(status, Status::BadRequest);
    assert!(message.contains("cluster"), "{message}");
    let (status, _, message) = call(&conn, &Request::ListTables).await;
    assert_eq!(status, Status::BadRequest);
    assert!(message.contains("backup service"), "{message}");
    // Acknowledged from memory (interval mode); only the flush at shutdown
    // writes it before the restart below.
    let (status, _, _) = call(&conn, &write_segment(cluster, 2, b"second")).await;
    assert_eq!(status, Status::Ok);
    drop(conn);
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();

    // Same directory: the replica is found again.
    let server = start_server(&caddr, &sdir).await.unwrap();
    let conn = RpcConn::connect(&server.backup_addr.to_string())
        .await
        .unwrap();
    let list = Request::BackupList {
        cluster,
        master: MASTER,
        fence: false,
    };
    match call_when_open(&conn, &list).await {
        (Status::Ok, Response::BackupReplicas { replicas, .. }, _) => {
            assert_eq!(replicas.len(), 2, "{replicas:?}");
            let r = &replicas[0];
            assert_eq!((r.log, r.table, r.segment), (3, 9, 1));
            assert_eq!((r.bytes, r.closed), (data.len() as u64, true));
            assert_eq!((replicas[1].segment, replicas[1].bytes), (2, 6));
        }
        other => panic!("{other:?}"),
    }

    // A flipped byte in the middle of the data: the read is refused, naming
    // the replica, so a recovery reads it from another backup.
    let files = replica_files(&sdir);
    assert_eq!(files.len(), 2);
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&files[0], &bytes).unwrap();
    let (status, _, message) = call(&conn, &read_request(cluster)).await;
    assert_eq!(status, Status::Internal);
    assert!(message.contains("corrupt"), "{message}");
    assert!(message.contains("another backup"), "{message}");

    // A fenced master's writes are refused.
    let fence = Request::BackupList {
        cluster,
        master: MASTER,
        fence: true,
    };
    assert_eq!(call(&conn, &fence).await.0, Status::Ok);
    assert_eq!(
        call(&conn, &write_request(cluster, &data)).await.0,
        Status::Fenced
    );

    // A frame announcing a body over the limit is refused from its header
    // alone, and the connection closed.
    let mut raw = TcpStream::connect(server.backup_addr).await.unwrap();
    let mut frame = BytesMut::new();
    let header = Header {
        kind: FrameKind::Request,
        request_id: 5,
        status: Status::Ok,
    };
    put_header(&mut frame, &header, 64 << 20);
    raw.write_all(&frame).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(SAFETY, raw.read_to_end(&mut reply))
        .await
        .expect("closed after the refusal")
        .unwrap();
    let (h, _) = check_header(&reply, usize::MAX).unwrap().unwrap();
    assert_eq!(h.status, Status::BadRequest);
    assert!(reply.len() > HEADER_BYTES);

    drop(conn);
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
    coordinator.shutdown().await;
}

/// Appends `data` as segment `segment` of log 3 in `BackupWrite`s of at
/// most 1 MiB each (a frame carries at most 4 MiB), closing it.
async fn write_whole(conn: &RpcConn, cluster: u64, segment: u64, data: &[u8]) {
    let chunks: Vec<&[u8]> = data.chunks(1 << 20).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let request = append(
            cluster,
            segment,
            (i << 20) as u64,
            chunk,
            i + 1 == chunks.len(),
        );
        let (status, _, message) = call_when_open(conn, &request).await;
        assert_eq!(status, Status::Ok, "{message}");
    }
}

#[tokio::test]
async fn a_recovery_reads_small_and_large_replicas_whole() {
    let node = common::start(|_| {}).await;
    let cluster = node.server.cluster_id;
    let conn = RpcConn::connect(&node.server.backup_addr.to_string())
        .await
        .unwrap();
    // One segment bigger than a `BackupRead` answers (read in chunks), one
    // that comes in a single reply (handed on without a copy).
    let big: Vec<u8> = (0..(5u32 << 20) + 77).map(|i| (i % 253) as u8).collect();
    let small: Vec<u8> = (0..1000u32).map(|i| (i % 7) as u8).collect();
    write_whole(&conn, cluster, 1, &big).await;
    write_whole(&conn, cluster, 2, &small).await;
    let read = |segment: u64, len: u64| {
        tokio::time::timeout(
            SAFETY,
            insitu_server::read_replica(&conn, cluster, MASTER, 3, segment, len),
        )
    };
    let got = read(1, big.len() as u64).await.unwrap().unwrap();
    assert!(got[..] == big[..], "the big replica came back different");
    let got = read(2, small.len() as u64).await.unwrap().unwrap();
    assert_eq!(&got[..], &small[..]);
    // Listed longer than it is: a short read is an error, not a silent cut.
    let err = read(2, small.len() as u64 + 1).await.unwrap().unwrap_err();
    assert!(err.contains("short read"), "{err}");
}

#[tokio::test]
async fn a_replica_store_of_another_cluster_stops_the_server_from_starting() {
    let (dir, coordinator) = common::start_coordinator().await;
    let caddr = coordinator.addr().to_string();
    let sdir = dir.path().join("s");
    // Learn this cluster's id, then leave a replica of another cluster.
    let server = start_server(&caddr, &sdir).await.unwrap();
    let foreign = server.cluster_id.wrapping_add(0x5eed);
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
    let config = insitu_backup::BackupConfig {
        dir: sdir.join(REPLICA_DIR),
        cluster: foreign,
        disk_budget_bytes: 1 << 20,
        buffer_budget_bytes: 1 << 20,
        record_slice_bytes: insitu_backup::RECORD_SLICE_BYTES,
        sync: SyncMode::Always,
    };
    let (mut store, _) =
        insitu_backup::BackupStore::open(config, insitu_backup::FsIo::default()).unwrap();
    let id = insitu_backup::ReplicaId {
        master: 1,
        log: 1,
        segment: 1,
    };
    store
        .append(
            id,
            insitu_backup::Tablet::default(),
            0,
            b"x",
            false,
            insitu_backup::AppendMode::Synced,
        )
        .unwrap();
    drop(store);

    let err = match start_server(&caddr, &sdir).await {
        Ok(_) => panic!("a server started on another cluster's replicas"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("another --dir"), "{err}");
    assert!(err.contains(REPLICA_DIR), "{err}");
    coordinator.shutdown().await;
}
