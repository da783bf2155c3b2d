//! Redis Cluster's discovery commands, so cluster-aware clients (redis-py's
//! `RedisCluster`, `redis-cli -c`, `redis-benchmark --cluster`, the `redis`
//! crate's cluster client) work unchanged: `CLUSTER SLOTS | SHARDS | NODES
//! | INFO | MYID | KEYSLOT | COUNTKEYSINSLOT`, and `READONLY`, `READWRITE`,
//! `ASKING` (`exec.rs`).
//!
//! What they describe is the store's slot layout (`Store::layout`): on a
//! server, the servers holding the tablets of database 0's table, each with
//! the slots of its tablets, when that table places keys by hash slot. A
//! cluster client then sends each key to its server, and a key sent to
//! another node is answered `MOVED` (`exec.rs`, on connections that asked
//! for the layout only; a plain client has it forwarded). Without a slot
//! layout (a table made before slot placement, or `MemStore`) they describe
//! one node, the address this connection reached, serving all 16,384
//! slots: also true, since every node forwards a key it does not serve.
//!
//! `CLUSTER KEYSLOT` computes Redis's slot (CRC16-XMODEM of the key, or of
//! its `{hash tag}`, mod 16,384) exactly, so clients that check that the
//! keys of a multi-key command share a slot get Redis's answer.

use bytes::Bytes;
pub use insitu_keyhash::{SLOTS, key_slot};

use crate::exec::{Ctx, wrong_args};
use crate::store::{ClusterNode, Store, StoreError};

/// The node a connection describes without a layout: every slot, at the
/// (ip, port) it reached, with the server's own id.
fn only_node<S>(ctx: &Ctx<'_, S>) -> ClusterNode {
    let (ip, port) = ctx
        .session
        .local
        .clone()
        .unwrap_or_else(|| (String::new(), ctx.settings.port));
    ClusterNode {
        id: ctx.settings.node_id.clone(),
        ip,
        port,
        myself: true,
        slots: vec![(0, SLOTS - 1)],
    }
}

/// `CLUSTER ...`: `a` is the arguments after the command name (at least one).
pub(crate) async fn cluster<S: Store>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) -> Result<(), StoreError> {
    let sub = a[0].to_ascii_lowercase();
    let arity_ok = match sub.as_slice() {
        b"keyslot" | b"countkeysinslot" => a.len() == 2,
        _ => a.len() == 1,
    };
    let known = matches!(
        sub.as_slice(),
        b"slots" | b"shards" | b"nodes" | b"info" | b"myid" | b"keyslot" | b"countkeysinslot"
    );
    if known && !arity_ok {
        let name = format!("cluster|{}", String::from_utf8_lossy(&sub));
        wrong_args(&mut ctx.out, &name);
        return Ok(());
    }
    let describes = matches!(
        sub.as_slice(),
        b"slots" | b"shards" | b"nodes" | b"info" | b"myid"
    );
    let nodes = if describes {
        match ctx.store.layout().await? {
            Some(nodes) => nodes,
            None => vec![only_node(ctx)],
        }
    } else {
        Vec::new()
    };
    if matches!(sub.as_slice(), b"slots" | b"shards" | b"nodes") {
        ctx.session.cluster = true;
    }
    match sub.as_slice() {
        b"slots" => slots(ctx, &nodes),
        b"shards" => shards(ctx, &nodes),
        b"nodes" => {
            let mut text = String::new();
            for n in &nodes {
                text.push_str(&node_line(n));
            }
            ctx.out.bulk(text.as_bytes());
        }
        b"info" => {
            let assigned: u32 = nodes
                .iter()
                .flat_map(|n| &n.slots)
                .map(|&(first, last)| u32::from(last - first) + 1)
                .sum();
            let serving = nodes.iter().filter(|n| !n.slots.is_empty()).count();
            let state = if assigned == u32::from(SLOTS) {
                "ok"
            } else {
                "fail"
            };
            let text = format!(
                "cluster_state:{state}\r\ncluster_slots_assigned:{assigned}\r\n\
                 cluster_slots_ok:{assigned}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\n\
                 cluster_known_nodes:{}\r\ncluster_size:{serving}\r\ncluster_current_epoch:0\r\n\
                 cluster_my_epoch:0\r\ncluster_stats_messages_sent:0\r\n\
                 cluster_stats_messages_received:0\r\n\
                 total_cluster_links_buffer_limit_exceeded:0\r\n",
                nodes.len()
            );
            ctx.out.bulk(text.as_bytes());
        }
        b"myid" => {
            let id = nodes
                .iter()
                .find(|n| n.myself)
                .map_or(&ctx.settings.node_id, |n| &n.id)
                .clone();
            ctx.out.bulk(id.as_bytes());
        }
        b"keyslot" => ctx.out.int(i64::from(key_slot(&a[1]))),
        // Keys are not grouped by slot in a node's memory: counting one
        // slot's keys would walk the whole database. Said, not guessed.
        b"countkeysinslot" => ctx.out.error(
            "ERR CLUSTER COUNTKEYSINSLOT is not supported: insitu does not group keys by slot",
        ),
        _ => {
            let name = String::from_utf8_lossy(&a[0]);
            ctx.out.error(&format!(
                "ERR unknown subcommand '{name}'. Try CLUSTER HELP."
            ));
        }
    }
    Ok(())
}

/// `CLUSTER SLOTS`: one entry per slot range, `[first, last, [ip, port,
/// id, {}]]`, in slot order.
fn slots<S>(ctx: &mut Ctx<'_, S>, nodes: &[ClusterNode]) {
    let mut ranges: Vec<(u16, u16, &ClusterNode)> = nodes
        .iter()
        .flat_map(|n| n.slots.iter().map(move |&(f, l)| (f, l, n)))
        .collect();
    ranges.sort_by_key(|r| r.0);
    ctx.out.array(ranges.len());
    for (first, last, n) in ranges {
        ctx.out.array(3);
        ctx.out.int(i64::from(first));
        ctx.out.int(i64::from(last));
        ctx.out.array(4);
        ctx.out.bulk(n.ip.as_bytes());
        ctx.out.int(i64::from(n.port));
        ctx.out.bulk(n.id.as_bytes());
        ctx.out.map(0); // no extra networking metadata
    }
}

/// `CLUSTER SHARDS`: one shard per node serving slots (no replicas).
fn shards<S>(ctx: &mut Ctx<'_, S>, nodes: &[ClusterNode]) {
    let serving: Vec<&ClusterNode> = nodes.iter().filter(|n| !n.slots.is_empty()).collect();
    ctx.out.array(serving.len());
    for n in serving {
        ctx.out.map(2);
        ctx.out.bulk(b"slots");
        ctx.out.array(2 * n.slots.len());
        for &(first, last) in &n.slots {
            ctx.out.int(i64::from(first));
            ctx.out.int(i64::from(last));
        }
        ctx.out.bulk(b"nodes");
        ctx.out.array(1);
        ctx.out.map(7);
        ctx.out.bulk(b"id");
        ctx.out.bulk(n.id.as_bytes());
        ctx.out.bulk(b"port");
        ctx.out.int(i64::from(n.port));
        ctx.out.bulk(b"ip");
        ctx.out.bulk(n.ip.as_bytes());
        ctx.out.bulk(b"endpoint");
        ctx.out.bulk(n.ip.as_bytes());
        ctx.out.bulk(b"role");
        ctx.out.bulk(b"master");
        ctx.out.bulk(b"replication-offset");
        ctx.out.int(0);
        ctx.out.bulk(b"health");
        ctx.out.bulk(b"online");
    }
}

/// One line of `CLUSTER NODES`. The cluster bus port is Redis's convention
/// (port + 10000); nobody connects to it here.
fn node_line(n: &ClusterNode) -> String {
    let bus = u32::from(n.port) + 10000;
    let flags = if n.myself { "myself,master" } else { "master" };
    let mut line = format!(
        "{} {}:{}@{bus} {flags} - 0 0 0 connected",
        n.id, n.ip, n.port
    );
    for &(first, last) in &n.slots {
        if first == last {
            line.push_str(&format!(" {first}"));
        } else {
            line.push_str(&format!(" {first}-{last}"));
        }
    }
    line.push('\n');
    line
}
