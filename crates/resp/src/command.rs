//! The command table: every command this port answers, its arity as Redis
//! declares it (n: exactly n arguments with the name; -n: at least n), and
//! whether it runs before authentication. `COMMAND` describes this table.

/// One command's static description.
pub struct CommandInfo {
    /// Lower case, as Redis names it in errors and in `COMMAND`.
    pub name: &'static str,
    /// The `kind` label of its request metrics (`resp_get`, ...).
    pub metric: &'static str,
    pub arity: i32,
    /// Allowed before `AUTH` (Redis's `no-auth` flag).
    pub no_auth: bool,
    /// Flags reported by `COMMAND` (`write`, `readonly`, `fast`, ...).
    pub flags: &'static [&'static str],
    /// Positions of the first and last key and the step (0: no keys; -1 as
    /// the last: to the end), as `COMMAND` reports them.
    pub keys: (i32, i32, i32),
}

const fn c(
    name: &'static str,
    metric: &'static str,
    arity: i32,
    flags: &'static [&'static str],
    keys: (i32, i32, i32),
) -> CommandInfo {
    CommandInfo {
        name,
        metric,
        arity,
        no_auth: false,
        flags,
        keys,
    }
}

const fn open(
    name: &'static str,
    metric: &'static str,
    arity: i32,
    flags: &'static [&'static str],
) -> CommandInfo {
    CommandInfo {
        name,
        metric,
        arity,
        no_auth: true,
        flags,
        keys: (0, 0, 0),
    }
}

const R: &[&str] = &["readonly", "fast"];
const W: &[&str] = &["write", "denyoom", "fast"];
const WS: &[&str] = &["write"];
const A: &[&str] = &["fast"];

/// Every command answered, with Redis 7's arity, flags and key positions.
pub const COMMANDS: &[CommandInfo] = &[
    // Not open: Redis 7 answers an unauthenticated PING with NOAUTH.
    c("ping", "resp_ping", -1, A, (0, 0, 0)),
    c("echo", "resp_echo", 2, A, (0, 0, 0)),
    open("hello", "resp_hello", -1, A),
    open("auth", "resp_auth", -2, A),
    c("select", "resp_select", 2, A, (0, 0, 0)),
    open("quit", "resp_quit", -1, A),
    c(
        "command",
        "resp_command",
        -1,
        &["loading", "stale"],
        (0, 0, 0),
    ),
    c(
        "client",
        "resp_client",
        -2,
        &["loading", "stale"],
        (0, 0, 0),
    ),
    c("info", "resp_info", -1, &["loading", "stale"], (0, 0, 0)),
    c(
        "config",
        "resp_config",
        -2,
        &["admin", "loading", "stale"],
        (0, 0, 0),
    ),
    c(
        "cluster",
        "resp_cluster",
        -2,
        &["loading", "stale"],
        (0, 0, 0),
    ),
    c(
        "readonly",
        "resp_readonly",
        1,
        &["loading", "stale", "fast"],
        (0, 0, 0),
    ),
    c(
        "readwrite",
        "resp_readwrite",
        1,
        &["loading", "stale", "fast"],
        (0, 0, 0),
    ),
    c("asking", "resp_asking", 1, &["fast"], (0, 0, 0)),
    c("dbsize", "resp_dbsize", 1, R, (0, 0, 0)),
    c("flushdb", "resp_flushdb", -1, WS, (0, 0, 0)),
    c("flushall", "resp_flushall", -1, WS, (0, 0, 0)),
    c("get", "resp_get", 2, R, (1, 1, 1)),
    c("set", "resp_set", -3, &["write", "denyoom"], (1, 1, 1)),
    c("setnx", "resp_setnx", 3, W, (1, 1, 1)),
    c("setex", "resp_setex", 4, &["write", "denyoom"], (1, 1, 1)),
    c("psetex", "resp_psetex", 4, &["write", "denyoom"], (1, 1, 1)),
    c("getex", "resp_getex", -2, &["write", "fast"], (1, 1, 1)),
    c("getset", "resp_getset", 3, W, (1, 1, 1)),
    c("getdel", "resp_getdel", 2, &["write", "fast"], (1, 1, 1)),
    c("mget", "resp_mget", -2, R, (1, -1, 1)),
    c("mset", "resp_mset", -3, &["write", "denyoom"], (1, -1, 2)),
    c(
        "msetnx",
        "resp_msetnx",
        -3,
        &["write", "denyoom"],
        (1, -1, 2),
    ),
    c("incr", "resp_incr", 2, W, (1, 1, 1)),
    c("incrby", "resp_incrby", 3, W, (1, 1, 1)),
    c("decr", "resp_decr", 2, W, (1, 1, 1)),
    c("decrby", "resp_decrby", 3, W, (1, 1, 1)),
    c("incrbyfloat", "resp_incrbyfloat", 3, W, (1, 1, 1)),
    c("append", "resp_append", 3, W, (1, 1, 1)),
    c("strlen", "resp_strlen", 2, R, (1, 1, 1)),
    c("getrange", "resp_getrange", 4, &["readonly"], (1, 1, 1)),
    c(
        "setrange",
        "resp_setrange",
        4,
        &["write", "denyoom"],
        (1, 1, 1),
    ),
    c("del", "resp_del", -2, WS, (1, -1, 1)),
    c("unlink", "resp_unlink", -2, &["write", "fast"], (1, -1, 1)),
    c("exists", "resp_exists", -2, R, (1, -1, 1)),
    c("type", "resp_type", 2, R, (1, 1, 1)),
    c("scan", "resp_scan", -2, &["readonly"], (0, 0, 0)),
    c("rename", "resp_rename", 3, WS, (1, 2, 1)),
    c("expire", "resp_expire", -3, &["write", "fast"], (1, 1, 1)),
    c("pexpire", "resp_pexpire", -3, &["write", "fast"], (1, 1, 1)),
    c(
        "expireat",
        "resp_expireat",
        -3,
        &["write", "fast"],
        (1, 1, 1),
    ),
    c(
        "pexpireat",
        "resp_pexpireat",
        -3,
        &["write", "fast"],
        (1, 1, 1),
    ),
    c("ttl", "resp_ttl", 2, R, (1, 1, 1)),
    c("pttl", "resp_pttl", 2, R, (1, 1, 1)),
    c("expiretime", "resp_expiretime", 2, R, (1, 1, 1)),
    c("pexpiretime", "resp_pexpiretime", 2, R, (1, 1, 1)),
    c("persist", "resp_persist", 2, &["write", "fast"], (1, 1, 1)),
    c("multi", "resp_multi", 1, A, (0, 0, 0)),
    c("exec", "resp_exec", 1, &[], (0, 0, 0)),
    c("discard", "resp_discard", 1, A, (0, 0, 0)),
    c("watch", "resp_watch", -2, A, (1, -1, 1)),
    c("unwatch", "resp_unwatch", 1, A, (0, 0, 0)),
];

/// The command named `name` (any case), if answered here.
pub fn lookup(name: &[u8]) -> Option<&'static CommandInfo> {
    if name.len() > 16 {
        return None;
    }
    let mut lower = [0u8; 16];
    let lower = &mut lower[..name.len()];
    lower.copy_from_slice(name);
    lower.make_ascii_lowercase();
    COMMANDS.iter().find(|c| c.name.as_bytes() == lower)
}

impl CommandInfo {
    /// The keys among `args` (the name first), by `keys`' positions: what
    /// `exec::prefetch` hints. Positions past `args` are skipped (the
    /// arity is checked later, when the command runs).
    pub fn key_args<'a>(&self, args: &'a [bytes::Bytes]) -> impl Iterator<Item = &'a [u8]> {
        let (first, last, step) = self.keys;
        let first = usize::try_from(first).unwrap_or(0);
        let end = match last {
            -1 => args.len(),
            l => usize::try_from(l).map_or(0, |l| l.saturating_add(1).min(args.len())),
        };
        let (start, step) = match (first, usize::try_from(step)) {
            (1.., Ok(step @ 1..)) => (first, step),
            _ => (end, 1), // no keys
        };
        args.get(start..end)
            .unwrap_or(&[])
            .iter()
            .step_by(step)
            .map(|a| &a[..])
    }

    /// Whether `argc` arguments (name included) fit the arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        let argc = argc as i64;
        let arity = self.arity as i64;
        if arity >= 0 {
            argc == arity
        } else {
            argc >= -arity
        }
    }
}

#[cfg(test)]
mod tests {
    use super::lookup;
    use bytes::Bytes;

    fn keys_of(line: &str) -> Vec<String> {
        let args: Vec<Bytes> = line
            .split(' ')
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect();
        let info = lookup(&args[0]).expect("a known command");
        info.key_args(&args)
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect()
    }

    /// What `exec::prefetch` hints: the keys by the positions `COMMAND`
    /// reports, never a value or an option, and nothing past the arguments
    /// given (a short command is refused later, when it runs).
    #[test]
    fn key_args_are_the_keys_and_only_them() {
        assert_eq!(keys_of("GET k"), ["k"]);
        assert_eq!(keys_of("SET k v EX 10"), ["k"]);
        assert_eq!(keys_of("MGET a b c"), ["a", "b", "c"]);
        assert_eq!(keys_of("MSET a 1 b 2"), ["a", "b"]);
        assert_eq!(keys_of("DEL a b"), ["a", "b"]);
        assert_eq!(keys_of("RENAME a b"), ["a", "b"]);
        assert!(keys_of("PING hello").is_empty());
        assert!(keys_of("SELECT 1").is_empty());
        assert!(keys_of("GET").is_empty());
        assert!(keys_of("MSET").is_empty());
    }
}
