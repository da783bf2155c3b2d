//! Keyspace commands: `DEL UNLINK EXISTS TYPE SCAN RENAME DBSIZE FLUSHDB
//! FLUSHALL`. The expiry commands are in `expiry.rs`; an expired key is
//! absent to every command here because the store hides it.

use bytes::Bytes;

use crate::exec::{Ctx, errors, parse_i64, refuse};
use crate::store::{Store, StoreError};

/// Most keys one `SCAN` page returns whatever `COUNT` asks: bounds the reply.
pub const MAX_SCAN_COUNT: usize = 100_000;

pub async fn run<S: Store>(
    ctx: &mut Ctx<'_, S>,
    name: &str,
    a: &[Bytes],
) -> Result<(), StoreError> {
    let (db, store) = (ctx.session.db, ctx.store);
    match name {
        "del" | "unlink" => {
            let removed = store.del_many(db, a).await?;
            ctx.out.int(removed as i64);
        }
        "exists" => {
            // A key named twice counts twice, as in Redis.
            let found = store.mget(db, a).await?;
            ctx.out
                .int(found.iter().filter(|v| v.is_some()).count() as i64);
        }
        "type" => {
            let v = store.get(db, &a[0]).await?;
            ctx.out.simple(if v.is_some() { "string" } else { "none" });
        }
        "rename" => {
            // The store carries the deadline over: Redis's RENAME keeps it.
            let done = if a[0] == a[1] {
                store.get(db, &a[0]).await?.is_some()
            } else {
                store.rename(db, &a[0], &a[1]).await?
            };
            if done {
                ctx.out.ok()
            } else {
                ctx.out.error(errors::NO_SUCH_KEY)
            }
        }
        "scan" => scan(ctx, a).await?,
        "dbsize" => {
            let n = store.dbsize(db).await?;
            ctx.out.int(n as i64);
        }
        "flushdb" | "flushall" => {
            let ok = match a {
                [] => true,
                [mode] => mode.eq_ignore_ascii_case(b"ASYNC") || mode.eq_ignore_ascii_case(b"SYNC"),
                _ => false,
            };
            if !ok {
                {
                    ctx.out.error(errors::SYNTAX);
                    return Ok(());
                }
            }
            if name == "flushdb" {
                store.flush(db).await?;
            } else {
                for db in 0..ctx.settings.databases {
                    store.flush(db).await?;
                }
            }
            ctx.out.ok();
        }
        other => {
            // Every name in the command table is handled somewhere.
            debug_assert!(false, "command {other} has no handler");
            ctx.out
                .error(&format!("ERR command '{other}' is not implemented"));
        }
    }
    Ok(())
}

async fn scan<S: Store>(ctx: &mut Ctx<'_, S>, a: &[Bytes]) -> Result<(), StoreError> {
    let cursor = match std::str::from_utf8(&a[0])
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
    {
        Some(c) => c,
        None => return refuse(&mut ctx.out, "ERR invalid cursor"),
    };
    let mut count = 10usize;
    let mut pattern: Option<&[u8]> = None;
    let mut only_strings = true;
    let mut opts = &a[1..];
    while let Some(opt) = opts.first() {
        let Some(value) = opts.get(1) else {
            {
                ctx.out.error(errors::SYNTAX);
                return Ok(());
            }
        };
        if opt.eq_ignore_ascii_case(b"COUNT") {
            match parse_i64(value) {
                None => return refuse(&mut ctx.out, errors::NOT_INTEGER),
                Some(n) if n < 1 => return refuse(&mut ctx.out, errors::SYNTAX),
                Some(n) => count = (n as usize).min(MAX_SCAN_COUNT),
            }
        } else if opt.eq_ignore_ascii_case(b"MATCH") {
            pattern = Some(value);
        } else if opt.eq_ignore_ascii_case(b"TYPE") {
            // Every key is a string here.
            only_strings = value.eq_ignore_ascii_case(b"string");
        } else {
            {
                ctx.out.error(errors::SYNTAX);
                return Ok(());
            }
        }
        opts = &opts[2..];
    }
    let page = ctx.store.scan(ctx.session.db, cursor, count).await?;
    let keys: Vec<&Bytes> = page
        .keys
        .iter()
        .filter(|k| only_strings && pattern.is_none_or(|p| crate::glob::matches(p, k, false)))
        .collect();
    ctx.out.array(2);
    ctx.out.bulk(page.cursor.to_string().as_bytes());
    ctx.out.array(keys.len());
    for k in keys {
        ctx.out.bulk(k);
    }
    Ok(())
}
