//! A transaction prepared on two shards commits whole even when plain
//! writes fill both shards' memory between its prepare and its decision:
//! the prepare holds the log room its decision needs (`Engine::
//! promise_head`). Before, the commit's writes were refused for room and
//! lost for their keys while the transaction counted as committed.

use crate::common;

use common::txn::{decide, fill, keys_on_two_shards, participants, prepare, small_budget};

use insitu_client::{Client, RpcConn, Status};

#[tokio::test]
async fn a_commit_applies_on_memory_filled_after_its_prepare() {
    common::trace_to_test_output();
    let (node, client) = small_budget().await;
    let info = client.create_table("full", 4).await.unwrap();
    let t = info.id;
    let ((k1, s1), (k2, s2)) = participants(&info).await;
    // Values larger than the crumbs the filling leaves in a head.
    let (v1, v2) = ("1".repeat(3000), "2".repeat(3000));
    // Most of the memory first (as long as it takes), then room for the
    // prepare by removing some of it; the rest is filled after the prepare,
    // well within the 2 s after which a resolution would decide it.
    let bulk = fill(&client, t, "bulk", &[4000]).await;
    assert!(
        bulk.len() > 100,
        "only {} keys filled the memory",
        bulk.len()
    );
    for key in &bulk[..20] {
        client.remove(t, key).await.unwrap();
    }
    let txn = 0xf011;
    for (conn, request) in [
        (&s1, prepare(txn, None, &[&k2], t, &k1, &v1)),
        (&s2, prepare(txn, Some(&k1), &[], t, &k2, &v2)),
    ] {
        let r = conn.call(&request).await.unwrap();
        assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    }
    let rest = fill(&client, t, "rest", &[4000, 1000]).await;
    assert!(
        rest.len() >= 20,
        "only {} keys after the prepare",
        rest.len()
    );
    // What the commit's writes need does not fit any more.
    let late = client.write(t, "late00000000", &v1).await.unwrap_err();
    assert_eq!(late.status(), Some(Status::OutOfMemory), "{late}");
    // The primary decides, then the other participant hears it.
    assert!(decide(&s1, txn, true).await);
    assert!(decide(&s2, txn, true).await);
    for (key, want) in [(&k1, &v1), (&k2, &v2)] {
        let got = client.read(t, key).await.unwrap().map(|(v, _)| v);
        assert_eq!(
            got.as_deref(),
            Some(want.as_bytes()),
            "{key}: the committed write"
        );
    }
    // Nothing else was lost.
    for key in bulk[20..].iter().chain(&rest) {
        assert!(client.read(t, key).await.unwrap().is_some(), "{key}");
    }
    drop(node);
}

/// A transaction writing most of a log segment in each of two tablets still
/// commits: its prepared records (as large as its writes) go in first, and
/// the room its decision needs is promised in a fresh head after them.
#[tokio::test]
async fn a_transaction_of_most_of_a_segment_commits() {
    let node = large_values().await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let info = client.create_table("large", 4).await.unwrap();
    let t = info.id;
    let ((k1, _), (k2, _)) = keys_on_two_shards(&info);
    // More than half a segment: its record and its promise cannot share a head.
    let value = vec![b'x'; 150 * 1024];
    let keys = [k1.clone(), k2.clone()];
    client
        .transaction(|mut tx| {
            let (keys, value) = (keys.clone(), value.clone());
            async move {
                for key in keys {
                    tx.write(t, key, value.clone());
                }
                Ok((tx, ()))
            }
        })
        .await
        .expect("a large transaction commits");
    for key in [&k1, &k2] {
        let got = client.read(t, key).await.unwrap().map(|(v, _)| v);
        assert_eq!(got.as_deref(), Some(&value[..]), "{key}");
    }
    drop(node);
}

/// Write `value` under `key` on `conn` unconditionally, as a client's plain
/// write does but without its retries: the status the shard answered.
/// Two shards with 256 KiB segments that take values up to 160 KiB: one
/// large part fills most of a segment's head.
async fn large_values() -> common::Node {
    common::start(|c| {
        c.shards = 2;
        c.engine.segment_bytes = 256 * 1024;
        c.engine.max_value_bytes = 160 * 1024;
    })
    .await
}

async fn raw_write(conn: &RpcConn, table: u64, key: &str, value: &[u8]) -> (Status, String) {
    let reply = common::raw_write(conn, table, key, value).await;
    (reply.status, reply.error_message())
}

/// A plain write that does not fit the tablet's head beside the room
/// promised to a prepared transaction's decision is refused with `Retry`
/// (the engine's `HeadPromised`), never allowed to break the promise; a
/// write that fits beside it is taken meanwhile, and once the transaction
/// is decided the refused write succeeds as sent.
#[tokio::test]
async fn a_write_with_no_room_beside_a_promise_is_retried_until_the_decision() {
    // No small budget needed: the refusal is for head room, not memory.
    let node = large_values().await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let info = client.create_table("promised", 4).await.unwrap();
    let t = info.id;
    // Two participants: a lone one would commit at its prepare.
    let ((k1, s1), (k2, s2)) = participants(&info).await;
    // Other keys of k1's tablet (the promise is the tablet's): a write to
    // k1 itself would wait on its lock, a `Retry` of another cause.
    let tablet = common::tablet_of(&info, &k1);
    let (plain, small) = (
        common::key_in(&info, tablet, "plain"),
        common::key_in(&info, tablet, "small"),
    );
    // More than half a segment: only a lone promise may hold that much, and
    // `big` (under half a segment) does not fit a head beside it.
    let v1 = "1".repeat(150 * 1024);
    let big = vec![b'b'; 120 * 1024];
    let txn = 0xf0f1;
    for (conn, request) in [
        (&s1, prepare(txn, None, &[&k2], t, &k1, &v1)),
        (&s2, prepare(txn, Some(&k1), &[], t, &k2, "2")),
    ] {
        let r = conn.call(&request).await.unwrap();
        assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    }
    // Both writes come well within the 2 s after which the resolver would
    // decide the transaction itself.
    let (status, why) = raw_write(&s1, t, &plain, &big).await;
    assert_eq!(status, Status::Retry, "{plain} beside the promise: {why}");
    // The tablet takes what fits beside the promise: the refusal is for
    // room, not for a lock or a frozen tablet.
    let (status, why) = raw_write(&s1, t, &small, b"fits").await;
    assert_eq!(status, Status::Ok, "{small} beside the promise: {why}");
    // The primary decides, then the other participant hears it.
    assert!(decide(&s1, txn, true).await);
    assert!(decide(&s2, txn, true).await);
    let (status, why) = raw_write(&s1, t, &plain, &big).await;
    assert_eq!(status, Status::Ok, "{plain} after the decision: {why}");
    for (key, want) in [(&k1, v1.as_bytes()), (&plain, &big[..]), (&small, b"fits")] {
        let got = client.read(t, key).await.unwrap().map(|(v, _)| v);
        assert_eq!(got.as_deref(), Some(want), "{key}");
    }
    drop(node);
}
