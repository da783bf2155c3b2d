//! Applying a transaction's decision on one shard: the decision recorded
//! (the first one stands), then each part's group appended in the order a
//! crash needs (ARCHITECTURE.md, "Durable records": "Groups", "Order at a
//! participant").

use insitu_protocol::txn::TxnId;

use crate::shard::ShardState;
use crate::txn::wait_durable;
use crate::txn_durable::{self, GroupPlan};

/// Record the decision (the one already recorded wins) and apply it to the
/// parts prepared here, each as one group (on a commit: a commit record,
/// the writes; the record's removal). An abort at the primary applies its
/// anchor part first, held by the backups before any other part changes.
/// `commit_ts`: the commit's timestamp if this call decides it (the first
/// one known here stands). Returns the decision that stands and its
/// timestamp.
pub(crate) async fn settle_and_apply(
    state: &ShardState,
    txn: TxnId,
    commit: bool,
    commit_ts: u64,
) -> (bool, u64) {
    let now = state.txns.now_ms();
    // Whether this shard took the prepare from the client and nobody asked
    // it since (only the test fault below cares now).
    let took_prepare = state.txns.direct_ok.borrow_mut().remove(&txn);
    let committed = state.txns.participant.borrow_mut().settle(txn, commit, now);
    let commit_ts = match committed {
        false => 0,
        true => *state
            .txns
            .commit_ts
            .borrow_mut()
            .entry(txn)
            .or_insert(commit_ts),
    };
    // One application at a time: a second caller waits for the first.
    loop {
        let released = state.holds_released.notified();
        if !state.txns.applying.borrow().contains(&txn) {
            break;
        }
        released.await;
    }
    let (parts, voters) = {
        let engine = state.engine.borrow();
        let participant = state.txns.participant.borrow();
        match participant.prepared(txn) {
            Some(p) => (txn_durable::parts(&engine, p, None), p.voters.clone()),
            None => return (committed, commit_ts), // nothing of it here, or applied already
        }
    };
    // Taken out of `records` only once the decision is applied: a commit
    // that waits for room (below) keeps them for the sweep's next try.
    let mut parts = parts;
    let recorded = match state.txns.records.borrow().get(&txn) {
        Some(at) => {
            txn_durable::attach_records(&state.engine.borrow(), &mut parts, at);
            txn_durable::mark_votes(&mut parts, &voters);
            true
        }
        None => false,
    };
    // A commit applies only where its writes have room: a part without
    // it (taken back by a recovery when the shard had none) would have its
    // writes refused and lost. It stays prepared, its keys locked, and the
    // sweep applies it once room is made.
    if committed && let Err(why) = crate::txn_room::room_for_commit(state, txn, &parts) {
        tracing::warn!(
            shard = state.index,
            txn,
            "a committed transaction waits for log room (its keys stay locked; retried by the sweep): {why}"
        );
        return (committed, commit_ts);
    }
    state.txns.records.borrow_mut().remove(&txn);
    // On a commit every part with a record keeps the decision in its group
    // (a commit record first): a crash that keeps some of the groups and
    // loses others leaves each applied part saying "committed, at this
    // timestamp" in its own log, so whatever is recovered commits the rest
    // at that timestamp. The vote parts' (the primary's anchor part's
    // among them) stay for the decision's time to live, for a primary
    // deciding an orphan; the others only until every group is durable.
    let plan = |part: &txn_durable::Part| GroupPlan {
        commit: committed,
        commit_record: committed && part.record,
        has_record: part.record,
        commit_ts,
    };
    let mut rest = &parts[..];
    // An abort has no such record: the primary's anchor part, holding the
    // decision, goes first, and no other part changes until it is held by
    // the backups (a removal of another part's record surviving a crash
    // that lost it would leave a resolution free to commit).
    if !committed
        && let Some(first) = parts.first()
        && first.primary_anchor
        && parts.len() > 1
        && recorded
    {
        state.txns.applying.borrow_mut().insert(txn);
        txn_durable::apply_part(state, txn, first, plan(first));
        let waited = wait_durable(state).await;
        state.txns.applying.borrow_mut().remove(&txn);
        if let Err(why) = waited {
            tracing::error!(
                shard = state.index,
                txn,
                "{why}: the decision is not applied"
            );
            state.holds_released.notify_waiters();
            return (committed, commit_ts);
        }
        rest = &parts[1..];
    }
    // From here one synchronous step: the locks go and the writes land with
    // no request in between.
    let _ = state.txns.participant.borrow_mut().finish(txn);
    state.txns.unproven.borrow_mut().remove(&txn);
    let mut passing = Vec::new();
    for part in rest {
        let plan = plan(part);
        let writes = plan.commit && !part.items.is_empty();
        if !writes && !plan.has_record && !plan.commit_record {
            continue; // nothing to append: reads only, or an abort with no record
        }
        if took_prepare
            && committed
            && part.vote
            && crate::faults::fault_at("decide-lose-vote-part", txn)
        {
            continue; // injected for tests: as if a crash lost this group
        }
        let kept = txn_durable::apply_part(state, txn, part, plan);
        match (kept, part.keeps_decision()) {
            (Some(at), true) => txn_durable::keep_decision_record(state, txn, at),
            (Some(at), false) => passing.push(at),
            (None, _) => {}
        }
    }
    if !passing.is_empty() {
        let changes = state.engine.borrow().log_changes();
        let mut queue = state.txns.passing_records.borrow_mut();
        queue.push_back((changes, txn, passing));
    }
    state.txns.held.borrow_mut().remove(&txn);
    // Moves and updates waiting for this tablet's locks re-check; so does
    // a caller waiting for this application.
    state.holds_released.notify_waiters();
    (committed, commit_ts)
}
