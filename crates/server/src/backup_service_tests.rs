//! The backup port before and after its store is installed.

use super::*;
use insitu_client::RpcConn;
use insitu_protocol::{Request, Response};

/// A safety net for awaits that must end; not a performance assertion.
const SAFETY: Duration = Duration::from_secs(20);

/// A backup service's settings for these tests: no disk budget, the
/// default connection limits, no tokens, no TLS.
fn settings(sync: SyncMode) -> BackupSettings {
    BackupSettings {
        sync,
        sync_interval: Duration::from_secs(1),
        disk_budget_bytes: u64::MAX,
        limits: ConnLimits::default(),
        gate: insitu_auth::Gate::open(),
        tls: None,
    }
}

#[tokio::test]
async fn backup_requests_get_retry_until_the_store_is_installed_and_ping_works_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(SyncMode::Always);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (addr, installer, thread, _door) =
        start("127.0.0.1", 0, settings.clone(), stop_rx).unwrap();
    let conn = RpcConn::connect(&addr.to_string()).await.unwrap();
    let call = |r: Request<'static>| {
        let conn = conn.clone();
        async move {
            tokio::time::timeout(SAFETY, conn.call(&r))
                .await
                .unwrap()
                .unwrap()
        }
    };
    let pong = call(Request::Ping).await;
    assert!(matches!(pong.decode().unwrap(), Response::Pong));
    let list = Request::BackupList {
        cluster: 0,
        master: 1,
        fence: false,
    };
    let early = call(list.clone()).await;
    assert_eq!(early.status, Status::Retry, "{}", early.error_message());
    let service = open_store(&dir.path().join(REPLICA_DIR), 0, &settings).unwrap();
    installer.install(service).unwrap();
    // The committer takes the store before the next group, but the
    // install is asynchronous: retry as a master would (bounded).
    let mut answered = None;
    for _ in 0..2000 {
        let reply = call(list.clone()).await;
        if reply.status != Status::Retry {
            answered = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let reply = answered.expect("the installed store answers");
    assert!(matches!(
        reply.decode().unwrap(),
        Response::BackupReplicas { replicas, .. } if replicas.is_empty()
    ));
    let _ = stop_tx.send(true);
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
}

/// The in-process door (`LocalBackup`) reaches the same committer and store
/// as the port: `Retry` before the store is installed, then a write made
/// through the door is listed through the port (and the door), in order
/// with a list in the same job; once the service has stopped the door
/// answers an error instead of hanging.
#[tokio::test]
async fn the_in_process_door_reaches_the_same_store_as_the_port() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(SyncMode::Interval);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (addr, installer, thread, door) = start("127.0.0.1", 0, settings.clone(), stop_rx).unwrap();
    let list = Request::BackupList {
        cluster: 0,
        master: 9,
        fence: false,
    };
    // The door takes a connection's encoded bodies and the replicator's
    // ops alike (`JobBody`); both kinds go through it here.
    let write = || append_of(b"seven b".to_vec());
    let door_call = |bodies: Vec<JobBody>| {
        let door = door.clone();
        async move {
            tokio::time::timeout(SAFETY, door.call(bodies))
                .await
                .unwrap()
        }
    };
    let early = door_call(vec![encoded(&list)]).await.unwrap();
    assert_eq!(early.len(), 1);
    assert_eq!(
        early[0].status,
        Status::Retry,
        "{}",
        early[0].error_message()
    );
    let service = open_store(&dir.path().join(REPLICA_DIR), 0, &settings).unwrap();
    installer.install(service).unwrap();
    // The install is asynchronous: retry as a master would (bounded).
    let mut replies = Vec::new();
    for _ in 0..2000 {
        replies = door_call(vec![write(), encoded(&list)]).await.unwrap();
        if replies[0].status != Status::Retry {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(replies.len(), 2);
    assert_eq!(
        replies[0].status,
        Status::Ok,
        "{}",
        replies[0].error_message()
    );
    assert!(matches!(replies[0].decode().unwrap(), Response::Done));
    let listed = |reply: &insitu_client::rpc::Reply| match reply.decode().unwrap() {
        Response::BackupReplicas { replicas, .. } => replicas
            .iter()
            .map(|r| (r.log, r.table, r.segment, r.bytes))
            .collect::<Vec<_>>(),
        other => panic!("{other:?} to BackupList"),
    };
    // The list after the write in the same job sees it: frames apply in order.
    assert_eq!(listed(&replies[1]), vec![(1, 5, 3, 7)]);
    let conn = RpcConn::connect(&addr.to_string()).await.unwrap();
    let by_port = tokio::time::timeout(SAFETY, conn.call(&list))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(listed(&by_port), vec![(1, 5, 3, 7)]);
    let _ = stop_tx.send(true);
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
    let after = door_call(vec![encoded(&list)]).await;
    assert!(after.is_err(), "a stopped service cannot answer");
}

/// The backup port bounds its connections as a shard does (the same
/// `Inbox`): a frame not completed within the stall timeout is answered
/// why, then closed; a connection that sends nothing is closed at the idle
/// timeout.
#[tokio::test]
async fn the_backup_port_closes_stalled_and_idle_connections() {
    let mut settings = settings(SyncMode::Interval);
    settings.limits.stall_timeout = Duration::from_millis(300);
    settings.limits.idle_timeout = Duration::from_millis(300);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (addr, _installer, thread, _door) = start("127.0.0.1", 0, settings, stop_rx).unwrap();
    insitu_testkit::raw::check_stalled_and_idle_closed(&addr.to_string(), 300).await;
    let _ = stop_tx.send(true);
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
}

/// `r` as a connection hands it to the committer.
fn encoded(r: &Request) -> JobBody {
    let mut body = BytesMut::new();
    insitu_protocol::encode_request(&mut body, 0, r).unwrap();
    body.advance(HEADER_BYTES);
    JobBody::Encoded {
        body,
        append: is_append(r),
    }
}

/// A replicator's append of `bytes` to segment 3 of master 9's log 1.
fn append_of(bytes: Vec<u8>) -> JobBody {
    JobBody::Write {
        cluster: 0,
        master: 9,
        ops: vec![crate::replicate::OwnedOp::Append {
            log: 1,
            table: 5,
            start_hash: 0,
            segment: 3,
            offset: 0,
            bytes: bytes::Bytes::from(bytes),
            close: false,
        }],
    }
}

/// Only small groups of appends run on the service thread: a `BackupRead`,
/// `BackupList` or `BackupForget` is a few bytes that can read, verify or
/// delete whole replica files, and a ping waiting behind that work on a
/// loaded machine can go unanswered past the failure timeout.
#[test]
fn only_small_groups_of_appends_run_on_the_service_thread() {
    let append = |n: usize| append_of(vec![7u8; n]);
    let read = || {
        encoded(&Request::BackupRead {
            cluster: 0,
            master: 9,
            log: 1,
            segment: 3,
            offset: 0,
            max_bytes: 2 << 20,
        })
    };
    let list = || {
        encoded(&Request::BackupList {
            cluster: 0,
            master: 9,
            fence: false,
        })
    };
    let forget = || {
        encoded(&Request::BackupForget {
            cluster: 0,
            master: 9,
        })
    };
    let free_log = || {
        encoded(&Request::BackupWrite {
            cluster: 0,
            master: 9,
            ops: vec![insitu_protocol::BackupOp::FreeLog { log: 1 }],
        })
    };
    let write = || {
        encoded(&Request::BackupWrite {
            cluster: 0,
            master: 9,
            ops: Vec::new(),
        })
    };
    let group = |jobs: Vec<Vec<JobBody>>| -> Vec<Vec<(u64, JobBody)>> {
        jobs.into_iter()
            .map(|j| {
                j.into_iter()
                    .enumerate()
                    .map(|(i, b)| (i as u64, b))
                    .collect()
            })
            .collect()
    };
    let interval = SyncMode::Interval;
    assert!(runs_inline(
        interval,
        &group(vec![vec![append(100), write()], vec![append(100)]])
    ));
    // Anything but appends goes to the blocking pool, however small.
    for other in [read(), list(), forget(), free_log()] {
        assert!(!runs_inline(interval, &group(vec![vec![other]])));
    }
    assert!(!runs_inline(
        interval,
        &group(vec![vec![append(100)], vec![read()]])
    ));
    // Appends too big for the thread, or any group that fsyncs.
    assert!(!runs_inline(
        interval,
        &group(vec![vec![append(INLINE_GROUP_BYTES + 1)]])
    ));
    assert!(!runs_inline(
        SyncMode::Always,
        &group(vec![vec![append(100)]])
    ));
}
