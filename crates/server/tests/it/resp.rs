//! The Redis protocol port on real servers: keys served whichever server
//! holds them, MULTI/EXEC with WATCH losing no update, `AUTH` with the
//! cluster's token, and the same objects read through insitu's own client.
//! (Replies compared with Redis's: `resp_redis.rs`; bad input and the
//! connection limits: `resp_limits.rs`; cluster clients: `resp_cluster.rs`.)

use crate::common;

use common::resp::{Line, cluster, pipeline, start_redis, with_resp};
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
