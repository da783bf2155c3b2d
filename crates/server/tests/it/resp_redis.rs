//! The Redis protocol port against Redis itself: replies compared byte for
//! byte with a real `redis-server` started beside it (when one is
//! installed; CI installs it), and the `redis` crate as a client.

use crate::common;

use common::resp::{cluster, pipeline, start_redis};

/// Commands whose replies must equal Redis 7's, byte for byte. (Values
/// chosen so that Redis's long-double `INCRBYFLOAT` and insitu's f64 print
/// alike.)
const SCRIPT: &[&str] = &[
    "PING",
    "PING hello",
    "ECHO \"a b\"",
    "GET missing",
    "SET k v",
    "GET k",
    "SET k w NX",
    "SET k w XX",
    "GET k",
    "SET k x XX GET",
    "SET fresh 1 NX GET",
    "SET k v NX XX",
    "SET k v EX 0",
    "SET k v EX abc",
    "SET k v BOGUS",
    "SETNX k y",
    "SETNX k2 y",
    "GETSET k z",
    "GETSET newkey z",
    "GETDEL k",
    "GETDEL k",
    "MSET a 1 b 2 c 3",
    "MSET a 1 b",
    "MGET a b nope c",
    "MSETNX a 9 d 4",
    "MSETNX d 4 e 5",
    "MGET d e",
    "INCR n",
    "INCRBY n 41",
    "DECR n",
    "DECRBY n 50",
    "INCRBY n x",
    "INCRBY n +1",
    "INCRBY n 01",
    "SET big 9223372036854775807",
    "INCR big",
    "DECRBY n -9223372036854775808",
    "SET s abc",
    "INCR s",
    "SET f 10.50",
    "INCRBYFLOAT f 0.1",
    "INCRBYFLOAT f -5",
    "SET e 5.0e3",
    "INCRBYFLOAT e 2.0e2",
    "INCRBYFLOAT e x",
    "INCRBYFLOAT s 1",
    "INCRBYFLOAT nf 3",
    "APPEND s def",
    "APPEND s2 x",
    "STRLEN s",
    "STRLEN nope",
    "GETRANGE s 0 2",
    "GETRANGE s -3 -1",
    "GETRANGE s -1 -3",
    "GETRANGE s 2 100",
    "GETRANGE nope 0 1",
    "GETRANGE s a 1",
    "SETRANGE s 1 XY",
    "GET s",
    "SETRANGE pad 3 x",
    "GET pad",
    "SETRANGE empty 3 \"\"",
    "SETRANGE s -1 x",
    "EXISTS a a nope b",
    "DEL a nope",
    "UNLINK b c",
    "EXISTS a b c",
    "TYPE d",
    "TYPE nope",
    "RENAME d d2",
    "GET d2",
    "RENAME d d2",
    "RENAME d2 d2",
    "RENAME nope nope",
    "TTL d2",
    "PTTL nope",
    "PERSIST d2",
    "PERSIST nope",
    // Expiry: only replies that do not depend on the milliseconds between
    // commands (a TTL of 100 s reads 100 for the first half second).
    "SET t v EX 100",
    "TTL t",
    "EXPIRE t 200 GT",
    "TTL t",
    "EXPIRE t 50 GT",
    "EXPIRE t 50 LT",
    "TTL t",
    "EXPIRE t 10 NX",
    "EXPIRE t 10 XX",
    "PERSIST t",
    "TTL t",
    "EXPIRE t 10 NX",
    "EXPIRE t 10 NX XX",
    "EXPIRE t 10 GT LT",
    "EXPIRE t x",
    "EXPIRE t 10 BOGUS",
    "EXPIRE nope 10",
    "EXPIREAT t 4000000000",
    "EXPIRETIME t",
    "PEXPIRETIME t",
    "RENAME t t2",
    "EXPIRETIME t2",
    "SET t2 w KEEPTTL",
    "EXPIRETIME t2",
    "SET t2 w",
    "EXPIRETIME t2",
    "EXPIRETIME nope",
    "SET num 5 EX 100",
    "INCR num",
    "APPEND num 0",
    "TTL num",
    "GETSET num 1",
    "TTL num",
    "SETEX sx 100 v",
    "TTL sx",
    "SETEX sx 0 v",
    "PSETEX px -5 v",
    "GETEX sx PERSIST",
    "TTL sx",
    "GETEX sx EX 100",
    "TTL sx",
    "GETEX sx EX 0",
    "SET k v EX 10 PX 10",
    "SET k v KEEPTTL EX 10",
    "SET gone v PXAT 1",
    "GET gone",
    "EXISTS gone",
    "SET gone2 v",
    "EXPIRE gone2 -1",
    "GET gone2",
    "PEXPIREAT gone2 1",
    "SET k v EXAT 0",
    "DBSIZE",
    "SELECT 1",
    "DBSIZE",
    "SET k1 v",
    "DBSIZE",
    "SELECT 16",
    "SELECT -1",
    "SELECT x",
    "SELECT 0",
    "FLUSHDB BAD",
    "CLIENT SETNAME app",
    "CLIENT GETNAME",
    "CLIENT SETNAME \"a b\"",
    "CLIENT NOPE",
    "CONFIG GET appendonly",
    "CONFIG GET no-such-setting",
    "GET",
    "SET k",
    "NOSUCH a b",
    "nosuch",
    "AUTH secret",
    "HELLO 4",
    "HELLO x",
    "FLUSHDB",
    "DBSIZE",
    "SELECT 1",
    "FLUSHALL",
    "DBSIZE",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_match_redis_byte_for_byte() {
    let c = cluster(|_| {}).await;
    let addr = c.resp();
    let ours = tokio::task::spawn_blocking(move || pipeline(addr, SCRIPT))
        .await
        .unwrap();
    // Replies that are insitu's own, checked here; Redis's are compared below.
    assert_eq!(ours[0], "+PONG\r\n");
    assert_eq!(ours[5], "$1\r\nv\r\n");
    let Some((_redis, redis_addr)) = start_redis(&[]) else {
        return;
    };
    let theirs = tokio::task::spawn_blocking(move || pipeline(redis_addr, SCRIPT))
        .await
        .unwrap();
    let mut differ = Vec::new();
    for ((line, a), b) in SCRIPT.iter().zip(&ours).zip(&theirs) {
        if a != b {
            differ.push(format!("{line}: insitu {a:?}, redis {b:?}"));
        }
    }
    assert!(
        differ.is_empty(),
        "replies differ from Redis's:\n{}",
        differ.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_crate_works_unchanged() {
    let c = cluster(|_| {}).await;
    let url = format!("redis://{}/", c.resp());
    tokio::task::spawn_blocking(move || {
        let client = redis::Client::open(url).unwrap();
        let mut con = client.get_connection().unwrap();
        let _: () = redis::cmd("SET")
            .arg("greeting")
            .arg("hello")
            .query(&mut con)
            .unwrap();
        let v: String = redis::cmd("GET").arg("greeting").query(&mut con).unwrap();
        assert_eq!(v, "hello");
        let n: i64 = redis::cmd("INCRBY")
            .arg("counter")
            .arg(5)
            .query(&mut con)
            .unwrap();
        assert_eq!(n, 5);
        // A pipeline of 1,000 commands answered in order.
        let mut pipe = redis::pipe();
        for i in 0..1000 {
            pipe.cmd("INCR").arg("counter");
            pipe.cmd("SET").arg(format!("p{i}")).arg(i).ignore();
        }
        let counts: Vec<i64> = pipe.query(&mut con).unwrap();
        assert_eq!(counts.len(), 1000);
        assert_eq!(counts.last(), Some(&1005));
        let vals: Vec<Option<i64>> = redis::cmd("MGET")
            .arg("p0")
            .arg("p999")
            .arg("none")
            .query(&mut con)
            .unwrap();
        assert_eq!(vals, vec![Some(0), Some(999), None]);
        let err = redis::cmd("INCR")
            .arg("greeting")
            .query::<i64>(&mut con)
            .unwrap_err();
        assert!(err.to_string().contains("value is not an integer"), "{err}");
        // SCAN walks every key (the crate's iterator follows the cursor).
        let mut keys: Vec<String> = redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("MATCH")
            .arg("p*")
            .arg("COUNT")
            .arg(50)
            .clone()
            .iter(&mut con)
            .unwrap()
            .map(|k| k.unwrap())
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 1000);
    })
    .await
    .unwrap();
}

/// `db0:keys=..,expires=..` of an `INFO keyspace` reply, and `avg_ttl`.
fn keyspace(info: &str) -> (String, u64) {
    let line = info
        .lines()
        .find(|l| l.starts_with("db0:"))
        .unwrap_or_else(|| panic!("no db0 line in {info:?}"));
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .to_string()
    };
    let counts = format!("keys={},expires={}", field("keys="), field("expires="));
    (counts, field("avg_ttl=").parse().expect("avg_ttl"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_counts_the_keys_with_a_deadline_as_redis_does() {
    const LINES: &[&str] = &["SET a 1 EX 100", "SET b 2", "INFO keyspace"];
    let c = cluster(|_| {}).await;
    let (first, second) = (c.resp(), c.resp_of_second());
    let (ours, ours_second) = tokio::task::spawn_blocking(move || {
        let ours = pipeline(first, LINES);
        // The other server's port: the count is the cluster's, summed over
        // every shard of both servers, wherever the keys live.
        (ours, pipeline(second, &["INFO keyspace"]))
    })
    .await
    .unwrap();
    let (counts, avg_ttl) = keyspace(&ours[2]);
    assert_eq!(counts, "keys=2,expires=1");
    assert!((90_000..=100_000).contains(&avg_ttl), "avg_ttl={avg_ttl}");
    assert_eq!(keyspace(&ours_second[0]).0, "keys=2,expires=1");
    let Some((_redis, redis_addr)) = start_redis(&[]) else {
        return;
    };
    let theirs = tokio::task::spawn_blocking(move || pipeline(redis_addr, LINES))
        .await
        .unwrap();
    // Redis's avg_ttl is an estimate its expiry cycle samples: not compared.
    assert_eq!(keyspace(&theirs[2]).0, counts, "redis: {:?}", theirs[2]);
}
