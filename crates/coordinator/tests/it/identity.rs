//! Servers are known by the identity they keep in their data directory, not
//! by address; servers that start before the coordinator wait for it; a
//! restarted `insitu up` spreads the re-created tablets over all its servers.

use crate::common;

use common::*;
use insitu_coordinator::CoordinatorConfig;
use insitu_protocol::{Request, ServerState, Status};
use insitu_server::ServerConfig;

#[tokio::test]
async fn a_second_server_on_a_live_servers_address_is_refused() {
    let (dir, coord, c, log) = coordinator_and_log("identity").await;
    let s1 = fake_server(&log, 2).await;
    let id1 = enlist_as(&c, addrs(&s1), "aaaa", false).await;
    let t = create(&c, "t", 4).await;
    take_log(&log);

    // Another server (another identity) advertises one of the same
    // addresses, e.g. two hosts started with --host 0.0.0.0: refused, and
    // the first server keeps its tablets.
    let other = fake_shard(log.clone()).await;
    let reply = call(
        &c,
        Request::Enlist {
            shard_addrs: vec![other.addr.clone(), s1[1].addr.clone()],
            identity: "bbbb".into(),
            replace: false,
            backup_addr: String::new(),
        },
    )
    .await;
    let msg = expect_err(&reply, Status::BadRequest);
    assert!(msg.contains(&s1[1].addr), "{msg}");
    assert!(msg.contains("already registered by live server"), "{msg}");
    assert!(msg.contains("--replace"), "{msg}");
    let ids: Vec<u64> = list_servers(&c).await.iter().map(|s| s.id).collect();
    assert_eq!(ids, vec![id1]);
    assert_eq!(open(&c, "t").await, t, "nothing was re-homed");
    assert!(take_log(&log).is_empty());

    // The same server restarting (same identity) retires its old entry, even
    // on other addresses: the old one is declared dead at once, and forgotten
    // once its tablets are recovered (re-created on the new one).
    let moved = fake_server(&log, 2).await;
    let id2 = enlist_as(&c, addrs(&moved), "aaaa", false).await;
    let servers = list_servers(&c).await;
    assert!(
        servers
            .iter()
            .any(|s| s.id == id1 && s.state == ServerState::Dead)
            || server_ids(&servers) == vec![id2],
        "{servers:?}"
    );
    servers_when(&c, "only id2", |s| server_ids(s) == vec![id2]).await;
    let t2 = open_when_ready(&c, "t").await;
    assert!(t2.tablets.iter().all(|x| x.server_id == id2), "{t2:?}");

    // The operator says the holder of an address is dead: --replace.
    let id3 = enlist_as(&c, addrs(&moved), "cccc", true).await;
    servers_when(&c, "only id3", |s| server_ids(s) == vec![id3]).await;

    // A bad identity is refused.
    let reply = call(
        &c,
        Request::Enlist {
            shard_addrs: addrs(&s1),
            identity: "has space".into(),
            replace: false,
            backup_addr: String::new(),
        },
    )
    .await;
    expect_err(&reply, Status::BadRequest);

    // Identities are durable.
    let (coord, c) = restart(&dir, coord, c).await;
    let reply = call(
        &c,
        Request::Enlist {
            shard_addrs: addrs(&moved),
            identity: "dddd".into(),
            replace: false,
            backup_addr: String::new(),
        },
    )
    .await;
    expect_err(&reply, Status::BadRequest);
    drop(c);
    coord.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_keeps_its_identity_and_waits_for_the_coordinator() {
    let dir = TempDir::new("serverid");
    // Start the server first: nothing listens on the coordinator's port yet.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let coord_addr = format!("127.0.0.1:{port}");
    let config = |name: &str| {
        let mut config = ServerConfig::new(&coord_addr, dir.0.join(name));
        config.shards = 1;
        config.engine.memory_budget_bytes = 64 << 20;
        config
    };
    let early = tokio::spawn(insitu_server::start(config("s1")));
    // It keeps trying (with back-off) instead of exiting.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !early.is_finished(),
        "the server gave up on the coordinator"
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the coordinator's port");
    let coord = insitu_coordinator::start(CoordinatorConfig::new(dir.0.join("coord")), listener)
        .await
        .unwrap();
    let s1 = early
        .await
        .unwrap()
        .expect("the server enlists once the coordinator is up");
    let identity = std::fs::read_to_string(dir.0.join("s1").join("server-identity")).unwrap();
    assert_eq!(identity.trim().len(), 32);

    // A second server claiming s1's address (same port, another directory)
    // cannot even bind it here; simulate its enlistment with s1's address.
    let c = connect(&coord).await;
    let reply = call(
        &c,
        Request::Enlist {
            shard_addrs: vec![s1.shard_addrs[0].to_string()],
            identity: "0123456789abcdef0123456789abcdef".into(),
            replace: false,
            backup_addr: String::new(),
        },
    )
    .await;
    expect_err(&reply, Status::BadRequest);
    // s1 restarted on the same directory: the same identity, its old entry retired.
    let first_id = s1.server_id;
    tokio::task::spawn_blocking(move || s1.shutdown())
        .await
        .unwrap();
    let s1 = insitu_server::start(config("s1")).await.unwrap();
    // The old entry is dead at once and forgotten after its recovery.
    servers_when(&c, "only the new entry", |s| {
        server_ids(s) == vec![s1.server_id]
    })
    .await;
    assert_ne!(s1.server_id, first_id);
    drop(c);
    tokio::task::spawn_blocking(move || s1.shutdown())
        .await
        .unwrap();
    coord.shutdown().await;
}

#[tokio::test]
async fn re_created_tablets_wait_for_every_expected_server_and_spread_over_them() {
    let dir = TempDir::new("spread");
    let log = Log::default();
    {
        let coord = start_coordinator(&dir).await;
        let c = connect(&coord).await;
        let a = fake_server(&log, 1).await;
        let b = fake_server(&log, 1).await;
        enlist(&c, addrs(&a)).await;
        enlist(&c, addrs(&b)).await;
        create(&c, "t", 4).await;
        drop(c);
        coord.shutdown().await;
    }
    // `insitu up` restarted: forget the old servers, wait for both new ones.
    let mut config = CoordinatorConfig::new(dir.0.clone());
    config.forget_servers = true;
    config.rehome_after_servers = 2;
    let coord = start_coordinator_with(config).await;
    let c = connect(&coord).await;
    take_log(&log);
    let a = fake_server(&log, 1).await;
    let b = fake_server(&log, 1).await;
    let id_a = enlist(&c, addrs(&a)).await;
    assert!(
        take_log(&log).is_empty(),
        "nothing is re-created with one of two servers"
    );
    let reply = call(&c, Request::OpenTable { name: "t".into() }).await;
    expect_err(&reply, Status::Retry);
    let id_b = enlist(&c, addrs(&b)).await;
    // Recovery (here: re-creation) runs once both are in.
    let t = open_when_ready(&c, "t").await;
    // Each dead server's tablets are spread over both (recovery goes server
    // by server, so the order within the table is not fixed).
    let owners: Vec<u64> = t.tablets.iter().map(|x| x.server_id).collect();
    for id in [id_a, id_b] {
        assert_eq!(owners.iter().filter(|o| **o == id).count(), 2, "{owners:?}");
    }
    drop(c);
    coord.shutdown().await;
}
