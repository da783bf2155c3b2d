//! The client against fake servers that misbehave: stale maps, `Retry`
//! statuses, time budgets, hung and dropped connections, dead shards, an
//! enumeration that makes no progress, nobody listening.

mod common;
mod fake;

use std::time::{Duration, Instant};

use common::*;
use insitu_client::{BlockingClient, ClientError, Status};
use insitu_keyhash::key_hash;

#[tokio::test]
async fn stale_map_unknown_tablet_refreshes_and_reroutes() {
    let (cluster, client, t) = setup().await;
    write_numbered(&client, t, 100).await;
    // A key of tablet 1, which lives on shard 1 (server 2).
    let k = (0..100)
        .map(key)
        .find(|k| cluster.tablet_of(t, key_hash(t, k)).0 == 1)
        .unwrap();
    assert_eq!(cluster.holder(t, &k), Some(1));

    // Behind the client's back, tablet 1 moves to server 1 (shard 0).
    cluster.move_tablet(t, 1, 1);
    let refreshes = cluster.co().count("TableMap");
    let (v, _) = client
        .read(t, &k)
        .await
        .unwrap()
        .expect("found on the new owner");
    assert_eq!(&v[..], &value(key_index(&k))[..]);
    assert_eq!(cluster.co().count("TableMap"), refreshes + 1, "one refresh");
    assert_eq!(
        cluster.shards[1].st().log.last().unwrap().status,
        Status::UnknownTablet
    );

    // And back: the multi-read hits shard 0 with per-object UnknownTablet for
    // tablet-1 keys, refreshes, and re-routes just those.
    cluster.move_tablet(t, 1, 2);
    let keys: Vec<Vec<u8>> = (0..100).map(key).collect();
    let got = client.multi_read(t, &keys).await.unwrap();
    assert_numbered(&got);
    assert_eq!(cluster.co().count("TableMap"), refreshes + 2);
    let st = cluster.shards[1].st();
    let last = st.log.last().unwrap();
    assert_eq!(last.op, "MultiRead");
    let tablet1 = (0..100)
        .filter(|&i| cluster.tablet_of(t, key_hash(t, &key(i))).0 == 1)
        .count();
    assert_eq!(
        last.items, tablet1,
        "only the re-routed keys went to shard 1"
    );
}

#[tokio::test]
async fn retry_status_backs_off_then_succeeds() {
    let (cluster, client, t) = setup().await;
    client.write(t, b"k", b"v").await.unwrap();
    let shard = cluster.holder(t, b"k").unwrap();
    cluster.shards[shard].st().retry_next = 4;
    let refreshes = cluster.co().count("TableMap");
    let start = Instant::now();
    let (v, _) = client.read(t, b"k").await.unwrap().unwrap();
    let took = start.elapsed();
    assert_eq!(&v[..], b"v");
    assert_eq!(cluster.shards[shard].st().count("Read"), 5);
    assert!(
        took >= Duration::from_millis(1 + 2 + 4 + 8),
        "backed off 1+2+4+8 ms, took {took:?}"
    );
    assert_eq!(
        cluster.co().count("TableMap"),
        refreshes + 4,
        "map refreshed after each Retry"
    );

    // Multi-ops honour a request-level Retry too.
    cluster.shards[shard].st().retry_next = 2;
    let got = client.multi_read(t, &[b"k".as_slice()]).await.unwrap();
    assert_eq!(&got[0].as_ref().unwrap().as_ref().unwrap().0[..], b"v");
}

#[tokio::test]
async fn endless_retry_gives_up_within_the_budget() {
    let (cluster, client, t) = setup_with(short(300)).await;
    for s in &cluster.shards {
        s.st().retry_always = true;
    }
    let start = Instant::now();
    let e = client.write(t, b"k", b"v").await.unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(&e, ClientError::GaveUp { last, .. } if last.status() == Some(Status::Retry)),
        "{e}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(e.to_string().contains("gave up"), "{e}");
    // Backing off capped at 50 ms: a bounded number of attempts, well above one.
    let attempts = cluster
        .shards
        .iter()
        .map(|s| s.st().count("Write"))
        .sum::<usize>();
    assert!(
        (5..=40).contains(&attempts),
        "{attempts} attempts in 300 ms"
    );

    let keys: Vec<Vec<u8>> = (0..10).map(key).collect();
    let got = client.multi_read(t, &keys).await.unwrap();
    assert!(
        got.iter()
            .all(|r| matches!(r, Err(ClientError::GaveUp { .. }))),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_hung_shard_times_out() {
    let (cluster, client, t) = setup_with(short(300)).await;
    for s in &cluster.shards {
        s.st().hang = true;
    }
    let start = Instant::now();
    let e = client.read(t, b"k").await.unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn dropped_connection_reconnects_for_plain_ops_only() {
    let (cluster, client, t) = setup().await;
    client.write(t, b"k", b"v1").await.unwrap();
    let shard = cluster.holder(t, b"k").unwrap();

    // A plain write whose connection drops (after it was applied) is sent again.
    cluster.shards[shard].st().drop_after_apply_next = 1;
    client.write(t, b"k", b"v2").await.unwrap();
    assert_eq!(cluster.shards[shard].st().count("Write"), 3, "sent twice");
    assert_eq!(&client.read(t, b"k").await.unwrap().unwrap().0[..], b"v2");

    // A conditional write is not repeated: its outcome is reported unknown.
    let (_, v) = client.read(t, b"k").await.unwrap().unwrap();
    cluster.shards[shard].st().drop_after_apply_next = 1;
    let rules = unless_version(v);
    let e = client.write_with(t, b"k", b"v3", rules).await.unwrap_err();
    assert!(matches!(e, ClientError::Closed(_)), "{e}");
    assert_eq!(cluster.shards[shard].st().count("Write"), 4, "sent once");
    assert_eq!(
        &client.read(t, b"k").await.unwrap().unwrap().0[..],
        b"v3",
        "it was applied"
    );

    // Nor is an increment.
    let n = b"k".to_vec();
    client.write(t, &n, 10i64.to_le_bytes()).await.unwrap();
    cluster.shards[shard].st().drop_after_apply_next = 1;
    let e = client.increment_i64(t, &n, 1).await.unwrap_err();
    assert!(matches!(e, ClientError::Closed(_)), "{e}");
    assert_eq!(
        cluster.shards[shard].st().count("Increment"),
        1,
        "sent once"
    );
    assert_eq!(
        client.increment_i64(t, &n, 1).await.unwrap().0,
        12,
        "first increment applied once, client reconnected"
    );
}

#[tokio::test]
async fn dead_shard_whose_tablet_moved_is_routed_around() {
    let (cluster, client, t) = setup().await;
    write_numbered(&client, t, 50).await;
    // Shard 1 dies; its tablet is recovered on shard 0 (server 1).
    cluster.shards[1].kill();
    cluster.move_tablet(t, 1, 1);
    let keys: Vec<Vec<u8>> = (0..50).map(key).collect();
    assert_numbered(&client.multi_read(t, &keys).await.unwrap());
    for i in 0..50 {
        assert!(client.read(t, key(i)).await.unwrap().is_some());
    }
}

#[tokio::test]
async fn enumerate_that_makes_no_progress_is_an_error_not_a_hang() {
    let (cluster, client, t) = setup().await;
    client.write(t, b"k", b"v").await.unwrap();
    for s in &cluster.shards {
        s.st().enumerate_stall = true;
    }
    let e = tokio::time::timeout(Duration::from_secs(5), client.enumerate(t).next_batch())
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::Unexpected { what, .. } if what.contains("no progress")),
        "{e}"
    );
}

#[test]
fn connect_to_nothing_fails_with_the_address() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let e = BlockingClient::connect(&addr)
        .err()
        .expect("nobody listens");
    assert!(matches!(e, ClientError::Connect { .. }), "{e}");
    assert!(e.to_string().contains(&addr), "{e}");
}
