//! The backup port before and after its store is installed.

use super::*;
use insitu_client::RpcConn;
use insitu_protocol::{Request, Response};

/// A safety net for awaits that must end; not a performance assertion.
const SAFETY: Duration = Duration::from_secs(20);

#[tokio::test]
async fn backup_requests_get_retry_until_the_store_is_installed_and_ping_works_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let settings = BackupSettings {
        sync: SyncMode::Always,
        sync_interval: Duration::from_secs(1),
        disk_budget_bytes: u64::MAX,
        limits: ConnLimits::default(),
        gate: insitu_auth::Gate::open(),
        tls: None,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let (addr, installer, thread) = start("127.0.0.1", 0, settings.clone(), stop_rx).unwrap();
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
        Response::BackupReplicas { replicas } if replicas.is_empty()
    ));
    let _ = stop_tx.send(true);
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
}
