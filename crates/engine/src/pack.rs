//! Freeing a segment without allocating one: the last resort of a write
//! (above all a remove) on a budget so full that the cleaner cannot open a
//! survivor.
//!
//! The cleaner frees a segment by copying what it keeps into a survivor,
//! and opening a survivor takes a free segment. When the budget has none
//! (the reserves went to other tablets' heads and survivors, and index
//! growth took the rest), the tablets may still hold free room in segments
//! already allocated: the open survivor, and the head beyond what it keeps
//! for a tombstone and for promised groups (`slack.rs`, `promise.rs`).
//! Copying a sealed segment whose kept bytes fit that room frees it whole.
//! Seen in the model test: a 10-segment budget, a remove refused because
//! the only segments with room were a near-empty head of another tablet
//! (3.9 KB free) and full survivors, while that tablet held a sealed segment
//! with 703 live bytes.
//!
//! Copying into a head mixes old data into it. Harmless: replay decides by
//! version, not by position (`replay.rs`); the tombstone rule depends on
//! segment ids, and a copy is only ever of a live entry (`cleaner.rs`); the
//! head is never cleaned while it is the head, so the copies simply wait
//! for the cleaning after it is sealed. The room a head keeps for the next
//! remove and for promised groups is left alone, so every guarantee made
//! about the head before still holds.

use crate::CleanStats;
use crate::cleaner::{self, kept_bytes};
use crate::entry;
use crate::segment::{Budget, Purpose};
use crate::tablet::Tablet;

/// Free sealed segments of `tablets` by copying them into room their
/// tablets already hold, until a segment for `purpose` may be allocated or
/// nothing more fits. Returns how many segments were freed.
pub(crate) fn free_in_place(
    tablets: &mut [Option<Tablet>],
    budget: &mut Budget,
    purpose: Purpose,
    stats: &mut CleanStats,
) -> u64 {
    let mut freed = 0;
    for t in tablets.iter_mut().flatten() {
        while !budget.may_allocate(purpose) {
            if !free_one(t, budget, stats) {
                break;
            }
            freed += 1;
        }
    }
    freed
}

/// Copy the sealed segment of `t` that keeps the fewest bytes into its open
/// survivor, or else into its head's spare room, and free it; false if no
/// sealed segment fits either (or a scan holds the tablet's log positions).
fn free_one(t: &mut Tablet, budget: &mut Budget, stats: &mut CleanStats) -> bool {
    if t.clean_holds > 0 {
        return false; // a scan relies on this tablet's log positions
    }
    let segment_bytes = budget.segment_bytes;
    // A copied mark of a headless tablet is carried on (`carry_counter`):
    // one header of margin covers it wherever the copies go.
    let margin = entry::MAX_HEADER_BYTES as u64;
    let survivor_room = t
        .survivor
        .map_or(0, |s| t.segs[s as usize].room(segment_bytes) as u64);
    let head_spare = t.head.map_or(0, |h| {
        let keep = t.tombstone_slack() + t.promised.bytes();
        t.segs[h as usize].room(segment_bytes).saturating_sub(keep) as u64
    });
    let Some((kept, slot)) = t
        .order
        .iter()
        .filter(|&&s| t.head != Some(s) && t.survivor != Some(s))
        .map(|&s| (kept_bytes(t, s, &t.segs[s as usize]), s))
        .min()
    else {
        return false;
    };
    let into_head = if kept + margin <= survivor_room {
        false
    } else if kept + margin <= head_spare {
        true
    } else {
        return false;
    };
    let survivor = t.survivor;
    if into_head {
        // The head takes the copies as if it were the open survivor.
        t.survivor = t.head;
    }
    let cleaned = cleaner::clean_segment(t, slot, budget, stats).is_ok();
    if into_head && t.survivor == t.head {
        t.survivor = survivor;
    }
    debug_assert!(cleaned, "{kept} kept bytes fit the room measured");
    cleaned
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HashRange;

    const SEG: usize = 4096;

    fn key(i: u32) -> Vec<u8> {
        format!("key-{i}").into_bytes()
    }

    /// Put objects `from..` into the head of `t` until it is full; returns
    /// the next key number.
    fn fill_head(t: &mut Tablet, budget: &mut Budget, from: u32) -> u32 {
        let mut n = from;
        while t.head_room(SEG) >= entry::max_entry_bytes(10, 200) + t.tombstone_slack_with(10) {
            let hash = crate::key_hash(1, &key(n));
            t.reserve_index(budget, 1).expect("index");
            let v = t.take_version();
            t.put(budget, hash, &key(n), &[n as u8; 200], v, 0, None);
            n += 1;
        }
        n
    }

    /// A tablet whose first segment, sealed, holds `live` of its objects
    /// (the rest removed, their tombstones in the head), on a budget with
    /// no segment to spare.
    fn setup(live: u32) -> (Tablet, Budget, u32) {
        let mut budget = Budget::new(1 << 20, SEG);
        let mut t = Tablet::new(1, HashRange::FULL, 1);
        t.open_head(&mut budget, Purpose::Object).expect("head");
        let sealed = t.head.expect("head");
        let n = fill_head(&mut t, &mut budget, 0);
        t.open_head(&mut budget, Purpose::Object)
            .expect("second head");
        for j in live..n {
            let hash = crate::key_hash(1, &key(j));
            let old = t.find(hash, &key(j)).expect("present");
            let v = t.take_version();
            t.remove(&mut budget, hash, &key(j), v, old);
        }
        budget.budget_bytes = budget.used_bytes();
        assert!(
            !budget.may_allocate(Purpose::Survivor),
            "budget must be full"
        );
        (t, budget, sealed)
    }

    /// A sealed segment whose kept bytes fit the head's spare room is copied
    /// there and freed, with no segment allocated; its objects stay
    /// readable and the head keeps its room for a tombstone.
    #[test]
    fn a_sealed_segment_is_copied_into_the_heads_spare_room() {
        let (mut t, mut budget, sealed) = setup(3);
        let before = budget.allocated_bytes;
        let mut stats = CleanStats::default();
        assert!(free_one(&mut t, &mut budget, &mut stats));
        assert_eq!(
            budget.allocated_bytes,
            before - SEG as u64,
            "one segment freed"
        );
        assert!(!t.order.contains(&sealed));
        assert_eq!(t.survivor, None, "no survivor opened");
        let head = t.head.expect("head");
        assert!(
            t.segs[head as usize].live_bytes > 0,
            "the copies are in the head"
        );
        assert!(t.head_room(SEG) >= t.tombstone_slack());
        t.check_consistency();
        for j in 0..3 {
            let at = t.find(crate::key_hash(1, &key(j)), &key(j)).expect("kept");
            assert_eq!(crate::index::slot_of(at), head as usize);
            assert_eq!(t.object(at).value, &[j as u8; 200][..]);
        }
    }

    /// Nothing fits (the head is nearly full, the sealed segment still
    /// holds most of its objects): nothing is copied and nothing freed.
    #[test]
    fn a_segment_that_does_not_fit_is_left_alone() {
        let (mut t, mut budget, sealed) = setup(8);
        budget.budget_bytes += 1 << 20; // room for the index while filling
        fill_head(&mut t, &mut budget, 1000);
        budget.budget_bytes = budget.used_bytes();
        let before = budget.allocated_bytes;
        let mut stats = CleanStats::default();
        assert!(!free_one(&mut t, &mut budget, &mut stats));
        assert_eq!(budget.allocated_bytes, before);
        assert!(t.order.contains(&sealed));
        assert_eq!(stats.entries_moved, 0);
        t.check_consistency();
    }
}
