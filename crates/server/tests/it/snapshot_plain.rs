//! Plain writes (not transactions) are ordered by snapshots: a read at a
//! snapshot sees every plain write acknowledged before its timestamp was
//! taken and none applied after it, on every shard alike (the server's
//! `stamped.rs`). Before, a snapshot read of several shards saw each as it
//! was when its request arrived there: a write acknowledged after a later
//! one's shard was read could be missing while the later one was seen.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use common::snap::{keep_versions, read_at, server_of, two_servers_one_table};
use common::txn::{as_i64, retrying_client};
use insitu_client::{Selection, Status};
use insitu_protocol::Number;
use insitu_protocol::plan::{Field, UpdateAction};

/// Keys written as a multiWrite, then keys written one at a time.
const FIRST: usize = 8;
const SECOND: usize = 8;

/// A writer goes round and round: it writes round number `r` to the first
/// group of keys in one multiWrite (several shards at once), then to each
/// key of the second group in turn, each write acknowledged before the next.
/// So at any one instant the first group holds `r` or `r - 1` (mixed while
/// its multiWrite is under way), and the second group holds values that do
/// not rise along it, none above the first group's least, and none more
/// than one round behind the first group's largest. Every read at a
/// snapshot must show such an instant, and show every round acknowledged
/// before the snapshot was taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_sees_plain_writes_as_of_its_timestamp_on_every_shard() {
    let (_node, client) = retrying_client(3).await;
    let t = client.create_table("plain", 6).await.unwrap().id;
    let keys: Vec<String> = (0..FIRST + SECOND).map(|i| format!("k{i:02}")).collect();
    for k in &keys {
        client.write(t, k, 0i64.to_le_bytes()).await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    // The last round whose every write was acknowledged.
    let done = Arc::new(AtomicI64::new(0));
    let writer = {
        let (client, keys, stop, done) = (client.clone(), keys.clone(), stop.clone(), done.clone());
        tokio::spawn(async move {
            let mut round = 0i64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let value = round.to_le_bytes();
                let first: Vec<(&String, [u8; 8])> =
                    keys[..FIRST].iter().map(|k| (k, value)).collect();
                for r in client.multi_write(t, &first).await.unwrap() {
                    r.unwrap();
                }
                for k in &keys[FIRST..] {
                    client.write(t, k, value).await.unwrap();
                }
                done.store(round, Ordering::Relaxed);
            }
            round
        })
    };
    let mut snapshots = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while (snapshots < 150 || done.load(Ordering::Relaxed) < 100) && Instant::now() < deadline {
        let acknowledged = done.load(Ordering::Relaxed);
        let keys = &keys;
        let (values, ts) = client
            .read_only(|snap| async move {
                // One key at a time, in the order they are written: a
                // shard read later than another must not show writes the
                // earlier read missed, though the writer goes on between.
                let mut values = Vec::new();
                for k in keys {
                    values.push(as_i64(snap.read(t, k).await?));
                }
                Ok((values, snap.ts()))
            })
            .await
            .unwrap();
        let (first, second) = values.split_at(FIRST);
        let least_first = *first.iter().min().unwrap();
        let most_first = *first.iter().max().unwrap();
        let shown = format!("snapshot {ts}: {first:?} then {second:?}");
        assert!(
            most_first - least_first <= 1,
            "{shown}: the multiWrite group"
        );
        assert!(
            second.windows(2).all(|w| w[0] >= w[1]),
            "{shown}: a later write seen without an earlier one"
        );
        assert!(
            second[0] <= least_first && second[SECOND - 1] + 1 >= most_first,
            "{shown}: the two groups are not of one instant"
        );
        assert!(
            second[SECOND - 1] >= acknowledged,
            "{shown}: round {acknowledged} was acknowledged before the snapshot was taken"
        );
        snapshots += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.await.unwrap();
    assert!(
        snapshots >= 150 && rounds >= 100,
        "{snapshots} snapshots during {rounds} rounds of writes"
    );
    // The writes applied under timestamps are plain writes still: read
    // back as written, and the last round everywhere.
    for k in &keys {
        let v = client.read(t, k).await.unwrap().map(|(v, _)| v);
        assert_eq!(as_i64(v), rounds, "{k}");
    }
}

/// A key written twice in one multiWrite ends with the later value, and a
/// multiRemove and an increment while snapshots are read are not seen by
/// an older snapshot: the parts a shard locks under one timestamp take a
/// key once, in order.
#[tokio::test]
async fn a_multi_write_under_snapshots_keeps_its_order() {
    let (_node, client) = retrying_client(1).await;
    let t = client.create_table("twice", 1).await.unwrap().id;
    client.write(t, "a", b"0").await.unwrap();
    // Versions are kept on the shard from now on: writes take timestamps.
    client
        .read_only(|snap| async move { snap.read(t, "a").await })
        .await
        .unwrap();
    let items = [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"), ("a", "3")];
    for r in client.multi_write(t, &items).await.unwrap() {
        r.unwrap();
    }
    let a = client.read(t, "a").await.unwrap().map(|(v, _)| v);
    assert_eq!(
        a.as_deref(),
        Some(&b"3"[..]),
        "the last write of a key wins"
    );
    assert_eq!(client.increment_i64(t, "n", 5).await.unwrap().0, 5);
    let before = client.snapshot().await.unwrap();
    for r in client.multi_remove(t, &["b", "c"]).await.unwrap() {
        r.unwrap();
    }
    assert_eq!(client.read(t, "b").await.unwrap(), None, "removed");
    let then = before.read(t, "b").await.unwrap();
    assert_eq!(
        then.as_deref(),
        Some(&b"1"[..]),
        "as of the earlier snapshot"
    );
    // One key named 5,000 times: locked once per part (not a part, and an
    // oracle round trip, per repeat), every write applied in order.
    let same: Vec<(&str, String)> = (0..5000).map(|i| ("d", i.to_string())).collect();
    let versions: Vec<u64> = client
        .multi_write(t, &same)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "in order");
    let d = client.read(t, "d").await.unwrap().map(|(v, _)| v);
    assert_eq!(d.as_deref(), Some(&b"4999"[..]));
    assert_eq!(
        before.read(t, "d").await.unwrap(),
        None,
        "absent at the snapshot"
    );
    // An increment takes a timestamp too, and answers the new number.
    assert_eq!(client.increment_i64(t, "n", 2).await.unwrap().0, 7);
    assert_eq!(as_i64(before.read(t, "n").await.unwrap()), 5, "as of it");
    let now = client.read(t, "n").await.unwrap().map(|(v, _)| v);
    assert_eq!(as_i64(now), 7);
}

/// A plain write applied while its shard kept no versions takes no
/// timestamp, but it makes its table's commit bound unknown: a tablet that
/// moves after it carries a timestamp fetched after it, so a snapshot taken
/// before the write is refused on the new shard, never answered with it.
/// (With the bound of commits alone, 0 here, the new shard, which keeps
/// versions, read the later value at the older snapshot.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_write_before_a_move_is_not_read_by_an_older_snapshot() {
    let (_node, _second, client, info) = two_servers_one_table("plainmove").await;
    let t = info.id;
    let (k, other) = (common::key_in(&info, 0, "k"), common::key_in(&info, 1, "o"));
    let away = server_of(&client, &info.tablets[1].addr).await;
    // Only the destination keeps versions (a snapshot read there).
    keep_versions(&client, t, &[&other]).await;
    client.write(t, &k, "v1").await.unwrap();
    let before = client.timestamp().await.unwrap();
    client.write(t, &k, "v2").await.unwrap();
    client.move_tablet("plainmove", 0, away).await.unwrap();
    assert_eq!(
        read_at(&client, before, t, &k).await,
        Err(Status::SnapshotTooOld),
        "a snapshot older than a plain write that moved with its tablet"
    );
    let after = client.timestamp().await.unwrap();
    assert_eq!(read_at(&client, after, t, &k).await, Ok(Some("v2".into())));
}

/// The Redis port's writes are ordered by snapshots too: while snapshots are
/// read on a shard, a `SET`, `DEL` or `INCR` of a key it owns goes through
/// its request port (and takes a timestamp) instead of straight to its
/// engine, and an `MSET` is a transaction. (Before, the keys the receiving
/// shard owned were written at once, and an older snapshot saw them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_writes_are_not_seen_by_an_older_snapshot() {
    let c = common::resp::cluster(|_| {}).await;
    let addr = c.resp();
    let run = |lines: Vec<String>| async move {
        tokio::task::spawn_blocking(move || common::resp::pipeline(addr, &lines))
            .await
            .unwrap()
    };
    // Enough keys that several live on the shard the connection lands on.
    let keys: Vec<String> = (0..24).map(|i| format!("k{i}")).collect();
    let sets = keys.iter().map(|k| format!("SET {k} 1")).collect();
    assert!(run(sets).await.iter().all(|r| r == "+OK\r\n"));
    let client = insitu_client::Client::connect(&c.node.addr())
        .await
        .unwrap();
    let t = client.table_id("redis").await.unwrap();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    // Every shard owning a key keeps versions from here on.
    keep_versions(&client, t, &names).await;
    let before = client.snapshot().await.unwrap();
    let mut writes = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        writes.push(match i % 4 {
            0 => format!("SET {k} 2"),
            1 => format!("DEL {k}"),
            2 => format!("INCR {k}"),
            _ => format!("MSET {k} 2"),
        });
    }
    let replies = run(writes).await;
    assert!(replies.iter().all(|r| !r.starts_with('-')), "{replies:?}");
    for (i, k) in keys.iter().enumerate() {
        let then = before.read(t, k).await.unwrap();
        assert_eq!(then.as_deref(), Some(&b"1"[..]), "{k} as of the snapshot");
        let now = client.read(t, k).await.unwrap().map(|(v, _)| v);
        let want: Option<&[u8]> = if i % 4 == 1 { None } else { Some(b"2") };
        assert_eq!(now.as_deref(), want, "{k} now");
    }
}

/// Pushdown updates and removals (`insitu update`, `insitu delete`, SQL
/// `UPDATE` / `DELETE`) take a timestamp too, one per tablet while
/// snapshots are read there, so a snapshot taken before one reads the
/// values before it, by key and by aggregate alike, and one taken after
/// reads it whole. (Before, they took none: the older snapshot read the
/// updated values, 2 instead of 1.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushdown_updates_are_not_seen_by_an_older_snapshot() {
    let (_node, client) = retrying_client(2).await;
    let t = client.create_table("bulk", 4).await.unwrap().id;
    let keys: Vec<String> = (0..200).map(|i| format!("k{i:03}")).collect();
    let ones: Vec<(&String, [u8; 8])> = keys.iter().map(|k| (k, 1i64.to_le_bytes())).collect();
    for r in client.multi_write(t, &ones).await.unwrap() {
        r.unwrap();
    }
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    keep_versions(&client, t, &names).await;
    let sum_at = |snap: insitu_client::Snapshot| async move {
        let sel = Selection::all();
        snap.aggregate(t, Field::I64(0), &sel)
            .await
            .unwrap()
            .sum_int
    };
    let before = client.snapshot().await.unwrap();
    let add = UpdateAction::Add(Number::I64(1));
    let n = client
        .update(t, Field::I64(0), add, &Selection::all())
        .await;
    assert_eq!(n.unwrap(), 200);
    let updated = client.snapshot().await.unwrap();
    for k in &keys {
        assert_eq!(as_i64(before.read(t, k).await.unwrap()), 1, "{k} before");
        assert_eq!(as_i64(updated.read(t, k).await.unwrap()), 2, "{k} after");
    }
    assert_eq!(sum_at(before.clone()).await, 200, "the sum as of before");
    assert_eq!(sum_at(updated.clone()).await, 400, "the sum as of after");
    let removed = client.remove_where(t, &Selection::all()).await.unwrap();
    assert_eq!(removed, 200);
    for k in &keys {
        assert_eq!(as_i64(before.read(t, k).await.unwrap()), 1, "{k} before");
        assert_eq!(as_i64(updated.read(t, k).await.unwrap()), 2, "{k} updated");
        assert_eq!(client.read(t, k).await.unwrap(), None, "{k} removed");
    }
    assert_eq!(
        sum_at(before).await,
        200,
        "the sum as of before, after the removal"
    );
}

/// A snapshot read of a tablet that a pushdown update is writing waits for
/// its end: the update's writes yield between slices of about a
/// millisecond, and a read at a snapshot above the update's timestamp would
/// otherwise see the keys written so far and not the rest. Every sum of all
/// keys read at one snapshot, by key (a multiRead, whose reads do not
/// restart) and by aggregate, over a table that updates keep adding 1 to,
/// must be a whole number of updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_never_reads_half_a_pushdown_update() {
    const KEYS: i64 = 40_000;
    let (node, client) = retrying_client(1).await;
    let t = client.create_table("halfway", 1).await.unwrap().id;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("k{i:05}")).collect();
    for chunk in keys.chunks(4_000) {
        let zeros: Vec<(&String, [u8; 8])> =
            chunk.iter().map(|k| (k, 0i64.to_le_bytes())).collect();
        for r in client.multi_write(t, &zeros).await.unwrap() {
            r.unwrap();
        }
    }
    keep_versions(&client, t, &["k00000"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    // Its own connection: a shard answers one connection's requests in
    // order, so a read sent behind an update on the same one never meets it.
    let other = common::txn::client_with_op_timeout(&node, Duration::from_secs(60)).await;
    let updater = {
        let (client, stop) = (other, stop.clone());
        tokio::spawn(async move {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                let add = UpdateAction::Add(Number::I64(1));
                let n = client
                    .update(t, Field::I64(0), add, &Selection::all())
                    .await;
                assert_eq!(n.unwrap() as i64, KEYS);
                rounds += 1;
            }
            rounds
        })
    };
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < 30 && Instant::now() < deadline {
        let snap = client.snapshot().await.unwrap();
        let by_key: i64 = snap
            .multi_read(t, &keys)
            .await
            .unwrap()
            .into_iter()
            .map(|r| as_i64(r.unwrap().map(|(v, _)| v)))
            .sum();
        assert_eq!(
            by_key % KEYS,
            0,
            "a multiRead read part of an update: sum {by_key}"
        );
        let sel = Selection::all();
        let sum = snap
            .aggregate(t, Field::I64(0), &sel)
            .await
            .unwrap()
            .sum_int;
        assert_eq!(sum, by_key as i128, "the aggregate at the same snapshot");
        seen.push(by_key / KEYS);
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = updater.await.unwrap();
    assert!(rounds >= 3, "the updates ran ({rounds} rounds)");
    seen.dedup();
    assert!(seen.len() >= 3, "snapshots saw the updates go on: {seen:?}");
}
