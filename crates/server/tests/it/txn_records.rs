//! The side records a commit leaves in the log. Every part of a commit
//! starts with a commit record, so a crash that keeps some of a
//! participant's groups and loses others leaves every applied part saying
//! "committed". The one beside the participant's vote part stays for the
//! decision's lifetime (a primary deciding an orphan, or a recovery, learns
//! the commit from it); the others are removed by the sweep once the log
//! holding them is durable (`txn_resolve.rs`, `remove_passing_records`).
//! Nothing but `ShardStats` shows them: were that removal broken, every
//! commit would leave a record per such part in the log for good.

use crate::common;

use common::txn::{retrying_client, side_records};
use common::{key_in, tablet_of};

use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_records_beside_parts_other_than_the_vote_are_removed_once_durable() {
    let (node, client) = retrying_client(2).await;
    let info = client.create_table("parts", 4).await.unwrap();
    let t = info.id;
    // Two tablets on one shard (`x`), one on the other (`y`): a commit then
    // has two parts on `x` (its vote part and one other) and one on `y`.
    let x = info.tablets[0].addr.clone();
    let on_x: Vec<usize> = (0..info.tablets.len())
        .filter(|&i| info.tablets[i].addr == x)
        .collect();
    let on_y = (0..info.tablets.len())
        .find(|&i| info.tablets[i].addr != x)
        .expect("tablets on both shards");
    assert!(on_x.len() >= 2, "two tablets on one shard: {info:?}");
    let y = info.tablets[on_y].addr.clone();
    let keys = [
        key_in(&info, on_x[0], "a"),
        key_in(&info, on_x[1], "b"),
        key_in(&info, on_y, "c"),
    ];
    assert_ne!(tablet_of(&info, &keys[0]), tablet_of(&info, &keys[1]));
    const COMMITS: u64 = 12;
    for i in 0..COMMITS {
        let keys = keys.clone();
        client
            .transaction(move |mut tx| {
                let keys = keys.clone();
                async move {
                    for k in &keys {
                        tx.write(t, k, i.to_le_bytes());
                    }
                    Ok((tx, ()))
                }
            })
            .await
            .unwrap();
    }
    // One record kept per commit on each participant; `x`'s second part's
    // records go within a few sweeps (every 250 ms) once durable.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (on_x, on_y) = (
            side_records(&client, &x, t).await,
            side_records(&client, &y, t).await,
        );
        if on_x == COMMITS && on_y == COMMITS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "records after {COMMITS} commits: {on_x} on the shard with two parts, {on_y} on the \
             other; want {COMMITS} each (the kept one beside each vote part)"
        );
        assert!(
            on_x >= COMMITS && on_y >= COMMITS,
            "a kept record went: {on_x}, {on_y}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The kept ones stay (their decision's lifetime is minutes).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(side_records(&client, &x, t).await, COMMITS);
    assert_eq!(side_records(&client, &y, t).await, COMMITS);
    for k in &keys {
        let (v, _) = client.read(t, k).await.unwrap().unwrap();
        assert_eq!(&v[..], &(COMMITS - 1).to_le_bytes()[..], "{k}");
    }
    node.server.shutdown();
    node.coordinator.shutdown().await;
}
