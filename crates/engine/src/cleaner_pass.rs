//! Incremental cleaning in slices: a pass chosen once, then carried out a
//! few kilobytes at a time after writes, so that no engine call holds the
//! shard for a whole pass.
//!
//! Why: a pass of 8 two-megabyte segments at 1M objects took ~26 ms inline
//! on the shard's event loop (`insitu bench engine`: the longest overwrite
//! call was 9.7 ms even with the index re-pointing batched), and every
//! request queued behind it waited that long. The same work cut into
//! slices of `SLICE_SCAN_BYTES` costs each write of a pass a few
//! microseconds instead.
//!
//! How a slice stays correct although writes run between slices (the shard
//! is single-threaded: a slice runs whole between two requests, so no reader
//! ever sees one half-done):
//! - A source is re-checked on every slice: same tablet instance
//!   (generation), same segment id, not the head or the open survivor. A
//!   source freed meanwhile (an explicit or room pass took it) is skipped.
//! - Entries are copied and their index entries re-pointed within the
//!   slice (`copy_kept` relinks before it returns); the copy is marked dead
//!   in the source. So between slices every live object is reachable through
//!   the index at exactly one place, as with no pass at all, and a write
//!   that supersedes a not-yet-copied entry marks it dead where it is (the
//!   slice then skips it).
//! - Copied tombstones are marked dead in the source as well, so whoever
//!   takes the source up again copies each one once.
//! - A tombstone is dropped only if no other segment of its tablet with an
//!   id <= the one it records exists (checked at the slice that reaches it).
//!   Segments created later have larger ids, so that stays true until the
//!   source is freed at the pass's last slice over it.
//! - A scan that relies on a tablet's log positions holds the tablet
//!   (`clean_holds`): its sources are skipped, not waited for. Each slice
//!   bumps `clean_epoch`, which invalidates scan cursors as a whole pass did.
//! - A source is freed only after its last slice; a pass stopped anywhere
//!   (no room for a survivor, a tablet dropped) loses nothing.

use crate::CleanStats;
use crate::cleaner::{self, Candidate, Goal, INCREMENTAL_MAX_SOURCES};
use crate::segment::Budget;
use crate::tablet::Tablet;

/// Bytes of source segments a slice reads (live entries are copied, dead
/// ones skipped) when the cleaner is behind, at the least.
pub(crate) const SLICE_SCAN_BYTES: usize = 8 * 1024;
/// Most bytes one slice reads, whatever was written: with
/// `SLICE_MAX_MOVED`, the bound on one slice's time.
///
/// Why more than `SLICE_SCAN_BYTES`: the pace asks ~17 bytes read per byte
/// written at 0.88 utilisation, so a 1 KB write needs ~17 KB. Capped at
/// 8 KiB, slices behind 1 KB writes freed less than was written, the
/// budget filled, and the write that found it full cleaned a whole segment
/// inline (`Goal::Room`: 1,740 entries, 0.6-2.5 ms in `insitu bench engine
/// --value-bytes 1000`). 64 KiB of kilobyte entries is ~64 moves.
pub(crate) const SLICE_MAX_SCAN_BYTES: usize = 64 * 1024;
/// Most entries one slice copies: the bound on its time when the bytes it
/// reads hold many small entries (each move is a few cache misses: the
/// entry, its index slot, the survivor's tail), ~0.3-1.4 us each.
pub(crate) const SLICE_MAX_MOVED: u64 = 256;
/// Fewest bytes a slice reads, so that a pass behind a run of tiny writes
/// still ends.
pub(crate) const SLICE_MIN_SCAN_BYTES: usize = 512;
/// How far ahead of the writes a slice keeps: it reads enough to free this
/// many times the bytes written since the last slice.
///
/// Why paced and not always `SLICE_SCAN_BYTES`: uniform overwrites at 0.88
/// utilisation need ~1.4 KB read per 162-byte write (each source frees
/// 1 - u of what is read), and at 0.5 (a budget mostly free) ~320 B. A
/// fixed 8 KiB ran 6 to 25 times ahead, so a pass was a burst: for a few
/// percent of the time every write carried tens of microseconds of copying
/// and the shard served requests several times slower, which is what a
/// pipelining client saw as its p99 (`insitu bench kv`, write c16 d16).
/// Paced, the same copying is spread over the writes a pass lasts, and a
/// pass still ends with room to spare: at twice the need it frees a
/// segment's worth while half a segment is written. Measured: at 1.25 the
/// cleaner fell behind under a tight budget (utilisation 0.845), at 4 a
/// write copied twice as many entries for the same tails (BENCHMARKS.md).
pub(crate) const SLICE_PACE: f64 = 2.0;
/// A pass whose segments keep more than this fraction is paced as if they
/// kept this much (a bound on the bytes one write may ask a slice to read
/// is `SLICE_MAX_SCAN_BYTES` anyway).
const PACE_MAX_KEPT: f64 = 0.95;

/// A pass in progress.
pub(crate) struct Pass {
    /// Chosen when the pass started, best first.
    sources: Vec<Candidate>,
    /// The source being cleaned.
    next: usize,
    /// Bytes of `sources[next]` already done.
    at: usize,
    /// Tombstones of `sources[next]` dropped so far (counted when it is freed).
    dropped: u64,
    /// Segment bytes the pass freed less the survivors it opened. Counted
    /// within slices: writes between slices open heads, so the budget's
    /// figure before and after the pass would not say what the pass did.
    net_freed: i64,
    /// What the pass has done so far.
    pub stats: CleanStats,
    /// The fraction of its sources' bytes the pass expects to copy (their
    /// kept bytes over their size when it started): it reads 1 / (1 - this)
    /// bytes per byte it frees.
    kept_fraction: f64,
    /// `Budget::clock` (bytes written engine-wide) when the last slice ran:
    /// what was written since is what the next slice keeps up with.
    paced_clock: u64,
    /// At the last source boundary, utilisation was under the start
    /// threshold by more than twice the gap a pass closes: the writes
    /// outran the pace, so slices read the most until the next boundary.
    /// Checked there, where the kept bytes are summed anyway, not per slice.
    behind: bool,
}

/// What a slice left.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sliced {
    /// More to do: call again after a later write.
    More,
    /// The pass is over (goal reached, sources exhausted, or no room for a survivor).
    Done,
}

impl Pass {
    /// A pass over the segments most worth cleaning, or `None` if none is.
    pub(crate) fn start(tablets: &[Option<Tablet>], budget: &Budget) -> Option<Pass> {
        let mut sources = cleaner::candidates(tablets, budget, Goal::Incremental);
        sources.truncate(INCREMENTAL_MAX_SOURCES);
        if sources.is_empty() {
            return None;
        }
        let kept: u64 = sources
            .iter()
            .filter_map(|c| {
                let t = tablets.get(c.tablet)?.as_ref()?;
                Some(cleaner::kept_bytes(t, c.slot, t.segs.get(c.slot as usize)?))
            })
            .sum();
        let kept_fraction = kept as f64 / (sources.len() * budget.segment_bytes) as f64;
        Some(Pass {
            sources,
            next: 0,
            at: 0,
            dropped: 0,
            net_freed: 0,
            stats: CleanStats::default(),
            kept_fraction,
            paced_clock: budget.clock,
            behind: false,
        })
    }

    /// Bytes the next slice should read: `SLICE_PACE` times what frees the
    /// bytes written since the last one, within [`SLICE_MIN_SCAN_BYTES`,
    /// `SLICE_MAX_SCAN_BYTES`]; at least `SLICE_SCAN_BYTES` while `behind`.
    pub(crate) fn paced_scan_bytes(&mut self, budget: &Budget) -> usize {
        let written = budget.clock.saturating_sub(self.paced_clock);
        self.paced_clock = budget.clock;
        let per_byte_freed = 1.0 / (1.0 - self.kept_fraction.min(PACE_MAX_KEPT));
        let want = (SLICE_PACE * written as f64 * per_byte_freed).ceil() as usize;
        let least = if self.behind {
            SLICE_SCAN_BYTES
        } else {
            SLICE_MIN_SCAN_BYTES
        };
        want.clamp(least, SLICE_MAX_SCAN_BYTES)
    }

    /// Bytes the pass has freed so far (survivors it opened deducted).
    pub(crate) fn bytes_freed(&self) -> u64 {
        self.net_freed.max(0) as u64
    }

    fn advance(&mut self) {
        self.next += 1;
        self.at = 0;
        self.dropped = 0;
    }

    /// Read at most about `max_scan` bytes of sources (to the next entry
    /// boundary) and move at most `SLICE_MAX_MOVED` entries, copying what
    /// they keep; free each source finished.
    pub(crate) fn slice(
        &mut self,
        tablets: &mut [Option<Tablet>],
        budget: &mut Budget,
        max_scan: usize,
    ) -> Sliced {
        let mut left = max_scan;
        let moved_at_start = self.stats.entries_moved;
        loop {
            let moves_left =
                SLICE_MAX_MOVED.saturating_sub(self.stats.entries_moved - moved_at_start);
            if left == 0 || moves_left == 0 {
                return Sliced::More;
            }
            let Some(&c) = self.sources.get(self.next) else {
                return Sliced::Done;
            };
            if self.at == 0 {
                // Between sources: stop once the budget has headroom and
                // utilisation is back up, and note whether the writes
                // outran the pace.
                let kept = cleaner::kept_bytes_total(tablets) as f64;
                let allocated = budget.allocated_bytes as f64;
                let pressure = budget.pressure();
                let gap = cleaner::INCREMENTAL_HIGH - cleaner::INCREMENTAL_LOW;
                self.behind = kept < (cleaner::incremental_low(pressure) - 2.0 * gap) * allocated;
                if !cleaner::pressed(budget)
                    && kept >= cleaner::incremental_high(pressure) * allocated
                {
                    return Sliced::Done;
                }
            }
            let t = match tablets.get_mut(c.tablet) {
                Some(Some(t)) if t.generation == c.generation => t,
                _ => {
                    self.advance(); // the tablet was dropped or replaced
                    continue;
                }
            };
            let gone = t.segs.get(c.slot as usize).is_none_or(|s| s.id != c.id)
                || t.head == Some(c.slot)
                || t.survivor == Some(c.slot);
            if gone || t.clean_holds > 0 {
                self.advance();
                continue;
            }
            if t.free_slots.try_reserve(1).is_err() {
                return Sliced::Done;
            }
            let min_other = t.min_segment_id_except(c.slot);
            t.clean_epoch += 1; // invalidates scan cursors (scan.rs)
            let mut src = std::mem::take(&mut t.segs[c.slot as usize]);
            let from = self.at;
            let allocated = budget.allocated_bytes as i64;
            let copied = cleaner::copy_kept(
                t,
                c.slot,
                &mut src,
                (from, left, moves_left),
                min_other,
                budget,
                &mut self.stats,
                &mut self.dropped,
            );
            let outcome = match copied {
                Ok(end) if end == src.buf.len() => {
                    left = left.saturating_sub(end - from);
                    self.stats.segments_cleaned += 1;
                    self.stats.tombstones_dropped += self.dropped;
                    t.free_segment(c.slot, src, budget);
                    self.advance();
                    None
                }
                Ok(end) => {
                    debug_assert!(end > from, "a slice makes progress");
                    t.segs[c.slot as usize] = src;
                    self.at = end;
                    Some(Sliced::More) // `left` or `moves_left` is used up
                }
                Err(_) => {
                    // No room even for a survivor: what was copied is
                    // re-pointed and dead in the source; stop here.
                    t.segs[c.slot as usize] = src;
                    Some(Sliced::Done)
                }
            };
            self.net_freed += allocated - budget.allocated_bytes as i64;
            if let Some(outcome) = outcome {
                return outcome;
            }
        }
    }
}

#[cfg(test)]
#[path = "cleaner_pass_tests.rs"]
mod tests;
