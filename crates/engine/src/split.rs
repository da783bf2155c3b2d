//! The tablet side of a split (`Engine::split_tablet` picks the halves and
//! routes them): the moving half is built off-line from copies of the live
//! objects and side records anchored in it, and the staying half, which
//! keeps its log, logs one record removal for each side record that left,
//! as `remove_record` would append it. Objects need no such entry: a key's
//! hash decides its half, so every entry of a moved key is out of the
//! staying range and filtered out by a replay of it.
//!
//! Why: a record's identity is its id, not its anchor, so the staying half's
//! log may hold an older entry of a leaving record anchored in the staying
//! range (the record was put under such an anchor, then re-put under one in
//! the moving half, which kills the older entry). Replay resolves each id
//! across every anchor, so while the newer entry is in the log it outvotes
//! the older one. But the split makes that newer entry dead, and the cleaner
//! drops dead entries without a trace: once its segment is freed while the
//! older entry's segment remains, a replay of the staying half finds the
//! older entry the newest of its id, anchored in range, and loads a record
//! the tablet no longer holds. Entry sequence, in the staying half's log:
//! `record(id, a_stay, v1)` in segment 1, `record(id, a_move, v2)` (kills
//! v1) in segment 2, split (kills v2), segment 2 cleaned: v1 is back.
//!
//! Why a removal closes it: it gets the staying half's next version (above
//! every entry of that id in its log) and records `R`, the half's newest
//! segment id. Every older entry of the id in that log is in a segment that
//! exists now (id <= R) and is dead, so the cleaner never copies it into a
//! newer segment; the tombstone rule (`cleaner.rs`) keeps the removal until
//! all those segments are gone, so no replay finds an older entry without
//! the removal that outvotes it. A later put of the id in the staying half
//! gets a higher version than the removal. The removal's key is the leaving
//! record's anchor (out of the staying range: a removal is never loaded, so
//! its anchor only says which record it was). The moved half needs no
//! removal: its log starts with copies of live records only.
//!
//! Why planned ahead: the removals are appended after the moved half is
//! built, when the split may no longer fail. So the fresh heads they need
//! are counted (next-fit, each removal at its widest size: the exact sizes,
//! never larger, never need more heads) and allocated before; a split that
//! cannot get them fails with nothing changed.

use crate::entry::{self, RECORD_REMOVED_VALUE_BYTES};
use crate::error::oom;
use crate::index::probe_hash;
use crate::segment::{Budget, Purpose, Segment};
use crate::tablet::Tablet;
use crate::{EngineError, HashRange, RecordId};

/// The removals a split appends to the staying half, ready to be written.
pub(crate) struct Leaving {
    /// Each leaving record's id, log reference (in the staying half) and
    /// anchor, copied out: the append cannot borrow the log it writes to.
    records: Vec<(RecordId, u64, Vec<u8>)>,
    /// Segments allocated for the fresh heads the removals need, in order.
    heads: Vec<Segment>,
}

/// Head room one removal of a record anchored at `anchor` may take.
fn removal_room(anchor: &[u8]) -> usize {
    entry::max_entry_bytes(anchor.len(), RECORD_REMOVED_VALUE_BYTES)
}

impl Tablet {
    /// Move the live objects and side records whose hash lies in `part` into
    /// a new tablet (same table and version counter); a removal is logged
    /// here for each record moved. On failure nothing here changed.
    pub fn split_off(
        &mut self,
        budget: &mut Budget,
        part: HashRange,
        expected: usize,
    ) -> Result<Tablet, EngineError> {
        let mut movers: Vec<(u64, u64)> = Vec::new();
        movers
            .try_reserve_exact(expected)
            .map_err(|_| EngineError::OutOfMemory)?;
        let table = self.table;
        self.for_each_live_entry(|loc, obj| {
            let hash = crate::key_hash(table, obj.key);
            if part.contains(hash) && movers.len() < movers.capacity() {
                movers.push((loc, hash));
            }
        });
        debug_assert_eq!(movers.len(), expected);
        // Side records go with their anchor's hash, keeping their versions.
        let record_movers = self.record_movers(part)?;
        let mut new = Tablet::new(table, part, self.next_version);
        let built = new
            .reserve_index(budget, movers.len())
            .and_then(|()| {
                movers.iter().try_for_each(|&(loc, hash)| {
                    let o = self.object(loc);
                    new.push_new(budget, hash, o.key, o.value, o.version, o.expires_at_ms)
                })
            })
            .and_then(|()| new.reserve_records(budget, record_movers.len()))
            .and_then(|()| {
                record_movers.iter().try_for_each(|&(_, loc)| {
                    let r = self.record_ref(loc);
                    new.push_record(budget, r.id, r.anchor, r.payload, r.version)
                })
            });
        if let Err(e) = built {
            new.release(budget);
            return Err(e);
        }
        // The staying half logs a removal for each record that left (see
        // the module comment); its heads are allocated first, so from here
        // on nothing fails.
        let leaving = match self.plan_leaving(budget, &record_movers) {
            Ok(leaving) => leaving,
            Err(e) => {
                new.release(budget);
                return Err(e);
            }
        };
        self.log_leaving(budget, leaving);
        for &(loc, hash) in &movers {
            self.key_classes.remove(self.object(loc).key.len());
            self.live_bytes -= self.kill(loc);
            self.object_count -= 1;
            let prefix = self.prefixer.prefix(hash);
            match self
                .index
                .find_entry(probe_hash(prefix), |e| e.loc() == loc)
            {
                Ok(e) => {
                    e.remove();
                }
                Err(_) => unreachable!("live object is indexed"),
            }
        }
        Ok(new)
    }

    /// Plan the removals for `movers` (the records leaving this tablet by a
    /// split: id, log reference): versions checked, the heads they need
    /// allocated (as removals: the remove reserve may serve) and their
    /// bookkeeping reserved. On failure nothing changed.
    pub fn plan_leaving(
        &mut self,
        budget: &mut Budget,
        movers: &[(RecordId, u64)],
    ) -> Result<Leaving, EngineError> {
        let mut records = Vec::new();
        records.try_reserve_exact(movers.len()).map_err(oom)?;
        for &(id, l) in movers {
            let anchor = self.record_ref(l).anchor;
            let mut copy = Vec::new();
            copy.try_reserve_exact(anchor.len()).map_err(oom)?;
            copy.extend_from_slice(anchor);
            records.push((id, l, copy));
        }
        let mut leaving = Leaving {
            records,
            heads: Vec::new(),
        };
        if movers.is_empty() {
            return Ok(leaving);
        }
        // One version each, all below MAX_VERSION + 1.
        let last = self.next_version.saturating_add(movers.len() as u64 - 1);
        if last > crate::MAX_VERSION {
            return Err(EngineError::VersionExhausted {
                version: self.next_version,
            });
        }
        let fresh = budget.segment_bytes - entry::MAX_HEADER_BYTES;
        let mut room = self.head_room(budget.segment_bytes);
        let mut needed = 0;
        for (_, _, anchor) in &leaving.records {
            let len = removal_room(anchor);
            assert!(len <= fresh, "a removal fits a fresh head");
            if room < len {
                needed += 1;
                room = fresh;
            }
            room -= len;
        }
        self.reserve_segment_slots(needed)?;
        leaving.heads.try_reserve_exact(needed).map_err(oom)?;
        for _ in 0..needed {
            // The id is set when the segment is linked (ids follow linking).
            match budget.allocate(Purpose::Tombstone, self.next_segment_id) {
                Ok(seg) => leaving.heads.push(seg),
                Err(e) => {
                    leaving.heads.into_iter().for_each(|s| budget.free(s));
                    return Err(e);
                }
            }
        }
        Ok(leaving)
    }

    /// Append the planned removals (the records' entries die, their map
    /// entries go), each with the next version; cannot fail.
    pub fn log_leaving(&mut self, budget: &mut Budget, leaving: Leaving) {
        let Leaving { records, heads } = leaving;
        let mut heads = heads.into_iter();
        for (id, old, anchor) in records {
            debug_assert_eq!(self.records.get(&id), Some(&old));
            if self.head_room(budget.segment_bytes) < removal_room(&anchor) {
                let seg = heads.next().expect("planned heads suffice (next-fit)");
                let slot = self.link_segment(seg);
                self.make_head(budget, slot);
            }
            let version = self.take_version();
            self.remove_record(budget, id, &anchor, version, old);
        }
        // Planned with the widest sizes: a head may be left over.
        heads.for_each(|s| budget.free(s));
    }
}
