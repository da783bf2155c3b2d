//! Transactions on a real server with several shards: no lost update under
//! concurrent read-modify-writes, a bank's total never changes under
//! concurrent transfers and every committed audit sees it whole, a stale read
//! aborts the commit, and a client that vanishes mid-commit leaves no key
//! locked for ever: prepared everywhere it commits, prepared in part it
//! aborts (and its late prepare is refused).

use crate::common;

use common::txn::{
    as_i64, decide, keys_on_two_shards, open_accounts, participants, prepare, retrying_client,
    transfer,
};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use insitu_client::{Client, RpcConn, Status};
use insitu_keyhash::key_hash;
use insitu_protocol::txn::{TxnAnchor, TxnItem, TxnWrite};
use insitu_protocol::{RejectRules, Request, blob};

struct Cluster {
    client: Client,
    node: common::Node,
}

async fn cluster(shards: usize) -> Cluster {
    let (node, client) = retrying_client(shards).await;
    Cluster { client, node }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_increments_lose_no_update() {
    let c = cluster(2).await;
    let t = c.client.create_table("counters", 4).await.unwrap().id;
    const TASKS: u64 = 8;
    const EACH: u64 = 25;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = c.client.clone();
            tokio::spawn(async move {
                for _ in 0..EACH {
                    client
                        .transaction(|mut tx| async move {
                            let n = as_i64(tx.read(t, "n").await?);
                            tx.write(t, "n", (n + 1).to_le_bytes());
                            Ok((tx, ()))
                        })
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let (v, _) = c.client.read(t, "n").await.unwrap().unwrap();
    assert_eq!(
        i64::from_le_bytes(v[..8].try_into().unwrap()) as u64,
        TASKS * EACH
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bank_transfers_keep_the_total_and_audits_see_it_whole() {
    let c = cluster(3).await;
    let t = c.client.create_table("accounts", 6).await.unwrap().id;
    const ACCOUNTS: u64 = 20;
    const INITIAL: i64 = 100;
    open_accounts(&c.client, t, ACCOUNTS, INITIAL).await;
    let total = INITIAL * ACCOUNTS as i64;
    let transfers = Arc::new(AtomicU64::new(0));
    let movers: Vec<_> = (0..4u64)
        .map(|seed| {
            let client = c.client.clone();
            let transfers = transfers.clone();
            tokio::spawn(async move {
                let mut rng = insitu_testkit::rng(seed);
                for _ in 0..40 {
                    let from = format!("acct{}", rng.u64(0..ACCOUNTS));
                    let to = format!("acct{}", rng.u64(0..ACCOUNTS));
                    let amount = rng.i64(1..=30);
                    // Only what the account holds (an absent one holds nothing).
                    let moved = transfer(&client, t, (&from, &to), |a| {
                        (a >= amount).then_some((amount, false))
                    })
                    .await;
                    if moved {
                        transfers.fetch_add(1, Ordering::Relaxed);
                    }
                    // Leave the auditor windows in which nothing moves.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    let auditor = {
        let client = c.client.clone();
        tokio::spawn(async move {
            let mut audits = 0u32;
            let deadline = Instant::now() + Duration::from_secs(60);
            while audits < 10 && Instant::now() < deadline {
                let sum = client
                    .transaction(|mut tx| async move {
                        let mut sum = 0;
                        for a in 0..ACCOUNTS {
                            let balance = as_i64(tx.read(t, format!("acct{a}")).await?);
                            assert!(balance >= 0, "no account goes negative");
                            sum += balance;
                        }
                        Ok((tx, sum))
                    })
                    .await
                    .unwrap();
                assert_eq!(sum, total, "a committed audit sees one consistent state");
                audits += 1;
            }
            audits
        })
    };
    for m in movers {
        m.await.unwrap();
    }
    assert_eq!(
        auditor.await.unwrap(),
        10,
        "audits commit under concurrent transfers"
    );
    assert!(transfers.load(Ordering::Relaxed) > 20, "transfers happened");
    let mut sum = 0;
    for a in 0..ACCOUNTS {
        sum += as_i64(
            c.client
                .read(t, format!("acct{a}"))
                .await
                .unwrap()
                .map(|f| f.0),
        );
    }
    assert_eq!(sum, total);
}

#[tokio::test]
async fn a_stale_read_aborts_and_nothing_is_written() {
    let c = cluster(2).await;
    let t = c.client.create_table("stale", 4).await.unwrap().id;
    c.client.write(t, "x", "1").await.unwrap();
    let mut tx = c.client.begin();
    assert_eq!(tx.read(t, "x").await.unwrap().as_deref(), Some(&b"1"[..]));
    tx.write(t, "y", "written by the transaction");
    // Someone else changes what the transaction read.
    c.client.write(t, "x", "2").await.unwrap();
    let e = tx.commit().await.unwrap_err();
    assert_eq!(e.status(), Some(Status::Conflict), "{e}");
    assert!(e.to_string().contains("changed after it was read"), "{e}");
    assert!(
        c.client.read(t, "y").await.unwrap().is_none(),
        "nothing applied"
    );
    // A removal and a write commit together.
    let mut tx = c.client.begin();
    tx.remove(t, "x");
    tx.write(t, "y", "y");
    tx.commit().await.unwrap();
    assert!(c.client.read(t, "x").await.unwrap().is_none());
    assert!(c.client.read(t, "y").await.unwrap().is_some());
}

/// Two keys of `table` owned by different shards.
/// Wait until `key` reads `want` (None: absent), or fail after `within`.
async fn wait_for(client: &Client, table: u64, key: &str, want: Option<&str>, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = client.read(table, key).await.unwrap().map(|(v, _)| v);
        if got.as_deref() == want.map(str::as_bytes) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} is {got:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A tablet move waits for a prepared transaction's lock on the tablet
/// (the copy must carry what the decision writes), and then completes: the
/// destination serves the committed value.
#[tokio::test]
async fn a_tablet_move_waits_for_locks_then_carries_the_commit() {
    let c = cluster(1).await;
    let second = c.node.second_server("s2").await;
    let info = c.client.create_table("moving", 1).await.unwrap();
    let t = info.id;
    let owner = info.tablets[0].addr.clone();
    let servers = c.client.list_servers().await.unwrap();
    let dest = servers
        .iter()
        .find(|s| !s.shard_addrs.contains(&owner))
        .expect("a second server");
    let (dest_id, dest_shard) = (dest.id, dest.shard_addrs[0].clone());

    // Prepared as a secondary whose primary (the other server) has not
    // decided: the lock stays until a decision comes (or, after 2 s, the
    // primary is asked; this test decides well before).
    let s = RpcConn::connect(&owner).await.unwrap();
    let txn = 0xfeed;
    let r = s
        .call(&prepare(txn, Some("primary-key"), &[], t, "k", "committed"))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    let client = c.client.clone();
    let mover = tokio::spawn(async move { client.move_tablet("moving", 0, dest_id).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!mover.is_finished(), "the move did not wait for the lock");
    assert!(decide(&s, txn, true).await);
    mover
        .await
        .unwrap()
        .expect("the move completes once the lock is gone");
    let moved = c.client.open_table("moving").await.unwrap();
    assert_eq!(moved.tablets[0].addr, dest_shard);
    wait_for(&c.client, t, "k", Some("committed"), Duration::from_secs(5)).await;
    tokio::task::spawn_blocking(move || second.shutdown())
        .await
        .unwrap();
    drop(c.node);
}

/// A commit decision lives in the log of the primary's anchor tablet, and
/// moves with it: the primary commits (its client then vanishes before
/// telling the secondary), the anchor's tablet moves to the secondary's
/// server, and the secondary's resolution, routed by the anchor key to its
/// new owner, still learns the commit. (Before decisions were records, the
/// new owner knew nothing and the secondary aborted: half a commit.)
#[tokio::test]
async fn a_commit_decision_moves_with_its_anchor_tablet() {
    let c = cluster(1).await;
    let second = c.node.second_server("s2").await;
    let info = c.client.create_table("carried", 4).await.unwrap();
    let t = info.id;
    let ((k1, a1), (k2, a2)) = keys_on_two_shards(&info);
    let (s1, s2) = (
        RpcConn::connect(&a1).await.unwrap(),
        RpcConn::connect(&a2).await.unwrap(),
    );
    let txn = 0xdec1;
    for (conn, request) in [
        (&s1, prepare(txn, None, &[&k2], t, &k1, "v1")),
        (&s2, prepare(txn, Some(&k1), &[], t, &k2, "v2")),
    ] {
        let r = conn.call(&request).await.unwrap();
        assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    }
    // The primary alone hears the commit.
    assert!(decide(&s1, txn, true).await);
    wait_for(&c.client, t, &k1, Some("v1"), Duration::from_secs(1)).await;
    // Move the anchor's tablet onto the secondary's server.
    let h1 = key_hash(t, k1.as_bytes());
    let index = info
        .tablets
        .iter()
        .position(|tb| tb.start_hash <= h1 && h1 <= tb.end_hash)
        .unwrap();
    let servers = c.client.list_servers().await.unwrap();
    let dest = servers
        .iter()
        .find(|s| s.shard_addrs.contains(&a2))
        .expect("the secondary's server");
    c.client
        .move_tablet("carried", index as u32, dest.id)
        .await
        .expect("the anchor's tablet moves (the primary holds no lock)");
    // The secondary resolves after its 2 s timeout and learns the commit
    // from the anchor's new owner.
    wait_for(&c.client, t, &k2, Some("v2"), Duration::from_secs(15)).await;
    wait_for(&c.client, t, &k1, Some("v1"), Duration::from_secs(1)).await;
    tokio::task::spawn_blocking(move || second.shutdown())
        .await
        .unwrap();
    drop(c.node);
}

#[tokio::test]
async fn a_vanished_clients_transactions_are_resolved() {
    let c = cluster(2).await;
    let info = c.client.create_table("orphans", 4).await.unwrap();
    let t = info.id;
    let ((k1, s1), (k2, s2)) = participants(&info).await;

    // Prepared on both participants, then the client is gone: every vote was
    // yes, so the primary's resolution commits it.
    let txn = 0xabc1;
    let r = s1
        .call(&prepare(txn, None, &[&k2], t, &k1, "v1"))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    let r = s2
        .call(&prepare(txn, Some(&k1), &[], t, &k2, "v2"))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    // While prepared, a plain write of a locked key waits (Retry).
    let w = Request::Write {
        expires_at_ms: 0,
        table: t,
        key: blob(k1.as_bytes()),
        value: blob(b"plain"),
        rules: RejectRules::default(),
    };
    assert_eq!(s1.call(&w).await.unwrap().status, Status::Retry);
    let took = Instant::now();
    wait_for(&c.client, t, &k1, Some("v1"), Duration::from_secs(10)).await;
    wait_for(&c.client, t, &k2, Some("v2"), Duration::from_secs(10)).await;
    assert!(
        took.elapsed() < Duration::from_secs(8),
        "resolved after the 2 s timeout, not much later"
    );
    assert_eq!(
        s1.call(&w).await.unwrap().status,
        Status::Ok,
        "the lock is gone"
    );

    // Prepared only on the secondary (the primary never heard of it): the
    // primary answers aborted, the secondary drops it and its lock.
    let txn = 0xabc2;
    let r = s2
        .call(&prepare(txn, Some(&k1), &[], t, &k2, "never"))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    let w2 = Request::Write {
        expires_at_ms: 0,
        table: t,
        key: blob(k2.as_bytes()),
        value: blob(b"after"),
        rules: RejectRules::default(),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = s2.call(&w2).await.unwrap().status;
        if s == Status::Ok {
            break;
        }
        assert_eq!(s, Status::Retry);
        assert!(
            Instant::now() < deadline,
            "the orphan's lock was never released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for(&c.client, t, &k2, Some("after"), Duration::from_secs(1)).await;
    // Its prepare reaching the primary late is refused: it was aborted.
    let r = s1
        .call(&prepare(txn, None, &[&k2], t, &k1, "never"))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Conflict, "{}", r.error_message());
    // And the client's commit decision, if it came now, learns the abort.
    assert!(!decide(&s1, txn, true).await);
    drop(c.node);
}

#[tokio::test]
async fn bad_prepares_are_refused_without_locking() {
    let c = cluster(1).await;
    let info = c.client.create_table("bad", 2).await.unwrap();
    let a = c.node.shard(0);
    let s = RpcConn::connect(&a).await.unwrap();
    // The same key twice.
    let twice = Request::TxnPrepare {
        txn: 1,
        primary: None,
        others: vec![],
        items: vec![
            TxnItem {
                table: info.id,
                key: blob(b"k"),
                read_version: None,
                write: TxnWrite::Remove,
            },
            TxnItem {
                table: info.id,
                key: blob(b"k"),
                read_version: None,
                write: TxnWrite::Remove,
            },
        ],
        writes: true,
    };
    let r = s.call(&twice).await.unwrap();
    assert_eq!(r.status, Status::BadRequest);
    assert!(r.error_message().contains("twice"), "{}", r.error_message());
    // An unknown table.
    let r = s.call(&prepare(2, None, &[], 999, "k", "v")).await.unwrap();
    assert_eq!(r.status, Status::UnknownTablet, "{}", r.error_message());
    // An empty key.
    let r = s
        .call(&prepare(3, None, &[], info.id, "", "v"))
        .await
        .unwrap();
    assert_eq!(r.status, Status::EmptyKey, "{}", r.error_message());
    // A write in a prepare that says the transaction writes nothing (it
    // would be applied without a record).
    let mut quiet = prepare(4, None, &[], info.id, "k", "v");
    if let Request::TxnPrepare { writes, .. } = &mut quiet {
        *writes = false;
    }
    let r = s.call(&quiet).await.unwrap();
    assert_eq!(r.status, Status::BadRequest, "{}", r.error_message());
    assert!(
        r.error_message().contains("writes nothing"),
        "{}",
        r.error_message()
    );
    // A part whose decision would not fit one log segment (2 MiB): three
    // 1 MB values in one tablet.
    let one = c.client.create_table("big", 1).await.unwrap();
    let value = vec![7u8; 1_000_000];
    let keys = ["b0", "b1", "b2"];
    let big = Request::TxnPrepare {
        txn: 5,
        primary: Some(TxnAnchor {
            table: one.id,
            key: blob(b"elsewhere"),
        }),
        others: vec![],
        items: keys
            .iter()
            .map(|k| TxnItem {
                table: one.id,
                key: blob(k.as_bytes()),
                read_version: None,
                write: TxnWrite::Put(blob(&value)),
            })
            .collect(),
        writes: true,
    };
    let r = s.call(&big).await.unwrap();
    assert_eq!(r.status, Status::BadRequest, "{}", r.error_message());
    assert!(
        r.error_message().contains("one log segment"),
        "{}",
        r.error_message()
    );
    // Nothing stayed locked: plain writes go through.
    c.client.write(one.id, "b0", "v").await.unwrap();
    c.client.write(info.id, "k", "v").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recorded_histories_have_no_anomaly() {
    use insitu_txn::checker::{Outcome, Recorded, check};
    let c = cluster(2).await;
    let t = c.client.create_table("history", 4).await.unwrap().id;
    const KEYS: u64 = 6;
    // Every value is the tag of the attempt that wrote it: the checker
    // learns who wrote what each transaction read.
    let tasks: Vec<_> = (0..4u64)
        .map(|task| {
            let client = c.client.clone();
            tokio::spawn(async move {
                let mut rng = insitu_testkit::rng(task + 7);
                let mut history = Vec::new();
                for _ in 0..60 {
                    let mut keys: Vec<String> = (0..rng.usize(1..=3))
                        .map(|_| format!("k{}", rng.u64(0..KEYS)))
                        .collect();
                    keys.sort();
                    keys.dedup();
                    let writes: Vec<String> = keys.iter().filter(|_| rng.bool()).cloned().collect();
                    let tag = rng.u64(1..);
                    let mut tx = client.begin();
                    let values = tx.read_many(t, &keys).await.unwrap();
                    let reads = keys
                        .iter()
                        .zip(values)
                        .map(|(k, v)| {
                            (
                                k.clone().into_bytes(),
                                v.map(|b| u64::from_le_bytes(b[..8].try_into().unwrap())),
                            )
                        })
                        .collect();
                    for k in &writes {
                        tx.write(t, k, tag.to_le_bytes());
                    }
                    let outcome = match tx.commit().await {
                        Ok(()) => Outcome::Committed,
                        Err(e) if insitu_client::txn::is_retryable(&e) => Outcome::Aborted,
                        Err(e) => panic!("{e}"),
                    };
                    history.push(Recorded {
                        id: tag,
                        outcome,
                        reads,
                        writes: writes.into_iter().map(String::into_bytes).collect(),
                    });
                }
                history
            })
        })
        .collect();
    let mut history = Vec::new();
    for task in tasks {
        history.extend(task.await.unwrap());
    }
    let committed = history
        .iter()
        .filter(|h| h.outcome == Outcome::Committed)
        .count();
    assert!(
        committed > 100,
        "only {committed} of {} committed",
        history.len()
    );
    let verdict = check(&history);
    assert_eq!(verdict.serializability_anomalies(), 0, "{verdict:?}");
}
