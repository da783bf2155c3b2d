//! Raw transaction requests for the tests that play a client's part by
//! hand: a prepare of one put, and a decision sent to a participant.

use insitu_client::{RpcConn, TableInfo};
use insitu_keyhash::key_hash;
use insitu_protocol::txn::{TxnAnchor, TxnItem, TxnWrite};
use insitu_protocol::{Request, Response, blob};

/// A prepare of one put; `primary` and `others` are anchor keys of `table`.
pub fn prepare<'a>(
    txn: u64,
    primary: Option<&'a str>,
    others: &[&'a str],
    table: u64,
    key: &'a str,
    value: &'a str,
) -> Request<'a> {
    let anchor = |k: &'a str| TxnAnchor {
        table,
        key: blob(k.as_bytes()),
    };
    Request::TxnPrepare {
        txn,
        primary: primary.map(anchor),
        others: others.iter().map(|k| anchor(k)).collect(),
        items: vec![TxnItem {
            table,
            key: blob(key.as_bytes()),
            read_version: None,
            write: TxnWrite::Put(blob(value.as_bytes())),
        }],
        writes: true,
    }
}

/// Send decision `commit` of `txn` on `conn`; the decision that stands there.
pub async fn decide(conn: &RpcConn, txn: u64, commit: bool) -> bool {
    // No snapshot reads these commits: no timestamp.
    decide_at(conn, txn, commit, 0).await
}

/// `decide` with the commit's timestamp (what snapshots order it by).
pub async fn decide_at(conn: &RpcConn, txn: u64, commit: bool, commit_ts: u64) -> bool {
    let r = conn
        .call(&Request::TxnDecide {
            txn,
            commit,
            commit_ts,
        })
        .await
        .unwrap();
    match r.decode().unwrap() {
        Response::TxnDecided { committed, .. } => committed,
        other => panic!("{other:?} to TxnDecide"),
    }
}

/// Two keys of `info`'s table whose tablets are on different shards, each
/// with its shard's address.
pub fn keys_on_two_shards(info: &TableInfo) -> ((String, String), (String, String)) {
    let addr_of = |key: &str| {
        let h = key_hash(info.id, key.as_bytes());
        let tablet = info
            .tablets
            .iter()
            .find(|t| t.start_hash <= h && h <= t.end_hash)
            .unwrap();
        tablet.addr.clone()
    };
    let first = "k0".to_string();
    let first_addr = addr_of(&first);
    let second = (1..1000)
        .map(|i| format!("k{i}"))
        .find(|k| addr_of(k) != first_addr)
        .expect("keys spread over both shards");
    let second_addr = addr_of(&second);
    ((first, first_addr), (second, second_addr))
}
