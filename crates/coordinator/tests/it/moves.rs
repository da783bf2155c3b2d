//! Moves of a tablet: the protocol's steps in order, a refused step undone;
//! and moves that stop half-way: the coordinator crashes at each step, or the
//! destination dies; a restarted coordinator finishes or undoes the move, so
//! exactly one shard serves the tablet.

use crate::common;

use std::time::Duration;

use common::*;
use insitu_protocol::{Request, Status, TabletState};

/// Where the move is when the coordinator crashes, and whether a restart
/// must finish it (the new owner was committed) or undo it.
const STEPS: [(&str, bool); 4] = [
    // (1) TakeTablet{Receiving} on the destination: not committed.
    ("Take", false),
    // (2) MigrateTablet on the source: not committed.
    ("Migrate", false),
    // (4) ActivateTablet on the destination: committed.
    ("Activate", true),
    // (5) DropTablet on the source: committed.
    ("Drop", true),
];

#[tokio::test]
async fn a_coordinator_crash_at_each_step_of_a_move_is_reconciled_on_restart() {
    for (step, committed) in STEPS {
        let (dir, coord, c, log, src, dest, src_id, dest_id) = two_servers("movecrash", 1, 1).await;
        let t = create(&c, "t", 1).await;
        assert_eq!(t.tablets[0].server_id, src_id);
        let tab = t.tablets[0].clone();
        let (table, start) = (t.id, tab.start_hash);
        take_log(&log);

        // The step's shard hangs on it; crash the coordinator while it waits.
        let (shard, kind) = match step {
            "Take" | "Activate" => (&dest[0], step),
            _ => (&src[0], step),
        };
        shard.hang.lock().unwrap().insert(kind);
        let mover = connect(&coord).await;
        let pending = tokio::spawn(async move {
            let request = Request::MoveTablet {
                table: "t".into(),
                tablet_index: 0,
                server_id: dest_id,
            };
            // No reply is coming: the coordinator crashes first.
            let _ = mover.call_timeout(&request, Duration::from_secs(60)).await;
        });
        let shard_addr = shard.addr.clone();
        wait_for_log(&log, step, |(a, ctl)| {
            *a == shard_addr
                && ctl.kind() == kind
                // Step (1) is the Receiving take, not a later Active one.
                && !matches!(ctl, Ctl::Take { state: TabletState::Active, .. })
        })
        .await;
        drop(c);
        coord.crash().await;
        pending.abort();
        shard.hang.lock().unwrap().clear();
        take_log(&log);

        // A new coordinator process on the same metadata.
        let coord = start_coordinator(&dir).await;
        let c = connect(&coord).await;
        let (src_addr, dest_addr) = (src[0].addr.clone(), dest[0].addr.clone());
        if committed {
            // Finished: the destination is activated, the source's copy dropped.
            wait_for_log(&log, "DropTablet on the source", |(a, ctl)| {
                *a == src_addr && matches!(ctl, Ctl::Drop { .. })
            })
            .await;
            let now = open(&c, "t").await;
            assert_eq!(now.tablets[0].server_id, dest_id, "step {step}");
            assert!(now.map_version > t.map_version);
            let got = take_log(&log);
            assert_eq!(
                got[0],
                (
                    dest_addr.clone(),
                    Ctl::Activate {
                        table,
                        start,
                        version: now.tablets[0].map_version
                    }
                ),
                "step {step}: activate first, then drop: {got:?}"
            );
            assert_eq!(got[1], (src_addr.clone(), Ctl::Drop { table, start }));
            assert_eq!(got.len(), 2, "step {step}: {got:?}");
        } else {
            // Undone: the source serves again under its version, the
            // destination's copy is dropped, the map is unchanged.
            wait_for_log(&log, "DropTablet on the destination", |(a, ctl)| {
                *a == dest_addr && matches!(ctl, Ctl::Drop { .. })
            })
            .await;
            assert_eq!(open(&c, "t").await, t, "step {step}: map unchanged");
            let got = take_log(&log);
            assert_eq!(
                got,
                vec![
                    (
                        src_addr.clone(),
                        Ctl::Take {
                            table,
                            start,
                            end: tab.end_hash,
                            version: tab.map_version,
                            state: TabletState::Active
                        }
                    ),
                    (dest_addr.clone(), Ctl::Drop { table, start }),
                ],
                "step {step}"
            );
        }
        // The record is gone: the tablet can be moved again (back and forth).
        let target = if committed { src_id } else { dest_id };
        let moved = move_tablet(&c, "t", 0, target).await;
        assert_eq!(moved.tablets[0].server_id, target, "step {step}");
        drop(c);
        coord.shutdown().await;
    }
}

#[tokio::test]
async fn a_destination_that_dies_at_activation_leaves_one_owner() {
    let (_dir, coord, c, log, src, dest, src_id, dest_id) = two_servers("destdies", 1, 1).await;
    let t = create(&c, "t", 1).await;
    assert_eq!(t.tablets[0].server_id, src_id);
    take_log(&log);

    // The destination dies when asked to activate: no reply, ever.
    dest[0].close.lock().unwrap().insert("Activate");
    let reply = try_move(&c, "t", 0, dest_id).await;
    // The truth: committed, activation unconfirmed; never "failed".
    let msg = expect_err(&reply, Status::Internal);
    assert!(msg.contains("the move is committed"), "{msg}");
    assert!(msg.contains("not confirmed"), "{msg}");
    let got = take_log(&log);
    assert!(
        !got.iter()
            .any(|(a, ctl)| *a == src[0].addr && matches!(ctl, Ctl::Drop { .. })),
        "nothing is dropped while the destination may serve: {got:?}"
    );
    // Another move of this tablet waits for the first to be resolved.
    let busy = try_move(&c, "t", 0, src_id).await;
    expect_err(&busy, Status::Retry);

    // Its replacement enlists on the same addresses: the old destination is
    // declared dead, the tablet recovered (for now: re-created) (on the source's shard: the
    // first slot); the reconciler's DropTablet on the source is conditional
    // (only a copy that serves nothing), so it never drops the re-created
    // tablet. One owner.
    dest[0].close.lock().unwrap().clear();
    let new_dest = enlist(&c, addrs(&dest)).await;
    wait_for_log(&log, "DropTablet on the source", |(a, ctl)| {
        *a == src[0].addr && matches!(ctl, Ctl::Drop { .. })
    })
    .await;
    // The dead destination's tablet waits for recovery, then has one owner.
    let now = open_when_ready(&c, "t").await;
    assert!(
        now.tablets[0].server_id == new_dest || now.tablets[0].server_id == src_id,
        "{now:?}"
    );
    assert!(now.map_version > t.map_version);
    drop(c);
    coord.shutdown().await;
}

#[tokio::test]
async fn move_tablet_runs_the_protocol_in_order() {
    let (_dir, coord, c, log, s1, s2, id1, id2) = two_servers("move", 2, 2).await;
    // Slots: (1,0) (2,0) (1,1): server 2's shard 1 is empty, so it receives.
    let t = create(&c, "m", 3).await;
    assert_eq!((t.tablets[0].server_id, t.tablets[0].shard), (id1, 0));
    take_log(&log);

    let moved = move_tablet(&c, "m", 0, id2).await;
    let tab = &t.tablets[0];
    let (src, dest) = (s1[0].addr.clone(), s2[1].addr.clone());
    let new_version = t.map_version + 1;
    assert_eq!(
        moved.map_version, new_version,
        "a move bumps the map version"
    );
    assert_eq!(
        (moved.tablets[0].server_id, moved.tablets[0].shard),
        (id2, 1)
    );
    assert_eq!(moved.tablets[0].addr, dest);
    assert_eq!(moved.tablets[0].map_version, new_version);
    assert_eq!(
        (moved.tablets[0].start_hash, moved.tablets[0].end_hash),
        (tab.start_hash, tab.end_hash)
    );
    assert_eq!(
        &moved.tablets[1..],
        &t.tablets[1..],
        "other tablets untouched"
    );
    let (table, start) = (t.id, tab.start_hash);
    let mut expected = move_start_log(&t, 0, &src, &dest);
    let activate = Ctl::Activate {
        table,
        start,
        version: new_version,
    };
    expected.push((dest.clone(), activate));
    expected.push((src.clone(), Ctl::Drop { table, start }));
    assert_eq!(take_log(&log), expected);
    assert_eq!(open(&c, "m").await, moved);

    // Moving to the current owner: success, nothing sent, nothing bumped.
    let same = move_tablet(&c, "m", 0, id2).await;
    assert_eq!(same, moved);
    assert!(take_log(&log).is_empty());

    // Bad requests.
    let msg = expect_err(&try_move(&c, "m", 3, id2).await, Status::BadRequest);
    assert!(msg.contains("3 tablets"), "{msg}");
    let msg = expect_err(&try_move(&c, "m", 1, 42).await, Status::UnknownServer);
    assert!(msg.contains("42"), "{msg}");
    expect_err(&try_move(&c, "nope", 0, id2).await, Status::UnknownTable);
    assert!(take_log(&log).is_empty());
    assert_eq!(open(&c, "m").await.map_version, new_version);

    // The next move picks server 1's emptiest shard: shard 0 (now empty) over shard 1.
    let back = move_tablet(&c, "m", 1, id1).await;
    assert_eq!((back.tablets[1].server_id, back.tablets[1].shard), (id1, 0));
    assert_eq!(back.map_version, new_version + 1);
    coord.shutdown().await;
}

#[tokio::test]
async fn failed_migration_is_undone() {
    let (_dir, coord, c, log, s1, s2, _, id2) = two_servers("movefail", 1, 1).await;
    let t = create(&c, "f", 2).await;
    take_log(&log);
    s1[0].fail.lock().unwrap().insert("Migrate");

    let msg = expect_err(&try_move(&c, "f", 0, id2).await, Status::Internal);
    assert!(msg.contains("injected failure"), "{msg}");
    let tab = &t.tablets[0];
    let (table, start) = (t.id, tab.start_hash);
    let (src, dest) = (s1[0].addr.clone(), s2[0].addr.clone());
    let mut expected = move_start_log(&t, 0, &src, &dest);
    // Un-freeze the source under its old version (first: serving
    // again matters most), then drop the destination's copy.
    let unfreeze = take_of(&t, 0, t.map_version, TabletState::Active);
    expected.push((src.clone(), unfreeze));
    expected.push((dest.clone(), Ctl::Drop { table, start }));
    assert_eq!(take_log(&log), expected);
    assert_eq!(open(&c, "f").await, t, "map and version unchanged");

    // Destination refuses to receive: nothing reaches the source.
    s1[0].fail.lock().unwrap().clear();
    s2[0].fail.lock().unwrap().insert("Take");
    expect_err(&try_move(&c, "f", 0, id2).await, Status::Internal);
    // The source is at most told to serve on (idempotent): never to
    // migrate or drop.
    let got = take_log(&log);
    assert!(
        got.iter().all(|(addr, ctl)| *addr == dest
            || matches!(ctl, Ctl::Take { state: TabletState::Active, version, .. } if *version == t.map_version)),
        "{got:?}"
    );
    assert_eq!(open(&c, "f").await, t);

    // Destination refuses to activate: the tablet goes back to the source under a new version.
    s2[0].fail.lock().unwrap().clear();
    s2[0].fail.lock().unwrap().insert("Activate");
    expect_err(&try_move(&c, "f", 0, id2).await, Status::Internal);
    let after = open(&c, "f").await;
    assert_eq!(after.tablets[0].server_id, t.tablets[0].server_id);
    assert!(after.map_version > t.map_version);
    let got = take_log(&log);
    let last_two: Vec<_> = got.iter().rev().take(2).collect();
    assert!(
        last_two.contains(&&(dest.clone(), Ctl::Drop { table, start })),
        "{got:?}"
    );
    assert!(
        last_two.contains(&&(
            src.clone(),
            take_of(&t, 0, after.tablets[0].map_version, TabletState::Active)
        )),
        "{got:?}"
    );
    assert!(
        !got.iter()
            .any(|(addr, ctl)| *addr == src && matches!(ctl, Ctl::Drop { .. })),
        "the source copy is kept: {got:?}"
    );
    coord.shutdown().await;
}
