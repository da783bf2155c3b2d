//! Log segments and the memory budget they are allocated from.
//!
//! A segment is one fixed-size, append-only buffer of entries (see
//! `entry.rs`). Its `Vec` is allocated once with `try_reserve_exact` at the
//! full segment size and never grows, so appends never reallocate and the
//! budget can count allocated segment bytes exactly.

use crate::EngineError;
use crate::entry;

/// One append-only buffer of entries, owned by one tablet.
#[derive(Default)]
pub(crate) struct Segment {
    /// Creation order within the tablet (survivor segments too); 0 = freed slot.
    pub id: u64,
    /// `len()` is the bytes written; capacity is the segment size.
    pub buf: Vec<u8>,
    /// Bytes of live object entries: what the cleaner would have to copy.
    pub live_bytes: u64,
    /// Bytes of tombstones here (they stay until this segment is freed).
    pub tombstone_bytes: u64,
    /// Largest segment id recorded by a tombstone here (0 if none): all of
    /// them are droppable once no other segment with an id <= this exists.
    pub max_tombstone_segment: u64,
    /// Engine clock (bytes appended engine-wide) when data was last added:
    /// the age of the youngest data, for the cleaner's cost-benefit score.
    pub stamp: u64,
}

impl Segment {
    #[inline]
    pub fn room(&self, segment_bytes: usize) -> usize {
        segment_bytes - self.buf.len()
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
        entry::append(&mut self.buf, kind, table, version, key, value);
        self.stamp = clock;
        at as u32
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

/// Engine-wide memory accounting: allocated segment bytes against the budget.
pub(crate) struct Budget {
    pub budget_bytes: u64,
    pub segment_bytes: usize,
    pub allocated_bytes: u64,
    cleaner_reserve_bytes: u64,
    remove_reserve_bytes: u64,
    /// Bytes appended engine-wide so far: a logical clock for segment ages.
    pub clock: u64,
}

impl Budget {
    pub fn new(budget_bytes: u64, segment_bytes: usize) -> Budget {
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
            cleaner_reserve_bytes,
            remove_reserve_bytes,
            clock: 0,
        }
    }

    pub fn may_allocate(&self, purpose: Purpose) -> bool {
        let held_back = match purpose {
            Purpose::Object => self.cleaner_reserve_bytes + self.remove_reserve_bytes,
            Purpose::Tombstone => self.cleaner_reserve_bytes,
            Purpose::Survivor => 0,
        };
        self.allocated_bytes + self.segment_bytes as u64 + held_back <= self.budget_bytes
    }

    /// Allocate a segment if the budget (and the allocator) allow it.
    pub fn allocate(&mut self, purpose: Purpose, id: u64) -> Result<Segment, EngineError> {
        if !self.may_allocate(purpose) {
            return Err(EngineError::OutOfMemory);
        }
        let mut buf = Vec::new();
        buf.try_reserve_exact(self.segment_bytes)
            .map_err(|_| EngineError::OutOfMemory)?;
        self.allocated_bytes += self.segment_bytes as u64;
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
        drop(segment);
    }
}
