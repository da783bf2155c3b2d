//! Running one command: look it up, check its arity and the connection's
//! authentication (in Redis's order: unknown command, then arity, then
//! `NOAUTH`), then answer it. Connection and server commands are here; data
//! commands in `strings.rs`, `expiry.rs` and `keys.rs`.

use bytes::{Bytes, BytesMut};

use crate::command::{COMMANDS, CommandInfo, lookup};
use crate::reply::{Out, Proto};
use crate::session::{Session, Settings};
use crate::store::{ExpiringKeys, Store, StoreError, Transactional};

/// The version of Redis whose replies this port reproduces (what `INFO`
/// and `HELLO` report as `redis_version` / `version`).
pub const REDIS_VERSION: &str = "7.0.0";

/// Error texts a client may test for, exactly as Redis writes them.
pub mod errors {
    pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
    pub const NOT_FLOAT: &str = "ERR value is not a valid float";
    pub const SYNTAX: &str = "ERR syntax error";
    pub const NOAUTH: &str = "NOAUTH Authentication required.";
    pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
    pub const OVERFLOW: &str = "ERR increment or decrement would overflow";
    pub const NO_SUCH_KEY: &str = "ERR no such key";
    pub const TOO_BIG: &str = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";
    pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
}

/// Everything a command handler needs.
pub struct Ctx<'a, S> {
    pub store: &'a S,
    pub settings: &'a Settings,
    pub session: &'a mut Session,
    pub out: Out<'a>,
}

/// Run `args` (the command name first) and write its reply. An empty
/// command writes nothing, as in Redis. Commands after `MULTI` are queued
/// (`multi.rs`) and run at `EXEC` in one transaction of `store`. Returns
/// the command run (None: unknown or empty), for metrics.
/// Let the store start loading what the commands of a pipelined batch will
/// look up, before the first of them runs (`Store::prefetch`). Why: each
/// lookup of a key in a large keyspace waits for memory twice (the index
/// slot, then the entry it points at); run one after another, a batch of 16
/// pays 32 waits in series, and with every entry already on its way they
/// overlap. Nothing is decided here: unknown commands and bad arities are
/// skipped, and each command is checked as usual when it runs.
pub fn prefetch<S: Store>(store: &S, session: &Session, batch: &[Vec<Bytes>]) {
    if batch.len() < 2 {
        return; // nothing to overlap with
    }
    // On the stack: this runs for every pipelined read of a connection.
    let mut keys: [&[u8]; PREFETCH_KEYS] = [&[]; PREFETCH_KEYS];
    let mut n = 0;
    'batch: for args in batch {
        if let Some(info) = args.first().and_then(|name| lookup(name)) {
            for key in info.key_args(args) {
                if n == PREFETCH_KEYS {
                    break 'batch;
                }
                keys[n] = key;
                n += 1;
            }
        }
    }
    store.prefetch(session.db, &keys[..n]);
}

/// Most keys of one batch hinted (an `MSET` of many keys hints its first).
const PREFETCH_KEYS: usize = 64;

pub async fn execute<S: Transactional>(
    store: &S,
    settings: &Settings,
    session: &mut Session,
    args: &[Bytes],
    out: &mut BytesMut,
) -> Option<&'static CommandInfo> {
    if args.is_empty() {
        return None;
    }
    let proto = session.proto;
    let mut ctx = Ctx {
        store,
        settings,
        session,
        out: Out { buf: out, proto },
    };
    let Some(info) = check(&mut ctx, args) else {
        // A command refused while queueing dooms the transaction.
        if ctx.session.queued.is_some() {
            ctx.session.queue_failed = true;
        }
        return lookup(&args[0]);
    };
    if ctx.session.queued.is_some() && !crate::multi::runs_while_queueing(info.name) {
        crate::multi::queue(&mut ctx, args);
        return Some(info);
    }
    match crate::multi::run(&mut ctx, info, &args[1..]).await {
        Ok(true) => {}
        Ok(false) => run_command(&mut ctx, info, args).await,
        Err(e) => ctx.out.error(&format!("ERR {e}")),
    }
    Some(info)
}

/// Check and run one command on any store (inside `EXEC`: the transaction).
pub(crate) async fn run_checked<S: Store>(ctx: &mut Ctx<'_, S>, args: &[Bytes]) {
    if let Some(info) = check(ctx, args) {
        run_command(ctx, info, args).await;
    }
}

/// Look the command up and check its arity and the connection's
/// authentication, in Redis's order (unknown command, arity, `NOAUTH`);
/// None after replying with the refusal.
fn check<S>(ctx: &mut Ctx<'_, S>, args: &[Bytes]) -> Option<&'static CommandInfo> {
    let name = args.first()?;
    let Some(info) = lookup(name) else {
        let mut tail = String::new();
        for a in &args[1..] {
            if tail.len() >= 128 {
                break;
            }
            let room = 128 - tail.len();
            let text = String::from_utf8_lossy(a);
            let cut: String = text.chars().take(room).collect();
            tail.push_str(&format!("'{cut}' "));
        }
        let name = String::from_utf8_lossy(name);
        let name: String = name.chars().take(128).collect();
        ctx.out.error(&format!(
            "ERR unknown command '{name}', with args beginning with: {tail}"
        ));
        return None;
    };
    if !info.arity_ok(args.len()) {
        wrong_args(&mut ctx.out, info.name);
        return None;
    }
    if ctx.settings.auth.is_some() && !ctx.session.authenticated && !info.no_auth {
        ctx.out.error(errors::NOAUTH);
        return None;
    }
    Some(info)
}

async fn run_command<S: Store>(ctx: &mut Ctx<'_, S>, info: &CommandInfo, args: &[Bytes]) {
    match redirect(ctx, info, args).await {
        Ok(true) => return,
        Ok(false) => {}
        Err(e) => return ctx.out.error(&format!("ERR {e}")),
    }
    if let Err(e) = run(ctx, info, args).await {
        ctx.out.error(&format!("ERR {e}"));
    }
}

/// On a connection of a cluster client, a command whose first key another
/// node serves is answered `MOVED <slot> <ip:port>` (Redis Cluster's reply:
/// the client updates its layout and sends it there), and a multi-key
/// command whose keys are in different slots `CROSSSLOT`, as a Redis
/// Cluster node answers it (a cluster client splits such a request by
/// slot, or uses hash tags; sending it whole is the client's bug, which it
/// should see here as it would in production). A plain client's
/// multi-key command runs whatever its slots (forwarded).
async fn redirect<S: Store>(
    ctx: &mut Ctx<'_, S>,
    info: &CommandInfo,
    args: &[Bytes],
) -> Result<bool, StoreError> {
    let first = usize::try_from(info.keys.0).unwrap_or(0);
    if !ctx.session.cluster || first == 0 {
        return Ok(false);
    }
    let Some(key) = args.get(first) else {
        return Ok(false);
    };
    if !one_slot(info.keys, args) {
        ctx.out.error(errors::CROSSSLOT);
        return Ok(true);
    }
    match ctx.store.redirect(ctx.session.db, key).await? {
        Some(node) => {
            let slot = insitu_keyhash::key_slot(key);
            ctx.out.error(&format!("MOVED {slot} {node}"));
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Whether every key of `args` (positions `keys`, as `CommandInfo::keys`)
/// hashes to the first key's slot.
pub(crate) fn one_slot(keys: (i32, i32, i32), args: &[Bytes]) -> bool {
    let (Ok(first), Ok(step)) = (usize::try_from(keys.0), usize::try_from(keys.2)) else {
        return true;
    };
    // A negative last counts from the end (-1: the last argument).
    let last = match usize::try_from(keys.1) {
        Ok(last) => last.min(args.len().saturating_sub(1)),
        Err(_) => args.len().saturating_sub(keys.1.unsigned_abs() as usize),
    };
    // One key (every single-key command): nothing to compare, no hashing.
    if first == 0 || step == 0 || first >= args.len() || last < first + step {
        return true;
    }
    let slot = insitu_keyhash::key_slot(&args[first]);
    (first + step..=last)
        .step_by(step)
        .all(|i| insitu_keyhash::key_slot(&args[i]) == slot)
}

/// Reply with the error `text` (the command is done).
pub(crate) fn refuse(out: &mut Out<'_>, text: &str) -> Result<(), StoreError> {
    out.error(text);
    Ok(())
}

pub(crate) fn wrong_args(out: &mut Out<'_>, name: &str) {
    out.error(&format!(
        "ERR wrong number of arguments for '{name}' command"
    ));
}

async fn run<S: Store>(
    ctx: &mut Ctx<'_, S>,
    info: &CommandInfo,
    args: &[Bytes],
) -> Result<(), StoreError> {
    let a = &args[1..];
    match info.name {
        "ping" => ping(ctx, a),
        "echo" => ctx.out.bulk(&a[0]),
        "hello" => hello(ctx, a),
        "auth" => auth(ctx, a),
        "select" => select(ctx, a),
        "quit" => {
            ctx.session.closing = true;
            ctx.out.ok();
        }
        "command" => command(ctx, a),
        "client" => client(ctx, a),
        "info" => return info_cmd(ctx).await,
        "config" => config(ctx, a),
        "cluster" => return crate::cluster::cluster(ctx, a).await,
        // Only cluster clients send these. No node has replicas to read
        // from and no slot is ever half-moved (a tablet moves whole, and
        // every node forwards a key it does not serve), so they need no
        // state beyond marking the connection as a cluster client's.
        "readonly" | "readwrite" | "asking" => {
            ctx.session.cluster = true;
            ctx.out.ok();
        }
        // Handled by `execute` (`multi.rs`); never queued, so never here.
        "multi" | "exec" | "discard" | "watch" | "unwatch" => ctx.out.error(&format!(
            "ERR {} is not allowed here",
            info.name.to_uppercase()
        )),
        _ => {
            if crate::strings::run(ctx, info.name, a).await? {
                return Ok(());
            }
            if crate::expiry::run(ctx, info.name, a).await? {
                return Ok(());
            }
            crate::keys::run(ctx, info.name, a).await?;
        }
    }
    Ok(())
}

fn ping<S>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) {
    match a {
        [] => ctx.out.simple("PONG"),
        [msg] => ctx.out.bulk(msg),
        _ => wrong_args(&mut ctx.out, "ping"),
    }
}

fn check_password<S>(ctx: &mut Ctx<'_, S>, user: Option<&[u8]>, password: &[u8]) -> bool {
    let Some(check) = &ctx.settings.auth else {
        ctx.out.error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?");
        return false;
    };
    // One user, Redis's `default`: the cluster's client token is its password.
    let ok = user.is_none_or(|u| u == b"default") && check(password);
    ctx.session.authenticated |= ok;
    if !ok {
        ctx.out.error(errors::WRONGPASS);
    }
    ok
}

fn auth<S>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) {
    let ok = match a {
        [password] => check_password(ctx, None, password),
        [user, password] => check_password(ctx, Some(user), password),
        _ => return ctx.out.error(errors::SYNTAX),
    };
    if ok {
        ctx.out.ok();
    }
}

fn hello<S>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) {
    let mut proto = ctx.session.proto;
    let mut rest = a;
    if let Some(ver) = a.first() {
        match parse_i64(ver) {
            Some(2) => proto = Proto::Resp2,
            Some(3) => proto = Proto::Resp3,
            Some(_) => return ctx.out.error("NOPROTO unsupported protocol version"),
            None => {
                return ctx
                    .out
                    .error("ERR Protocol version is not an integer or out of range");
            }
        }
        rest = &a[1..];
    }
    let mut name = None;
    while let Some(opt) = rest.first() {
        if opt.eq_ignore_ascii_case(b"AUTH") && rest.len() >= 3 {
            if !check_password(ctx, Some(&rest[1]), &rest[2]) {
                return;
            }
            rest = &rest[3..];
        } else if opt.eq_ignore_ascii_case(b"SETNAME") && rest.len() >= 2 {
            name = Some(rest[1].clone());
            rest = &rest[2..];
        } else {
            let opt = String::from_utf8_lossy(opt);
            return ctx
                .out
                .error(&format!("ERR Syntax error in HELLO option '{opt}'"));
        }
    }
    if ctx.settings.auth.is_some() && !ctx.session.authenticated {
        return ctx.out.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    if let Some(name) = name {
        if !valid_client_name(&name) {
            return ctx.out.error(BAD_NAME);
        }
        ctx.session.name = Some(name);
    }
    ctx.session.proto = proto;
    ctx.out.proto = proto;
    let out = &mut ctx.out;
    out.map(7);
    out.bulk(b"server");
    out.bulk(b"insitu");
    out.bulk(b"version");
    out.bulk(REDIS_VERSION.as_bytes());
    out.bulk(b"proto");
    out.int(if proto == Proto::Resp3 { 3 } else { 2 });
    out.bulk(b"id");
    out.int(ctx.session.id as i64);
    out.bulk(b"mode");
    out.bulk(b"standalone");
    out.bulk(b"role");
    out.bulk(b"master");
    out.bulk(b"modules");
    out.array(0);
}

fn select<S>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) {
    match parse_i64(&a[0]) {
        None => ctx.out.error(errors::NOT_INTEGER),
        Some(db) if db < 0 || db >= ctx.settings.databases as i64 => {
            ctx.out.error("ERR DB index is out of range")
        }
        Some(db) => {
            ctx.session.db = db as u32;
            ctx.out.ok();
        }
    }
}

fn command<S>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) {
    let Some(sub) = a.first() else {
        ctx.out.array(COMMANDS.len());
        for info in COMMANDS {
            command_entry(&mut ctx.out, info);
        }
        return;
    };
    let sub = sub.to_ascii_lowercase();
    match (sub.as_slice(), a.len()) {
        (b"count", 1) => ctx.out.int(COMMANDS.len() as i64),
        // redis-cli asks for documentation to show hints; it has none to
        // show here, and an empty answer is valid.
        (b"docs", _) => ctx.out.map(0),
        (b"info", _) => {
            ctx.out.array(a.len() - 1);
            for name in &a[1..] {
                match lookup(name) {
                    Some(info) => command_entry(&mut ctx.out, info),
                    None => ctx.out.null_array(),
                }
            }
        }
        (b"count", _) => wrong_args(&mut ctx.out, "command|count"),
        _ => unknown_subcommand(&mut ctx.out, &a[0], "COMMAND"),
    }
}

/// One `COMMAND` entry, as Redis 7 lays it out (10 fields).
fn command_entry(out: &mut Out<'_>, info: &CommandInfo) {
    out.array(10);
    out.bulk(info.name.as_bytes());
    out.int(info.arity as i64);
    out.array(info.flags.len());
    for f in info.flags {
        out.simple(f);
    }
    out.int(info.keys.0 as i64);
    out.int(info.keys.1 as i64);
    out.int(info.keys.2 as i64);
    for _ in 0..4 {
        out.array(0); // ACL categories, tips, key specs, subcommands
    }
}

pub(crate) fn unknown_subcommand(out: &mut Out<'_>, sub: &[u8], command: &str) {
    let sub = String::from_utf8_lossy(sub);
    out.error(&format!(
        "ERR unknown subcommand '{sub}'. Try {command} HELP."
    ));
}

const BAD_NAME: &str = "ERR Client names cannot contain spaces, newlines or special characters.";

fn valid_client_name(name: &[u8]) -> bool {
    name.iter().all(|&b| (b'!'..=b'~').contains(&b))
}

fn client<S>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) {
    let sub = a[0].to_ascii_lowercase();
    match (sub.as_slice(), a.len()) {
        (b"setname", 2) => {
            if !valid_client_name(&a[1]) {
                return ctx.out.error(BAD_NAME);
            }
            ctx.session.name = (!a[1].is_empty()).then(|| a[1].clone());
            ctx.out.ok();
        }
        (b"getname", 1) => {
            let name = ctx.session.name.clone();
            ctx.out.bulk_or_null(name.as_deref())
        }
        (b"id", 1) => ctx.out.int(ctx.session.id as i64),
        // Client libraries announce themselves (redis-py 5 does); accepted.
        (b"setinfo", 3) => ctx.out.ok(),
        (b"setname" | b"getname" | b"id" | b"setinfo", _) => {
            let name = format!("client|{}", String::from_utf8_lossy(&sub));
            wrong_args(&mut ctx.out, &name)
        }
        _ => unknown_subcommand(&mut ctx.out, &a[0], "CLIENT"),
    }
}

/// The settings `CONFIG GET` reports (what redis-benchmark and client
/// libraries ask about); insitu's own flags set them.
fn config_values(settings: &Settings) -> Vec<(&'static str, String)> {
    vec![
        ("databases", settings.databases.to_string()),
        ("port", settings.port.to_string()),
        // Durability is by replication to backups, not Redis's snapshots
        // or append-only file: neither is configured.
        ("save", String::new()),
        ("appendonly", "no".into()),
        ("maxmemory", "0".into()),
    ]
}

fn config<S>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) {
    let sub = a[0].to_ascii_lowercase();
    if sub != b"get" {
        return unknown_subcommand(&mut ctx.out, &a[0], "CONFIG");
    }
    if a.len() < 2 {
        return wrong_args(&mut ctx.out, "config|get");
    }
    let all = config_values(ctx.settings);
    let hits: Vec<&(&str, String)> = all
        .iter()
        .filter(|(name, _)| {
            a[1..]
                .iter()
                .any(|p| crate::glob::matches(p, name.as_bytes(), true))
        })
        .collect();
    ctx.out.map(hits.len());
    for (name, value) in hits {
        ctx.out.bulk(name.as_bytes());
        ctx.out.bulk(value.as_bytes());
    }
}

async fn info_cmd<S: Store>(ctx: &mut Ctx<'_, S>) -> Result<(), StoreError> {
    let mut text = format!(
        "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:standalone\r\n\
         insitu_version:{}\r\nos:{}\r\narch_bits:64\r\ntcp_port:{}\r\n\r\n# Keyspace\r\n",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        ctx.settings.port
    );
    let keys = ctx.store.dbsize(ctx.session.db).await?;
    if keys > 0 {
        let expiring = ctx.store.expiring(ctx.session.db).await?;
        let (expires, avg_ttl) = expiry_fields(keys, expiring, ctx.store.now_ms());
        text.push_str(&format!(
            "db{}:keys={keys},expires={expires},avg_ttl={avg_ttl}\r\n",
            ctx.session.db
        ));
    }
    ctx.out.bulk(text.as_bytes());
    Ok(())
}

/// `INFO`'s `expires=` and `avg_ttl=` for a database of `keys` keys.
///
/// `expires`: the keys with a deadline (`Store::expiring`), at most `keys`.
/// The store may count a key whose deadline passed until it is removed (as
/// Redis's `expires=` does), which `keys` (`dbsize`) may not, and the two
/// are counted one after the other: the cap keeps Redis's `expires <= keys`.
///
/// `avg_ttl`: the mean of (deadline - `now_ms`) in ms over every key the
/// store counted (before the cap), a key past its deadline but not yet
/// removed counting with its negative rest; 0 if that mean is not positive
/// or nothing has a deadline. Exact, from the store's sum of deadlines;
/// Redis's own `avg_ttl` is an estimate its expiry cycle keeps from samples
/// (0 until the cycle has run).
pub(crate) fn expiry_fields(keys: u64, expiring: ExpiringKeys, now_ms: u64) -> (u64, u64) {
    if expiring.keys == 0 {
        return (0, 0);
    }
    let mean_deadline = expiring.deadline_sum_ms / u128::from(expiring.keys);
    let avg_ttl = mean_deadline.saturating_sub(u128::from(now_ms));
    (
        expiring.keys.min(keys),
        u64::try_from(avg_ttl).unwrap_or(u64::MAX),
    )
}

/// A Redis integer argument: decimal, optional '-', no '+', no spaces, no
/// leading zeros (as `string2ll` reads them).
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return None;
    }
    if bytes == b"-0" {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// A Redis float argument (`INCRBYFLOAT`): a decimal or exponent form, no
/// spaces, not NaN.
pub fn parse_f64(bytes: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(bytes).ok()?;
    if text.is_empty()
        || text.starts_with(char::is_whitespace)
        || text.ends_with(char::is_whitespace)
    {
        return None;
    }
    let x: f64 = text.parse().ok()?;
    (!x.is_nan()).then_some(x)
}
