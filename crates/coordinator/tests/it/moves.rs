//! Moves that stop half-way: the coordinator crashes at each step, or the
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
