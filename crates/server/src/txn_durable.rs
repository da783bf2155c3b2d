//! The durable side of a shard's transactions: the records a participant
//! keeps in its tablets' logs (`insitu_txn::record`), the order in which a
//! decision reaches the log, and taking the state back from the records
//! after a recovery or a tablet move. ARCHITECTURE.md, "Transactions",
//! "Durable records", has the crash cases this order answers.
//!
//! A *part* is what a transaction does in one tablet here: its writes, and
//! the record that holds them until the decision. Why per tablet: a tablet
//! is recovered on its own (onto any server), and its log is the only thing
//! that survives with it. Why each part's decision is one *group* of
//! appends in one log segment (`Engine::reserve_head`): a backup's replica
//! of a segment holds a prefix of it, so after a crash the record's removal
//! is present only if every write of the group before it is.

use std::collections::HashMap;

use insitu_engine::{Engine, EngineError, RecordId, key_hash, max_entry_bytes};
use insitu_protocol::Status;
use insitu_txn::{
    Anchor, CLASS_ABORTED, CLASS_COMMITTED, CLASS_PREPARED, Item, Prepared, PreparedRecord,
    RecordItem, TxnId, Write,
};

use crate::shard::ShardState;
use crate::txn::{DecisionAt, RecordAt};

/// One tablet's part of a prepared transaction.
#[derive(Debug)]
pub(crate) struct Part {
    pub table: u64,
    /// The key its record is anchored at: the primary's anchor for the
    /// primary's anchor tablet, else the part's first written key.
    pub anchor: Vec<u8>,
    /// Whether this is the primary's anchor tablet (its record names the
    /// other participants; the commit record goes beside it).
    pub primary_anchor: bool,
    /// Whether its record is a participant's vote record (`write_prepared`):
    /// a commit leaves a commit record beside it too, so that participant
    /// can say it committed, and at which timestamp, after a crash.
    pub vote: bool,
    /// Its written items (reads need no record).
    pub items: Vec<Item>,
    /// Whether a prepared record of the transaction is kept in this tablet
    /// (at `anchor`): its removal joins the part's decision group. Set by
    /// `attach_records` from the records actually written or restored.
    pub record: bool,
}

impl Part {
    /// Whether a commit keeps its decision beside this part's record (a
    /// commit record in its group): the primary's anchor part and every
    /// vote part. Why every participant's and not the primary's alone: the
    /// client tells all participants a commit at once, so one may apply its
    /// writes before the primary has anything durable; the commit record it
    /// keeps is what a primary deciding the orphan, or its own recovery,
    /// learns the commit and its timestamp from.
    pub fn keeps_decision(&self) -> bool {
        self.primary_anchor || self.vote
    }
}

/// Mark the parts whose record is the vote record of one of `voters` (the
/// participants whose yes vote this shard holds).
pub(crate) fn mark_votes(parts: &mut [Part], voters: &[Anchor]) {
    for part in parts.iter_mut().filter(|p| p.record) {
        part.vote = voters
            .iter()
            .any(|v| v.table == part.table && v.key == part.anchor);
    }
}

/// A prepared transaction's parts here, the primary's anchor part first.
/// `own`: the participant's anchor when it prepares here; its tablet gets a
/// part keyed at it even if nothing is written there (the *vote part*,
/// whose record is written last, see `write_prepared`); the primary's
/// anchor part is the primary's vote part. Tablets are found through the
/// engine; an item whose tablet is gone (a bug: tablets with locks neither
/// move nor split away) forms its own part.
pub(crate) fn parts(engine: &Engine, p: &Prepared, own: Option<&Anchor>) -> Vec<Part> {
    let tablet_of = |table: u64, hash: u64| engine.tablet_for(table, hash).map(|r| r.start);
    let mut order: Vec<(u64, Option<u64>)> = Vec::new();
    let mut by_tablet: HashMap<(u64, Option<u64>), Part> = HashMap::new();
    let first = match (p.is_primary, own) {
        (true, _) => Some((&p.primary, true)),
        (false, Some(own)) => Some((own, false)),
        (false, None) => None,
    };
    if let Some((anchor, primary_anchor)) = first {
        let t = (
            anchor.table,
            tablet_of(anchor.table, key_hash(anchor.table, &anchor.key)),
        );
        order.push(t);
        by_tablet.insert(
            t,
            Part {
                table: anchor.table,
                anchor: anchor.key.clone(),
                primary_anchor,
                // The participant's own anchor part (the primary's is its
                // anchor part) holds its vote record.
                vote: true,
                items: Vec::new(),
                record: false,
            },
        );
    }
    for item in p.items.iter().filter(|i| i.write != Write::None) {
        let t = (item.table, tablet_of(item.table, item.hash));
        by_tablet
            .entry(t)
            .or_insert_with(|| {
                order.push(t);
                Part {
                    table: item.table,
                    anchor: item.key.clone(),
                    primary_anchor: false,
                    vote: false,
                    items: Vec::new(),
                    record: false,
                }
            })
            .items
            .push(item.clone());
    }
    order
        .into_iter()
        .filter_map(|t| by_tablet.remove(&t))
        .collect()
}

/// Join the records `recorded` (table, key) of a transaction to its parts:
/// each goes with the part in its tablet, whose group then removes it at
/// that key; a record in a tablet with no part (a vote record at a key
/// only read) becomes a part of its own, with nothing to write. Why by
/// tablet and not by key: the records of a shard's transaction may come
/// from several participants (a recovery or a move merged them), each
/// keyed by its own rule, and every one must go with the decision.
pub(crate) fn attach_records(engine: &Engine, parts: &mut Vec<Part>, recorded: &[RecordAt]) {
    let tablet_of = |table: u64, key: &[u8]| {
        engine
            .tablet_for(table, key_hash(table, key))
            .map(|r| r.start)
    };
    for (table, key) in recorded {
        let at = tablet_of(*table, key);
        let part = parts
            .iter_mut()
            .find(|p| !p.record && p.table == *table && tablet_of(p.table, &p.anchor) == at);
        match part {
            Some(part) => {
                part.anchor = key.clone();
                part.record = true;
            }
            None => parts.push(Part {
                table: *table,
                anchor: key.clone(),
                primary_anchor: false,
                vote: false,
                items: Vec::new(),
                record: true,
            }),
        }
    }
}

/// Most bytes a part's decision appends in one group: the commit record
/// (every part of a commit has one), every write, the record's removal.
pub(crate) fn group_bytes(part: &Part) -> usize {
    let writes: usize = part
        .items
        .iter()
        .map(|i| match i.write.value() {
            // The widest header, deadline included.
            Some(v) => max_entry_bytes(i.key.len(), v.len()),
            None => max_entry_bytes(i.key.len(), 8),
        })
        .sum();
    let commit = max_entry_bytes(part.anchor.len(), 9);
    commit + writes + max_entry_bytes(part.anchor.len(), 17)
}

fn prepared_id(txn: TxnId) -> RecordId {
    RecordId {
        class: CLASS_PREPARED,
        id: txn,
    }
}

fn status_of(e: &EngineError) -> Status {
    crate::handler::engine_status(e)
}

/// Write the prepared records of `txn` (prepared in the participant whose
/// anchor is `own`), one per part, all in one step: the vote part's record
/// (the *vote record*, at `own`, or at the primary's anchor for the
/// primary) names the others as its siblings. Returns how many it wrote.
/// Refused (and nothing of this call left written) if a part's decision
/// would not fit one log segment or the engine refuses a record.
///
/// Why the siblings: each tablet's log is replicated and recovered on its
/// own, so a crash before the vote left may keep some of its records and
/// lose others. A recovered vote record counts as a vote only once every
/// sibling is found (`txn_proof`); only a counted vote makes a participant
/// `Prepared` to a primary deciding an orphan, or lets a recovered primary
/// commit one. The caller makes every record durable before the vote
/// leaves (the conn's ack rule).
pub(crate) fn write_prepared(
    state: &ShardState,
    txn: TxnId,
    own: &Anchor,
) -> Result<usize, (Status, String)> {
    let mut engine = state.engine.borrow_mut();
    let participant = state.txns.participant.borrow();
    let Some(p) = participant.prepared(txn) else {
        return Ok(0);
    };
    let parts = parts(&engine, p, Some(own));
    for part in &parts {
        crate::txn_room::check_fits(&engine, txn, part)?;
    }
    let mut written: Vec<(u64, Vec<u8>)> = Vec::with_capacity(parts.len());
    // The vote part is the first (`parts`); the others are its siblings.
    let siblings: Vec<Anchor> = parts[1..]
        .iter()
        .map(|part| Anchor {
            table: part.table,
            key: part.anchor.clone(),
        })
        .collect();
    // Injected for tests: the siblings' records are not written, as if a
    // crash had kept the vote record alone (`faults.rs`).
    let lose_siblings = crate::faults::fault_at("prepare-lose-part-records", txn);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 && lose_siblings {
            continue;
        }
        let record = PreparedRecord {
            primary: p.primary.clone(),
            participant: Some(own.clone()),
            siblings: (i == 0).then(|| siblings.clone()),
            others: if part.primary_anchor {
                p.others.clone()
            } else {
                Vec::new()
            },
            items: part
                .items
                .iter()
                .map(|i| RecordItem {
                    table: i.table,
                    key: i.key.clone(),
                    write: i.write.clone(),
                })
                .collect(),
        };
        if let Err(e) =
            engine.put_record(part.table, &part.anchor, prepared_id(txn), &record.encode())
        {
            for (table, anchor) in &written {
                let _ = engine.remove_record(*table, anchor, prepared_id(txn));
            }
            return Err((
                status_of(&e),
                format!(
                    "transaction {txn:#x}: cannot record its part in table {}: {e}",
                    part.table
                ),
            ));
        }
        written.push((part.table, part.anchor.clone()));
    }
    drop(participant);
    let n = written.len();
    if n > 0 {
        note_records(state, txn, written);
    }
    Ok(n)
}

/// Remember that `txn` has prepared records at `at` here (its decision
/// removes them: `attach_records`).
fn note_records(state: &ShardState, txn: TxnId, at: impl IntoIterator<Item = RecordAt>) {
    let mut records = state.txns.records.borrow_mut();
    records.entry(txn).or_default().extend(at);
}

/// What `apply_part` writes besides the part's own changes.
#[derive(Clone, Copy)]
pub(crate) struct GroupPlan {
    /// The decision (apply the writes or not).
    pub commit: bool,
    /// Write the commit record first (the primary's anchor part of a commit
    /// that has records elsewhere to answer).
    pub commit_record: bool,
    /// The part has a prepared record to remove.
    pub has_record: bool,
    /// The commit's timestamp (0: none): kept in the commit record, and the
    /// values its writes replace are kept for snapshot reads under it.
    pub commit_ts: u64,
}

/// Append one part's decision as one group: the commit record, the writes
/// (on a commit), the record's removal, in one log segment, in the room
/// its prepare promised (`txn_room`), or one `txn_room::room_for_commit`
/// made before a commit is applied (a part a recovery took back without
/// room waits for it). So a commit's writes are never refused for room; a
/// refusal left (an abort's record removal without a promise) is logged.
/// Returns where the commit record was written, for the caller to keep
/// (`keep_decision_record`) or remove once durable.
pub(crate) fn apply_part(
    state: &ShardState,
    txn: TxnId,
    part: &Part,
    plan: GroupPlan,
) -> Option<DecisionAt> {
    let promise = crate::txn_room::take_promise(state, txn, part);
    let mut engine = state.engine.borrow_mut();
    let hash = key_hash(part.table, &part.anchor);
    let bytes = group_bytes(part);
    let room = match promise {
        Some(promise) => engine.reserve_promised_head(promise, bytes),
        None => engine.reserve_head(part.table, hash, bytes),
    };
    if let Err(e) = room {
        tracing::warn!(
            shard = state.index,
            txn,
            table = part.table,
            "a transaction's decision may span two log segments: {e}"
        );
    }
    let mut kept = None;
    if plan.commit_record {
        let id = RecordId {
            class: CLASS_COMMITTED,
            id: txn,
        };
        let payload = insitu_txn::commit_payload(plan.commit_ts);
        match engine.put_record(part.table, &part.anchor, id, &payload) {
            Ok(()) => kept = Some((part.table, part.anchor.clone(), CLASS_COMMITTED)),
            Err(e) => tracing::error!(
                shard = state.index,
                txn,
                "cannot record a commit decision: {e}"
            ),
        }
    }
    if plan.commit {
        let rules = insitu_engine::RejectRules::default();
        let mut versions = state.versions.borrow_mut();
        let now = std::time::Instant::now();
        // Reads (`Write::None`) change nothing: skipped.
        for item in part
            .items
            .iter()
            .filter(|i| !matches!(i.write, Write::None))
        {
            // What a move of its tablet carries (`commit_bound.rs`).
            versions.commits.applied(item.table, plan.commit_ts);
            if versions.is_active() && plan.commit_ts != 0 {
                // The object this commit replaces, for snapshots before
                // it (one past its deadline too: an older snapshot sees it).
                let before = engine
                    .read_expired_too(item.table, &item.key)
                    .ok()
                    .map(crate::versions::Before::from);
                versions.keep(
                    (item.table, &item.key, item.hash),
                    plan.commit_ts,
                    before,
                    now,
                    |n| engine.try_charge_transient(n).ok(),
                );
            }
            let result = match &item.write {
                Write::Put(v) => engine.write(item.table, &item.key, v, &rules).map(|_| ()),
                Write::PutExpiring(v, deadline) => engine
                    .write_expiring(item.table, &item.key, v, *deadline, &rules)
                    .map(|_| ()),
                Write::Remove => match engine.remove(item.table, &item.key, &rules) {
                    Err(EngineError::ObjectDoesntExist) => Ok(()),
                    r => r.map(|_| ()),
                },
                Write::None => unreachable!("reads are filtered out above"),
            };
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
    if plan.has_record
        && let Err(e) = engine.remove_record(part.table, &part.anchor, prepared_id(txn))
    {
        tracing::error!(
            shard = state.index,
            txn,
            "cannot remove a decided transaction's record: {e}"
        );
    }
    kept
}

/// Remember a decision record of `txn` kept here (removed when the
/// decision is forgotten: `forget`); one already remembered is not doubled.
pub(crate) fn keep_decision_record(state: &ShardState, txn: TxnId, at: DecisionAt) {
    let mut records = state.txns.decided_records.borrow_mut();
    let kept = records.entry(txn).or_default();
    if !kept.contains(&at) {
        kept.push(at);
    }
}

/// Record at the primary's anchor that `txn` was aborted before its
/// prepare arrived here (a participant's resolution asked first), so the
/// prepare, if it comes after a crash of this server, is still refused.
pub(crate) fn record_abort(state: &ShardState, txn: TxnId, anchor: &Anchor) {
    let id = RecordId {
        class: CLASS_ABORTED,
        id: txn,
    };
    match state
        .engine
        .borrow_mut()
        .put_record(anchor.table, &anchor.key, id, &[])
    {
        Ok(()) => {
            keep_decision_record(
                state,
                txn,
                (anchor.table, anchor.key.clone(), CLASS_ABORTED),
            );
        }
        Err(e) => tracing::error!(
            shard = state.index,
            txn,
            "cannot record an abort decision: {e}"
        ),
    }
}

/// Remove the decision records of decisions forgotten (their time to live
/// passed): nobody can ask about them any more.
pub(crate) fn forget(state: &ShardState, gone: &[TxnId]) {
    if gone.is_empty() {
        return;
    }
    let mut records = state.txns.decided_records.borrow_mut();
    let mut engine = state.engine.borrow_mut();
    let mut stamps = state.txns.commit_ts.borrow_mut();
    for txn in gone {
        stamps.remove(txn);
        for (table, anchor, class) in records.remove(txn).unwrap_or_default() {
            // A tablet moved away took its records along: nothing here.
            let _ = engine.remove_record(table, &anchor, RecordId { class, id: *txn });
        }
    }
}

/// Take back the transaction state held in one tablet's records (after a
/// recovery replayed it, or a move installed it): prepared parts lock their
/// keys again, decisions are known again. Overdue parts are resolved by the
/// sweep (`txn_resolve::sweep`) as if their client had gone silent.
pub(crate) fn restore_tablet(state: &ShardState, table: u64, start_hash: u64) -> usize {
    let records = state.engine.borrow().records(table, start_hash);
    let n = records.len();
    for r in records {
        restore_record(state, table, r.id, &r.anchor, &r.payload);
    }
    n
}

/// Take back one record (see `restore_tablet`).
pub(crate) fn restore_record(
    state: &ShardState,
    table: u64,
    id: RecordId,
    anchor: &[u8],
    payload: &[u8],
) {
    let now = state.txns.now_ms();
    let txn = id.id;
    match id.class {
        CLASS_PREPARED => {
            let record = match PreparedRecord::decode(payload) {
                Ok(r) => r,
                Err(why) => {
                    tracing::error!(
                        shard = state.index,
                        txn,
                        table,
                        "a transaction record cannot be read; its keys are not locked: {why}"
                    );
                    return;
                }
            };
            let is_primary = record.primary.table == table && record.primary.key == anchor;
            // The record kept at the participant's own anchor is its vote
            // record: finding it with every sibling it names proves the
            // whole vote survived (`write_prepared`, `txn_proof`).
            let vote = record
                .participant
                .clone()
                .filter(|a| a.table == table && a.key == anchor);
            let items: Vec<Item> = record
                .items
                .into_iter()
                .map(|i| Item {
                    hash: key_hash(i.table, &i.key),
                    table: i.table,
                    key: i.key,
                    read_version: None,
                    write: i.write,
                })
                .collect();
            let bytes: usize = items.iter().map(|i| i.key.len() + value_len(i)).sum();
            let restored_items = items.clone();
            if let Err(why) = state.txns.participant.borrow_mut().restore(
                txn,
                record.primary,
                is_primary,
                record.others,
                items,
                now,
            ) {
                tracing::error!(shard = state.index, txn, "restoring a transaction: {why}");
            }
            let vote_part = vote.is_some();
            match (vote, record.siblings) {
                // A vote record naming siblings counts once they are found.
                (Some(vote), Some(siblings)) if !siblings.is_empty() => {
                    let mut unproven = state.txns.unproven.borrow_mut();
                    let votes = unproven.entry(txn).or_default();
                    if !votes.iter().any(|(a, _)| *a == vote) {
                        votes.push((vote, siblings));
                    }
                }
                // One with none is the whole vote; a format-2 one was
                // written after its siblings were durable.
                (Some(vote), _) => state.txns.participant.borrow_mut().voted(txn, vote),
                (None, _) => {}
            }
            note_records(state, txn, [(table, anchor.to_vec())]);
            // Charged and given its decision's room when they fit; a
            // recovery is never refused for them.
            if let Ok(charge) = state.engine.borrow().try_charge_transient(bytes as u64) {
                let mut held = state.txns.held.borrow_mut();
                held.entry(txn).or_default().charges.push(charge);
            }
            let part = Part {
                table,
                anchor: anchor.to_vec(),
                primary_anchor: is_primary,
                vote: vote_part,
                items: restored_items,
                record: true,
            };
            crate::txn_room::promise_restored(state, txn, &part);
        }
        CLASS_COMMITTED | CLASS_ABORTED => {
            let committed = id.class == CLASS_COMMITTED;
            if committed {
                match insitu_txn::decode_commit_payload(payload) {
                    Ok(0) => {}
                    Ok(ts) => {
                        state.txns.commit_ts.borrow_mut().insert(txn, ts);
                    }
                    Err(why) => tracing::error!(
                        shard = state.index,
                        txn,
                        "a commit record's timestamp cannot be read (the commit stands, without it): {why}"
                    ),
                }
            }
            state
                .txns
                .participant
                .borrow_mut()
                .restore_decision(txn, committed, now);
            keep_decision_record(state, txn, (table, anchor.to_vec(), id.class));
        }
        // An update's progress: read where it is needed (update_log.rs).
        crate::update_log::CLASS_UPDATE => {}
        other => tracing::error!(
            shard = state.index,
            txn,
            "a record of unknown class {other} is kept but not understood"
        ),
    }
}

pub(crate) fn value_len(i: &Item) -> usize {
    i.write.value().map_or(0, <[u8]>::len)
}
