//! After a move, the old owner never answers a read, write or scan of the
//! tablet with data (it answers `UnknownTablet`, so a client with an old map
//! refreshes it), even when the coordinator's DropTablet never arrives. Real
//! storage servers, in this process.

use crate::common;

use common::*;
use insitu_client::{Client, RpcConn};
use insitu_protocol::{Object, Request, Response, Status, TabletState, blob};
use insitu_server::{ServerConfig, ServerHandle};

async fn server(coordinator: &str, dir: &TempDir, name: &str) -> ServerHandle {
    let mut config = ServerConfig::new(coordinator, dir.0.join(name));
    config.shards = 1;
    config.engine.memory_budget_bytes = 64 << 20;
    insitu_server::start(config).await.expect("start server")
}

async fn stop(servers: Vec<ServerHandle>) {
    tokio::task::spawn_blocking(move || servers.into_iter().for_each(|s| s.shutdown()))
        .await
        .unwrap();
}

async fn shard(handle: &ServerHandle) -> RpcConn {
    RpcConn::connect(&handle.shard_addrs[0].to_string())
        .await
        .expect("connect to shard")
}

async fn status_of(conn: &RpcConn, request: Request<'_>) -> Status {
    call(conn, request).await.status
}

fn read(table: u64) -> Request<'static> {
    Request::Read {
        table,
        key: blob(b"k"),
    }
}

fn write(table: u64, value: &'static [u8]) -> Request<'static> {
    Request::Write {
        expires_at_ms: 0,
        table,
        key: blob(b"k"),
        value: blob(value),
        rules: Default::default(),
    }
}

fn take(table: u64, version: u64, state: TabletState) -> Request<'static> {
    let migration = if state == TabletState::Receiving {
        MOVE
    } else {
        0
    };
    take_for(table, version, state, migration)
}

fn take_for(table: u64, version: u64, state: TabletState, migration: u64) -> Request<'static> {
    Request::TakeTablet {
        table,
        start_hash: 0,
        end_hash: u64::MAX,
        map_version: version,
        state,
        migration,
    }
}

/// The id of the moves these tests drive by hand.
const MOVE: u64 = 7;

fn migrate(table: u64, dest: &ServerHandle) -> Request<'static> {
    migrate_for(table, dest, MOVE)
}

fn migrate_for(table: u64, dest: &ServerHandle, migration: u64) -> Request<'static> {
    Request::MigrateTablet {
        table,
        start_hash: 0,
        dest_addr: dest.shard_addrs[0].to_string(),
        migration,
    }
}

async fn value_of(conn: &RpcConn, table: u64) -> Vec<u8> {
    match expect_ok(&call(conn, read(table)).await) {
        Response::Read { value, .. } => value.to_vec(),
        other => panic!("expected Read, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_with_a_stale_map_never_sees_an_older_value_than_an_acknowledged_write() {
    let dir = TempDir::new("stale");
    let coord = start_coordinator(&dir).await;
    let addr = coord.addr().to_string();
    let s1 = server(&addr, &dir, "s1").await;
    let s2 = server(&addr, &dir, "s2").await;

    // Through the coordinator: a reader caches the map, the tablet moves, a
    // writer's newer value is acknowledged by the new owner.
    let writer = Client::connect(&addr).await.unwrap();
    let t = writer.create_table("t", 1).await.unwrap();
    assert_eq!(t.tablets[0].server_id, s1.server_id);
    writer.write(t.id, "k", "old").await.unwrap();
    let reader = Client::connect(&addr).await.unwrap();
    reader.open_table("t").await.unwrap();
    assert_eq!(
        &reader.read(t.id, "k").await.unwrap().unwrap().0[..],
        b"old"
    );
    writer.move_tablet("t", 0, s2.server_id).await.unwrap();
    let acked = writer.write(t.id, "k", "new").await.unwrap();
    let (value, version) = reader.read(t.id, "k").await.unwrap().unwrap();
    assert_eq!((&value[..], version), (&b"new"[..], acked));

    // The same with the coordinator's DropTablet lost: the control requests
    // sent by hand, to a table the coordinator does not know.
    let (src, dest) = (shard(&s1).await, shard(&s2).await);
    let table = 777;
    expect_ok(&call(&src, take(table, 1, TabletState::Active)).await);
    expect_ok(&call(&src, write(table, b"old")).await);
    expect_ok(&call(&dest, take(table, 1, TabletState::Receiving)).await);
    expect_ok(&call(&src, migrate(table, &s2)).await);
    // Moved out: silent from now on, before and after the destination serves.
    assert_eq!(status_of(&src, read(table)).await, Status::UnknownTablet);
    expect_ok(
        &call(
            &dest,
            Request::ActivateTablet {
                table,
                start_hash: 0,
                map_version: 2,
                writes: true,
            },
        )
        .await,
    );
    expect_ok(&call(&dest, write(table, b"new")).await);
    assert_eq!(status_of(&src, read(table)).await, Status::UnknownTablet);
    assert_eq!(
        status_of(&src, write(table, b"x")).await,
        Status::UnknownTablet
    );
    let enumerate = Request::Enumerate {
        table,
        tablet_start: 0,
        from_hash: 0,
        max_bytes: 1 << 20,
    };
    assert_eq!(status_of(&src, enumerate).await, Status::UnknownTablet);
    let multi = Request::MultiRead {
        table,
        keys: vec![blob(b"k")],
    };
    match call(&src, multi).await {
        r if r.status == Status::Ok => match r.decode().unwrap() {
            Response::MultiRead { results } => {
                assert_eq!(results[0].status, Status::UnknownTablet)
            }
            other => panic!("expected MultiRead, got {other:?}"),
        },
        r => assert_eq!(r.status, Status::UnknownTablet),
    }
    assert_eq!(value_of(&dest, table).await, b"new");
    // Clearing up never drops a serving copy; it does drop the moved-out one.
    let drop_if_idle = Request::DropTablet {
        table,
        start_hash: 0,
        only_if_not_serving: true,
    };
    expect_ok(&call(&dest, drop_if_idle.clone()).await);
    assert_eq!(value_of(&dest, table).await, b"new");
    expect_ok(&call(&src, drop_if_idle).await);
    assert_eq!(status_of(&src, read(table)).await, Status::UnknownTablet);
    // Re-homed here once its owner died (the coordinator drops a copy
    // that serves nothing, as above, then takes it): the tablet starts
    // empty, not with the contents from before the move.
    expect_ok(&call(&src, take(table, 3, TabletState::Active)).await);
    assert_eq!(
        status_of(&src, read(table)).await,
        Status::ObjectDoesntExist
    );

    // An aborted move (TakeTablet Active on the source) makes it serve again.
    let table = 778;
    expect_ok(&call(&src, take(table, 1, TabletState::Active)).await);
    expect_ok(&call(&src, write(table, b"kept")).await);
    expect_ok(&call(&dest, take(table, 1, TabletState::Receiving)).await);
    expect_ok(&call(&src, migrate(table, &s2)).await);
    assert_eq!(status_of(&src, read(table)).await, Status::UnknownTablet);
    // (A take alone keeps the copy it finds: that is what an undo needs,
    // and why a re-home drops first.)
    expect_ok(&call(&src, take(table, 1, TabletState::Active)).await);
    assert_eq!(value_of(&src, table).await, b"kept");
    expect_ok(&call(&src, write(table, b"again")).await);

    // A migration that fails un-freezes the source by itself: the
    // destination does not hold the tablet, so it refuses the first batch.
    let table = 779;
    expect_ok(&call(&src, take(table, 1, TabletState::Active)).await);
    expect_ok(&call(&src, write(table, b"v")).await);
    let failed = call(&src, migrate(table, &s2)).await;
    assert_ne!(failed.status, Status::Ok);
    expect_ok(&call(&src, write(table, b"w")).await);
    assert_eq!(value_of(&src, table).await, b"w");

    drop((src, dest, reader, writer));
    stop(vec![s1, s2]).await;
    coord.shutdown().await;
}

/// A receiving copy takes only its own move's batches, and each move
/// attempt starts from an empty copy: a late batch of an aborted attempt,
/// or the aborted attempt's copy itself, would otherwise bring back an
/// object deleted between the attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_batch_of_an_aborted_move_never_brings_back_a_deleted_object() {
    let dir = TempDir::new("moveids");
    let coord = start_coordinator(&dir).await;
    let addr = coord.addr().to_string();
    let s1 = server(&addr, &dir, "s1").await;
    let s2 = server(&addr, &dir, "s2").await;
    let (src, dest) = (shard(&s1).await, shard(&s2).await);
    let table = 900;
    let (first, second) = (0x11, 0x22);
    expect_ok(&call(&src, take(table, 1, TabletState::Active)).await);
    expect_ok(&call(&src, write(table, b"kept")).await);
    let gone = Request::Write {
        expires_at_ms: 0,
        table,
        key: blob(b"gone"),
        value: blob(b"old"),
        rules: Default::default(),
    };
    expect_ok(&call(&src, gone).await);

    // Attempt 1 copies both objects, then is aborted (the source serves again).
    let receive_first = take_for(table, 1, TabletState::Receiving, first);
    expect_ok(&call(&dest, receive_first.clone()).await);
    // A resent take of the same attempt keeps its copy.
    expect_ok(&call(&dest, receive_first).await);
    expect_ok(&call(&src, migrate_for(table, &s2, first)).await);
    expect_ok(&call(&src, take(table, 1, TabletState::Active)).await);
    // Deleted between the attempts.
    let remove = Request::Remove {
        table,
        key: blob(b"gone"),
        rules: Default::default(),
    };
    expect_ok(&call(&src, remove).await);

    // Attempt 2: its take empties the copy; attempt 1's late batch is refused.
    expect_ok(&call(&dest, take_for(table, 1, TabletState::Receiving, second)).await);
    let late = Request::MigrateBatch {
        table,
        start_hash: 0,
        migration: first,
        next_version: 1,
        commit_ts_bound: None,
        objects: vec![Object {
            key: blob(b"gone"),
            value: blob(b"old"),
            version: 2,
            expires_at_ms: 0,
        }],
        records: Vec::new(),
    };
    let refused = expect_err(&call(&dest, late).await, Status::BadRequest);
    assert!(refused.contains("aborted move"), "{refused}");
    expect_ok(&call(&src, migrate_for(table, &s2, second)).await);
    let activate = Request::ActivateTablet {
        table,
        start_hash: 0,
        map_version: 2,
        writes: true,
    };
    expect_ok(&call(&dest, activate).await);
    assert_eq!(value_of(&dest, table).await, b"kept");
    let gone = Request::Read {
        table,
        key: blob(b"gone"),
    };
    assert_eq!(
        status_of(&dest, gone).await,
        Status::ObjectDoesntExist,
        "deleted stays deleted"
    );

    // A receiving take without a move id, or over a copy that serves, is refused.
    let no_id = take_for(901, 1, TabletState::Receiving, 0);
    expect_err(&call(&dest, no_id).await, Status::BadRequest);
    let over_serving = take_for(table, 3, TabletState::Receiving, 0x33);
    expect_err(&call(&dest, over_serving).await, Status::BadRequest);
    assert_eq!(
        value_of(&dest, table).await,
        b"kept",
        "the serving copy is untouched"
    );

    drop((src, dest));
    stop(vec![s1, s2]).await;
    coord.shutdown().await;
}
