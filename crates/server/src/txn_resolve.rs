//! Orphaned transactions: a participant left prepared past
//! `PREPARED_TIMEOUT` (its client went silent) asks the primary's anchor
//! (`TxnResolve`); an undecided primary asks every other participant where
//! it stands (`TxnInquire`), then decides. ARCHITECTURE.md, "Transactions",
//! "A client that goes silent" and "Whose vote an inquiry asks about".

use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use insitu_engine::key_hash;
use insitu_protocol::txn::{TxnAnchor, TxnId, TxnPhase};
use insitu_protocol::{Request, Response, Status, blob, encode_error};
use insitu_txn::{Anchor, Phase};

use crate::handler::reply;
use crate::shard::ShardState;
use crate::txn::{PREPARED_TIMEOUT, settle_and_apply};
use crate::txn_durable;
use crate::txn_peers::{Unrouted, routed_call};
use crate::txn_proof::{self, Proof};

/// How often overdue transactions and expired decisions are looked for.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// `TxnInquire`: where the participant named by `anchor` stands on the
/// transaction here. Its reply waits, like a write's, until the log is
/// durable (`handler`'s `exposes`): a `Prepared` answer then speaks of a
/// vote record the backups hold, a `Committed` one of a commit record.
///
/// From this answer on, the client's direct decision is refused here
/// (`direct_ok`): a primary told "prepared" may commit at a timestamp of
/// its own, and this participant must then take that one.
///
/// A vote a recovery brought back waits for its proof first (`txn_proof`):
/// a sibling that committed answers `Committed`, one missing makes it no
/// vote. With `part`, the question is about the part recorded at `anchor`
/// (`txn_proof::part_phase`), asked by a shard proving such a vote.
pub async fn inquire(
    state: &ShardState,
    id: u64,
    txn: TxnId,
    anchor: TxnAnchor<'_>,
    part: bool,
    out: &mut BytesMut,
) {
    let anchor = Anchor {
        table: anchor.table,
        key: anchor.key.to_vec(),
    };
    if part {
        // A question about a recovered vote's sibling: the part here is a
        // recovered one too (never in `direct_ok`), or this shard's own
        // vote is asked about on its own, which locks it out below.
        if !txn_proof::owned_here(state, &anchor) {
            let s = txn_proof::NOT_OWNED;
            return encode_error(
                out,
                id,
                s,
                format!("transaction {txn:#x}: the part's anchor is not served here ({s})"),
            );
        }
        let phase = txn_proof::part_phase(state, txn, &anchor);
        return reply(out, id, &Response::TxnPhase(phase));
    }
    state.txns.direct_ok.borrow_mut().remove(&txn);
    match txn_proof::prove(state, txn, &anchor).await {
        Err(why) => {
            return encode_error(
                out,
                id,
                Status::Retry,
                format!("transaction {txn:#x}: its recovered vote cannot be proven yet: {why}"),
            );
        }
        Ok(Some(Proof::Committed(commit_ts))) => {
            return reply(
                out,
                id,
                &Response::TxnPhase(TxnPhase::Committed { commit_ts }),
            );
        }
        Ok(_) => {}
    }
    let now = state.txns.now_ms();
    let phase = match state.txns.participant.borrow_mut().phase(txn, &anchor, now) {
        Phase::Prepared => TxnPhase::Prepared,
        Phase::Committed => TxnPhase::Committed {
            commit_ts: state
                .txns
                .commit_ts
                .borrow()
                .get(&txn)
                .copied()
                .unwrap_or(0),
        },
        Phase::Aborted => TxnPhase::Aborted,
    };
    reply(out, id, &Response::TxnPhase(phase));
}

/// `TxnResolve` (this shard owns the primary's anchor): the decision,
/// taking it first if there is none yet.
pub async fn resolve(
    state: &ShardState,
    id: u64,
    txn: TxnId,
    anchor: TxnAnchor<'_>,
    out: &mut BytesMut,
) {
    // Only the anchor's owner may answer: "no record here" means aborted
    // only where the record would be.
    let owned =
        crate::handler::admit_tablet(state, anchor.table, anchor.key, false).and_then(|()| {
            let hash = key_hash(anchor.table, anchor.key);
            match state.engine.borrow().tablet_for(anchor.table, hash) {
                Some(_) => Ok(()),
                None => Err(Status::UnknownTablet),
            }
        });
    if let Err(s) = owned {
        return encode_error(
            out,
            id,
            s,
            format!("transaction {txn:#x}: the primary's anchor is not served here ({s})"),
        );
    }
    let anchor = Anchor {
        table: anchor.table,
        key: anchor.key.to_vec(),
    };
    match resolve_as_primary(state, txn, Some(&anchor)).await {
        Ok(decided) => crate::txn::reply_decided(out, id, decided),
        Err(why) => encode_error(out, id, Status::Retry, why),
    }
}

/// Take the decision the primary must: commit if every participant is
/// prepared (all voted yes) or one has committed (the client told it: all
/// voted yes), at that one's timestamp; abort if any is not (asking it
/// aborts it there). `anchor`: the primary's anchor, when a participant
/// asked (then a transaction unknown here is aborted durably). Err: a
/// participant could not be asked; nothing was decided.
async fn resolve_as_primary(
    state: &ShardState,
    txn: TxnId,
    anchor: Option<&Anchor>,
) -> Result<(bool, u64), String> {
    let decided = state.txns.participant.borrow().decision(txn);
    if let Some(d) = decided {
        // A part restored beside its decision is applied now.
        return Ok(settle_and_apply(state, txn, d, 0).await);
    }
    // A primary's vote a recovery brought back is whole only once proven.
    let primary_anchor = {
        let p = state.txns.participant.borrow();
        p.prepared(txn)
            .filter(|p| p.is_primary)
            .map(|p| p.primary.clone())
    };
    if let Some(primary_anchor) = primary_anchor {
        match txn_proof::prove(state, txn, &primary_anchor).await? {
            Some(Proof::Committed(commit_ts)) => {
                return Ok(settle_and_apply(state, txn, true, commit_ts).await);
            }
            Some(Proof::Whole | Proof::NotWhole) | None => {}
        }
    }
    let (decided, prepared) = {
        let p = state.txns.participant.borrow();
        (
            p.decision(txn),
            p.prepared(txn).map(|p| {
                // The primary's own vote: whole (every part recorded) only
                // once its prepare wrote every record, or a recovered vote
                // record was proven (above).
                let own_vote = p.voters.contains(&p.primary);
                (p.is_primary && own_vote, p.is_primary, p.others.clone())
            }),
        )
    };
    if let Some(d) = decided {
        // Decided while the vote was being proven.
        return Ok(settle_and_apply(state, txn, d, 0).await);
    }
    let others = match prepared {
        Some((true, _, others)) => others,
        // The primary's part is here but its vote is not whole (still being
        // recorded, or a recovery found some of its records and not its
        // vote record): it never voted yes, so the outcome is an abort.
        Some((false, true, _)) => return Ok(settle_and_apply(state, txn, false, 0).await),
        // Not prepared here as the primary: no anchor record, no decision
        // record, so the primary never voted yes or aborted (presumed
        // abort). Recorded durably when the primary's prepare may still
        // come (a participant asked first), so it is refused even after a
        // crash here.
        Some((false, false, _)) | None => {
            if let Some(anchor) = anchor {
                let now = state.txns.now_ms();
                state.txns.participant.borrow_mut().settle(txn, false, now);
                txn_durable::record_abort(state, txn, anchor);
            }
            return Ok(settle_and_apply(state, txn, false, 0).await);
        }
    };
    let mut all_prepared = true;
    // The timestamp of a commit a participant took from the client (every
    // one it took is the same: the client sends one).
    let mut committed_at: Option<u64> = None;
    for other in &others {
        let phase = match crate::txn_peers::inquire(state, txn, other, false).await {
            Ok(p) => p,
            // The participant's table is gone, and its vote with it: it
            // never voted yes as far as anyone can learn now, and nothing
            // was decided yet (checked above), so aborting is safe.
            Err(Unrouted::TableGone(why)) => {
                tracing::warn!(
                    shard = state.index,
                    txn,
                    "a participant's table is gone, so the transaction aborts: {why}"
                );
                TxnPhase::Aborted
            }
            Err(Unrouted::Failed(why)) => return Err(why),
        };
        match phase {
            TxnPhase::Prepared => {}
            // The client told it the commit directly (every vote was yes):
            // the outcome is that commit, at its timestamp.
            TxnPhase::Committed { commit_ts } => {
                committed_at.get_or_insert(commit_ts);
            }
            TxnPhase::Aborted => all_prepared = false,
        }
    }
    let commit = match (committed_at, all_prepared) {
        (Some(_), false) => {
            // Cannot happen: a commit is taken only after every yes vote,
            // and a participant that voted yes never answers aborted. The
            // commit applied somewhere cannot be taken back, so it stands.
            tracing::error!(
                shard = state.index,
                txn,
                "a participant committed and another never voted yes: committing"
            );
            true
        }
        (Some(_), true) => true,
        (None, all_prepared) => all_prepared,
    };
    // A commit's timestamp is the one a participant committed at, else one
    // taken now, every participant holding its locks (as a client takes it
    // after the votes). Unreachable oracle: nothing is decided, the next
    // sweep tries again.
    let commit_ts = match (commit, committed_at) {
        (true, Some(ts)) => ts,
        (true, None) => crate::txn_peers::oracle_timestamp(state).await?,
        (false, _) => 0,
    };
    // The client's own decision may have come while we asked: it stands.
    Ok(settle_and_apply(state, txn, commit, commit_ts).await)
}

/// Remove the commit records that kept a commit only until every group of
/// it was durable (`ShardTxns::passing_records`), oldest first, once the
/// log that held them is. Why wait: removed while another part's group may
/// still be lost, a crash could leave that part applied with nothing saying
/// so in its log (`settle_and_apply`).
async fn remove_passing_records(state: &ShardState) {
    loop {
        let Some(changes) = state.txns.passing_records.borrow().front().map(|e| e.0) else {
            return;
        };
        if state.repl.wait_durable(changes).await.is_err() {
            return; // declared dead: nothing is removed any more
        }
        // Everything queued by then is durable too: drained at once.
        let done: Vec<_> = {
            let mut queue = state.txns.passing_records.borrow_mut();
            let n = queue.iter().take_while(|e| e.0 <= changes).count().max(1);
            queue.drain(..n).collect()
        };
        let mut engine = state.engine.borrow_mut();
        for (_, txn, records) in done {
            for (table, anchor, class) in records {
                // A tablet moved away took its records along: nothing here.
                let _ = engine.remove_record(
                    table,
                    &anchor,
                    insitu_engine::RecordId { class, id: txn },
                );
            }
        }
    }
}

/// The shard's resolver: transactions prepared here for longer than
/// `PREPARED_TIMEOUT` are resolved (as primary: decided; else: the
/// primary's decision is asked and applied), and old decisions forgotten
/// with their records.
pub async fn sweep(state: Rc<ShardState>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let now = state.txns.now_ms();
        let (overdue, gone) = {
            let mut p = state.txns.participant.borrow_mut();
            let gone = p.expire(now);
            (p.overdue(now, PREPARED_TIMEOUT.as_millis() as u64), gone)
        };
        txn_durable::forget(&state, &gone);
        remove_passing_records(&state).await;
        // Kept versions past their time go; keeping stops when snapshots do.
        // A step at a time, yielding between: a reset may leave 64 MiB.
        while state
            .versions
            .borrow_mut()
            .expire(std::time::Instant::now())
        {
            tokio::task::yield_now().await;
        }
        for txn in overdue {
            if state.txns.stamping.borrow().contains(&txn) {
                continue; // a plain write waiting for its timestamp (`stamped.rs`)
            }
            let primary = state
                .txns
                .participant
                .borrow()
                .prepared(txn)
                .map(|p| (p.is_primary, p.primary.clone()));
            let Some((is_primary, anchor)) = primary else {
                continue; // decided meanwhile
            };
            let outcome = if is_primary {
                resolve_as_primary(&state, txn, None).await
            } else {
                let request = Request::TxnResolve {
                    txn,
                    anchor: TxnAnchor {
                        table: anchor.table,
                        key: blob(&anchor.key),
                    },
                };
                match routed_call(&state, &anchor, &request).await {
                    Ok(Response::TxnDecided {
                        committed,
                        commit_ts,
                    }) => Ok(settle_and_apply(&state, txn, committed, commit_ts).await),
                    Ok(other) => Err(format!("answered {other:?} to TxnResolve")),
                    // The primary's table is gone, and its decision record
                    // with it (ARCHITECTURE.md, "A client that goes silent":
                    // dropping a table under a transaction). No one can say
                    // how it ended any more: abort here rather than lock the
                    // keys for ever.
                    Err(Unrouted::TableGone(why)) => {
                        tracing::warn!(
                            shard = state.index,
                            txn,
                            "the primary's table is gone, so this part aborts: {why}"
                        );
                        Ok(settle_and_apply(&state, txn, false, 0).await)
                    }
                    Err(Unrouted::Failed(why)) => Err(why),
                }
            };
            match outcome {
                Ok((committed, commit_ts)) => tracing::info!(
                    shard = state.index,
                    txn,
                    committed,
                    commit_ts,
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
