//! Cluster mode of the Redis port: the slot layout `CLUSTER SLOTS | SHARDS
//! | NODES` describe, and where a cluster client is sent (`MOVED`).
//!
//! Database 0's table is placed by hash slot (`insitu_keyhash::SLOT_PLACED`:
//! the slot is the top of every key hash, and the tablets hold whole
//! slots), so each tablet is a slot range and its server a Redis node:
//! id `format!("{server_id:040x}")`, the host of its shards' address and
//! its RESP port (asked once per server, `RespShard::resp_port_of`). A
//! table made before slot placement, or a server without a RESP port in
//! the map, has no layout: the connection then describes one node serving
//! every slot (`insitu_resp::cluster`), which forwarding keeps true.

use std::collections::BTreeMap;

use insitu_keyhash::{key_hash, slot_of_hash, slot_placed};
use insitu_resp::{ClusterNode, StoreError};

use super::store::{ShardStore, err};

/// A server's node id: 40 hex digits, as Redis's, the same on every shard
/// and every server (so any node's `CLUSTER NODES` agrees with its `MYID`).
fn node_id(server_id: u64) -> String {
    format!("{server_id:040x}")
}

/// The host of `host:port` (an IPv6 address without its brackets, as
/// Redis writes node addresses).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The servers serving database 0 by slot, or None without a slot layout.
pub(super) async fn layout(store: &ShardStore<'_>) -> Result<Option<Vec<ClusterNode>>, StoreError> {
    let Some(table) = store.table(0, true).await? else {
        return Ok(None);
    };
    if !slot_placed(table) {
        return Ok(None);
    }
    let client = store.client().await?;
    let map = client
        .open_table(&store.resp.table_name(0))
        .await
        .map_err(store.lost(0))?;
    if map.id != table {
        // Dropped and made again meanwhile: the next command finds it.
        store.resp.forget(0);
        return Err(err(format!(
            "database 0's table changed (id {table} is now {})",
            map.id
        )));
    }
    // server id -> (a shard's address, slot ranges in order, merged).
    let mut servers: BTreeMap<u64, (String, Vec<(u16, u16)>)> = BTreeMap::new();
    for t in &map.tablets {
        let (first, last) = (slot_of_hash(t.start_hash), slot_of_hash(t.end_hash));
        let entry = servers
            .entry(t.server_id)
            .or_insert_with(|| (t.addr.clone(), Vec::new()));
        match entry.1.last_mut() {
            Some(prev) if prev.1 + 1 == first => prev.1 = last,
            _ => entry.1.push((first, last)),
        }
    }
    let me = store.state.repl.server_id();
    let mut nodes = Vec::with_capacity(servers.len());
    for (server_id, (addr, slots)) in servers {
        if server_id == 0 {
            return Ok(None); // an orphaned tablet (being recovered): no owner to name
        }
        let port = store
            .resp
            .resp_port_of(server_id, &addr)
            .await
            .map_err(err)?;
        if port == 0 {
            return Ok(None); // a server without a Redis port cannot be named
        }
        nodes.push(ClusterNode {
            id: node_id(server_id),
            ip: host_of(&addr).to_string(),
            port,
            myself: Some(server_id) == me,
            slots,
        });
    }
    Ok(Some(nodes))
}

/// The node serving `key` of `db` when it is another server (`MOVED`);
/// None when this server serves it (maybe on another of its shards, which
/// it forwards to), or when the database has no slot layout.
pub(super) async fn redirect(
    store: &ShardStore<'_>,
    db: u32,
    key: &[u8],
) -> Result<Option<String>, StoreError> {
    // Only database 0's table is described to cluster clients (Redis
    // Cluster has no other), and only a slot-placed one.
    let Some(table) = store
        .resp
        .cached_table(db)
        .filter(|&t| db == 0 && slot_placed(t))
    else {
        return Ok(None);
    };
    // Served by this shard: no request needed (the common case for a
    // cluster client, which sends each key to its server).
    if store
        .state
        .engine
        .borrow()
        .tablet_for(table, key_hash(table, key))
        .is_some()
    {
        return Ok(None);
    }
    let client = store.client().await?;
    let tablet = client.tablet_of(table, key).await.map_err(store.lost(db))?;
    if tablet.server_id == 0 || Some(tablet.server_id) == store.state.repl.server_id() {
        return Ok(None);
    }
    let port = store
        .resp
        .resp_port_of(tablet.server_id, &tablet.addr)
        .await
        .map_err(err)?;
    if port == 0 {
        return Ok(None);
    }
    Ok(Some(format!("{}:{port}", host_of(&tablet.addr))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_ids() {
        assert_eq!(host_of("127.0.0.1:7000"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7000"), "::1");
        assert_eq!(host_of("db.example:7000"), "db.example");
        assert_eq!(node_id(3).len(), 40);
        assert_eq!(node_id(3), format!("{}3", "0".repeat(39)));
    }
}
