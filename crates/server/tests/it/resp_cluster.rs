//! Redis Cluster clients on the RESP port of two real servers: the slot
//! layout both describe (`CLUSTER SLOTS`, `MYID`, `NODES`, `INFO`), `MOVED`
//! for a key sent elsewhere, `CROSSSLOT`, and plain clients served anywhere.

use crate::common;

use common::resp::{Line, cluster};

/// `CLUSTER SLOTS` parsed: (first, last, port, node id), in slot order.
fn slot_ranges(reply: &str) -> Vec<(u16, u16, u16, String)> {
    let mut lines = reply.split("\r\n");
    let count: usize = lines.next().unwrap()[1..].parse().unwrap();
    (0..count)
        .map(|_| {
            let mut next = || lines.next().unwrap().to_string();
            assert_eq!(next(), "*3");
            let first = next()[1..].parse().unwrap();
            let last = next()[1..].parse().unwrap();
            assert_eq!(next(), "*4");
            assert_eq!(next(), "$9");
            assert_eq!(next(), "127.0.0.1");
            let port = next()[1..].parse().unwrap();
            assert_eq!(next(), "$40");
            let id = next();
            assert_eq!(next(), "*0");
            (first, last, port, id)
        })
        .collect()
}

/// The Redis table is placed by hash slot, so cluster clients learn which
/// server serves which slots: both servers describe the same layout (every
/// slot once, each server under its own port and id); a cluster client
/// that follows it is never redirected, one that sends a key elsewhere is
/// answered `MOVED` to the right server, and a plain client is served by
/// any port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_clients_learn_which_server_serves_each_slot() {
    let c = cluster(|_| {}).await;
    let (a, b) = (c.resp(), c.resp_of_second());
    tokio::task::spawn_blocking(move || {
        let layout = slot_ranges(&Line::open(a).call("CLUSTER SLOTS"));
        assert_eq!(slot_ranges(&Line::open(b).call("CLUSTER SLOTS")), layout);
        // Every slot once, in order; both servers serve some.
        assert_eq!(layout[0].0, 0);
        assert_eq!(layout.last().unwrap().1, 16383);
        for w in layout.windows(2) {
            assert_eq!(w[0].1 + 1, w[1].0, "{layout:?}");
        }
        for addr in [a, b] {
            let mine: Vec<&(u16, u16, u16, String)> =
                layout.iter().filter(|r| r.2 == addr.port()).collect();
            // One run of slots each: the tablets (several per shard) go
            // to the servers in blocks.
            assert_eq!(
                mine.len(),
                1,
                "{} serves one run of slots: {layout:?}",
                addr.port()
            );
            // Its id is the one its ranges carry, from every shard (a
            // connection may land on any of them).
            let id = format!("$40\r\n{}\r\n", mine[0].3);
            for _ in 0..8 {
                assert_eq!(Line::open(addr).call("CLUSTER MYID"), id);
            }
            let nodes = Line::open(addr).call("CLUSTER NODES");
            let myself = format!(
                "{} 127.0.0.1:{}@{} myself,master",
                mine[0].3,
                addr.port(),
                u32::from(addr.port()) + 10000
            );
            assert!(nodes.contains(&myself), "{nodes}");
            assert_eq!(
                nodes.matches(" master ").count() + nodes.matches(",master ").count(),
                2,
                "{nodes}"
            );
            let info = Line::open(addr).call("CLUSTER INFO");
            assert!(
                info.contains("cluster_state:ok\r\n") && info.contains("cluster_known_nodes:2\r\n"),
                "{info}"
            );
        }
        let owner = |slot: u16| {
            let r = layout.iter().find(|r| (r.0..=r.1).contains(&slot)).unwrap();
            std::net::SocketAddr::from(([127, 0, 0, 1], r.2))
        };
        let slot_of = |key: &str| insitu_keyhash::key_slot(key.as_bytes());
        // A cluster client sends each key to its server: never redirected.
        let mut cluster_conns: Vec<Line> = [a, b].iter().map(|&x| Line::open(x)).collect();
        for conn in &mut cluster_conns {
            conn.call("CLUSTER SLOTS");
        }
        let (mut to_a, mut to_b) = (0, 0);
        for i in 0..60 {
            let key = format!("slot{i}");
            let home = owner(slot_of(&key));
            let conn = if home == a {
                to_a += 1;
                &mut cluster_conns[0]
            } else {
                to_b += 1;
                &mut cluster_conns[1]
            };
            assert_eq!(
                conn.call(&format!("SET {key} {i}")),
                "+OK\r\n",
                "{key} at {home}"
            );
        }
        assert!(to_a > 0 && to_b > 0, "keys on both servers: {to_a} {to_b}");
        // Sent to the other server: MOVED, with the slot and the owner.
        for i in 0..60 {
            let key = format!("slot{i}");
            let slot = slot_of(&key);
            let home = owner(slot);
            let conn = if home == a {
                &mut cluster_conns[1]
            } else {
                &mut cluster_conns[0]
            };
            assert_eq!(
                conn.call(&format!("GET {key}")),
                format!("-MOVED {slot} 127.0.0.1:{}\r\n", home.port())
            );
        }
        // Keys of different slots in one command: refused to a cluster
        // client as Redis Cluster refuses them (a plain one is served).
        assert_ne!(slot_of("{a}1"), slot_of("{b}1"));
        assert_eq!(
            cluster_conns[0].call("MGET {a}1 {b}1"),
            "-CROSSSLOT Keys in request don't hash to the same slot\r\n"
        );
        assert_eq!(Line::open(a).call("MGET {a}1 {b}1"), "*2\r\n$-1\r\n$-1\r\n");
        // A plain client (it never asked for the layout) is served anywhere.
        for addr in [a, b] {
            let mut plain = Line::open(addr);
            for i in 0..60 {
                let want = format!("${}\r\n{i}\r\n", i.to_string().len());
                assert_eq!(plain.call(&format!("GET slot{i}")), want);
            }
        }
        assert_eq!(Line::open(a).call("CLUSTER KEYSLOT {user1}.a"), ":8106\r\n");
        assert_eq!(Line::open(a).call("READONLY"), "+OK\r\n");
    })
    .await
    .unwrap();
}
