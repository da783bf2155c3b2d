//! The Redis protocol port on real servers: keys served whichever server
//! holds them, MULTI/EXEC with WATCH losing no update, bad input closing
//! only its own connection, the connection limits, `AUTH` with the
//! cluster's token, and the same objects read through insitu's own client.
//! (Replies compared with Redis's: `resp_redis.rs`.)

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::resp::{Line, cluster, pipeline, read_reply, start_redis, with_resp};
use insitu_client::{Client, Selection};
use insitu_server::ServerConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_is_served_from_either_server_and_insitu_reads_the_same_objects() {
    let c = cluster(|_| {}).await;
    let (first, second) = (c.resp(), c.resp_of_second());
    let keys: Vec<String> = (0..200).map(|i| format!("key:{i}")).collect();
    let sets: Vec<String> = keys
        .iter()
        .map(|k| format!("SET {k} value-of-{k}"))
        .collect();
    let replies = tokio::task::spawn_blocking(move || pipeline(first, &sets))
        .await
        .unwrap();
    assert!(replies.iter().all(|r| r == "+OK\r\n"), "{replies:?}");
    // Read back through the other server: half the keys live on each.
    let gets: Vec<String> = keys.iter().map(|k| format!("GET {k}")).collect();
    let replies = tokio::task::spawn_blocking(move || pipeline(second, &gets))
        .await
        .unwrap();
    for (k, r) in keys.iter().zip(&replies) {
        let v = format!("value-of-{k}");
        assert_eq!(r, &format!("${}\r\n{v}\r\n", v.len()));
    }
    // MSET spanning shards and servers is all-or-nothing (a transaction).
    let replies = tokio::task::spawn_blocking(move || {
        pipeline(
            second,
            &[
                "MSET key:1 a key:2 b key:3 c",
                "MGET key:1 key:2 key:3",
                "DBSIZE",
                "RENAME key:1 moved",
                "GET moved",
                "EXISTS key:1",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(replies[0], "+OK\r\n");
    assert_eq!(replies[1], "*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n");
    assert_eq!(replies[2], ":200\r\n");
    assert_eq!(replies[3], "+OK\r\n");
    assert_eq!(replies[4], "$1\r\na\r\n");
    assert_eq!(replies[5], ":0\r\n");
    // The same objects, through insitu's own client and a pushdown count.
    let client = Client::connect(&c.node.addr()).await.unwrap();
    let table = client.table_id("redis").await.unwrap();
    assert_eq!(client.count(table, &Selection::all()).await.unwrap(), 200);
    let (v, _) = client.read(table, "key:7").await.unwrap().unwrap();
    assert_eq!(&v[..], b"value-of-key:7");
    // RESP commands count in the shards' request metrics (PING touches no
    // data, so only the RESP port's own counting can account for them).
    let shards: Vec<String> = c
        .node
        .server
        .shard_addrs
        .iter()
        .map(|a| a.to_string())
        .collect();
    let mut before = 0;
    for addr in &shards {
        before += client.shard_stats(addr).await.unwrap().requests;
    }
    let pings = vec!["PING"; 300];
    tokio::task::spawn_blocking(move || pipeline(first, &pings))
        .await
        .unwrap();
    let mut after = 0;
    for addr in &shards {
        after += client.shard_stats(addr).await.unwrap().requests;
    }
    assert!(
        after - before >= 300,
        "{} requests counted for 300 PINGs",
        after - before
    );
    assert!(c.node.server.shard_addrs.len() + c.second.shard_addrs.len() == 4);
}

/// Redis's optimistic locking (WATCH, read, MULTI, write, EXEC; again on a
/// null EXEC) from many connections on both servers loses no increment,
/// and a MULTI over keys of every shard applies all or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_multi_exec_loses_no_update() {
    let c = cluster(|_| {}).await;
    let addrs = [c.resp(), c.resp_of_second()];
    const THREADS: usize = 4;
    const EACH: usize = 15;
    let retries = tokio::task::spawn_blocking(move || {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut conn = Line::open(addrs[t % 2]);
                    let mut retries = 0;
                    for _ in 0..EACH {
                        loop {
                            assert_eq!(conn.call("WATCH counter"), "+OK\r\n");
                            let n = match conn.call("GET counter").as_str() {
                                "$-1\r\n" => 0,
                                r => r.split("\r\n").nth(1).unwrap().parse::<i64>().unwrap(),
                            };
                            assert_eq!(conn.call("MULTI"), "+OK\r\n");
                            assert_eq!(conn.call(&format!("SET counter {}", n + 1)), "+QUEUED\r\n");
                            assert_eq!(conn.call("INCR ops"), "+QUEUED\r\n");
                            match conn.call("EXEC").as_str() {
                                "*-1\r\n" => retries += 1,
                                r => {
                                    assert!(r.starts_with("*2\r\n+OK\r\n:"), "{r}");
                                    break;
                                }
                            }
                        }
                    }
                    retries
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum::<usize>()
    })
    .await
    .unwrap();
    let replies = tokio::task::spawn_blocking(move || {
        pipeline(
            addrs[0],
            &[
                "GET counter",
                "GET ops",
                "MULTI",
                "MSET x:1 a x:2 b x:3 c x:4 d x:5 e x:6 f",
                "INCR x:1",
                "EXEC",
                "MGET x:1 x:6",
            ],
        )
    })
    .await
    .unwrap();
    let total = (THREADS * EACH).to_string();
    assert_eq!(
        replies[0],
        format!("${}\r\n{total}\r\n", total.len()),
        "retries {retries}"
    );
    // Every EXEC that answered applied both its commands.
    assert_eq!(replies[1], replies[0]);
    assert_eq!(
        replies[5],
        "*2\r\n+OK\r\n-ERR value is not an integer or out of range\r\n"
    );
    assert_eq!(replies[6], "*2\r\n$1\r\na\r\n$1\r\nf\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_closes_only_its_connection() {
    let c = cluster(|_| {}).await;
    let addr = c.resp();
    tokio::task::spawn_blocking(move || {
        let bad: &[(&[u8], &str)] = &[
            (
                b"*1\r\n$99999999999\r\n",
                "-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n+OK\r\n",
                "-ERR Protocol error: expected '$', got '+'\r\n",
            ),
            (
                b"*99999999999\r\n",
                "-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"SET k \"open\r\n",
                "-ERR Protocol error: unbalanced quotes in request\r\n",
            ),
            // Commands before the bad one in the same read are answered
            // first, in order (they are cut from the buffer as a batch).
            (
                b"SET a 1\r\nGET a\r\n*1\r\n+OK\r\n",
                "+OK\r\n$1\r\n1\r\n-ERR Protocol error: expected '$', got '+'\r\n",
            ),
        ];
        for (bytes, want) in bad {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(bytes).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap(); // the server closes
            assert_eq!(String::from_utf8_lossy(&got), *want);
        }
        // A value over the limit (1 MiB by default) is refused the same way.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n", 2 << 20).as_bytes())
            .unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            "-ERR Protocol error: invalid bulk length\r\n"
        );
        // Inline commands (telnet) work, and the server kept serving.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"SET k \"a b\"\r\nGET k\r\n").unwrap();
        let mut buf = Vec::new();
        assert_eq!(read_reply(&mut s, &mut buf), b"+OK\r\n");
        assert_eq!(read_reply(&mut s, &mut buf), b"$3\r\na b\r\n");
    })
    .await
    .unwrap();
}

/// `MSETNX` with a key insitu refuses (over 64 KiB) writes none of its keys:
/// sent to each server, so one of them holds every key (one hash tag) and
/// takes its local path, the other forwards them as a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msetnx_with_a_bad_key_writes_none() {
    let c = cluster(|_| {}).await;
    for addr in [c.resp(), c.resp_of_second()] {
        let long = format!("{{t}}{}", "x".repeat(insitu_engine::MAX_KEY_BYTES));
        let lines = [format!("MSETNX {{t}}a 1 {long} 2"), "EXISTS {t}a".into()];
        let replies = tokio::task::spawn_blocking(move || pipeline(addr, &lines))
            .await
            .unwrap();
        assert!(replies[0].starts_with("-ERR"), "{}", replies[0]);
        assert_eq!(replies[1], ":0\r\n", "{addr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_takes_the_cluster_token() {
    let client_token = insitu_auth::Token::parse(b"client-secret-0123456789", "test").unwrap();
    let member_token = insitu_auth::Token::parse(b"member-secret-0123456789", "test").unwrap();
    let gate = insitu_auth::Gate::new(client_token, member_token);
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = common::coordinator_config(&dir.path().join("c"));
    config.gate = gate.clone();
    let coordinator = insitu_coordinator::start(config, listener).await.unwrap();
    let mut config = ServerConfig::new(coordinator.addr().to_string(), dir.path().join("s"));
    with_resp(&mut config);
    config.gate = gate;
    let server = insitu_server::start(config).await.unwrap();
    let node = common::Node {
        coordinator,
        server,
        dir,
    };
    let addr = node.server.resp_addr.unwrap();
    const SCRIPT: &[&str] = &[
        "GET k",
        "PING",
        "AUTH wrong",
        "AUTH default client-secret-0123456789",
        "PING",
        "SET k v",
        "GET k",
    ];
    let replies = tokio::task::spawn_blocking(move || pipeline(addr, SCRIPT))
        .await
        .unwrap();
    assert_eq!(replies[0], "-NOAUTH Authentication required.\r\n");
    assert_eq!(replies[1], "-NOAUTH Authentication required.\r\n");
    assert_eq!(
        replies[2],
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(replies[3], "+OK\r\n");
    assert_eq!(replies[4], "+PONG\r\n");
    assert_eq!(replies[5], "+OK\r\n");
    assert_eq!(replies[6], "$1\r\nv\r\n");
    // The same replies as Redis with that password.
    let Some((_redis, redis_addr)) = start_redis(&["--requirepass", "client-secret-0123456789"])
    else {
        return;
    };
    let theirs = tokio::task::spawn_blocking(move || pipeline(redis_addr, SCRIPT))
        .await
        .unwrap();
    assert_eq!(replies, theirs);
}

/// The RESP port applies the shard's connection limits: a command not
/// completed within the stall timeout, and a connection idle past the idle
/// timeout, are closed; others keep being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_idle_resp_connections_are_closed() {
    let c = cluster(|c| {
        c.limits.stall_timeout = Duration::from_millis(300);
        c.limits.idle_timeout = Duration::from_millis(600);
    })
    .await;
    let addr = c.resp();
    tokio::task::spawn_blocking(move || {
        let mut stalled = TcpStream::connect(addr).unwrap();
        stalled
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stalled.write_all(b"*2\r\n$3\r\nGET\r\n$5\r\nab").unwrap();
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let t = std::time::Instant::now();
        let mut got = Vec::new();
        stalled.read_to_end(&mut got).unwrap();
        assert!(got.is_empty(), "{got:?}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "stall not enforced: {:?}",
            t.elapsed()
        );
        idle.read_to_end(&mut got).unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(500),
            "idle closed too early"
        );
        assert_eq!(pipeline(addr, &["PING"]), vec!["+PONG\r\n"]);
    })
    .await
    .unwrap();
}

/// A command's size is learned one argument at a time; the bytes buffered
/// for it are charged to the shard's frame budget in full as it grows, not
/// at the size of its first big argument (which let one connection buffer
/// up to a 16 MiB command against a charge of one argument's size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_command_is_charged_to_the_frame_budget_in_full() {
    const VALUE: usize = 512 * 1024;
    let c = cluster(|c| c.limits.stall_timeout = Duration::from_secs(30)).await;
    let addr = c.resp();
    let mut cmd = b"*7\r\n$4\r\nMSET\r\n".to_vec();
    for k in ["k1", "k2", "k3"] {
        cmd.extend_from_slice(format!("$2\r\n{k}\r\n${VALUE}\r\n").as_bytes());
        cmd.extend(std::iter::repeat_n(b'v', VALUE));
        cmd.extend_from_slice(b"\r\n");
    }
    // All but the last value's final bytes: the command stays incomplete.
    let sent = cmd.len() - 1024;
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&cmd[..sent]).unwrap();
    let buffered = || -> usize {
        c.node
            .server
            .buffered_frame_bytes()
            .iter()
            .map(|b| b.0)
            .sum()
    };
    let charged = insitu_testkit::poll_until(2000, || buffered() >= sent).await;
    assert!(
        charged,
        "{} bytes charged for a command of which {sent} bytes are buffered",
        buffered()
    );
    // A growing command's buffer at most doubles what it holds (`Inbox::growing`).
    assert!(buffered() <= 2 * cmd.len(), "{} charged", buffered());
    // Completed, it runs, and the charge is given back.
    s.write_all(&cmd[sent..]).unwrap();
    let mut got = Vec::new();
    assert_eq!(read_reply(&mut s, &mut got), b"+OK\r\n");
    assert!(insitu_testkit::poll_until(2000, || buffered() == 0).await);
}

/// An MSET of `pairs` keys `{prefix}:{i}` with 20-byte values, as one command.
fn mset_command(prefix: &str, pairs: usize) -> Vec<u8> {
    let mut cmd = format!("*{}\r\n$4\r\nMSET\r\n", 2 * pairs + 1).into_bytes();
    for i in 0..pairs {
        let (k, v) = (format!("{prefix}:{i}"), format!("value-{i:>14}"));
        cmd.extend_from_slice(format!("${}\r\n{k}\r\n${}\r\n{v}\r\n", k.len(), v.len()).as_bytes());
    }
    cmd
}

/// Big MSETs over the four shards of two servers: one of 30,000 pairs (a
/// 1.2 MB command of 60,001 arguments) is served, its buffer grown by
/// doubling (made exactly each new argument's end, it was copied whole per
/// argument and per byte of each argument's header: quadratic); one of
/// 60,000 pairs, over the per-shard limit of a transaction, is refused
/// with the limit named and writes nothing. Then one DEL removes them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_msets_are_served_or_refused_whole() {
    let c = cluster(|_| {}).await;
    let addr = c.resp();
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut got = Vec::new();
        s.write_all(&mset_command("big", 30_000)).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&read_reply(&mut s, &mut got)),
            "+OK\r\n"
        );
        s.write_all(&mset_command("huge", 60_000)).unwrap();
        let refused = String::from_utf8_lossy(&read_reply(&mut s, &mut got)).into_owned();
        assert!(
            refused.starts_with("-ERR")
                && refused.contains("more than the limit of 10000 per shard"),
            "{refused}"
        );
        assert_eq!(
            pipeline(
                addr,
                &[
                    "GET big:0",
                    "GET big:29999",
                    "GET huge:0",
                    "GET huge:59999",
                    "DBSIZE"
                ]
            ),
            vec![
                format!("$20\r\nvalue-{:>14}\r\n", 0),
                format!("$20\r\nvalue-{:>14}\r\n", 29_999),
                "$-1\r\n".to_string(),
                "$-1\r\n".to_string(),
                ":30000\r\n".to_string(),
            ]
        );
        // One DEL of every key, each named twice, and one never written:
        // removed in one round trip per shard, each counted once.
        let mut del = format!("*{}\r\n$3\r\nDEL\r\n", 2 * 30_000 + 2).into_bytes();
        for i in (0..30_000).chain(0..30_000) {
            let k = format!("big:{i}");
            del.extend_from_slice(format!("${}\r\n{k}\r\n", k.len()).as_bytes());
        }
        del.extend_from_slice(b"$5\r\nnever\r\n");
        s.write_all(&del).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&read_reply(&mut s, &mut got)),
            ":30000\r\n"
        );
        assert_eq!(
            pipeline(addr, &["GET big:7", "DBSIZE"]),
            vec!["$-1\r\n", ":0\r\n"]
        );
    })
    .await
    .unwrap();
}

/// `insitu table drop redis` while Redis clients are connected: the next
/// command may fail (its table is gone), the one after finds a new table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_table_is_created_again() {
    let c = cluster(|_| {}).await;
    let addr = c.resp();
    let mut conn = tokio::task::spawn_blocking(move || {
        let mut conn = Line::open(addr);
        assert_eq!(conn.call("SET a 1"), "+OK\r\n");
        conn
    })
    .await
    .unwrap();
    let client = Client::connect(&c.node.addr()).await.unwrap();
    client.drop_table("redis").await.unwrap();
    let replies = tokio::task::spawn_blocking(move || {
        let first = conn.call("SET a 2");
        assert!(first == "+OK\r\n" || first.starts_with("-ERR"), "{first}");
        vec![
            conn.call("SET a 3"),
            conn.call("GET a"),
            conn.call("DBSIZE"),
        ]
    })
    .await
    .unwrap();
    assert_eq!(replies, vec!["+OK\r\n", "$1\r\n3\r\n", ":1\r\n"]);
}

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
