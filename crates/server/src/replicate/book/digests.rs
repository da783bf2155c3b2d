//! Each log's digests in the bookkeeping (see "Log digests" in
//! ARCHITECTURE.md; split from `book.rs`): when the newest is held, when
//! they are settled so a walk's mark may be published, and which frees
//! they hold back. Which digest a round sends is in `plan.rs`.

use std::collections::HashSet;

use super::Book;

impl Book {
    /// Whether every log that can carry a digest (it has an open segment
    /// with bytes) has one held by all of its carrier's backups, listing
    /// every durable segment, and every replica of its other sealed
    /// segments is closed. Why an acknowledgement waits for this: a write
    /// is then in a listed segment, and any replica holding an older digest
    /// is closed, so a recovery that misses the newest digest (all of its
    /// carrier's backups gone) sees a closed carrier or a missing listed
    /// segment and refuses instead of dropping the write without a word.
    /// Costs a round after a segment fills or a digest changes, not per write.
    pub fn digests_settled(&self) -> bool {
        let mut open: HashSet<u64> = HashSet::new();
        for (&(log, _), seg) in &self.segs {
            if seg.may_carry() {
                open.insert(log);
            }
        }
        for (&(log, segment), seg) in &self.segs {
            if !open.contains(&log) {
                continue; // no carrier possible: nothing to wait for
            }
            let Some(d) = self.logs.get(&log) else {
                return false;
            };
            if !d.acked
                || (seg.durable && d.listed.binary_search(&segment).is_err())
                || (seg.sealed && segment != d.carrier && seg.replicas.iter().any(|r| !r.closed))
            {
                return false;
            }
        }
        true
    }

    /// Whether every backup of the log's digest carrier (R of them) holds
    /// its newest digest; recorded in `LogDigests::acked`.
    pub(in crate::replicate) fn check_digest_acked(&mut self, log: u64) {
        let target = self.target_replicas();
        let Some(d) = self.logs.get_mut(&log) else {
            return;
        };
        d.acked = d.seq > 0
            && self.segs.get(&(log, d.carrier)).is_some_and(|seg| {
                seg.replicas.len() >= target && seg.replicas.iter().all(|r| r.digest >= d.seq)
            });
    }

    /// A segment gone from the log is freed only once a digest that does not
    /// list it is held by every backup of its carrier: a recovery trusts the
    /// newest digest it finds and refuses when a listed segment is missing,
    /// so freeing a listed segment first could block the log's recovery.
    /// A segment still in the log (a failed backup's stale copy) and a log
    /// with no digest (no open segment with bytes could carry one yet, or
    /// the whole log is gone) are not held back.
    pub(super) fn digest_allows_free(&self, log: u64, segment: u64) -> bool {
        if self.segs.contains_key(&(log, segment)) {
            return true;
        }
        self.logs
            .get(&log)
            .is_none_or(|d| d.acked && d.listed.binary_search(&segment).is_err())
    }
}
