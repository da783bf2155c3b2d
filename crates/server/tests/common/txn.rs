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
            direct: false,
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

/// A node whose memory a test can fill in about a second: two shards of 12
/// log segments of 128 KiB each, values up to 4 KiB; and a client whose
/// calls wait up to 10 s (filling takes many refused writes).
pub async fn small_budget() -> (super::Node, insitu_client::Client) {
    let node = super::start(|c| {
        c.shards = 2;
        c.engine.segment_bytes = 128 * 1024;
        // 12 segments per shard.
        c.engine.memory_budget_bytes = 2 * 12 * 128 * 1024;
        c.engine.max_value_bytes = 4096;
    })
    .await;
    let client = client_with_op_timeout(&node, std::time::Duration::from_secs(10)).await;
    (node, client)
}

/// Write new keys (`{prefix}{n:08}`, all of one length) of each size in
/// turn until that size is refused for memory 30 times in a row: with
/// falling sizes, no head keeps room for another key and the budget is
/// spent (every key is live, so cleaning frees nothing). Returns the keys
/// written.
pub async fn fill(
    client: &insitu_client::Client,
    table: u64,
    prefix: &str,
    sizes: &[usize],
) -> Vec<String> {
    let mut written = Vec::new();
    let mut n = 0u64;
    for &size in sizes {
        let value = vec![b'f'; size];
        let mut refused = 0;
        while refused < 30 {
            n += 1;
            let key = format!("{prefix}{n:08}");
            match client.write(table, &key, &value).await {
                Ok(_) => {
                    written.push(key);
                    refused = 0;
                }
                Err(e) if e.status() == Some(insitu_client::Status::OutOfMemory) => refused += 1,
                Err(e) => panic!("filling: {e}"),
            }
        }
    }
    written
}

/// Two keys of `info`'s table on different shards (`keys_on_two_shards`),
/// each with a connection to its shard: the two participants of a
/// transaction a test drives by hand.
pub async fn participants(info: &TableInfo) -> ((String, RpcConn), (String, RpcConn)) {
    let ((k1, a1), (k2, a2)) = keys_on_two_shards(info);
    let s1 = RpcConn::connect(&a1).await.unwrap();
    let s2 = RpcConn::connect(&a2).await.unwrap();
    ((k1, s1), (k2, s2))
}

/// A node of `shards` shards and a client whose contended transactions
/// retry for up to 60 s.
pub async fn retrying_client(shards: usize) -> (super::Node, insitu_client::Client) {
    let node = super::start(|c| c.shards = shards).await;
    // Contended transactions retry until this passes.
    let client = client_with_op_timeout(&node, std::time::Duration::from_secs(60)).await;
    (node, client)
}

/// A client of `node` whose calls wait up to `op_timeout`.
pub async fn client_with_op_timeout(
    node: &super::Node,
    op_timeout: std::time::Duration,
) -> insitu_client::Client {
    let config = insitu_client::ClientConfig {
        op_timeout,
        ..insitu_client::ClientConfig::default()
    };
    insitu_client::Client::connect_with(&node.addr(), config)
        .await
        .unwrap()
}

/// The little-endian i64 at the start of a value; 0 for no value.
pub fn as_i64(v: Option<bytes::Bytes>) -> i64 {
    v.map_or(0, |b| i64::from_le_bytes(b[..8].try_into().unwrap()))
}

/// Accounts `acct0` .. `acct{n-1}` of `table`, each holding `initial`.
pub async fn open_accounts(client: &insitu_client::Client, table: u64, n: u64, initial: i64) {
    for a in 0..n {
        client
            .write(table, format!("acct{a}"), initial.to_le_bytes())
            .await
            .unwrap();
    }
}

/// One transfer in a transaction, as the bank tests make them: nothing moves
/// when `from` is `to` or absent, or when `take` refuses `from`'s balance;
/// else `take(balance)` gives the amount and whether `from` is then removed
/// rather than debited, and `to` (absent: 0) is credited. Whether it moved.
pub async fn transfer(
    client: &insitu_client::Client,
    t: u64,
    (from, to): (&str, &str),
    take: impl Fn(i64) -> Option<(i64, bool)> + Sync,
) -> bool {
    let take = &take;
    client
        .transaction(|mut tx| async move {
            let a = tx.read(t, from).await?;
            if from == to || a.is_none() {
                return Ok((tx, false));
            }
            let a = as_i64(a);
            let Some((amount, remove)) = take(a) else {
                return Ok((tx, false));
            };
            let b = as_i64(tx.read(t, to).await?);
            if remove {
                tx.remove(t, from);
            } else {
                tx.write(t, from, (a - amount).to_le_bytes());
            }
            tx.write(t, to, (b + amount).to_le_bytes());
            Ok((tx, true))
        })
        .await
        .unwrap()
}

/// The side records (`TabletStat::records`: transactions' votes and kept
/// decisions) the shard at `addr` holds in `table`'s tablets.
pub async fn side_records(client: &insitu_client::Client, addr: &str, table: u64) -> u64 {
    super::tablet_sum(client, addr, table, |t| t.records).await
}
