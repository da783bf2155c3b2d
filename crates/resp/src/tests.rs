//! Commands over `MemStore`, replies checked byte for byte against what
//! Redis 7 sends (the texts were taken from a real `redis-server`; the
//! server's integration test compares the two side by side).

use bytes::{Bytes, BytesMut};

use crate::{MemStore, Session, Settings, execute};

// Expiry's tests, beside these and using their `Conn`.
#[path = "tests_expiry.rs"]
mod expiry;

// Cluster mode with a slot layout, beside these and using their `Conn`.
#[path = "tests_cluster.rs"]
mod cluster;

struct Conn {
    store: MemStore,
    settings: Settings,
    session: Session,
}

impl Conn {
    fn new() -> Conn {
        Conn {
            store: MemStore::default(),
            settings: Settings::default(),
            session: Session::new(7),
        }
    }

    fn run(&mut self, line: &str) -> String {
        let args: Vec<Bytes> = crate::codec::split_args(line.as_bytes())
            .expect("test line parses")
            .into_iter()
            .map(Bytes::from)
            .collect();
        let mut out = BytesMut::new();
        let fut = execute(
            &self.store,
            &self.settings,
            &mut self.session,
            &args,
            &mut out,
        );
        futures_lite(fut);
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl MemStore {
    /// Keys in database 0, synchronously (tests only).
    fn dbsize_now(&self) -> u64 {
        futures_lite(crate::Store::dbsize(self, 0)).expect("MemStore never fails")
    }
}

/// Run a future that never waits (MemStore is synchronous) to completion.
fn futures_lite<F: std::future::Future>(fut: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(fut)
}

#[test]
fn strings() {
    let mut c = Conn::new();
    assert_eq!(c.run("GET k"), "$-1\r\n");
    assert_eq!(c.run("SET k v"), "+OK\r\n");
    assert_eq!(c.run("GET k"), "$1\r\nv\r\n");
    assert_eq!(c.run("SET k w NX"), "$-1\r\n");
    assert_eq!(c.run("SET k w XX GET"), "$1\r\nv\r\n");
    assert_eq!(c.run("SET n 1 NX GET"), "$-1\r\n");
    assert_eq!(c.run("SET k v NX XX"), "-ERR syntax error\r\n");
    assert_eq!(
        c.run("SET k v EX 0"),
        "-ERR invalid expire time in 'set' command\r\n"
    );
    assert_eq!(
        c.run("SET k v EX x"),
        "-ERR value is not an integer or out of range\r\n"
    );
    assert_eq!(c.run("SET k w EX 10"), "+OK\r\n");
    assert_eq!(c.run("SETNX k x"), ":0\r\n");
    assert_eq!(c.run("GETSET k z"), "$1\r\nw\r\n");
    assert_eq!(c.run("GETDEL k"), "$1\r\nz\r\n");
    assert_eq!(c.run("GETDEL k"), "$-1\r\n");
    assert_eq!(c.run("MSET a 1 b 2"), "+OK\r\n");
    assert_eq!(
        c.run("MSET a 1 b"),
        "-ERR wrong number of arguments for 'mset' command\r\n"
    );
    assert_eq!(
        c.run("MGET a nope b"),
        "*3\r\n$1\r\n1\r\n$-1\r\n$1\r\n2\r\n"
    );
    assert_eq!(c.run("MSETNX a 9 c 3"), ":0\r\n");
    assert_eq!(c.run("MSETNX c 3 d 4"), ":1\r\n");
    assert_eq!(c.run("APPEND s hello"), ":5\r\n");
    assert_eq!(c.run("APPEND s \" world\""), ":11\r\n");
    assert_eq!(c.run("STRLEN s"), ":11\r\n");
    assert_eq!(c.run("GETRANGE s 0 3"), "$4\r\nhell\r\n");
    assert_eq!(c.run("GETRANGE s -3 -1"), "$3\r\nrld\r\n");
    assert_eq!(c.run("GETRANGE s -1 -3"), "$0\r\n\r\n");
    assert_eq!(c.run("GETRANGE s 5 100"), "$6\r\n world\r\n");
    assert_eq!(c.run("SETRANGE s 6 redis"), ":11\r\n");
    assert_eq!(c.run("GET s"), "$11\r\nhello redis\r\n");
    assert_eq!(c.run("SETRANGE pad 3 x"), ":4\r\n");
    assert_eq!(c.run("GET pad"), "$4\r\n\0\0\0x\r\n");
    assert_eq!(c.run("SETRANGE none 3 \"\""), ":0\r\n");
    assert_eq!(c.run("SETRANGE s -1 x"), "-ERR offset is out of range\r\n");
    assert_eq!(
        c.run("SETRANGE s 1048576 x"),
        "-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n"
    );
}

#[test]
fn counters() {
    let mut c = Conn::new();
    assert_eq!(c.run("INCR n"), ":1\r\n");
    assert_eq!(c.run("INCRBY n 41"), ":42\r\n");
    assert_eq!(c.run("DECR n"), ":41\r\n");
    assert_eq!(c.run("DECRBY n 50"), ":-9\r\n");
    assert_eq!(
        c.run("INCRBY n x"),
        "-ERR value is not an integer or out of range\r\n"
    );
    assert_eq!(
        c.run("INCRBY n +1"),
        "-ERR value is not an integer or out of range\r\n"
    );
    assert_eq!(c.run("SET big 9223372036854775807"), "+OK\r\n");
    assert_eq!(
        c.run("INCR big"),
        "-ERR increment or decrement would overflow\r\n"
    );
    assert_eq!(
        c.run("DECRBY n -9223372036854775808"),
        "-ERR decrement would overflow\r\n"
    );
    assert_eq!(c.run("SET s abc"), "+OK\r\n");
    assert_eq!(
        c.run("INCR s"),
        "-ERR value is not an integer or out of range\r\n"
    );
    assert_eq!(c.run("SET f 10.50"), "+OK\r\n");
    assert_eq!(c.run("INCRBYFLOAT f 0.1"), "$4\r\n10.6\r\n");
    assert_eq!(c.run("INCRBYFLOAT f -5"), "$3\r\n5.6\r\n");
    assert_eq!(c.run("SET e 5.0e3"), "+OK\r\n");
    assert_eq!(c.run("INCRBYFLOAT e 2.0e2"), "$4\r\n5200\r\n");
    assert_eq!(
        c.run("INCRBYFLOAT e x"),
        "-ERR value is not a valid float\r\n"
    );
    assert_eq!(
        c.run("INCRBYFLOAT s 1"),
        "-ERR value is not a valid float\r\n"
    );
    assert_eq!(
        c.run("INCRBYFLOAT e inf"),
        "-ERR increment would produce NaN or Infinity\r\n"
    );
}

#[test]
fn keys() {
    let mut c = Conn::new();
    c.run("MSET a 1 b 2 c 3");
    assert_eq!(c.run("EXISTS a a nope"), ":2\r\n");
    assert_eq!(c.run("DEL a nope"), ":1\r\n");
    assert_eq!(c.run("UNLINK a b"), ":1\r\n");
    assert_eq!(c.run("TYPE c"), "+string\r\n");
    assert_eq!(c.run("TYPE a"), "+none\r\n");
    assert_eq!(c.run("RENAME c d"), "+OK\r\n");
    assert_eq!(c.run("GET d"), "$1\r\n3\r\n");
    assert_eq!(c.run("RENAME c d"), "-ERR no such key\r\n");
    assert_eq!(c.run("RENAME d d"), "+OK\r\n");
    assert_eq!(c.run("TTL d"), ":-1\r\n");
    assert_eq!(c.run("PTTL nope"), ":-2\r\n");
    assert_eq!(c.run("PERSIST d"), ":0\r\n");
    assert_eq!(c.run("EXPIRE d 10"), ":1\r\n");
    assert_eq!(c.run("DBSIZE"), ":1\r\n");
    assert_eq!(c.run("SELECT 1"), "+OK\r\n");
    assert_eq!(c.run("DBSIZE"), ":0\r\n");
    assert_eq!(c.run("SELECT 16"), "-ERR DB index is out of range\r\n");
    assert_eq!(
        c.run("SELECT x"),
        "-ERR value is not an integer or out of range\r\n"
    );
    assert_eq!(c.run("SELECT 0"), "+OK\r\n");
    assert_eq!(c.run("FLUSHDB BAD"), "-ERR syntax error\r\n");
    assert_eq!(c.run("FLUSHALL"), "+OK\r\n");
    assert_eq!(c.run("DBSIZE"), ":0\r\n");
}

#[test]
fn scan_walks_every_key_once() {
    let mut c = Conn::new();
    for i in 0..25 {
        c.run(&format!("SET key:{i} v"));
    }
    c.run("SET other v");
    let mut cursor = "0".to_string();
    let mut seen = Vec::new();
    loop {
        let reply = c.run(&format!("SCAN {cursor} MATCH key:* COUNT 7"));
        let lines: Vec<&str> = reply.split("\r\n").collect();
        cursor = lines[2].to_string();
        seen.extend(
            lines
                .iter()
                .filter(|l| l.starts_with("key:"))
                .map(|s| s.to_string()),
        );
        if cursor == "0" {
            break;
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 25);
    assert_eq!(c.run("SCAN x"), "-ERR invalid cursor\r\n");
    assert_eq!(c.run("SCAN 0 COUNT 0"), "-ERR syntax error\r\n");
    assert!(c.run("SCAN 0 TYPE hash").ends_with("*0\r\n"));
}

#[test]
fn connection_commands() {
    let mut c = Conn::new();
    assert_eq!(c.run("PING"), "+PONG\r\n");
    assert_eq!(c.run("PING hi"), "$2\r\nhi\r\n");
    assert_eq!(
        c.run("ping a b"),
        "-ERR wrong number of arguments for 'ping' command\r\n"
    );
    assert_eq!(c.run("ECHO x"), "$1\r\nx\r\n");
    assert_eq!(
        c.run("NOSUCH a b"),
        "-ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' \r\n"
    );
    assert_eq!(
        c.run("GET"),
        "-ERR wrong number of arguments for 'get' command\r\n"
    );
    assert_eq!(c.run("CLIENT SETNAME app"), "+OK\r\n");
    assert_eq!(c.run("CLIENT GETNAME"), "$3\r\napp\r\n");
    assert_eq!(c.run("CLIENT ID"), ":7\r\n");
    assert_eq!(
        c.run("CLIENT SETNAME \"a b\""),
        "-ERR Client names cannot contain spaces, newlines or special characters.\r\n"
    );
    assert_eq!(
        c.run("CLIENT NOPE"),
        "-ERR unknown subcommand 'NOPE'. Try CLIENT HELP.\r\n"
    );
    assert_eq!(
        c.run("CONFIG GET appendonly"),
        "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n"
    );
    assert_eq!(c.run("CONFIG GET nothing*"), "*0\r\n");
    assert_eq!(
        c.run("COMMAND COUNT"),
        format!(":{}\r\n", crate::command::COMMANDS.len())
    );
    assert_eq!(
        c.run("AUTH secret"),
        "-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n"
    );
    assert!(c.run("HELLO 3").starts_with("%7\r\n"));
    assert_eq!(c.run("GET nope"), "_\r\n");
    assert_eq!(
        c.run("HELLO 4"),
        "-NOPROTO unsupported protocol version\r\n"
    );
    assert!(c.run("HELLO 2").starts_with("*14\r\n"));
    assert!(c.run("INFO").contains("redis_version:"));
    assert_eq!(c.run("QUIT"), "+OK\r\n");
    assert!(c.session.closing);
}

#[test]
fn authentication() {
    let mut c = Conn::new();
    c.settings.auth = Some(Box::new(|p: &[u8]| p == b"token"));
    assert_eq!(c.run("GET k"), "-NOAUTH Authentication required.\r\n");
    // Unknown commands and wrong arity are reported first, as by Redis.
    assert!(c.run("NOPE").starts_with("-ERR unknown command"));
    assert_eq!(
        c.run("GET"),
        "-ERR wrong number of arguments for 'get' command\r\n"
    );
    assert!(c.run("HELLO 3").starts_with("-NOAUTH HELLO must be called"));
    assert_eq!(
        c.run("AUTH wrong"),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(
        c.run("AUTH alice token"),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(c.run("PING"), "-NOAUTH Authentication required.\r\n");
    assert_eq!(c.run("AUTH default token"), "+OK\r\n");
    assert_eq!(c.run("PING"), "+PONG\r\n");
    assert_eq!(c.run("GET k"), "$-1\r\n");
    let mut d = Conn::new();
    d.settings.auth = Some(Box::new(|p: &[u8]| p == b"token"));
    assert!(
        d.run("HELLO 3 AUTH default token SETNAME me")
            .starts_with("%7\r\n")
    );
    assert_eq!(d.run("CLIENT GETNAME"), "$2\r\nme\r\n");
}

#[test]
fn multi_exec_discard_watch() {
    let mut c = Conn::new();
    assert_eq!(c.run("EXEC"), "-ERR EXEC without MULTI\r\n");
    assert_eq!(c.run("DISCARD"), "-ERR DISCARD without MULTI\r\n");
    assert_eq!(c.run("MULTI"), "+OK\r\n");
    assert_eq!(c.run("SET a 1"), "+QUEUED\r\n");
    assert_eq!(c.run("INCR a"), "+QUEUED\r\n");
    assert_eq!(c.run("SET s x"), "+QUEUED\r\n");
    assert_eq!(c.run("INCR s"), "+QUEUED\r\n");
    assert_eq!(c.run("GET a"), "+QUEUED\r\n");
    assert_eq!(c.run("MULTI"), "-ERR MULTI calls can not be nested\r\n");
    assert_eq!(
        c.run("WATCH a"),
        "-ERR WATCH inside MULTI is not allowed\r\n"
    );
    // Nothing ran yet.
    assert_eq!(c.store.dbsize_now(), 0);
    assert_eq!(
        c.run("EXEC"),
        "*5\r\n+OK\r\n:2\r\n+OK\r\n-ERR value is not an integer or out of range\r\n$1\r\n2\r\n"
    );
    // A command refused while queueing aborts the whole transaction.
    c.run("MULTI");
    assert_eq!(
        c.run("SET a"),
        "-ERR wrong number of arguments for 'set' command\r\n"
    );
    assert_eq!(c.run("SET a 9"), "+QUEUED\r\n");
    assert_eq!(
        c.run("EXEC"),
        "-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    assert_eq!(c.run("GET a"), "$1\r\n2\r\n");
    c.run("MULTI");
    c.run("SET a 9");
    assert_eq!(c.run("DISCARD"), "+OK\r\n");
    assert_eq!(c.run("GET a"), "$1\r\n2\r\n");
    // WATCH: a key changed by another connection makes EXEC answer null.
    assert_eq!(c.run("WATCH a"), "+OK\r\n");
    let mine = std::mem::replace(&mut c.session, Session::new(8));
    c.run("SET a 3");
    c.session = mine;
    c.run("MULTI");
    c.run("SET a 100");
    assert_eq!(c.run("EXEC"), "*-1\r\n");
    assert_eq!(c.run("GET a"), "$1\r\n3\r\n");
    // Unchanged: it runs (and EXEC ends the watch).
    c.run("WATCH a nope");
    c.run("MULTI");
    c.run("SET a 100");
    assert_eq!(c.run("EXEC"), "*1\r\n+OK\r\n");
    assert!(c.session.watched.is_empty());
    // SELECT inside applies to what follows.
    c.run("MULTI");
    c.run("SELECT 2");
    c.run("SET only-in-2 x");
    assert_eq!(c.run("EXEC"), "*2\r\n+OK\r\n+OK\r\n");
    assert_eq!(c.run("GET only-in-2"), "$1\r\nx\r\n");
}

#[test]
fn multi_queues_at_most_max_queued_commands() {
    let mut c = Conn::new();
    c.run("MULTI");
    for _ in 0..crate::multi::MAX_QUEUED {
        assert_eq!(c.run("PING"), "+QUEUED\r\n");
    }
    assert_eq!(
        c.run("PING"),
        format!(
            "-ERR too many commands in MULTI (the limit is {})\r\n",
            crate::multi::MAX_QUEUED
        )
    );
    assert_eq!(
        c.run("EXEC"),
        "-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    assert!(c.session.queued.is_none());
}

#[test]
fn cluster_discovery_describes_one_node_with_every_slot() {
    let mut c = Conn::new();
    c.session.local = Some(("127.0.0.1".into(), 6380));
    let id = "0".repeat(40);
    assert_eq!(
        c.run("CLUSTER SLOTS"),
        format!(
            "*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:6380\r\n$40\r\n{id}\r\n*0\r\n"
        )
    );
    assert_eq!(
        c.run("CLUSTER NODES"),
        format!("$102\r\n{id} 127.0.0.1:6380@16380 myself,master - 0 0 0 connected 0-16383\n\r\n")
    );
    assert_eq!(c.run("CLUSTER MYID"), format!("$40\r\n{id}\r\n"));
    assert_eq!(c.run("CLUSTER KEYSLOT foo"), ":12182\r\n");
    assert!(c.run("CLUSTER INFO").contains("cluster_state:ok\r\n"));
    let shards = c.run("CLUSTER SHARDS");
    assert!(
        shards.starts_with(
            "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*14\r\n"
        ),
        "{shards}"
    );
    // RESP3: maps where Redis sends maps.
    c.run("HELLO 3");
    assert!(c.run("CLUSTER SLOTS").ends_with("%0\r\n"));
    assert!(c.run("CLUSTER SHARDS").starts_with("*1\r\n%2\r\n"));
    // Errors as Redis words them.
    assert_eq!(
        c.run("CLUSTER KEYSLOT"),
        "-ERR wrong number of arguments for 'cluster|keyslot' command\r\n"
    );
    assert_eq!(
        c.run("CLUSTER NODES x"),
        "-ERR wrong number of arguments for 'cluster|nodes' command\r\n"
    );
    assert_eq!(
        c.run("CLUSTER BOGUS"),
        "-ERR unknown subcommand 'BOGUS'. Try CLUSTER HELP.\r\n"
    );
    assert_eq!(
        c.run("CLUSTER"),
        "-ERR wrong number of arguments for 'cluster' command\r\n"
    );
    for cmd in ["READONLY", "READWRITE", "ASKING"] {
        assert_eq!(c.run(cmd), "+OK\r\n");
    }
    assert_eq!(
        c.run("READONLY x"),
        "-ERR wrong number of arguments for 'readonly' command\r\n"
    );
}

#[test]
fn info_counts_the_keys_with_a_deadline_and_their_mean_ttl() {
    const T0: u64 = 1_700_000_000_000;
    let mut c = Conn::new();
    c.store.set_clock_ms(Some(T0));
    let keyspace = |c: &mut Conn| {
        let info = c.run("INFO keyspace");
        let at = info.find("# Keyspace\r\n").expect("keyspace section") + 12;
        info[at..].trim_end().to_string()
    };
    assert_eq!(keyspace(&mut c), "", "an empty database is not listed");
    c.run("SET a 1 EX 100");
    c.run("SET b 2");
    assert_eq!(keyspace(&mut c), "db0:keys=2,expires=1,avg_ttl=100000");
    c.run("PEXPIRE b 50000");
    assert_eq!(keyspace(&mut c), "db0:keys=2,expires=2,avg_ttl=75000");
    c.store.set_clock_ms(Some(T0 + 10_000));
    assert_eq!(keyspace(&mut c), "db0:keys=2,expires=2,avg_ttl=65000");
    c.run("PERSIST a");
    assert_eq!(keyspace(&mut c), "db0:keys=2,expires=1,avg_ttl=40000");
    // Past b's deadline it is gone from both counts.
    c.store.set_clock_ms(Some(T0 + 50_000));
    assert_eq!(keyspace(&mut c), "db0:keys=1,expires=0,avg_ttl=0");
    // Another database counts its own keys only.
    c.run("SELECT 1");
    c.run("SET c 3 PX 2000");
    assert_eq!(keyspace(&mut c), "db1:keys=1,expires=1,avg_ttl=2000");
}

#[test]
fn info_expiry_fields_keep_expires_within_keys_and_a_past_mean_at_zero() {
    use crate::ExpiringKeys;
    use crate::exec::expiry_fields;
    let figures = |keys, deadline_sum_ms| ExpiringKeys {
        keys,
        deadline_sum_ms,
    };
    assert_eq!(expiry_fields(5, figures(0, 0), 1000), (0, 0));
    assert_eq!(expiry_fields(5, figures(2, 5000), 1000), (2, 1500));
    // Counted before an expired key was removed, after it left `keys`.
    assert_eq!(expiry_fields(1, figures(2, 5000), 1000), (1, 1500));
    // Every counted deadline has passed: the mean rest is negative.
    assert_eq!(expiry_fields(3, figures(2, 1000), 1000), (2, 0));
    // Deadlines far beyond a u64 sum still average exactly.
    let far = u64::MAX / 2;
    assert_eq!(
        expiry_fields(9, figures(4, 4 * u128::from(far)), 0),
        (4, far)
    );
}
