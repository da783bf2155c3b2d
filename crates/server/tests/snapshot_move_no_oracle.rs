//! A tablet that moves out of a table whose commit bound is unknown here
//! (a commit took no timestamp) while the timestamp oracle is unreachable
//! carries no bound (`migrate.rs`, `commit_ts_bound`): the move still
//! completes, and its new shard refuses every snapshot taken before the
//! arrival rather than answer one with a value committed after it. (With
//! the oracle reachable, the same snapshots are refused too: the fetched
//! bound is later than them. What this pins is the path without one: no
//! bound is never taken as "no commits", which would answer `v1` at a
//! snapshot taken before `v1` was written.)
//!
//! Alone in its test binary: the fault is armed by an environment variable
//! the server reads once per process (`faults.rs`).

mod common;

use common::snap::{commit, keep_versions, read_at, server_of, text, two_servers_one_table};
use insitu_client::Status;

/// The table the fault is armed for: the first table of a fresh cluster.
const TABLE: u64 = 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tablet_moved_without_a_bound_refuses_the_snapshots_before_it() {
    // SAFETY: set before any server thread starts (the first thing the
    // only test of this binary does).
    unsafe { std::env::set_var("INSITU_FAULT_AT", format!("move-oracle-fails:{TABLE:x}")) };
    let (node, second, client, info) = two_servers_one_table("moved").await;
    let t = info.id;
    assert_eq!(t, TABLE, "the first table of a fresh cluster");
    let (k, other) = (common::key_in(&info, 0, "k"), common::key_in(&info, 1, "o"));
    let away = server_of(&client, &info.tablets[1].addr).await;

    // Taken before anything is written: k did not exist at this snapshot.
    let before = client.timestamp().await.unwrap();
    // No snapshot was read yet, so no shard keeps versions and this commit
    // takes no timestamp: the table's bound on its source becomes unknown.
    commit(&client, t, &k, "v1").await;
    // Both shards keep versions from here on.
    keep_versions(&client, t, &[&k, &other]).await;
    let after_commit = client.timestamp().await.unwrap();
    assert_eq!(
        read_at(&client, after_commit, t, &k).await,
        Ok(Some("v1".into()))
    );

    // The source needs the oracle for a bound and cannot reach it: the move
    // goes on without one.
    client.move_tablet("moved", 0, away).await.unwrap();
    let moved = client.list_tables().await.unwrap();
    let moved = moved.iter().find(|i| i.id == t).expect("the table");
    assert_eq!(
        moved.tablets[0].addr, moved.tablets[1].addr,
        "both tablets on the second server now"
    );
    // Without a bound its new shard cannot tell which commits the arriving
    // objects hold: every snapshot before the arrival is refused, the one
    // taken before k existed too (answering v1 there would be wrong).
    assert_eq!(
        read_at(&client, before, t, &k).await,
        Err(Status::SnapshotTooOld)
    );
    assert_eq!(
        read_at(&client, after_commit, t, &k).await,
        Err(Status::SnapshotTooOld)
    );
    // A snapshot taken after the move reads the tablet, and plain reads
    // never depended on the bound.
    let later = client.timestamp().await.unwrap();
    assert_eq!(read_at(&client, later, t, &k).await, Ok(Some("v1".into())));
    assert_eq!(
        text(client.read(t, &k).await.map(|v| v.map(|(v, _)| v))),
        Ok(Some("v1".into()))
    );
    tokio::task::spawn_blocking(move || second.shutdown())
        .await
        .unwrap();
    drop(node);
}
