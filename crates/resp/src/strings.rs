//! String commands: `GET SET SETNX SETEX PSETEX GETSET GETDEL MGET MSET
//! MSETNX INCR INCRBY DECR DECRBY INCRBYFLOAT APPEND STRLEN GETRANGE
//! SETRANGE`.
//!
//! Each read-modify-write is `get`, compute, `put` on condition of the
//! version read (or of absence), retried when another writer got there
//! first: atomic for its key like Redis's, without holding anything.
//!
//! Deadlines follow Redis: the commands that change a value in place
//! (`INCR`..., `APPEND`, `SETRANGE`) keep the key's deadline; those that
//! replace the value (`SET` without `KEEPTTL`, `GETSET`, `MSET`) drop it.

use bytes::Bytes;

use crate::exec::{Ctx, errors, parse_f64, parse_i64, refuse, wrong_args};
use crate::expiry::{Unit, deadline, string_options};
use crate::store::{Cond, Put, Store, StoreError, Versioned};

/// Compare-and-set attempts before giving up on a key under contention.
/// Each lost race means another write to the key succeeded, so the system
/// as a whole progresses; this only bounds one unlucky client.
pub(crate) const MAX_CAS_ATTEMPTS: u32 = 10_000;

/// The deadline a replaced value gets.
#[derive(Clone, Copy)]
enum Ttl {
    /// This one (0: none).
    At(u64),
    /// The key's current one (`SET ... KEEPTTL`).
    Keep,
}

/// Handle `name` if it is a string command; false if it is not one.
pub async fn run<S: Store>(
    ctx: &mut Ctx<'_, S>,
    name: &str,
    a: &[Bytes],
) -> Result<bool, StoreError> {
    let db = ctx.session.db;
    let store = ctx.store;
    match name {
        "get" => {
            let v = store.get(db, &a[0]).await?;
            ctx.out.bulk_or_null(v.as_ref().map(|v| &v.value[..]));
        }
        "set" => set(ctx, a).await?,
        "setnx" => {
            let done = store
                .put(db, Put::new(&a[0], &a[1]).when(Cond::Absent))
                .await?;
            ctx.out.int(done as i64);
        }
        "setex" | "psetex" => {
            let unit = if name == "setex" { Unit::Ex } else { Unit::Px };
            match deadline(store.now_ms(), unit, &a[1], name) {
                Ok(at) => {
                    store
                        .put(db, Put::new(&a[0], &a[2]).expiring_at(at))
                        .await?;
                    ctx.out.ok();
                }
                Err(e) => ctx.out.error(&e),
            }
        }
        "getset" => {
            let (old, _) = swap(store, db, &a[0], Some((&a[1], Ttl::At(0))), None).await?;
            ctx.out.bulk_or_null(old.as_ref().map(|v| &v.value[..]));
        }
        "getdel" => {
            let (old, _) = swap(store, db, &a[0], None, None).await?;
            ctx.out.bulk_or_null(old.as_ref().map(|v| &v.value[..]));
        }
        "mget" => {
            let values = store.mget(db, a).await?;
            ctx.out.array(values.len());
            for v in values {
                ctx.out.bulk_or_null(v.as_deref());
            }
        }
        "mset" | "msetnx" => {
            if !a.len().is_multiple_of(2) {
                wrong_args(&mut ctx.out, name);
                return Ok(true);
            }
            let pairs: Vec<(Bytes, Bytes)> = a
                .chunks_exact(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect();
            if name == "mset" {
                store.mset(db, &pairs).await?;
                ctx.out.ok();
            } else {
                let done = store.mset_absent(db, &pairs).await?;
                ctx.out.int(done as i64);
            }
        }
        "incr" | "decr" | "incrby" | "decrby" => {
            let by = match name {
                "incr" => 1,
                "decr" => -1,
                _ => match parse_i64(&a[1]) {
                    None => {
                        ctx.out.error(errors::NOT_INTEGER);
                        return Ok(true);
                    }
                    Some(i64::MIN) if name == "decrby" => {
                        ctx.out.error("ERR decrement would overflow");
                        return Ok(true);
                    }
                    Some(n) if name == "decrby" => -n,
                    Some(n) => n,
                },
            };
            match increment(store, db, &a[0], by).await? {
                Ok(n) => ctx.out.int(n),
                Err(e) => ctx.out.error(e),
            }
        }
        "incrbyfloat" => {
            let Some(by) = parse_f64(&a[1]) else {
                ctx.out.error(errors::NOT_FLOAT);
                return Ok(true);
            };
            let result = modify(store, db, &a[0], |old| {
                let current = match old {
                    None => 0.0,
                    Some(v) => parse_f64(v).ok_or(errors::NOT_FLOAT)?,
                };
                let sum = current + by;
                if !sum.is_finite() {
                    return Err("ERR increment would produce NaN or Infinity");
                }
                Ok(crate::reply::format_double(sum).into_bytes())
            })
            .await?;
            match result {
                Ok(text) => ctx.out.bulk(&text),
                Err(e) => ctx.out.error(e),
            }
        }
        "append" => {
            let max = store.max_value_bytes();
            let result = modify(store, db, &a[0], |old| {
                let old = old.unwrap_or_default();
                if old.len() + a[1].len() > max {
                    return Err(errors::TOO_BIG);
                }
                let mut v = Vec::with_capacity(old.len() + a[1].len());
                v.extend_from_slice(old);
                v.extend_from_slice(&a[1]);
                Ok(v)
            })
            .await?;
            match result {
                Ok(v) => ctx.out.int(v.len() as i64),
                Err(e) => ctx.out.error(e),
            }
        }
        "strlen" => {
            let v = store.get(db, &a[0]).await?;
            ctx.out.int(v.map_or(0, |v| v.value.len()) as i64);
        }
        "getrange" => {
            let (Some(start), Some(end)) = (parse_i64(&a[1]), parse_i64(&a[2])) else {
                ctx.out.error(errors::NOT_INTEGER);
                return Ok(true);
            };
            let v = store.get(db, &a[0]).await?;
            let value = v.map(|v| v.value).unwrap_or_default();
            ctx.out.bulk(range(&value, start, end));
        }
        "setrange" => setrange(ctx, a).await?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// `GETRANGE`'s slice, with Redis 7's index rules.
fn range(value: &[u8], mut start: i64, mut end: i64) -> &[u8] {
    let len = value.len() as i64;
    if start < 0 && end < 0 && start > end {
        return &[];
    }
    if start < 0 {
        start += len;
    }
    if end < 0 {
        end += len;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    if start > end || len == 0 {
        return &[];
    }
    &value[start as usize..=end as usize]
}

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]`.
async fn set<S: Store>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) -> Result<(), StoreError> {
    let (db, store) = (ctx.session.db, ctx.store);
    let o = match string_options(&a[2..], true) {
        Ok(o) => o,
        Err(e) => return refuse(&mut ctx.out, e),
    };
    let at = match &o.expire {
        None => 0,
        Some((unit, arg)) => match deadline(store.now_ms(), *unit, arg, "set") {
            Ok(at) => at,
            Err(e) => return refuse(&mut ctx.out, &e),
        },
    };
    let only = match (o.nx, o.xx) {
        (true, _) => Some(Cond::Absent),
        (_, true) => Some(Cond::Present),
        _ => None,
    };
    if !o.get && !o.keep_ttl {
        // A blind write: nothing of the old object is needed.
        let done = store
            .put(
                db,
                Put::new(&a[0], &a[1])
                    .when(only.unwrap_or(Cond::Always))
                    .expiring_at(at),
            )
            .await?;
        if done {
            ctx.out.ok()
        } else {
            ctx.out.null()
        }
        return Ok(());
    }
    let ttl = if o.keep_ttl { Ttl::Keep } else { Ttl::At(at) };
    let (old, written) = swap(store, db, &a[0], Some((&a[1], ttl)), only).await?;
    if o.get {
        // With GET the old value is the reply, written or not (Redis 7).
        ctx.out.bulk_or_null(old.as_ref().map(|v| &v.value[..]));
    } else if written {
        ctx.out.ok();
    } else {
        ctx.out.null();
    }
    Ok(())
}

/// Replace (`new` Some) or remove (None) `key`'s value, returning the old
/// one and whether anything changed, atomically. With `only`
/// Absent/Present the change is made only if the key was absent/present.
async fn swap<S: Store>(
    store: &S,
    db: u32,
    key: &[u8],
    new: Option<(&[u8], Ttl)>,
    only: Option<Cond>,
) -> Result<(Option<Versioned>, bool), StoreError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let old = store.get(db, key).await?;
        let skip = match only {
            Some(Cond::Absent) => old.is_some(),
            Some(Cond::Present) => old.is_none(),
            _ => false,
        };
        if skip {
            return Ok((old, false));
        }
        let cond = match &old {
            Some(v) => Cond::Version(v.version),
            None => Cond::Absent,
        };
        let done = match new {
            Some((value, ttl)) => {
                let at = match ttl {
                    Ttl::At(at) => at,
                    Ttl::Keep => old.as_ref().map_or(0, |v| v.expires_at_ms),
                };
                let put = Put::new(key, value).when(cond).expiring_at(at);
                store.put(db, put).await?
            }
            // Removing an absent key is a no-op with nothing to race.
            None if old.is_none() => return Ok((None, false)),
            None => store.del(db, key, cond).await?,
        };
        if done {
            return Ok((old, true));
        }
    }
    Err(contention())
}

pub(crate) fn contention() -> StoreError {
    StoreError(format!(
        "gave up after {MAX_CAS_ATTEMPTS} attempts: other clients kept changing the key"
    ))
}

/// Set `key` to `f(old value)` atomically; `f`'s error is the reply (and
/// nothing is written). Returns the value written.
async fn modify<S: Store>(
    store: &S,
    db: u32,
    key: &[u8],
    mut f: impl FnMut(Option<&[u8]>) -> Result<Vec<u8>, &'static str>,
) -> Result<Result<Vec<u8>, &'static str>, StoreError> {
    if let Some(done) = store.modify_at_once(db, key, &mut f) {
        return done;
    }
    for _ in 0..MAX_CAS_ATTEMPTS {
        let old = store.get(db, key).await?;
        let new = match f(old.as_ref().map(|v| &v.value[..])) {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        let cond = match &old {
            Some(v) => Cond::Version(v.version),
            None => Cond::Absent,
        };
        // Changed in place, as Redis sees it: the deadline stays.
        let at = old.as_ref().map_or(0, |v| v.expires_at_ms);
        if store
            .put(db, Put::new(key, &new).when(cond).expiring_at(at))
            .await?
        {
            return Ok(Ok(new));
        }
    }
    Err(contention())
}

async fn increment<S: Store>(
    store: &S,
    db: u32,
    key: &[u8],
    by: i64,
) -> Result<Result<i64, &'static str>, StoreError> {
    let mut result = 0;
    let written = modify(store, db, key, |old| {
        let current = match old {
            None => 0,
            Some(v) => parse_i64(v).ok_or(errors::NOT_INTEGER)?,
        };
        result = current.checked_add(by).ok_or(errors::OVERFLOW)?;
        Ok(result.to_string().into_bytes())
    })
    .await?;
    Ok(written.map(|_| result))
}

async fn setrange<S: Store>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) -> Result<(), StoreError> {
    let (db, store) = (ctx.session.db, ctx.store);
    let Some(offset) = parse_i64(&a[1]) else {
        {
            ctx.out.error(errors::NOT_INTEGER);
            return Ok(());
        }
    };
    if offset < 0 {
        {
            ctx.out.error("ERR offset is out of range");
            return Ok(());
        }
    }
    let patch = &a[2];
    let max = store.max_value_bytes() as i64;
    if patch.is_empty() {
        // Nothing to write: the length as it is (a missing key stays missing).
        let v = store.get(db, &a[0]).await?;
        {
            ctx.out.int(v.map_or(0, |v| v.value.len()) as i64);
            return Ok(());
        }
    }
    if offset + patch.len() as i64 > max {
        {
            ctx.out.error(errors::TOO_BIG);
            return Ok(());
        }
    }
    let offset = offset as usize;
    let written = modify(store, db, &a[0], |old| {
        let old = old.unwrap_or_default();
        let mut v = old.to_vec();
        if v.len() < offset + patch.len() {
            v.resize(offset + patch.len(), 0);
        }
        v[offset..offset + patch.len()].copy_from_slice(patch);
        Ok(v)
    })
    .await?;
    match written {
        Ok(v) => ctx.out.int(v.len() as i64),
        Err(e) => ctx.out.error(e),
    }
    Ok(())
}
