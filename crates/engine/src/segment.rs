//! Log segments and the memory budget they are allocated from.
//!
//! A segment is one fixed-size, append-only buffer of entries (see
//! `entry.rs`). Its `Vec` is allocated once with `try_reserve_exact` at the
//! full segment size and never grows, so appends never reallocate and the
//! budget can count allocated segment bytes exactly.
//!
//! The budget covers three kinds of memory: segments, every tablet's hash
//! index (hashbrown's allocation, computed), and transient copies the engine
//! or its owner makes (index snapshots, sorted hash lists, migration buffers,
//! key lists), charged through `TransientCharge`.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::EngineError;
use crate::entry;

/// One append-only buffer of entries, owned by one tablet.
#[derive(Default)]
pub(crate) struct Segment {
    /// Creation order within the tablet (survivor segments too); 0 = freed slot.
    pub id: u64,
    /// `len()` is the bytes written; capacity is the segment size.
    pub buf: Vec<u8>,
    /// Bytes of live object and side-record entries: what the cleaner would
    /// have to copy.
    pub live_bytes: u64,
    /// Bytes of tombstones and record removals here (they stay until this
    /// segment is freed, or are copied while older segments remain).
    pub tombstone_bytes: u64,
    /// Largest segment id recorded by a tombstone or record removal here (0
    /// if none): all of them are droppable once no other segment with an id
    /// <= this exists.
    pub max_tombstone_segment: u64,
    /// Engine clock (bytes appended engine-wide) when data was last added:
    /// the age of the youngest data, for the cleaner's cost-benefit score.
    pub stamp: u64,
    /// Live objects here that carry a deadline: the expiry sweep
    /// (`expiry.rs`) skips a segment with none without reading it.
    pub expiring: u32,
    /// With `expiring > 0`: no live object here expires before this (Unix
    /// ms). Lowered by each expiring append; raised only by the sweep's exact
    /// recount, so it may be early, never late.
    pub earliest_expiry_ms: u64,
    /// Sum of the deadlines (Unix ms) of the `expiring` objects: with the
    /// count, their mean deadline without reading them (Redis's `INFO`
    /// `avg_ttl`). u128: 2^32 deadlines near 2^41 ms overflow a u64.
    pub expiry_deadline_sum_ms: u128,
    /// What the replication walks saw of this segment (`Engine::note_walk`):
    /// the last two lengths they found, each with the mark (the engine's
    /// `log_changes()`) of the first walk that found it, older first. Every
    /// entry that starts below such a length was there at that walk, so it
    /// is held by the backups once that mark is durable, and a read of it
    /// need not wait for later changes (`Engine::read_held`). Two, not one:
    /// the newest walk's round may still be in flight while the one before
    /// is held, and an entry the older walk saw waits only for that one.
    /// (0, 0) until walked. A `Cell`: the walk sees the engine shared.
    pub walked: Cell<[(u32, u64); 2]>,
}

impl Segment {
    #[inline]
    pub fn room(&self, segment_bytes: usize) -> usize {
        segment_bytes - self.buf.len()
    }

    /// The mark after whose replication the entry starting at `at` is
    /// durable, if a walk saw it (None: it came after the last walk, which
    /// the next walk's mark covers).
    #[inline]
    pub fn held_at(&self, at: usize) -> Option<u64> {
        let [(older_len, older_mark), (len, mark)] = self.walked.get();
        if at < older_len as usize {
            Some(older_mark)
        } else {
            (at < len as usize).then_some(mark)
        }
    }

    /// Note a walk at `mark` (see `walked`): nothing if it found the length
    /// the last walk found, else this walk's length and mark become the
    /// newest pair.
    #[inline]
    pub fn note_walk(&self, mark: u64) {
        let [_, newest] = self.walked.get();
        if newest.0 as usize != self.buf.len() {
            debug_assert!(self.buf.len() <= u32::MAX as usize);
            self.walked.set([newest, (self.buf.len() as u32, mark)]);
        }
    }

    /// Append an entry built from parts; the caller checked `room`.
    #[inline]
    pub fn append(
        &mut self,
        kind: u8,
        table: u64,
        version: u64,
        key: &[u8],
        value: &[u8],
        clock: u64,
    ) -> u32 {
        let at = self.buf.len();
        let _len = entry::append(&mut self.buf, kind, table, version, key, value);
        self.stamp = clock;
        at as u32
    }

    /// `append` with the value in two parts (a record's id, then its payload).
    #[inline]
    pub fn append_parts(
        &mut self,
        kind: u8,
        table: u64,
        version: u64,
        key: &[u8],
        (head, tail): (&[u8], &[u8]),
        clock: u64,
    ) -> u32 {
        let at = self.buf.len();
        let _len = entry::append_parts(&mut self.buf, kind, table, version, 0, key, head, tail);
        self.stamp = clock;
        at as u32
    }

    /// Append an object with a deadline (`expires_at_ms`, Unix ms; 0: none).
    #[inline]
    pub fn append_object(
        &mut self,
        table: u64,
        version: u64,
        expires_at_ms: u64,
        key: &[u8],
        value: &[u8],
        clock: u64,
    ) -> u32 {
        let at = self.buf.len();
        if expires_at_ms != 0 {
            self.note_expiring(expires_at_ms);
        }
        let _len = entry::append_parts(
            &mut self.buf,
            entry::KIND_OBJECT,
            table,
            version,
            expires_at_ms,
            key,
            value,
            &[],
        );
        self.stamp = clock;
        at as u32
    }

    /// Count one more live object here that expires at `expires_at_ms`.
    #[inline]
    pub fn note_expiring(&mut self, expires_at_ms: u64) {
        debug_assert!(expires_at_ms != 0);
        self.earliest_expiry_ms = if self.expiring == 0 {
            expires_at_ms
        } else {
            self.earliest_expiry_ms.min(expires_at_ms)
        };
        self.expiring += 1;
        self.expiry_deadline_sum_ms += u128::from(expires_at_ms);
    }

    /// Count one live object that expires at `expires_at_ms` less: it died
    /// here (superseded, removed, or copied away by the cleaner). The bound
    /// stays: early is allowed.
    #[inline]
    pub fn forget_expiring(&mut self, expires_at_ms: u64) {
        debug_assert!(expires_at_ms != 0 && self.expiring > 0);
        self.expiring -= 1;
        self.expiry_deadline_sum_ms -= u128::from(expires_at_ms);
    }

    /// Append an object entry that replay verified (`entry_parse::parse`),
    /// verbatim, live, with its deadline counted: what `append_object`
    /// would write for the same fields, without encoding or checksumming
    /// it again (the CRC covers the same table, header, key and value).
    #[inline]
    pub fn append_verified(&mut self, entry: &[u8], expires_at_ms: u64, clock: u64) -> u32 {
        if expires_at_ms != 0 {
            self.note_expiring(expires_at_ms);
        }
        let at = self.append_raw(entry);
        entry::clear_dead(&mut self.buf, at as usize);
        self.stamp = clock;
        at
    }

    /// Append an already encoded entry verbatim (the cleaner's copy: the CRC stays valid).
    #[inline]
    pub fn append_raw(&mut self, bytes: &[u8]) -> u32 {
        let at = self.buf.len();
        debug_assert!(at + bytes.len() <= self.buf.capacity());
        self.buf.extend_from_slice(bytes);
        at as u32
    }
}

/// Ask the CPU to start loading the cache line of `buf` at `at` (nothing if
/// `at` is past its end, or on targets without the instruction). A hint
/// only: it never faults, blocks or changes memory.
#[inline(always)]
pub(crate) fn prefetch(buf: &[u8], at: usize) {
    if at >= buf.len() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` only hints the cache; it reads nothing the
    // program sees and cannot fault, and the address is inside `buf`.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(buf.as_ptr().add(at).cast());
    }
}

/// What a new segment is for: each may dip into a different share of the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A head for object writes: leaves both reserves untouched.
    Object,
    /// A head for a tombstone: may use the remove reserve, so objects can be
    /// removed (and then cleaned away) even when the budget is full.
    Tombstone,
    /// A cleaner survivor: may use everything, so the cleaner can always
    /// make progress and never deadlocks on a full budget.
    Survivor,
}

/// Engine-wide memory accounting: segments, indexes and transient copies
/// against the budget.
pub(crate) struct Budget {
    pub budget_bytes: u64,
    pub segment_bytes: usize,
    /// Bytes of allocated segments (whole segments, whether filled or not).
    pub allocated_bytes: u64,
    /// Bytes of every tablet's hash index allocation (the sum of the tablets'
    /// `index_charged_bytes`).
    pub index_bytes: u64,
    /// Bytes held by live `TransientCharge`s; shared with them so a charge
    /// releases itself on drop without borrowing the engine.
    pub transient: Arc<AtomicU64>,
    cleaner_reserve_bytes: u64,
    remove_reserve_bytes: u64,
    /// Bytes appended engine-wide so far: a logical clock for segment ages.
    pub clock: u64,
    /// Segments allocated, freed or appended to by the cleaner so far: with
    /// `clock` it tells a replicator whether any segment changed since it
    /// last looked (`Engine::log_changes`), so an idle shard costs nothing.
    pub changes: u64,
    /// Buffers of freed segments, kept for the next allocation. Why: the
    /// cleaner frees a segment and the log opens one again a moment later;
    /// returning 2 MiB to the OS (munmap, or a heap trim) and faulting it back
    /// in cost 0.3-2.5 ms per free on the shard's thread, the longest stalls
    /// left once cleaning ran in slices. At most as many as the reserves
    /// hold, and only while the budget has room for them, so segments,
    /// indexes, transient copies and spares together never exceed the
    /// budget: index and transient growth must leave the reserves free,
    /// and a segment allocated into a reserve takes a spare first.
    spare: Vec<Vec<u8>>,
}

/// Bytes of a transient copy counted against an engine's memory budget
/// until dropped. Holds no borrow of the engine, so it can live in a
/// migration task or a cache beside it.
#[derive(Debug)]
pub struct TransientCharge {
    /// The engine's transient counter this charge is part of.
    counter: Arc<AtomicU64>,
    bytes: u64,
}

impl TransientCharge {
    /// Bytes this charge holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for TransientCharge {
    fn drop(&mut self) {
        let before = self.counter.fetch_sub(self.bytes, Ordering::Relaxed);
        debug_assert!(before >= self.bytes, "transient bytes released twice");
    }
}

impl Budget {
    pub fn new(budget_bytes: u64, segment_bytes: usize) -> Budget {
        crate::reaper::start();
        let segments = budget_bytes / segment_bytes as u64;
        // Tiny budgets cannot afford reserves; they simply get no guarantees.
        let cleaner_reserve_bytes = if segments >= 3 {
            segment_bytes as u64
        } else {
            0
        };
        let remove_reserve_bytes = if segments >= 4 {
            segment_bytes as u64
        } else {
            0
        };
        Budget {
            budget_bytes,
            segment_bytes,
            allocated_bytes: 0,
            index_bytes: 0,
            transient: Arc::new(AtomicU64::new(0)),
            cleaner_reserve_bytes,
            remove_reserve_bytes,
            clock: 0,
            changes: 0,
            spare: Vec::new(),
        }
    }

    /// Spare buffers the reserves can cover (see `spare`).
    fn max_spare(&self) -> usize {
        ((self.cleaner_reserve_bytes + self.remove_reserve_bytes) / self.segment_bytes as u64)
            as usize
    }

    /// Bytes in use: segments, indexes, transient copies.
    pub fn used_bytes(&self) -> u64 {
        self.allocated_bytes + self.index_bytes + self.transient.load(Ordering::Relaxed)
    }

    /// How full the budget is: used / budget bytes (1 for a zero budget,
    /// which has no room to be sparse in).
    pub fn pressure(&self) -> f64 {
        if self.budget_bytes == 0 {
            return 1.0;
        }
        self.used_bytes() as f64 / self.budget_bytes as f64
    }

    /// Whether `bytes` more may be used for `purpose`, leaving the reserves
    /// that purpose may not touch.
    pub fn may_grow(&self, bytes: u64, purpose: Purpose) -> bool {
        let held_back = match purpose {
            Purpose::Object => self.cleaner_reserve_bytes + self.remove_reserve_bytes,
            Purpose::Tombstone => self.cleaner_reserve_bytes,
            Purpose::Survivor => 0,
        };
        self.used_bytes()
            .checked_add(bytes)
            .and_then(|b| b.checked_add(held_back))
            .is_some_and(|b| b <= self.budget_bytes)
    }

    /// Grow a hash table charged to `index_bytes` (a tablet's index or its
    /// side-record map): refused with `OutOfMemory` when `growth` (the new
    /// table beside the old) does not fit beside the reserves; then `reserve`
    /// grows it and gives its allocation's size, which replaces the
    /// `charged` part of `index_bytes`. One path, so the two tables are
    /// charged alike.
    pub fn grow_index_table(
        &mut self,
        growth: u64,
        charged: &mut u64,
        reserve: impl FnOnce() -> Result<u64, EngineError>,
    ) -> Result<(), EngineError> {
        if growth > 0 && !self.may_grow(growth, Purpose::Object) {
            return Err(EngineError::OutOfMemory);
        }
        let now = reserve()?;
        self.index_bytes = self.index_bytes - *charged + now;
        *charged = now;
        Ok(())
    }

    pub fn may_allocate(&self, purpose: Purpose) -> bool {
        self.may_grow(self.segment_bytes as u64, purpose)
    }

    /// Charge `bytes` of a transient copy; refused (`OutOfMemory`) if they
    /// would eat into the reserves. Same rule as an object write.
    pub fn charge_transient(&self, bytes: u64) -> Result<TransientCharge, EngineError> {
        if !self.may_grow(bytes, Purpose::Object) {
            return Err(EngineError::OutOfMemory);
        }
        self.transient.fetch_add(bytes, Ordering::Relaxed);
        Ok(TransientCharge {
            counter: Arc::clone(&self.transient),
            bytes,
        })
    }

    /// Allocate a segment if the budget (and the allocator) allow it.
    pub fn allocate(&mut self, purpose: Purpose, id: u64) -> Result<Segment, EngineError> {
        if !self.may_allocate(purpose) {
            return Err(EngineError::OutOfMemory);
        }
        let buf = match self.spare.pop() {
            Some(mut buf) => {
                debug_assert!(buf.capacity() >= self.segment_bytes);
                buf.clear();
                buf
            }
            None => {
                let mut buf = Vec::new();
                buf.try_reserve_exact(self.segment_bytes)
                    .map_err(|_| EngineError::OutOfMemory)?;
                buf
            }
        };
        self.allocated_bytes += self.segment_bytes as u64;
        self.changes += 1;
        Ok(Segment {
            id,
            buf,
            stamp: self.clock,
            ..Segment::default()
        })
    }

    /// Return a segment's memory to the budget.
    pub fn free(&mut self, segment: Segment) {
        debug_assert!(segment.id != 0, "freeing an empty slot");
        debug_assert!(self.allocated_bytes >= self.segment_bytes as u64);
        self.allocated_bytes -= self.segment_bytes as u64;
        self.changes += 1;
        let spare_after = (self.spare.len() as u64 + 1) * self.segment_bytes as u64;
        if self.spare.len() < self.max_spare()
            && self.used_bytes() + spare_after <= self.budget_bytes
            && segment.buf.capacity() == self.segment_bytes
            && self.spare.try_reserve(1).is_ok()
        {
            self.spare.push(segment.buf);
        } else {
            crate::reaper::release(segment.buf);
        }
    }

    /// Bytes of spare segment buffers held (outside `used_bytes`).
    pub fn spare_bytes(&self) -> u64 {
        self.spare.len() as u64 * self.segment_bytes as u64
    }
}

#[cfg(test)]
mod spare_tests {
    use super::*;

    const SEG: usize = 4096;

    /// A freed segment's buffer is handed to the next allocation (no trip
    /// to the OS), and spares never take the budget's room: segments, index
    /// and spares together stay within it.
    #[test]
    fn freed_buffers_are_reused_within_the_budget() {
        let mut b = Budget::new(8 * SEG as u64, SEG);
        assert_eq!(b.max_spare(), 2, "one cleaner and one remove reserve");
        let mut segs: Vec<Segment> = (1..=5)
            .map(|id| b.allocate(Purpose::Object, id).expect("room"))
            .collect();
        let freed: Vec<*const u8> = segs.iter().map(|s| s.buf.as_ptr()).collect();
        let released_before = crate::reaper::released();
        for s in segs.drain(..3) {
            b.free(s);
        }
        assert_eq!(
            b.spare_bytes(),
            2 * SEG as u64,
            "two kept, the third returned"
        );
        // Other tests release buffers too (one counter per process): at
        // least this one went to the reaper rather than being dropped here.
        assert!(
            crate::reaper::released() > released_before,
            "the buffer not kept went to the reaper"
        );
        let again = b.allocate(Purpose::Object, 6).expect("room");
        assert!(
            freed[..3].contains(&again.buf.as_ptr()),
            "a spare was reused"
        );
        assert!(again.buf.is_empty() && again.buf.capacity() >= SEG);
        assert_eq!(b.spare_bytes(), SEG as u64);
        // Fill the budget to the last segment: spares are used up first, and
        // none is kept when a free would leave no room for it.
        let mut more = Vec::new();
        while let Ok(s) = b.allocate(Purpose::Survivor, 7) {
            more.push(s);
            assert!(b.used_bytes() + b.spare_bytes() <= b.budget_bytes);
        }
        assert_eq!(b.spare_bytes(), 0);
        b.free(more.pop().expect("one"));
        assert_eq!(b.spare_bytes(), SEG as u64, "the budget had room for it");
        b.index_bytes = SEG as u64 / 2; // an index took part of the room
        b.free(more.pop().expect("two"));
        assert_eq!(b.spare_bytes(), SEG as u64, "no room for a second spare");
        assert!(b.used_bytes() + b.spare_bytes() <= b.budget_bytes);
    }
}
