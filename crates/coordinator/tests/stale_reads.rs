//! After a move, the old owner never answers a read, write or scan of the
//! tablet with data (it answers `UnknownTablet`, so a client with an old map
//! refreshes it), even when the coordinator's DropTablet never arrives. Real
//! storage servers, in this process.

mod common;

use common::*;
use insitu_client::{Client, RpcConn};
use insitu_protocol::{Request, Response, Status, TabletState, blob};
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
        table,
        key: blob(b"k"),
        value: blob(value),
        rules: Default::default(),
    }
}

fn take(table: u64, version: u64, state: TabletState) -> Request<'static> {
    Request::TakeTablet {
        table,
        start_hash: 0,
        end_hash: u64::MAX,
        map_version: version,
        state,
    }
}

fn migrate(table: u64, dest: &ServerHandle) -> Request<'static> {
    Request::MigrateTablet {
        table,
        start_hash: 0,
        dest_addr: dest.shard_addrs[0].to_string(),
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

    // An aborted move (TakeTablet Active on the source) makes it serve again.
    let table = 778;
    expect_ok(&call(&src, take(table, 1, TabletState::Active)).await);
    expect_ok(&call(&src, write(table, b"kept")).await);
    expect_ok(&call(&dest, take(table, 1, TabletState::Receiving)).await);
    expect_ok(&call(&src, migrate(table, &s2)).await);
    assert_eq!(status_of(&src, read(table)).await, Status::UnknownTablet);
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
