//! The Redis protocol port on real servers: replies compared byte for byte
//! with a real `redis-server` started beside it (when one is installed; CI
//! installs it), keys served whichever server holds them, the `redis` crate
//! as a client, bad input closing only its own connection, `AUTH` with the
//! cluster's token, and the same objects read through insitu's own client.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use insitu_client::{Client, Selection};
use insitu_server::{RespSettings, ServerConfig};

/// A coordinator and two servers of two shards each, with the RESP port on
/// both (sharing one port number is `insitu up`'s business; here each has
/// its own).
struct Cluster {
    node: common::Node,
    second: insitu_server::ServerHandle,
}

impl Cluster {
    fn resp(&self) -> SocketAddr {
        self.node.server.resp_addr.expect("RESP port")
    }
    fn resp_of_second(&self) -> SocketAddr {
        self.second.resp_addr.expect("RESP port")
    }
}

fn with_resp(c: &mut ServerConfig) {
    c.shards = 2;
    c.resp = Some(RespSettings {
        port: 0,
        table: "redis".into(),
        join: false,
    });
}

async fn cluster(tweak: impl Fn(&mut ServerConfig) + Copy) -> Cluster {
    let node = common::start(|c| {
        with_resp(c);
        tweak(c);
    })
    .await;
    let mut config = ServerConfig::new(node.addr(), node.dir.path().join("s2"));
    with_resp(&mut config);
    tweak(&mut config);
    let second = insitu_server::start(config).await.unwrap();
    Cluster { node, second }
}

/// Read one whole RESP reply (any type, nested) from `s`, as raw bytes.
fn read_reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<u8> {
    loop {
        if let Some(n) = reply_len(buf, 0) {
            return buf.drain(..n).collect();
        }
        let mut chunk = [0u8; 65536];
        let n = s.read(&mut chunk).expect("read reply");
        assert!(
            n > 0,
            "connection closed mid-reply; have {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Length of the reply starting at `at`, if whole.
fn reply_len(buf: &[u8], at: usize) -> Option<usize> {
    let end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[at + 1..end]).ok()?;
    let after = end + 2;
    match buf[at] {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' => Some(after - at),
        b'$' | b'=' => {
            let n: i64 = line.parse().ok()?;
            if n < 0 {
                return Some(after - at);
            }
            let stop = after + n as usize + 2;
            (buf.len() >= stop).then_some(stop - at)
        }
        b'*' | b'%' | b'~' => {
            let n: i64 = line.parse().ok()?;
            let items = if buf[at] == b'%' { 2 * n } else { n };
            let mut pos = after;
            for _ in 0..items.max(0) {
                pos += reply_len(buf, pos)?;
            }
            Some(pos - at)
        }
        other => panic!("not a RESP reply: {:?}", other as char),
    }
}

/// Encode `line` (split as redis-cli splits) as a multibulk command.
fn encode(line: &str) -> Vec<u8> {
    let args = insitu_resp::codec::split_args(line.as_bytes()).expect("test line");
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).bytes());
        out.extend(a);
        out.extend(b"\r\n");
    }
    out
}

/// Send every line as one pipeline and return the replies, in order.
fn pipeline<S: AsRef<str>>(addr: SocketAddr, lines: &[S]) -> Vec<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let bytes: Vec<u8> = lines.iter().flat_map(|l| encode(l.as_ref())).collect();
    s.write_all(&bytes).unwrap();
    let mut buf = Vec::new();
    lines
        .iter()
        .map(|_| String::from_utf8_lossy(&read_reply(&mut s, &mut buf)).into_owned())
        .collect()
}

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

fn start_redis() -> Option<(insitu_testkit::Proc, SocketAddr)> {
    if !insitu_testkit::on_path("redis-server") {
        eprintln!("SKIPPED: the comparison with Redis (redis-server is not installed)");
        return None;
    }
    let port = insitu_testkit::free_port().unwrap();
    let mut cmd = std::process::Command::new("redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]);
    let (proc, _) = insitu_testkit::Proc::spawn(cmd, "redis-server", |l| {
        l.contains("Ready to accept connections")
    })
    .unwrap();
    Some((proc, SocketAddr::from(([127, 0, 0, 1], port))))
}

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
    let Some((_redis, redis_addr)) = start_redis() else {
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

/// One connection, one command at a time.
struct Line(TcpStream, Vec<u8>);

impl Line {
    fn open(addr: SocketAddr) -> Line {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Line(s, Vec::new())
    }
    fn call(&mut self, line: &str) -> String {
        self.0.write_all(&encode(line)).unwrap();
        String::from_utf8_lossy(&read_reply(&mut self.0, &mut self.1)).into_owned()
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_takes_the_cluster_token() {
    let client_token = insitu_auth::Token::parse(b"client-secret-0123456789", "test").unwrap();
    let member_token = insitu_auth::Token::parse(b"member-secret-0123456789", "test").unwrap();
    let gate = insitu_auth::Gate::new(client_token, member_token);
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = insitu_coordinator::CoordinatorConfig::new(dir.path().join("c"));
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
    let replies = tokio::task::spawn_blocking(move || {
        pipeline(
            addr,
            &[
                "GET k",
                "AUTH wrong",
                "AUTH default client-secret-0123456789",
                "SET k v",
                "GET k",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(replies[0], "-NOAUTH Authentication required.\r\n");
    assert_eq!(
        replies[1],
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(replies[2], "+OK\r\n");
    assert_eq!(replies[3], "+OK\r\n");
    assert_eq!(replies[4], "$1\r\nv\r\n");
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
