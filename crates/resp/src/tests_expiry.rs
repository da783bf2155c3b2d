//! Key expiry over `MemStore` with its clock pinned, then moved on to make
//! keys expire. Replies are checked byte for byte against what Redis 7
//! sends (taken from a real `redis-server` 7.0.15, the TTL values computed
//! from the pinned clock instead of a running one).

use bytes::Bytes;

use super::{Conn, futures_lite};
use crate::{Cond, MemStore, Put, Store};

/// The pinned clock's start, in Unix ms (a whole second, so EXPIRETIME's
/// rounding is easy to read).
const T0: u64 = 1_700_000_000_000;

fn conn() -> Conn {
    let c = Conn::new();
    c.store.set_clock_ms(Some(T0));
    c
}

impl Conn {
    /// Move the pinned clock to `T0 + ms`.
    fn at(&self, ms: u64) {
        self.store.set_clock_ms(Some(T0 + ms));
    }

    /// Run `line` and check its reply.
    fn check(&mut self, line: &str, reply: &str) {
        assert_eq!(self.run(line), reply, "{line}");
    }
}

fn int(n: i64) -> String {
    format!(":{n}\r\n")
}

const OK: &str = "+OK\r\n";
const NIL: &str = "$-1\r\n";
const SYNTAX: &str = "-ERR syntax error\r\n";
const NOT_INT: &str = "-ERR value is not an integer or out of range\r\n";

fn invalid(command: &str) -> String {
    format!("-ERR invalid expire time in '{command}' command\r\n")
}

fn arity(command: &str) -> String {
    format!("-ERR wrong number of arguments for '{command}' command\r\n")
}

#[test]
fn set_ex_counts_down_then_the_key_is_gone() {
    let mut c = conn();
    c.check("SET k v EX 10", OK);
    c.check("TTL k", ":10\r\n");
    c.check("PTTL k", ":10000\r\n");
    c.check("EXPIRETIME k", &int(T0 as i64 / 1000 + 10));
    c.check("PEXPIRETIME k", &int(T0 as i64 + 10_000));
    // TTL rounds to the nearest second, halves up.
    c.at(9_499);
    c.check("TTL k", ":1\r\n");
    c.check("PTTL k", ":501\r\n");
    c.at(9_501);
    c.check("TTL k", ":0\r\n");
    c.at(9_999);
    c.check("PTTL k", ":1\r\n");
    c.check("GET k", "$1\r\nv\r\n");
    c.at(10_000);
    c.check("GET k", NIL);
    c.check("EXISTS k", ":0\r\n");
    c.check("TTL k", ":-2\r\n");
    c.check("PTTL k", ":-2\r\n");
    c.check("EXPIRETIME k", ":-2\r\n");
    c.check("PEXPIRETIME k", ":-2\r\n");
    c.check("TYPE k", "+none\r\n");
    c.check("MGET k", "*1\r\n$-1\r\n");
    c.check("DBSIZE", ":0\r\n");
    c.check("SCAN 0", "*2\r\n$1\r\n0\r\n*0\r\n");
    c.check("STRLEN k", ":0\r\n");
    c.check("SET k w XX", NIL);
    c.check("SET k w NX", OK);
    c.check("TTL k", ":-1\r\n");
    c.check("EXPIRETIME k", ":-1\r\n");
    c.check("PEXPIRETIME k", ":-1\r\n");
}

#[test]
fn set_time_options() {
    let mut c = conn();
    c.check("SET k v PX 1500", OK);
    c.check("TTL k", ":2\r\n");
    c.check("SET k v PX 1499", OK);
    c.check("TTL k", ":1\r\n");
    c.check("SET k v EXAT 1700000100", OK);
    c.check("TTL k", ":100\r\n");
    c.check("SET k v pxat 1700000000250", OK);
    c.check("PTTL k", ":250\r\n");
    c.check("SET k v PXAT 9999999999499", OK);
    c.check("EXPIRETIME k", ":9999999999\r\n");
    c.check("SET k v PXAT 9999999999500", OK);
    c.check("EXPIRETIME k", ":10000000000\r\n");
    // The largest deadline there is: its rounding does not wrap.
    c.check("SET k v PXAT 9223372036854775807", OK);
    c.check("EXPIRETIME k", ":9223372036854776\r\n");
    c.check("PEXPIRETIME k", ":9223372036854775807\r\n");
    c.check("SET k v EXAT 9223372036854775", OK);
    // A repeated option: the last one counts, as in Redis.
    c.check("SET k v EX 10 EX 20", OK);
    c.check("TTL k", ":20\r\n");
    c.check("SET k v NX NX", NIL);
    c.check("SET k v XX XX KEEPTTL KEEPTTL", OK);
    c.check("TTL k", ":20\r\n");
    // A deadline already past: written, and at once expired.
    c.check("SET k v EXAT 1", OK);
    c.check("GET k", NIL);
    c.check("EXISTS k", ":0\r\n");
    c.check("SET k v PXAT 1700000000000", OK);
    c.check("GET k", NIL);
    // NX or XX with a time: nothing written when the condition fails.
    c.check("SET z 1 EX 100", OK);
    c.check("SET z 2 NX EX 5", NIL);
    c.check("TTL z", ":100\r\n");
    c.check("SET z 2 XX PX 5000", OK);
    c.check("PTTL z", ":5000\r\n");
    c.check("SET z 3 GET EX 7", "$1\r\n2\r\n");
    c.check("TTL z", ":7\r\n");
}

#[test]
fn set_errors() {
    let mut c = conn();
    let (invalid, syntax, not_int) = (&invalid("set")[..], SYNTAX, NOT_INT);
    for (line, reply) in [
        ("SET k v EX 0", invalid),
        ("SET k v PX -1", invalid),
        ("SET k v EXAT 0", invalid),
        ("SET k v PXAT -5", invalid),
        ("SET k v GET EX 0", invalid),
        // Seconds that overflow as milliseconds, and deadlines past i64.
        ("SET k v EX 9223372036854776", invalid),
        ("SET k v EXAT 9223372036854776", invalid),
        ("SET k v PX 9223372036854775807", invalid),
        ("SET k v EX x", not_int),
        ("SET k v PX 1.5", not_int),
        ("SET k v EX 99999999999999999999", not_int),
        // Every option is parsed before the time is read.
        ("SET k v EX x NX XX", syntax),
        ("SET k v EX 10 PX 5", syntax),
        ("SET k v EX 10 EXAT 5", syntax),
        ("SET k v PXAT 10 PX 5", syntax),
        ("SET k v KEEPTTL EX 5", syntax),
        ("SET k v EX 5 KEEPTTL", syntax),
        ("SET k v NX XX", syntax),
        ("SET k v XX NX", syntax),
        ("SET k v EX", syntax),
        ("SET k v GET EX 5 EX", syntax),
        ("SET k v PERSIST", syntax),
        ("SET k v EXPIRE 5", syntax),
    ] {
        c.check(line, reply);
    }
    // Nothing was written by any of them.
    c.check("EXISTS k", ":0\r\n");
}

#[test]
fn which_writes_keep_the_deadline() {
    let mut c = conn();
    c.check("SET k v EX 100", OK);
    c.check("SET k w KEEPTTL", OK);
    c.check("TTL k", ":100\r\n");
    c.check("SET k x KEEPTTL GET", "$1\r\nw\r\n");
    c.check("TTL k", ":100\r\n");
    c.check("SET k y", OK);
    c.check("TTL k", ":-1\r\n");
    c.check("SET k v EX 100", OK);
    c.check("SET k y XX", OK);
    c.check("TTL k", ":-1\r\n");
    c.check("SET k v EX 100", OK);
    c.check("SET k w GET", "$1\r\nv\r\n");
    c.check("TTL k", ":-1\r\n");
    c.check("SET k v EX 100", OK);
    c.check("GETSET k w", "$1\r\nv\r\n");
    c.check("TTL k", ":-1\r\n");
    c.check("SET k v EX 100", OK);
    c.check("MSET k w", OK);
    c.check("TTL k", ":-1\r\n");
    // KEEPTTL on a new key: no deadline to keep.
    c.check("SET fresh v KEEPTTL", OK);
    c.check("TTL fresh", ":-1\r\n");
    c.check("SET k v EX 100", OK);
    c.check("SET k w NX KEEPTTL", NIL);
    c.check("GETDEL k", "$1\r\nv\r\n");
    c.check("TTL k", ":-2\r\n");
    // SETNX, MSETNX find an expired key absent and write without deadline.
    c.check("SET e v PX 10", OK);
    c.check("SET f v PX 10", OK);
    c.at(10);
    c.check("SETNX e 1", ":1\r\n");
    c.check("MSETNX f 2 g 3", ":1\r\n");
    c.check("TTL e", ":-1\r\n");
    c.check("TTL f", ":-1\r\n");
}

#[test]
fn read_modify_writes_keep_the_deadline() {
    let mut c = conn();
    c.check("SET n 5 EX 100", OK);
    c.at(30_000);
    for (line, reply) in [
        ("INCR n", ":6\r\n"),
        ("INCRBY n 4", ":10\r\n"),
        ("DECR n", ":9\r\n"),
        ("DECRBY n 2", ":7\r\n"),
        ("INCRBYFLOAT n 1.5", "$3\r\n8.5\r\n"),
        ("APPEND n x", ":4\r\n"),
        ("SETRANGE n 0 y", ":4\r\n"),
    ] {
        c.check(line, reply);
        c.check("TTL n", ":70\r\n");
    }
    c.check("GET n", "$4\r\ny.5x\r\n");
    // Once expired, they start from nothing, without a deadline.
    c.at(100_000);
    c.check("INCR n", ":1\r\n");
    c.check("TTL n", ":-1\r\n");
    c.check("SET s abc PX 1", OK);
    c.at(100_001);
    c.check("APPEND s de", ":2\r\n");
    c.check("TTL s", ":-1\r\n");
    // A failed increment writes nothing, so the deadline is untouched.
    c.check("SET s abc EX 9", OK);
    c.check("INCR s", "-ERR value is not an integer or out of range\r\n");
    c.check("TTL s", ":9\r\n");
}

/// One `EXPIRE` with options against a key with a deadline 100 s away
/// (`Some(100)`) or none, and the reply and TTL after.
#[test]
fn expire_conditions() {
    let cases: &[(Option<u32>, &str, &str, i64)] = &[
        (None, "EXPIRE k 50", ":1\r\n", 50),
        (Some(100), "EXPIRE k 50", ":1\r\n", 50),
        (None, "EXPIRE k 50 NX", ":1\r\n", 50),
        (Some(100), "EXPIRE k 50 NX", ":0\r\n", 100),
        (None, "EXPIRE k 50 XX", ":0\r\n", -1),
        (Some(100), "EXPIRE k 50 XX", ":1\r\n", 50),
        // No deadline counts as infinite: never smaller, always larger.
        (None, "EXPIRE k 50 GT", ":0\r\n", -1),
        (Some(100), "EXPIRE k 50 GT", ":0\r\n", 100),
        (Some(100), "EXPIRE k 100 GT", ":0\r\n", 100),
        (Some(100), "EXPIRE k 150 GT", ":1\r\n", 150),
        (None, "EXPIRE k 50 LT", ":1\r\n", 50),
        (Some(100), "EXPIRE k 50 LT", ":1\r\n", 50),
        (Some(100), "EXPIRE k 100 LT", ":0\r\n", 100),
        (Some(100), "EXPIRE k 150 LT", ":0\r\n", 100),
        (None, "EXPIRE k 50 XX GT", ":0\r\n", -1),
        (Some(100), "EXPIRE k 150 xx gt", ":1\r\n", 150),
        (None, "EXPIRE k 50 XX LT", ":0\r\n", -1),
        (Some(100), "EXPIRE k 50 XX LT", ":1\r\n", 50),
        (Some(100), "EXPIRE k 50 NX NX", ":0\r\n", 100),
        (Some(100), "PEXPIRE k 50000 LT", ":1\r\n", 50),
        (Some(100), "EXPIREAT k 1700000150 GT", ":1\r\n", 150),
        (Some(100), "PEXPIREAT k 1700000050000 GT", ":0\r\n", 100),
        (None, "PEXPIREAT k 1700000050000 NX", ":1\r\n", 50),
        // A condition that fails keeps even a deadline in the past.
        (Some(100), "EXPIRE k -1 NX", ":0\r\n", 100),
        (Some(100), "EXPIRE k 0 GT", ":0\r\n", 100),
    ];
    for (deadline, line, reply, ttl) in cases {
        let mut c = conn();
        match deadline {
            Some(s) => c.check(&format!("SET k v EX {s}"), OK),
            None => c.check("SET k v", OK),
        }
        c.check(line, reply);
        assert_eq!(c.run("TTL k"), int(*ttl), "TTL after {line}");
    }
}

#[test]
fn expire_sets_and_deletes() {
    let mut c = conn();
    c.check("EXPIRE nokey 10", ":0\r\n");
    c.check("EXPIRE nokey 10 GT", ":0\r\n");
    c.check("SET k v", OK);
    c.check("PEXPIRE k 1500", ":1\r\n");
    c.check("PTTL k", ":1500\r\n");
    c.check("GET k", "$1\r\nv\r\n");
    c.at(1_500);
    c.check("EXISTS k", ":0\r\n");
    // A time at or before now deletes the key and answers 1.
    for line in [
        "EXPIRE k 0",
        "EXPIRE k -5",
        "PEXPIRE k 0",
        "EXPIREAT k 1700000001",
        "PEXPIREAT k 1",
        "PEXPIREAT k 1700000001500",
        "EXPIRE k -9223372036854775",
    ] {
        c.check("SET k v", OK);
        c.check(line, ":1\r\n");
        c.check("EXISTS k", ":0\r\n");
    }
    // One millisecond ahead is still ahead.
    c.check("SET k v", OK);
    c.check("PEXPIREAT k 1700000001501", ":1\r\n");
    c.check("PTTL k", ":1\r\n");
    c.check("PEXPIREAT k 9223372036854775807", ":1\r\n");
    c.check("PEXPIRETIME k", ":9223372036854775807\r\n");
    c.check("EXPIREAT k 9223372036854775", ":1\r\n");
    c.check("EXPIRETIME k", ":9223372036854775\r\n");
}

#[test]
fn expire_errors() {
    let mut c = conn();
    c.check("SET k v", OK);
    let nx_with = "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n";
    let gt_lt = "-ERR GT and LT options at the same time are not compatible\r\n";
    let unsupported = |opt: &str| format!("-ERR Unsupported option {opt}\r\n");
    for (line, reply) in [
        ("EXPIRE k 100 NX XX", nx_with.to_string()),
        ("EXPIRE k 100 NX GT", nx_with.into()),
        ("PEXPIRE k 100 lt nx", nx_with.into()),
        ("EXPIRE k 100 GT LT", gt_lt.into()),
        ("EXPIRE k 100 FOO", unsupported("FOO")),
        ("EXPIRE k 100 nx foo", unsupported("foo")),
        ("EXPIRE k 100 FOO NX XX", unsupported("FOO")),
        // The options come before the number, the number before its range.
        ("EXPIRE k x FOO", unsupported("FOO")),
        ("EXPIRE k x NX XX", nx_with.into()),
        ("EXPIRE k x", NOT_INT.into()),
        ("EXPIRE k 1.5", NOT_INT.into()),
        ("EXPIRE k 9223372036854776", invalid("expire")),
        ("EXPIRE k -9223372036854776", invalid("expire")),
        ("EXPIRE nokey 9223372036854776", invalid("expire")),
        ("PEXPIRE k 9223372036854775807", invalid("pexpire")),
        ("EXPIREAT k 9223372036854775807", invalid("expireat")),
        ("EXPIREAT k 9223372036854776", invalid("expireat")),
        ("expire k", arity("expire")),
        ("PEXPIREAT k", arity("pexpireat")),
        ("TTL", arity("ttl")),
        ("EXPIRETIME", arity("expiretime")),
        ("PERSIST a b", arity("persist")),
    ] {
        c.check(line, &reply);
    }
    // PEXPIREAT takes the largest time there is; the key keeps its value.
    c.check("PEXPIREAT k 9223372036854775807", ":1\r\n");
    c.check("GET k", "$1\r\nv\r\n");
}

#[test]
fn persist() {
    let mut c = conn();
    c.check("PERSIST nokey", ":0\r\n");
    c.check("SET k v", OK);
    c.check("PERSIST k", ":0\r\n");
    c.check("EXPIRE k 10", ":1\r\n");
    c.check("PERSIST k", ":1\r\n");
    c.check("TTL k", ":-1\r\n");
    c.check("PERSIST k", ":0\r\n");
    c.at(20_000);
    c.check("GET k", "$1\r\nv\r\n");
    // Too late once expired.
    c.check("SET j v PX 5", OK);
    c.at(20_005);
    c.check("PERSIST j", ":0\r\n");
    c.check("EXISTS j", ":0\r\n");
}

#[test]
fn getex() {
    let mut c = conn();
    c.check("GETEX nokey", NIL);
    // A missing key answers nil before its time is checked.
    c.check("GETEX nokey EX 0", NIL);
    c.check("GETEX nokey EX x", NIL);
    c.check("SET k v", OK);
    c.check("GETEX k", "$1\r\nv\r\n");
    c.check("TTL k", ":-1\r\n");
    c.check("GETEX k EX 10", "$1\r\nv\r\n");
    c.check("TTL k", ":10\r\n");
    c.check("GETEX k PX 5000", "$1\r\nv\r\n");
    c.check("PTTL k", ":5000\r\n");
    c.check("GETEX k", "$1\r\nv\r\n");
    c.check("PTTL k", ":5000\r\n");
    c.check("GETEX k EXAT 1700000100", "$1\r\nv\r\n");
    c.check("TTL k", ":100\r\n");
    c.check("GETEX k PXAT 1700000000300", "$1\r\nv\r\n");
    c.check("PTTL k", ":300\r\n");
    c.check("GETEX k EX 5 EX 6", "$1\r\nv\r\n");
    c.check("TTL k", ":6\r\n");
    c.check("GETEX k PERSIST", "$1\r\nv\r\n");
    c.check("TTL k", ":-1\r\n");
    c.check("GETEX k PERSIST PERSIST", "$1\r\nv\r\n");
    c.check("TTL k", ":-1\r\n");
    // An absolute time already past: the value, and the key deleted.
    c.check("GETEX k EXAT 1", "$1\r\nv\r\n");
    c.check("EXISTS k", ":0\r\n");
    c.check("SET k v", OK);
    c.check("GETEX k PXAT 1700000000000", "$1\r\nv\r\n");
    c.check("EXISTS k", ":0\r\n");
    c.check("SET k v EX 1", OK);
    c.at(1_000);
    c.check("GETEX k PERSIST", NIL);
    c.check("SET k v", OK);
    let (invalid, syntax) = (&invalid("getex")[..], SYNTAX);
    for (line, reply) in [
        ("GETEX k EX 0", invalid),
        ("GETEX k PX -1", invalid),
        ("GETEX k EXAT 9223372036854776", invalid),
        ("GETEX k EX 9223372036854776", invalid),
        ("GETEX k EX x", NOT_INT),
        ("GETEX k KEEPTTL", syntax),
        ("GETEX k NX", syntax),
        ("GETEX k GET", syntax),
        ("GETEX k PERSIST EX 5", syntax),
        ("GETEX k EX 5 PERSIST", syntax),
        ("GETEX k EX 5 PX 5", syntax),
        ("GETEX k EX", syntax),
        ("GETEX nokey NX", syntax),
        ("GETEX", &arity("getex")),
    ] {
        c.check(line, reply);
    }
    c.check("TTL k", ":-1\r\n");
}

#[test]
fn setex_psetex() {
    let mut c = conn();
    c.check("SETEX k 10 v", OK);
    c.check("GET k", "$1\r\nv\r\n");
    c.check("PTTL k", ":10000\r\n");
    c.check("PSETEX k 1500 w", OK);
    c.check("TTL k", ":2\r\n");
    c.at(1_500);
    c.check("GET k", NIL);
    for (line, reply) in [
        ("SETEX k 0 v", invalid("setex")),
        ("SETEX k -1 v", invalid("setex")),
        ("SETEX k 9223372036854776 v", invalid("setex")),
        ("PSETEX k 0 v", invalid("psetex")),
        ("PSETEX k 9223372036854775807 v", invalid("psetex")),
        ("SETEX k x v", NOT_INT.into()),
        ("SETEX k 10", arity("setex")),
        ("PSETEX k 10 v x", arity("psetex")),
    ] {
        c.check(line, &reply);
    }
    c.check("EXISTS k", ":0\r\n");
}

#[test]
fn rename_keeps_the_deadline() {
    let mut c = conn();
    c.check("SET a 1 EX 100", OK);
    c.check("RENAME a b", OK);
    c.check("TTL b", ":100\r\n");
    c.check("TTL a", ":-2\r\n");
    // The destination's own deadline goes with its old value.
    c.check("SET c 1 EX 50", OK);
    c.check("SET d 1", OK);
    c.check("RENAME d c", OK);
    c.check("TTL c", ":-1\r\n");
    c.check("RENAME b b", OK);
    c.check("TTL b", ":100\r\n");
    // An expired source is missing.
    c.at(100_000);
    c.check("RENAME b e", "-ERR no such key\r\n");
    c.check("RENAME b b", "-ERR no such key\r\n");
    c.check("EXISTS e", ":0\r\n");
}

#[test]
fn expiry_in_transactions() {
    let mut c = conn();
    c.check("SET k v", OK);
    c.check("MULTI", OK);
    c.check("EXPIRE k 10", "+QUEUED\r\n");
    c.check("TTL k", "+QUEUED\r\n");
    c.check("SETEX j 5 x", "+QUEUED\r\n");
    c.check("GETEX j PERSIST", "+QUEUED\r\n");
    c.check("TTL j", "+QUEUED\r\n");
    c.check("EXEC", "*5\r\n:1\r\n:10\r\n+OK\r\n$1\r\nx\r\n:-1\r\n");
    // A watched key that expires meanwhile makes EXEC fail, as in Redis 7.
    c.check("WATCH k", OK);
    c.at(10_000);
    c.check("MULTI", OK);
    c.check("SET x 1", "+QUEUED\r\n");
    c.check("EXEC", "*-1\r\n");
}

#[test]
fn command_table_lists_the_expiry_commands() {
    let mut c = conn();
    c.check(
        "COMMAND INFO getex setex pexpiretime",
        "*3\r\n\
         *10\r\n$5\r\ngetex\r\n:-2\r\n*2\r\n+write\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n\
         *10\r\n$5\r\nsetex\r\n:4\r\n*2\r\n+write\r\n+denyoom\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n\
         *10\r\n$11\r\npexpiretime\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*0\r\n",
    );
    let all = c.run("COMMAND");
    assert!(all.starts_with(&format!("*{}\r\n", crate::command::COMMANDS.len())));
    for name in ["psetex", "expiretime", "getex", "persist", "pexpireat"] {
        assert!(all.contains(&format!("\r\n{name}\r\n")), "{name}");
    }
}

#[test]
fn store_hides_expired_keys_everywhere() {
    let s = MemStore::default();
    s.set_clock_ms(Some(T0));
    let b = |x: &str| Bytes::from(x.to_string());
    futures_lite(async {
        for (i, k) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            // b and d expire at T0 + 10, the others never.
            let at = if i % 2 == 1 { T0 + 10 } else { 0 };
            assert!(
                s.put(0, Put::new(k.as_bytes(), b"v").expiring_at(at))
                    .await
                    .unwrap()
            );
        }
        // A SCAN begun before the expiry: the walk goes on where it was.
        let first = s.scan(0, 0, 2).await.unwrap();
        assert_eq!(first.keys, [b("a"), b("b")]);
        s.set_clock_ms(Some(T0 + 10));
        let second = s.scan(0, first.cursor, 2).await.unwrap();
        assert_eq!(second.keys, [b("c")]);
        let third = s.scan(0, second.cursor, 2).await.unwrap();
        assert_eq!((third.keys, third.cursor), (vec![b("e")], 0));
        assert_eq!(s.dbsize(0).await.unwrap(), 3);
        let version = s.get(0, b"a").await.unwrap().unwrap().version;
        assert!(s.get(0, b"b").await.unwrap().is_none());
        assert_eq!(
            s.mget(0, &[b("b"), b("c")]).await.unwrap(),
            [None, Some(b("v"))]
        );
        // Conditions see an expired key as absent.
        assert!(
            !s.put(0, Put::new(b"b", b"x").when(Cond::Present))
                .await
                .unwrap()
        );
        assert!(!s.del(0, b"d", Cond::Always).await.unwrap());
        assert!(
            !s.mset_absent(0, &[(b("d"), b("1")), (b("a"), b("1"))])
                .await
                .unwrap()
        );
        assert!(s.mset_absent(0, &[(b("d"), b("1"))]).await.unwrap());
        assert!(!s.rename(0, b"b", b"z").await.unwrap());
        assert!(
            s.put(
                0,
                Put::new(b"b", b"x").when(Cond::Absent).expiring_at(T0 + 20)
            )
            .await
            .unwrap()
        );
        assert!(
            s.put(
                0,
                Put::new(b"a", b"y")
                    .when(Cond::Version(version))
                    .expiring_at(T0 + 15)
            )
            .await
            .unwrap()
        );
        assert!(s.rename(0, b"a", b"r").await.unwrap());
        let moved = s.get(0, b"r").await.unwrap().unwrap();
        assert_eq!(moved.expires_at_ms, T0 + 15);
        let version = moved.version;
        s.set_clock_ms(Some(T0 + 15));
        // A version read before the key expired no longer matches.
        assert!(
            !s.put(0, Put::new(b"r", b"z").when(Cond::Version(version)))
                .await
                .unwrap()
        );
        assert!(s.get(0, b"r").await.unwrap().is_none());
        assert_eq!(s.dbsize(0).await.unwrap(), 4);
    });
}
