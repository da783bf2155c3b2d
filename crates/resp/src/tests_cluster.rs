//! Cluster mode over a slot layout (`MemStore::set_layout`): what the
//! `CLUSTER` commands describe, and `MOVED` for keys of another node on a
//! connection that learned the layout (only there).

use super::Conn;
use crate::ClusterNode;

/// Two nodes: this one (6380) serves slots 0-8191 and 12000, the other
/// (6381) 8192-11999 and 12001-16383.
fn two_nodes() -> Conn {
    let c = Conn::new();
    c.store.set_layout(Some(vec![
        ClusterNode {
            id: "a".repeat(40),
            ip: "127.0.0.1".into(),
            port: 6380,
            myself: true,
            slots: vec![(0, 8191), (12000, 12000)],
        },
        ClusterNode {
            id: "b".repeat(40),
            ip: "127.0.0.1".into(),
            port: 6381,
            myself: false,
            slots: vec![(8192, 11999), (12001, 16383)],
        },
    ]));
    c
}

#[test]
fn the_layout_is_described_in_slot_order() {
    let mut c = two_nodes();
    let (a, b) = ("a".repeat(40), "b".repeat(40));
    let entry = |first: u16, last: u16, port: u16, id: &str| {
        format!(
            "*3\r\n:{first}\r\n:{last}\r\n*4\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$40\r\n{id}\r\n*0\r\n"
        )
    };
    assert_eq!(
        c.run("CLUSTER SLOTS"),
        format!(
            "*4\r\n{}{}{}{}",
            entry(0, 8191, 6380, &a),
            entry(8192, 11999, 6381, &b),
            entry(12000, 12000, 6380, &a),
            entry(12001, 16383, 6381, &b)
        )
    );
    let nodes = c.run("CLUSTER NODES");
    assert!(
        nodes.contains(&format!(
            "{a} 127.0.0.1:6380@16380 myself,master - 0 0 0 connected 0-8191 12000\n"
        )),
        "{nodes}"
    );
    assert!(
        nodes.contains(&format!(
            "{b} 127.0.0.1:6381@16381 master - 0 0 0 connected 8192-11999 12001-16383\n"
        )),
        "{nodes}"
    );
    assert_eq!(c.run("CLUSTER MYID"), format!("$40\r\n{a}\r\n"));
    let info = c.run("CLUSTER INFO");
    assert!(info.contains("cluster_state:ok\r\n"), "{info}");
    assert!(info.contains("cluster_known_nodes:2\r\n"), "{info}");
    assert!(info.contains("cluster_slots_assigned:16384\r\n"), "{info}");
    let shards = c.run("CLUSTER SHARDS");
    assert!(
        shards.starts_with("*2\r\n*4\r\n$5\r\nslots\r\n*4\r\n:0\r\n:8191\r\n:12000\r\n:12000\r\n"),
        "{shards}"
    );
}

#[test]
fn a_cluster_client_is_moved_and_a_plain_one_is_served() {
    let mut c = two_nodes();
    // "foo" is in slot 12182 (the other node), "bar" in 5061 (this one).
    assert_eq!(c.run("SET foo 1"), "+OK\r\n", "a plain client: served");
    assert_eq!(c.run("GET foo"), "$1\r\n1\r\n");
    c.run("CLUSTER SLOTS");
    assert_eq!(c.run("GET foo"), "-MOVED 12182 127.0.0.1:6381\r\n");
    assert_eq!(c.run("SET foo 2"), "-MOVED 12182 127.0.0.1:6381\r\n");
    assert_eq!(c.run("GET bar"), "$-1\r\n", "this node's slot: served");
    // A hash tag moves the key with its tag.
    assert_eq!(c.run("GET {bar}foo"), "$-1\r\n");
    assert_eq!(c.run("MSET {bar}foo 3 bar 4"), "+OK\r\n");
    assert_eq!(c.run("MGET bar {bar}foo"), "*2\r\n$1\r\n4\r\n$1\r\n3\r\n");
    // Keys in different slots: refused as Redis Cluster refuses them,
    // before any MOVED, whatever node the first key is on.
    let cross = "-CROSSSLOT Keys in request don't hash to the same slot\r\n";
    assert_eq!(c.run("MGET bar foo"), cross);
    assert_eq!(c.run("MGET foo bar"), cross);
    assert_eq!(c.run("MSET bar 1 foo 2"), cross);
    assert_eq!(c.run("DEL bar foo"), cross);
    assert_eq!(c.run("GET bar"), "$1\r\n4\r\n", "nothing written");
    // Commands without keys are never moved.
    assert_eq!(c.run("DBSIZE"), ":3\r\n");
    assert_eq!(c.run("PING"), "+PONG\r\n");
    // READONLY / ASKING mark a cluster client too.
    let mut d = two_nodes();
    assert_eq!(d.run("GET foo"), "$-1\r\n");
    d.run("READONLY");
    assert_eq!(d.run("GET foo"), "-MOVED 12182 127.0.0.1:6381\r\n");
    // A plain client's multi-key command runs whatever its slots.
    let mut e = two_nodes();
    assert_eq!(e.run("MSET bar 1 foo 2"), "+OK\r\n");
    assert_eq!(e.run("MGET foo bar"), "*2\r\n$1\r\n2\r\n$1\r\n1\r\n");
}

#[test]
fn the_slots_of_every_key_position_are_compared() {
    use crate::command::COMMANDS;
    let keys = |name: &str| COMMANDS.iter().find(|c| c.name == name).unwrap().keys;
    let args = |s: &str| -> Vec<bytes::Bytes> {
        s.split(' ')
            .map(|w| bytes::Bytes::copy_from_slice(w.as_bytes()))
            .collect()
    };
    // MSET's values are not keys: only the odd positions count.
    assert!(crate::exec::one_slot(
        keys("mset"),
        &args("MSET {a}1 foo {a}2 bar")
    ));
    assert!(!crate::exec::one_slot(
        keys("mset"),
        &args("MSET {a}1 x foo y")
    ));
    assert!(!crate::exec::one_slot(
        keys("rename"),
        &args("RENAME foo bar")
    ));
    assert!(crate::exec::one_slot(
        keys("rename"),
        &args("RENAME {t}a {t}b")
    ));
    assert!(crate::exec::one_slot(keys("get"), &args("GET foo")));
    assert!(crate::exec::one_slot(keys("ping"), &args("PING")));
}

#[test]
fn inside_exec_nothing_is_moved() {
    let mut c = two_nodes();
    c.run("CLUSTER NODES");
    assert_eq!(c.run("MULTI"), "+OK\r\n");
    assert_eq!(c.run("SET bar 1"), "+QUEUED\r\n");
    assert_eq!(c.run("EXEC"), "*1\r\n+OK\r\n");
}
