//! Budget policy: making room in a head (incremental cleaning, cleaning
//! when the budget is full, `OutOfMemory`), running the cleaner, and the
//! engine-wide memory figures.

use crate::cleaner::{self, Goal};
use crate::cleaner_pass::{Pass, Sliced};
use crate::compact;
use crate::segment::{Budget, Purpose, TransientCharge};
#[cfg(debug_assertions)]
use crate::tablet::Tablet;
use crate::{CleanStats, Engine, EngineError, MemoryStats};

impl Engine {
    /// Bytes of live objects (what `MemoryStats::live_bytes` reports).
    pub(crate) fn live_bytes_total(&self) -> u64 {
        self.tablets.iter().flatten().map(|t| t.live_bytes).sum()
    }

    /// Bytes the cleaner must keep: live objects and live side records.
    fn kept_bytes_total(&self) -> u64 {
        cleaner::kept_bytes_total(&self.tablets)
    }

    pub(crate) fn wants_incremental_clean(&self) -> bool {
        let allocated = self.budget.allocated_bytes;
        allocated >= cleaner::INCREMENTAL_MIN_SEGMENTS * self.config.segment_bytes as u64
            && self.budget.clock >= self.incremental_backoff_clock
            && (cleaner::pressed(&self.budget)
                || (self.kept_bytes_total() as f64)
                    < cleaner::incremental_low(self.budget.pressure()) * allocated as f64)
    }

    /// One slice of the incremental pass in progress, if any (after a
    /// write: nothing the caller holds points into the log).
    #[inline]
    pub(crate) fn clean_slice_if_due(&mut self) {
        if self.clean_pass.is_some() {
            self.clean_slice();
        }
    }

    #[cold]
    fn clean_slice(&mut self) {
        let Some(pass) = self.clean_pass.as_mut() else {
            return;
        };
        let scan = pass.paced_scan_bytes(&self.budget);
        let before = pass.stats.clone();
        let sliced = pass.slice(&mut self.tablets, &mut self.budget, scan);
        let mut slice = CleanStats {
            segments_cleaned: pass.stats.segments_cleaned - before.segments_cleaned,
            entries_moved: pass.stats.entries_moved - before.entries_moved,
            bytes_freed: 0,
            tombstones_dropped: pass.stats.tombstones_dropped - before.tombstones_dropped,
        };
        if sliced == Sliced::Done {
            let freed = pass.bytes_freed();
            slice.bytes_freed = freed;
            if freed == 0 {
                // Nothing to gain (entries too large to pack better, say):
                // no new pass for a while.
                self.incremental_backoff_clock =
                    self.budget.clock + self.budget.allocated_bytes / 2;
            }
            self.clean_pass = None;
        }
        self.add_clean_totals(&slice);
    }

    fn add_clean_totals(&mut self, stats: &CleanStats) {
        let t = &mut self.cleaner_totals;
        t.segments_cleaned += stats.segments_cleaned;
        t.entries_moved += stats.entries_moved;
        t.bytes_freed += stats.bytes_freed;
        t.tombstones_dropped += stats.tombstones_dropped;
        #[cfg(debug_assertions)]
        if stats.segments_cleaned > 0
            && self
                .tablets
                .iter()
                .flatten()
                .map(|t| t.object_count)
                .sum::<u64>()
                < 5_000
        {
            self.tablets
                .iter()
                .flatten()
                .for_each(Tablet::check_consistency);
        }
    }

    pub(crate) fn run_cleaner(&mut self, goal: Goal) -> CleanStats {
        let stats = cleaner::run(&mut self.tablets, &mut self.budget, goal);
        self.add_clean_totals(&stats);
        stats
    }

    /// Index room for one more object in tablet `slot`. The index grows by
    /// doubling, so on a full budget a whole cleaning pass runs before the
    /// one retry (one segment's worth would rarely be enough).
    pub(crate) fn reserve_index_room(&mut self, slot: usize) -> Result<(), EngineError> {
        let attempt = |e: &mut Engine| {
            let Engine {
                tablets, budget, ..
            } = e;
            tablets[slot]
                .as_mut()
                .expect("a routed slot holds a tablet")
                .reserve_index(budget, 1)
        };
        match attempt(self) {
            Err(EngineError::OutOfMemory) => {
                self.run_cleaner(Goal::Explicit);
                attempt(self)
            }
            other => other,
        }
    }

    /// Charge `bytes` of a transient copy (a migration buffer, a key list, a
    /// snapshot) to the memory budget until the returned charge is dropped.
    /// Refused with `OutOfMemory` when it would not fit beside the reserves
    /// (the same rule as an object write); no cleaning is attempted, so a
    /// refusal is cheap and the caller may retry later or in smaller pieces.
    pub fn try_charge_transient(&self, bytes: u64) -> Result<TransientCharge, EngineError> {
        self.budget.charge_transient(bytes)
    }

    /// The budget is full: compact tablet `slot` so that its own survivor
    /// becomes a head with `len` bytes free (see `compact::compact_into_head`),
    /// if the tablet holds at least `min_reclaimable` bytes copying would free.
    fn compact_tablet_into_head(&mut self, slot: usize, len: usize, min_reclaimable: u64) -> bool {
        let mut stats = CleanStats::default();
        let allocated_before = self.budget.allocated_bytes;
        let (t, budget) = self.tablet_and_budget(slot);
        let done = compact::compact_into_head(t, budget, len, min_reclaimable, &mut stats);
        stats.bytes_freed = allocated_before.saturating_sub(self.budget.allocated_bytes);
        self.add_clean_totals(&stats);
        debug_assert!(!done || self.tablet(slot).head_room(self.config.segment_bytes) >= len);
        done
    }

    /// Head room an append of `len` bytes to tablet `slot` asks for when it
    /// is not a removal: `len` and the tablet's room for one tombstone
    /// behind it (`slack.rs`), grown to cover `new_key` (the length of the
    /// key of an object the append adds, if any).
    pub(crate) fn append_room(&self, slot: usize, len: usize, new_key: Option<usize>) -> usize {
        let t = self.tablet(slot);
        let slack = match new_key {
            Some(key_len) => t.tombstone_slack_with(key_len),
            None => t.tombstone_slack(),
        };
        t.append_room(len, slack, self.config.segment_bytes)
    }

    /// Make sure the head of tablet `slot` has `len` bytes free, opening a
    /// new head if needed: after incremental cleaning when utilisation is
    /// low, after cleaning for room when the budget is full, and failing with
    /// `OutOfMemory` if there is still no room. Returns whether the cleaner
    /// ran (log references held by the caller may then have moved).
    pub(crate) fn make_room(
        &mut self,
        slot: usize,
        len: usize,
        purpose: Purpose,
    ) -> Result<bool, EngineError> {
        // Room promised to pending groups stays free behind every append
        // (`promise.rs`); a group drops its promise before it appends.
        let held = self.tablet(slot).promised.bytes();
        let fresh = self.config.segment_bytes - crate::entry::MAX_HEADER_BYTES;
        if held > 0 && len + held > fresh {
            return Err(EngineError::HeadPromised {
                held,
                asked: len,
                max: fresh,
            });
        }
        let len = len + held;
        if self.tablet(slot).head_room(self.config.segment_bytes) >= len {
            return Ok(false);
        }
        let mut cleaned = false;
        // A new head is about to be opened: start an incremental pass if
        // utilisation is low. Its slices run after this write and the next
        // ones (`clean_slice_if_due`), nothing of it here.
        if self.clean_pass.is_none() && self.wants_incremental_clean() {
            self.clean_pass = Pass::start(&self.tablets, &self.budget);
            if self.clean_pass.is_none() {
                self.incremental_backoff_clock =
                    self.budget.clock + self.budget.allocated_bytes / 2;
            }
        }
        if !self.budget.may_allocate(purpose) {
            cleaned = true;
            // The tablet itself first if that gains at least 1/8 segment (a
            // cheap, local pass), then every tablet, then the tablet again
            // for any gain at all: the last resort that lets removes and
            // writes use space freed in tablets with few segments.
            let worthwhile = self.config.segment_bytes as u64 / 8;
            if self.compact_tablet_into_head(slot, len, worthwhile) {
                return Ok(true);
            }
            self.run_cleaner(Goal::Room(purpose));
            if !self.budget.may_allocate(purpose) && self.compact_tablet_into_head(slot, len, 0) {
                return Ok(true);
            }
        }
        let (t, budget) = self.tablet_and_budget(slot);
        t.open_head(budget, purpose)?;
        debug_assert!(t.head_room(budget.segment_bytes) >= len);
        Ok(cleaned)
    }

    pub fn memory(&self) -> MemoryStats {
        let live = self.live_bytes_total();
        let held = self.budget.allocated_bytes;
        MemoryStats {
            budget_bytes: self.budget.budget_bytes,
            segment_bytes: held,
            index_bytes: self.budget.index_bytes,
            transient_bytes: self
                .budget
                .transient
                .load(std::sync::atomic::Ordering::Relaxed),
            live_bytes: live,
            utilization: if held == 0 {
                1.0
            } else {
                live as f64 / held as f64
            },
        }
    }

    /// One cleaner pass over every tablet: compact segments with little live
    /// data. Also runs by itself when a write finds the budget full.
    pub fn clean(&mut self) -> CleanStats {
        self.run_cleaner(Goal::Explicit)
    }

    /// Run `f`; if the budget is full, clean the other tablets once and retry.
    pub(crate) fn with_room_retry(
        &mut self,
        mut f: impl FnMut(&mut Budget) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        match f(&mut self.budget) {
            Err(EngineError::OutOfMemory) => {
                self.run_cleaner(Goal::Room(Purpose::Object));
                f(&mut self.budget)
            }
            other => other,
        }
    }
}
