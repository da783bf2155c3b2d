//! One tablet: its own log segments, its own hash index, its own counters.
//!
//! Everything here costs in proportion to this tablet's data only, which is
//! what keeps a scan of one table independent of what else a server holds.
//! Methods assume the engine already did the policy work (key checks, reject
//! rules, making room in the head); they keep the log, the index and the
//! statistics consistent with each other.

use hashbrown::HashTable;

use crate::entry::{self, KIND_MARK, KIND_OBJECT, KIND_TOMBSTONE};
use crate::index::{self, IndexEntry, Prefixer, loc, offset_of, probe_hash, slot_of};
use crate::segment::{Budget, Purpose, Segment};
use crate::{EngineError, HashRange, ObjectRef, RecordId, TableId, TabletStats};

pub(crate) struct Tablet {
    pub table: TableId,
    pub range: HashRange,
    /// The version the next write gets; only grows.
    pub next_version: u64,
    pub object_count: u64,
    /// Bytes of live object entries (header + key + value).
    pub live_bytes: u64,
    /// Live side records (`records.rs`) by id, to their entries' log
    /// references (`loc`): the only way to them, since the index and every
    /// object walk leave records out.
    pub records: hashbrown::HashMap<RecordId, u64>,
    /// Bytes of live record entries: kept apart from `live_bytes` so object
    /// figures stay about objects, while the segments' `live_bytes` include
    /// them (the cleaner must copy them).
    pub record_bytes: u64,
    /// Bytes of `records`' allocation counted in the budget's `index_bytes`
    /// (kept equal to `records.allocation_size()`).
    pub records_charged_bytes: u64,
    /// Segments by slot; a freed slot holds `Segment::default()` (id 0).
    pub segs: Vec<Segment>,
    pub free_slots: Vec<u32>,
    /// Slots of the held segments in id (= creation) order, oldest first.
    pub order: Vec<u32>,
    /// Where writes append; never cleaned.
    pub head: Option<u32>,
    /// Live objects by key length: sizes the head's room for one tombstone
    /// (`slack.rs`).
    pub key_classes: crate::slack::KeyClasses,
    /// This head keeps no tombstone slack: a reserved group filled it
    /// (`Engine::reserve_head`). Cleared whenever a new head is taken.
    pub slack_waived: bool,
    /// Head room, index slots and record slots held for pending groups
    /// (`promise.rs`): every other append leaves them free.
    pub promised: std::sync::Arc<crate::promise::Promised>,
    /// Where the cleaner appends survivors; kept open across passes so a
    /// pass's last, partly filled survivor is topped up by the next pass.
    pub survivor: Option<u32>,
    /// While the tablet has no head: the id of the segment holding the
    /// cleaner's mark of the counter (`cleaner::carry_counter`), so each
    /// cleaning carries one mark, not one per mark it meets.
    pub counter_mark: Option<u64>,
    pub next_segment_id: u64,
    pub index: HashTable<IndexEntry>,
    /// Which bits of a key hash the index keeps (`index.rs`); fixed for the
    /// tablet's life, so a split never re-keys the index.
    pub prefixer: Prefixer,
    /// Bytes of `index`'s allocation counted in the budget's `index_bytes`
    /// (kept equal to `index.allocation_size()`).
    pub index_charged_bytes: u64,
    /// Unique per tablet instance (a dropped and re-created tablet differs).
    pub generation: u64,
    /// Bumped whenever the cleaner starts on one of this tablet's segments:
    /// log positions held across it may have moved (see `scan.rs`).
    pub clean_epoch: u64,
    /// Scans holding this tablet's log positions fixed (`Engine::hold_cleaner`):
    /// while > 0 the cleaner leaves the tablet alone.
    pub clean_holds: u32,
    /// Hashes of the keys written or removed since the last
    /// `Engine::take_changes`, while someone watches (`Engine::watch`): what
    /// a shard's secondary indexes catch up from. None: not watched.
    pub changes: Option<crate::changes::ChangeLog>,
}

impl Tablet {
    pub fn new(table: TableId, range: HashRange, next_version: u64) -> Tablet {
        Tablet {
            table,
            range,
            next_version: next_version.max(1),
            object_count: 0,
            live_bytes: 0,
            records: hashbrown::HashMap::new(),
            record_bytes: 0,
            records_charged_bytes: 0,
            segs: Vec::new(),
            free_slots: Vec::new(),
            order: Vec::new(),
            head: None,
            key_classes: crate::slack::KeyClasses::default(),
            slack_waived: false,
            promised: std::sync::Arc::default(),
            survivor: None,
            counter_mark: None,
            next_segment_id: 1,
            index: HashTable::new(),
            prefixer: Prefixer::new(range),
            index_charged_bytes: 0,
            generation: crate::scan::next_generation(),
            clean_epoch: 0,
            clean_holds: 0,
            changes: None,
        }
    }

    // ---- lookups ----------------------------------------------------------

    /// The log reference of the live object `key` (whose hash is `hash`).
    #[inline]
    pub fn find(&self, hash: u64, key: &[u8]) -> Option<u64> {
        self.lookup(hash, key).map(|(loc, _)| loc)
    }

    /// The live object `key` (whose hash is `hash`): what a read needs.
    #[inline]
    pub fn find_object(&self, hash: u64, key: &[u8]) -> Option<ObjectRef<'_>> {
        self.lookup(hash, key).map(|(_, o)| o)
    }

    /// `find_object`, and its segment's `held_at` (see `Engine::read_held`).
    #[inline]
    pub fn find_object_held(&self, hash: u64, key: &[u8]) -> Option<(ObjectRef<'_>, Option<u64>)> {
        self.lookup(hash, key)
            .map(|(l, o)| (o, self.segs[slot_of(l)].held_at(offset_of(l))))
    }

    /// The log reference and the object of `key`, its entry decoded once
    /// (the key compare and the caller share the decode).
    #[inline]
    fn lookup(&self, hash: u64, key: &[u8]) -> Option<(u64, ObjectRef<'_>)> {
        let segs = &self.segs;
        let prefix = self.prefixer.prefix(hash);
        let mut found = None;
        self.index.find(probe_hash(prefix), |e| {
            if e.prefix() != prefix {
                return false;
            }
            let l = e.loc();
            let o = entry::object_at(&segs[slot_of(l)].buf, offset_of(l));
            let hit = o.key == key;
            if hit {
                found = Some((l, o));
            }
            hit
        });
        found
    }

    /// Prefetch the log entries `lookup(hash, ..)` would compare keys with
    /// (`Engine::prefetch`): the first cache line of each, where the key
    /// starts.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        let prefix = self.prefixer.prefix(hash);
        for e in self.index.iter_hash(probe_hash(prefix)) {
            if e.prefix() == prefix {
                let l = e.loc();
                if let Some(seg) = self.segs.get(slot_of(l)) {
                    crate::segment::prefetch(&seg.buf, offset_of(l));
                }
            }
        }
    }

    #[inline]
    pub fn object(&self, loc: u64) -> ObjectRef<'_> {
        entry::object_at(&self.segs[slot_of(loc)].buf, offset_of(loc))
    }

    #[inline]
    pub fn head_room(&self, segment_bytes: usize) -> usize {
        self.head
            .map_or(0, |h| self.segs[h as usize].room(segment_bytes))
    }

    /// Smallest id of a held segment other than `slot` (u64::MAX if none).
    pub fn min_segment_id_except(&self, slot: u32) -> u64 {
        self.order
            .iter()
            .find(|&&s| s != slot)
            .map_or(u64::MAX, |&s| self.segs[s as usize].id)
    }

    /// Id of the newest segment this tablet ever allocated (0 if none).
    pub fn newest_segment_id(&self) -> u64 {
        self.next_segment_id - 1
    }

    // ---- versions -------------------------------------------------------------

    /// Refuses once `MAX_VERSION` was issued: never saturates.
    #[inline]
    pub fn check_version_left(&self) -> Result<(), EngineError> {
        if self.next_version > crate::MAX_VERSION {
            return Err(EngineError::VersionExhausted {
                version: self.next_version,
            });
        }
        Ok(())
    }

    /// The next version; the caller checked `check_version_left`.
    #[inline]
    pub fn take_version(&mut self) -> u64 {
        let v = self.next_version;
        assert!(v <= crate::MAX_VERSION, "version counter exhausted");
        self.next_version = v + 1;
        v
    }

    /// `at_least` is at most `MAX_VERSION + 1` (`u64::MAX`), so it always fits.
    pub fn raise_version(&mut self, at_least: u64) {
        self.next_version = self.next_version.max(at_least);
    }

    // ---- segments -------------------------------------------------------------

    /// Allocate a segment from the budget and register it as the newest.
    pub fn new_segment(
        &mut self,
        budget: &mut Budget,
        purpose: Purpose,
    ) -> Result<u32, EngineError> {
        // Bookkeeping room first, so a failure leaves nothing half done.
        self.reserve_segment_slots(1)?;
        let seg = budget.allocate(purpose, self.next_segment_id)?;
        Ok(self.link_segment(seg))
    }

    /// Bookkeeping room for `n` more segments, so linking them cannot fail.
    pub fn reserve_segment_slots(&mut self, n: usize) -> Result<(), EngineError> {
        self.order
            .try_reserve(n)
            .map_err(|_| EngineError::OutOfMemory)?;
        let fresh_slots = n.saturating_sub(self.free_slots.len());
        if fresh_slots > 0 {
            // Index slots address at most this many segments per tablet.
            if self.segs.len() + fresh_slots > index::MAX_TABLET_SEGMENTS {
                return Err(EngineError::OutOfMemory);
            }
            self.segs
                .try_reserve(fresh_slots)
                .map_err(|_| EngineError::OutOfMemory)?;
        }
        Ok(())
    }

    /// Register `seg` (allocated from the budget; `reserve_segment_slots`
    /// made room) as the newest segment; returns its slot.
    pub fn link_segment(&mut self, mut seg: Segment) -> u32 {
        seg.id = self.next_segment_id;
        self.next_segment_id += 1;
        let slot = match self.free_slots.pop() {
            Some(s) => {
                debug_assert_eq!(self.segs[s as usize].id, 0);
                self.segs[s as usize] = seg;
                s
            }
            None => {
                debug_assert!(self.segs.capacity() > self.segs.len());
                self.segs.push(seg);
                (self.segs.len() - 1) as u32
            }
        };
        debug_assert!(self.order.capacity() > self.order.len());
        self.order.push(slot);
        slot
    }

    /// Seal the head and open a new one, starting with a version mark so
    /// that replaying the head alone restores the version counter.
    pub fn open_head(&mut self, budget: &mut Budget, purpose: Purpose) -> Result<(), EngineError> {
        let slot = self.new_segment(budget, purpose)?;
        self.make_head(budget, slot);
        Ok(())
    }

    /// Make the empty segment in `slot` the head, with its version mark.
    pub fn make_head(&mut self, budget: &mut Budget, slot: u32) {
        debug_assert!(self.segs[slot as usize].buf.is_empty());
        self.head = Some(slot);
        self.counter_mark = None; // the head's mark holds the counter
        self.slack_waived = false;
        self.append_mark(budget);
    }

    /// Append a version mark to the head (the caller made room).
    pub fn append_mark(&mut self, budget: &mut Budget) {
        let h = self.head.expect("append_mark needs a head") as usize;
        let (table, version) = (self.table, self.next_version);
        let len = entry::entry_bytes(0, 0, version);
        debug_assert!(self.segs[h].room(budget.segment_bytes) >= len);
        budget.clock += len as u64;
        self.segs[h].append(KIND_MARK, table, version, &[], &[], budget.clock);
    }

    /// Free the segment in `slot` (all its live entries must be gone).
    pub fn free_segment(&mut self, slot: u32, seg: Segment, budget: &mut Budget) {
        debug_assert_eq!(seg.live_bytes, 0, "freeing a segment with live objects");
        debug_assert_eq!(
            self.segs[slot as usize].id, 0,
            "slot must already be emptied"
        );
        debug_assert!(self.head != Some(slot) && self.survivor != Some(slot));
        self.order.retain(|&s| s != slot);
        // Capacity was reserved by the caller; a failed push only loses slot reuse.
        if self.free_slots.try_reserve(1).is_ok() {
            self.free_slots.push(slot);
        }
        budget.free(seg);
    }

    /// Return every segment to the budget (tablet dropped or build abandoned).
    pub fn release(mut self, budget: &mut Budget) {
        budget.index_bytes -= self.index_charged_bytes + self.records_charged_bytes;
        for &slot in &self.order {
            budget.free(std::mem::take(&mut self.segs[slot as usize]));
        }
    }

    /// Room for `additional` new index entries. Growth is refused
    /// (`OutOfMemory`) when the new table (which briefly exists beside the
    /// old one) does not fit the budget beside the reserves; the budget then
    /// counts the table's actual allocation.
    pub fn reserve_index(
        &mut self,
        budget: &mut Budget,
        additional: usize,
    ) -> Result<(), EngineError> {
        // Slots promised to pending groups stay free (`promise.rs`).
        let additional = additional + self.promised.index_slots();
        if additional <= self.index.capacity() - self.index.len() {
            return Ok(());
        }
        // No growth predicted can still mean no capacity left: removed
        // entries (a split's movers) hold buckets until a rehash, which
        // `try_reserve` then does in place, allocating nothing.
        let growth = index::growth_bytes(&self.index, additional) as u64;
        let table = &mut self.index;
        budget.grow_index_table(growth, &mut self.index_charged_bytes, || {
            table
                .try_reserve(additional, index::rehash)
                .map_err(|_| EngineError::OutOfMemory)?;
            Ok(table.allocation_size() as u64)
        })
    }

    // ---- mutations (room in the head already made) ---------------------------

    /// Mark the object entry at `loc` dead; returns its length.
    pub fn kill(&mut self, loc: u64) -> u64 {
        self.kill_entry(loc, KIND_OBJECT)
    }

    /// Mark the live entry of `kind` at `loc` dead; returns its length. One
    /// path for objects and side records (`kill_record`), so both leave
    /// their segment's accounting alike; only objects carry a deadline.
    pub(crate) fn kill_entry(&mut self, loc: u64, kind: u8) -> u64 {
        let seg = &mut self.segs[slot_of(loc)];
        let at = offset_of(loc);
        debug_assert_eq!(entry::kind(&seg.buf, at), kind);
        let len = entry::len_at(&seg.buf, at) as u64;
        let deadline = entry::expires_at(&seg.buf, at);
        if deadline != 0 {
            seg.forget_expiring(deadline);
        }
        entry::set_dead(&mut seg.buf, at);
        seg.live_bytes -= len;
        len
    }

    /// Append an object to the head, superseding `old` (its current entry,
    /// if any). With `old == None` the caller reserved index capacity.
    /// `expires_at_ms`: its deadline (Unix ms; 0: none).
    #[allow(clippy::too_many_arguments)] // the object's fields, one each
    pub fn put(
        &mut self,
        budget: &mut Budget,
        hash: u64,
        key: &[u8],
        value: &[u8],
        version: u64,
        expires_at_ms: u64,
        old: Option<u64>,
    ) {
        let h = self.head.expect("put needs a head");
        let len = entry::entry_bytes_expiring(key.len(), value.len(), version, expires_at_ms);
        budget.clock += len as u64;
        let seg = &mut self.segs[h as usize];
        debug_assert!(seg.room(budget.segment_bytes) >= len);
        let at = seg.append_object(self.table, version, expires_at_ms, key, value, budget.clock);
        self.placed(hash, key.len(), len, loc(h, at), old);
    }

    /// Append a new object while building a tablet off-line, as `push_new`,
    /// from an entry replay verified, verbatim (`Segment::append_verified`):
    /// no second encoding or checksum of it.
    pub fn push_verified(
        &mut self,
        budget: &mut Budget,
        hash: u64,
        key_len: usize,
        entry: &[u8],
        expires_at_ms: u64,
    ) -> Result<(), EngineError> {
        debug_assert_eq!(entry::kind(entry, 0), entry::KIND_OBJECT);
        self.make_room_offline(budget, entry.len(), self.tombstone_slack_with(key_len))?;
        self.reserve_index(budget, 1)?;
        let h = self.head.expect("put needs a head");
        let len = entry.len();
        budget.clock += len as u64;
        let seg = &mut self.segs[h as usize];
        debug_assert!(seg.room(budget.segment_bytes) >= len);
        let at = seg.append_verified(entry, expires_at_ms, budget.clock);
        self.placed(hash, key_len, len, loc(h, at), None);
        Ok(())
    }

    /// Account and index an object entry of `len` bytes just appended at
    /// `new_loc` to the head, replacing the live one at `old` if any.
    #[inline]
    fn placed(&mut self, hash: u64, key_len: usize, len: usize, new_loc: u64, old: Option<u64>) {
        self.segs[slot_of(new_loc)].live_bytes += len as u64;
        if let Some(c) = &mut self.changes {
            c.record(hash);
        }
        let prefix = self.prefixer.prefix(hash);
        match old {
            Some(old) => {
                self.live_bytes -= self.kill(old);
                let e = self
                    .index
                    .find_mut(probe_hash(prefix), |e| e.loc() == old)
                    .expect("live object is indexed");
                e.set_loc(new_loc);
            }
            None => {
                debug_assert!(
                    self.index.capacity() > self.index.len(),
                    "index capacity not reserved"
                );
                self.index.insert_unique(
                    probe_hash(prefix),
                    IndexEntry::new(prefix, new_loc),
                    index::rehash,
                );
                self.object_count += 1;
                self.key_classes.add(key_len);
            }
        }
        self.live_bytes += len as u64;
    }

    /// Append a tombstone for the object at `old` and unindex it.
    pub fn remove(&mut self, budget: &mut Budget, hash: u64, key: &[u8], version: u64, old: u64) {
        let h = self.head.expect("remove needs a head");
        // Laid out and counted as a record removal is (records.rs).
        self.append_removal(budget, h, (KIND_TOMBSTONE, &[]), key, version);
        self.live_bytes -= self.kill(old);
        self.object_count -= 1;
        self.key_classes.remove(key.len());
        if let Some(c) = &mut self.changes {
            c.record(hash);
        }
        let prefix = self.prefixer.prefix(hash);
        match self
            .index
            .find_entry(probe_hash(prefix), |e| e.loc() == old)
        {
            Ok(e) => {
                e.remove();
            }
            Err(_) => unreachable!("live object is indexed"),
        }
    }

    // ---- visits -------------------------------------------------------------------

    /// Walk the segments oldest first, calling `f` for each live object.
    /// The per-entry loop reads only the header; dead entries are skipped by
    /// their flag, without a hash lookup.
    #[inline]
    pub fn for_each_log(&self, mut f: impl FnMut(ObjectRef<'_>)) {
        for &slot in &self.order {
            walk_live(&self.segs[slot as usize].buf, &mut f);
        }
    }

    /// Like `for_each_log` but also passes each object's log reference.
    pub fn for_each_live_entry(&self, mut f: impl FnMut(u64, ObjectRef<'_>)) {
        for &slot in &self.order {
            let buf = &self.segs[slot as usize].buf;
            let mut at = 0;
            while at < buf.len() {
                let len = entry::len_at(buf, at);
                if entry::kind(buf, at) == KIND_OBJECT && !entry::is_dead(buf, at) {
                    f(loc(slot, at as u32), entry::object_at(buf, at));
                }
                at += len;
            }
        }
    }

    pub fn for_each_index(&self, mut f: impl FnMut(ObjectRef<'_>)) {
        for e in self.index.iter() {
            f(self.object(e.loc()));
        }
    }

    pub fn segment_slices(&self) -> impl Iterator<Item = &[u8]> {
        self.order.iter().map(|&s| &self.segs[s as usize].buf[..])
    }

    pub fn stats(&self, segment_bytes: usize) -> TabletStats {
        TabletStats {
            table: self.table,
            range: self.range,
            object_count: self.object_count,
            live_bytes: self.live_bytes,
            segment_bytes: (self.order.len() * segment_bytes) as u64,
            segments: self.order.len() as u64,
            next_version: self.next_version,
        }
    }
}

// The O(data) consistency check of a tablet (`check_consistency`).
#[path = "tablet_check.rs"]
mod check;

/// How far ahead of the entry being read log traversal asks for cache lines.
const WALK_PREFETCH_BYTES: usize = 2048;
/// A cache line.
const LINE_BYTES: usize = 64;

/// The hot loop of log traversal: header fields only, then `f`.
///
/// Each entry's length says where the next starts, so the walk is a chain
/// of dependent loads; the hardware prefetcher follows the sequential
/// stream, but only as far as it has seen it. The loop also asks for the
/// lines `WALK_PREFETCH_BYTES` ahead of the entry it reads, so the chain
/// finds them in cache.
#[inline(always)]
pub(crate) fn walk_live(buf: &[u8], f: &mut impl FnMut(ObjectRef<'_>)) {
    let mut at = 0;
    // Lines below this were already asked for.
    let mut asked = 0;
    while at < buf.len() {
        while asked < at + WALK_PREFETCH_BYTES {
            crate::segment::prefetch(buf, asked);
            asked += LINE_BYTES;
        }
        let h = entry::header(buf, at);
        let key_start = at + h.header_len;
        let value_start = key_start + h.key_len;
        let next = value_start + h.value_len;
        // Live objects only: the kind, with the dead flag clear.
        if h.kind == KIND_OBJECT && !h.dead {
            f(ObjectRef {
                key: &buf[key_start..value_start],
                value: &buf[value_start..next],
                version: h.version,
                expires_at_ms: h.expires_at_ms,
            });
        }
        at = next;
    }
}
