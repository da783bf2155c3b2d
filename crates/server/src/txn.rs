//! A shard's side of multi-key transactions: the `txn` crate's participant
//! wired to the engine (validation reads versions, a commit writes) and to
//! the network (an orphaned transaction is resolved with the primary).
//! ARCHITECTURE.md, "Transactions", has the protocol and its crash cases.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use insitu_client::rpc::RpcConn;
use insitu_engine::{TransientCharge, key_hash};
use insitu_protocol::txn::{TxnId, TxnItem, TxnPhase, TxnWrite};
use insitu_protocol::{Request, Response, Status, encode_error};
use insitu_txn::{Apply, Item, Participant, Phase, Refusal, Write};

use crate::handler::reply;
use crate::shard::ShardState;

/// How long a transaction may stay prepared before this participant stops
/// waiting for its client and resolves it with the primary. Why 2 s: a
/// client commits in a few round trips (well under 10 ms); a longer wait
/// only keeps keys locked after a client died, and a shorter one makes a
/// slow client's commit race its resolution (harmless: the primary's
/// decision stands either way, the client learns it).
pub const PREPARED_TIMEOUT: Duration = Duration::from_secs(2);
/// How often overdue transactions and expired decisions are looked for.
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// One call to another participant (resolve, inquire) must finish within
/// this; an unreachable participant leaves the transaction prepared, and the
/// next sweep tries again.
const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// A tablet move or bulk update waits this long for the tablet's
/// transaction locks to be released before giving up with Retry. Why: a
/// lock lives at most `PREPARED_TIMEOUT` plus a resolution unless a
/// participant is unreachable.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// A shard's transactions: the participant state and what it holds.
pub struct ShardTxns {
    pub participant: RefCell<Participant>,
    /// The memory-budget charge of each prepared transaction (its keys and
    /// values are copies held outside the log until decided).
    charges: RefCell<HashMap<TxnId, TransientCharge>>,
    /// Origin of the participant's millisecond clock.
    epoch: Instant,
}

impl Default for ShardTxns {
    fn default() -> Self {
        ShardTxns {
            participant: RefCell::new(Participant::new(insitu_txn::Limits::default())),
            charges: RefCell::new(HashMap::new()),
            epoch: Instant::now(),
        }
    }
}

impl ShardTxns {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether a transaction holds `key`'s lock (plain writes then wait).
    #[inline]
    pub fn is_locked(&self, table: u64, key: &[u8]) -> bool {
        let p = self.participant.borrow();
        p.lock_count() > 0 && p.is_locked(table, key)
    }
}

/// Locks held on the tablet of `table` starting at `start_hash`.
pub fn locks_on_tablet(state: &ShardState, table: u64, start_hash: u64) -> usize {
    let p = state.txns.participant.borrow();
    if p.lock_count() == 0 {
        return 0;
    }
    let Some(range) = state.engine.borrow().tablet_for(table, start_hash) else {
        return 0;
    };
    p.locks_in(table, range.start, range.end)
}

/// Wait until no transaction holds a lock on the tablet (a move calls this
/// after freezing it, so no new prepare can lock it, and before copying).
pub async fn wait_no_locks(
    state: &ShardState,
    table: u64,
    start_hash: u64,
) -> Result<(), (Status, String)> {
    let deadline = tokio::time::Instant::now() + LOCK_WAIT;
    loop {
        let released = state.holds_released.notified();
        let held = locks_on_tablet(state, table, start_hash);
        if held == 0 {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, released).await.is_err() {
            return Err((
                Status::Retry,
                format!(
                    "tablet {table}/{start_hash:#x}: {held} keys stayed locked by transactions for {} s; retry",
                    LOCK_WAIT.as_secs()
                ),
            ));
        }
    }
}

/// `TxnPrepare`: validate and lock; a primary with no others commits at once.
pub fn prepare(
    state: &ShardState,
    id: u64,
    txn: TxnId,
    primary: Option<String>,
    others: Vec<String>,
    items: &[TxnItem<'_>],
    out: &mut BytesMut,
) {
    // Every item's tablet must be here and accept what the item does: a
    // move in progress (frozen) refuses the locks, a moved-out tablet sends
    // the client to refresh its map. Nothing is locked on a refusal.
    let mut owned = Vec::with_capacity(items.len());
    {
        let engine = state.engine.borrow();
        for it in items {
            let write = !matches!(it.write, TxnWrite::None);
            if let Err(s) = crate::handler::admit_tablet(state, it.table, it.key, write) {
                return encode_error(out, id, s, format!("transaction {txn:#x}: {s}"));
            }
            let hash = key_hash(it.table, it.key);
            if engine.tablet_for(it.table, hash).is_none() {
                let s = Status::UnknownTablet;
                return encode_error(out, id, s, format!("transaction {txn:#x}: {s}"));
            }
            if let TxnWrite::Put(v) = &it.write
                && let Err(e) = engine.check_object(it.key, v.len())
            {
                return crate::handler::reply_engine_error(out, id, &e);
            }
            owned.push(Item {
                table: it.table,
                key: it.key.to_vec(),
                hash,
                read_version: it.read_version,
                write: match &it.write {
                    TxnWrite::None => Write::None,
                    TxnWrite::Put(v) => Write::Put(v.to_vec()),
                    TxnWrite::Remove => Write::Remove,
                },
            });
        }
    }
    let one_phase = primary.is_none() && others.is_empty();
    let now = state.txns.now_ms();
    let result = {
        let engine = state.engine.borrow();
        state
            .txns
            .participant
            .borrow_mut()
            .prepare(txn, primary, others, owned, now, |item| {
                engine.read(item.table, &item.key).map_or(0, |o| o.version)
            })
    };
    if let Err(refusal) = result {
        let status = match refusal {
            Refusal::Bad(_) => Status::BadRequest,
            Refusal::Full { .. } => Status::OutOfMemory,
            _ => Status::Conflict,
        };
        return encode_error(out, id, status, format!("transaction {txn:#x}: {refusal}"));
    }
    // The copies held until the decision count against the memory budget.
    let bytes = state
        .txns
        .participant
        .borrow()
        .prepared(txn)
        .map_or(0, |p| {
            p.items.iter().map(|i| i.key.len() + value_len(i)).sum()
        });
    let charge = state.engine.borrow().try_charge_transient(bytes as u64);
    match charge {
        Ok(charge) => {
            state.txns.charges.borrow_mut().insert(txn, charge);
        }
        Err(_) => {
            decide_and_apply(state, txn, false);
            return encode_error(
                out,
                id,
                Status::OutOfMemory,
                format!("transaction {txn:#x}: no memory to hold {bytes} bytes until the commit"),
            );
        }
    }
    if one_phase {
        let committed = decide_and_apply(state, txn, true);
        reply(out, id, &Response::TxnDecided { committed });
    } else {
        reply(out, id, &Response::TxnPrepared);
    }
}

fn value_len(i: &Item) -> usize {
    match &i.write {
        Write::Put(v) => v.len(),
        _ => 0,
    }
}

/// `TxnDecide`: take (or learn) the decision and apply it; answers the
/// decision that stands here.
pub fn decide(state: &ShardState, id: u64, txn: TxnId, commit: bool, out: &mut BytesMut) {
    let committed = decide_and_apply(state, txn, commit);
    reply(out, id, &Response::TxnDecided { committed });
}

/// `TxnInquire`: where the transaction stands here.
pub fn inquire(state: &ShardState, id: u64, txn: TxnId, out: &mut BytesMut) {
    let now = state.txns.now_ms();
    let phase = match state.txns.participant.borrow_mut().phase(txn, now) {
        Phase::Prepared => TxnPhase::Prepared,
        Phase::Committed => TxnPhase::Committed,
        Phase::Aborted => TxnPhase::Aborted,
    };
    reply(out, id, &Response::TxnPhase(phase));
}

/// `TxnResolve` (this shard is the primary): the decision, taking it first
/// if there is none yet.
pub async fn resolve(state: &ShardState, id: u64, txn: TxnId, out: &mut BytesMut) {
    match resolve_as_primary(state, txn).await {
        Ok(committed) => reply(out, id, &Response::TxnDecided { committed }),
        Err(why) => encode_error(out, id, Status::Retry, why),
    }
}

/// Take the decision the primary must: commit if every participant is
/// prepared (all voted yes), abort if any is not (asking it aborts it
/// there). Err: a participant could not be asked; nothing was decided.
async fn resolve_as_primary(state: &ShardState, txn: TxnId) -> Result<bool, String> {
    if let Some(d) = state.txns.participant.borrow().decision(txn) {
        return Ok(d);
    }
    // (Taken out first: a borrow in the match would be held by its arms.)
    let others = state
        .txns
        .participant
        .borrow()
        .prepared(txn)
        .map(|p| p.others.clone());
    let Some(others) = others else {
        // Never prepared here: abort (recorded, so a late prepare is refused).
        return Ok(decide_and_apply(state, txn, false));
    };
    let mut all_prepared = true;
    for addr in &others {
        let phase = match peer_call(state, addr, &Request::TxnInquire { txn }).await? {
            Response::TxnPhase(p) => p,
            other => return Err(format!("{addr} answered {other:?} to TxnInquire")),
        };
        match phase {
            TxnPhase::Prepared => {}
            // Only the primary decides; a participant that committed learned
            // it from here, so a decision is recorded already (checked below).
            TxnPhase::Committed => {}
            TxnPhase::Aborted => {
                all_prepared = false;
                break;
            }
        }
    }
    // The client's own decision may have come while we asked: it stands.
    Ok(decide_and_apply(state, txn, all_prepared))
}

/// Record the decision (the one already recorded wins) and apply a commit's
/// writes. Returns the decision that stands.
fn decide_and_apply(state: &ShardState, txn: TxnId, commit: bool) -> bool {
    let now = state.txns.now_ms();
    let (committed, apply) = state.txns.participant.borrow_mut().decide(txn, commit, now);
    state.txns.charges.borrow_mut().remove(&txn);
    if let Apply::Writes(items) = apply {
        let mut engine = state.engine.borrow_mut();
        let rules = insitu_engine::RejectRules::default();
        for item in items {
            let result = match &item.write {
                Write::Put(v) => engine.write(item.table, &item.key, v, &rules).map(|_| ()),
                Write::Remove => engine.remove(item.table, &item.key, &rules).map(|_| ()),
                Write::None => Ok(()),
            };
            // The decision is taken; a write the engine refuses now (out of
            // memory: the prepare's charge was released just before) is lost
            // for this key alone. Logged loudly; ARCHITECTURE.md lists it
            // among the known gaps.
            if let Err(e) = result {
                tracing::error!(
                    shard = state.index,
                    txn,
                    table = item.table,
                    "committed transaction: a write could not be applied: {e}"
                );
            }
        }
    }
    // Moves and updates waiting for this tablet's locks re-check.
    state.holds_released.notify_waiters();
    committed
}

/// One request to another participant, with a bound on its time.
///
/// It presents the *client* token, not the cluster credential: the address
/// came from a client's `TxnPrepare`, so it may be anyone's, and a member
/// credential sent there would be handed to whoever listens.
async fn peer_call(
    state: &ShardState,
    addr: &str,
    request: &Request<'_>,
) -> Result<Response<'static>, String> {
    let call = async {
        let conn = RpcConn::open(addr, state.gate.as_client())
            .await
            .map_err(|e| e.to_string())?;
        let reply = conn.call(request).await.map_err(|e| e.to_string())?;
        if reply.status != Status::Ok {
            return Err(format!("{}: {}", reply.status, reply.error_message()));
        }
        match reply.decode().map_err(|e| e.to_string())? {
            Response::TxnPhase(p) => Ok(Response::TxnPhase(p)),
            Response::TxnDecided { committed } => Ok(Response::TxnDecided { committed }),
            other => Err(format!("unexpected answer {other:?}")),
        }
    };
    match tokio::time::timeout(PEER_CALL_TIMEOUT, call).await {
        Ok(r) => r.map_err(|e| format!("participant {addr}: {e}")),
        Err(_) => Err(format!(
            "participant {addr} did not answer within {} ms",
            PEER_CALL_TIMEOUT.as_millis()
        )),
    }
}

/// The shard's resolver: transactions prepared here for longer than
/// `PREPARED_TIMEOUT` are resolved (as primary: decided; else: the
/// primary's decision is asked and applied), and old decisions forgotten.
pub async fn sweep(state: Rc<ShardState>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let now = state.txns.now_ms();
        let overdue = {
            let mut p = state.txns.participant.borrow_mut();
            p.expire(now);
            p.overdue(now, PREPARED_TIMEOUT.as_millis() as u64)
        };
        for txn in overdue {
            let primary = state
                .txns
                .participant
                .borrow()
                .prepared(txn)
                .map(|p| p.primary.clone());
            let Some(primary) = primary else {
                continue; // decided meanwhile
            };
            let outcome = match &primary {
                None => resolve_as_primary(&state, txn).await,
                Some(addr) => match peer_call(&state, addr, &Request::TxnResolve { txn }).await {
                    Ok(Response::TxnDecided { committed }) => {
                        Ok(decide_and_apply(&state, txn, committed))
                    }
                    Ok(other) => Err(format!("{addr} answered {other:?} to TxnResolve")),
                    Err(e) => Err(e),
                },
            };
            match outcome {
                Ok(committed) => tracing::info!(
                    shard = state.index,
                    txn,
                    committed,
                    "resolved a transaction whose client went silent"
                ),
                Err(why) => tracing::warn!(
                    shard = state.index,
                    txn,
                    "cannot resolve a prepared transaction yet (its keys stay locked): {why}"
                ),
            }
        }
    }
}
