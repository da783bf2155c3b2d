//! The cleaner on one tablet: a pass that runs out of room, the tombstone
//! rule, and the counter of a tablet left without a head.

use super::*;
use crate::HashRange;
use crate::ReplayReport;
use crate::compact::compact_into_head;
use crate::replay::resolve;

const SEG: usize = 4096;

fn key(i: u32) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

/// Tablet with a sealed segment of live objects (every third one dead),
/// a head, and an open survivor with little room left; budget exactly full.
fn setup() -> (Tablet, Budget, u32, Vec<u32>) {
    let mut budget = Budget::new(3 * SEG as u64, SEG);
    // Room for the index while building; cut back to exactly full below.
    budget.budget_bytes += 1 << 20;
    let mut t = Tablet::new(1, HashRange::FULL, 1);
    t.open_head(&mut budget, Purpose::Object).expect("head");
    let sealed = t.head.expect("head");
    let mut i = 0;
    while t.head_room(SEG) >= entry::max_entry_bytes(10, 100) {
        let hash = crate::key_hash(1, &key(i));
        t.reserve_index(&mut budget, 1).expect("index");
        let v = t.take_version();
        t.put(&mut budget, hash, &key(i), &[i as u8; 100], v, 0, None);
        i += 1;
    }
    let live: Vec<u32> = (0..i).filter(|j| j % 3 != 0).collect();
    t.open_head(&mut budget, Purpose::Object)
        .expect("second head");
    for j in (0..i).filter(|j| j % 3 == 0) {
        let hash = crate::key_hash(1, &key(j));
        let old = t.find(hash, &key(j)).expect("present");
        let v = t.take_version();
        t.remove(&mut budget, hash, &key(j), v, old);
    }
    let s = t
        .new_segment(&mut budget, Purpose::Survivor)
        .expect("survivor");
    t.survivor = Some(s);
    while t.segs[s as usize].room(SEG) > 600 {
        t.segs[s as usize].append(KIND_MARK, 1, 1, &[], &[], 0);
    }
    budget.budget_bytes = budget.used_bytes();
    assert!(
        !budget.may_allocate(Purpose::Survivor),
        "budget must be full"
    );
    (t, budget, sealed, live)
}

fn assert_all_readable(t: &Tablet, live: &[u32]) {
    t.check_consistency();
    assert_eq!(t.object_count, live.len() as u64);
    for &j in live {
        let loc = t
            .find(crate::key_hash(1, &key(j)), &key(j))
            .expect("live object lost");
        assert_eq!(t.object(loc).value, &[j as u8; 100][..]);
    }
}

#[test]
fn a_pass_that_runs_out_of_room_midway_loses_nothing() {
    let (mut t, mut budget, sealed, live) = setup();
    let mut stats = CleanStats::default();
    assert_eq!(
        clean_segment(&mut t, sealed, &mut budget, &mut stats),
        Err(EngineError::OutOfMemory)
    );
    assert!(
        stats.entries_moved > 0,
        "some entries fitted in the open survivor"
    );
    assert_eq!(stats.segments_cleaned, 0);
    assert!(t.order.contains(&sealed), "the source stays");
    assert_all_readable(&t, &live);
    // With room again the same segment is cleaned completely.
    budget.budget_bytes += SEG as u64;
    clean_segment(&mut t, sealed, &mut budget, &mut stats).expect("clean");
    assert!(!t.order.contains(&sealed));
    assert_eq!(stats.segments_cleaned, 1);
    assert_all_readable(&t, &live);
}

#[test]
fn tombstones_are_kept_while_an_older_segment_exists() {
    let (mut t, mut budget, sealed, live) = setup();
    budget.budget_bytes += 4 * SEG as u64;
    // The tombstones sit in the second head, which recorded the newest id (2)
    // while segment 1 (the sealed one, holding the removed versions) exists.
    let head = t.head.expect("head");
    t.open_head(&mut budget, Purpose::Object)
        .expect("third head");
    let mut stats = CleanStats::default();
    clean_segment(&mut t, head, &mut budget, &mut stats).expect("clean the old head");
    assert_eq!(
        stats.tombstones_dropped, 0,
        "segment 1 still holds the removed versions"
    );
    // Once segment 1 is gone, every copy may go (all recorded id 2 < 3).
    clean_segment(&mut t, sealed, &mut budget, &mut stats).expect("clean segment 1");
    t.survivor = None; // seal it so it can be cleaned
    let holding: Vec<u32> = t
        .order
        .iter()
        .copied()
        .filter(|&s| t.segs[s as usize].tombstone_bytes > 0 && t.head != Some(s))
        .collect();
    assert!(!holding.is_empty());
    for s in holding {
        if t.survivor == Some(s) {
            t.survivor = None;
        }
        clean_segment(&mut t, s, &mut budget, &mut stats).expect("clean a tombstone holder");
    }
    assert!(stats.tombstones_dropped > 0);
    assert_eq!(
        t.order
            .iter()
            .map(|&s| t.segs[s as usize].tombstone_bytes)
            .sum::<u64>(),
        0,
        "all tombstones dropped"
    );
    assert_all_readable(&t, &live);
}

/// The counter a replay of `t`'s log restores.
fn replayed_counter(t: &Tablet) -> u64 {
    let segments = t.order.iter().map(|&s| &t.segs[s as usize].buf[..]);
    let mut report = ReplayReport::default();
    resolve(1, HashRange::FULL, segments, 64, 1024, &mut report)
        .expect("the log replays")
        .next_version
}

/// The head held the raised counter (a mark) above every live version, and
/// overwritten versions (dead) too; compaction cleans it but cannot adopt a
/// head with the room asked for. The survivor holding the head's copies is
/// then the head (the tablet keeps room for a tombstone), and the log must
/// still restore the counter: the mark carried out of the headless tablet
/// is the head's.
#[test]
fn a_head_cleaned_without_the_room_asked_for_leaves_a_head_and_the_counter() {
    let mut budget = Budget::new(8 * SEG as u64, SEG);
    budget.budget_bytes += 1 << 20; // room for the index
    let mut t = Tablet::new(1, HashRange::FULL, 1);
    t.open_head(&mut budget, Purpose::Object).expect("head");
    // Two segments' worth, all but the last three versions overwritten
    // (dead): worth compacting.
    for i in 0..60u32 {
        if t.head_room(SEG) < entry::max_entry_bytes(10, 100) {
            t.open_head(&mut budget, Purpose::Object).expect("head");
        }
        let k = key(i % 3);
        let hash = crate::key_hash(1, &k);
        let old = t.find(hash, &k);
        t.reserve_index(&mut budget, 1).expect("index");
        let v = t.take_version();
        t.put(&mut budget, hash, &k, &[i as u8; 100], v, 0, old);
    }
    assert_eq!(t.order.len(), 2);
    let old_head = t.head.expect("head");
    let old_head_id = t.segs[old_head as usize].id;
    t.raise_version(80);
    t.append_mark(&mut budget);
    assert_eq!(replayed_counter(&t), 80);
    let mut stats = CleanStats::default();
    // A whole segment: a survivor, which holds something, never has that room.
    assert!(!compact_into_head(&mut t, &mut budget, SEG, 0, &mut stats));
    assert!(stats.segments_cleaned >= 2, "both segments cleaned");
    let head = t.head.expect("the survivor is the head");
    assert_ne!(t.segs[head as usize].id, old_head_id, "not the old head");
    assert!(t.survivor.is_none() && t.counter_mark.is_none());
    assert!(
        t.head_room(SEG) >= t.tombstone_slack(),
        "room for a tombstone"
    );
    assert_eq!(t.order.len(), 1, "three live objects in one segment");
    assert_eq!(replayed_counter(&t), 80, "the counter survives the head");
    assert_eq!(t.next_version, 80);
    // Compacted again for room that fits: a survivor is adopted.
    assert!(compact_into_head(&mut t, &mut budget, 100, 0, &mut stats));
    assert!(t.head.is_some() && t.counter_mark.is_none());
    assert_eq!(replayed_counter(&t), 80);
    t.check_consistency();
}
