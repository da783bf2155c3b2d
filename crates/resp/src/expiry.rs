//! Key expiry: the time options of `SET` and `GETEX` and the deadlines they
//! name, and the commands `EXPIRE PEXPIRE EXPIREAT PEXPIREAT TTL PTTL
//! EXPIRETIME PEXPIRETIME PERSIST GETEX`.
//!
//! A deadline is an absolute time in Unix milliseconds of the store's clock
//! (`Store::now_ms`), 0 for none; the store hides a key once it is past.
//! Changing a key's deadline rewrites its value on the version read (as the
//! other read-modify-write commands do), retried on a lost race.

use bytes::Bytes;

use crate::exec::{Ctx, errors, parse_i64, refuse};
use crate::store::{Cond, Put, Store, StoreError};
use crate::strings::{MAX_CAS_ATTEMPTS, contention};

/// How a time argument counts (`EX`, `PX`, `EXAT`, `PXAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Seconds from now.
    Ex,
    /// Milliseconds from now.
    Px,
    /// A Unix time in seconds.
    ExAt,
    /// A Unix time in milliseconds.
    PxAt,
}

impl Unit {
    fn seconds(self) -> bool {
        matches!(self, Unit::Ex | Unit::ExAt)
    }

    fn relative(self) -> bool {
        matches!(self, Unit::Ex | Unit::Px)
    }

    fn named(opt: &[u8]) -> Option<Unit> {
        [
            (&b"EX"[..], Unit::Ex),
            (b"PX", Unit::Px),
            (b"EXAT", Unit::ExAt),
            (b"PXAT", Unit::PxAt),
        ]
        .into_iter()
        .find(|(name, _)| opt.eq_ignore_ascii_case(name))
        .map(|(_, unit)| unit)
    }
}

/// What the options of `SET` (after key and value) or `GETEX` (after the
/// key) asked for.
#[derive(Debug, Default)]
pub(crate) struct StringOptions {
    pub nx: bool,
    pub xx: bool,
    pub get: bool,
    pub keep_ttl: bool,
    pub persist: bool,
    /// The time option and its argument, not yet checked (Redis checks the
    /// number only once every option parsed: a syntax error comes first).
    pub expire: Option<(Unit, Bytes)>,
}

/// Parse `SET`'s options (`set`) or `GETEX`'s, accepting exactly what
/// Redis's `parseExtendedStringArgumentsOrReply` does: an option may be
/// repeated (the last time wins) but not combined with a conflicting one.
pub(crate) fn string_options(a: &[Bytes], set: bool) -> Result<StringOptions, &'static str> {
    let mut o = StringOptions::default();
    let mut i = 0;
    while i < a.len() {
        let opt = &a[i][..];
        let is = |name: &[u8]| opt.eq_ignore_ascii_case(name);
        if set && is(b"NX") && !o.xx {
            o.nx = true;
        } else if set && is(b"XX") && !o.nx {
            o.xx = true;
        } else if set && is(b"GET") {
            o.get = true;
        } else if set && is(b"KEEPTTL") && o.expire.is_none() {
            o.keep_ttl = true;
        } else if !set && is(b"PERSIST") && o.expire.is_none() {
            o.persist = true;
        } else if let Some(unit) = Unit::named(opt)
            && !o.keep_ttl
            && !o.persist
            && o.expire.as_ref().is_none_or(|(u, _)| *u == unit)
            && i + 1 < a.len()
        {
            o.expire = Some((unit, a[i + 1].clone()));
            i += 1;
        } else {
            return Err(errors::SYNTAX);
        }
        i += 1;
    }
    Ok(o)
}

/// `ERR invalid expire time in '<command>' command`.
fn invalid_expire(command: &str) -> String {
    format!("ERR invalid expire time in '{command}' command")
}

/// The clock as Redis's signed milliseconds (a clock past `i64::MAX` ms,
/// some 292 million years, saturates).
fn signed(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// The deadline a `SET`/`SETEX`/`PSETEX`/`GETEX` time argument names, as
/// Redis's `getExpireMillisecondsOrReply` reads it: a positive integer
/// whose deadline fits in a signed 64-bit count of milliseconds. It may be
/// in the past (`EXAT 1`): the key is then written already expired.
pub(crate) fn deadline(now_ms: u64, unit: Unit, arg: &[u8], command: &str) -> Result<u64, String> {
    let n = parse_i64(arg).ok_or(errors::NOT_INTEGER)?;
    if n <= 0 {
        return Err(invalid_expire(command));
    }
    let ms = if unit.seconds() {
        n.checked_mul(1000)
    } else {
        Some(n)
    };
    let at = match ms {
        Some(ms) if unit.relative() => ms.checked_add(signed(now_ms)),
        other => other,
    };
    // Positive: n > 0 and the clock is not negative.
    at.map(|at| at as u64)
        .ok_or_else(|| invalid_expire(command))
}

/// The conditions of `EXPIRE` and friends.
#[derive(Default)]
struct ExpireFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

/// `EXPIRE`'s options, with Redis 7's errors (checked before the time).
fn expire_flags(a: &[Bytes]) -> Result<ExpireFlags, String> {
    let mut f = ExpireFlags::default();
    for opt in a {
        let flag = match opt.to_ascii_lowercase().as_slice() {
            b"nx" => &mut f.nx,
            b"xx" => &mut f.xx,
            b"gt" => &mut f.gt,
            b"lt" => &mut f.lt,
            _ => {
                // Redis prints the option as a C string: it ends at a NUL.
                let shown = opt.split(|&b| b == 0).next().unwrap_or_default();
                return Err(format!(
                    "ERR Unsupported option {}",
                    String::from_utf8_lossy(shown)
                ));
            }
        };
        *flag = true;
    }
    if f.nx && (f.xx || f.gt || f.lt) {
        return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
    }
    if f.gt && f.lt {
        return Err("ERR GT and LT options at the same time are not compatible".into());
    }
    Ok(f)
}

/// Handle `name` if it is an expiry command; false if it is not one.
pub async fn run<S: Store>(
    ctx: &mut Ctx<'_, S>,
    name: &str,
    a: &[Bytes],
) -> Result<bool, StoreError> {
    match name {
        "expire" | "pexpire" | "expireat" | "pexpireat" => expire(ctx, name, a).await?,
        "ttl" | "pttl" | "expiretime" | "pexpiretime" => {
            let now = signed(ctx.store.now_ms());
            let v = ctx.store.get(ctx.session.db, &a[0]).await?;
            let reply = match v {
                None => -2,
                Some(v) if v.expires_at_ms == 0 => -1,
                Some(v) => {
                    let at = signed(v.expires_at_ms);
                    let ms = match name {
                        "expiretime" | "pexpiretime" => at,
                        _ => at.saturating_sub(now).max(0),
                    };
                    match name {
                        "pttl" | "pexpiretime" => ms,
                        _ => rounded_seconds(ms),
                    }
                }
            };
            ctx.out.int(reply);
        }
        "persist" => persist(ctx, &a[0]).await?,
        "getex" => getex(ctx, a).await?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// Milliseconds to the nearest second, halves up, as Redis's `TTL` and
/// `EXPIRETIME` give them. Wide, so a deadline near `i64::MAX` ms does not
/// overflow (Redis 7 answers 9223372036854776 for it, not a wrapped value).
fn rounded_seconds(ms: i64) -> i64 {
    ((i128::from(ms) + 500) / 1000) as i64
}

/// `EXPIRE key time [NX|XX|GT|LT]` and `PEXPIRE`, `EXPIREAT`, `PEXPIREAT`.
async fn expire<S: Store>(ctx: &mut Ctx<'_, S>, name: &str, a: &[Bytes]) -> Result<(), StoreError> {
    let (db, store) = (ctx.session.db, ctx.store);
    // Redis's order: the options, then the number, then its range, and
    // only then whether the key exists.
    let f = match expire_flags(&a[2..]) {
        Ok(f) => f,
        Err(e) => return refuse(&mut ctx.out, &e),
    };
    let Some(n) = parse_i64(&a[1]) else {
        return refuse(&mut ctx.out, errors::NOT_INTEGER);
    };
    let now = signed(store.now_ms());
    let (seconds, base) = match name {
        "expire" => (true, now),
        "pexpire" => (false, now),
        "expireat" => (true, 0),
        _ => (false, 0),
    };
    let ms = if seconds {
        n.checked_mul(1000)
    } else {
        Some(n)
    };
    // A negative time is allowed (the key is deleted); only overflow is not.
    let Some(when) = ms.and_then(|ms| ms.checked_add(base)) else {
        return refuse(&mut ctx.out, &invalid_expire(name));
    };
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Some(old) = store.get(db, &a[0]).await? else {
            ctx.out.int(0);
            return Ok(());
        };
        // None: no deadline, which GT and LT count as infinitely far.
        let current = (old.expires_at_ms != 0).then(|| signed(old.expires_at_ms));
        let refused = (f.nx && current.is_some())
            || (f.xx && current.is_none())
            || (f.gt && current.is_none_or(|c| when <= c))
            || (f.lt && current.is_some_and(|c| when >= c));
        if refused {
            ctx.out.int(0);
            return Ok(());
        }
        let cond = Cond::Version(old.version);
        let done = if when <= now {
            // Already past: Redis deletes the key at once.
            store.del(db, &a[0], cond).await?
        } else {
            // when > now >= 0, so positive.
            store
                .put(
                    db,
                    Put::new(&a[0], &old.value)
                        .when(cond)
                        .expiring_at(when as u64),
                )
                .await?
        };
        if done {
            ctx.out.int(1);
            return Ok(());
        }
    }
    Err(contention())
}

/// `PERSIST key`: 1 if a deadline was removed.
async fn persist<S: Store>(ctx: &mut Ctx<'_, S>, key: &[u8]) -> Result<(), StoreError> {
    let (db, store) = (ctx.session.db, ctx.store);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let old = match store.get(db, key).await? {
            Some(v) if v.expires_at_ms != 0 => v,
            _ => {
                ctx.out.int(0);
                return Ok(());
            }
        };
        let cond = Cond::Version(old.version);
        if store.put(db, Put::new(key, &old.value).when(cond)).await? {
            ctx.out.int(1);
            return Ok(());
        }
    }
    Err(contention())
}

/// `GETEX key [EX s|PX ms|EXAT s|PXAT ms|PERSIST]`: the value, and the
/// deadline set or removed.
async fn getex<S: Store>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) -> Result<(), StoreError> {
    let (db, store) = (ctx.session.db, ctx.store);
    let o = match string_options(&a[1..], false) {
        Ok(o) => o,
        Err(e) => return refuse(&mut ctx.out, e),
    };
    let now = store.now_ms();
    for _ in 0..MAX_CAS_ATTEMPTS {
        // Redis looks the key up before checking the time: a missing key
        // answers nil even with a bad time.
        let Some(old) = store.get(db, &a[0]).await? else {
            ctx.out.null();
            return Ok(());
        };
        let cond = Cond::Version(old.version);
        let done = match &o.expire {
            Some((unit, arg)) => match deadline(now, *unit, arg, "getex") {
                Err(e) => return refuse(&mut ctx.out, &e),
                // An EXAT/PXAT already past deletes the key, as in Redis.
                Ok(at) if at <= now => store.del(db, &a[0], cond).await?,
                Ok(at) => {
                    store
                        .put(db, Put::new(&a[0], &old.value).when(cond).expiring_at(at))
                        .await?
                }
            },
            None if o.persist && old.expires_at_ms != 0 => {
                store
                    .put(db, Put::new(&a[0], &old.value).when(cond))
                    .await?
            }
            // Nothing to change: a plain read.
            None => true,
        };
        if done {
            ctx.out.bulk(&old.value);
            return Ok(());
        }
    }
    Err(contention())
}
