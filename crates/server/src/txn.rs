//! A shard's side of multi-key transactions: the `txn` crate's participant
//! wired to the engine (validation reads versions, a commit writes): the
//! prepare, the decision and its application. Orphans (a silent client) are
//! resolved in `txn_resolve.rs`. ARCHITECTURE.md, "Transactions", has the
//! protocol and its crash cases.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use insitu_client::Client;
use insitu_engine::{HeadPromise, TransientCharge, key_hash};
use insitu_protocol::txn::{TxnAnchor, TxnId, TxnItem, TxnWrite};
use insitu_protocol::{Response, Status, encode_error};
use insitu_txn::{Anchor, Item, Participant, Refusal, Write};

use crate::handler::reply;
use crate::shard::ShardState;
pub(crate) use crate::txn_apply::settle_and_apply;
use crate::txn_durable;

/// How long a transaction may stay prepared before this participant stops
/// waiting for its client and resolves it with the primary. Why 2 s: a
/// client commits in a few round trips (well under 10 ms); a longer wait
/// only keeps keys locked after a client died, and a shorter one makes a
/// slow client's commit race its resolution (harmless: the primary's
/// decision stands either way, the client learns it).
pub const PREPARED_TIMEOUT: Duration = Duration::from_secs(2);
/// One call to another participant (resolve, inquire) must finish within
/// this; an unreachable participant leaves the transaction prepared, and the
/// next sweep tries again.
pub(crate) const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// A tablet move or bulk update waits this long for the tablet's
/// transaction locks to be released before giving up with Retry. Why: a
/// lock lives at most `PREPARED_TIMEOUT` plus a resolution unless a
/// participant is unreachable.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Where a prepared record is: (table, anchor key).
pub(crate) type RecordAt = (u64, Vec<u8>);
/// Where a decision record is: (table, anchor key, record class).
pub(crate) type DecisionAt = (u64, Vec<u8>, u8);
/// A recovered vote waiting for its proof: the participant's anchor and
/// the anchors of its sibling records (`txn_proof`).
pub(crate) type Unproven = (Anchor, Vec<Anchor>);

/// A shard's transactions: the participant state and what it holds.
pub struct ShardTxns {
    pub participant: RefCell<Participant>,
    /// What each prepared transaction holds until its decision is applied
    /// (`Held`). Present from the prepare (or the recovery of a record) on:
    /// a resent prepare finds it.
    pub(crate) held: RefCell<HashMap<TxnId, Held>>,
    /// The prepared records each transaction has here: (table, anchor key)
    /// per part (`txn_durable`). Absent: its parts have no records (a
    /// one-phase commit in one tablet).
    pub(crate) records: RefCell<HashMap<TxnId, Vec<RecordAt>>>,
    /// Decision records kept here (table, anchor key, class), removed when
    /// the participant forgets the decision. Several for one transaction
    /// when a recovery or a move brought the records of several of its
    /// participants here (each participant that commits keeps one).
    pub(crate) decided_records: RefCell<HashMap<TxnId, Vec<DecisionAt>>>,
    /// Transactions this shard prepared for their client as a participant
    /// other than the primary, whose *direct* decision (the client's own,
    /// after every vote was yes, sent to all at once) is still taken. Why a
    /// set of those allowed rather than those refused: a part taken back by
    /// a recovery or a move is never in it, and neither is one a primary
    /// deciding the orphan has asked about (`txn_resolve::inquire` takes it
    /// out); those learn the decision from the primary, whose answer may be
    /// a resolution's at another timestamp. Gone with the decision.
    pub(crate) direct_ok: RefCell<HashSet<TxnId>>,
    /// Votes a recovery or a move brought back in vote records that name
    /// siblings (participant's anchor, sibling anchors): no vote until
    /// `txn_proof::prove` finds every sibling. Gone with the decision.
    pub(crate) unproven: RefCell<HashMap<TxnId, Vec<Unproven>>>,
    /// Commit records beside parts that are not vote parts, to remove once
    /// the log holding them is durable (`log_changes` then): they keep a
    /// commit only for the moment its other groups may not be durable yet
    /// (`settle_and_apply`). Oldest first; the sweep removes them.
    pub(crate) passing_records: RefCell<VecDeque<(u64, TxnId, Vec<DecisionAt>)>>,
    /// Transactions whose decision is being applied (between the primary's
    /// anchor part and the rest, a durable wait): another caller waits for
    /// it instead of applying the rest out of order.
    pub(crate) applying: RefCell<HashSet<TxnId>>,
    /// The timestamp of each commit decided or learned here (none: aborted,
    /// or committed without one), answered to a resend or a resolution so
    /// every participant applies the commit at the same timestamp;
    /// forgotten with the decision.
    pub(crate) commit_ts: RefCell<HashMap<TxnId, u64>>,
    /// Plain writes waiting for their timestamp (`stamped.rs`): one-phase
    /// parts this shard made itself, which the sweep must not resolve (their
    /// writer applies or drops them when the oracle answers).
    pub(crate) stamping: RefCell<HashSet<TxnId>>,
    /// A client of the cluster, made on first use: it finds the shard that
    /// owns an anchor now (the coordinator's maps), for resolutions.
    pub(crate) client: tokio::sync::OnceCell<Client>,
    /// Origin of the participant's millisecond clock.
    epoch: Instant,
}

/// What a prepared transaction holds here until its decision is applied.
/// Several of each when a recovery brings several parts of one
/// transaction: every part keeps its own, none replaces another.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Memory-budget charges: its keys and values are copies held outside
    /// the log until decided.
    pub charges: Vec<TransientCharge>,
    /// Log room for each part's decision (`Engine::promise_head`): a
    /// committed write must never be refused for room once the vote is
    /// yes. Taken by `txn_durable::apply_part`, the rest dropped with this.
    pub promises: Vec<HeadPromise>,
}

impl Default for ShardTxns {
    fn default() -> Self {
        ShardTxns {
            participant: RefCell::new(Participant::new(insitu_txn::Limits::default())),
            held: RefCell::new(HashMap::new()),
            records: RefCell::new(HashMap::new()),
            decided_records: RefCell::new(HashMap::new()),
            direct_ok: RefCell::new(HashSet::new()),
            unproven: RefCell::new(HashMap::new()),
            passing_records: RefCell::new(VecDeque::new()),
            applying: RefCell::new(HashSet::new()),
            commit_ts: RefCell::new(HashMap::new()),
            stamping: RefCell::new(HashSet::new()),
            client: tokio::sync::OnceCell::new(),
            epoch: Instant::now(),
        }
    }
}

impl ShardTxns {
    pub(crate) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether a transaction holds `key`'s lock (plain writes then wait).
    #[inline]
    pub fn is_locked(&self, table: u64, key: &[u8]) -> bool {
        self.participant.borrow().locks().is_locked(table, key)
    }
}

/// Locks held on the tablet of `table` starting at `start_hash`.
pub fn locks_on_tablet(state: &ShardState, table: u64, start_hash: u64) -> usize {
    let p = state.txns.participant.borrow();
    if p.locks().is_empty() {
        return 0;
    }
    let Some(range) = state.engine.borrow().tablet_for(table, start_hash) else {
        return 0;
    };
    p.locks().count_in(table, range.start, range.end)
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

/// `TxnPrepare`: validate and lock, record the parts durably (the vote
/// leaves once they are held by the backups: the conn's ack rule); a
/// primary with no others commits at once. `writes`: whether the
/// transaction writes anywhere (when not, nothing is recorded).
#[allow(clippy::too_many_arguments)] // the request's fields, as dispatched
pub async fn prepare(
    state: &ShardState,
    id: u64,
    txn: TxnId,
    primary: Option<TxnAnchor<'_>>,
    others: Vec<TxnAnchor<'_>>,
    items: &[TxnItem<'_>],
    writes: bool,
    out: &mut BytesMut,
) {
    if !writes && items.iter().any(|it| !matches!(it.write, TxnWrite::None)) {
        return encode_error(
            out,
            id,
            Status::BadRequest,
            format!(
                "transaction {txn:#x}: a write item in a prepare that says the transaction writes nothing"
            ),
        );
    }
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
            if let TxnWrite::Put(v) | TxnWrite::PutExpiring { value: v, .. } = &it.write
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
                    // A deadline of 0 means none: the same as a plain put.
                    TxnWrite::PutExpiring {
                        value,
                        expires_at_ms: 0,
                    } => Write::Put(value.to_vec()),
                    TxnWrite::PutExpiring {
                        value,
                        expires_at_ms,
                    } => Write::PutExpiring(value.to_vec(), *expires_at_ms),
                },
            });
        }
    }
    let one_phase = primary.is_none() && others.is_empty();
    let is_primary = primary.is_none();
    let anchor = |a: &TxnAnchor<'_>| Anchor {
        table: a.table,
        key: a.key.to_vec(),
    };
    let primary = primary.as_ref().map(anchor);
    let others = others.iter().map(anchor).collect();
    let now = state.txns.now_ms();
    // Whether snapshots are read here as the keys are locked (same step).
    let needs_ts = state.versions.borrow().is_active();
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
    // The participant's anchor: its first item (the client names it so).
    let own = Anchor {
        table: items[0].table,
        key: items[0].key.to_vec(),
    };
    if state.txns.held.borrow().contains_key(&txn) || state.txns.records.borrow().contains_key(&txn)
    {
        // A resend of a prepare already taken: the same yes, once the first
        // has recorded the whole vote.
        let voted = state
            .txns
            .participant
            .borrow()
            .prepared(txn)
            .is_some_and(|p| p.voters.contains(&own));
        return match voted {
            true => reply(
                out,
                id,
                &Response::TxnPrepared {
                    needs_ts: state.versions.borrow().is_active(),
                },
            ),
            false => encode_error(
                out,
                id,
                Status::Retry,
                format!("transaction {txn:#x}: its prepare is still being recorded; ask again"),
            ),
        };
    }
    // The copies held until the decision count against the memory budget.
    let bytes = state
        .txns
        .participant
        .borrow()
        .prepared(txn)
        .map_or(0, |p| {
            p.items
                .iter()
                .map(|i| i.key.len() + txn_durable::value_len(i))
                .sum()
        });
    let charge = state.engine.borrow().try_charge_transient(bytes as u64);
    match charge {
        Ok(charge) => {
            let held = Held {
                charges: vec![charge],
                promises: Vec::new(),
            };
            state.txns.held.borrow_mut().insert(txn, held);
        }
        Err(_) => {
            abort_here(state, txn);
            return encode_error(
                out,
                id,
                Status::OutOfMemory,
                format!("transaction {txn:#x}: no memory to hold {bytes} bytes until the commit"),
            );
        }
    }
    // A one-phase commit that writes in one tablet needs no record: its
    // writes are one group in one log segment, so a crash keeps all of them
    // or none (a replica holds a prefix of a segment, and nothing after the
    // group belongs to it). Writes in several tablets (several logs) are
    // recorded first, like every two-phase part.
    let parts = {
        let engine = state.engine.borrow();
        let participant = state.txns.participant.borrow();
        participant.prepared(txn).map_or(0, |p| {
            txn_durable::parts(&engine, p, Some(&own))
                .iter()
                .filter(|part| !part.items.is_empty())
                .count()
        })
    };
    // A read-only transaction records nothing: nothing is applied anywhere,
    // so neither a vote nor the decision has anything to keep.
    if writes && (!one_phase || parts > 1) {
        // Every part's record in one step, the vote record (at the anchor)
        // naming the others: one replication wait (the conn's, before the
        // vote leaves). A tablet is recovered from its own log, so a crash
        // before the vote left may keep some of these records and lose
        // others; a recovered vote record then counts only once its
        // siblings are found (`txn_proof`).
        if let Err((status, why)) = txn_durable::write_prepared(state, txn, &own) {
            abort_here(state, txn);
            return encode_error(out, id, status, why);
        }
        if parts > 1 && crate::faults::crash_armed("prepare-after-records", txn) {
            let _ = wait_durable(state).await;
            crate::faults::crash_point("prepare-after-records", txn);
        }
    }
    // The log room of each part's decision, held from now on: once the vote
    // is yes, a commit must apply whatever fills the budget meanwhile. Taken
    // after the records (a record as large as its part's decision would not
    // fit a head beside it).
    if writes && let Err((status, why)) = crate::txn_room::promise_parts(state, txn, &own) {
        // Records written above are removed by the abort.
        settle_and_apply(state, txn, false, 0).await;
        return encode_error(out, id, status, why);
    }
    if crate::faults::fault_at("prepare-no-promise", txn)
        && let Some(held) = state.txns.held.borrow_mut().get_mut(&txn)
    {
        held.promises.clear();
    }
    // Every part is recorded (the conn makes the vote record durable before
    // this reply leaves, and before any answer to an inquiry): the vote
    // counts.
    state.txns.participant.borrow_mut().voted(txn, own);
    if one_phase {
        if parts > 1 {
            // The records must be held by the backups before any part
            // changes: a crash then finds every part, applied or recorded.
            if let Err(why) = wait_durable(state).await {
                return encode_error(out, id, Status::Internal, why);
            }
        }
        // While snapshots are read here, the commit needs a timestamp: one
        // taken now, with every key locked, is later than any snapshot that
        // could miss it (ARCHITECTURE.md, "Snapshot reads"). Otherwise none:
        // a snapshot arriving while this is prepared waits for it.
        let commit_ts = if state.versions.borrow().is_active() {
            match crate::txn_peers::oracle_timestamp(state).await {
                Ok(ts) => ts,
                Err(why) => {
                    settle_and_apply(state, txn, false, 0).await;
                    return encode_error(
                        out,
                        id,
                        Status::Retry,
                        format!("transaction {txn:#x} did not commit: {why}"),
                    );
                }
            }
        } else {
            0
        };
        let decided = settle_and_apply(state, txn, true, commit_ts).await;
        reply_decided(out, id, decided);
    } else {
        if !is_primary {
            state.txns.direct_ok.borrow_mut().insert(txn);
        }
        reply(out, id, &Response::TxnPrepared { needs_ts });
    }
}

/// Drop a prepare refused after the participant took it (nothing applied).
fn abort_here(state: &ShardState, txn: TxnId) {
    let now = state.txns.now_ms();
    state.txns.direct_ok.borrow_mut().remove(&txn);
    state.txns.unproven.borrow_mut().remove(&txn);
    state.txns.participant.borrow_mut().decide(txn, false, now);
    state.txns.held.borrow_mut().remove(&txn);
    state.txns.records.borrow_mut().remove(&txn);
    state.holds_released.notify_waiters();
}

/// Wait until everything the engine holds now is held by the backups.
pub(crate) async fn wait_durable(state: &ShardState) -> Result<(), String> {
    let changes = state.engine.borrow().log_changes();
    state
        .repl
        .wait_durable(changes)
        .await
        .map_err(|_| "this server was declared dead by the coordinator".to_string())
}

/// `TxnDecide`: take (or learn) the decision and apply it; answers the
/// decision that stands here. A commit for a transaction neither prepared
/// nor decided here is an abort: at the primary, no record means aborted
/// (presumed abort); a participant that voted yes holds its part.
///
/// A `direct` decision (the client's own after every yes vote, sent to all
/// participants at once) is refused with `Retry` by a participant other
/// than the primary that has no decision yet and is not in `direct_ok`: a
/// primary deciding the orphan asked it already, or its part came back from
/// a recovery or a move. The client then relays the primary's answer. Why:
/// the primary commits an orphan at a timestamp of its own unless a
/// participant it asks has committed (then at that one); a participant
/// that answered "prepared" must take the primary's, not the client's.
pub async fn decide(
    state: &ShardState,
    id: u64,
    txn: TxnId,
    (commit, commit_ts): (bool, u64),
    direct: bool,
    out: &mut BytesMut,
) {
    let (known, decided, primary_here) = {
        let p = state.txns.participant.borrow();
        let prepared = p.prepared(txn);
        (
            prepared.is_some() || p.decision(txn).is_some(),
            p.decision(txn).is_some(),
            prepared.is_some_and(|p| p.is_primary),
        )
    };
    if direct && !decided && !primary_here && !state.txns.direct_ok.borrow().contains(&txn) {
        return encode_error(
            out,
            id,
            Status::Retry,
            format!(
                "transaction {txn:#x}: this participant takes its decision from the primary (a resolution asked it, or its part was recovered); ask the primary"
            ),
        );
    }
    let decided = settle_and_apply(state, txn, commit && known, commit_ts).await;
    if direct && crate::faults::crash_armed("decide-after-apply", txn) {
        let _ = wait_durable(state).await;
        crate::faults::crash_point("decide-after-apply", txn);
    }
    reply_decided(out, id, decided);
}

/// Answer the decision that stands and its commit timestamp.
pub(crate) fn reply_decided(out: &mut BytesMut, id: u64, (committed, commit_ts): (bool, u64)) {
    reply(
        out,
        id,
        &Response::TxnDecided {
            committed,
            commit_ts,
        },
    );
}
