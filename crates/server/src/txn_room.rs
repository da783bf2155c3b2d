//! The log room a prepared transaction's decision will need, held from the
//! prepare until the decision is applied (`Engine::promise_head`).
//!
//! Why: a participant that votes yes must apply a commit whatever the shard
//! takes meanwhile. The prepare's memory charge covers the bytes, but the
//! log grows in whole segments: on a budget filled after the prepare, the
//! decision's group would need a new head the budget no longer has, and the
//! commit's writes would be refused and lost for their keys. A promise per
//! part (one per tablet it appends to) holds that room in the tablet's head
//! instead, with index slots for its new keys and a records-map slot for a
//! commit record; `apply_part` gives it up and appends at once.

use insitu_engine::{Engine, EngineError, GroupSize, HeadPromise, key_hash};
use insitu_protocol::Status;
use insitu_txn::{Anchor, TxnId, Write};

use crate::shard::ShardState;
use crate::txn_durable::{Part, group_bytes, parts};

/// What a part's decision appends at most.
pub(crate) fn group_size(part: &Part) -> GroupSize {
    // Every put may add a key.
    let puts = || {
        part.items
            .iter()
            .filter(|i| matches!(i.write, Write::Put(_) | Write::PutExpiring(..)))
    };
    GroupSize {
        bytes: group_bytes(part),
        new_keys: puts().count(),
        // The commit record a commit leaves in every part's group.
        new_records: 1,
        longest_key: puts().map(|i| i.key.len()).max().unwrap_or(0),
    }
}

/// Refuse a part whose decision would not fit one log segment.
pub(crate) fn check_fits(engine: &Engine, txn: TxnId, part: &Part) -> Result<(), (Status, String)> {
    let bytes = group_bytes(part);
    let segment_bytes = engine.config().segment_bytes;
    if bytes > segment_bytes {
        return Err((
            Status::BadRequest,
            format!(
                "transaction {txn:#x} writes {bytes} bytes in one tablet of table {}; a transaction may write at most {segment_bytes} bytes (one log segment) per tablet",
                part.table
            ),
        ));
    }
    Ok(())
}

/// Hold the room of every part of `txn` (prepared in the participant whose
/// anchor is `own`). On a refusal nothing of this call is held.
pub(crate) fn promise_parts(
    state: &ShardState,
    txn: TxnId,
    own: &Anchor,
) -> Result<(), (Status, String)> {
    let mut engine = state.engine.borrow_mut();
    let participant = state.txns.participant.borrow();
    let Some(p) = participant.prepared(txn) else {
        return Ok(());
    };
    let parts = parts(&engine, p, Some(own));
    let mut promises = Vec::with_capacity(parts.len());
    for part in &parts {
        check_fits(&engine, txn, part)?;
        let hash = key_hash(part.table, &part.anchor);
        match engine.promise_head(part.table, hash, group_size(part)) {
            Ok(promise) => promises.push(promise),
            Err(e) => {
                let status = crate::handler::engine_status(&e);
                let why = match e {
                    EngineError::OutOfMemory => format!(
                        "transaction {txn:#x}: no log room for its decision in table {}: {e}",
                        part.table
                    ),
                    _ => format!("transaction {txn:#x}: table {}: {e}", part.table),
                };
                return Err((status, why));
            }
        }
    }
    let mut held = state.txns.held.borrow_mut();
    held.entry(txn).or_default().promises.extend(promises);
    Ok(())
}

/// Hold the room of one part taken back from its record (a recovery or a
/// move). Never refuses the recovery: without room, a commit of the part
/// waits until `room_for_commit` can make it (logged).
pub(crate) fn promise_restored(state: &ShardState, txn: TxnId, part: &Part) {
    let hash = key_hash(part.table, &part.anchor);
    let promise = state
        .engine
        .borrow_mut()
        .promise_head(part.table, hash, group_size(part));
    match promise {
        Ok(promise) => {
            let mut held = state.txns.held.borrow_mut();
            held.entry(txn).or_default().promises.push(promise);
        }
        Err(e) => tracing::warn!(
            shard = state.index,
            txn,
            table = part.table,
            "a recovered transaction's decision has no log room held for it: {e}"
        ),
    }
}

/// Where in `txn`'s held promises the one for `part` (one of its tablet) is.
fn promise_at(state: &ShardState, txn: TxnId, part: &Part) -> Option<usize> {
    let start = state
        .engine
        .borrow()
        .tablet_for(part.table, key_hash(part.table, &part.anchor))?
        .start;
    let held = state.txns.held.borrow();
    held.get(&txn)?
        .promises
        .iter()
        .position(|p| p.table() == part.table && p.start_hash() == start)
}

/// Take back the promise held for `part` (one of its tablet), if any.
pub(crate) fn take_promise(state: &ShardState, txn: TxnId, part: &Part) -> Option<HeadPromise> {
    let at = promise_at(state, txn, part)?;
    let mut held = state.txns.held.borrow_mut();
    Some(held.get_mut(&txn)?.promises.swap_remove(at))
}

/// Room for every part of a commit that changes data or records the
/// decision (every part with a record): the part's promise, or one made now (and held until the
/// decision is applied). Err names the first part with neither: the
/// caller must not apply the commit yet. Why: a part taken back by a
/// recovery on a shard without room has no promise, and its writes,
/// refused for memory, would be lost while the transaction counts as
/// committed; kept prepared, its keys stay locked and the sweep applies it
/// once removes or the cleaner make room. A part that only removes its
/// record needs none (a record left behind is resolved again, harmlessly).
pub(crate) fn room_for_commit(
    state: &ShardState,
    txn: TxnId,
    parts: &[Part],
) -> Result<(), String> {
    for part in parts {
        let writes = part.items.iter().any(|i| !matches!(i.write, Write::None));
        if !(writes || part.record || part.keeps_decision())
            || promise_at(state, txn, part).is_some()
        {
            continue;
        }
        let hash = key_hash(part.table, &part.anchor);
        let promise = state
            .engine
            .borrow_mut()
            .promise_head(part.table, hash, group_size(part))
            .map_err(|e| format!("no log room for its part in table {}: {e}", part.table))?;
        let mut held = state.txns.held.borrow_mut();
        held.entry(txn).or_default().promises.push(promise);
    }
    Ok(())
}
