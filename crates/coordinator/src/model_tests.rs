//! Unit tests of the in-memory model (placement, validation, dead servers).

use super::*;

fn model_with_servers(shards: &[usize]) -> Model {
    let mut m = Model::empty();
    for (i, n) in shards.iter().enumerate() {
        let id = i as u64 + 1;
        m.apply(&[
            Op::PutServer {
                id,
                shard_addrs: (0..*n)
                    .map(|s| format!("127.0.0.1:{}", 1000 + 10 * id + s as u64))
                    .collect(),
                identity: String::new(),
                backup_addr: String::new(),
            },
            Op::Counter(NEXT_SERVER_ID, id + 1),
        ]);
    }
    m
}

/// A tablet over [start, end] on shard 0 of `server_id`, at map version 1.
fn tablet_on(start: u64, end: u64, server_id: u64) -> Tablet {
    Tablet {
        start_hash: start,
        end_hash: end,
        server_id,
        shard: 0,
        map_version: 1,
    }
}

/// The ops that create table 1, "t", of the two tablets `first` and `second`.
fn table_of_two(first: Tablet, second: Tablet) -> Vec<Op> {
    vec![
        Op::Counter(MAP_VERSION, 1),
        Op::Counter(NEXT_TABLE_ID, 2),
        Op::PutTable {
            id: 1,
            name: "t".into(),
            schema: None,
        },
        Op::PutTablet {
            table: 1,
            index: 0,
            tablet: first,
        },
        Op::PutTablet {
            table: 1,
            index: 1,
            tablet: second,
        },
    ]
}

#[test]
fn placement_alternates_servers_first() {
    let m = model_with_servers(&[2, 1, 3]);
    assert_eq!(
        m.placement_slots(),
        vec![(1, 0), (2, 0), (3, 0), (1, 1), (3, 1), (3, 2)]
    );
    assert!(Model::empty().placement_slots().is_empty());
}

#[test]
fn validate_rejects_gaps_and_unknown_owners() {
    let mut m = model_with_servers(&[1]);
    let tablet = |start, end| tablet_on(start, end, 1);
    m.apply(&table_of_two(tablet(0, 99), tablet(100, u64::MAX)));
    assert_eq!(m.validate(), Ok(()));
    assert_eq!(m.shard_loads(1), vec![2]);

    let mut gap = m.clone();
    gap.apply(&[Op::PutTablet {
        table: 1,
        index: 1,
        tablet: tablet(101, u64::MAX),
    }]);
    assert!(gap.validate().unwrap_err().contains("gap"));

    let mut orphan = m.clone();
    orphan.apply(&[Op::PutTablet {
        table: 1,
        index: 0,
        tablet: Tablet {
            shard: 5,
            ..tablet(0, 99)
        },
    }]);
    assert!(orphan.validate().unwrap_err().contains("unknown"));

    let mut dropped = m.clone();
    dropped.apply(&[Op::DeleteTable { id: 1 }]);
    assert!(dropped.tables.is_empty() && dropped.by_name.is_empty());

    // Retiring the owner orphans both tablets; that is coherent.
    let mut retired = m.clone();
    let mut ops = m.retire_ops(&[1], 2);
    ops.push(Op::Counter(MAP_VERSION, 2));
    retired.apply(&ops);
    assert_eq!(retired.validate(), Ok(()));
    assert!(retired.servers.is_empty());
    assert_eq!(retired.orphaned_tablets().len(), 2);
    assert_eq!(retired.orphaned_table_names(), vec!["t".to_string()]);
    assert_eq!(retired.first_orphan(1), Some(0));
    let info = retired.table_info(1).unwrap();
    assert!(
        info.tablets
            .iter()
            .all(|t| t.addr.is_empty() && t.server_id == ORPHANED && t.map_version == 2)
    );
    assert_eq!(m.first_orphan(1), None);
    // But an orphan's version may not run ahead of the global one.
    let mut ahead = m.clone();
    ahead.apply(&m.retire_ops(&[1], 7));
    assert!(ahead.validate().unwrap_err().contains("ahead"));

    // A table placed by slot: the id is counted without its bit, and a
    // tablet must start on a slot boundary.
    let slot_id = 1 | insitu_keyhash::SLOT_PLACED;
    let boundary = 1u64 << insitu_keyhash::SLOT_SHIFT;
    let mut by_slot = model_with_servers(&[1]);
    by_slot.apply(&[
        Op::Counter(MAP_VERSION, 1),
        Op::Counter(NEXT_TABLE_ID, 2),
        Op::PutTable {
            id: slot_id,
            name: "redis".into(),
            schema: None,
        },
        Op::PutTablet {
            table: slot_id,
            index: 0,
            tablet: tablet(0, boundary - 1),
        },
        Op::PutTablet {
            table: slot_id,
            index: 1,
            tablet: tablet(boundary, u64::MAX),
        },
    ]);
    assert_eq!(by_slot.validate(), Ok(()));
    let mut off_slot = by_slot.clone();
    off_slot.apply(&[
        Op::PutTablet {
            table: slot_id,
            index: 0,
            tablet: tablet(0, boundary),
        },
        Op::PutTablet {
            table: slot_id,
            index: 1,
            tablet: tablet(boundary + 1, u64::MAX),
        },
    ]);
    assert!(
        off_slot
            .validate()
            .unwrap_err()
            .contains("does not start on a slot")
    );
}

#[test]
fn dead_servers_stay_on_record_but_are_never_routed_to() {
    let mut m = model_with_servers(&[1, 2]);
    let tablet = tablet_on;
    m.apply(&table_of_two(tablet(0, 99, 1), tablet(100, u64::MAX, 2)));
    assert_eq!(m.first_orphan(1), None);
    m.apply(&[Op::MarkDead { id: 2 }, Op::MarkDead { id: 77 }]);
    assert_eq!(m.validate(), Ok(()), "a dead owner is still a known owner");
    assert!(
        m.dead.contains(&2) && !m.dead.contains(&77),
        "only servers on record die"
    );
    assert!(m.is_live(1) && !m.is_live(2));
    assert_eq!(m.live_servers(), vec![1]);
    assert_eq!(
        m.shard_addr(2, 0),
        None,
        "nothing is routed to a dead server"
    );
    assert_eq!(m.placement_slots(), vec![(1, 0)]);
    assert_eq!(m.first_orphan(1), Some(1), "its tablet waits for recovery");
    assert_eq!(m.awaiting_recovery_table_names(), vec!["t".to_string()]);
    assert_eq!(m.tablets_of(2).len(), 1);
    let info = m.table_info(1).unwrap();
    assert_eq!(
        (info.tablets[1].server_id, info.tablets[1].addr.as_str()),
        (2, "")
    );
    let states: Vec<ServerState> = m.server_infos().iter().map(|s| s.state).collect();
    assert_eq!(states, vec![ServerState::Up, ServerState::Dead]);
    // Forgetting it (after recovery) clears every trace.
    m.apply(&[Op::DeleteServer { id: 2 }]);
    assert!(m.dead.is_empty() && !m.servers.contains_key(&2));
}
