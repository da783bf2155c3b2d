//! Side records: small durable per-tablet records that live in the tablet's
//! log beside its objects but are not objects (a prepared transaction's
//! intended writes, a commit decision).
//!
//! Why in the log: everything that makes objects durable then carries them
//! for free. Segment replication copies them to backups, `Engine::replay`
//! rebuilds them after a crash, the cleaner relocates the live ones and drops
//! the dead ones, and a split sends each to the half holding its anchor
//! (logging a removal in the half it left: `split.rs`).
//!
//! What they are: a record is named by a [`RecordId`] (the caller's `class`
//! and an `id` unique within it) within its tablet, and has an *anchor*: a
//! key of the table whose hash lies in the tablet's range, which decides
//! the tablet that holds it. Entries (`entry.rs`): `KIND_RECORD` (key =
//! anchor, value = class | id LE | payload) and `KIND_RECORD_REMOVED` (key =
//! anchor, value = class | id LE | segment id LE). Versions come from the
//! tablet's counter like objects', so replay's newest-version-wins decides
//! between a record and its removal.
//!
//! What never sees them: reads, scans, counts, index and hash walks,
//! enumeration, `extract`, migration chunks, `object_count`, `live_bytes`,
//! `MemoryStats::live_bytes` and the change log. The index holds objects
//! only, and every log walk keeps `KIND_OBJECT` entries only.
//!
//! Accounting: a live record's entry counts in its segment's `live_bytes`
//! (the cleaner must copy it, and utilisation must see it) and in the
//! tablet's `record_bytes`, not in its `live_bytes`. A removal counts in its
//! segment's `tombstone_bytes` and `max_tombstone_segment`, and the cleaner
//! drops it under the tombstone rule (`cleaner.rs`). The map of live records
//! is charged to the budget's `index_bytes` like the hash index.

use crate::entry::{self, KIND_RECORD, KIND_RECORD_REMOVED, RECORD_ID_BYTES, RecordRef};
use crate::error::oom;
use crate::index::{self, loc, offset_of, slot_of};
use crate::segment::{Budget, Purpose};
use crate::tablet::Tablet;
use crate::{Engine, EngineError, HashRange, TableId, key_hash};

/// Identifies a side record within its tablet: `class` separates record
/// families (the caller's), `id` is unique within a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId {
    /// The record family (the caller's numbering).
    pub class: u8,
    /// Unique within `class` in one tablet.
    pub id: u64,
}

/// A live side record, copied out of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its name within the tablet.
    pub id: RecordId,
    /// The key whose hash placed it in this tablet.
    pub anchor: Vec<u8>,
    /// The caller's bytes (opaque to the engine).
    pub payload: Vec<u8>,
}

/// Bytes of one slot of a tablet's records map (for its budget charge).
const MAP_ITEM_BYTES: usize = std::mem::size_of::<(RecordId, u64)>();

impl Tablet {
    /// The record entry at `loc` (live or not).
    #[inline]
    pub fn record_ref(&self, loc: u64) -> RecordRef<'_> {
        entry::record_at(&self.segs[slot_of(loc)].buf, offset_of(loc))
    }

    /// Room in `records` for `additional` more, charged to the budget's
    /// `index_bytes` (refused with `OutOfMemory` beside the reserves, as
    /// index growth is).
    pub fn reserve_records(
        &mut self,
        budget: &mut Budget,
        additional: usize,
    ) -> Result<(), EngineError> {
        // Slots promised to pending groups stay free (`promise.rs`).
        let additional = additional + self.promised.record_slots();
        let map = &self.records;
        let growth = index::growth_bytes_of(
            (map.len(), map.capacity(), map.allocation_size()),
            MAP_ITEM_BYTES,
            additional,
        ) as u64;
        let records = &mut self.records;
        budget.grow_index_table(growth, &mut self.records_charged_bytes, || {
            records.try_reserve(additional).map_err(oom)?;
            Ok(records.allocation_size() as u64)
        })
    }

    /// Mark the record entry at `loc` dead; returns its length.
    pub fn kill_record(&mut self, loc: u64) -> u64 {
        self.kill_entry(loc, KIND_RECORD)
    }

    /// Append `record` to the head (the caller made room), superseding the
    /// live entry of its id if any (looked up here, after the room was
    /// made: the cleaner may have moved it). For a new id the caller
    /// reserved map room (`reserve_records`).
    pub fn put_record(&mut self, budget: &mut Budget, record: RecordRef<'_>) {
        let RecordRef {
            id,
            anchor,
            payload,
            version,
        } = record;
        let old = self.records.get(&id).copied();
        let h = self.head.expect("put_record needs a head");
        let head = entry::record_id_bytes(id);
        let len = entry::entry_bytes(anchor.len(), head.len() + payload.len(), version);
        budget.clock += len as u64;
        let seg = &mut self.segs[h as usize];
        debug_assert!(seg.room(budget.segment_bytes) >= len);
        let at = seg.append_parts(
            KIND_RECORD,
            self.table,
            version,
            anchor,
            (&head, payload),
            budget.clock,
        );
        seg.live_bytes += len as u64;
        self.record_bytes += len as u64;
        let new_loc = loc(h, at);
        match old {
            Some(old) => {
                self.record_bytes -= self.kill_record(old);
                *self.records.get_mut(&id).expect("a live record is mapped") = new_loc;
            }
            None => {
                debug_assert!(self.records.capacity() > self.records.len());
                self.records.insert(id, new_loc);
            }
        }
    }

    /// Append a removal of record `id` (whose live entry is at `old`) to the
    /// head (the caller made room) and forget it.
    pub fn remove_record(
        &mut self,
        budget: &mut Budget,
        id: RecordId,
        anchor: &[u8],
        version: u64,
        old: u64,
    ) {
        let h = self.head.expect("remove_record needs a head");
        let id_bytes = entry::record_id_bytes(id);
        self.append_removal(budget, h, (KIND_RECORD_REMOVED, &id_bytes), anchor, version);
        self.record_bytes -= self.kill_record(old);
        self.records.remove(&id);
    }

    /// Append to head `h` (the caller made room) a removal entry of `kind`
    /// for `key`: its value `id_bytes` (empty for an object's tombstone, the
    /// record's id for a record removal), then the newest segment id now.
    /// Object and record removals share this layout and its accounting, so
    /// the cleaner's tombstone rule treats both alike (see cleaner.rs).
    pub(crate) fn append_removal(
        &mut self,
        budget: &mut Budget,
        h: u32,
        (kind, id_bytes): (u8, &[u8]),
        key: &[u8],
        version: u64,
    ) {
        // The newest segment id now, not the one the entry lands in.
        let newest = self.newest_segment_id();
        let value_len = id_bytes.len() + entry::TOMBSTONE_VALUE_BYTES;
        let len = entry::entry_bytes(key.len(), value_len, version);
        budget.clock += len as u64;
        let seg = &mut self.segs[h as usize];
        debug_assert!(seg.room(budget.segment_bytes) >= len);
        seg.append_parts(
            kind,
            self.table,
            version,
            key,
            (id_bytes, &newest.to_le_bytes()),
            budget.clock,
        );
        seg.tombstone_bytes += len as u64;
        seg.max_tombstone_segment = seg.max_tombstone_segment.max(newest);
    }

    /// Append a record while building a tablet off-line (split, replay):
    /// opens heads as needed but never cleans.
    pub fn push_record(
        &mut self,
        budget: &mut Budget,
        id: RecordId,
        anchor: &[u8],
        payload: &[u8],
        version: u64,
    ) -> Result<(), EngineError> {
        let len = entry::entry_bytes(anchor.len(), RECORD_ID_BYTES + payload.len(), version);
        self.make_room_offline(budget, len, self.tombstone_slack())?;
        self.reserve_records(budget, 1)?;
        let record = RecordRef {
            id,
            anchor,
            payload,
            version,
        };
        self.put_record(budget, record);
        Ok(())
    }

    /// The live records whose anchor hashes into `part`: (id, log reference).
    pub fn record_movers(&self, part: HashRange) -> Result<Vec<(RecordId, u64)>, EngineError> {
        let mut movers = Vec::new();
        for (&id, &l) in &self.records {
            if part.contains(key_hash(self.table, self.record_ref(l).anchor)) {
                movers.try_reserve(1).map_err(oom)?;
                movers.push((id, l));
            }
        }
        Ok(movers)
    }

    /// The records half of `check_consistency`: every map entry points at a
    /// live record entry of its id whose anchor hashes into the range, every
    /// live record entry is in the map, and `record_bytes` is the sum of
    /// their lengths (`in_log`, counted by the caller's walk).
    pub fn check_records(&self, in_log: u64) {
        assert_eq!(in_log, self.record_bytes, "record bytes drifted");
        let mut live = 0usize;
        for &slot in &self.order {
            let buf = &self.segs[slot as usize].buf;
            let mut at = 0;
            while at < buf.len() {
                if entry::kind(buf, at) == KIND_RECORD && !entry::is_dead(buf, at) {
                    live += 1;
                    let r = entry::record_at(buf, at);
                    assert_eq!(
                        self.records.get(&r.id),
                        Some(&loc(slot, at as u32)),
                        "live record entry {:?} is not the mapped one",
                        r.id
                    );
                    assert!(
                        r.version < self.next_version,
                        "record version not below the counter"
                    );
                }
                at += entry::len_at(buf, at);
            }
        }
        assert_eq!(live, self.records.len(), "records map and log disagree");
        for (&id, &l) in &self.records {
            let buf = &self.segs[slot_of(l)].buf;
            assert_eq!(
                entry::kind(buf, offset_of(l)),
                KIND_RECORD,
                "mapped entry kind"
            );
            assert!(!entry::is_dead(buf, offset_of(l)), "mapped record is dead");
            let r = self.record_ref(l);
            assert_eq!(r.id, id, "mapped record has another id");
            assert!(
                self.range.contains(key_hash(self.table, r.anchor)),
                "record anchor outside the tablet's range"
            );
        }
        assert_eq!(
            self.records_charged_bytes,
            self.records.allocation_size() as u64,
            "records map charge drifted"
        );
    }
}

impl Engine {
    /// Map room for one more record in tablet `slot`; on a full budget a
    /// whole cleaning pass runs before the one retry (as for the index).
    fn reserve_record_room(&mut self, slot: usize) -> Result<(), EngineError> {
        let attempt = |e: &mut Engine| {
            let (t, budget) = e.tablet_and_budget(slot);
            t.reserve_records(budget, 1)
        };
        match attempt(self) {
            Err(EngineError::OutOfMemory) => {
                self.clean();
                attempt(self)
            }
            other => other,
        }
    }

    /// Write record `id` in the tablet of `table` holding `anchor`
    /// (replacing a live record with that id in that tablet). Errors like
    /// `write`: `ValueTooLarge { len: payload + 9, .. }` when the record's
    /// value (class, id and payload) exceeds `max_value_bytes`, then the key
    /// checks on `anchor`, `UnknownTablet`, `VersionExhausted`, `OutOfMemory`;
    /// a failure changes nothing. The record takes the tablet's next version.
    pub fn put_record(
        &mut self,
        table: TableId,
        anchor: &[u8],
        id: RecordId,
        payload: &[u8],
    ) -> Result<(), EngineError> {
        let value_len = payload.len().saturating_add(RECORD_ID_BYTES);
        self.check_value(value_len)?;
        self.check_key(anchor)?;
        let slot = self
            .route(table, key_hash(table, anchor))
            .ok_or(EngineError::UnknownTablet)?;
        self.tablet(slot).check_version_left()?;
        if !self.tablet(slot).records.contains_key(&id) {
            self.reserve_record_room(slot)?;
        }
        let len = entry::max_entry_bytes(anchor.len(), value_len);
        let need = self.append_room(slot, len, None);
        self.make_room(slot, need, Purpose::Object)?;
        let (t, budget) = self.tablet_and_budget(slot);
        let record = RecordRef {
            id,
            anchor,
            payload,
            version: t.take_version(),
        };
        t.put_record(budget, record);
        self.clean_slice_if_due();
        Ok(())
    }

    /// Remove record `id` from the tablet holding `anchor`: appends a record
    /// removal (its key is the `anchor` given: it only routes, the record is
    /// found by id) and marks the record's entry dead. `Ok(false)`, with
    /// nothing appended, if the tablet holds no such live record. Errors:
    /// the key checks on `anchor`, `UnknownTablet`, `VersionExhausted`,
    /// `OutOfMemory` (a removal may use the remove reserve, as a remove does).
    pub fn remove_record(
        &mut self,
        table: TableId,
        anchor: &[u8],
        id: RecordId,
    ) -> Result<bool, EngineError> {
        self.check_key(anchor)?;
        let slot = self
            .route(table, key_hash(table, anchor))
            .ok_or(EngineError::UnknownTablet)?;
        if !self.tablet(slot).records.contains_key(&id) {
            return Ok(false);
        }
        self.tablet(slot).check_version_left()?;
        let len = entry::max_entry_bytes(anchor.len(), entry::RECORD_REMOVED_VALUE_BYTES);
        self.make_room(slot, len, Purpose::Tombstone)?;
        let (t, budget) = self.tablet_and_budget(slot);
        let old = *t.records.get(&id).expect("cleaning keeps live records");
        let version = t.take_version();
        t.remove_record(budget, id, anchor, version, old);
        self.clean_slice_if_due();
        Ok(true)
    }

    /// The payload of live record `id` in the tablet holding `anchor`
    /// (`None` if absent, or if no tablet here holds `anchor`).
    pub fn record(&self, table: TableId, anchor: &[u8], id: RecordId) -> Option<&[u8]> {
        self.check_key(anchor).ok()?;
        let t = self.tablet(self.route(table, key_hash(table, anchor))?);
        t.records.get(&id).map(|&l| t.record_ref(l).payload)
    }

    /// Every live record of the tablet of `table` starting at `start_hash`,
    /// sorted by id (empty if no such tablet).
    pub fn records(&self, table: TableId, start_hash: u64) -> Vec<Record> {
        let Ok(t) = self.tablet_at(table, start_hash) else {
            return Vec::new();
        };
        let mut out: Vec<Record> = t
            .records
            .values()
            .map(|&l| {
                let r = t.record_ref(l);
                Record {
                    id: r.id,
                    anchor: r.anchor.to_vec(),
                    payload: r.payload.to_vec(),
                }
            })
            .collect();
        out.sort_unstable_by_key(|r| r.id);
        out
    }

    /// Live records in the tablet of `table` starting at `start_hash` (0 if
    /// no such tablet).
    pub fn record_count(&self, table: TableId, start_hash: u64) -> usize {
        self.tablet_at(table, start_hash)
            .map_or(0, |t| t.records.len())
    }

    /// Make sure the head segment of the tablet of `table` holding `hash`
    /// has at least `bytes` free, opening a new head (after the same
    /// room-making a write does: incremental or full-budget cleaning) if it
    /// has less. Then the caller's next appends to that tablet totalling at
    /// most `bytes` (each sized with [`crate::max_entry_bytes`]: objects,
    /// increments (value 8), tombstones (value 8), records (payload + 9),
    /// record removals (value 17)) all land in that one segment: a write
    /// opens a new head only when the head has less room than the
    /// `max_entry_bytes` of that write and the room it keeps for a
    /// tombstone (`slack.rs`; reserved here too), the exact entry never
    /// takes more, and nothing else appends to a head (the cleaner copies into survivor
    /// segments; only a version mark from `raise_version`, not part of any
    /// group, would also take head room). A replica holds a prefix of its
    /// segment, so such a group survives a crash whole or as a prefix.
    /// Only log room is reserved: a write of a new key (or a new record id)
    /// may still fail with `OutOfMemory` growing the index (or the records
    /// map), appending nothing, which leaves the group a prefix.
    ///
    /// Errors: `UnknownTablet`; `ValueTooLarge { len: bytes, max }` when
    /// `bytes` exceeds `max`, what a fresh head holds beside its version mark
    /// (`segment_bytes - ENTRY_HEADER_BYTES_MAX`): like a value too large
    /// for the log; `OutOfMemory` as a write.
    pub fn reserve_head(
        &mut self,
        table: TableId,
        hash: u64,
        bytes: usize,
    ) -> Result<(), EngineError> {
        let slot = self.route(table, hash).ok_or(EngineError::UnknownTablet)?;
        let max = self.config.segment_bytes - entry::MAX_HEADER_BYTES;
        if bytes > max {
            return Err(EngineError::ValueTooLarge { len: bytes, max });
        }
        // Each write of the group keeps the head's room for a tombstone
        // behind it, which a new key (of at most `bytes`) may raise: that
        // room is reserved too, unless the group is too close to a whole
        // segment for it; then the group has the head, which keeps none.
        let slack = self
            .tablet(slot)
            .tombstone_slack_with(bytes.min(self.max_key_bytes));
        if bytes + slack <= max {
            self.make_room(slot, bytes + slack, Purpose::Object)?;
        } else {
            self.make_room(slot, bytes, Purpose::Object)?;
            self.tablet_and_budget(slot).0.slack_waived = true;
        }
        debug_assert!(self.tablet(slot).head_room(self.config.segment_bytes) >= bytes);
        Ok(())
    }
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
