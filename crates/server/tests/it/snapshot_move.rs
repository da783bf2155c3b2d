//! Snapshot reads of a tablet that moved: the tablet carries a bound on its
//! commits' timestamps, so its new shard reads snapshots taken after its
//! last commit (even before the move) at once, and refuses those older than
//! a commit whose replaced value stayed behind rather than answer them with
//! a later value. Three servers of one shard each, on loopback.

use crate::common;

use common::snap::{commit, keep_versions, read_at, server_of, two_servers_one_table};
use insitu_client::{AtSnapshot, Selection, Status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_tablet_reads_the_snapshots_its_commits_allow() {
    let (node, second, client, info) = two_servers_one_table("moved").await;
    let t = info.id;
    let (k, other) = (common::key_in(&info, 0, "k"), common::key_in(&info, 1, "o"));
    let home = server_of(&client, &info.tablets[0].addr).await;
    let away = server_of(&client, &info.tablets[1].addr).await;

    // Both servers keep versions from here on (a snapshot read of each).
    keep_versions(&client, t, &[&k, &other]).await;
    commit(&client, t, &k, "v1").await;
    let old = client.timestamp().await.unwrap();
    commit(&client, t, &k, "v2").await;
    let fresh = client.timestamp().await.unwrap();
    assert_eq!(read_at(&client, old, t, &k).await, Ok(Some("v1".into())));
    assert_eq!(read_at(&client, fresh, t, &k).await, Ok(Some("v2".into())));

    client.move_tablet("moved", 0, away).await.unwrap();
    // Taken before the move, after the tablet's last commit: read there.
    assert_eq!(
        read_at(&client, fresh, t, &k).await,
        Ok(Some("v2".into())),
        "a snapshot after the tablet's last commit, read on its new shard"
    );
    // Older than a commit whose replaced value stayed on the old shard:
    // refused, never answered with the later value.
    assert_eq!(
        read_at(&client, old, t, &k).await,
        Err(Status::SnapshotTooOld)
    );
    // A count at that snapshot spans both servers (only `k` was written).
    assert_eq!(
        client
            .count(
                t,
                &Selection {
                    at_snapshot: AtSnapshot::At(fresh),
                    ..Selection::all()
                }
            )
            .await
            .unwrap(),
        1
    );

    // On to a third server, which knew nothing of the table: the bound the
    // second server took in is carried on.
    let third = node.second_server("s3").await;
    let servers = client.list_servers().await.unwrap();
    let far = servers
        .iter()
        .map(|s| s.id)
        .find(|id| ![home, away].contains(id))
        .expect("a third server");
    // It keeps versions once a snapshot was read there (until then the
    // commits applied there were not kept, and any snapshot before its
    // first read is refused, moved tablet or not).
    client.move_tablet("moved", 1, far).await.unwrap();
    client
        .read_only(|snap| {
            let other = other.clone();
            async move { snap.read(t, &other).await }
        })
        .await
        .unwrap();
    client.move_tablet("moved", 0, far).await.unwrap();
    assert_eq!(read_at(&client, fresh, t, &k).await, Ok(Some("v2".into())));
    assert_eq!(
        read_at(&client, old, t, &k).await,
        Err(Status::SnapshotTooOld),
        "the first server's commit is still bounded"
    );

    // Back home, where the versions of the first stay are still kept: a
    // snapshot the bound admits never reads them, one below it is refused.
    commit(&client, t, &k, "v3").await;
    let after = client.timestamp().await.unwrap();
    client.move_tablet("moved", 0, home).await.unwrap();
    assert_eq!(read_at(&client, after, t, &k).await, Ok(Some("v3".into())));
    assert_eq!(
        read_at(&client, fresh, t, &k).await,
        Err(Status::SnapshotTooOld),
        "v3 was committed after it on the other server"
    );
    assert_eq!(
        read_at(&client, old, t, &k).await,
        Err(Status::SnapshotTooOld)
    );
    tokio::task::spawn_blocking(move || {
        third.shutdown();
        second.shutdown();
    })
    .await
    .unwrap();
    drop(node);
}
