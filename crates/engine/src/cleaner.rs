//! The log cleaner: copies the live entries of lightly used segments into
//! survivor segments of the same tablet and frees the sources.
//!
//! Policy (RAMCloud's cost-benefit, from LFS): a segment's score is
//! `(1 - u) * age / (1 + u)`, where `u` is the fraction of the segment that
//! must be copied (live objects, plus tombstones that cannot be dropped yet)
//! and `age` is how long ago (in bytes appended engine-wide) its youngest
//! data was written. Freeing `1 - u` of a segment costs reading it (1) and
//! copying `u`; old data is unlikely to die soon by itself, so compacting it
//! now is worth more than compacting young data that may still be
//! overwritten for free. The head (where writes append) and the open
//! survivor are never cleaned.
//!
//! Tombstones. A tombstone for key `k` records `R`, the id of the newest
//! segment its tablet had allocated when the tombstone was written. It may be
//! dropped (not copied) when the segment holding it is freed and no other
//! segment of the tablet with id <= R still exists. Why that is safe: an
//! older version of `k` can only be in a segment that existed when the
//! tombstone was written, because (a) new writes of `k` get higher versions,
//! and (b) the cleaner copies only live entries, and every older version of
//! `k` was dead from the moment the tombstone was written, so no segment
//! created afterwards (id > R, ids growing in creation order) receives one.
//! Those older segments (id <= R) are all gone, except the one being freed
//! now, whose dead entries vanish with it; so no replayable copy of an older
//! version remains for the tombstone to cancel. (Recording the segment the
//! tombstone landed in would not be enough: a survivor created after that
//! head was opened may hold a copy made while the old version was still live.)
//!
//! Side records (`records.rs`) follow the same rules: a live record entry is
//! copied like a live object (its map entry re-pointed, not the index), a
//! superseded or removed one is dead and goes, and a record removal records
//! `R` like a tombstone and is kept or dropped by the tombstone rule: an
//! older entry of the same record id can only be in a segment that existed
//! when the removal was written, for the same reasons (a, b).
//! A source is freed only after all it keeps was copied; if a survivor cannot
//! be allocated midway, the source stays (its copied objects marked dead,
//! its tombstones still physically there), so a failed pass loses nothing.

use crate::entry::{
    self, KIND_MARK, KIND_OBJECT, KIND_RECORD, KIND_RECORD_REMOVED, KIND_TOMBSTONE,
};
use crate::index::{loc, probe_hash};
use crate::segment::{Budget, Purpose, Segment};
use crate::tablet::Tablet;
use crate::{CleanStats, EngineError};

/// What a pass is trying to achieve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Goal {
    /// `Engine::clean`: every segment worth compacting.
    Explicit,
    /// Utilisation fell below `INCREMENTAL_LOW`: raise it to `INCREMENTAL_HIGH`.
    Incremental,
    /// A write found the budget full: free enough for a segment of `Purpose`.
    Room(Purpose),
}

/// Under memory pressure, incremental cleaning starts below this
/// utilisation (live / allocated)...
pub(crate) const INCREMENTAL_LOW: f64 = 0.88;
/// ...and stops once it is back above this (the same gap is kept at every
/// pressure, `incremental_high`).
pub(crate) const INCREMENTAL_HIGH: f64 = 0.90;
/// With the budget mostly free, incremental cleaning starts only below this
/// utilisation: the log may hold up to twice its live bytes.
pub(crate) const RELAXED_LOW: f64 = 0.50;
/// Pressure (used / budget bytes) up to which `RELAXED_LOW` applies...
pub(crate) const PRESSURE_RELAXED: f64 = 0.25;
/// ...and from which `INCREMENTAL_LOW` does (linear in between).
pub(crate) const PRESSURE_FULL: f64 = 0.75;

/// The utilisation below which an incremental pass starts, at `pressure`
/// (`Budget::pressure`: used / budget bytes).
///
/// Why it depends on pressure: the cost of cleaning per write grows as
/// u / (1 - u) in the utilisation u of the segments cleaned. Held at 0.88
/// whatever the budget, uniform overwrites moved 4.2 entries per write, and
/// a profile of Redis-protocol `SET`s on a server using an eighth of its
/// budget spent a quarter of its shard's time copying survivors, to save
/// memory nobody needed. A budget mostly free lets the log run sparse (at
/// worst twice the live bytes, so a server's memory stays a small multiple
/// of its data, and its replicas and a recovery read no more than that);
/// as the budget fills the target rises to 0.88, so memory is compact
/// exactly when it is scarce. At steady state `pressure * low(pressure)` is
/// the live share of the budget, an increasing function: one equilibrium.
pub(crate) fn incremental_low(pressure: f64) -> f64 {
    let t = ((pressure - PRESSURE_RELAXED) / (PRESSURE_FULL - PRESSURE_RELAXED)).clamp(0.0, 1.0);
    RELAXED_LOW + t * (INCREMENTAL_LOW - RELAXED_LOW)
}

/// The utilisation at which an incremental pass stops, at `pressure`.
pub(crate) fn incremental_high(pressure: f64) -> f64 {
    incremental_low(pressure) + (INCREMENTAL_HIGH - INCREMENTAL_LOW)
}
/// Segments of budget headroom (beyond the reserves) below which the
/// budget is *pressed*: an incremental pass starts whatever the utilisation
/// and does not stop (at a source boundary) until the headroom is back.
///
/// Why: the utilisation thresholds say how dense the log is, not how close
/// the budget is to full. With a budget that leaves only a few segments
/// beyond live / 0.9 (`insitu bench engine` at 1 KB values leaves about 7
/// with the reserves), a pass stopped at `INCREMENTAL_HIGH` let the writes
/// fill the budget before utilisation fell back to `INCREMENTAL_LOW`, and
/// the write that found it full cleaned a whole segment inline
/// (`Goal::Room`: 1,740 entries of 1 KB, 0.6-2.5 ms on one call). Two
/// segments are the next head and one more: a pass that starts when a head
/// opens into that margin has a segment's worth of writes to free one.
pub(crate) const PRESSED_HEADROOM_SEGMENTS: u64 = 2;

/// Whether the budget has less than `PRESSED_HEADROOM_SEGMENTS` of room
/// for object segments left.
pub(crate) fn pressed(budget: &Budget) -> bool {
    !budget.may_grow(
        PRESSED_HEADROOM_SEGMENTS * budget.segment_bytes as u64,
        Purpose::Object,
    )
}
/// No incremental cleaning while fewer segments than this are held.
pub(crate) const INCREMENTAL_MIN_SEGMENTS: u64 = 8;
/// Cap on segments one incremental pass cleans. The list is chosen when the
/// pass starts and ages while it runs (a slice at a time, `cleaner_pass.rs`).
/// 8 keeps utilisation at INCREMENTAL_LOW under uniform overwrites (1M
/// objects, 3M random overwrites: 0.888, 4.2 entries moved per write); at 4
/// the cleaner falls behind and utilisation drops to 0.75. (Run whole, a pass
/// of 8 took 26 ms at 1M objects, down from 72-106 ms at 64: why passes are
/// now sliced.)
pub(crate) const INCREMENTAL_MAX_SOURCES: usize = 8;

impl Goal {
    /// Segments whose kept fraction is at or above this are not worth copying.
    fn max_utilisation(self) -> f64 {
        match self {
            Goal::Explicit => 0.90,
            Goal::Incremental => 0.95,
            // Any gain helps when a write is waiting for room.
            Goal::Room(_) => 0.999,
        }
    }
}

/// A segment chosen for cleaning, and how to tell that it is still the same
/// one when it is reached (a sliced pass reaches it many writes later).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    pub tablet: usize,
    /// `Tablet::generation`: a dropped tablet's slot may hold a new tablet
    /// whose segment ids start again at 1.
    pub generation: u64,
    pub slot: u32,
    pub id: u64,
    score: f64,
}

/// Bytes the cleaner must keep in all `tablets`: live objects and live
/// side records (utilisation is this over the segment bytes held).
pub(crate) fn kept_bytes_total(tablets: &[Option<Tablet>]) -> u64 {
    tablets
        .iter()
        .flatten()
        .map(|t| t.live_bytes + t.record_bytes)
        .sum()
}

/// Bytes the cleaner would copy out of `seg`: live objects, plus its
/// tombstones unless all of them are droppable now.
pub(crate) fn kept_bytes(t: &Tablet, slot: u32, seg: &Segment) -> u64 {
    let droppable = seg.max_tombstone_segment < t.min_segment_id_except(slot);
    seg.live_bytes + if droppable { 0 } else { seg.tombstone_bytes }
}

/// Every segment worth cleaning towards `goal`, best first.
pub(crate) fn candidates(
    tablets: &[Option<Tablet>],
    budget: &Budget,
    goal: Goal,
) -> Vec<Candidate> {
    let segment_bytes = budget.segment_bytes as f64;
    let max_u = goal.max_utilisation();
    let mut candidates = Vec::new();
    for (ti, t) in tablets.iter().enumerate() {
        let Some(t) = t else { continue };
        if t.clean_holds > 0 {
            continue; // a scan relies on this tablet's log positions
        }
        for &slot in &t.order {
            if t.head == Some(slot) || t.survivor == Some(slot) {
                continue;
            }
            let seg = &t.segs[slot as usize];
            let u = kept_bytes(t, slot, seg) as f64 / segment_bytes;
            if u >= max_u {
                continue;
            }
            let age = (budget.clock.saturating_sub(seg.stamp) + 1) as f64;
            // Never abort on allocation: a short candidate list just cleans less.
            if candidates.try_reserve(1).is_err() {
                break;
            }
            candidates.push(Candidate {
                tablet: ti,
                generation: t.generation,
                slot,
                id: seg.id,
                score: (1.0 - u) * age / (1.0 + u),
            });
        }
    }
    candidates.sort_unstable_by(|a, b| b.score.total_cmp(&a.score));
    candidates
}

/// One pass over all tablets towards `goal`, run to its end. Incremental
/// passes do not come here: they run in slices (`cleaner_pass.rs`), which
/// also decide when they are done.
pub(crate) fn run(tablets: &mut [Option<Tablet>], budget: &mut Budget, goal: Goal) -> CleanStats {
    debug_assert!(goal != Goal::Incremental, "incremental passes are sliced");
    let mut stats = CleanStats::default();
    let candidates = candidates(tablets, budget, goal);
    let allocated_before = budget.allocated_bytes;
    for c in &candidates {
        let done = match goal {
            Goal::Explicit | Goal::Incremental => false,
            Goal::Room(purpose) => budget.may_allocate(purpose),
        };
        if done {
            break;
        }
        let Some(t) = tablets[c.tablet].as_mut() else {
            continue;
        };
        // A survivor of this pass may have reused a cleaned slot.
        if t.segs[c.slot as usize].id != c.id
            || t.survivor == Some(c.slot)
            || t.head == Some(c.slot)
        {
            continue;
        }
        if clean_segment(t, c.slot, budget, &mut stats).is_err() {
            continue; // no room for a survivor of its own: nothing was lost, and others may fit theirs
        }
    }
    // Still no room: the survivors the pass needed may not have been
    // allocatable at all; free what fits room the tablets already hold.
    if let Goal::Room(purpose) = goal
        && !budget.may_allocate(purpose)
    {
        crate::pack::free_in_place(tablets, budget, purpose, &mut stats);
    }
    stats.bytes_freed = allocated_before.saturating_sub(budget.allocated_bytes);
    stats
}

/// Copy what `slot` keeps into survivors and free it.
pub(crate) fn clean_segment(
    t: &mut Tablet,
    slot: u32,
    budget: &mut Budget,
    stats: &mut CleanStats,
) -> Result<(), EngineError> {
    debug_assert!(t.head != Some(slot) && t.survivor != Some(slot));
    t.free_slots
        .try_reserve(1)
        .map_err(|_| EngineError::OutOfMemory)?;
    let min_other = t.min_segment_id_except(slot);
    t.clean_epoch += 1; // invalidates scan cursors (scan.rs)
    let mut src = std::mem::take(&mut t.segs[slot as usize]);
    let mut dropped = 0;
    let copied = copy_kept(
        t,
        slot,
        &mut src,
        (0, usize::MAX, u64::MAX),
        min_other,
        budget,
        stats,
        &mut dropped,
    );
    match copied {
        Ok(end) => {
            debug_assert_eq!(end, src.buf.len());
            stats.segments_cleaned += 1;
            stats.tombstones_dropped += dropped;
            t.free_segment(slot, src, budget);
            Ok(())
        }
        Err(e) => {
            t.segs[slot as usize] = src;
            Err(e)
        }
    }
}

/// Copy the live entry of `len` bytes at `at` of `src` (an object or a side
/// record) into a survivor segment of `t`, counted live there; returns the
/// survivor's slot and the entry's offset in it. Inlined: it is the body of
/// the cleaner's per-entry loop.
#[inline(always)]
fn copy_live(
    t: &mut Tablet,
    budget: &mut Budget,
    src: &Segment,
    at: usize,
    len: usize,
) -> Result<(u32, u32), EngineError> {
    let sv = survivor_with_room(t, budget, len)?;
    let survivor = &mut t.segs[sv as usize];
    let new_at = survivor.append_raw(&src.buf[at..at + len]);
    budget.changes += 1;
    survivor.live_bytes += len as u64;
    survivor.stamp = survivor.stamp.max(src.stamp);
    Ok((sv, new_at))
}

/// Copy what the entries of `src` (slot `slot`, taken out of the tablet)
/// keep, starting at byte `from` and stopping at the first entry boundary at
/// or past `from + max_scan` bytes, or after `max_moved` entries copied;
/// returns that offset (`src.buf.len()` when the segment is done).
/// Everything copied is marked dead in `src` (objects, side records,
/// tombstones and record removals), so a later call, or another pass that
/// takes the same segment, never copies it twice; `min_other` is the
/// smallest id of the tablet's other segments (the tombstone rule).
#[allow(clippy::too_many_arguments)] // one call site each; a struct would only rename them
pub(crate) fn copy_kept(
    t: &mut Tablet,
    slot: u32,
    src: &mut Segment,
    (from, max_scan, max_moved): (usize, usize, u64),
    min_other: u64,
    budget: &mut Budget,
    stats: &mut CleanStats,
    dropped: &mut u64,
) -> Result<usize, EngineError> {
    // Index updates are batched: each is a cache miss on a random index
    // slot, and a tight loop of independent lookups lets the CPU overlap
    // them (one at a time, they were 70% of the cleaner's time).
    let mut moved: [(u64, u64, u64); MOVE_BATCH] = [(0, 0, 0); MOVE_BATCH];
    let mut pending = 0;
    let mut at = from;
    let stop = from.saturating_add(max_scan);
    let moved_before = stats.entries_moved;
    while at < src.buf.len() && at < stop && stats.entries_moved - moved_before < max_moved {
        let len = entry::len_at(&src.buf, at);
        match entry::kind(&src.buf, at) {
            KIND_OBJECT if !entry::is_dead(&src.buf, at) => {
                let (sv, new_at) = match copy_live(t, budget, src, at, len) {
                    Ok(copied) => copied,
                    Err(e) => {
                        relink(t, &moved[..pending]);
                        return Err(e);
                    }
                };
                let expires_at_ms = entry::expires_at(&src.buf, at);
                if expires_at_ms != 0 {
                    t.segs[sv as usize].note_expiring(expires_at_ms);
                    src.forget_expiring(expires_at_ms);
                }
                let hash = crate::key_hash(t.table, entry::key_at(&src.buf, at));
                moved[pending] = (hash, loc(slot, at as u32), loc(sv, new_at));
                pending += 1;
                if pending == MOVE_BATCH {
                    relink(t, &moved);
                    pending = 0;
                }
                // Dead in the source now; a pass that stops midway relinks
                // what it copied first, so it stays consistent.
                entry::set_dead(&mut src.buf, at);
                src.live_bytes -= len as u64;
                stats.entries_moved += 1;
            }
            KIND_RECORD if !entry::is_dead(&src.buf, at) => {
                let (sv, new_at) = match copy_live(t, budget, src, at, len) {
                    Ok(copied) => copied,
                    Err(e) => {
                        relink(t, &moved[..pending]);
                        return Err(e);
                    }
                };
                // Re-pointed at once (records are few: no batching).
                let id = entry::record_at(&src.buf, at).id;
                let mapped = t.records.get_mut(&id).expect("a live record is mapped");
                debug_assert_eq!(*mapped, loc(slot, at as u32));
                *mapped = loc(sv, new_at);
                entry::set_dead(&mut src.buf, at);
                src.live_bytes -= len as u64;
                stats.entries_moved += 1;
            }
            // A record removal is a tombstone for its record id.
            KIND_TOMBSTONE | KIND_RECORD_REMOVED if !entry::is_dead(&src.buf, at) => {
                let recorded = entry::tombstone_segment(&src.buf, at);
                if recorded < min_other {
                    *dropped += 1;
                } else {
                    let sv = match survivor_with_room(t, budget, len) {
                        Ok(sv) => sv,
                        Err(e) => {
                            relink(t, &moved[..pending]);
                            return Err(e);
                        }
                    };
                    let survivor = &mut t.segs[sv as usize];
                    survivor.append_raw(&src.buf[at..at + len]);
                    budget.changes += 1;
                    survivor.tombstone_bytes += len as u64;
                    survivor.max_tombstone_segment = survivor.max_tombstone_segment.max(recorded);
                    survivor.stamp = survivor.stamp.max(src.stamp);
                    stats.entries_moved += 1;
                    // Copied: not to be copied again if this segment is
                    // taken up again before it is freed (a sliced pass).
                    entry::set_dead(&mut src.buf, at);
                    src.tombstone_bytes -= len as u64;
                }
            }
            // A mark of a headless tablet, unless the counter is held by
            // another segment: carried on (see `carry_counter`).
            KIND_MARK if t.head.is_none() && t.counter_mark.is_none_or(|id| id == src.id) => {
                if let Err(e) = carry_counter(t, budget, src) {
                    relink(t, &moved[..pending]);
                    return Err(e);
                }
            }
            // Dead objects go; other marks go too: the head's mark and
            // entries always bound the versions issued before it was opened.
            _ => {}
        }
        at += len;
    }
    relink(t, &moved[..pending]);
    Ok(at)
}

/// Append a version mark holding the counter (`t.next_version`) to a
/// survivor of `t`, which has no head, as the cleaner copies a mark out of
/// `src`. Why: a tablet's counter is bounded by its log only through its
/// head (its opening mark, `raise_version`'s marks, and the entries appended
/// since, dead ones and tombstones included). `compact_into_head` seals the
/// head and may clean it without adopting a new one; the versions above
/// every surviving copy were then held only by the dropped mark, dead
/// entries and dropped tombstones, and a replay from that log restored a
/// lower counter (a raised version mark, then the head cleaned by a write
/// that still found no room, then a replay: versions handed out again).
/// While a tablet has no head its counter does not move (taking or raising
/// a version opens a head first), so the fresh mark is its exact value.
/// Until a mark is carried, the old head holds the counter, and it began
/// with a mark; after, the segment named by `t.counter_mark` does, and only
/// its mark is carried on (once: it then names the survivor). So cleaning
/// whatever holds the counter carries it on, and cleaning anything else
/// while the counter is held elsewhere adds no byte (repeated compactions of
/// a headless tablet would otherwise multiply marks and eat the room a
/// remove relies on). Once a head is opened again, its own mark holds it.
fn carry_counter(t: &mut Tablet, budget: &mut Budget, src: &Segment) -> Result<(), EngineError> {
    debug_assert!(t.head.is_none(), "a head's mark holds the counter");
    let (table, version) = (t.table, t.next_version);
    let len = entry::entry_bytes(0, 0, version);
    let sv = survivor_with_room(t, budget, len)?;
    let survivor = &mut t.segs[sv as usize];
    // A survivor takes the age of the data copied in, not the clock's.
    let stamp = survivor.stamp.max(src.stamp);
    survivor.append(KIND_MARK, table, version, &[], &[], budget.clock);
    survivor.stamp = stamp;
    t.counter_mark = Some(survivor.id);
    budget.changes += 1;
    Ok(())
}

/// Objects copied before their index entries are pointed at the copies.
const MOVE_BATCH: usize = 32;

/// Point the index entries of moved objects (hash, old loc, new loc) at their copies.
#[inline]
fn relink(t: &mut Tablet, moved: &[(u64, u64, u64)]) {
    for &(hash, old, new) in moved {
        let prefix = t.prefixer.prefix(hash);
        let e = t
            .index
            .find_mut(probe_hash(prefix), |e| e.loc() == old)
            .expect("live object is indexed");
        e.set_loc(new);
    }
}

/// The open survivor if `len` fits, else a new one (the old one is sealed).
fn survivor_with_room(t: &mut Tablet, budget: &mut Budget, len: usize) -> Result<u32, EngineError> {
    if let Some(s) = t.survivor
        && t.segs[s as usize].room(budget.segment_bytes) >= len
    {
        return Ok(s);
    }
    let s = t.new_segment(budget, Purpose::Survivor)?;
    t.segs[s as usize].stamp = 0; // takes the age of the data copied in
    t.survivor = Some(s);
    Ok(s)
}

#[cfg(test)]
#[path = "cleaner_tests.rs"]
mod tests;
