//! Dead servers: retirement on re-enlist and with `forget_servers`, orphaned
//! tablets, and their re-homing onto newly enlisted (fake) servers.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use common::*;
use futures::StreamExt;
use insitu_protocol::{
    FrameCodec, Request, Response, ServerState, Status, TableInfo, TabletState, decode_request,
    encode_response,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::codec::FramedRead;

/// The TakeTablet / RecoverTablet requests in `log` (a fake shard logs a
/// `RecoverTablet` as a take `Receiving`): (shard address, table, start, end,
/// version, state). The `ActivateTablet` that follows each recovery must
/// name a recovered tablet on the same shard; the version reported is the
/// activation's (the one the map commits), not the recovery's reservation.
fn takes(log: &[(String, Ctl)]) -> Vec<(String, u64, u64, u64, u64, TabletState)> {
    let mut out: Vec<(String, u64, u64, u64, u64, TabletState)> = Vec::new();
    for (addr, ctl) in log {
        match ctl {
            Ctl::Take {
                table,
                start,
                end,
                version,
                state,
            } => out.push((addr.clone(), *table, *start, *end, *version, *state)),
            Ctl::Activate {
                table,
                start,
                version,
            } => {
                let recovered = out
                    .iter_mut()
                    .rev()
                    .find(|t| &t.0 == addr && t.1 == *table && t.2 == *start);
                let recovered = recovered.unwrap_or_else(|| {
                    panic!("ActivateTablet {table}/{start:#x} v{version} on {addr} without its recovery")
                });
                assert!(
                    *version >= recovered.4,
                    "activated below its recovery's version"
                );
                recovered.4 = *version;
            }
            // The clean-up of a failed recovery attempt.
            Ctl::Drop { .. } => {}
            other => panic!("only recovery and activation expected, got {other:?}"),
        }
    }
    out
}

async fn expect_no_live_server(c: &insitu_client::rpc::RpcConn, table: &TableInfo) {
    let msg = expect_err(
        &call(
            c,
            Request::OpenTable {
                name: table.name.clone(),
            },
        )
        .await,
        Status::Retry,
    );
    assert!(
        msg.contains("has no live server yet") && msg.contains(&format!("{:?}", table.name)),
        "{msg}"
    );
    let msg = expect_err(
        &call(c, Request::TableMap { table: table.id }).await,
        Status::Retry,
    );
    assert!(msg.contains("tablet 0 of table"), "{msg}");
}

#[tokio::test]
async fn reenlisting_on_the_same_addresses_rehomes_the_old_servers_tablets() {
    let (dir, coord, c, log, s1, s2, id1, id2) = two_servers("reenlist", 2, 1).await;
    let a = create(&c, "a", 6).await;
    let b = create(&c, "b", 3).await;
    take_log(&log);
    let before = b.map_version;

    // s1's process "restarts" on the same addresses: a new id, the old one
    // declared dead, and forgotten once its tablets are recovered.
    let id3 = enlist(&c, addrs(&s1)).await;
    assert!(id3 > id2);
    let servers = servers_when(&c, "without the old server", |s| {
        server_ids(s) == vec![id2, id3]
    })
    .await;
    assert_eq!(servers[1].shard_addrs, addrs(&s1));

    let a2 = open_when_ready(&c, "a").await;
    let b2 = open_when_ready(&c, "b").await;
    assert!(a2.map_version > before, "the map version was bumped");
    assert_covers_hash_space(&a2);
    assert_covers_hash_space(&b2);
    // Exactly the tablets of id1 were re-homed, round-robin over every live
    // shard, those holding the fewest tablets first (id3's, empty, before
    // id2's shard with 3; then shard 0 of each server by id, then shard 1),
    // with the new version; id2's are untouched.
    let slots = [
        (id3, 0u32, s1[0].addr.clone()),
        (id3, 1, s1[1].addr.clone()),
        (id2, 0, s2[0].addr.clone()),
    ];
    let mut expected = Vec::new();
    let mut next_shard = 0usize;
    for (old, new) in [(&a, &a2), (&b, &b2)] {
        for (i, (o, n)) in old.tablets.iter().zip(&new.tablets).enumerate() {
            assert_eq!((o.start_hash, o.end_hash), (n.start_hash, n.end_hash));
            if o.server_id == id1 {
                let (server, shard, addr) = &slots[next_shard % slots.len()];
                assert_eq!(n.server_id, *server, "table {} tablet {i}", old.name);
                assert_eq!(n.shard, *shard);
                assert_eq!(n.addr, *addr);
                assert!(
                    n.map_version > before,
                    "each recovered tablet has a new version"
                );
                next_shard += 1;
                expected.push((
                    n.addr.clone(),
                    old.id,
                    n.start_hash,
                    n.end_hash,
                    n.map_version,
                    TabletState::Receiving,
                ));
            } else {
                assert_eq!(o.server_id, id2);
                assert_eq!(o, n, "table {} tablet {i} stays on server {id2}", old.name);
            }
        }
    }
    assert!(next_shard > 0);
    let mut got = takes(&take_log(&log));
    got.sort_by_key(|g| (g.0.clone(), g.1, g.2));
    expected.sort_by_key(|g| (g.0.clone(), g.1, g.2));
    assert_eq!(
        got, expected,
        "one recovery (then activation) per tablet of the dead server"
    );

    // A server whose addresses overlap only partly is retired too.
    let extra = fake_shard(log.clone()).await;
    let id4 = enlist(&c, vec![extra.addr.clone(), s2[0].addr.clone()]).await;
    servers_when(&c, "id3 and id4", |s| server_ids(s) == vec![id3, id4]).await;
    let a3 = open_when_ready(&c, "a").await;
    assert!(a3.map_version > a2.map_version);
    for t in &a3.tablets {
        assert!(t.server_id == id3 || t.server_id == id4, "{t:?}");
    }
    assert_eq!(
        takes(&take_log(&log)).len(),
        a2.tablets
            .iter()
            .chain(&b2.tablets)
            .filter(|t| t.server_id == id2)
            .count()
    );

    // The new state is durable.
    let tables = list_tables(&c).await;
    let (coord, c) = restart(&dir, coord, c).await;
    assert_eq!(list_tables(&c).await, tables);
    coord.shutdown().await;
}

#[tokio::test]
async fn a_failed_take_leaves_the_tablet_orphaned_until_the_next_enlist() {
    let (_dir, coord, c, log) = coordinator_and_log("failtake").await;
    let s1 = fake_server(&log, 1).await;
    enlist(&c, addrs(&s1)).await;
    let t = create(&c, "t", 2).await;
    take_log(&log);

    // The new process on the same address refuses TakeTablet: enlisting
    // still succeeds, the tablets stay orphaned.
    s1[0].fail.lock().unwrap().insert("Take");
    let id2 = enlist(&c, addrs(&s1)).await;
    // Recovery runs after the reply: wait for both tries and the dead server
    // to be forgotten.
    insitu_testkit::poll_until(2000, || log.lock().unwrap().len() >= 2).await;
    // A recovery that failed keeps the dead server on record (its replicas
    // are still needed) and is retried.
    let servers = servers_when(&c, "id1 dead, id2 up", |s| server_ids(s).contains(&id2)).await;
    assert!(
        servers
            .iter()
            .any(|s| s.id != id2 && s.state == ServerState::Dead),
        "{servers:?}"
    );
    assert!(takes(&take_log(&log)).len() >= 2, "both were tried");
    for request in [
        Request::OpenTable {
            name: t.name.clone(),
        },
        Request::TableMap { table: t.id },
    ] {
        expect_err(&call(&c, request).await, Status::Retry);
    }
    let listed = list_tables(&c).await;
    assert!(
        listed[0]
            .tablets
            .iter()
            .all(|x| x.server_id == 0 && x.addr.is_empty()),
        "{listed:?}"
    );
    let msg = expect_err(&try_move(&c, "t", 1, id2).await, Status::Retry);
    assert!(msg.contains("tablet 1 of table \"t\""), "{msg}");

    // The next server to enlist gets them.
    s1[0].fail.lock().unwrap().clear();
    let s2 = fake_server(&log, 1).await;
    let id3 = enlist(&c, addrs(&s2)).await;
    // They spread over both live servers (id2 takes them again now).
    let t2 = open_when_ready(&c, "t").await;
    let owners: Vec<u64> = t2.tablets.iter().map(|x| x.server_id).collect();
    assert_eq!(owners, vec![id2, id3]);
    assert!(t2.map_version > t.map_version);
    let got = takes(&take_log(&log));
    // At least the two that placed them; the recovery driver, which retries
    // a failed recovery, may also have placed both on id2 before id3
    // enlisted (then the enlist moved one): more takes, same end state.
    assert!(got.len() >= 2, "{got:?}");
    assert!(
        got.iter()
            .all(|g| g.4 > t.map_version && g.4 <= t2.map_version)
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn forget_servers_orphans_every_tablet_until_servers_enlist() {
    let (dir, coord, c, log, old1, old2, _, old_id) = two_servers("forget", 2, 1).await;
    let a = create(&c, "a", 5).await;
    let b = create(&c, "b", 2).await;
    let gone = create(&c, "gone", 2).await;
    assert!(coord.orphaned_table_names().is_empty());
    drop(c);
    coord.shutdown().await;
    take_log(&log);

    // Restart "as insitu up does": every stored server is declared dead.
    let coord = start_forgetting(&dir).await;
    assert_eq!(coord.awaiting_recovery_table_names(), ["a", "b", "gone"]);
    let c = connect(&coord).await;
    let servers = list_servers(&c).await;
    assert_eq!(servers.len(), 2);
    assert!(
        servers.iter().all(|s| s.state == ServerState::Dead),
        "{servers:?}"
    );
    // Tables waiting for recovery: listed (owners dead, no address), but no
    // map is handed out.
    let listed = list_tables(&c).await;
    assert_eq!(listed.len(), 3);
    for t in &listed {
        assert_covers_hash_space(t);
        assert!(t.map_version >= b.map_version);
        assert!(
            t.tablets
                .iter()
                .all(|x| x.server_id != 0 && x.addr.is_empty())
        );
        expect_no_live_server(&c, t).await;
    }
    expect_err(&try_create(&c, "new", 1).await, Status::NoServers);
    // Dropping an orphaned table needs no shard.
    expect_ok(&try_drop(&c, "gone").await);
    assert!(take_log(&log).is_empty(), "no shard was called");
    assert_eq!(coord.awaiting_recovery_table_names(), ["a", "b"]);

    // Stopped before any server enlisted: still waiting after a plain restart.
    let (coord, c) = restart(&dir, coord, c).await;
    assert_eq!(coord.awaiting_recovery_table_names(), ["a", "b"]);
    expect_no_live_server(&c, &a).await;

    // A new server enlists: it gets every tablet (for now re-created empty),
    // spread over its shards.
    let n1 = fake_server(&log, 2).await;
    let new_id = enlist(&c, addrs(&n1)).await;
    assert!(new_id > old_id);
    let a2 = open_when_ready(&c, "a").await;
    let b2 = open_when_ready(&c, "b").await;
    servers_when(&c, "only the new one", |s| server_ids(s) == vec![new_id]).await;
    assert!(coord.awaiting_recovery_table_names().is_empty());
    let mut expected = Vec::new();
    let mut shards_used = HashSet::new();
    for (table, t) in a2
        .tablets
        .iter()
        .map(|t| (&a2, t))
        .chain(b2.tablets.iter().map(|t| (&b2, t)))
    {
        assert_eq!(t.server_id, new_id, "{} {t:?}", table.name);
        assert_eq!(t.addr, n1[t.shard as usize].addr);
        assert!(t.map_version > listed[0].map_version);
        shards_used.insert(t.shard);
        expected.push((
            t.addr.clone(),
            table.id,
            t.start_hash,
            t.end_hash,
            t.map_version,
            TabletState::Receiving,
        ));
    }
    assert_eq!(shards_used.len(), 2, "spread over both shards");
    assert_eq!(a2.tablets.len(), a.tablets.len());
    let mut got = takes(&take_log(&log));
    got.sort_by_key(|g| (g.0.clone(), g.1, g.2));
    expected.sort_by_key(|g| (g.0.clone(), g.1, g.2));
    assert_eq!(got, expected);
    // Old servers got nothing.
    let old: HashSet<String> = addrs(&old1).into_iter().chain(addrs(&old2)).collect();
    assert!(got.iter().all(|g| !old.contains(&g.0)));
    // A second server gets nothing: nothing is orphaned any more.
    let n2 = fake_server(&log, 1).await;
    enlist(&c, addrs(&n2)).await;
    assert!(take_log(&log).is_empty());
    // (The enlistment itself may advance the global map version.)
    assert_eq!(open(&c, "a").await.tablets, a2.tablets);

    // Durable; and `forget_servers` with no stored tables or servers is harmless.
    let (coord, c) = restart(&dir, coord, c).await;
    assert_eq!(open(&c, "b").await.tablets, b2.tablets);
    assert_eq!(list_servers(&c).await.len(), 2);
    drop(c);
    coord.shutdown().await;
    let empty = TempDir::new("forget-empty");
    let coord = start_forgetting(&empty).await;
    assert!(coord.orphaned_table_names().is_empty());
    coord.shutdown().await;
    let _ = gone;
}

/// What a real client sees for a table with an orphaned tablet: it retries
/// within its timeout and then fails with the coordinator's message, instead
/// of hanging on an empty address.
#[tokio::test]
async fn a_client_fails_clearly_on_an_orphaned_table() {
    let dir = TempDir::new("client");
    let log = Log::default();
    let s1 = fake_server(&log, 1).await;
    let coord = start_coordinator(&dir).await;
    let c = connect(&coord).await;
    enlist(&c, addrs(&s1)).await;
    let t = create(&c, "t", 2).await;
    drop(c);
    coord.shutdown().await;
    let coord = start_forgetting(&dir).await;

    let client = insitu_client::Client::connect_with(
        &coord.addr().to_string(),
        insitu_client::ClientConfig {
            op_timeout: std::time::Duration::from_millis(500),
            ..Default::default()
        },
    )
    .await
    .expect("connect");
    let started = std::time::Instant::now();
    let e = client.open_table("t").await.expect_err("no map yet");
    assert_eq!(e.status(), Some(Status::Retry), "{e}");
    assert!(e.to_string().contains("has no live server yet"), "{e}");
    let e = client.read(t.id, "k").await.expect_err("no map yet");
    assert_eq!(e.status(), Some(Status::Retry), "{e}");
    assert!(
        e.to_string()
            .contains("tablet 0 of table \"t\" has no live server yet"),
        "{e}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // Once a server enlists, the same client gets the map.
    let c = connect(&coord).await;
    let s2 = fake_server(&log, 1).await;
    let id = enlist(&c, addrs(&s2)).await;
    // Recovery runs after the enlistment's reply.
    open_when_ready(&c, "t").await;
    let info = client.open_table("t").await.expect("a map now");
    assert!(info.tablets.iter().all(|x| x.server_id == id));
    coord.shutdown().await;
}

/// A fake shard that answers every request with Done, concurrently; a
/// MigrateTablet notifies `arrived`, then waits for `release` before replying.
async fn slow_migrate_shard(arrived: Arc<Notify>, release: Arc<Notify>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (arrived, release) = (arrived.clone(), release.clone());
            tokio::spawn(async move {
                let (read_half, write_half) = stream.into_split();
                let write_half = Arc::new(tokio::sync::Mutex::new(write_half));
                let mut frames = FramedRead::new(read_half, FrameCodec::default());
                while let Some(Ok(frame)) = frames.next().await {
                    let id = frame.header.request_id;
                    let is_migrate = matches!(
                        decode_request(&frame.body),
                        Ok(Request::MigrateTablet { .. })
                    );
                    let (arrived, release, write_half) =
                        (arrived.clone(), release.clone(), write_half.clone());
                    tokio::spawn(async move {
                        if is_migrate {
                            arrived.notify_one();
                            release.notified().await;
                        }
                        let mut out = BytesMut::new();
                        encode_response(&mut out, id, Status::Ok, &Response::Done).unwrap();
                        let _ = write_half.lock().await.write_all(&out).await;
                    });
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_move_whose_server_is_retired_meanwhile_is_abandoned() {
    let (dir, coord, c, log) = coordinator_and_log("moveretire").await;
    let (arrived, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let src = slow_migrate_shard(arrived.clone(), release.clone()).await;
    let src_id = enlist(&c, vec![src.clone()]).await;
    let t = create(&c, "t", 1).await;
    assert_eq!(t.tablets[0].server_id, src_id);
    let dest = fake_server(&log, 1).await;
    let dest_id = enlist(&c, addrs(&dest)).await;

    // (a) The destination is replaced while the source copies: the tablet stays put.
    let mover = connect(&coord).await;
    let move_reply = tokio::spawn(async move { try_move(&mover, "t", 0, dest_id).await });
    // The source is copying (MigrateTablet arrived, not answered yet).
    tokio::time::timeout(Duration::from_secs(10), arrived.notified())
        .await
        .expect("the move reaches MigrateTablet");
    let new_dest = enlist(&c, addrs(&dest)).await;
    assert_ne!(new_dest, dest_id);
    release.notify_one();
    let reply = move_reply.await.unwrap();
    let msg = expect_err(&reply, Status::Internal);
    assert!(msg.contains("was retired during the move"), "{msg}");
    let t2 = open(&c, "t").await;
    assert_eq!(
        t2.tablets[0].server_id, src_id,
        "the source keeps the tablet"
    );
    assert_eq!(t2.tablets[0].map_version, t.tablets[0].map_version);

    // (b) The source is replaced while it copies: the move is abandoned and
    // the tablet is re-homed (empty) on the source's successor.
    let mover = connect(&coord).await;
    let move_reply = tokio::spawn(async move { try_move(&mover, "t", 0, new_dest).await });
    // The source is copying (MigrateTablet arrived, not answered yet).
    tokio::time::timeout(Duration::from_secs(10), arrived.notified())
        .await
        .expect("the move reaches MigrateTablet");
    let new_src = enlist(&c, vec![src.clone()]).await;
    release.notify_one();
    let reply = move_reply.await.unwrap();
    let msg = expect_err(&reply, Status::Internal);
    assert!(msg.contains("was retired during the move"), "{msg}");
    let t3 = open_when_ready(&c, "t").await;
    // Re-homed on the first live slot: shard 0 of the lowest server id.
    assert_eq!(t3.tablets[0].server_id, new_dest);
    assert_eq!(t3.tablets[0].addr, dest[0].addr);
    assert!(t3.map_version > t2.map_version);
    servers_when(&c, "the two new ones", |s| {
        server_ids(s) == vec![new_dest, new_src]
    })
    .await;
    // The metadata is coherent on reload.
    let (coord, c) = restart(&dir, coord, c).await;
    assert_eq!(open(&c, "t").await, t3);
    coord.shutdown().await;
}
