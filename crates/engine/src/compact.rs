//! A tablet's own compaction into a new head (`compact_into_head`): how a
//! write or remove finds room on a full budget when the freed space is
//! scattered over many tablets (`room.rs` calls it). It copies with the
//! cleaner's `clean_segment`, so the cleaner's rules (live entries only,
//! the tombstone rule, side records) hold here too.

use crate::CleanStats;
use crate::cleaner::{clean_segment, kept_bytes};
use crate::entry;
use crate::segment::Budget;
use crate::tablet::Tablet;

/// Make room for an entry of `len` bytes in tablet `t` by compacting the
/// tablet itself, without growing its segment count: the full head and an
/// open survivor too full to adopt are sealed (so they can be cleaned like
/// any other segment), the sealed segments with the most reclaimable bytes
/// are copied into a new survivor, and as soon as the open survivor has room
/// for a version mark plus `len`, it is adopted as the new head. Needs at
/// most one free segment at a time (a survivor may be opened before its
/// source is freed), which the cleaner reserve provides; every source is
/// freed once copied, so the tablet ends with no more segments than it
/// started with (plus at most that one). If no survivor is adopted for
/// `len`, the old head is the head again, or, if it was cleaned, the
/// survivor holding its copies is (cleaning the head is only done while that
/// survivor keeps room for a tombstone: a failed write must not take away
/// the room a tablet's first remove relies on, `slack.rs`).
///
/// This is what makes removes and writes succeed on a full budget when the
/// freed space is scattered over many tablets with few segments each: a
/// global pass cannot free a whole segment there (each tablet's copies need
/// a segment of their own), but the tablet's own survivor can take the
/// writes. Nothing is done unless the tablet's segments hold at least
/// `min_reclaimable` bytes that copying would free (so a caller can refuse
/// to copy whole segments for a tiny gain). Returns whether the head now
/// has room.
pub(crate) fn compact_into_head(
    t: &mut Tablet,
    budget: &mut Budget,
    len: usize,
    min_reclaimable: u64,
    stats: &mut CleanStats,
) -> bool {
    let segment_bytes = budget.segment_bytes;
    let need = len + entry::MAX_HEADER_BYTES; // the adopted head starts with a version mark
    // The open survivor becomes the head if it has `len` bytes free behind
    // the head's version mark.
    let adopt = |t: &mut Tablet, budget: &mut Budget, len: usize| -> bool {
        let Some(s) = t.survivor else { return false };
        // A survivor holding the carried counter (`carry_counter`; the
        // counter has not moved since) needs no mark of its own: it then
        // needs no more room than before the carried mark took its bytes.
        let carries = t.head.is_none() && t.counter_mark == Some(t.segs[s as usize].id);
        let room = t.segs[s as usize].room(segment_bytes);
        if room
            < if carries {
                len
            } else {
                len + entry::MAX_HEADER_BYTES
            }
        {
            return false;
        }
        t.survivor = None;
        t.head = Some(s);
        t.counter_mark = None; // the head holds the counter
        t.slack_waived = false;
        if !carries {
            t.append_mark(budget);
        }
        true
    };
    if adopt(t, budget, len) {
        return true;
    }
    let mut sources: Vec<(u64, u32, u64)> = Vec::new();
    if sources.try_reserve_exact(t.order.len()).is_err() {
        return false;
    }
    // The open survivor counts too (it could not be adopted): removes may
    // have left its copies dead, and once sealed below it can be cleaned.
    for &slot in &t.order {
        let seg = &t.segs[slot as usize];
        sources.push((kept_bytes(t, slot, seg), slot, seg.id));
    }
    let reclaimable: u64 = sources
        .iter()
        .map(|&(kept, _, _)| segment_bytes as u64 - kept)
        .sum();
    if reclaimable < min_reclaimable.max(need as u64) {
        return false; // not worth it: keep the head as it is
    }
    // The full head is sealed: cleanable like any other segment. If nothing
    // is adopted below and it was not cleaned, it is the head again (with
    // its room for a tombstone); else the next write opens a new head.
    let sealed = t.head.map(|h| (h, t.segs[h as usize].id));
    if sealed.is_some() {
        // The sealed head holds the counter now, not a mark of an earlier
        // headless spell (`carry_counter`).
        t.counter_mark = None;
    }
    // What a head must keep free for a tombstone (`slack.rs`) and for the
    // groups promised room (`promise.rs`) beside its version mark, and a
    // mark carried out of a headless tablet's segment.
    let slack = t.tombstone_slack() + t.promised.bytes();
    let keep_for_tombstone = slack + 2 * entry::MAX_HEADER_BYTES;
    t.head = None;
    t.survivor = None;
    sources.sort_unstable_by_key(|&(kept, _, _)| kept);
    let mut head_cleaned = false;
    for (kept, slot, id) in sources {
        if t.segs[slot as usize].id != id || t.survivor == Some(slot) {
            continue; // reused by a survivor of this compaction
        }
        // The old head is cleaned, and anything after it, only while the
        // survivor taking the copies can then be the head with room for a
        // tombstone: a write that still fails must not leave the tablet
        // without the room its first remove relies on (the other tablets
        // may hold the tombstone reserve). A segment's copies fit the open
        // survivor or spill into a fresh one, so the survivor then keeps at
        // least `room - kept` bytes.
        let is_head = sealed.is_some_and(|(h, _)| h == slot);
        if is_head || head_cleaned {
            let room = t
                .survivor
                .map_or(segment_bytes, |s| t.segs[s as usize].room(segment_bytes));
            if (room as u64) < kept + keep_for_tombstone as u64 {
                continue;
            }
        }
        if clean_segment(t, slot, budget, stats).is_err() {
            break; // no room even for a survivor: nothing was lost
        }
        head_cleaned |= is_head;
        if adopt(t, budget, len) {
            return true;
        }
    }
    match sealed {
        // Not cleaned: the old head is the head again, with its room.
        Some((h, id)) if t.segs[h as usize].id == id && t.survivor != Some(h) => {
            t.head = Some(h);
        }
        // Cleaned: the survivor holding its copies is the head (with the
        // room for a tombstone and the promises the check above left it),
        // though the caller's `len` does not fit.
        Some(_) => {
            let adopted = adopt(t, budget, slack);
            debug_assert!(
                adopted,
                "the old head was cleaned into a survivor with room"
            );
        }
        None => {}
    }
    false
}
