//! Mutated Redis commands against the Redis port of two real servers: the
//! RESP parser has its fuzz target (against the in-memory model store);
//! this test sends well-formed commands with mutated *arguments* to the real
//! store path (routing between servers, cross-server MSET/RENAME as
//! transactions, expiry, MULTI/EXEC/WATCH, the cluster commands). What must
//! hold: every command is answered with one reply (any reply, errors
//! included) within 20 s, both servers answer `PING` throughout, and the
//! canary keys, which no mutant names, keep their values.
//!
//! `INSITU_RESP_MUTANTS` sets how many (default 3,000), `INSITU_MUTANT_SEED`
//! the seed (printed).

use crate::common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::resp::{cluster, encode_args, read_reply};

/// Valid commands the mutants start from (split on spaces).
const SEEDS: &[&str] = &[
    "SET k1 v1",
    "SET k2 v2 EX 100 NX",
    "SET k3 v3 PX 50 GET",
    "SET k1 v9 KEEPTTL XX",
    "SET {t}a 1 EXAT 4102444800",
    "SETNX k4 v",
    "SETEX k5 10 v",
    "PSETEX k6 100 v",
    "GET k1",
    "GETEX k1 PERSIST",
    "GETEX k2 PX 500",
    "GETSET k1 x",
    "GETDEL k3",
    "MGET k1 k2 k3 {t}a",
    "MSET a 1 b 2 {t}c 3",
    "MSETNX d 1 e 2",
    "INCR n",
    "INCRBY n 5",
    "DECR n",
    "DECRBY n 3",
    "INCRBYFLOAT f 1.5",
    "APPEND s abc",
    "STRLEN s",
    "GETRANGE s 0 -1",
    "DEL a b",
    "UNLINK d e",
    "EXISTS a k1 k2",
    "TYPE k1",
    "SCAN 0 MATCH k* COUNT 10 TYPE string",
    "RENAME k1 k7",
    "EXPIRE k2 100 NX",
    "PEXPIRE k2 1000",
    "TTL k2",
    "PTTL k2",
    "EXPIRETIME k2",
    "PEXPIRETIME k2",
    "PERSIST k2",
    "MULTI",
    "EXEC",
    "DISCARD",
    "WATCH k1 n",
    "UNWATCH",
    "PING",
    "PING hello",
    "ECHO hi",
    "SELECT 0",
    "DBSIZE",
    "INFO",
    "CLIENT SETNAME mutant",
    "CLIENT ID",
    "CONFIG GET maxmemory",
    "CLUSTER SLOTS",
    "CLUSTER SHARDS",
    "CLUSTER NODES",
    "CLUSTER KEYSLOT k1",
    "COMMAND COUNT",
    "COMMAND DOCS get",
    "READONLY",
    "READWRITE",
    "ASKING",
];

/// Arguments a mutant may put anywhere: numbers at and past the edges,
/// empty and odd strings, option words, hash tags, and big ones.
fn special(rng: &mut insitu_testkit::Rng) -> Vec<u8> {
    let words: &[&str] = &[
        "",
        "0",
        "-1",
        "1",
        "9223372036854775807",
        "-9223372036854775808",
        "9223372036854775808",
        "18446744073709551616",
        "1e308",
        "-1e308",
        "nan",
        "inf",
        "-inf",
        "0.1",
        "EX",
        "PX",
        "EXAT",
        "PXAT",
        "NX",
        "XX",
        "GT",
        "LT",
        "GET",
        "KEEPTTL",
        "PERSIST",
        "MATCH",
        "COUNT",
        "TYPE",
        "*",
        "[",
        "\\",
        "{",
        "{}",
        "{t}",
        "k1",
        "n",
        "s",
    ];
    match rng.u8(0..10) {
        0 => vec![b'x'; rng.usize(1..200_000)],
        1 => (0..rng.usize(0..40)).map(|_| rng.u8(..)).collect(),
        _ => words[rng.usize(0..words.len())].as_bytes().to_vec(),
    }
}

/// One to three argument-level changes of `args`, mostly one that keeps
/// the count (a wrong count only reaches the arity check).
fn mutate(rng: &mut insitu_testkit::Rng, mut args: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let changes = match rng.u8(0..10) {
        0..=6 => 1,
        7..=8 => 2,
        _ => 3,
    };
    for _ in 0..changes {
        let at = rng.usize(0..args.len());
        match rng.u8(0..20) {
            // An argument (never the name) replaced.
            0..=9 if args.len() > 1 => {
                let at = rng.usize(1..args.len());
                args[at] = special(rng);
            }
            10..=11 => args.insert(at.max(1), special(rng)),
            12 if args.len() > 1 => {
                args.remove(at);
            }
            13 => {
                let copy = args[at].clone();
                args.insert(at, copy);
            }
            // Another command's name in front of these arguments.
            14..=15 => {
                let other = SEEDS[rng.usize(0..SEEDS.len())];
                args[0] = other.split(' ').next().unwrap().as_bytes().to_vec();
            }
            _ => args[at].push(b'9'),
        }
    }
    args
}

/// Whether the mutant may not be sent: it names a canary key, or empties
/// the store (`FLUSHALL`/`FLUSHDB`, whose meaning is to remove everything).
fn spares_nothing(args: &[Vec<u8>]) -> bool {
    let name = args[0].to_ascii_uppercase();
    name == b"FLUSHALL"
        || name == b"FLUSHDB"
        || args
            .iter()
            .any(|a| a.windows(6).any(|w| w.eq_ignore_ascii_case(b"canary")))
}

/// A connection that is opened again after the server closed it (`QUIT`,
/// or a limit).
struct Conn {
    addr: SocketAddr,
    stream: Option<(TcpStream, Vec<u8>)>,
}

impl Conn {
    /// Send `args` and read its one reply; None if the server closed the
    /// connection. Panics if no reply comes within 20 s.
    fn call(&mut self, args: &[Vec<u8>], what: &str) -> Option<Vec<u8>> {
        let (s, buf) = self.stream.get_or_insert_with(|| {
            let s = TcpStream::connect(self.addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            (s, Vec::new())
        });
        if s.write_all(&encode_args(args)).is_err() {
            self.stream = None;
            return None;
        }
        let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_reply(s, buf)));
        match answer {
            Ok(reply) => Some(reply),
            Err(_) => {
                // `read_reply` panics on a closed connection and on a read
                // timeout: tell them apart by the connection's state.
                let closed = {
                    let mut probe = [0u8; 1];
                    s.set_nonblocking(true).unwrap();
                    let r = std::io::Read::read(s, &mut probe);
                    matches!(r, Ok(0))
                        || matches!(&r, Err(e) if e.kind() != std::io::ErrorKind::WouldBlock)
                };
                assert!(closed, "{what}: no reply within 20 s");
                self.stream = None;
                None
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_redis_commands_leave_the_servers_up_and_other_keys_intact() {
    let c = cluster(|_| {}).await;
    let addrs = [c.resp(), c.resp_of_second()];
    let count: usize = insitu_testkit::env_or("INSITU_RESP_MUTANTS", 3_000);
    let seed: u64 = insitu_testkit::env_or("INSITU_MUTANT_SEED", 0x0005_EED0_FBAD);
    tokio::task::spawn_blocking(move || {
        eprintln!("mutated Redis commands: {count} mutants, seed {seed} (INSITU_MUTANT_SEED)");
        let mut setup = Conn {
            addr: addrs[0],
            stream: None,
        };
        for i in 0..100 {
            let args = [
                b"SET".to_vec(),
                format!("canary:{i}").into(),
                format!("v{i}").into(),
            ];
            assert_eq!(setup.call(&args, "setup").unwrap(), b"+OK\r\n");
        }
        let mut rng = insitu_testkit::rng(seed);
        let mut conns: Vec<Conn> = addrs
            .iter()
            .map(|&addr| Conn { addr, stream: None })
            .collect();
        let (mut sent, mut errors, mut closed, mut skipped) = (0, 0, 0, 0);
        let started = Instant::now();
        for n in 0..count {
            let base: Vec<Vec<u8>> = SEEDS[rng.usize(0..SEEDS.len())]
                .split(' ')
                .map(|a| a.as_bytes().to_vec())
                .collect();
            let args = mutate(&mut rng, base);
            if spares_nothing(&args) {
                skipped += 1;
                continue;
            }
            let what = format!(
                "mutant {n} (seed {seed}): {:?}",
                args.iter()
                    .map(|a| String::from_utf8_lossy(&a[..a.len().min(40)]).into_owned())
                    .collect::<Vec<_>>()
            );
            let i = rng.usize(0..conns.len());
            sent += 1;
            match conns[i].call(&args, &what) {
                Some(reply) if reply.first() == Some(&b'-') => {
                    errors += 1;
                    if std::env::var_os("INSITU_SHOW_ERRORS").is_some() {
                        eprintln!("{what} -> {}", String::from_utf8_lossy(&reply));
                    }
                }
                Some(_) => {}
                None => closed += 1,
            }
            if n % 500 == 499 {
                for &addr in &addrs {
                    let mut fresh = Conn { addr, stream: None };
                    let pong = fresh.call(&[b"PING".to_vec()], &format!("PING after {what}"));
                    assert_eq!(
                        pong.as_deref(),
                        Some(&b"+PONG\r\n"[..]),
                        "{addr} after {what}"
                    );
                }
            }
        }
        eprintln!(
            "mutated Redis commands: {sent} sent in {:?} ({errors} answered with an error, \
             {closed} closed the connection), {skipped} not sent (naming a canary key or \
             emptying the store)",
            started.elapsed()
        );
        assert!(sent > count / 2, "most mutants are sent: {sent} of {count}");
        // Every canary key, read through the other server.
        let mut check = Conn {
            addr: addrs[1],
            stream: None,
        };
        for i in 0..100 {
            let args = [b"GET".to_vec(), format!("canary:{i}").into_bytes()];
            let want = format!("${}\r\nv{i}\r\n", format!("v{i}").len());
            assert_eq!(
                String::from_utf8_lossy(&check.call(&args, "canary").unwrap()),
                want,
                "canary:{i}"
            );
        }
    })
    .await
    .unwrap();
}
