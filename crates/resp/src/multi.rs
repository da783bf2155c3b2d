//! `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH`: commands queued after
//! `MULTI` run at `EXEC` inside one store transaction, so their writes
//! appear together and only if no key they read, and no `WATCH`ed key,
//! changed meanwhile (else the transaction runs again from the start, or,
//! for a watched key, `EXEC` answers a null array as Redis does).

use bytes::{Bytes, BytesMut};

use crate::command::CommandInfo;
use crate::exec::Ctx;
use crate::reply::Out;
use crate::store::{Commit, Store, StoreError, Transactional};

/// Most commands one `MULTI` may queue (bounds the connection's memory).
pub const MAX_QUEUED: usize = 100_000;

/// Attempts of one `EXEC` whose transaction keeps conflicting with others.
const MAX_EXEC_ATTEMPTS: u32 = 1_000;

/// Whether `name` runs even while commands are being queued.
pub fn runs_while_queueing(name: &str) -> bool {
    matches!(name, "exec" | "discard" | "multi" | "watch" | "quit")
}

/// Queue `args` (already checked: known command, right arity).
pub fn queue<S>(ctx: &mut Ctx<'_, S>, args: &[Bytes]) {
    let queued = ctx.session.queued.get_or_insert_with(Vec::new);
    if queued.len() >= MAX_QUEUED {
        ctx.session.queue_failed = true;
        return ctx.out.error(&format!(
            "ERR too many commands in MULTI (the limit is {MAX_QUEUED})"
        ));
    }
    queued.push(args.to_vec());
    ctx.out.simple("QUEUED");
}

/// MULTI, EXEC, DISCARD, WATCH, UNWATCH; false for any other command.
pub async fn run<S: Transactional>(
    ctx: &mut Ctx<'_, S>,
    info: &CommandInfo,
    a: &[Bytes],
) -> Result<bool, StoreError> {
    match info.name {
        "multi" => {
            if ctx.session.queued.is_some() {
                ctx.out.error("ERR MULTI calls can not be nested");
            } else {
                ctx.session.queued = Some(Vec::new());
                ctx.out.ok();
            }
        }
        "discard" => match ctx.session.queued.take() {
            None => ctx.out.error("ERR DISCARD without MULTI"),
            Some(_) => {
                ctx.session.queue_failed = false;
                ctx.session.watched.clear();
                ctx.out.ok();
            }
        },
        "watch" => {
            if ctx.session.queued.is_some() {
                ctx.out.error("ERR WATCH inside MULTI is not allowed");
                return Ok(true);
            }
            let db = ctx.session.db;
            for key in a {
                let version = ctx.store.get(db, key).await?.map_or(0, |v| v.version);
                ctx.session.watched.push((db, key.clone(), version));
            }
            ctx.out.ok();
        }
        "unwatch" => {
            ctx.session.watched.clear();
            ctx.out.ok();
        }
        "exec" => exec(ctx).await?,
        _ => return Ok(false),
    }
    Ok(true)
}

async fn exec<S: Transactional>(ctx: &mut Ctx<'_, S>) -> Result<(), StoreError> {
    let Some(queued) = ctx.session.queued.take() else {
        ctx.out.error("ERR EXEC without MULTI");
        return Ok(());
    };
    let watched = std::mem::take(&mut ctx.session.watched);
    if std::mem::take(&mut ctx.session.queue_failed) {
        ctx.out
            .error("EXECABORT Transaction discarded because of previous errors.");
        return Ok(());
    }
    // SELECT inside the transaction changes the database for the commands
    // after it, and for the connection after EXEC; a retry starts over.
    let db_before = ctx.session.db;
    for _ in 0..MAX_EXEC_ATTEMPTS {
        ctx.session.db = db_before;
        let tx = ctx.store.begin().await?;
        for (db, key, seen) in &watched {
            let now = tx.get(*db, key).await?.map_or(0, |v| v.version);
            if now != *seen {
                ctx.out.null_array();
                return Ok(());
            }
        }
        let mut replies = BytesMut::new();
        {
            let mut inner = Ctx {
                store: &tx,
                settings: ctx.settings,
                session: &mut *ctx.session,
                out: Out {
                    buf: &mut replies,
                    proto: ctx.out.proto,
                },
            };
            for args in &queued {
                crate::exec::run_checked(&mut inner, args).await;
            }
        }
        if tx.commit().await? {
            ctx.out.array(queued.len());
            ctx.out.buf.extend_from_slice(&replies);
            return Ok(());
        }
    }
    Err(StoreError(format!(
        "EXEC gave up after {MAX_EXEC_ATTEMPTS} attempts: other clients kept changing the keys it reads"
    )))
}
