//! Redis Cluster's discovery commands, so cluster-aware clients (redis-py's
//! `RedisCluster`, `redis-cli -c`, `redis-benchmark --cluster`, the `redis`
//! crate's cluster client) work unchanged: `CLUSTER SLOTS | SHARDS | NODES
//! | INFO | MYID | KEYSLOT | COUNTKEYSINSLOT`, and `READONLY`, `READWRITE`,
//! `ASKING`.
//!
//! What they describe: one node, the address this connection reached,
//! serving all 16,384 slots. That is true of insitu's RESP port: every
//! server's port serves every key (a key another server owns is forwarded
//! in one hop), and the servers of one `insitu up` share one address. So a
//! cluster client sends everything to the address it was given and never
//! needs `MOVED` or `ASK`; none is ever sent. Why not a layout with one
//! node per server: insitu places keys by a 64-bit hash, not by Redis's
//! slots, so no slot range maps to one server; describing one would send
//! clients to the wrong node for most keys.
//!
//! `CLUSTER KEYSLOT` computes Redis's slot (CRC16-XMODEM of the key, or of
//! its `{hash tag}`, mod 16,384) exactly, so clients that check that the
//! keys of a multi-key command share a slot get Redis's answer.

use bytes::Bytes;

use crate::exec::{Ctx, wrong_args};

/// Slots of a Redis cluster.
pub const SLOTS: u16 = 16384;

/// Redis's slot of `key`: CRC16-XMODEM (polynomial 0x1021, initial 0) of
/// the key, or of the text between its first `{` and the next `}` when
/// that is not empty, mod 16,384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-XMODEM, bit by bit (keys are short; this is not a hot path).
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The node a connection describes: (ip, port) it reached and the id.
fn node<S>(ctx: &Ctx<'_, S>) -> (String, u16, String) {
    let (ip, port) = ctx
        .session
        .local
        .clone()
        .unwrap_or_else(|| (String::new(), ctx.settings.port));
    (ip, port, ctx.settings.node_id.clone())
}

/// `CLUSTER ...`: `a` is the arguments after the command name (at least one).
pub(crate) fn cluster<S>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) {
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
        return wrong_args(&mut ctx.out, &name);
    }
    let (ip, port, id) = node(ctx);
    match sub.as_slice() {
        b"slots" => {
            ctx.out.array(1);
            ctx.out.array(3);
            ctx.out.int(0);
            ctx.out.int(i64::from(SLOTS) - 1);
            ctx.out.array(4);
            ctx.out.bulk(ip.as_bytes());
            ctx.out.int(i64::from(port));
            ctx.out.bulk(id.as_bytes());
            ctx.out.map(0); // no extra networking metadata
        }
        b"shards" => {
            ctx.out.array(1);
            ctx.out.map(2);
            ctx.out.bulk(b"slots");
            ctx.out.array(2);
            ctx.out.int(0);
            ctx.out.int(i64::from(SLOTS) - 1);
            ctx.out.bulk(b"nodes");
            ctx.out.array(1);
            ctx.out.map(7);
            ctx.out.bulk(b"id");
            ctx.out.bulk(id.as_bytes());
            ctx.out.bulk(b"port");
            ctx.out.int(i64::from(port));
            ctx.out.bulk(b"ip");
            ctx.out.bulk(ip.as_bytes());
            ctx.out.bulk(b"endpoint");
            ctx.out.bulk(ip.as_bytes());
            ctx.out.bulk(b"role");
            ctx.out.bulk(b"master");
            ctx.out.bulk(b"replication-offset");
            ctx.out.int(0);
            ctx.out.bulk(b"health");
            ctx.out.bulk(b"online");
        }
        b"nodes" => {
            // The cluster bus port is Redis's convention (port + 10000);
            // nobody connects to it here.
            let bus = u32::from(port) + 10000;
            let line = format!(
                "{id} {ip}:{port}@{bus} myself,master - 0 0 0 connected 0-{}\n",
                SLOTS - 1
            );
            ctx.out.bulk(line.as_bytes());
        }
        b"info" => {
            let text = "cluster_state:ok\r\ncluster_slots_assigned:16384\r\n\
                 cluster_slots_ok:16384\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\n\
                 cluster_known_nodes:1\r\ncluster_size:1\r\ncluster_current_epoch:0\r\n\
                 cluster_my_epoch:0\r\ncluster_stats_messages_sent:0\r\n\
                 cluster_stats_messages_received:0\r\n\
                 total_cluster_links_buffer_limit_exceeded:0\r\n";
            ctx.out.bulk(text.as_bytes());
        }
        b"myid" => ctx.out.bulk(id.as_bytes()),
        b"keyslot" => ctx.out.int(i64::from(key_slot(&a[1]))),
        // Keys are not grouped by slot here: counting one slot's keys
        // would walk the whole database. Said, not answered with a guess.
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_s() {
        // Each slot as `CLUSTER KEYSLOT` of Redis 7.0.15 answered.
        for (key, slot) in [
            ("foo", 12182),
            ("{user1}.a", 8106),
            ("123456789", 12739),
            ("", 0),
            ("{}", 15257),
            ("foo{}{bar}", 8363),
            ("foo{{bar}}zap", 4015),
            ("foo{bar}{zap}", 5061),
            ("key:000000000042", 7803),
            ("{a", 10276),
        ] {
            assert_eq!(key_slot(key.as_bytes()), slot, "{key:?}");
        }
        assert_eq!(key_slot(b"{user1}.a"), key_slot(b"{user1}.b"));
    }
}
