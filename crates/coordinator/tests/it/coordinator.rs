//! The coordinator alone over real TCP, fake shards: tables created, opened,
//! listed, dropped or rolled back, placed by slot; enlistments refused;
//! metadata kept over restarts. (Moves: `moves.rs`; bad bytes: `hostile_input.rs`.)

use crate::common;

use common::*;
use insitu_protocol::{Request, Response, Status, TabletState};

#[tokio::test]
async fn create_open_list_drop() {
    let (_dir, coord, c, log, s1, s2, id1, id2) = two_servers("basic", 2, 2).await;
    assert_ne!(id1, id2);

    let servers = list_servers(&c).await;
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0].id, id1);
    assert_eq!(servers[0].shard_addrs, addrs(&s1));
    assert_eq!(servers[1].id, id2);
    assert_eq!(servers[1].shard_addrs, addrs(&s2));

    let t = create(&c, "t", 8).await;
    assert_eq!(t.name, "t");
    assert_eq!(t.tablets.len(), 8);
    assert!(t.map_version > 0);
    assert_covers_hash_space(&t);
    // Round robin: shard 0 of each server, then shard 1 of each server, ...
    let slots = [
        (id1, 0u32, &s1[0].addr),
        (id2, 0, &s2[0].addr),
        (id1, 1, &s1[1].addr),
        (id2, 1, &s2[1].addr),
    ];
    for (i, tablet) in t.tablets.iter().enumerate() {
        let (server, shard, addr) = slots[i % 4];
        assert_eq!(
            (tablet.server_id, tablet.shard, &tablet.addr),
            (server, shard, addr),
            "tablet {i}"
        );
        assert_eq!(tablet.map_version, t.map_version);
    }
    for w in t.tablets.windows(2) {
        assert_ne!(
            w[0].server_id, w[1].server_id,
            "consecutive tablets land on different servers"
        );
    }
    // Each owning shard got TakeTablet Active for exactly its tablets.
    let mut got = take_log(&log);
    assert_eq!(got.len(), 8, "{got:?}");
    got.sort_by_key(|(_, ctl)| match ctl {
        Ctl::Take { start, .. } => *start,
        _ => panic!("only TakeTablet expected, got {ctl:?}"),
    });
    for (i, (addr, ctl)) in got.iter().enumerate() {
        assert_eq!(addr, &t.tablets[i].addr);
        assert_eq!(ctl, &take_of(&t, i, t.map_version, TabletState::Active));
    }

    assert_eq!(open(&c, "t").await, t);
    assert_eq!(
        table_of(&call(&c, Request::TableMap { table: t.id }).await),
        t
    );
    assert_eq!(list_tables(&c).await, vec![t.clone()]);

    // Refusals, none of which reaches a shard.
    let msg = expect_err(&try_create(&c, "t", 4).await, Status::TableExists);
    assert!(msg.contains("\"t\""), "{msg}");
    let msg = expect_err(&try_create(&c, "z", 0).await, Status::BadRequest);
    assert!(msg.contains("tablets"), "{msg}");
    for (name, tablets) in [
        ("z".to_string(), 1025),
        (String::new(), 1),
        ("x".repeat(257), 1),
        ("a\nb".to_string(), 1),
    ] {
        expect_err(&try_create(&c, name, tablets).await, Status::BadRequest);
    }
    expect_err(
        &call(
            &c,
            Request::OpenTable {
                name: "nope".into(),
            },
        )
        .await,
        Status::UnknownTable,
    );
    expect_err(
        &call(&c, Request::TableMap { table: 999 }).await,
        Status::UnknownTable,
    );
    assert!(take_log(&log).is_empty());

    // A 256-byte name is fine; so is one tablet.
    let long = create(&c, &"y".repeat(256), 1).await;
    assert_eq!(long.tablets.len(), 1);
    assert!(long.map_version > t.map_version);
    assert_ne!(long.id, t.id);
    assert_covers_hash_space(&long);
    take_log(&log);

    // Drop.
    let before = list_tables(&c).await;
    assert_eq!(before.len(), 2);
    assert!(matches!(
        expect_ok(&try_drop(&c, "t").await),
        Response::Done
    ));
    let mut drops = take_log(&log);
    drops.sort_by_key(|(_, ctl)| match ctl {
        Ctl::Drop { start, .. } => *start,
        _ => panic!("only DropTablet expected, got {ctl:?}"),
    });
    assert_eq!(drops.len(), 8);
    for (tablet, (addr, ctl)) in t.tablets.iter().zip(&drops) {
        assert_eq!(addr, &tablet.addr);
        assert_eq!(
            ctl,
            &Ctl::Drop {
                table: t.id,
                start: tablet.start_hash
            }
        );
    }
    expect_err(
        &call(&c, Request::OpenTable { name: "t".into() }).await,
        Status::UnknownTable,
    );
    expect_err(
        &call(&c, Request::TableMap { table: t.id }).await,
        Status::UnknownTable,
    );
    expect_err(&try_drop(&c, "t").await, Status::UnknownTable);
    let after = list_tables(&c).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].id, long.id);
    assert!(
        after[0].map_version > long.map_version,
        "drop bumps the map version"
    );

    // The name is free again, under a new id.
    let t2 = create(&c, "t", 2).await;
    assert!(t2.id > long.id);
    coord.shutdown().await;
}

#[tokio::test]
async fn no_servers_and_bad_enlist() {
    let dir = TempDir::new("noservers");
    let coord = start_coordinator(&dir).await;
    let c = connect(&coord).await;
    expect_err(&try_create(&c, "t", 4).await, Status::NoServers);
    for shard_addrs in [vec![], vec!["no-port".to_string()], vec!["h:0".to_string()]] {
        let request = Request::Enlist {
            shard_addrs,
            identity: String::new(),
            replace: false,
            backup_addr: String::new(),
        };
        expect_err(&call(&c, request).await, Status::BadRequest);
    }
    assert!(list_servers(&c).await.is_empty());
    assert!(matches!(
        expect_ok(&call(&c, Request::Ping).await),
        Response::Pong
    ));
    // Data requests are not the coordinator's.
    expect_err(
        &call(
            &c,
            Request::ShardStats {
                reset_longest_call: false,
            },
        )
        .await,
        Status::BadRequest,
    );
    coord.shutdown().await;
}

#[tokio::test]
async fn metadata_survives_restart() {
    let (dir, coord, c, log, _s1, _s2, id1, id2) = two_servers("restart", 2, 1).await;
    let a = create(&c, "a", 5).await;
    create(&c, "b", 3).await;
    create(&c, "gone", 2).await;
    expect_ok(&try_drop(&c, "gone").await);
    let moved = move_tablet(&c, "a", 0, id2).await;
    assert_eq!(moved.tablets[0].server_id, id2);
    assert!(moved.map_version > a.map_version);
    let tables = list_tables(&c).await;
    let servers = list_servers(&c).await;
    let version = tables[0].map_version;

    // Same directory, new listener (new port).
    let (coord, c) = restart(&dir, coord, c).await;
    assert_eq!(list_servers(&c).await, servers);
    let tables2 = list_tables(&c).await;
    assert_eq!(
        tables2, tables,
        "tables, tablets and the map version are unchanged"
    );
    assert_eq!(
        tables2.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(open(&c, "a").await, moved);

    // Counters continue: no id or version is reused. (A new server: one
    // enlisting on s2's addresses would retire s2, see tests/it/retire.rs.)
    let s3 = fake_server(&log, 1).await;
    let id3 = enlist(&c, addrs(&s3)).await;
    assert!(id3 > id1.max(id2));
    let d = create(&c, "d", 2).await;
    assert!(
        d.map_version > version,
        "map version continues after restart"
    );
    assert!(tables.iter().all(|t| d.id > t.id));

    // And once more, after the changes made by the second incarnation.
    let (coord, c) = restart(&dir, coord, c).await;
    assert_eq!(open(&c, "d").await, d);
    assert_eq!(list_servers(&c).await.len(), 3);
    coord.shutdown().await;
}
#[tokio::test]
async fn failed_create_is_rolled_back() {
    let (_dir, coord, c, log, _, s2, _, _) = two_servers("createfail", 2, 2).await;
    s2[0].fail.lock().unwrap().insert("Take");

    let msg = expect_err(&try_create(&c, "r", 4).await, Status::Internal);
    assert!(msg.contains("injected failure"), "{msg}");
    let got = take_log(&log);
    let takes: Vec<_> = got
        .iter()
        .filter(|(_, ctl)| matches!(ctl, Ctl::Take { .. }))
        .collect();
    let drops: Vec<_> = got
        .iter()
        .filter(|(_, ctl)| matches!(ctl, Ctl::Drop { .. }))
        .collect();
    assert_eq!(takes.len(), 4, "{got:?}");
    assert_eq!(
        drops.len(),
        3,
        "the three that succeeded are dropped: {got:?}"
    );
    assert!(drops.iter().all(|(addr, _)| *addr != s2[0].addr));
    expect_err(
        &call(&c, Request::OpenTable { name: "r".into() }).await,
        Status::UnknownTable,
    );
    assert!(list_tables(&c).await.is_empty());

    s2[0].fail.lock().unwrap().clear();
    let r = create(&c, "r", 4).await;
    assert_covers_hash_space(&r);
    coord.shutdown().await;
}

#[tokio::test]
async fn concurrent_creates_of_one_name() {
    let dir = TempDir::new("race");
    let coord = start_coordinator(&dir).await;
    let log = Log::default();
    let s1 = fake_server(&log, 2).await;
    let c = connect(&coord).await;
    enlist(&c, addrs(&s1)).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let c = connect(&coord).await;
        tasks.push(tokio::spawn(async move {
            try_create(&c, "same", 2).await.status
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == Status::Ok).count(),
        1,
        "{statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|s| *s == Status::Ok || *s == Status::TableExists),
        "{statuses:?}"
    );
    assert_eq!(list_tables(&c).await.len(), 1);
    coord.shutdown().await;
}
/// A table placed by Redis hash slot (what the RESP port creates): its id
/// carries `SLOT_PLACED`, its tablets start on slot boundaries, the next
/// table's id is counted without the bit, and a typed one is refused.
#[tokio::test]
async fn a_table_placed_by_slot_has_the_bit_and_whole_slots() {
    use insitu_keyhash::{HashRange, SLOT_PLACED, slot_placed};
    let (_dir, _coord, c, _log, _s1, _s2, id1, id2) = two_servers("by_slot", 2, 2).await;
    let by_slot = |name: &str, schema| Request::CreateTable {
        name: name.into(),
        tablets: 3,
        schema,
        by_slot: true,
    };
    let t = table_of(&call(&c, by_slot("redis", None)).await);
    assert!(slot_placed(t.id), "id {:#x}", t.id);
    assert_covers_hash_space(&t);
    let ranges: Vec<(u64, u64)> = t
        .tablets
        .iter()
        .map(|x| (x.start_hash, x.end_hash))
        .collect();
    let want: Vec<(u64, u64)> = HashRange::split_slots(3)
        .iter()
        .map(|r| (r.start, r.end))
        .collect();
    assert_eq!(ranges, want, "whole slots");
    assert_eq!(open(&c, "redis").await, t);
    // Tablets go to the shards in blocks, server by server: each server
    // serves one run of slots.
    let eight = Request::CreateTable {
        name: "redis8".into(),
        tablets: 8,
        schema: None,
        by_slot: true,
    };
    let t8 = table_of(&call(&c, eight).await);
    let owners: Vec<(u64, u32)> = t8.tablets.iter().map(|x| (x.server_id, x.shard)).collect();
    let (a, b) = (id1.min(id2), id1.max(id2));
    assert_eq!(
        owners,
        [
            (a, 0),
            (a, 0),
            (a, 1),
            (a, 1),
            (b, 0),
            (b, 0),
            (b, 1),
            (b, 1)
        ],
        "blocks of slots per server and shard"
    );
    // The next id is counted without the bit.
    let plain = create(&c, "plain", 2).await;
    assert!(!slot_placed(plain.id));
    assert_eq!(plain.id, (t8.id & !SLOT_PLACED) + 1);
    // Typed tables are never placed by slot.
    let schema = insitu_protocol::schema::Schema {
        columns: vec![insitu_protocol::schema::Column::new(
            "k",
            insitu_protocol::schema::ColumnType::Int64,
            false,
        )],
        key: vec![0],
    };
    let msg = expect_err(
        &call(&c, by_slot("typed", Some(schema))).await,
        Status::BadRequest,
    );
    assert!(msg.contains("placed by hash slot is untyped"), "{msg}");
}
