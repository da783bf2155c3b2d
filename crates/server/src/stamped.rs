//! Plain writes while snapshots are read here: each takes a timestamp from
//! the oracle, so a snapshot sees the plain writes acknowledged before its
//! timestamp was handed out and none applied after it, as it sees
//! transactions' commits (ARCHITECTURE.md, "Snapshot reads").
//!
//! How. While the shard keeps versions (`Versions::is_active`: a snapshot
//! read arrived within `IDLE`), a `Write`, `Remove`, `Increment`,
//! `MultiWrite` or `MultiRemove` runs as a one-phase transaction only this shard knows of:
//! its keys are locked in the participant as a prepare locks them, a
//! timestamp `T` is taken from the oracle, and then, in one synchronous
//! step, the locks go and the writes are applied with the ordinary engine
//! calls, the value each replaces kept under `T`. That is the one-phase
//! commit's rule (`txn.rs`), and the same argument holds. A snapshot at `S`
//! whose request reaches the tablet:
//! - while the write holds its locks waits for it (`snapshot::begin` waits
//!   for the tablet's lock holders) and then compares `T` with `S`;
//! - after it was applied reads the kept value before it if `T > S` (the
//!   write was applied while versions were kept, so its replaced value is
//!   in the chain), and the new value if `T < S`;
//! - before it locked its keys began keeping versions (`note_read`), and
//!   `T`, taken after the lock, is above `S`: the chain hides the write.
//!
//! And a write acknowledged (or seen by a read) before `S` was handed out
//! was applied after `T` was handed out, so `T < S`: the snapshot sees it.
//!
//! Why only while snapshots are read: the oracle round trip (shared by
//! concurrent callers, `Client::timestamp`) and the locks cost latency; a
//! write applied while nothing is kept needs no timestamp, since the floor
//! learned when keeping begins is fetched after it (`versions.rs`). Such a
//! write does make its table's commit bound unknown (`commit_bound.rs`), so
//! a tablet that moves out after it carries a timestamp fetched after it.
//!
//! If the oracle cannot be reached, the writes are applied anyway (plain
//! writes must not depend on the coordinator) with no timestamp, and the
//! shard stops keeping versions (`Versions::reset`): every snapshot read
//! under way is refused at its end, and later ones must learn a new floor
//! from the oracle, fetched after these writes.
//!
//! The Redis port's writes reach this by forwarding while snapshots are
//! read (`resp/store.rs`, `writes_here`); pushdown updates take one
//! timestamp per tablet while they hold it (`bulk_timestamp`); the expiry
//! sweep's removals come here as `PlainOp::Expire` (`expiry.rs`). The
//! object a write replaces is kept with its deadline, even one that has
//! passed: a snapshot older than the deadline still reads it
//! (`versions::expired_at`).

use bytes::BytesMut;
use insitu_engine::{EngineError, RejectRules, key_hash};
use insitu_protocol::{Number, Response, Status, encode_error};
use insitu_txn::{Item, Refusal, TxnId, Write};

use crate::handler::admit;
use crate::shard::ShardState;
use crate::versions::Before;

/// At most this many writes share one timestamp's locks. Why: a
/// multiWrite may carry 100,000 items; a transaction takes 10,000 at most,
/// and a smaller part keeps fewer keys locked for the oracle's round trip.
const PART_ITEMS: usize = 1024;
/// At most this many bytes of keys and values per part, for the same reason
/// (and the participant's 64 MiB bound on everything prepared).
const PART_BYTES: usize = 4 << 20;

/// One plain write of a request.
pub(crate) struct PlainWrite<'a> {
    pub key: &'a [u8],
    pub op: PlainOp<'a>,
    /// The object's deadline (Unix ms; 0: none). Only for a put (an
    /// increment keeps the object's own).
    pub expires_at_ms: u64,
    pub rules: RejectRules,
}

/// What a plain write does to its key.
pub(crate) enum PlainOp<'a> {
    Put(&'a [u8]),
    Remove,
    /// Add to the number the object holds (`Request::Increment`).
    Add(Number),
    /// The expiry sweep's removal of an object at this version whose
    /// deadline has passed (`Engine::expire`; refused with
    /// `ObjectDoesntExist` if it was written, removed or re-dated since).
    Expire(u64),
}

/// A plain write applied.
pub(crate) struct Applied {
    /// The object's new version (a remove: the version removed).
    pub version: u64,
    /// An increment's new value (None for a put or a remove).
    pub number: Option<Number>,
}

/// Why one plain write was not applied.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The engine refused it, as it refuses an unstamped write.
    Engine(EngineError),
    /// It could not take its locks (another transaction holds a key, or the
    /// participant is full): nothing was applied.
    Status(Status, String),
    /// Its key is not served here now, or is locked (`handler::admit`).
    Admit(Status),
}

/// Whether a plain write must take a timestamp now: snapshots are read here.
#[inline]
pub(crate) fn needed(state: &ShardState) -> bool {
    state.versions.borrow().is_active()
}

/// A plain write to `table` applied with no timestamp: its table's commit
/// bound is unknown until a timestamp is fetched after it (a tablet moving
/// out then carries one, `commit_bound.rs`).
#[inline]
pub(crate) fn unstamped(state: &ShardState, table: u64) {
    state.versions.borrow_mut().commits.applied(table, 0);
}

/// The timestamp a pushdown update (or removal) of `table` applies its
/// writes under, taken while it holds its tablet (`update_apply.rs`): one
/// from the oracle while snapshots are read here, else 0 (no timestamp: the
/// table's commit bound is unknown from here, as for an unstamped write).
/// The same argument as a part's: the hold keeps every other write out from
/// before the timestamp is taken until the last write lands, and a snapshot
/// read of the tablet waits while it is held (`snapshot::wait_for`), so it
/// reads the tablet before the update began (and the timestamp, taken
/// later, is above its own) or after it ended, through the kept versions.
/// An oracle that cannot be reached: 0, and the shard stops keeping
/// versions (as in `lock_and_apply`).
pub(crate) async fn bulk_timestamp(state: &ShardState, table: u64) -> u64 {
    if !needed(state) {
        unstamped(state, table);
        return 0;
    }
    let ts = match crate::txn_peers::oracle_timestamp(state).await {
        Ok(ts) => ts,
        Err(why) => {
            tracing::warn!(
                shard = state.index,
                table,
                "an update applied without a timestamp ({why}); snapshot reads here start afresh"
            );
            state.versions.borrow_mut().reset();
            0
        }
    };
    state.versions.borrow_mut().commits.applied(table, ts);
    ts
}

/// Keep the object `before` (None: absent) that a write at
/// `commit_ts` is about to replace under `key` of `table`, for snapshots
/// before it (nothing while versions are not kept or with no timestamp).
pub(crate) fn keep_before(
    versions: &mut crate::versions::Versions,
    engine: &insitu_engine::Engine,
    (table, key): (u64, &[u8]),
    commit_ts: u64,
    before: Option<Before<'_>>,
) {
    if versions.is_active() && commit_ts != 0 {
        versions.keep(
            (table, key, key_hash(table, key)),
            commit_ts,
            before,
            std::time::Instant::now(),
            |n| engine.try_charge_transient(n).ok(),
        );
    }
}

/// A `Write`, `Remove` or `Increment` while snapshots are read here (the handler's
/// `write_keyed` otherwise): admitted, applied under a timestamp, answered;
/// `response` makes the reply of what was applied.
pub(crate) async fn reply_one(
    state: &ShardState,
    id: u64,
    (table, write): (u64, PlainWrite<'_>),
    out: &mut BytesMut,
    response: impl FnOnce(Applied) -> Response<'static>,
) {
    let key = write.key;
    let result = crate::stamped::apply(state, table, &[write]).await.pop();
    let result = result.unwrap_or_else(|| {
        let why = "a stamped write gave no result".to_string();
        Err(Refused::Status(Status::Internal, why))
    });
    reply_applied(state, id, (table, key), result, out, response);
}

/// Answer request `id` with what its stamped write to `key` of `table` did:
/// `response` of it, or the refusal (a lost key's worded by `lost.rs`).
pub(crate) fn reply_applied<'r>(
    state: &ShardState,
    id: u64,
    (table, key): (u64, &[u8]),
    result: Result<Applied, Refused>,
    out: &mut BytesMut,
    response: impl FnOnce(Applied) -> Response<'r>,
) {
    match result {
        Ok(applied) => crate::handler::reply(out, id, &response(applied)),
        Err(Refused::Engine(e)) => crate::lost::reply_keyed(state, (table, key), out, id, Err(e)),
        Err(Refused::Status(status, why)) => encode_error(out, id, status, why),
        Err(Refused::Admit(status)) => encode_error(out, id, status, status.to_string()),
    }
}

/// Apply `writes` to `table` under timestamps, a part at a time, each
/// write admitted (`handler::admit`) as its part locks its keys. Returns
/// what each write did (or why it was refused), in order.
pub(crate) async fn apply(
    state: &ShardState,
    table: u64,
    writes: &[PlainWrite<'_>],
) -> Vec<Result<Applied, Refused>> {
    let mut results = Vec::with_capacity(writes.len());
    let mut rest = writes;
    while !rest.is_empty() {
        let n = part_len(rest);
        let (part, tail) = rest.split_at(n);
        results.extend(apply_part(state, table, part).await);
        rest = tail;
    }
    debug_assert_eq!(results.len(), writes.len());
    results
}

/// How many of `writes` form the next part: within the bounds. A key may
/// come twice (a request may write one twice, the later write winning): it
/// is locked once and its writes applied in order under the one timestamp.
/// Why not a part per repeat: a request naming one key 100,000 times would
/// cost as many oracle round trips.
fn part_len(writes: &[PlainWrite<'_>]) -> usize {
    let mut bytes = 0usize;
    for (i, w) in writes.iter().enumerate() {
        let value = match w.op {
            PlainOp::Put(v) => v.len(),
            PlainOp::Remove | PlainOp::Add(_) | PlainOp::Expire(_) => 0,
        };
        bytes += w.key.len() + value;
        let full = i == PART_ITEMS || (i > 0 && bytes > PART_BYTES);
        if full {
            return i;
        }
    }
    writes.len()
}

/// One part: admit each write and lock the admitted ones' keys in one
/// synchronous step (so a move or a bulk update that begins later waits for
/// the locks, and one begun earlier refuses the write), take a timestamp,
/// then release and apply in another.
async fn apply_part(
    state: &ShardState,
    table: u64,
    writes: &[PlainWrite<'_>],
) -> Vec<Result<Applied, Refused>> {
    let admitted: Vec<Result<(), Status>> = writes
        .iter()
        .map(|w| admit(state, table, w.key, true))
        .collect();
    let taken: Vec<&PlainWrite<'_>> = writes
        .iter()
        .zip(&admitted)
        .filter_map(|(w, a)| a.is_ok().then_some(w))
        .collect();
    let mut applied = if taken.is_empty() {
        Vec::new()
    } else {
        lock_and_apply(state, table, &taken).await
    }
    .into_iter();
    let results = admitted.into_iter().map(|a| match a {
        Err(status) => Err(Refused::Admit(status)),
        Ok(()) => applied.next().unwrap_or_else(|| {
            Err(Refused::Status(
                Status::Internal,
                "no result for a write".into(),
            ))
        }),
    });
    results.collect()
}

async fn lock_and_apply(
    state: &ShardState,
    table: u64,
    writes: &[&PlainWrite<'_>],
) -> Vec<Result<Applied, Refused>> {
    let refuse_all = |status: Status, why: String| {
        let all = writes
            .iter()
            .map(|_| Err(Refused::Status(status, why.clone())));
        all.collect()
    };
    let txn = match lock(state, table, writes) {
        Ok(txn) => txn,
        Err((status, why)) => return refuse_all(status, why),
    };
    let ts = crate::txn_peers::oracle_timestamp(state).await;
    // From here one synchronous step: the locks go and the writes land with
    // no request in between.
    state.txns.stamping.borrow_mut().remove(&txn);
    let released = state.txns.participant.borrow_mut().release(txn);
    state.holds_released.notify_waiters();
    if released.is_none() {
        // Only this call releases its part; were it gone, nothing may land.
        debug_assert!(false, "a stamped part was released by another");
        let why = "the write lost its locks before it was applied".to_string();
        return refuse_all(Status::Retry, why);
    }
    let commit_ts = match ts {
        Ok(ts) => ts,
        Err(why) => {
            tracing::warn!(
                shard = state.index,
                table,
                "plain writes applied without a timestamp ({why}); snapshot reads here start afresh"
            );
            state.versions.borrow_mut().reset();
            0
        }
    };
    let mut engine = state.engine.borrow_mut();
    let mut versions = state.versions.borrow_mut();
    versions.commits.applied(table, commit_ts);
    // A key's first write of the part keeps the value before the part: all
    // that a snapshot before `commit_ts` may read (one after it reads the
    // last write), so a repeat keeps nothing.
    let mut kept = std::collections::HashSet::new();
    writes
        .iter()
        .map(|w| {
            if let PlainOp::Expire(version) = w.op
                && !due(&engine, (table, w.key), version)
            {
                // Nothing to remove: nothing to keep either.
                return Err(Refused::Engine(EngineError::ObjectDoesntExist));
            }
            if versions.is_active() && commit_ts != 0 && kept.insert(w.key) {
                // The object this write replaces, for snapshots before it:
                // one whose deadline has passed too, as a snapshot older
                // than the deadline still sees it.
                let before = engine.read_expired_too(table, w.key).ok().map(Before::from);
                keep_before(&mut versions, &engine, (table, w.key), commit_ts, before);
            }
            let plain = |version| Applied {
                version,
                number: None,
            };
            let done = match w.op {
                PlainOp::Put(v) => engine
                    .write_expiring(table, w.key, v, w.expires_at_ms, &w.rules)
                    .map(plain),
                PlainOp::Remove => engine.remove(table, w.key, &w.rules).map(plain),
                PlainOp::Add(Number::I64(d)) => engine
                    .increment_i64(table, w.key, d, &w.rules)
                    .map(|(v, version)| Applied {
                        version,
                        number: Some(Number::I64(v)),
                    }),
                PlainOp::Expire(version) => match engine.expire(table, w.key, version) {
                    Ok(true) => Ok(plain(version)),
                    Ok(false) => Err(EngineError::ObjectDoesntExist),
                    Err(e) => Err(e),
                },
                PlainOp::Add(Number::F64(d)) => engine
                    .increment_f64(table, w.key, d, &w.rules)
                    .map(|(v, version)| Applied {
                        version,
                        number: Some(Number::F64(v)),
                    }),
            };
            done.map_err(Refused::Engine)
        })
        .collect()
}

/// Whether `key`'s object is still at `version` and past its deadline: what
/// `Engine::expire` removes.
fn due(engine: &insitu_engine::Engine, (table, key): (u64, &[u8]), version: u64) -> bool {
    engine
        .read_expired_too(table, key)
        .is_ok_and(|o| o.version == version && o.is_expired(engine.now_ms()))
}

/// Lock the keys of `writes` under a fresh transaction id only this shard
/// knows (the sweep leaves it alone: it is in `stamping`).
fn lock(
    state: &ShardState,
    table: u64,
    writes: &[&PlainWrite<'_>],
) -> Result<TxnId, (Status, String)> {
    // Each key once: a prepare refuses a key twice.
    let mut seen = std::collections::HashSet::new();
    let items: Vec<Item> = writes
        .iter()
        .filter(|w| seen.insert(w.key))
        .map(|w| Item {
            table,
            key: w.key.to_vec(),
            hash: key_hash(table, w.key),
            read_version: None,
            // Only the lock counts: the part is released, not applied,
            // by the participant (an increment locks as a put).
            write: match w.op {
                PlainOp::Put(v) => Write::Put(v.to_vec()),
                PlainOp::Add(_) => Write::Put(Vec::new()),
                PlainOp::Remove | PlainOp::Expire(_) => Write::Remove,
            },
        })
        .collect();
    let now = state.txns.now_ms();
    let mut participant = state.txns.participant.borrow_mut();
    // Random like a client's id; one in use here (2^-64 a time) is skipped.
    let txn = loop {
        let txn: TxnId = fastrand::u64(1..);
        if participant.prepared(txn).is_none() && participant.decision(txn).is_none() {
            break txn;
        }
    };
    match participant.prepare(txn, None, Vec::new(), items, now, |_| 0) {
        Ok(()) => {
            state.txns.stamping.borrow_mut().insert(txn);
            Ok(txn)
        }
        Err(refusal) => {
            let status = match refusal {
                Refusal::Full { .. } => Status::OutOfMemory,
                Refusal::Locked { .. } => Status::Retry,
                _ => Status::Internal,
            };
            Err((
                status,
                format!("plain write under a snapshot timestamp: {refusal}"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put<'a>(key: &'a [u8], value: &'a [u8]) -> PlainWrite<'a> {
        PlainWrite {
            key,
            op: PlainOp::Put(value),
            expires_at_ms: 0,
            rules: RejectRules::default(),
        }
    }

    #[test]
    fn a_part_stays_within_its_bounds() {
        let w = [
            put(b"a", b"1"),
            put(b"b", b"1"),
            put(b"a", b"2"),
            put(b"c", b"1"),
        ];
        assert_eq!(part_len(&w), 4, "a key twice stays in one part");
        let keys: Vec<Vec<u8>> = (0..PART_ITEMS + 5)
            .map(|i| i.to_le_bytes().to_vec())
            .collect();
        let many: Vec<PlainWrite<'_>> = keys.iter().map(|k| put(k, b"v")).collect();
        assert_eq!(part_len(&many), PART_ITEMS);
        let big = vec![7u8; PART_BYTES / 2 + 1];
        let large = [put(b"x", &big), put(b"y", &big), put(b"z", &big)];
        assert_eq!(part_len(&large), 1, "two would pass the byte bound");
        let huge = vec![7u8; PART_BYTES * 2];
        assert_eq!(
            part_len(&[put(b"h", &huge)]),
            1,
            "one write always makes a part"
        );
        assert_eq!(part_len(&[]), 0);
    }
}
