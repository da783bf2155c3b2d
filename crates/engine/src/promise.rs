//! Head room promised to a group of appends that must not fail later: a
//! transaction's decision (`Engine::promise_head`).
//!
//! Why: a participant votes yes once its part is prepared, and from then on
//! the commit must be applied whatever else the tablet takes meanwhile. The
//! prepare's memory charge covers the bytes, but the log is allocated in
//! whole segments: on a full budget the decision's group would need a new
//! head the budget no longer has, and the commit's writes would be lost for
//! their keys. A promise holds the room in the tablet's *current head*
//! instead, where it cannot be fragmented away:
//!
//! - every append to the tablet but the promised group's leaves the
//!   promised bytes free behind it (`Engine::make_room` adds them to what
//!   it asks for), opening a new head, with all the promised room, when the
//!   head lacks them; so the head always has `slack + promised` free after
//!   an append (the slack being the room for one tombstone, `slack.rs`);
//! - index growth and records-map growth likewise leave the promised slots
//!   free (`Tablet::reserve_index`, `Tablet::reserve_records`): hashbrown's
//!   spare capacity only shrinks by inserts, and the engine never shrinks a
//!   table while it holds;
//! - the group drops its promise and appends at once
//!   (`reserve_promised_head`, then its writes; no other append in
//!   between, the shard being single-threaded): the head still has the
//!   room, so nothing is allocated, and the new keys find index slots.
//!
//! Why the room asked is `bytes` plus the tombstone slack with the group's
//! longest new key: so the head keeps its slack behind the group, as
//! `reserve_head` would. Where a longer key written and then removed
//! meanwhile took that slack, the group waives it for this head
//! (`slack_waived`) rather than needing a new one: the promise only ever
//! has to cover `bytes`, since every append, removals included, leaves the
//! promised bytes free.
//!
//! Limits: the promised bytes of one tablet are at most half a fresh head
//! (a lone promise may take the whole head), so a write of up to half a
//! segment always fits beside them. A larger write to a tablet whose head is
//! promised is refused with `HeadPromised` (a retry after the decisions
//! succeeds), never allowed to break a promise.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::segment::Purpose;
use crate::{Engine, EngineError, TableId, entry};

/// What a tablet has promised, shared with its `HeadPromise`s so a promise
/// releases itself on drop without borrowing the engine.
#[derive(Debug, Default)]
pub(crate) struct Promised {
    /// Head bytes every other append must leave free.
    bytes: AtomicUsize,
    /// Index slots every other new key must leave free.
    index_slots: AtomicUsize,
    /// Records-map slots every other new record id must leave free.
    record_slots: AtomicUsize,
}

impl Promised {
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn index_slots(&self) -> usize {
        self.index_slots.load(Ordering::Relaxed)
    }

    pub fn record_slots(&self) -> usize {
        self.record_slots.load(Ordering::Relaxed)
    }
}

/// What a promised group appends at most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupSize {
    /// Bytes of its entries, each sized with `max_entry_bytes`.
    pub bytes: usize,
    /// Objects it may add (its puts: each may be a new key).
    pub new_keys: usize,
    /// Record ids it may add.
    pub new_records: usize,
    /// The longest key among the objects it may add (0 if none): the
    /// tombstone slack the head keeps behind the group grows to cover it.
    pub longest_key: usize,
}

/// Room held in one tablet's head (and index) for one group until dropped.
#[derive(Debug)]
pub struct HeadPromise {
    /// The tablet's shared tally this promise is part of.
    promised: Arc<Promised>,
    /// Head bytes held: the group's bytes and its slack.
    bytes: usize,
    index_slots: usize,
    record_slots: usize,
    /// The group's longest new key (`GroupSize::longest_key`).
    longest_key: usize,
    /// The tablet's table and first hash: which group this promise is for.
    table: TableId,
    start_hash: u64,
}

impl HeadPromise {
    pub fn table(&self) -> TableId {
        self.table
    }

    /// The first hash of the tablet the room is held in.
    pub fn start_hash(&self) -> u64 {
        self.start_hash
    }

    /// Head bytes held (the group's and its slack).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for HeadPromise {
    fn drop(&mut self) {
        let p = &self.promised;
        let before = p.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        debug_assert!(before >= self.bytes, "promised bytes released twice");
        p.index_slots.fetch_sub(self.index_slots, Ordering::Relaxed);
        p.record_slots
            .fetch_sub(self.record_slots, Ordering::Relaxed);
    }
}

impl Engine {
    /// Hold room in the head of the tablet holding `hash` for `group`, so
    /// that once the promise is dropped the group's appends (`reserve_head`
    /// with `group.bytes`, then its writes and records) find the room, the
    /// index slots and the record slots without allocating. See the module
    /// comment for the argument.
    ///
    /// Errors: `UnknownTablet`; `HeadPromised` when the tablet's promises
    /// would pass their limit (retry after the pending groups apply);
    /// `ValueTooLarge` when the group alone exceeds a fresh head;
    /// `OutOfMemory` when the room cannot be made (as a write).
    pub fn promise_head(
        &mut self,
        table: TableId,
        hash: u64,
        group: GroupSize,
    ) -> Result<HeadPromise, EngineError> {
        let slot = self.route(table, hash).ok_or(EngineError::UnknownTablet)?;
        let fresh = self.config.segment_bytes - entry::MAX_HEADER_BYTES;
        let t = self.tablet(slot);
        let longest_key = group.longest_key.min(self.max_key_bytes);
        let bytes = group.bytes + t.tombstone_slack_with(longest_key);
        if bytes + t.tombstone_slack() > fresh {
            return Err(EngineError::ValueTooLarge {
                len: group.bytes,
                max: fresh,
            });
        }
        let held = t.promised.bytes();
        let max = if held == 0 { fresh } else { fresh / 2 };
        if held + bytes + t.tombstone_slack() > max {
            return Err(EngineError::HeadPromised {
                held,
                asked: bytes,
                max,
            });
        }
        // The head keeps its slack and every promise; `make_room` adds
        // those already promised to what is asked.
        let slack = t.tombstone_slack();
        self.make_room(slot, bytes + slack, Purpose::Object)?;
        if group.new_keys > 0 {
            let (t, budget) = self.tablet_and_budget(slot);
            if let Err(EngineError::OutOfMemory) = t.reserve_index(budget, group.new_keys) {
                self.run_cleaner(crate::cleaner::Goal::Explicit);
                let (t, budget) = self.tablet_and_budget(slot);
                t.reserve_index(budget, group.new_keys)?;
            }
        }
        if group.new_records > 0 {
            self.with_room_retry_at(slot, group.new_records)?;
        }
        let t = self.tablet(slot);
        debug_assert!(t.head_room(self.config.segment_bytes) >= bytes + held);
        let promised = Arc::clone(&t.promised);
        promised.bytes.fetch_add(bytes, Ordering::Relaxed);
        promised
            .index_slots
            .fetch_add(group.new_keys, Ordering::Relaxed);
        promised
            .record_slots
            .fetch_add(group.new_records, Ordering::Relaxed);
        Ok(HeadPromise {
            promised,
            bytes,
            index_slots: group.new_keys,
            record_slots: group.new_records,
            longest_key,
            table,
            start_hash: t.range.start,
        })
    }

    /// Drop `promise` and make its group's room ready, as `reserve_head`
    /// does for `bytes` (at most what was promised): the head has it, so
    /// nothing is allocated. The head keeps its tombstone slack behind the
    /// group when it has room for it, else the slack is waived until the
    /// next head (a longer key written and removed meanwhile may have used
    /// it); the group's appends never need more than the promise held.
    ///
    /// Errors: `UnknownTablet` if the tablet is gone (its promise with it);
    /// otherwise as `reserve_head`, which it falls back to if the room is
    /// not there (a broken promise: a bug, asserted in debug builds).
    pub fn reserve_promised_head(
        &mut self,
        promise: HeadPromise,
        bytes: usize,
    ) -> Result<(), EngineError> {
        let (table, start) = (promise.table, promise.start_hash);
        let (promised, longest_key) = (promise.bytes, promise.longest_key);
        drop(promise);
        let slot = self
            .route_exact(table, start)
            .ok_or(EngineError::UnknownTablet)?;
        let t = self.tablet(slot);
        let room = t.head_room(self.config.segment_bytes);
        let held = t.promised.bytes();
        let slack = t.tombstone_slack_with(longest_key);
        if bytes <= promised && room >= bytes + held {
            if room < bytes + slack + held {
                self.tablet_and_budget(slot).0.slack_waived = true;
            }
            return Ok(());
        }
        debug_assert!(
            bytes > promised,
            "a promised head lost its room: {room} bytes for {bytes} + {held} promised"
        );
        self.reserve_head(table, start, bytes)
    }

    /// Head bytes promised in the tablet holding `hash` (0 if none).
    pub fn promised_bytes(&self, table: TableId, hash: u64) -> usize {
        self.route(table, hash)
            .map_or(0, |slot| self.tablet(slot).promised.bytes())
    }

    /// Records-map room for `additional` more ids in tablet `slot` (beside
    /// the promised ones), cleaning once on a full budget.
    fn with_room_retry_at(&mut self, slot: usize, additional: usize) -> Result<(), EngineError> {
        let (t, budget) = self.tablet_and_budget(slot);
        match t.reserve_records(budget, additional) {
            Err(EngineError::OutOfMemory) => {
                self.run_cleaner(crate::cleaner::Goal::Explicit);
                let (t, budget) = self.tablet_and_budget(slot);
                t.reserve_records(budget, additional)
            }
            other => other,
        }
    }
}

#[cfg(test)]
#[path = "promise_tests.rs"]
mod tests;
