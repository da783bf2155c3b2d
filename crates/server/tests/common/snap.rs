//! Client-side steps of the snapshot tests: a one-key transaction, a read at
//! a snapshot timestamp, and replies as text so assertions read plainly.

use std::time::Duration;

use insitu_client::{Client, ClientError, Status, TableInfo};
use insitu_server::ServerHandle;

/// Two servers (the node's and a second one), a patient client, and table
/// `name` of two tablets, one on each server: the set-up of the move tests.
pub async fn two_servers_one_table(name: &str) -> (super::Node, ServerHandle, Client, TableInfo) {
    let node = super::start(|_| {}).await;
    let second = node.second_server("s2").await;
    // Moves and snapshot retries fit well within this.
    let client = super::txn::client_with_op_timeout(&node, Duration::from_secs(30)).await;
    let info = client.create_table(name, 2).await.unwrap();
    assert_ne!(
        info.tablets[0].addr, info.tablets[1].addr,
        "one tablet on each server"
    );
    (node, second, client, info)
}

/// The id of the server whose shard listens on `addr`.
pub async fn server_of(client: &Client, addr: &str) -> u64 {
    let servers = client.list_servers().await.unwrap();
    servers
        .iter()
        .find(|s| s.shard_addrs.iter().any(|a| a == addr))
        .expect("a server holds it")
        .id
}

/// A read's outcome as text (values are UTF-8 in these tests), or its status.
pub fn text(found: Result<Option<bytes::Bytes>, ClientError>) -> Result<Option<String>, Status> {
    found
        .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
        .map_err(|e| e.status().unwrap_or(Status::Internal))
}

/// `key` of table `t` as of snapshot timestamp `ts`.
pub async fn read_at(
    client: &Client,
    ts: u64,
    t: u64,
    key: &str,
) -> Result<Option<String>, Status> {
    let snap = client.snapshot_at(ts).await.unwrap();
    text(snap.read(t, key).await)
}

/// Write `key` = `value` in table `t` in a transaction of its own.
pub async fn commit(client: &Client, t: u64, key: &str, value: &str) {
    let (key, value) = (key.to_string(), value.to_string());
    client
        .transaction(|mut tx| {
            let (key, value) = (key.clone(), value.clone());
            async move {
                tx.write(t, key, value);
                Ok((tx, ()))
            }
        })
        .await
        .unwrap();
}

/// Read `keys` of table `t` in one read-only transaction: a snapshot read on
/// the shards holding them, from which on they keep replaced versions.
pub async fn keep_versions(client: &Client, t: u64, keys: &[&str]) {
    let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    client
        .read_only(|snap| {
            let keys = keys.clone();
            async move {
                for k in &keys {
                    snap.read(t, k).await?;
                }
                Ok(())
            }
        })
        .await
        .unwrap();
}
