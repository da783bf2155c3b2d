//! Failure detection and dead servers: a silent server is declared dead,
//! its tablets wait for recovery (`Retry`) and are then recovered onto live
//! servers; `RemoveServer`; the cluster id and R across restarts; a dead
//! server that comes back is a new server.
//!
//! No wall-clock assertions: every wait polls for a state with a generous
//! deadline (`servers_when`, `open_when_ready`: 10 s).

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use insitu_client::rpc::RpcConn;
use insitu_coordinator::CoordinatorConfig;
use insitu_protocol::{Request, Response, ServerInfo, ServerState, Status};

/// Frequent pings; a failure timeout long enough that a loaded test machine
/// never makes a live fake server miss it (a death takes about a second).
fn fast(dir: &TempDir) -> CoordinatorConfig {
    let mut config = CoordinatorConfig::new(dir.0.clone());
    config.ping_interval = Duration::from_millis(20);
    config.failure_timeout = Duration::from_millis(1000);
    config
}

/// `fast`, with recovery waiting for two live servers (so a dead state can be observed).
fn fast_waiting_for_two(dir: &TempDir) -> CoordinatorConfig {
    let mut config = fast(dir);
    config.rehome_after_servers = 2;
    config
}

/// `fast_waiting_for_two` with failure detection too slow to matter.
fn never_detecting(dir: &TempDir) -> CoordinatorConfig {
    let mut config = fast_waiting_for_two(dir);
    config.failure_timeout = Duration::from_secs(3600);
    config
}

fn state_of(servers: &[ServerInfo], id: u64) -> Option<ServerState> {
    servers.iter().find(|s| s.id == id).map(|s| s.state)
}

/// Enlist with an identity and a backup address; the whole reply.
async fn enlist_full(
    c: &RpcConn,
    shard_addrs: Vec<String>,
    identity: &str,
    backup_addr: &str,
) -> (u64, u64, u32) {
    let request = Request::Enlist {
        shard_addrs,
        identity: identity.into(),
        replace: false,
        backup_addr: backup_addr.into(),
    };
    match expect_ok(&call(c, request).await) {
        Response::Enlisted {
            server_id,
            cluster_id,
            replicas,
        } => (server_id, cluster_id, replicas),
        other => panic!("expected Enlisted, got {other:?}"),
    }
}

#[tokio::test]
async fn a_silent_server_is_declared_dead_and_its_tablets_recovered() {
    let dir = TempDir::new("silent");
    // Recovery waits for two live servers: the dead state can be observed.
    let (coord, c) = start_connected(fast_waiting_for_two(&dir)).await;
    let log = Log::default();
    let s1 = fake_server(&log, 1).await;
    let s2 = fake_server(&log, 1).await;
    // s2 is pinged at its backup address, not at its shard.
    let backup2 = fake_shard(log.clone()).await;
    let id1 = enlist(&c, addrs(&s1)).await;
    let (id2, ..) = enlist_full(&c, addrs(&s2), "s2", &backup2.addr).await;
    let servers = list_servers(&c).await;
    assert_eq!(servers[1].backup_addr, backup2.addr);
    assert!(servers.iter().all(|s| s.state == ServerState::Up));
    let t = create(&c, "t", 4).await;
    assert!(t.tablets.iter().any(|x| x.server_id == id2));
    take_log(&log);

    // Both keep answering: nobody is declared dead meanwhile.
    insitu_testkit::poll_until(2000, || {
        backup2.pings.load(Ordering::SeqCst) >= 3 && s1[0].pings.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert!(
        backup2.pings.load(Ordering::SeqCst) >= 3,
        "the backup address is pinged"
    );
    assert_eq!(s2[0].pings.load(Ordering::SeqCst), 0, "not the shard");
    assert!(
        list_servers(&c)
            .await
            .iter()
            .all(|s| s.state == ServerState::Up)
    );

    // s2's process hangs (its backup service answers nothing): dead.
    backup2.silent.store(true, Ordering::SeqCst);
    let servers = servers_when(&c, "s2 dead", |s| {
        state_of(s, id2) == Some(ServerState::Dead)
    })
    .await;
    assert_eq!(state_of(&servers, id1), Some(ServerState::Up));
    // Its tablets are unavailable (clients back off), listed without an address.
    let reply = call(&c, Request::TableMap { table: t.id }).await;
    let msg = expect_err(&reply, Status::Retry);
    assert!(msg.contains("has no live server yet"), "{msg}");
    let listed = list_tables(&c).await;
    for x in &listed[0].tablets {
        assert_eq!(x.addr.is_empty(), x.server_id == id2, "{x:?}");
    }
    // The live shard was told.
    insitu_testkit::poll_until(2000, || !s1[0].downs.lock().unwrap().is_empty()).await;
    assert_eq!(*s1[0].downs.lock().unwrap(), vec![id2]);
    // Moves to or from it are refused.
    let from = t.tablets.iter().position(|x| x.server_id == id2).unwrap() as u32;
    expect_err(&try_move(&c, "t", from, id1).await, Status::Retry);
    let to = t.tablets.iter().position(|x| x.server_id == id1).unwrap() as u32;
    expect_err(&try_move(&c, "t", to, id2).await, Status::UnknownServer);

    // A second live server arrives: recovery runs, the dead one is forgotten.
    let s3 = fake_server(&log, 1).await;
    let id3 = enlist(&c, addrs(&s3)).await;
    let t2 = open_when_ready(&c, "t").await;
    assert_covers_hash_space(&t2);
    for (old, new) in t.tablets.iter().zip(&t2.tablets) {
        if old.server_id == id2 {
            assert!(new.server_id == id1 || new.server_id == id3, "{new:?}");
            assert!(new.map_version > t.map_version);
        } else {
            assert_eq!(old, new);
        }
    }
    servers_when(&c, "id1 and id3", |s| server_ids(s) == vec![id1, id3]).await;
    drop(c);
    coord.shutdown().await;
}

/// Two servers, the second pinged at a backup address whose process is
/// killed (`gone`: its port refuses connections) after it answered pings,
/// or before its first one. The failure timeout is an hour. Returns both
/// servers' states: once the second is dead (when killed after answering),
/// or after 15 refused pings (when killed before).
async fn refusing_backup(name: &str, killed_after_answering: bool) -> [Option<ServerState>; 2] {
    let dir = TempDir::new(name);
    let (coord, c) = start_connected(never_detecting(&dir)).await;
    let log = Log::default();
    let s1 = fake_server(&log, 1).await;
    let s2 = fake_server(&log, 1).await;
    let backup2 = fake_shard(log.clone()).await;
    if !killed_after_answering {
        backup2.gone.cancel();
    }
    let id1 = enlist(&c, addrs(&s1)).await;
    let (id2, ..) = enlist_full(&c, addrs(&s2), "s2", &backup2.addr).await;
    let servers = if killed_after_answering {
        insitu_testkit::poll_until(5000, || backup2.pings.load(Ordering::SeqCst) >= 2).await;
        let answered = backup2.pings.load(Ordering::SeqCst);
        assert!(answered >= 2, "s2 answered {answered} pings");
        // The established ping connection closes, a new one is refused.
        backup2.gone.cancel();
        servers_when(&c, "s2 dead", |s| {
            state_of(s, id2) == Some(ServerState::Dead)
        })
        .await
    } else {
        // 20 ms pings: 300 ms is 15 refused pings.
        tokio::time::sleep(Duration::from_millis(300)).await;
        list_servers(&c).await
    };
    drop(c);
    coord.shutdown().await;
    [state_of(&servers, id1), state_of(&servers, id2)]
}

/// A killed process is declared dead at once, not after the timeout.
#[tokio::test]
async fn a_server_whose_port_refuses_is_dead_without_the_timeout() {
    let states = refusing_backup("refused", true).await;
    assert_eq!(states, [Some(ServerState::Up), Some(ServerState::Dead)]);
}

/// One never seen answering is not: it may be a server of a previous run,
/// restarting.
#[tokio::test]
async fn a_server_never_seen_answering_gets_the_full_timeout() {
    let states = refusing_backup("refused-unseen", false).await;
    assert_eq!(states, [Some(ServerState::Up), Some(ServerState::Up)]);
}

#[tokio::test]
async fn remove_server_declares_it_dead_now() {
    let dir = TempDir::new("remove");
    // Detection slow enough not to matter here.
    let (coord, c) = start_connected(never_detecting(&dir)).await;
    let log = Log::default();
    let s1 = fake_server(&log, 1).await;
    let s2 = fake_server(&log, 2).await;
    let id1 = enlist(&c, addrs(&s1)).await;
    let id2 = enlist(&c, addrs(&s2)).await;
    let t = create(&c, "t", 3).await;

    let unknown = call(&c, Request::RemoveServer { server_id: 999 }).await;
    let msg = expect_err(&unknown, Status::UnknownServer);
    assert!(msg.contains("999"), "{msg}");

    let reply = call(&c, Request::RemoveServer { server_id: id2 }).await;
    assert!(matches!(expect_ok(&reply), Response::Done));
    // Dead at once (the reply follows the commit); the live shard was told.
    let servers = list_servers(&c).await;
    assert_eq!(state_of(&servers, id2), Some(ServerState::Dead));
    assert_eq!(state_of(&servers, id1), Some(ServerState::Up));
    assert_eq!(*s1[0].downs.lock().unwrap(), vec![id2]);
    assert!(s2.iter().all(|s| s.downs.lock().unwrap().is_empty()));
    expect_err(
        &call(&c, Request::TableMap { table: t.id }).await,
        Status::Retry,
    );
    // Again: not an error, nothing more happens.
    let again = call(&c, Request::RemoveServer { server_id: id2 }).await;
    assert!(matches!(expect_ok(&again), Response::Done));
    assert_eq!(s1[0].downs.lock().unwrap().len(), 1);

    // The death is durable: after a restart it is still dead, still waiting.
    let (coord, c) = {
        drop(c);
        coord.shutdown().await;
        start_connected(never_detecting(&dir)).await
    };
    assert_eq!(
        state_of(&list_servers(&c).await, id2),
        Some(ServerState::Dead)
    );
    assert_eq!(coord.awaiting_recovery_table_names(), ["t"]);
    // Once a second live server is in, its tablets are recovered.
    let s3 = fake_server(&log, 1).await;
    let id3 = enlist(&c, addrs(&s3)).await;
    let t2 = open_when_ready(&c, "t").await;
    assert!(
        t2.tablets
            .iter()
            .all(|x| x.server_id == id1 || x.server_id == id3)
    );
    servers_when(&c, "id1 and id3", |s| server_ids(s) == vec![id1, id3]).await;
    drop(c);
    coord.shutdown().await;
}

#[tokio::test]
async fn cluster_id_is_stable_and_the_configured_replicas_win() {
    let dir = TempDir::new("clusterid");
    let log = Log::default();
    let s1 = fake_server(&log, 1).await;
    let mut config = CoordinatorConfig::new(dir.0.clone());
    config.replicas = 3;
    let coord = start_coordinator_with(config).await;
    assert_ne!(coord.cluster_id(), 0);
    assert_eq!(coord.replicas(), 3);
    let c = connect(&coord).await;
    let (_, cluster, replicas) = enlist_full(&c, addrs(&s1), "a", "").await;
    assert_eq!((cluster, replicas), (coord.cluster_id(), 3));
    drop(c);
    coord.shutdown().await;

    // Restarted with the default R (2): same cluster, the new R.
    let coord = start_coordinator(&dir).await;
    assert_eq!(coord.cluster_id(), cluster);
    let c = connect(&coord).await;
    let (_, cluster2, replicas2) = enlist_full(&c, addrs(&s1), "a", "").await;
    assert_eq!((cluster2, replicas2), (cluster, 2));
    drop(c);
    coord.shutdown().await;

    // Another directory is another cluster; R = 0 is accepted (in-memory only).
    let other = TempDir::new("clusterid-other");
    let mut config = CoordinatorConfig::new(other.0.clone());
    config.replicas = 0;
    let coord = start_coordinator_with(config).await;
    assert_ne!(coord.cluster_id(), cluster);
    assert_eq!(coord.replicas(), 0);
    coord.shutdown().await;

    // Settings that cannot work are refused, naming the setting.
    let bad = TempDir::new("clusterid-bad");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = CoordinatorConfig::new(bad.0.clone());
    config.replicas = 99;
    let e = insitu_coordinator::start(config, listener)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("replicas"), "{e}");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = CoordinatorConfig::new(bad.0.clone());
    config.failure_timeout = config.ping_interval;
    let e = insitu_coordinator::start(config, listener)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("failure timeout"), "{e}");
}

#[tokio::test]
async fn a_dead_server_that_comes_back_is_a_new_server() {
    let dir = TempDir::new("comeback");
    let (coord, c) = start_connected(fast_waiting_for_two(&dir)).await;
    let log = Log::default();
    let s1 = fake_server(&log, 1).await;
    let s2 = fake_server(&log, 1).await;
    let id1 = enlist_as(&c, addrs(&s1), "one", false).await;
    let id2 = enlist_as(&c, addrs(&s2), "two", false).await;
    create(&c, "t", 2).await;

    // s2 stalls long enough to be declared dead (no backup address: its
    // shard 0 is pinged).
    s2[0].silent.store(true, Ordering::SeqCst);
    servers_when(&c, "s2 dead", |s| {
        state_of(s, id2) == Some(ServerState::Dead)
    })
    .await;
    // It wakes up and enlists again, same identity and addresses: a new id,
    // no refusal (a dead server's addresses are free); the old id stays dead
    // until its tablets are recovered, then is forgotten.
    s2[0].silent.store(false, Ordering::SeqCst);
    let again = enlist_as(&c, addrs(&s2), "two", false).await;
    assert!(again > id2);
    let t = open_when_ready(&c, "t").await;
    assert!(
        t.tablets
            .iter()
            .all(|x| x.server_id == id1 || x.server_id == again)
    );
    let servers = servers_when(&c, "id1 and the new id", |s| {
        server_ids(s) == vec![id1, again]
    })
    .await;
    assert!(servers.iter().all(|s| s.state == ServerState::Up));
    drop(c);
    coord.shutdown().await;
}

#[tokio::test]
async fn servers_on_record_at_start_are_pinged_and_the_silent_ones_recovered() {
    let dir = TempDir::new("restart");
    let log = Log::default();
    let s1 = fake_server(&log, 1).await;
    let s2 = fake_server(&log, 1).await;
    let (id1, id2) = {
        let (coord, c) = start_connected(fast(&dir)).await;
        let id1 = enlist(&c, addrs(&s1)).await;
        let id2 = enlist(&c, addrs(&s2)).await;
        create(&c, "t", 4).await;
        drop(c);
        coord.shutdown().await;
        (id1, id2)
    };
    // While the coordinator was down, s2's process died.
    s2[0].silent.store(true, Ordering::SeqCst);
    let (coord, c) = start_connected(fast(&dir)).await;
    // Found dead (then forgotten once recovered); s1 answers and stays.
    servers_when(&c, "only s1", |s| server_ids(s) == vec![id1]).await;
    assert!(s1[0].pings.load(Ordering::SeqCst) > 0);
    let t = open_when_ready(&c, "t").await;
    assert!(t.tablets.iter().all(|x| x.server_id == id1), "{t:?}");
    assert!(t.map_version > 1, "the recovered tablets have new versions");
    let _ = id2;
    drop(c);
    coord.shutdown().await;
}

/// After a whole-cluster restart every server of the previous run is dead;
/// recovering one must wait while another dead server that may hold some of
/// its replicas is neither back on its disk nor given up by the operator.
#[tokio::test]
async fn recovery_waits_for_the_disks_of_other_dead_servers() {
    let dir = TempDir::new("wait-disks");
    let log = Log::default();
    let mut old = Vec::new();
    for _ in 0..3 {
        old.push(fake_server(&log, 1).await);
    }
    let ids: Vec<u64> = {
        let (coord, c) = start_connected(fast(&dir)).await;
        let mut ids = Vec::new();
        for (i, s) in old.iter().enumerate() {
            let disk = format!("disk-{i}");
            ids.push(enlist_full(&c, addrs(s), &disk, &s[0].addr).await.0);
        }
        create(&c, "t", 6).await;
        drop(c);
        coord.shutdown().await;
        ids
    };
    // Every process of the previous run is gone.
    for s in &old {
        s[0].silent.store(true, Ordering::SeqCst);
    }
    let (coord, c) = start_connected(fast(&dir)).await;
    servers_when(&c, "the old servers dead", |s| {
        ids.iter()
            .all(|id| state_of(s, *id) == Some(ServerState::Dead))
    })
    .await;
    // Server 0 comes back on its disk; 1 and 2 do not: each dead server has
    // another dead one whose disk could hold its only replicas, so nothing
    // is recovered.
    let back = fake_server(&log, 1).await;
    let id_back = enlist_full(&c, addrs(&back), "disk-0", &back[0].addr)
        .await
        .0;
    tokio::time::sleep(Duration::from_millis(500)).await;
    expect_err(
        &call(&c, Request::OpenTable { name: "t".into() }).await,
        Status::Retry,
    );
    let servers = list_servers(&c).await;
    assert!(
        ids.iter()
            .all(|id| state_of(&servers, *id) == Some(ServerState::Dead)),
        "{servers:?}"
    );
    // The operator gives server 1 up: then every dead server is recovered
    // onto the live one.
    expect_ok(&call(&c, Request::RemoveServer { server_id: ids[1] }).await);
    let t = open_when_ready(&c, "t").await;
    assert!(t.tablets.iter().all(|x| x.server_id == id_back), "{t:?}");
    drop(c);
    coord.shutdown().await;
}
