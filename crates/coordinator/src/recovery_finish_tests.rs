//! A recovered tablet's two activations (`recovery/finish.rs`): reads
//! first, then writes once its replay is held; the `lost_from` row through
//! the stages; an owner that dies in between; a coordinator that stopped
//! before the writes.

use super::*;

/// Tablet 0 of the fixture (`setup`) committed to server 2 (fake `a`)
/// under a new version, its row naming `row` (1: the dead master, replay
/// not yet held; 2: the owner, held).
async fn recovered_to_a(coord: &Coordinator, row: u64) -> Tablet {
    let guard = coord.meta_lock.lock().await;
    let owned = tablet(coord, 0).placed(2, 0, 5);
    let ops = vec![
        Op::PutTablet {
            table: TABLE,
            index: 0,
            tablet: owned.clone(),
        },
        Op::PutLostFrom {
            table: TABLE,
            index: 0,
            master: row,
        },
        Op::Counter(MAP_VERSION, 5),
    ];
    coord.commit(&guard, ops).await.unwrap();
    owned
}

/// The `(index, master)` of every `lost_from` row `ops` write.
fn lost_rows(ops: &[Op]) -> Vec<(u32, u64)> {
    ops.iter()
        .filter_map(|op| match op {
            Op::PutLostFrom { index, master, .. } => Some((*index, *master)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn every_tablet_serves_reads_before_writes_and_its_row_goes_last() {
    let dir = Dir::new("recovery");
    let (a, b) = (fake_shard().await, fake_shard().await);
    let coord = open(&dir);
    setup(&coord, &a, &b).await;
    let summary = recover_server(&coord, 1).await.unwrap();
    assert_eq!(summary.tablets, 2);
    let mut logs = take(&a.log);
    logs.extend(take(&b.log));
    for index in [0, 2] {
        let t = tablet(&coord, index);
        let s = t.start_hash;
        let at = |line: String| {
            logs.iter()
                .position(|l| *l == line)
                .unwrap_or_else(|| panic!("{line} missing from {logs:?}"))
        };
        let recover = at(format!("Recover t1 s{s} m1"));
        let reads = at(format!("Activate t1 s{s} v{} reads", t.map_version));
        let writes = at(format!("Activate t1 s{s} v{}", t.map_version));
        assert!(recover < reads && reads < writes, "{logs:?}");
    }
    assert!(coord.model().lost_from.is_empty());
    coord.close().await;
}

#[tokio::test]
async fn an_owner_that_dies_before_its_replay_is_held_leaves_the_tablet_to_the_first_master() {
    let dir = Dir::new("recovery");
    let (a, b) = (fake_shard().await, fake_shard().await);
    let coord = open(&dir);
    setup(&coord, &a, &b).await;
    // Tablet 0: replayed on server 2, not yet held (row: master 1).
    recovered_to_a(&coord, 1).await;
    let ops = coord.model().lose_tablets_ops(2, 6);
    let rows = lost_rows(&ops);
    // Tablet 1 (server 2's own) is lost from server 2; tablet 0 keeps the
    // row naming server 1, whose replicas hold all of it.
    assert_eq!(rows, vec![(1, 2)]);
    let orphaned = ops
        .iter()
        .filter(|op| matches!(op, Op::PutTablet { tablet, .. } if tablet.is_orphaned()))
        .count();
    assert_eq!(orphaned, 2, "both of server 2's tablets are orphaned");

    // Once held, the row names the owner: its death makes it its own.
    let dir2 = Dir::new("recovery");
    let coord2 = open(&dir2);
    setup(&coord2, &a, &b).await;
    recovered_to_a(&coord2, 2).await;
    let rows = lost_rows(&coord2.model().lose_tablets_ops(2, 6));
    assert_eq!(rows, vec![(0, 2), (1, 2)]);
    coord.close().await;
    coord2.close().await;
}

#[tokio::test]
async fn a_held_tablet_left_refusing_writes_is_activated_by_the_next_round() {
    let dir = Dir::new("recovery");
    let (a, b) = (fake_shard().await, fake_shard().await);
    let coord = open(&dir);
    setup(&coord, &a, &b).await;
    let owned = recovered_to_a(&coord, 2).await;
    // A coordinator that stopped between recording the hold and the writes'
    // activation: the new one's driver finishes it, though no server is dead.
    coord.close().await;
    drop(coord);
    let coord = open(&dir);
    assert!(
        coord.masters_being_recovered().is_empty(),
        "not a dead master"
    );
    assert!(!coord.recover_dead_servers().await, "nothing failed");
    assert_eq!(
        take(&a.log),
        vec![format!(
            "Activate t1 s{} v{}",
            owned.start_hash, owned.map_version
        )]
    );
    assert!(coord.model().lost_from.is_empty());
    // Nothing left: the next round sends nothing.
    assert!(!coord.recover_dead_servers().await);
    assert!(take(&a.log).is_empty());
    coord.close().await;
}

#[tokio::test]
async fn a_row_naming_the_dead_master_resumes_with_the_reads_activation() {
    let dir = Dir::new("recovery");
    let (a, b) = (fake_shard().await, fake_shard().await);
    let coord = open(&dir);
    setup(&coord, &a, &b).await;
    // Server 1 is dead and tablet 2 still on it; tablet 0 was replayed on
    // server 2 and committed, its activations not confirmed.
    let owned = recovered_to_a(&coord, 1).await;
    let summary = recover_server(&coord, 1).await.unwrap();
    assert_eq!((summary.activated, summary.tablets), (1, 1));
    let log = take(&a.log);
    let s = owned.start_hash;
    let reads = format!("Activate t1 s{s} v{} reads", owned.map_version);
    let writes = format!("Activate t1 s{s} v{}", owned.map_version);
    let at = |line: &str| log.iter().position(|l| l == line);
    assert!(at(&reads).is_some() && at(&reads) < at(&writes), "{log:?}");
    assert!(
        !log.iter().any(|l| l == &format!("Recover t1 s{s} m1")),
        "not replayed again: {log:?}"
    );
    assert!(coord.model().lost_from.is_empty());
    coord.close().await;
}

#[tokio::test]
async fn accept_loss_leaves_a_held_tablet_alone() {
    let dir = Dir::new("recovery");
    let (a, b) = (fake_shard().await, fake_shard().await);
    let coord = open(&dir);
    setup(&coord, &a, &b).await;
    // Tablet 0 recovered onto live server 2 and held by its backups (the
    // row names its owner): nothing of it is missing.
    recovered_to_a(&coord, 2).await;
    let reply = coord.accept_loss("t".into()).await.unwrap();
    assert_eq!(reply, Response::LossAcknowledged { tablets: 0 });
    assert!(coord.model().data_lost.is_empty());
    assert_eq!(coord.model().lost_from.get(&(TABLE, 0)), Some(&2));
    coord.close().await;
}
