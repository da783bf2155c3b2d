//! Expiry is ordered by snapshots: a read at a snapshot judges an object's
//! deadline at the snapshot's instant, however late it runs (the server's
//! `versions::expired_at`, the engine's clock pinned for its reads), and
//! neither the expiry sweep's removal nor a write that replaces an object
//! past its deadline changes what an older snapshot reads (the removed
//! object is kept with its deadline, `expiry.rs`, `stamped.rs`). Before,
//! an object vanished from a snapshot taken before its deadline as soon as
//! the deadline passed on the server's clock.

use crate::common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::snap::keep_versions;
use common::txn::{as_i64, retrying_client};
use insitu_client::{Client, RejectRules, Selection};
use insitu_protocol::plan::Field;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as u64
}

/// Objects with a deadline the shard still holds in `table` (an expired
/// one counts until the sweep removes it).
async fn expiring_held(client: &Client, shard: &str, table: u64) -> u64 {
    common::tablet_sum(client, shard, table, |t| t.expiring_objects).await
}

/// `gone` expires and is removed by the sweep; `over` expires and is
/// written again right after its deadline (usually before the sweep, which
/// runs every 100 ms, gets to it: then the write must keep the expired
/// object for older snapshots; if the sweep came first, its removal must).
/// A snapshot taken before the deadline reads both as they were, by key
/// and by count and sum, after all of that; one taken after reads them
/// gone and rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_before_a_deadline_keeps_reading_the_object_after_it() {
    let (node, client) = retrying_client(1).await;
    let t = client.create_table("expiring", 2).await.unwrap().id;
    client.write(t, "stay", 1i64.to_le_bytes()).await.unwrap();
    keep_versions(&client, t, &["stay"]).await;
    let deadline_ms = now_ms() + 1_500;
    let rules = RejectRules::default();
    for (key, value) in [("gone", 7i64), ("over", 8)] {
        client
            .write_expiring(t, key, value.to_le_bytes(), deadline_ms, rules)
            .await
            .unwrap();
    }
    let before = client.snapshot().await.unwrap();
    assert!(
        before.ts() / 1000 < deadline_ms,
        "the snapshot ({} us) was taken before the deadline ({deadline_ms} ms)",
        before.ts()
    );
    let sum = |snap: insitu_client::Snapshot| async move {
        let a = snap.aggregate(t, Field::I64(0), &Selection::all()).await;
        let a = a.unwrap();
        (a.count, a.sum_int)
    };
    assert_eq!(sum(before.clone()).await, (3, 16), "before the deadline");

    // The deadline passes: overwrite `over` as soon as a plain read no
    // longer sees it.
    let give_up = Instant::now() + Duration::from_secs(10);
    while client.read(t, "over").await.unwrap().is_some() {
        assert!(Instant::now() < give_up, "`over` never expired");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    client.write(t, "over", 9i64.to_le_bytes()).await.unwrap();
    // Past the deadline on the server's clock, usually before the sweep
    // removed `gone`: the snapshot still judges it at its own instant.
    let read = before.read(t, "gone").await.unwrap();
    assert_eq!(read.map(|b| as_i64(Some(b))), Some(7), "gone, just expired");
    let scanned = sum(before.clone()).await;
    assert_eq!(scanned, (3, 16), "by aggregate, just expired");
    // Wait for the sweep to remove `gone` (the only expiring object left).
    let shard = node.shard(0);
    while expiring_held(&client, &shard, t).await > 0 {
        assert!(Instant::now() < give_up, "the sweep never removed `gone`");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(client.read(t, "gone").await.unwrap(), None);

    let after = client.snapshot().await.unwrap();
    for (key, then, now) in [("gone", Some(7), None), ("over", Some(8), Some(9))] {
        let read_then = before.read(t, key).await.unwrap().map(|b| as_i64(Some(b)));
        assert_eq!(read_then, then, "{key} at the snapshot before");
        let read_now = after.read(t, key).await.unwrap().map(|b| as_i64(Some(b)));
        assert_eq!(read_now, now, "{key} at the snapshot after");
    }
    assert_eq!(
        sum(before).await,
        (3, 16),
        "by aggregate at the snapshot before"
    );
    assert_eq!(
        sum(after).await,
        (2, 10),
        "by aggregate at the snapshot after"
    );
}
