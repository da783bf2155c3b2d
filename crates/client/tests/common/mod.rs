//! What the client's tests against fake servers share: numbered keys and
//! values, a 2-shard cluster with a table and a client, short time budgets,
//! reject rules.

#![allow(dead_code)]

use std::time::Duration;

use insitu_client::{Client, ClientConfig, RejectRules};

use crate::fake::FakeCluster;

pub fn key(i: usize) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

/// The number `key` was made from.
pub fn key_index(k: &[u8]) -> usize {
    std::str::from_utf8(&k[4..]).unwrap().parse().unwrap()
}

pub fn value(i: usize) -> Vec<u8> {
    format!("value of {i}").into_bytes()
}

/// Write keys 0..n with their `value`s in one multi-write.
pub async fn write_numbered(client: &Client, table: u64, n: usize) {
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..n).map(|i| (key(i), value(i))).collect();
    client.multi_write(table, &items).await.unwrap();
}

/// Multi-read results of keys 0..: each found, with its `value`.
pub fn assert_numbered<E: std::fmt::Debug, V: AsRef<[u8]>, X>(got: &[Result<Option<(V, X)>, E>]) {
    for (i, r) in got.iter().enumerate() {
        assert_eq!(
            r.as_ref().unwrap().as_ref().unwrap().0.as_ref(),
            &value(i)[..],
            "key {i}"
        );
    }
}

/// A 2-shard cluster with one 2-tablet table, and a client that has opened it.
pub async fn setup() -> (FakeCluster, Client, u64) {
    setup_with(ClientConfig::default()).await
}

pub async fn setup_with(config: ClientConfig) -> (FakeCluster, Client, u64) {
    let cluster = FakeCluster::start(2).await;
    let client = Client::connect_with(&cluster.coord_addr, config)
        .await
        .unwrap();
    let info = client.create_table("t", 2).await.unwrap();
    assert_eq!(info.tablets.len(), 2);
    assert_ne!(
        info.tablets[0].addr, info.tablets[1].addr,
        "one tablet per shard"
    );
    (cluster, client, info.id)
}

pub fn short(timeout_ms: u64) -> ClientConfig {
    ClientConfig {
        op_timeout: Duration::from_millis(timeout_ms),
        ..ClientConfig::default()
    }
}

/// Rules that refuse a change when the object exists.
pub fn if_exists() -> RejectRules {
    RejectRules {
        exists: true,
        ..Default::default()
    }
}

/// Rules that refuse a change when the object does not exist.
pub fn if_missing() -> RejectRules {
    RejectRules {
        doesnt_exist: true,
        ..Default::default()
    }
}

/// Rules that refuse a change unless the object is at `version`.
pub fn unless_version(version: u64) -> RejectRules {
    RejectRules {
        version_ne_given: true,
        given_version: version,
        ..Default::default()
    }
}
