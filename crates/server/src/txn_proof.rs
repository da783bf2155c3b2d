//! Whether a participant's vote, found again in a recovered vote record, is
//! whole. ARCHITECTURE.md, "Durable records", "The vote record".
//!
//! A participant writes every part's prepared record in one step (one
//! replication wait) and its vote leaves only once all of them are held by
//! the backups. But each tablet's log is recovered on its own, from its own
//! replicas: a crash before the vote left may keep the vote record and lose
//! a sibling's record. So a recovered vote record (format 3) names its
//! siblings, and the vote counts only once each sibling is found where it
//! was written, held by the owner of its tablet now: its record (the vote
//! is whole), or a commit decided there (the transaction committed: every
//! vote was whole). A sibling found nowhere, with nothing decided, proves
//! the vote never left: it is no vote, and the primary aborts.
//!
//! Why this is asked only after a recovery: a participant that prepared
//! here and did not crash knows its records were written together, and its
//! answers wait (the ack rule) until the backups hold them.

use insitu_engine::key_hash;
use insitu_protocol::Status;
use insitu_protocol::txn::{TxnId, TxnPhase};
use insitu_txn::Anchor;

use crate::shard::ShardState;
use crate::txn_peers::{Unrouted, inquire};

/// What proving a recovered vote found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Proof {
    /// Every sibling is held: the vote is whole, and now registered
    /// (`Participant::voted`).
    Whole,
    /// A sibling's tablet knows the transaction committed, at this
    /// timestamp: the outcome is that commit.
    Committed(u64),
    /// A sibling is missing and nothing was decided there: the vote never
    /// left, so it never counts.
    NotWhole,
}

/// Prove the vote of the participant anchored at `anchor` for `txn`, if a
/// recovery left it waiting for proof here. None: nothing waits (a vote
/// proven already, one taken here, or none). Err: a sibling's owner could
/// not be asked (a recovery under way, say); nothing is settled, ask again.
pub(crate) async fn prove(
    state: &ShardState,
    txn: TxnId,
    anchor: &Anchor,
) -> Result<Option<Proof>, String> {
    let siblings = {
        let unproven = state.txns.unproven.borrow();
        let waiting = unproven
            .get(&txn)
            .and_then(|votes| votes.iter().find(|(a, _)| a == anchor));
        match waiting {
            Some((_, siblings)) => siblings.clone(),
            None => return Ok(None),
        }
    };
    for sibling in &siblings {
        let phase = match owned_here(state, sibling) {
            true => part_phase(state, txn, sibling),
            false => match inquire(state, txn, sibling, true).await {
                Ok(p) => p,
                // The sibling's table is gone, and its part with it: no
                // commit can be applied whole any more.
                Err(Unrouted::TableGone(_)) => TxnPhase::Aborted,
                Err(Unrouted::Failed(why)) => return Err(why),
            },
        };
        match phase {
            TxnPhase::Prepared => {}
            TxnPhase::Committed { commit_ts } => return Ok(Some(Proof::Committed(commit_ts))),
            TxnPhase::Aborted => {
                settle(state, txn, anchor);
                return Ok(Some(Proof::NotWhole));
            }
        }
    }
    settle(state, txn, anchor);
    state
        .txns
        .participant
        .borrow_mut()
        .voted(txn, anchor.clone());
    Ok(Some(Proof::Whole))
}

/// The vote anchored at `anchor` no longer waits for proof.
fn settle(state: &ShardState, txn: TxnId, anchor: &Anchor) {
    let mut unproven = state.txns.unproven.borrow_mut();
    if let Some(votes) = unproven.get_mut(&txn) {
        votes.retain(|(a, _)| a != anchor);
        if votes.is_empty() {
            unproven.remove(&txn);
        }
    }
}

/// Whether this shard owns the tablet of `anchor` and may answer for it.
pub(crate) fn owned_here(state: &ShardState, anchor: &Anchor) -> bool {
    crate::handler::admit_tablet(state, anchor.table, &anchor.key, false).is_ok()
        && state
            .engine
            .borrow()
            .tablet_for(anchor.table, key_hash(anchor.table, &anchor.key))
            .is_some()
}

/// Where the part of `txn` whose record was written at `anchor` stands on
/// this shard, which owns that tablet: committed (a decision here, from its
/// commit record or the decision itself), aborted, its record held
/// (`Prepared`), or neither (`Aborted`: never written, or lost before the
/// vote left). Nothing is recorded by asking: no prepare can come any more
/// for a part a recovered vote names.
pub(crate) fn part_phase(state: &ShardState, txn: TxnId, anchor: &Anchor) -> TxnPhase {
    match state.txns.participant.borrow().decision(txn) {
        Some(true) => {
            let commit_ts = state.txns.commit_ts.borrow().get(&txn).copied();
            return TxnPhase::Committed {
                commit_ts: commit_ts.unwrap_or(0),
            };
        }
        Some(false) => return TxnPhase::Aborted,
        None => {}
    }
    let held = state.txns.records.borrow().get(&txn).is_some_and(|at| {
        at.iter()
            .any(|(t, k)| *t == anchor.table && *k == anchor.key)
    });
    match held {
        true => TxnPhase::Prepared,
        false => TxnPhase::Aborted,
    }
}

/// The status a part question gets from a shard that does not own the
/// tablet (the asker refreshes its map and asks again).
pub(crate) const NOT_OWNED: Status = Status::UnknownTablet;
