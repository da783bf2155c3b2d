//! A prepared transaction whose other side lives in a table that no longer
//! exists (dropped after the prepare, or never made: a broken or hostile
//! client named it) must not keep its keys locked for ever. The resolution
//! asks the coordinator for the anchor's owner; "no such table" is final,
//! so the participant aborts instead of asking again every sweep.
//!
//! Found by `mutated_requests`: mutated prepares locked keys of its attack
//! table for good, and every later move of those tablets waited 10 s for
//! the locks and gave up.

use crate::common;

use common::txn::{participants, retrying_client};

use std::time::{Duration, Instant};

use insitu_client::{RpcConn, Status};
use insitu_protocol::txn::{TxnAnchor, TxnItem, TxnWrite};
use insitu_protocol::{RejectRules, Request, blob};

/// A table id the coordinator never handed out.
const NEVER_MADE: u64 = 9_999_999;

/// A prepare of one put of `key` in `table`, with the primary's anchor
/// (None: this is the primary) and the other participants' anchors.
fn prepare<'a>(
    txn: u64,
    primary: Option<(u64, &'a str)>,
    others: &[(u64, &'a str)],
    table: u64,
    key: &'a str,
) -> Request<'a> {
    let anchor = |(table, key): (u64, &'a str)| TxnAnchor {
        table,
        key: blob(key.as_bytes()),
    };
    Request::TxnPrepare {
        txn,
        primary: primary.map(anchor),
        others: others.iter().copied().map(anchor).collect(),
        items: vec![TxnItem {
            table,
            key: blob(key.as_bytes()),
            read_version: None,
            write: TxnWrite::Put(blob(b"prepared")),
        }],
        writes: true,
    }
}

/// Wait until a plain write of `key` is taken (its lock is gone); fail
/// after `within`. Returns how long it took.
async fn until_unlocked(shard: &RpcConn, table: u64, key: &str, within: Duration) -> Duration {
    let started = Instant::now();
    let write = Request::Write {
        table,
        key: blob(key.as_bytes()),
        value: blob(b"plain"),
        rules: RejectRules::default(),
        expires_at_ms: 0,
    };
    loop {
        let reply = shard.call(&write).await.unwrap();
        if reply.status == Status::Ok {
            return started.elapsed();
        }
        assert_eq!(reply.status, Status::Retry, "{}", reply.error_message());
        assert!(
            started.elapsed() < within,
            "{key} is still locked after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_whose_other_side_is_in_a_gone_table_is_aborted() {
    let (node, client) = retrying_client(2).await;
    let info = client.create_table("kept", 4).await.unwrap();
    let gone = client.create_table("gone", 1).await.unwrap();
    let t = info.id;
    let ((k1, s1), (k2, s2)) = participants(&info).await;

    // A secondary whose primary's anchor is in a table never made.
    let r = s1
        .call(&prepare(0x90_01, Some((NEVER_MADE, "p")), &[], t, &k1))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    // A primary one of whose other participants is in a table never made.
    let r = s2
        .call(&prepare(0x90_02, None, &[(NEVER_MADE, "o")], t, &k2))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    // Both locks go once the prepares are overdue (2 s) and resolved.
    let took = until_unlocked(&s1, t, &k1, Duration::from_secs(15)).await;
    eprintln!("the secondary's lock went after {took:?}");
    let took = until_unlocked(&s2, t, &k2, Duration::from_secs(15)).await;
    eprintln!("the primary's lock went after {took:?}");

    // A secondary whose primary's table is dropped after the prepare (the
    // primary never prepared: nothing can have been decided).
    let r = s1
        .call(&prepare(0x90_03, Some((gone.id, "p")), &[], t, &k1))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    client.drop_table("gone").await.unwrap();
    until_unlocked(&s1, t, &k1, Duration::from_secs(15)).await;

    // The transactions are aborted: what the plain writes left stands.
    let (v, _) = client.read(t, &k1).await.unwrap().unwrap();
    assert_eq!(&v[..], b"plain");
    let (v, _) = client.read(t, &k2).await.unwrap().unwrap();
    assert_eq!(&v[..], b"plain");
    drop(node);
}
