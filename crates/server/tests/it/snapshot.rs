//! Snapshot reads on a real server with several shards: a count or an
//! aggregate at a snapshot sees the table at one instant of the
//! transactions' commits, while transfers go on; a snapshot read sees the
//! values as of its timestamp, not later commits; a snapshot older than what
//! a shard keeps is refused, and the client takes a new one; a snapshot read
//! of a locked key waits for the transaction's decision.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::txn::{
    as_i64, client_with_op_timeout, decide_at, open_accounts, prepare, retrying_client, transfer,
};
use insitu_client::{AtSnapshot, Client, RpcConn, Selection, Status};
use insitu_protocol::plan::Field;

async fn cluster(shards: usize) -> (Client, common::Node) {
    let (node, client) = retrying_client(shards).await;
    (client, node)
}

fn at(mode: AtSnapshot) -> Selection {
    Selection {
        at_snapshot: mode,
        ..Selection::all()
    }
}

async fn sum(client: &Client, t: u64, mode: AtSnapshot) -> Result<(i128, u64), Status> {
    client
        .aggregate(t, Field::I64(0), &at(mode))
        .await
        .map(|a| (a.sum_int, a.count))
        .map_err(|e| e.status().unwrap_or(Status::Internal))
}

/// 40 accounts of 100 over 6 tablets on 3 shards; 4 clients move money
/// without pause: a transfer may empty an account and remove it, or credit
/// an account that does not exist yet (60 names). Every sum at a snapshot
/// is the initial total, though transfers commit on two shards at different
/// moments (one-phase commits on one shard, two-phase across two).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sums_at_a_snapshot_are_always_the_total_under_concurrent_transfers() {
    let (client, _node) = cluster(3).await;
    let t = client.create_table("bank", 6).await.unwrap().id;
    const NAMES: u64 = 60;
    const INITIAL: i64 = 100;
    open_accounts(&client, t, 40, INITIAL).await;
    let total = INITIAL as i128 * 40;
    let stop = Arc::new(AtomicBool::new(false));
    let transfers = Arc::new(AtomicU64::new(0));
    let movers: Vec<_> = (0..4u64)
        .map(|seed| {
            let client = client.clone();
            let (stop, transfers) = (stop.clone(), transfers.clone());
            tokio::spawn(async move {
                let mut rng = insitu_testkit::rng(seed);
                while !stop.load(Ordering::Relaxed) {
                    let from = format!("acct{}", rng.u64(0..NAMES));
                    let to = format!("acct{}", rng.u64(0..NAMES));
                    let all = rng.u64(0..4) == 0;
                    // All of it (and the account removed) or up to 7.
                    let moved = transfer(&client, t, (&from, &to), |a| {
                        Some((if all { a } else { a.min(7) }, all))
                    })
                    .await;
                    if moved {
                        transfers.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let mut audits = 0;
    let mut point_audits = 0;
    let mut snapshots = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (audits < 40 || transfers.load(Ordering::Relaxed) < 200) && Instant::now() < deadline {
        let out = client
            .execute_plan_at(
                t,
                &insitu_protocol::plan::ScanPlan::new(insitu_protocol::plan::Op::Aggregate {
                    field: Field::I64(0),
                }),
                AtSnapshot::On,
            )
            .await
            .unwrap();
        let insitu_protocol::plan::Partial::Aggregate(a) = out.partial else {
            panic!("not an aggregate: {:?}", out.partial);
        };
        assert_eq!(
            a.sum_int,
            total,
            "the sum at snapshot {} ({} accounts, after {} transfers)",
            out.snapshot_ts,
            a.count,
            transfers.load(Ordering::Relaxed)
        );
        assert!(out.snapshot_ts > 0);
        snapshots.insert(out.snapshot_ts);
        audits += 1;
        // A read-only transaction: every name read at one snapshot, on
        // every shard at once. It never aborts, and it sums to the total.
        let names: Vec<String> = (0..NAMES).map(|a| format!("acct{a}")).collect();
        let names = &names;
        let (read_sum, ts) = client
            .read_only(|snap| async move {
                let mut sum = 0i128;
                for found in snap.multi_read(t, names).await? {
                    sum += as_i64(found?.map(|(v, _)| v)) as i128;
                }
                Ok((sum, snap.ts()))
            })
            .await
            .unwrap();
        assert_eq!(read_sum, total, "the balances read at snapshot {ts}");
        point_audits += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for m in movers {
        m.await.unwrap();
    }
    let moved = transfers.load(Ordering::Relaxed);
    assert!(
        audits >= 40 && point_audits >= 40 && moved >= 200,
        "{audits} audits, {point_audits} read-only transactions, {moved} transfers"
    );
    assert_eq!(snapshots.len(), audits, "every audit had its own snapshot");
    // Auto reads a snapshot too (the table has 6 tablets), and a quiet
    // table sums the same either way.
    assert_eq!(sum(&client, t, AtSnapshot::Auto).await.unwrap().0, total);
    assert_eq!(sum(&client, t, AtSnapshot::Off).await.unwrap().0, total);
}

/// A snapshot sees each key as of its timestamp: a later commit's new
/// value, a later removal and a later creation are not seen by it, and are
/// by a newer snapshot; a snapshot the shards cannot read is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_reads_the_values_as_of_its_timestamp() {
    let (client, _node) = cluster(2).await;
    let t = client.create_table("vals", 4).await.unwrap().id;
    for (k, v) in [("a", 5i64), ("b", 10), ("c", 100)] {
        client.write(t, k, v.to_le_bytes()).await.unwrap();
    }
    // A timestamp from before any snapshot was read: the shards kept
    // nothing for it, so it is refused, not answered from today's values.
    let early = client.timestamp().await.unwrap();
    assert_eq!(
        sum(&client, t, AtSnapshot::At(early)).await,
        Err(Status::SnapshotTooOld)
    );
    // The client's own retry takes fresh timestamps until the shards keep
    // versions: then snapshots are read.
    assert_eq!(sum(&client, t, AtSnapshot::On).await, Ok((115, 3)));
    let before = client.timestamp().await.unwrap();
    client
        .transaction(|mut tx| async move {
            tx.write(t, "a", 7i64.to_le_bytes());
            tx.remove(t, "c");
            tx.write(t, "d", 1000i64.to_le_bytes());
            Ok((tx, ()))
        })
        .await
        .unwrap();
    // One key of a one-key transaction too (a one-phase commit).
    client
        .transaction(|mut tx| async move {
            let b = as_i64(tx.read(t, "b").await?);
            tx.write(t, "b", (b + 1).to_le_bytes());
            Ok((tx, ()))
        })
        .await
        .unwrap();
    assert_eq!(
        sum(&client, t, AtSnapshot::At(before)).await,
        Ok((115, 3)),
        "as of before the commits"
    );
    assert_eq!(
        client.count(t, &at(AtSnapshot::At(before))).await.unwrap(),
        3
    );
    let after = client.timestamp().await.unwrap();
    assert_eq!(sum(&client, t, AtSnapshot::At(after)).await, Ok((1018, 3)));
    // A count or aggregate at a timestamp not handed out yet is refused.
    assert_eq!(
        sum(&client, t, AtSnapshot::At(after + 3_600_000_000)).await,
        Err(Status::BadRequest)
    );
    assert_eq!(sum(&client, t, AtSnapshot::Off).await, Ok((1018, 3)));
    // Point reads at a snapshot: each key as of its timestamp.
    let read = |ts: u64| {
        let client = client.clone();
        async move {
            let snap = client.snapshot_at(ts).await.unwrap();
            let keys = ["a", "b", "c", "d"];
            let found = snap.multi_read(t, &keys).await.unwrap();
            let values: Vec<Option<i64>> = found
                .into_iter()
                .map(|f| f.unwrap().map(|(v, _)| as_i64(Some(v))))
                .collect();
            assert_eq!(
                snap.read(t, "a").await.unwrap().map(|v| as_i64(Some(v))),
                values[0]
            );
            values
        }
    };
    assert_eq!(read(before).await, vec![Some(5), Some(10), Some(100), None]);
    assert_eq!(read(after).await, vec![Some(7), Some(11), None, Some(1000)]);
    // A snapshot's counts and aggregates are at its timestamp too.
    let then = client.snapshot_at(before).await.unwrap();
    assert_eq!(then.count(t, &Selection::all()).await.unwrap(), 3);
    let agg = then
        .aggregate(t, Field::I64(0), &at(AtSnapshot::Off))
        .await
        .unwrap();
    assert_eq!(
        (agg.count, agg.sum_int),
        (3, 115),
        "Off is replaced by the snapshot"
    );
    // The version read at a snapshot is the one the value had then.
    let (_, v_then) = client
        .snapshot_at(before)
        .await
        .unwrap()
        .read_versioned(t, "a")
        .await
        .unwrap()
        .unwrap();
    let (_, v_now) = client.read(t, "a").await.unwrap().unwrap();
    assert!(v_then < v_now, "version {v_then} then, {v_now} now");
    // Older than what the shards keep: refused, not answered from today.
    let e = client
        .snapshot_at(early)
        .await
        .unwrap()
        .read(t, "a")
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::SnapshotTooOld));
    // A timestamp the oracle has not handed out yet is refused before any
    // read (a transaction could still commit below it); one just above the
    // highest this client saw is checked against a fresh one and accepted.
    let future = client.timestamp().await.unwrap() + 3_600_000_000;
    let e = client.snapshot_at(future).await.err().expect("refused");
    assert_eq!(e.status(), Some(Status::BadRequest), "{e}");
    assert!(e.to_string().contains("in the future"), "{e}");
    let e = client.snapshot_at(0).await.err().expect("refused");
    assert_eq!(e.status(), Some(Status::BadRequest), "{e}");
    let next = client.timestamp().await.unwrap() + 1;
    assert_eq!(client.snapshot_at(next).await.unwrap().ts(), next);
    // A read-only transaction that began there runs again at a new one.
    let mut first = true;
    let a = client
        .read_only(|snap| {
            let ts = if std::mem::take(&mut first) {
                early
            } else {
                snap.ts()
            };
            let client = client.clone();
            async move { client.snapshot_at(ts).await?.read(t, "a").await }
        })
        .await
        .unwrap();
    assert_eq!(as_i64(a), 7);
    // An update is never at a snapshot.
    let e = client
        .execute_plan_at(
            t,
            &insitu_protocol::plan::ScanPlan::new(insitu_protocol::plan::Op::Update {
                field: Field::I64(0),
                action: insitu_protocol::plan::UpdateAction::Add(insitu_protocol::Number::I64(1)),
            }),
            AtSnapshot::On,
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::BadRequest));
}

/// A snapshot read of a key waits for the transaction holding its lock
/// when the read arrives (its commit timestamp is not known before its
/// decision): committed at a timestamp below the snapshot's, its value is
/// seen; above it, the value before it is. Without the wait the read
/// would answer at once with the value before the first commit.
#[tokio::test]
async fn a_snapshot_read_waits_for_the_transaction_locking_its_key() {
    let (client, _node) = cluster(1).await;
    let info = client.create_table("snapwait", 1).await.unwrap();
    let t = info.id;
    let s = RpcConn::connect(&info.tablets[0].addr).await.unwrap();
    client.write(t, "k", "first").await.unwrap();
    // Snapshots are read here from now on: versions kept, the floor known.
    let read_at = |ts: u64| {
        let client = client.clone();
        async move { client.snapshot_at(ts).await?.read(t, "k").await }
    };
    client.read_only(|snap| read_at(snap.ts())).await.unwrap();
    // (txn, commit below the snapshot, value written, value the snapshot sees)
    let cases = [
        (0xa1, true, "below", "below"),
        (0xa2, false, "above", "below"),
    ];
    for (txn, below, value, seen) in cases {
        // A secondary whose primary has not decided: locked until the
        // decision sent below (after 2 s its primary would be asked).
        let r = s
            .call(&prepare(txn, Some("primary-key"), &[], t, "k", value))
            .await
            .unwrap();
        assert_eq!(r.status, Status::Ok, "{}", r.error_message());
        let early = client.timestamp().await.unwrap();
        let ts = client.timestamp().await.unwrap();
        let reader = tokio::spawn(read_at(ts));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !reader.is_finished(),
            "the snapshot read did not wait for the lock"
        );
        let commit_ts = if below {
            early
        } else {
            client.timestamp().await.unwrap()
        };
        assert!(decide_at(&s, txn, true, commit_ts).await);
        let got = reader.await.unwrap().unwrap();
        assert_eq!(got.as_deref(), Some(seen.as_bytes()), "txn {txn:#x}");
    }
    let now = client.read(t, "k").await.unwrap().map(|(v, _)| v);
    assert_eq!(now.as_deref(), Some(&b"above"[..]));
}

/// A one-key transaction commits in one request at its only participant,
/// which takes the commit timestamp from the oracle itself while snapshots
/// are read there. With the oracle unreachable it must not commit without
/// one (a snapshot could not place it): it aborts and unlocks, the client
/// gets an error, and the key keeps its value and takes a plain write.
#[tokio::test]
async fn a_one_phase_commit_without_the_oracle_aborts_and_unlocks() {
    let node = common::start(|_| {}).await;
    let client = client_with_op_timeout(&node, Duration::from_secs(3)).await;
    let t = client.create_table("nooracle", 1).await.unwrap().id;
    client.write(t, "k", 1i64.to_le_bytes()).await.unwrap();
    // Versions are kept on the shard from now on.
    let first = client
        .read_only(|snap| async move { snap.read(t, "k").await })
        .await
        .unwrap();
    assert_eq!(as_i64(first), 1);
    let before = client.snapshot().await.unwrap();
    let common::Node {
        coordinator,
        server,
        dir,
    } = node;
    coordinator.shutdown().await;
    let e = client
        .transaction(|mut tx| async move {
            let n = as_i64(tx.read(t, "k").await?);
            tx.write(t, "k", (n + 1).to_le_bytes());
            Ok((tx, ()))
        })
        .await
        .expect_err("committed without a timestamp from the oracle");
    assert!(e.to_string().contains("oracle"), "{e}");
    let now = client.read(t, "k").await.unwrap().map(|(v, _)| v);
    assert_eq!(as_i64(now), 1, "half a commit");
    client
        .write(t, "k", 5i64.to_le_bytes())
        .await
        .expect("the key was left locked");
    // That write took no timestamp (no oracle), so the shard stopped
    // keeping versions: a snapshot taken before it is not answered with
    // it (`stamped.rs`; without the reset it read 5).
    let then = before.read(t, "k").await;
    assert!(
        then.is_err(),
        "a snapshot older than an unstamped write read {then:?}"
    );
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
    drop(dir);
}
